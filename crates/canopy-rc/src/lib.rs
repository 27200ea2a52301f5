//! # canopy-rc
//!
//! Reference-counted n-dimensional arrays that update in place when they
//! can (SAC, paper 000 §1, §3), SAC with-loops that run data-parallel, and a
//! choice of counting policies, among them delegated asynchronous counting
//! (the Microgrid design of paper 003 §4) and biased counting.
//!
//! ```text
//!   Array<T, P>  ── descriptor + data in one block ──▶ canopy_alloc::alloc_with_descriptor
//!     │ clone / drop / getrc
//!     ▼
//!   P: Local | Atomic | Biased | Delegated ── counting threads (delegate.rs, ring.rs)
//! ```
//!
//! ## Arrays and reuse
//! ```
//! use canopy_rc::{Array, Atomic, Gen};
//!
//! let a: Array<i64> = Array::from_fn(&[2, 3], |i| i as i64);
//! assert_eq!(a.shape(), &[2, 3]);
//! assert_eq!(a[[1, 2]], 5);
//!
//! let b = a.clone(); // one more reference, no copy
//! assert_eq!(b.getrc(), 2);
//! let addr = b.addr();
//! drop(a);
//! // Only reference left: modarray updates in place.
//! let c = b.modarray(&[Gen::update(&[0, 0], &[2, 3], |_, x| x * 10)]);
//! assert_eq!(c.addr(), addr);
//! assert_eq!(c.as_slice(), &[0, 10, 20, 30, 40, 50]);
//! ```
//!
//! ## With-loops
//! ```
//! use canopy_rc::{fold, genarray, Array, Gen};
//!
//! // The 6x7 example of paper 003, Fig. 2, with bar(A, iv) = iv[0] + iv[1].
//! // Expressions may run on several threads, so the arrays they read are
//! // of a shared policy (`Array<_, Local>` is not `Sync`).
//! let b: Array<i32> = Array::filled(&[6, 7], 9);
//! let c: Array<i32> = genarray(&[6, 7], 1, &[
//!     Gen::new(&[3, 0], &[6, 4], |iv| (iv[0] + iv[1]) as i32),
//!     Gen::new(&[0, 4], &[6, 7], |iv| b[iv]),
//! ]);
//! assert_eq!((c[[0, 0]], c[[4, 2]], c[[0, 5]]), (1, 6, 9));
//! let sum = fold(&[0, 0], &[6, 7], 0i64, |iv| i64::from(c[iv]), |x, y| x + y);
//! assert_eq!(sum, c.as_slice().iter().map(|&x| i64::from(x)).sum::<i64>());
//! ```
//!
//! ## Delegated counting
//! ```
//! use canopy_rc::{delegated, Array, Delegated};
//!
//! let a: Array<u8, Delegated> = Array::filled(&[100], 7);
//! let b = a.clone();                       // a message, not waited for
//! let t = std::thread::spawn(move || { let s: u32 = b.as_slice().iter().map(|&x| u32::from(x)).sum(); drop(b); delegated::flush(); s });
//! assert_eq!(t.join().unwrap(), 700);
//! // getrc waits for this thread's messages only: it may say 2 for a while
//! // (the other thread's decrement in flight), never 1 too early.
//! while a.getrc() != 1 {}
//! assert!(a.is_unique());
//! ```
//!
//! ## Policies
//! See [`policy`](mod@policy): [`Local`], [`Atomic`] (the default),
//! [`Biased`], [`Delegated`].  The policy is a type parameter: per array, or
//! per program with a type alias.
//!
//! ## Errors
//! Bad shapes and generators panic with a message naming the shapes
//! ([`Array::try_from_vec`] returns a [`ShapeError`] instead).  Allocation
//! failure calls `handle_alloc_error`.
//!
//! Module map: `array` (the type, descriptor layout), [`policy`](mod@policy) (counts),
//! `withloop` (genarray, modarray, fold), [`delegated`] (the counting
//! threads), `delegate` and `ring` (the delegation protocol, modelled with
//! loom), [`biased`] (owner queues), [`stats`](mod@stats) (counters).
#![deny(missing_docs)]

mod prim;
mod ring;

#[cfg(not(canopy_loom))]
mod biased_core;
#[cfg(canopy_loom)]
#[doc(hidden)]
pub mod biased_core;
#[cfg(not(canopy_loom))]
mod delegate;
#[cfg(canopy_loom)]
#[doc(hidden)]
pub mod delegate;

#[cfg(not(canopy_loom))]
mod array;
#[cfg(not(canopy_loom))]
pub mod biased;
#[cfg(not(canopy_loom))]
pub mod delegated;
#[cfg(not(canopy_loom))]
pub mod policy;
#[cfg(not(canopy_loom))]
pub mod stats;
#[cfg(not(canopy_loom))]
mod withloop;

#[cfg(not(canopy_loom))]
pub use array::{Array, ShapeError};
#[cfg(not(canopy_loom))]
pub use policy::{Atomic, Biased, Delegated, Local, Policy, SharedPolicy};
#[cfg(not(canopy_loom))]
pub use stats::{stats, thread_stats, Stats};
#[cfg(not(canopy_loom))]
pub use withloop::{fold, genarray, genarray_fn, Gen, DEFAULT_GRAIN};
