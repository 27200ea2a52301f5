//! Loom models of the delegated counting protocol (`delegate.rs`,
//! `ring.rs`).  Run by `scripts/loom.sh`:
//! `RUSTFLAGS="--cfg canopy_loom" cargo test --release -p canopy-rc --test loom`.
//! Under loom a lane holds 4 words and decrements are published every 2,
//! so back-pressure and partial publication are explored too.
#![cfg(canopy_loom)]

use canopy_rc::delegate::{DCount, Domain, Sender};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;

/// The models' search: `LOOM_MAX_PREEMPTIONS` (scripts/loom.sh sets 3),
/// capped at 2 unless `CANOPY_RC_LOOM_DEEP=1`: at 3 these models take many
/// minutes on two cores, beyond the CI budget.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if std::env::var_os("CANOPY_RC_LOOM_DEEP").is_none() {
        b.preemption_bound = Some(b.preemption_bound.unwrap_or(2).min(2));
    }
    b.check(f);
}

/// A counted object: the count first (as in an array's descriptor), then
/// data that holders read and a unique holder may write.
#[repr(C)]
struct Obj {
    count: DCount,
    data: UnsafeCell<u32>,
    freed: AtomicUsize,
    /// True while the second thread still holds its reference.
    t1_holds: AtomicBool,
}

unsafe fn release(p: *const u8) {
    // SAFETY: p is an Obj (count is its first field); the model frees the
    // memory itself after checking `freed`.
    unsafe { (*(p as *const Obj)).freed.fetch_add(1, Ordering::Relaxed) };
}

fn new_obj() -> *mut Obj {
    Box::into_raw(Box::new(Obj {
        count: DCount::new(release),
        data: UnsafeCell::new(0),
        freed: AtomicUsize::new(0),
        t1_holds: AtomicBool::new(true),
    }))
}

/// Spawn the counting thread: drains until told to stop, then once more.
fn counter(d: &Arc<Domain>, stop: &Arc<AtomicBool>) -> loom::thread::JoinHandle<()> {
    let (d, stop) = (d.clone(), stop.clone());
    loom::thread::spawn(move || {
        let c = d.counters[0].clone();
        loop {
            let stop = stop.load(Ordering::Acquire);
            // SAFETY: this is counter 0's only drainer.
            unsafe { c.drain() };
            if stop {
                break;
            }
            loom::thread::yield_now();
        }
    })
}

/// Thread 0 creates an object and gives a reference to thread 1, then asks
/// `getrc` and writes the data in place if it answers 1.  Thread 1 reads the
/// data and drops its reference.  Checked: `getrc` never answers 1 while
/// thread 1 holds its reference (and the in-place write never races with
/// thread 1's read: loom checks the cell), the answer is never below 1, and
/// the object is released exactly once, after both references are gone.
#[test]
fn getrc_never_reports_unique_while_shared() {
    model(|| {
        let d = Arc::new(Domain::new(1));
        let stop = Arc::new(AtomicBool::new(false));
        let o = new_obj();
        let ou = o as usize;
        let mut s0 = Sender::new(d.clone(), true);
        let mut s1 = Sender::new(d.clone(), true);
        let ct = counter(&d, &stop);
        // SAFETY (both threads): the object lives until the model frees it.
        s0.inc(o as *const DCount); // the reference handed to thread 1
        let t1 = loom::thread::spawn(move || {
            let o = ou as *const Obj;
            let v = unsafe { (*o).data.with(|p| *p) };
            assert!(v == 0, "thread 1 reads the original data");
            unsafe { (*o).t1_holds.store(false, Ordering::Relaxed) };
            s1.dec(o as *const DCount);
            drop(s1); // flushes
        });
        let n = s0.getrc(o as *const DCount);
        assert!(n >= 1, "getrc under-reports: {n}");
        if n == 1 {
            // SAFETY: getrc said unique.
            unsafe {
                assert!(
                    !(*o).t1_holds.load(Ordering::Relaxed),
                    "getrc said 1 while thread 1 holds a reference"
                );
                (*o).data.with_mut(|p| *p = 1);
            }
        }
        unsafe {
            assert_eq!(
                (*o).freed.load(Ordering::Relaxed),
                0,
                "freed while referenced"
            )
        };
        s0.dec(o as *const DCount);
        drop(s0);
        t1.join().unwrap();
        stop.store(true, Ordering::Release);
        ct.join().unwrap();
        // SAFETY: every thread is done with the object.
        unsafe {
            assert_eq!(
                (*o).freed.load(Ordering::Relaxed),
                1,
                "released exactly once"
            );
            drop(Box::from_raw(o));
        }
    });
}

/// The case that pending increments make delicate: thread 0 holds the
/// original reference, clones it (the increment stays pending in its lane),
/// hands the clone to thread 1 and then reads the data and drops its
/// original, which cancels the pending increment (nothing is sent).  Thread
/// 1 asks `getrc` and writes in place if it answers 1, then drops.  Checked:
/// `getrc` never answers 1 while thread 0 holds its reference (and loom's
/// cell check: the in-place write never races with thread 0's read), the
/// object is not freed while referenced, and it is released exactly once
/// (from the counter's zero list, since the last decrement may arrive while
/// the increment that balances it is still pending).
#[test]
fn getrc_by_receiver_while_giver_increment_pending() {
    model(|| {
        let d = Arc::new(Domain::new(1));
        let stop = Arc::new(AtomicBool::new(false));
        let o = new_obj();
        let ou = o as usize;
        let mut s0 = Sender::new(d.clone(), true);
        let mut s1 = Sender::new(d.clone(), true);
        let t0_holds = Arc::new(AtomicBool::new(true));
        let ct = counter(&d, &stop);
        s0.inc(o as *const DCount); // the clone handed to thread 1: pending
        let h = t0_holds.clone();
        let t1 = loom::thread::spawn(move || {
            let o = ou as *const Obj;
            // SAFETY: thread 1 holds a reference until its `dec`.
            let n = s1.getrc(o as *const DCount);
            assert!(n >= 1, "getrc under-reports: {n}");
            if n == 1 {
                assert!(
                    !h.load(Ordering::Relaxed),
                    "getrc said 1 while thread 0 holds a reference"
                );
                unsafe { (*o).data.with_mut(|p| *p = 1) };
            }
            unsafe {
                assert_eq!(
                    (*o).freed.load(Ordering::Relaxed),
                    0,
                    "freed while referenced"
                )
            };
            s1.dec(o as *const DCount);
            drop(s1);
        });
        // SAFETY: thread 0 holds its original reference until its `dec`.
        let v = unsafe { (*o).data.with(|p| *p) };
        assert_eq!(v, 0, "thread 0 reads the original data");
        unsafe {
            assert_eq!(
                (*o).freed.load(Ordering::Relaxed),
                0,
                "freed while referenced"
            )
        };
        t0_holds.store(false, Ordering::Relaxed);
        s0.dec(o as *const DCount); // cancels the pending increment
        drop(s0);
        t1.join().unwrap();
        stop.store(true, Ordering::Release);
        ct.join().unwrap();
        // SAFETY: every thread is done with the object.
        unsafe {
            assert_eq!(
                (*o).freed.load(Ordering::Relaxed),
                1,
                "released exactly once"
            );
            drop(Box::from_raw(o));
        }
    });
}

/// A reference handed on while the giver's increment is pending and dropped
/// by the receiver at once: the receiver's decrement may be applied before
/// the giver's increment is sent, but the object must not be freed while the
/// giver still holds its original; thread 0 then clones again (evicting),
/// and both references end.  Released exactly once.
#[test]
fn receiver_drop_before_giver_increment_arrives() {
    model(|| {
        let d = Arc::new(Domain::new(1));
        let stop = Arc::new(AtomicBool::new(false));
        let o = new_obj();
        let ou = o as usize;
        let mut s0 = Sender::new(d.clone(), true);
        let mut s1 = Sender::new(d.clone(), true);
        let ct = counter(&d, &stop);
        s0.inc(o as *const DCount); // pending
        let t1 = loom::thread::spawn(move || {
            s1.dec(ou as *const DCount);
            s1.flush();
            drop(s1);
        });
        // Thread 0 still holds the original: never freed meanwhile.
        loom::thread::yield_now();
        // SAFETY: thread 0 holds a reference.
        unsafe {
            assert_eq!(
                (*o).freed.load(Ordering::Relaxed),
                0,
                "freed while referenced"
            );
        }
        s0.inc(o as *const DCount); // evicts the first increment
        s0.dec(o as *const DCount); // cancels the second
        unsafe {
            assert_eq!(
                (*o).freed.load(Ordering::Relaxed),
                0,
                "freed while referenced"
            );
        }
        s0.dec(o as *const DCount); // the original
        drop(s0);
        t1.join().unwrap();
        stop.store(true, Ordering::Release);
        ct.join().unwrap();
        // SAFETY: every thread is done with the object.
        unsafe {
            assert_eq!(
                (*o).freed.load(Ordering::Relaxed),
                1,
                "released exactly once"
            );
            drop(Box::from_raw(o));
        }
    });
}

/// One sender issues more operations than its lane holds (4 words) while the counter drains: no deadlock, the
/// operations apply in order (the count never touches zero early), and the
/// final decrement releases the object once.
#[test]
fn back_pressure_keeps_order() {
    model(|| {
        let d = Arc::new(Domain::new(1));
        let stop = Arc::new(AtomicBool::new(false));
        let o = new_obj();
        let mut s = Sender::new(d.clone(), true);
        let ct = counter(&d, &stop);
        for _ in 0..3 {
            s.inc(o as *const DCount);
        }
        for _ in 0..3 {
            s.dec(o as *const DCount);
        }
        assert_eq!(
            s.getrc(o as *const DCount),
            1,
            "own operations applied in order before the query"
        );
        s.dec(o as *const DCount);
        drop(s);
        stop.store(true, Ordering::Release);
        ct.join().unwrap();
        // SAFETY: all threads done.
        unsafe {
            assert_eq!((*o).freed.load(Ordering::Relaxed), 1);
            drop(Box::from_raw(o));
        }
    });
}

// ---------------------------------------------------------------------------
// Biased counting (`biased_core.rs`): the owner counts in a plain field,
// others atomically; the owner's queue is modelled by a mutex-protected list
// (in the library, `biased.rs`), the owner's thread stays alive.
// ---------------------------------------------------------------------------

use canopy_rc::biased_core::{BiasedCount, Dec};
use loom::sync::Mutex;

#[repr(C)]
struct BObj {
    count: BiasedCount,
    data: UnsafeCell<u32>,
    freed: AtomicUsize,
}

/// A fresh object owned by `OWNER`, with no reference counted yet; the
/// model frees it.
fn new_bobj() -> *mut BObj {
    Box::into_raw(Box::new(BObj { count: BiasedCount::new(brelease, OWNER), data: UnsafeCell::new(0), freed: AtomicUsize::new(0) }))
}

unsafe fn brelease(p: *const u8) {
    // SAFETY: p is a BObj (count first); the model frees the memory.
    unsafe { (*(p as *const BObj)).freed.fetch_add(1, Ordering::Relaxed) };
}

const OWNER: u64 = 1;

/// A non-owner's decrement: release, or queue to the owner.
fn bdec_other(o: *const BObj, me: u64, queue: &Mutex<Vec<usize>>) {
    // SAFETY: the caller holds a reference it gives up here.
    match unsafe { (*o).count.dec(me) } {
        Dec::Keep => {}
        Dec::Free => unsafe { brelease(o as *const u8) },
        Dec::Queue => queue.lock().unwrap().push(o as usize),
        d => panic!("non-owner got {d:?}"),
    }
}

/// The owner's decrement, including its poll of the queue.
fn bdec_owner(o: *const BObj, queue: &Mutex<Vec<usize>>) {
    // SAFETY: owner thread, holds a reference.
    match unsafe { (*o).count.dec(OWNER) } {
        Dec::Keep => {}
        Dec::Free => unsafe { brelease(o as *const u8) },
        Dec::OwnerAlive => bmerge_queue(queue),
        Dec::OwnerZero => {
            // SAFETY: owner thread.
            if unsafe { (*o).count.owner_zero() } {
                unsafe { brelease(o as *const u8) };
            }
            bmerge_queue(queue);
        }
        Dec::Queue => panic!("the owner never queues"),
    }
}

/// The owner processes its queue.
fn bmerge_queue(queue: &Mutex<Vec<usize>>) {
    let items = core::mem::take(&mut *queue.lock().unwrap());
    for o in items {
        let o = o as *const BObj;
        // SAFETY: queued objects stay alive until merged from the queue.
        if unsafe { (*o).count.merge(true) } {
            unsafe { brelease(o as *const u8) };
        }
    }
}

/// The owner creates an object and hands a reference (counted in its plain
/// field) to a non-owner, which reads the data and drops it (the unmerged
/// count goes negative: queued).  Meanwhile the owner asks `getrc` and writes
/// in place if it says 1, then drops its own reference.  Checked: no answer
/// of 1 while the other thread holds its reference (and loom's cell check on
/// the in-place write), never freed while referenced, released exactly once.
#[test]
fn biased_owner_and_other() {
    model(|| {
        let o = new_bobj();
        let ou = o as usize;
        let queue = Arc::new(Mutex::new(Vec::new()));
        let holds = Arc::new(AtomicBool::new(true));
        // SAFETY (both threads): the object lives until the model frees it.
        unsafe { (*o).count.inc(OWNER) };
        let (q, h) = (queue.clone(), holds.clone());
        let t1 = loom::thread::spawn(move || {
            let o = ou as *const BObj;
            assert!(unsafe { (*o).count.getrc(2) } >= 2, "non-owner sees shared");
            let v = unsafe { (*o).data.with(|p| *p) };
            assert_eq!(v, 0);
            h.store(false, Ordering::Relaxed);
            bdec_other(o, 2, &q);
        });
        let n = unsafe { (*o).count.getrc(OWNER) };
        if n == 1 {
            assert!(!holds.load(Ordering::Relaxed), "getrc said 1 while shared");
            unsafe { (*o).data.with_mut(|p| *p = 1) };
        }
        assert_eq!(unsafe { (*o).freed.load(Ordering::Relaxed) }, 0);
        bdec_owner(o, &queue);
        t1.join().unwrap();
        bmerge_queue(&queue); // the owner's thread end
        unsafe {
            assert_eq!(
                (*o).freed.load(Ordering::Relaxed),
                1,
                "released exactly once"
            );
            drop(Box::from_raw(o));
        }
    });
}

/// Two non-owners each drop a reference the owner counted (both race to
/// take the count negative and to queue it) while the owner merges its
/// queue and drops its own: `getrc` on a non-owner never says 1 while the
/// owner still holds its reference, released exactly once, never early.
#[test]
fn biased_two_others_queue_once() {
    model(|| {
        let o = new_bobj();
        let ou = o as usize;
        let queue = Arc::new(Mutex::new(Vec::new()));
        let owner_holds = Arc::new(AtomicBool::new(true));
        unsafe {
            (*o).count.inc(OWNER);
            (*o).count.inc(OWNER);
        }
        let ts: Vec<_> = (2..4u64)
            .map(|me| {
                let (q, h) = (queue.clone(), owner_holds.clone());
                loom::thread::spawn(move || {
                    let o = ou as *const BObj;
                    let c = unsafe { (*o).count.getrc(me) };
                    assert!(c >= 1, "getrc under-reports: {c}");
                    if c == 1 {
                        assert!(
                            !h.load(Ordering::Relaxed),
                            "a non-owner saw 1 while the owner holds one"
                        );
                    }
                    bdec_other(o, me, &q);
                })
            })
            .collect();
        bmerge_queue(&queue);
        assert_eq!(
            unsafe { (*o).freed.load(Ordering::Relaxed) },
            0,
            "freed early"
        );
        owner_holds.store(false, Ordering::Relaxed);
        bdec_owner(o, &queue);
        for t in ts {
            t.join().unwrap();
        }
        bmerge_queue(&queue);
        unsafe {
            assert_eq!(
                (*o).freed.load(Ordering::Relaxed),
                1,
                "released exactly once"
            );
            drop(Box::from_raw(o));
        }
    });
}

/// A non-owner's decrement as `biased.rs` makes it: on `Queue`, push to the
/// owner's queue if the owner is still registered, else merge here.
fn bdec_registry(o: *const BObj, me: u64, registered: &Mutex<bool>, queue: &Mutex<Vec<usize>>) {
    // SAFETY: the caller holds a reference it gives up here.
    match unsafe { (*o).count.dec(me) } {
        Dec::Keep => {}
        Dec::Free => unsafe { brelease(o as *const u8) },
        Dec::Queue => {
            let reg = registered.lock().unwrap();
            if *reg {
                queue.lock().unwrap().push(o as usize);
                return;
            }
            drop(reg);
            // SAFETY: we won QUEUED and the owner has left the registry
            // (under the lock we just held).
            if unsafe { (*o).count.merge(true) } {
                unsafe { brelease(o as *const u8) };
            }
        }
        d => panic!("non-owner got {d:?}"),
    }
}

/// The owner's thread ends while it still holds a reference: it leaves the
/// registry, merges its queue, and then (in a later thread-local
/// destructor) drops the reference, with a fresh id as `biased.rs` gives it
/// there, while another thread drops the reference the owner handed it.
/// Whoever takes the count below zero after the owner left merges the
/// object itself.  Checked: released exactly once, never early, and loom's
/// cell check that no two threads touch the owner's plain fields at once
/// (with that last drop made as the owner's, `bdec_owner`, which is what the
/// code did before the fix, this model fails that check).
#[test]
fn biased_drop_during_owner_teardown() {
    model(|| {
        let o = new_bobj();
        let ou = o as usize;
        let queue = Arc::new(Mutex::new(Vec::new()));
        let registered = Arc::new(Mutex::new(true));
        // SAFETY (both threads): the object lives until the model frees it.
        unsafe { (*o).count.inc(OWNER) };
        let (q, r) = (queue.clone(), registered.clone());
        let t1 = loom::thread::spawn(move || bdec_registry(ou as *const BObj, 2, &r, &q));
        // The owner's guard: leave the registry, then merge the queue.
        *registered.lock().unwrap() = false;
        bmerge_queue(&queue);
        // A later destructor on the ending thread drops its reference.
        bdec_registry(o, 9, &registered, &queue);
        t1.join().unwrap();
        unsafe {
            assert_eq!(
                (*o).freed.load(Ordering::Relaxed),
                1,
                "released exactly once"
            );
            drop(Box::from_raw(o));
        }
    });
}

/// A thread whose sender is created while a round of the counting thread is
/// already under way: thread 1 holds the original reference, creates its
/// sender (registering its lane), clones (the increment stays pending in the
/// new lane) and hands the clone to thread 2, which asks `getrc`.  The round
/// that answers may have picked up its lanes before thread 1's registered;
/// its check must still see thread 1's pending increment, so `getrc` never
/// answers 1 while thread 1 holds its original.  Released exactly once.
#[test]
fn getrc_sees_pending_increment_of_a_lane_registered_mid_round() {
    model(|| {
        let d = Arc::new(Domain::new(1));
        let stop = Arc::new(AtomicBool::new(false));
        let o = new_obj();
        let ou = o as usize;
        let s2 = Sender::new(d.clone(), true);
        let ct = counter(&d, &stop);
        let d1 = d.clone();
        let t1 = loom::thread::spawn(move || {
            let o = ou as *const Obj;
            let mut s1 = Sender::new(d1, true);
            s1.inc(o as *const DCount); // the clone handed to thread 2: pending
            let t2 = loom::thread::spawn(move || {
                let mut s2 = s2;
                let o = ou as *const Obj;
                // SAFETY: thread 2 holds the clone until its `dec`.
                let n = s2.getrc(o as *const DCount);
                assert!(n >= 1, "getrc under-reports: {n}");
                if n == 1 {
                    unsafe {
                        assert!(
                            !(*o).t1_holds.load(Ordering::Relaxed),
                            "getrc said 1 while thread 1 holds a reference"
                        );
                        (*o).data.with_mut(|p| *p = 1);
                    }
                }
                s2.dec(o as *const DCount);
                drop(s2);
            });
            // SAFETY: thread 1 holds its original until its `dec`.
            let v = unsafe { (*o).data.with(|p| *p) };
            assert_eq!(v, 0, "thread 1 reads the original data");
            unsafe { (*o).t1_holds.store(false, Ordering::Relaxed) };
            s1.dec(o as *const DCount); // the original (cancels the pending increment)
            drop(s1);
            t2.join().unwrap();
        });
        t1.join().unwrap();
        stop.store(true, Ordering::Release);
        ct.join().unwrap();
        // SAFETY: every thread is done with the object.
        unsafe {
            assert_eq!(
                (*o).freed.load(Ordering::Relaxed),
                1,
                "released exactly once"
            );
            drop(Box::from_raw(o));
        }
    });
}
