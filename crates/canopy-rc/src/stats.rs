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
            bytes_not_copied: self.bytes_not_copied.saturating_sub(earlier.bytes_not_copied),
        }
    }
}

#[derive(Default)]
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
    static MINE: Arc<Slot> = {
        let s = Arc::new(Slot::default());
        registry().lock().unwrap_or_else(|p| p.into_inner()).push(s.clone());
        s
    };
}

/// Add `v` to one of this thread's counters.  Only this thread writes its
/// slot, so a relaxed load and store suffice (readers may see a stale value).
#[inline]
fn bump(f: impl Fn(&Slot) -> &AtomicU64, v: u64) {
    let _ = MINE.try_with(|s| {
        let a = f(s);
        a.store(a.load(Ordering::Relaxed) + v, Ordering::Relaxed);
    });
}

#[inline]
pub(crate) fn on_alloc(bytes: usize) {
    bump(|s| &s.allocations, 1);
    bump(|s| &s.bytes_allocated, bytes as u64);
}

#[inline]
pub(crate) fn on_free() {
    bump(|s| &s.frees, 1);
}

#[inline]
pub(crate) fn on_reuse(bytes: usize) {
    bump(|s| &s.reuses, 1);
    bump(|s| &s.bytes_not_copied, bytes as u64);
}

#[inline]
pub(crate) fn on_copy(bytes: usize) {
    bump(|s| &s.copies, 1);
    bump(|s| &s.bytes_copied, bytes as u64);
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
    MINE.try_with(|s| s.read()).unwrap_or_default()
}
