//! The synchronisation seam of this crate: atomics from `canopy_sync::prim`
//! (core's, or loom's under `cfg(canopy_loom)`), and `Arc`, `Mutex` and a
//! checked `UnsafeCell` from std or loom alike, so the models in
//! `tests/loom.rs` run the same code as the library.

pub(crate) use canopy_sync::prim::{
    fence, spin_hint, AtomicBool, AtomicU64, AtomicUsize, Ordering,
};

#[cfg(not(canopy_loom))]
pub(crate) use core::sync::atomic::AtomicIsize;
#[cfg(canopy_loom)]
pub(crate) use loom::sync::atomic::AtomicIsize;

#[cfg(canopy_loom)]
pub(crate) use loom::sync::{Arc, Mutex};
#[cfg(not(canopy_loom))]
pub(crate) use std::sync::{Arc, Mutex};

/// A cell whose every access goes through `with`/`with_mut`, so loom can
/// check that accesses are ordered; std's `UnsafeCell` otherwise.
#[derive(Debug)]
pub(crate) struct Cell<T>(
    #[cfg(canopy_loom)] loom::cell::UnsafeCell<T>,
    #[cfg(not(canopy_loom))] core::cell::UnsafeCell<T>,
);

impl<T> Cell<T> {
    pub(crate) fn new(v: T) -> Self {
        #[cfg(canopy_loom)]
        return Cell(loom::cell::UnsafeCell::new(v));
        #[cfg(not(canopy_loom))]
        return Cell(core::cell::UnsafeCell::new(v));
    }

    /// Read through a shared pointer.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        #[cfg(canopy_loom)]
        return self.0.with(f);
        #[cfg(not(canopy_loom))]
        return f(self.0.get());
    }

    /// Write through a mutable pointer.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        #[cfg(canopy_loom)]
        return self.0.with_mut(f);
        #[cfg(not(canopy_loom))]
        return f(self.0.get());
    }
}

/// Lock a mutex, ignoring poisoning (the data behind our mutexes stays
/// consistent across a panic: every critical section is a push or a swap).
pub(crate) fn lock<T>(m: &Mutex<T>) -> impl core::ops::DerefMut<Target = T> + '_ {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}
