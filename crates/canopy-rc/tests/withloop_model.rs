//! With-loops against a model: random shapes of rank 0 to 3, one or two
//! generators on random boxes, random grains (so parallel chunks start and
//! end in the middle of rows), for `genarray` and `modarray`.  Every element
//! and the index vector each expression saw are checked.
#![cfg(not(canopy_loom))]

use canopy_rc::{genarray, Array, Atomic, Gen, Local};
use proptest::prelude::*;

/// A number that names an index vector (dimensions below 64).
fn code(iv: &[usize]) -> u64 {
    iv.iter().fold(1u64, |c, &i| c * 64 + i as u64)
}

/// The row-major index vector of `flat` in `shape`.
fn unflatten(shape: &[usize], mut flat: usize) -> Vec<usize> {
    let mut iv = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        iv[d] = flat % shape[d];
        flat /= shape[d];
    }
    iv
}

fn inside(lo: &[usize], hi: &[usize], iv: &[usize]) -> bool {
    iv.iter().enumerate().all(|(d, &i)| lo[d] <= i && i < hi[d])
}

#[derive(Debug, Clone)]
struct Case {
    shape: Vec<usize>,
    /// Non-overlapping boxes (split along axis 0 when there are two).
    boxes: Vec<(Vec<usize>, Vec<usize>)>,
    grain: usize,
}

fn case() -> impl Strategy<Value = Case> {
    (0usize..=3)
        .prop_flat_map(|rank| {
            (
                proptest::collection::vec(0usize..=40, rank),
                proptest::collection::vec((0usize..=40, 0usize..=40), rank),
                0usize..=40,
                0u8..3,
                1usize..=24,
            )
        })
        .prop_map(|(shape, cuts, split, form, grain)| {
            let rank = shape.len();
            let s0 = shape.first().map_or(0, |&n| split.min(n));
            // A box inside the shape from the cuts, axis 0 replaced if asked.
            let mk = |axis0: Option<(usize, usize)>| {
                let mut lo = vec![0; rank];
                let mut hi = vec![0; rank];
                for d in 0..rank {
                    let (x, y) = cuts[d];
                    let (x, y) = (x.min(shape[d]), y.min(shape[d]));
                    lo[d] = x.min(y);
                    hi[d] = x.max(y);
                }
                if let Some((a0, b0)) = axis0 {
                    lo[0] = a0;
                    hi[0] = b0;
                }
                (lo, hi)
            };
            // The boxes: form 0, one box covering the shape (genarray's
            // write-once path); form 1, one box from the cuts; form 2 (rank
            // above 0), two boxes, the second taking axis 0 from `split`
            // on and the first the rest.
            let boxes = match form {
                0 => vec![(vec![0; rank], shape.clone())],
                2 if rank > 0 => vec![mk(Some((0, s0))), mk(Some((s0, shape[0])))],
                _ => vec![mk(None)],
            };
            Case { shape, boxes, grain }
        })
}

/// Generator `k`'s expression: names the generator and the index vector,
/// and (for updates) keeps the old value.
fn value(k: usize, iv: &[usize], old: u64) -> u64 {
    old.wrapping_mul(31) ^ (code(iv) << 2 | k as u64)
}

fn cfg() -> ProptestConfig {
    let cases = std::env::var("CANOPY_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    ProptestConfig::with_cases(cases)
}

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn with_loops_match_the_model(c in case()) {
        let len: usize = c.shape.iter().product();
        let default = 7u64;
        let gens = |update: bool| -> Vec<Gen<'static, u64>> {
            c.boxes
                .iter()
                .enumerate()
                .map(|(k, (lo, hi))| {
                    let g = if update {
                        Gen::update(lo, hi, move |iv, &old| value(k, iv, old))
                    } else {
                        Gen::new(lo, hi, move |iv| value(k, iv, default))
                    };
                    g.grain(c.grain)
                })
                .collect()
        };
        let model = |start: &dyn Fn(usize) -> u64| -> Vec<u64> {
            (0..len)
                .map(|i| {
                    let iv = unflatten(&c.shape, i);
                    let old = start(i);
                    c.boxes
                        .iter()
                        .position(|(lo, hi)| inside(lo, hi, &iv))
                        .map_or(old, |k| value(k, &iv, old))
                })
                .collect()
        };
        // genarray: one generator over the whole shape takes the
        // write-once path; boxes that leave elements out fill first.
        let g: Array<u64, Atomic> = genarray(&c.shape, default, &gens(false));
        let want = model(&|_| default);
        prop_assert_eq!(g.as_slice(), &want[..], "genarray {:?}", c);
        // modarray in place (unique) and on a copy (shared), from values
        // that differ per element.
        let start = |i: usize| i as u64 * 1_000_003;
        let want = model(&start);
        let a: Array<u64, Local> = Array::from_fn(&c.shape, start);
        let m = a.modarray(&gens(true));
        prop_assert_eq!(m.as_slice(), &want[..], "modarray in place {:?}", c);
        let b: Array<u64, Atomic> = Array::from_fn(&c.shape, start);
        let keep = b.clone();
        let m = b.modarray(&gens(true));
        prop_assert_eq!(m.as_slice(), &want[..], "modarray on a copy {:?}", c);
        let orig: Vec<u64> = (0..len).map(start).collect();
        prop_assert_eq!(keep.as_slice(), &orig[..], "the shared input changed {:?}", c);
    }
}
