//! Allocation in a fresh region against Canopy's malloc when the program
//! writes each object, as region-speed measures it but in a loop small enough
//! for callgrind and with the region's configuration from the environment
//! (`CANOPY_REGION_SLAB`, `CANOPY_REGION_HIGH`, ... as `Config::from_env`):
//!
//! `probe_touch SIZE N ROUNDS` allocates N objects of SIZE bytes per round,
//! writes the first word of each (not with `NOTOUCH=1`) and keeps the
//! pointers; the region round allocates in a fresh region (freed whole after
//! the clock stops), the malloc round frees one by one after it.  The two
//! alternate, the first round of each is a warm-up; prints the medians.
//! For instruction counts: `valgrind --tool=callgrind --collect-atstart=no
//! --toggle-collect='*fill_region*'` (or `*fill_malloc*`).
//!
//! Diagnostics: `ROUNDS=1` prints every round's time, `COLD=1` reads 64 MiB
//! before each round (a clean, cold cache: the round before's dirty lines
//! are written back outside the clock), `FRESH=1` gives the memory back after
//! each round (`trim`, `collect`), so the next round faults in new pages.

use std::time::Instant;

use canopy_region::{Config, RegionAllocator, RegionId};

/// Allocate `n` objects of `size` bytes through `inr`, writing each (unless
/// `touch` is false) and keeping its address.
#[inline(never)]
pub fn fill_region(inr: &mut canopy_region::InRegion<'_>, size: usize, n: usize, touch: bool, ptrs: &mut Vec<*mut u8>) {
    for i in 0..n {
        let p = inr.alloc(std::hint::black_box(size)).expect("region allocation").as_ptr();
        if touch {
            // SAFETY: p is a fresh allocation of at least size >= 8 bytes
            // (checked in main), aligned to 8 at least.
            unsafe { (p as *mut u64).write_volatile(i as u64) };
        }
        ptrs.push(p);
    }
}

/// [`fill_region`] with Canopy's malloc.
#[inline(never)]
pub fn fill_malloc(size: usize, n: usize, touch: bool, ptrs: &mut Vec<*mut u8>) {
    for i in 0..n {
        let p = canopy_alloc::alloc(std::hint::black_box(size));
        assert!(!p.is_null(), "malloc({size}) failed");
        if touch {
            // SAFETY: as in fill_region.
            unsafe { (p as *mut u64).write_volatile(i as u64) };
        }
        ptrs.push(p);
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: usize| a.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (size, n, rounds) = (arg(1, 64), arg(2, 1_000_000), arg(3, 9).max(1));
    assert!(size >= 8, "SIZE must be at least 8 (the first word is written)");
    let touch = std::env::var_os("NOTOUCH").is_none();
    let cfg = Config::from_env().expect("CANOPY_REGION_* variables");
    let mut ra = RegionAllocator::with_config(cfg).expect("region configuration");
    let mut ptrs: Vec<*mut u8> = Vec::with_capacity(n);
    let (mut tr, mut tm) = (Vec::new(), Vec::new());
    // With COLD=1 every round starts with a clean cold cache: 64 MiB read
    // first (dirty lines of the round before are written back here).
    let cold: Vec<u64> = if std::env::var_os("COLD").is_some() { vec![1; 8 << 20] } else { Vec::new() };
    for round in 0..=rounds {
        for k in 0..2 {
            ptrs.clear();
            std::hint::black_box(cold.iter().step_by(8).fold(0u64, |a, &x| a.wrapping_add(x)));
            if (k + round) % 2 == 0 {
                let rid = ra.ralloc(RegionId::ROOT, 0).expect("ralloc");
                let t = Instant::now();
                fill_region(&mut ra.in_region(rid).expect("in_region"), size, n, touch, &mut ptrs);
                let e = t.elapsed().as_nanos() as f64 / n as f64;
                ra.rfree(rid).expect("rfree");
                if std::env::var_os("FRESH").is_some() {
                    ra.trim();
                }
                if round > 0 {
                    tr.push(e);
                }
            } else {
                let t = Instant::now();
                fill_malloc(size, n, touch, &mut ptrs);
                let e = t.elapsed().as_nanos() as f64 / n as f64;
                for &p in &ptrs {
                    // SAFETY: allocated by fill_malloc just above, freed once.
                    unsafe { canopy_alloc::free(p) };
                }
                if std::env::var_os("FRESH").is_some() {
                    canopy_alloc::collect();
                }
                if round > 0 {
                    tm.push(e);
                }
            }
        }
    }
    if std::env::var_os("ROUNDS").is_some() {
        let f = |v: &[f64]| v.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(" ");
        println!("region rounds: {}\nmalloc rounds: {}", f(&tr), f(&tm));
    }
    let (r, m) = (median(&mut tr), median(&mut tm));
    println!(
        "size {size} n {n} slab {} touch {touch}: region {r:.2} ns, malloc {m:.2} ns per object, ratio {:.3}",
        ra.config().slab_size,
        r / m
    );
}
