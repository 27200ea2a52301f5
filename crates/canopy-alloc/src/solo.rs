//! The global lock, and running without it while one thread is alone.
//!
//! SAC's runtime alternates single-threaded and multithreaded supersteps and
//! lets the global heap skip synchronisation in the former.  Canopy applies
//! this to the start of a program: the first thread that gets a heap becomes
//! the *solo* thread and enters the global heap without the lock, until any
//! other thread wants the global heap.  That thread *ends solo mode* for good.
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
//!  solo thread                       ending thread
//!  BUSY = 1                          SOLO_TID = 0
//!  compiler fence                    membarrier()          (full fence everywhere)
//!  if SOLO_TID == me:                ENDED = 1 (release)
//!      ... unlocked ...              lock(); while BUSY { spin }
//!      BUSY = 0 (release)
//!  else: BUSY = 0; lock(); ...       every later locker: lock(); while BUSY { spin }
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
        } else {
            end_solo();
        }
    }
    GLOBAL.lock.lock();
    wait_not_busy();
    true
}

/// Leave the global heap.
#[inline]
pub(crate) fn unlock(locked: bool) {
    if locked {
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

/// Take the real lock whatever the mode (fork handlers); ends solo mode
/// unless the caller is the solo thread.
pub(crate) fn lock_for_fork() {
    if !ENDED.load(Ordering::Acquire) && SOLO_TID.load(Ordering::Relaxed) != canopy_sys::thread_id() {
        end_solo();
    }
    GLOBAL.lock.lock();
    wait_not_busy();
}
