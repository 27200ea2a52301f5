//! Stress runs of deep and wide fork trees with allocation, down-pointers and
//! collections at random points, on an oversubscribed pool, with the heap
//! verifier on. Not a benchmark. `CANOPY_STRESS_SCALE` multiplies the work
//! (default 1: the CI setting; the release setting uses 20).

#![cfg(not(canopy_loom))]

use canopy_hh::{run_with_stats, set_config, Config, Gc, Scope, Val};

fn scale() -> u64 {
    std::env::var("CANOPY_STRESS_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1)
}

fn setup() -> rayon_core::ThreadPool {
    let _ = set_config(Config { chunk_bytes: 8 << 10, gc_min_bytes: 16 << 10, gc_ratio: 0.5, verify: true, gc: true });
    rayon_core::ThreadPoolBuilder::new().num_threads(4).stack_size(64 << 20).build().unwrap()
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn build_list<'s>(s: &mut Scope<'s>, n: u64, tag: i64) -> Gc<'s> {
    let mut l = Val::Int(0);
    for i in 0..n {
        l = Val::Obj(s.scope_keep(|s| s.tuple(&[Val::Int(tag + i as i64), l])));
    }
    s.scope_keep(|s| s.tuple(&[Val::Int(-1), l]))
}

fn list_total(s: &mut Scope<'_>, l: Gc<'_>) -> i64 {
    s.scope(|s| {
        let mut t = 0;
        let mut cur = s.get(l, 1);
        while let Val::Obj(c) = cur {
            t += s.get_int(c, 0);
            cur = s.get(c, 1);
        }
        t
    })
}

fn expect(n: u64, tag: i64) -> i64 {
    (0..n as i64).map(|i| tag + i).sum()
}

/// A random task: builds a list, maybe forks two children that write their
/// lists into a fresh array of this task (down-pointers), makes garbage,
/// collects sometimes, and checks everything it can see. Returns the sum of
/// all list totals in its subtree.
fn task(s: &mut Scope<'_>, seed: u64, depth: u32) -> i64 {
    let mut rng = seed | 1;
    let n = next(&mut rng) % 300;
    let tag = (seed % 1000) as i64;
    let mine = build_list(s, n, tag);
    let mut total = expect(n, tag);
    if depth > 0 && next(&mut rng) % 4 != 0 {
        let slots = s.array(2, Val::Int(0));
        let (sa, sb) = (next(&mut rng), next(&mut rng));
        let (ta, tb) = s.par(
            |s| {
                let t = task(s, sa, depth - 1);
                let l = build_list(s, 50, 7);
                s.set(slots, 0, Val::Obj(l));
                t
            },
            |s| {
                let t = task(s, sb, depth - 1);
                let l = build_list(s, 60, 9);
                s.set(slots, 1, Val::Obj(l));
                t
            },
        );
        total += ta + tb;
        for (i, (len, tag)) in [(50, 7), (60, 9)].into_iter().enumerate() {
            let l = s.get(slots, i).as_obj().unwrap();
            assert_eq!(list_total(s, l), expect(len, tag));
        }
    }
    for _ in 0..next(&mut rng) % 4 {
        s.scope(|s| {
            build_list(s, 500, 0);
        });
        match next(&mut rng) % 6 {
            0 | 1 => s.collect(),
            2 => {
                s.collect_with_ancestors();
            }
            _ => {}
        }
    }
    assert_eq!(list_total(s, mine), expect(n, tag));
    total
}

fn model_total(seed: u64, depth: u32) -> i64 {
    let mut rng = seed | 1;
    let n = next(&mut rng) % 300;
    let tag = (seed % 1000) as i64;
    let mut total = expect(n, tag);
    if depth > 0 && next(&mut rng) % 4 != 0 {
        let (sa, sb) = (next(&mut rng), next(&mut rng));
        total += model_total(sa, depth - 1) + model_total(sb, depth - 1);
    }
    total
}

#[test]
fn random_fork_trees_with_collections() {
    let pool = setup();
    let (mut forks, mut collections) = (0, 0);
    for round in 0..4 * scale() {
        let seed = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(round + 1);
        let (got, st) = pool.install(|| run_with_stats(|s| task(s, seed, 9)));
        assert_eq!(got, model_total(seed, 9), "round {round}");
        forks += st.forks;
        collections += st.collections;
    }
    assert!(forks > 100 && collections > 10, "forks {forks}, collections {collections}");
}

#[test]
fn a_deep_fork_chain_allocating_at_every_level() {
    let pool = setup();
    fn chain(s: &mut Scope<'_>, d: u32) -> i64 {
        let mine = s.tuple(&[Val::Int(d as i64)]);
        if d == 0 {
            return 0;
        }
        let (a, b) = s.par(
            |s| chain(s, d - 1),
            |s| {
                let t = s.tuple(&[Val::Int(1)]);
                s.len(t) as i64
            },
        );
        a + b + s.get_int(mine, 0) - d as i64
    }
    let depth = 3_000 * scale().min(4) as u32;
    let (r, st) = pool.install(|| run_with_stats(|s| chain(s, depth)));
    assert_eq!(r, depth as i64);
    assert_eq!(st.forks, 2 * depth as u64);
}

#[test]
fn a_wide_parallel_loop_filling_an_ancestor_array() {
    let pool = setup();
    let n = 100_000 * scale() as usize;
    let ok = pool.install(|| {
        canopy_hh::run(|s| {
            let out = s.array(n, Val::Int(0));
            s.par_for(0..n, 64, |s, i| {
                let t = s.tuple(&[Val::Int(i as i64), Val::Int(2 * i as i64)]);
                s.set(out, i, Val::Obj(t));
            });
            s.collect();
            (0..n).all(|i| {
                s.scope(|s| {
                    let t = s.get(out, i).as_obj().unwrap();
                    s.get_int(t, 0) == i as i64 && s.get_int(t, 1) == 2 * i as i64
                })
            })
        })
    });
    assert!(ok);
}

/// Two siblings write pointers to their own objects into one field of the
/// root's array (legal: no one reads it until the join) while the first
/// collects again and again. A remembered field that the sibling overwrites
/// between a collection's root pass and its verifier is a stale entry, not a
/// broken heap.
#[test]
fn a_remembered_field_overwritten_by_a_sibling_during_a_collection() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    let pool = setup();
    let rounds = 3_000 * scale();
    let last = pool.install(|| {
        canopy_hh::run(|s| {
            let shared = s.array(1, Val::Int(0));
            let (started, done) = (AtomicBool::new(false), AtomicBool::new(false));
            let wait_for = |flag: &AtomicBool| {
                let t0 = Instant::now();
                while !flag.load(Ordering::Acquire) && t0.elapsed() < Duration::from_secs(5) {
                    std::thread::yield_now();
                }
            };
            s.par(
                |s| {
                    // Let the sibling go even if a collection here panics.
                    struct Done<'a>(&'a AtomicBool);
                    impl Drop for Done<'_> {
                        fn drop(&mut self) {
                            self.0.store(true, Ordering::Release);
                        }
                    }
                    let _done = Done(&done);
                    wait_for(&started);
                    for r in 0..rounds {
                        s.scope(|s| {
                            let t = s.tuple(&[Val::Int(r as i64)]);
                            s.set(shared, 0, Val::Obj(t));
                            s.collect();
                        });
                    }
                },
                |s| {
                    started.store(true, Ordering::Release);
                    while !done.load(Ordering::Acquire) {
                        s.scope(|s| {
                            let t = s.tuple(&[Val::Int(-1)]);
                            s.set(shared, 0, Val::Obj(t));
                        });
                    }
                },
            );
            s.collect();
            let t = s.get(shared, 0).as_obj().unwrap();
            s.get_int(t, 0)
        })
    });
    assert!(last == -1 || last == rounds as i64 - 1, "{last}");
}

/// A worker waiting at a join inside one run takes other jobs meanwhile, an
/// independent run spawned on the pool among them. That run is not nested in
/// the waiting task, and must not be refused as if it were.
#[test]
fn a_run_spawned_on_a_worker_waiting_inside_another_run_is_not_nested() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::{Duration, Instant};
    let _ = setup();
    let pool = rayon_core::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    for _ in 0..3 * scale() {
        let (tx, rx) = mpsc::channel();
        let started = Arc::new(AtomicBool::new(false));
        let (tx1, s1) = (tx.clone(), started.clone());
        pool.spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                canopy_hh::run(|s| {
                    let (a, b) = s.par(
                        |s| {
                            // Wait for the second child to be stolen: then
                            // this worker waits for it at the join.
                            let t0 = Instant::now();
                            while !s1.load(Ordering::Acquire) && t0.elapsed() < Duration::from_secs(5) {
                                std::thread::yield_now();
                            }
                            s.tuple(&[Val::Int(1)]);
                            1
                        },
                        |s| {
                            s1.store(true, Ordering::Release);
                            // Long enough for the other run to be taken by the
                            // waiting worker.
                            std::thread::sleep(Duration::from_millis(100));
                            s.tuple(&[Val::Int(2)]);
                            2
                        },
                    );
                    a + b
                })
            }));
            let _ = tx1.send(r.map_err(|_| "first run panicked".to_string()));
        });
        let t0 = Instant::now();
        while !started.load(Ordering::Acquire) && t0.elapsed() < Duration::from_secs(5) {
            std::thread::yield_now();
        }
        // Both workers are busy: the first waits at the join, the second
        // sleeps in the second child. This run goes to the pool's queue.
        pool.spawn(move || {
            let r = std::panic::catch_unwind(|| canopy_hh::run(|s| {
                let t = s.tuple(&[Val::Int(7)]);
                s.get_int(t, 0)
            }));
            let _ = tx.send(r.map_err(|e| {
                e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
            }));
        });
        let mut got: Vec<_> = (0..2).map(|_| rx.recv_timeout(Duration::from_secs(30)).unwrap()).collect();
        got.sort();
        assert_eq!(got, vec![Ok(3), Ok(7)]);
    }
}
