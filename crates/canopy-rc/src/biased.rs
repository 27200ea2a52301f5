//! The biased policy's slow paths: thread ids, and the owners' queues.
//!
//! When a thread other than the owner takes a not-yet-merged count below
//! zero, the object holds references that the owner counted in its plain
//! field and that have since been dropped elsewhere; only the owner can read
//! that field, so the object goes to the owner's queue.  The owner merges
//! queued objects when it next creates a biased array, when one of its local
//! counts reaches zero, on [`merge_pending`], and when its thread ends.
//! After the owner's thread has ended its fields are frozen, and the thread
//! that would have queued the object merges it itself.  The ending thread
//! counts like any other from the moment it leaves the registry: references
//! dropped by its later thread-local destructors take the shared path.
//!
//! Thread ids here are never reused (a counter, not the TCB address), so an
//! object can never be mistaken for one owned by a later thread.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use canopy_sync::prim::{AtomicBool, AtomicU64, Ordering};

use crate::biased_core::BiasedCount;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static ID: Cell<u64> = const { Cell::new(0) };
    static OWNER: RefCell<Option<OwnerGuard>> = const { RefCell::new(None) };
    /// This thread's slot's `pending` flag while it is an owner (else null);
    /// polled on the owner's decrements.
    static PENDING: Cell<*const AtomicBool> = const { Cell::new(core::ptr::null()) };
}

/// Owner fast-path poll: merge queued objects if another thread queued some.
/// A merge may free the object the caller just decremented (the merge sees
/// the true total), so callers must not touch their object afterwards.
#[inline(always)]
pub(crate) fn poll() {
    let p = PENDING.with(|p| p.get());
    // SAFETY: non-null only while this thread's OwnerGuard (which keeps the
    // slot alive) exists.
    if !p.is_null() && unsafe { (*p).load(Ordering::Relaxed) } {
        merge_pending();
    }
}

/// This thread's id (assigned on first use, never 0, never reused).
#[inline(always)]
pub(crate) fn thread_id() -> u64 {
    ID.with(|c| {
        let v = c.get();
        if v != 0 {
            v
        } else {
            let v = NEXT_ID.fetch_add(1, Ordering::Relaxed);
            c.set(v);
            v
        }
    })
}

/// Objects queued to one owner.
struct OwnerSlot {
    pending: AtomicBool,
    items: Mutex<Vec<usize>>,
}

fn owners() -> &'static Mutex<HashMap<u64, Arc<OwnerSlot>>> {
    static O: OnceLock<Mutex<HashMap<u64, Arc<OwnerSlot>>>> = OnceLock::new();
    O.get_or_init(|| Mutex::new(HashMap::new()))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers the thread as an owner; merging its queue when the thread ends.
struct OwnerGuard {
    id: u64,
    slot: Arc<OwnerSlot>,
}

impl Drop for OwnerGuard {
    fn drop(&mut self) {
        let _ = PENDING.try_with(|p| p.set(core::ptr::null()));
        // From here on this thread is not the owner of its objects: later
        // clones and drops (other thread-locals' destructors run after this
        // one) take the shared path with a fresh id.  Otherwise such a drop
        // would write a plain `local` field while another thread, finding no
        // registry entry, merges that same field itself (`queue` below): a
        // data race that could lose a count or free twice.  `ID` has no
        // destructor, so it is reachable for the whole teardown.
        ID.with(|c| c.set(NEXT_ID.fetch_add(1, Ordering::Relaxed)));
        // Leave the registry first: a thread that finds no slot for us merges
        // the object itself.  Under the registry lock, so every push made
        // while we were registered is in `items` when we drain below, and our
        // last writes to local counts happen before such a self-merge.
        lock(owners()).remove(&self.id);
        drain(&self.slot);
    }
}

fn drain(slot: &OwnerSlot) {
    slot.pending.store(false, Ordering::Relaxed);
    let items = core::mem::take(&mut *lock(&slot.items));
    for o in items {
        // SAFETY: a queued object stays alive until its queue entry is
        // processed (the QUEUED flag defers the free to us), and we are its
        // owner.
        unsafe { merge_queued(o as *const BiasedCount) };
    }
}

/// The id of this thread as an owner (0: none, the thread is ending): registers its queue on first use and
/// merges whatever was queued to it since the last time.
pub(crate) fn owner_id() -> u64 {
    let id = thread_id();
    let ok = OWNER.try_with(|o| {
        let mut o = o.borrow_mut();
        match &*o {
            Some(g) => {
                if g.slot.pending.load(Ordering::Acquire) {
                    let slot = g.slot.clone();
                    drop(o);
                    drain(&slot);
                }
            }
            None => {
                let slot = Arc::new(OwnerSlot {
                    pending: AtomicBool::new(false),
                    items: Mutex::new(Vec::new()),
                });
                lock(owners()).insert(id, slot.clone());
                let _ = PENDING.try_with(|p| p.set(&slot.pending as *const AtomicBool));
                *o = Some(OwnerGuard { id, slot });
            }
        }
    });
    // During thread teardown there is no queue: the object starts merged.
    if ok.is_ok() {
        id
    } else {
        0
    }
}

/// Merge the objects other threads queued to this thread.  Owners also do
/// this when they create a biased array and when they end.
pub fn merge_pending() {
    let slot = OWNER
        .try_with(|o| o.borrow().as_ref().map(|g| g.slot.clone()))
        .ok()
        .flatten();
    if let Some(s) = slot {
        if s.pending.load(Ordering::Acquire) {
            drain(&s);
        }
    }
}

/// Merge a queued object and process its queue entry; release it if no
/// reference is left.
///
/// # Safety
/// As for [`BiasedCount::merge`] with `from_queue`.
unsafe fn merge_queued(c: *const BiasedCount) {
    // SAFETY: forwarded; the queue entry kept the object alive.
    unsafe {
        if (*c).merge(true) {
            ((*c).release)(c as *const u8);
        }
    }
}

/// The owner's local count of `c` reached zero; true if the caller frees.
///
/// # Safety
/// Owner thread; object live.
pub(crate) unsafe fn owner_hit_zero(c: *const BiasedCount) -> bool {
    // SAFETY: forwarded.
    let free = unsafe { (*c).owner_zero() };
    merge_pending();
    free
}

/// A non-owner took the unmerged count of `c` below zero and won QUEUED:
/// queue it to its owner, or merge it here if the owner has ended.
///
/// # Safety
/// Object live (its owner-counted references keep it so).
pub(crate) unsafe fn queue(c: *const BiasedCount) {
    // SAFETY: live.
    let owner = unsafe { (*c).owner() };
    let reg = lock(owners());
    if let Some(slot) = reg.get(&owner) {
        lock(&slot.items).push(c as usize);
        // Release: pairs with the Acquire load in `owner_id`/`merge_pending`.
        slot.pending.store(true, Ordering::Release);
        return;
    }
    drop(reg);
    // The owner's thread has ended (it left the registry before we looked,
    // under the lock we just held, so its writes are visible): merge here.
    // SAFETY: we won the QUEUED flag, the owner is gone.
    unsafe { merge_queued(c) };
}
