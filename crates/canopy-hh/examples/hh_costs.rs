//! Costs of the basic operations, side by side with what a Rust program
//! would use instead: a fork (`Scope::par` vs `rayon::join`), allocating a
//! small immutable object (`Scope::tuple` vs `Box`), and collection
//! throughput. Prints one line per measurement (median of 5).
//!
//! ```text
//! cargo run --release -p canopy-hh --example hh_costs
//! ```

use canopy_hh::{run_with_stats, Scope, Val};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn fib_seq(n: u64) -> u64 {
    if n < 2 {
        n
    } else {
        fib_seq(n - 1) + fib_seq(n - 2)
    }
}

fn fib_rayon(n: u64, cut: u64) -> u64 {
    if n <= cut {
        return fib_seq(n);
    }
    let (a, b) = rayon_core::join(|| fib_rayon(n - 1, cut), || fib_rayon(n - 2, cut));
    a + b
}

fn fib_hh(s: &mut Scope<'_>, n: u64, cut: u64) -> u64 {
    if n <= cut {
        return fib_seq(n);
    }
    let (a, b) = s.par(|s| fib_hh(s, n - 1, cut), |s| fib_hh(s, n - 2, cut));
    a + b
}

fn main() {
    let threads: usize = std::env::var("THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let pool = rayon_core::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let (n, cut) = (32u64, 8u64);
    let forks = {
        let (_, st) = pool.install(|| run_with_stats(|s| fib_hh(s, n, cut)));
        st.forks / 2
    };
    let (mut tr, mut th) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = Instant::now();
        let a = pool.install(|| fib_rayon(n, cut));
        tr.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let b = pool.install(|| canopy_hh::run(|s| fib_hh(s, n, cut)));
        th.push(t.elapsed().as_secs_f64());
        assert_eq!(a, b);
    }
    let seq = {
        let t = Instant::now();
        std::hint::black_box(fib_seq(std::hint::black_box(n)));
        t.elapsed().as_secs_f64()
    };
    let (r, h) = (median(tr), median(th));
    println!(
        "fork ({threads} thread(s)): fib({n}) cut {cut}, {forks} forks: rayon::join {:.1} ns/fork over seq, Scope::par {:.1} ns/fork over seq ({:.2}x rayon)",
        (r - seq) / forks as f64 * 1e9 * threads as f64,
        (h - seq) / forks as f64 * 1e9 * threads as f64,
        h / r
    );

    if std::env::var("ONLY").as_deref() == Ok("fork") {
        for _ in 0..20 {
            pool.install(|| canopy_hh::run(|s| fib_hh(s, n, cut)));
        }
        return;
    }
    let count = 10_000_000usize;
    let (mut tb, mut tt) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = Instant::now();
        let mut keep: Option<Box<(i64, i64)>> = None;
        for i in 0..count {
            let b = Box::new((i as i64, 0i64));
            if i % 1024 == 0 {
                keep = Some(b);
            } else {
                std::hint::black_box(&b);
            }
        }
        std::hint::black_box(keep);
        tb.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        canopy_hh::run(|s| {
            let keep = s.new_ref(Val::Int(0));
            for chunk in 0..count / 1024 {
                s.scope(|s| {
                    for i in 0..1024 {
                        let b = s.tuple(&[Val::Int((chunk * 1024 + i) as i64), Val::Int(0)]);
                        if i == 0 {
                            s.set(keep, 0, Val::Obj(b));
                        }
                    }
                });
            }
        });
        tt.push(t.elapsed().as_secs_f64());
    }
    let (b, t) = (median(tb), median(tt));
    println!(
        "allocate a 2-field immutable object: Box (system malloc+free) {:.1} ns, Scope::tuple (bump + collection) {:.1} ns ({:.2}x)",
        b / count as f64 * 1e9,
        t / count as f64 * 1e9,
        t / b
    );

    // Collection throughput: a 1M-node list kept live, collected 5 times.
    let (_, st) = run_with_stats(|s| {
        let mut l = Val::Int(0);
        for i in 0..1_000_000 {
            l = Val::Obj(s.scope_keep(|s| s.tuple(&[Val::Int(i), l])));
        }
        for _ in 0..5 {
            s.collect();
        }
    });
    println!(
        "collector: {} collections, {:.1} MB copied in {:.1} ms: {:.0} MB/s",
        st.collections,
        st.bytes_copied as f64 / 1e6,
        st.gc_nanos as f64 / 1e6,
        st.bytes_copied as f64 / 1e6 / (st.gc_nanos as f64 / 1e9)
    );
}
