//! Where a region allocator's pages come from.
//!
//! By default, the global heap of `canopy-alloc` (the page is the unit every
//! layer trades).  A [`FixedRange`] instead manages a range reserved at a
//! fixed address, which is what the global address space needs: every
//! process maps the same range at the same base, so a region packed in one
//! process can be unpacked at the same addresses in another.

use core::ptr::NonNull;

/// A supplier of page-aligned memory.  Called only on slow paths.
pub trait PageSource: Send {
    /// Take `pages` contiguous pages of `page_size` bytes, aligned to
    /// `page_size`.  The contents are unspecified.
    fn take(&mut self, pages: usize, page_size: usize) -> Option<NonNull<u8>>;

    /// Take the pages starting exactly at `addr` (for unpacking at the same
    /// addresses).  Sources that cannot place memory say why.
    fn take_at(&mut self, addr: usize, pages: usize, page_size: usize) -> Result<(), String>;

    /// Give back pages obtained from `take` or `take_at` with the same count.
    ///
    /// # Safety
    /// Nothing may use the memory afterwards.
    unsafe fn give_back(&mut self, addr: NonNull<u8>, pages: usize, page_size: usize);

    /// One line for messages.
    fn describe(&self) -> String;
}

/// Pages lent by Canopy's global heap (`canopy_alloc::lend_pages`).  The page
/// size must be a multiple of 1 MiB.
#[derive(Debug, Default)]
pub struct GlobalHeap;

const MIB: usize = 1 << 20;

impl PageSource for GlobalHeap {
    fn take(&mut self, pages: usize, page_size: usize) -> Option<NonNull<u8>> {
        debug_assert!(page_size % MIB == 0);
        canopy_alloc::lend_pages(pages.checked_mul(page_size / MIB)?, page_size / MIB)
    }

    fn take_at(&mut self, addr: usize, _pages: usize, _page_size: usize) -> Result<(), String> {
        Err(format!(
            "the global heap cannot place pages at {addr:#x}; unpack into an allocator over a FixedRange \
             reserved at the sender's base"
        ))
    }

    unsafe fn give_back(&mut self, addr: NonNull<u8>, pages: usize, page_size: usize) {
        // SAFETY: forwarded; the pages were lent with this count.
        let r = unsafe { canopy_alloc::return_pages(addr, pages * (page_size / MIB)) };
        debug_assert!(r.is_ok(), "{r:?}");
    }

    fn describe(&self) -> String {
        "canopy global heap".into()
    }
}

/// A range of address space reserved at a fixed base, handed out in pages.
/// Dropping it unmaps the range.
#[derive(Debug)]
pub struct FixedRange {
    base: usize,
    len: usize,
    page_size: usize,
    /// One flag per page: taken.
    taken: Vec<bool>,
}

impl FixedRange {
    /// Reserve `len` bytes at exactly `base` (both multiples of `page_size`,
    /// a power of two).  Fails if any part of the range is already mapped.
    pub fn reserve_at(base: usize, len: usize, page_size: usize) -> Result<FixedRange, String> {
        if !page_size.is_power_of_two() || base % page_size != 0 || len % page_size != 0 || len == 0 {
            return Err(format!(
                "fixed range {base:#x}+{len:#x}: base and length must be non-zero multiples of the page size {page_size:#x}"
            ));
        }
        canopy_sys::reserve_fixed(base, len)
            .map_err(|e| format!("cannot reserve {len:#x} bytes at {base:#x}: {e:?}"))?;
        Ok(FixedRange { base, len, page_size, taken: vec![false; len / page_size] })
    }

    /// Reserve `len` bytes wherever the OS puts them (aligned to `page_size`).
    pub fn reserve(len: usize, page_size: usize) -> Result<FixedRange, String> {
        if !page_size.is_power_of_two() || len % page_size != 0 || len == 0 {
            return Err(format!("range of {len:#x} bytes: not a non-zero multiple of the page size {page_size:#x}"));
        }
        let p = canopy_sys::reserve_aligned(len, page_size)
            .map_err(|e| format!("cannot reserve {len:#x} bytes: {e:?}"))?;
        Ok(FixedRange { base: p as usize, len, page_size, taken: vec![false; len / page_size] })
    }

    /// First address of the range.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Length of the range in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true (a range has at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check_size(&self, page_size: usize) -> bool {
        page_size % self.page_size == 0
    }
}

impl PageSource for FixedRange {
    fn take(&mut self, pages: usize, page_size: usize) -> Option<NonNull<u8>> {
        if !self.check_size(page_size) || pages == 0 {
            return None;
        }
        let per = page_size / self.page_size;
        let need = pages.checked_mul(per)?;
        let n = self.taken.len();
        let mut i = 0;
        while i + need <= n {
            match self.taken[i..i + need].iter().rposition(|&t| t) {
                Some(j) => i = (i + j + 1).next_multiple_of(per),
                None => {
                    self.taken[i..i + need].iter_mut().for_each(|t| *t = true);
                    return NonNull::new((self.base + i * self.page_size) as *mut u8);
                }
            }
        }
        None
    }

    fn take_at(&mut self, addr: usize, pages: usize, page_size: usize) -> Result<(), String> {
        let end = pages.checked_mul(page_size).and_then(|l| addr.checked_add(l));
        match end {
            Some(end) if self.check_size(page_size) && addr >= self.base && end <= self.base + self.len && addr % page_size == 0 => {
                let (a, b) = ((addr - self.base) / self.page_size, (end - self.base) / self.page_size);
                if let Some(j) = self.taken[a..b].iter().position(|&t| t) {
                    return Err(format!("page {:#x} of {} is already in use", self.base + (a + j) * self.page_size, self.describe()));
                }
                self.taken[a..b].iter_mut().for_each(|t| *t = true);
                Ok(())
            }
            _ => Err(format!("{addr:#x} (+{pages} pages) is outside {}", self.describe())),
        }
    }

    unsafe fn give_back(&mut self, addr: NonNull<u8>, pages: usize, page_size: usize) {
        let a = (addr.as_ptr() as usize - self.base) / self.page_size;
        let b = a + pages * page_size / self.page_size;
        // SAFETY: the pages are ours and unused (caller's contract).
        let r = unsafe { canopy_sys::decommit(addr.as_ptr(), pages * page_size) };
        debug_assert!(r.is_ok());
        self.taken[a..b].iter_mut().for_each(|t| *t = false);
    }

    fn describe(&self) -> String {
        format!("fixed range {:#x}..{:#x}", self.base, self.base + self.len)
    }
}

impl Drop for FixedRange {
    fn drop(&mut self) {
        // SAFETY: the reservation is ours; the allocator that used it is gone
        // (it owns this source and drops it last).
        unsafe { canopy_sys::release(self.base as *mut u8, self.len) };
    }
}
