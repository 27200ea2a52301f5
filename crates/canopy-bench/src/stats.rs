//! The arithmetic of a report: medians of repeated runs, ratios between
//! contenders and geometric means over workloads.
//!
//! Every function here is total: an empty or invalid input gives `None`
//! rather than a NaN that would end up printed in a table.

/// Median of `xs` (the mean of the two middle values for an even count).
/// `None` when `xs` is empty or holds a NaN.
pub fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() || xs.iter().any(|x| x.is_nan()) {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Median of integer samples (peak RSS in KiB), rounded down.
pub fn median_u64(xs: &[u64]) -> Option<u64> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_unstable();
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        v[n / 2 - 1] / 2 + v[n / 2] / 2 + (v[n / 2 - 1] % 2 + v[n / 2] % 2) / 2
    })
}

/// `a / b`, or `None` when either side is missing or `b` is not positive.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() && b.is_finite() => Some(a / b),
        _ => None,
    }
}

/// Geometric mean of positive values; `None` when `xs` is empty or holds a
/// value that is not positive and finite.
pub fn geomean(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() || xs.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
        return None;
    }
    let mean_log = xs.iter().map(|x| x.ln()).sum::<f64>() / xs.len() as f64;
    Some(mean_log.exp())
}

/// The share of a run spent in the allocator, estimated against the
/// compute-only bound: `(t - t_bound) / t`.  May be negative when the run
/// was faster than the bound (noise).
pub fn alloc_share(t: Option<f64>, t_bound: Option<f64>) -> Option<f64> {
    match (t, t_bound) {
        (Some(t), Some(b)) if t > 0.0 && b.is_finite() => Some((t - b) / t),
        _ => None,
    }
}

/// Instructions per malloc+free pair: `(ir_mode - ir_bound) / pairs`.
pub fn per_pair(ir_mode: u64, ir_bound: u64, pairs: u64) -> Option<f64> {
    if pairs == 0 {
        return None;
    }
    Some((ir_mode as f64 - ir_bound as f64) / pairs as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.5]), Some(7.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, f64::NAN]), None);
    }

    #[test]
    fn median_of_integers() {
        assert_eq!(median_u64(&[5, 1, 9]), Some(5));
        assert_eq!(median_u64(&[1, 2, 3, 4]), Some(2));
        assert_eq!(median_u64(&[3, 5]), Some(4));
        assert_eq!(median_u64(&[u64::MAX, u64::MAX]), Some(u64::MAX));
        assert_eq!(median_u64(&[]), None);
    }

    #[test]
    fn ratios() {
        assert_eq!(ratio(Some(3.0), Some(2.0)), Some(1.5));
        assert_eq!(ratio(Some(3.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(2.0)), None);
        assert_eq!(ratio(Some(1.0), None), None);
    }

    #[test]
    fn geometric_mean() {
        let g = geomean(&[1.0, 4.0]).unwrap();
        assert!((g - 2.0).abs() < 1e-12);
        let g = geomean(&[2.0, 2.0, 2.0]).unwrap();
        assert!((g - 2.0).abs() < 1e-12);
        assert_eq!(geomean(&[]), None);
        assert_eq!(geomean(&[1.0, 0.0]), None);
        assert_eq!(geomean(&[1.0, -1.0]), None);
    }

    #[test]
    fn shares_and_pairs() {
        assert_eq!(alloc_share(Some(2.0), Some(0.5)), Some(0.75));
        assert_eq!(alloc_share(Some(0.0), Some(0.5)), None);
        assert_eq!(per_pair(1_000, 400, 10), Some(60.0));
        assert_eq!(per_pair(400, 1_000, 10), Some(-60.0));
        assert_eq!(per_pair(1, 1, 0), None);
    }
}
