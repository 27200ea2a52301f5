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

/// A counter guarded by a `SoloLock`, for the solo models.  The counter is
/// a loom `UnsafeCell`, so overlapping critical sections are reported.
struct Shared {
    lock: canopy_sync::SoloLock,
    count: loom::cell::UnsafeCell<usize>,
}
// SAFETY: `count` is only touched inside the lock's critical sections.
unsafe impl Sync for Shared {}

impl Shared {
    fn new() -> Arc<Shared> {
        Arc::new(Shared { lock: canopy_sync::SoloLock::new(), count: loom::cell::UnsafeCell::new(0) })
    }
    /// One critical section as thread `me`; `alone` as for `SoloLock::unlock`.
    fn enter(&self, me: usize, alone: Option<usize>) -> bool {
        let locked = self.lock.lock(me);
        // SAFETY: inside the critical section.
        self.count.with_mut(|c| unsafe { *c += 1 });
        self.lock.unlock(locked, alone);
        locked
    }
    fn count(&self) -> usize {
        // SAFETY: every other thread has been joined.
        self.count.with(|c| unsafe { *c })
    }
}

/// The solo hand-off: the solo thread enters twice without the lock while a
/// second thread enters once with it.  The shared counter is a loom
/// `UnsafeCell`, so any overlap of the two critical sections is a reported
/// data race.  (The kernel's membarrier is modelled as a SeqCst fence on both
/// sides.)
#[test]
fn solo_lock_hand_off() {
    loom::model(|| {
        let s = Shared::new();
        assert!(s.lock.enable(1));
        let s2 = s.clone();
        let other = loom::thread::spawn(move || {
            assert!(s2.enter(2, None), "a thread that is not solo always takes the lock");
        });
        for _ in 0..2 {
            s.enter(1, None);
        }
        other.join().unwrap();
        assert_eq!(s.count(), 3);
        assert!(!s.lock.solo_active(), "the second thread ended the solo period");
    });
}

/// A new solo period begun under the lock is ended safely by a late thread.
#[test]
fn solo_lock_new_period() {
    loom::model(|| {
        let s = Shared::new();
        // Solo periods allowed (the first solo thread, 9, never runs); thread
        // 1 takes the lock and begins a period as it leaves.
        assert!(s.lock.enable(9));
        let s2 = s.clone();
        let late = loom::thread::spawn(move || {
            s2.enter(2, None);
        });
        s.enter(1, Some(1));
        s.enter(1, None);
        late.join().unwrap();
        assert_eq!(s.count(), 3);
    });
}

/// A large chunk as `canopy_sync::claim` sees it: the claim word (the head
/// descriptor's `owner`) and the state (its kind, a plain byte in the
/// allocator, read without ordering: a relaxed atomic here).
struct Chunk {
    word: loom::sync::atomic::AtomicUsize,
    state: loom::sync::atomic::AtomicU8,
    wins: loom::sync::atomic::AtomicUsize,
    /// Set (release) once a free has given the chunk back: the global
    /// heap's lock, which orders a reuse of the memory after it.
    released: loom::sync::atomic::AtomicBool,
}

const LIVE_STATE: u8 = 1;
const CACHED: u8 = 2;
const FREE: u8 = 3;
const LIVE: usize = 2;
const CLAIMED: usize = 1;

impl Chunk {
    fn new() -> Arc<Chunk> {
        let c = Chunk {
            word: loom::sync::atomic::AtomicUsize::new(0),
            state: loom::sync::atomic::AtomicU8::new(LIVE_STATE),
            wins: loom::sync::atomic::AtomicUsize::new(0),
            released: loom::sync::atomic::AtomicBool::new(false),
        };
        canopy_sync::claim::publish(&c.word, LIVE);
        Arc::new(c)
    }

    /// One free, as `canopy_alloc`'s `free_large`: into a cache (the chunk
    /// stays claimed) or back to the global heap (the word is cleared with
    /// the span's other marks).  Returns whether it won.
    fn free(&self, cache: bool) -> bool {
        if !canopy_sync::claim::claim(&self.word, LIVE, CLAIMED) {
            return false; // refused: a double free
        }
        assert_eq!(self.state.load(Ordering::Relaxed), LIVE_STATE, "the winner sees the live chunk");
        self.wins.fetch_add(1, Ordering::Relaxed);
        if cache {
            self.state.store(CACHED, Ordering::Relaxed);
        } else {
            self.state.store(FREE, Ordering::Relaxed);
            self.word.store(0, Ordering::Relaxed);
            self.released.store(true, Ordering::Release);
        }
        true
    }
}

/// Two frees of one chunk race while a third thread takes the memory over
/// once it is free (as the global heap hands a freed span out again) and
/// writes its own value into the word, `new_word` (a slab owner's thread
/// id, or 0).  Exactly one free wins, and a late loser writes nothing.
fn racing_frees_then_reuse(new_word: usize) {
    loom::model(move || {
        let c = Chunk::new();
        let frees: Vec<_> = (0..2)
            .map(|_| {
                let c = c.clone();
                loom::thread::spawn(move || c.free(false))
            })
            .collect();
        let c2 = c.clone();
        let reuser = loom::thread::spawn(move || {
            while !c2.released.load(Ordering::Acquire) {
                loom::thread::yield_now();
            }
            c2.word.store(new_word, Ordering::Relaxed);
        });
        let won: Vec<bool> = frees.into_iter().map(|t| t.join().unwrap()).collect();
        reuser.join().unwrap();
        assert_eq!(won.iter().filter(|&&w| w).count(), 1, "exactly one free wins");
        assert_eq!(c.wins.load(Ordering::Relaxed), 1);
        assert_eq!(c.word.load(Ordering::Relaxed), new_word, "the new owner's word stays");
    });
}

#[test]
fn large_free_claim_one_winner_then_reuse_by_a_slab_owner() {
    racing_frees_then_reuse(77);
}

#[test]
fn large_free_claim_one_winner_then_reuse_with_no_owner() {
    racing_frees_then_reuse(0);
}

/// Two frees of one chunk race, one into its thread's cache and one to the
/// global heap: exactly one wins, and a cached chunk stays claimed.  Its
/// owner then hands it out again (publishes it) while another thread frees
/// it (the program's free of the new allocation): that free wins and sees
/// the state written before the publish.
#[test]
fn large_free_claim_cache_and_hand_out_again() {
    loom::model(|| {
        let c = Chunk::new();
        let ths: Vec<_> = [true, false]
            .into_iter()
            .map(|cache| {
                let c = c.clone();
                loom::thread::spawn(move || c.free(cache))
            })
            .collect();
        let won: Vec<bool> = ths.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(won.iter().filter(|&&w| w).count(), 1, "exactly one free wins");
        if c.state.load(Ordering::Relaxed) == CACHED {
            assert_eq!(c.word.load(Ordering::Relaxed), CLAIMED, "a cached chunk stays claimed");
            let c3 = c.clone();
            let freer = loom::thread::spawn(move || {
                while !c3.free(false) {
                    loom::thread::yield_now();
                }
            });
            c.state.store(LIVE_STATE, Ordering::Relaxed);
            canopy_sync::claim::publish(&c.word, LIVE);
            freer.join().unwrap();
            assert_eq!(c.wins.load(Ordering::Relaxed), 2);
            assert_eq!(c.state.load(Ordering::Relaxed), FREE);
        } else {
            assert_eq!(c.state.load(Ordering::Relaxed), FREE);
        }
    });
}
