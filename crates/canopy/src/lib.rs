//! Canopy: a memory-management runtime for parallel programs.
//!
//! This facade re-exports Canopy's layers under one name: the allocator,
//! [`alloc`] (`canopy-alloc`), reference-counted arrays, [`rc`]
//! (`canopy-rc`), hierarchical heaps for fork-join programs, [`hh`]
//! (`canopy-hh`), and hierarchical regions, [`region`] (`canopy-region`).  The `canopy` command-line tool in
//! this crate runs the papers' experiments (`canopy tour`, `canopy bench ...`).

#![deny(missing_docs)]

/// The allocator: size classes, thread heaps, the global heap, statistics,
/// and [`alloc::Canopy`], which implements `GlobalAlloc`.
pub use canopy_alloc as alloc;

/// Reference-counted arrays with in-place reuse and counting policies
/// (SAC, delegated counting).
pub use canopy_rc as rc;

/// Hierarchical heaps for fork-join programs (MPL): task heaps, managed
/// objects and handles, barriers, the leaf collector.
pub use canopy_hh as hh;

/// Hierarchical regions (Myrmics): region trees over slab pools, packing.
pub use canopy_region as region;
