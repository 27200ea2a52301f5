//! Statistics: global figures and the arena matrix (class x heap).
//!
//! A snapshot asks every heap to publish its figures (by bumping an epoch that
//! heaps look at on their slow paths) and reads what they published.  The
//! calling thread's heap publishes at once; another thread's figures are as of
//! its last slow path.  Nothing here needs the heaps to stop.

use crate::arena::{self, UNIT};
use crate::global;
use crate::heap::{empty_heap, Heap, DEAD_TID, STATS_EPOCH};
use crate::report::Buf;
use crate::size_class::{class_size, NUM_CLASSES, SMALL_CLASSES};
use canopy_sync::prim::Ordering;

/// Figures for one size class, summed over heaps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Block size of the class.
    pub block_size: usize,
    /// Live blocks (small) or chunks (medium).
    pub blocks_in_use: u64,
    /// `blocks_in_use * block_size`.
    pub bytes_in_use: u64,
    /// Slabs (small classes only).
    pub slabs: u64,
}

/// One cell of the arena matrix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArenaStats {
    /// Heap number.
    pub heap: usize,
    /// Size class.
    pub class: usize,
    /// Live blocks.
    pub blocks_in_use: u64,
    /// Bytes in live blocks.
    pub bytes_in_use: u64,
    /// Slabs (small classes).
    pub slabs: u64,
}

/// A statistics snapshot.
#[derive(Clone, Debug)]
pub struct Stats {
    /// Address space the arena holds: the whole reservation, or in an arena
    /// that grows (under `ulimit -v`) what is mapped less the holes that
    /// free spans below live memory have given back.
    pub reserved_bytes: u64,
    /// Upper bound of arena memory that may be resident (handed out or free but not decommitted).
    pub committed_bytes: u64,
    /// Resident set of the whole process, if known.
    pub resident_bytes: Option<u64>,
    /// Metadata (descriptor table pages in use are not counted; heap
    /// structures and the batch blocks remote frees travel in are).
    pub metadata_bytes: u64,
    /// Bytes in live blocks (small + medium + large).
    pub in_use_bytes: u64,
    /// Allocations (all sizes).
    pub allocations: u64,
    /// Frees sent to another thread's heap.
    pub remote_frees: u64,
    /// Batches those frees travelled in (one atomic swap each).
    pub remote_batches: u64,
    /// Remote frees taken in by their owners.
    pub remote_frees_received: u64,
    /// Frees of other threads' blocks that the freeing thread kept for its
    /// own next allocations of the same class (not sent, not counted in
    /// `remote_frees` unless sent later).
    pub remote_frees_kept: u64,
    /// Deferred coalescing passes in medium heaps.
    pub coalescings: u64,
    /// Coalescings of free spans in the global heap.
    pub span_coalescings: u64,
    /// Pages handed from the global heap to thread heaps.
    pub pages_to_heaps: u64,
    /// Pages thread heaps gave back to the global heap.
    pub pages_from_heaps: u64,
    /// Bytes given back to the OS (decommitted).
    pub bytes_returned_to_os: u64,
    /// Decommit operations.
    pub decommits: u64,
    /// Large chunks allocated.
    pub large_allocs: u64,
    /// Large chunks freed.
    pub large_frees: u64,
    /// Bytes in live large chunks.
    pub large_bytes: u64,
    /// Bytes of freed large chunks kept in threads' large caches (committed,
    /// not in use; see `CANOPY_LARGE_CACHE_KB`).
    pub large_cached_bytes: u64,
    /// Large allocations served from a thread's large cache (counted in
    /// `large_allocs` too).
    pub large_cache_hits: u64,
    /// Bytes of pages currently lent to region allocators (`lend_pages`).
    pub lent_bytes: u64,
    /// Heaps owned by live threads.
    pub heaps_live: u64,
    /// Heaps created.
    pub heaps_created: u64,
    /// Heaps adopted from exited threads.
    pub heaps_adopted: u64,
    /// Heaps abandoned by exiting threads.
    pub heaps_abandoned: u64,
    /// Global-heap entries made without the lock (solo mode).
    pub unlocked_global_entries: u64,
    /// Solo periods begun after the first (a thread left alone again).
    pub solo_periods: u64,
    /// Bad frees seen (refused in the default mode).
    pub bad_frees: u64,
    /// Per size class.
    pub classes: [ClassStats; NUM_CLASSES],
}

fn for_each_heap(mut f: impl FnMut(&Heap)) {
    if !crate::thread::ensure_init() {
        return;
    }
    let locked = crate::solo::lock();
    // SAFETY: global lock held while reading the list head.
    let head = unsafe { global::state().heaps };
    crate::solo::unlock(locked);
    let mut h = head;
    while !h.is_null() {
        // SAFETY: heaps are never freed and `next_all` never changes after
        // insertion; we read only atomics (published figures) and `id`.
        unsafe {
            f(&*h);
            h = (*h).next_all;
        }
    }
}

fn ask_publish() {
    STATS_EPOCH.fetch_add(1, Ordering::Relaxed);
    let me = crate::thread::tls_heap();
    if me != empty_heap() {
        // SAFETY: our own heap.
        unsafe { (*me).publish() };
    }
}

/// Visit every non-empty cell of the arena matrix.
pub fn for_each_arena(mut f: impl FnMut(ArenaStats)) {
    ask_publish();
    for_each_heap(|h| {
        for c in 0..NUM_CLASSES {
            let blocks = h.published.blocks[c].load(Ordering::Relaxed);
            let slabs = if c < SMALL_CLASSES { h.published.slabs[c].load(Ordering::Relaxed) } else { 0 };
            if blocks != 0 || slabs != 0 {
                f(ArenaStats { heap: h.id, class: c, blocks_in_use: blocks, bytes_in_use: blocks * class_size(c) as u64, slabs });
            }
        }
    });
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            reserved_bytes: 0,
            committed_bytes: 0,
            resident_bytes: None,
            metadata_bytes: 0,
            in_use_bytes: 0,
            allocations: 0,
            remote_frees: 0,
            remote_batches: 0,
            remote_frees_received: 0,
            remote_frees_kept: 0,
            coalescings: 0,
            span_coalescings: 0,
            pages_to_heaps: 0,
            pages_from_heaps: 0,
            bytes_returned_to_os: 0,
            decommits: 0,
            large_allocs: 0,
            large_frees: 0,
            large_bytes: 0,
            large_cached_bytes: 0,
            large_cache_hits: 0,
            lent_bytes: 0,
            heaps_live: 0,
            heaps_created: 0,
            heaps_adopted: 0,
            heaps_abandoned: 0,
            unlocked_global_entries: 0,
            solo_periods: 0,
            bad_frees: 0,
            classes: [ClassStats::default(); NUM_CLASSES],
        }
    }
}

/// Take a snapshot.
pub fn snapshot() -> Stats {
    let mut s = Stats::default();
    for (c, cs) in s.classes.iter_mut().enumerate() {
        cs.block_size = class_size(c);
    }
    if !crate::thread::ensure_init() {
        return s;
    }
    ask_publish();
    let mut batch_bytes = 0;
    let (mut hits, mut puts, mut cached) = (0, 0, 0);
    for_each_heap(|h| {
        hits += h.published.large_cache_hits.load(Ordering::Relaxed);
        puts += h.published.large_cache_puts.load(Ordering::Relaxed);
        cached += h.published.large_cached_bytes.load(Ordering::Relaxed);
        for c in 0..NUM_CLASSES {
            let blocks = h.published.blocks[c].load(Ordering::Relaxed);
            s.classes[c].blocks_in_use += blocks;
            s.classes[c].bytes_in_use += blocks * class_size(c) as u64;
            if c < SMALL_CLASSES {
                s.classes[c].slabs += h.published.slabs[c].load(Ordering::Relaxed);
            }
        }
        let k = |i: usize| h.published.counters[i].load(Ordering::Relaxed);
        s.allocations += h.published.small_allocs.load(Ordering::Relaxed) + k(0) + k(8);
        s.remote_frees += k(1);
        s.remote_batches += k(2);
        s.remote_frees_received += k(3);
        s.remote_frees_kept += k(9);
        s.coalescings += k(4);
        batch_bytes += h.published.batch_bytes.load(Ordering::Relaxed);
        let _ = h.tid == DEAD_TID;
    });
    let direct = crate::heap::DIRECT_REMOTE_FREES.load(Ordering::Relaxed);
    s.remote_frees += direct;
    s.remote_batches += direct;
    let locked = crate::solo::lock();
    // SAFETY: global lock held.
    // The mapped length with the holes, under the lock: the global heap
    // changes both only while it holds it.
    let (g, committed, reserved) = unsafe {
        let g = global::state();
        (g.stats, g.committed_bytes(), arena::mapped_units() - g.hole_units)
    };
    crate::solo::unlock(locked);
    s.reserved_bytes = (reserved * UNIT) as u64;
    s.committed_bytes = committed as u64;
    s.resident_bytes = canopy_sys::resident_bytes().map(|v| v as u64);
    s.metadata_bytes = crate::meta::used() as u64 + batch_bytes;
    // The global heap counts a cached chunk as live until it gets it back.
    s.large_allocs = g.large_allocs + hits;
    s.large_frees = g.large_frees + puts;
    s.large_bytes = g.large_bytes.saturating_sub(cached);
    s.large_cached_bytes = cached;
    s.large_cache_hits = hits;
    s.lent_bytes = g.lent_units * crate::arena::UNIT as u64;
    s.pages_to_heaps = g.pages_out;
    s.pages_from_heaps = g.pages_back;
    s.bytes_returned_to_os = g.bytes_decommitted;
    s.decommits = g.decommits;
    s.span_coalescings = g.span_coalescings;
    s.heaps_created = g.heaps_created;
    s.heaps_adopted = g.heaps_adopted;
    s.heaps_abandoned = g.heaps_abandoned;
    s.heaps_live = crate::thread::LIVE_HEAPS.load(Ordering::Relaxed) as u64;
    s.unlocked_global_entries = crate::solo::UNLOCKED_ENTRIES.load(Ordering::Relaxed) as u64;
    s.solo_periods = crate::solo::SOLO_PERIODS.load(Ordering::Relaxed) as u64;
    s.bad_frees = crate::report::bad_frees() as u64;
    s.in_use_bytes = s.classes.iter().map(|c| c.bytes_in_use).sum::<u64>() + s.large_bytes;
    s
}

impl Stats {
    fn rows(&self) -> [(&'static str, u64); 29] {
        [
            ("reserved_bytes", self.reserved_bytes),
            ("committed_bytes", self.committed_bytes),
            ("resident_bytes", self.resident_bytes.unwrap_or(0)),
            ("metadata_bytes", self.metadata_bytes),
            ("in_use_bytes", self.in_use_bytes),
            ("allocations", self.allocations),
            ("remote_frees", self.remote_frees),
            ("remote_batches", self.remote_batches),
            ("remote_frees_received", self.remote_frees_received),
            ("remote_frees_kept", self.remote_frees_kept),
            ("coalescings", self.coalescings),
            ("span_coalescings", self.span_coalescings),
            ("pages_to_heaps", self.pages_to_heaps),
            ("pages_from_heaps", self.pages_from_heaps),
            ("bytes_returned_to_os", self.bytes_returned_to_os),
            ("decommits", self.decommits),
            ("large_allocs", self.large_allocs),
            ("large_frees", self.large_frees),
            ("large_bytes", self.large_bytes),
            ("large_cached_bytes", self.large_cached_bytes),
            ("large_cache_hits", self.large_cache_hits),
            ("lent_bytes", self.lent_bytes),
            ("heaps_live", self.heaps_live),
            ("heaps_created", self.heaps_created),
            ("heaps_adopted", self.heaps_adopted),
            ("heaps_abandoned", self.heaps_abandoned),
            ("unlocked_global_entries", self.unlocked_global_entries),
            ("solo_periods", self.solo_periods),
            ("bad_frees", self.bad_frees),
        ]
    }

    /// Write the snapshot as one JSON object through `out` (no allocation).
    pub fn write_json(&self, out: &mut dyn FnMut(&[u8])) {
        out(b"{");
        for (i, (k, v)) in self.rows().iter().enumerate() {
            let mut b = Buf::new();
            if i > 0 {
                b.str(",");
            }
            b.str("\"").str(k).str("\":").dec(*v as usize);
            out(b.as_bytes());
        }
        out(b",\"classes\":[");
        let mut first = true;
        for (c, cs) in self.classes.iter().enumerate() {
            if cs.blocks_in_use == 0 && cs.slabs == 0 {
                continue;
            }
            let mut b = Buf::new();
            if !first {
                b.str(",");
            }
            first = false;
            b.str("{\"class\":").dec(c).str(",\"block_size\":").dec(cs.block_size);
            b.str(",\"blocks_in_use\":").dec(cs.blocks_in_use as usize).str(",\"bytes_in_use\":").dec(cs.bytes_in_use as usize);
            b.str(",\"slabs\":").dec(cs.slabs as usize).str("}");
            out(b.as_bytes());
        }
        out(b"]}");
    }
}

/// The snapshot in glibc's `struct mallinfo2` layout (what `mallinfo2()`
/// returns under `libcanopy_malloc`).  Canopy maps no region per request,
/// so large chunks (above `MEDIUM_MAX`, taken from the global heap) stand
/// where glibc reports mmapped chunks; everything else is "the arena":
///
/// - `arena`: committed bytes not in large chunks (`committed_bytes -
///   large_bytes`);
/// - `uordblks`: bytes in small and medium blocks in use (`in_use_bytes -
///   large_bytes`), `fordblks`: `arena - uordblks` (free but committed);
/// - `hblks`, `hblkhd`: large chunks in use and their bytes;
/// - `ordblks`, `smblks`, `fsmblks`, `usmblks`, `keepcost`: 0 (glibc's free
///   chunk lists, fastbins and top chunk have no counterpart here; glibc
///   itself always reports `usmblks` as 0).
///
/// So `uordblks + hblkhd` is the memory the program holds and `arena +
/// hblkhd` what Canopy has committed for it, as with glibc.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mallinfo2 {
    /// Committed bytes outside large chunks.
    pub arena: usize,
    /// Free chunks (0: no counterpart).
    pub ordblks: usize,
    /// Free fastbin blocks (0: no counterpart).
    pub smblks: usize,
    /// Large chunks in use.
    pub hblks: usize,
    /// Bytes in large chunks in use.
    pub hblkhd: usize,
    /// Always 0 (as in glibc).
    pub usmblks: usize,
    /// Bytes in free fastbin blocks (0: no counterpart).
    pub fsmblks: usize,
    /// Bytes in small and medium blocks in use.
    pub uordblks: usize,
    /// Committed bytes outside large chunks that no block uses.
    pub fordblks: usize,
    /// Releasable top-most space (0: no counterpart).
    pub keepcost: usize,
}

impl Stats {
    /// This snapshot as glibc's `mallinfo2` (see [`Mallinfo2`]).
    pub fn mallinfo2(&self) -> Mallinfo2 {
        let large = self.large_bytes as usize;
        let arena = (self.committed_bytes as usize).saturating_sub(large);
        let used = (self.in_use_bytes as usize).saturating_sub(large).min(arena);
        Mallinfo2 {
            arena,
            hblks: self.large_allocs.saturating_sub(self.large_frees) as usize,
            hblkhd: large,
            uordblks: used,
            fordblks: arena - used,
            ..Mallinfo2::default()
        }
    }

    /// Write the snapshot as the XML document of glibc's `malloc_info`
    /// (no allocation): `<total>` elements for the bytes in use and in large
    /// chunks, then the figures of [`write_json`](Self::write_json), one
    /// `<figure name= value=>` each, and one `<class>` per size class in use.
    pub fn write_xml(&self, out: &mut dyn FnMut(&[u8])) {
        out(b"<malloc version=\"1\" allocator=\"canopy\">\n");
        let m = self.mallinfo2();
        let mut b = Buf::new();
        b.str("<total type=\"in_use\" size=\"").dec(self.in_use_bytes as usize).str("\"/>\n");
        b.str("<total type=\"large\" count=\"").dec(m.hblks).str("\" size=\"").dec(m.hblkhd).str("\"/>\n");
        out(b.as_bytes());
        for (k, v) in self.rows() {
            let mut b = Buf::new();
            b.str("<figure name=\"").str(k).str("\" value=\"").dec(v as usize).str("\"/>\n");
            out(b.as_bytes());
        }
        for (c, cs) in self.classes.iter().enumerate() {
            if cs.blocks_in_use == 0 && cs.slabs == 0 {
                continue;
            }
            let mut b = Buf::new();
            b.str("<class nr=\"").dec(c).str("\" block_size=\"").dec(cs.block_size);
            b.str("\" blocks_in_use=\"").dec(cs.blocks_in_use as usize).str("\" bytes_in_use=\"").dec(cs.bytes_in_use as usize);
            b.str("\" slabs=\"").dec(cs.slabs as usize).str("\"/>\n");
            out(b.as_bytes());
        }
        out(b"</malloc>\n");
    }
}

/// Write the snapshot as a text table through `out` (no allocation).
pub fn write_table(s: &Stats, out: &mut dyn FnMut(&[u8])) {
    out(b"canopy statistics\n");
    for (k, v) in s.rows() {
        let mut b = Buf::new();
        b.str("  ").str(k);
        for _ in k.len()..26 {
            b.str(" ");
        }
        b.dec(v as usize).str("\n");
        out(b.as_bytes());
    }
    out(b"  class  block_size  blocks_in_use   bytes_in_use  slabs\n");
    for (c, cs) in s.classes.iter().enumerate() {
        if cs.blocks_in_use == 0 && cs.slabs == 0 {
            continue;
        }
        let mut b = Buf::new();
        let col = |b: &mut Buf, v: usize, w: usize| {
            let mut t = Buf::new();
            t.dec(v);
            for _ in t.as_bytes().len()..w {
                b.str(" ");
            }
            b.dec(v);
        };
        col(&mut b, c, 7);
        col(&mut b, cs.block_size, 12);
        col(&mut b, cs.blocks_in_use as usize, 15);
        col(&mut b, cs.bytes_in_use as usize, 15);
        col(&mut b, cs.slabs as usize, 7);
        b.str("\n");
        out(b.as_bytes());
    }
}

impl core::fmt::Display for Stats {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mut r = Ok(());
        write_table(self, &mut |b| {
            if r.is_ok() {
                r = f.write_str(core::str::from_utf8(b).unwrap_or("?"));
            }
        });
        r
    }
}
