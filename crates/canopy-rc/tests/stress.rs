//! Stress test: millions of clone/drop/getrc operations across threads on
//! the shared policies; every array is freed exactly once, and `getrc`
//! never says 1 while another reference is known to be alive.
//! Not a benchmark.  `CANOPY_STRESS_SCALE` multiplies the work (default 1:
//! about two million count operations per policy; CI runs the default).
#![cfg(not(canopy_loom))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use canopy_rc::{delegated, Array, Atomic, Biased, Delegated, Policy};

fn scale() -> usize {
    std::env::var("CANOPY_STRESS_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1)
}

/// Counts its array's frees (the check after the run wants exactly one).
struct Tracker {
    id: usize,
    freed: Arc<Vec<AtomicUsize>>,
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.freed[self.id].fetch_add(1, Ordering::SeqCst);
    }
}

/// A tiny xorshift, seeded per thread.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

fn stress<P: Policy>()
where
    Array<Tracker, P>: Send + Sync,
{
    const THREADS: usize = 3;
    const ARRAYS: usize = 32;
    let rounds = 48 * scale();
    let ops = 12_000;
    let total = ARRAYS * rounds;
    let freed = Arc::new((0..total).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
    let false_unique = AtomicUsize::new(0);
    for round in 0..rounds {
        // The creating thread keeps its references for the whole round, so
        // every worker's getrc must say at least 2.
        let originals: Vec<Array<Tracker, P>> = (0..ARRAYS)
            .map(|i| {
                Array::from_fn(&[1], |_| Tracker {
                    id: round * ARRAYS + i,
                    freed: freed.clone(),
                })
            })
            .collect();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let held: Vec<Vec<Array<Tracker, P>>> =
                    originals.iter().map(|a| vec![a.clone()]).collect();
                let false_unique = &false_unique;
                s.spawn(move || {
                    let mut held = held;
                    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((round * THREADS + t) as u64 + 1));
                    for _ in 0..ops {
                        let i = rng.below(ARRAYS);
                        match rng.below(64) {
                            0 => {
                                let n = held[i][0].getrc();
                                if n < 2 {
                                    false_unique.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            1..=32 => {
                                let c = held[i][0].clone();
                                held[i].push(c);
                            }
                            _ => {
                                if held[i].len() > 1 {
                                    held[i].pop();
                                }
                            }
                        }
                    }
                    drop(held);
                    delegated::flush();
                });
            }
        });
        drop(originals);
        delegated::flush();
        canopy_rc::biased::merge_pending();
    }
    assert_eq!(
        false_unique.load(Ordering::Relaxed),
        0,
        "{}: getrc said 1 while another reference lived",
        P::NAME
    );
    // Delegated frees happen on the counting threads, soon after.
    let mut waited = 0u64;
    loop {
        let done = freed
            .iter()
            .filter(|f| f.load(Ordering::SeqCst) >= 1)
            .count();
        if done == total {
            break;
        }
        waited += 1;
        assert!(
            waited < 20_000,
            "{}: only {done} of {total} arrays freed",
            P::NAME
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    let twice = freed
        .iter()
        .filter(|f| f.load(Ordering::SeqCst) > 1)
        .count();
    assert_eq!(twice, 0, "{}: {twice} arrays freed more than once", P::NAME);
}

#[test]
fn stress_atomic() {
    stress::<Atomic>();
}

#[test]
fn stress_biased() {
    stress::<Biased>();
}

#[test]
fn stress_delegated() {
    stress::<Delegated>();
}

enum Msg {
    Item(Array<Tracker, Delegated>),
    Ack,
    Done,
}

/// References handed between threads while the giver's increment is still
/// pending (delegated counting keeps a thread's last increment unsent): a
/// thread clones an array, sends the clone to its peer and keeps its own
/// reference until the peer acknowledges; the peer asks `getrc`, which must
/// say at least 2, then keeps or drops the clone.  Threads also drop their
/// own references at random (the drop of the array whose increment is
/// pending cancels it).  Every array freed exactly once.
#[test]
fn stress_delegated_handoff() {
    const ARRAYS: usize = 16;
    let rounds = 24 * scale();
    let ops = 6_000;
    let total = ARRAYS * rounds;
    let freed = Arc::new((0..total).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
    let false_unique = AtomicUsize::new(0);
    for round in 0..rounds {
        let arrays: Vec<Array<Tracker, Delegated>> = (0..ARRAYS)
            .map(|i| {
                Array::from_fn(&[1], |_| Tracker {
                    id: round * ARRAYS + i,
                    freed: freed.clone(),
                })
            })
            .collect();
        let mine: [Vec<Vec<Array<Tracker, Delegated>>>; 2] = [
            arrays.iter().map(|a| vec![a.clone()]).collect(),
            arrays.into_iter().map(|a| vec![a]).collect(),
        ];
        // This thread's last clone is still pending (it would keep its array
        // alive until this thread's next count operation): send it.
        delegated::flush();
        let (tx0, rx1) = std::sync::mpsc::channel::<Msg>();
        let (tx1, rx0) = std::sync::mpsc::channel::<Msg>();
        std::thread::scope(|s| {
            for (t, (held, (tx, rx))) in mine.into_iter().zip([(tx0, rx0), (tx1, rx1)]).enumerate()
            {
                let false_unique = &false_unique;
                s.spawn(move || {
                    let mut held = held;
                    let mut peer_done = false;
                    let mut rng = Rng(0xD1B5_4A32_D192_ED03 ^ ((round * 2 + t) as u64 + 1));
                    for _ in 0..ops {
                        let i = rng.below(ARRAYS);
                        if held[i].is_empty() {
                            continue;
                        }
                        let c = held[i][0].clone();
                        tx.send(Msg::Item(c)).unwrap();
                        // Our reference held[i][0] lives until the ack.
                        loop {
                            match rx.recv().unwrap() {
                                Msg::Ack => break,
                                Msg::Done => peer_done = true,
                                Msg::Item(c) => {
                                    if c.getrc() < 2 {
                                        false_unique.fetch_add(1, Ordering::Relaxed);
                                    }
                                    let j = c.as_slice()[0].id % ARRAYS;
                                    tx.send(Msg::Ack).unwrap();
                                    if rng.below(2) == 0 {
                                        held[j].push(c);
                                    }
                                }
                            }
                        }
                        match rng.below(8) {
                            0 => {
                                held[i].pop();
                            }
                            1 => delegated::flush(),
                            _ => {}
                        }
                    }
                    // Serve the peer's last requests, then finish.
                    tx.send(Msg::Done).unwrap();
                    while !peer_done {
                        match rx.recv().unwrap() {
                            Msg::Item(c) => {
                                if c.getrc() < 2 {
                                    false_unique.fetch_add(1, Ordering::Relaxed);
                                }
                                tx.send(Msg::Ack).unwrap();
                                drop(c);
                            }
                            Msg::Done => peer_done = true,
                            Msg::Ack => unreachable!("no request outstanding"),
                        }
                    }
                    drop(held);
                    delegated::flush();
                });
            }
        });
    }
    assert_eq!(
        false_unique.load(Ordering::Relaxed),
        0,
        "getrc said 1 while the giver held a reference"
    );
    let mut waited = 0u64;
    loop {
        let done = freed
            .iter()
            .filter(|f| f.load(Ordering::SeqCst) >= 1)
            .count();
        if done == total {
            break;
        }
        waited += 1;
        assert!(waited < 20_000, "only {done} of {total} arrays freed");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    let twice = freed
        .iter()
        .filter(|f| f.load(Ordering::SeqCst) > 1)
        .count();
    assert_eq!(twice, 0, "{twice} arrays freed more than once");
}

/// References a thread keeps in a thread-local that is destroyed after its
/// biased owner registration (registered first, destroyed last): they are
/// dropped during the thread's teardown, after it has left the owners'
/// registry, each at the same moment as the peer thread drops its clone of
/// the same array.  Every array freed exactly once.
#[test]
fn stress_biased_drops_during_owner_teardown() {
    use std::cell::RefCell;
    use std::sync::{mpsc, Barrier};

    struct Held {
        arrays: Vec<Array<Tracker, Biased>>,
        barrier: Option<Arc<Barrier>>,
    }
    impl Drop for Held {
        fn drop(&mut self) {
            let Some(b) = self.barrier.take() else { return };
            // Drop one array at a time, each in step with the peer.
            for a in self.arrays.drain(..) {
                b.wait();
                drop(a);
            }
        }
    }
    thread_local! {
        static HELD: RefCell<Held> = const { RefCell::new(Held { arrays: Vec::new(), barrier: None }) };
    }

    const ARRAYS: usize = 64;
    let rounds = 200 * scale();
    let total = ARRAYS * rounds;
    let freed = Arc::new((0..total).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
    for round in 0..rounds {
        let barrier = Arc::new(Barrier::new(2));
        let (tx, rx) = mpsc::channel::<Array<Tracker, Biased>>();
        let (f, b) = (freed.clone(), barrier.clone());
        let owner = std::thread::spawn(move || {
            // Register the holder's destructor before the owner's guard
            // exists (the first biased array makes it): it runs after it.
            HELD.with(|h| h.borrow_mut().barrier = Some(b));
            for i in 0..ARRAYS {
                let a = Array::<Tracker, Biased>::from_fn(&[1], |_| Tracker {
                    id: round * ARRAYS + i,
                    freed: f.clone(),
                });
                tx.send(a.clone()).unwrap();
                HELD.with(|h| h.borrow_mut().arrays.push(a.clone()));
            }
        });
        let peer = std::thread::spawn(move || {
            let got: Vec<_> = rx.iter().collect();
            for a in got {
                barrier.wait();
                drop(a);
            }
        });
        owner.join().unwrap();
        peer.join().unwrap();
    }
    let wrong: Vec<(usize, usize)> = freed
        .iter()
        .enumerate()
        .map(|(i, f)| (i, f.load(Ordering::SeqCst)))
        .filter(|&(_, n)| n != 1)
        .collect();
    assert!(
        wrong.is_empty(),
        "arrays freed other than once (id, times): {:?}",
        &wrong[..wrong.len().min(10)]
    );
}
