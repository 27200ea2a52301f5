//! Loom models of Canopy's lock-free protocols.  Run with
//! `RUSTFLAGS="--cfg canopy_loom" cargo test -p canopy-sync --test loom --release`
//! (see `ci/loom.sh`).
#![cfg(canopy_loom)]

use canopy_sync::prim::Ordering;
use canopy_sync::{MpscQueue, Node, RawLock};
use loom::sync::Arc;

fn node() -> *mut Node {
    Box::into_raw(Box::new(Node::new()))
}

/// Two producers push a chain of two and a single node while the consumer
/// drains: every node comes out exactly once, a producer's chain in order.
#[test]
fn mpsc_two_producers_one_consumer() {
    loom::model(|| {
        let q = Arc::new(MpscQueue::new());
        // SAFETY: not shared yet.
        unsafe { q.init() };
        let a1 = node();
        let a2 = node();
        let b1 = node();
        let (a1u, a2u, b1u) = (a1 as usize, a2 as usize, b1 as usize);
        let qa = q.clone();
        let ta = loom::thread::spawn(move || {
            let (a1, a2) = (a1u as *mut Node, a2u as *mut Node);
            // SAFETY: fresh nodes owned by this thread until pushed.
            unsafe {
                (*a1).next.store(a2, Ordering::Relaxed);
                qa.push_chain(a1, a2);
            }
        });
        let qb = q.clone();
        let tb = loom::thread::spawn(move || {
            // SAFETY: fresh node owned by this thread until pushed.
            unsafe { qb.push(b1u as *mut Node) };
        });
        let mut got = Vec::new();
        // Consume concurrently with the producers for a bounded number of tries.
        for _ in 0..3 {
            // SAFETY: this thread is the only consumer.
            let n = unsafe { q.pop() };
            if !n.is_null() {
                got.push(n as usize);
            }
            loom::thread::yield_now();
        }
        ta.join().unwrap();
        tb.join().unwrap();
        loop {
            // SAFETY: only consumer.
            let n = unsafe { q.pop() };
            if n.is_null() {
                break;
            }
            got.push(n as usize);
        }
        assert_eq!(got.len(), 3, "every node popped exactly once: {got:?}");
        let pa1 = got.iter().position(|&x| x == a1u).unwrap();
        let pa2 = got.iter().position(|&x| x == a2u).unwrap();
        assert!(pa1 < pa2, "a chain keeps its order");
        assert!(got.contains(&b1u));
        for p in got {
            // SAFETY: each node came from Box::into_raw and is popped once.
            drop(unsafe { Box::from_raw(p as *mut Node) });
        }
    });
}

/// The raw lock gives mutual exclusion between two threads.
#[test]
fn raw_lock_mutual_exclusion() {
    loom::model(|| {
        let lock = Arc::new(RawLock::new());
        let counter = Arc::new(loom::sync::atomic::AtomicUsize::new(0));
        let ths: Vec<_> = (0..2)
            .map(|_| {
                let lock = lock.clone();
                let counter = counter.clone();
                loom::thread::spawn(move || {
                    lock.lock();
                    // A non-atomic read-modify-write made of two atomic steps:
                    // only safe under the lock.
                    let v = counter.load(Ordering::Relaxed);
                    counter.store(v + 1, Ordering::Relaxed);
                    lock.unlock();
                })
            })
            .collect();
        for t in ths {
            t.join().unwrap();
        }
        assert_eq!(counter.load(Ordering::Relaxed), 2);
    });
}
