//! Check mode (`CANOPY_CHECK=1`, always on in debug builds).
//!
//! In check mode no free takes the fast path (slabs have no owner and the
//! fast-path current slabs are all empty), and every small block has an
//! allocation bit in a bitmap kept apart from the data: 512 bytes per 64 KiB
//! slab (one bit per 16-byte slot), in a table reserved once and touched only
//! for slabs in use.  A free checks and clears the bit atomically, so a double
//! free, a free of a block never handed out, or a free of an interior pointer
//! is caught exactly, whichever thread does it.

use crate::arena::{self, desc_index, Desc, MAX_UNITS, UNIT};
use canopy_sync::prim::{AtomicPtr, AtomicU64, Ordering};
use core::ptr;

const WORDS_PER_UNIT: usize = UNIT / 16 / 64;
static BITS: AtomicPtr<AtomicU64> = AtomicPtr::new(ptr::null_mut());

/// Reserve the bitmap table, for every unit the arena may ever have
/// (`arena::arena_cap`: all of `MAX_UNITS` when reserved whole, its cap
/// when it grows).  Returns false if the OS refuses.
pub(crate) fn init() -> bool {
    let bytes = arena::arena_cap().min(MAX_UNITS) * WORDS_PER_UNIT * 8;
    match canopy_sys::reserve_aligned(bytes, 4096) {
        Ok(p) => {
            BITS.store(p as *mut AtomicU64, Ordering::Release);
            true
        }
        Err(_) => false,
    }
}

fn words(d: *const Desc) -> *mut AtomicU64 {
    // SAFETY: the table has WORDS_PER_UNIT words for each unit the arena
    // may have, and d describes one of them.
    unsafe { BITS.load(Ordering::Acquire).add(desc_index(d) * WORDS_PER_UNIT) }
}

/// The check bit of `p` in slab `d` (its 16-byte granule) if `p` starts a
/// slot of the slab.
fn slot(d: *const Desc, p: *const u8) -> Option<usize> {
    let base = arena::unit_addr(d) as usize;
    let off = (p as usize).checked_sub(base)?;
    if off >= UNIT {
        return None;
    }
    // SAFETY: d is a SMALL descriptor; its slot test is stable while a
    // block of the slab may be live.
    let (divc, limit) = unsafe { ((*d).divc, (*d).limit) };
    crate::slab::locate_small(divc, limit, off as u32)?;
    Some(off / 16)
}

/// Clear a slab's bits (a fresh slab).
pub(crate) fn clear_unit(d: *const Desc) {
    let w = words(d);
    for i in 0..WORDS_PER_UNIT {
        // SAFETY: within this unit's words.
        unsafe { (*w.add(i)).store(0, Ordering::Relaxed) };
    }
}

/// Record that block `p` of slab `d` was handed out.
pub(crate) fn mark_allocated(d: *const Desc, p: *const u8) {
    let Some(s) = slot(d, p) else {
        crate::report::bad_free("malloc (internal)", p, crate::report::BadFree::NotABlock, 0, None);
        return;
    };
    // SAFETY: within this unit's words.
    let w = unsafe { &*words(d).add(s / 64) };
    let old = w.fetch_or(1 << (s % 64), Ordering::Relaxed);
    if old & (1 << (s % 64)) != 0 {
        let mut b = crate::report::Buf::new();
        b.str("canopy: internal error: block ").hex(p as usize).str(" handed out twice\n");
        canopy_sys::write_stderr(b.as_bytes());
        canopy_sys::abort();
    }
}

/// Check that `p` is a live block of slab `d` and mark it free.
pub(crate) fn check_and_clear(d: *const Desc, p: *const u8) -> Result<(), crate::report::BadFree> {
    let s = slot(d, p).ok_or(crate::report::BadFree::NotABlock)?;
    // SAFETY: within this unit's words.
    let w = unsafe { &*words(d).add(s / 64) };
    let old = w.fetch_and(!(1 << (s % 64)), Ordering::Relaxed);
    if old & (1 << (s % 64)) == 0 {
        return Err(crate::report::BadFree::DoubleFree);
    }
    Ok(())
}

/// Whether `p` is a live block (check mode only; used by usable-size queries).
pub(crate) fn is_live(d: *const Desc, p: *const u8) -> bool {
    let Some(s) = slot(d, p) else { return false };
    // SAFETY: within this unit's words.
    let w = unsafe { &*words(d).add(s / 64) };
    w.load(Ordering::Relaxed) & (1 << (s % 64)) != 0
}
