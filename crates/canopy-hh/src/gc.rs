//! The leaf collector and the heap verifier.
//!
//! A task collects its own heap (everything it allocated plus the heaps of the
//! children it joined) when the heap has grown past
//! `max(CANOPY_HH_GC_MIN_KB, (1 + CANOPY_HH_GC_RATIO) x survived)`. The
//! collector is a Cheney copy: the roots are the task's handle slots and its
//! remembered set (fields of older objects that point into this heap); live
//! objects are copied into fresh chunks of the task's heap, large objects keep
//! their place (their chunk is relinked), and the old chunks are released.
//! Objects of ancestor heaps are never touched (their tasks are suspended and
//! their children may be reading them without barriers); the remembered-set
//! fields are updated with a compare-and-swap, so a concurrent write of a
//! sibling into the same field is never lost.
//!
//! Collecting the ancestors' levels a task alone can reach (as MPL does when the
//! sibling branches were never stolen) is not done: rayon's deque does not say
//! whether the other branch may still be stolen, and a stolen branch reads the
//! ancestors' objects without barriers.

use crate::chunk::{self, Chunk};
use crate::heap::{self, HeapRecord, RemEntry};
use crate::object::{self, Word, FORWARDED};
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

struct Collector<'t> {
    id: u64,
    task: &'t mut Task,
    large: Vec<u64>,
    copied: usize,
}

impl Collector<'_> {
    #[inline]
    fn in_from_space(&self, w: u64) -> bool {
        // SAFETY: w is a pointer held by a live object or root of this task's
        // tree, so its chunk is live.
        Word(w).is_ptr() && unsafe { (*chunk::chunk_of(w)).gc_id } == self.id
    }

    fn evacuate(&mut self, w: u64) -> u64 {
        if !self.in_from_space(w) {
            return w;
        }
        let hdr = header_at(w);
        let h = hdr.load(Ordering::Relaxed);
        if h & FORWARDED != 0 {
            return h & !FORWARDED;
        }
        let c = chunk::chunk_of(w);
        // SAFETY: c is a live from-space chunk of this task.
        if unsafe { (*c).large } {
            // Keep the object where it is: relink its chunk after the trace.
            // SAFETY: as above.
            unsafe { (*c).gc_id = 0 };
            self.large.push(w);
            return w;
        }
        let words = object::object_words(h);
        let to = self.task.alloc_words(words);
        // SAFETY: `to` is a fresh block of `words` words in a to-space chunk and
        // `w` an object of `words` words; they do not overlap.
        unsafe { ptr::copy_nonoverlapping(w as *const u64, to, words) };
        hdr.store(to as u64 | FORWARDED, Ordering::Relaxed);
        self.copied += words * 8;
        to as u64
    }

    fn scan_object(&mut self, obj: u64) -> usize {
        let h = header_at(obj).load(Ordering::Relaxed);
        let kind = object::header_kind(h);
        let len = object::header_len(h);
        if kind.holds_values() {
            for i in 0..len {
                let f = field_at(obj, i);
                let v = f.load(Ordering::Relaxed);
                if self.in_from_space(v) {
                    let nv = self.evacuate(v);
                    f.store(nv, Ordering::Relaxed);
                }
            }
        }
        1 + object::payload_words(kind, len)
    }

    /// Scan to-space (Cheney) and the kept large objects until nothing is left.
    ///
    /// Cheney's breadth-first order visits from-space objects far apart, so
    /// the scan runs a prefetch cursor `PREFETCH_AHEAD` bytes ahead of itself
    /// that asks for the headers of the objects the fields there point to.
    fn trace(&mut self) {
        const PREFETCH_AHEAD: usize = 512;
        let mut sc: *mut Chunk = ptr::null_mut();
        let mut pos = 0usize;
        let mut ahead = 0usize;
        loop {
            let mut progress = false;
            if sc.is_null() && !self.task.head.is_null() {
                sc = self.task.head;
                pos = Chunk::start(sc);
            }
            while !sc.is_null() {
                // The limit is re-read after every object: scanning copies
                // objects, which may fill this chunk and move the bump chunk on.
                let limit = if sc == self.task.tail {
                    self.task.cur
                } else {
                    // SAFETY: sc is a live to-space chunk.
                    unsafe { (*sc).top }
                };
                if pos < limit {
                    ahead = ahead.max(pos);
                    while ahead < limit && ahead < pos + PREFETCH_AHEAD {
                        ahead += prefetch_targets(ahead as u64) * 8;
                    }
                    pos += self.scan_object(pos as u64) * 8;
                    progress = true;
                    continue;
                }
                if sc == self.task.tail {
                    break;
                }
                // SAFETY: as above.
                let next = unsafe { (*sc).next };
                if next.is_null() {
                    break;
                }
                sc = next;
                pos = Chunk::start(sc);
                ahead = pos;
            }
            while let Some(o) = self.large.pop() {
                self.scan_object(o);
                progress = true;
            }
            if !progress {
                break;
            }
        }
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

/// Collect the task's heap.
pub(crate) fn collect(task: &mut Task) {
    let t0 = Instant::now();
    task.in_gc = true;
    task.flush_bump();
    let me = task.heap();
    let id = GC_ID.fetch_add(1, Ordering::Relaxed);
    let from = task.head;
    let mut from_bytes = 0usize;
    let mut c = from;
    while !c.is_null() {
        // SAFETY: c is one of our live chunks.
        unsafe {
            (*c).gc_id = id;
            from_bytes += chunk::chunk_bytes(c);
            c = (*c).next;
        }
    }
    task.head = ptr::null_mut();
    task.tail = ptr::null_mut();
    task.cur = 0;
    task.end = 0;
    task.bytes = 0;

    let mut cx = Collector { id, task, large: Vec::new(), copied: 0 };
    // Roots 1: handle slots.
    let mut roots = std::mem::replace(&mut cx.task.roots, crate::task::RootStack::empty());
    roots.for_each(|s| *s = cx.evacuate(*s));
    cx.task.roots = roots;
    // Roots 2: remembered set (own entries and those pushed by descendants).
    let mut entries = std::mem::take(&mut cx.task.remset);
    {
        // SAFETY: our record is live.
        let rec = unsafe { &*cx.task.heap() };
        entries.append(&mut rec.shared_remset.lock().unwrap_or_else(|e| e.into_inner()));
        rec.shared_pending.store(false, Ordering::Relaxed);
    }
    let mut keep: Vec<RemEntry> = Vec::with_capacity(entries.len());
    for e in entries {
        if cx.in_from_space(e.obj) {
            // The source object is in this heap now (a joined child's entry):
            // the trace handles it.
            continue;
        }
        let f = field_at(e.obj, e.index as usize);
        let v = f.load(Ordering::Acquire);
        if !cx.in_from_space(v) {
            continue; // overwritten since: stale
        }
        let nv = cx.evacuate(v);
        // A sibling may have written the field meanwhile; then its value wins.
        let _ = f.compare_exchange(v, nv, Ordering::AcqRel, Ordering::Relaxed);
        keep.push(e);
    }
    cx.trace();
    let copied = cx.copied;
    let kept_large = cx.task.stats.large_kept;
    // Release from-space; relink the large chunks that survived.
    let mut c = from;
    let mut large_kept = 0u64;
    while !c.is_null() {
        // SAFETY: c is one of our from-space chunks.
        let next = unsafe { (*c).next };
        // SAFETY: as above.
        if unsafe { (*c).gc_id } == 0 {
            // SAFETY: a surviving large chunk: re-home it to our record.
            unsafe {
                let old = (*c).heap.load(Ordering::Relaxed);
                if old != me {
                    HeapRecord::add_ref(me);
                    (*c).heap.store(me, Ordering::Release);
                    HeapRecord::unref(old);
                }
                (*c).next = task.head;
            }
            if task.head.is_null() {
                task.tail = c;
                // SAFETY: live chunk; an exhausted bump range.
                unsafe {
                    task.cur = (*c).top;
                    task.end = (*c).top;
                }
            }
            task.head = c;
            task.bytes += chunk::chunk_bytes(c);
            large_kept += 1;
        } else {
            // SAFETY: unreachable from roots; nothing else can reach this
            // task's heap without entanglement, which stops the program.
            unsafe { chunk::free_chunk(c) };
        }
        c = next;
    }
    let _ = kept_large;
    task.remset = keep;
    task.survived = task.bytes;
    task.stats.collections += 1;
    task.stats.bytes_copied += copied as u64;
    task.stats.large_kept += large_kept;
    task.stats.bytes_reclaimed += from_bytes.saturating_sub(task.bytes) as u64;
    task.in_gc = false;
    task.stats.gc_nanos += t0.elapsed().as_nanos() as u64;
    if crate::config::config().verify {
        if let Err(e) = verify(task) {
            panic!("canopy-hh: heap verifier failed after collection {id} of {}: {e}", heap::task_name(me));
        }
    }
}

/// Check one value held by the task's heap or roots.
fn check_value(task: &Task, w: u64, what: &dyn Fn() -> String) -> Result<(), String> {
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
    if me.is_null() || !heap::is_ancestor_or_self(h, me) {
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
/// objects, in this heap or an ancestor's, with well-formed headers.
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
                    check_value(task, v, &|| format!("field {i} of {kind:?} {pos:#x}"))?;
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
            err = check_value(task, *s, &|| format!("handle slot {i}"));
        }
        i += 1;
    });
    task.roots = roots;
    err?;
    for e in &task.remset {
        let v = field_at(e.obj, e.index as usize).load(Ordering::Relaxed);
        check_value(task, v, &|| format!("remembered field {} of {:#x}", e.index, e.obj))?;
    }
    let _ = objects;
    Ok(())
}
