//! One process-wide region allocator behind a lock, for the C API and for
//! programs that want regions shared by threads without managing an
//! allocator themselves.  Its configuration comes from the `CANOPY_REGION_*`
//! variables ([`Config::from_env`]) on first use.
//!
//! The lock is held across `fork()` (taken in the prepare handler, released
//! in the parent and reset in the child), so a child of a multithreaded
//! program finds the allocator consistent and can go on using it.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, Ordering};

use canopy_sync::RawLock;

use crate::{Config, RegionAllocator, RegionError};

struct Global {
    lock: RawLock,
    ra: UnsafeCell<Option<RegionAllocator>>,
}

// SAFETY: `ra` is only touched with `lock` held.
unsafe impl Sync for Global {}

static GLOBAL: Global = Global { lock: RawLock::new(), ra: UnsafeCell::new(None) };
/// Whether the fork hooks are in place.  Setting them is idempotent (one
/// atomic store in the allocator), so there is no "being set" state a
/// `fork()` from another thread could leave behind in the child.
static HOOKED: AtomicBool = AtomicBool::new(false);

static HOOKS: canopy_alloc::ForkHooks =
    canopy_alloc::ForkHooks { prepare: fork_prepare, parent: fork_parent, child: fork_child };

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
    if !HOOKED.load(Ordering::Acquire) {
        // The allocator's fork handlers take the region lock before its own
        // (region calls allocate under the region lock) and release it after.
        canopy_alloc::set_fork_hooks(&HOOKS);
        HOOKED.store(true, Ordering::Release);
    }
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
