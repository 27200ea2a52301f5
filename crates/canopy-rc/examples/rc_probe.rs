//! Probe of count-operation costs, for profilers (callgrind, perf):
//! `rc_probe <what> <n>` with what = pair-delegated | pair-atomic |
//! pair-local | pair-biased | getrc | shared-delegated | shared-atomic |
//! shared-biased (two threads on one array).  Prints ns per operation.
use std::hint::black_box;
use std::time::Instant;

use canopy_rc::{delegated, Array, Atomic, Biased, Delegated, Local, Policy};

fn pairs<P: Policy>(n: usize) -> f64 {
    let a: Array<u64, P> = Array::filled(&[1], 1);
    let t = Instant::now();
    for _ in 0..n {
        let c = black_box(a.clone());
        drop(c);
    }
    let e = t.elapsed().as_nanos() as f64 / n as f64;
    delegated::flush();
    e
}

fn shared<P: Policy>(n: usize) -> f64
where
    Array<u64, P>: Send + Sync,
{
    let a: Array<u64, P> = Array::filled(&[1], 1);
    let b = std::sync::Barrier::new(2);
    let ts: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let (a, b) = (&a, &b);
                s.spawn(move || {
                    b.wait();
                    let t = Instant::now();
                    for _ in 0..n {
                        let c = black_box(a.clone());
                        drop(c);
                    }
                    let e = t.elapsed().as_nanos() as f64 / n as f64;
                    delegated::flush();
                    e
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    ts.iter().sum::<f64>() / 2.0
}

fn getrc(n: usize) -> f64 {
    let a: Array<u64, Delegated> = Array::filled(&[1], 1);
    let t = Instant::now();
    let bad = (0..n).filter(|_| a.getrc() != 1).count();
    assert_eq!(bad, 0);
    t.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).map_or("pair-delegated", |s| s.as_str());
    let n: usize = args
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000_000);
    let ns = match what {
        "pair-delegated" => pairs::<Delegated>(n),
        "pair-atomic" => pairs::<Atomic>(n),
        "pair-local" => pairs::<Local>(n),
        "pair-biased" => pairs::<Biased>(n),
        "getrc" => getrc(n),
        "shared-delegated" => shared::<Delegated>(n),
        "shared-atomic" => shared::<Atomic>(n),
        "shared-biased" => shared::<Biased>(n),
        _ => panic!("unknown probe {what}"),
    };
    println!("{what}: {ns:.2} ns");
}
