//! SAC with-loops: [`genarray`], [`Array::modarray`] and [`fold`].
//!
//! A generator ([`Gen`]) is a rectangular index range `lo <= iv < hi` with
//! an expression.  The generators of one with-loop must lie inside the shape
//! and must not overlap (as in SAC); elements no generator covers take the
//! default (`genarray`) or keep their value (`modarray`).  The index space of
//! each generator is cut into chunks that run on the rayon pool; each worker
//! allocates from its own Canopy heap.  Ranges smaller than twice the
//! generator's grain (default 2048 elements) run on the calling thread, and
//! so does everything when the pool has one thread and the caller is not
//! one of its workers.
//!
//! Bad input panics with a message naming the generator and the shapes.

use core::marker::PhantomData;
use core::ops::Range;

use rayon::prelude::*;

use crate::array::{shape_len, Array};
use crate::policy::Policy;
use crate::stats;

/// A short vector of indices kept inline up to rank 6 (with-loops on small
/// arrays run often; their bookkeeping must not allocate).
#[derive(Clone)]
enum Idx {
    Inline(usize, [usize; 6]),
    Heap(Vec<usize>),
}

impl Idx {
    fn from_slice(s: &[usize]) -> Self {
        if s.len() <= 6 {
            let mut a = [0; 6];
            a[..s.len()].copy_from_slice(s);
            Idx::Inline(s.len(), a)
        } else {
            Idx::Heap(s.to_vec())
        }
    }

    fn zeros(n: usize) -> Self {
        if n <= 6 {
            Idx::Inline(n, [0; 6])
        } else {
            Idx::Heap(vec![0; n])
        }
    }
}

impl core::ops::Deref for Idx {
    type Target = [usize];
    #[inline(always)]
    fn deref(&self) -> &[usize] {
        match self {
            Idx::Inline(n, a) => &a[..*n],
            Idx::Heap(v) => v,
        }
    }
}

impl core::ops::DerefMut for Idx {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [usize] {
        match self {
            Idx::Inline(n, a) => &mut a[..*n],
            Idx::Heap(v) => v,
        }
    }
}

/// Default minimum number of elements per parallel chunk.
pub const DEFAULT_GRAIN: usize = 2048;

/// A generator's expression, type-erased without allocating when it is
/// small (closures capturing up to four words, the common case): with-loops
/// on short vectors are frequent (the FFT's recursion), and a heap
/// allocation per generator would cost more than the loop.
///
/// What is erased is the whole loop over the generator's range, not the
/// call per element: `run` is made for the closure's type when the
/// generator is built, so the expression is compiled into the loop as in
/// `modarray_fn`, and a with-loop makes one indirect call per generator.
struct Expr<'a, T> {
    store: Store,
    run: unsafe fn(*const u8, Sweep<'_, T>) -> bool,
    drop: unsafe fn(*mut u8),
    _life: PhantomData<&'a ()>,
}

/// One generator's loop for [`Expr::run`]: the box `lo..hi` of an array of
/// `shape` at `data`, in parallel chunks of at least `grain` elements.
struct Sweep<'s, T> {
    data: *mut T,
    lo: &'s [usize],
    hi: &'s [usize],
    shape: &'s [usize],
    grain: usize,
    /// `None`: the elements hold values, and each becomes `f(iv, &old)`.
    /// `Some(x)`: they are uninitialised, and each is written `f(iv, x)`.
    init: Option<&'s T>,
}

#[repr(C, align(16))]
struct Inline([usize; 4]);

enum Store {
    Inline(core::mem::MaybeUninit<Inline>),
    Boxed(*mut u8),
}

// SAFETY: an Expr holds a closure that is Send + Sync (required by `new`).
unsafe impl<T> Send for Expr<'_, T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Expr<'_, T> {}

impl<'a, T> Expr<'a, T> {
    fn new<F: Fn(&[usize], &T) -> T + Send + Sync + 'a>(f: F) -> Self
    where
        T: Send + Sync,
    {
        /// Returns whether the loop ran in parallel.
        ///
        /// # Safety
        /// `p` points to a live `F`; the box is inside the shape of the
        /// array at `s.data`; no other thread touches its elements during
        /// the call; they hold values when `s.init` is `None` and are
        /// uninitialised otherwise.
        unsafe fn run<F: Fn(&[usize], &T) -> T + Sync, T: Send + Sync>(p: *const u8, s: Sweep<'_, T>) -> bool {
            // SAFETY: p points to a live F (see `Expr::ptr`).
            let f = unsafe { &*(p as *const F) };
            let (data, init) = (SyncPtr(s.data), s.init);
            // One call of `f` for both cases, the shape of `modarray_fn`'s
            // loop, which the compiler inlines `f` into (a call site per
            // case left `f` out of line: a call per element).
            par_box(s.lo, s.hi, s.shape, s.grain, |iv, off| {
                // SAFETY: off is inside the array (the box is inside the
                // shape) and chunks are disjoint, so no other thread touches
                // the element; it holds a value when `init` is None (read,
                // then replaced once f has returned) and is uninitialised
                // otherwise (written once).
                unsafe {
                    let e = data.get().add(off);
                    // A pointer first: no reference to an uninitialised
                    // element is made.
                    let src: *const T = match init {
                        Some(x) => x,
                        None => e,
                    };
                    let v = f(iv, &*src);
                    if init.is_none() {
                        // The new value is in place before the old one's
                        // drop runs, as with `*e = v`: a panicking drop
                        // leaves no dropped value in the array.
                        drop(core::ptr::replace(e, v));
                    } else {
                        e.write(v);
                    }
                }
            })
        }
        unsafe fn drop_inline<F>(p: *mut u8) {
            // SAFETY: p points to the F stored inline, dropped once.
            unsafe { core::ptr::drop_in_place(p as *mut F) }
        }
        unsafe fn drop_boxed<F>(p: *mut u8) {
            // SAFETY: p came from Box::into_raw of a Box<F>, dropped once.
            drop(unsafe { Box::from_raw(p as *mut F) })
        }
        let fits = core::mem::size_of::<F>() <= core::mem::size_of::<Inline>()
            && core::mem::align_of::<F>() <= core::mem::align_of::<Inline>();
        if fits {
            let mut m = core::mem::MaybeUninit::<Inline>::uninit();
            // SAFETY: F fits in the inline storage (size and alignment checked).
            unsafe { (m.as_mut_ptr() as *mut F).write(f) };
            Expr {
                store: Store::Inline(m),
                run: run::<F, T>,
                drop: drop_inline::<F>,
                _life: PhantomData,
            }
        } else {
            let p = Box::into_raw(Box::new(f)) as *mut u8;
            Expr {
                store: Store::Boxed(p),
                run: run::<F, T>,
                drop: drop_boxed::<F>,
                _life: PhantomData,
            }
        }
    }

    fn ptr(&self) -> *const u8 {
        match &self.store {
            Store::Inline(m) => m.as_ptr() as *const u8,
            Store::Boxed(p) => *p,
        }
    }

    /// Run the generator's loop; returns whether it ran in parallel.
    ///
    /// # Safety
    /// As for `run` in [`Expr::new`]: the box is inside the array's shape,
    /// no other thread touches its elements during the call, and they hold
    /// values (`init` None) or are uninitialised (`init` Some).
    unsafe fn run(&self, s: Sweep<'_, T>) -> bool {
        // SAFETY: `run` was made for the stored closure's type; the rest is
        // the caller's promise.
        unsafe { (self.run)(self.ptr(), s) }
    }
}

impl<T> Drop for Expr<'_, T> {
    fn drop(&mut self) {
        let p = match &mut self.store {
            Store::Inline(m) => m.as_mut_ptr() as *mut u8,
            Store::Boxed(p) => *p,
        };
        // SAFETY: `drop` matches the stored closure; Expr is dropped once.
        unsafe { (self.drop)(p) }
    }
}

/// One generator: an index range `lo <= iv < hi` and its expression.
pub struct Gen<'a, T> {
    lo: Idx,
    hi: Idx,
    expr: Expr<'a, T>,
    grain: usize,
}

impl<T> core::fmt::Debug for Gen<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Gen")
            .field("lo", &&*self.lo)
            .field("hi", &&*self.hi)
            .field("grain", &self.grain)
            .finish()
    }
}

impl<'a, T> Gen<'a, T> {
    /// Elements `lo <= iv < hi` become `f(iv)`.
    pub fn new(lo: &[usize], hi: &[usize], f: impl Fn(&[usize]) -> T + Send + Sync + 'a) -> Self
    where
        T: Send + Sync,
    {
        Gen {
            lo: Idx::from_slice(lo),
            hi: Idx::from_slice(hi),
            expr: Expr::new(move |iv: &[usize], _: &T| f(iv)),
            grain: DEFAULT_GRAIN,
        }
    }

    /// Elements `lo <= iv < hi` become `f(iv, &current)`, where `current`
    /// is the element's value before the with-loop (the default, in
    /// `genarray`).  Reading the element being replaced is what lets
    /// `modarray` run in place.
    pub fn update(
        lo: &[usize],
        hi: &[usize],
        f: impl Fn(&[usize], &T) -> T + Send + Sync + 'a,
    ) -> Self
    where
        T: Send + Sync,
    {
        Gen {
            lo: Idx::from_slice(lo),
            hi: Idx::from_slice(hi),
            expr: Expr::new(f),
            grain: DEFAULT_GRAIN,
        }
    }

    /// Every index of `shape`.
    pub fn all(shape: &[usize], f: impl Fn(&[usize]) -> T + Send + Sync + 'a) -> Self
    where
        T: Send + Sync,
    {
        Self::new(&Idx::zeros(shape.len()), shape, f)
    }

    /// Every index of `shape`, from the current value.
    pub fn all_update(shape: &[usize], f: impl Fn(&[usize], &T) -> T + Send + Sync + 'a) -> Self
    where
        T: Send + Sync,
    {
        Self::update(&Idx::zeros(shape.len()), shape, f)
    }

    /// Minimum elements per parallel chunk (1: one element may be a task;
    /// `usize::MAX`: always on the calling thread).
    pub fn grain(mut self, g: usize) -> Self {
        self.grain = g.max(1);
        self
    }

    fn volume(&self) -> usize {
        self.lo
            .iter()
            .zip(self.hi.iter())
            .map(|(l, h)| h - l)
            .product()
    }
}

/// Check generator `k` against `shape`: rank, `lo <= hi <= shape`.
fn check_range(what: &str, k: usize, lo: &[usize], hi: &[usize], shape: &[usize]) {
    assert!(
        lo.len() == shape.len() && hi.len() == shape.len(),
        "{what}: generator {k} has bounds {lo:?}..{hi:?} of rank {}/{}, but the array has rank {} (shape {shape:?})",
        lo.len(),
        hi.len(),
        shape.len()
    );
    for d in 0..shape.len() {
        assert!(
            lo[d] <= hi[d],
            "{what}: generator {k}: lower bound {lo:?} exceeds upper bound {hi:?}"
        );
        assert!(
            hi[d] <= shape[d],
            "{what}: generator {k}: upper bound {hi:?} exceeds shape {shape:?}"
        );
    }
}

/// Check every generator and that no two overlap; returns the elements covered.
fn check_gens<T>(what: &str, shape: &[usize], gens: &[Gen<'_, T>]) -> usize {
    for (k, g) in gens.iter().enumerate() {
        check_range(what, k, &g.lo, &g.hi, shape);
    }
    for a in 0..gens.len() {
        for b in a + 1..gens.len() {
            let (x, y) = (&gens[a], &gens[b]);
            let overlap = (0..shape.len()).all(|d| x.lo[d].max(y.lo[d]) < x.hi[d].min(y.hi[d]));
            assert!(
                !overlap || x.volume() == 0 || y.volume() == 0,
                "{what}: generators {a} ({:?}..{:?}) and {b} ({:?}..{:?}) overlap",
                &*x.lo,
                &*x.hi,
                &*y.lo,
                &*y.hi
            );
        }
    }
    gens.iter().map(|g| g.volume()).sum()
}

/// A raw pointer the workers share; each writes disjoint elements.
struct SyncPtr<T>(*mut T);
impl<T> Clone for SyncPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SyncPtr<T> {}
impl<T> SyncPtr<T> {
    /// The pointer (a method, so closures capture the whole wrapper).
    #[inline(always)]
    fn get(self) -> *mut T {
        self.0
    }
}
// SAFETY: used only to write disjoint elements from the workers of one
// with-loop, which the calling thread waits for.
unsafe impl<T: Send> Send for SyncPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SyncPtr<T> {}

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Idx {
    let mut s = Idx::zeros(shape.len());
    s.iter_mut().for_each(|x| *x = 1);
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Visit the indices `k` in `range` of the box `lo..hi` (numbered row-major
/// within the box), passing the index vector and its offset in `shape`.
fn visit_chunk(
    lo: &[usize],
    hi: &[usize],
    st: &[usize],
    range: Range<usize>,
    f: &mut impl FnMut(&[usize], usize),
) {
    let r = lo.len();
    if range.is_empty() {
        return;
    }
    if r == 1 {
        // Rank 1 (vectors, the common case): the index is the offset's
        // source, no carry logic; a plain counted loop the compiler can
        // unroll.
        let (base, s0) = (lo[0], st[0]);
        for k in range {
            let i = base + k;
            f(&[i], i * s0);
        }
        return;
    }
    let mut iv = Idx::zeros(r);
    let mut k = range.start;
    for d in (0..r).rev() {
        let ext = hi[d] - lo[d];
        iv[d] = lo[d] + k % ext;
        k /= ext;
    }
    let mut off: usize = iv.iter().zip(st).map(|(i, s)| i * s).sum();
    for _ in range {
        f(&iv, off);
        if r == 0 {
            continue;
        }
        let last = r - 1;
        iv[last] += 1;
        off += 1;
        if iv[last] == hi[last] {
            let mut d = last;
            loop {
                iv[d] = lo[d];
                if d == 0 {
                    break;
                }
                d -= 1;
                iv[d] += 1;
                if iv[d] < hi[d] {
                    break;
                }
            }
            off = iv.iter().zip(st).map(|(i, s)| i * s).sum();
        }
    }
}

/// Run `f(iv, offset)` for every index of `lo..hi`, in parallel chunks of at
/// least `grain` elements.  Returns whether it ran through the rayon pool
/// (the caller then ships the workers' count operations).
fn par_box(
    lo: &[usize],
    hi: &[usize],
    shape: &[usize],
    grain: usize,
    f: impl Fn(&[usize], usize) + Sync,
) -> bool {
    let vol: usize = lo.iter().zip(hi).map(|(l, h)| h - l).product();
    if vol == 0 {
        return false;
    }
    if shape.len() == 1 && vol < grain.saturating_mul(2) {
        // A short vector: on this thread, no strides to compute.
        visit_chunk(lo, hi, &[1], 0..vol, &mut |iv, o| f(iv, o));
        return false;
    }
    let st = strides(shape);
    if vol < grain.saturating_mul(2) {
        visit_chunk(lo, hi, &st, 0..vol, &mut |iv, o| f(iv, o));
        return false;
    }
    let threads = rayon::current_num_threads().max(1);
    if threads == 1 && rayon::current_thread_index().is_none() {
        visit_chunk(lo, hi, &st, 0..vol, &mut |iv, o| f(iv, o));
        return false;
    }
    // On a worker of a one-thread pool, the chunks below run one after
    // another on this thread at the cost of a few deque operations.  They
    // go that way all the same, so that a large with-loop runs the same
    // compiled loop at every pool size: the copy inlined here kept the
    // with-loop's expression out of line, a call per element (the SAC
    // kernel's generator form at X = 25 took 80-82 ms on one thread that
    // way, 69-72 ms this way).
    let chunk = (vol / (threads * 8)).max(grain).max(1);
    let n = vol.div_ceil(chunk);
    let _unwind = AfterParallelOnUnwind;
    (0..n).into_par_iter().for_each(|c| {
        let r = c * chunk..((c + 1) * chunk).min(vol);
        visit_chunk(lo, hi, &st, r, &mut |iv, o| f(iv, o));
    });
    true
}

/// After a parallel with-loop: ship the workers' delegated count operations
/// and merge biased counts queued to the caller.
fn after_parallel() {
    crate::delegated::flush_all_workers();
    crate::biased::merge_pending();
}

/// Runs [`after_parallel`] if dropped while a parallel region's panic
/// propagates (the caller's own call is then skipped): the workers' count
/// operations would otherwise stay pending until their next count operation,
/// keeping the arrays they name alive.
struct AfterParallelOnUnwind;

impl Drop for AfterParallelOnUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            after_parallel();
        }
    }
}

/// Apply the generators to initialised data at `data` (shape `shape`).
fn run_gens<T: Send + Sync>(data: *mut T, shape: &[usize], gens: &[Gen<'_, T>]) {
    let p = SyncPtr(data);
    let mut par = false;
    for g in gens {
        // SAFETY: the box is inside the shape (checked by the caller); the
        // data is initialised; generators do not overlap, so no other
        // generator's loop touches these elements.
        par |= unsafe {
            g.expr.run(Sweep { data: p.get(), lo: &g.lo, hi: &g.hi, shape, grain: g.grain, init: None })
        };
    }
    if par {
        after_parallel();
    }
}

/// SAC `genarray`: an array of `shape` where each generator's range holds
/// its expression and every other element is `default`.
///
/// # Panics
/// If a generator's rank differs from the shape's, its bounds are inverted
/// or exceed the shape, two generators overlap, or the shape is too large.
pub fn genarray<T, P>(shape: &[usize], default: T, gens: &[Gen<'_, T>]) -> Array<T, P>
where
    T: Clone + Send + Sync,
    P: Policy,
{
    // The shape first: a generator's volume cannot overflow once the shape's
    // element count does not.
    let len = shape_len(shape).unwrap_or_else(|e| panic!("genarray: {e}"));
    let covered = check_gens("genarray", shape, gens);
    if covered == len && gens.len() == 1 {
        // One generator covers everything: write each element once.
        let g = &gens[0];
        let u = Array::<T, P>::alloc(shape).unwrap_or_else(|e| panic!("genarray: {e}"));
        let p = SyncPtr(u.data());
        // SAFETY: the box is the whole shape; the elements are
        // uninitialised and written exactly once.
        let par = unsafe {
            g.expr.run(Sweep {
                data: p.get(),
                lo: &g.lo,
                hi: &g.hi,
                shape,
                grain: g.grain,
                init: Some(&default),
            })
        };
        // SAFETY: the single generator covered all len elements.
        let a = unsafe { u.assume_init() };
        if par {
            after_parallel();
        }
        return a;
    }
    let a = Array::<T, P>::filled(shape, default);
    run_gens(a.data_ptr(), shape, gens);
    a
}

impl<T: Clone + Send + Sync, P: Policy> Array<T, P> {
    /// SAC `modarray`: this array with each generator's range replaced by
    /// its expression.  In place when this is the only reference (counted as
    /// a reuse), otherwise on a fresh copy (counted as a copy).
    ///
    /// # Panics
    /// As for [`genarray`].
    pub fn modarray(self, gens: &[Gen<'_, T>]) -> Self {
        check_gens("modarray", self.shape(), gens);
        let bytes = self.len() * core::mem::size_of::<T>();
        let target = if self.is_unique() {
            stats::on_reuse(bytes);
            self
        } else {
            stats::on_copy(bytes);
            let src = self.as_slice();
            let copy = if self.len() >= 2 * DEFAULT_GRAIN {
                copy_par(&self)
            } else {
                Array::from_fn(self.shape(), |i| src[i].clone())
            };
            drop(self);
            copy
        };
        let shape = Idx::from_slice(target.shape());
        run_gens(target.data_ptr(), &shape, gens);
        target
    }
}

/// A parallel copy of `a` (count 1).  The workers clone the elements, so
/// their count operations are shipped afterwards (`after_parallel`), as for
/// any parallel with-loop.
fn copy_par<T: Clone + Send + Sync, P: Policy>(a: &Array<T, P>) -> Array<T, P> {
    let u = Array::<T, P>::alloc(a.shape()).unwrap_or_else(|e| panic!("modarray: {e}"));
    let dst = SyncPtr(u.data());
    let src = a.as_slice();
    let unwind = AfterParallelOnUnwind;
    src.par_chunks(DEFAULT_GRAIN)
        .enumerate()
        .for_each(|(c, s)| {
            for (i, v) in s.iter().enumerate() {
                // SAFETY: each destination index written once, inside len.
                unsafe { dst.get().add(c * DEFAULT_GRAIN + i).write(v.clone()) };
            }
        });
    drop(unwind);
    after_parallel();
    // SAFETY: every element written.
    unsafe { u.assume_init() }
}

/// SAC `fold`: combine `f(iv)` over `lo <= iv < hi` with `op`, starting from
/// `neutral`.  `op` must be associative and commutative and `neutral` its
/// identity (the order of combination is unspecified: it runs in parallel).
///
/// # Panics
/// If `lo` and `hi` differ in length, `lo` exceeds `hi`, or the box has
/// more elements than a `usize` counts.
pub fn fold<U, F, O>(lo: &[usize], hi: &[usize], neutral: U, f: F, op: O) -> U
where
    U: Clone + Send + Sync,
    F: Fn(&[usize]) -> U + Sync,
    O: Fn(U, U) -> U + Sync + Send,
{
    assert_eq!(
        lo.len(),
        hi.len(),
        "fold: bounds {lo:?}..{hi:?} differ in rank"
    );
    for d in 0..lo.len() {
        assert!(
            lo[d] <= hi[d],
            "fold: lower bound {lo:?} exceeds upper bound {hi:?}"
        );
    }
    let vol = lo
        .iter()
        .zip(hi)
        .try_fold(1usize, |a, (l, h)| a.checked_mul(h - l))
        .unwrap_or_else(|| panic!("fold: bounds {lo:?}..{hi:?} have too many elements"));
    // fold uses the index vector only, not an element offset: zero strides
    // (the strides of `hi` can overflow a word for a small box far from the
    // origin, which panicked in debug builds).
    let st = Idx::zeros(hi.len());
    let threads = rayon::current_num_threads().max(1);
    let seq = |r: Range<usize>| {
        let mut acc = neutral.clone();
        visit_chunk(lo, hi, &st, r, &mut |iv, _| {
            acc = op(core::mem::replace(&mut acc, neutral.clone()), f(iv));
        });
        acc
    };
    if vol < 2 * DEFAULT_GRAIN || threads == 1 {
        return seq(0..vol);
    }
    let chunk = (vol / (threads * 8)).max(DEFAULT_GRAIN);
    let n = vol.div_ceil(chunk);
    let unwind = AfterParallelOnUnwind;
    let r = (0..n)
        .into_par_iter()
        .map(|c| seq(c * chunk..((c + 1) * chunk).min(vol)))
        .reduce(|| neutral.clone(), &op);
    drop(unwind);
    after_parallel();
    r
}

/// `genarray` with one generator covering the whole shape, monomorphised
/// (the expression inlines into the loop; no generator object is built).
/// Runs in parallel when the array has at least `2 * DEFAULT_GRAIN` elements.
///
/// # Panics
/// If the shape is too large.
pub fn genarray_fn<T, P, F>(shape: &[usize], f: F) -> Array<T, P>
where
    T: Send + Sync,
    P: Policy,
    F: Fn(&[usize]) -> T + Sync,
{
    let u = Array::<T, P>::alloc(shape).unwrap_or_else(|e| panic!("genarray: {e}"));
    let p = SyncPtr(u.data());
    let lo = Idx::zeros(shape.len());
    let par = par_box(&lo, shape, shape, DEFAULT_GRAIN, |iv, off| {
        // SAFETY: off < len; each element written exactly once.
        unsafe { p.get().add(off).write(f(iv)) };
    });
    // SAFETY: the range covered every element.
    let a = unsafe { u.assume_init() };
    if par {
        after_parallel();
    }
    a
}

impl<T: Clone + Send + Sync, P: Policy> Array<T, P> {
    /// `modarray` with one generator `lo <= iv < hi`, monomorphised: in
    /// place when this is the only reference, else on a copy.
    ///
    /// # Panics
    /// As for [`genarray`].
    pub fn modarray_fn<F>(self, lo: &[usize], hi: &[usize], f: F) -> Self
    where
        F: Fn(&[usize], &T) -> T + Sync,
    {
        check_range("modarray", 0, lo, hi, self.shape());
        let bytes = self.len() * core::mem::size_of::<T>();
        let target = if self.is_unique() {
            stats::on_reuse(bytes);
            self
        } else {
            stats::on_copy(bytes);
            let copy = if self.len() >= 2 * DEFAULT_GRAIN {
                copy_par(&self)
            } else {
                let src = self.as_slice();
                Array::from_fn(self.shape(), |i| src[i].clone())
            };
            drop(self);
            copy
        };
        let shape = Idx::from_slice(target.shape());
        let p = SyncPtr(target.data_ptr());
        let par = par_box(lo, hi, &shape, DEFAULT_GRAIN, |iv, off| {
            // SAFETY: off < len; chunks are disjoint.
            unsafe {
                let e = p.get().add(off);
                let v = f(iv, &*e);
                *e = v;
            }
        });
        if par {
            after_parallel();
        }
        target
    }
}
