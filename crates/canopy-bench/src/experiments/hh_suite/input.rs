//! The deterministic input generators of the suite.
//!
//! Every input is a pure function of `(size parameters, seed)`; the thread
//! count never changes it.  Element `i` of a random array is
//! [`at(seed, i)`](at), the `i`-th output of the SplitMix64 stream that
//! [`Rng::new(seed)`](crate::experiments::region::Rng) produces, computed by
//! random access so that arrays can be filled in parallel.  Text is cut into
//! fixed 64 KiB blocks; block `b` is written by its own `Rng` seeded with
//! `at(seed ^ TEXT_SALT, b)`, so it too is the same whichever thread writes
//! which block.

use rayon::prelude::*;

use crate::experiments::region::Rng;

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64's output function (Stafford's Mix13).
#[inline(always)]
pub fn fmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `i`-th (from 0) output of `Rng::new(seed)`, by random access.
#[inline(always)]
pub fn at(seed: u64, i: u64) -> u64 {
    fmix((seed ^ 0x6a09_e667_f3bc_c908).wrapping_add(i.wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// `n` hashed 64-bit integers (msort-int64's input): element `i` is `at(seed, i)`
/// reinterpreted as signed.
pub fn hashed_i64(n: usize, seed: u64) -> Vec<i64> {
    (0..n as u64)
        .into_par_iter()
        .map(|i| at(seed, i) as i64)
        .collect()
}

/// `n` integers uniform in `-1000..1000` (mcss's input).
pub fn small_i64(n: usize, seed: u64) -> Vec<i64> {
    (0..n as u64)
        .into_par_iter()
        .map(|i| ((at(seed, i) >> 32) % 2000) as i64 - 1000)
        .collect()
}

/// `n` points near the line y = 3x + 12345 (linefit's input): x uniform in
/// `0..65536`, y = 3x + 12345 + noise with noise uniform in `-1000..=1000`.
/// Coordinates are integers, so sums over them are exact in any order.
pub fn line_points(n: usize, seed: u64) -> Vec<(i64, i64)> {
    (0..n as u64)
        .into_par_iter()
        .map(|i| {
            let h = at(seed, i);
            let x = (h & 0xffff) as i64;
            let noise = ((h >> 16) % 2001) as i64 - 1000;
            (x, 3 * x + 12_345 + noise)
        })
        .collect()
}

/// Uniform in `[0, 1)` from 53 bits of `h`.
#[inline(always)]
pub fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// A sparse matrix in compressed sparse row form.
#[derive(Debug, Clone)]
pub struct Csr {
    /// Rows (= columns: the matrix is square).
    pub rows: usize,
    /// Row `r`'s entries are `offsets[r]..offsets[r + 1]`.
    pub offsets: Vec<usize>,
    /// Column of each entry.
    pub cols: Vec<u32>,
    /// Value of each entry.
    pub vals: Vec<f64>,
}

/// sparse-mxv's input: a `rows` x `rows` matrix with `degree` entries per row
/// at uniformly random columns (repeats allowed), values uniform in `[0, 1)`,
/// and a dense vector of `rows` values uniform in `[0, 1)`.
pub fn sparse(rows: usize, degree: usize, seed: u64) -> (Csr, Vec<f64>) {
    assert!(rows <= u32::MAX as usize, "sparse-mxv: at most 2^32 rows");
    let degree = degree.max(1);
    let nnz = rows * degree;
    let cols: Vec<u32> = (0..nnz as u64)
        .into_par_iter()
        .map(|k| (((at(seed, k) >> 32) * rows as u64) >> 32) as u32)
        .collect();
    let vals: Vec<f64> = (0..nnz as u64)
        .into_par_iter()
        .map(|k| unit(at(seed ^ 0x5eed_0001, k)))
        .collect();
    let offsets: Vec<usize> = (0..=rows).map(|r| r * degree).collect();
    let x: Vec<f64> = (0..rows as u64)
        .into_par_iter()
        .map(|j| unit(at(seed ^ 0x5eed_0002, j)))
        .collect();
    (
        Csr {
            rows,
            offsets,
            cols,
            vals,
        },
        x,
    )
}

/// Bytes per independently generated text block.
pub const TEXT_BLOCK: usize = 1 << 16;
const TEXT_SALT: u64 = 0x7e47_7e47_7e47_7e47;

/// `n` bytes of ASCII text: words of 1 to 12 lower-case letters separated by
/// runs of 1 to 3 whitespace bytes (space 70 %, newline 20 %, tab 10 %).
/// A block boundary may fall inside a word or a separator; the text is
/// still text.  Used by tokens and wc.
pub fn text(n: usize, seed: u64) -> String {
    let mut buf = vec![0u8; n];
    buf.par_chunks_mut(TEXT_BLOCK)
        .enumerate()
        .for_each(|(b, block)| fill_block(block, at(seed ^ TEXT_SALT, b as u64)));
    String::from_utf8(buf).expect("the generator writes ASCII only")
}

fn fill_block(block: &mut [u8], seed: u64) {
    let mut rng = Rng::new(seed);
    let mut i = 0;
    while i < block.len() {
        let word = 1 + rng.below(12);
        for _ in 0..word {
            if i == block.len() {
                return;
            }
            block[i] = b'a' + rng.below(26) as u8;
            i += 1;
        }
        let gap = 1 + rng.below(3);
        for _ in 0..gap {
            if i == block.len() {
                return;
            }
            let r = rng.below(10);
            block[i] = match r {
                0..=6 => b' ',
                7 | 8 => b'\n',
                _ => b'\t',
            };
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_is_the_rng_stream() {
        let mut r = Rng::new(42);
        for i in 0..100 {
            assert_eq!(at(42, i), r.next_u64());
        }
    }

    #[test]
    fn generators_do_not_depend_on_threads() {
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let two = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let t1 = one.install(|| text(3 * TEXT_BLOCK + 17, 9));
        let t2 = two.install(|| text(3 * TEXT_BLOCK + 17, 9));
        assert_eq!(t1, t2);
        assert_eq!(t1.len(), 3 * TEXT_BLOCK + 17);
        assert!(t1
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_whitespace()));
        assert_ne!(text(1000, 9), text(1000, 10));
        let (a, xa) = one.install(|| sparse(100, 5, 3));
        let (b, xb) = two.install(|| sparse(100, 5, 3));
        assert_eq!((a.cols, a.vals, xa), (b.cols, b.vals, xb));
        assert!(a.offsets.len() == 101 && a.offsets[100] == 500);
        let p = line_points(1000, 1);
        assert!(p
            .iter()
            .all(|&(x, y)| (0..65536).contains(&x) && (y - 3 * x - 12_345).abs() <= 1000));
        assert!(small_i64(1000, 1).iter().all(|v| (-1000..1000).contains(v)));
    }
}
