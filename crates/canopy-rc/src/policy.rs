//! Counting policies.  An [`Array`](crate::Array) carries its policy as a
//! type parameter, so the choice is made per array (`Array<f64, Biased>`) or
//! per program (a type alias); the count's representation is the first
//! field of the array's descriptor and each operation compiles to that
//! policy's code only.
//!
//! | policy | increment / decrement | `getrc` | arrays cross threads |
//! |---|---|---|---|
//! | [`Local`] | plain add | exact | no (`!Send`) |
//! | [`Atomic`] | atomic add | exact | yes |
//! | [`Biased`] | owner: plain add; others: atomic add | owner: exact; others: exact once merged, else "shared" | yes |
//! | [`Delegated`] | the thread's pending increment (cancelled by a drop of the same object), or a message to the object's counting thread, not waited for | waits for the asker's earlier messages; may over-report | yes |

use core::cell::Cell;

use canopy_sync::prim::{AtomicUsize, Ordering};

mod sealed {
    pub trait Sealed {}
}

/// How an array's reference count is kept.  Implemented by [`Local`],
/// [`Atomic`], [`Biased`] and [`Delegated`] only.
pub trait Policy: sealed::Sealed + Sized + 'static {
    /// The count, first field of the descriptor.
    type Count;
    /// The policy's name in reports.
    const NAME: &'static str;
    /// Whether a released array's block goes back through the allocator's
    /// unchecked free (`canopy_alloc::free_with_descriptor_unchecked`): the
    /// count proves it is freed once, and a mutator that frees it will
    /// likely allocate the class again soon, from its kept list.  False for
    /// [`Delegated`], whose counting threads free what the mutators
    /// allocated and allocate nothing there themselves: they send it home
    /// through the remote-free path (paper 003 §4).
    #[doc(hidden)]
    const FREE_UNCHECKED: bool = true;
    /// A count of 1 for a new object that `release` frees.
    #[doc(hidden)]
    fn new_count(release: unsafe fn(*const u8)) -> Self::Count;
    /// Count one more reference.
    ///
    /// # Safety
    /// `c` is the count of a live object the caller holds a reference to.
    #[doc(hidden)]
    unsafe fn inc(c: *const Self::Count);
    /// Count one reference less.  True: the caller held the last reference
    /// and must call the release function now; false: someone else (another
    /// holder, the owner, a counting thread) will.
    ///
    /// # Safety
    /// `c` is the count of a live object; the caller gives up its reference.
    #[doc(hidden)]
    unsafe fn dec(c: *const Self::Count) -> bool;
    /// The count as the calling thread can know it: never less than the
    /// number of references alive.
    ///
    /// # Safety
    /// `c` is the count of a live object the caller holds a reference to.
    #[doc(hidden)]
    unsafe fn getrc(c: *const Self::Count) -> usize;
}

/// Policies whose arrays may be sent to and shared with other threads.
pub trait SharedPolicy: Policy {}

/// A non-atomic count: arrays that stay on one thread (`Array<T, Local>` is
/// neither `Send` nor `Sync`), the case a compiler knows to be sequential.
#[derive(Debug, Clone, Copy, Default)]
pub struct Local;

impl sealed::Sealed for Local {}
impl Policy for Local {
    type Count = Cell<usize>;
    const NAME: &'static str = "local";
    #[inline(always)]
    fn new_count(_: unsafe fn(*const u8)) -> Cell<usize> {
        Cell::new(1)
    }
    #[inline(always)]
    unsafe fn inc(c: *const Cell<usize>) {
        // SAFETY: live object (contract); Local arrays never leave their thread.
        let c = unsafe { &*c };
        c.set(c.get() + 1);
    }
    #[inline(always)]
    unsafe fn dec(c: *const Cell<usize>) -> bool {
        // SAFETY: as in `inc`.
        let c = unsafe { &*c };
        debug_assert!(c.get() > 0, "local count below zero");
        c.set(c.get() - 1);
        c.get() == 0
    }
    #[inline(always)]
    unsafe fn getrc(c: *const Cell<usize>) -> usize {
        // SAFETY: as in `inc`.
        unsafe { (*c).get() }
    }
}

/// The usual atomic count.
#[derive(Debug, Clone, Copy, Default)]
pub struct Atomic;

impl sealed::Sealed for Atomic {}
impl SharedPolicy for Atomic {}
impl Policy for Atomic {
    type Count = AtomicUsize;
    const NAME: &'static str = "atomic";
    #[inline(always)]
    fn new_count(_: unsafe fn(*const u8)) -> AtomicUsize {
        AtomicUsize::new(1)
    }
    #[inline(always)]
    unsafe fn inc(c: *const AtomicUsize) {
        // SAFETY: live object (contract).  Relaxed: the new reference comes
        // from an existing one, which keeps the object alive meanwhile.
        unsafe { (*c).fetch_add(1, Ordering::Relaxed) };
    }
    #[inline(always)]
    unsafe fn dec(c: *const AtomicUsize) -> bool {
        // SAFETY: live object (contract).  Release: this holder's uses happen
        // before the free; pairs with the Acquire fence below on the thread
        // that frees, and with the Acquire load in `getrc`.
        let prev = unsafe { (*c).fetch_sub(1, Ordering::Release) };
        debug_assert!(prev > 0, "atomic count below zero");
        if prev == 1 {
            canopy_sync::prim::fence(Ordering::Acquire);
            true
        } else {
            false
        }
    }
    #[inline(always)]
    unsafe fn getrc(c: *const AtomicUsize) -> usize {
        // SAFETY: live object.  Acquire: pairs with the Release decrements, so
        // an in-place update after reading 1 follows every other holder's uses.
        unsafe { (*c).load(Ordering::Acquire) }
    }
}

/// Delegated asynchronous counting (paper 003 §4): see [`crate::delegated`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Delegated;

impl sealed::Sealed for Delegated {}
impl SharedPolicy for Delegated {}
impl Policy for Delegated {
    type Count = crate::delegate::DCount;
    const NAME: &'static str = "delegated";
    const FREE_UNCHECKED: bool = false;
    #[inline(always)]
    fn new_count(release: unsafe fn(*const u8)) -> crate::delegate::DCount {
        crate::delegate::DCount::new(release)
    }
    #[inline(always)]
    unsafe fn inc(c: *const crate::delegate::DCount) {
        crate::delegated::inc(c);
    }
    #[inline(always)]
    unsafe fn dec(c: *const crate::delegate::DCount) -> bool {
        crate::delegated::dec(c);
        false
    }
    unsafe fn getrc(c: *const crate::delegate::DCount) -> usize {
        crate::delegated::with_sender(|s| s.getrc(c))
    }
}

/// Biased counting (Choi, Shull and Torrellas, PACT'18): the thread that
/// created the array (its owner) counts in a plain field, every other thread
/// in an atomic one; see [`crate::biased`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Biased;

impl sealed::Sealed for Biased {}
impl SharedPolicy for Biased {}

pub use crate::biased_core::BiasedCount;
use crate::biased_core::Dec;

impl Policy for Biased {
    type Count = BiasedCount;
    const NAME: &'static str = "biased";
    #[inline(always)]
    fn new_count(release: unsafe fn(*const u8)) -> BiasedCount {
        // Owner 0: no owner (thread teardown); the count starts merged.
        BiasedCount::new(release, crate::biased::owner_id())
    }
    #[inline(always)]
    unsafe fn inc(c: *const BiasedCount) {
        // SAFETY: live object (contract); this thread's id.
        unsafe { (*c).inc(crate::biased::thread_id()) }
    }
    #[inline(always)]
    unsafe fn dec(c: *const BiasedCount) -> bool {
        // SAFETY: live object (contract); this thread's id.
        match unsafe { (*c).dec(crate::biased::thread_id()) } {
            Dec::Keep => false,
            Dec::Free => true,
            Dec::OwnerAlive => {
                // Last use of `c`: the poll may merge (and free) it.
                crate::biased::poll();
                false
            }
            // SAFETY: owner thread, object live.
            Dec::OwnerZero => unsafe { crate::biased::owner_hit_zero(c) },
            Dec::Queue => {
                // SAFETY: live (the owner's references keep it so); we won
                // QUEUED.
                unsafe { crate::biased::queue(c) };
                false
            }
        }
    }
    unsafe fn getrc(c: *const BiasedCount) -> usize {
        // SAFETY: live object held by the caller; this thread's id.
        unsafe { (*c).getrc(crate::biased::thread_id()) }
    }
}
