//! Metadata memory for heap structures, apart from the arena.
//!
//! Heaps are never freed (an exited thread's heap waits for adoption), so a
//! bump allocator over one reservation is all that is needed.  Called under
//! the global lock.

use crate::heap::Heap;
use canopy_sync::prim::{AtomicUsize, Ordering};

const META_BYTES: usize = 1 << 30;
static BASE: AtomicUsize = AtomicUsize::new(0);
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Pages between a gigabyte boundary and the metadata area, so that the
/// pages of the first heaps have known virtual address bits 12 to 27: the
/// ones that AMD Zen's L1 way predictor hashes (see
/// `arena::BITMAP_PAGES`).  From these pages on, the heaps' pages share
/// their hash with no page of the first 14 units of a 1 MiB heap page
/// before the sixth heap (`metadata_pages_share_way_hashes_only_with_late_units`).
/// Left where the kernel put it, the area fell wherever the arena's
/// reservation left room: one process had its first heap on a page with
/// the same hash as the arena's first page, where the first slab's first
/// blocks are, and the next on a page of its own.
pub(crate) const META_PAGES: usize = 0x1E10;

/// Reserve the metadata area: [`META_PAGES`] pages past a gigabyte
/// boundary (the pages before it are given back at once).  Aligning asks
/// the OS for another gigabyte of address space for a moment; where a limit
/// on address space (`ulimit -v`) refuses that, the area goes wherever the
/// OS puts it, as before the placement mattered.
pub(crate) fn init() -> bool {
    let skew = META_PAGES << 12;
    let base = match canopy_sys::reserve_aligned(skew + META_BYTES, 1 << 30) {
        Ok(p) => {
            // SAFETY: [p, p + skew) is part of the reservation just made and
            // nothing else refers to it.
            unsafe { canopy_sys::release(p, skew) };
            p as usize + skew
        }
        Err(_) => match canopy_sys::reserve_aligned(META_BYTES, 4096) {
            Ok(p) => p as usize,
            Err(_) => return false,
        },
    };
    BASE.store(base, Ordering::Relaxed);
    NEXT.store(base, Ordering::Relaxed);
    true
}

/// The metadata area's first byte (0 before [`init`]).
#[cfg(test)]
pub(crate) fn base() -> usize {
    BASE.load(Ordering::Relaxed)
}

/// Bytes each heap takes in the area (whole pages).
pub(crate) const fn heap_stride() -> usize {
    (core::mem::size_of::<Heap>() + HEAP_PAGE_OFFSET + 4095) & !4095
}

/// Where a heap starts within its 4 KiB page.  The fast paths load the
/// heap's first fields (the size-indexed current slabs, `direct[g]` at
/// `8 * g`) right after the program's and `free`'s stores into blocks; a
/// block at the same offset modulo 4 KiB makes those loads wait (4K
/// aliasing).  Every slab's first block, the one LIFO reuse keeps hot, sits
/// at page offset 0, and `free` has just stored its first two words.  From
/// 1920, the entries of the small sizes sit at 1928..2048, and the one entry
/// that wraps onto page offset 0 is granule 272 (sizes 4337..4352 bytes), not
/// a common size like 4096 (granule 256, which a start at 2048 would put
/// there).  A multiple of 128, the heap's alignment.
const HEAP_PAGE_OFFSET: usize = 1920;
const _: () = assert!(HEAP_PAGE_OFFSET % core::mem::align_of::<Heap>() == 0);

/// Room for one heap, or null when the area is exhausted.
pub(crate) fn alloc_heap() -> *mut Heap {
    let size = heap_stride();
    let at = NEXT.load(Ordering::Relaxed);
    if at + size > BASE.load(Ordering::Relaxed) + META_BYTES {
        return core::ptr::null_mut();
    }
    NEXT.store(at + size, Ordering::Relaxed);
    (at + HEAP_PAGE_OFFSET) as *mut Heap
}

/// Bytes of metadata handed out.
pub(crate) fn used() -> usize {
    NEXT.load(Ordering::Relaxed) - BASE.load(Ordering::Relaxed)
}
