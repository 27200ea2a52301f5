//! Metadata memory for heap structures, apart from the arena.
//!
//! Heaps are never freed (an exited thread's heap waits for adoption), so a
//! bump allocator over one reservation is all that is needed.  Called under
//! the global lock.

use crate::heap::Heap;
use canopy_sync::prim::{AtomicUsize, Ordering};

const META_BYTES: usize = 1 << 30;
/// The area's size where the arena grows (`arena::arena_grows`): under a
/// limit on address space every reserved byte counts, so the area is
/// reserved in pieces of this size (1 MiB, or eight heaps if more) as heaps
/// need them.
const META_PIECE: usize = if 8 * heap_stride() > 1 << 20 { 8 * heap_stride() } else { 1 << 20 };
/// The first area's start (the first heap's page).
static BASE: AtomicUsize = AtomicUsize::new(0);
/// Where the next heap goes, and the end of the piece it is cut from.
static NEXT: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);
/// Bytes handed out, over all pieces.
static USED: AtomicUsize = AtomicUsize::new(0);

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
/// OS puts it, as before the placement mattered.  Where the arena grows,
/// the area is a [`META_PIECE`] at the same page offset past the gigabyte
/// three below the arena (free: the arena was put where nothing is), or
/// wherever the OS puts it, and grows by pieces ([`alloc_heap`]).
pub(crate) fn init() -> bool {
    let skew = META_PAGES << 12;
    let (base, len) = if crate::arena::arena_grows() {
        let near = (crate::arena::arena_base() & !(crate::arena::ARENA_ALIGN - 1)).wrapping_sub(3 << 30) + skew;
        match canopy_sys::reserve_fixed(near, META_PIECE).or_else(|_| canopy_sys::reserve_aligned(META_PIECE, 4096)) {
            Ok(p) => (p as usize, META_PIECE),
            Err(_) => return false,
        }
    } else {
        match canopy_sys::reserve_aligned(skew + META_BYTES, 1 << 30) {
            Ok(p) => {
                // SAFETY: [p, p + skew) is part of the reservation just made and
                // nothing else refers to it.
                unsafe { canopy_sys::release(p, skew) };
                (p as usize + skew, META_BYTES)
            }
            Err(_) => match canopy_sys::reserve_aligned(META_BYTES, 4096) {
                Ok(p) => (p as usize, META_BYTES),
                Err(_) => return false,
            },
        }
    };
    BASE.store(base, Ordering::Relaxed);
    NEXT.store(base, Ordering::Relaxed);
    END.store(base + len, Ordering::Relaxed);
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

/// Room for one heap, or null when the area is exhausted (and, where the
/// arena grows, the OS refuses another piece).
pub(crate) fn alloc_heap() -> *mut Heap {
    let size = heap_stride();
    let mut at = NEXT.load(Ordering::Relaxed);
    if at + size > END.load(Ordering::Relaxed) {
        if !crate::arena::arena_grows() {
            return core::ptr::null_mut();
        }
        let len = META_PIECE.max(size);
        match canopy_sys::reserve_aligned(len, 4096) {
            Ok(p) => {
                at = p as usize;
                END.store(at + len, Ordering::Relaxed);
            }
            Err(_) => return core::ptr::null_mut(),
        }
    }
    NEXT.store(at + size, Ordering::Relaxed);
    USED.fetch_add(size, Ordering::Relaxed);
    (at + HEAP_PAGE_OFFSET) as *mut Heap
}

/// Bytes of metadata handed out.
pub(crate) fn used() -> usize {
    USED.load(Ordering::Relaxed)
}
