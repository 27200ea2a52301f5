//! A lock that a thread which is alone can skip: [`SoloLock`].
//!
//! SAC's runtime alternates single-threaded and multithreaded supersteps and
//! lets its global heap skip synchronisation in the former.  `SoloLock` gives
//! that without help from a compiler: one thread at a time may be the *solo*
//! thread and enter without the lock, until another thread wants in, which
//! *ends the solo period*.  A thread that holds the lock may begin a new solo
//! period (when it knows it is alone) as it unlocks.
//!
//! The hand-off is a Dekker-style pairing.  The solo thread marks itself busy
//! with a plain store, then re-reads whether it is still solo; that needs a
//! full fence between the store and the load, which would cost as much as
//! the lock.  Instead the ending thread issues the heavy side with
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`: after the call every thread
//! of the process has passed a full barrier, so either the solo thread's busy
//! mark is visible to the ender (which then waits for it to clear) or the solo
//! thread sees that its period is over (and takes the lock).  Under loom the
//! barrier is modelled as a `SeqCst` fence on both sides, which is what the
//! kernel's barrier amounts to at the point it reaches the solo thread.
//!
//! ```text
//!  solo thread                       any other thread
//!  BUSY = 1                          lock()
//!  compiler fence                    if a solo period is on:
//!  if SOLO == me:                        SOLO = 0
//!      ... unlocked ...                  membarrier()      (full fence everywhere)
//!      BUSY = 0 (release)                ENDED = 1
//!  else: BUSY = 0; lock(); ...       while BUSY { spin }
//! ```
//!
//! A solo period only begins under the lock, so a thread holding the lock
//! sees whether one is on.  Thread ids are any non-zero numbers unique among
//! live threads (`canopy_sys::thread_id`).

use crate::prim::{AtomicBool, AtomicUsize, Ordering};
use crate::RawLock;

/// See the module documentation.
#[derive(Debug)]
pub struct SoloLock {
    lock: RawLock,
    /// Id of the solo thread, 0 if none.
    solo: AtomicUsize,
    /// No solo period is on (set after the ender's barrier).
    ended: AtomicBool,
    /// The solo thread is inside without the lock.
    busy: AtomicBool,
    /// The asymmetric barrier works here: solo periods are allowed.
    available: AtomicBool,
}

impl SoloLock {
    /// A lock with no solo period; call [`enable`](Self::enable) to allow them.
    #[cfg(not(canopy_loom))]
    pub const fn new() -> Self {
        SoloLock {
            lock: RawLock::new(),
            solo: AtomicUsize::new(0),
            ended: AtomicBool::new(true),
            busy: AtomicBool::new(false),
            available: AtomicBool::new(false),
        }
    }

    /// A lock with no solo period; call [`enable`](Self::enable) to allow them.
    #[cfg(canopy_loom)]
    pub fn new() -> Self {
        SoloLock {
            lock: RawLock::new(),
            solo: AtomicUsize::new(0),
            ended: AtomicBool::new(true),
            busy: AtomicBool::new(false),
            available: AtomicBool::new(false),
        }
    }

    /// Allow solo periods if the process-wide barrier is available, and make
    /// `first` the solo thread.  Call once, before any other thread can use
    /// the lock.  Returns whether solo periods are possible.
    pub fn enable(&self, first: usize) -> bool {
        if !register_barrier() {
            return false;
        }
        self.available.store(true, Ordering::Relaxed);
        self.solo.store(first, Ordering::Relaxed);
        self.ended.store(false, Ordering::Release);
        true
    }

    /// Whether a solo period is on.
    pub fn solo_active(&self) -> bool {
        !self.ended.load(Ordering::Acquire)
    }

    /// Enter.  Returns `true` if the lock was taken, `false` if the caller
    /// entered as the solo thread; pass the value to [`unlock`](Self::unlock).
    #[inline]
    pub fn lock(&self, me: usize) -> bool {
        if !self.ended.load(Ordering::Acquire) && self.solo.load(Ordering::Relaxed) == me {
            self.busy.store(true, Ordering::Relaxed);
            // The other half of this barrier is `end_solo`'s membarrier.
            solo_side_barrier();
            if self.solo.load(Ordering::Relaxed) == me {
                return false;
            }
            self.busy.store(false, Ordering::Release);
        }
        self.lock.lock();
        if self.solo.load(Ordering::Relaxed) != 0 || !self.ended.load(Ordering::Acquire) {
            self.end_solo();
        }
        self.wait_not_busy();
        true
    }

    /// Leave.  `locked` is what [`lock`](Self::lock) returned.  With
    /// `alone = Some(me)` a thread that held the lock and knows it is the only
    /// one that will want it begins a solo period as `me`.  Returns whether a
    /// solo period began.
    #[inline]
    pub fn unlock(&self, locked: bool, alone: Option<usize>) -> bool {
        if !locked {
            // Release: whoever waits for `busy` to clear sees our writes.
            self.busy.store(false, Ordering::Release);
            return false;
        }
        let mut began = false;
        if let Some(me) = alone {
            if self.available.load(Ordering::Relaxed) {
                self.solo.store(me, Ordering::Relaxed);
                self.ended.store(false, Ordering::Relaxed);
                began = true;
            }
        }
        // Release: the next holder of the lock sees the solo state above.
        self.lock.unlock();
        began
    }

    /// Take the lock and end any solo period (for `fork` handlers, which
    /// then call [`force_unlock`](Self::force_unlock) or
    /// [`unlock`](Self::unlock)).
    pub fn lock_ending_solo(&self) {
        self.lock.lock();
        if self.solo.load(Ordering::Relaxed) != 0 || !self.ended.load(Ordering::Acquire) {
            self.end_solo();
        }
        self.wait_not_busy();
    }

    /// Release without checks: only for the child side of `fork()`.
    pub fn force_unlock(&self) {
        self.lock.force_unlock();
    }

    #[cold]
    fn end_solo(&self) {
        if self.solo.swap(0, Ordering::SeqCst) != 0 {
            process_barrier();
        }
        self.ended.store(true, Ordering::Release);
    }

    fn wait_not_busy(&self) {
        while self.busy.load(Ordering::Acquire) {
            crate::prim::spin_hint();
        }
    }
}

#[cfg(not(canopy_loom))]
impl Default for SoloLock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(not(canopy_loom))]
fn register_barrier() -> bool {
    canopy_sys::register_process_barrier()
}

#[cfg(not(canopy_loom))]
fn process_barrier() {
    canopy_sys::barrier_all_threads();
}

#[cfg(not(canopy_loom))]
#[inline(always)]
fn solo_side_barrier() {
    core::sync::atomic::compiler_fence(Ordering::SeqCst);
}

#[cfg(canopy_loom)]
fn register_barrier() -> bool {
    true
}

#[cfg(canopy_loom)]
fn process_barrier() {
    crate::prim::fence(Ordering::SeqCst);
}

#[cfg(canopy_loom)]
fn solo_side_barrier() {
    crate::prim::fence(Ordering::SeqCst);
}
