//! The region API of `canopy.h` over the process-wide region allocator
//! (`canopy_region::global`).  Errors: a zero id, null or -1 with `errno`
//! (`EINVAL` for a bad region or pointer, `ENOMEM` when memory runs out or a
//! size is too large for any region) and
//! the message in `canopy_region_error()`.

use core::ffi::c_void;
use core::ptr::{self, NonNull};
use std::cell::RefCell;
use std::ffi::CString;

use canopy_region::{global, RegionError, RegionId};
use libc::{c_char, c_int, size_t};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn fail(e: RegionError) {
    canopy_sys::set_errno(match e {
        // A size no region can hold is memory that runs out, as for malloc.
        RegionError::OutOfMemory { .. } | RegionError::SizeTooLarge(_) => libc::ENOMEM,
        _ => libc::EINVAL,
    });
    let msg = CString::new(e.to_string()).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|l| *l.borrow_mut() = msg);
}

fn id_arg(v: u64) -> Result<RegionId, RegionError> {
    RegionId::from_raw(v).ok_or_else(|| RegionError::Invalid("region id 0 is never valid (the root is CANOPY_REGION_ROOT = 1)".into()))
}

/// Run `f` on the global allocator; report its error.
fn call<T>(f: impl FnOnce(&mut canopy_region::RegionAllocator) -> Result<T, RegionError>) -> Option<T> {
    match global::with(f) {
        Ok(Ok(v)) => Some(v),
        Ok(Err(e)) | Err(e) => {
            fail(e);
            None
        }
    }
}

/// See `canopy.h`.
#[no_mangle]
pub extern "C" fn canopy_ralloc(parent: u64, level_hint: c_int) -> u64 {
    match id_arg(parent) {
        Ok(p) => call(|ra| ra.ralloc(p, level_hint)).map_or(0, RegionId::get),
        Err(e) => {
            fail(e);
            0
        }
    }
}

/// See `canopy.h`.
#[no_mangle]
pub extern "C" fn canopy_rfree(region: u64) -> c_int {
    let r = id_arg(region).and_then(|r| global::with(|ra| ra.rfree(r)).and_then(|x| x));
    match r {
        Ok(()) => 0,
        Err(e) => {
            fail(e);
            -1
        }
    }
}

/// See `canopy.h`.
#[no_mangle]
pub extern "C" fn canopy_region_alloc(size: size_t, region: u64) -> *mut c_void {
    match id_arg(region) {
        Ok(r) => call(|ra| ra.alloc(size, r)).map_or(ptr::null_mut(), |p| p.as_ptr().cast()),
        Err(e) => {
            fail(e);
            ptr::null_mut()
        }
    }
}

/// See `canopy.h`.
///
/// # Safety
/// `p` is null or was returned by the region API (anything else is refused
/// with an error, but must at least be a pointer value).
#[no_mangle]
pub unsafe extern "C" fn canopy_region_free(p: *mut c_void) -> c_int {
    let Some(p) = NonNull::new(p.cast::<u8>()) else { return 0 };
    match call(|ra| ra.free(p)) {
        Some(()) => 0,
        None => -1,
    }
}

/// See `canopy.h`.
///
/// # Safety
/// As for `canopy_region_free`; on success `p` must not be used again
/// unless it is the pointer returned.
#[no_mangle]
pub unsafe extern "C" fn canopy_region_realloc(p: *mut c_void, size: size_t, region: u64) -> *mut c_void {
    let to = if region == 0 { None } else { Some(id_arg(region)) };
    let to = match to.transpose() {
        Ok(t) => t,
        Err(e) => {
            fail(e);
            return ptr::null_mut();
        }
    };
    let r = match NonNull::new(p.cast::<u8>()) {
        None => match to {
            Some(r) => call(|ra| ra.alloc(size, r)),
            None => {
                fail(RegionError::Invalid("canopy_region_realloc(NULL, ...) needs a region".into()));
                None
            }
        },
        Some(p) => call(|ra| ra.realloc(p, size, to)),
    };
    r.map_or(ptr::null_mut(), |q| q.as_ptr().cast())
}

/// See `canopy.h`.
///
/// # Safety
/// `objects` is valid for `n` pointer writes.
#[no_mangle]
pub unsafe extern "C" fn canopy_region_balloc(size: size_t, region: u64, n: size_t, objects: *mut *mut c_void) -> c_int {
    if objects.is_null() && n > 0 {
        fail(RegionError::Invalid("canopy_region_balloc: objects is NULL".into()));
        return -1;
    }
    let r = match id_arg(region) {
        Ok(r) => r,
        Err(e) => {
            fail(e);
            return -1;
        }
    };
    // The list of pointers first: a count it cannot hold is out of memory,
    // not an abort in `Vec::with_capacity`.
    let mut v = Vec::new();
    if v.try_reserve_exact(n).is_err() {
        fail(RegionError::OutOfMemory { size: size.saturating_mul(n), region: r });
        return -1;
    }
    match call(|ra| ra.balloc_into(size, r, n, &mut v).map(|()| v)) {
        Some(v) => {
            for (i, p) in v.into_iter().enumerate() {
                // SAFETY: i < n, inside the caller's array.
                unsafe { *objects.add(i) = p.as_ptr().cast() };
            }
            0
        }
        None => -1,
    }
}

/// See `canopy.h`.
#[no_mangle]
pub extern "C" fn canopy_region_of(p: *const c_void) -> u64 {
    call(|ra| ra.region_of(p.cast())).map_or(0, RegionId::get)
}

/// See `canopy.h`.
///
/// # Safety
/// `runs` is null or valid for `cap` writes.
#[no_mangle]
pub unsafe extern "C" fn canopy_region_pack(region: u64, runs: *mut CanopyRun, cap: size_t) -> size_t {
    let r = match id_arg(region) {
        Ok(r) => r,
        Err(e) => {
            fail(e);
            return usize::MAX;
        }
    };
    match call(|ra| ra.pack_runs(r)) {
        Some(v) => {
            if !runs.is_null() {
                for (i, run) in v.iter().take(cap).enumerate() {
                    // SAFETY: i < cap, inside the caller's array.
                    unsafe { *runs.add(i) = CanopyRun { addr: run.addr, len: run.len } };
                }
            }
            v.len()
        }
        None => usize::MAX,
    }
}

/// One run of a packed region (`canopy_run_t`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CanopyRun {
    /// First byte.
    pub addr: usize,
    /// Length in bytes.
    pub len: size_t,
}

/// See `canopy.h`.
#[no_mangle]
pub extern "C" fn canopy_region_error() -> *const c_char {
    LAST_ERROR.try_with(|l| l.borrow().as_ptr()).unwrap_or(c"".as_ptr())
}

/// See `canopy.h`.
#[no_mangle]
pub extern "C" fn canopy_region_begin(region: u64) -> u64 {
    match id_arg(region).and_then(global::session_begin) {
        Ok(s) => s,
        Err(e) => {
            fail(e);
            0
        }
    }
}

/// See `canopy.h`.
#[no_mangle]
pub extern "C" fn canopy_session_alloc(s: u64, size: size_t) -> *mut c_void {
    // The fast path has no call in it, so no stack frame; the rest is out of line.
    match global::session_alloc_fast(s, size) {
        Some(p) => p.as_ptr().cast(),
        None => session_alloc_rest(s, size),
    }
}

#[cold]
#[inline(never)]
fn session_alloc_rest(s: u64, size: size_t) -> *mut c_void {
    match global::session_alloc(s, size) {
        Ok(p) => p.as_ptr().cast(),
        Err(e) => {
            fail(e);
            ptr::null_mut()
        }
    }
}

/// See `canopy.h`.
///
/// # Safety
/// As for `canopy_region_free`.
#[no_mangle]
pub unsafe extern "C" fn canopy_session_free(s: u64, p: *mut c_void) -> c_int {
    let Some(p) = NonNull::new(p.cast::<u8>()) else { return 0 };
    match global::session_free(s, p) {
        Ok(()) => 0,
        Err(e) => {
            fail(e);
            -1
        }
    }
}

/// See `canopy.h`.
#[no_mangle]
pub extern "C" fn canopy_region_end(s: u64) -> c_int {
    match global::session_end(s) {
        Ok(()) => 0,
        Err(e) => {
            fail(e);
            -1
        }
    }
}
