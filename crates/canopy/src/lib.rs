//! Canopy: a memory-management runtime for parallel programs.
//!
//! This facade re-exports Canopy's layers under one name: the allocator,
//! [`alloc`] (`canopy-alloc`), and hierarchical regions, [`region`]
//! (`canopy-region`).  The `canopy` command-line tool in
//! this crate runs the papers' experiments (`canopy tour`, `canopy bench ...`).

#![deny(missing_docs)]

/// The allocator: size classes, thread heaps, the global heap, statistics,
/// and [`alloc::Canopy`], which implements `GlobalAlloc`.
pub use canopy_alloc as alloc;

/// Hierarchical regions (Myrmics): region trees over slab pools, packing.
pub use canopy_region as region;
