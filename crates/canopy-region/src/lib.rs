//! Hierarchical regions: the Myrmics local layer (paper 002 §3-4).
//!
//! A *region* is a growable pool of objects that are freed together.
//! Regions form a tree under an ever-present root: freeing a region frees
//! its objects and all its descendants, in time proportional to the slabs
//! and regions involved, never to the number of objects.
//!
//! Each region is a slab pool of its own.  Objects up to a slab (4 KiB by
//! default) live in slots whose size is the request rounded up to a multiple
//! of the granule (64 B), or, below the granule, of the smallest slot (16 B:
//! slots of 16, 32 and 48 B; [`Config::min_slot`] set to the granule gives
//! Myrmics' granule multiples only); a region keeps one list of partially filled slabs
//! per slot size, so allocation fills holes before it takes new slabs.
//! Larger objects span consecutive slabs.  Slabs come from 1 MiB pages that
//! the allocator takes from Canopy's global heap (or any [`PageSource`]);
//! free slab ranges are kept in address order so a growing region takes the
//! slabs right after its last ones and stays compact.
//!
//! All metadata (the slab table, free-slot bitmaps, lists, the region tree)
//! lives apart from the slabs.  A region's memory is therefore pure data, and
//! [`RegionAllocator::pack`] describes it as a short list of (address,
//! length) runs that another process can [`unpack`](RegionAllocator::unpack)
//! at the same addresses, pointers intact: the basis of the global address
//! space layer.
//!
//! ```
//! use canopy_region::{RegionAllocator, RegionId};
//!
//! let mut ra = RegionAllocator::new();
//! let list = ra.ralloc(RegionId::ROOT, 0)?;
//! let nodes = ra.balloc(48, list, 1000)?;          // 1000 objects, one call
//! let big = ra.alloc(100_000, list)?;              // spans 25 slabs
//! ra.free(nodes[0])?;                              // one object
//! assert_eq!(ra.region_stats(list)?.objects, 1000); // 999 nodes + big
//! assert!(ra.pack_runs(list)?.len() <= 2);         // compact: a run or two
//! ra.rfree(list)?;                                 // everything else at once
//! assert!(ra.free(big).is_err());                  // ... and it is gone
//! # Ok::<(), canopy_region::RegionError>(())
//! ```
//!
//! [`Regions`] is a safe, typed front end: `alloc(r, value) -> &mut T`
//! through `&self`, and `free_region` through `&mut self`, so the borrow
//! checker proves that no reference outlives its region.
//!
//! Bad calls are refused with a [`RegionError`] that says what was wrong and
//! change nothing: a pointer no region owns, an object freed twice, an
//! interior pointer, an unknown or freed region (ids carry a generation, so
//! a stale id is never mistaken for a newer region).
//!
//! A [`RegionAllocator`] belongs to one thread at a time (it is `Send`);
//! [`global::with`] gives a process-wide one behind a lock, which is what the
//! C API in `canopy.h` (`canopy_ralloc`, ...) uses.

mod allocator;
mod config;
mod error;
pub mod global;
mod pack;
mod pagemap;
mod ranges;
mod source;
mod typed;

pub use allocator::{AllocatorStats, InRegion, RegionAllocator, RegionId, RegionStats, SlabCounts};
pub use config::Config;
pub use error::RegionError;
pub use pack::{Packed, PackedRegion, PackedSlab, Run, MAX_UNPACK_GROWTH};
pub use source::{FixedRange, GlobalHeap, PageSource};
pub use typed::Regions;

#[cfg(test)]
mod tests;
