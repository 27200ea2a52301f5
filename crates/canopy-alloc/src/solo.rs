//! The global lock, and running without it while one thread is alone.
//!
//! SAC's runtime alternates single-threaded and multithreaded supersteps and
//! lets the global heap skip synchronisation in the former.  Canopy does the
//! same without help from a compiler: the thread that starts the allocator is
//! the *solo* thread and enters the global heap without the lock until another
//! thread wants the global heap, which *ends the solo period*.  When threads
//! exit and a thread holding the lock finds itself the only one with a heap,
//! it begins a new solo period.
//!
//! The hand-off is a Dekker-style pairing.  The solo thread marks itself busy
//! with a plain store, then re-reads whether it is still solo; that needs a
//! full fence between the store and the load, which would cost as much as the
//! lock.  Instead the ending thread issues the heavy side with
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`: after the call, every thread
//! of the process has passed a full barrier, so either the solo thread's busy
//! mark is visible to the ender (which then waits for it to clear) or the solo
//! thread sees that solo mode is over (and takes the lock).  Where
//! `membarrier` is unavailable, or `CANOPY_SOLO_UNLOCKED=0`, there is no solo
//! mode and the lock is always taken.
//!
//! ```text
//!  solo thread                       any other thread
//!  BUSY = 1                          lock()
//!  compiler fence                    if solo period on:
//!  if SOLO_TID == me:                    SOLO_TID = 0
//!      ... unlocked ...                  membarrier()      (full fence everywhere)
//!      BUSY = 0 (release)                ENDED = 1
//!  else: BUSY = 0; lock(); ...       while BUSY { spin }
//!
//!  A solo period only begins under the lock (at start-up, or in `unlock`),
//!  so a thread holding the lock sees whether one is on.
//! ```

use crate::global::GLOBAL;
use canopy_sync::prim::{AtomicBool, AtomicUsize, Ordering};
use core::sync::atomic::compiler_fence;

/// Thread id of the solo thread, 0 if none.
static SOLO_TID: AtomicUsize = AtomicUsize::new(0);
/// Solo mode is over (set after the ending thread's membarrier).
static ENDED: AtomicBool = AtomicBool::new(false);
/// The solo thread is inside the global heap without the lock.
static BUSY: AtomicBool = AtomicBool::new(false);
/// The kernel supports the barrier and the option is on.
static AVAILABLE: AtomicBool = AtomicBool::new(false);
/// Times the global heap was entered without the lock (statistics).
pub(crate) static UNLOCKED_ENTRIES: AtomicUsize = AtomicUsize::new(0);
/// Solo periods begun after the first (statistics).
pub(crate) static SOLO_PERIODS: AtomicUsize = AtomicUsize::new(0);

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

/// Decide whether solo mode is possible (once, at start-up).
pub(crate) fn init(enabled: bool) {
    if !enabled {
        ENDED.store(true, Ordering::Release);
        return;
    }
    // SAFETY: membarrier takes plain integer arguments.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) };
    AVAILABLE.store(r == 0, Ordering::Relaxed);
    if r != 0 {
        ENDED.store(true, Ordering::Release);
    }
}

/// The thread that starts the allocator claims solo mode (once, during
/// start-up, before the allocator is published as ready).
pub(crate) fn claim(tid: usize) {
    if AVAILABLE.load(Ordering::Relaxed) && !ENDED.load(Ordering::Relaxed) {
        let _ = SOLO_TID.compare_exchange(0, tid, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// Whether solo mode is still on.
pub fn solo_active() -> bool {
    !ENDED.load(Ordering::Acquire)
}

/// Enter the global heap.  Returns whether the real lock was taken (pass it
/// to [`unlock`]).
#[inline]
pub(crate) fn lock() -> bool {
    if !ENDED.load(Ordering::Acquire) {
        let me = canopy_sys::thread_id();
        if SOLO_TID.load(Ordering::Relaxed) == me {
            BUSY.store(true, Ordering::Relaxed);
            // The other half of this fence is the ender's membarrier.
            compiler_fence(Ordering::SeqCst);
            if SOLO_TID.load(Ordering::Relaxed) == me {
                UNLOCKED_ENTRIES.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            BUSY.store(false, Ordering::Release);
        }
    }
    GLOBAL.lock.lock();
    // Under the lock nobody can start a solo period; end the current one, if
    // any, so that the solo thread's unlocked section (if it is in one) is
    // visible through BUSY.
    if SOLO_TID.load(Ordering::Relaxed) != 0 || !ENDED.load(Ordering::Acquire) {
        end_solo();
    }
    wait_not_busy();
    true
}

/// Leave the global heap.  A thread that held the lock and finds itself the
/// only thread with a heap starts a new solo period (SAC's single-threaded
/// superstep after the parallel one).
#[inline]
pub(crate) fn unlock(locked: bool) {
    if locked {
        if AVAILABLE.load(Ordering::Relaxed)
            && crate::thread::LIVE_HEAPS.load(Ordering::Relaxed) == 1
            && crate::thread::has_live_heap()
        {
            SOLO_TID.store(canopy_sys::thread_id(), Ordering::Relaxed);
            ENDED.store(false, Ordering::Relaxed);
            SOLO_PERIODS.fetch_add(1, Ordering::Relaxed);
        }
        // Release: whoever takes the lock next sees the solo state above.
        GLOBAL.lock.unlock();
    } else {
        // Release: whoever waits for BUSY to clear sees our writes.
        BUSY.store(false, Ordering::Release);
    }
}

#[cold]
fn end_solo() {
    if SOLO_TID.swap(0, Ordering::SeqCst) != 0 {
        // SAFETY: membarrier takes plain integer arguments.
        unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) };
    }
    ENDED.store(true, Ordering::Release);
}

fn wait_not_busy() {
    while BUSY.load(Ordering::Acquire) {
        canopy_sync::prim::spin_hint();
    }
}

/// Take the real lock whatever the mode (fork handlers); ends solo mode.
pub(crate) fn lock_for_fork() {
    GLOBAL.lock.lock();
    if SOLO_TID.load(Ordering::Relaxed) != 0 || !ENDED.load(Ordering::Acquire) {
        end_solo();
    }
    wait_not_busy();
}
