//! What the region experiments share ([`region_frag`](super::region_frag),
//! [`region_speed`](super::region_speed), [`region_pack`](super::region_pack)):
//! their options, a seeded random number generator, and the report helpers.
//!
//! Unlike the allocator experiments, these run in-process: the contenders
//! (Canopy's region allocator, glibc's malloc, Canopy's allocator called
//! directly, `bumpalo`, `typed-arena`, `slab`) are libraries called from the
//! `canopy` binary, one after the other, never two at the same time.

use std::path::PathBuf;

use crate::report::Size;

/// Settings the region experiments share.
#[derive(Debug, Clone)]
pub struct RegionCommon {
    /// Problem size.
    pub size: Size,
    /// Repetitions per configuration (`None`: the size's default).
    pub runs: Option<usize>,
    /// Where results go.
    pub results_dir: PathBuf,
}

impl RegionCommon {
    /// Repetitions per configuration.
    pub fn runs(&self) -> usize {
        self.runs.unwrap_or_else(|| self.size.default_runs()).max(1)
    }
}

/// A small, fast, seeded generator (SplitMix64): the same seed gives the
/// same sequence on every machine, so every experiment is deterministic.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x6a09_e667_f3bc_c908)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), by multiply-shift.
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

/// `met` / `not met` for a target.
pub fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "not met"
    }
}

/// Nanoseconds with three significant digits.
pub fn fmt_ns(ns: Option<f64>) -> String {
    match ns {
        None => "–".into(),
        Some(v) if v >= 1e9 => format!("{:.2} s", v / 1e9),
        Some(v) if v >= 1e6 => format!("{:.2} ms", v / 1e6),
        Some(v) if v >= 1e4 => format!("{:.1} µs", v / 1e3),
        Some(v) if v >= 100.0 => format!("{v:.0} ns"),
        Some(v) => format!("{v:.1} ns"),
    }
}

/// Bytes as B / KiB / MiB.
pub fn fmt_bytes(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    } else if b >= 1 << 10 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{b} B")
    }
}

/// 10^k as `1e3`, ... for labels.
pub fn fmt_count(n: usize) -> String {
    let mut k = 0;
    let mut m = n;
    while m >= 10 && m % 10 == 0 {
        m /= 10;
        k += 1;
    }
    if m == 1 && k >= 3 {
        format!("1e{k}")
    } else {
        n.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_seeded_and_in_range() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..1000 {
            assert_eq!(a.next_u64(), b.next_u64());
            let x = a.below(10);
            assert!(x < 10);
            assert_eq!(x, b.below(10));
            let u = a.unit();
            assert!((0.0..1.0).contains(&u));
            b.unit();
        }
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_count(1000), "1e3");
        assert_eq!(fmt_count(1_000_000), "1e6");
        assert_eq!(fmt_count(30_000), "30000");
        assert_eq!(fmt_ns(Some(12.345)), "12.3 ns");
        assert_eq!(fmt_ns(Some(2.5e6)), "2.50 ms");
        assert_eq!(fmt_bytes(2048), "2.0 KiB");
        assert_eq!(verdict(true), "met");
    }
}
