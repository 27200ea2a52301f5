//! A task's heap: its chunk list, bump allocation, roots and the fork/join
//! protocol that keeps the heap tree in step with the task tree.

use crate::chunk::{self, Chunk};
use crate::forklink::ForkLink;
use crate::heap::{HeapRecord, RemEntry};
use crate::stats::Stats;
use std::ptr;

const ROOT_BLOCK: usize = 256;

/// The handle slots of a task: a stack of fixed blocks, so a slot never moves.
pub(crate) struct RootStack {
    // Boxed so a slot never moves when the Vec grows: handles point at slots.
    #[allow(clippy::vec_box)]
    blocks: Vec<Box<[u64; ROOT_BLOCK]>>,
    top: usize,
}

impl RootStack {
    pub(crate) const fn empty() -> RootStack {
        RootStack::new()
    }

    const fn new() -> RootStack {
        RootStack { blocks: Vec::new(), top: 0 }
    }

    #[inline]
    pub(crate) fn push(&mut self, v: u64) -> *mut u64 {
        let (b, i) = (self.top / ROOT_BLOCK, self.top % ROOT_BLOCK);
        if b == self.blocks.len() {
            self.blocks.push(Box::new([0; ROOT_BLOCK]));
        }
        let slot = &mut self.blocks[b][i];
        *slot = v;
        self.top += 1;
        slot
    }

    #[inline]
    pub(crate) fn mark(&self) -> usize {
        self.top
    }

    #[inline]
    pub(crate) fn reset(&mut self, mark: usize) {
        debug_assert!(mark <= self.top);
        self.top = mark;
    }

    /// Visit every live slot.
    pub(crate) fn for_each(&mut self, mut f: impl FnMut(&mut u64)) {
        let mut left = self.top;
        for b in self.blocks.iter_mut() {
            let n = left.min(ROOT_BLOCK);
            for s in b[..n].iter_mut() {
                f(s);
            }
            left -= n;
            if left == 0 {
                break;
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.top
    }
}

/// The state of one running task. Only the task's own thread touches it while
/// the task runs; a suspended parent's state is read (never written) by its
/// children through handles.
pub(crate) struct Task {
    /// The task's heap record, made on first need (a task that never
    /// allocates, forks or checks a barrier never gets one).
    heap: *mut HeapRecord,
    parent_heap: *mut HeapRecord,
    side: u32,
    /// Chunk list: large chunks and spliced children's chunks go to the front,
    /// the bump chunk is always the last.
    pub(crate) head: *mut Chunk,
    pub(crate) tail: *mut Chunk,
    pub(crate) cur: usize,
    pub(crate) end: usize,
    /// Bytes of chunks on the list.
    pub(crate) bytes: usize,
    /// Bytes that survived the last collection.
    pub(crate) survived: usize,
    /// Remembered-set entries recorded by this task for its own heap.
    pub(crate) remset: Vec<RemEntry>,
    pub(crate) roots: RootStack,
    pub(crate) stats: Stats,
    pub(crate) in_gc: bool,
    /// For a first child: its fork's link and the forking (parent) task,
    /// through which it may collect the parent's heap (see forklink.rs).
    pub(crate) link: *const ForkLink,
    pub(crate) parent: *mut Task,
    /// par_fill calls in progress: while non-zero, no descendant collects
    /// this heap (children hold `&mut` pieces of one of its arrays).
    pub(crate) shielded: u32,
    /// The task tree (one `run`) this task belongs to; handles carry it.
    pub(crate) tree: u32,
}

// SAFETY: a Task is used by one thread at a time: it is created by the forking
// thread, moved into the closure rayon runs (possibly on another worker), and
// handed back by the join, which orders all of those accesses.
unsafe impl Send for Task {}

impl Task {
    pub(crate) fn new(parent_heap: *mut HeapRecord, side: u32) -> Task {
        Task {
            heap: ptr::null_mut(),
            parent_heap,
            side,
            head: ptr::null_mut(),
            tail: ptr::null_mut(),
            cur: 0,
            end: 0,
            bytes: 0,
            survived: 0,
            remset: Vec::new(),
            roots: RootStack::new(),
            stats: Stats::default(),
            in_gc: false,
            link: ptr::null(),
            parent: ptr::null_mut(),
            shielded: 0,
            tree: 0,
        }
    }

    /// The task's heap record, made now if it has none yet.
    #[inline]
    pub(crate) fn heap(&mut self) -> *mut HeapRecord {
        if self.heap.is_null() {
            self.heap = HeapRecord::new_task(self.parent_heap, self.side, HeapRecord::next_task_id());
        }
        self.heap
    }

    /// The heap record if the task has one (null otherwise).
    #[inline]
    pub(crate) fn heap_if_any(&self) -> *mut HeapRecord {
        self.heap
    }

    /// Record the bump position in the bump chunk's header.
    #[inline]
    pub(crate) fn flush_bump(&mut self) {
        if !self.tail.is_null() {
            // SAFETY: tail is this task's live bump chunk.
            unsafe { (*self.tail).top = self.cur };
        }
    }

    /// Allocate `words` words (uninitialised); may collect first.
    #[inline]
    pub(crate) fn alloc_words(&mut self, words: usize) -> *mut u64 {
        let bytes = words * 8;
        if self.end - self.cur >= bytes {
            let p = self.cur;
            self.cur += bytes;
            return p as *mut u64;
        }
        self.alloc_slow(words)
    }

    #[cold]
    fn alloc_slow(&mut self, words: usize) -> *mut u64 {
        let cfg = crate::config::config();
        if cfg.gc && !self.in_gc && crate::gc::over_threshold(self) {
            crate::gc::collect(self, crate::gc::Reach::AncestorsOverThreshold);
        }
        let bytes = words * 8;
        if self.end - self.cur >= bytes {
            let p = self.cur;
            self.cur += bytes;
            return p as *mut u64;
        }
        let large = bytes > cfg.chunk_bytes / 4;
        let c = chunk::new_chunk(self.heap(), words, large);
        self.stats.chunks += 1;
        let cb = chunk::chunk_bytes(c);
        self.bytes += cb;
        self.stats.peak_heap_bytes = self.stats.peak_heap_bytes.max(self.bytes as u64);
        let p = Chunk::start(c);
        if large {
            // SAFETY: c is fresh; the object fills it from the start.
            unsafe {
                (*c).top = p + bytes;
                (*c).next = self.head;
            }
            self.head = c;
            if self.tail.is_null() {
                // A list must end with a bump chunk or be empty of bump chunks:
                // a large-only list keeps tail null-safe by pointing at it, but
                // with an exhausted bump range.
                self.tail = c;
                self.cur = p + bytes;
                self.end = p + bytes;
                // SAFETY: c is live.
                unsafe { (*c).top = self.cur };
            }
            return p as *mut u64;
        }
        self.flush_bump();
        if self.tail.is_null() {
            self.head = c;
        } else {
            // SAFETY: tail is live and ours.
            unsafe { (*self.tail).next = c };
        }
        self.tail = c;
        self.cur = p + bytes;
        // SAFETY: c is live.
        self.end = unsafe { (*c).end };
        p as *mut u64
    }

    /// Splice a finished child's heap into this one: O(1) in the heap's size.
    pub(crate) fn absorb(&mut self, child: &mut Task) {
        child.flush_bump();
        if !child.head.is_null() {
            // Child chunks go in front, so our bump chunk stays last.
            // SAFETY: child.tail is the child's live last chunk.
            unsafe { (*child.tail).next = self.head };
            self.head = child.head;
            if self.tail.is_null() {
                self.tail = child.tail;
                // SAFETY: live chunk. A large chunk is never bumped into: its
                // slack lies beyond the first chunk-size unit, where masking
                // would not find the objects' chunk.
                unsafe {
                    self.cur = (*child.tail).top;
                    self.end = if (*child.tail).large { (*child.tail).top } else { (*child.tail).end };
                }
            }
        }
        // The children's chunks count as new allocation here: what survived
        // their collections need not be live in this heap any more, so the
        // threshold stays relative to this heap's own last survivors.
        self.bytes += child.bytes;
        if self.remset.is_empty() {
            self.remset = std::mem::take(&mut child.remset);
        } else {
            self.remset.append(&mut child.remset);
        }
        self.stats.add(&child.stats);
        self.stats.peak_heap_bytes = self.stats.peak_heap_bytes.max(self.bytes as u64);
        if child.heap.is_null() {
            return; // no record: the child allocated nothing and never forked
        }
        // Entries descendants pushed into the child's shared set.
        // SAFETY: the child's record is live until merged below.
        let child_rec = unsafe { &*child.heap };
        if child_rec.shared_pending.load(std::sync::atomic::Ordering::Acquire) {
            let mut s = child_rec.shared_remset.lock().unwrap_or_else(|e| e.into_inner());
            self.remset.append(&mut s);
            child_rec.shared_pending.store(false, std::sync::atomic::Ordering::Relaxed);
        }
        let me = self.heap();
        // SAFETY: the child task has finished; this task joins it.
        unsafe { HeapRecord::merge(child.heap, me) };
        child.heap = ptr::null_mut();
        child.head = ptr::null_mut();
        child.tail = ptr::null_mut();
    }

    /// Fork two child tasks and join them.
    pub(crate) fn fork<RA: Send, RB: Send>(
        &mut self,
        f: impl FnOnce(&mut Task) -> RA + Send,
        g: impl FnOnce(&mut Task) -> RB + Send,
    ) -> (RA, RB) {
        self.flush_bump();
        let me = self.heap();
        let link = ForkLink::new();
        let mut a = Task::new(me, 0);
        let mut b = Task::new(me, 1);
        a.tree = self.tree;
        b.tree = self.tree;
        // The first child may collect this (suspended) task's heap while the
        // second has not started: it gets the link and a way back here.
        a.link = &link;
        a.parent = self;
        let joined = {
            let (pa, pb, l) = (&mut a, &mut b, &link);
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                rayon_core::join(
                    move || f(pa),
                    move || {
                        l.start_second();
                        g(pb)
                    },
                )
            }))
        };
        // Absorb the children even if one panicked: older objects may point
        // into their heaps (remembered-set entries), so their chunks must
        // outlive the unwinding.
        self.stats.forks += 2;
        self.absorb(&mut a);
        self.absorb(&mut b);
        match joined {
            Ok(r) => r,
            Err(payload) => std::panic::resume_unwind(payload),
        }
    }
}

impl Drop for Task {
    /// Release the heap of a task that is not absorbed: the root task at the
    /// end of `run`, or tasks unwound by a panic.
    fn drop(&mut self) {
        if self.heap.is_null() {
            return;
        }
        let mut c = self.head;
        while !c.is_null() {
            // SAFETY: c is on our list; nothing uses it after the task ends.
            let next = unsafe { (*c).next };
            // SAFETY: as above.
            unsafe { chunk::free_chunk(c) };
            c = next;
        }
        // SAFETY: our record is live until the unref below.
        let rec = unsafe { &*self.heap };
        rec.shared_remset.lock().unwrap_or_else(|e| e.into_inner()).clear();
        rec.shared_pending.store(false, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the task held one reference to its record.
        unsafe { HeapRecord::unref(self.heap) };
        self.heap = ptr::null_mut();
    }
}
