//! The SAC with-loop microbenchmark (paper 000, Fig. 1) in Rust, shared by
//! the binaries `sac_rs` (std's system allocator, so `LD_PRELOAD` applies)
//! `sac_rs_canopy` (Canopy as `#[global_allocator]`) and
//! `sac_rs_canopy_unchecked` (`CanopyUnchecked` as `#[global_allocator]`).
//!
//! The kernel is the one of `c/sac.c`: a vector A of N/X elements, ITERS
//! iterations that each build a new A in which every element adds the sum of
//! a temporary int vector of length X, filled with `idx + i`.  Threads take
//! static chunks of the element loop and meet at two barriers per iteration;
//! thread 0 is the calling thread.  The checksum (wrapping sum of A) is the
//! same as the C program's, so the harness checks both against one formula,
//! [`expected_checksum`].

use std::cell::UnsafeCell;
use std::hint::black_box;
use std::mem::MaybeUninit;
use std::sync::Barrier;
use std::time::Instant;

use canopy_alloc::SizeClass;

/// How each element gets its temporary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A boxed slice from the global allocator (std's `System` in `sac_rs`).
    System,
    /// The same code in `sac_rs_canopy`, whose global allocator is Canopy
    /// (`sac_rs_canopy_unchecked`: `CanopyUnchecked`).
    CanopyGlobal,
    /// Canopy's rich interface: class computed once, `alloc_class`/`free_class`.
    CanopyRich,
    /// The same with `free_class_unchecked` (the caller vouches for the block).
    CanopyUnchecked,
    /// Compute only: one temporary per thread, allocated before the loop.
    Bound,
}

impl Mode {
    /// The mode's command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Mode::System => "system",
            Mode::CanopyGlobal => "canopy-global",
            Mode::CanopyRich => "canopy-rich",
            Mode::CanopyUnchecked => "canopy-unchecked",
            Mode::Bound => "bound",
        }
    }

    /// Parse a command-line name.
    pub fn parse(s: &str) -> Option<Mode> {
        [
            Mode::System,
            Mode::CanopyGlobal,
            Mode::CanopyRich,
            Mode::CanopyUnchecked,
            Mode::Bound,
        ]
        .into_iter()
        .find(|m| m.name() == s)
    }
}

/// Parameters of one run.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Temporary length X.
    pub x: usize,
    /// Problem size N (A has N / X elements).
    pub n: usize,
    /// Iterations.
    pub iters: usize,
    /// Threads.
    pub threads: usize,
}

/// What a run reports.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// Wrapping sum of A.
    pub checksum: u64,
    /// Time of the iterations, seconds.
    pub seconds: f64,
    /// Allocation/free pairs the kernel performs (N/X * ITERS).
    pub pairs: u64,
}

/// The checksum every correct run prints, for any mode and allocator:
/// `ITERS * sum over idx < M of sum over i < X of (idx + i)` with `M = N / X`,
/// in wrapping 64-bit arithmetic.
pub fn expected_checksum(x: u64, n: u64, iters: u64) -> u64 {
    let m = n / x;
    // sum_idx sum_i (idx + i) = X * M(M-1)/2 + M * X(X-1)/2
    let tri = |k: u64| -> u64 {
        if k % 2 == 0 {
            (k / 2).wrapping_mul(k.wrapping_sub(1))
        } else {
            k.wrapping_mul(k.wrapping_sub(1) / 2)
        }
    };
    let per_iter = x.wrapping_mul(tri(m)).wrapping_add(m.wrapping_mul(tri(x)));
    iters.wrapping_mul(per_iter)
}

/// Fill the temporary with `idx + i` and sum it.  `black_box` on the pointer
/// makes the compiler assume the memory escapes, so the fill really happens
/// and the sum re-reads it.  Never inlined, so every mode (and the bound)
/// runs exactly the same machine code for the arithmetic.
#[inline(never)]
fn fill_and_sum(t: &mut [MaybeUninit<i32>], idx: usize) -> u64 {
    for (i, slot) in t.iter_mut().enumerate() {
        *slot = MaybeUninit::new((idx + i) as i32);
    }
    black_box(t.as_mut_ptr());
    let mut s = 0u64;
    for slot in t.iter() {
        // SAFETY: every slot was written by the loop above.
        s = s.wrapping_add(u64::from(unsafe { slot.assume_init() } as u32));
    }
    s
}

/// A and the A being built, shared by the workers.
struct Arrays {
    a: *mut u64,
    b: *mut u64,
}

/// The arrays behind a cell the workers share.  Access follows the barrier
/// protocol in [`worker`]: only thread 0 writes the pointers, between two
/// barriers during which no other thread reads them; element writes go to
/// disjoint chunks.
struct Shared(UnsafeCell<Arrays>);

// SAFETY: see the protocol on `Shared`; the barriers order every access.
unsafe impl Sync for Shared {}

/// A boxed slice of `len` uninitialised elements, allocated with exactly
/// that size (like `Box::new_uninit_slice`, which is newer than our MSRV).
fn uninit_slice<T>(len: usize) -> Box<[MaybeUninit<T>]> {
    let mut v: Vec<MaybeUninit<T>> = Vec::with_capacity(len);
    // SAFETY: MaybeUninit needs no initialisation; capacity is len.
    unsafe { v.set_len(len) };
    v.into_boxed_slice()
}

fn new_array(len: usize) -> *mut u64 {
    Box::into_raw(uninit_slice::<u64>(len)) as *mut u64
}

/// # Safety
/// `p` came from [`new_array`] or a `Box<[u64]>` of `len` elements, all initialised.
unsafe fn free_array(p: *mut u64, len: usize) {
    // SAFETY: per the contract, p is a leaked boxed slice of len elements.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, len)) });
}

fn worker(
    tid: usize,
    p: &Params,
    mode: Mode,
    class: Option<SizeClass>,
    shared: &Shared,
    barrier: &Barrier,
) -> f64 {
    let len = p.n / p.x;
    let chunk = len.div_ceil(p.threads);
    let lo = (tid * chunk).min(len);
    let hi = (lo + chunk).min(len);
    let mut own: Option<Box<[MaybeUninit<i32>]>> = (mode == Mode::Bound).then(|| uninit_slice(p.x));

    barrier.wait();
    let start = Instant::now();
    for _ in 0..p.iters {
        if tid == 0 {
            // SAFETY: only thread 0 touches the pointers here; the others are
            // waiting at the next barrier.
            unsafe { (*shared.0.get()).b = new_array(len) };
        }
        barrier.wait();
        // SAFETY: after the barrier the pointers are stable until the next one.
        let (a, b) = unsafe { ((*shared.0.get()).a, (*shared.0.get()).b) };
        for idx in lo..hi {
            let v = match mode {
                Mode::System | Mode::CanopyGlobal => {
                    let mut t: Box<[MaybeUninit<i32>]> = uninit_slice(p.x);
                    black_box(t.as_mut_ptr());
                    fill_and_sum(&mut t, idx)
                }
                Mode::CanopyRich | Mode::CanopyUnchecked => {
                    let cls = class.expect("class computed for rich mode");
                    let raw = canopy_alloc::alloc_class(cls);
                    if raw.is_null() {
                        eprintln!("sac_rs: out of memory (alloc_class)");
                        std::process::exit(2);
                    }
                    black_box(raw);
                    // SAFETY: the block has cls.size() >= 4 * x bytes, aligned for i32.
                    let t = unsafe {
                        std::slice::from_raw_parts_mut(raw as *mut MaybeUninit<i32>, p.x)
                    };
                    let v = fill_and_sum(t, idx);
                    // SAFETY: raw came from alloc_class(cls), is freed once
                    // and not used after.
                    unsafe {
                        if mode == Mode::CanopyUnchecked {
                            canopy_alloc::free_class_unchecked(raw, cls)
                        } else {
                            canopy_alloc::free_class(raw, cls)
                        }
                    };
                    v
                }
                Mode::Bound => fill_and_sum(own.as_mut().expect("bound temporary"), idx),
            };
            // SAFETY: idx is in this thread's chunk of both arrays; chunks are disjoint;
            // a[idx] was initialised by the previous iteration (or is zero).
            unsafe { *b.add(idx) = (*a.add(idx)).wrapping_add(v) };
        }
        barrier.wait();
        if tid == 0 {
            // SAFETY: the others wait at the next barrier; every element of b is written.
            unsafe {
                let arr = &mut *shared.0.get();
                free_array(arr.a, len);
                arr.a = arr.b;
            }
        }
    }
    barrier.wait();
    let secs = start.elapsed().as_secs_f64();
    drop(own.take());
    secs
}

/// Run the kernel.
pub fn run(p: Params, mode: Mode) -> Result<Outcome, String> {
    if p.x == 0 || p.n < p.x || p.iters == 0 || p.threads == 0 {
        return Err("need X >= 1, N >= X, ITERS >= 1, THREADS >= 1".into());
    }
    let class = if matches!(mode, Mode::CanopyRich | Mode::CanopyUnchecked) {
        Some(
            SizeClass::of(p.x * 4)
                .ok_or_else(|| format!("a temporary of {} bytes has no size class", p.x * 4))?,
        )
    } else {
        None
    };
    let len = p.n / p.x;
    let a = Box::into_raw(vec![0u64; len].into_boxed_slice()) as *mut u64;
    let shared = Shared(UnsafeCell::new(Arrays {
        a,
        b: std::ptr::null_mut(),
    }));
    let barrier = Barrier::new(p.threads);
    let seconds = std::thread::scope(|s| {
        for tid in 1..p.threads {
            let (shared, barrier, pr) = (&shared, &barrier, &p);
            s.spawn(move || worker(tid, pr, mode, class, shared, barrier));
        }
        worker(0, &p, mode, class, &shared, &barrier)
    });
    let arr = shared.0.into_inner();
    // SAFETY: a has len initialised elements (all workers are joined).
    let a = unsafe { std::slice::from_raw_parts(arr.a, len) };
    let checksum = a.iter().fold(0u64, |s, v| s.wrapping_add(*v));
    // SAFETY: arr.a is a boxed slice of len elements, freed once.
    unsafe { free_array(arr.a, len) };
    Ok(Outcome {
        checksum,
        seconds,
        pairs: (len * p.iters) as u64,
    })
}

/// This process's peak resident set size in KiB (`VmHWM`), which unlike the
/// `ru_maxrss` its parent sees does not include the parent's size at fork.
pub fn peak_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `main` of the SAC binaries: `PROG MODE X N ITERS THREADS`, where MODE is
/// one of `allowed`.  Prints the result line of `c/sac.c`.
pub fn main_with(prog: &str, allowed: &[Mode]) -> ! {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let names: Vec<&str> = allowed.iter().map(|m| m.name()).collect();
    let usage = || -> ! {
        eprintln!("usage: {prog} {} X N ITERS THREADS", names.join("|"));
        std::process::exit(2)
    };
    if args.len() != 5 {
        usage();
    }
    let Some(mode) = Mode::parse(&args[0]).filter(|m| allowed.contains(m)) else {
        eprintln!(
            "{prog}: mode {:?} is not available in this binary (modes: {})",
            args[0],
            names.join(", ")
        );
        std::process::exit(2)
    };
    let num = |s: &str| s.parse::<usize>().unwrap_or_else(|_| usage());
    let p = Params {
        x: num(&args[1]),
        n: num(&args[2]),
        iters: num(&args[3]),
        threads: num(&args[4]),
    };
    match run(p, mode) {
        Ok(o) => {
            println!(
                "checksum={} seconds={:.6} pairs={} mode={} x={} n={} iters={} threads={} peak_kib={}",
                o.checksum,
                o.seconds,
                o.pairs,
                mode.name(),
                p.x,
                p.n,
                p.iters,
                p.threads,
                peak_kib().map_or(-1, |k| k as i64)
            );
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("{prog}: {e}");
            std::process::exit(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formula_matches_brute_force() {
        for (x, n, iters) in [
            (25u64, 1000u64, 3u64),
            (1000, 5000, 2),
            (7, 100, 1),
            (3, 3, 4),
        ] {
            let m = n / x;
            let mut s = 0u64;
            for idx in 0..m {
                for i in 0..x {
                    s = s.wrapping_add(idx + i);
                }
            }
            assert_eq!(
                expected_checksum(x, n, iters),
                s.wrapping_mul(iters),
                "x={x} n={n}"
            );
        }
        // The value the C program printed for X=25, N=10^6, 10 iterations.
        assert_eq!(expected_checksum(25, 1_000_000, 10), 200_115_000_000);
    }

    #[test]
    fn kernel_matches_formula_in_system_and_bound_modes() {
        for threads in [1, 2, 3] {
            for mode in [Mode::System, Mode::Bound] {
                let p = Params {
                    x: 25,
                    n: 10_000,
                    iters: 3,
                    threads,
                };
                let o = run(p, mode).unwrap();
                assert_eq!(
                    o.checksum,
                    expected_checksum(25, 10_000, 3),
                    "{mode:?} threads={threads}"
                );
                assert_eq!(o.pairs, 1200);
            }
        }
    }

    #[test]
    fn kernel_on_canopy_rich_interface() {
        for threads in [1, 2] {
            let p = Params {
                x: 100,
                n: 20_000,
                iters: 2,
                threads,
            };
            for mode in [Mode::CanopyRich, Mode::CanopyUnchecked] {
                let o = run(p, mode).unwrap();
                assert_eq!(o.checksum, expected_checksum(100, 20_000, 2), "{mode:?}");
            }
        }
    }

    #[test]
    fn modes_round_trip() {
        for m in [
            Mode::System,
            Mode::CanopyGlobal,
            Mode::CanopyRich,
            Mode::CanopyUnchecked,
            Mode::Bound,
        ] {
            assert_eq!(Mode::parse(m.name()), Some(m));
        }
        assert_eq!(Mode::parse("malloc"), None);
        assert!(peak_kib().unwrap() > 0);
        assert!(run(
            Params {
                x: 0,
                n: 1,
                iters: 1,
                threads: 1
            },
            Mode::Bound
        )
        .is_err());
    }
}
