//! The global heap's lock, which a thread that is alone skips: SAC's
//! single-threaded supersteps.  The protocol is `canopy_sync::SoloLock` (see
//! its documentation and its loom model); this module decides who is alone:
//!
//! - the thread that starts the allocator is the first solo thread;
//! - any other thread that enters the global heap ends the solo period;
//! - a thread that leaves the global heap while it is the only thread with a
//!   heap begins a new solo period.

use crate::global::GLOBAL;
use canopy_sync::prim::{AtomicUsize, Ordering};

/// Times the global heap was entered without the lock (statistics).
pub(crate) static UNLOCKED_ENTRIES: AtomicUsize = AtomicUsize::new(0);
/// Solo periods begun after the first (statistics).
pub(crate) static SOLO_PERIODS: AtomicUsize = AtomicUsize::new(0);

/// At start-up, from the starting thread: allow solo periods if the option
/// asks for them, the kernel supports them, and the process has one thread.
///
/// Ending a solo period takes the kernel's expedited `membarrier`, which a
/// process must register for first.  Registering costs nothing in a process
/// with one thread, but with more it waits for an RCU grace period: 6-14 ms
/// on the 2-CPU test machine, paid by the thread whose allocation started
/// Canopy (a Rust program that uses the rich interface or `canopy-rc`
/// without making Canopy its global allocator starts it late, often after a
/// thread pool).  A late start therefore goes without solo periods: every
/// entry into the global heap takes its lock, as when
/// `CANOPY_SOLO_UNLOCKED=0`.  The usual starts (before `main` under
/// `LD_PRELOAD`, in the runtime's start-up as the global allocator) have one
/// thread.
pub(crate) fn init(enabled: bool, first: usize) {
    if enabled && canopy_sys::thread_count() == Some(1) {
        GLOBAL.lock.enable(first);
    }
}

/// Whether a solo period is on.
pub fn solo_active() -> bool {
    GLOBAL.lock.solo_active()
}

/// Enter the global heap.  Returns whether the real lock was taken (pass it
/// to [`unlock`]).
#[inline]
pub(crate) fn lock() -> bool {
    let locked = GLOBAL.lock.lock(canopy_sys::thread_id());
    if !locked {
        UNLOCKED_ENTRIES.fetch_add(1, Ordering::Relaxed);
    }
    locked
}

/// Leave the global heap, beginning a solo period if the caller is the only
/// thread with a heap.
#[inline]
pub(crate) fn unlock(locked: bool) {
    let alone = (locked && crate::thread::LIVE_HEAPS.load(Ordering::Relaxed) == 1 && crate::thread::has_live_heap())
        .then(canopy_sys::thread_id);
    if GLOBAL.lock.unlock(locked, alone) {
        SOLO_PERIODS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Take the real lock and end any solo period (the `fork` prepare handler).
pub(crate) fn lock_for_fork() {
    GLOBAL.lock.lock_ending_solo();
}

/// Release after `fork` in the parent.
pub(crate) fn unlock_after_fork_parent() {
    GLOBAL.lock.unlock(true, None);
}

/// Release after `fork` in the child, where the other threads are gone.
pub(crate) fn unlock_after_fork_child() {
    GLOBAL.lock.force_unlock();
}
