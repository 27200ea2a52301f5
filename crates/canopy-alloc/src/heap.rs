//! Thread heaps: the SAC *local heaps* with their slab *subheaps*.
//!
//! Each thread that allocates gets a [`Heap`].  It takes 1 MiB pages from the
//! global heap and cuts them into 64 KiB slabs, one size class per slab (the
//! arena matrix row x column is `class x heap`), or uses whole pages for medium
//! chunks (see `medium.rs`).  A slab is a [`crate::slab`] slab, the building
//! block the region layer's pools use too: slots of one size and a bitmap of
//! free slots kept apart from them ([`arena::bitmap`]).
//!
//! Fast paths (no atomics, no locks; the bitmap words are read and written
//! with relaxed loads and stores, plain moves):
//! - `alloc`: take the lowest free slot of the cursor word of
//!   `direct[(size + 15) / 16]` (by size) or `cursors[class]` (by class).
//! - `free` by the owner thread: set the slot's bit (a bit already set is a
//!   double free, caught exactly).
//!
//! Slow path (`alloc_small_slow`): drain the inbox of remote frees and send
//! the outgoing remote batches, then move the cursor to the lowest word of
//! the current slab with a free slot (so a slab fills upwards, and untouched
//! memory at its top is never committed early), else take a slab with free
//! slots of that class, else a fresh slab from the heap's free units, else a
//! new page from the global heap.
//!
//! Frees by another thread are messages to the owner: the freeing thread
//! collects the freed pointers per destination heap in a *batch*, a small
//! block of its own holding up to `CANOPY_REMOTE_BATCH` pointers (see
//! [`Batch`]), and sends the batch with one atomic swap into the owner's
//! inbox (`canopy_sync::MpscQueue`); the owner drains its inbox on its slow
//! path and hands each emptied batch back to the heap that made it (its
//! `spares` queue), which reuses it.  Because the pointers travel in an
//! array rather than linked through the freed blocks, the owner does not
//! chase a chain of blocks that sit in the freeing thread's cache (one miss
//! after another): it walks the array and its loads of the blocks overlap.
//!
//! A free of another heap's block whose class is whole cache lines (a
//! multiple of 64 bytes), by a thread that allocates in that class, is
//! first *kept* by the freeing thread, up to
//! `CANOPY_KEEP_KB` per class (see [`Heap::keep`]): its next allocation of
//! the class takes it back, still in its cache.  The same list takes the
//! blocks of any class and any heap, this one's included, that the thread
//! frees through the unchecked rich interface (`free_class_unchecked`,
//! whose caller vouches for the block and its class).  Kept blocks stay
//! marked in flight (live for their owner) until then, or until the thread
//! exits or calls `collect()`, which send them home (a block of this heap
//! goes straight back into its slab).
//!
//! A heap outlives its thread: when the thread exits, the heap is *abandoned*
//! (its slabs lose their owner, empty pages go back to the global heap) and
//! the next thread that needs a heap *adopts* it with all its memory.
//!
//! Invariants (checked by [`Heap::check`]):
//! - `cur[c]` is `EMPTY_DESC` or a SMALL slab of class `c` on no list;
//!   `cursors[c]` is empty (its word [`ZERO_WORD`]) or a word of `cur[c]`'s
//!   bitmap, and always empty in check mode; `direct[g]` points at
//!   `cursors[c]` for every size granule `g` of class `c`.
//! - A cursor's kept blocks and its `kept_room` add up to the class's cap
//!   ([`kept_cap`], 0 in check mode); every kept block is a block of the
//!   class in a small slab (of any heap), marked in flight.
//! - A slab on `avail[c]` has no FULL flag; a slab on `full[c]` has it.
//! - Every slab's `heap` is this heap; `owner` is `tid` for the slabs on
//!   `avail` while the heap is live outside check mode, and 0 for the slabs on
//!   `full` (so a free into a full slab takes the slow path).
//! - `used + free slots == slots` for every slab, plus one for `cur[c]`.

use crate::arena::{self, desc, desc_index, flight_tag, free_mark, kind, Block, Desc, FLAG_FULL, PAGE_UNITS, UNIT, UNIT_SHIFT};
use crate::global;
use crate::large_cache::LargeCache;
use crate::medium::Medium;
use crate::report::BadFree;
use crate::size_class::{class_size, NUM_CLASSES, SMALL_CLASSES, SMALL_MAX};
use crate::slab::{self, SlotShape};
use canopy_sync::prim::{AtomicU64, AtomicUsize, Ordering};
use canopy_sync::{CachePadded, MpscQueue, Node};
use core::ptr;
use core::sync::atomic::AtomicU64 as BitWord;

/// Slots in a thread's cache of outgoing remote-free batches.
const REMOTE_SLOTS: usize = 8;

/// The slab geometry of each small class in a 64 KiB unit.
pub(crate) static SHAPES: [SlotShape; SMALL_CLASSES] = {
    let mut a = [SlotShape::EMPTY; SMALL_CLASSES];
    let mut c = 0;
    while c < SMALL_CLASSES {
        a[c] = SlotShape::new(class_size(c), UNIT);
        c += 1;
    }
    a
};

/// The free path's slot test of each small class (see [`slab::small_test`]).
pub(crate) static SMALL_TESTS: [(u32, u32); SMALL_CLASSES] = {
    let mut a = [(0, 0); SMALL_CLASSES];
    let mut c = 0;
    while c < SMALL_CLASSES {
        a[c] = slab::small_test(SHAPES[c].size as usize, SHAPES[c].slots as usize);
        c += 1;
    }
    a
};

/// Where the allocation fast path of a class takes its next block: one word
/// of its current slab's bitmap.
#[repr(C)]
pub(crate) struct Cursor {
    /// The bitmap word; [`ZERO_WORD`] when the class has no current slab to
    /// take from on the fast path.
    pub(crate) word: *const BitWord,
    /// Address of the word's slot 0.
    pub(crate) base: usize,
    /// Slot size.
    pub(crate) size: usize,
    /// The slab the word belongs to (`EMPTY_DESC` with `ZERO_WORD`).
    pub(crate) desc: *mut Desc,
    /// Blocks the fast path took through this cursor, not yet added to the
    /// heap's allocation count (see `Heap::settle`).  (A `u64` beside the
    /// `u32` room: two `u32` counters side by side were bumped together
    /// with four vector instructions where two plain ones do.)
    pub(crate) taken: u64,
    /// How many more blocks the kept list may take (0: none, always in
    /// check mode).
    pub(crate) kept_room: u32,
    /// Blocks of this class that this thread freed, kept for its next
    /// allocations of the class: of other heaps (see [`Heap::keep`]), of
    /// any heap through `free_class_unchecked`, or of this heap through
    /// `CanopyUnchecked`'s `dealloc`.  A stack linked through the
    /// blocks' first words.  Each carries `flight_tag()` (its owner counts
    /// it live, and a second checked free is refused) until it is allocated
    /// again or sent home.
    pub(crate) kept: *mut Block,
    /// To 64 bytes: a class index finds its cursor with one shift (48-byte
    /// cursors took a `lea` and a shift).
    _pad: u64,
}

const _: () = assert!(core::mem::size_of::<Cursor>() == 64);

impl Cursor {
    /// Push dead block `b` onto cursor `k`'s kept list, taking one place of
    /// its room (the caller marks `b` in flight).  Through a raw pointer:
    /// `free_class_unchecked` reaches the cursor without a `&mut Heap`.
    ///
    /// # Safety
    /// `k` is a cursor of the calling thread's heap with `kept_room > 0`;
    /// `b` is a dead small block of the cursor's class, at least 16 bytes.
    #[inline(always)]
    pub(crate) unsafe fn push_kept(k: *mut Cursor, b: *mut Block) {
        // SAFETY: the caller's contract.
        unsafe {
            (*k).kept_room -= 1;
            (*b).next = (*k).kept;
            (*k).kept = b;
        }
    }
}

/// Room of class `c`'s kept list (see [`Heap::keep`]): `keep_bytes`
/// (`CANOPY_KEEP_KB`) of blocks, at least one; 0 for every class when
/// `keep_bytes` is 0.  (Which blocks a remote free may keep is
/// [`keeps_remote`]'s rule.)
pub(crate) fn kept_cap(c: usize, keep_bytes: usize) -> u32 {
    if keep_bytes == 0 {
        0
    } else {
        (keep_bytes / class_size(c)).max(1) as u32
    }
}

/// Whether a remote free of a block of slot size `size` may be kept
/// ([`Heap::keep`]): only where blocks are whole cache lines (sizes that
/// are multiples of 64: a slab is 64 KiB aligned and its slots start at
/// multiples of the size, so such a block shares no line with another
/// block).  Elsewhere a thread reusing a block that other threads' blocks
/// sit next to would share that line with them.  (An unchecked free keeps
/// a block of any class: its caller chose that interface.)
#[inline(always)]
pub(crate) fn keeps_remote(size: usize) -> bool {
    size % 64 == 0
}

/// Slow-path visits between two sweeps for empty slabs, at least (see
/// [`Heap::sweep_empty`]).
pub(crate) const SWEEP_PERIOD: u32 = 64;

/// The word of every empty cursor: no free slot, so the fast path goes to
/// the slow path without writing anything.  Never written.
pub(crate) static ZERO_WORD: BitWord = BitWord::new(0);

impl Cursor {
    const fn empty() -> Cursor {
        Cursor {
            word: &ZERO_WORD,
            base: 0,
            size: 0,
            desc: &EMPTY_DESC.0 as *const Desc as *mut Desc,
            taken: 0,
            kept_room: 0,
            kept: ptr::null_mut(),
            _pad: 0,
        }
    }
}

/// Wrapper making the static cursor shareable.
#[repr(transparent)]
pub(crate) struct SyncCursor(pub Cursor);
// SAFETY: EMPTY_CURSOR is never written: its word has no free slot, so the
// fast path never takes from it, and only a live heap's own cursors are set.
unsafe impl Sync for SyncCursor {}

/// What `direct` points at in [`EMPTY_HEAP`].
pub(crate) static EMPTY_CURSOR: SyncCursor = SyncCursor(Cursor::empty());

/// A batch being filled for one destination heap.
#[derive(Clone, Copy)]
struct RemoteSlot {
    heap: *mut Heap,
    /// The batch block (null: none yet).
    batch: *mut Batch,
    count: usize,
}

const EMPTY_SLOT: RemoteSlot = RemoteSlot { heap: ptr::null_mut(), batch: ptr::null_mut(), count: 0 };

/// A batch of remote frees on its way to the owning heap: a small block of
/// the sending heap, queued in the owner's inbox by its first word.  Its
/// second word, where a freed block carries `flight_tag()`, carries
/// [`arena::batch_tag`], so the owner tells a batch from a single block
/// pushed by a thread without a heap (`push_direct`).
#[repr(C)]
pub(crate) struct Batch {
    link: Node,
    tag: usize,
    count: usize,
    ptrs: [*mut u8; 0],
}

/// Most pointers a batch holds: a batch block stays a small block.
pub(crate) const MAX_BATCH: usize = (crate::size_class::SMALL_MAX - core::mem::size_of::<Batch>()) / 8;

/// [`batch_shape`] for the tests.
#[cfg(test)]
pub(crate) fn batch_shape_for_tests() -> (usize, usize) {
    batch_shape()
}

/// Pointers per batch (`CANOPY_REMOTE_BATCH`, at most [`MAX_BATCH`]) and the
/// small class of a batch block.
fn batch_shape() -> (usize, usize) {
    let cap = batch_cap();
    (cap, crate::size_class::small_class_index(core::mem::size_of::<Batch>() + 8 * cap))
}

/// Pointers per batch (see [`batch_shape`]), on every remote free.  The
/// option is in `1..=MAX_BATCH` already: `Options::from_lookup` clamps it
/// (and reports a value it had to clamp), and the options are set nowhere else.
#[inline(always)]
fn batch_cap() -> usize {
    let cap = crate::options().remote_batch;
    debug_assert!((1..=MAX_BATCH).contains(&cap), "remote_batch {cap} outside 1..={MAX_BATCH}");
    cap
}

/// Figures a heap publishes for the statistics (read by other threads).
pub(crate) struct Published {
    /// Live blocks per class (slabs) or live chunks (medium).
    pub blocks: [AtomicU64; NUM_CLASSES],
    /// Units (slabs) per small class.
    pub slabs: [AtomicU64; SMALL_CLASSES],
    /// Counters, in the order of [`HeapCounters`].
    pub counters: [AtomicU64; COUNTERS],
    /// Pages (small + medium) the heap holds.
    pub pages: AtomicU64,
    /// Small allocations (the program's: batch blocks are not counted).
    pub small_allocs: AtomicU64,
    /// Bytes of the batch blocks this heap made and still has (metadata).
    pub batch_bytes: AtomicU64,
    /// Large allocations served from the heap's large cache, frees put into
    /// it, and the bytes it holds (written by the owner as they change, so
    /// the statistics' large-chunk figures are exact).
    pub large_cache_hits: AtomicU64,
    pub large_cache_puts: AtomicU64,
    pub large_cached_bytes: AtomicU64,
}

/// Number of per-heap counters.
pub(crate) const COUNTERS: usize = 10;

/// Per-heap event counters (owner-only, published for statistics).
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct HeapCounters {
    pub medium_allocs: u64,
    pub remote_frees_sent: u64,
    pub remote_batches_sent: u64,
    pub remote_frees_received: u64,
    pub remote_frees_kept: u64,
    pub coalescings: u64,
    pub slabs_made: u64,
    pub pages_taken: u64,
    pub pages_returned: u64,
    pub large_allocs: u64,
}

impl HeapCounters {
    fn as_array(&self) -> [u64; COUNTERS] {
        [
            self.medium_allocs,
            self.remote_frees_sent,
            self.remote_batches_sent,
            self.remote_frees_received,
            self.coalescings,
            self.slabs_made,
            self.pages_taken,
            self.pages_returned,
            self.large_allocs,
            self.remote_frees_kept,
        ]
    }
}

/// Entries of [`Heap::direct`]: one per 16-byte granule of sizes up to `SMALL_MAX`.
pub(crate) const DIRECT_LEN: usize = SMALL_MAX / 16 + 1;

/// A thread's local heap.  `repr(C)` with the fast-path arrays first, so the
/// fast path reaches a slab with one load from the heap pointer (see also
/// `meta::HEAP_PAGE_OFFSET`, which places `direct` in its page).
#[repr(C)]
pub struct Heap {
    /// The cursor of each 16-byte granule of the size:
    /// `direct[(size + 15) / 16] == &cursors[class of size]`, so `malloc`
    /// needs no size-to-class step (mimalloc's `pages_free_direct`).  Set
    /// once when the heap is built (the heap never moves).
    pub(crate) direct: [*mut Cursor; DIRECT_LEN],
    /// The allocation cursor of each small class.
    pub(crate) cursors: [Cursor; SMALL_CLASSES],
    /// Small allocations, but for those the cursors count and have not
    /// settled yet (owner-only).
    pub(crate) allocs: u64,
    /// Batch blocks this heap ever made, and those it still has (in its
    /// slots, in flight, or handed back): small blocks of its own, which the
    /// statistics count as metadata, not as the program's allocations or
    /// blocks in use (owner-only).
    pub(crate) batches_made: u64,
    pub(crate) batches_live: u64,
    /// Thread id of the owner, 0 while abandoned.
    pub(crate) tid: usize,
    /// Slow-path view of the current slab per class.
    cur: [*mut Desc; SMALL_CLASSES],
    /// Slabs with free blocks (not current), per class.
    avail: [*mut Desc; SMALL_CLASSES],
    /// Slabs without free blocks, per class.
    full: [*mut Desc; SMALL_CLASSES],
    /// Free units of this heap's pages.
    free_units: *mut Desc,
    /// Pages whose 16 units are all free.
    free_pages: usize,
    /// Pages held for slabs.
    small_pages: usize,
    /// Slow-path visits (`maintenance`) since the last sweep for empty slabs.
    sweep_visits: u32,
    /// Visits between sweeps: [`SWEEP_PERIOD`] plus four per slab the last
    /// sweep looked at, so a sweep costs at most a quarter of a slab check
    /// per visit.
    sweep_every: u32,
    /// Bytes of large chunks this thread took since the last sweep (see
    /// [`Heap::note_large`]).
    large_since_sweep: usize,
    /// The medium (local heap) part.
    pub(crate) medium: Medium,
    /// Freed large chunks kept for this thread ([`crate::large_cache`]).
    pub(crate) large_cache: LargeCache,
    /// Outgoing remote frees.
    remote: [RemoteSlot; REMOTE_SLOTS],
    /// [`batch_cap`] for [`try_queue_remote`](Self::try_queue_remote), the
    /// remote free's fast path; 0 in check mode (and in `EMPTY_HEAP`), which
    /// turns that path off.
    remote_fast_cap: usize,
    /// Counters.
    pub(crate) counters: HeapCounters,
    /// Statistics epoch last published.
    seen_epoch: usize,
    /// Published statistics.
    pub(crate) published: Published,
    /// Incoming remote frees (written by other threads): batches, and single
    /// blocks from threads without a heap.
    inbox: CachePadded<MpscQueue>,
    /// Batches this heap made, emptied and handed back by their receivers.
    spares: CachePadded<MpscQueue>,
    /// The inbox can no longer be trusted: a node taken from it was not a
    /// block in flight to this heap.  Both free paths refuse a block whose
    /// tag marks it in flight, so this takes a double free that races with
    /// the remote free, or a free of a block reused meanwhile: the word that
    /// linked the block in the inbox was reused, so the rest of the chain may
    /// run through free or live blocks.  The inbox is not drained again
    /// (frees still sent to it are given up), no page of the heap goes back
    /// to the global heap from then on, and the heap is retired when its thread exits, keeping its memory:
    /// the inbox's tail may be any block of this heap, and a late remote free
    /// writes through it.
    pub(crate) inbox_broken: bool,
    /// Next heap in the global list of heaps.
    pub(crate) next_all: *mut Heap,
    /// Next abandoned heap.
    pub(crate) next_abandoned: *mut Heap,
    /// Sequence number (for hashing and reports).
    pub(crate) id: usize,
}

/// The descriptor of every empty cursor and empty `cur` entry.  Never
/// written (the fast path reaches it only through an empty cursor, which
/// has no free slot).
pub(crate) static EMPTY_DESC: SyncDesc = SyncDesc(Desc::new());

/// Wrapper making the static descriptor shareable.
#[repr(transparent)]
pub(crate) struct SyncDesc(pub Desc);
// SAFETY: EMPTY_DESC is never written (see above).
unsafe impl Sync for SyncDesc {}

#[inline(always)]
pub(crate) fn empty_desc() -> *mut Desc {
    &EMPTY_DESC.0 as *const Desc as *mut Desc
}

/// The heap a thread has before its first allocation: every cursor is
/// empty, so its first allocation takes the slow path, which creates or
/// adopts a real heap.
pub(crate) static EMPTY_HEAP: SyncHeap = SyncHeap(Heap::new_empty());

/// Wrapper making the static heap shareable.
#[repr(transparent)]
pub(crate) struct SyncHeap(pub Heap);
// SAFETY: EMPTY_HEAP is never written: its cursors are all empty, so the
// fast path never succeeds on it, and the slow path replaces it first.
unsafe impl Sync for SyncHeap {}

#[inline(always)]
pub(crate) fn empty_heap() -> *mut Heap {
    &EMPTY_HEAP.0 as *const Heap as *mut Heap
}

/// `tid` of a heap whose thread vanished in a `fork()` (never adopted).
pub(crate) const DEAD_TID: usize = usize::MAX;

/// Statistics epoch: bumped by a snapshot to ask every heap to publish.
pub(crate) static STATS_EPOCH: AtomicUsize = AtomicUsize::new(1);

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);

impl Heap {
    const fn new_empty() -> Heap {
        let e = &EMPTY_DESC.0 as *const Desc as *mut Desc;
        Heap {
            direct: [&EMPTY_CURSOR.0 as *const Cursor as *mut Cursor; DIRECT_LEN],
            cursors: [const { Cursor::empty() }; SMALL_CLASSES],
            allocs: 0,
            batches_made: 0,
            batches_live: 0,
            tid: 0,
            cur: [e; SMALL_CLASSES],
            avail: [ptr::null_mut(); SMALL_CLASSES],
            full: [ptr::null_mut(); SMALL_CLASSES],
            free_units: ptr::null_mut(),
            free_pages: 0,
            small_pages: 0,
            sweep_visits: 0,
            sweep_every: SWEEP_PERIOD,
            large_since_sweep: 0,
            medium: Medium::new(),
            large_cache: LargeCache::new(),
            remote: [EMPTY_SLOT; REMOTE_SLOTS],
            remote_fast_cap: 0,
            counters: HeapCounters {
                medium_allocs: 0,
                remote_frees_sent: 0,
                remote_batches_sent: 0,
                remote_frees_received: 0,
                remote_frees_kept: 0,
                coalescings: 0,
                slabs_made: 0,
                pages_taken: 0,
                pages_returned: 0,
                large_allocs: 0,
            },
            seen_epoch: 0,
            published: Published {
                blocks: [ZERO; NUM_CLASSES],
                slabs: [ZERO; SMALL_CLASSES],
                counters: [ZERO; COUNTERS],
                pages: ZERO,
                small_allocs: ZERO,
                batch_bytes: ZERO,
                large_cache_hits: ZERO,
                large_cache_puts: ZERO,
                large_cached_bytes: ZERO,
            },
            inbox: CachePadded::new(MpscQueue::new()),
            spares: CachePadded::new(MpscQueue::new()),
            inbox_broken: false,
            next_all: ptr::null_mut(),
            next_abandoned: ptr::null_mut(),
            id: 0,
        }
    }

    /// Build a heap in place at `at` (metadata memory).
    ///
    /// # Safety
    /// `at` is valid for writes of a `Heap` and never moves.
    pub(crate) unsafe fn init_at(at: *mut Heap, id: usize) {
        // The fresh heap is a copy of `EMPTY_HEAP`, which is
        // `Heap::new_empty()` built at compile time, so the 8 KiB heap is
        // copied straight into place.  Built at run time
        // (`at.write(Heap::new_empty())`), it was first assembled on the
        // stack, and every thread's first allocation touched 11 KiB of
        // stack it never used again (12 KiB more resident per thread).  A
        // `const` template of its own was a second 8 KiB image in the
        // library's relocated data (its pointers to `EMPTY_CURSOR` and
        // `EMPTY_DESC` are relocated at load), three more pages in every
        // process.
        // SAFETY: caller's contract (`at` is room for a heap that nothing
        // else uses); `EMPTY_HEAP` is never written (see `SyncHeap`), so
        // its bytes are `Heap::new_empty()`'s, and a heap in that state
        // holds nothing that a byte copy could duplicate (its lists and
        // queues are empty, and `inbox`/`spares` are initialised below).
        unsafe {
            ptr::copy_nonoverlapping(empty_heap() as *const Heap, at, 1);
            // A report and an abort, not a panic: this runs under the global
            // lock, inside an allocation, where a panic would allocate.
            #[cfg(debug_assertions)]
            if !(*at).is_pristine() {
                canopy_sys::write_stderr(b"canopy: invariant broken: EMPTY_HEAP was written, and a new heap would start from its state\n");
                canopy_sys::abort();
            }
            (*at).id = id;
            for c in 0..SMALL_CLASSES {
                for g in granules(c) {
                    (*at).direct[g] = &mut (*at).cursors[c];
                }
            }
            (*at).inbox.init();
            (*at).spares.init();
            (*at).remote_fast_cap = if crate::options().check { 0 } else { batch_cap() };
            if !crate::options().check {
                for c in 0..SMALL_CLASSES {
                    (*at).cursors[c].kept_room = kept_cap(c, crate::options().keep_bytes);
                }
            }
        }
    }

    /// Whether the heap is in `Heap::new_empty()`'s state in everything a
    /// thread could have changed (checked on each copy of `EMPTY_HEAP` in
    /// debug builds): no blocks, slabs, pages, batches or links.
    #[cfg(debug_assertions)]
    fn is_pristine(&self) -> bool {
        let cursor = |c: &Cursor| {
            c.kept.is_null()
                && c.taken == 0
                && c.kept_room == 0
                && c.desc == empty_desc()
                && ptr::eq(c.word, &ZERO_WORD)
                && c.base == 0
                && c.size == 0
        };
        let empty_cursor = &EMPTY_CURSOR.0 as *const Cursor as *mut Cursor;
        self.direct.iter().all(|&d| d == empty_cursor)
            && self.cursors.iter().all(cursor)
            && cursor(&EMPTY_CURSOR.0)
            && self.cur.iter().all(|&d| d == empty_desc())
            && self.avail.iter().chain(self.full.iter()).all(|d| d.is_null())
            && self.remote.iter().all(|r| r.heap.is_null() && r.batch.is_null() && r.count == 0)
            && self.free_units.is_null()
            && self.free_pages == 0
            && self.small_pages == 0
            && self.allocs == 0
            && self.batches_made == 0
            && self.batches_live == 0
            && self.tid == 0
            && self.remote_fast_cap == 0
            && !self.inbox_broken
            && self.next_all.is_null()
            && self.next_abandoned.is_null()
    }

    // ----- lists of slabs (doubly linked through Desc::next/prev) -----

    unsafe fn list_push(head: &mut *mut Desc, d: *mut Desc) {
        // SAFETY: d is a valid descriptor owned by this heap, on no list.
        unsafe {
            (*d).prev = ptr::null_mut();
            (*d).next = *head;
            if !head.is_null() {
                (**head).prev = d;
            }
        }
        *head = d;
    }

    unsafe fn list_remove(head: &mut *mut Desc, d: *mut Desc) {
        // SAFETY: d is on the list `head`.
        unsafe {
            if (*d).prev.is_null() {
                *head = (*d).next;
            } else {
                (*(*d).prev).next = (*d).next;
            }
            if !(*d).next.is_null() {
                (*(*d).next).prev = (*d).prev;
            }
            (*d).next = ptr::null_mut();
            (*d).prev = ptr::null_mut();
        }
    }

    // ----- allocation -----

    /// The small-allocation slow path.  `self` is a live heap owned by the
    /// calling thread.
    ///
    /// # Safety
    /// Called by the owning thread only.
    pub(crate) unsafe fn alloc_small_slow(&mut self, c: usize) -> *mut u8 {
        // SAFETY: owner thread (caller's contract) for everything below.
        unsafe {
            // Take in the frees other threads sent (the blocks come back to
            // their slabs' bitmaps), send ours; then the lowest word of the
            // current slab with a free slot.
            self.maintenance();
            self.alloc_small_refill(c)
        }
    }

    /// [`alloc_small_slow`](Self::alloc_small_slow) without the maintenance
    /// (no inbox drained, no batch sent): for a block the heap needs for
    /// itself in the middle of a remote free.
    ///
    /// # Safety
    /// Called by the owning thread only.
    unsafe fn alloc_small_refill(&mut self, c: usize) -> *mut u8 {
        // SAFETY: owner thread (caller's contract) for everything below.
        unsafe {
            let d = self.cur[c];
            if d != empty_desc() {
                if let Some(p) = self.take_from(c, d) {
                    return p;
                }
                // Exhausted: to the full list.
                self.set_current(c, empty_desc());
                self.make_full(c, d);
            }
            // A slab with free slots?
            while !self.avail[c].is_null() {
                let s = self.avail[c];
                Heap::list_remove(&mut self.avail[c], s);
                self.set_current(c, s);
                if let Some(p) = self.take_from(c, s) {
                    return p;
                }
                self.set_current(c, empty_desc());
                self.make_full(c, s);
            }
            // A fresh slab.
            let Some(s) = self.new_slab(c) else {
                return ptr::null_mut();
            };
            self.set_current(c, s);
            self.take_from(c, s).unwrap_or(ptr::null_mut())
        }
    }

    /// Put slab `d` of class `c` (on no list, not current) on the full list.
    /// A full slab has no owner, so a free into it takes the slow path, which
    /// moves it back to `avail` (`free_small_post`): the free fast path needs
    /// no flag test.
    unsafe fn make_full(&mut self, c: usize, d: *mut Desc) {
        // SAFETY: d is a slab of this heap on no list (caller's contract).
        unsafe {
            (*d).flags |= FLAG_FULL;
            (*d).owner.store(0, Ordering::Relaxed);
            Heap::list_push(&mut self.full[c], d);
        }
    }

    /// Make `d` the current slab of class `c` (or none, with `EMPTY_DESC`).
    /// Its cursor is set by the next `take_from`.
    #[inline]
    fn set_current(&mut self, c: usize, d: *mut Desc) {
        self.settle(c);
        self.cur[c] = d;
        let k = &mut self.cursors[c];
        *k = Cursor { kept_room: k.kept_room, kept: k.kept, ..Cursor::empty() };
    }

    /// Add the blocks class `c`'s cursor took to the heap's allocation count.
    #[inline]
    fn settle(&mut self, c: usize) {
        let cur = &mut self.cursors[c];
        if cur.taken != 0 {
            self.allocs += cur.taken;
            cur.taken = 0;
        }
    }

    /// Take the lowest free slot of the current slab `d` of class `c` and
    /// point the class's cursor at its word (outside check mode); `None` if
    /// the slab has no free slot.
    unsafe fn take_from(&mut self, c: usize, d: *mut Desc) -> Option<*mut u8> {
        let shape = &SHAPES[c];
        // SAFETY: d is a SMALL slab of this heap (owner thread), so its
        // bitmap words (shape.words of them) are ours to write.
        unsafe {
            let words = arena::bitmap(desc_index(d));
            for w in 0..shape.words as usize {
                let word = &*words.add(w);
                let Some((rest, bit)) = slab::take_lowest_bits(word.load(Ordering::Relaxed)) else {
                    continue;
                };
                word.store(rest, Ordering::Relaxed);
                let size = shape.size as usize;
                let base = arena::unit_addr(d) as usize + w * 64 * size;
                let p = (base + bit as usize * size) as *mut u8;
                // Clear the free mark (see arena::Block).
                (*(p as *mut Block)).tag = 0;
                self.allocs += 1;
                if crate::options().check {
                    crate::check::mark_allocated(d, p);
                } else {
                    self.settle(c);
                    let k = &mut self.cursors[c];
                    (k.word, k.base, k.size, k.desc) = (word, base, size, d);
                }
                return Some(p);
            }
            None
        }
    }

    /// Make a fresh slab of class `c` from a free unit.
    unsafe fn new_slab(&mut self, c: usize) -> Option<*mut Desc> {
        if self.free_units.is_null() && self.sweep_visits >= self.sweep_every / 2 {
            // Before taking a page: slabs emptied by frees on the fast path
            // (at most twice as often as the periodic sweep).
            // SAFETY: owner thread (caller's contract).
            unsafe { self.sweep_empty() };
        }
        if self.free_units.is_null() && !self.take_page() {
            return None;
        }
        // SAFETY: free_units holds HEAP_FREE units of this heap.
        unsafe {
            let d = self.free_units;
            Heap::list_remove(&mut self.free_units, d);
            let page_first = desc((desc_index(d)) & !(PAGE_UNITS - 1));
            if (*page_first).page_free as usize == PAGE_UNITS {
                self.free_pages -= 1;
            }
            (*page_first).page_free -= 1;
            let shape = &SHAPES[c];
            let words = arena::bitmap(desc_index(d));
            for w in 0..shape.words as usize {
                (*words.add(w)).store(shape.fresh_word(w), Ordering::Relaxed);
            }
            (*d).class = c as u8;
            (*d).flags = 0;
            (*d).divc = SMALL_TESTS[c].0;
            (*d).limit = SMALL_TESTS[c].1;
            (*d).b = shape.size;
            (*d).heap.store(self as *mut Heap, Ordering::Relaxed);
            (*d).kind = kind::SMALL;
            if crate::options().check {
                crate::check::clear_unit(d);
            } else {
                (*d).owner.store(self.tid, Ordering::Relaxed);
            }
            self.counters.slabs_made += 1;
            Some(d)
        }
    }

    /// Take a 1 MiB page from the global heap for slabs.
    fn take_page(&mut self) -> bool {
        let Some(idx) = global::take_page() else {
            return false;
        };
        // SAFETY: the page's units are now ours.
        unsafe {
            for i in (idx..idx + PAGE_UNITS).rev() {
                let d = desc(i);
                (*d).owner.store(0, Ordering::Relaxed);
                (*d).kind = kind::HEAP_FREE;
                (*d).heap.store(self as *mut Heap, Ordering::Relaxed);
                Heap::list_push(&mut self.free_units, d);
            }
            (*desc(idx)).page_free = PAGE_UNITS as u8;
        }
        self.free_pages += 1;
        self.small_pages += 1;
        self.counters.pages_taken += 1;
        true
    }

    /// Return an empty slab's unit to the heap's free units; give whole free
    /// pages back to the global heap beyond the retain limit.
    unsafe fn release_slab(&mut self, d: *mut Desc) {
        // SAFETY: d is an empty slab of this heap on no list.
        unsafe {
            debug_assert!(slab_empty(d), "released a slab with live blocks");
            (*d).owner.store(0, Ordering::Relaxed);
            (*d).kind = kind::HEAP_FREE;
            (*d).flags = 0;
            Heap::list_push(&mut self.free_units, d);
            let first_idx = desc_index(d) & !(PAGE_UNITS - 1);
            let page_first = desc(first_idx);
            (*page_first).page_free += 1;
            if (*page_first).page_free as usize == PAGE_UNITS {
                self.free_pages += 1;
                if self.free_pages > crate::options().heap_retain_pages && !self.inbox_broken {
                    self.return_page(first_idx);
                }
            }
        }
    }

    /// Give a fully free page back to the global heap.
    unsafe fn return_page(&mut self, first_idx: usize) {
        // SAFETY: all 16 units of the page are HEAP_FREE units on free_units.
        unsafe {
            for i in first_idx..first_idx + PAGE_UNITS {
                let u = desc(i);
                debug_assert_eq!((*u).kind, kind::HEAP_FREE);
                Heap::list_remove(&mut self.free_units, u);
                (*u).heap.store(ptr::null_mut(), Ordering::Relaxed);
                (*u).page_free = 0;
            }
        }
        self.free_pages -= 1;
        self.small_pages -= 1;
        self.counters.pages_returned += 1;
        give_span_back(first_idx, PAGE_UNITS, true);
    }

    // ----- freeing -----

    /// The owner's free of a small block `p` in slab `d` off the fast path
    /// (a full slab, check mode, a remote free taken in): set its bit.
    /// Refuses (changing nothing) a pointer that starts no slot and a block
    /// that is free already.  A full slab goes back to `avail`; a slab whose
    /// word this free made wholly free is checked for emptiness.
    #[inline]
    pub(crate) unsafe fn free_small_local(&mut self, d: *mut Desc, p: *mut u8) -> Result<(), BadFree> {
        // SAFETY: d is a slab of this heap (owner thread), so its bitmap is
        // ours to write; the slot index is below `slots`, inside the bitmap.
        unsafe {
            let off = p as usize - arena::unit_addr(d) as usize;
            let i = slab::locate_small((*d).divc, (*d).limit, off as u32).ok_or(BadFree::NotABlock)?;
            let word = &*arena::bitmap(desc_index(d)).add(i / 64);
            let now = slab::release_bits(word.load(Ordering::Relaxed), i).map_err(|_| BadFree::DoubleFree)?;
            word.store(now, Ordering::Relaxed);
            (*(p as *mut Block)).tag = free_mark();
            if (*d).flags != 0 || now == SHAPES[(*d).class as usize].fresh_word(i / 64) {
                self.free_small_post(d);
            }
            Ok(())
        }
    }

    /// After a free off the fast path: a full slab becomes available again;
    /// an empty slab that is not current goes back to the free units unless
    /// it is the class's only slab with room.
    #[cold]
    pub(crate) unsafe fn free_small_post(&mut self, d: *mut Desc) {
        // SAFETY: d is a slab of this heap (owner thread).
        unsafe {
            let c = (*d).class as usize;
            if (*d).flags & FLAG_FULL != 0 {
                (*d).flags &= !FLAG_FULL;
                Heap::list_remove(&mut self.full[c], d);
                Heap::list_push(&mut self.avail[c], d);
                if !crate::options().check {
                    // Back on the fast path (see `make_full`).
                    (*d).owner.store(self.tid, Ordering::Relaxed);
                }
            }
            if self.cur[c] != d && slab_empty(d) {
                self.release_if_not_last(c, d);
            }
        }
    }

    /// Release empty slab `d` of class `c` (on `avail`), unless it is the
    /// class's last slab with room (no current slab, nothing else on
    /// `avail`): that one stays for the class's next allocation.  A unit
    /// released and taken again by another class is touched by every class
    /// it ever held, so a heap that empties and refills its classes (a
    /// thread adopting the heap of one that ended) spread them over ever
    /// more resident pages (thread churn: half of every slab resident, for a
    /// few kilobytes in use in each).
    ///
    /// # Safety
    /// Owner thread; `d` is an empty slab of class `c` on this heap's `avail` list.
    unsafe fn release_if_not_last(&mut self, c: usize, d: *mut Desc) {
        let last = self.cur[c] == empty_desc() && self.avail[c] == d && {
            // SAFETY: d is on this heap's avail list (caller's contract).
            unsafe { (*d).next.is_null() }
        };
        if !last {
            // SAFETY: as above; an empty slab on no list is released.
            unsafe {
                Heap::list_remove(&mut self.avail[c], d);
                self.release_slab(d);
            }
        }
    }

    /// Empty slabs of class `c` on this heap's `avail` list, for tests.
    #[cfg(test)]
    pub(crate) fn empty_avail_slabs(&self, c: usize) -> usize {
        let mut n = 0;
        let mut d = self.avail[c];
        while !d.is_null() {
            // SAFETY: slabs of this heap (owner thread).
            unsafe {
                n += slab_empty(d) as usize;
                d = (*d).next;
            }
        }
        n
    }

    /// Count a large chunk of `bytes` this thread is about to take from the
    /// global heap, and sweep first once such chunks add up to a sixteenth
    /// of the pages the heap holds for slabs (at least 4 MiB: a sweep walks
    /// the lists of every class, some 180 instructions when they are empty,
    /// and with a floor of 1 MiB that was 6 % of the instructions of a loop
    /// allocating and freeing 64..544 KiB blocks).  A program
    /// that frees its small blocks and then allocates large ones (a change
    /// of phase) would otherwise keep the emptied slabs, and the global
    /// heap would grow for the large chunks instead of reusing their pages:
    /// 1.6 million 64 B blocks freed, then 100 chunks of 1 MiB, peaked at
    /// 218 MB of RSS against 120 MB when slabs were released at once.  A
    /// sweep costs at most one slab check per 4 KiB of large chunks.
    ///
    /// # Safety
    /// Owner thread.
    pub(crate) unsafe fn note_large(&mut self, bytes: usize) {
        self.large_since_sweep = self.large_since_sweep.saturating_add(bytes);
        if self.large_since_sweep >= (self.small_pages * arena::PAGE / 16).max(4 * arena::PAGE) {
            // SAFETY: owner thread (caller's contract).
            unsafe { self.sweep_empty() };
        }
    }

    /// Find the empty slabs on the `avail` lists and release them (each
    /// class keeps one, see [`release_if_not_last`](Self::release_if_not_last)).
    ///
    /// The free fast path does not count a slab's live blocks (a count in the
    /// descriptor was a store into a line that other threads read on every
    /// remote free of the slab's blocks, and a line more for every free to
    /// write back), so a slab that its owner's frees empty is found here:
    /// before the heap takes a page from the global heap, every
    /// [`SWEEP_PERIOD`] slow-path visits, and when the thread exits.  Frees
    /// off the fast path (remote frees taken in, frees into full slabs, check
    /// mode) release at once a slab they empty.
    ///
    /// # Safety
    /// Called by the owning thread only (or the only thread after `fork`).
    pub(crate) unsafe fn sweep_empty(&mut self) {
        // This heap's kept blocks first, so that the slabs they alone kept
        // from being empty are found (blocks freed unchecked stay kept until
        // the thread allocates their class again, which may be never).
        // SAFETY: owner thread (caller's contract).
        unsafe { self.return_kept(true) };
        let mut scanned = 0u32;
        for c in 0..SMALL_CLASSES {
            let mut s = self.avail[c];
            while !s.is_null() {
                scanned = scanned.saturating_add(1);
                // SAFETY: slabs on this heap's avail list (owner thread).
                unsafe {
                    let next = (*s).next;
                    if slab_empty(s) {
                        self.release_if_not_last(c, s);
                    }
                    s = next;
                }
            }
        }
        self.sweep_visits = 0;
        self.sweep_every = SWEEP_PERIOD.saturating_add(scanned.saturating_mul(4));
        self.large_since_sweep = 0;
    }

    /// The remote free's fast path: put `p`, a small block of heap `target`
    /// (this heap too: then nothing matches) already validated by the caller, in the batch open
    /// for `target` if it has room for more than this pointer.  False,
    /// changing nothing, otherwise: no batch open for `target` (the slow
    /// path opens one), or check mode (`remote_fast_cap` is 0).  A slot that
    /// names a heap always holds a batch block, and no slot names this heap
    /// (`send_in_flight` frees such blocks at home), so two compares decide.
    ///
    /// # Safety
    /// Called by this heap's thread, on a heap that is not `EMPTY_HEAP`.
    #[inline(always)]
    pub(crate) unsafe fn try_queue_remote(&mut self, target: *mut Heap, p: *mut u8) -> bool {
        // SAFETY: forwarded.
        unsafe { self.queue_if_room(target, p, self.remote_fast_cap) }
    }

    /// Put `p` into the batch open for `target` if that batch has room for
    /// more than this pointer (`count + 1 < cap`); false, changing nothing,
    /// otherwise.  The common case of every remote free, fast path or not.
    ///
    /// # Safety
    /// As for [`try_queue_remote`](Self::try_queue_remote).
    #[inline(always)]
    unsafe fn queue_if_room(&mut self, target: *mut Heap, p: *mut u8, cap: usize) -> bool {
        let me = self as *const Heap;
        let slot = &mut self.remote[(target as usize >> 6) % REMOTE_SLOTS];
        if slot.heap == target && slot.count + 1 < cap {
            debug_assert!(!slot.batch.is_null(), "a slot names a heap but holds no batch");
            debug_assert!(!core::ptr::eq(target, me), "a slot names its own heap");
            // SAFETY: the batch is ours and has room (count + 1 < cap).
            unsafe { *(*slot.batch).ptrs.as_mut_ptr().add(slot.count) = p };
            slot.count += 1;
            self.counters.remote_frees_sent += 1;
            return true;
        }
        false
    }

    /// Keep `p`, a block of class `c` of another heap, for this thread's next
    /// allocation of the class, if the class's blocks are whole cache lines
    /// ([`keeps_remote`]), its kept list has room and the thread allocates
    /// in that class (its cursor has a current slab: a
    /// thread that only frees, such as a consumer or a counting thread,
    /// keeps nothing); false, changing nothing, otherwise.  The caller has
    /// validated the block (a live block of a small slab of another heap)
    /// and marks it in flight.
    ///
    /// # Safety
    /// Called by this heap's thread, on a heap that is not `EMPTY_HEAP`;
    /// `c < SMALL_CLASSES`.
    #[inline(always)]
    pub(crate) unsafe fn keep(&mut self, c: usize, p: *mut u8) -> bool {
        // SAFETY: c is a small class (caller's contract); the cursor is ours.
        let k = unsafe { self.cursors.get_unchecked_mut(c) };
        if k.kept_room == 0 || k.desc == empty_desc() || !keeps_remote(k.size) {
            return false;
        }
        // SAFETY: our cursor, with room; p is a dead block of class c
        // (caller's contract).
        unsafe { Cursor::push_kept(k, p as *mut Block) };
        self.counters.remote_frees_kept += 1;
        true
    }

    /// Send every kept block to its owner (see [`keep`](Self::keep)), or
    /// back into its slab if it is this heap's: at thread exit, in
    /// `collect()`, and in tests.
    ///
    /// # Safety
    /// Called by this heap's thread.
    pub(crate) unsafe fn flush_kept(&mut self) {
        // SAFETY: forwarded.
        unsafe { self.return_kept(false) }
    }

    /// Put every kept block of this heap back into its slab, keeping the
    /// others' (before a sweep for empty slabs: a kept block of this heap
    /// would keep its slab from being released), or, with `own_only` false,
    /// send the others home too ([`flush_kept`](Self::flush_kept)).
    ///
    /// A list that comes back to a block this walk already put back (no
    /// longer marked in flight), or runs past its cap, is a cycle, made by
    /// a block freed twice through `free_class_unchecked`: it is reported,
    /// and the rest is left alone (leaked) rather than walked forever.
    ///
    /// # Safety
    /// Called by this heap's thread.
    pub(crate) unsafe fn return_kept(&mut self, own_only: bool) {
        let me = self as *mut Heap;
        let keep_bytes = crate::options().keep_bytes;
        for c in 0..SMALL_CLASSES {
            let mut b = self.cursors[c].kept;
            if b.is_null() {
                continue;
            }
            let cap = kept_cap(c, keep_bytes);
            let (mut stay, mut staying, mut walked) = (ptr::null_mut::<Block>(), 0u32, 0u32);
            // SAFETY: the kept blocks are dead small blocks marked in flight
            // (see `keep`, `free_class_unchecked` and `CanopyUnchecked`);
            // their descriptors say whose.
            unsafe {
                let key = flight_tag();
                while !b.is_null() {
                    // Past the cap, or a block no longer marked in flight
                    // (this walk already put it back): a cycle.
                    if walked == cap || (*b).tag != key {
                        crate::report::kept_list_broken(b as *const u8, c);
                        break;
                    }
                    walked += 1;
                    let next = (*b).next;
                    let owner = (*desc(arena::unit_index(b as usize))).heap.load(Ordering::Relaxed);
                    if owner == me {
                        self.free_sent_home(b as *mut u8);
                    } else if own_only {
                        (*b).next = stay;
                        stay = b;
                        staying += 1;
                    } else {
                        self.free_remote(owner, b as *mut u8);
                    }
                    b = next;
                }
            }
            self.cursors[c].kept = stay;
            self.cursors[c].kept_room = cap - staying;
        }
    }

    /// Queue a free of `p` (a block of another heap `target`) for sending.
    #[inline]
    pub(crate) unsafe fn free_remote(&mut self, target: *mut Heap, p: *mut u8) {
        // SAFETY: forwarded (this heap's thread).
        unsafe {
            if !self.queue_if_room(target, p, batch_cap()) {
                self.free_remote_slow(target, p, (target as usize >> 6) % REMOTE_SLOTS);
            }
        }
    }

    /// [`free_remote`](Self::free_remote) when the slot has no batch for
    /// `target` or this pointer fills it.
    #[cold]
    #[inline(never)]
    unsafe fn free_remote_slow(&mut self, target: *mut Heap, p: *mut u8, slot_i: usize) {
        let cap = batch_cap();
        self.counters.remote_frees_sent += 1;
        // SAFETY: p is a dead block of `target` in flight (caller's
        // contract); the batches in our slots are ours to fill.
        unsafe {
            loop {
                let slot = self.remote[slot_i];
                if slot.heap == target && !slot.batch.is_null() {
                    let b = slot.batch;
                    *(*b).ptrs.as_mut_ptr().add(slot.count) = p;
                    let count = slot.count + 1;
                    if count >= cap {
                        self.remote[slot_i] = EMPTY_SLOT;
                        self.send(RemoteSlot { heap: target, batch: b, count });
                    } else {
                        self.remote[slot_i].count = count;
                    }
                    return;
                }
                if !slot.batch.is_null() {
                    // Another destination's batch: send it (or keep its
                    // block if it is empty) and start one for `target`.
                    self.remote[slot_i] = EMPTY_SLOT;
                    if slot.count > 0 {
                        self.send(slot);
                        continue;
                    }
                    self.remote[slot_i] = RemoteSlot { heap: target, batch: slot.batch, count: 0 };
                    continue;
                }
                // No batch block at hand.  Taking one may run other frees of
                // this thread (`new_slab` takes in abandoned heaps' frees),
                // so the slot is read again afterwards.
                let b = self.take_batch();
                if b.is_null() {
                    // Out of memory: the block goes alone, as from a thread
                    // without a heap.
                    push_direct(target, p);
                    return;
                }
                if self.remote[slot_i].batch.is_null() {
                    self.remote[slot_i] = RemoteSlot { heap: target, batch: b, count: 0 };
                } else {
                    (*b).link.next.store(ptr::null_mut(), Ordering::Relaxed);
                    self.spares.push(b as *mut Node);
                }
            }
        }
    }

    /// An empty batch block: one handed back by a receiver, or a new block
    /// of this heap (null if memory is exhausted).
    unsafe fn take_batch(&mut self) -> *mut Batch {
        // SAFETY: this heap's thread is the only consumer of its spares; a
        // new block is ours.
        unsafe {
            let mut b = self.spares.pop() as *mut Batch;
            if b.is_null() {
                let (_, c) = batch_shape();
                b = self.alloc_small_refill(c) as *mut Batch;
                if b.is_null() {
                    return b;
                }
                self.batches_made += 1;
                self.batches_live += 1;
                (*b).tag = arena::batch_tag();
            }
            debug_assert_eq!((*b).tag, arena::batch_tag(), "a spare batch lost its tag");
            (*b).count = 0;
            b
        }
    }

    unsafe fn send(&mut self, s: RemoteSlot) {
        debug_assert!(s.count > 0 && !s.batch.is_null());
        self.counters.remote_batches_sent += 1;
        // SAFETY: the batch block is ours until pushed; the target heap is
        // never freed (heaps are recycled, not unmapped).
        unsafe {
            (*s.batch).count = s.count;
            (*s.heap).inbox.push(s.batch as *mut Node);
        }
    }

    /// Send every pending remote batch.
    pub(crate) fn flush_remote(&mut self) {
        for i in 0..REMOTE_SLOTS {
            let s = self.remote[i];
            if s.count > 0 {
                self.remote[i] = EMPTY_SLOT;
                // SAFETY: as in `send`.
                unsafe { self.send(s) };
            }
        }
    }

    /// Give back the empty batch blocks this heap holds (slots and spares):
    /// before the heap is abandoned.
    unsafe fn release_batches(&mut self) {
        // SAFETY: owner; the blocks are this heap's (made by `take_batch`).
        unsafe {
            for i in 0..REMOTE_SLOTS {
                let s = self.remote[i];
                if !s.batch.is_null() {
                    debug_assert_eq!(s.count, 0, "release_batches after flush_remote");
                    self.remote[i] = EMPTY_SLOT;
                    self.free_own_block(s.batch as *mut u8);
                    self.batches_live -= 1;
                }
            }
            loop {
                let b = self.spares.pop();
                if b.is_null() {
                    break;
                }
                self.free_own_block(b as *mut u8);
                self.batches_live -= 1;
            }
        }
    }

    /// Free a small block this heap allocated for itself.
    unsafe fn free_own_block(&mut self, p: *mut u8) {
        // SAFETY: p is a live small block of this heap (caller's contract).
        unsafe {
            let d = desc(arena::unit_index(p as usize));
            if crate::options().check {
                let _ = crate::check::check_and_clear(d, p);
            }
            let r = self.free_small_local(d, p);
            debug_assert!(r.is_ok(), "a batch block of this heap was not live");
        }
    }

    /// Take every block other threads have freed to us and free it locally.
    pub(crate) unsafe fn drain_inbox(&mut self) {
        if self.inbox_broken || self.inbox.is_empty_hint() {
            return;
        }
        loop {
            // SAFETY: the owner is the only consumer.
            let n = unsafe { self.inbox.pop() };
            if n.is_null() {
                break;
            }
            // SAFETY: n was linked into our inbox by a trusted link (every
            // node before it was a batch or a block in flight to us).
            let ok = unsafe {
                if (*(n as *mut Block)).tag == arena::batch_tag() && self.take_batch_in(n as *mut Batch) {
                    true
                } else {
                    self.counters.remote_frees_received += 1;
                    self.free_owned(n as *mut u8, true)
                }
            };
            if !ok {
                // Its link to the next node is not to be followed (see
                // `inbox_broken`).  From now on no page of this heap goes
                // back to the global heap: the inbox's tail may lie in any.
                self.inbox_broken = true;
                self.medium.keep_pages = true;
                return;
            }
        }
    }

    /// Free every block of batch `b` (from the inbox) and hand the batch back
    /// to the heap that made it.  False, changing nothing, if `b` is not a
    /// batch block (a single block whose data matched the batch tag).
    unsafe fn take_batch_in(&mut self, b: *mut Batch) -> bool {
        // SAFETY: b came through our inbox; it is checked to be a live small
        // block of another heap before its fields are trusted.
        unsafe {
            let idx = arena::unit_index(b as usize);
            if idx >= arena::arena_units() {
                return false;
            }
            let d = desc(idx);
            let maker = (*d).heap.load(Ordering::Relaxed);
            let n = (*b).count;
            if (*d).kind != kind::SMALL || core::ptr::eq(maker, self) || maker.is_null() || n == 0 || n > MAX_BATCH || small_slot_start(d, b as *mut u8).is_none() {
                return false;
            }
            let ptrs = (*b).ptrs.as_ptr();
            self.counters.remote_frees_received += n as u64;
            let base = arena::arena_base();
            let units = arena::arena_units();
            let key = arena::flight_tag();
            for i in 0..n {
                #[cfg(target_arch = "x86_64")]
                if i + 4 < n {
                    // The blocks sit in the sender's cache: ask for the
                    // lines a few entries ahead, for writing (the tag is
                    // written), so that their misses overlap.
                    // SAFETY: a prefetch never faults and changes no memory.
                    core::arch::asm!("prefetchw [{0}]", in(reg) *ptrs.add(i + 4), options(nostack, preserves_flags, readonly));
                }
                let p = *ptrs.add(i);
                if !self.take_in_small(p, base, units, key) {
                    // Not the common case (a medium chunk, a slab that
                    // needs its lists changed, a block no longer in flight
                    // to us, which is reported; the rest of the batch is
                    // unaffected).
                    self.free_owned(p, false);
                }
            }
            (*b).link.next.store(ptr::null_mut(), Ordering::Relaxed);
            (*maker).spares.push(b as *mut Node);
            true
        }
    }

    /// The common case of a block taken in from a batch, with the arena's
    /// base and size and the flight mark loaded once per batch: a small
    /// block of this heap, marked in flight, whose bit was clear and which
    /// does not change its slab's lists (the slab is not full, and the word
    /// it sets is not all free, so the slab cannot have become empty).  Its
    /// bit is set and its mark becomes the free mark.  False, changing
    /// nothing, for anything else, which [`free_owned`](Self::free_owned)
    /// then handles (or reports).
    ///
    /// # Safety
    /// Owner thread; `base`, `units` and `key` are the arena's and the
    /// process's (`arena_base`, `arena_units`, `flight_tag`).
    #[inline(always)]
    unsafe fn take_in_small(&mut self, p: *mut u8, base: usize, units: usize, key: usize) -> bool {
        let idx = (p as usize).wrapping_sub(base) >> UNIT_SHIFT;
        if idx >= units {
            return false;
        }
        // SAFETY: idx is a reserved unit, so its descriptor and bitmap words
        // are mapped; a block of this heap's slab is ours to write, and p is
        // written only once it is known to start a slot of such a slab.
        unsafe {
            let d = arena::desc_at(base, idx);
            if !core::ptr::eq((*d).heap.load(Ordering::Relaxed), self) || (*d).kind != kind::SMALL || (*d).flags != 0 {
                return false;
            }
            let b = p as *mut Block;
            if (*b).tag != key {
                return false;
            }
            let Some(i) = slab::locate_small((*d).divc, (*d).limit, (p as usize & (UNIT - 1)) as u32) else {
                return false;
            };
            let word = &*arena::bitmap_at(base, idx).add(i / 64);
            let x = word.load(Ordering::Relaxed);
            let Ok(now) = slab::release_bits(x, i) else {
                return false;
            };
            if SHAPES[(*d).class as usize].may_be_empty(now) {
                return false;
            }
            word.store(now, Ordering::Relaxed);
            (*b).tag = key ^ 1;
            true
        }
    }

    /// Free a block of this heap that its thread marked in flight before it
    /// found the heap was its own (see `batching_heap` in lib.rs).
    ///
    /// # Safety
    /// Owner thread; `p` is a block of this heap marked in flight.
    pub(crate) unsafe fn free_sent_home(&mut self, p: *mut u8) {
        // SAFETY: forwarded.
        unsafe { self.free_owned(p, false) };
    }

    /// Free a block sent to this heap (from the inbox: `linked`, a single
    /// block queued by its first word, or from a batch).  Returns false,
    /// after reporting it, if `p` is not a block in flight to this heap.
    unsafe fn free_owned(&mut self, p: *mut u8, linked: bool) -> bool {
        let idx = arena::unit_index(p as usize);
        if idx >= arena::arena_units() {
            crate::report::bad_inbox_node(p, linked);
            return false;
        }
        // SAFETY: idx is an arena unit; p is validated before it is used.
        unsafe {
            let d = desc(idx);
            // A block sent as a remote free still carries the in-flight mark
            // (tag or chunk state) and lies in a unit of this heap.  If not,
            // its owner freed it again meanwhile (a double free) and the unit
            // may even have been reused: drop it rather than list it twice.
            let mine = core::ptr::eq((*d).heap.load(Ordering::Relaxed), self);
            match (*d).kind {
                kind::SMALL if mine && (*(p as *mut Block)).tag == flight_tag() => {
                    (*(p as *mut Block)).tag = 0;
                    match self.free_small_local(d, p) {
                        Ok(()) => {}
                        // Sent by a thread that read the bitmap before the
                        // owner freed it too: refused here, exactly.
                        Err(BadFree::DoubleFree) => crate::report::bad_free("free", p, BadFree::DoubleFree, (*d).b as usize, Some((*d).class as usize)),
                        Err(_) => {
                            crate::report::bad_inbox_node(p, linked);
                            return false;
                        }
                    }
                }
                kind::MEDIUM if mine && crate::medium::Medium::is_in_flight(p) => self.medium.free_in_flight(&mut self.counters, p),
                _ => {
                    crate::report::bad_inbox_node(p, linked);
                    return false;
                }
            }
        }
        true
    }

    /// For `collect()`: give back the medium pages with no live chunk,
    /// the one being bumped included (it stays otherwise, and where it is
    /// the top of the arena, the global heap cannot give the free units
    /// below it back to the OS under a limit on address space).
    ///
    /// # Safety
    /// Called by the owner thread.
    pub(crate) unsafe fn release_empty_medium(&mut self) {
        // SAFETY: owner thread (caller's contract).
        unsafe { self.medium.release_empty_pages(&mut self.counters) }
    }

    /// Slow-path housekeeping: drain, send, publish statistics.
    #[inline]
    pub(crate) unsafe fn maintenance(&mut self) {
        // SAFETY: owner thread.
        unsafe { self.drain_inbox() };
        self.flush_remote();
        self.sweep_visits += 1;
        if self.sweep_visits >= self.sweep_every {
            // SAFETY: owner thread.
            unsafe { self.sweep_empty() };
        }
        let e = STATS_EPOCH.load(Ordering::Relaxed);
        if e != self.seen_epoch {
            self.publish();
        }
        #[cfg(feature = "check-full")]
        self.check_full();
    }

    /// Under `check-full`: check every invariant, abort with the broken one.
    #[cfg(feature = "check-full")]
    fn check_full(&self) {
        let r = self.check().and_then(|()| {
            let locked = crate::solo::lock();
            // SAFETY: global lock held.
            let r = unsafe { global::state().check() };
            crate::solo::unlock(locked);
            r
        });
        if let Err(e) = r {
            let mut b = crate::report::Buf::new();
            b.str("canopy: invariant broken: ").str(e).str("\n");
            canopy_sys::write_stderr(b.as_bytes());
            canopy_sys::abort();
        }
    }

    /// Publish this heap's figures for the statistics.
    // `c` indexes six per-class arrays at once; a counted loop says so best.
    #[allow(clippy::needless_range_loop)]
    pub(crate) fn publish(&mut self) {
        self.seen_epoch = STATS_EPOCH.load(Ordering::Relaxed);
        for c in 0..SMALL_CLASSES {
            let mut blocks = 0u64;
            let mut slabs = 0u64;
            for head in [self.cur[c], self.avail[c], self.full[c]] {
                let mut d = head;
                let only_one = head == self.cur[c];
                while !d.is_null() && d != empty_desc() {
                    // SAFETY: slabs of this heap, read by their owner.
                    unsafe {
                        blocks += u64::from(SHAPES[c].slots - free_slots(d));
                        slabs += 1;
                        d = if only_one { ptr::null_mut() } else { (*d).next };
                    }
                }
            }
            // This heap's blocks on its kept lists are free to the program,
            // though their bits say live: not in use.
            let blocks = blocks.saturating_sub(self.own_kept(c));
            self.published.blocks[c].store(blocks, Ordering::Relaxed);
            self.published.slabs[c].store(slabs, Ordering::Relaxed);
        }
        // Batch blocks are the allocator's own: metadata, not blocks in use.
        let (_, bc) = batch_shape();
        let b = &self.published.blocks[bc];
        b.store(b.load(Ordering::Relaxed).saturating_sub(self.batches_live), Ordering::Relaxed);
        self.published.batch_bytes.store(self.batches_live * SHAPES[bc].size as u64, Ordering::Relaxed);
        let medium = self.medium.live_per_class();
        for (i, v) in medium.iter().enumerate() {
            self.published.blocks[SMALL_CLASSES + i].store(*v, Ordering::Relaxed);
        }
        let counters = self.counters.as_array();
        for (i, v) in counters.iter().enumerate() {
            self.published.counters[i].store(*v, Ordering::Relaxed);
        }
        let unsettled: u64 = self.cursors.iter().map(|k| k.taken).sum();
        self.published.small_allocs.store((self.allocs + unsettled).saturating_sub(self.batches_made), Ordering::Relaxed);
        self.published.pages.store((self.small_pages + self.medium.pages) as u64, Ordering::Relaxed);
    }

    /// How many of the blocks on class `c`'s kept list are this heap's own
    /// (the others count in their owners' figures).  Walks at most the
    /// list's cap, so a list made a cycle by a double unchecked free ends.
    fn own_kept(&self, c: usize) -> u64 {
        let me = self as *const Heap as *mut Heap;
        let cap = kept_cap(c, crate::options().keep_bytes);
        let (mut n, mut walked, mut b) = (0u64, 0u32, self.cursors[c].kept);
        while !b.is_null() && walked < cap {
            // SAFETY: kept blocks are dead small blocks of mapped units,
            // linked by this thread; their descriptors say whose they are.
            unsafe {
                if (*desc(arena::unit_index(b as usize))).heap.load(Ordering::Relaxed) == me {
                    n += 1;
                }
                b = (*b).next;
            }
            walked += 1;
        }
        n
    }

    // ----- thread lifecycle -----

    /// Give up the heap as its thread exits: send pending frees, take in
    /// those sent to us, hand empty slabs and pages back, clear ownership.
    ///
    /// # Safety
    /// Called by the owner thread (or the only thread after `fork`).
    pub(crate) unsafe fn abandon(&mut self) {
        // SAFETY: owner.
        unsafe {
            crate::flush_large_cache(self, None);
            self.flush_kept();
            self.drain_inbox();
            self.flush_remote();
            self.release_batches();
            if self.inbox_broken {
                self.retire_keeping_memory();
                return;
            }
            for c in 0..SMALL_CLASSES {
                let d = self.cur[c];
                if d != empty_desc() {
                    self.set_current(c, empty_desc());
                    Heap::list_push(&mut self.avail[c], d);
                }
                // Empty slabs go back; the rest lose their owner.
                let mut s = self.avail[c];
                while !s.is_null() {
                    let next = (*s).next;
                    if slab_empty(s) {
                        Heap::list_remove(&mut self.avail[c], s);
                        self.release_slab(s);
                    } else {
                        (*s).owner.store(0, Ordering::Relaxed);
                    }
                    s = next;
                }
                let mut s = self.full[c];
                while !s.is_null() {
                    (*s).owner.store(0, Ordering::Relaxed);
                    s = (*s).next;
                }
            }
            // Whole free pages go back to the global heap.
            let mut u = self.free_units;
            while !u.is_null() {
                let next = (*u).next;
                let first_idx = desc_index(u) & !(PAGE_UNITS - 1);
                if (*desc(first_idx)).page_free as usize == PAGE_UNITS {
                    // Skip the other units of this page in the walk.
                    let mut nx = next;
                    while !nx.is_null() && desc_index(nx) & !(PAGE_UNITS - 1) == first_idx {
                        nx = (*nx).next;
                    }
                    self.return_page(first_idx);
                    u = nx;
                    continue;
                }
                u = next;
            }
            self.medium.release_empty_pages(&mut self.counters);
        }
        self.publish();
        self.tid = 0;
    }

    /// Give up a heap whose inbox is broken (see `inbox_broken`): its slabs
    /// lose their owner so every free of their blocks takes the slow path
    /// (and is sent to the dead inbox), but no slab or page goes back to the
    /// global heap, because the inbox's tail may lie in any of them.
    unsafe fn retire_keeping_memory(&mut self) {
        for c in 0..SMALL_CLASSES {
            let d = self.cur[c];
            if d != empty_desc() {
                self.set_current(c, empty_desc());
                // SAFETY: owner; d was this heap's current slab.
                unsafe { Heap::list_push(&mut self.avail[c], d) };
            }
            for head in [self.avail[c], self.full[c]] {
                let mut s = head;
                while !s.is_null() {
                    // SAFETY: slabs of this heap, owner thread.
                    unsafe {
                        (*s).owner.store(0, Ordering::Relaxed);
                        s = (*s).next;
                    }
                }
            }
        }
        self.publish();
        self.tid = 0;
    }

    /// Take over an abandoned heap for the calling thread.
    ///
    /// # Safety
    /// The heap is abandoned and the caller owns it now.
    pub(crate) unsafe fn adopt(&mut self, tid: usize) {
        self.tid = tid;
        if crate::options().check {
            return;
        }
        // Full slabs keep owner 0 (see `make_full`).
        for c in 0..SMALL_CLASSES {
            let mut s = self.avail[c];
            while !s.is_null() {
                // SAFETY: slabs of this heap, which we now own.
                unsafe {
                    (*s).owner.store(tid, Ordering::Relaxed);
                    s = (*s).next;
                }
            }
        }
    }

    /// The kept list of class `c` (see [`keep`](Self::keep)): its blocks and
    /// its room add up to the class's cap (both 0 in check mode); every
    /// block is a block of class `c` of a small slab, marked in flight.
    fn check_kept(&self, c: usize, check_mode: bool) -> Result<(), &'static str> {
        let k = &self.cursors[c];
        let cap = if check_mode { 0 } else { kept_cap(c, crate::options().keep_bytes) };
        let mut n = 0u32;
        let mut b = k.kept;
        while !b.is_null() {
            n += 1;
            if n > cap {
                return Err("a kept list holds more blocks than its cap");
            }
            let idx = arena::unit_index(b as usize);
            if idx >= arena::arena_units() {
                return Err("a kept block lies outside the arena");
            }
            // SAFETY: idx < arena_units(); a kept block is dead and ours to read.
            unsafe {
                let d = desc(idx);
                if (*d).kind != kind::SMALL || (*d).class as usize != c {
                    return Err("a kept block is not a small block of its class");
                }
                if (*b).tag != flight_tag() {
                    return Err("a kept block is not marked in flight");
                }
                b = (*b).next;
            }
        }
        if n + k.kept_room != cap {
            return Err("a kept list's blocks and room are not its cap");
        }
        Ok(())
    }

    /// Check this heap's invariants (owner thread; debug builds and tests).
    pub(crate) fn check(&self) -> Result<(), &'static str> {
        let check_mode = crate::options().check;
        self.large_cache.check()?;
        if self.published.large_cached_bytes.load(Ordering::Relaxed) != self.large_cache.bytes as u64 {
            return Err("the published bytes of the large cache are not its bytes");
        }
        for c in 0..SHAPES.len() {
            let d = self.cur[c];
            if d != empty_desc() {
                // SAFETY: owner reading its own slabs.
                unsafe {
                    if (*d).kind != kind::SMALL || (*d).class as usize != c {
                        return Err("current slab has the wrong kind or class");
                    }
                    if (*d).flags & FLAG_FULL != 0 {
                        return Err("current slab is flagged full");
                    }
                }
            }
            if !check_mode && self.cursors[c].desc != d && self.cursors[c].desc != empty_desc() {
                return Err("the class's cursor is in another slab than its current one");
            }
            if check_mode && !core::ptr::eq(self.cursors[c].word, &ZERO_WORD) {
                return Err("a cursor is set in check mode");
            }
            if granules(c).any(|g| !core::ptr::eq(self.direct[g], &self.cursors[c])) {
                return Err("a size granule's cursor is not its class's");
            }
            self.check_kept(c, check_mode)?;
            for (head, full) in [(self.avail[c], false), (self.full[c], true)] {
                let mut s = head;
                while !s.is_null() {
                    // SAFETY: owner reading its own slabs.
                    unsafe {
                        if (*s).kind != kind::SMALL || (*s).class as usize != c {
                            return Err("listed slab has the wrong kind or class");
                        }
                        if ((*s).flags & FLAG_FULL != 0) != full {
                            return Err("slab's FULL flag disagrees with its list");
                        }
                        if !core::ptr::eq((*s).heap.load(Ordering::Relaxed), self) {
                            return Err("slab belongs to another heap");
                        }
                        let want = if full || check_mode { 0 } else { self.tid };
                        if self.tid != 0 && (*s).owner.load(Ordering::Relaxed) != want {
                            return Err("slab owner is not the heap's thread (0 for full slabs and in check mode)");
                        }
                        if full && free_slots(s) != 0 {
                            return Err("a slab on the full list has a free slot");
                        }
                        if !bits_within_slots(s) {
                            return Err("a slab's bitmap has bits past its last slot");
                        }
                        s = (*s).next;
                    }
                }
            }
            // SAFETY: owner reading its own current slab.
            if d != empty_desc() && !unsafe { bits_within_slots(d) } {
                return Err("the current slab's bitmap has bits past its last slot");
            }
        }
        self.medium.check()
    }
}

/// The entries of [`Heap::direct`] of class `c`: the granules `g` with
/// `class_index(16 * g) == c` (granule 0, size 0, belongs to class 0).
fn granules(c: usize) -> core::ops::RangeInclusive<usize> {
    let lo = if c == 0 { 0 } else { class_size(c - 1) / 16 + 1 };
    lo..=class_size(c) / 16
}

/// Give a span back to the global heap.
pub(crate) fn give_span_back(idx: usize, units: usize, committed: bool) {
    let retain = crate::options().retain_bytes;
    let locked = crate::solo::lock();
    // SAFETY: we hold the global lock; the units are ours to return.
    unsafe {
        let g = global::state();
        g.stats.pages_back += (units == PAGE_UNITS) as u64;
        g.free_span(idx, units, committed, retain, None);
    }
    crate::solo::unlock(locked);
}

/// Frees sent one by one by threads without a heap.
pub(crate) static DIRECT_REMOTE_FREES: AtomicU64 = AtomicU64::new(0);

/// Send one free straight to `owner`'s inbox (a thread without a heap).
///
/// # Safety
/// `p` is a dead block of a unit owned by `owner`.
pub(crate) unsafe fn push_direct(owner: *mut Heap, p: *mut u8) {
    DIRECT_REMOTE_FREES.fetch_add(1, Ordering::Relaxed);
    // SAFETY: heaps are never freed; p is ours to link.
    unsafe { (*owner).inbox.push(p as *mut Node) };
}

/// Heaps on the abandoned list (a hint, read without the lock).
pub(crate) static ABANDONED: AtomicUsize = AtomicUsize::new(0);

/// Take in what other threads freed to heaps whose threads have exited, so
/// that memory is reused even when no new thread comes to adopt them.  Called
/// before taking a new page from the global heap, and by `collect`.
pub(crate) fn reclaim_abandoned() {
    if ABANDONED.load(Ordering::Relaxed) == 0 {
        return;
    }
    let locked = crate::solo::lock();
    // SAFETY: global lock held; we take the whole list and own its heaps.
    let list = unsafe {
        let g = global::state();
        core::mem::replace(&mut g.abandoned, ptr::null_mut())
    };
    crate::solo::unlock(locked);
    let mut h = list;
    let mut list: *mut Heap = ptr::null_mut();
    let mut last: *mut Heap = ptr::null_mut();
    while !h.is_null() {
        // SAFETY: the heap is off the list, so no other thread adopts or
        // reclaims it; remote frees only push to its inbox.
        unsafe {
            let next = (*h).next_abandoned;
            if !(*h).inbox.is_empty_hint() {
                (*h).abandon();
            }
            if (*h).inbox_broken {
                // Retired (see `inbox_broken`): never adopted again.
                (*h).next_abandoned = ptr::null_mut();
                ABANDONED.fetch_sub(1, Ordering::Relaxed);
            } else {
                (*h).next_abandoned = list;
                list = h;
                if last.is_null() {
                    last = h;
                }
            }
            h = next;
        }
    }
    if last.is_null() {
        return;
    }
    let locked = crate::solo::lock();
    // SAFETY: global lock held; splice the list back in front.
    unsafe {
        let g = global::state();
        (*last).next_abandoned = g.abandoned;
        g.abandoned = list;
    }
    crate::solo::unlock(locked);
}

/// Whether SMALL slab `d` has no live block: every slot's bit set (its
/// owner, or a heap nobody runs).  Blocks in flight to the owner as remote
/// frees count as live until the owner takes them in.
///
/// # Safety
/// `d` is a SMALL descriptor.
pub(crate) unsafe fn slab_empty(d: *const Desc) -> bool {
    // SAFETY: a SMALL unit's bitmap has its class's words.
    unsafe {
        let shape = &SHAPES[(*d).class as usize];
        let words = arena::bitmap(desc_index(d));
        (0..shape.words as usize).all(|w| (*words.add(w)).load(Ordering::Relaxed) == shape.fresh_word(w))
    }
}

/// Whether SMALL slab `d`'s bitmap has no bit past its last slot.
///
/// # Safety
/// `d` is a SMALL descriptor.
unsafe fn bits_within_slots(d: *const Desc) -> bool {
    // SAFETY: a SMALL unit's bitmap has its class's words.
    unsafe {
        let shape = &SHAPES[(*d).class as usize];
        let words = arena::bitmap(desc_index(d));
        (0..shape.words as usize).all(|w| (*words.add(w)).load(Ordering::Relaxed) & !shape.fresh_word(w) == 0)
    }
}

/// Free slots of SMALL slab `d` (its owner, or a heap nobody runs).
///
/// # Safety
/// `d` is a SMALL descriptor.
unsafe fn free_slots(d: *const Desc) -> u32 {
    // SAFETY: a SMALL unit's bitmap has its class's words.
    unsafe {
        let words = arena::bitmap(desc_index(d));
        (0..SHAPES[(*d).class as usize].words as usize).map(|w| (*words.add(w)).load(Ordering::Relaxed).count_ones()).sum()
    }
}

/// The slot of SMALL slab `d` that `p` starts, or `None`.
///
/// # Safety
/// `d` is a SMALL descriptor and `p` lies in its unit.
pub(crate) unsafe fn small_slot_start(d: *const Desc, p: *mut u8) -> Option<usize> {
    // SAFETY: d is a valid SMALL descriptor (caller's contract); its slot
    // test does not change while a block of it may be live.
    unsafe {
        let off = p as usize - arena::unit_addr(d) as usize;
        slab::locate_small((*d).divc, (*d).limit, off as u32)
    }
}

/// The slot of SMALL slab `d` that `p` starts, and whether it is free (a
/// relaxed read of the owner's bitmap: from another thread, a hint); `None`
/// if `p` starts no slot.
///
/// # Safety
/// `d` is a SMALL descriptor and `p` lies in its unit.
pub(crate) unsafe fn small_slot(d: *const Desc, p: *mut u8) -> Option<(usize, bool)> {
    // SAFETY: d is a valid SMALL descriptor (caller's contract): `divc` and
    // `limit` do not change while a block of it may be live, and a slot
    // index below `slots` is inside the unit's bitmap.
    unsafe {
        let off = p as usize - arena::unit_addr(d) as usize;
        let i = slab::locate_small((*d).divc, (*d).limit, off as u32)?;
        let x = (*arena::bitmap(desc_index(d)).add(i / 64)).load(Ordering::Relaxed);
        Some((i, slab::is_free(x, i)))
    }
}
