//! The one place Canopy takes its synchronisation primitives from.
//!
//! - [`prim`]: atomics and fences from `core`, or from `loom` when built with
//!   `RUSTFLAGS="--cfg canopy_loom"` so the protocols can be model-checked.
//! - [`CachePadded`]: keeps fields written by different threads on different
//!   cache lines.
//! - [`RawLock`]: a test-and-test-and-set lock for slow paths, lockable and
//!   unlockable from separate calls (needed around `fork()`).
//! - [`MpscQueue`]: an intrusive multi-producer single-consumer queue whose
//!   push of a whole chain costs one atomic swap; the allocator sends remote
//!   frees through it.
//! - [`SoloLock`]: a lock that a thread which is alone enters without
//!   locking, handed over with `membarrier(2)`; the allocator's global heap.
//! - [`claim`]: one-winner claims on an object that racing threads may each
//!   try to give up (the allocator's large chunks).
//!
//! Nothing in this crate allocates.
#![deny(missing_docs)]

pub mod prim {
    //! Atomics: `core`'s normally, loom's under `cfg(canopy_loom)`.
    #[cfg(canopy_loom)]
    pub use loom::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
    #[cfg(not(canopy_loom))]
    pub use core::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

    /// Spin-loop hint (loom: yield to the model scheduler).
    #[inline]
    pub fn spin_hint() {
        #[cfg(canopy_loom)]
        loom::thread::yield_now();
        #[cfg(not(canopy_loom))]
        core::hint::spin_loop();
    }
}

pub mod claim;
mod lock;
mod mpsc;
mod solo;

pub use crossbeam_utils::CachePadded;
pub use lock::RawLock;
pub use mpsc::{MpscQueue, Node};
pub use solo::SoloLock;
