//! One process-wide region allocator behind a lock, for the C API and for
//! programs that want regions shared by threads without managing an
//! allocator themselves.  Its configuration comes from the `CANOPY_REGION_*`
//! variables ([`Config::from_env`]) on first use.
//!
//! [`with`] runs one call under the lock.  A *session* ([`session_begin`] ..
//! [`session_end`]) keeps the lock for one thread across many allocations
//! in one region, checking the region once, as [`RegionAllocator::in_region`]
//! does for an allocator of one's own: each [`session_alloc`] then costs no
//! lock and no id check.  Other threads' calls wait until the session ends.
//! A session is named by a handle (a number, never 0, never reused), so a
//! call with an ended session's handle is refused; so is a call from a
//! thread other than the one that began it, and any other call of this
//! module on the session's own thread (it would wait for the lock its own
//! session holds).  A thread that ends while its session is open ends the
//! session (with a message on stderr), so the lock is not lost with it: a
//! `pthread_key_t` destructor does it, which runs after the thread's
//! thread-local destructors, so this holds for a session begun in one of
//! those too (or in a key destructor, within the system's
//! `PTHREAD_DESTRUCTOR_ITERATIONS` rounds).  `exit()` runs no key
//! destructors: the session of the thread that calls it stays open while the
//! process ends.
//!
//! The lock is held across `fork()` (taken in the prepare handler, released
//! in the parent and reset in the child), so a child of a multithreaded
//! program finds the allocator consistent and can go on using it.  A thread
//! that forks during its own session keeps the session in the parent and the
//! child; another thread's `fork()` waits until the session ends.

use core::cell::UnsafeCell;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use canopy_sync::RawLock;

use crate::{Config, InRegion, RegionAllocator, RegionError, RegionId};

struct Global {
    lock: RawLock,
    ra: UnsafeCell<Option<RegionAllocator>>,
    /// The open session, if any: touched only by the thread that holds the
    /// lock for it (`SESSION_OWNER`).
    session: UnsafeCell<Option<Open>>,
}

/// An open session: its handle and the allocation handle it borrows the
/// allocator for (for as long as the lock is held).
struct Open {
    handle: u64,
    inr: InRegion<'static>,
}

// SAFETY: `ra` and `session` are only touched with `lock` held (a session's
// thread holds it from `session_begin` to `session_end`).
unsafe impl Sync for Global {}

static GLOBAL: Global = Global { lock: RawLock::new(), ra: UnsafeCell::new(None), session: UnsafeCell::new(None) };
/// Whether the fork hooks are in place.  Setting them is idempotent (one
/// atomic store in the allocator), so there is no "being set" state a
/// `fork()` from another thread could leave behind in the child.
static HOOKED: AtomicBool = AtomicBool::new(false);
/// The thread (`canopy_sys::thread_id`) whose session is open; 0 if none.
/// Only that thread stores a non-zero value or clears it, so a thread that
/// reads its own id here knows it holds the lock.
static SESSION_OWNER: AtomicUsize = AtomicUsize::new(0);
/// The last session handle given out.
static SESSION_SEQ: AtomicU64 = AtomicU64::new(0);

static HOOKS: canopy_alloc::ForkHooks =
    canopy_alloc::ForkHooks { prepare: fork_prepare, parent: fork_parent, child: fork_child };

fn in_own_session() -> bool {
    SESSION_OWNER.load(Ordering::Relaxed) == canopy_sys::thread_id()
}

extern "C" fn fork_prepare() {
    // A thread forking during its own session already holds the lock.
    if !in_own_session() {
        GLOBAL.lock.lock();
    }
}

extern "C" fn fork_parent() {
    if !in_own_session() {
        GLOBAL.lock.unlock();
    }
}

extern "C" fn fork_child() {
    // The child has one thread, this one, which took the lock in prepare
    // (or holds it for its session, which goes on in the child).
    if !in_own_session() {
        GLOBAL.lock.force_unlock();
    }
}

/// Releases the lock when dropped (also if `f` panics in a test build).
struct Held;

impl Drop for Held {
    fn drop(&mut self) {
        GLOBAL.lock.unlock();
    }
}

/// The error for a call on the thread of an open session.
fn busy_here() -> RegionError {
    // SAFETY: this thread owns the open session (caller), so it holds the lock.
    let h = unsafe { (*GLOBAL.session.get()).as_ref().map_or(0, |o| o.handle) };
    RegionError::Session(format!(
        "this thread has session {h} open, which holds the region lock: end it first (or allocate through it)"
    ))
}

/// Take the lock and make the allocator on first use; on an error the lock
/// is released again.
///
/// # Safety
/// The returned reference is the only one to the allocator only while the
/// lock is held: the caller releases the lock after its last use (and no
/// earlier reference from this function may still be in use).
unsafe fn lock_allocator() -> Result<&'static mut RegionAllocator, RegionError> {
    if !HOOKED.load(Ordering::Acquire) {
        // The allocator's fork handlers take the region lock before its own
        // (region calls allocate under the region lock) and release it after.
        canopy_alloc::set_fork_hooks(&HOOKS);
        HOOKED.store(true, Ordering::Release);
    }
    GLOBAL.lock.lock();
    // SAFETY: the lock is held (by the caller from here on), so this is the
    // only reference to the allocator until it is released.
    let slot = unsafe { &mut *GLOBAL.ra.get() };
    if slot.is_none() {
        match Config::from_env().and_then(RegionAllocator::with_config) {
            Ok(ra) => *slot = Some(ra),
            Err(e) => {
                GLOBAL.lock.unlock();
                return Err(e);
            }
        }
    }
    Ok(slot.as_mut().expect("made above"))
}

/// Run `f` on the process-wide allocator (made on first use).  Fails if the
/// `CANOPY_REGION_*` configuration is invalid, or if this thread has a
/// session open (the call would wait for its own lock).  `f` must not call
/// back into this module (the lock is not reentrant).
pub fn with<R>(f: impl FnOnce(&mut RegionAllocator) -> R) -> Result<R, RegionError> {
    if in_own_session() {
        return Err(busy_here());
    }
    // SAFETY: `_held` releases the lock when `f`, the last user of `ra`,
    // has returned (or unwound).
    let ra = unsafe { lock_allocator()? };
    let _held = Held;
    Ok(f(ra))
}

/// The `pthread_key_t` (plus one; 0 until made) whose destructor ends a
/// session left open by a thread that is ending.  A key rather than a
/// `thread_local!`: key destructors run after every thread-local destructor,
/// and again (up to `PTHREAD_DESTRUCTOR_ITERATIONS` rounds) for a key set by
/// an earlier destructor, so a session begun while the thread is ending (in
/// a thread-local or key destructor) is ended too; a `thread_local!` guard
/// first touched then, or already destroyed, never runs.  Made by one
/// compare-exchange: no "being made" state a `fork()` could leave behind.
static EXIT_KEY: AtomicUsize = AtomicUsize::new(0);

fn exit_key() -> Option<libc::pthread_key_t> {
    let k = EXIT_KEY.load(Ordering::Acquire);
    if k != 0 {
        return Some((k - 1) as libc::pthread_key_t);
    }
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is a valid place for the new key; the destructor is an
    // `extern "C"` function valid for the life of the process.
    if unsafe { libc::pthread_key_create(&mut key, Some(end_at_thread_exit)) } != 0 {
        return None;
    }
    match EXIT_KEY.compare_exchange(0, key as usize + 1, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Some(key),
        Err(other) => {
            // Another thread made one first: ours was never set on any thread.
            // SAFETY: `key` came from pthread_key_create above.
            unsafe { libc::pthread_key_delete(key) };
            Some((other - 1) as libc::pthread_key_t)
        }
    }
}

/// A fixed buffer for a message written without allocating (the thread is
/// ending: its heap may already be given back).
struct StackMessage {
    buf: [u8; 128],
    len: usize,
}

impl core::fmt::Write for StackMessage {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// The key destructor: ends the session of a thread that is ending.
extern "C" fn end_at_thread_exit(_: *mut libc::c_void) {
    if in_own_session() {
        // SAFETY: this thread owns the session, so it holds the lock.
        let h = unsafe { (*GLOBAL.session.get()).as_ref().map_or(0, |o| o.handle) };
        let mut m = StackMessage { buf: [0; 128], len: 0 };
        let _ = core::fmt::Write::write_fmt(
            &mut m,
            format_args!("canopy: a thread ended with region session {h} open; the session is ended\n"),
        );
        canopy_sys::write_stderr(&m.buf[..m.len]);
        let _ = session_end(h);
    }
}

/// Begin a session: allocation in region `rid` by this thread, with the
/// region lock held until [`session_end`].  Returns the session's handle.
/// Fails if the region does not exist or is freed, this thread already
/// has a session open, or the thread-exit hook cannot be set (no
/// `pthread_key_t` left).
pub fn session_begin(rid: RegionId) -> Result<u64, RegionError> {
    if in_own_session() {
        return Err(busy_here());
    }
    // Set before the lock is taken (it may allocate): the key's destructor
    // is what ends a session whose thread forgot to.  Without it a session
    // could outlive its thread and keep the lock, so none is begun.
    let armed = exit_key().is_some_and(|key| {
        // SAFETY: `key` is a live key; the value is only a non-null marker.
        unsafe { libc::pthread_setspecific(key, NonNull::<u8>::dangling().as_ptr().cast()) == 0 }
    });
    if !armed {
        return Err(RegionError::Session("cannot set the hook that ends the session if this thread ends".into()));
    }
    // SAFETY: on success the reference lives in the session's `InRegion`,
    // which `session_end` drops before it releases the lock (and nothing but
    // the session's thread reaches it meanwhile); on failure the lock is
    // released below, after the last use.
    let ra = unsafe { lock_allocator()? };
    match ra.in_region(rid) {
        Ok(inr) => {
            let handle = SESSION_SEQ.fetch_add(1, Ordering::Relaxed) + 1;
            // SAFETY: the lock is held, and stays held until `session_end`
            // takes the session out again; nothing else reaches `session`.
            unsafe { *GLOBAL.session.get() = Some(Open { handle, inr }) };
            SESSION_OWNER.store(canopy_sys::thread_id(), Ordering::Relaxed);
            Ok(handle)
        }
        Err(e) => {
            GLOBAL.lock.unlock();
            Err(e)
        }
    }
}

/// The open session `handle` of this thread.
#[inline(always)]
fn session(handle: u64) -> Result<&'static mut InRegion<'static>, RegionError> {
    if in_own_session() {
        // SAFETY: this thread owns the open session, so it holds the lock
        // and is the only one to reach `session`.
        if let Some(open) = unsafe { (*GLOBAL.session.get()).as_mut() } {
            if open.handle == handle {
                return Ok(&mut open.inr);
            }
        }
    }
    Err(not_open(handle))
}

/// Why `handle` names no session open on this thread.
#[cold]
#[inline(never)]
fn not_open(handle: u64) -> RegionError {
    if in_own_session() {
        // SAFETY: as in `session`.
        let h = unsafe { (*GLOBAL.session.get()).as_ref().map_or(0, |o| o.handle) };
        return RegionError::Session(format!("session {handle} is not open (this thread's open session is {h})"));
    }
    let why = if SESSION_SEQ.load(Ordering::Relaxed) < handle || handle == 0 {
        "no such session was begun"
    } else {
        "it is not open on this thread (ended, or begun by another thread)"
    };
    RegionError::Session(format!("session {handle}: {why}"))
}

/// Allocate `size` bytes in the session's region, as
/// [`RegionAllocator::alloc`] does, without the lock or the id check.
#[inline(always)]
pub fn session_alloc(handle: u64, size: usize) -> Result<NonNull<u8>, RegionError> {
    match session_alloc_fast(handle, size) {
        Some(p) => Ok(p),
        None => session_alloc_refill(handle, size),
    }
}

/// The fast path of [`session_alloc`] alone, with no call in it: an object
/// if `handle` is this thread's open session and the size's slot size has a
/// free slot under its cursor; `None` otherwise (then [`session_alloc`]
/// does the rest, or says what was wrong).
#[inline(always)]
pub fn session_alloc_fast(handle: u64, size: usize) -> Option<NonNull<u8>> {
    if !in_own_session() {
        return None;
    }
    // SAFETY: this thread owns the open session, so it holds the lock and is
    // the only one to reach `session`.
    let open = unsafe { (*GLOBAL.session.get()).as_mut()? };
    if open.handle != handle {
        return None;
    }
    open.inr.alloc_fast(size)
}

/// [`session_alloc`] past its fast path, out of line.
#[cold]
#[inline(never)]
fn session_alloc_refill(handle: u64, size: usize) -> Result<NonNull<u8>, RegionError> {
    session(handle)?.alloc_refill(size)
}

/// Free one object (of any region) within the session.
pub fn session_free(handle: u64, p: NonNull<u8>) -> Result<(), RegionError> {
    session(handle)?.free(p)
}

/// End the session: the lock is released and the handle is no longer valid.
pub fn session_end(handle: u64) -> Result<(), RegionError> {
    session(handle)?;
    // SAFETY: as in `session`: this thread holds the lock for the session.
    // The allocation handle is dropped before the lock is released.
    unsafe { *GLOBAL.session.get() = None };
    SESSION_OWNER.store(0, Ordering::Relaxed);
    GLOBAL.lock.unlock();
    Ok(())
}
