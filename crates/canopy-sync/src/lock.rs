//! A raw test-and-test-and-set lock for slow paths.
//!
//! Unlike `std::sync::Mutex` it has no guard: `lock` and `unlock` are separate
//! calls, which is what `pthread_atfork` handlers need (lock in `prepare`,
//! unlock in `parent` and `child`).  It never allocates and never unwinds.

use crate::prim::{AtomicBool, Ordering};

/// A spin lock that yields the processor after a short spin.
#[derive(Debug)]
pub struct RawLock {
    locked: AtomicBool,
}

impl RawLock {
    /// An unlocked lock.
    #[cfg(not(canopy_loom))]
    pub const fn new() -> Self {
        RawLock { locked: AtomicBool::new(false) }
    }

    /// An unlocked lock.
    #[cfg(canopy_loom)]
    pub fn new() -> Self {
        RawLock { locked: AtomicBool::new(false) }
    }

    /// Take the lock, waiting as long as it takes.
    #[inline]
    pub fn lock(&self) {
        // Acquire: pairs with the Release in `unlock`.
        if self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            return;
        }
        self.lock_contended();
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        let mut spins = 0u32;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                if spins < 64 {
                    spins += 1;
                    crate::prim::spin_hint();
                } else {
                    #[cfg(canopy_loom)]
                    loom::thread::yield_now();
                    #[cfg(not(canopy_loom))]
                    canopy_sys::yield_now();
                }
            }
            if self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return;
            }
        }
    }

    /// Take the lock if it is free.
    #[inline]
    pub fn try_lock(&self) -> bool {
        self.locked.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// Release the lock.  Must be called by whoever holds it.
    #[inline]
    pub fn unlock(&self) {
        debug_assert!(self.locked.load(Ordering::Relaxed), "RawLock::unlock of a free lock");
        // Release: pairs with the Acquire in `lock`.
        self.locked.store(false, Ordering::Release);
    }

    /// Reset to unlocked without checking who holds it: only for the child
    /// side of `fork()`, where the holder no longer exists.
    pub fn force_unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }

    /// Whether the lock is held (a racy observation, for assertions).
    pub fn is_locked(&self) -> bool {
        self.locked.load(Ordering::Relaxed)
    }
}

#[cfg(not(canopy_loom))]
impl Default for RawLock {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY (the unsafe blocks below): `value` is read or written only while
// `lock` is held, or after every thread has been joined.
#[cfg(all(test, not(canopy_loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn excludes_other_threads() {
        struct Shared {
            lock: RawLock,
            value: std::cell::UnsafeCell<u64>,
        }
        // SAFETY: value is only touched while lock is held.
        unsafe impl Sync for Shared {}
        let s = Arc::new(Shared { lock: RawLock::new(), value: 0.into() });
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        s.lock.lock();
                        // SAFETY: we hold the lock.
                        unsafe { *s.value.get() += 1 };
                        s.lock.unlock();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(unsafe { *s.value.get() }, 40_000);
        assert!(!s.lock.is_locked());
        assert!(s.lock.try_lock());
        assert!(!s.lock.try_lock());
        s.lock.unlock();
    }
}
