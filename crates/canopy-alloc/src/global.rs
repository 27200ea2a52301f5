//! The global heap: owner of the arena (SAC's top-level heap).
//!
//! It hands out *spans* of consecutive 64 KiB units: 1 MiB pages (aligned) to
//! thread heaps, and large chunks directly to the program.  Freed spans are
//! kept and reused (coalesced with free neighbours at once, in O(1) through
//! the descriptor table) instead of being unmapped per request: unmapping per
//! request is what made Hoard ten times slower at X = 1000 in the SAC paper.
//!
//! Returning memory to the OS, the policy: the global heap keeps
//! `CANOPY_RETAIN_MB` of committed free memory.  Above that it waits: when a
//! free finds committed free memory above the limit and every free since the
//! first such one (at least `CANOPY_DECAY_MS` earlier) found it above too,
//! free spans are decommitted (`MADV_DONTNEED`), largest first, until at most
//! half of the limit is left.  A program that frees a lot and soon allocates
//! as much again (a phase of a loop) keeps its memory instead of faulting it
//! in afresh each time; one that stays above the limit gives the excess back
//! on its first free, or first allocation from the global heap, after the
//! delay (the check rides on those calls: nothing runs in the background).  `CANOPY_DECAY_MS=0` decommits at once.
//! `canopy_collect()` decommits every free span now.  In an arena that grows
//! (under a limit on address space) decommitting unmaps, addresses and all:
//! the free span at the top lowers the top (`unmap_top`), one below live
//! memory becomes *holes* (`unmap_runs`, the clean mark [`HOLE`]), mapped
//! again before its units are handed out (`map_holes`).
//!
//! Free spans sit in bins by length: bins 1..=63 hold spans of exactly that
//! many units, bin 64 the longer ones.  Lists are doubly linked through the
//! descriptors so a neighbour can be unlinked in O(1) when coalescing, and a
//! word with a bit per non-empty bin leads a request to the first bin that
//! can serve it.  The work of a span operation is proportional to the units
//! handed out or given back, never to the free span they are cut from or
//! merged into: the body units of a free span keep their marks when the span
//! is split or grows, and only the units at its ends change.
//!
//! Locking: one lock (`GLOBAL.lock`) guards the spans, the list of heaps and
//! the abandoned heaps.  It is only taken on slow paths, and not at all while
//! a single thread has a heap (see `crate::solo`).

use crate::arena::{self, desc, desc_index, kind, Desc, SPAN_COMMITTED, SPAN_ZEROED, UNIT, UNIT_SHIFT};
use crate::heap::Heap;
use core::cell::UnsafeCell;
use core::ptr;

const BINS: usize = 65;

/// The clean mark (`Desc::limit`) of a free unit whose memory is unmapped,
/// addresses and all: a *hole* in an arena that grows, left where the global
/// heap decommitted a free span below live memory (`unmap_span`).  It holds
/// no memory, like a unit marked 0, but must be mapped again before it is
/// handed out (`map_holes`), and it is never unmapped a second time: the
/// program may have a mapping of its own there by then.
pub(crate) const HOLE: u32 = u32::MAX;

/// The shortest run of units made a hole (1 MiB); shorter runs are only
/// decommitted.  Each hole splits the arena's mapping, and a process may
/// have only so many mappings (`vm.max_map_count`, 65530 by default): with
/// this, an arena of N GiB makes at most 1024·N of them.
const MIN_HOLE_UNITS: usize = 16;

/// The global heap's state (only touched under its lock).
pub(crate) struct GlobalState {
    /// First unit never handed out.
    pub top: usize,
    /// Heads of the span bins (index = length, 64 = longer).
    bins: [*mut Desc; BINS],
    /// Bit `b` set: `bins[b]` is not empty.
    nonempty: u128,
    /// Units of free spans that may hold memory (clean mark not 0): what a
    /// decommit of every free span would give back.
    pub free_committed_units: usize,
    /// Units in free spans.
    pub free_units: usize,
    /// Units of free spans whose memory is unmapped, addresses and all (clean
    /// mark [`HOLE`]; only in an arena that grows).
    pub hole_units: usize,
    /// When a free first found committed free memory above the retain limit,
    /// with every free since finding it above too (coarse monotonic ms; 0:
    /// it is not above).
    over_since_ms: u64,
    /// Every heap ever created (linked by `Heap::next_all`).
    pub heaps: *mut Heap,
    /// Heaps whose thread exited, waiting for adoption.
    pub abandoned: *mut Heap,
    /// Counters.
    pub stats: GlobalCounters,
}

/// Counters of the global heap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlobalCounters {
    /// Large chunks allocated.
    pub large_allocs: u64,
    /// Large chunks freed.
    pub large_frees: u64,
    /// Bytes in live large chunks.
    pub large_bytes: u64,
    /// Pages handed to thread heaps.
    pub pages_out: u64,
    /// Units currently lent to other layers (`lend_pages`).
    pub lent_units: u64,
    /// Pages given back by thread heaps.
    pub pages_back: u64,
    /// Bytes decommitted (given back to the OS).
    pub bytes_decommitted: u64,
    /// Decommit operations.
    pub decommits: u64,
    /// Span coalescings.
    pub span_coalescings: u64,
    /// Heaps created.
    pub heaps_created: u64,
    /// Heaps adopted from exited threads.
    pub heaps_adopted: u64,
    /// Heaps abandoned by exiting threads.
    pub heaps_abandoned: u64,
}

/// 128-byte aligned: the lock and the state are written by whichever thread
/// holds the lock, and no other static may share their lines (see
/// `arena::FastKeys`).
#[repr(align(128))]
pub(crate) struct Global {
    pub lock: canopy_sync::SoloLock,
    pub state: UnsafeCell<GlobalState>,
}

// SAFETY: `state` is only accessed while `lock` is held (or while the process
// is known to have a single thread with a heap, see crate::solo).
unsafe impl Sync for Global {}

pub(crate) static GLOBAL: Global = Global {
    lock: canopy_sync::SoloLock::new(),
    state: UnsafeCell::new(GlobalState {
        top: 0,
        bins: [ptr::null_mut(); BINS],
        nonempty: 0,
        free_committed_units: 0,
        free_units: 0,
        hole_units: 0,
        over_since_ms: 0,
        heaps: ptr::null_mut(),
        abandoned: ptr::null_mut(),
        stats: GlobalCounters {
            large_allocs: 0,
            large_frees: 0,
            large_bytes: 0,
            pages_out: 0,
            lent_units: 0,
            pages_back: 0,
            bytes_decommitted: 0,
            decommits: 0,
            span_coalescings: 0,
            heaps_created: 0,
            heaps_adopted: 0,
            heaps_abandoned: 0,
        },
    }),
};

/// Access the global state.
///
/// # Safety
/// The caller holds the global lock (see [`crate::solo::lock`]).
#[allow(clippy::mut_from_ref)]
pub(crate) unsafe fn state() -> &'static mut GlobalState {
    // SAFETY: caller holds the lock, so this is the only live reference.
    unsafe { &mut *GLOBAL.state.get() }
}

fn bin_of(units: usize) -> usize {
    units.min(BINS - 1)
}

impl GlobalState {
    /// Put a free span of units that are not marked free yet (fresh units
    /// above `top`) in its bin: mark every unit, count the ones that may hold
    /// memory.  O(n): for the units of a span being created, not of one that
    /// exists.
    unsafe fn insert_free(&mut self, idx: usize, n: usize) {
        debug_assert!(n > 0);
        // SAFETY: idx..idx+n are arena units owned by the global heap.
        unsafe {
            let dirty = dirty_units(idx, n);
            arena::mark_units(idx, n, kind::FREE_BODY);
            self.link_free(idx, n, dirty);
        }
    }

    /// Put the free span `idx..idx+n` in its bin.  Units `idx+1..idx+n`
    /// already carry `FREE_BODY` (their owner 0) and `dirty` of the span's
    /// units have a clean mark that is not 0; here only the first unit (made
    /// the head) and the last (pointed back at it) are written.  The span's
    /// flags come from `dirty`: committed if any unit may hold memory, zeroed
    /// if none does; the head keeps the count (`Desc::spare`), which is what
    /// `free_committed_units` adds up, so a span merged from decommitted and
    /// committed pieces counts only the committed ones.
    unsafe fn link_free(&mut self, idx: usize, n: usize, dirty: usize) {
        debug_assert!(n > 0);
        debug_assert_eq!(dirty, unsafe { dirty_units(idx, n) }, "a free span's committed-unit count");
        // SAFETY: idx..idx+n are arena units owned by the global heap.
        unsafe {
            let first = desc(idx);
            (*first).owner.store(0, core::sync::atomic::Ordering::Relaxed);
            (*first).kind = kind::FREE_SPAN;
            (*first).a = n as u32;
            (*first).flags = if dirty == 0 { SPAN_ZEROED } else { SPAN_COMMITTED };
            (*first).spare = dirty as u64;
            let b = bin_of(n);
            (*first).prev = ptr::null_mut();
            (*first).next = self.bins[b];
            if !self.bins[b].is_null() {
                (*self.bins[b]).prev = first;
            }
            self.bins[b] = first;
            self.nonempty |= 1 << b;
            if n > 1 {
                // The last unit points back at the first for left coalescing.
                let last = desc(idx + n - 1);
                debug_assert_eq!((*last).kind, kind::FREE_BODY);
                (*last).next = first;
            }
        }
        self.free_committed_units += dirty;
        self.free_units += n;
    }

    /// Take a free span out of its bin.  Its units keep their marks.
    unsafe fn unlink_free(&mut self, first: *mut Desc) {
        // SAFETY: first is the head unit of a free span in a bin.
        unsafe {
            let n = (*first).a as usize;
            let b = bin_of(n);
            if (*first).prev.is_null() {
                debug_assert_eq!(self.bins[b], first);
                self.bins[b] = (*first).next;
                if self.bins[b].is_null() {
                    self.nonempty &= !(1 << b);
                }
            } else {
                (*(*first).prev).next = (*first).next;
            }
            if !(*first).next.is_null() {
                (*(*first).next).prev = (*first).prev;
            }
            self.free_units -= n;
            self.free_committed_units -= (*first).spare as usize;
        }
    }

    /// Put back the part `idx..idx+n` of a free span just unlinked, of which
    /// it is the tail, holding `dirty` committed units.  Its last unit is the
    /// old span's last, a body unit pointing at the old head (`link_free`
    /// points it at the new one); its first, a body unit until now, becomes
    /// the head.
    unsafe fn relink_tail(&mut self, idx: usize, n: usize, dirty: usize) {
        // SAFETY: forwarded; the units are a free span's.
        unsafe { self.link_free(idx, n, dirty) }
    }

    /// Allocate `n` units aligned to `align` units.  Returns the first unit's
    /// index and whether the span reads as zero.
    ///
    /// The units still carry the kinds of a free span: the caller marks them
    /// before it lets go of the lock, because `free_span` reads the kinds of
    /// a freed span's neighbours to coalesce with them.
    ///
    /// Free memory waiting above the retain limit (see the module's
    /// documentation) goes back to the OS here too once its delay is over,
    /// so a program that stops freeing but still allocates gives it back.
    pub(crate) unsafe fn alloc_span(&mut self, n: usize, align: usize) -> Option<(usize, bool)> {
        // SAFETY: the caller holds the lock (this function's contract).
        let got = unsafe { self.alloc_span_fit(n, align) };
        if self.over_since_ms != 0 {
            let o = crate::options();
            // SAFETY: as above; the span just taken is no longer free.  Its
            // units still carry a free span's kinds (the caller marks them),
            // so the top is not given back here: a span taken from the top
            // would look free to `unmap_top`.
            unsafe { self.apply_retain_policy(o.retain_bytes, o.decay_ms, now_ms, false) };
        }
        got
    }

    /// [`alloc_span`](Self::alloc_span) without the decommit check.
    unsafe fn alloc_span_fit(&mut self, n: usize, align: usize) -> Option<(usize, bool)> {
        debug_assert!(align.is_power_of_two() && n > 0);
        // Bins first: first fit, a few candidates per bin, only the bins
        // that hold spans.
        let mut bins = self.nonempty >> bin_of(n) << bin_of(n);
        while bins != 0 {
            let b = bins.trailing_zeros() as usize;
            bins &= bins - 1;
            let mut d = self.bins[b];
            let mut tries = 0;
            while !d.is_null() && tries < 16 {
                // SAFETY: d is a free span head in a bin.
                let len = unsafe { (*d).a as usize };
                let s = desc_index(d);
                let at = (s + align - 1) & !(align - 1);
                // SAFETY: the units are d's, a free span's (for `map_holes`).
                if len >= n && at + n <= s + len && (self.hole_units == 0 || unsafe { self.map_holes(at, n) }) {
                    // SAFETY: d is in a bin; the pieces are ours to re-insert.
                    unsafe {
                        let spare = (*d).spare as usize;
                        self.unlink_free(d);
                        // The pieces left over keep their units' marks: only
                        // the units handed out and an alignment gap (shorter
                        // than the alignment) are counted.
                        let taken = dirty_units(at, n);
                        let mut rest = spare - taken;
                        if at > s {
                            let front = dirty_units(s, at - s);
                            rest -= front;
                            if at - s > 1 {
                                (*desc(at - 1)).kind = kind::FREE_BODY;
                            }
                            self.link_free(s, at - s, front);
                        }
                        if at + n < s + len {
                            self.relink_tail(at + n, s + len - at - n, rest);
                        }
                        return Some((at, taken == 0));
                    }
                }
                // SAFETY: d is a valid descriptor in the list.
                d = unsafe { (*d).next };
                tries += 1;
            }
        }
        // Then fresh units from the top of the arena, starting in the free
        // span that ends at the top if it has holes: a span of holes that
        // could not be given back as the top (see `unmap_top`) would
        // otherwise strand its positions below every fresh unit, and under
        // a limit the arena could not grow past them.
        if self.hole_units != 0 && self.top > 0 {
            // SAFETY: top - 1 is an arena unit below top.
            let head = unsafe { span_ending_at(self.top - 1) };
            if !head.is_null() {
                let s = desc_index(head);
                let at = (s + align - 1) & !(align - 1);
                // SAFETY (map_holes): the units at..top are head's.
                if at < self.top
                    && at + n >= self.top
                    && (at + n <= arena::mapped_units() || arena::ensure_mapped(at + n))
                    && unsafe { self.map_holes(at, self.top - at) }
                {
                    // SAFETY: head is the free span ending at top; the
                    // piece before `at` is ours to put back, the rest and
                    // the fresh units above top are handed out.
                    unsafe {
                        let spare = (*head).spare as usize;
                        self.unlink_free(head);
                        let taken = dirty_units(at, self.top - at);
                        if at > s {
                            let front = dirty_units(s, at - s);
                            debug_assert_eq!(spare, taken + front);
                            if at - s > 1 {
                                (*desc(at - 1)).kind = kind::FREE_BODY;
                            }
                            self.link_free(s, at - s, front);
                        } else {
                            debug_assert_eq!(spare, taken);
                        }
                        self.top = at + n;
                        return Some((at, taken == 0));
                    }
                }
            }
        }
        // Then fresh units from the top of the arena.
        let at = (self.top + align - 1) & !(align - 1);
        if at + n > arena::mapped_units() && !arena::ensure_mapped(at + n) {
            return None;
        }
        if at > self.top {
            // SAFETY: units top..at are fresh arena units.
            unsafe { self.insert_free(self.top, at - self.top) };
        }
        self.top = at + n;
        Some((at, true))
    }

    /// Grow the large chunk at `idx` from `old` to `new` units in place, from
    /// a free span right after it or from the untouched top of the arena.
    pub(crate) unsafe fn grow_in_place(&mut self, idx: usize, old: usize, new: usize) -> bool {
        let end = idx + old;
        let need = new - old;
        if end == self.top {
            if idx + new > arena::mapped_units() && !arena::ensure_mapped(idx + new) {
                return false;
            }
            self.top = idx + new;
            // SAFETY: the units were never handed out; now they are the chunk's.
            unsafe { arena::mark_units(end, need, kind::LARGE_BODY) };
            return true;
        }
        // SAFETY: `end` is an arena unit below top; its kind says whether it
        // heads a free span owned by us.
        unsafe {
            let right = desc(end);
            if (*right).kind != kind::FREE_SPAN || ((*right).a as usize) < need {
                return false;
            }
            if self.hole_units != 0 && !self.map_holes(end, need) {
                return false;
            }
            let avail = (*right).a as usize;
            let spare = (*right).spare as usize;
            self.unlink_free(right);
            if avail > need {
                self.relink_tail(end + need, avail - need, spare - dirty_units(end, need));
            }
            arena::mark_units(end, need, kind::LARGE_BODY);
        }
        true
    }

    /// Whether bytes `from..to` of the units starting at `idx` are known to
    /// hold no memory, by the units' clean marks (see `free_span`).  For the
    /// units `alloc_span` just handed out, before their new owner reuses the
    /// descriptors' `limit`.
    pub(crate) unsafe fn known_clean(idx: usize, from: usize, to: usize) -> bool {
        (from / UNIT..to.div_ceil(UNIT)).all(|k| {
            // SAFETY: the units are arena units (caller's contract).
            let mark = unsafe { (*desc(idx + k)).limit } as usize;
            mark <= from.saturating_sub(k * UNIT)
        })
    }

    /// Give back `n` units from `idx`, coalescing with free neighbours, then
    /// apply the decommit policy.  `clean_from`: the units hold no memory
    /// from this byte offset on (None: nothing known); `committed` false:
    /// the units hold no memory at all.
    ///
    /// Every unit of a free span carries a *clean mark* in its descriptor's
    /// `limit`: the byte offset in the unit from which its pages are known to
    /// hold no memory (`UNIT`: none known; 0: all clean, as for units never
    /// handed out).  Marks survive splitting and coalescing, so a short large
    /// chunk cut from a span can skip trimming a tail that is already clean.
    pub(crate) unsafe fn free_span(&mut self, idx: usize, n: usize, committed: bool, retain_bytes: usize, clean_from: Option<usize>) {
        let mut dirty = 0;
        for k in 0..n {
            let mark = if committed { clean_from.map_or(UNIT, |c| c.saturating_sub(k * UNIT).min(UNIT)) } else { 0 };
            // SAFETY: the units are ours to give back (caller's contract).
            unsafe {
                let d = desc(idx + k);
                (*d).limit = mark as u32;
                (*d).owner.store(0, core::sync::atomic::Ordering::Relaxed);
                (*d).kind = kind::FREE_BODY;
            }
            dirty += usize::from(mark != 0);
        }
        let mut start = idx;
        let mut len = n;
        // SAFETY: neighbours are arena units; their kinds tell whether they
        // are free spans owned by us.
        unsafe {
            if start > 0 {
                let left = desc(start - 1);
                let head = match (*left).kind {
                    kind::FREE_SPAN => left,
                    kind::FREE_BODY => (*left).next,
                    _ => ptr::null_mut(),
                };
                if !head.is_null() {
                    debug_assert_eq!((*head).kind, kind::FREE_SPAN);
                    let hl = (*head).a as usize;
                    let hs = desc_index(head);
                    debug_assert_eq!(hs + hl, start);
                    dirty += (*head).spare as usize;
                    self.unlink_free(head);
                    start = hs;
                    len += hl;
                    self.stats.span_coalescings += 1;
                }
            }
            if start + len < self.top {
                let right = desc(start + len);
                if (*right).kind == kind::FREE_SPAN {
                    let rl = (*right).a as usize;
                    dirty += (*right).spare as usize;
                    self.unlink_free(right);
                    // Its head is a body unit of the merged span now.
                    (*right).kind = kind::FREE_BODY;
                    len += rl;
                    self.stats.span_coalescings += 1;
                }
            }
            self.link_free(start, len, dirty);
        }
        // SAFETY: we hold the lock (caller's contract).
        unsafe { self.apply_retain_policy(retain_bytes, crate::options().decay_ms, now_ms, true) };
    }

    /// The decommit policy (see the module's documentation), after a free:
    /// committed free memory above `retain` is decommitted down to half of
    /// it once it has stayed above for `decay_ms` by the clock `now`.
    /// `top`: whether the free span at the top may be given back too
    /// ([`Self::unmap_top`]); only where every free span is in its bin.
    ///
    /// # Safety
    /// The caller holds the global lock.
    pub(crate) unsafe fn apply_retain_policy(&mut self, retain: usize, decay_ms: u64, now: fn() -> u64, top: bool) {
        if self.free_committed_units * UNIT <= retain {
            self.over_since_ms = 0;
            return;
        }
        if decay_ms != 0 {
            let t = now().max(1);
            if self.over_since_ms == 0 {
                self.over_since_ms = t;
                return;
            }
            if t.saturating_sub(self.over_since_ms) < decay_ms {
                return;
            }
        }
        // SAFETY: we hold the lock (caller's contract).
        unsafe { self.decommit_down_to(retain / 2, top) };
        self.over_since_ms = 0;
    }

    /// In an arena that grows (under a limit on address space), give the
    /// free span that ends at `top` back to the OS, addresses included
    /// (`arena::unmap_from`), and lower `top` to its start: its units become
    /// fresh again, mapped anew when they are next handed out
    /// (`arena::ensure_mapped`).  Without this, the addresses a heap's peak
    /// took stayed reserved for good, and a program under `ulimit -v` could
    /// not map, say, thread stacks after its heap shrank.  Returns the bytes
    /// of memory given back (the span's committed units).
    ///
    /// # Safety
    /// The caller holds the global lock, and every free span is in its bin
    /// (not between `alloc_span_fit` and the caller's marking of the units
    /// it took).
    unsafe fn unmap_top(&mut self) -> usize {
        if !arena::arena_grows() || self.top == 0 {
            return 0;
        }
        // SAFETY: top - 1 is an arena unit below top.
        unsafe {
            let head = span_ending_at(self.top - 1);
            if head.is_null() {
                return 0;
            }
            let s = desc_index(head);
            let n = (*head).a as usize;
            debug_assert_eq!(s + n, self.top);
            let dirty = (*head).spare as usize;
            self.unlink_free(head);
            if self.hole_units != 0 && (s..s + n).any(|k| (*desc(k)).limit == HOLE) && !self.map_holes(s, n) {
                // Its holes are mapped again above if they are still empty
                // (then the whole span is the arena's and goes back as one,
                // the top lowered; mapping them costs no memory).  If the
                // OS refuses (the limit, or a mapping of the program's in a
                // hole), the span stays a free span, of holes: its mapped
                // runs go one by one (a hole may hold a mapping of the
                // program's by now, which must neither be unmapped nor block
                // the arena's growth, as it would above a lowered top), and
                // so do the fresh units above the top.
                let given = self.unmap_runs(s, n);
                self.link_free(s, n, dirty_units(s, n));
                if self.top < arena::mapped_units() {
                    // The units above the top were never handed out since
                    // they were mapped.
                    arena::unmap_from(self.top);
                }
                if given != 0 {
                    self.stats.bytes_decommitted += (given << UNIT_SHIFT) as u64;
                    self.stats.decommits += 1;
                }
                return given << UNIT_SHIFT;
            } else if !arena::unmap_from(s) {
                // SAFETY (of the call): the span is free and taken out of its
                // bin, and the units above top were never handed out since
                // they were mapped.
                self.link_free(s, n, dirty);
                return 0;
            }
            for k in s..self.top {
                // Fresh units: what a unit never handed out carries.
                let d = desc(k);
                (*d).owner.store(0, core::sync::atomic::Ordering::Relaxed);
                (*d).heap.store(ptr::null_mut(), core::sync::atomic::Ordering::Relaxed);
                (*d).kind = kind::NONE;
                (*d).flags = 0;
                (*d).limit = 0;
                (*d).spare = 0;
                (*d).a = 0;
                (*d).next = ptr::null_mut();
                (*d).prev = ptr::null_mut();
            }
            self.top = s;
            self.stats.bytes_decommitted += (dirty << UNIT_SHIFT) as u64;
            self.stats.decommits += 1;
            dirty << UNIT_SHIFT
        }
    }

    /// Map again the holes among units `s..s+n` of a free span (units marked
    /// [`HOLE`]) before they are handed out; they become clean units
    /// (mark 0).  All or nothing: if the OS refuses a run (the limit on
    /// address space is reached, or the program has mapped something of its
    /// own there), the runs mapped here are unmapped again and false
    /// returned, and the span stays as it was.
    ///
    /// # Safety
    /// The caller holds the global lock; the units belong to a free span.
    unsafe fn map_holes(&mut self, s: usize, n: usize) -> bool {
        let mut k = s;
        let mut count = 0;
        // SAFETY (next_run): free units of the arena (caller's contract).
        while let Some((run, stop)) = unsafe { next_run(k, s + n, true) } {
            if arena::map_again(run, stop - run).is_err() {
                // Undo: the holes before this run are mapped by this call
                // alone (their marks change only below, on success).
                let mut j = s;
                // SAFETY: as above.
                while let Some((r, e)) = unsafe { next_run(j, run, true) } {
                    // SAFETY: mapped just above, unused.
                    if !unsafe { arena::unmap_units(r, e - r) } {
                        // Still mapped (the OS would not split the mapping):
                        // mapped, clean units of the span, not holes.
                        for u in r..e {
                            // SAFETY: as above.
                            unsafe { (*desc(u)).limit = 0 };
                        }
                        self.hole_units -= e - r;
                    }
                    j = e;
                }
                return false;
            }
            count += stop - run;
            k = stop;
        }
        for k in s..s + n {
            // SAFETY: as above; a hole is mapped again now, and clean.
            unsafe {
                if (*desc(k)).limit == HOLE {
                    (*desc(k)).limit = 0;
                }
            }
        }
        self.hole_units -= count;
        true
    }

    /// Unmap the units of `s..s+n`, part of a free span, that are not holes
    /// already, addresses and all, in an arena that grows; they become holes.
    /// A run shorter than [`MIN_HOLE_UNITS`], or one the OS will not unmap
    /// (at its limit on mappings, a split of the arena's mapping is
    /// refused), is decommitted instead and stays mapped, clean.  Returns
    /// how many units that held memory (by their marks) were given back.
    /// The caller fixes the span's count of committed units.
    ///
    /// # Safety
    /// The caller holds the global lock; the units belong to a free span (in
    /// its bin or just taken out).
    unsafe fn unmap_runs(&mut self, s: usize, n: usize) -> usize {
        let mut given = 0;
        let mut k = s;
        // SAFETY: free units of the arena (caller's contract).
        while let Some((run, stop)) = unsafe { next_run(k, s + n, false) } {
            k = stop;
            // SAFETY: as above; the run is mapped by the arena and free.
            unsafe {
                let dirty = dirty_units(run, stop - run);
                let mark = if stop - run >= MIN_HOLE_UNITS && arena::unmap_units(run, stop - run) {
                    self.hole_units += stop - run;
                    HOLE
                } else if canopy_sys::decommit(arena::unit_addr(desc(run)), (stop - run) << UNIT_SHIFT).is_ok() {
                    0
                } else {
                    continue;
                };
                for j in run..stop {
                    (*desc(j)).limit = mark;
                }
                given += dirty;
            }
        }
        given
    }

    /// Unmap the mapped units of the free span headed by `d`, in its bin
    /// (`unmap_runs`), and bring its count of committed units, its flags and
    /// the counters up to date.  Returns the bytes of memory given back.
    ///
    /// # Safety
    /// The caller holds the global lock; `d` heads a free span in a bin.
    unsafe fn unmap_span(&mut self, d: *mut Desc) -> usize {
        // SAFETY: the caller's contract; only the span's marks and counts
        // change, not the lists.
        unsafe {
            let s = desc_index(d);
            let n = (*d).a as usize;
            let dirty = (*d).spare as usize;
            let given = self.unmap_runs(s, n);
            let left = dirty_units(s, n);
            (*d).spare = left as u64;
            (*d).flags = if left == 0 { SPAN_ZEROED } else { SPAN_COMMITTED };
            self.free_committed_units -= dirty - left;
            if given != 0 {
                self.stats.bytes_decommitted += (given << UNIT_SHIFT) as u64;
                self.stats.decommits += 1;
            }
            given << UNIT_SHIFT
        }
    }

    /// In an arena that grows, unmap every free span's units that are still
    /// mapped (`collect`): clean ones too, which hold addresses though no
    /// memory.  Returns the bytes of memory given back.
    ///
    /// # Safety
    /// The caller holds the global lock, and every free span is in its bin.
    unsafe fn unmap_free_spans(&mut self) -> usize {
        let mut given = 0;
        for b in 0..BINS {
            let mut d = self.bins[b];
            while !d.is_null() {
                // SAFETY: d heads a free span in a bin; only its units' marks
                // and counts change, not the lists.
                unsafe {
                    given += self.unmap_span(d);
                    d = (*d).next;
                }
            }
        }
        given
    }

    /// Decommit every free span that may hold memory (`collect`).  Nothing
    /// committed is left free, so a decommit delay that was running stops.
    ///
    /// # Safety
    /// The caller holds the global lock.
    pub(crate) unsafe fn decommit_all(&mut self) -> usize {
        // SAFETY: forwarded.
        let mut n = unsafe { self.decommit_down_to(0, true) };
        if arena::arena_grows() {
            // SAFETY: forwarded; every free span is in its bin.
            n += unsafe { self.unmap_free_spans() };
        }
        if self.free_committed_units == 0 {
            self.over_since_ms = 0;
        }
        n
    }

    /// Whether a decommit delay is running (tests).
    #[cfg(test)]
    pub(crate) fn decay_running(&self) -> bool {
        self.over_since_ms != 0
    }

    /// Start a decommit delay as a free would have at `t` ms (tests).
    #[cfg(test)]
    pub(crate) fn start_decay_at(&mut self, t: u64) {
        self.over_since_ms = t;
    }

    /// Decommit free spans, largest bins first, until at most `keep` bytes of
    /// committed free memory remain.  Returns bytes decommitted.
    ///
    /// `top`: give the free span at the top back first, addresses included,
    /// in an arena that grows ([`Self::unmap_top`]).  Only where every free
    /// span is in its bin: not while a span just taken still carries free
    /// kinds.
    pub(crate) unsafe fn decommit_down_to(&mut self, keep: usize, top: bool) -> usize {
        // SAFETY: forwarded (the lock is held, and with `top` every free
        // span is in its bin).
        let mut done = if top { unsafe { self.unmap_top() } } else { 0 };
        let mut b = BINS;
        while b > 0 && self.free_committed_units * UNIT > keep {
            b -= 1;
            let mut d = self.bins[b];
            while !d.is_null() && self.free_committed_units * UNIT > keep {
                // SAFETY: d is a free span head; its units are ours and dead.
                unsafe {
                    let dirty = (*d).spare as usize;
                    if dirty != 0 && arena::arena_grows() {
                        // Addresses and all (holes), but never over a hole:
                        // the program may have mapped something there.
                        done += self.unmap_span(d);
                    } else if dirty != 0 {
                        // The whole span in one call: its clean units cost
                        // the kernel nearly nothing, but only the others count.
                        let n = (*d).a as usize;
                        let addr = arena::unit_addr(d);
                        if canopy_sys::decommit(addr, n << UNIT_SHIFT).is_ok() {
                            (*d).flags = SPAN_ZEROED;
                            (*d).spare = 0;
                            let s = desc_index(d);
                            for k in s..s + n {
                                (*desc(k)).limit = 0;
                            }
                            self.free_committed_units -= dirty;
                            self.stats.bytes_decommitted += (dirty << UNIT_SHIFT) as u64;
                            self.stats.decommits += 1;
                            done += dirty << UNIT_SHIFT;
                        }
                    }
                    d = (*d).next;
                }
            }
        }
        done
    }

    /// Bytes the global heap has handed out or keeps committed (an upper
    /// bound on what the arena holds in physical memory).
    pub(crate) fn committed_bytes(&self) -> usize {
        (self.top - (self.free_units - self.free_committed_units)) << UNIT_SHIFT
    }

    /// Walk every free span and check the bins' invariants (debug and tests).
    pub(crate) unsafe fn check(&self) -> Result<(), &'static str> {
        let mut units = 0;
        let mut committed = 0;
        let mut holes = 0;
        for b in 0..BINS {
            let mut d = self.bins[b];
            let mut prev: *mut Desc = ptr::null_mut();
            while !d.is_null() {
                // SAFETY: bins hold valid descriptors.
                unsafe {
                    if (*d).kind != kind::FREE_SPAN {
                        return Err("a bin holds a unit that is not a free span head");
                    }
                    if (*d).prev != prev {
                        return Err("broken back link in a span bin");
                    }
                    let n = (*d).a as usize;
                    if bin_of(n) != b {
                        return Err("span in the wrong bin");
                    }
                    let s = desc_index(d);
                    for i in s + 1..s + n {
                        if (*desc(i)).kind != kind::FREE_BODY {
                            return Err("a free span's body unit has another kind");
                        }
                    }
                    if (s..s + n).any(|i| (*desc(i)).limit != HOLE && (*desc(i)).limit as usize > UNIT) {
                        return Err("a free unit's clean mark lies past the unit");
                    }
                    let h = (s..s + n).filter(|&i| (*desc(i)).limit == HOLE).count();
                    if h != 0 && !arena::arena_grows() {
                        return Err("a hole in an arena reserved whole");
                    }
                    holes += h;
                    if n > 1 && (*desc(s + n - 1)).next != d {
                        return Err("a free span's last unit does not point at its head");
                    }
                    units += n;
                    let dirty = dirty_units(s, n);
                    if dirty != (*d).spare as usize {
                        return Err("a free span's count of committed units disagrees with its clean marks");
                    }
                    let want = if dirty == 0 { SPAN_ZEROED } else { SPAN_COMMITTED };
                    if (*d).flags != want {
                        return Err("a free span's flags disagree with its clean marks");
                    }
                    committed += dirty;
                    prev = d;
                    d = (*d).next;
                }
            }
        }
        if units != self.free_units || committed != self.free_committed_units {
            return Err("free unit counters disagree with the bins");
        }
        if holes != self.hole_units {
            return Err("the count of holes disagrees with the free spans' marks");
        }
        if (0..BINS).any(|b| (self.nonempty >> b & 1 == 1) == self.bins[b].is_null()) || self.nonempty >> BINS != 0 {
            return Err("the word of non-empty bins disagrees with the bins");
        }
        Ok(())
    }
}

/// The clock of the decommit delay: the coarse monotonic clock, or in tests
/// the time a test set (when not 0).
fn now_ms() -> u64 {
    #[cfg(test)]
    {
        let t = TEST_NOW_MS.load(core::sync::atomic::Ordering::Relaxed);
        if t != 0 {
            return t;
        }
    }
    canopy_sys::monotonic_coarse_ms()
}

/// A test's clock for the decommit delay (0: the real clock).
#[cfg(test)]
pub(crate) static TEST_NOW_MS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// The head of the free span whose last unit is `last`, or null if that
/// unit is not free.
///
/// # Safety
/// `last` is an arena unit below the global heap's top.
unsafe fn span_ending_at(last: usize) -> *mut Desc {
    // SAFETY: forwarded; a free span's last unit points at its head.
    unsafe {
        let d = desc(last);
        match (*d).kind {
            kind::FREE_SPAN => d,
            kind::FREE_BODY => (*d).next,
            _ => ptr::null_mut(),
        }
    }
}

/// The first run of units in `from..end` whose marks are holes (`hole`) or
/// not: `(start, end)` of it, or None.
///
/// # Safety
/// The units are free units of the arena (their clean marks are read).
unsafe fn next_run(from: usize, end: usize, hole: bool) -> Option<(usize, usize)> {
    // SAFETY: forwarded.
    let is = |k: usize| unsafe { ((*desc(k)).limit == HOLE) == hole };
    let start = (from..end).find(|&k| is(k))?;
    let stop = (start..end).find(|&k| !is(k)).unwrap_or(end);
    Some((start, stop))
}

/// How many of the units `idx..idx+n` may hold memory: their clean mark
/// (`Desc::limit` of a free unit, see `GlobalState::free_span`) is neither
/// 0 nor [`HOLE`].
///
/// # Safety
/// The units are arena units whose descriptors carry clean marks (free, or
/// just taken from a free span).
unsafe fn dirty_units(idx: usize, n: usize) -> usize {
    // SAFETY: forwarded to the caller.
    (idx..idx + n)
        .filter(|&k| {
            // SAFETY: forwarded to the caller.
            let mark = unsafe { (*desc(k)).limit };
            mark != 0 && mark != HOLE
        })
        .count()
}

/// Take a 1 MiB page (aligned) from the global heap for a thread heap, after
/// taking in what other threads freed to heaps of exited threads.  Returns the
/// index of its first unit.
pub(crate) fn take_page() -> Option<usize> {
    crate::heap::reclaim_abandoned();
    let locked = crate::solo::lock();
    // SAFETY: we hold the global lock.
    let got = unsafe {
        let g = state();
        let r = g.alloc_span(arena::PAGE_UNITS, arena::PAGE_UNITS);
        if let Some((idx, _)) = r {
            // No longer free (see `alloc_span`); the heap gives the units
            // their final kinds after the lock is released.
            arena::mark_units(idx, arena::PAGE_UNITS, kind::HEAP_FREE);
            g.stats.pages_out += 1;
        }
        r
    };
    crate::solo::unlock(locked);
    got.map(|(idx, _zeroed)| idx)
}
