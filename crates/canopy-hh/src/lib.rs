//! Hierarchical heaps for fork-join programs (the MPL design, paper 004),
//! part 1: a heap per task, the managed object model, rooted handles,
//! barriers, and the leaf collector.
//!
//! # The model
//!
//! A program runs as a tree of tasks: [`run`] starts the root task and
//! [`Scope::par`] forks two children and joins them. Every task has its own
//! heap, and the heaps form a tree that mirrors the task tree: a task
//! allocates by bumping a pointer in its own chunk, with no synchronisation,
//! and at the join the children's heaps are spliced into the parent's in
//! constant time (no copying; merged heaps are found by union-find).
//!
//! Managed objects ([`Kind`]) are immutable tuples and vectors, mutable arrays
//! and refs, and raw arrays of unboxed data. A value ([`Val`]) is a 63-bit
//! integer or a handle. Rust code reaches objects only through rooted handles
//! ([`Gc`]) that the collector updates when it moves objects.
//!
//! ```
//! use canopy_hh::{run, Val};
//!
//! let sum = run(|s| {
//!     // A list 1 -> 2 -> ... -> 100 of immutable pairs (head, tail).
//!     let mut list = Val::Int(0);
//!     for i in (1..=100).rev() {
//!         list = Val::Obj(s.tuple(&[Val::Int(i), list]));
//!     }
//!     let list = list.as_obj().unwrap();
//!     // Two children read the same list; the parent's handles are theirs too.
//!     let (a, b) = s.par(
//!         |s| {
//!             // A parent's handle is re-rooted here to sit beside this
//!             // scope's own handles.
//!             let (mut n, mut l) = (0, Val::Obj(s.rebind(list)));
//!             while let Val::Obj(c) = l {
//!                 n += s.get_int(c, 0);
//!                 l = s.get(c, 1);
//!             }
//!             n
//!         },
//!         |s| s.len(list),
//!     );
//!     a + b as i64
//! });
//! assert_eq!(sum, 5050 + 2);
//! ```
//!
//! # The rules for handles
//!
//! * A handle ([`Gc<'s>`](Gc)) lives as long as the scope that made it. It
//!   cannot leave that scope: the scope's lifetime is a brand no outside
//!   variable can name (a compile error; see [`Gc`]). Loops that read many
//!   objects should run each iteration in [`Scope::scope`], which releases
//!   the handles it made; [`Scope::scope_keep`] returns one.
//! * Anything that can allocate takes `&mut Scope`, so a borrowed view of an
//!   object ([`Scope::raw_slice`]) cannot be held across an allocation (a
//!   compile error; see [`Scope`]). There are no raw pointers to objects in
//!   the API.
//! * A scope belongs to its task: the closures given to `par` get their own
//!   scopes and cannot capture the parent's (a compile error: `Scope` is not
//!   `Sync`). They may capture and use the parent's handles.
//! * Children return plain data from `par`, or objects through
//!   [`Scope::par_gc`], which re-roots them in the parent.
//! * What Rust cannot express is checked: every use of a handle checks that
//!   it belongs to the current task tree (a handle carried to another `run`
//!   panics); in debug builds, also that its object is in the current task's
//!   heap or an ancestor's; and the write
//!   barrier refuses, in every build, to store pointers between heaps that are
//!   not on the current task's path to the root.
//!
//! # Barriers and entanglement
//!
//! Reads of immutable objects have no barrier. Writes of pointers into mutable
//! objects go through the write barrier: a pointer from an older heap's object
//! into a younger heap is added to the younger heap's remembered set (a root
//! for its collector), and the object joins the *frontier* (a header bit).
//! Reads from mutable objects on the frontier go through the read barrier,
//! which checks that the pointer read leads to the reader's heap or an
//! ancestor's. If not, the program is *entangled*: part 1 stops it with a
//! panic that names both tasks and the object. Managing entanglement
//! (pinning, exp-depth, the hybrid collector) is part 2; the header already
//! has the pin, mark and exp-depth bits ([`object`] module notes).
//!
//! # The collector
//!
//! When a task's heap outgrows `max(CANOPY_HH_GC_MIN_KB, (1 + ratio) x
//! survived)`, the task collects it by itself, copying what its handles and
//! remembered set reach into fresh chunks; other tasks keep running. A task
//! that is the first child of its fork also collects the ancestors' heaps no
//! other task can reach at the time (the fork's second child waits to start). See
//! [`config()`] for the options and [`Stats`] for the counters. The verifier
//! (on in debug builds, or with `CANOPY_HH_VERIFY=1`) checks every pointer
//! after each collection.

#![warn(missing_docs)]
// Under `--cfg canopy_loom` only the fork link is built, for its model.
#![cfg_attr(canopy_loom, allow(dead_code, unused_imports))]

#[cfg(not(canopy_loom))]
mod chunk;
#[cfg(not(canopy_loom))]
pub mod config;
mod forklink;
#[cfg(not(canopy_loom))]
mod gc;
#[cfg(not(canopy_loom))]
mod heap;
#[cfg(not(canopy_loom))]
pub mod object;
#[cfg(not(canopy_loom))]
mod scope;
#[cfg(not(canopy_loom))]
mod stats;
#[cfg(not(canopy_loom))]
mod task;

/// The atomics the lock-free protocols use (loom's under `canopy_loom`).
mod sync {
    #[cfg(canopy_loom)]
    pub(crate) use loom::sync::atomic::{AtomicU8, Ordering};
    #[cfg(not(canopy_loom))]
    pub(crate) use std::sync::atomic::{AtomicU8, Ordering};

    /// Wait a moment in a spin loop.
    #[inline]
    pub(crate) fn spin() {
        #[cfg(canopy_loom)]
        loom::thread::yield_now();
        #[cfg(not(canopy_loom))]
        std::hint::spin_loop();
    }
}

#[cfg(not(canopy_loom))]
pub use config::{config, set_config, Config};
#[cfg(not(canopy_loom))]
pub use heap::live_heap_records;
#[cfg(not(canopy_loom))]
pub use object::{Kind, INT_MAX, INT_MIN};
#[cfg(not(canopy_loom))]
pub use scope::{run, run_keep, run_with_stats, Filler, Gc, Kept, Scope, Unboxed, Val};
#[cfg(not(canopy_loom))]
pub use stats::{global_stats, Stats};

#[cfg(all(test, not(canopy_loom)))]
mod tests;
