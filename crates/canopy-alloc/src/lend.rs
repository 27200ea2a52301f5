//! Pages lent to other layers.
//!
//! A region allocator (`canopy-region`) builds its own slab pools out of 1 MiB
//! pages taken from the global heap: the page is the unit every layer trades
//! (DESIGN.md).  Lent units are marked `LENT`, so a plain `free` of a pointer
//! into them is refused with a message naming the region API instead of
//! corrupting either allocator.

use core::fmt;
use core::ptr::NonNull;

use crate::arena::{self, desc, kind, PAGE, PAGE_UNITS, UNIT};
use crate::{global, solo, thread};

/// Why pages could not be returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LendError {
    /// The address is not the start of pages lent by `lend_pages`.
    NotLent(usize),
    /// The page count differs from the one lent at this address.
    WrongCount {
        /// Start of the pages.
        addr: usize,
        /// Pages lent at `addr`.
        lent: usize,
        /// Pages the caller gave back.
        given: usize,
    },
}

impl fmt::Display for LendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LendError::NotLent(a) => write!(f, "return_pages({a:#x}): not the start of lent pages"),
            LendError::WrongCount { addr, lent, given } => {
                write!(f, "return_pages({addr:#x}, {given}): {lent} pages were lent at this address")
            }
        }
    }
}

impl std::error::Error for LendError {}

/// Take `pages` contiguous 1 MiB pages, aligned to `align_pages` pages (a
/// power of two), from the global heap for another layer to manage.  The
/// memory may hold old data.  `None` when the arena is exhausted, `pages` is
/// 0 or the alignment is not a power of two.
pub fn lend_pages(pages: usize, align_pages: usize) -> Option<NonNull<u8>> {
    if pages == 0 || !align_pages.is_power_of_two() || !thread::ensure_init() {
        return None;
    }
    let units = pages.checked_mul(PAGE_UNITS)?;
    let align = align_pages.checked_mul(PAGE_UNITS)?;
    if units > arena::MAX_UNITS || align > arena::MAX_UNITS {
        return None;
    }
    crate::heap::reclaim_abandoned();
    let locked = solo::lock();
    // SAFETY: the global lock is held; the span's units become the borrower's.
    let got = unsafe {
        let g = global::state();
        match g.alloc_span(units, align) {
            Some((idx, _)) => {
                arena::mark_units(idx, units, kind::LENT_BODY);
                let d = desc(idx);
                (*d).kind = kind::LENT;
                (*d).a = units as u32;
                g.stats.lent_units += units as u64;
                Some(arena::unit_addr(d))
            }
            None => None,
        }
    };
    solo::unlock(locked);
    got.and_then(NonNull::new)
}

/// Give back pages taken with [`lend_pages`].
///
/// # Safety
/// Nothing may use the memory after the call.
pub unsafe fn return_pages(p: NonNull<u8>, pages: usize) -> Result<(), LendError> {
    let addr = p.as_ptr() as usize;
    let base = arena::arena_base();
    if !arena::arena_initialised() || addr < base || addr & (PAGE - 1) != 0 {
        return Err(LendError::NotLent(addr));
    }
    let idx = arena::unit_index(addr);
    if idx >= arena::arena_units() {
        return Err(LendError::NotLent(addr));
    }
    let retain = crate::options().retain_bytes;
    let locked = solo::lock();
    // SAFETY: the global lock is held; idx is an arena unit, checked to start
    // lent pages of the right size before the span is freed.
    let r = unsafe {
        let d = desc(idx);
        if (*d).kind != kind::LENT {
            Err(LendError::NotLent(addr))
        } else if (*d).a as usize != pages * PAGE_UNITS {
            Err(LendError::WrongCount { addr, lent: (*d).a as usize / PAGE_UNITS, given: pages })
        } else {
            let units = (*d).a as usize;
            let g = global::state();
            g.stats.lent_units -= units as u64;
            g.free_span(idx, units, true, retain, None);
            Ok(())
        }
    };
    solo::unlock(locked);
    const { assert!(UNIT * PAGE_UNITS == PAGE) };
    r
}
