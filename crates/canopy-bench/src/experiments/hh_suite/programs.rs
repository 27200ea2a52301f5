//! The nine programs.  Each is a unit struct implementing [`Program`]: its
//! sizes, its input generator, one body per [`Variant`] and the check of its
//! output.  The sequential body is the sequential elision of the parallel
//! algorithm, written as one would write it in plain Rust (the analogue of
//! the paper's MLton column); the rayon body forks with `rayon::join` or
//! parallel iterators and allocates with the system allocator; the canopy-hh
//! body forks with `Scope::par` (and `par_for`, `par_reduce`, `par_gc`) and
//! allocates what the algorithm allocates in the managed heap, reading the
//! input where the harness left it (borrowed Rust data, as the rayon body
//! does). Its last step turns the managed result into the program's `Output`
//! in one pass.

use canopy_hh::{Gc, Scope};
use rayon::prelude::*;

use super::input::{self, Csr};
use super::managed::{self, Seq};
use super::{Answer, Params, Program, Variant};
use crate::report::Size;

/// An order-dependent hash of a sequence of words (untimed result checks).
#[derive(Debug, Clone, Copy)]
pub struct Hasher(u64);

impl Default for Hasher {
    fn default() -> Self {
        Hasher(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher {
    /// Mix in one word.
    #[inline(always)]
    pub fn add(&mut self, x: u64) {
        self.0 = (self.0 ^ x)
            .wrapping_mul(0x0000_0100_0000_01b3)
            .rotate_left(29);
    }

    /// The hash so far.
    pub fn finish(self) -> u64 {
        input::fmix(self.0)
    }
}

fn hash_all<I: IntoIterator<Item = u64>>(it: I) -> u64 {
    let mut h = Hasher::default();
    for x in it {
        h.add(x);
    }
    h.finish()
}

fn pick<T>(size: Size, quick: T, default: T, paper: T) -> T {
    match size {
        Size::Quick => quick,
        Size::Default => default,
        Size::Paper => paper,
    }
}

// ---------------------------------------------------------------- primes

/// Sieve of Eratosthenes: every prime up to n, in order.
pub struct Primes;

/// Odd numbers per sieve segment (a 64 KiB byte map: fits in L2).
const PRIME_SEGMENT: usize = 1 << 16;

/// The odd primes up to `limit` by the plain sieve (the sieving primes).
fn small_primes(limit: usize) -> Vec<usize> {
    let m = limit.saturating_sub(1) / 2; // odd k-index k <-> 2k + 1
    let mut composite = vec![false; m + 1];
    let mut out = Vec::new();
    for k in 1..=m {
        if !composite[k] {
            let p = 2 * k + 1;
            out.push(p);
            let mut j = (p * p - 1) / 2;
            while j <= m {
                composite[j] = true;
                j += p;
            }
        }
    }
    out
}

/// Sieve segment `s` (odd k-indices `s*SEG .. min((s+1)*SEG, m+1)`), appending
/// its primes to `out` (segment 0 starts with 2); `composite` is scratch of
/// `PRIME_SEGMENT` bytes.  Needs n >= 2.
fn sieve_segment(
    s: usize,
    m: usize,
    sieving: &[usize],
    composite: &mut [bool],
    out: &mut Vec<u32>,
) {
    let lo = s * PRIME_SEGMENT;
    let hi = ((s + 1) * PRIME_SEGMENT).min(m + 1);
    let seg = &mut composite[..hi - lo];
    seg.fill(false);
    let top = 2 * hi + 1; // exclusive bound on the numbers of this segment
    for &p in sieving {
        if p * p >= top {
            break;
        }
        // First k >= lo with 2k + 1 an odd multiple of p, and not below p*p.
        let r = (p - 1) / 2;
        let mut j = lo + (r + p - lo % p) % p;
        j = j.max((p * p - 1) / 2);
        while j < hi {
            seg[j - lo] = true;
            j += p;
        }
    }
    // k = 0 stands for 1, which is not prime; 2, the one even prime, takes its place.
    for (i, &c) in seg.iter().enumerate() {
        let k = lo + i;
        if !c {
            out.push(if k == 0 { 2 } else { (2 * k + 1) as u32 });
        }
    }
}

/// The odd primes up to `limit` by the plain sieve, as an immutable raw
/// array of the managed heap (the map is a managed byte array).
fn small_primes_hh<'s>(s: &mut Scope<'s>, limit: usize) -> Gc<'s> {
    let m = limit.saturating_sub(1) / 2;
    let map = s.raw::<u8>(m + 1);
    let mut count = 0;
    {
        let composite = s.raw_mut::<u8>(map);
        for k in 1..=m {
            if composite[k] == 0 {
                count += 1;
                let p = 2 * k + 1;
                let mut j = (p * p - 1) / 2;
                while j <= m {
                    composite[j] = 1;
                    j += p;
                }
            }
        }
    }
    let mut k = 1;
    let out = managed::build_staged::<u32>(s, count, |s, buf| {
        let composite = s.raw_slice::<u8>(map);
        let mut w = 0;
        while w < buf.len() {
            if composite[k] == 0 {
                buf[w] = (2 * k + 1) as u32;
                w += 1;
            }
            k += 1;
        }
        w
    });
    s.freeze(out);
    out
}

/// Segment `seg` sieved in a fresh managed byte map (the zeroed allocation is
/// the baseline's `fill(false)`), its primes returned as a fresh immutable raw
/// array of exactly their number. The map dies here; the collections at the
/// joins above reclaim it.
fn primes_segment_hh<'a>(s: &mut Scope<'a>, seg: usize, m: usize, sieving: Gc<'_>) -> Gc<'a> {
    s.scope_keep(|s| primes_sieve_hh(s, seg, m, sieving))
}

/// [`primes_segment_hh`]: the map is written (`with_raw_mut`) while the
/// sieving primes are read, and the primes are built straight into their
/// array (`raw_build`, staged in L1, never zeroed).
fn primes_sieve_hh<'a>(s: &mut Scope<'a>, seg: usize, m: usize, sieving: Gc<'_>) -> Gc<'a> {
    let lo = seg * PRIME_SEGMENT;
    let hi = ((seg + 1) * PRIME_SEGMENT).min(m + 1);
    let top = 2 * hi + 1;
    let map = s.raw::<u8>(hi - lo);
    // Write the map while reading the sieving primes (no staging).
    s.with_raw_mut::<u8, ()>(map, |s, composite| {
        for &p in s.raw_slice::<u32>(sieving) {
            let p = p as usize;
            if p * p >= top {
                break;
            }
            let r = (p - 1) / 2;
            let mut j = lo + (r + p - lo % p) % p;
            j = j.max((p * p - 1) / 2);
            while j < hi {
                composite[j - lo] = 1;
                j += p;
            }
        }
    });
    let count = s.raw_slice::<u8>(map).iter().filter(|&&c| c == 0).count();
    let mut at = 0;
    let out = managed::build_staged::<u32>(s, count, |s, buf| {
        let composite = s.raw_slice::<u8>(map);
        let mut w = 0;
        while w < buf.len() {
            if composite[at] == 0 {
                let k = lo + at;
                // k = 0 stands for 1, which is not prime; 2 takes its place.
                buf[w] = if k == 0 { 2 } else { (2 * k + 1) as u32 };
                w += 1;
            }
            at += 1;
        }
        w
    });
    s.freeze(out);
    out
}

/// Every prime up to n (n >= 2): one task per segment, each returning its
/// primes as a managed array; the arrays are joined into a rope at the joins
/// (no copying), which stays in the managed heap as the result.
fn primes_hh(n: usize, m: usize, segments: usize) -> Seq<u32> {
    Seq::rope(managed::run_keep(|s| {
        let sieving = small_primes_hh(s, (n as f64).sqrt() as usize + 1);
        managed::par_rope::<u32, _>(s, 0..segments, &|s, seg| primes_segment_hh(s, seg, m, sieving))
    }))
}

impl Program for Primes {
    type Input = usize;
    type Output<'a> = Seq<u32>;
    fn name(&self) -> &'static str {
        "primes"
    }
    fn about(&self) -> &'static str {
        "segmented sieve of Eratosthenes: every prime up to n as a Vec<u32>; answer: count and hash of the primes"
    }
    fn params(&self, size: Size) -> Params {
        Params::n(pick(size, 2_000_000, 100_000_000, 100_000_000))
    }
    fn label(&self, p: &Params) -> String {
        format!("n={}", p.n)
    }
    fn generate(&self, p: &Params, _seed: u64) -> usize {
        assert!(p.n <= u32::MAX as u64, "primes: n must fit in u32");
        p.n as usize
    }
    fn run(&self, v: Variant, &n: &usize) -> Seq<u32> {
        if n < 2 {
            return Seq::Vec(Vec::new());
        }
        let m = (n - 1) / 2;
        let segments = (m + 1).div_ceil(PRIME_SEGMENT);
        if v == Variant::Hh {
            return primes_hh(n, m, segments);
        }
        let sieving = small_primes((n as f64).sqrt() as usize + 1);
        match v {
            Variant::Seq => {
                // ~n / ln n primes; a little more room avoids the last doubling.
                let mut out = Vec::with_capacity((n as f64 / (n as f64).ln() * 1.2) as usize + 16);
                let mut scratch = vec![false; PRIME_SEGMENT];
                for s in 0..segments {
                    sieve_segment(s, m, &sieving, &mut scratch, &mut out);
                }
                Seq::Vec(out)
            }
            Variant::Rayon => Seq::Vec(
                (0..segments)
                    .into_par_iter()
                    .flat_map_iter(|s| {
                        let mut scratch = vec![false; PRIME_SEGMENT];
                        let mut out = Vec::new();
                        sieve_segment(s, m, &sieving, &mut scratch, &mut out);
                        out
                    })
                    .collect(),
            ),
            Variant::Hh => unreachable!("handled above"),
        }
    }
    fn answer(&self, out: &Seq<u32>, _input: &usize) -> Answer {
        let mut h = Hasher::default();
        out.for_each_slice(|xs| xs.iter().for_each(|&p| h.add(u64::from(p))));
        Answer {
            checksum: h.finish(),
            summary: format!("count:{},last:{}", out.len(), out.ends().map_or(0, |e| e.1)),
        }
    }
}

// ---------------------------------------------------------------- msort-int64

/// Merge sort of hashed 64-bit integers into a new vector.
pub struct Msort;

/// Elements below which the canopy-hh merge sort sorts sequentially.
const MSORT_CUTOFF: usize = 1 << 18;

/// Elements per piece of a canopy-hh merge: a merge of more is split into
/// pieces merged by parallel tasks, each into its own array.
const MERGE_PIECE: usize = 1 << 18;

/// Merge `x[*i..]` and `y[*j..]` (stably: ties from `x` first) into `buf`
/// until `buf` is full or one of them runs out; advances `i` and `j` and
/// returns the elements written.
#[inline]
fn merge_into(x: &[i64], y: &[i64], i: &mut usize, j: &mut usize, buf: &mut [i64]) -> usize {
    let (mut a, mut b, mut k) = (*i, *j, 0);
    while k < buf.len() && a < x.len() && b < y.len() {
        // Steps that cannot exhaust either run or the buffer.
        let steps = (buf.len() - k).min(x.len() - a).min(y.len() - b);
        for slot in &mut buf[k..k + steps] {
            let (u, v) = (x[a], y[b]);
            let take_x = u <= v;
            *slot = if take_x { u } else { v };
            a += usize::from(take_x);
            b += usize::from(!take_x);
        }
        k += steps;
    }
    (*i, *j) = (a, b);
    k
}

/// A sorted sequence held as a rope of immutable raw arrays (see
/// `managed::rope_*`), seen from one task: its leaves' handles and where
/// each starts.
struct Runs<'s> {
    leaves: Vec<Gc<'s>>,
    starts: Vec<usize>,
    len: usize,
}

impl<'s> Runs<'s> {
    fn of(s: &Scope<'s>, rope: Gc<'_>) -> Runs<'s> {
        let mut leaves = Vec::new();
        collect_leaves(s, rope, &mut leaves);
        let mut starts = Vec::with_capacity(leaves.len());
        let mut len = 0;
        for &g in &leaves {
            starts.push(len);
            len += s.raw_len::<i64>(g);
        }
        Runs { leaves, starts, len }
    }

    /// (leaf, offset) of element `i` (`i < len`).
    fn locate(&self, i: usize) -> (usize, usize) {
        let l = self.starts.partition_point(|&st| st <= i) - 1;
        (l, i - self.starts[l])
    }

    fn at(&self, s: &Scope<'_>, i: usize) -> i64 {
        let (l, o) = self.locate(i);
        s.raw_slice::<i64>(self.leaves[l])[o]
    }
}

fn collect_leaves<'s>(s: &Scope<'s>, g: Gc<'_>, out: &mut Vec<Gc<'s>>) {
    if s.kind(g) == canopy_hh::Kind::Tuple {
        for f in [1, 2] {
            if let canopy_hh::Val::Obj(c) = s.get(g, f) {
                collect_leaves(s, c, out);
            }
        }
    } else if s.raw_len::<i64>(g) > 0 {
        out.push(s.rebind(g));
    }
}

/// How many of the first `t` elements of the stable merge of `a` and `b`
/// come from `a` (ties go to `a`).
fn co_rank(s: &Scope<'_>, a: &Runs<'_>, b: &Runs<'_>, t: usize) -> usize {
    let (mut lo, mut hi) = (t.saturating_sub(b.len), t.min(a.len));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if a.at(s, mid) <= b.at(s, t - mid - 1) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Elements `range` of the stable merge of the sorted ropes `a` and `b`, as
/// a fresh immutable raw array (written through a stack buffer, the runs
/// read leaf by leaf).
fn merge_piece<'t>(s: &mut Scope<'t>, a: Gc<'_>, b: Gc<'_>, range: std::ops::Range<usize>) -> Gc<'t> {
    let (ra, rb) = (Runs::of(s, a), Runs::of(s, b));
    let ia = co_rank(s, &ra, &rb, range.start);
    let (mut ca, mut cb) = (
        if ia < ra.len { ra.locate(ia) } else { (ra.leaves.len(), 0) },
        if range.start - ia < rb.len { rb.locate(range.start - ia) } else { (rb.leaves.len(), 0) },
    );
    let out = managed::build_staged::<i64>(s, range.len(), |s, buf| {
        let empty: &[i64] = &[];
        let x = ra.leaves.get(ca.0).map_or(empty, |&g| s.raw_slice::<i64>(g));
        let y = rb.leaves.get(cb.0).map_or(empty, |&g| s.raw_slice::<i64>(g));
        let k = if ca.0 == ra.leaves.len() {
            let k = buf.len().min(y.len() - cb.1);
            buf[..k].copy_from_slice(&y[cb.1..cb.1 + k]);
            cb.1 += k;
            k
        } else if cb.0 == rb.leaves.len() {
            let k = buf.len().min(x.len() - ca.1);
            buf[..k].copy_from_slice(&x[ca.1..ca.1 + k]);
            ca.1 += k;
            k
        } else {
            merge_into(x, y, &mut ca.1, &mut cb.1, buf)
        };
        if ca.0 < ra.leaves.len() && ca.1 == x.len() {
            ca = (ca.0 + 1, 0);
        }
        if cb.0 < rb.leaves.len() && cb.1 == y.len() {
            cb = (cb.0 + 1, 0);
        }
        k
    });
    s.freeze(out);
    out
}

/// The sorted elements of `xs` as a rope of fresh immutable raw arrays:
/// halves sorted by two tasks (`par_gc`) and merged, in pieces of
/// [`MERGE_PIECE`] elements by parallel tasks (`par_rope`), each piece a new
/// array; below the cutoff, a copy sorted by `slice::sort` (the baseline's
/// sort).
fn msort_hh<'a>(s: &mut Scope<'a>, xs: &[i64]) -> Gc<'a> {
    if xs.len() <= MSORT_CUTOFF {
        // Built from the input (no zeroing), then sorted in place.
        let (out, ()) = s.raw_build::<i64, ()>(xs.len(), |_, o| o.extend_from_slice(xs));
        s.raw_mut::<i64>(out).sort();
        s.freeze(out);
        return out;
    }
    let (l, r) = xs.split_at(xs.len() / 2);
    let n = xs.len();
    let merged = s.scope_keep(|s| {
        let (a, b) = s.par_gc(|s| msort_hh(s, l), |s| msort_hh(s, r));
        managed::par_rope::<i64, _>(s, 0..n.div_ceil(MERGE_PIECE), &|s, p| {
            merge_piece(s, a, b, p * MERGE_PIECE..((p + 1) * MERGE_PIECE).min(n))
        })
    });
    // The two sorted halves are garbage now, half of this heap: the
    // collection at the join (when the heap is over its threshold) reclaims
    // them; the pieces are large objects and stay in place.
    merged
}

impl Program for Msort {
    type Input = Vec<i64>;
    type Output<'a> = Seq<i64>;
    fn name(&self) -> &'static str {
        "msort-int64"
    }
    fn about(&self) -> &'static str {
        "stable merge sort of hashed i64 into a fresh vector (slice::sort / par_sort); answer: hash of the sorted vector"
    }
    fn params(&self, size: Size) -> Params {
        Params::n(pick(size, 500_000, 10_000_000, 20_000_000))
    }
    fn label(&self, p: &Params) -> String {
        format!("n={}", p.n)
    }
    fn generate(&self, p: &Params, seed: u64) -> Vec<i64> {
        input::hashed_i64(p.n as usize, seed)
    }
    fn run(&self, v: Variant, xs: &Vec<i64>) -> Seq<i64> {
        match v {
            Variant::Seq => {
                let mut out = xs.to_vec();
                out.sort();
                Seq::Vec(out)
            }
            Variant::Rayon => {
                let mut out: Vec<i64> = xs.par_iter().copied().collect();
                out.par_sort();
                Seq::Vec(out)
            }
            Variant::Hh => Seq::rope(managed::run_keep(|s| msort_hh(s, xs))),
        }
    }
    fn answer(&self, out: &Seq<i64>, _input: &Vec<i64>) -> Answer {
        let mut h = Hasher::default();
        out.for_each_slice(|xs| xs.iter().for_each(|&x| h.add(x as u64)));
        let (min, max) = out.ends().unwrap_or((0, 0));
        Answer {
            checksum: h.finish(),
            summary: format!("len:{},min:{min},max:{max}", out.len()),
        }
    }
}

// ---------------------------------------------------------------- tokens

/// Split a text on ASCII whitespace into a vector of `&str`.
pub struct Tokens;

fn offsets_hash(text: &str, toks: &[&str]) -> u64 {
    let base = text.as_ptr() as usize;
    hash_all(
        toks.iter()
            .map(|t| (((t.as_ptr() as usize - base) as u64) << 8) ^ t.len() as u64),
    )
}

/// Bytes of text per canopy-hh tokens task: about 6.7k tokens, whose 8-byte
/// entries (53 KB) fit one 64 KiB chunk of the managed heap.
const TOKENS_BLOCK: usize = 56 << 10;

/// The tokens starting in block `b` of the text, as a fresh immutable raw
/// array of `offset << 32 | length` (an unboxed pair per token): counted in a
/// first pass, written in a second.
fn tokens_block_hh<'a>(s: &mut Scope<'a>, bytes: &[u8], b: usize) -> Gc<'a> {
    let lo = b * TOKENS_BLOCK;
    let hi = (lo + TOKENS_BLOCK).min(bytes.len());
    let before = lo == 0 || bytes[lo - 1].is_ascii_whitespace();
    let (_, count) = wc_chunk(&bytes[lo..hi], before);
    let out = s.raw::<u64>(count as usize);
    let o = s.raw_mut::<u64>(out);
    let (mut i, mut w, mut prev_space) = (lo, 0, before);
    while i < hi {
        let space = bytes[i].is_ascii_whitespace();
        if prev_space && !space {
            let mut j = i + 1;
            while j < bytes.len() && !bytes[j].is_ascii_whitespace() {
                j += 1;
            }
            o[w] = ((i as u64) << 32) | (j - i) as u64;
            w += 1;
            i = j;
            prev_space = false;
        } else {
            prev_space = space;
            i += 1;
        }
    }
    debug_assert_eq!(w, o.len());
    s.freeze(out);
    out
}

/// The tokens: one task per block, blocks' arrays joined into a rope, which
/// stays in the managed heap as the result (each token a packed
/// `offset << 32 | length` into the text: the unboxed form of a `&str` of it).
fn tokens_hh(text: &str) -> TokenList<'_> {
    let bytes = text.as_bytes();
    assert!(bytes.len() < 1 << 32, "tokens: the canopy-hh version packs offsets in 32 bits");
    TokenList::Packed(Seq::rope(managed::run_keep(|s| {
        let blocks = bytes.len().div_ceil(TOKENS_BLOCK);
        managed::par_rope::<u64, _>(s, 0..blocks, &|s, b| tokens_block_hh(s, bytes, b))
    })))
}

/// What tokens returns: `&str`s of the text (the sequential and rayon
/// variants), or packed `offset << 32 | length` pairs in a managed rope (the
/// canopy-hh variant).
#[derive(Debug)]
pub enum TokenList<'a> {
    /// Slices of the text.
    Strs(Vec<&'a str>),
    /// Packed (offset, length) pairs.
    Packed(Seq<u64>),
}

impl TokenList<'_> {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        match self {
            TokenList::Strs(v) => v.len(),
            TokenList::Packed(p) => p.len(),
        }
    }

    /// No tokens?
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// (offset, length) of every token, in order.
    pub fn spans(&self, text: &str) -> Vec<(usize, usize)> {
        match self {
            TokenList::Strs(v) => {
                let base = text.as_ptr() as usize;
                v.iter().map(|t| (t.as_ptr() as usize - base, t.len())).collect()
            }
            TokenList::Packed(p) => p.to_vec().into_iter().map(unpack_token).collect(),
        }
    }
}

fn unpack_token(t: u64) -> (usize, usize) {
    ((t >> 32) as usize, (t & 0xffff_ffff) as usize)
}

impl Program for Tokens {
    type Input = String;
    type Output<'a> = TokenList<'a>;
    fn name(&self) -> &'static str {
        "tokens"
    }
    fn about(&self) -> &'static str {
        "split generated text on ASCII whitespace into a Vec<&str> (split_ascii_whitespace / par_split_ascii_whitespace); answer: count and hash of (offset, length)"
    }
    fn params(&self, size: Size) -> Params {
        Params::n(pick(size, 2_000_000, 100_000_000, 500_000_000))
    }
    fn label(&self, p: &Params) -> String {
        format!("{} B of text", p.n)
    }
    fn generate(&self, p: &Params, seed: u64) -> String {
        input::text(p.n as usize, seed)
    }
    fn run<'a>(&self, v: Variant, text: &'a String) -> TokenList<'a> {
        match v {
            Variant::Seq => TokenList::Strs(text.split_ascii_whitespace().collect()),
            Variant::Rayon => TokenList::Strs(text.par_split_ascii_whitespace().collect()),
            Variant::Hh => tokens_hh(text),
        }
    }
    fn answer(&self, out: &TokenList<'_>, text: &String) -> Answer {
        let checksum = match out {
            TokenList::Strs(toks) => offsets_hash(text, toks),
            TokenList::Packed(p) => {
                let mut h = Hasher::default();
                p.for_each_slice(|ts| {
                    for &t in ts {
                        let (at, len) = unpack_token(t);
                        h.add(((at as u64) << 8) ^ len as u64);
                    }
                });
                h.finish()
            }
        };
        Answer {
            checksum,
            summary: format!("tokens:{}", out.len()),
        }
    }
}

// ---------------------------------------------------------------- mcss

/// Maximum contiguous subsequence sum (non-empty) of i64 values.
pub struct Mcss;

/// What the parallel mcss keeps per block: total, best prefix, best suffix,
/// best inside (all over non-empty ranges).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct McssSummary {
    total: i64,
    prefix: i64,
    suffix: i64,
    best: i64,
}

impl McssSummary {
    /// The summary of one leaf.  Never inlined, so the rayon and canopy-hh
    /// variants run the same machine code for their leaves: inlined into the
    /// two callers, the compiler chose different instruction schedules, and
    /// one ran 1.5x slower than the other on the same data.
    #[inline(never)]
    fn of(xs: &[i64]) -> Self {
        let (mut total, mut prefix, mut best, mut cur) = (0i64, i64::MIN, i64::MIN, i64::MIN);
        for &x in xs {
            total += x;
            prefix = prefix.max(total);
            cur = if cur > 0 { cur + x } else { x };
            best = best.max(cur);
        }
        // cur ends at the last element: the best suffix.
        McssSummary {
            total,
            prefix,
            suffix: cur,
            best,
        }
    }

    fn join(a: Self, b: Self) -> Self {
        McssSummary {
            total: a.total + b.total,
            prefix: a.prefix.max(a.total + b.prefix),
            suffix: b.suffix.max(b.total + a.suffix),
            best: a.best.max(b.best).max(a.suffix + b.prefix),
        }
    }
}

/// Elements per leaf of the parallel mcss and linefit reductions.
const LEAF: usize = 1 << 14;

/// Elements per leaf task of the canopy-hh mcss and linefit reductions
/// (`par_reduce` forks down to this many, where rayon's adaptive splitting
/// stops by itself).
const HH_LEAF: usize = 1 << 16;

impl Program for Mcss {
    type Input = Vec<i64>;
    type Output<'a> = i64;
    fn name(&self) -> &'static str {
        "mcss"
    }
    fn about(&self) -> &'static str {
        "maximum contiguous subsequence sum of i64 in -1000..1000 (Kadane / a reduction of (total, prefix, suffix, best)); answer: the sum"
    }
    fn params(&self, size: Size) -> Params {
        Params::n(pick(size, 2_000_000, 50_000_000, 100_000_000))
    }
    fn label(&self, p: &Params) -> String {
        format!("n={}", p.n)
    }
    fn generate(&self, p: &Params, seed: u64) -> Vec<i64> {
        input::small_i64(p.n as usize, seed)
    }
    fn run(&self, v: Variant, xs: &Vec<i64>) -> i64 {
        if xs.is_empty() {
            return 0;
        }
        match v {
            Variant::Seq => {
                let (mut best, mut cur) = (i64::MIN, 0i64);
                for &x in xs {
                    cur = if cur > 0 { cur + x } else { x };
                    best = best.max(cur);
                }
                best
            }
            Variant::Rayon => xs
                .par_chunks(LEAF)
                .map(McssSummary::of)
                .reduce_with(McssSummary::join)
                .map_or(0, |s| s.best),
            Variant::Hh => managed::run(|s| {
                s.par_reduce(
                    0..xs.len(),
                    HH_LEAF,
                    |_, r| McssSummary::of(&xs[r]),
                    McssSummary::join,
                )
                .best
            }),
        }
    }
    fn answer(&self, out: &i64, _input: &Vec<i64>) -> Answer {
        Answer {
            checksum: *out as u64,
            summary: format!("mcss:{out}"),
        }
    }
}

// ---------------------------------------------------------------- linefit

/// Least-squares line through integer points (exact integer sums).
pub struct Linefit;

/// n, Σx, Σy, Σx², Σxy (wrapping, hence associative in any order).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sums {
    n: i64,
    x: i64,
    y: i64,
    xx: i64,
    xy: i64,
}

impl Sums {
    #[inline(always)]
    fn add(mut self, &(x, y): &(i64, i64)) -> Self {
        self.n += 1;
        self.x = self.x.wrapping_add(x);
        self.y = self.y.wrapping_add(y);
        self.xx = self.xx.wrapping_add(x * x);
        self.xy = self.xy.wrapping_add(x * y);
        self
    }

    /// The sums of one leaf (never inlined: the rayon and canopy-hh variants
    /// run the same machine code for their leaves, see `McssSummary::of`).
    #[inline(never)]
    fn of(pts: &[(i64, i64)]) -> Self {
        pts.iter().fold(Sums::default(), Sums::add)
    }

    fn join(a: Self, b: Self) -> Self {
        Sums {
            n: a.n + b.n,
            x: a.x.wrapping_add(b.x),
            y: a.y.wrapping_add(b.y),
            xx: a.xx.wrapping_add(b.xx),
            xy: a.xy.wrapping_add(b.xy),
        }
    }

    /// (slope, intercept), computed from the exact sums.
    fn fit(self) -> (f64, f64) {
        let n = i128::from(self.n);
        let (sx, sy) = (i128::from(self.x), i128::from(self.y));
        let den = n * i128::from(self.xx) - sx * sx;
        if den == 0 {
            return (0.0, if n > 0 { sy as f64 / n as f64 } else { 0.0 });
        }
        let slope = (n * i128::from(self.xy) - sx * sy) as f64 / den as f64;
        let intercept = (sy as f64 - slope * sx as f64) / n as f64;
        (slope, intercept)
    }
}

impl Program for Linefit {
    type Input = Vec<(i64, i64)>;
    type Output<'a> = (f64, f64);
    fn name(&self) -> &'static str {
        "linefit"
    }
    fn about(&self) -> &'static str {
        "least-squares line through points near y = 3x + 12345 (a fold / reduction of n, Σx, Σy, Σx², Σxy); answer: slope and intercept"
    }
    fn params(&self, size: Size) -> Params {
        // Σx² stays below 2^63 for n up to ~2·10^9 (x < 2^16).
        Params::n(pick(size, 2_000_000, 30_000_000, 100_000_000))
    }
    fn label(&self, p: &Params) -> String {
        format!("n={}", p.n)
    }
    fn generate(&self, p: &Params, seed: u64) -> Vec<(i64, i64)> {
        input::line_points(p.n as usize, seed)
    }
    fn run(&self, v: Variant, pts: &Vec<(i64, i64)>) -> (f64, f64) {
        match v {
            Variant::Seq => pts.iter().fold(Sums::default(), Sums::add).fit(),
            Variant::Rayon => pts
                .par_chunks(LEAF)
                .map(Sums::of)
                .reduce(Sums::default, Sums::join)
                .fit(),
            Variant::Hh => managed::run(|s| {
                s.par_reduce(
                    0..pts.len(),
                    HH_LEAF,
                    |_, r| Sums::of(&pts[r]),
                    Sums::join,
                )
            })
            .fit(),
        }
    }
    fn answer(&self, &(s, i): &(f64, f64), _input: &Vec<(i64, i64)>) -> Answer {
        Answer {
            checksum: hash_all([s.to_bits(), i.to_bits()]),
            summary: format!("slope:{s:.6},intercept:{i:.3}"),
        }
    }
}

// ---------------------------------------------------------------- sparse-mxv

/// CSR sparse matrix times dense vector.
pub struct SparseMxv;

#[inline(always)]
fn row_dot(m: &Csr, x: &[f64], r: usize) -> f64 {
    let (a, b) = (m.offsets[r], m.offsets[r + 1]);
    m.cols[a..b]
        .iter()
        .zip(&m.vals[a..b])
        .map(|(&c, &v)| v * x[c as usize])
        .sum()
}

/// Rows per canopy-hh sparse-mxv task.
const MXV_ROWS: usize = 1 << 10;

impl Program for SparseMxv {
    type Input = (Csr, Vec<f64>);
    type Output<'a> = Seq<f64>;
    fn name(&self) -> &'static str {
        "sparse-mxv"
    }
    fn about(&self) -> &'static str {
        "y = A·x for a square CSR matrix with a fixed number of random columns per row; each row summed in order, so every variant gives the same bits; answer: hash of y"
    }
    fn params(&self, size: Size) -> Params {
        // (rows, entries per row): 10^8 entries at paper size (1.2 GB of matrix).
        let (n, d) = pick(size, (100_000, 20), (1_000_000, 50), (1_000_000, 100));
        Params { n, grain: d }
    }
    fn label(&self, p: &Params) -> String {
        format!("{} rows x {} per row", p.n, p.grain)
    }
    fn generate(&self, p: &Params, seed: u64) -> (Csr, Vec<f64>) {
        input::sparse(p.n as usize, p.grain as usize, seed)
    }
    fn run(&self, v: Variant, (m, x): &(Csr, Vec<f64>)) -> Seq<f64> {
        match v {
            Variant::Seq => Seq::Vec((0..m.rows).map(|r| row_dot(m, x, r)).collect()),
            Variant::Rayon => Seq::Vec((0..m.rows).into_par_iter().map(|r| row_dot(m, x, r)).collect()),
            // y is one managed raw array of the root task, the result; the
            // tasks fill disjoint blocks of rows with raw_set.
            Variant::Hh => Seq::rope(managed::run_keep(|s| {
                let y = s.raw::<f64>(m.rows);
                s.par_for(0..m.rows.div_ceil(MXV_ROWS), 1, |s, b| {
                    for r in b * MXV_ROWS..((b + 1) * MXV_ROWS).min(m.rows) {
                        s.raw_set(y, r, row_dot(m, x, r));
                    }
                });
                y
            })),
        }
    }
    fn answer(&self, y: &Seq<f64>, _input: &(Csr, Vec<f64>)) -> Answer {
        let (mut h, mut sum) = (Hasher::default(), 0.0);
        y.for_each_slice(|ys| {
            for &v in ys {
                h.add(v.to_bits());
                sum += v;
            }
        });
        Answer {
            checksum: h.finish(),
            summary: format!("rows:{},sum:{sum:.6}", y.len()),
        }
    }
}

// ---------------------------------------------------------------- wc

/// Line, word and byte counts (words: maximal runs of non-ASCII-whitespace).
pub struct Wc;

/// (lines, words) of `chunk`, given whether the byte before it is whitespace.
#[inline(always)]
fn wc_chunk(chunk: &[u8], mut prev_space: bool) -> (u64, u64) {
    let (mut lines, mut words) = (0u64, 0u64);
    for &b in chunk {
        let space = b.is_ascii_whitespace();
        lines += u64::from(b == b'\n');
        words += u64::from(prev_space & !space);
        prev_space = space;
    }
    (lines, words)
}

/// Bytes per leaf of the parallel wc.
const WC_LEAF: usize = 1 << 16;

/// Bytes per leaf task of the canopy-hh wc.
const WC_HH_LEAF: usize = 1 << 18;

impl Program for Wc {
    type Input = String;
    type Output<'a> = (u64, u64, u64);
    fn name(&self) -> &'static str {
        "wc"
    }
    fn about(&self) -> &'static str {
        "line, word and byte counts of generated text (one pass / per-block counts whose word starts look one byte back); answer: the three counts"
    }
    fn params(&self, size: Size) -> Params {
        Params::n(pick(size, 2_000_000, 200_000_000, 1_000_000_000))
    }
    fn label(&self, p: &Params) -> String {
        format!("{} B of text", p.n)
    }
    fn generate(&self, p: &Params, seed: u64) -> String {
        input::text(p.n as usize, seed)
    }
    fn run(&self, v: Variant, text: &String) -> (u64, u64, u64) {
        let bytes = text.as_bytes();
        let (lines, words) = match v {
            Variant::Seq => wc_chunk(bytes, true),
            Variant::Rayon => bytes
                .par_chunks(WC_LEAF)
                .enumerate()
                .map(|(i, c)| wc_chunk(c, i == 0 || bytes[i * WC_LEAF - 1].is_ascii_whitespace()))
                .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1)),
            Variant::Hh => managed::run(|s| {
                s.par_reduce(
                    0..bytes.len(),
                    WC_HH_LEAF,
                    |_, r| wc_chunk(&bytes[r.clone()], r.start == 0 || bytes[r.start - 1].is_ascii_whitespace()),
                    |a, b| (a.0 + b.0, a.1 + b.1),
                )
            }),
        };
        (lines, words, bytes.len() as u64)
    }
    fn answer(&self, &(l, w, b): &(u64, u64, u64), _input: &String) -> Answer {
        Answer {
            checksum: hash_all([l, w, b]),
            summary: format!("lines:{l},words:{w},bytes:{b}"),
        }
    }
}

// ---------------------------------------------------------------- fib

/// Naive doubly recursive Fibonacci with a sequential cutoff.
pub struct Fib;

/// fib(n) by the naive recursion.
pub fn fib_seq(n: u64) -> u64 {
    if n < 2 {
        n
    } else {
        fib_seq(n - 1) + fib_seq(n - 2)
    }
}

fn fib_par(n: u64, cutoff: u64) -> u64 {
    if n <= cutoff.max(1) {
        fib_seq(n)
    } else {
        let (a, b) = rayon::join(|| fib_par(n - 1, cutoff), || fib_par(n - 2, cutoff));
        a + b
    }
}

fn fib_hh(s: &mut Scope<'_>, n: u64, cutoff: u64) -> u64 {
    if n <= cutoff.max(1) {
        fib_seq(n)
    } else {
        let (a, b) = s.par(|s| fib_hh(s, n - 1, cutoff), |s| fib_hh(s, n - 2, cutoff));
        a + b
    }
}

impl Program for Fib {
    type Input = (u64, u64);
    type Output<'a> = u64;
    fn name(&self) -> &'static str {
        "fib"
    }
    fn about(&self) -> &'static str {
        "naive fib(n); the rayon version forks with rayon::join above the cutoff; answer: fib(n)"
    }
    fn params(&self, size: Size) -> Params {
        let (n, cutoff) = pick(size, (30, 18), (39, 20), (42, 20));
        Params { n, grain: cutoff }
    }
    fn label(&self, p: &Params) -> String {
        format!("fib({}) cutoff {}", p.n, p.grain)
    }
    fn generate(&self, p: &Params, _seed: u64) -> (u64, u64) {
        assert!(p.n <= 92, "fib: n at most 92 (u64)");
        (p.n, p.grain)
    }
    fn run(&self, v: Variant, &(n, cutoff): &(u64, u64)) -> u64 {
        match v {
            Variant::Seq => fib_seq(n),
            Variant::Rayon => fib_par(n, cutoff),
            Variant::Hh => managed::run(|s| fib_hh(s, n, cutoff)),
        }
    }
    fn answer(&self, f: &u64, _input: &(u64, u64)) -> Answer {
        Answer {
            checksum: *f,
            summary: format!("fib:{f}"),
        }
    }
}

// ---------------------------------------------------------------- nqueens

/// Count the placements of n non-attacking queens (bitmask backtracking).
pub struct Nqueens;

/// Solutions below a partial placement: `cols`, `d1`, `d2` are the attacked
/// columns and diagonals of the next row, `all` the mask of n columns.
fn queens_seq(all: u32, cols: u32, d1: u32, d2: u32) -> u64 {
    if cols == all {
        return 1;
    }
    let mut free = all & !(cols | d1 | d2);
    let mut count = 0;
    while free != 0 {
        let bit = free & free.wrapping_neg();
        free ^= bit;
        count += queens_seq(all, cols | bit, (d1 | bit) << 1, (d2 | bit) >> 1);
    }
    count
}

/// The same with one forked task per free column in the first `depth` rows.
fn queens_par(all: u32, cols: u32, d1: u32, d2: u32, depth: u64) -> u64 {
    if depth == 0 || cols == all {
        return queens_seq(all, cols, d1, d2);
    }
    let free = all & !(cols | d1 | d2);
    (0..32u32)
        .into_par_iter()
        .filter(|c| free & (1 << c) != 0)
        .map(|c| {
            let bit = 1u32 << c;
            queens_par(all, cols | bit, (d1 | bit) << 1, (d2 | bit) >> 1, depth - 1)
        })
        .sum()
}

/// [`queens_par`] with `Scope::par`: the free columns of a forked row are
/// halved (by count) into two tasks down to one column per task.
fn queens_hh(s: &mut Scope<'_>, all: u32, cols: u32, d1: u32, d2: u32, depth: u64) -> u64 {
    if depth == 0 || cols == all {
        return queens_seq(all, cols, d1, d2);
    }
    queens_cols_hh(s, all, cols, d1, d2, all & !(cols | d1 | d2), depth)
}

/// The solutions with the next queen in one of the columns of `set`.
fn queens_cols_hh(s: &mut Scope<'_>, all: u32, cols: u32, d1: u32, d2: u32, set: u32, depth: u64) -> u64 {
    match set.count_ones() {
        0 => 0,
        1 => queens_hh(s, all, cols | set, (d1 | set) << 1, (d2 | set) >> 1, depth - 1),
        c => {
            let (mut low, mut high) = (0u32, set);
            for _ in 0..c / 2 {
                let bit = high & high.wrapping_neg();
                low |= bit;
                high ^= bit;
            }
            let (a, b) = s.par(
                |s| queens_cols_hh(s, all, cols, d1, d2, low, depth),
                |s| queens_cols_hh(s, all, cols, d1, d2, high, depth),
            );
            a + b
        }
    }
}

impl Program for Nqueens {
    type Input = (u64, u64);
    type Output<'a> = u64;
    fn name(&self) -> &'static str {
        "nqueens"
    }
    fn about(&self) -> &'static str {
        "number of n-queens solutions by bitmask backtracking; the rayon version forks one task per free column in the first rows; answer: the count"
    }
    fn params(&self, size: Size) -> Params {
        // (n, rows forked)
        let (n, depth) = pick(size, (10, 3), (14, 4), (15, 4));
        Params { n, grain: depth }
    }
    fn label(&self, p: &Params) -> String {
        format!("n={} forking {} rows", p.n, p.grain)
    }
    fn generate(&self, p: &Params, _seed: u64) -> (u64, u64) {
        assert!((1..=31).contains(&p.n), "nqueens: n in 1..=31");
        (p.n, p.grain)
    }
    fn run(&self, v: Variant, &(n, depth): &(u64, u64)) -> u64 {
        let all = (1u32 << n) - 1;
        match v {
            Variant::Seq => queens_seq(all, 0, 0, 0),
            Variant::Rayon => queens_par(all, 0, 0, 0, depth),
            Variant::Hh => managed::run(|s| queens_hh(s, all, 0, 0, 0, depth)),
        }
    }
    fn answer(&self, c: &u64, _input: &(u64, u64)) -> Answer {
        Answer {
            checksum: *c,
            summary: format!("solutions:{c}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers() {
        let p = Params::n(100);
        let primes = Primes.run(Variant::Seq, &Primes.generate(&p, 0));
        assert_eq!(primes.len(), 25);
        assert_eq!(primes.ends().map(|e| e.1), Some(97));
        for n in [0usize, 1, 2, 3, 9, 10, 131_072 * 2 + 5, 1_000_000] {
            let s = Primes.run(Variant::Seq, &n);
            let naive: Vec<u32> = (2..=n as u32)
                .filter(|&k| (2..k).take_while(|d| d * d <= k).all(|d| k % d != 0))
                .collect();
            if n <= 300_000 {
                assert_eq!(s, naive, "n={n}");
            }
            assert_eq!(Primes.run(Variant::Rayon, &n), s, "n={n}");
        }
        assert_eq!(Primes.run(Variant::Seq, &1_000_000).len(), 78_498);
        assert_eq!(fib_seq(30), 832_040);
        assert_eq!(Nqueens.run(Variant::Seq, &(8, 2)), 92);
        assert_eq!(Nqueens.run(Variant::Rayon, &(10, 3)), 724);
        assert_eq!(
            Mcss.run(Variant::Seq, &vec![-2, 1, -3, 4, -1, 2, 1, -5, 4]),
            6
        );
        assert_eq!(Mcss.run(Variant::Rayon, &vec![-5, -3, -9]), -3);
        let (s, i) = Linefit.run(Variant::Seq, &vec![(0, 1), (1, 3), (2, 5)]);
        assert!((s - 2.0).abs() < 1e-12 && (i - 1.0).abs() < 1e-12);
        assert_eq!(Wc.run(Variant::Seq, &" a bb\nc \n".to_string()), (2, 3, 9));
    }

    #[test]
    fn mcss_summary_matches_kadane_on_every_split() {
        let xs = input::small_i64(300, 5);
        let whole = Mcss.run(Variant::Seq, &xs);
        for cut in 1..xs.len() {
            let j = McssSummary::join(McssSummary::of(&xs[..cut]), McssSummary::of(&xs[cut..]));
            assert_eq!(j.best, whole, "cut {cut}");
            assert_eq!(j, McssSummary::of(&xs));
        }
    }

    #[test]
    fn wc_words_are_tokens() {
        let t = input::text(300_000, 4);
        let (_, words, bytes) = Wc.run(Variant::Seq, &t);
        assert_eq!(words as usize, Tokens.run(Variant::Seq, &t).len());
        assert_eq!(bytes, 300_000);
        assert_eq!(Wc.run(Variant::Rayon, &t), Wc.run(Variant::Seq, &t));
    }
}
