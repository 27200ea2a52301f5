//! Counters of the array layer: allocations, frees, reuses (an update done
//! in place because the count was 1), copies, and bytes.  Each thread counts
//! in its own slot (no shared cache line on the hot path); [`stats`] sums
//! the slots of every thread that ever counted.

use std::sync::{Arc, Mutex, OnceLock};

use canopy_sync::prim::{AtomicU64, Ordering};

/// A snapshot of the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Arrays allocated (descriptor and data in one block each).
    pub allocations: u64,
    /// Arrays freed.
    pub frees: u64,
    /// Updates done in place because the array's count was 1 (each one is
    /// an allocation and a copy avoided).
    pub reuses: u64,
    /// Updates that had to allocate and copy because the array was shared.
    pub copies: u64,
    /// Bytes allocated (descriptor and data).
    pub bytes_allocated: u64,
    /// Bytes copied by updates of shared arrays.
    pub bytes_copied: u64,
    /// Bytes of data that in-place updates did not have to copy.
    pub bytes_not_copied: u64,
}

impl Stats {
    /// `self - earlier`, field by field (saturating).
    pub fn since(&self, earlier: &Stats) -> Stats {
        Stats {
            allocations: self.allocations.saturating_sub(earlier.allocations),
            frees: self.frees.saturating_sub(earlier.frees),
            reuses: self.reuses.saturating_sub(earlier.reuses),
            copies: self.copies.saturating_sub(earlier.copies),
            bytes_allocated: self.bytes_allocated.saturating_sub(earlier.bytes_allocated),
            bytes_copied: self.bytes_copied.saturating_sub(earlier.bytes_copied),
            bytes_not_copied: self
                .bytes_not_copied
                .saturating_sub(earlier.bytes_not_copied),
        }
    }
}

/// One thread's counters.  Each thread writes its own slot on every
/// allocation and free of an array, so slots never share a cache line
/// (two 128-byte lines: the adjacent-line prefetcher pairs them).
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct Slot {
    allocations: AtomicU64,
    frees: AtomicU64,
    reuses: AtomicU64,
    copies: AtomicU64,
    bytes_allocated: AtomicU64,
    bytes_copied: AtomicU64,
    bytes_not_copied: AtomicU64,
}

impl Slot {
    fn read(&self) -> Stats {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            allocations: r(&self.allocations),
            frees: r(&self.frees),
            reuses: r(&self.reuses),
            copies: r(&self.copies),
            bytes_allocated: r(&self.bytes_allocated),
            bytes_copied: r(&self.bytes_copied),
            bytes_not_copied: r(&self.bytes_not_copied),
        }
    }
}

fn registry() -> &'static Mutex<Vec<Arc<Slot>>> {
    static R: OnceLock<Mutex<Vec<Arc<Slot>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(Vec::new()))
}

thread_local! {
    /// This thread's slot (null until first use).  The registry keeps every
    /// slot alive for the whole process, so the pointer never dangles.
    static MINE: core::cell::Cell<*const Slot> = const { core::cell::Cell::new(core::ptr::null()) };
}

#[cold]
fn register() -> *const Slot {
    let s = Arc::new(Slot::default());
    let p = Arc::as_ptr(&s);
    registry().lock().unwrap_or_else(|p| p.into_inner()).push(s);
    p
}

/// Run `f` on this thread's slot (nothing during thread teardown).
#[inline(always)]
fn with_slot(f: impl FnOnce(&Slot)) {
    let _ = MINE.try_with(|m| {
        let mut p = m.get();
        if p.is_null() {
            p = register();
            m.set(p);
        }
        // SAFETY: the registry holds the slot for the process's lifetime.
        f(unsafe { &*p })
    });
}

/// Add `v` to a counter of this thread's slot.  Only this thread writes its
/// slot, so a relaxed load and store suffice (readers may see a stale value).
#[inline(always)]
fn add(a: &AtomicU64, v: u64) {
    a.store(a.load(Ordering::Relaxed) + v, Ordering::Relaxed);
}

#[inline]
pub(crate) fn on_alloc(bytes: usize) {
    with_slot(|s| {
        add(&s.allocations, 1);
        add(&s.bytes_allocated, bytes as u64);
    });
}

#[inline]
pub(crate) fn on_free() {
    with_slot(|s| add(&s.frees, 1));
}

#[inline]
pub(crate) fn on_reuse(bytes: usize) {
    with_slot(|s| {
        add(&s.reuses, 1);
        add(&s.bytes_not_copied, bytes as u64);
    });
}

#[inline]
pub(crate) fn on_copy(bytes: usize) {
    with_slot(|s| {
        add(&s.copies, 1);
        add(&s.bytes_copied, bytes as u64);
    });
}

/// The counters summed over every thread (a racy but monotone snapshot).
pub fn stats() -> Stats {
    let mut t = Stats::default();
    for s in registry().lock().unwrap_or_else(|p| p.into_inner()).iter() {
        let x = s.read();
        t.allocations += x.allocations;
        t.frees += x.frees;
        t.reuses += x.reuses;
        t.copies += x.copies;
        t.bytes_allocated += x.bytes_allocated;
        t.bytes_copied += x.bytes_copied;
        t.bytes_not_copied += x.bytes_not_copied;
    }
    t
}

/// The calling thread's counters only (exact for work this thread did).
pub fn thread_stats() -> Stats {
    let mut r = Stats::default();
    with_slot(|s| r = s.read());
    r
}
