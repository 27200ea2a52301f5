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

/// Reserve the metadata area.
pub(crate) fn init() -> bool {
    match canopy_sys::reserve_aligned(META_BYTES, 4096) {
        Ok(p) => {
            BASE.store(p as usize, Ordering::Relaxed);
            NEXT.store(p as usize, Ordering::Relaxed);
            true
        }
        Err(_) => false,
    }
}

/// Where a heap starts within its 4 KiB page.  The fast paths load the
/// heap's first fields (the size-indexed current slabs, `direct[g]` at
/// `8 * g`) right after the program's and `free`'s stores into blocks; a
/// block at the same offset modulo 4 KiB makes those loads wait (4K
/// aliasing).  Every slab's first blocks, the ones LIFO reuse keeps hot, sit
/// at the lowest page offsets, so heaps start in the middle of a page.
const HEAP_PAGE_OFFSET: usize = 2048;

/// Room for one heap, or null when the area is exhausted.
pub(crate) fn alloc_heap() -> *mut Heap {
    let size = (core::mem::size_of::<Heap>() + HEAP_PAGE_OFFSET + 4095) & !4095;
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
