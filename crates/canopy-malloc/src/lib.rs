//! `libcanopy_malloc`: Canopy behind the C allocation API.
//!
//! Build with `cargo build --release -p canopy-malloc`, then either link with
//! `-lcanopy_malloc` or run any program on Canopy with
//! `LD_PRELOAD=target/release/libcanopy_malloc.so program`.  `include/canopy.h`
//! declares the rich interface (`canopy_alloc_class`, `canopy_free_sized`, ...).
//! glibc's extensions (`mallinfo2`, `malloc_stats`, `malloc_info`, `mallopt`,
//! the `__libc_*` entry points) answer for Canopy too (module `glibc`).
//!
//! Errors follow C: null with `errno = ENOMEM` on exhaustion or overflow
//! (calloc's and reallocarray's multiplications included, and alignments
//! above 1 GiB, which the arena cannot give), `EINVAL` for a bad alignment.  Nothing here unwinds: the release profile aborts on panic and
//! the allocator paths do not panic.
#![deny(missing_docs)]

mod glibc;
mod region;

use canopy_alloc::SizeClass;
use core::ffi::c_void;
use core::ptr;
use libc::{c_char, c_int, size_t};

#[inline(always)]
fn oom<T>(p: *mut T) -> *mut T {
    if p.is_null() {
        canopy_sys::set_errno(libc::ENOMEM);
    }
    p
}

/// C `malloc`.
#[no_mangle]
pub extern "C" fn malloc(size: size_t) -> *mut c_void {
    // The allocator sets errno = ENOMEM itself when it returns null.
    canopy_alloc::alloc(size) as *mut c_void
}

/// C `free`.
///
/// # Safety
/// `p` is null or a live block from this allocator.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    // SAFETY: the caller's contract; bad pointers are detected and reported.
    unsafe { canopy_alloc::free(p as *mut u8) }
}

/// Old name of `free`, still used by some programs.
///
/// # Safety
/// As for [`free`].
#[no_mangle]
pub unsafe extern "C" fn cfree(p: *mut c_void) {
    // SAFETY: as for free.
    unsafe { canopy_alloc::free_from(p as *mut u8, "cfree") }
}

/// C `calloc`: null and `ENOMEM` if `n * size` overflows.
#[no_mangle]
pub extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    oom(canopy_alloc::calloc(n, size) as *mut c_void)
}

/// C `realloc`.  `realloc(p, 0)` frees `p` and returns null (as glibc does).
///
/// # Safety
/// `p` is null or a live block from this allocator.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: size_t) -> *mut c_void {
    // SAFETY: the caller's contract.
    let q = unsafe { canopy_alloc::realloc(p as *mut u8, size) };
    if q.is_null() && size != 0 {
        canopy_sys::set_errno(libc::ENOMEM);
    }
    q as *mut c_void
}

/// `reallocarray`: `realloc(p, n * size)` with an overflow check.
///
/// # Safety
/// As for [`realloc`].
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: forwarded.
        Some(total) => unsafe { realloc(p, total) },
        None => {
            canopy_sys::set_errno(libc::ENOMEM);
            ptr::null_mut()
        }
    }
}

/// `posix_memalign`: returns `EINVAL` unless `align` is a power of two and a
/// multiple of `sizeof(void *)`, `ENOMEM` when out of memory; `*out` is only
/// written on success.
///
/// # Safety
/// `out` is valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: size_t, size: size_t) -> c_int {
    if !align.is_power_of_two() || align % core::mem::size_of::<*mut c_void>() != 0 {
        return libc::EINVAL;
    }
    let p = canopy_alloc::alloc_aligned(size, align);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller's contract.
    unsafe { *out = p as *mut c_void };
    0
}

fn aligned(align: size_t, size: size_t) -> *mut c_void {
    if !align.is_power_of_two() {
        canopy_sys::set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    oom(canopy_alloc::alloc_aligned(size, align) as *mut c_void)
}

/// C11 `aligned_alloc`: `EINVAL` unless `align` is a power of two.
#[no_mangle]
pub extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    aligned(align, size)
}

/// `memalign`: `EINVAL` unless `align` is a power of two.
#[no_mangle]
pub extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    aligned(align, size)
}

/// `valloc`: page-aligned.
#[no_mangle]
pub extern "C" fn valloc(size: size_t) -> *mut c_void {
    aligned(canopy_sys::page_size(), size)
}

/// `pvalloc`: page-aligned, size rounded up to whole pages.
#[no_mangle]
pub extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    let page = canopy_sys::page_size();
    match size.max(1).checked_add(page - 1) {
        Some(s) => aligned(page, s & !(page - 1)),
        None => {
            canopy_sys::set_errno(libc::ENOMEM);
            ptr::null_mut()
        }
    }
}

/// `malloc_usable_size`: bytes usable in the block (0 for null).
///
/// # Safety
/// `p` is null or a live block from this allocator.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> size_t {
    // SAFETY: the caller's contract.
    unsafe { canopy_alloc::usable_size(p as *mut u8) }
}

/// C23 `free_sized`.
///
/// # Safety
/// `p` is null or a live block allocated with `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn free_sized(p: *mut c_void, size: size_t) {
    // SAFETY: the caller's contract.
    unsafe { canopy_alloc::free_sized(p as *mut u8, size) }
}

/// C23 `free_aligned_sized`.
///
/// # Safety
/// `p` is null or a live block allocated with `aligned_alloc(align, size)`.
#[no_mangle]
pub unsafe extern "C" fn free_aligned_sized(p: *mut c_void, _align: size_t, size: size_t) {
    // SAFETY: the caller's contract.
    unsafe { canopy_alloc::free_sized(p as *mut u8, size) }
}

/// glibc's `malloc_trim`: gives free memory back to the OS; returns 1 if any was.
#[no_mangle]
pub extern "C" fn malloc_trim(_pad: size_t) -> c_int {
    (canopy_alloc::collect() > 0) as c_int
}

// ----- the rich interface (canopy.h) -----

/// See `canopy.h`.
#[no_mangle]
pub extern "C" fn canopy_size_class(size: size_t) -> u32 {
    SizeClass::of(size).map(|c| c.index() as u32).unwrap_or(u32::MAX)
}

/// See `canopy.h`.
#[no_mangle]
pub extern "C" fn canopy_class_size(cls: u32) -> size_t {
    SizeClass::from_index(cls as usize).map(|c| c.size()).unwrap_or(0)
}

/// See `canopy.h`.
#[no_mangle]
pub extern "C" fn canopy_alloc_class(cls: u32) -> *mut c_void {
    // An unknown class: null with EINVAL (on the slow path).
    canopy_alloc::alloc_class_index(cls as usize) as *mut c_void
}

/// See `canopy.h`.
///
/// # Safety
/// `p` is null or a live block of class `cls`.
#[no_mangle]
pub unsafe extern "C" fn canopy_free_class(p: *mut c_void, cls: u32) {
    // SAFETY: the caller's contract; the class is checked on the slow path
    // in check mode, and an invalid class still frees the block (checked by
    // free).
    unsafe { canopy_alloc::free_class_index(p as *mut u8, cls as usize) }
}

/// See `canopy.h`.
///
/// # Safety
/// `p` is a live block of class `cls` (or of a size in it), freed once; null
/// is ignored.
#[no_mangle]
pub unsafe extern "C" fn canopy_free_class_unchecked(p: *mut c_void, cls: u32) {
    if p.is_null() {
        return;
    }
    // SAFETY: the caller's contract (see canopy.h); check mode and the
    // cases the kept list does not take go to the checked free.
    unsafe { canopy_alloc::free_class_index_unchecked(p as *mut u8, cls as usize) }
}

/// See `canopy.h`.
///
/// # Safety
/// `p` is null or a live block of `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn canopy_free_sized(p: *mut c_void, size: size_t) {
    // SAFETY: the caller's contract.
    unsafe { canopy_alloc::free_sized(p as *mut u8, size) }
}

/// See `canopy.h`.
///
/// # Safety
/// `data` is null or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn canopy_alloc_with_descriptor(desc_size: size_t, data_size: size_t, data_align: size_t, data: *mut *mut c_void) -> *mut c_void {
    if !data_align.is_power_of_two() {
        canopy_sys::set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    match canopy_alloc::alloc_with_descriptor(desc_size, data_size, data_align) {
        Some((d, x)) => {
            if !data.is_null() {
                // SAFETY: the caller's contract.
                unsafe { *data = x as *mut c_void };
            }
            d as *mut c_void
        }
        None => {
            canopy_sys::set_errno(libc::ENOMEM);
            ptr::null_mut()
        }
    }
}

/// See `canopy.h`.
///
/// # Safety
/// `desc` is null or a live block from `canopy_alloc_with_descriptor`.
#[no_mangle]
pub unsafe extern "C" fn canopy_free_with_descriptor(desc: *mut c_void) {
    // SAFETY: the caller's contract.
    unsafe { canopy_alloc::free_from(desc as *mut u8, "canopy_free_with_descriptor") }
}

/// See `canopy.h`.
///
/// # Safety
/// `buf` is null or valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn canopy_stats_json(buf: *mut c_char, len: size_t) -> size_t {
    let s = canopy_alloc::stats::snapshot();
    let mut n = 0usize;
    s.write_json(&mut |bytes| {
        for &b in bytes {
            if !buf.is_null() && n + 1 < len {
                // SAFETY: n + 1 < len, inside the caller's buffer.
                unsafe { *buf.add(n) = b as c_char };
            }
            n += 1;
        }
    });
    if !buf.is_null() && len > 0 {
        // SAFETY: min(n, len - 1) < len.
        unsafe { *buf.add(n.min(len - 1)) = 0 };
    }
    n
}

/// See `canopy.h`.
#[no_mangle]
pub extern "C" fn canopy_stats_print() {
    let s = canopy_alloc::stats::snapshot();
    canopy_alloc::stats::write_table(&s, &mut |b| canopy_sys::write_stderr(b));
}

/// See `canopy.h`.
#[no_mangle]
pub extern "C" fn canopy_collect() -> size_t {
    canopy_alloc::collect()
}
