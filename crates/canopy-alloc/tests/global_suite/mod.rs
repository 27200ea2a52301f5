//! The tests of a whole program on a Canopy global allocator, shared by
//! `global_alloc.rs` (`Canopy`) and `global_alloc_unchecked.rs`
//! (`CanopyUnchecked`): collections, threads that hand memory to each
//! other, thread churn, over-aligned types.  Stress sizes scale with
//! `CANOPY_STRESS_SCALE` (default 1).

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc;

pub fn scale() -> usize {
    std::env::var("CANOPY_STRESS_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1)
}

#[test]
fn collections_work() {
    let mut m = HashMap::new();
    let mut b = BTreeMap::new();
    for i in 0..50_000 * scale() {
        m.insert(i, format!("value {i}"));
        b.insert(format!("{i:08}"), vec![i as u8; i % 300]);
    }
    for i in (0..50_000 * scale()).step_by(3) {
        m.remove(&i);
    }
    assert_eq!(m.get(&1).map(String::as_str), Some("value 1"));
    assert_eq!(b.get("00000299").map(Vec::len), Some(299));
    let big: Vec<u64> = (0..3_000_000).collect();
    assert_eq!(big.iter().sum::<u64>(), 3_000_000 * 2_999_999 / 2);
    canopy_alloc::check_invariants().unwrap();
}

#[test]
fn producer_consumer_across_threads() {
    let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(64);
    let n = 100_000 * scale();
    let producer = std::thread::spawn(move || {
        for i in 0..n {
            tx.send(vec![(i % 251) as u8; 1 + i % 2000]).unwrap();
        }
    });
    let consumer = std::thread::spawn(move || {
        let mut total = 0usize;
        for (i, v) in rx.iter().enumerate() {
            assert_eq!(v.len(), 1 + i % 2000);
            assert!(v.iter().all(|&x| x == (i % 251) as u8));
            total += v.len();
        }
        total
    });
    producer.join().unwrap();
    let total = consumer.join().unwrap();
    assert_eq!(total, (0..n).map(|i| 1 + i % 2000).sum::<usize>());
    let s = canopy_alloc::stats::snapshot();
    assert!(s.remote_frees > 0, "the consumer frees the producer's memory remotely");
}

#[test]
fn thread_churn_reuses_heaps() {
    for round in 0..(200 * scale()) {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    let v: Vec<String> = (0..100).map(|i| format!("{round}-{t}-{i}")).collect();
                    v.into_iter().filter(|s| s.ends_with('7')).collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            let kept = h.join().unwrap();
            assert_eq!(kept.len(), 10);
        }
    }
    let s = canopy_alloc::stats::snapshot();
    assert!(s.heaps_adopted > 0);
    assert!(s.heaps_created < 200, "heaps are adopted, not created per thread ({} created)", s.heaps_created);
}

#[repr(align(4096))]
struct Page([u8; 4096]);

#[repr(align(128))]
#[derive(Clone, Copy)]
struct Line([u8; 128]);

#[test]
fn over_aligned_types() {
    let pages: Vec<Box<Page>> = (0..100).map(|i| Box::new(Page([i as u8; 4096]))).collect();
    for (i, p) in pages.iter().enumerate() {
        assert_eq!(&**p as *const Page as usize % 4096, 0);
        assert!(p.0.iter().all(|&x| x == i as u8));
    }
    let mut lines: Vec<Line> = Vec::new();
    for i in 0..10_000 {
        lines.push(Line([i as u8; 128]));
        assert_eq!(lines.as_ptr() as usize % 128, 0);
    }
    assert!(lines.iter().enumerate().all(|(i, l)| l.0[0] == i as u8));
}

/// Larson's server pattern: each thread replaces random blocks of a table and
/// the tables move on to the next thread every round, so most frees are of
/// other threads' blocks (kept by the freeing thread for its next
/// allocations of the class, or sent home).  Every block is filled with a
/// stamp and checked in full before it is freed; the live blocks of all
/// tables are distinct after every round.
#[test]
fn tables_handed_between_threads_keep_every_byte() {
    use std::sync::{Arc, Barrier, Mutex};
    const THREADS: usize = 3;
    const SLOTS: usize = 400;
    let rounds = 12 * scale();
    let stamp = |v: &[u8]| v.first().copied().unwrap_or(0);
    let fresh = |len: usize, s: u8| vec![s; len];
    let tables: Arc<Vec<Mutex<Vec<Vec<u8>>>>> = Arc::new(
        (0..THREADS).map(|t| Mutex::new((0..SLOTS).map(|i| fresh(16 + (i * 37 + t) % 2033, (i + t) as u8)).collect())).collect(),
    );
    let barrier = Arc::new(Barrier::new(THREADS));
    let hs: Vec<_> = (0..THREADS)
        .map(|t| {
            let (tables, barrier) = (tables.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                let mut rnd = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                for round in 0..rounds {
                    let mut table = tables[(t + round) % THREADS].lock().unwrap();
                    for _ in 0..2000 {
                        let s = rnd() as usize % SLOTS;
                        let old = std::mem::take(&mut table[s]);
                        let st = stamp(&old);
                        assert!(old.iter().all(|&b| b == st), "a block changed while it was live");
                        drop(old);
                        let r = rnd();
                        table[s] = fresh(16 + (r as usize >> 8) % 2033, r as u8);
                    }
                    drop(table);
                    barrier.wait();
                    if t == 0 {
                        let mut seen = std::collections::HashSet::new();
                        for tb in tables.iter() {
                            for v in tb.lock().unwrap().iter() {
                                assert!(seen.insert(v.as_ptr() as usize), "a block is in two slots");
                            }
                        }
                    }
                    barrier.wait();
                }
                canopy_alloc::check_invariants().unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let s = canopy_alloc::stats::snapshot();
    let o = canopy_alloc::options();
    if !o.check && o.keep_bytes > 0 {
        assert!(s.remote_frees_kept > 0, "other threads' blocks were kept for reuse");
    } else {
        assert_eq!(s.remote_frees_kept, 0, "nothing is kept in check mode or with CANOPY_KEEP_KB=0");
    }
    canopy_alloc::check_invariants().unwrap();
}
