//! The mutator interface: scopes, rooted handles and the barriers.

use crate::gc::{field_at, header_at};
use crate::heap::{self, RemEntry};
use crate::object::{self, Kind, Word, BUSY, FRONTIER};
use crate::stats::Stats;
use crate::task::Task;
use std::cell::Cell;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::Ordering;

/// An invariant lifetime brand: handles of one scope cannot be passed off as
/// handles of another.
type Brand<'s> = PhantomData<fn(&'s ()) -> &'s ()>;

thread_local! {
    static TASKS_ON_THREAD: Cell<u32> = const { Cell::new(0) };
}

struct OnThread;
impl OnThread {
    #[inline]
    fn enter() -> OnThread {
        TASKS_ON_THREAD.with(|c| c.set(c.get() + 1));
        OnThread
    }
}
impl Drop for OnThread {
    #[inline]
    fn drop(&mut self) {
        TASKS_ON_THREAD.with(|c| c.set(c.get() - 1));
    }
}

/// A task waiting at a join: while it waits, rayon runs other jobs on its
/// thread (work it steals), an independent `run` among them, which is not
/// nested in this task. So the thread's count is cleared until the join
/// returns (or unwinds); each child counts itself while it runs.
struct AtJoin(u32);
impl AtJoin {
    #[inline]
    fn enter() -> AtJoin {
        AtJoin(TASKS_ON_THREAD.with(|c| c.replace(0)))
    }
}
impl Drop for AtJoin {
    #[inline]
    fn drop(&mut self) {
        TASKS_ON_THREAD.with(|c| c.set(self.0));
    }
}

/// A rooted handle to a managed object.
///
/// A handle is a slot the collector knows and updates when it moves the
/// object, so it stays valid across allocations and collections. It lives as
/// long as the scope that made it (`'s`), and the brand keeps it from leaving
/// that scope:
///
/// ```compile_fail
/// let mut leaked = None;
/// canopy_hh::run(|s| {
///     let t = s.tuple(&[canopy_hh::Val::Int(1)]);
///     leaked = Some(t); // error: the handle cannot outlive its scope
/// });
/// ```
#[derive(Clone, Copy)]
pub struct Gc<'s> {
    slot: *mut u64,
    /// The task tree whose root stack holds the slot: a handle used in
    /// another tree (whose tasks could be collecting concurrently) is refused.
    tree: u32,
    _brand: Brand<'s>,
}

// SAFETY: a handle is a pointer to a slot of a task's root stack. Child tasks
// may read the slots of their (suspended) ancestors, which nobody writes while
// the children run: the ancestor's collector runs only in the ancestor itself
// (or in a first child while the ancestor's other child has not started).
// Every use checks that the handle belongs to the using task's tree, so a
// handle sent to another tree (another `run`) is refused before its slot is read.
unsafe impl Send for Gc<'_> {}
// SAFETY: as above; reading a slot is the only operation through `&Gc`.
unsafe impl Sync for Gc<'_> {}

impl<'s> Gc<'s> {
    #[inline]
    pub(crate) fn word(self) -> u64 {
        // SAFETY: the slot lives as long as 's (its scope), and only the
        // collector of the owning task writes it, never concurrently with a use.
        unsafe { *self.slot }
    }
}

impl std::fmt::Debug for Gc<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gc(slot {:p}, tree {})", self.slot, self.tree)
    }
}

/// A value as Rust code sees it: an unboxed integer or a handle.
#[derive(Clone, Copy, Debug)]
pub enum Val<'s> {
    /// A 63-bit integer (see [`crate::INT_MIN`], [`crate::INT_MAX`]).
    Int(i64),
    /// A managed object.
    Obj(Gc<'s>),
}

impl<'s> Val<'s> {
    #[inline]
    fn word(self) -> u64 {
        match self {
            Val::Int(i) => {
                assert!(
                    (object::INT_MIN..=object::INT_MAX).contains(&i),
                    "canopy-hh: integer {i} does not fit a 63-bit managed value"
                );
                Word::int(i).0
            }
            Val::Obj(g) => g.word(),
        }
    }
    /// The integer, if this is one.
    pub fn as_int(self) -> Option<i64> {
        match self {
            Val::Int(i) => Some(i),
            Val::Obj(_) => None,
        }
    }
    /// The handle, if this is an object.
    pub fn as_obj(self) -> Option<Gc<'s>> {
        match self {
            Val::Obj(g) => Some(g),
            Val::Int(_) => None,
        }
    }
}

impl From<i64> for Val<'_> {
    fn from(i: i64) -> Self {
        Val::Int(i)
    }
}
impl<'s> From<Gc<'s>> for Val<'s> {
    fn from(g: Gc<'s>) -> Self {
        Val::Obj(g)
    }
}

/// Appends the elements of an array being built by [`Scope::raw_build`].
pub struct Filler<'f, T> {
    base: *mut T,
    cap: usize,
    done: usize,
    _life: PhantomData<&'f mut [T]>,
}

impl<T: Unboxed> Filler<'_, T> {
    /// Append one element.
    ///
    /// # Panics
    /// If the array is full.
    #[inline]
    pub fn push(&mut self, v: T) {
        assert!(self.done < self.cap, "canopy-hh: raw_build: more than {} elements appended", self.cap);
        // SAFETY: done < len: inside the payload, not yet written.
        unsafe { self.base.add(self.done).write(v) };
        self.done += 1;
    }

    /// Append a slice.
    ///
    /// # Panics
    /// If it does not fit.
    #[inline]
    pub fn extend_from_slice(&mut self, xs: &[T]) {
        assert!(xs.len() <= self.cap - self.done, "canopy-hh: raw_build: more than {} elements appended", self.cap);
        // SAFETY: the range is inside the payload and not yet written; `xs`
        // cannot alias it (the new array has no handle `fill` could use).
        unsafe { std::ptr::copy_nonoverlapping(xs.as_ptr(), self.base.add(self.done), xs.len()) };
        self.done += xs.len();
    }

    /// Elements appended so far.
    pub fn len(&self) -> usize {
        self.done
    }

    /// Nothing appended yet?
    pub fn is_empty(&self) -> bool {
        self.done == 0
    }

    /// Elements still to append.
    pub fn remaining(&self) -> usize {
        self.cap - self.done
    }
}

/// Zeroes what a panicking or short `fill` left unwritten, so the array
/// never holds uninitialised memory.
struct FillGuard<'a, 'f, T>(&'a mut Filler<'f, T>);

impl<T> Drop for FillGuard<'_, '_, T> {
    fn drop(&mut self) {
        let f = &mut *self.0;
        // SAFETY: [done, len) is inside the payload.
        unsafe { std::ptr::write_bytes(f.base.add(f.done), 0, f.cap - f.done) };
    }
}

/// Marks a raw array busy (every other access to it panics) until dropped.
struct Busy(u64);

impl Busy {
    fn mark(o: u64, header: u64) -> Busy {
        header_at(o).store(header | BUSY, Ordering::Relaxed);
        Busy(o)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        header_at(self.0).fetch_and(!BUSY, Ordering::Relaxed);
    }
}

#[cold]
fn foreign_handle(from: u32, here: u32) -> ! {
    panic!(
        "canopy-hh: a handle of task tree {from} used in task tree {here}: handles stay in the run() that \
         made them (another tree's tasks may move the object at any time)"
    )
}

static NEXT_TREE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

#[cold]
fn busy_panic(o: u64, what: &str) -> ! {
    panic!("canopy-hh: {what} of raw array {o:#x} while par_fill has it in pieces")
}

#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: the pointer is the base of a raw array that par_fill hands out in
// disjoint pieces, one per task; see par_fill.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

fn fill_rec<T: Unboxed, F>(s: &mut Scope<'_>, base: SendPtr<T>, lo: usize, hi: usize, grain: usize, f: &F)
where
    F: for<'a> Fn(&mut Scope<'a>, usize, &mut [T]) + Sync,
{
    if hi - lo <= grain {
        if hi > lo {
            // SAFETY: [lo, hi) is in bounds of the array (par_fill's n), the
            // pieces of different calls are disjoint, the array does not move
            // while par_fill runs (its owner is suspended), and every other
            // access to it panics while it is busy.
            let piece = unsafe { std::slice::from_raw_parts_mut(base.0.add(lo), hi - lo) };
            s.scope(|s| f(s, lo, piece));
        }
        return;
    }
    let mid = lo + (hi - lo) / 2;
    s.par(|s| fill_rec(s, base, lo, mid, grain, f), |s| fill_rec(s, base, mid, hi, grain, f));
}

mod sealed {
    pub trait Sealed {}
}

/// Element types of raw (unboxed) arrays.
pub trait Unboxed: Copy + Send + Sync + 'static + sealed::Sealed {
    #[doc(hidden)]
    fn atomic_load(p: *const Self) -> Self;
    #[doc(hidden)]
    fn atomic_store(p: *mut Self, v: Self);
}

macro_rules! unboxed {
    ($($t:ty => $a:ty, $to:expr, $from:expr);* $(;)?) => {$(
        impl sealed::Sealed for $t {}
        impl Unboxed for $t {
            #[inline]
            fn atomic_load(p: *const Self) -> Self {
                // SAFETY: p is an aligned element of a live raw array
                // (payloads are 8-aligned and callers bound-check).
                let a = unsafe { &*(p as *const $a) };
                #[allow(clippy::redundant_closure_call)]
                ($from)(a.load(Ordering::Relaxed))
            }
            #[inline]
            fn atomic_store(p: *mut Self, v: Self) {
                // SAFETY: as above.
                let a = unsafe { &*(p as *const $a) };
                #[allow(clippy::redundant_closure_call)]
                a.store(($to)(v), Ordering::Relaxed)
            }
        }
    )*};
}

unboxed! {
    u8 => std::sync::atomic::AtomicU8, |v| v, |v| v;
    i8 => std::sync::atomic::AtomicI8, |v| v, |v| v;
    u16 => std::sync::atomic::AtomicU16, |v| v, |v| v;
    i16 => std::sync::atomic::AtomicI16, |v| v, |v| v;
    u32 => std::sync::atomic::AtomicU32, |v| v, |v| v;
    i32 => std::sync::atomic::AtomicI32, |v| v, |v| v;
    u64 => std::sync::atomic::AtomicU64, |v| v, |v| v;
    i64 => std::sync::atomic::AtomicI64, |v| v, |v| v;
    f32 => std::sync::atomic::AtomicU32, |v: f32| v.to_bits(), f32::from_bits;
    f64 => std::sync::atomic::AtomicU64, |v: f64| v.to_bits(), f64::from_bits;
}

/// A task's view of the managed heap, and the scope its handles live in.
///
/// Everything that can allocate (and so collect and move objects) takes
/// `&mut self`; reads take `&self`. A slice borrowed from a raw array
/// therefore cannot be held across an allocation:
///
/// ```compile_fail
/// canopy_hh::run(|s| {
///     let a = s.raw_from::<u64>(&[1, 2, 3]);
///     let view: &[u64] = s.raw_slice(a);
///     let _b = s.tuple(&[]); // error: `s` is borrowed by `view`
///     assert_eq!(view[0], 1);
/// });
/// ```
///
/// A scope is tied to its task: it cannot be sent to or shared with the
/// tasks `par` forks (each of them gets its own):
///
/// ```compile_fail
/// canopy_hh::run(|s| {
///     s.par(|_a| { s.tuple(&[]); }, |_b| ()); // error: `Scope` cannot be shared with a child
/// });
/// ```
pub struct Scope<'s> {
    task: *mut Task,
    _brand: Brand<'s>,
}

/// Run `f` as the root task of a new heap tree. Forks inside `f` run on the
/// current rayon pool (the global one unless called inside
/// `ThreadPool::install`).
///
/// # Panics
/// If called from inside a task (a task tree cannot be nested in another).
pub fn run<R>(f: impl for<'s> FnOnce(&mut Scope<'s>) -> R) -> R {
    run_with_stats(f).0
}

/// [`run`], also returning the counters of the task tree.
pub fn run_with_stats<R>(f: impl for<'s> FnOnce(&mut Scope<'s>) -> R) -> (R, Stats) {
    let (r, task) = run_root(f);
    let stats = task.stats;
    drop(task);
    (r, stats)
}

/// Run `f` as a root task; return its result and the root task, whose heap
/// (every task's heap, merged at the joins) is still alive.
fn run_root<R>(f: impl for<'s> FnOnce(&mut Scope<'s>) -> R) -> (R, Box<Task>) {
    assert!(
        TASKS_ON_THREAD.with(|c| c.get()) == 0,
        "canopy-hh: run() called inside a task; fork with Scope::par instead"
    );
    let _on = OnThread::enter();
    // Boxed so the task can outlive this call (run_keep) without moving.
    let mut task = Box::new(Task::new(std::ptr::null_mut(), 2));
    task.tree = NEXT_TREE.fetch_add(1, Ordering::Relaxed);
    let r = {
        let mut s = Scope::new(&mut task);
        f(&mut s)
    };
    crate::stats::add_global(&task.stats);
    (r, task)
}

/// [`run`] for a program whose result is a managed object: the task tree's
/// heap is kept after the run, holding the object `f` returns, so the caller
/// reads it where it was built instead of copying it out. The heap (all of
/// it: the tasks' heaps were merged into the root's at the joins) is
/// released when the [`Kept`] is dropped.
///
/// ```
/// use canopy_hh::{run_keep, Val};
///
/// let squares = run_keep(|s| {
///     let (l, r) = s.par_gc(
///         |s| s.raw_from::<u64>(&[0, 1, 4]),
///         |s| s.raw_from::<u64>(&[9, 16]),
///     );
///     s.tuple(&[Val::Obj(l), Val::Obj(r)])
/// });
/// let total: u64 = squares.read(|s, pair| {
///     (0..2).map(|i| s.raw_slice::<u64>(s.get(pair, i).as_obj().unwrap()).iter().sum::<u64>()).sum()
/// });
/// assert_eq!(total, 30);
/// ```
///
/// # Panics
/// As [`run`].
pub fn run_keep(f: impl for<'s> FnOnce(&mut Scope<'s>) -> Gc<'s>) -> Kept {
    let (w, mut task) = run_root(|s| f(s).word());
    // The run's own handles died with its closure (their brand cannot leave
    // it): the result is the one root left, so a later collection keeps only
    // what it reaches.
    task.roots.reset(0);
    let slot = task.roots.push(w);
    Kept { task: Box::into_raw(task), slot, reading: std::cell::Cell::new(0) }
}

/// The heap of a finished task tree and the object its root task returned
/// (see [`run_keep`]).
///
/// No task runs in the heap any more; only [`Kept::collect`] (which takes
/// `&mut self`, so no read is open) moves its objects, and the heap lives
/// until the `Kept` is dropped. It is read through a shared [`Scope`], which
/// cannot allocate or fork; `set` works through it, so a kept result's
/// fields can still be updated in place (`raw_set`, which needs `&mut
/// Scope`, does not: unboxed data of a kept result is read-only). It can be
/// sent to another thread
/// (it owns the heap outright), but not shared: a read adds handles to its
/// root stack.
pub struct Kept {
    /// The root task (from `Box::into_raw`; reads mutate its root stack
    /// through `&self`, so no reference to it is kept).
    task: *mut Task,
    /// The root slot holding the result.
    slot: *mut u64,
    /// Reads in progress (nested reads share the root stack). Only the
    /// outermost read releases handles: an outer scope may make a handle
    /// while a nested read is open, and that handle (of the outer brand)
    /// outlives the nested read.
    reading: std::cell::Cell<u32>,
}

// SAFETY: a Kept owns a finished task tree's heap outright: no task runs in
// it and nothing else points at its task, root stack or chunks, and none of
// them is tied to a thread (a dropped chunk goes to the dropping thread's
// pool). So moving it to another thread is sound; it stays !Sync, because a
// read mutates the root stack through `&self`.
unsafe impl Send for Kept {}

impl Kept {
    /// Read the kept result: `f` gets a shared scope over the heap and the
    /// handle of the object the run returned. Handles made while reading
    /// (by `get`) are released when the outermost read returns or unwinds
    /// (a nested read keeps them: the outer scope may have made some of them).
    pub fn read<R>(&self, f: impl for<'k> FnOnce(&Scope<'k>, Gc<'k>) -> R) -> R {
        /// Ends a read, on return or unwind: the outermost read releases
        /// every handle made since the run (slot 0 holds the result).
        struct End<'a>(&'a Kept);
        impl Drop for End<'_> {
            fn drop(&mut self) {
                let n = self.0.reading.get() - 1;
                self.0.reading.set(n);
                if n == 0 {
                    // SAFETY: as in read; no read is open, so no handle of
                    // any read's brand is alive.
                    unsafe { (*self.0.task).roots.reset(1) };
                }
            }
        }
        let task = self.task;
        // SAFETY: the task is ours and alive while self is; a Kept is !Sync,
        // so only this thread touches it now; no reference to the task
        // outlives a statement here or in Scope's methods (see Scope::task),
        // so nested reads are fine.
        let tree = unsafe { (*task).tree };
        self.reading.set(self.reading.get() + 1);
        let _end = End(self);
        let s = Scope { task, _brand: PhantomData };
        let g = Gc { slot: self.slot, tree, _brand: PhantomData };
        f(&s, g)
    }

    /// Collect the kept heap: keep what the result reaches and give the
    /// rest (the run's garbage that no collection reclaimed yet) back.
    /// Objects may move; large objects stay where they are.
    pub fn collect(&mut self) {
        // SAFETY: the task is ours (see read); `&mut self` excludes reads.
        let t = unsafe { &mut *self.task };
        // The collection's own counters go to the global ones too.
        let run = std::mem::take(&mut t.stats);
        crate::gc::collect(t, crate::gc::Reach::Own);
        let this = std::mem::replace(&mut t.stats, run);
        crate::stats::add_global(&this);
        t.stats.add(&this);
    }

    /// Run the heap verifier on the kept heap.
    pub fn verify(&mut self) -> Result<(), String> {
        // SAFETY: as in collect.
        crate::gc::verify(unsafe { &mut *self.task })
    }

    /// Counters of the task tree's run (and of collections of the kept heap).
    pub fn stats(&self) -> Stats {
        // SAFETY: see read.
        unsafe { (*self.task).stats }
    }

    /// Bytes of chunks the kept heap holds.
    pub fn heap_bytes(&self) -> usize {
        // SAFETY: see read.
        unsafe { (*self.task).bytes }
    }
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kept").field("heap_bytes", &self.heap_bytes()).finish()
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        // SAFETY: from Box::into_raw in run_keep, dropped once; the Task's
        // own Drop releases the heap's chunks.
        drop(unsafe { Box::from_raw(self.task) });
    }
}

impl<'s> Scope<'s> {
    fn new(task: &mut Task) -> Scope<'s> {
        Scope { task, _brand: PhantomData }
    }

    #[inline]
    #[allow(clippy::mut_from_ref)]
    fn task(&self) -> &mut Task {
        // SAFETY: the scope is used by its task's thread only (it is !Send and
        // !Sync), and no method holds this reference across a call that
        // creates another one.
        unsafe { &mut *self.task }
    }

    #[inline]
    fn root(&self, w: u64) -> Gc<'s> {
        let t = self.task();
        Gc { slot: t.roots.push(w), tree: t.tree, _brand: PhantomData }
    }

    /// The object behind a handle, checked in debug builds to belong to this
    /// task's heap or an ancestor's.
    #[inline]
    fn obj(&self, g: Gc<'_>) -> u64 {
        // In every build: the slot must belong to this task tree, where its
        // owner is this task or a suspended ancestor (never collecting now).
        if g.tree != self.task().tree {
            foreign_handle(g.tree, self.task().tree);
        }
        let o = g.word();
        if cfg!(debug_assertions) {
            self.check_reachable(o);
        }
        o
    }

    /// The word of a value, its handle checked as in `obj`.
    #[inline]
    fn val_word(&self, v: Val<'_>) -> u64 {
        match v {
            Val::Obj(g) => self.obj(g),
            Val::Int(_) => v.word(),
        }
    }

    #[cold]
    fn check_reachable(&self, o: u64) {
        let me = self.task().heap();
        match heap::heap_of(o) {
            Some(h) if heap::is_ancestor_or_self(h, me) => {}
            Some(h) => panic!(
                "canopy-hh: handle to {o:#x} used in {}, but the object belongs to {}, which is not its ancestor \
                 (a handle was carried out of its task tree)",
                heap::task_name(me),
                heap::task_name(h)
            ),
            None => panic!("canopy-hh: handle to {o:#x} used in {}, but no live heap holds it", heap::task_name(me)),
        }
    }

    #[inline]
    fn header(&self, o: u64) -> (u64, Kind, usize) {
        let h = header_at(o).load(Ordering::Relaxed);
        (h, object::header_kind(h), object::header_len(h))
    }

    /// The header of a raw array about to be accessed: refused while
    /// `par_fill` has it in pieces.
    #[inline]
    fn raw_header(&self, o: u64, what: &str) -> (u64, Kind, usize) {
        let r = self.header(o);
        if r.0 & BUSY != 0 {
            busy_panic(o, what);
        }
        r
    }

    #[inline]
    fn alloc_object(&mut self, kind: Kind, len: usize) -> *mut u64 {
        assert!(len <= object::MAX_LEN, "canopy-hh: object length {len} exceeds {}", object::MAX_LEN);
        let words = 1 + object::payload_words(kind, len);
        let t = self.task();
        let p = t.alloc_words(words);
        t.stats.bytes_allocated += words as u64 * 8;
        t.stats.objects_allocated += 1;
        // SAFETY: p is a fresh block of `words` words.
        unsafe { p.write(object::make_header(kind, len)) };
        p
    }

    // ---- scopes and forks --------------------------------------------------

    /// Run `f` in a nested scope: the handles it makes are released when it
    /// returns (use this in loops that read many objects).
    pub fn scope<R>(&mut self, f: impl for<'i> FnOnce(&mut Scope<'i>) -> R) -> R {
        let mark = self.task().roots.mark();
        let r = f(&mut Scope::new(self.task()));
        self.task().roots.reset(mark);
        r
    }

    /// [`Scope::scope`], keeping the one handle `f` returns (re-rooted here).
    pub fn scope_keep(&mut self, f: impl for<'i> FnOnce(&mut Scope<'i>) -> Gc<'i>) -> Gc<'s> {
        let out = self.root(Word::int(0).0);
        let mark = self.task().roots.mark();
        let g = f(&mut Scope::new(self.task()));
        let w = g.word();
        self.task().roots.reset(mark);
        // SAFETY: out's slot is below the mark, so still live.
        unsafe { *out.slot = w };
        out
    }

    /// Fork: run `f` and `g` as two child tasks, possibly in parallel, each in
    /// a fresh heap under this task's heap; join them (splicing their heaps
    /// into this one) and return both results. Handles of this scope may be
    /// used by both children.
    pub fn par<RA: Send, RB: Send>(
        &mut self,
        f: impl for<'a> FnOnce(&mut Scope<'a>) -> RA + Send,
        g: impl for<'b> FnOnce(&mut Scope<'b>) -> RB + Send,
    ) -> (RA, RB) {
        let r = self.fork_raw(f, g);
        self.after_join();
        r
    }

    /// The fork itself, without the join-time collection (the callers that
    /// return managed words root them first).
    fn fork_raw<RA: Send, RB: Send>(
        &mut self,
        f: impl for<'a> FnOnce(&mut Scope<'a>) -> RA + Send,
        g: impl for<'b> FnOnce(&mut Scope<'b>) -> RB + Send,
    ) -> (RA, RB) {
        let _at_join = AtJoin::enter();
        self.task().fork(
            move |t| {
                let _on = OnThread::enter();
                f(&mut Scope::new(t))
            },
            move |t| {
                let _on = OnThread::enter();
                g(&mut Scope::new(t))
            },
        )
    }

    /// At a join the children's heaps become this task's: collect if that
    /// took the heap over its threshold (a task that only forks and joins
    /// would otherwise never collect what its children left).
    #[inline]
    fn after_join(&mut self) {
        let t = self.task();
        if crate::config::config().gc && crate::gc::over_threshold(t) {
            crate::gc::collect(t, crate::gc::Reach::AncestorsOverThreshold);
        }
    }

    /// [`Scope::par`] for children that return managed objects: the results are
    /// in this task's heap after the join and come back as handles here.
    pub fn par_gc(
        &mut self,
        f: impl for<'a> FnOnce(&mut Scope<'a>) -> Gc<'a> + Send,
        g: impl for<'b> FnOnce(&mut Scope<'b>) -> Gc<'b> + Send,
    ) -> (Gc<'s>, Gc<'s>) {
        let (a, b) = self.fork_raw(move |s| f(s).word(), move |s| g(s).word());
        // Nothing allocates or collects between the children's return and
        // here, so the words are still current.
        let r = (self.root(a), self.root(b));
        self.after_join();
        r
    }

    /// [`Scope::par`] for children that return values (integers or objects).
    pub fn par_val(
        &mut self,
        f: impl for<'a> FnOnce(&mut Scope<'a>) -> Val<'a> + Send,
        g: impl for<'b> FnOnce(&mut Scope<'b>) -> Val<'b> + Send,
    ) -> (Val<'s>, Val<'s>) {
        let (a, b) = self.fork_raw(move |s| f(s).word(), move |s| g(s).word());
        let r = (self.val(a), self.val(b));
        self.after_join();
        r
    }

    fn val(&self, w: u64) -> Val<'s> {
        if Word(w).is_int() {
            Val::Int(Word(w).as_int())
        } else {
            Val::Obj(self.root(w))
        }
    }

    /// A handle in this scope to the object of a handle from an enclosing
    /// scope or an ancestor task, so it can sit beside this scope's handles.
    pub fn rebind(&self, g: Gc<'_>) -> Gc<'s> {
        self.root(self.obj(g))
    }

    /// [`Scope::rebind`] for values.
    pub fn rebind_val(&self, v: Val<'_>) -> Val<'s> {
        match v {
            Val::Int(i) => Val::Int(i),
            Val::Obj(g) => Val::Obj(self.rebind(g)),
        }
    }

    /// A parallel loop: `f(scope, i)` for every `i` in `range`, split by `par`
    /// down to `grain` indices per task; each index gets its own nested scope.
    pub fn par_for<F>(&mut self, range: Range<usize>, grain: usize, f: F)
    where
        F: for<'a> Fn(&mut Scope<'a>, usize) + Sync,
    {
        self.par_for_rec(range, grain.max(1), &f);
    }

    fn par_for_rec<F>(&mut self, r: Range<usize>, grain: usize, f: &F)
    where
        F: for<'a> Fn(&mut Scope<'a>, usize) + Sync,
    {
        if r.len() <= grain {
            for i in r {
                self.scope(|s| f(s, i));
            }
            return;
        }
        let mid = r.start + r.len() / 2;
        self.par(|s| s.par_for_rec(r.start..mid, grain, f), |s| s.par_for_rec(mid..r.end, grain, f));
    }

    /// A parallel reduction: `leaf(scope, sub_range)` on pieces of at most
    /// `grain` indices, combined pairwise with `combine` in index order.
    pub fn par_reduce<R, L, C>(&mut self, range: Range<usize>, grain: usize, leaf: L, combine: C) -> R
    where
        R: Send,
        L: for<'a> Fn(&mut Scope<'a>, Range<usize>) -> R + Sync,
        C: Fn(R, R) -> R + Sync,
    {
        self.par_reduce_rec(range, grain.max(1), &leaf, &combine)
    }

    fn par_reduce_rec<R, L, C>(&mut self, r: Range<usize>, grain: usize, leaf: &L, combine: &C) -> R
    where
        R: Send,
        L: for<'a> Fn(&mut Scope<'a>, Range<usize>) -> R + Sync,
        C: Fn(R, R) -> R + Sync,
    {
        if r.len() <= grain {
            return self.scope(|s| leaf(s, r));
        }
        let mid = r.start + r.len() / 2;
        let (a, b) = self.par(
            |s| s.par_reduce_rec(r.start..mid, grain, leaf, combine),
            |s| s.par_reduce_rec(mid..r.end, grain, leaf, combine),
        );
        combine(a, b)
    }

    // ---- allocation ---------------------------------------------------------

    /// An immutable tuple (record) of values.
    pub fn tuple(&mut self, fields: &[Val<'_>]) -> Gc<'s> {
        let p = self.alloc_object(Kind::Tuple, fields.len());
        for (i, v) in fields.iter().enumerate() {
            // Read the handles after the allocation: it may have moved them.
            // SAFETY: field i of the fresh object.
            unsafe { p.add(1 + i).write(self.val_word(*v)) };
        }
        self.root(p as u64)
    }

    /// A mutable array of `len` values, each `init`.
    pub fn array(&mut self, len: usize, init: Val<'_>) -> Gc<'s> {
        let p = self.alloc_object(Kind::Array, len);
        let w = self.val_word(init);
        for i in 0..len {
            // SAFETY: field i of the fresh object.
            unsafe { p.add(1 + i).write(w) };
        }
        self.root(p as u64)
    }

    /// A mutable reference holding `init`.
    pub fn new_ref(&mut self, init: Val<'_>) -> Gc<'s> {
        let p = self.alloc_object(Kind::Ref, 1);
        // SAFETY: the one field of the fresh object.
        unsafe { p.add(1).write(self.val_word(init)) };
        self.root(p as u64)
    }

    /// A mutable raw array of `len` zeroed elements of `T`.
    pub fn raw<T: Unboxed>(&mut self, len: usize) -> Gc<'s> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).expect("canopy-hh: raw array size overflows");
        let p = self.alloc_object(Kind::RawMut, bytes);
        // SAFETY: the payload of the fresh object is bytes.div_ceil(8) words.
        unsafe { std::ptr::write_bytes(p.add(1), 0, bytes.div_ceil(8)) };
        self.root(p as u64)
    }

    /// An immutable raw array holding a copy of `data`.
    pub fn raw_from<T: Unboxed>(&mut self, data: &[T]) -> Gc<'s> {
        let bytes = std::mem::size_of_val(data);
        let p = self.alloc_object(Kind::Raw, bytes);
        // SAFETY: the payload holds `bytes` bytes (rounded up to words, the
        // tail word zeroed first); `data` is not managed memory (it cannot be
        // borrowed from this scope while `&mut self` is held).
        unsafe {
            if bytes % 8 != 0 {
                p.add(bytes / 8 + 1).write(0);
            }
            std::ptr::copy_nonoverlapping(data.as_ptr() as *const u8, p.add(1) as *mut u8, bytes);
        }
        self.root(p as u64)
    }

    /// An immutable raw array copied from elements `range` of raw array `src`.
    pub fn raw_copy<T: Unboxed>(&mut self, src: Gc<'_>, range: Range<usize>) -> Gc<'s> {
        let n = self.raw_len::<T>(src);
        assert!(range.start <= range.end && range.end <= n, "canopy-hh: raw_copy range {range:?} out of bounds for length {n}");
        let bytes = range.len() * std::mem::size_of::<T>();
        let p = self.alloc_object(Kind::Raw, bytes);
        let o = self.obj(src);
        let (_, kind, _) = self.raw_header(o, "raw_copy");
        if kind == Kind::RawMut && !self.owns(o) {
            panic!("canopy-hh: raw_copy from a mutable raw array of another task's heap; read it with raw_get");
        }
        // SAFETY: the source range is in bounds (checked) and the source is
        // immutable or this task's own (so no concurrent writer); the
        // destination is the fresh payload.
        unsafe {
            if bytes % 8 != 0 {
                p.add(bytes / 8 + 1).write(0);
            }
            let from = (o as *const u64).add(1) as *const T;
            std::ptr::copy_nonoverlapping(from.add(range.start), p.add(1) as *mut T, range.len());
        }
        self.root(p as u64)
    }

    /// Turn a mutable array (or raw array) of this task's own heap into an
    /// immutable one, in place. Immutable objects are read without barriers.
    pub fn freeze(&mut self, g: Gc<'_>) {
        let o = self.obj(g);
        let (h, kind, _) = self.raw_header(o, "freeze");
        assert!(
            matches!(kind, Kind::Array | Kind::RawMut),
            "canopy-hh: freeze of a {kind:?}; only Array and RawMut can be frozen"
        );
        assert!(self.owns(o), "canopy-hh: freeze of an object outside this task's own heap ({})", heap::task_name(self.task().heap()));
        let nh = object::with_kind(h & !FRONTIER, kind.frozen());
        header_at(o).store(nh, Ordering::Relaxed);
    }

    // ---- reads and writes ---------------------------------------------------

    fn owns(&self, o: u64) -> bool {
        let me = self.task().heap_if_any();
        !me.is_null() && heap::heap_of(o) == Some(me)
    }

    /// The kind of an object.
    pub fn kind(&self, g: Gc<'_>) -> Kind {
        self.header(self.obj(g)).1
    }

    /// Number of fields (value kinds) or bytes (raw kinds).
    pub fn len(&self, g: Gc<'_>) -> usize {
        self.header(self.obj(g)).2
    }

    /// Number of `T` elements of a raw array.
    pub fn raw_len<T: Unboxed>(&self, g: Gc<'_>) -> usize {
        let (_, kind, len) = self.header(self.obj(g));
        assert!(!kind.holds_values(), "canopy-hh: raw_len of a {kind:?}");
        len / std::mem::size_of::<T>()
    }

    #[inline]
    fn value_field(&self, o: u64, i: usize, what: &str) -> (u64, Kind) {
        let (h, kind, len) = self.header(o);
        if !kind.holds_values() {
            panic!("canopy-hh: {what} on a {kind:?} object {o:#x}; use the raw_* methods");
        }
        if i >= len {
            panic!("canopy-hh: {what}: index {i} out of bounds for {kind:?} of length {len}");
        }
        (h, kind)
    }

    /// Read field `i`. Immutable objects are read plainly; a mutable object is
    /// read through the read barrier, which checks for entanglement when the
    /// object is on the frontier (holds pointers into other heaps).
    #[inline]
    pub fn get(&self, g: Gc<'_>, i: usize) -> Val<'s> {
        let w = self.read(g, i, "get");
        self.val(w)
    }

    /// Read field `i` as an integer (no handle is made).
    ///
    /// # Panics
    /// If the field holds an object.
    #[inline]
    pub fn get_int(&self, g: Gc<'_>, i: usize) -> i64 {
        let w = Word(self.read(g, i, "get_int"));
        assert!(w.is_int(), "canopy-hh: get_int: field {i} holds an object");
        w.as_int()
    }

    #[inline]
    fn read(&self, g: Gc<'_>, i: usize, what: &str) -> u64 {
        let o = self.obj(g);
        let (_, kind) = self.value_field(o, i, what);
        let f = field_at(o, i);
        if !kind.is_mutable() {
            return f.load(Ordering::Relaxed);
        }
        // Read barrier. The writer sets FRONTIER before it stores the field
        // (release), so a reader that sees the new pointer sees the bit.
        let w = f.load(Ordering::Acquire);
        if Word(w).is_ptr() && header_at(o).load(Ordering::Relaxed) & FRONTIER != 0 {
            self.entanglement_check(o, w);
        }
        w
    }

    #[cold]
    fn entanglement_check(&self, o: u64, w: u64) {
        let t = self.task();
        t.stats.frontier_checks += 1;
        let me = t.heap();
        match heap::heap_of(w) {
            Some(h) if heap::is_ancestor_or_self(h, me) => {}
            found => {
                let holder = heap::heap_of(o).map(heap::task_name).unwrap_or_else(|| "no live heap".into());
                let alloc = found
                    .map(heap::task_name)
                    .unwrap_or_else(|| "a task whose heap was already reclaimed".into());
                panic!(
                    "canopy-hh: entanglement detected: {} read, from mutable object {o:#x} (heap of {holder}), \
                     a pointer to object {w:#x} allocated by {alloc}, which runs concurrently with the reader \
                     (neither heap is an ancestor of the other). Managing entanglement (pinning) is part 2 of \
                     the hierarchical heaps and not implemented yet, so the program is stopped before it can \
                     use the pointer.",
                    heap::task_name(me)
                );
            }
        }
    }

    /// Write `v` into field `i` of a mutable array or ref, through the write
    /// barrier: a pointer from an older heap's object into a younger heap is
    /// recorded in the younger heap's remembered set, and the object joins the
    /// frontier so concurrent readers check what they read from it.
    pub fn set(&self, g: Gc<'_>, i: usize, v: Val<'_>) {
        let o = self.obj(g);
        let (h, kind) = self.value_field(o, i, "set");
        assert!(kind.is_mutable(), "canopy-hh: set on an immutable {kind:?} object {o:#x}");
        let w = self.val_word(v);
        if Word(w).is_ptr() && crate::chunk::chunk_of(w) != crate::chunk::chunk_of(o) {
            self.write_barrier(o, h, i, w);
        }
        field_at(o, i).store(w, Ordering::Release);
    }

    #[cold]
    fn write_barrier(&self, o: u64, h: u64, i: usize, w: u64) {
        let t = self.task();
        let me = t.heap();
        let (Some(ho), Some(hw)) = (heap::heap_of(o), heap::heap_of(w)) else {
            panic!("canopy-hh: set: object {o:#x} or value {w:#x} is not in a live heap ({})", heap::task_name(me));
        };
        if ho == hw {
            return;
        }
        if !heap::is_ancestor_or_self(ho, me) || !heap::is_ancestor_or_self(hw, me) {
            panic!(
                "canopy-hh: set in {}: writing a pointer to {w:#x} (heap of {}) into {o:#x} (heap of {}); one of them \
                 is not in this task's heap or an ancestor's (entanglement or a handle carried out of its task tree)",
                heap::task_name(me),
                heap::task_name(hw),
                heap::task_name(ho)
            );
        }
        if heap::is_ancestor_or_self(hw, ho) {
            return; // a pointer up the tree: the older heap outlives the younger
        }
        // A pointer down the tree: remember it for hw's collector.
        let e = RemEntry { obj: o, index: i as u32 };
        assert!(i <= u32::MAX as usize, "canopy-hh: field index {i} too large for the remembered set");
        if hw == me {
            t.remset.push(e);
        } else {
            // SAFETY: hw is an ancestor of this task, so live (suspended).
            let rec = unsafe { &*hw };
            let mut v = rec.shared_remset.lock().unwrap_or_else(|e| e.into_inner());
            v.push(e);
            rec.shared_pending.store(true, Ordering::Release);
        }
        t.stats.remset_entries += 1;
        if h & FRONTIER == 0 {
            header_at(o).fetch_or(FRONTIER, Ordering::Relaxed);
        }
    }

    /// A read-only view of a raw array: any immutable raw array, or a mutable
    /// one of this task's own heap.
    pub fn raw_slice<T: Unboxed>(&self, g: Gc<'_>) -> &[T] {
        let o = self.obj(g);
        let (_, kind, len) = self.raw_header(o, "raw_slice");
        assert!(!kind.holds_values(), "canopy-hh: raw_slice of a {kind:?}");
        if kind == Kind::RawMut && !self.owns(o) {
            panic!(
                "canopy-hh: raw_slice of a mutable raw array of another task's heap ({}); other tasks may write it: \
                 use raw_get, or freeze it first",
                heap::task_name(self.task().heap())
            );
        }
        // SAFETY: the payload is 8-aligned and holds `len` bytes; it does not
        // move while `&self` is borrowed (collection needs `&mut self`, and only
        // the owning task collects); no one writes it meanwhile (immutable, or
        // this task's own with writes needing `&mut self`).
        unsafe { std::slice::from_raw_parts((o as *const u64).add(1) as *const T, len / std::mem::size_of::<T>()) }
    }

    /// A writable view of a mutable raw array of this task's own heap.
    pub fn raw_mut<T: Unboxed>(&mut self, g: Gc<'_>) -> &mut [T] {
        let o = self.obj(g);
        let (_, kind, len) = self.raw_header(o, "raw_mut");
        assert!(kind == Kind::RawMut, "canopy-hh: raw_mut of a {kind:?}; only RawMut arrays are writable");
        assert!(
            self.owns(o),
            "canopy-hh: raw_mut of an array outside this task's own heap ({}); use raw_set",
            heap::task_name(self.task().heap())
        );
        // SAFETY: as raw_slice; `&mut self` excludes every other view in this
        // task, and other tasks reach this heap's objects only after it joins.
        unsafe { std::slice::from_raw_parts_mut((o as *mut u64).add(1) as *mut T, len / std::mem::size_of::<T>()) }
    }

    /// Read element `i` of a raw array (atomically: safe on arrays other tasks
    /// write).
    #[inline]
    pub fn raw_get<T: Unboxed>(&self, g: Gc<'_>, i: usize) -> T {
        let o = self.obj(g);
        let (_, kind, len) = self.raw_header(o, "raw_get");
        assert!(!kind.holds_values(), "canopy-hh: raw_get of a {kind:?}");
        let n = len / std::mem::size_of::<T>();
        assert!(i < n, "canopy-hh: raw_get: index {i} out of bounds for length {n}");
        // SAFETY: in bounds, aligned (8-aligned payload, i * size_of::<T>()).
        T::atomic_load(unsafe { ((o as *const u64).add(1) as *const T).add(i) })
    }

    /// Write element `i` of a mutable raw array (atomically: children may
    /// write disjoint or even the same elements of an ancestor's array).
    #[inline]
    pub fn raw_set<T: Unboxed>(&mut self, g: Gc<'_>, i: usize, v: T) {
        let o = self.obj(g);
        let (_, kind, len) = self.raw_header(o, "raw_set");
        assert!(kind == Kind::RawMut, "canopy-hh: raw_set of a {kind:?}; only RawMut arrays are writable");
        let n = len / std::mem::size_of::<T>();
        assert!(i < n, "canopy-hh: raw_set: index {i} out of bounds for length {n}");
        // SAFETY: as raw_get.
        T::atomic_store(unsafe { ((o as *mut u64).add(1) as *mut T).add(i) }, v)
    }

    /// A new mutable raw array of `len` elements, written by `fill` before
    /// anyone can see it: `fill` gets read access to the heap (`&Scope`, e.g.
    /// `raw_slice` of other arrays) and a [`Filler`] that appends elements;
    /// it must append exactly `len` (checked: a short or long fill panics).
    /// No zeroing, no staging copy: this is how a merge or a copy makes its
    /// output. Freeze the result if it should be immutable.
    pub fn raw_build<T: Unboxed, R>(
        &mut self,
        len: usize,
        fill: impl FnOnce(&Scope<'s>, &mut Filler<'_, T>) -> R,
    ) -> (Gc<'s>, R) {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).expect("canopy-hh: raw array size overflows");
        let p = self.alloc_object(Kind::RawMut, bytes);
        // SAFETY: the payload has bytes.div_ceil(8) words; the tail word is
        // zeroed first so no byte of the payload stays unwritten.
        unsafe {
            if bytes % 8 != 0 {
                p.add(bytes / 8 + 1).write(0);
            }
        }
        let g = self.root(p as u64);
        // SAFETY: the payload holds `len` elements of T (8-aligned); no handle
        // to the new array exists besides `g`, which `fill` does not get, and
        // the array cannot move while `fill` holds `&Scope` (collection needs
        // `&mut Scope`).
        let mut filler = Filler { base: unsafe { p.add(1) as *mut T }, cap: len, done: 0, _life: PhantomData };
        let guard = FillGuard(&mut filler);
        let r = fill(self, guard.0);
        let done = guard.0.done;
        if done != len {
            drop(guard); // zeroes the unwritten tail
            panic!("canopy-hh: raw_build of {len} elements: fill appended {done}");
        }
        std::mem::forget(guard);
        (g, r)
    }

    /// Write into a mutable raw array of this task's own heap while reading
    /// others: `f` gets `&mut [T]` of `dst` and read access to the heap. The
    /// array is marked busy meanwhile, so `f` cannot also view it through the
    /// scope.
    pub fn with_raw_mut<T: Unboxed, R>(&mut self, dst: Gc<'_>, f: impl FnOnce(&Scope<'s>, &mut [T]) -> R) -> R {
        let o = self.obj(dst);
        let (h, kind, len) = self.raw_header(o, "with_raw_mut");
        assert!(kind == Kind::RawMut, "canopy-hh: with_raw_mut of a {kind:?}; only RawMut arrays are writable");
        assert!(
            self.owns(o),
            "canopy-hh: with_raw_mut of an array outside this task's own heap ({})",
            heap::task_name(self.task().heap())
        );
        let _unbusy = Busy::mark(o, h);
        // SAFETY: as raw_mut; besides, the busy bit refuses every other view
        // of the array while `f` runs, and `f` cannot allocate (it gets
        // `&Scope`), so the array does not move.
        let view = unsafe { std::slice::from_raw_parts_mut((o as *mut u64).add(1) as *mut T, len / std::mem::size_of::<T>()) };
        f(self, view)
    }

    /// Write `data` into elements `offset..` of a mutable raw array, element
    /// by element with atomic stores (children may fill disjoint parts of an
    /// ancestor's array this way).
    pub fn raw_set_range<T: Unboxed>(&mut self, g: Gc<'_>, offset: usize, data: &[T]) {
        let o = self.obj(g);
        let (_, kind, len) = self.raw_header(o, "raw_set_range");
        assert!(kind == Kind::RawMut, "canopy-hh: raw_set_range of a {kind:?}; only RawMut arrays are writable");
        let n = len / std::mem::size_of::<T>();
        assert!(
            offset <= n && data.len() <= n - offset,
            "canopy-hh: raw_set_range: {} elements at {offset} do not fit length {n}",
            data.len()
        );
        let base = (o as *mut u64).wrapping_add(1) as *mut T;
        for (i, &v) in data.iter().enumerate() {
            // SAFETY: offset + i < n (checked), aligned as in raw_get.
            T::atomic_store(unsafe { base.add(offset + i) }, v);
        }
    }

    /// Fill a mutable raw array of this task's own heap in parallel: the array
    /// is split into disjoint pieces of at most `grain` elements, and
    /// `f(scope, offset, piece)` runs on each in a child task, with the piece
    /// as `&mut [T]`. Meanwhile every other access to the array panics (it is
    /// marked busy), and the array cannot move (only its owner, suspended in
    /// this call, could collect it).
    pub fn par_fill<T: Unboxed, F>(&mut self, g: Gc<'_>, grain: usize, f: F)
    where
        F: for<'a> Fn(&mut Scope<'a>, usize, &mut [T]) + Sync,
    {
        let o = self.obj(g);
        let (h, kind, len) = self.raw_header(o, "par_fill");
        assert!(kind == Kind::RawMut, "canopy-hh: par_fill of a {kind:?}; only RawMut arrays are writable");
        assert!(
            self.owns(o),
            "canopy-hh: par_fill of an array outside this task's own heap ({})",
            heap::task_name(self.task().heap())
        );
        let n = len / std::mem::size_of::<T>();
        let unbusy = Busy::mark(o, h);
        let base = SendPtr((o as *mut u64).wrapping_add(1) as *mut T);
        let grain = grain.max(1);
        // Even a single piece runs in a child: the owner could collect (and
        // move the array) if `f` allocated in the owner's scope.
        let mid = if n <= grain { n } else { n / 2 };
        // No descendant may collect this heap while the pieces are out.
        self.task().shielded += 1;
        struct Unshield(*mut Task);
        impl Drop for Unshield {
            fn drop(&mut self) {
                // SAFETY: the task outlives this call.
                unsafe { (*self.0).shielded -= 1 };
            }
        }
        let unshield = Unshield(self.task);
        // No collection at this join: the guards still name the array at `o`.
        self.fork_raw(|s| fill_rec(s, base, 0, mid, grain, &f), |s| fill_rec(s, base, mid, n, grain, &f));
        drop(unshield);
        drop(unbusy);
        self.after_join();
    }

    // ---- the collector ------------------------------------------------------

    /// Collect this task's heap now.
    pub fn collect(&mut self) {
        crate::gc::collect(self.task(), crate::gc::Reach::Own);
    }

    /// Collect this task's heap and the heaps of the ancestors that no other
    /// task can reach now: going up the task tree while this task's branch is
    /// the first child of a fork whose second child has not started (that
    /// child waits until the collection ends). Returns how many ancestor heaps
    /// were collected. The automatic collection does the same for ancestors
    /// over their own thresholds.
    pub fn collect_with_ancestors(&mut self) -> u64 {
        let before = self.task().stats.ancestor_levels;
        crate::gc::collect(self.task(), crate::gc::Reach::Ancestors);
        self.task().stats.ancestor_levels - before
    }

    /// Run the heap verifier on this task's heap now.
    pub fn verify(&mut self) -> Result<(), String> {
        crate::gc::verify(self.task())
    }

    /// Counters of this task so far (children's included once joined).
    pub fn stats(&self) -> Stats {
        self.task().stats
    }

    /// Bytes of chunks in this task's heap.
    pub fn heap_bytes(&self) -> usize {
        self.task().bytes
    }

    /// Handle slots in use by this task.
    pub fn handles(&self) -> usize {
        self.task().roots.len()
    }

    /// Depth of this task in the task tree (the root task is 0).
    pub fn depth(&self) -> u32 {
        // SAFETY: our record is live.
        unsafe { (*self.task().heap()).depth.load(Ordering::Relaxed) }
    }
}
