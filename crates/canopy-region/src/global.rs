//! One process-wide region allocator behind a lock, for the C API and for
//! programs that want regions shared by threads without managing an
//! allocator themselves.  Its configuration comes from the `CANOPY_REGION_*`
//! variables ([`Config::from_env`]) on first use.
//!
//! The lock is held across `fork()` (taken in the prepare handler, released
//! in the parent and reset in the child), so a child of a multithreaded
//! program finds the allocator consistent and can go on using it.

use core::cell::UnsafeCell;
use std::sync::Once;

use canopy_sync::RawLock;

use crate::{Config, RegionAllocator, RegionError};

struct Global {
    lock: RawLock,
    ra: UnsafeCell<Option<RegionAllocator>>,
}

// SAFETY: `ra` is only touched with `lock` held.
unsafe impl Sync for Global {}

static GLOBAL: Global = Global { lock: RawLock::new(), ra: UnsafeCell::new(None) };
static ATFORK: Once = Once::new();

extern "C" fn fork_prepare() {
    GLOBAL.lock.lock();
}

extern "C" fn fork_parent() {
    GLOBAL.lock.unlock();
}

extern "C" fn fork_child() {
    // The child has one thread, this one, which took the lock in prepare.
    GLOBAL.lock.force_unlock();
}

/// Releases the lock when dropped (also if `f` panics in a test build).
struct Held;

impl Drop for Held {
    fn drop(&mut self) {
        GLOBAL.lock.unlock();
    }
}

/// Run `f` on the process-wide allocator (made on first use).  Fails only
/// if the `CANOPY_REGION_*` configuration is invalid.  `f` must not call
/// back into this function (the lock is not reentrant).
pub fn with<R>(f: impl FnOnce(&mut RegionAllocator) -> R) -> Result<R, RegionError> {
    ATFORK.call_once(|| {
        // Lock order: region lock, then the allocator's (region calls
        // allocate).  Prepare handlers run in reverse order of registration,
        // so the allocator's must be registered first: initialise it now.
        canopy_alloc::init();
        // SAFETY: registering plain extern "C" functions that only touch the lock.
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    });
    GLOBAL.lock.lock();
    let _held = Held;
    // SAFETY: the lock is held until `_held` drops, so this is the only
    // reference to the allocator.
    let slot = unsafe { &mut *GLOBAL.ra.get() };
    if slot.is_none() {
        *slot = Some(RegionAllocator::with_config(Config::from_env()?)?);
    }
    Ok(f(slot.as_mut().expect("made above")))
}
