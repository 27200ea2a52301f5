//! Medium chunks: the SAC *local heap* with splitting and deferred coalescing.
//!
//! Requests above 8 KiB and up to 256 KiB are served from whole 1 MiB pages of
//! the thread's heap.  A chunk is a 16-byte header followed by the payload:
//!
//! ```text
//!  +-----------+-----------+---------------------+------------------------+
//!  | size: u32 | state:u32 | tag: u64            | payload ...            |
//!  +-----------+-----------+---------------------+------------------------+
//!  size  = whole chunk in bytes (header included), a multiple of 16
//!  state = USED, FREE (in a bin), FRAG (free, too small for any bin) or
//!          IN_FLIGHT (freed by another thread, on its way to the owner)
//!  tag   = chunk address ^ process key (rejects pointers that are not chunks)
//! ```
//!
//! Free chunks sit in bins, one per medium size class, doubly linked through
//! their payload; a chunk is in the bin of the largest class whose size fits
//! its payload.  Allocation: exact bin, else bump the current page, else split
//! a chunk from a larger bin.  Only when all of that fails are adjacent free
//! chunks merged (deferred coalescing, SAC §3: a freed size is likely to be
//! requested again soon), then a new page is taken.  A page whose chunks are
//! all free goes back to the global heap.
//!
//! A free moves a chunk out of USED with one compare-and-swap on `state`:
//! USED -> IN_FLIGHT by another thread (`mark_in_flight`), USED -> FRAG by
//! the owner (`free_local`; then FREE if it is binned), IN_FLIGHT -> FRAG
//! when the owner takes the chunk from its inbox (`free_in_flight`).  Of two
//! frees of one chunk racing from two threads exactly one wins; the other is
//! refused and reported as a double free, and leaves the chunk alone.

use crate::arena::{self, desc, desc_index, kind, Desc, PAGE, PAGE_UNITS};
use crate::global;
use crate::heap::{give_span_back, Heap, HeapCounters};
use crate::size_class::{class_index, class_size, NUM_CLASSES, SMALL_CLASSES};
use canopy_sync::prim::Ordering;
use core::ptr;
// Not `canopy_sync::prim`: chunk headers are written in place in page memory,
// never constructed, which loom's atomics cannot be (as for `report.rs`).
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

const MEDIUM_CLASSES: usize = NUM_CLASSES - SMALL_CLASSES;
const HDR: usize = 16;
const USED: u32 = 0x5553_4544;
const FREE: u32 = 0x4652_4545;
const FRAG: u32 = 0x4652_4147;
const IN_FLIGHT: u32 = 0x464c_4954;
/// Smallest payload a bin holds.
const MIN_BIN_PAYLOAD: usize = class_size(SMALL_CLASSES);

#[repr(C)]
struct Chunk {
    size: u32,
    /// Atomic because frees of a live chunk may race with each other (see
    /// the module comment) and with the owner's reads (coalescing); plain
    /// stores are the owner's, to chunks no free can claim (`set_state`).
    state: AtomicU32,
    /// Atomic for the same reason: a free of a chunk that the owner is
    /// reusing (a double free racing with the reuse) reads the tag from
    /// another thread while the owner may write it.  Relaxed: the tag only
    /// says whether a header is a chunk's, and nothing is published with it.
    tag: AtomicU64,
    // payload starts here; while free:
    next: *mut Chunk,
    prev: *mut Chunk,
}

// The header keeps its layout: `AtomicU32` and `AtomicU64` have the sizes of
// `u32` and `u64` and the alignment of their sizes.
const _: () = assert!(core::mem::offset_of!(Chunk, tag) == 8 && core::mem::offset_of!(Chunk, next) == HDR);

// The state is read and written through the raw pointer, never through a
// `&Chunk`: that would also cover `next` and `prev`, the first bytes of the
// payload, which the program or a remote free may be writing meanwhile.
//
// Relaxed for plain reads and writes of the state: nothing is published
// through it.  The owner's own accesses need no ordering, and a chunk reaches
// the owner from another thread through the inbox, whose push (release) and
// pop (acquire) order the sender's writes, IN_FLIGHT included, before the
// owner's reads.

/// State of the chunk at `c`.
///
/// # Safety
/// `c` is a chunk header in a mapped page.
#[inline]
unsafe fn state_of(c: *const Chunk) -> u32 {
    // SAFETY: the header is mapped (caller); the reference covers only
    // `state`, which every thread accesses atomically.
    unsafe { (*c).state.load(Relaxed) }
}

/// Set the state of the chunk at `c` (the owner, on a chunk no free can
/// claim: one that is not USED, or that it is handing out).
///
/// # Safety
/// As for [`state_of`].
#[inline]
unsafe fn set_state(c: *const Chunk, s: u32) {
    // SAFETY: as in `state_of`.
    unsafe { (*c).state.store(s, Relaxed) }
}

/// Tag of the chunk header at `c`.
///
/// # Safety
/// As for [`state_of`].
#[inline]
unsafe fn tag_at(c: *const Chunk) -> u64 {
    // SAFETY: the header is mapped (caller); the reference covers only
    // `tag`, which every thread accesses atomically.
    unsafe { (*c).tag.load(Relaxed) }
}

/// Set the tag of the chunk header at `c` (the owner).
///
/// # Safety
/// As for [`state_of`].
#[inline]
unsafe fn set_tag(c: *const Chunk, t: u64) {
    // SAFETY: as in `tag_at`.
    unsafe { (*c).tag.store(t, Relaxed) }
}

/// Move the state of the chunk at `c` from `from` to `to` if it is `from`;
/// false (nothing written) if it is not: another free of the chunk won.
///
/// Relaxed suffices.  Exclusion comes from the atomicity of the
/// read-modify-write, whatever its ordering: the writes to `state` have one
/// modification order and a successful CAS reads the value just before its
/// own write, so of two CAS from USED only the first in that order reads
/// USED.  Nor can a free read a value older than the USED written by
/// `make_used`: the program's hand-over of the pointer orders that write
/// before the free (write-read coherence).  The CAS publishes nothing: the
/// winner's later writes reach the owner through the inbox (see above), and
/// the loser touches nothing more of the chunk.
///
/// # Safety
/// As for [`state_of`].
#[inline]
unsafe fn claim(c: *const Chunk, from: u32, to: u32) -> bool {
    // SAFETY: as in `state_of`.
    unsafe { (*c).state.compare_exchange(from, to, Relaxed, Relaxed).is_ok() }
}

/// The medium part of a heap.
pub(crate) struct Medium {
    bins: [*mut Chunk; MEDIUM_CLASSES],
    /// Medium pages (their first unit descriptors, linked by next/prev).
    page_list: *mut Desc,
    /// Page we bump from.
    current: *mut Desc,
    /// Pages held.
    pub pages: usize,
    /// Live chunks per medium class (by requested class).
    live: [u64; MEDIUM_CLASSES],
    /// Never give a page back (the heap's inbox broke: see
    /// `Heap::inbox_broken`); empty pages stay for reuse by this heap.
    pub(crate) keep_pages: bool,
    /// Bytes of chunks freed into the bins since the last coalescing pass
    /// (see [`Medium::coalescing_may_pay`]).
    freed_since_coalesce: usize,
}

#[inline]
fn tag_of(c: *const Chunk) -> u64 {
    (c as u64) ^ (arena::flight_tag() as u64).rotate_left(17)
}

/// Bin of a free payload of `q` bytes (the largest class that fits), or None.
fn bin_of(q: usize) -> Option<usize> {
    if q < MIN_BIN_PAYLOAD {
        return None;
    }
    let q = q.min(class_size(NUM_CLASSES - 1));
    let mut c = class_index(q);
    if class_size(c) > q {
        c -= 1;
    }
    Some(c - SMALL_CLASSES)
}

impl Medium {
    pub(crate) const fn new() -> Medium {
        Medium { bins: [ptr::null_mut(); MEDIUM_CLASSES], page_list: ptr::null_mut(), current: ptr::null_mut(), pages: 0, live: [0; MEDIUM_CLASSES], keep_pages: false, freed_since_coalesce: 0 }
    }

    pub(crate) fn live_per_class(&self) -> [u64; MEDIUM_CLASSES] {
        self.live
    }

    unsafe fn bin_push(&mut self, c: *mut Chunk) {
        // SAFETY: c is a free chunk of ours with room for the links.
        unsafe {
            let q = (*c).size as usize - HDR;
            match bin_of(q) {
                Some(b) => {
                    set_state(c, FREE);
                    (*c).prev = ptr::null_mut();
                    (*c).next = self.bins[b];
                    if !self.bins[b].is_null() {
                        (*self.bins[b]).prev = c;
                    }
                    self.bins[b] = c;
                }
                None => set_state(c, FRAG),
            }
        }
    }

    unsafe fn bin_remove(&mut self, c: *mut Chunk) {
        // SAFETY: c is a free chunk; if FREE it is in its bin.
        unsafe {
            if state_of(c) != FREE {
                return;
            }
            let b = bin_of((*c).size as usize - HDR).expect("binned chunk has a bin");
            if (*c).prev.is_null() {
                self.bins[b] = (*c).next;
            } else {
                (*(*c).prev).next = (*c).next;
            }
            if !(*c).next.is_null() {
                (*(*c).next).prev = (*c).prev;
            }
            set_state(c, FRAG);
        }
    }

    #[inline]
    fn page_of(c: *const u8) -> *mut Desc {
        // SAFETY: c is inside a medium page of the arena.
        unsafe { desc(arena::unit_index(c as usize) & !(PAGE_UNITS - 1)) }
    }

    unsafe fn make_used(&mut self, c: *mut Chunk, cls: usize) -> *mut u8 {
        // SAFETY: c is a chunk of ours being handed out.
        unsafe {
            set_state(c, USED);
            set_tag(c, tag_of(c));
            (*Medium::page_of(c as *const u8)).used += 1;
            self.live[cls - SMALL_CLASSES] += 1;
            (c as *mut u8).add(HDR)
        }
    }

    /// Split `c` (free, unbinned) to `need` bytes if the rest is worth keeping.
    unsafe fn split(&mut self, c: *mut Chunk, need: usize) {
        // SAFETY: c is ours; the remainder lies inside the same page.
        unsafe {
            let size = (*c).size as usize;
            if size >= need + HDR + 64 {
                let r = (c as *mut u8).add(need) as *mut Chunk;
                (*r).size = (size - need) as u32;
                set_tag(r, tag_of(r));
                self.bin_push(r);
                (*c).size = need as u32;
            }
        }
    }

    /// Allocate a chunk of class `cls` (a medium class).
    ///
    /// # Safety
    /// Owner thread of `heap`.
    pub(crate) unsafe fn alloc(&mut self, heap: *mut Heap, counters: &mut HeapCounters, cls: usize) -> *mut u8 {
        let need = class_size(cls) + HDR;
        let b = cls - SMALL_CLASSES;
        for attempt in 0..2 {
            // SAFETY: owner thread; all chunks touched are ours.
            unsafe {
                // 1. exact bin
                let c = self.bins[b];
                if !c.is_null() {
                    self.bin_remove(c);
                    if b == MEDIUM_CLASSES - 1 {
                        // The last bin holds every longer run too (up to a
                        // whole page): keep only what the class needs.
                        self.split(c, need);
                    }
                    return self.make_used(c, cls);
                }
                // 2. bump the current page
                if !self.current.is_null() {
                    let top = (*self.current).a as usize;
                    if top + need <= PAGE {
                        let c = (arena::unit_addr(self.current).add(top)) as *mut Chunk;
                        (*c).size = need as u32;
                        (*self.current).a = (top + need) as u32;
                        return self.make_used(c, cls);
                    }
                }
                // 3. split a larger free chunk
                for bb in b + 1..MEDIUM_CLASSES {
                    let c = self.bins[bb];
                    if !c.is_null() {
                        self.bin_remove(c);
                        self.split(c, need);
                        return self.make_used(c, cls);
                    }
                }
                // 4. coalesce once, then retry, if enough was freed since
                // the last pass for it to pay
                if attempt == 0 && self.coalescing_may_pay() {
                    counters.coalescings += 1;
                    self.coalesce(counters);
                }
            }
        }
        // 5. a new page
        if !self.take_page(heap, counters) {
            return ptr::null_mut();
        }
        // SAFETY: the fresh current page has room for any medium chunk.
        unsafe {
            let c = arena::unit_addr(self.current) as *mut Chunk;
            (*c).size = need as u32;
            (*self.current).a = need as u32;
            self.make_used(c, cls)
        }
    }

    fn take_page(&mut self, heap: *mut Heap, counters: &mut HeapCounters) -> bool {
        let Some(idx) = global::take_page() else { return false };
        // SAFETY: the page's units are ours now.
        unsafe {
            arena::mark_units(idx, PAGE_UNITS, kind::MEDIUM);
            for i in idx..idx + PAGE_UNITS {
                (*desc(i)).heap.store(heap, Ordering::Relaxed);
            }
            let first = desc(idx);
            (*first).a = 0;
            (*first).used = 0;
            (*first).prev = ptr::null_mut();
            (*first).next = self.page_list;
            if !self.page_list.is_null() {
                (*self.page_list).prev = first;
            }
            self.page_list = first;
            self.current = first;
            counters.pages_taken += 1;
        }
        self.pages += 1;
        true
    }

    /// Validate a pointer into a medium page: it must be the payload of a
    /// chunk (its header's tag matches its address) that is in use.
    pub(crate) fn validate(p: *mut u8) -> Result<(), crate::report::BadFree> {
        use crate::report::BadFree;
        let page = Medium::page_of(p);
        let base = arena::unit_addr(page) as usize;
        let a = p as usize;
        if a % 16 != 0 || a < base + HDR {
            return Err(BadFree::NotABlock);
        }
        let c = (a - HDR) as *mut Chunk;
        // SAFETY: c..c+16 lies inside the page (checked above), which is mapped.
        unsafe {
            if tag_at(c) != tag_of(c) {
                return Err(BadFree::NotABlock);
            }
            match state_of(c) {
                USED => Ok(()),
                FREE | FRAG | IN_FLIGHT => Err(BadFree::DoubleFree),
                _ => Err(BadFree::NotABlock),
            }
        }
    }

    /// Mark a validated chunk as on its way to its owner (a remote free), so
    /// a second free of it is recognised.  False, with nothing written, if
    /// another free of the chunk won the race since `validate`: the caller
    /// reports a double free and must not send the chunk.
    #[must_use]
    pub(crate) fn mark_in_flight(p: *mut u8) -> bool {
        // SAFETY: `validate` found a chunk header at p - HDR, inside a mapped
        // page (page memory stays mapped); `state` is only accessed
        // atomically, so a racing free or the owner's accesses are no data
        // race.
        unsafe { claim((p as usize - HDR) as *const Chunk, USED, IN_FLIGHT) }
    }

    /// Whether `p` is the payload of a chunk marked in flight to its owner.
    pub(crate) fn is_in_flight(p: *mut u8) -> bool {
        let page = Medium::page_of(p);
        let base = arena::unit_addr(page) as usize;
        let a = p as usize;
        if a % 16 != 0 || a < base + HDR {
            return false;
        }
        let c = (a - HDR) as *mut Chunk;
        // SAFETY: the header lies inside the page, which is mapped.
        unsafe { tag_at(c) == tag_of(c) && state_of(c) == IN_FLIGHT }
    }

    /// Usable size of a live chunk.
    pub(crate) fn usable(p: *mut u8) -> usize {
        // SAFETY: p is a validated live chunk payload.
        unsafe { (*((p as usize - HDR) as *mut Chunk)).size as usize - HDR }
    }

    /// Free a validated chunk of this heap that the program freed on this
    /// thread.  False, with nothing done, if another thread's free of the
    /// chunk won the race since `validate` (a double free, to be reported).
    ///
    /// # Safety
    /// Owner thread; `p` is a validated chunk of this heap.
    #[must_use]
    pub(crate) unsafe fn free_local(&mut self, counters: &mut HeapCounters, p: *mut u8) -> bool {
        // SAFETY: forwarded.
        unsafe { self.free_from(counters, p, USED) }
    }

    /// Free a chunk of this heap that another thread's free sent home (from
    /// the inbox, found in flight by `is_in_flight`).  Only the owner moves a
    /// chunk out of IN_FLIGHT, so this does not fail.
    ///
    /// # Safety
    /// Owner thread; `p` is a chunk of this heap in flight to it.
    pub(crate) unsafe fn free_in_flight(&mut self, counters: &mut HeapCounters, p: *mut u8) {
        // SAFETY: forwarded.
        let freed = unsafe { self.free_from(counters, p, IN_FLIGHT) };
        debug_assert!(freed, "a chunk in flight to its owner changed state on the way");
    }

    /// Claim the chunk at `p` from state `from` (USED or IN_FLIGHT) and free
    /// it; false if its state was not `from`.
    ///
    /// # Safety
    /// Owner thread; `p` is a validated chunk of this heap.
    unsafe fn free_from(&mut self, counters: &mut HeapCounters, p: *mut u8, from: u32) -> bool {
        // SAFETY: p is a validated chunk of ours (header in a mapped page of
        // this heap).  Once the CAS has moved it out of `from`, no other free
        // can claim it (they all claim from USED), so it is ours alone to
        // unbin, link and count; if the CAS fails, nothing is touched.
        unsafe {
            let c = (p as usize - HDR) as *mut Chunk;
            if !claim(c, from, FRAG) {
                return false;
            }
            let q = (*c).size as usize - HDR;
            let cls = class_index(q.min(class_size(NUM_CLASSES - 1)));
            let cls = if class_size(cls) > q { cls - 1 } else { cls };
            let slot = cls.max(SMALL_CLASSES) - SMALL_CLASSES;
            self.live[slot] = self.live[slot].saturating_sub(1);
            let page = Medium::page_of(p);
            (*page).used -= 1;
            self.bin_push(c);
            self.freed_since_coalesce = self.freed_since_coalesce.saturating_add((*c).size as usize);
            if (*page).used == 0 && page != self.current {
                self.release_page(counters, page);
            }
        }
        true
    }

    /// Unbin every chunk of an empty page and give the page back.
    unsafe fn release_page(&mut self, counters: &mut HeapCounters, page: *mut Desc) {
        if self.keep_pages {
            return;
        }
        // SAFETY: every chunk of the page is free and ours.
        unsafe {
            let base = arena::unit_addr(page);
            let top = (*page).a as usize;
            let mut off = 0;
            while off < top {
                let c = base.add(off) as *mut Chunk;
                self.bin_remove(c);
                set_state(c, 0);
                set_tag(c, 0);
                off += (*c).size as usize;
            }
            if (*page).prev.is_null() {
                self.page_list = (*page).next;
            } else {
                (*(*page).prev).next = (*page).next;
            }
            if !(*page).next.is_null() {
                (*(*page).next).prev = (*page).prev;
            }
            if self.current == page {
                self.current = self.page_list;
            }
            let idx = desc_index(page);
            for i in idx..idx + PAGE_UNITS {
                (*desc(i)).heap.store(ptr::null_mut(), Ordering::Relaxed);
            }
            (*page).a = 0;
            counters.pages_returned += 1;
            self.pages -= 1;
            give_span_back(idx, PAGE_UNITS, true);
        }
    }

    /// Whether a coalescing pass is worth its cost before a request takes a
    /// new page: only once the chunks freed into the bins since the last
    /// pass add up to a 64th of the heap's medium pages.  A pass walks every
    /// chunk of every page; run on every request that missed, it was paid
    /// again and again by a heap whose free chunks cannot merge (every other
    /// chunk live): 4000 chunks of 9..45 KB, half of them freed, then 400 000
    /// requests of 8..208 KiB took 2.0 s (24 333 passes; tcmalloc 4 ms,
    /// mimalloc 76 ms, jemalloc 210 ms), now 20 ms.  What the heap takes
    /// meanwhile instead of merging is bounded by what was freed, a 64th of
    /// its pages: the size walk's peak RSS did not move (47.3 MiB; with the
    /// threshold at the request's size instead, 48.1).
    fn coalescing_may_pay(&self) -> bool {
        self.freed_since_coalesce >= self.pages * PAGE / 64
    }

    /// Merge adjacent free chunks in every page; a run that ends at the
    /// current page's bump offset lowers it (in another page it is binned).
    /// Empty pages other than the current go back (unless `keep_pages`).
    unsafe fn coalesce(&mut self, counters: &mut HeapCounters) {
        self.freed_since_coalesce = 0;
        let mut page = self.page_list;
        while !page.is_null() {
            // SAFETY: pages and chunks of this heap.
            unsafe {
                let next_page = (*page).next;
                // A heap that keeps its pages coalesces its empty ones too.
                if (*page).used == 0 && page != self.current && !self.keep_pages {
                    self.release_page(counters, page);
                    page = next_page;
                    continue;
                }
                let base = arena::unit_addr(page);
                let top = (*page).a as usize;
                let mut off = 0;
                while off < top {
                    let c = base.add(off) as *mut Chunk;
                    let size = (*c).size as usize;
                    let s = state_of(c);
                    if s != FREE && s != FRAG {
                        // USED, or IN_FLIGHT: freed by another thread and
                        // still on its way back to us.
                        off += size;
                        continue;
                    }
                    // A run of free chunks starting at c.
                    self.bin_remove(c);
                    let mut run = size;
                    while off + run < top {
                        let n = base.add(off + run) as *mut Chunk;
                        let s = state_of(n);
                        if s != FREE && s != FRAG {
                            break;
                        }
                        self.bin_remove(n);
                        set_tag(n, 0);
                        run += (*n).size as usize;
                    }
                    // Only the current page is bumped from: a run at the
                    // top of another page goes to a bin, or it would be
                    // lost until the page empties.
                    if off + run == top && page == self.current {
                        (*page).a = off as u32;
                        set_tag(c, 0);
                        set_state(c, 0);
                        break;
                    }
                    (*c).size = run as u32;
                    self.bin_push(c);
                    off += run;
                }
                page = next_page;
            }
        }
    }

    /// At heap abandonment: give back pages with no live chunk.
    pub(crate) unsafe fn release_empty_pages(&mut self, counters: &mut HeapCounters) {
        let mut page = self.page_list;
        while !page.is_null() {
            // SAFETY: pages of this heap.
            unsafe {
                let next = (*page).next;
                if (*page).used == 0 {
                    if self.current == page {
                        self.current = ptr::null_mut();
                    }
                    self.release_page(counters, page);
                }
                page = next;
            }
        }
        if self.current.is_null() {
            self.current = self.page_list;
        }
    }

    /// Check the bins and pages (owner; tests and debug).
    pub(crate) fn check(&self) -> Result<(), &'static str> {
        let mut page = self.page_list;
        let mut n = 0;
        while !page.is_null() {
            // SAFETY: pages and chunks of this heap, read by the owner.
            unsafe {
                if (*page).kind != kind::MEDIUM {
                    return Err("medium page list holds a unit of another kind");
                }
                let base = arena::unit_addr(page);
                let top = (*page).a as usize;
                let mut off = 0;
                let mut used = 0;
                while off < top {
                    let c = base.add(off) as *mut Chunk;
                    let size = (*c).size as usize;
                    if size < HDR || size % 16 != 0 || off + size > top {
                        return Err("medium chunk with a bad size");
                    }
                    match state_of(c) {
                        USED | IN_FLIGHT => used += 1,
                        FREE => {
                            let b = bin_of(size - HDR).ok_or("binned chunk too small for a bin")?;
                            let mut x = self.bins[b];
                            let mut found = false;
                            while !x.is_null() {
                                if x == c {
                                    found = true;
                                    break;
                                }
                                x = (*x).next;
                            }
                            if !found {
                                return Err("free chunk missing from its bin");
                            }
                        }
                        FRAG => {}
                        _ => return Err("medium chunk with a bad state"),
                    }
                    off += size;
                }
                if used != (*page).used {
                    return Err("page's live count disagrees with its chunks");
                }
                n += 1;
                page = (*page).next;
            }
        }
        if n != self.pages {
            return Err("medium page count disagrees with the list");
        }
        Ok(())
    }
}
