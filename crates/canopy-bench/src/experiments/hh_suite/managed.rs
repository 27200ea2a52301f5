//! Helpers for the `canopy-hh` variant of the programs: running a task tree
//! while keeping its counters for the child's result line, ropes of raw
//! arrays (results concatenated at the joins without copying), and staged
//! writes into a raw array.
//!
//! Why staging: `Scope::raw_slice` borrows the scope shared and
//! `Scope::raw_mut` borrows it exclusively, so a task cannot read one managed
//! array while it holds a writable view of another (a merge reads two runs
//! and writes a third). [`fill_staged`] produces up to [`STAGE`] elements at a
//! time into a buffer on the Rust stack (through read-only views), then
//! copies the buffer into the output array (through a writable view).

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Mutex;

use canopy_hh::{Gc, Kept, Kind, Scope, Stats, Unboxed, Val};

/// Counters of the last finished [`run`] in this process.
static LAST: Mutex<Option<Stats>> = Mutex::new(None);

/// `canopy_hh::run_with_stats`, keeping the counters for [`take_stats`].
pub fn run<R>(f: impl for<'s> FnOnce(&mut Scope<'s>) -> R) -> R {
    let (r, st) = canopy_hh::run_with_stats(f);
    *LAST.lock().unwrap_or_else(|e| e.into_inner()) = Some(st);
    r
}

/// `canopy_hh::run_keep`, keeping the counters for [`take_stats`]: the
/// result stays in the managed heap where the tasks built it.
pub fn run_keep(f: impl for<'s> FnOnce(&mut Scope<'s>) -> Gc<'s>) -> Kept {
    let k = canopy_hh::run_keep(f);
    *LAST.lock().unwrap_or_else(|e| e.into_inner()) = Some(k.stats());
    k
}

/// A sequence a program returns: a `Vec` (the sequential and rayon
/// variants), or a rope of raw arrays left in the managed heap where the
/// canopy-hh variant built it (as an MPL program leaves its result sequence
/// in its heap), read in place by the untimed answer check.
pub enum Seq<T> {
    /// Elements in a vector.
    Vec(Vec<T>),
    /// A rope (see [`rope_len`]) kept after its run.
    Rope(Kept, PhantomData<T>),
}

impl<T: Unboxed> Seq<T> {
    /// A kept rope.
    pub fn rope(k: Kept) -> Seq<T> {
        Seq::Rope(k, PhantomData)
    }

    /// Visit the elements in order, a slice at a time.
    pub fn for_each_slice(&self, mut f: impl FnMut(&[T])) {
        match self {
            Seq::Vec(v) => f(v),
            Seq::Rope(k, _) => k.read(|s, g| rope_for_each::<T>(s, g, &mut f)),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Seq::Vec(v) => v.len(),
            Seq::Rope(k, _) => k.read(|s, g| rope_len::<T>(s, g)),
        }
    }

    /// Is it empty?
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first and last elements.
    pub fn ends(&self) -> Option<(T, T)> {
        let mut ends = None;
        self.for_each_slice(|xs| {
            if let (Some(&a), Some(&b)) = (xs.first(), xs.last()) {
                ends = Some((ends.map_or(a, |(f, _)| f), b));
            }
        });
        ends
    }

    /// The elements in a vector (tests).
    pub fn to_vec(&self) -> Vec<T> {
        let mut v = Vec::with_capacity(self.len());
        self.for_each_slice(|xs| v.extend_from_slice(xs));
        v
    }
}

impl<T: Unboxed + PartialEq> PartialEq for Seq<T> {
    fn eq(&self, other: &Seq<T>) -> bool {
        self.to_vec() == other.to_vec()
    }
}

impl<T: Unboxed + PartialEq> PartialEq<Vec<T>> for Seq<T> {
    fn eq(&self, other: &Vec<T>) -> bool {
        self.to_vec() == *other
    }
}

impl<T> std::fmt::Debug for Seq<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Seq::Vec(v) => write!(f, "Seq::Vec(len {})", v.len()),
            Seq::Rope(k, _) => write!(f, "Seq::Rope({k:?})"),
        }
    }
}

/// The counters of the last [`run`] (and forget them).
pub fn take_stats() -> Option<Stats> {
    LAST.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// Elements staged at a time by [`fill_staged`] (8 KiB of `u64`: L1-sized).
pub const STAGE: usize = 1024;

/// Fill the mutable raw array `out` of this task's heap front to back.
/// `produce(scope, buf)` writes the next `buf.len()` elements (at most
/// [`STAGE`], never past the end of `out`) into `buf` and returns how many it
/// wrote (at least one); it may read any raw array through `scope`.
pub fn fill_staged<T: Unboxed + Default>(
    s: &mut Scope<'_>,
    out: Gc<'_>,
    mut produce: impl FnMut(&Scope<'_>, &mut [T]) -> usize,
) {
    let n = s.raw_len::<T>(out);
    let mut buf = [T::default(); STAGE];
    let mut pos = 0;
    while pos < n {
        let want = STAGE.min(n - pos);
        let k = produce(s, &mut buf[..want]);
        assert!(k > 0 && k <= want, "fill_staged: produced {k} of {want}");
        s.raw_mut::<T>(out)[pos..pos + k].copy_from_slice(&buf[..k]);
        pos += k;
    }
}

/// A new mutable raw array of `n` elements produced front to back by
/// `produce(scope, buf)`, as [`fill_staged`] does, but built with
/// `Scope::raw_build`: the array is never zeroed, each staged block is
/// appended once.
pub fn build_staged<'s, T: Unboxed + Default>(
    s: &mut Scope<'s>,
    n: usize,
    mut produce: impl FnMut(&Scope<'_>, &mut [T]) -> usize,
) -> Gc<'s> {
    s.raw_build::<T, ()>(n, |s, out| {
        let mut buf = [T::default(); STAGE];
        while out.remaining() > 0 {
            let want = STAGE.min(out.remaining());
            let k = produce(s, &mut buf[..want]);
            assert!(k > 0 && k <= want, "build_staged: produced {k} of {want}");
            out.extend_from_slice(&buf[..k]);
        }
    })
    .0
}

/// Elements of a rope: a raw array of `T` (a leaf) or a tuple
/// `(length, left, right)`.
pub fn rope_len<T: Unboxed>(s: &Scope<'_>, g: Gc<'_>) -> usize {
    if s.kind(g) == Kind::Tuple {
        s.get_int(g, 0) as usize
    } else {
        s.raw_len::<T>(g)
    }
}

/// The rope `a ++ b` (a new tuple; neither side is copied; an empty side is
/// dropped).
pub fn rope_join<'s, T: Unboxed>(s: &mut Scope<'s>, a: Gc<'s>, b: Gc<'s>) -> Gc<'s> {
    let (la, lb) = (rope_len::<T>(s, a), rope_len::<T>(s, b));
    if la == 0 {
        return s.rebind(b);
    }
    if lb == 0 {
        return s.rebind(a);
    }
    s.tuple(&[Val::Int((la + lb) as i64), Val::Obj(a), Val::Obj(b)])
}

/// A rope of the leaves `leaf(scope, i)` for `i` in `r`, in order: the range
/// is halved with `par_gc` down to single indices, and the two halves' ropes
/// are joined by [`rope_join`] in the parent.
pub fn par_rope<'s, T, L>(s: &mut Scope<'s>, r: Range<usize>, leaf: &L) -> Gc<'s>
where
    T: Unboxed,
    L: for<'a> Fn(&mut Scope<'a>, usize) -> Gc<'a> + Sync,
{
    match r.len() {
        0 => {
            let e = s.raw::<T>(0);
            s.freeze(e);
            e
        }
        1 => leaf(s, r.start),
        len => {
            let mid = r.start + len / 2;
            let (a, b) = s.par_gc(
                |s| par_rope::<T, L>(s, r.start..mid, leaf),
                |s| par_rope::<T, L>(s, mid..r.end, leaf),
            );
            rope_join::<T>(s, a, b)
        }
    }
}

/// Visit the leaves of a rope in order.
pub fn rope_for_each<T: Unboxed>(s: &Scope<'_>, g: Gc<'_>, f: &mut impl FnMut(&[T])) {
    if s.kind(g) == Kind::Tuple {
        for i in [1, 2] {
            if let Val::Obj(c) = s.get(g, i) {
                rope_for_each::<T>(s, c, f);
            }
        }
    } else {
        f(s.raw_slice::<T>(g));
    }
}

/// A rope's elements in a `Vec` (one pass; `Vec::with_capacity` of the
/// exact length).
pub fn rope_to_vec<T: Unboxed>(s: &mut Scope<'_>, g: Gc<'_>) -> Vec<T> {
    let mut out = Vec::with_capacity(rope_len::<T>(s, g));
    s.scope(|s| rope_for_each::<T>(s, g, &mut |xs| out.extend_from_slice(xs)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ropes_keep_order_and_staging_fills_everything() {
        let (v, st) = canopy_hh::run_with_stats(|s| {
            let r = par_rope::<u32, _>(s, 0..37, &|s, i| {
                let a = s.raw::<u32>(i % 5);
                for (k, x) in s.raw_mut::<u32>(a).iter_mut().enumerate() {
                    *x = (i * 10 + k) as u32;
                }
                s.freeze(a);
                a
            });
            assert_eq!(rope_len::<u32>(s, r), (0..37).map(|i| i % 5).sum::<usize>());
            let out = s.raw::<u32>(3000);
            let mut next = 0u32;
            fill_staged::<u32>(s, out, |_, buf| {
                let k = buf.len().min(7);
                for x in &mut buf[..k] {
                    *x = next;
                    next += 1;
                }
                k
            });
            assert!(s.raw_slice::<u32>(out).iter().copied().eq(0..3000));
            rope_to_vec::<u32>(s, r)
        });
        let want: Vec<u32> = (0..37u32).flat_map(|i| (0..i % 5).map(move |k| i * 10 + k)).collect();
        assert_eq!(v, want);
        assert!(st.forks > 0);
    }

    #[test]
    fn a_kept_rope_reads_like_its_vector() {
        fn leaves<'s>(s: &mut Scope<'s>, i: usize) -> Gc<'s> {
            let (a, ()) = s.raw_build::<u32, ()>(i % 4, |_, o| {
                for k in 0..i % 4 {
                    o.push((i * 10 + k) as u32);
                }
            });
            s.freeze(a);
            a
        }
        let kept: Seq<u32> = Seq::rope(run_keep(|s| par_rope::<u32, _>(s, 0..41, &leaves)));
        let want: Vec<u32> = (0..41u32).flat_map(|i| (0..i % 4).map(move |k| i * 10 + k)).collect();
        assert_eq!(kept.len(), want.len());
        assert_eq!(kept.ends(), Some((want[0], *want.last().unwrap())));
        assert_eq!(kept, Seq::Vec(want.clone()));
        assert_eq!(kept, want);
        assert!(take_stats().is_some_and(|st| st.forks > 0));
        let empty: Seq<u32> = Seq::rope(run_keep(|s| par_rope::<u32, _>(s, 0..0, &leaves)));
        assert!(empty.is_empty());
        assert_eq!(empty.ends(), None);
    }
}
