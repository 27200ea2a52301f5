//! A thread's cache of the large chunks it freed.
//!
//! Large chunks (above `MEDIUM_MAX`) come from the global heap, whose spans
//! are shared by every thread: each allocation and each free of one takes
//! the global lock.  Two threads that allocate and free chunks of a few
//! hundred KiB at a steady rate spent a quarter of their time waiting for
//! that lock (the `phases` workload).  So a thread keeps the chunks of up to
//! [`CACHE_MAX_UNITS`] units (1 MiB) it frees, up to
//! `CANOPY_LARGE_CACHE_KB` bytes of them (and no more than its share of
//! `CANOPY_RETAIN_MB` among the threads with heaps, so that many threads
//! together keep no more than the global heap would), and hands one out
//! again, without the lock, for a request of exactly its units.
//!
//! ```text
//!   heap.large_cache.heads[units - CACHE_MIN_UNITS] -> chunk -> chunk -> 0
//!                                                      (linked through
//!                                                       the head unit's
//!                                                       descriptor, `spare`)
//! ```
//!
//! A cached chunk keeps its units (its descriptors say `LARGE_CACHED` for
//! the head, `LARGE_BODY` for the rest); its pages stay committed.
//!
//! **Who may free a chunk.**  A large free has no owner to ask, so two
//! frees of one chunk may race (a program's double free from two threads).
//! The head descriptor's `owner` word says who holds a chunk
//! (`canopy_sync::claim`, model-checked with loom): `LARGE_LIVE` while the
//! program has it, written last when the chunk is handed out.  Every free
//! of a large chunk, cached or not, first claims it with one
//! compare-and-swap from `LARGE_LIVE` to `LARGE_CLAIMED`; a free that finds
//! anything else (another free holds it, it is cached, its units went back
//! to the global heap and serve something else) reports a double free and
//! writes nothing.  A chunk stays claimed while it is cached, and giving
//! it to the global heap clears the word with the span's other marks.
//!
//! **When chunks are cached.**  Only while no solo period is on: a thread
//! alone takes no lock in the global heap, so the cache would save it
//! little, and chunks kept for one size are memory the global heap cannot
//! give to another (a single thread allocating log-uniform sizes up to
//! 4 MiB, the `sizewalk` workload, peaked at 54.8 MiB with the cache
//! against 47.2 without).
//!
//! **When the cache empties.**  A free that would take the cache above its
//! budget hands every cached chunk, and itself, to the global heap under
//! one lock; so does the thread's exit (`Heap::abandon`), its
//! `canopy_collect()` (`malloc_trim`; other threads' caches stay), and a
//! large allocation that the global heap could meet
//! only with memory not yet in use (a fresh or decommitted span) or not at
//! all: the cached chunks go back first, where they may merge with free
//! neighbours, and the request looks again.  A thread holds at most its
//! budget in freed chunks; a thread that frees large chunks and then only
//! waits keeps them until it exits, frees more, or calls
//! `canopy_collect()`.  The heaps of threads a `fork()` left behind keep
//! theirs in the child, as they keep their slabs.

use crate::arena::{self, desc, desc_index, kind, Desc, UNIT, UNIT_SHIFT};
use crate::size_class::MEDIUM_MAX;

/// Units of the smallest large chunk.
pub(crate) const CACHE_MIN_UNITS: usize = (MEDIUM_MAX >> UNIT_SHIFT) + 1;
/// Units of the largest chunk a cache keeps (1 MiB).
pub(crate) const CACHE_MAX_UNITS: usize = arena::PAGE_UNITS;
const SLOTS: usize = CACHE_MAX_UNITS - CACHE_MIN_UNITS + 1;

/// A thread's cached large chunks, one list per unit count (owner-only).
pub(crate) struct LargeCache {
    /// Per unit count: the unit index of the first cached chunk, plus one
    /// (0: none).
    heads: [u32; SLOTS],
    /// Bytes of the cached chunks (their whole units).
    pub(crate) bytes: usize,
}

impl LargeCache {
    pub(crate) const fn new() -> LargeCache {
        LargeCache { heads: [0; SLOTS], bytes: 0 }
    }

    /// Whether a chunk of `units` units may be cached.
    #[inline]
    pub(crate) fn holds(units: usize) -> bool {
        (CACHE_MIN_UNITS..=CACHE_MAX_UNITS).contains(&units)
    }

    /// Take a cached chunk of exactly `units` units.  The chunk is still
    /// `LARGE_CACHED` and claimed: the caller hands it out
    /// ([`crate::hand_out_cached`]).
    ///
    /// # Safety
    /// Owner thread; `holds(units)`.
    pub(crate) unsafe fn take(&mut self, units: usize) -> Option<*mut Desc> {
        let slot = &mut self.heads[units - CACHE_MIN_UNITS];
        if *slot == 0 {
            return None;
        }
        // SAFETY: the list holds cached chunks' head units (arena units);
        // only this thread reads or writes their `spare` while cached.
        unsafe {
            let d = desc(*slot as usize - 1);
            debug_assert_eq!((*d).kind, kind::LARGE_CACHED);
            debug_assert_eq!((*d).a as usize, units);
            *slot = (*d).spare as u32;
            (*d).spare = 0;
            self.bytes -= units * UNIT;
            Some(d)
        }
    }

    /// Cache the claimed large chunk `d` of `units` units.  False, changing
    /// nothing, if that would take the cache above `budget` bytes.
    ///
    /// # Safety
    /// Owner thread; `holds(units)`; `d` heads a live large chunk this
    /// thread has just claimed (see the module's documentation).
    pub(crate) unsafe fn put(&mut self, d: *mut Desc, units: usize, budget: usize) -> bool {
        if self.bytes + units * UNIT > budget {
            return false;
        }
        let slot = &mut self.heads[units - CACHE_MIN_UNITS];
        // SAFETY: the caller claimed the chunk: no other thread writes its
        // descriptor until it is handed out again.
        unsafe {
            (*d).spare = *slot as u64;
            (*d).kind = kind::LARGE_CACHED;
        }
        *slot = desc_index(d) as u32 + 1;
        self.bytes += units * UNIT;
        true
    }

    /// Take every cached chunk out, calling `f` with each head descriptor
    /// and its units (the chunks are still claimed and `LARGE_CACHED`).
    ///
    /// # Safety
    /// Owner thread.
    pub(crate) unsafe fn drain(&mut self, mut f: impl FnMut(*mut Desc, usize)) {
        for (i, slot) in self.heads.iter_mut().enumerate() {
            let mut at = core::mem::take(slot);
            while at != 0 {
                // SAFETY: a cached chunk's head unit (owner thread).
                let d = unsafe { desc(at as usize - 1) };
                // SAFETY: as above.
                unsafe {
                    at = (*d).spare as u32;
                    (*d).spare = 0;
                }
                f(d, CACHE_MIN_UNITS + i);
            }
        }
        self.bytes = 0;
    }

    /// Whether the cache holds nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Check the cache: every listed chunk is a claimed `LARGE_CACHED` head
    /// of its list's units, and the bytes add up.
    pub(crate) fn check(&self) -> Result<(), &'static str> {
        let mut bytes = 0;
        for (i, &head) in self.heads.iter().enumerate() {
            let units = CACHE_MIN_UNITS + i;
            let mut at = head;
            let mut steps = 0usize;
            while at != 0 {
                if at as usize > arena::arena_units() {
                    return Err("a cached large chunk lies outside the arena");
                }
                // SAFETY: an arena descriptor (bounds checked above), read
                // by the cache's owner.
                unsafe {
                    let d = desc(at as usize - 1);
                    if (*d).kind != kind::LARGE_CACHED || (*d).a as usize != units {
                        return Err("a cached large chunk has the wrong kind or length");
                    }
                    if (*d).owner.load(core::sync::atomic::Ordering::Relaxed) != arena::LARGE_CLAIMED {
                        return Err("a cached large chunk is not claimed");
                    }
                    if (1..units).any(|k| (*desc(desc_index(d) + k)).kind != kind::LARGE_BODY) {
                        return Err("a cached large chunk's body units are not LARGE_BODY");
                    }
                    at = (*d).spare as u32;
                }
                bytes += units * UNIT;
                steps += 1;
                if steps > arena::MAX_UNITS {
                    return Err("a large cache list loops");
                }
            }
        }
        if bytes != self.bytes {
            return Err("the large cache's byte count disagrees with its lists");
        }
        Ok(())
    }
}
