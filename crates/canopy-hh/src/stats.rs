//! Counters of the hierarchical heaps.

use std::sync::Mutex;

/// Counters of one task tree (a `run`), or of all runs so far ([`global_stats`]).
/// Children's counters are added to their parent's at the join.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Tasks forked (two per `par`).
    pub forks: u64,
    /// Bytes of objects allocated (headers included).
    pub bytes_allocated: u64,
    /// Objects allocated.
    pub objects_allocated: u64,
    /// Chunks taken from `canopy-alloc` (the collector's to-space included).
    pub chunks: u64,
    /// Leaf collections.
    pub collections: u64,
    /// Ancestor heaps collected together with a leaf's (levels no other task
    /// could reach at the time).
    pub ancestor_levels: u64,
    /// Bytes copied by the collector.
    pub bytes_copied: u64,
    /// Bytes of chunks the collector released.
    pub bytes_reclaimed: u64,
    /// Large objects kept in place (their chunk relinked) by the collector.
    pub large_kept: u64,
    /// Nanoseconds spent collecting.
    pub gc_nanos: u64,
    /// Remembered-set entries recorded by the write barrier.
    pub remset_entries: u64,
    /// Mutable reads that took the entanglement check (frontier objects).
    pub frontier_checks: u64,
    /// Objects the collector took off the frontier (their pointers down the
    /// tree had become pointers within one heap after joins).
    pub frontier_expired: u64,
    /// Largest heap (bytes of chunks) any task reached.
    pub peak_heap_bytes: u64,
}

impl Stats {
    pub(crate) fn add(&mut self, o: &Stats) {
        self.forks += o.forks;
        self.bytes_allocated += o.bytes_allocated;
        self.objects_allocated += o.objects_allocated;
        self.chunks += o.chunks;
        self.collections += o.collections;
        self.ancestor_levels += o.ancestor_levels;
        self.bytes_copied += o.bytes_copied;
        self.bytes_reclaimed += o.bytes_reclaimed;
        self.large_kept += o.large_kept;
        self.gc_nanos += o.gc_nanos;
        self.remset_entries += o.remset_entries;
        self.frontier_checks += o.frontier_checks;
        self.frontier_expired += o.frontier_expired;
        self.peak_heap_bytes = self.peak_heap_bytes.max(o.peak_heap_bytes);
    }
}

static GLOBAL: Mutex<Stats> = Mutex::new(Stats {
    forks: 0,
    bytes_allocated: 0,
    objects_allocated: 0,
    chunks: 0,
    collections: 0,
    ancestor_levels: 0,
    bytes_copied: 0,
    bytes_reclaimed: 0,
    large_kept: 0,
    gc_nanos: 0,
    remset_entries: 0,
    frontier_checks: 0,
    frontier_expired: 0,
    peak_heap_bytes: 0,
});

pub(crate) fn add_global(s: &Stats) {
    GLOBAL.lock().unwrap_or_else(|e| e.into_inner()).add(s);
}

/// Counters summed over every finished `run` in this process.
pub fn global_stats() -> Stats {
    *GLOBAL.lock().unwrap_or_else(|e| e.into_inner())
}
