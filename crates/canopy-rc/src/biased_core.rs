//! The biased count's word-level protocol (Choi, Shull and Torrellas,
//! PACT'18), independent of thread ids and of the owners' queues so that
//! `tests/loom.rs` can model it; the policy (`policy.rs`) and the queues
//! (`biased.rs`) are built on it.
//!
//! ```text
//!  offset 0    release fn | owner id            (read by every thread, never written)
//!  offset 80   local | merged                   (the owner's plain fields)
//!  offset 160  shared: count << 2 | QUEUED << 1 | MERGED   (atomic, signed)
//!  offset 224  end (the descriptor's length and shape follow)
//! ```
//!
//! Each group is at least 64 bytes from the next whatever the block's
//! alignment, so no two share a cache line: every clone and drop reads
//! `owner`, the owner writes `local`, non-owners write `shared`, and every
//! element access reads the length that follows.  (With `owner` next to
//! `local`, each of the owner's updates took the line away from the other
//! threads, which read `owner` on every operation.)
//!
//! Invariant: live references = `local + count` while not merged, `count`
//! once merged.  `count` may be negative before the merge (a reference the
//! owner counted was dropped by another thread); the first thread to make it
//! negative queues the object to its owner (wins QUEUED), which merges
//! `local` into the shared word; the queue entry, not the decrement that
//! takes the merged count to zero, then frees it.

use crate::prim::{AtomicIsize, Cell, Ordering};

/// The biased count, first field of an object's descriptor.  The owner's
/// fields and the shared word sit on different cache lines, so the owner's
/// plain updates do not slow the other threads' atomic ones.
#[repr(C)]
pub struct BiasedCount {
    pub(crate) release: unsafe fn(*const u8),
    owner: u64,
    _pad0: [u8; 64],
    local: Cell<usize>,
    merged: Cell<bool>,
    _pad1: [u8; 64],
    shared: AtomicIsize,
    _pad2: [u8; 56],
}

impl core::fmt::Debug for BiasedCount {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BiasedCount")
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

#[cfg(not(canopy_loom))]
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(offset_of!(BiasedCount, local) >= offset_of!(BiasedCount, owner) + 8 + 64);
    assert!(offset_of!(BiasedCount, shared) >= offset_of!(BiasedCount, merged) + 1 + 64);
    assert!(size_of::<BiasedCount>() >= offset_of!(BiasedCount, shared) + 8 + 56);
};

const MERGED: isize = 1;
const QUEUED: isize = 2;
const ONE: isize = 4;

#[inline(always)]
fn count_of(w: isize) -> isize {
    w >> 2
}

/// What a decrement leaves the caller to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dec {
    /// Nothing.
    Keep,
    /// The owner's local count is still positive: poll its queue.
    OwnerAlive,
    /// The owner's local count reached zero: call [`BiasedCount::owner_zero`].
    OwnerZero,
    /// The caller held the last reference: release the object.
    Free,
    /// A non-owner took the unmerged count below zero and won QUEUED: queue
    /// the object to its owner (or merge it, if the owner has ended).
    Queue,
}

impl BiasedCount {
    /// A count of 1 owned by thread `owner` (0: no owner, the count starts
    /// merged); `release` frees the object.
    pub fn new(release: unsafe fn(*const u8), owner: u64) -> Self {
        let merged = owner == 0;
        BiasedCount {
            release,
            owner,
            local: Cell::new(usize::from(!merged)),
            merged: Cell::new(merged),
            _pad0: [0; 64],
            _pad1: [0; 64],
            _pad2: [0; 56],
            shared: AtomicIsize::new(if merged { ONE | MERGED } else { 0 }),
        }
    }

    /// The owner's thread id.
    #[inline(always)]
    pub fn owner(&self) -> u64 {
        self.owner
    }

    /// Does thread `me` count in the plain field?
    ///
    /// # Safety
    /// `merged` is read by the owner only (until its thread has ended).
    #[inline(always)]
    unsafe fn plain(&self, me: u64) -> bool {
        // SAFETY: read only when `me` is the owner (contract).
        self.owner == me && !self.merged.with(|m| unsafe { *m })
    }

    /// Count one more reference, on thread `me`.
    ///
    /// # Safety
    /// Object live; `me` is the calling thread's id.
    #[inline(always)]
    pub unsafe fn inc(&self, me: u64) {
        // SAFETY: owner-only fields touched by the owner only.
        if unsafe { self.plain(me) } {
            self.local.with_mut(|l| unsafe { *l += 1 });
        } else {
            // Relaxed: the new reference comes from an existing one.
            self.shared.fetch_add(ONE, Ordering::Relaxed);
        }
    }

    /// Count one reference less, on thread `me`.
    ///
    /// # Safety
    /// Object live; `me` is the calling thread's id; the caller gives up a
    /// reference.
    #[inline(always)]
    pub unsafe fn dec(&self, me: u64) -> Dec {
        // SAFETY: owner-only fields touched by the owner only.
        if unsafe { self.plain(me) } {
            let l = self.local.with_mut(|l| unsafe {
                debug_assert!(*l > 0, "biased local count below zero");
                *l -= 1;
                *l
            });
            return if l > 0 {
                Dec::OwnerAlive
            } else {
                Dec::OwnerZero
            };
        }
        // Unmerged, the decrement and the decision to queue must be one
        // atomic step: once our decrement is in, our reference is gone, and
        // the owner may merge and free the object at any moment (a separate
        // `fetch_or(QUEUED)` afterwards could touch freed memory and queue it
        // a second time; the loom model `biased_two_others_queue_once` found
        // this).  MERGED is never cleared, so a merged word takes a plain
        // `fetch_sub`.
        let mut prev = self.shared.load(Ordering::Relaxed);
        loop {
            if prev & MERGED != 0 {
                // AcqRel: Release publishes this holder's uses; Acquire makes
                // the other holders' uses visible if this thread frees.
                let p = self.shared.fetch_sub(ONE, Ordering::AcqRel);
                // Whoever takes the merged count to zero frees, unless the
                // object is still queued: then the owner's queue does.
                return if count_of(p) == 1 && p & QUEUED == 0 {
                    Dec::Free
                } else {
                    Dec::Keep
                };
            }
            // Below zero and not queued yet: we queue it (set QUEUED).
            let queue = count_of(prev) - 1 < 0 && prev & QUEUED == 0;
            let new = (prev - ONE) | if queue { QUEUED } else { 0 };
            // AcqRel: as for the merged decrement.
            match self
                .shared
                .compare_exchange_weak(prev, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return if queue { Dec::Queue } else { Dec::Keep },
                Err(p) => prev = p,
            }
        }
    }

    /// The count as thread `me` can know it: never less than the number of
    /// references alive.
    ///
    /// # Safety
    /// Object live, held by the caller.
    pub unsafe fn getrc(&self, me: u64) -> usize {
        // Acquire: pairs with the AcqRel decrements of other threads.
        let w = self.shared.load(Ordering::Acquire);
        // SAFETY: owner-only fields read by the owner only.
        if unsafe { self.plain(me) } {
            let l = self.local.with(|l| unsafe { *l }) as isize;
            (l + count_of(w)).max(1) as usize
        } else if w & MERGED != 0 {
            count_of(w).max(1) as usize
        } else {
            // Another thread's plain count is unknown here: report "shared"
            // (an over-report, which only costs a copy).
            count_of(w).max(0) as usize + 2
        }
    }

    /// Merge the owner's count into the shared word.  `from_queue`: the
    /// caller processes the object's queue entry (clears QUEUED); returns
    /// true if the caller must release the object (no reference left).
    ///
    /// # Safety
    /// Object live; the caller is the owner, or the owner's thread has ended
    /// and the caller won QUEUED (and synchronised with the owner's end).
    pub unsafe fn merge(&self, from_queue: bool) -> bool {
        // SAFETY: contract: nobody else touches `local`/`merged` now.
        unsafe {
            if !self.merged.with(|m| *m) {
                self.merged.with_mut(|m| *m = true);
                let l = self.local.with_mut(|l| core::mem::replace(&mut *l, 0)) as isize;
                // AcqRel: as for the decrements; adding MERGED sets the bit
                // (it was clear: only a merge sets it).
                self.shared.fetch_add(l * ONE + MERGED, Ordering::AcqRel);
            }
        }
        if from_queue {
            let prev = self.shared.fetch_and(!QUEUED, Ordering::AcqRel);
            count_of(prev) == 0
        } else {
            false
        }
    }

    /// The owner's local count reached zero: merge; true if the caller must
    /// release the object.
    ///
    /// # Safety
    /// Owner thread, object live.
    pub unsafe fn owner_zero(&self) -> bool {
        self.merged.with_mut(|m| unsafe { *m = true });
        let prev = self.shared.fetch_or(MERGED, Ordering::AcqRel);
        count_of(prev) == 0 && prev & QUEUED == 0
    }
}
