//! The leaf collector and the heap verifier.
//!
//! A task collects its own heap (everything it allocated plus the heaps of the
//! children it joined) when the heap has grown past
//! `max(CANOPY_HH_GC_MIN_KB, (1 + CANOPY_HH_GC_RATIO) x survived)`. The
//! collector is a Cheney copy: the roots are the task's handle slots and its
//! remembered set (fields of older objects that point into this heap); live
//! objects are copied into fresh chunks of the task's heap, large objects keep
//! their place (their chunk is relinked), and the old chunks are released.
//! Objects of other ancestors' heaps are never touched (their tasks are
//! suspended and their children may be reading them without barriers); the remembered-set
//! fields are updated with a compare-and-swap, so a concurrent write of a
//! sibling into the same field is never lost.
//!
//! A first child may also collect its ancestors' heaps while the second
//! children of their forks have not started (see `forklink.rs`); each level's
//! survivors stay in their own heap.

use crate::chunk::{self, Chunk};
use crate::heap::{self, HeapRecord, RemEntry};
use crate::object::{self, Word, FORWARDED, FRONTIER};
use crate::task::Task;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

static GC_ID: AtomicU64 = AtomicU64::new(1);

#[inline]
pub(crate) fn header_at(addr: u64) -> &'static AtomicU64 {
    // SAFETY: addr is the start of a live object (callers); the header word is
    // 8-aligned and lives as long as the object's chunk.
    unsafe { &*(addr as *const AtomicU64) }
}

#[inline]
pub(crate) fn field_at(addr: u64, i: usize) -> &'static AtomicU64 {
    // SAFETY: as header_at, with i < the object's length (callers check).
    unsafe { &*((addr as *const AtomicU64).add(1 + i)) }
}

/// One heap being collected: a task's chunk list (from-space), its to-space
/// (the task's list again, refilled), and the scan state of its Cheney queue.
struct Level {
    task: *mut Task,
    from: *mut Chunk,
    from_bytes: usize,
    large: Vec<u64>,
    sc: *mut Chunk,
    pos: usize,
    ahead: usize,
}

/// A collection of one or more levels of the heap tree: the leaf task's heap
/// (level 0) and the ancestors' heaps it alone can reach (levels 1..). Each
/// object stays in its own level: survivors are copied into fresh chunks of the
/// same heap. From-space chunks of level `j` carry the id `base + j`; the
/// chunks of large objects kept in place carry `base + n + j` until the end.
struct Collector {
    base: u64,
    n: u64,
    levels: Vec<Level>,
    copied: usize,
    /// Objects taken off the frontier (no pointer down the tree left).
    expired: u64,
}

/// Where a collection may reach.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Reach {
    /// Only the task's own heap.
    Own,
    /// Also the ancestors' heaps no other task can reach now, if they are
    /// over their own thresholds.
    AncestorsOverThreshold,
    /// Also every ancestor heap no other task can reach now.
    Ancestors,
}

impl Collector {
    /// The level a pointer's chunk is being collected in (`Some((level,
    /// kept))`), or None for values outside the collection.
    #[inline]
    fn level_of(&self, w: u64) -> Option<(usize, bool)> {
        if !Word(w).is_ptr() {
            return None;
        }
        // SAFETY: w is held by a live object or root of the collected tasks'
        // tree, so its chunk is live.
        let id = unsafe { (*chunk::chunk_of(w)).gc_id.load(Ordering::Relaxed) };
        let i = id.wrapping_sub(self.base);
        if i < self.n {
            Some((i as usize, false))
        } else if i < 2 * self.n {
            Some(((i - self.n) as usize, true))
        } else {
            None
        }
    }

    /// The new address of `w`, whose level is `j` (copying it on first visit).
    fn evacuate(&mut self, w: u64, j: usize, kept: bool) -> u64 {
        if kept {
            return w;
        }
        let hdr = header_at(w);
        let h = hdr.load(Ordering::Relaxed);
        if h & FORWARDED != 0 {
            return h & !FORWARDED;
        }
        let c = chunk::chunk_of(w);
        // SAFETY: c is a live from-space chunk of level j.
        if unsafe { (*c).large } {
            // Keep the object where it is: relink its chunk after the trace.
            // SAFETY: as above.
            unsafe { (*c).gc_id.store(self.base + self.n + j as u64, Ordering::Relaxed) };
            self.levels[j].large.push(w);
            return w;
        }
        let words = object::object_words(h);
        // SAFETY: level tasks are live and used only by this collection.
        let to = unsafe { (*self.levels[j].task).alloc_words(words) };
        // SAFETY: `to` is a fresh block of `words` words in a to-space chunk and
        // `w` an object of `words` words; they do not overlap.
        unsafe { ptr::copy_nonoverlapping(w as *const u64, to, words) };
        hdr.store(to as u64 | FORWARDED, Ordering::Relaxed);
        self.copied += words * 8;
        to as u64
    }

    /// Scan a to-space object of level `li`: evacuate what its fields point
    /// to, and remember its pointers down into younger collected levels.
    ///
    /// Frontier expiry: an object on the frontier whose fields no longer
    /// point down the tree leaves it. The younger heaps alive below a
    /// collected level are exactly the collected levels below it (the
    /// collecting task runs, so it has no live children, and an ancestor is
    /// collected only while its fork's other child has not started), so "no
    /// field points into a level `j < li`" means no down-pointer at all, and
    /// no concurrent task reads the object while it is collected. Two facts
    /// this rests on: the write barrier never stores a pointer sideways (only
    /// up or down the tree), so a field pointing outside the collected levels
    /// points to an ancestor; and a sibling that starts after the collection
    /// sees the cleared bit (the fork link's release/acquire hand-off), so its
    /// own down-pointer write sets it again before storing the field.
    fn scan_object(&mut self, obj: u64, li: usize) -> usize {
        let h = header_at(obj).load(Ordering::Relaxed);
        let kind = object::header_kind(h);
        let len = object::header_len(h);
        if kind.holds_values() {
            let mut down = false;
            for i in 0..len {
                let f = field_at(obj, i);
                let v = f.load(Ordering::Relaxed);
                if let Some((j, kept)) = self.level_of(v) {
                    let nv = self.evacuate(v, j, kept);
                    f.store(nv, Ordering::Relaxed);
                    if j < li {
                        // A pointer into a younger heap: its collector needs
                        // the field as a root, at the object's new address.
                        // SAFETY: level tasks are live.
                        unsafe { (*self.levels[j].task).remset.push(RemEntry { obj, index: i as u32 }) };
                        down = true;
                    }
                }
            }
            if h & FRONTIER != 0 && !down {
                header_at(obj).fetch_and(!FRONTIER, Ordering::Relaxed);
                self.expired += 1;
            }
        }
        1 + object::payload_words(kind, len)
    }

    /// Scan the new part of level `li`'s to-space; true if anything was.
    fn scan_level(&mut self, li: usize) -> bool {
        const PREFETCH_AHEAD: usize = 512;
        let task = self.levels[li].task;
        let mut progress = false;
        // SAFETY (whole function): the level's task is live and used only by
        // this collection; sc walks its to-space chunks.
        unsafe {
            if self.levels[li].sc.is_null() && !(*task).head.is_null() {
                self.levels[li].sc = (*task).head;
                self.levels[li].pos = Chunk::start((*task).head);
            }
            loop {
                let sc = self.levels[li].sc;
                if sc.is_null() {
                    break;
                }
                // The limit is re-read after every object: scanning copies
                // objects, which may fill this chunk and move the bump chunk on.
                let limit = if sc == (*task).tail { (*task).cur } else { (*sc).top };
                let pos = self.levels[li].pos;
                if pos < limit {
                    let mut ahead = self.levels[li].ahead.max(pos);
                    while ahead < limit && ahead < pos + PREFETCH_AHEAD {
                        ahead += prefetch_targets(ahead as u64) * 8;
                    }
                    self.levels[li].ahead = ahead;
                    let words = self.scan_object(pos as u64, li);
                    self.levels[li].pos = pos + words * 8;
                    progress = true;
                    continue;
                }
                if sc == (*task).tail || (*sc).next.is_null() {
                    break;
                }
                let next = (*sc).next;
                self.levels[li].sc = next;
                self.levels[li].pos = Chunk::start(next);
                self.levels[li].ahead = Chunk::start(next);
            }
        }
        while let Some(o) = self.levels[li].large.pop() {
            self.scan_object(o, li);
            progress = true;
        }
        progress
    }
}

/// Prefetch the headers of the objects the fields of `obj` (a to-space
/// object) point to; returns the object's size in words.
#[inline]
fn prefetch_targets(obj: u64) -> usize {
    let h = header_at(obj).load(Ordering::Relaxed);
    let kind = object::header_kind(h);
    let len = object::header_len(h);
    if kind.holds_values() {
        for i in 0..len.min(8) {
            let v = field_at(obj, i).load(Ordering::Relaxed);
            if Word(v).is_ptr() {
                prefetch(v);
            }
        }
    }
    1 + object::payload_words(kind, len)
}

#[inline(always)]
fn prefetch(addr: u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// Is the task's heap over its collection threshold?
pub(crate) fn over_threshold(t: &Task) -> bool {
    let cfg = crate::config::config();
    t.bytes >= cfg.gc_min_bytes.max(((1.0 + cfg.gc_ratio) * t.survived as f64) as usize)
}

/// Collect the task's heap, and with `reach` the ancestors' heaps that no
/// other task can reach now (see `forklink.rs`).
pub(crate) fn collect(task: &mut Task, reach: Reach) {
    let t0 = Instant::now();
    // Everything below goes through raw pointers: the levels alias the task
    // (level 0) and its ancestors.
    let task: *mut Task = task;
    // The levels: this task, then each parent whose other child has not
    // started (the link's hand-off keeps it from starting meanwhile) and
    // that has no par_fill pieces out.
    let mut levels: Vec<*mut Task> = vec![task];
    let mut links = Vec::new();
    if reach != Reach::Own {
        let mut cur: *mut Task = task;
        loop {
            // SAFETY: cur is this task or a suspended ancestor on this
            // thread's chain of first children (see Task::parent).
            let (link, parent) = unsafe { ((*cur).link, (*cur).parent) };
            if link.is_null() || parent.is_null() {
                break;
            }
            // SAFETY: a first child's parent is suspended in its fork.
            let p = unsafe { &*parent };
            if p.shielded > 0 || (reach == Reach::AncestorsOverThreshold && !over_threshold(p)) {
                break;
            }
            // SAFETY: the link lives in the parent's fork frame.
            if !unsafe { (*link).try_collect() } {
                break;
            }
            links.push(link);
            levels.push(parent);
            cur = parent;
        }
    }
    // Whatever happens below (a verifier panic included), the second children
    // waiting on these links must be let go.
    struct Release(Vec<*const crate::forklink::ForkLink>);
    impl Drop for Release {
        fn drop(&mut self) {
            for &l in &self.0 {
                // SAFETY: each link was acquired by try_collect above and its
                // fork frame is still live (a descendant of it is running).
                unsafe { (*l).end_collect() };
            }
        }
    }
    let _release = Release(links);

    let n = levels.len() as u64;
    let base = GC_ID.fetch_add(2 * n, Ordering::Relaxed);
    let mut cx = Collector { base, n, levels: Vec::with_capacity(levels.len()), copied: 0, expired: 0 };
    for (j, &t) in levels.iter().enumerate() {
        // SAFETY: t is this task or a suspended ancestor no other task can
        // reach during this collection.
        let t = unsafe { &mut *t };
        t.in_gc = true;
        t.flush_bump();
        t.heap();
        let from = t.head;
        let mut from_bytes = 0usize;
        let mut c = from;
        while !c.is_null() {
            // SAFETY: c is one of the level's live chunks.
            unsafe {
                (*c).gc_id.store(base + j as u64, Ordering::Relaxed);
                from_bytes += chunk::chunk_bytes(c);
                c = (*c).next;
            }
        }
        t.head = ptr::null_mut();
        t.tail = ptr::null_mut();
        t.cur = 0;
        t.end = 0;
        t.bytes = 0;
        cx.levels.push(Level { task: t, from, from_bytes, large: Vec::new(), sc: ptr::null_mut(), pos: 0, ahead: 0 });
    }

    // Roots 1: every level's handle slots.
    for j in 0..cx.levels.len() {
        // SAFETY: level tasks are live; the root stack is moved out while the
        // collector (which also borrows the task) updates it.
        let t = unsafe { &mut *cx.levels[j].task };
        let mut roots = std::mem::replace(&mut t.roots, crate::task::RootStack::empty());
        roots.for_each(|s| {
            if let Some((l, kept)) = cx.level_of(*s) {
                *s = cx.evacuate(*s, l, kept);
            }
        });
        // SAFETY: as above.
        unsafe { (*cx.levels[j].task).roots = roots };
    }
    // Roots 2: remembered sets. An entry whose object is in a collected level
    // is dropped (scanning the object re-registers its down-pointers); one
    // whose object is older than every level is a root.
    let mut entries = Vec::new();
    for lv in &cx.levels {
        // SAFETY: level tasks and their records are live.
        unsafe {
            let t = &mut *lv.task;
            entries.append(&mut t.remset);
            let rec = &*t.heap();
            entries.append(&mut rec.shared_remset.lock().unwrap_or_else(|e| e.into_inner()));
            rec.shared_pending.store(false, Ordering::Relaxed);
        }
    }
    for e in entries {
        if cx.level_of(e.obj).is_some() {
            continue;
        }
        let f = field_at(e.obj, e.index as usize);
        let v = f.load(Ordering::Acquire);
        let Some((j, kept)) = cx.level_of(v) else {
            continue; // overwritten since: stale
        };
        let nv = cx.evacuate(v, j, kept);
        // A sibling of an ancestor may have written the field meanwhile; then
        // its value wins.
        let _ = f.compare_exchange(v, nv, Ordering::AcqRel, Ordering::Relaxed);
        // SAFETY: level tasks are live.
        unsafe { (*cx.levels[j].task).remset.push(e) };
    }
    // Trace until every level's queue is empty.
    loop {
        let mut progress = false;
        for j in 0..cx.levels.len() {
            progress |= cx.scan_level(j);
        }
        if !progress {
            break;
        }
    }
    let copied = cx.copied;
    let expired = cx.expired;
    let (mut from_total, mut kept_total, mut large_kept) = (0usize, 0usize, 0u64);
    for j in 0..cx.levels.len() {
        let lv = &cx.levels[j];
        // SAFETY: level tasks are live.
        let t = unsafe { &mut *lv.task };
        let me = t.heap();
        let kept_id = base + n + j as u64;
        let mut c = lv.from;
        while !c.is_null() {
            // SAFETY: c is one of this level's from-space chunks.
            let next = unsafe { (*c).next };
            // SAFETY: as above.
            if unsafe { (*c).gc_id.load(Ordering::Relaxed) } == kept_id {
                // SAFETY: a surviving large chunk: re-home it to the level's record.
                unsafe {
                    (*c).gc_id.store(0, Ordering::Relaxed);
                    let old = (*c).heap.load(Ordering::Relaxed);
                    if old != me {
                        HeapRecord::add_ref(me);
                        (*c).heap.store(me, Ordering::Release);
                        HeapRecord::unref(old);
                    }
                    (*c).next = t.head;
                }
                if t.head.is_null() {
                    t.tail = c;
                    // SAFETY: live chunk; an exhausted bump range.
                    unsafe {
                        t.cur = (*c).top;
                        t.end = (*c).top;
                    }
                }
                t.head = c;
                t.bytes += chunk::chunk_bytes(c);
                large_kept += 1;
            } else {
                // SAFETY: unreachable from the roots: nothing else can reach
                // these heaps now (see forklink.rs), and entanglement stops
                // the program before a concurrent task could hold a pointer.
                unsafe { chunk::free_chunk(c) };
            }
            c = next;
        }
        from_total += lv.from_bytes;
        kept_total += t.bytes;
        t.survived = t.bytes;
        t.in_gc = false;
    }
    // SAFETY: the collecting task is live.
    let st = unsafe { &mut (*task).stats };
    st.collections += 1;
    st.ancestor_levels += n - 1;
    st.bytes_copied += copied as u64;
    st.large_kept += large_kept;
    st.frontier_expired += expired;
    st.bytes_reclaimed += from_total.saturating_sub(kept_total) as u64;
    st.gc_nanos += t0.elapsed().as_nanos() as u64;
    if crate::config::config().verify {
        for &t in &levels {
            // SAFETY: as above; the links are still held.
            let t = unsafe { &mut *t };
            if let Err(e) = verify(t) {
                panic!("canopy-hh: heap verifier failed after a collection of {}: {e}", heap::task_name(t.heap()));
            }
        }
    }
}

/// Check one value held by the task's heap or roots. `down_ok`: the value is
/// a field of a mutable object, which may point down the tree into a
/// descendant's heap (a remembered pointer).
fn check_value(task: &Task, w: u64, down_ok: bool, what: &dyn Fn() -> String) -> Result<(), String> {
    let w = Word(w);
    if w.0 == 0 {
        return Err(format!("{}: a zero word (neither an integer nor a pointer)", what()));
    }
    if !w.is_ptr() {
        return Ok(());
    }
    if w.0 & 7 != 0 {
        return Err(format!("{}: pointer {:#x} is not 8-aligned", what(), w.0));
    }
    let Some(h) = heap::heap_of(w.0) else {
        return Err(format!("{}: pointer {:#x} is not in a live chunk", what(), w.0));
    };
    let me = task.heap_if_any();
    let down = down_ok && !me.is_null() && heap::is_ancestor_or_self(me, h);
    if me.is_null() || !(heap::is_ancestor_or_self(h, me) || down) {
        return Err(format!(
            "{}: pointer {:#x} is in the heap of {}, which is not an ancestor of {}",
            what(),
            w.0,
            heap::task_name(h),
            if me.is_null() { "a task without a heap".to_string() } else { heap::task_name(me) }
        ));
    }
    let hv = header_at(w.0).load(Ordering::Relaxed);
    object::check_header(hv).map_err(|e| format!("{}: target {:#x}: {e}", what(), w.0))?;
    let c = chunk::chunk_of(w.0);
    // SAFETY: live chunk (heap_of checked its magic).
    let (start, top) = unsafe { (Chunk::start(c), (*c).top) };
    if (w.0 as usize) < start {
        return Err(format!("{}: pointer {:#x} points into its chunk's header", what(), w.0));
    }
    if h == me && w.0 as usize + object::object_words(hv) * 8 > top {
        return Err(format!("{}: target {:#x} lies beyond its chunk's allocated range", what(), w.0));
    }
    Ok(())
}

/// Walk the task's heap and roots and check every pointer: targets are live
/// objects, in this heap or an ancestor's (or, for fields of mutable
/// objects, a descendant's), with well-formed headers.
pub(crate) fn verify(task: &mut Task) -> Result<(), String> {
    task.flush_bump();
    task.heap();
    let mut c = task.head;
    let mut objects = 0usize;
    while !c.is_null() {
        if !Chunk::is_live(c) {
            return Err(format!("chunk {:#x} on the heap's list is not live", c as usize));
        }
        // SAFETY: live chunk on our list.
        let (mut pos, top, end, next) = unsafe { (Chunk::start(c), (*c).top, (*c).end, (*c).next) };
        if top > end {
            return Err(format!("chunk {:#x}: top {top:#x} beyond end {end:#x}", c as usize));
        }
        while pos < top {
            let h = header_at(pos as u64).load(Ordering::Relaxed);
            let kind = object::check_header(h).map_err(|e| format!("object {pos:#x}: {e}"))?;
            let words = object::object_words(h);
            if pos + words * 8 > top {
                return Err(format!("object {pos:#x} ({kind:?}, {words} words) runs past its chunk's top {top:#x}"));
            }
            if kind.holds_values() {
                for i in 0..object::header_len(h) {
                    let v = field_at(pos as u64, i).load(Ordering::Relaxed);
                    check_value(task, v, kind.is_mutable(), &|| format!("field {i} of {kind:?} {pos:#x}"))?;
                }
            }
            objects += 1;
            pos += words * 8;
        }
        c = next;
    }
    let mut err = Ok(());
    let mut roots = std::mem::replace(&mut task.roots, crate::task::RootStack::empty());
    let mut i = 0;
    roots.for_each(|s| {
        if err.is_ok() {
            err = check_value(task, *s, false, &|| format!("handle slot {i}"));
        }
        i += 1;
    });
    task.roots = roots;
    err?;
    let me = task.heap();
    for e in &task.remset {
        let v = field_at(e.obj, e.index as usize).load(Ordering::Relaxed);
        // A remembered field belongs to an older heap's object, which every
        // descendant of that heap may write, concurrently: a pointer into a
        // live heap off this task's path (a sibling's write since the
        // collection) makes the entry stale, and the next collection drops
        // it. Only pointers into this heap are the collector's business.
        if Word(v).is_ptr() {
            if let Some(h) = heap::heap_of(v) {
                if !heap::is_ancestor_or_self(h, me) && !heap::is_ancestor_or_self(me, h) {
                    continue;
                }
            }
        }
        check_value(task, v, false, &|| format!("remembered field {} of {:#x}", e.index, e.obj))?;
    }
    let _ = objects;
    Ok(())
}
