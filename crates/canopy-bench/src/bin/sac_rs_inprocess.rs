//! The SAC kernel in Rust with several ways of getting its temporaries, side
//! by side in one process in alternating bursts: the Rust companion of
//! `c/inprocess.c`'s `sac` and `sac2` loops (see there for why one process).
//!
//! Usage: `sac_rs_inprocess sac|sac2 BURSTS SCALE`
//!
//! Each element of a vector of `SCALE * 100 000` takes a temporary of 25
//! `i32` (100 bytes), fills and sums it, gives it back and adds the sum into
//! the next vector.  The ways (`lib` indices in the output, in this order):
//!
//! - `rs-system`: `GlobalAlloc` calls on std's `System` (glibc's malloc);
//! - `rs-canopy-global`: `GlobalAlloc` calls on `canopy_alloc::Canopy`, as a
//!   program with `#[global_allocator] static A: Canopy` makes them;
//! - `rs-canopy-global-unchecked`: the same on `canopy_alloc::CanopyUnchecked`;
//! - `rs-canopy-unchecked`: `alloc_class` and `free_class_unchecked`, the
//!   class computed once;
//! - `rs-bound`: one temporary per thread, taken before the loop (the
//!   compute-only bound).
//!
//! Every way runs the same monomorphised loop around the same out-of-line
//! `fill_and_sum`.  `sac2` runs two threads, each on half of the vector,
//! each timing its own work between the barriers; a burst's time is the sum
//! over the threads.  Output: one line per way,
//! `lib=I name=NAME loop=LOOP bursts=B ops=O median_ns=M min_ns=N q1_ns=Q q3_ns=R checksum=C`,
//! nanoseconds per element over the bursts; every way does the same work
//! and prints the same checksum.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

use canopy_alloc::{Canopy, CanopyUnchecked, SizeClass};

const X: usize = 25;
const LAYOUT: Layout = match Layout::from_size_align(X * 4, 4) {
    Ok(l) => l,
    Err(_) => panic!("the temporary's layout"),
};
const CLASS: SizeClass = match SizeClass::of(X * 4) {
    Some(c) => c,
    None => panic!("the temporary's class"),
};
const NAMES: [&str; 5] = ["rs-system", "rs-canopy-global", "rs-canopy-global-unchecked", "rs-canopy-unchecked", "rs-bound"];

/// Fill the temporary with `idx + i` and sum it; out of line, so every way
/// runs the same code for it.
#[inline(never)]
fn fill_and_sum(t: *mut i32, idx: usize) -> u64 {
    // SAFETY: t has X i32s (every way hands out at least 100 bytes, 4-aligned).
    let t = unsafe { std::slice::from_raw_parts_mut(t, X) };
    for (i, v) in t.iter_mut().enumerate() {
        *v = (idx + i) as i32;
    }
    black_box(t.as_mut_ptr());
    t.iter().map(|&v| v as u32 as u64).sum()
}

/// Where the temporaries come from.
trait Temps {
    fn take(&mut self) -> *mut i32;
    /// # Safety
    /// `p` came from this value's `take` and is not used again.
    unsafe fn give(&mut self, p: *mut i32);
}

struct Global<A: GlobalAlloc>(A);

impl<A: GlobalAlloc> Temps for Global<A> {
    #[inline(always)]
    fn take(&mut self) -> *mut i32 {
        // SAFETY: a layout of non-zero size.
        let p = unsafe { self.0.alloc(LAYOUT) };
        if p.is_null() {
            oom()
        }
        p as *mut i32
    }
    #[inline(always)]
    unsafe fn give(&mut self, p: *mut i32) {
        // SAFETY: p came from alloc with LAYOUT (caller's contract).
        unsafe { self.0.dealloc(p as *mut u8, LAYOUT) }
    }
}

struct RichUnchecked;

impl Temps for RichUnchecked {
    #[inline(always)]
    fn take(&mut self) -> *mut i32 {
        let p = canopy_alloc::alloc_class(CLASS);
        if p.is_null() {
            oom()
        }
        p as *mut i32
    }
    #[inline(always)]
    unsafe fn give(&mut self, p: *mut i32) {
        // SAFETY: a live block of class CLASS, freed once (caller's contract).
        unsafe { canopy_alloc::free_class_unchecked(p as *mut u8, CLASS) }
    }
}

struct Bound([i32; X]);

impl Temps for Bound {
    #[inline(always)]
    fn take(&mut self) -> *mut i32 {
        self.0.as_mut_ptr()
    }
    #[inline(always)]
    unsafe fn give(&mut self, _p: *mut i32) {}
}

#[cold]
fn oom() -> ! {
    eprintln!("sac_rs_inprocess: out of memory");
    std::process::exit(2)
}

/// The loop over `lo..hi`: `b[idx] = a[idx] + sum of the temporary`.
#[inline(never)]
fn range<T: Temps>(temps: &mut T, a: &[u64], b: &mut [u64], lo: usize) {
    for (k, (bv, av)) in b.iter_mut().zip(a).enumerate() {
        let t = temps.take();
        black_box(t);
        let s = fill_and_sum(t, lo + k);
        // SAFETY: t came from take and is not used after.
        unsafe { temps.give(t) };
        *bv = av.wrapping_add(s);
    }
}

/// One burst of way `way` over this thread's chunk.
fn burst(way: usize, a: &[u64], b: &mut [u64], lo: usize) {
    match way {
        0 => range(&mut Global(System), a, b, lo),
        1 => range(&mut Global(Canopy), a, b, lo),
        2 => range(&mut Global(CanopyUnchecked), a, b, lo),
        3 => range(&mut RichUnchecked, a, b, lo),
        _ => range(&mut Bound([0; X]), a, b, lo),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || -> ! {
        eprintln!("usage: sac_rs_inprocess sac|sac2 BURSTS SCALE");
        std::process::exit(2)
    };
    if args.len() != 3 {
        usage();
    }
    let threads = match args[0].as_str() {
        "sac" => 1,
        "sac2" => 2,
        _ => usage(),
    };
    let num = |s: &str| s.parse::<usize>().ok().filter(|&n| (1..=1000).contains(&n)).unwrap_or_else(|| usage());
    let (bursts, scale) = (num(&args[1]), num(&args[2]));
    let len = 100_000 * scale;
    let ways = NAMES.len();
    // A stays zero, so every burst of every way does the same work.
    let a = vec![0u64; len];
    let chunk = len.div_ceil(threads);
    let mut outs: Vec<Vec<u64>> = (0..threads).map(|t| vec![0u64; chunk.min(len - (t * chunk).min(len))]).collect();
    let barrier = Barrier::new(threads);
    // work[t][burst][way] in seconds; sums[t][way] the checksum parts.
    let results: Vec<(Vec<[f64; NAMES.len()]>, Vec<u64>)> = std::thread::scope(|s| {
        let hs: Vec<_> = outs
            .iter_mut()
            .enumerate()
            .map(|(t, out)| {
                let (a, barrier) = (&a, &barrier);
                s.spawn(move || {
                    let lo = (t * chunk).min(len);
                    let a = &a[lo..lo + out.len()];
                    let mut work = vec![[0f64; NAMES.len()]; bursts];
                    let mut sums = vec![0u64; ways];
                    for (bu, wb) in work.iter_mut().enumerate() {
                        for k in 0..ways {
                            let way = (k + bu) % ways;
                            barrier.wait();
                            let start = Instant::now();
                            burst(way, a, out, lo);
                            wb[way] = start.elapsed().as_secs_f64();
                            sums[way] = out.iter().fold(sums[way], |acc, &v| acc.wrapping_add(v));
                            barrier.wait();
                        }
                    }
                    (work, sums)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("a worker panicked")).collect()
    });
    for (way, name) in NAMES.iter().enumerate() {
        let mut ns: Vec<f64> = (0..bursts).map(|bu| results.iter().map(|(w, _)| w[bu][way]).sum::<f64>() * 1e9 / len as f64).collect();
        ns.sort_by(|x, y| x.total_cmp(y));
        let q = |f: f64| ns[((ns.len() - 1) as f64 * f).round() as usize];
        // The median of an even number of bursts is the mean of the middle two.
        let median = canopy_bench::stats::median(&ns).unwrap_or(f64::NAN);
        let checksum = results.iter().fold(0u64, |acc, (_, s)| acc.wrapping_add(s[way]));
        println!(
            "lib={way} name={name} loop={} bursts={bursts} ops={len} median_ns={:.3} min_ns={:.3} q1_ns={:.3} q3_ns={:.3} checksum={checksum}",
            args[0],
            median,
            ns[0],
            q(0.25),
            q(0.75)
        );
    }
}
