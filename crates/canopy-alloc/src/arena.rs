//! The address space and its descriptor table.
//!
//! Canopy reserves one contiguous *arena* when it starts (under a limit on
//! address space it maps a small one and grows it in place, see
//! `init_arena` and `ensure_mapped`).  The arena is cut
//! into 64 KiB *units*; a unit is a small-object slab, part of a 1 MiB page
//! of a thread's local heap, part of a large chunk, or free.  Every unit has a
//! 64-byte [`Desc`] in a separate *descriptor table*, so (as in Myrmics) no
//! metadata lives inside the data: finding a pointer's descriptor is
//! `table[(p - base) >> 16]`, one subtraction, one shift and a bounds check,
//! and a pointer that is not ours fails the bounds check or finds a unit whose
//! kind says it holds no live block.
//!
//! ```text
//!  arena:  | unit 0 | unit 1 | ... | unit 15 | unit 16 | ...        (64 KiB each)
//!          |<------ page 0 (1 MiB) -------->|<---- page 1 ...
//!  table:  [desc 0][desc 1] ... [desc 15][desc 16] ...               (64 B each)
//! ```
//!
//! Invariants (checked by `Heap::check`, `LargeCache::check` and
//! `GlobalState::check`, which the tests and `check_invariants` run):
//! - A `SMALL` unit has `owner != 0` only while its heap is live, and then
//!   `owner` is the id of the thread that runs that heap.  `owner` is `0` for
//!   full slabs (on their heap's full list) and every slab in
//!   check mode, which sends every free through the checked slow path.
//! - The head unit of a large chunk has `owner == LARGE_LIVE` while the
//!   chunk is live, and `LARGE_CLAIMED` from the moment a free claims it
//!   (`canopy_sync::claim`) until it is handed out again from a thread's
//!   cache (`LARGE_CACHED` meanwhile) or its units go back to the global
//!   heap; see the `large_cache` module.  No other unit ever holds
//!   `LARGE_LIVE`, so a claim of anything but a live chunk fails.
//! - Any other unit has `owner == 0`.
//! - For a `SMALL` unit, the set bits of the unit's bitmap ([`bitmap`]) are
//!   exactly its free slots (none past the last slot); blocks in flight to
//!   the owner as remote frees count as live until the owner drains them.
//!   A slab on its heap's full list has no set bit.  No count of live
//!   blocks is kept: a slab is empty when every slot's bit is set.
//!
//! A `SMALL` unit is a [`crate::slab`] slab: its slots' bitmap lives in a
//! table of its own, `BITMAP_STRIDE` bytes per unit, in the gigabyte below the
//! descriptor table, so a pointer's bitmap word is, like its descriptor, a
//! fixed offset from the arena base.  The bitmap alone says which blocks
//! are free; the allocator also marks a free block in its second word, and
//! links a block on its way to its owner as a remote free through its first
//! word, so that other threads can check a free without reading the owner's
//! bitmap (see [`Block`]).

use crate::heap::Heap;
use canopy_sync::prim::{AtomicPtr, AtomicUsize, Ordering};
use core::ptr;

/// log2 of the unit (slab) size.
pub const UNIT_SHIFT: usize = 16;
/// Unit (slab) size: 64 KiB.
pub const UNIT: usize = 1 << UNIT_SHIFT;
/// Units per page.
pub const PAGE_UNITS: usize = 16;
/// Page size: 1 MiB, the unit the global heap hands to thread heaps.
pub const PAGE: usize = UNIT * PAGE_UNITS;
/// Most units the arena can have (128 GiB).
pub const MAX_UNITS: usize = 1 << 21;

/// What a unit holds.
pub mod kind {
    /// Never used, or not part of the arena.
    pub const NONE: u8 = 0;
    /// A slab of small blocks of one class.
    pub const SMALL: u8 = 1;
    /// Part of a medium page of a thread's local heap.
    pub const MEDIUM: u8 = 2;
    /// First unit of a large chunk.
    pub const LARGE: u8 = 3;
    /// Another unit of a large chunk.
    pub const LARGE_BODY: u8 = 4;
    /// The unit holding the (over-aligned) user pointer of a large chunk that starts earlier.
    pub const LARGE_ALIGNED: u8 = 5;
    /// First unit of a free span of the global heap.
    pub const FREE_SPAN: u8 = 6;
    /// Another unit of a free span.
    pub const FREE_BODY: u8 = 7;
    /// A unit of a thread heap's page that is not in use.
    pub const HEAP_FREE: u8 = 8;
    /// First unit of pages lent to another layer (a region allocator); `a` holds the unit count.
    pub const LENT: u8 = 9;
    /// Another unit of lent pages.
    pub const LENT_BODY: u8 = 10;
    /// First unit of a freed large chunk in a thread's cache
    /// (the `large_cache` module); its other units stay `LARGE_BODY`.
    pub const LARGE_CACHED: u8 = 11;
}

/// `owner` of a large chunk's head unit while a free holds the chunk (see
/// the `large_cache` module): no thread id is 1.
pub const LARGE_CLAIMED: usize = 1;
/// `owner` of a live large chunk's head unit: a free claims the chunk by
/// moving it to [`LARGE_CLAIMED`].  No thread id is 2.
pub const LARGE_LIVE: usize = 2;

/// Slab flag: the slab is on its heap's full list.
pub const FLAG_FULL: u8 = 1;
/// Span flag: the span may hold committed memory.
pub const SPAN_COMMITTED: u8 = 1;
/// Span flag: the span is known to read as zero.
pub const SPAN_ZEROED: u8 = 2;
/// Large chunk flag: when the chunk was handed out, its pages past its
/// requested size held no memory (a fresh or decommitted span, or a tail
/// just trimmed); cleared when the chunk is resized in place.
pub const LARGE_TAIL_CLEAN: u8 = 4;

/// The words of a small block the allocator writes.  A block on its way
/// to its owner as a remote free: its first word links the owner's inbox
/// (`canopy_sync::Node`), its second holds [`flight_tag`] until the owner
/// drains it.  A free block: its second word holds [`free_mark`].
/// Allocation clears the second word.  The slab's bitmap is what says a
/// block is free (exactly, for its owner); the marks let *another* thread's
/// free refuse a block that is free or in flight without reading the
/// owner's bitmap, a line the owner writes on every allocation.  Both free
/// paths refuse a block marked in flight: a second free while the first is
/// in flight would cross the inbox with the bitmap.
#[repr(C)]
pub struct Block {
    /// The inbox link.
    pub next: *mut Block,
    /// `flight_tag()` while in flight.
    pub tag: usize,
}

/// The descriptor of one unit.  Fields are read and written through raw
/// pointers: the owner thread writes the plain fields; other threads read
/// only `owner`, `heap`, `kind`, `class` and `size`, which do not change while
/// a block of the unit is live.
#[repr(C, align(64))]
pub struct Desc {
    /// FREE_SPAN head: how many units of the span may hold memory (their
    /// clean mark is not 0, see `GlobalState::free_span`).  LARGE_CACHED:
    /// the next cached chunk's unit index plus one (0: none).  Unused by
    /// every other kind.
    pub spare: u64,
    /// SMALL: id of the owning thread while the free fast path may push onto
    /// this slab (current or available); 0 otherwise.  Head of a large
    /// chunk: [`LARGE_LIVE`] while live, [`LARGE_CLAIMED`] while a free
    /// holds it (see the module invariants).
    pub owner: AtomicUsize,
    /// MEDIUM (first unit of a page): live chunks in the page.  (Unused by
    /// SMALL units, whose bitmap alone says which slots are live.)
    pub used: u32,
    /// One of [`kind`].
    pub kind: u8,
    /// SMALL: size class.
    pub class: u8,
    /// SMALL: [`FLAG_FULL`]; spans: `SPAN_*`.
    pub flags: u8,
    /// First unit of a heap page: how many of its units are `HEAP_FREE`.
    pub page_free: u8,
    /// SMALL: the multiplier of the slot test ([`crate::slab::small_test`]).
    pub divc: u32,
    /// SMALL: the bound of the slot test ([`crate::slab::small_test`]).
    /// FREE_SPAN, FREE_BODY: the unit's clean mark (see
    /// `GlobalState::free_span`).
    pub limit: u32,
    /// SMALL, MEDIUM, HEAP_FREE: the owning heap.
    pub heap: AtomicPtr<Heap>,
    /// List links (slab lists, free unit lists, span bins, medium page list).
    /// FREE_BODY last unit / LARGE_ALIGNED: `next` points at the span's first unit.
    pub next: *mut Desc,
    /// List links.
    pub prev: *mut Desc,
    /// Spans: length in units.  MEDIUM first unit: bump offset.
    pub a: u32,
    /// SMALL: block size.  LARGE: requested size (saturating), raised by a
    /// `realloc` that keeps the chunk for more.
    pub b: u32,
}

const _: () = assert!(core::mem::size_of::<Desc>() == 64);

impl Default for Desc {
    fn default() -> Self {
        Desc::new()
    }
}

impl Desc {
    /// An unused descriptor.
    pub const fn new() -> Desc {
        Desc {
            spare: 0,
            owner: AtomicUsize::new(0),
            used: 0,
            kind: kind::NONE,
            class: 0,
            flags: 0,
            page_free: 0,
            divc: 0,
            limit: 0,
            heap: AtomicPtr::new(ptr::null_mut()),
            next: ptr::null_mut(),
            prev: ptr::null_mut(),
            a: 0,
            b: 0,
        }
    }
}

const _: () = assert!(UNIT <= 1 << 16 && crate::size_class::SMALL_MAX <= 1 << 13);

/// Bytes of bitmap per unit: one bit per slot of the smallest class.
pub const BITMAP_STRIDE: usize = UNIT / 16 / 8;
/// The bitmap table sits this many bytes below the arena base: it starts
/// `BITMAP_SKEW` bytes into the gigabyte below the descriptor table's, and
/// its last `BITMAP_SKEW` bytes (the words of units the arena never has
/// unless it is reserved whole) run into the descriptor gigabyte's head,
/// before the descriptor table.
pub const BITMAP_OFFSET: usize = (2 << 30) - BITMAP_SKEW;
// The free fast path reaches a bitmap word with a 32-bit displacement from
// the arena base (`mov -OFFSET(base, index, 8)`); at 2 GiB or more it
// would need an extra instruction (it did, at 3 GiB: 65 -> 67 per pair).
const _: () = assert!(BITMAP_OFFSET < 1 << 31);
/// Where the bitmap table starts in its region: [`BITMAP_PAGES`] pages in,
/// plus 256 bytes so that the first word of a slab's bitmap never lies at
/// page offset 0, the offset of the slab's first block (see
/// [`TABLE_SKEW`]).
pub const BITMAP_SKEW: usize = (BITMAP_PAGES << 12) + 256;
/// Pages between the bitmap region's start (1 GiB aligned, like the arena)
/// and the bitmap table; [`TABLE_PAGES`] does the same for the descriptor
/// table.  Without them the first page of each table (the bitmap words of
/// units 0 to 7; the descriptors of units 0 to 55) had the same virtual
/// address bits 12 to 29 as the arena's first page, the first slab's first
/// blocks.
///
/// On AMD Zen cores the L1 data cache predicts a line's way from a hash of
/// virtual address bits 12 to 27 (the "µtag": eight bits, each the exclusive
/// or of two address bits, as measured by Lipp et al., "Take A Way",
/// AsiaCCS 2020).  Two lines in the same cache set whose addresses have the
/// same µtag cannot both be found by the predictor, so a loop that touches
/// both misses on one of them every time.  The arena, the descriptor table
/// and the bitmap table all start at gigabyte boundaries; with the tables
/// at the very start of their gigabytes, the first page of each had the
/// same bits 12 to 29 (all zero) as the arena's first page, which holds the
/// first blocks of the first slab a program makes, and the hottest lines of
/// both (the blocks a loop reuses; the bitmap words of the first eight
/// slabs, written on every allocation and free; the descriptors read on
/// every free) shared sets.  On this project's AMD EPYC machine, a loop
/// freeing and allocating four 64-byte blocks ran 18-19 ns per pair when
/// one of its blocks was the first slab's fifth (page offset 256, where
/// unit 0's first bitmap word sits) and 12-14 ns at the other slots; a slab
/// of the same class in any other unit, at the same page offsets, ran 11-13
/// ns at every slot.  Moving the tables took the first slab to 12-13 ns at
/// every slot.  With the tables moved, the pages whose µtags
/// match the tables' first pages are the last units of each 1 MiB heap page
/// (units 14 and 15, 30 and 31, ...; the test
/// `metadata_pages_share_way_hashes_only_with_late_units` checks it), the
/// slabs a heap makes last.  Other processors do not predict ways this way;
/// there the move changes nothing.
pub const BITMAP_PAGES: usize = 0x1C00;
const _: () = assert!(MAX_UNITS * BITMAP_STRIDE + BITMAP_SKEW <= (1 << 30) + (TABLE_SKEW & !4095));
const _: () = assert!(BITMAP_STRIDE == 64 * 8); // the free fast path indexes words as `idx * 64 + w`

/// What `ARENA_BASE` holds until the arena is reserved: the base of a
/// would-be arena at the very top of the address space (kernel addresses, no
/// program's pointer), so that `p - base` of every pointer a program can
/// pass, null included, is at least `MAX_UNITS` units.  (The fast paths'
/// range check compares with `FastKeys::limit`, which is 0 until then, so
/// every pointer goes to the slow path before the arena exists either way.)  (With 0 there, a `free(NULL)`
/// made before the first allocation, as `sort` makes in `setlocale`, was in
/// range and read a descriptor below address 0.)
pub const UNINIT_BASE: usize = 0usize.wrapping_sub(MAX_UNITS << UNIT_SHIFT);

/// The two words every free reads, the arena base and the flight-tag key
/// ([`flight_tag`]), alone in a 128-byte block: written once at start-up,
/// then read by every thread on every call.  As plain statics they shared
/// a cache line with the global heap's lock and every write there (any
/// thread's lock, unlock or global statistics) took the line from the other
/// cores.  A thread freeing `malloc(100)` blocks beside one allocating and
/// freeing 300 KB blocks (the global heap, under its lock) ran at half speed
/// (1150 ms against 630 ms); the `mixed` workload of the benchmarks is that
/// pattern.
#[repr(C, align(128))]
pub(crate) struct FastKeys {
    /// Base address of the arena ([`UNINIT_BASE`] until initialised).
    pub(crate) base: AtomicUsize,
    /// See [`flight_tag`].
    pub(crate) key: AtomicUsize,
    /// Bytes of the arena mapped so far (`arena_units() * UNIT`; 0 until
    /// initialised): `p` is in the arena exactly when `p - base < limit`,
    /// the fast paths' one range check.  Only the units below it have
    /// descriptors and bitmap words mapped (an arena that grows maps them as
    /// it grows), so no descriptor is read before this check.
    pub(crate) limit: AtomicUsize,
}

/// See [`FastKeys`].  Its address escapes once (`init_free_key`): without
/// that, link-time optimisation split the struct into two 8-byte globals,
/// and the global heap's state came right after the second, on the same
/// line again.  (`#[used]` kept it whole too, but then every load went
/// through the GOT.)
pub(crate) static FAST_KEYS: FastKeys = FastKeys {
    base: AtomicUsize::new(UNINIT_BASE),
    key: AtomicUsize::new(0x5bd1_e995_a3c5_9ac3),
    limit: AtomicUsize::new(0),
};
/// Units whose memory is mapped: always `[0, MAPPED_UNITS)`, at most
/// [`arena_units`] (whose descriptors and bitmap words are mapped).  Equal
/// to it unless the global heap gave the top of an arena that grows back to
/// the OS ([`unmap_from`]); [`ensure_mapped`] maps units again.
static MAPPED_UNITS: AtomicUsize = AtomicUsize::new(0);
/// Units the arena may grow to (see [`ensure_mapped`]); equal to
/// [`arena_units`] when it was reserved whole.
static ARENA_CAP: AtomicUsize = AtomicUsize::new(0);
/// 1 if `madvise(MADV_HUGEPAGE)` is asked for the arena (also for what it
/// grows by).
static ARENA_HUGE: AtomicUsize = AtomicUsize::new(0);
/// Units an arena that grows starts with (4 MiB), and the most it grows by
/// at once (1 GiB): it grows by a quarter (at least 1 MiB), or by what a
/// request needs if that is more or the OS refuses the quarter.  (A
/// quarter, not a doubling: under a limit on address space what the arena
/// has grown to stays reserved, so overshooting takes room from the
/// program's other mappings, such as thread stacks.)
const GROW_FIRST_UNITS: usize = 4 * PAGE_UNITS;
const GROW_MAX_STEP_UNITS: usize = (1 << 30) >> UNIT_SHIFT;
/// The descriptor table sits this many bytes below the arena base, so one
/// load (the base) finds both the unit index and its descriptor.
///
/// The table starts `TABLE_SKEW` bytes into its gigabyte, so the descriptor
/// of unit `u` lies at page offset `((u + 8) % 64) * 64`.  Without the skew
/// the descriptor of every 64th unit (the first one the first thread's heap
/// makes a slab of among them) sat at page offset 0, the offset of its slab's
/// first block: a program reusing that one block in a loop (LIFO reuse makes
/// that the common case) had every `free` store to the block followed by
/// loads of the descriptor at the same address modulo 4 KiB, which the CPU
/// treats as possibly dependent (4K aliasing), and ran 2.3x slower (the SAC
/// kernel in Rust at X = 25).  With the skew the units that start a page and
/// the seven after them, the ones a heap makes slabs of first, keep their
/// descriptors at page offsets 512 and above, clear of their first blocks.
///
/// The table also starts [`TABLE_PAGES`] pages into its gigabyte (which
/// does not change the page offsets): see [`BITMAP_PAGES`].
pub const TABLE_SKEW: usize = (TABLE_PAGES << 12) + 8 * core::mem::size_of::<Desc>();
/// Pages between the descriptor gigabyte's start and the table (see
/// [`BITMAP_PAGES`]).
pub const TABLE_PAGES: usize = 0x1E00;

/// See [`TABLE_SKEW`].
pub const TABLE_OFFSET: usize = (1 << 30) - TABLE_SKEW;
const TABLE_BYTES: usize = MAX_UNITS * core::mem::size_of::<Desc>();
/// Alignment of the arena base.  A span aligned to `k` units (its index a
/// multiple of `k`) is aligned to `k * UNIT` bytes only up to this.
pub const ARENA_ALIGN: usize = 1 << 30;
const _: () = assert!(TABLE_BYTES + TABLE_SKEW <= 1 << 30);

/// Arena base (relaxed: set once before any pointer into the arena exists).
#[inline(always)]
pub fn arena_base() -> usize {
    FAST_KEYS.base.load(Ordering::Relaxed)
}

/// Bytes of the arena mapped (`FastKeys::limit`): `p` is in the arena
/// exactly when `p - arena_base() < arena_limit()`.
#[inline(always)]
pub fn arena_limit() -> usize {
    FAST_KEYS.limit.load(Ordering::Relaxed)
}

/// Whether the arena has been reserved.
#[inline]
pub fn arena_initialised() -> bool {
    arena_base() != UNINIT_BASE
}

/// Unit index of `p`, or a value `>= MAX_UNITS` if `p` is not in the arena
/// (every `p`, null included, before the arena is reserved).
#[inline(always)]
pub fn unit_index(p: usize) -> usize {
    p.wrapping_sub(arena_base()) >> UNIT_SHIFT
}

/// Descriptor of unit `idx`.
///
/// # Safety
/// `idx < MAX_UNITS` and the arena is initialised.
#[inline(always)]
pub unsafe fn desc(idx: usize) -> *mut Desc {
    desc_at(arena_base(), idx)
}

/// [`desc`] with the arena base already loaded (the address only: reading
/// it needs `idx < MAX_UNITS`).
#[inline(always)]
pub fn desc_at(base: usize, idx: usize) -> *mut Desc {
    ((base - TABLE_OFFSET) + idx * core::mem::size_of::<Desc>()) as *mut Desc
}

/// Index of a descriptor.
#[inline(always)]
pub fn desc_index(d: *const Desc) -> usize {
    (d as usize - (arena_base() - TABLE_OFFSET)) / core::mem::size_of::<Desc>()
}

/// Address of the unit a descriptor describes.
#[inline(always)]
pub fn unit_addr(d: *const Desc) -> *mut u8 {
    (arena_base() + (desc_index(d) << UNIT_SHIFT)) as *mut u8
}

/// Units with descriptors and bitmap words: all of an arena reserved
/// whole, what an arena that grows has grown to (the same number as
/// `FastKeys::limit`, in units, its one record).
pub fn arena_units() -> usize {
    FAST_KEYS.limit.load(Ordering::Relaxed) >> UNIT_SHIFT
}

/// Reserve the arena and its tables.  Without a limit on address space
/// the arena is reserved whole (`CANOPY_ARENA_GB`, halved until the OS
/// grants it: [`init_whole`]); under a limit (`ulimit -v`), with `grow`
/// (`CANOPY_ARENA_GROW=1`), or where even 1 GiB is refused, it starts small
/// and grows as the global heap needs units ([`init_growing`],
/// [`ensure_mapped`]).  Called once, under the init lock.  Returns false if
/// the OS refuses both.
pub(crate) fn init_arena(arena_gb: usize, grow: bool, huge: bool) -> bool {
    let gb = arena_gb.clamp(1, (MAX_UNITS * UNIT) >> 30);
    ARENA_HUGE.store(huge as usize, Ordering::Relaxed);
    match canopy_sys::address_space_limit() {
        Some(limit) => init_growing(limit.min(gb << 30)),
        None if grow => init_growing(gb << 30),
        None => init_whole(gb, huge) || init_growing(gb << 30),
    }
}

/// Whether the arena grows on demand (it was not reserved whole).
pub fn arena_grows() -> bool {
    GROWING.load(Ordering::Relaxed) != 0
}
/// 1 once an arena that grows is set up.
static GROWING: AtomicUsize = AtomicUsize::new(0);

/// The largest alignment the arena base has, up to [`ARENA_ALIGN`]: spans
/// aligned by unit index are aligned in memory up to this.  1 GiB unless
/// the kernel had to place an arena that grows (then at least 1 MiB).
pub fn base_align() -> usize {
    if !arena_initialised() {
        return ARENA_ALIGN;
    }
    (1usize << arena_base().trailing_zeros()).min(ARENA_ALIGN)
}

/// Units the arena may have at most (its whole reservation, or what it may
/// grow to).
pub fn arena_cap() -> usize {
    ARENA_CAP.load(Ordering::Relaxed)
}

/// Reserve the bitmap table, the descriptor table and the arena, one
/// reservation with the descriptors in the gigabyte below the arena (which
/// is 1 GiB aligned) and the bitmaps in the gigabyte below that.  The pages
/// of those two gigabytes that no table uses (before each table and after
/// it) are given back at once.  Returns false if the OS refuses even 1 GiB
/// of arena.
fn init_whole(mut gb: usize, huge: bool) -> bool {
    loop {
        match canopy_sys::reserve_aligned((2 << 30) + (gb << 30), ARENA_ALIGN) {
            Ok(start) => {
                // SAFETY: start..start+2GiB+gb GiB was just reserved; only
                // whole pages outside both tables are released (the bitmap
                // table ends before the descriptor table's first page), and
                // nothing else refers to them.
                let base = unsafe {
                    let (bitmap_from, bitmap_to) = unused_around(BITMAP_SKEW, MAX_UNITS * BITMAP_STRIDE);
                    let (table_from, table_to) = unused_around((1 << 30) + TABLE_SKEW, TABLE_BYTES);
                    canopy_sys::release(start, bitmap_from);
                    canopy_sys::release(start.add(bitmap_to), table_from - bitmap_to);
                    canopy_sys::release(start.add(table_to), (2 << 30) - table_to);
                    start.add(2 << 30)
                };
                if huge {
                    // SAFETY: base..base+gb GiB is ours.
                    unsafe { canopy_sys::advise_huge(base, gb << 30) };
                }
                let units = (gb << 30) >> UNIT_SHIFT;
                MAPPED_UNITS.store(units, Ordering::Relaxed);
                ARENA_CAP.store(units, Ordering::Relaxed);
                FAST_KEYS.limit.store(units << UNIT_SHIFT, Ordering::Relaxed);
                // Release: a thread that sees the base also sees the units.
                FAST_KEYS.base.store(base as usize, Ordering::Release);
                return true;
            }
            Err(_) if gb > 1 => gb /= 2,
            Err(_) => return false,
        }
    }
}

/// Where the arena that grows is put: gigabyte-aligned addresses between
/// 4 TiB and 64 TiB, chosen at random.  On x86-64 and AArch64 Linux with
/// 48-bit addresses nothing lives there (programs and their heaps sit near
/// 86 TiB, shared libraries and `mmap` below 128 TiB, growing down), so the
/// arena can grow upwards into addresses no one else takes, and its tables
/// can go at their fixed offsets below it.  Where none is free (or the
/// address space is smaller), the kernel places it, and it grows as long
/// as the addresses after it stay free.
const GROW_HINT_FROM: usize = 4 << 40;
const GROW_HINT_GIBS: usize = 60 << 10;
const GROW_HINT_TRIES: usize = 8;

/// Start an arena that grows: [`GROW_FIRST_UNITS`] units with their
/// descriptors and bitmap words, the same layout as a whole one (tables at
/// the same offsets below a 1 GiB-aligned base), at most `cap_bytes` ever.
/// Only what is mapped counts against an address-space limit.
fn init_growing(cap_bytes: usize) -> bool {
    let cap = ((cap_bytes >> UNIT_SHIFT) & !(PAGE_UNITS - 1)).clamp(PAGE_UNITS, MAX_UNITS);
    let first = GROW_FIRST_UNITS.min(cap);
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let mut x = (ts.tv_nsec as usize) ^ (&ts as *const _ as usize) ^ 0x2545_f491_4f6c_dd1d;
    for _ in 0..GROW_HINT_TRIES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let base = GROW_HINT_FROM + (x % GROW_HINT_GIBS) * ARENA_ALIGN;
        if map_units(base, 0, 0, first).is_ok() {
            return start_growing(base, first, cap);
        }
    }
    // Wherever the kernel puts it: the arena aligned to a 1 MiB page (a
    // gigabyte's alignment would ask for a gigabyte more for a moment), its
    // tables below it where they are free.
    let Ok(arena) = canopy_sys::reserve_aligned(first << UNIT_SHIFT, PAGE) else {
        return false;
    };
    let base = arena as usize;
    // SAFETY: the arena part was just reserved; map_units maps the tables
    // (and the arena part again, which the first piece refuses, so release
    // it first and map all three together).
    unsafe { canopy_sys::release(arena, first << UNIT_SHIFT) };
    if base < (2 << 30) || map_units(base, 0, 0, first).is_err() {
        return false;
    }
    start_growing(base, first, cap)
}

fn start_growing(base: usize, units: usize, cap: usize) -> bool {
    if ARENA_HUGE.load(Ordering::Relaxed) != 0 {
        // SAFETY: base..base+units is ours.
        unsafe { canopy_sys::advise_huge(base as *mut u8, units << UNIT_SHIFT) };
    }
    GROWING.store(1, Ordering::Relaxed);
    MAPPED_UNITS.store(units, Ordering::Relaxed);
    ARENA_CAP.store(cap, Ordering::Relaxed);
    FAST_KEYS.limit.store(units << UNIT_SHIFT, Ordering::Relaxed);
    // Release: a thread that sees the base also sees the units.
    FAST_KEYS.base.store(base, Ordering::Release);
    true
}

/// Map, for an arena at `base`, the memory of units `[mapped, to)` and the
/// pages of the descriptors and bitmap words of units `[tables, to)` that
/// units below `tables` have not already mapped.  Every piece is mapped
/// where nothing is (`MAP_FIXED_NOREPLACE`); if one is refused, the pieces
/// mapped here are given back and the error returned.
fn map_units(base: usize, mapped: usize, tables: usize, to: usize) -> Result<(), canopy_sys::OsError> {
    let page = |a: usize| a & !4095;
    let page_up = |a: usize| (a + 4095) & !4095;
    let table = base - TABLE_OFFSET;
    let bitmap = base - BITMAP_OFFSET;
    let pieces = [
        (base + (mapped << UNIT_SHIFT), base + (to << UNIT_SHIFT)),
        (
            if tables == 0 { page(table) } else { page_up(table + tables * core::mem::size_of::<Desc>()) },
            page_up(table + to * core::mem::size_of::<Desc>()),
        ),
        (
            if tables == 0 { page(bitmap) } else { page_up(bitmap + tables * BITMAP_STRIDE) },
            page_up(bitmap + to * BITMAP_STRIDE),
        ),
    ];
    for (i, &(a, b)) in pieces.iter().enumerate() {
        if b <= a {
            continue;
        }
        if let Err(e) = canopy_sys::reserve_fixed(a, b - a) {
            for &(a2, b2) in &pieces[..i] {
                if b2 > a2 {
                    // SAFETY: mapped just above by this call, unused yet.
                    unsafe { canopy_sys::release(a2 as *mut u8, b2 - a2) };
                }
            }
            return Err(e);
        }
    }
    Ok(())
}

/// Units whose memory is mapped (`[0, mapped_units())`).
pub fn mapped_units() -> usize {
    MAPPED_UNITS.load(Ordering::Relaxed)
}

/// Make the memory of units `[0, units)` mapped, if the arena grows and
/// may (its cap, the OS).  Units the global heap gave back
/// ([`unmap_from`]) are mapped again as far as asked (in whole 1 MiB
/// pages).  Past the units that have descriptors the arena grows: by a
/// quarter (at least 1 MiB, at most [`GROW_MAX_STEP_UNITS`]), or by just
/// what is asked when that is more or the OS refuses more.  Returns whether
/// `[0, units)` is now mapped.  Called by the global heap, which alone
/// hands out fresh units (under its lock, or as the solo thread).  Units,
/// descriptors and bitmap words are mapped before the new length is
/// published, so any thread that is handed a pointer into them (after
/// this, through the program's own synchronisation) finds them in range.
pub(crate) fn ensure_mapped(units: usize) -> bool {
    let mapped = MAPPED_UNITS.load(Ordering::Relaxed);
    if units <= mapped {
        return true;
    }
    let cap = ARENA_CAP.load(Ordering::Relaxed);
    if GROWING.load(Ordering::Relaxed) == 0 || units > cap {
        return false;
    }
    let base = arena_base();
    let cur = arena_units();
    let exact = ((units + PAGE_UNITS - 1) & !(PAGE_UNITS - 1)).min(cap);
    if exact <= cur {
        if map_units(base, mapped, cur, exact).is_err() {
            return false;
        }
        advise_huge_units(base, mapped, exact);
        MAPPED_UNITS.store(exact, Ordering::Relaxed);
        return true;
    }
    let wide = (cur + ((cur / 4) & !(PAGE_UNITS - 1)).clamp(PAGE_UNITS, GROW_MAX_STEP_UNITS)).max(exact).min(cap);
    let to = if map_units(base, mapped, cur, wide).is_ok() {
        wide
    } else if wide != exact && map_units(base, mapped, cur, exact).is_ok() {
        exact
    } else {
        return false;
    };
    advise_huge_units(base, mapped, to);
    MAPPED_UNITS.store(to, Ordering::Relaxed);
    FAST_KEYS.limit.store(to << UNIT_SHIFT, Ordering::Release);
    true
}

fn advise_huge_units(base: usize, from: usize, to: usize) {
    if ARENA_HUGE.load(Ordering::Relaxed) != 0 && to > from {
        // SAFETY: the units were just mapped by us.
        unsafe { canopy_sys::advise_huge((base + (from << UNIT_SHIFT)) as *mut u8, (to - from) << UNIT_SHIFT) };
    }
}

/// Give the memory of units `[at, mapped_units())` back to the OS, addresses
/// included, in an arena that grows: the global heap does this with a free
/// span at the top of what it has handed out, so that under a limit on
/// address space a heap that shrinks after a peak leaves the addresses to
/// the program's other mappings.  The units keep their descriptors (the
/// range check and every descriptor read stay valid: a stale pointer into
/// them is refused as before); [`ensure_mapped`] maps them again.  Returns
/// false (nothing done) for an arena reserved whole.
///
/// # Safety
/// The units `[at, mapped_units())` hold nothing anyone uses: they are above
/// the global heap's top, or a free span ending there.
pub(crate) unsafe fn unmap_from(at: usize) -> bool {
    let mapped = MAPPED_UNITS.load(Ordering::Relaxed);
    if GROWING.load(Ordering::Relaxed) == 0 || at >= mapped {
        return false;
    }
    let from = arena_base() + (at << UNIT_SHIFT);
    // SAFETY: the caller's contract; munmap of a part of our own mapping.
    if unsafe { libc::munmap(from as *mut libc::c_void, (mapped - at) << UNIT_SHIFT) } != 0 {
        return false;
    }
    MAPPED_UNITS.store(at, Ordering::Relaxed);
    true
}

/// Give the memory of units `[idx, idx+n)`, below the mapped length, back to
/// the OS with its addresses, in an arena that grows: the global heap does
/// this with free spans below live memory when it decommits (a hole in the
/// arena).  Their descriptors stay, so a stale pointer into them is still
/// refused without reading them; [`map_again`] maps them again.  Returns
/// false (nothing done) for an arena reserved whole or if the OS refuses.
///
/// # Safety
/// The units are mapped by the arena (not holes already, where a mapping of
/// the program's may sit now) and hold nothing anyone uses.
pub(crate) unsafe fn unmap_units(idx: usize, n: usize) -> bool {
    if GROWING.load(Ordering::Relaxed) == 0 || idx + n > MAPPED_UNITS.load(Ordering::Relaxed) {
        return false;
    }
    let from = arena_base() + (idx << UNIT_SHIFT);
    // SAFETY: the caller's contract; munmap of a part of our own mapping.
    unsafe { libc::munmap(from as *mut libc::c_void, n << UNIT_SHIFT) == 0 }
}

/// Map units `[idx, idx+n)` again after [`unmap_units`], where nothing else
/// is mapped (`MAP_FIXED_NOREPLACE`): if the program has put a mapping of
/// its own there, or the limit on address space is reached, the OS refuses
/// and so does this.
pub(crate) fn map_again(idx: usize, n: usize) -> Result<(), canopy_sys::OsError> {
    let base = arena_base();
    canopy_sys::reserve_fixed(base + (idx << UNIT_SHIFT), n << UNIT_SHIFT)?;
    advise_huge_units(base, idx, idx + n);
    Ok(())
}

/// The whole pages around a table of `len` bytes that starts `skew` bytes
/// into its region: the table lies in `[from, to)`, both page-aligned.
const fn unused_around(skew: usize, len: usize) -> (usize, usize) {
    (skew & !4095, (skew + len + 4095) & !4095)
}

/// The mark a small block on its way to its owner (a remote free) carries
/// in its second word: a per-process random odd number, so user data
/// almost never matches it.  The free fast path reads it and sends a block
/// that carries it to the slow path, which refuses the double free.  The
/// read could wait for the program's last narrow stores into the block; on
/// the SAC kernel at X = 25 the time with and without such a read was the
/// same (0.995, median of 9 interleaved runs).
#[inline(always)]
pub fn flight_tag() -> usize {
    FAST_KEYS.key.load(Ordering::Relaxed)
}

/// The mark a free small block carries in its second word (see [`Block`]):
/// `flight_tag() ^ 1`, so one test `tag ^ flight_tag() <= 1` finds both.
#[inline(always)]
pub fn free_mark() -> usize {
    FAST_KEYS.key.load(Ordering::Relaxed) ^ 1
}

/// The mark a batch of remote frees carries in its second word (see
/// `heap::Batch`): neither `flight_tag()` nor `free_mark()`.
#[inline(always)]
pub fn batch_tag() -> usize {
    FAST_KEYS.key.load(Ordering::Relaxed) ^ 0x10
}

/// Pick the process's flight-tag key (from the arena address and the clock).
pub(crate) fn init_free_key() {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let mut x = (ts.tv_nsec as usize) ^ ((ts.tv_sec as usize) << 32) ^ arena_base() ^ 0x9e37_79b9_7f4a_7c15;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    // Odd, and with bit 1 set, so neither mark is 0 (a live block's).
    FAST_KEYS.key.store(x | 3, Ordering::Relaxed);
    // Keep FAST_KEYS one object (see there).
    core::hint::black_box(&FAST_KEYS);
}

/// The first bitmap word of unit `idx` ([`BITMAP_STRIDE`] bytes; a SMALL
/// unit uses the first `words` of its class's [`crate::slab::SlotShape`]).
/// The owner reads and writes the words with relaxed loads and stores (plain
/// moves); other threads only read them, as a hint (see `free_small_slow`).
/// The words are `core` atomics even under loom: they live in raw memory.
///
/// # Safety
/// `idx < MAX_UNITS` and the arena is initialised.
#[inline(always)]
pub unsafe fn bitmap(idx: usize) -> *mut core::sync::atomic::AtomicU64 {
    bitmap_at(arena_base(), idx)
}

/// [`bitmap`] with the arena base already loaded.
#[inline(always)]
pub fn bitmap_at(base: usize, idx: usize) -> *mut core::sync::atomic::AtomicU64 {
    (base - BITMAP_OFFSET + idx * BITMAP_STRIDE) as *mut core::sync::atomic::AtomicU64
}

/// Set kind and clear owner for `n` units from `idx`.
///
/// # Safety
/// The units are in the arena and owned by the caller (global heap under its
/// lock, or the heap that owns them).
pub(crate) unsafe fn mark_units(idx: usize, n: usize, k: u8) {
    for i in idx..idx + n {
        // SAFETY: caller's contract.
        let d = unsafe { &mut *desc(i) };
        d.owner.store(0, Ordering::Relaxed);
        d.kind = k;
    }
}
