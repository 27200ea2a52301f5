//! Heap records: the nodes of the heap tree, and union-find for merged heaps.
//!
//! Every task has a heap record. At a fork the two children get fresh records
//! whose `tree_parent` is the forking task's record and whose depth is one
//! more. At the join each child record is *merged* into the parent's: its
//! `merged_into` is set, and nothing else is touched, so the chunks that still
//! name the child record now belong to the parent (found by following
//! `merged_into`: union-find without path compression; the collector re-homes
//! survivors into fresh chunks of the current record, which keeps chains short).
//!
//! A record lives while something names it: its task, each chunk allocated for
//! it, each record merged into it. The count is touched only by the task that
//! owns the record's subtree at that moment (forks and joins order those
//! accesses), so it needs no read-modify-write atomics; it is an atomic only
//! so that concurrent *readers* (the entanglement check) never race with it.
//! Freed records go back to a pool and are never returned to the OS, so a
//! reader that holds a stale record reads a valid (if recycled) record.

use std::cell::RefCell;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// A remembered-set entry: field `index` of the object at `obj` (which lives in
/// another heap) points into this heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RemEntry {
    pub(crate) obj: u64,
    pub(crate) index: u32,
}

pub(crate) struct HeapRecord {
    pub(crate) merged_into: AtomicPtr<HeapRecord>,
    /// The heap of the parent task (null for a root heap).
    pub(crate) tree_parent: AtomicPtr<HeapRecord>,
    pub(crate) depth: AtomicU32,
    /// Unique id of the task (for messages).
    pub(crate) task_id: AtomicU64,
    /// 0: left child, 1: right child, 2: root.
    pub(crate) side: AtomicU32,
    refs: AtomicUsize,
    /// Remembered-set entries pushed by descendant tasks (a descendant writes a
    /// pointer to this heap's object into an object of an older heap).
    pub(crate) shared_remset: Mutex<Vec<RemEntry>>,
    /// Set (under the lock) when `shared_remset` got an entry, so the join
    /// takes the lock only when there is something to take.
    pub(crate) shared_pending: AtomicBool,
}

static NEXT_TASK_ID: AtomicU64 = AtomicU64::new(1);
static POOL: Mutex<Vec<usize>> = Mutex::new(Vec::new());
static LIVE_RECORDS: AtomicUsize = AtomicUsize::new(0);

const ID_BLOCK: u64 = 1024;

thread_local! {
    static IDS: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    static CACHE: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

const CACHE_MAX: usize = 256;

impl HeapRecord {
    fn fresh() -> *mut HeapRecord {
        Box::into_raw(Box::new(HeapRecord {
            merged_into: AtomicPtr::new(ptr::null_mut()),
            tree_parent: AtomicPtr::new(ptr::null_mut()),
            depth: AtomicU32::new(0),
            task_id: AtomicU64::new(0),
            side: AtomicU32::new(2),
            refs: AtomicUsize::new(0),
            shared_remset: Mutex::new(Vec::new()),
            shared_pending: AtomicBool::new(false),
        }))
    }

    /// A record for a new task under `parent` (null: a root task). The task
    /// holds the one reference.
    pub(crate) fn new_task(parent: *mut HeapRecord, side: u32, task_id: u64) -> *mut HeapRecord {
        let r = CACHE
            .try_with(|c| c.borrow_mut().pop())
            .ok()
            .flatten()
            .or_else(|| POOL.lock().unwrap_or_else(|e| e.into_inner()).pop())
            .map(|a| a as *mut HeapRecord)
            .unwrap_or_else(HeapRecord::fresh);
        LIVE_RECORDS.fetch_add(1, Ordering::Relaxed);
        let depth = if parent.is_null() {
            0
        } else {
            // SAFETY: the parent task is suspended in par; its record lives.
            unsafe { (*parent).depth.load(Ordering::Relaxed) + 1 }
        };
        // SAFETY: r is a pooled or fresh record that nothing names.
        let rec = unsafe { &*r };
        rec.merged_into.store(ptr::null_mut(), Ordering::Relaxed);
        rec.tree_parent.store(parent, Ordering::Relaxed);
        rec.depth.store(depth, Ordering::Relaxed);
        rec.task_id.store(task_id, Ordering::Relaxed);
        rec.side.store(side, Ordering::Relaxed);
        rec.refs.store(1, Ordering::Relaxed);
        r
    }

    /// A fresh task id (ids are taken from the global counter in blocks, so
    /// making records does not contend on it).
    pub(crate) fn next_task_id() -> u64 {
        IDS.with(|c| {
            let (next, end) = c.get();
            let (next, end) = if next == end {
                let b = NEXT_TASK_ID.fetch_add(ID_BLOCK, Ordering::Relaxed);
                (b, b + ID_BLOCK)
            } else {
                (next, end)
            };
            c.set((next + 1, end));
            next
        })
    }

    /// # Safety
    /// `r` is a live record owned by the calling task's subtree.
    pub(crate) unsafe fn add_ref(r: *mut HeapRecord) {
        // SAFETY: caller.
        let rec = unsafe { &*r };
        rec.refs.store(rec.refs.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Drop one reference; at zero the record is recycled and its reference to
    /// the record it was merged into is dropped too.
    ///
    /// # Safety
    /// `r` is a live record owned by the calling task's subtree, and the caller
    /// held one of its references.
    pub(crate) unsafe fn unref(mut r: *mut HeapRecord) {
        loop {
            // SAFETY: caller / loop invariant: r is live and we hold a reference.
            let rec = unsafe { &*r };
            let n = rec.refs.load(Ordering::Relaxed);
            debug_assert!(n > 0, "heap record reference count underflow");
            rec.refs.store(n - 1, Ordering::Relaxed);
            if n != 1 {
                return;
            }
            let next = rec.merged_into.load(Ordering::Relaxed);
            debug_assert!(rec.shared_remset.lock().map(|v| v.is_empty()).unwrap_or(true));
            LIVE_RECORDS.fetch_sub(1, Ordering::Relaxed);
            recycle(r);
            if next.is_null() {
                return;
            }
            r = next;
        }
    }

    /// Merge `child` (a finished task's record) into `parent`.
    ///
    /// # Safety
    /// Both records are live; `child`'s task has finished and is being joined
    /// by `parent`'s task.
    pub(crate) unsafe fn merge(child: *mut HeapRecord, parent: *mut HeapRecord) {
        // SAFETY: caller.
        unsafe {
            (*child).merged_into.store(parent, Ordering::Release);
            HeapRecord::add_ref(parent);
            HeapRecord::unref(child);
        }
    }
}

fn recycle(r: *mut HeapRecord) {
    let spilled = CACHE
        .try_with(|c| {
            let mut c = c.borrow_mut();
            c.push(r as usize);
            if c.len() > CACHE_MAX {
                let half = c.len() / 2;
                let spill: Vec<usize> = c.drain(..half).collect();
                POOL.lock().unwrap_or_else(|e| e.into_inner()).extend(spill);
            }
        })
        .is_ok();
    if !spilled {
        POOL.lock().unwrap_or_else(|e| e.into_inner()).push(r as usize);
    }
}

/// Records alive now (tasks, heaps with chunks, merged records still named).
pub fn live_heap_records() -> usize {
    LIVE_RECORDS.load(Ordering::Relaxed)
}

/// The current representative of a (possibly merged) record.
#[inline]
pub(crate) fn find(mut r: *mut HeapRecord) -> *mut HeapRecord {
    loop {
        // SAFETY: records are never freed to the OS (see the module notes).
        let next = unsafe { (*r).merged_into.load(Ordering::Acquire) };
        if next.is_null() {
            return r;
        }
        r = next;
    }
}

/// The heap (representative record) that owns the object at `addr`, or None
/// if `addr` is not in a live chunk.
#[inline]
pub(crate) fn heap_of(addr: u64) -> Option<*mut HeapRecord> {
    let c = crate::chunk::chunk_of(addr);
    if !crate::chunk::Chunk::is_live(c) {
        return None;
    }
    // SAFETY: c is a live chunk.
    Some(find(unsafe { (*c).heap.load(Ordering::Acquire) }))
}

/// Is `a` an ancestor of `b` in the heap tree, or `b` itself? Both are live
/// representatives.
pub(crate) fn is_ancestor_or_self(a: *mut HeapRecord, mut b: *mut HeapRecord) -> bool {
    // SAFETY: live records; tree parents of live records are live.
    let da = unsafe { (*a).depth.load(Ordering::Relaxed) };
    loop {
        if b == a {
            return true;
        }
        // SAFETY: as above.
        let (db, p) = unsafe { ((*b).depth.load(Ordering::Relaxed), (*b).tree_parent.load(Ordering::Relaxed)) };
        if db <= da || p.is_null() {
            return false;
        }
        b = p;
    }
}

/// A readable name of the task owning a record: its id and fork path from the
/// root, e.g. `task 17 (root/L/R)`.
pub(crate) fn task_name(r: *mut HeapRecord) -> String {
    let mut path = Vec::new();
    let mut cur = r;
    let mut guard = 0;
    while !cur.is_null() && guard < 64 {
        // SAFETY: records are never freed to the OS.
        let side = unsafe { (*cur).side.load(Ordering::Relaxed) };
        path.push(match side {
            0 => "L",
            1 => "R",
            _ => "root",
        });
        // SAFETY: as above.
        cur = unsafe { (*cur).tree_parent.load(Ordering::Relaxed) };
        guard += 1;
    }
    if !cur.is_null() {
        path.push("...");
    }
    path.reverse();
    // SAFETY: as above.
    let (id, depth) = unsafe { ((*r).task_id.load(Ordering::Relaxed), (*r).depth.load(Ordering::Relaxed)) };
    format!("task {id} (depth {depth}, {})", path.join("/"))
}
