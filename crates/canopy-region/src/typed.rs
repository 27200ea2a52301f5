//! A safe, typed front end: values in regions, borrowed from the allocator.
//!
//! [`Regions`] hands out `&mut T` into region memory through `&self`, so any
//! number of objects can be alive at once, and frees regions through
//! `&mut self`, so the borrow checker proves no reference outlives its
//! memory.  Only `Copy` values (no destructor to run) can be stored: a
//! region frees its objects without visiting them.

use core::cell::UnsafeCell;
use core::mem::{align_of, size_of};
use core::ptr::NonNull;

use crate::{Config, RegionAllocator, RegionError, RegionId, RegionStats};

/// A region allocator with a safe, typed interface.
///
/// ```
/// use canopy_region::{Regions, RegionId};
///
/// #[derive(Clone, Copy)]
/// struct Node<'r> { value: u64, next: Option<&'r Node<'r>> }
///
/// let mut regions = Regions::new();
/// let r = regions.region(RegionId::ROOT)?;
/// let mut head: Option<&Node> = None;
/// for value in 0..1000 {
///     head = Some(regions.alloc(r, Node { value, next: head })?);
/// }
/// let sum: u64 = std::iter::successors(head, |n| n.next).map(|n| n.value).sum();
/// assert_eq!(sum, 999 * 1000 / 2);
/// let table = regions.alloc_slice(r, &[1.5f64; 100])?;
/// table[3] = 2.0;
/// regions.free_region(r)?;   // needs &mut: `head` and `table` cannot be used after this
/// # Ok::<(), canopy_region::RegionError>(())
/// ```
///
/// Using an object after its region is freed does not compile:
///
/// ```compile_fail
/// use canopy_region::{Regions, RegionId};
/// let mut regions = Regions::new();
/// let r = regions.region(RegionId::ROOT).unwrap();
/// let x = regions.alloc(r, 1u32).unwrap();
/// regions.free_region(r).unwrap(); // error: `regions` is still borrowed by `x`
/// *x += 1;
/// ```
pub struct Regions {
    inner: UnsafeCell<RegionAllocator>,
}

impl Regions {
    /// Regions with the default configuration over Canopy's global heap.
    pub fn new() -> Regions {
        Regions { inner: UnsafeCell::new(RegionAllocator::new()) }
    }

    /// Regions with `cfg`.
    pub fn with_config(cfg: Config) -> Result<Regions, RegionError> {
        Ok(Regions { inner: UnsafeCell::new(RegionAllocator::with_config(cfg)?) })
    }

    // The arena pattern: `&self` hands out `&mut` to fresh, disjoint objects
    // (and, here, to the allocator for the length of one call); clippy's
    // `mut_from_ref` cannot see that no two such references overlap.
    #[allow(clippy::mut_from_ref)]
    fn ra(&self) -> &mut RegionAllocator {
        // SAFETY: `Regions` is not `Sync`, and no method lets a reference to
        // the allocator escape or calls back into user code while holding
        // it, so this is the only live reference.
        unsafe { &mut *self.inner.get() }
    }

    /// A new region under `parent`.
    pub fn region(&self, parent: RegionId) -> Result<RegionId, RegionError> {
        self.ra().ralloc(parent, 0)
    }

    /// Store `value` in region `r`.
    #[allow(clippy::mut_from_ref)] // fresh objects, disjoint from every other (see `ra`)
    pub fn alloc<T: Copy>(&self, r: RegionId, value: T) -> Result<&mut T, RegionError> {
        let p = self.raw(r, size_of::<T>(), align_of::<T>())?.cast::<T>();
        // SAFETY: p is a fresh object of at least size_of::<T>() bytes,
        // suitably aligned, that nothing else refers to; it lives until its
        // region is freed, which needs `&mut self` and so ends this borrow.
        unsafe {
            p.as_ptr().write(value);
            Ok(&mut *p.as_ptr())
        }
    }

    /// Copy `values` into a new array in region `r`.
    #[allow(clippy::mut_from_ref)] // fresh objects, disjoint from every other (see `ra`)
    pub fn alloc_slice<T: Copy>(&self, r: RegionId, values: &[T]) -> Result<&mut [T], RegionError> {
        let bytes = size_of::<T>().checked_mul(values.len()).ok_or(RegionError::SizeTooLarge(usize::MAX))?;
        let p = self.raw(r, bytes, align_of::<T>())?.cast::<T>();
        // SAFETY: as in `alloc`, for `values.len()` elements.
        unsafe {
            core::ptr::copy_nonoverlapping(values.as_ptr(), p.as_ptr(), values.len());
            Ok(core::slice::from_raw_parts_mut(p.as_ptr(), values.len()))
        }
    }

    /// Copy `s` into region `r`.
    #[allow(clippy::mut_from_ref)] // fresh objects, disjoint from every other (see `ra`)
    pub fn alloc_str(&self, r: RegionId, s: &str) -> Result<&mut str, RegionError> {
        let b = self.alloc_slice(r, s.as_bytes())?;
        // SAFETY: the bytes were copied from a str.
        Ok(unsafe { core::str::from_utf8_unchecked_mut(b) })
    }

    fn raw(&self, r: RegionId, size: usize, align: usize) -> Result<NonNull<u8>, RegionError> {
        let ra = self.ra();
        // Slots are aligned to the largest power of two dividing their size
        // (at least the smallest slot); spans to the slab.  Round the request
        // up so the slot size is a multiple of the alignment.
        let size = if align > ra.config().min_slot { size.max(1).next_multiple_of(align) } else { size };
        if align > ra.config().slab_size {
            return Err(RegionError::Invalid(format!("alignment {align} is above the slab size")));
        }
        ra.alloc(size, r)
    }

    /// Free region `r`, its objects and its descendants.  Takes `&mut self`:
    /// every reference handed out earlier is dead by then.
    pub fn free_region(&mut self, r: RegionId) -> Result<(), RegionError> {
        self.inner.get_mut().rfree(r)
    }

    /// What region `r` holds.
    pub fn stats(&self, r: RegionId) -> Result<RegionStats, RegionError> {
        self.ra().region_stats(r)
    }

    /// The allocator underneath, for the untyped API (packing, single frees).
    pub fn allocator(&mut self) -> &mut RegionAllocator {
        self.inner.get_mut()
    }
}

impl Default for Regions {
    fn default() -> Regions {
        Regions::new()
    }
}

impl core::fmt::Debug for Regions {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Regions").field("allocator", self.ra()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_values_keep_alignment_and_contents() {
        let mut regions = Regions::new();
        let r = regions.region(RegionId::ROOT).unwrap();
        #[derive(Clone, Copy)]
        #[repr(align(128))]
        struct Wide([u8; 200]);
        let w = regions.alloc(r, Wide([7; 200])).unwrap();
        assert_eq!(w as *const Wide as usize % 128, 0);
        let big = regions.alloc_slice(r, &[3u32; 5000]).unwrap();
        assert_eq!(big.iter().map(|&x| x as u64).sum::<u64>(), 15000);
        let s = regions.alloc_str(r, "region").unwrap();
        s.make_ascii_uppercase();
        assert_eq!(s, "REGION");
        assert_eq!(w.0[199], 7);
        let child = regions.region(r).unwrap();
        let x = regions.alloc(child, 5u8).unwrap();
        *x += 1;
        assert_eq!(regions.stats(r).unwrap().objects, 3);
        regions.free_region(r).unwrap();
        assert!(regions.alloc(child, 1u8).is_err());
        regions.allocator().check().unwrap();
    }

    /// Types aligned above the smallest slot but smaller than the granule
    /// get slots of a multiple of their alignment, in every shape of slots.
    #[test]
    fn small_overaligned_types_are_aligned() {
        #[derive(Clone, Copy)]
        #[repr(align(32))]
        struct A32(u8);
        #[derive(Clone, Copy)]
        #[repr(align(64))]
        struct A64(u8);
        #[derive(Clone, Copy)]
        #[repr(align(64))]
        struct Z64;
        for (granule, min_slot) in [(64, 16), (16, 16), (128, 32), (64, 64), (32, 16)] {
            let mut regions = Regions::with_config(Config { granule, min_slot, ..Config::default() }).unwrap();
            let r = regions.region(RegionId::ROOT).unwrap();
            for i in 0..100u8 {
                let a = regions.alloc(r, A32(i)).unwrap();
                assert_eq!(a as *const A32 as usize % 32, 0, "granule {granule}, smallest slot {min_slot}");
                let b = regions.alloc(r, A64(i)).unwrap();
                assert_eq!(b as *const A64 as usize % 64, 0, "granule {granule}, smallest slot {min_slot}");
                let z = regions.alloc(r, Z64).unwrap();
                assert_eq!(z as *const Z64 as usize % 64, 0);
                let s = regions.alloc_slice(r, &[A32(i); 3]).unwrap();
                assert_eq!(s.as_ptr() as usize % 32, 0);
                assert_eq!((a.0, b.0, s[2].0), (i, i, i));
            }
            regions.allocator().check().unwrap();
        }
    }
}
