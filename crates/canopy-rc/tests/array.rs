//! Behaviour of arrays, with-loops and the four counting policies.
#![cfg(not(canopy_loom))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use canopy_rc::{
    delegated, fold, genarray, thread_stats, Array, Atomic, Biased, Delegated, Gen, Local, Policy,
};

/// An element that counts its drops.
#[derive(Debug)]
struct Tracked(Arc<AtomicUsize>);
impl Clone for Tracked {
    fn clone(&self) -> Self {
        Tracked(self.0.clone())
    }
}
impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn shape_index_and_rank0() {
    let a: Array<u32> = Array::from_fn(&[2, 3, 4], |i| i as u32);
    assert_eq!((a.rank(), a.len(), a.shape()), (3, 24, &[2usize, 3, 4][..]));
    assert_eq!(a[[1, 2, 3]], 23);
    assert_eq!(a.get(&[2, 0, 0]), None);
    assert_eq!(a.get(&[0, 0]), None);
    let s: Array<f64, Local> = Array::scalar(2.5);
    assert_eq!((s.rank(), s.len(), s[[]]), (0, 1, 2.5));
    let e: Array<u8> = Array::from_vec(&[0, 5], vec![]);
    assert!(e.is_empty());
    let err = Array::<u8>::try_from_vec(&[2, 2], vec![1, 2, 3]).unwrap_err();
    assert!(
        err.to_string()
            .contains("shape [2, 2] has 4 elements but 3"),
        "{err}"
    );
}

#[test]
#[should_panic(expected = "out of range for array of shape [2, 3]")]
fn index_out_of_range_panics() {
    let a: Array<u8, Local> = Array::filled(&[2, 3], 0);
    let _ = a[[2, 0]];
}

fn drops_exactly_once<P: Policy>()
where
    Array<Tracked, P>: Send,
{
    let drops = Arc::new(AtomicUsize::new(0));
    let a: Array<Tracked, P> = Array::from_fn(&[4], |_| Tracked(drops.clone()));
    let b = a.clone();
    let c = b.clone();
    assert!(a.getrc() >= 3);
    drop(a);
    let t = std::thread::spawn(move || {
        drop(c);
        delegated::flush();
    });
    t.join().unwrap();
    assert_eq!(
        drops.load(Ordering::SeqCst),
        0,
        "{}: freed while referenced",
        P::NAME
    );
    drop(b);
    delegated::flush();
    let mut spins = 0u64;
    while drops.load(Ordering::SeqCst) < 4 {
        std::thread::yield_now();
        spins += 1;
        assert!(spins < 50_000_000, "{}: never freed", P::NAME);
    }
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(
        drops.load(Ordering::SeqCst),
        4,
        "{}: elements dropped once each",
        P::NAME
    );
}

#[test]
fn every_policy_frees_exactly_once() {
    drops_exactly_once::<Atomic>();
    drops_exactly_once::<Biased>();
    drops_exactly_once::<Delegated>();
}

#[test]
fn local_counts() {
    let drops = Arc::new(AtomicUsize::new(0));
    let a: Array<Tracked, Local> = Array::from_fn(&[3], |_| Tracked(drops.clone()));
    let b = a.clone();
    assert_eq!(a.getrc(), 2);
    drop(a);
    assert_eq!(b.getrc(), 1);
    drop(b);
    assert_eq!(drops.load(Ordering::SeqCst), 3);
}

fn reuse_when_unique<P: Policy>() {
    let before = thread_stats();
    let a: Array<i64, P> = Array::from_fn(&[1000], |i| i as i64);
    let addr = a.addr();
    let a = a.modarray(&[Gen::update(&[10], &[20], |_, x| -x)]);
    assert_eq!(a.addr(), addr, "{}: unique array updated in place", P::NAME);
    assert_eq!(a[[15]], -15);
    assert_eq!(a[[25]], 25);
    let keep = a.clone();
    let b = a.modarray(&[Gen::new(&[0], &[1], |_| 7)]);
    assert_ne!(b.addr(), keep.addr(), "{}: shared array copied", P::NAME);
    assert_eq!((b[[0]], keep[[0]], b[[15]]), (7, 0, -15));
    let d = thread_stats().since(&before);
    assert_eq!((d.reuses, d.copies), (1, 1), "{}: {d:?}", P::NAME);
    assert_eq!(d.bytes_not_copied, 8000);
    assert_eq!(d.bytes_copied, 8000);
}

#[test]
fn modarray_reuses_unique_arrays() {
    reuse_when_unique::<Local>();
    reuse_when_unique::<Atomic>();
    reuse_when_unique::<Biased>();
    reuse_when_unique::<Delegated>();
}

#[test]
fn make_unique_copies_only_shared() {
    let mut a: Array<u8> = Array::filled(&[8], 1);
    let addr = a.addr();
    a.make_unique()[0] = 5;
    assert_eq!(a.addr(), addr);
    let b = a.clone();
    a.make_unique()[1] = 6;
    assert_ne!(a.addr(), b.addr());
    assert_eq!((a[[0]], a[[1]], b[[1]]), (5, 6, 1));
}

#[test]
fn genarray_paper_example() {
    // paper 003 Fig. 2: C = with { ([3,0] <= iv < [6,4]) : bar(A, iv); ([0,4] <= iv < [6,7]) : B[iv]; } : genarray([6,7], tmp)
    let bm: Array<i32> = Array::from_fn(&[6, 7], |i| 100 + i as i32);
    let c: Array<i32> = genarray(
        &[6, 7],
        -1,
        &[
            Gen::new(&[3, 0], &[6, 4], |iv| (iv[0] * 10 + iv[1]) as i32),
            Gen::new(&[0, 4], &[6, 7], |iv| bm[iv]),
        ],
    );
    for i in 0..6 {
        for j in 0..7 {
            let want = if j >= 4 {
                100 + (i * 7 + j) as i32
            } else if i >= 3 {
                (i * 10 + j) as i32
            } else {
                -1
            };
            assert_eq!(c[[i, j]], want, "at [{i},{j}]");
        }
    }
}

#[test]
fn parallel_with_loops_match_sequential() {
    let n = 300;
    let a: Array<u64> = genarray(
        &[n, n],
        0,
        &[Gen::all(&[n, n], |iv| (iv[0] * n + iv[1]) as u64).grain(64)],
    );
    assert!(a.as_slice().iter().enumerate().all(|(i, &v)| v == i as u64));
    let b: Array<u64, Delegated> = genarray(
        &[n, n],
        0,
        &[Gen::new(&[1, 2], &[n - 1, n - 3], |iv| (iv[0] + iv[1]) as u64).grain(16)],
    );
    for (i, &v) in b.as_slice().iter().enumerate() {
        let (r, c) = (i / n, i % n);
        let inside = (1..n - 1).contains(&r) && (2..n - 3).contains(&c);
        assert_eq!(v, if inside { (r + c) as u64 } else { 0 });
    }
    let s = fold(&[0, 0], &[n, n], 0u64, |iv| a[iv], |x, y| x + y);
    let m = (n * n) as u64;
    assert_eq!(s, m * (m - 1) / 2);
    let b2 = b.modarray(&[Gen::all_update(&[n, n], |_, x| x + 1).grain(100)]);
    assert_eq!(b2[[0, 0]], 1);
}

#[test]
fn parallel_workers_clone_shared_input() {
    // The synthetic kernel of paper 003 Fig. 5, small: each element clones and drops the input.
    fn run<P: Policy>()
    where
        Array<u64, P>: Send + Sync,
    {
        let v: Array<u64, P> = Array::from_fn(&[4096], |i| i as u64);
        let r: Array<u64, Atomic> = genarray(
            &[4096],
            0,
            &[Gen::all(&[4096], |iv| {
                let c = v.clone();
                let x = c[iv];
                drop(c);
                x * 2
            })
            .grain(1)],
        );
        assert!(r
            .as_slice()
            .iter()
            .enumerate()
            .all(|(i, &x)| x == 2 * i as u64));
        // All clones dropped and flushed at the end of the with-loop: once
        // the counting threads catch up, `v` is unique again.
        let mut n = 0u64;
        while !v.is_unique() {
            n += 1;
            assert!(n < 10_000_000, "{}: never unique again", P::NAME);
            std::thread::yield_now();
        }
    }
    run::<Atomic>();
    run::<Biased>();
    run::<Delegated>();
}

#[test]
#[should_panic(expected = "generators 0 ([0, 0]..[2, 2]) and 1 ([1, 1]..[3, 3]) overlap")]
fn overlapping_generators_panic() {
    let _: Array<u8, Local> = genarray(
        &[4, 4],
        0,
        &[
            Gen::new(&[0, 0], &[2, 2], |_| 1),
            Gen::new(&[1, 1], &[3, 3], |_| 2),
        ],
    );
}

#[test]
#[should_panic(expected = "upper bound [5] exceeds shape [4]")]
fn out_of_range_generator_panics() {
    let _: Array<u8, Local> = genarray(&[4], 0, &[Gen::new(&[0], &[5], |_| 1)]);
}

#[test]
#[should_panic(expected = "but the array has rank 2")]
fn generator_rank_mismatch_panics() {
    let a: Array<u8, Local> = Array::filled(&[4, 4], 0);
    let _ = a.modarray(&[Gen::new(&[0], &[1], |_| 1)]);
}

#[test]
fn biased_owner_ends_first() {
    let drops = Arc::new(AtomicUsize::new(0));
    let d2 = drops.clone();
    // The owner thread creates, hands a clone out, and ends while it is held.
    let (a, b) = std::thread::spawn(move || {
        let a: Array<Tracked, Biased> = Array::from_fn(&[2], |_| Tracked(d2.clone()));
        let b = a.clone();
        (a, b)
    })
    .join()
    .unwrap();
    assert_eq!(a.getrc(), 2, "after the merge the count is exact");
    drop(a);
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    assert!(b.is_unique());
    drop(b);
    assert_eq!(drops.load(Ordering::SeqCst), 2);
}

#[test]
fn biased_queue_to_live_owner() {
    let drops = Arc::new(AtomicUsize::new(0));
    let a: Array<Tracked, Biased> = Array::from_fn(&[1], |_| Tracked(drops.clone()));
    let b = a.clone(); // counted by the owner (this thread)
    std::thread::spawn(move || drop(b)).join().unwrap(); // goes negative: queued to us
    assert_eq!(a.getrc(), 1, "owner: local 2 + shared -1");
    canopy_rc::biased::merge_pending();
    assert!(a.is_unique());
    drop(a);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn delegated_config_is_fixed_once_started() {
    let a: Array<u8, Delegated> = Array::filled(&[1], 0);
    let n = delegated::counting_threads();
    assert!(delegated::set_counting_threads(n).is_ok());
    assert_eq!(
        delegated::set_counting_threads(n + 1),
        Err(delegated::AlreadyStarted(n))
    );
    drop(a);
}

#[test]
fn vector_with_loops_cover_subranges_sequential_and_parallel() {
    // Rank-1 with-loops take their own path: check every element against a
    // model, for boxes that start past 0, short (on this thread) and long
    // (cut into parallel chunks that also start past 0).
    for n in [1usize, 7, 100, 5000, 70_000] {
        let (a, b) = (n / 3, n - n / 4);
        let g: Array<u64, Atomic> = genarray(
            &[n],
            9,
            &[
                Gen::new(&[0], &[a], |iv| iv[0] as u64 * 2),
                Gen::new(&[b], &[n], |iv| iv[0] as u64 + 1_000_000),
            ],
        );
        let want: Vec<u64> = (0..n)
            .map(|i| {
                if i < a {
                    i as u64 * 2
                } else if i >= b {
                    i as u64 + 1_000_000
                } else {
                    9
                }
            })
            .collect();
        assert_eq!(g.as_slice(), &want[..], "genarray n={n}");
        let f: Array<u64, Atomic> = canopy_rc::genarray_fn(&[n], |iv| iv[0] as u64 ^ 0x55);
        assert!(
            f.as_slice()
                .iter()
                .enumerate()
                .all(|(i, &v)| v == i as u64 ^ 0x55),
            "genarray_fn n={n}"
        );
        let h = n / 2;
        let m = f.modarray_fn(&[h], &[n], |iv, &old| old + iv[0] as u64);
        let want: Vec<u64> = (0..n)
            .map(|i| (i as u64 ^ 0x55) + if i >= h { i as u64 } else { 0 })
            .collect();
        assert_eq!(m.as_slice(), &want[..], "modarray_fn n={n}");
    }
}

#[test]
fn with_loops_drop_each_replaced_element_once_at_every_pool_size() {
    // A generator's loop is compiled for its expression and runs three ways
    // (on the caller's thread, through a one-thread pool, and in parallel
    // chunks); each must drop every replaced element exactly once and never
    // an element it initialises (genarray's single generator writes
    // uninitialised memory).  Lengths cover the short path and the chunked
    // one, and a rank-2 box.
    fn check(n: usize, shape: &[usize], how: &str) {
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        let made = Arc::new(AtomicUsize::new(0));
        let m = made.clone();
        let lo = vec![0; shape.len()];
        let a: Array<Tracked, Atomic> = genarray(
            shape,
            Tracked(drops.clone()),
            &[Gen::new(&lo, shape, move |_| {
                m.fetch_add(1, Ordering::Relaxed);
                Tracked(d.clone())
            })],
        );
        // The default was cloned for no element: only `default` itself is
        // dropped (when genarray returns).
        assert_eq!(made.load(Ordering::Relaxed), n, "{how}: genarray made {n}");
        assert_eq!(drops.load(Ordering::SeqCst), 1, "{how}: genarray dropped only the default");
        let d = drops.clone();
        let a = a.modarray(&[Gen::update(&lo, shape, move |_, _old| Tracked(d.clone()))]);
        assert_eq!(drops.load(Ordering::SeqCst), 1 + n, "{how}: modarray dropped each old element once");
        drop(a);
        assert_eq!(drops.load(Ordering::SeqCst), 1 + 2 * n, "{how}: the array's drop");
    }
    let cases: [(usize, &[usize]); 4] = [(1, &[1]), (300, &[300]), (9000, &[9000]), (9000, &[90, 100])];
    for (n, shape) in cases {
        check(n, shape, &format!("caller's thread, shape {shape:?}"));
        for t in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(t).build().unwrap();
            pool.install(|| check(n, shape, &format!("{t}-thread pool, shape {shape:?}")));
        }
    }
}
