//! glibc's malloc extensions, answered by Canopy.
//!
//! A program run with `LD_PRELOAD=libcanopy_malloc.so` that asks glibc's
//! allocator about itself (`mallinfo2`, `malloc_stats`, `malloc_info`) would
//! otherwise get the figures of glibc's own, idle arena; one that calls the
//! `__libc_*` entry points directly would get a glibc block and hand it to
//! Canopy's `free` (refused as foreign), or the other way round (a crash
//! inside glibc).  Here they all go to Canopy.  `mallopt` has no setting to
//! act on and says so by returning 0.

use crate::{calloc, memalign, pvalloc, realloc, valloc};
use canopy_alloc::stats;
use core::ffi::c_void;
use std::io::Write;
use libc::{c_int, size_t, FILE};

/// glibc's `struct mallinfo` (the `int` version `mallinfo` returns).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Mallinfo {
    /// See [`canopy_alloc::stats::Mallinfo2`] for every field.
    pub arena: c_int,
    /// 0.
    pub ordblks: c_int,
    /// 0.
    pub smblks: c_int,
    /// Large chunks in use.
    pub hblks: c_int,
    /// Bytes in large chunks in use.
    pub hblkhd: c_int,
    /// 0.
    pub usmblks: c_int,
    /// 0.
    pub fsmblks: c_int,
    /// Bytes in small and medium blocks in use.
    pub uordblks: c_int,
    /// Committed bytes outside large chunks that no block uses.
    pub fordblks: c_int,
    /// 0.
    pub keepcost: c_int,
}

/// glibc's `mallinfo2`: Canopy's statistics in glibc's layout (the mapping
/// is documented on [`canopy_alloc::stats::Mallinfo2`]).  The calling
/// thread's figures are current; another thread's are as of its last slow
/// path.
#[no_mangle]
pub extern "C" fn mallinfo2() -> stats::Mallinfo2 {
    stats::snapshot().mallinfo2()
}

/// glibc's old `mallinfo`: as [`mallinfo2`], each figure capped at
/// `INT_MAX` (glibc's own wraps around).
#[no_mangle]
pub extern "C" fn mallinfo() -> Mallinfo {
    let m = mallinfo2();
    let int = |v: usize| v.min(c_int::MAX as usize) as c_int;
    Mallinfo {
        arena: int(m.arena),
        ordblks: int(m.ordblks),
        smblks: int(m.smblks),
        hblks: int(m.hblks),
        hblkhd: int(m.hblkhd),
        usmblks: int(m.usmblks),
        fsmblks: int(m.fsmblks),
        uordblks: int(m.uordblks),
        fordblks: int(m.fordblks),
        keepcost: int(m.keepcost),
    }
}

/// glibc's `malloc_stats`: Canopy's statistics table on stderr (the table
/// of `canopy_stats_print` and `CANOPY_VERBOSE=1`).
#[no_mangle]
pub extern "C" fn malloc_stats() {
    crate::canopy_stats_print();
}

/// glibc's `malloc_info`: Canopy's statistics as XML on `fp` (see
/// [`canopy_alloc::stats::Stats::write_xml`]).  `options` must be 0 and `fp`
/// not null, else -1 with `errno = EINVAL`; -1 also if writing fails.
///
/// # Safety
/// `fp` is null or an open `FILE`.
#[no_mangle]
pub unsafe extern "C" fn malloc_info(options: c_int, fp: *mut FILE) -> c_int {
    if options != 0 || fp.is_null() {
        canopy_sys::set_errno(libc::EINVAL);
        return -1;
    }
    let mut ok = true;
    stats::snapshot().write_xml(&mut |b| {
        // SAFETY: fp is an open FILE (caller's contract); b is valid for its
        // length.
        ok &= unsafe { libc::fwrite(b.as_ptr() as *const c_void, 1, b.len(), fp) } == b.len();
    });
    if ok {
        0
    } else {
        -1
    }
}

/// glibc's `mallopt`: Canopy has none of glibc's tunables (its own are the
/// `CANOPY_*` variables), so nothing changes and the result is 0, glibc's
/// "not done".  With `CANOPY_VERBOSE=1` the call is reported on stderr.
#[no_mangle]
pub extern "C" fn mallopt(param: c_int, value: c_int) -> c_int {
    if canopy_alloc::options().verbose {
        // Formatted into a stack buffer (`io::Write` for a byte slice): no
        // allocation inside the allocator.
        const LEN: usize = 160;
        let mut buf = [0u8; LEN];
        let mut rest: &mut [u8] = &mut buf;
        let _ = writeln!(rest, "canopy: mallopt({param}, {value}) has no Canopy setting to change; returning 0 (see the CANOPY_* variables)");
        let n = LEN - rest.len();
        canopy_sys::write_stderr(&buf[..n]);
    }
    0
}

// ----- glibc's internal entry points, for programs that call them -----

/// `__libc_malloc`: [`malloc`](crate::malloc).
#[no_mangle]
pub extern "C" fn __libc_malloc(size: size_t) -> *mut c_void {
    // The allocator's inline path itself, not a call through the GOT to
    // the exported `malloc` (which the compiler may choose to make).
    canopy_alloc::alloc(size) as *mut c_void
}

/// `__libc_calloc`: [`calloc`].
#[no_mangle]
pub extern "C" fn __libc_calloc(n: size_t, size: size_t) -> *mut c_void {
    calloc(n, size)
}

/// `__libc_realloc`: [`realloc`].
///
/// # Safety
/// As for [`realloc`].
#[no_mangle]
pub unsafe extern "C" fn __libc_realloc(p: *mut c_void, size: size_t) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { realloc(p, size) }
}

/// `__libc_free`: [`free`](crate::free).
///
/// # Safety
/// As for [`free`](crate::free).
#[no_mangle]
pub unsafe extern "C" fn __libc_free(p: *mut c_void) {
    // SAFETY: the caller's contract, as for `free`; the allocator's inline
    // path itself (see `__libc_malloc`).
    unsafe { canopy_alloc::free(p as *mut u8) }
}

/// `__libc_memalign`: [`memalign`].
#[no_mangle]
pub extern "C" fn __libc_memalign(align: size_t, size: size_t) -> *mut c_void {
    memalign(align, size)
}

/// `__libc_valloc`: [`valloc`].
#[no_mangle]
pub extern "C" fn __libc_valloc(size: size_t) -> *mut c_void {
    valloc(size)
}

/// `__libc_pvalloc`: [`pvalloc`].
#[no_mangle]
pub extern "C" fn __libc_pvalloc(size: size_t) -> *mut c_void {
    pvalloc(size)
}
