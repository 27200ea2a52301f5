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
