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
//! | [`Delegated`] | a message to the object's counting thread, not waited for | waits for the asker's earlier messages; may over-report | yes |

use core::cell::{Cell, UnsafeCell};

use canopy_sync::prim::{AtomicUsize, Ordering};
// canopy_sync::prim has no AtomicIsize; this module is not built under loom.
use core::sync::atomic::AtomicIsize;

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

/// The biased count.  The owner's fields and the shared word sit on
/// different cache lines, so the owner's plain updates do not slow the other
/// threads' atomic ones.
///
/// ```text
///  offset 0    release fn | owner id | local (owner only) | merged (owner only)
///  offset 128  shared: count << 2 | QUEUED << 1 | MERGED      (atomic, signed)
/// ```
///
/// Invariant: live references = `local + count` while not merged, `count`
/// once merged.  `count` may be negative before the merge (a reference the
/// owner counted was dropped by another thread); the first thread to make it
/// negative queues the object to its owner, which merges `local` into the
/// shared word.
#[repr(C)]
pub struct BiasedCount {
    release: unsafe fn(*const u8),
    owner: u64,
    local: UnsafeCell<usize>,
    merged: UnsafeCell<bool>,
    _pad: [u8; 103],
    shared: AtomicIsize,
}

const _: () = assert!(core::mem::offset_of!(BiasedCount, shared) >= 128);

impl core::fmt::Debug for BiasedCount {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BiasedCount")
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

const MERGED: isize = 1;
const QUEUED: isize = 2;
const ONE: isize = 4;

#[inline(always)]
fn count_of(w: isize) -> isize {
    w >> 2
}

impl Policy for Biased {
    type Count = BiasedCount;
    const NAME: &'static str = "biased";
    #[inline(always)]
    fn new_count(release: unsafe fn(*const u8)) -> BiasedCount {
        let owner = crate::biased::owner_id();
        // Owner 0: no owner (thread teardown); the count starts merged.
        let merged = owner == 0;
        BiasedCount {
            release,
            owner,
            local: UnsafeCell::new(usize::from(!merged)),
            merged: UnsafeCell::new(merged),
            _pad: [0; 103],
            shared: AtomicIsize::new(if merged { ONE | MERGED } else { 0 }),
        }
    }
    #[inline(always)]
    unsafe fn inc(c: *const BiasedCount) {
        // SAFETY: live object (contract).  `local` and `merged` are read and
        // written by the owner only (until the owner's thread has ended).
        unsafe {
            let c = &*c;
            if c.owner == crate::biased::thread_id() && !*c.merged.get() {
                *c.local.get() += 1;
            } else {
                // Relaxed: as for `Atomic::inc`.
                c.shared.fetch_add(ONE, Ordering::Relaxed);
            }
        }
    }
    #[inline(always)]
    unsafe fn dec(c: *const BiasedCount) -> bool {
        // SAFETY: live object (contract); owner-only fields as in `inc`.
        unsafe {
            let r = &*c;
            if r.owner == crate::biased::thread_id() && !*r.merged.get() {
                let l = r.local.get();
                debug_assert!(*l > 0, "biased local count below zero");
                *l -= 1;
                if *l > 0 {
                    // Last use of `r`: the poll may merge (and free) it.
                    crate::biased::poll();
                    return false;
                }
                crate::biased::owner_hit_zero(c)
            } else {
                // AcqRel: Release publishes this holder's uses; Acquire makes
                // the other holders' uses visible if this thread frees.
                let prev = r.shared.fetch_sub(ONE, Ordering::AcqRel);
                if prev & MERGED != 0 {
                    // Whoever takes the merged count to zero frees, unless the
                    // object is still queued: then the owner's queue does.
                    return count_of(prev) == 1 && prev & QUEUED == 0;
                }
                if count_of(prev) - 1 < 0 && prev & QUEUED == 0 {
                    crate::biased::went_negative(c);
                }
                false
            }
        }
    }
    unsafe fn getrc(c: *const BiasedCount) -> usize {
        // SAFETY: live object; owner-only fields read by the owner only.
        unsafe {
            let r = &*c;
            // Acquire: pairs with the AcqRel decrements of other threads.
            let w = r.shared.load(Ordering::Acquire);
            if r.owner == crate::biased::thread_id() && !*r.merged.get() {
                (*r.local.get() as isize + count_of(w)).max(1) as usize
            } else if w & MERGED != 0 {
                count_of(w).max(1) as usize
            } else {
                // Another thread's plain count is unknown here: report
                // "shared" (an over-report, which only costs a copy).
                count_of(w).max(0) as usize + 2
            }
        }
    }
}

/// Merge the owner's count into the shared word and free the object if no
/// reference is left.  Called by the owner (from its queue, or when its local
/// count reaches zero) or, after the owner's thread ended, by the thread that
/// queued the object.
///
/// # Safety
/// `c` is live; the caller is the owner, or the owner's thread has ended and
/// the caller won the QUEUED flag (and synchronised with the owner's end).
pub(crate) unsafe fn biased_merge(c: *const BiasedCount, from_queue: bool) {
    // SAFETY: contract: nobody else touches `local`/`merged` now.
    unsafe {
        let r = &*c;
        if !*r.merged.get() {
            *r.merged.get() = true;
            let l = core::mem::replace(&mut *r.local.get(), 0) as isize;
            // AcqRel: as for the decrements; adding MERGED sets the bit (it
            // was clear: only a merge sets it).
            r.shared.fetch_add(l * ONE + MERGED, Ordering::AcqRel);
        }
        if from_queue {
            let prev = r.shared.fetch_and(!QUEUED, Ordering::AcqRel);
            if count_of(prev) == 0 {
                (r.release)(c as *const u8);
            }
        }
    }
}

/// The owner's local count reached zero: merge; true if the caller must free.
///
/// # Safety
/// Owner thread, object live.
pub(crate) unsafe fn biased_owner_zero(c: *const BiasedCount) -> bool {
    // SAFETY: owner thread (contract).
    unsafe {
        let r = &*c;
        *r.merged.get() = true;
        let prev = r.shared.fetch_or(MERGED, Ordering::AcqRel);
        count_of(prev) == 0 && prev & QUEUED == 0
    }
}

/// Set QUEUED; true if this caller set it (and so must queue the object).
///
/// # Safety
/// Object live.
pub(crate) unsafe fn biased_try_queue(c: *const BiasedCount) -> bool {
    // SAFETY: object live (contract).
    unsafe { (*c).shared.fetch_or(QUEUED, Ordering::AcqRel) & QUEUED == 0 }
}

/// The owner's thread id of a biased count.
///
/// # Safety
/// Object live.
pub(crate) unsafe fn biased_owner(c: *const BiasedCount) -> u64 {
    // SAFETY: object live; `owner` never changes.
    unsafe { (*c).owner }
}
