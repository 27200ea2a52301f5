//! # canopy-alloc
//!
//! Canopy's allocator: the SAC private heap manager (Grelck & Scholz) made
//! general enough to replace `malloc`, with Myrmics-style slabs whose metadata
//! lives apart from the data.
//!
//! ```text
//!                 global heap  (one arena, spans of 64 KiB units; large chunks)
//!                /     |     \
//!        thread heap  ...   thread heap      (1 MiB pages taken from the global heap)
//!         /       \
//!   slab subheaps   medium local heap        (<= 8 KiB: slabs; <= 256 KiB: split/coalesce)
//! ```
//!
//! The arena matrix of the paper is `size class x thread heap`; a pointer's
//! arena is found in O(1) from the descriptor table (see [`arena`]).
//!
//! ## Using it
//! ```no_run
//! #[global_allocator]
//! static GLOBAL: canopy_alloc::Canopy = canopy_alloc::Canopy;
//! ```
//! (or [`CanopyUnchecked`], whose `dealloc` of a small block of the
//! thread's own heap trusts the pointer and the layout: fewer instructions
//! per free; a double free is still refused),
//! or the rich interface, with the size class chosen at compile time:
//! ```
//! use canopy_alloc::SizeClass;
//! const C: SizeClass = match SizeClass::of(100) { Some(c) => c, None => panic!() };
//! let p = canopy_alloc::alloc_class(C);
//! assert!(!p.is_null());
//! unsafe { canopy_alloc::free_class(p, C) };
//! ```
//!
//! ## Errors
//! Allocation returns null when memory is exhausted (the C layer sets
//! `ENOMEM`).  A free of a pointer Canopy did not allocate, or a double free,
//! is reported naming the call and the pointer; check mode (`CANOPY_CHECK=1`,
//! always in debug builds) detects every such case exactly and aborts, the
//! default mode refuses the frees it detects (foreign pointers, interior
//! pointers, double frees of small blocks and medium and large chunks) and
//! carries on.
//!
//! Module map: [`size_class`] (the rows of the matrix), [`arena`] (address
//! space, descriptors), `global` (the global heap), `heap` (thread heaps and
//! slabs), `medium` (local-heap chunks), `large_cache` (a thread's freed large chunks), `thread` (TLS, exit, fork), `solo`
//! (the lock and solo mode), `check` (check mode), [`stats`], [`options`](mod@options).
#![deny(missing_docs)]

pub mod arena;
mod check;
mod global;
mod heap;
mod large_cache;
mod lend;
mod medium;
mod meta;
pub mod options;
mod report;
pub mod size_class;
pub mod slab;
mod solo;
pub mod stats;
mod thread;

use arena::{desc, desc_index, flight_tag, kind, unit_index, Block, Desc, MAX_UNITS, UNIT, UNIT_SHIFT};
use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::ptr;
pub use heap::Heap;
pub use lend::{lend_pages, return_pages, LendError};
use canopy_sync::claim;
use canopy_sync::prim::Ordering;
use heap::{empty_heap, DEAD_TID};
use large_cache::LargeCache;
pub use options::Options;
pub use report::BadFree;
pub use size_class::{SizeClass, MEDIUM_MAX, NUM_CLASSES, SMALL_CLASSES, SMALL_MAX};
use size_class::small_class_index;
use thread::tls_heap;

/// In a 128-byte-aligned block of its own: slow paths of every thread read
/// the options, and beside other statics (the global heap's counters) each
/// of their writes would take the line from those readers (see
/// `arena::FastKeys`).
#[repr(align(128))]
struct OptCell(UnsafeCell<Options>);
// SAFETY: written once under the init lock before READY is published
// (Release); read only after observing READY (Acquire) in `options()`.
unsafe impl Sync for OptCell {}
static OPTIONS: OptCell = OptCell(UnsafeCell::new(Options::DEFAULT));
static OPTIONS_SET: canopy_sync::prim::AtomicBool = canopy_sync::prim::AtomicBool::new(false);

fn set_options(o: Options) {
    // SAFETY: called once, under the init lock, before OPTIONS_SET is set.
    unsafe { *OPTIONS.0.get() = o };
    OPTIONS_SET.store(true, canopy_sync::prim::Ordering::Release);
}

/// The options in force (read from the environment when the allocator
/// starts; this starts it if needed).
#[inline]
pub fn options() -> &'static Options {
    if OPTIONS_SET.load(canopy_sync::prim::Ordering::Acquire) {
        // SAFETY: see OptCell.
        unsafe { &*OPTIONS.0.get() }
    } else {
        options_at_start()
    }
}

#[cold]
fn options_at_start() -> &'static Options {
    if thread::ensure_init() {
        // SAFETY: READY was observed, so the options are written (see OptCell).
        unsafe { &*OPTIONS.0.get() }
    } else {
        &Options::DEFAULT
    }
}

// ---------------------------------------------------------------------------
// Allocation
// ---------------------------------------------------------------------------

/// Allocate `size` bytes (16-byte aligned).  Null when out of memory.
#[inline(always)]
pub fn alloc(size: usize) -> *mut u8 {
    if size <= SMALL_MAX {
        alloc_small_size(size)
    } else {
        alloc_big(size)
    }
}

/// Allocate one block of class `cls` (the rich interface).
#[inline(always)]
pub fn alloc_class(cls: SizeClass) -> *mut u8 {
    if cls.is_small() {
        alloc_small(cls.index())
    } else {
        alloc_big(cls.size())
    }
}

/// The fast path by class: the lowest free slot of the class's cursor word.
#[inline(always)]
fn alloc_small(c: usize) -> *mut u8 {
    let h = tls_heap();
    // SAFETY: h is this thread's heap (or EMPTY_HEAP, whose cursors are
    // empty); c < SMALL_CLASSES.
    unsafe { take_or_else((*h).cursors.as_mut_ptr().add(c), || alloc_small_slow(h, c)) }
}

/// The fast path by size (`size <= SMALL_MAX`): the heap's size-indexed
/// view of the cursors saves the size-to-class step.
#[inline(always)]
fn alloc_small_size(size: usize) -> *mut u8 {
    let g = (size + 15) >> 4;
    let h = tls_heap();
    // SAFETY: as in alloc_small; g < DIRECT_LEN.
    unsafe { take_or_else(*(*h).direct.get_unchecked(g), || alloc_small_slow_size(size, h)) }
}

/// Take the lowest free slot of cursor `cp`'s word (a word of the current
/// slab of its class in this thread's heap, or the empty cursor's zero word), else
/// call `slow`.  The word, once used up, stays with the cursor: the next
/// allocation finds it empty and the slow path moves the cursor.
///
/// # Safety
/// `cp` is a cursor of this thread's heap or of `EMPTY_HEAP`.
#[inline(always)]
unsafe fn take_or_else(cp: *mut heap::Cursor, slow: impl FnOnce() -> *mut u8) -> *mut u8 {
    // SAFETY: the cursor, its slab and its bitmap word belong to this thread
    // (only the owner writes a bitmap); an empty cursor's word is 0, so
    // nothing is written through it.
    unsafe {
        // First a block of another heap this thread freed, kept for this
        // class (see `Heap::keep`): the most recently freed, still in this
        // core's cache.  (Tested before the word: with the kept list reached
        // through the word's test instead, the word parked while blocks were
        // kept, Larson's two threads ran about 10 % slower; single-threaded
        // loops pay these three instructions.)
        let k = (*cp).kept;
        if !k.is_null() {
            (*cp).kept = (*k).next;
            (*cp).kept_room += 1;
            (*cp).taken += 1;
            (*k).tag = 0;
            return k as *mut u8;
        }
        let word = &*(*cp).word;
        if let Some((rest, bit)) = slab::take_lowest_bits(word.load(core::sync::atomic::Ordering::Relaxed)) {
            word.store(rest, core::sync::atomic::Ordering::Relaxed);
            (*cp).taken += 1;
            let p = ((*cp).base + bit as usize * (*cp).size) as *mut Block;
            // Clear the free mark (see arena::Block).
            (*p).tag = 0;
            return p as *mut u8;
        }
    }
    slow()
}

#[cold]
#[inline(never)]
fn alloc_small_slow_size(size: usize, h: *mut Heap) -> *mut u8 {
    // (Arguments in this order so that `malloc` passes `size` on where it
    // came in.)
    alloc_small_slow(h, small_class_index(size))
}

#[cold]
#[inline(never)]
fn alloc_small_slow(mut h: *mut Heap, c: usize) -> *mut u8 {
    if h == empty_heap() {
        h = thread::acquire_heap();
        if h.is_null() {
            return out_of_memory();
        }
    }
    // SAFETY: h is this thread's live heap.
    let p = unsafe { (*h).alloc_small_slow(c) };
    if p.is_null() {
        return out_of_memory();
    }
    p
}

/// Null, with `errno = ENOMEM` for C callers (harmless for Rust ones).
#[cold]
fn out_of_memory() -> *mut u8 {
    canopy_sys::set_errno(libc::ENOMEM);
    ptr::null_mut()
}

/// Medium or large.
#[cold]
#[inline(never)]
fn alloc_big(size: usize) -> *mut u8 {
    let p = alloc_big_inner(size);
    if p.is_null() {
        return out_of_memory();
    }
    p
}

fn alloc_big_inner(size: usize) -> *mut u8 {
    if size <= MEDIUM_MAX {
        let mut h = tls_heap();
        if h == empty_heap() {
            h = thread::acquire_heap();
            if h.is_null() {
                return ptr::null_mut();
            }
        }
        // SAFETY: h is this thread's live heap.
        unsafe {
            (*h).maintenance();
            (*h).counters.medium_allocs += 1;
            let hr = &mut *h;
            hr.medium.alloc(h, &mut hr.counters, size_class::class_index(size))
        }
    } else {
        alloc_large(size, 1).0
    }
}

/// Allocate a large chunk of `size` bytes aligned to `align_units` units.
/// Returns the pointer and whether it is known to read as zero.
fn alloc_large(size: usize, align_units: usize) -> (*mut u8, bool) {
    let Some(units) = size.checked_add(UNIT - 1).map(|s| s >> UNIT_SHIFT) else {
        return (ptr::null_mut(), false);
    };
    alloc_large_units(size, units, align_units, true)
}

/// [`alloc_large`] of a chunk of `units` units (at least `size` bytes) for
/// `size` requested bytes: the units past `size` are room to grow in place.
/// `trim`: give back the pages of a reused span past `size` (see
/// [`trim_of`]); false for room the caller expects to fill soon.
fn alloc_large_units(size: usize, units: usize, align_units: usize, trim: bool) -> (*mut u8, bool) {
    if !thread::ensure_init() {
        return (ptr::null_mut(), false);
    }
    debug_assert!(units << UNIT_SHIFT >= size);
    if units == 0 || units > MAX_UNITS {
        return (ptr::null_mut(), false);
    }
    let h = tls_heap();
    if h != empty_heap() {
        // SAFETY: this thread's own heap.
        unsafe {
            (*h).note_large(units * UNIT);
            if align_units == 1 && LargeCache::holds(units) {
                if let Some(d) = (*h).large_cache.take(units) {
                    return (hand_out_cached(h, d, size), false);
                }
            }
        }
    }
    let locked = solo::lock();
    // SAFETY: global lock held; the span's units become ours.
    let r = unsafe {
        let g = global::state();
        let mut got = g.alloc_span(units, align_units);
        if h != empty_heap() && !(*h).large_cache.is_empty() {
            // The request could not be met from memory the process already
            // has: rather than grow while this thread keeps freed chunks of
            // other sizes, give those back (they may merge with their free
            // neighbours) and look again.
            let retain = options().retain_bytes;
            match got {
                None => {
                    give_back_cached(g, h, retain);
                    got = g.alloc_span(units, align_units);
                }
                Some((idx, true)) => {
                    // A fresh or decommitted span: not in memory yet.
                    g.free_span(idx, units, false, retain, None);
                    give_back_cached(g, h, retain);
                    got = g.alloc_span(units, align_units);
                }
                Some((_, false)) => {}
            }
        }
        match got {
            Some((idx, zeroed)) => {
                // Read the clean marks before anything reuses the descriptors.
                let used = size.next_multiple_of(canopy_sys::page_size());
                let clean_tail = zeroed || global::GlobalState::known_clean(idx, used, units * UNIT);
                arena::mark_units(idx, units, kind::LARGE_BODY);
                let d = desc(idx);
                (*d).kind = kind::LARGE;
                (*d).a = units as u32;
                (*d).b = size.min(u32::MAX as usize) as u32;
                g.stats.large_allocs += 1;
                g.stats.large_bytes += (units * UNIT) as u64;
                let p = arena::unit_addr(d);
                // With huge pages asked for, a trim would split one.  A tail
                // the units' clean marks say holds no memory (see
                // `GlobalState::free_span`) needs no madvise.
                let tail = if options().huge_pages || !trim { None } else { trim_of(size, units) };
                let trim = tail.filter(|_| !clean_tail);
                if let Some((_, len)) = trim {
                    g.stats.bytes_decommitted += len as u64;
                    g.stats.decommits += 1;
                }
                // Zeroed, known clean, or about to be trimmed: the tail holds
                // no memory.
                (*d).flags = if clean_tail || trim.is_some() { arena::LARGE_TAIL_CLEAN } else { 0 };
                // Live now, after its fields: a free that claims the chunk
                // (without the lock, on the cache's path) reads them.
                claim::publish(&(*d).owner, arena::LARGE_LIVE);
                (p, zeroed, trim)
            }
            None => (ptr::null_mut(), false, None),
        }
    };
    solo::unlock(locked);
    // The chunk is ours: its tail is given back without holding the lock
    // (madvise can take long, and other threads' large allocations and page
    // takes would wait on it).
    let r = match r {
        (p, zeroed, Some((at, len))) => {
            // SAFETY: the tail lies inside the chunk just allocated, past
            // `size`: nothing lives there.
            if unsafe { canopy_sys::decommit(p.add(at), len) }.is_err() {
                let locked = solo::lock();
                // SAFETY: global lock held.
                unsafe {
                    let g = global::state();
                    g.stats.bytes_decommitted -= len as u64;
                    g.stats.decommits -= 1;
                }
                solo::unlock(locked);
            }
            (p, zeroed)
        }
        (p, zeroed, None) => (p, zeroed),
    };
    let h = tls_heap();
    if !r.0.is_null() && h != empty_heap() {
        // SAFETY: our own heap's counter.
        unsafe { (*h).counters.large_allocs += 1 };
    }
    r
}

/// Tails at least this long (and at least a quarter of their span) are
/// trimmed (see [`trim_of`]).
const TRIM_MIN: usize = 16 << 10;

/// A large chunk of `size` bytes got a reused span of `units` units, whose
/// pages past `size` may still be in memory (an earlier, longer chunk touched
/// them): a long enough tail is given back to the OS, so that a chunk costs
/// the memory it asked for, not its span's.  Returns the tail to decommit
/// (offset from the chunk's start, length), if any.  Chunks from fresh or
/// decommitted spans need nothing (untouched pages take no memory).  Growing
/// the chunk in place later is unaffected: the trimmed pages read as zero
/// when touched.
fn trim_of(size: usize, units: usize) -> Option<(usize, usize)> {
    let span = units << UNIT_SHIFT;
    let used = size.next_multiple_of(canopy_sys::page_size());
    let tail = span.saturating_sub(used);
    (tail >= TRIM_MIN && tail * 4 >= span).then_some((used, tail))
}

/// Allocate `size` zeroed bytes.
pub fn alloc_zeroed(size: usize) -> *mut u8 {
    if size > MEDIUM_MAX {
        let (p, zeroed) = alloc_large(size, 1);
        if !p.is_null() && !zeroed {
            // SAFETY: p has size bytes.
            unsafe { ptr::write_bytes(p, 0, size) };
        }
        return p;
    }
    let p = alloc(size);
    if !p.is_null() {
        // SAFETY: p has at least size bytes.
        unsafe { ptr::write_bytes(p, 0, size) };
    }
    p
}

/// Allocate `size` bytes aligned to `align` (a power of two).  Null if
/// `align` is not a power of two, is above the arena's own alignment
/// (1 GiB, [`arena::ARENA_ALIGN`]; at least 1 MiB where the kernel placed
/// an arena that grows, [`arena::base_align`]), or memory is exhausted.
pub fn alloc_aligned(size: usize, align: usize) -> *mut u8 {
    alloc_aligned_inner(size, align, false)
}

fn alloc_aligned_inner(size: usize, align: usize, zero: bool) -> *mut u8 {
    // Spans are aligned by their unit index, relative to the arena base,
    // which is aligned to ARENA_ALIGN and no more: a larger alignment would
    // not hold for the address.
    if !align.is_power_of_two() || align > arena::ARENA_ALIGN {
        return ptr::null_mut();
    }
    if align <= 16 {
        return if zero { alloc_zeroed(size) } else { alloc(size) };
    }
    let want = size.max(align);
    if want <= SMALL_MAX {
        // Power-of-two classes are aligned to their size (slabs are 64 KiB
        // aligned and blocks start at multiples of the size).
        let p = alloc(want.next_power_of_two());
        if zero && !p.is_null() {
            // SAFETY: p has at least size bytes.
            unsafe { ptr::write_bytes(p, 0, size) };
        }
        return p;
    }
    if align > UNIT && (!thread::ensure_init() || align > arena::base_align()) {
        return ptr::null_mut();
    }
    let (p, zeroed) = alloc_large(size.max(1), (align >> UNIT_SHIFT).max(1));
    if zero && !zeroed && !p.is_null() {
        // SAFETY: p has at least size bytes.
        unsafe { ptr::write_bytes(p, 0, size) };
    }
    p
}

/// Initialise the allocator now (it otherwise starts on first use).  Layers
/// that register their own `fork()` handlers call this first, so that the
/// allocator's handlers run innermost: their locks are taken last before a
/// fork and released first after it.  Returns false if the arena could not
/// be reserved.
pub fn init() -> bool {
    thread::ensure_init()
}

pub use thread::ForkHooks;

/// Have the allocator's `fork()` handlers run `h` too: `prepare` before the
/// allocator takes its locks, `parent` and `child` after it releases or
/// resets them.  For one layer above the allocator that keeps a lock its
/// calls hold while they allocate (the process-wide region allocator); a
/// later call replaces the hooks.  Unlike a `pthread_atfork` of its own
/// made on first use, this has no half-registered state a `fork()` from
/// another thread could catch.  Initialises the allocator.
pub fn set_fork_hooks(h: &'static ForkHooks) {
    thread::ensure_init();
    thread::set_fork_hooks(h);
}

/// Allocate a descriptor of `desc_size` bytes together with `data_size` bytes
/// of data aligned to `data_align` (a power of two) in one block.  Returns
/// `(descriptor, data)`; freeing the descriptor frees both.
pub fn alloc_with_descriptor(desc_size: usize, data_size: usize, data_align: usize) -> Option<(*mut u8, *mut u8)> {
    let (align, offset, total) = descriptor_layout(desc_size, data_size, data_align)?;
    let p = if align <= 16 { alloc(total) } else { alloc_aligned(total, align) };
    if p.is_null() {
        return None;
    }
    // SAFETY: offset <= total, inside the block.
    Some((p, unsafe { p.add(offset) }))
}

// ---------------------------------------------------------------------------
// Freeing
// ---------------------------------------------------------------------------

/// Free a block.  Null is ignored.  A pointer Canopy did not allocate, or a
/// block already freed, is reported (check mode aborts).
///
/// # Safety
/// `p` must not be used after this call.
#[inline(always)]
pub unsafe fn free(p: *mut u8) {
    // SAFETY: forwarded.
    unsafe { free_from(p, "free") }
}

/// [`free`] with the API name used in reports.
///
/// # Safety
/// As for [`free`].
#[inline(always)]
pub unsafe fn free_from(p: *mut u8, call: &'static str) {
    // SAFETY: forwarded.
    unsafe { free_inner(p, call, 0) }
}

/// Hint bit: `expected` holds a class index, not a size.
const HINT_CLASS: usize = 1 << 63;

/// The free fast path.  `expected` is what the caller says of the block: 0
/// (nothing), a size, or `HINT_CLASS | class`; it is checked on the slow path,
/// which check mode always takes.
///
/// The fast path takes a block of a slab that is current or on the `avail`
/// list of this thread's heap (`owner == thread_id()`: full and abandoned
/// slabs, and every slab in check mode, have `owner == 0`), checks that `p`
/// starts a slot, that the block is not marked in flight to this heap, and
/// that its bit is clear (else: a double free), and sets the bit and the
/// block's free mark: two stores, none into the descriptor, whose line
/// other threads read on every remote free of the slab's blocks.  It keeps
/// no count of a slab's live blocks; the heap finds the slabs its frees
/// emptied by a sweep of its bitmaps (`Heap::sweep_empty`).
///
/// A block of any other arena unit goes to [`free_elsewhere`], whose first
/// case is a remote free put into an open batch; anything else, to
/// [`free_slow`].
///
/// After `fork()`, a new thread of the child can have the id (TCB address)
/// of a parent thread that no longer exists, whose heap is retired: the fast
/// path then frees into a slab of that dead heap, which only leaks the block.
#[inline(always)]
unsafe fn free_inner(p: *mut u8, call: &'static str, expected: usize) {
    let base = arena::arena_base();
    let off = (p as usize).wrapping_sub(base);
    if off < arena::arena_limit() {
        let idx = off >> UNIT_SHIFT;
        // SAFETY: idx < arena_units(), so d is a mapped descriptor of the
        // table, which lies TABLE_OFFSET below the arena base.  When `owner`
        // is this thread, the slab belongs to this thread's heap and only
        // this thread touches its bitmap and counters.
        unsafe {
            // idx * 64 locates both the descriptor (64 bytes) and the
            // slab's bitmap words (64 per unit).
            let i64 = idx << 6;
            const _: () = assert!(core::mem::size_of::<Desc>() == 64);
            let d = (base - arena::TABLE_OFFSET + i64) as *mut Desc;
            if (*d).owner.load(canopy_sync::prim::Ordering::Relaxed) == canopy_sys::thread_id() {
                // The arena base is unit-aligned: p's low bits are its
                // offset in the unit; one multiplication and one compare give
                // its slot and whether it starts one (`slab::small_test`).  A
                // block marked in flight to this heap's inbox goes to the slow
                // path, which refuses the double free (setting its bit would
                // cross the inbox with the bitmap); so does a block whose bit
                // is set, a double free.  The bitmap word's index in the
                // table is `idx * 64 + i / 64` (BITMAP_STRIDE is 64 words).
                let off = (p as usize & (UNIT - 1)) as u32;
                if let Some(i) = slab::locate_small((*d).divc, (*d).limit, off) {
                    let key = flight_tag();
                    if (*(p as *mut Block)).tag != key {
                        let word = &*((base - arena::BITMAP_OFFSET + (i64 + (i >> 6)) * 8) as *const core::sync::atomic::AtomicU64);
                        if let Ok(now) = slab::release_bits(word.load(core::sync::atomic::Ordering::Relaxed), i) {
                            // A live block of this thread's heap.  While the
                            // class's kept list has room, the block goes onto
                            // it, marked in flight (a second free is refused),
                            // and the next allocation of the class pops it:
                            // its bit stays clear, so the free stores nothing
                            // into the bitmap word, whose address it learns
                            // only after the descriptor load and the slot
                            // multiplication, and which the next allocation
                            // would otherwise have to wait for.
                            // `owner` is this thread: a SMALL slab of this
                            // thread's heap `h`, whose class is a small class
                            // index (below SMALL_CLASSES), so the cursor is
                            // one of `h`'s, with no bounds test.
                            let h = (*d).heap.load(canopy_sync::prim::Ordering::Relaxed);
                            debug_assert!(((*d).class as usize) < size_class::SMALL_CLASSES);
                            let k = ptr::addr_of_mut!((*h).cursors).cast::<heap::Cursor>().add((*d).class as usize);
                            if (*k).kept_room != 0 {
                                heap::Cursor::push_kept(k, p as *mut Block);
                                (*(p as *mut Block)).tag = key;
                                return;
                            }
                            word.store(now, core::sync::atomic::Ordering::Relaxed);
                            // The free mark (`free_mark()`).  No count of
                            // live blocks: a slab this empties is found by the
                            // heap's sweep (`Heap::sweep_empty`).
                            (*(p as *mut Block)).tag = key ^ 1;
                            return;
                        }
                    }
                }
            }
        }
    }
    // One call for every other case, so that the caller's arguments (a
    // class hint) are computed only on the way out: two calls made the
    // compiler compute them before the test, on the fast path.
    // SAFETY: forwarded.
    unsafe { free_elsewhere(p, call, expected) }
}

/// Every free the fast path does not finish.  Most often a small block of
/// another thread's heap, which goes into this thread's open batch for that
/// heap without a further call (`Heap::try_queue_remote`).  The block is
/// validated as the slow path would: it starts a slot of a small slab and
/// is neither free nor in flight (a double free goes to the slow path,
/// which reports it).  Everything else (a pointer outside the arena, a
/// full slab of this heap, medium and large chunks, no batch open for the
/// owner, check mode, a refused free) goes to [`free_slow`].
///
/// # Safety
/// As for [`free`].
#[inline(never)]
unsafe fn free_elsewhere(p: *mut u8, call: &'static str, expected: usize) {
    let base = arena::arena_base();
    let off = (p as usize).wrapping_sub(base);
    // SAFETY: the descriptor is read only for a unit below the arena's
    // limit, whose descriptor is mapped; a SMALL unit's slot test does not
    // change while a block of it is live, and p is written only once it is
    // known to start a live slot.
    unsafe {
        let d = arena::desc_at(base, off >> UNIT_SHIFT);
        if off < arena::arena_limit() && (*d).kind == arena::kind::SMALL {
            let off = (p as usize & (UNIT - 1)) as u32;
            if slab::locate_small((*d).divc, (*d).limit, off).is_some() {
                let key = flight_tag();
                let b = p as *mut Block;
                if (*b).tag ^ key > 1 {
                    let owner = (*d).heap.load(canopy_sync::prim::Ordering::Relaxed);
                    let me = tls_heap();
                    // Kept for this thread's next allocation of the class
                    // when there is room (never a block of its own heap: a
                    // full slab's block goes home on the slow path), else
                    // into the batch open for the owner.  A thread without
                    // a heap (EMPTY_HEAP, shared and never written: no room,
                    // no batch) takes the slow path, which gives it one.
                    if me != empty_heap() && ((owner != me && (*me).keep((*d).class as usize, p)) || (*me).try_queue_remote(owner, p)) {
                        // In flight (see arena::Block): the owner takes
                        // the batch in by this mark.
                        (*b).tag = key;
                        return;
                    }
                }
            }
        }
        free_slow(p, call, expected)
    }
}

/// Free with the block's size known (the C `free_sized`).  In check mode a
/// size that does not match the block is reported.
///
/// # Safety
/// As for [`free`]; `size` is the size the block was allocated with.
pub unsafe fn free_sized(p: *mut u8, size: usize) {
    // SAFETY: forwarded.
    unsafe { free_inner(p, "free_sized", size.max(1)) }
}

/// Free a block of class `cls` (the rich interface).
///
/// # Safety
/// As for [`free`]; the block was allocated with class `cls` or a size in it.
#[inline(always)]
pub unsafe fn free_class(p: *mut u8, cls: SizeClass) {
    // SAFETY: forwarded.
    unsafe { free_inner(p, "free_class", HINT_CLASS | cls.index()) }
}

/// Free a block said to be of class index `cls` (C's `canopy_free_class`).
/// The class is checked only where the hint is: on the slow path, in check
/// mode; an index that is no class is no hint.
///
/// # Safety
/// As for [`free`]; the block was allocated with class `cls` or a size in it.
#[inline(always)]
pub unsafe fn free_class_index(p: *mut u8, cls: usize) {
    // SAFETY: forwarded.
    unsafe { free_inner(p, "free_class", HINT_CLASS | cls) }
}

/// Free a block of class `cls` without checking its pointer or its class:
/// the rich interface for callers that know every block they free is live
/// and allocated with class `cls` (or a size in it), such as a runtime
/// whose frees come from its own reference counts or from Rust ownership.
///
/// A small block goes onto this thread's kept list of the class (see
/// `Heap::keep`) while it has room, whichever heap it belongs to, and the
/// thread's next allocation of the class takes it back, still in its cache:
/// no descriptor is read and no bitmap written.  The block stays marked in
/// flight meanwhile, so a second free of it, through this function,
/// [`free`] or [`free_class`], is refused (this one reads the block's tag
/// word first: a block in flight or free in its slab goes to the checked
/// path).  The list's room is
/// `CANOPY_KEEP_KB` of blocks per class (at least one); a full list, a
/// medium or large class, check mode (`CANOPY_CHECK=1` and debug builds,
/// where the room is 0) and a thread that never allocated take the checked
/// path of [`free_class`].  Kept blocks go home when the thread exits or
/// calls [`collect`].
///
/// # Safety
/// `p` is a live block of this allocator that [`alloc_class`]`(cls)` or
/// [`alloc`] of a size in class `cls` returned (not a block that
/// [`realloc`] resized, an aligned allocation or a descriptor allocation,
/// whose class may be another), and it is not used or freed again.  A
/// wrong class puts the block on another class's list, which hands it out
/// for larger requests.
#[inline(always)]
pub unsafe fn free_class_unchecked(p: *mut u8, cls: SizeClass) {
    // SAFETY: forwarded.
    unsafe { free_class_index_unchecked(p, cls.index()) }
}

/// [`free_class_unchecked`] by class index (C's
/// `canopy_free_class_unchecked`); an index that is no class takes the
/// checked path, which reports the block if the index was wrong for it.
///
/// # Safety
/// As for [`free_class_unchecked`].
#[inline(always)]
pub unsafe fn free_class_index_unchecked(p: *mut u8, cls: usize) {
    if cls < SMALL_CLASSES {
        let h = tls_heap();
        // SAFETY: h is this thread's heap, or EMPTY_HEAP, whose cursors
        // have no room (nothing is written to it); cls < SMALL_CLASSES.  The
        // caller vouches that p is a live block of class cls, at least 16
        // bytes, so its first two words are ours to write.
        // (Raw pointers, no `&mut`: EMPTY_HEAP is shared by every thread
        // without a heap.)
        unsafe {
            let k = core::ptr::addr_of_mut!((*h).cursors).cast::<heap::Cursor>().add(cls);
            let b = p as *mut Block;
            let key = flight_tag();
            // Not a block already kept (in flight) or free in its slab (the
            // free mark): a second free goes to the checked path, which
            // refuses it, instead of linking the block into the list twice.
            if (*k).kept_room != 0 && (*b).tag ^ key > 1 {
                // In flight (see arena::Block): live for its owner, and a
                // checked free of it is refused.
                (*b).tag = key;
                heap::Cursor::push_kept(k, b);
                return;
            }
        }
    }
    // SAFETY: forwarded.
    unsafe { free_unchecked_full(p, cls) }
}

/// The block [`alloc_with_descriptor`] takes for these arguments: its
/// alignment (at least 16), the data's offset and the total size; `None`
/// for an alignment that is not a power of two or a size that overflows.
#[inline(always)]
fn descriptor_layout(desc_size: usize, data_size: usize, data_align: usize) -> Option<(usize, usize, usize)> {
    if !data_align.is_power_of_two() {
        return None;
    }
    let align = data_align.max(16);
    let offset = desc_size.checked_add(align - 1)? & !(align - 1);
    Some((align, offset, offset.checked_add(data_size)?))
}

/// Free, without checking it, a block that [`alloc_with_descriptor`]`(desc_size,
/// data_size, data_align)` returned: as [`free_class_unchecked`] with the
/// class that call allocated in, for data aligned to at most 16 bytes;
/// otherwise (an aligned allocation, whose class the sizes do not name) and
/// for medium and large blocks, the checked [`free`].
///
/// # Safety
/// `p` is the descriptor pointer of a live block that
/// `alloc_with_descriptor` returned for these three arguments, and it is not
/// used or freed again.
#[inline(always)]
pub unsafe fn free_with_descriptor_unchecked(p: *mut u8, desc_size: usize, data_size: usize, data_align: usize) {
    if let Some((16, _, total)) = descriptor_layout(desc_size, data_size, data_align) {
        if total <= SMALL_MAX {
            // SAFETY: the block came from alloc(total) (alloc_with_descriptor
            // with align 16), a small block of that size's class.
            unsafe { free_class_index_unchecked(p, small_class_index(total)) };
            return;
        }
    }
    // SAFETY: forwarded.
    unsafe { free_from(p, "free_with_descriptor_unchecked") }
}

/// The checked free for [`free_class_index_unchecked`]'s other cases.
///
/// # Safety
/// As for [`free_class_unchecked`].
#[inline(never)]
unsafe fn free_unchecked_full(p: *mut u8, cls: usize) {
    // SAFETY: forwarded.
    unsafe { free_inner(p, "free_class_unchecked", HINT_CLASS | cls) }
}

/// Allocate one block of class index `cls` (C's `canopy_alloc_class`): null
/// with `errno = EINVAL` if `cls` is no class.  Small classes are decided by
/// one compare.
#[inline(always)]
pub fn alloc_class_index(cls: usize) -> *mut u8 {
    if cls < SMALL_CLASSES {
        alloc_small(cls)
    } else {
        alloc_class_index_big(cls)
    }
}

#[cold]
#[inline(never)]
fn alloc_class_index_big(cls: usize) -> *mut u8 {
    match SizeClass::from_index(cls) {
        Some(c) => alloc_big(c.size()),
        None => {
            canopy_sys::set_errno(libc::EINVAL);
            ptr::null_mut()
        }
    }
}

/// The general free: validation, remote frees, medium and large chunks.
#[cold]
#[inline(never)]
unsafe fn free_slow(p: *mut u8, call: &'static str, expected: usize) {
    if p.is_null() {
        return;
    }
    // A class hint that names no class is no hint.
    let expected = match expected {
        e if e & HINT_CLASS == 0 => e,
        e if e & !HINT_CLASS < NUM_CLASSES => size_class::class_size(e & !HINT_CLASS),
        _ => 0,
    };
    if expected != 0 && options().check {
        // SAFETY: checks only; reports and refuses a pointer that is no block.
        match unsafe { usable_size_checked(p, call) } {
            None => return,
            Some(u) if expected > u => {
                report::bad_free(call, p, BadFree::WrongSize, u, None);
                return;
            }
            Some(_) => {}
        }
    }
    let idx = unit_index(p as usize);
    if !arena::arena_initialised() || idx >= arena::arena_units() {
        report::bad_free(call, p, BadFree::Foreign, 0, None);
        return;
    }
    // SAFETY: idx is an arena unit; each arm validates p before using it.
    unsafe {
        let d = desc(idx);
        match (*d).kind {
            kind::SMALL => free_small_slow(d, p, call),
            kind::MEDIUM => free_medium(d, p, call),
            kind::LARGE => free_large(d, p, call),
            kind::FREE_SPAN | kind::FREE_BODY | kind::HEAP_FREE | kind::LARGE_CACHED if p as usize & (UNIT - 1) == 0 => {
                report::bad_free(call, p, BadFree::DoubleFree, 0, None)
            }
            kind::LENT | kind::LENT_BODY => report::bad_free(call, p, BadFree::Lent, 0, None),
            _ => report::bad_free(call, p, BadFree::NotABlock, 0, None),
        }
    }
}

unsafe fn free_small_slow(d: *mut Desc, p: *mut u8, call: &'static str) {
    // SAFETY: d is a SMALL unit; p is validated below before any write.
    unsafe {
        let size = (*d).b as usize;
        let class = Some((*d).class as usize);
        let me = tls_heap();
        if options().check {
            if let Err(e) = check::check_and_clear(d, p) {
                report::bad_free(call, p, e, size, class);
                return;
            }
        } else {
            // A slot start, not marked free or in flight (see arena::Block;
            // the owner's bitmap, exact, is its own to read: another
            // thread reading it would pull the line away from the owner on
            // every remote free).
            if heap::small_slot_start(d, p).is_none() {
                report::bad_free(call, p, BadFree::NotABlock, size, class);
                return;
            }
            if (*(p as *mut Block)).tag ^ flight_tag() <= 1 {
                report::bad_free(call, p, BadFree::DoubleFree, size, class);
                return;
            }
        }
        let owner = (*d).heap.load(canopy_sync::prim::Ordering::Relaxed);
        if owner == me && !me.is_null() && (*me).tid == canopy_sys::thread_id() {
            if let Err(e) = (*me).free_small_local(d, p) {
                report::bad_free(call, p, e, size, class);
            }
        } else {
            send_remote(me, owner, p);
        }
    }
}

/// Send a free of a small block to the owning heap (see [`send_in_flight`]).
unsafe fn send_remote(me: *mut Heap, owner: *mut Heap, p: *mut u8) {
    // SAFETY: p is a validated block of `owner`, dead from now on.
    unsafe {
        (*(p as *mut Block)).tag = flight_tag();
        send_in_flight(me, owner, p);
    }
}

/// Send a block or chunk of `owner`, already marked in flight, to its heap:
/// batched through this thread's heap, or pushed directly if this thread
/// cannot have one.
#[inline(always)]
unsafe fn send_in_flight(me: *mut Heap, owner: *mut Heap, p: *mut u8) {
    // SAFETY: p is a block of `owner` marked in flight (caller's contract).
    unsafe {
        let me = batching_heap(me);
        if me.is_null() {
            heap::push_direct(owner, p);
        } else if me == owner {
            // The heap this thread just took is the block's (adopted from
            // the thread that made the block): the free is local after all.
            (*me).free_sent_home(p);
        } else {
            (*me).free_remote(owner, p);
        }
    }
}

/// The heap a remote free of this thread is batched in: its own, or a new
/// one if it has none yet (a thread that only frees, such as the consumer of
/// a producer/consumer pair, would otherwise push each free alone, one
/// atomic swap and one chained block each).  Null if it cannot have one.
unsafe fn batching_heap(me: *mut Heap) -> *mut Heap {
    if me == empty_heap() {
        return thread::acquire_heap();
    }
    // SAFETY: a heap pointer from this thread's slot is a heap.
    if me.is_null() || unsafe { (*me).tid == 0 || (*me).tid == DEAD_TID } {
        return ptr::null_mut();
    }
    me
}

unsafe fn free_medium(d: *mut Desc, p: *mut u8, call: &'static str) {
    match medium::Medium::validate(p) {
        Err(e) => report::bad_free(call, p, e, 0, None),
        Ok(_) => {
            // SAFETY: p is a validated medium chunk of `owner`.  `validate`
            // read USED, but another thread may be freeing the chunk at the
            // same time: `free_local` and `mark_in_flight` take it out of USED
            // with a compare-and-swap, so exactly one free wins, and only the
            // winner links the chunk into a bin or a remote batch.
            unsafe {
                let owner = (*d).heap.load(canopy_sync::prim::Ordering::Relaxed);
                let me = tls_heap();
                if owner == me && (*me).tid == canopy_sys::thread_id() {
                    let mr = &mut *me;
                    if !mr.medium.free_local(&mut mr.counters, p) {
                        report::bad_free(call, p, BadFree::DoubleFree, 0, None);
                    }
                } else if !medium::Medium::mark_in_flight(p) {
                    report::bad_free(call, p, BadFree::DoubleFree, 0, None);
                } else {
                    send_in_flight(me, owner, p);
                }
            }
        }
    }
}

/// Free the large chunk `p`, whose head descriptor `d` said `LARGE`: into
/// this thread's large cache if it holds such chunks and has room, else to
/// the global heap (see the `large_cache` module).
unsafe fn free_large(d: *mut Desc, p: *mut u8, call: &'static str) {
    if p != arena::unit_addr(d) {
        report::bad_free(call, p, BadFree::NotABlock, 0, None);
        return;
    }
    // SAFETY: d is an arena descriptor; the claim makes this free the only
    // one to act on the chunk (a free that loses, or finds the chunk no
    // longer live, writes nothing).
    unsafe {
        if !claim::claim(&(*d).owner, arena::LARGE_LIVE, arena::LARGE_CLAIMED) {
            report::bad_free(call, p, BadFree::DoubleFree, 0, None);
            return;
        }
        let units = (*d).a as usize;
        // A thread that is alone takes no lock in the global heap: the
        // cache would save it little and keep memory from other sizes.
        // Otherwise the budget, but the caches of all threads together
        // keep no more than the global heap's retain limit.
        let budget = if solo::solo_active() {
            0
        } else {
            let o = options();
            o.large_cache_bytes.min(o.retain_bytes / thread::LIVE_HEAPS.load(Ordering::Relaxed).max(1))
        };
        let cacheable = LargeCache::holds(units) && units * UNIT <= budget;
        let mut h = tls_heap();
        if h == empty_heap() && cacheable {
            // A thread that so far took only large chunks has no heap yet.
            h = thread::acquire_heap();
        }
        if cacheable && !h.is_null() && h != empty_heap() && (*h).tid == canopy_sys::thread_id() {
            if (*h).large_cache.put(d, units, budget) {
                let pb = &(*h).published;
                pb.large_cache_puts.store(pb.large_cache_puts.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                pb.large_cached_bytes.store((*h).large_cache.bytes as u64, Ordering::Relaxed);
                return;
            }
            // Full: the cached chunks go back with this one, under one lock.
            flush_large_cache(h, Some((d, units)));
            return;
        }
        let locked = solo::lock();
        let g = global::state();
        g.stats.large_frees += 1;
        give_back_large(g, d, units, options().retain_bytes);
        solo::unlock(locked);
    }
}

/// Give the claimed large chunk `d` of `units` units back to the global
/// heap.
///
/// # Safety
/// The global lock is held; `d` heads a large chunk (`LARGE` or
/// `LARGE_CACHED`) whose claim the caller holds.
unsafe fn give_back_large(g: &mut global::GlobalState, d: *mut Desc, units: usize, retain: usize) {
    // SAFETY: caller's contract.
    unsafe {
        g.stats.large_bytes -= (units * UNIT) as u64;
        let size = (*d).b as usize;
        // Pages past the requested size were clean when the chunk was
        // handed out; unless the program wrote past its request (into
        // what `usable_size` allows), they still are.  A wrong mark only
        // skips a trim later: memory stays resident, nothing breaks.
        let clean_from = ((*d).flags & arena::LARGE_TAIL_CLEAN != 0 && size < u32::MAX as usize)
            .then(|| size.next_multiple_of(canopy_sys::page_size()));
        // Clears the claim with the units' other marks.
        g.free_span(desc_index(d), units, true, retain, clean_from);
    }
}

/// Give every chunk of heap `h`'s large cache back to the global heap.
///
/// # Safety
/// The global lock is held; `h` is the calling thread's heap (or one it is
/// abandoning).
unsafe fn give_back_cached(g: &mut global::GlobalState, h: *mut Heap, retain: usize) {
    // SAFETY: caller's contract; cached chunks are claimed by this heap.
    unsafe {
        (*h).large_cache.drain(|d, units| give_back_large(g, d, units, retain));
        (*h).published.large_cached_bytes.store(0, Ordering::Relaxed);
    }
}

/// Give every chunk of heap `h`'s large cache, and `extra` (a claimed
/// chunk being freed, with its units), back to the global heap under one
/// lock.
///
/// # Safety
/// `h` is the calling thread's heap (or one it is abandoning).
pub(crate) unsafe fn flush_large_cache(h: *mut Heap, extra: Option<(*mut Desc, usize)>) {
    // SAFETY: caller's contract.
    if extra.is_none() && unsafe { (*h).large_cache.is_empty() } {
        return;
    }
    let retain = options().retain_bytes;
    let locked = solo::lock();
    // SAFETY: global lock held; the chunks are claimed by this thread.
    unsafe {
        let g = global::state();
        give_back_cached(g, h, retain);
        if let Some((d, units)) = extra {
            g.stats.large_frees += 1;
            give_back_large(g, d, units, retain);
        }
    }
    solo::unlock(locked);
}

/// Hand out the cached chunk `d` of heap `h` for `size` bytes.
///
/// # Safety
/// `d` was just taken from `h`'s large cache by its owner, the caller.
unsafe fn hand_out_cached(h: *mut Heap, d: *mut Desc, size: usize) -> *mut u8 {
    // SAFETY: caller's contract: the chunk is claimed by this thread.
    unsafe {
        // The tail past `size` was clean when the chunk was last handed
        // out, if it was then and the chunk was no shorter than now.
        if size < (*d).b as usize {
            (*d).flags &= !arena::LARGE_TAIL_CLEAN;
        }
        (*d).b = size.min(u32::MAX as usize) as u32;
        (*d).kind = kind::LARGE;
        // After the fields above: a free that claims the chunk reads them.
        claim::publish(&(*d).owner, arena::LARGE_LIVE);
        let pb = &(*h).published;
        pb.large_cache_hits.store(pb.large_cache_hits.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        pb.large_cached_bytes.store((*h).large_cache.bytes as u64, Ordering::Relaxed);
        (*h).counters.large_allocs += 1;
        arena::unit_addr(d)
    }
}

// ---------------------------------------------------------------------------
// Sizes and reallocation
// ---------------------------------------------------------------------------

/// Usable size of a live block, or `None` (reported) if `p` is not one.
///
/// # Safety
/// `p` is null or was returned by this allocator.
unsafe fn usable_size_checked(p: *mut u8, call: &'static str) -> Option<usize> {
    let idx = unit_index(p as usize);
    if !arena::arena_initialised() || idx >= arena::arena_units() {
        report::bad_free(call, p, BadFree::Foreign, 0, None);
        return None;
    }
    // SAFETY: idx is an arena unit.
    unsafe {
        let d = desc(idx);
        match (*d).kind {
            kind::SMALL => {
                let size = (*d).b as usize;
                let live = if options().check { check::is_live(d, p) } else { matches!(heap::small_slot(d, p), Some((_, false))) };
                if !live {
                    report::bad_free(call, p, BadFree::NotABlock, size, Some((*d).class as usize));
                    return None;
                }
                Some(size)
            }
            kind::MEDIUM => match medium::Medium::validate(p) {
                Ok(_) => Some(medium::Medium::usable(p)),
                Err(e) => {
                    report::bad_free(call, p, e, 0, None);
                    None
                }
            },
            kind::LARGE if p == arena::unit_addr(d) => Some((*d).a as usize * UNIT),
            _ => {
                report::bad_free(call, p, BadFree::NotABlock, 0, None);
                None
            }
        }
    }
}

/// Usable size of a live block (0 for null or a pointer that is not a block).
///
/// # Safety
/// `p` is null or was returned by this allocator and not freed.
pub unsafe fn usable_size(p: *mut u8) -> usize {
    if p.is_null() {
        return 0;
    }
    // SAFETY: forwarded.
    unsafe { usable_size_checked(p, "malloc_usable_size").unwrap_or(0) }
}

/// Resize a block (C `realloc` semantics, except that `new_size == 0` frees
/// and returns null, like glibc).  On failure returns null and leaves the
/// block as it was.
///
/// # Safety
/// `p` is null or a live block of this allocator; on success it must not be
/// used again unless the same pointer is returned.
pub unsafe fn realloc(p: *mut u8, new_size: usize) -> *mut u8 {
    if p.is_null() {
        return alloc(new_size);
    }
    if new_size == 0 {
        // SAFETY: forwarded.
        unsafe { free_from(p, "realloc") };
        return ptr::null_mut();
    }
    // SAFETY: forwarded.
    let Some(usable) = (unsafe { usable_size_checked(p, "realloc") }) else {
        return ptr::null_mut();
    };
    if new_size <= usable && new_size >= usable / 2 {
        // SAFETY: p is a live block (usable_size_checked said so).
        unsafe { large_grows_in_its_span(p, new_size) };
        return p;
    }
    if usable > MEDIUM_MAX && new_size > MEDIUM_MAX {
        // SAFETY: p is a live large chunk (usable_size_checked said so).
        if unsafe { resize_large_in_place(p, new_size) } {
            return p;
        }
    }
    if new_size <= usable && usable <= SMALL_MAX {
        // Shrinking a small block: a smaller class only if it saves a lot.
        if small_class_index(new_size) + 4 > small_class_index(usable) {
            return p;
        }
    }
    let q = if new_size > usable && new_size > MEDIUM_MAX && new_size - usable <= usable / 4 {
        // A buffer growing step by step into a large chunk that must move:
        // leave room to grow in place, half the old size again, so it is
        // copied a logarithmic number of times, not once per 64 KiB unit.
        // The room is not trimmed: a reused span's pages there stay in
        // memory for the growth to come (trimmed, they were faulted in again
        // at once).  100 buffers grown 1.5 KiB at a time to 1.5 MiB: 288 ->
        // 222 ms with trimmed room, 199-219 ms untrimmed (mimalloc 169-212);
        // 10 grown 12 KiB at a time to 12 MiB: 295-418 -> 134-196 ms
        // (glibc, which moves pages with mremap, 78-123).  A jump of more
        // than a quarter gets no room.  The size walk's random reallocs
        // peak 2.7 % higher with the room (48.6 against 47.2 MiB, trimmed
        // or not: the chunks' layout, not untouched pages).
        let room = usable.saturating_add(usable / 2);
        let units = room.div_ceil(UNIT).min(MAX_UNITS).max(new_size.div_ceil(UNIT));
        alloc_large_units(new_size, units, 1, false).0
    } else {
        alloc(new_size)
    };
    if q.is_null() {
        return q;
    }
    // SAFETY: both blocks hold at least min(usable, new_size) bytes.
    unsafe {
        ptr::copy_nonoverlapping(p, q, usable.min(new_size));
        free_from(p, "realloc");
    }
    q
}

/// `realloc` keeps `p` for `new_size` bytes within its span.  If `p` is a
/// large chunk asked for fewer bytes, the program may now write up to
/// `new_size`: the requested size, from which `free_large` marks the span's
/// pages clean, grows with it (otherwise pages the program wrote would be
/// marked clean, and a later chunk cut from the span would skip its trim).
///
/// # Safety
/// `p` is a live block.
unsafe fn large_grows_in_its_span(p: *mut u8, new_size: usize) {
    // SAFETY: p is a live block of the arena, so its unit index is below
    // MAX_UNITS; a live large chunk's kind and size change only through the
    // program's calls for that chunk.
    let d = unsafe { desc(unit_index(p as usize)) };
    // SAFETY: as above.
    if unsafe { (*d).kind != kind::LARGE || new_size <= (*d).b as usize } {
        return;
    }
    let locked = solo::lock();
    // SAFETY: global lock held (as for every change of a large chunk's
    // descriptor); d heads the live chunk p.
    unsafe { (*d).b = new_size.min(u32::MAX as usize) as u32 };
    solo::unlock(locked);
}

/// Grow a large chunk into the free span after it, or shrink it by giving
/// its tail back.  Returns false if it cannot be done in place.
///
/// # Safety
/// `p` is a live large chunk.
unsafe fn resize_large_in_place(p: *mut u8, new_size: usize) -> bool {
    let Some(new_units) = new_size.checked_add(UNIT - 1).map(|s| s >> UNIT_SHIFT) else {
        return false;
    };
    let idx = unit_index(p as usize);
    let retain = options().retain_bytes;
    let locked = solo::lock();
    // SAFETY: global lock held; d heads the live chunk p.
    let done = unsafe {
        let d = desc(idx);
        let old_units = (*d).a as usize;
        let g = global::state();
        if (*d).kind != kind::LARGE {
            false
        } else {
            // The requested size in `b` no longer describes the chunk.
            (*d).flags &= !arena::LARGE_TAIL_CLEAN;
            if new_units > old_units {
                let ok = g.grow_in_place(idx, old_units, new_units);
                if ok {
                    (*d).a = new_units as u32;
                    g.stats.large_bytes += ((new_units - old_units) * UNIT) as u64;
                }
                ok
            } else if new_units < old_units {
                (*d).a = new_units as u32;
                g.stats.large_bytes -= ((old_units - new_units) * UNIT) as u64;
                g.free_span(idx + new_units, old_units - new_units, true, retain, None);
                true
            } else {
                true
            }
        }
    };
    solo::unlock(locked);
    done
}

/// Give every free span of the global heap back to the OS now, send this
/// thread's pending remote frees, and hand its empty slabs and the large
/// chunks it keeps back (whole free pages beyond the heap's retain limit go
/// to the global heap first).  Returns the bytes decommitted.
pub fn collect() -> usize {
    if !thread::ensure_init() {
        return 0;
    }
    let h = tls_heap();
    if h != empty_heap() {
        // SAFETY: our own heap.
        unsafe {
            (*h).flush_kept();
            (*h).maintenance();
            (*h).sweep_empty();
            (*h).release_empty_medium();
            flush_large_cache(h, None);
        }
    }
    heap::reclaim_abandoned();
    let locked = solo::lock();
    // SAFETY: global lock held.
    let n = unsafe { global::state().decommit_all() };
    solo::unlock(locked);
    n
}

/// Check the invariants of the calling thread's heap and of the global heap.
/// For tests and debugging; walks every slab and span.
pub fn check_invariants() -> Result<(), &'static str> {
    if !thread::ensure_init() {
        return Ok(());
    }
    let h = tls_heap();
    if h != empty_heap() {
        // SAFETY: our own heap, read by its owner.
        unsafe { (*h).check()? };
    }
    let locked = solo::lock();
    // SAFETY: global lock held.
    let r = unsafe { global::state().check() };
    solo::unlock(locked);
    r
}

/// Whether the global heap is still in solo mode (no lock taken).
pub fn solo_mode() -> bool {
    solo::solo_active()
}

// ---------------------------------------------------------------------------
// GlobalAlloc
// ---------------------------------------------------------------------------

/// Canopy as Rust's global allocator:
/// `#[global_allocator] static A: canopy_alloc::Canopy = canopy_alloc::Canopy;`
#[derive(Debug, Clone, Copy, Default)]
pub struct Canopy;

// SAFETY: the functions return blocks of at least the layout's size and
// alignment or null, never unwind, and accept back exactly what they returned.
unsafe impl GlobalAlloc for Canopy {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= 16 {
            alloc(layout.size())
        } else {
            alloc_aligned(layout.size(), layout.align())
        }
    }

    #[inline]
    unsafe fn dealloc(&self, p: *mut u8, _layout: Layout) {
        // SAFETY: p came from this allocator (GlobalAlloc contract).
        unsafe { free(p) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= 16 {
            alloc_zeroed(layout.size())
        } else {
            alloc_aligned_inner(layout.size(), layout.align(), true)
        }
    }

    #[inline]
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= 16 {
            // SAFETY: p is live (GlobalAlloc contract); new_size > 0.
            unsafe { realloc(p, new_size) }
        } else {
            let q = alloc_aligned(new_size, layout.align());
            if !q.is_null() {
                // SAFETY: both hold at least min(old, new) bytes.
                unsafe {
                    ptr::copy_nonoverlapping(p, q, layout.size().min(new_size));
                    free(p);
                }
            }
            q
        }
    }
}

/// Canopy as Rust's global allocator, trusting Rust's ownership to free each
/// block once:
/// `#[global_allocator] static A: canopy_alloc::CanopyUnchecked = canopy_alloc::CanopyUnchecked;`
///
/// It allocates as [`Canopy`] does.  Where [`Canopy`]'s `dealloc` checks
/// every block (it starts a slot, it is not free already, it is not in
/// flight), this one takes the layout's word for it: a small block
/// (`layout.size() <= 8 KiB`, alignment at most 16) of the calling thread's
/// own heap goes onto the thread's kept list of its class, as with
/// [`free_class_unchecked`], and the thread's next allocation of the class
/// takes it back.  No bitmap is read or written.  Blocks of other threads'
/// heaps, larger blocks, over-aligned ones, a full kept list (`CANOPY_KEEP_KB`
/// of blocks per class), check mode (`CANOPY_CHECK=1`, and debug builds) and a
/// thread without a heap take [`Canopy`]'s checked path.
///
/// What it takes on trust: the pointer and the layout.  A pointer that is
/// not the start of a live Canopy block (a foreign or interior pointer in
/// the program's `unsafe` code) is not refused: an interior pointer can be
/// handed out again overlapping its block, and a foreign one can fault when
/// its descriptor is read.  A layout that is not the block's puts the block
/// on another class's list: a larger class then hands it out for requests
/// larger than the block.  A double free is still refused: a kept block
/// stays marked in flight and a block back in its slab carries the free
/// mark, and either sends a second `dealloc` to the checked path.  Run with
/// `CANOPY_CHECK=1` to check every free in full.
///
/// Kept blocks of the thread's own heap go back into their slabs when the
/// heap sweeps for empty slabs (on its slow path, and after large
/// allocations), at `collect()` and at thread exit; until then the
/// statistics count them in use.
///
/// `realloc` keeps the invariant the unchecked `dealloc` relies on: a block
/// whose layout is small is a block of exactly its size's class.  It moves
/// a small block whenever the class changes (where [`Canopy`] may shrink in
/// place), and a medium block that shrinks to a small size.
#[derive(Debug, Clone, Copy, Default)]
pub struct CanopyUnchecked;

/// Free small block `p` of this thread's heap whose size (from its layout)
/// is `size`, unchecked (see [`CanopyUnchecked`]); anything else takes the
/// checked path.
///
/// # Safety
/// `p` is live, came from `alloc(size')` for a `size'` of the same class as
/// `size <= SMALL_MAX` (16-byte alignment, never resized to another class),
/// and is not used or freed again.
#[inline(always)]
unsafe fn dealloc_small_unchecked(p: *mut u8, size: usize) {
    let h = tls_heap();
    // SAFETY: h is this thread's heap or EMPTY_HEAP, whose direct table
    // points at the shared empty cursor (no room: nothing is written); the
    // index is at most DIRECT_LEN - 1 for size <= SMALL_MAX.  p is a live
    // small block of this allocator (caller's contract), so it lies in the
    // arena and its descriptor is mapped; a block of this thread's heap is
    // ours to write.
    unsafe {
        let k = *(*h).direct.get_unchecked((size + 15) >> 4);
        if (*k).kept_room != 0 {
            // This heap's block: in the unit of the class's current slab
            // (the cursor's line, already loaded), or one whose descriptor
            // names this heap.
            let base = arena::arena_base();
            let d = arena::desc_at(base, (p as usize).wrapping_sub(base) >> UNIT_SHIFT);
            let b = p as *mut Block;
            let key = flight_tag();
            // Not a block already kept (in flight) or free in its slab (the
            // free mark): a second dealloc goes to the checked path, which
            // refuses it, instead of linking the block into the list twice.
            if (*b).tag ^ key > 1 && ((p as usize ^ (*k).base) < UNIT || (*d).heap.load(canopy_sync::prim::Ordering::Relaxed) == h) {
                // In flight (see arena::Block): live for the slab, and a
                // checked free of it is refused.
                (*b).tag = key;
                heap::Cursor::push_kept(k, b);
                return;
            }
        }
        free_dealloc_checked(p, size)
    }
}

/// The checked path of [`dealloc_small_unchecked`].
///
/// # Safety
/// As for [`free`].
#[inline(never)]
unsafe fn free_dealloc_checked(p: *mut u8, size: usize) {
    // SAFETY: forwarded.
    unsafe { free_inner(p, "dealloc", size.max(1)) }
}

// SAFETY: as for Canopy: blocks of at least the layout's size and alignment
// or null, no unwinding; `dealloc` takes back exactly what `alloc` and
// `realloc` returned, with the layout Rust's contract guarantees, and
// `realloc` keeps every small layout's block in its size's class.
unsafe impl GlobalAlloc for CanopyUnchecked {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { Canopy.alloc(layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        // `align <= 16 && size <= SMALL_MAX` in one compare: an alignment
        // of 32 or more adds at least 16 KiB (one instruction fewer).  No
        // overflow: a block handed out has an alignment of at most the
        // arena's (1 GiB) and a size below the address space.
        const _: () = assert!(SMALL_MAX < 1 << 14);
        if layout.size() + ((layout.align() >> 5) << 14) <= SMALL_MAX {
            // SAFETY: p came from alloc or realloc with this layout, which
            // give a small layout a block of its size's class.
            unsafe { dealloc_small_unchecked(p, layout.size()) }
        } else {
            // SAFETY: p came from this allocator, with this layout (whose
            // size check mode checks).
            unsafe { free_dealloc_checked(p, layout.size()) }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { Canopy.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= 16 && new_size <= SMALL_MAX {
            let old = layout.size();
            if old <= SMALL_MAX && small_class_index(old) == small_class_index(new_size) {
                return p;
            }
            // A small block in its size's class, never one resized in place.
            let q = alloc(new_size);
            if !q.is_null() {
                // SAFETY: both hold at least min(old, new) bytes; p is freed
                // once, with its own layout.
                unsafe {
                    ptr::copy_nonoverlapping(p, q, old.min(new_size));
                    self.dealloc(p, layout);
                }
            }
            q
        } else {
            // The result is medium or large (or over-aligned), whose
            // `dealloc` is checked: Canopy's realloc may keep it in place.
            // SAFETY: forwarded.
            unsafe { Canopy.realloc(p, layout, new_size) }
        }
    }
}

/// Allocate with the C rules for `calloc`: `n * size` bytes, zeroed; null on
/// overflow.
pub fn calloc(n: usize, size: usize) -> *mut u8 {
    match n.checked_mul(size) {
        Some(total) => alloc_zeroed(total),
        None => ptr::null_mut(),
    }
}

#[cfg(test)]
mod tests;
