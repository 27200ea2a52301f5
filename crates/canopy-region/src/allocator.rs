//! The region allocator: one instance is what a Myrmics scheduler holds for
//! its local regions (002 §4).  Each region is a slab pool of its own; all
//! metadata (slab table, bitmaps, lists, the region tree) lives in ordinary
//! heap memory of the process, never inside the slabs, so a region's memory
//! is only data and can be described as (address, length) runs.

use core::fmt;
use core::num::NonZeroU64;
use core::ptr::NonNull;

use crate::config::Config;
use crate::pagemap::PageMap;
use crate::ranges::FreeRanges;
use crate::source::{GlobalHeap, PageSource};
use crate::RegionError;

/// Null link of the intrusive slab and region lists.
pub(crate) const NIL: u32 = u32::MAX;

/// Slab states.
pub(crate) mod state {
    /// In the allocator's free ranges.
    pub const FREE: u8 = 0;
    /// Kept empty by a region (its empty list).
    pub const EMPTY: u8 = 1;
    /// Slots of one size, some free (its region's partial list for the size).
    pub const PARTIAL: u8 = 2;
    /// Slots of one size, none free (its region's full list).
    pub const FULL: u8 = 3;
    /// First slab of an object spanning `span` slabs (its region's span list).
    pub const SPAN: u8 = 4;
    /// Another slab of a spanning object; `span` is the head's slab index.
    pub const BODY: u8 = 5;
}

/// A region's id: unique and non-zero; a freed region's id is never given to
/// another region while... ever, in fact: ids carry a generation, so a stale
/// id is reported as freed instead of reaching a newer region.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionId(NonZeroU64);

impl RegionId {
    /// The root region, which exists for the allocator's whole life.
    pub const ROOT: RegionId = RegionId(NonZeroU64::MIN);

    /// The id as a number (for C and for messages).
    pub const fn get(self) -> u64 {
        self.0.get()
    }

    /// An id from a number (`None` for 0).  Whether a region has this id is
    /// checked by each call that takes it.
    pub const fn from_raw(v: u64) -> Option<RegionId> {
        match NonZeroU64::new(v) {
            Some(n) => Some(RegionId(n)),
            None => None,
        }
    }

    pub(crate) fn new(slot: u32, gen: u32) -> RegionId {
        RegionId(NonZeroU64::new(((gen as u64) << 32) | (slot as u64 + 1)).expect("slot + 1 is non-zero"))
    }

    pub(crate) fn slot(self) -> usize {
        ((self.0.get() & 0xffff_ffff) - 1) as usize
    }

    pub(crate) fn gen(self) -> u32 {
        (self.0.get() >> 32) as u32
    }
}

impl fmt::Display for RegionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Debug for RegionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RegionId({}: slot {}, generation {})", self.0, self.slot(), self.gen())
    }
}

/// Metadata of one slab.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slab {
    pub(crate) addr: usize,
    /// Region slot, or `NIL`.
    pub(crate) region: u32,
    pub(crate) prev: u32,
    pub(crate) next: u32,
    /// SPAN: slabs in the object; BODY: the head's index; PARTIAL and
    /// FULL: the first bitmap word that may have a free slot.
    pub(crate) span: u32,
    /// Live objects.
    pub(crate) live: u32,
    /// Slot size in granules (PARTIAL, FULL).
    pub(crate) class: u16,
    pub(crate) state: u8,
}

impl Slab {
    fn free_at(addr: usize) -> Slab {
        Slab { addr, region: NIL, prev: NIL, next: NIL, span: 0, live: 0, class: 0, state: state::FREE }
    }
}

/// One region: its place in the tree and its slab pool.
#[derive(Debug)]
pub(crate) struct Region {
    pub(crate) gen: u32,
    pub(crate) alive: bool,
    pub(crate) parent: u32,
    pub(crate) first_child: u32,
    pub(crate) next_sib: u32,
    pub(crate) prev_sib: u32,
    pub(crate) children: u32,
    pub(crate) level_hint: i32,
    pub(crate) depth: u32,
    /// Head of the partial list of each slot size (index: granules).
    pub(crate) partial: Box<[u32]>,
    pub(crate) full: u32,
    pub(crate) empty: u32,
    pub(crate) spans: u32,
    pub(crate) n_partial: u32,
    pub(crate) n_full: u32,
    pub(crate) n_empty: u32,
    pub(crate) n_span_slabs: u32,
    /// Objects spanning slabs (small objects are counted from their slabs on demand).
    pub(crate) span_objects: u64,
    /// The id while the region lives, 0 otherwise (one compare per lookup).
    pub(crate) key: u64,
    /// Address just past the slabs this region took last: where it grows next.
    pub(crate) hint: usize,
    /// Every range of slabs this region has taken (Myrmics' used ranges), in
    /// the order taken, neighbours merged.  Slabs that left the region since
    /// are skipped when it is freed; the list is rebuilt when it grows to
    /// twice the slabs the region holds.
    pub(crate) owned: Vec<(usize, usize)>,
}

impl Region {
    pub(crate) fn new_dead(classes: usize) -> Region {
        Region::new(classes)
    }

    fn new(classes: usize) -> Region {
        Region {
            gen: 0,
            alive: false,
            parent: NIL,
            first_child: NIL,
            next_sib: NIL,
            prev_sib: NIL,
            children: 0,
            level_hint: 0,
            depth: 0,
            partial: vec![NIL; classes].into_boxed_slice(),
            full: NIL,
            empty: NIL,
            spans: NIL,
            n_partial: 0,
            n_full: 0,
            n_empty: 0,
            n_span_slabs: 0,
            span_objects: 0,
            key: 0,
            hint: 0,
            owned: Vec::new(),
        }
    }

    pub(crate) fn id(&self, slot: usize) -> RegionId {
        RegionId::new(slot as u32, self.gen)
    }
}

/// What one region holds (`RegionAllocator::region_stats`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionStats {
    /// The region.
    pub id: RegionId,
    /// Its parent (`None` for the root).
    pub parent: Option<RegionId>,
    /// The level hint given at creation.
    pub level_hint: i32,
    /// Distance from the root.
    pub depth: u32,
    /// Direct children.
    pub children: u32,
    /// Live objects.
    pub objects: u64,
    /// Bytes of the slots and spans those objects occupy.
    pub bytes: u64,
    /// Slabs with every slot in use.
    pub full_slabs: u32,
    /// Slabs with some slots in use.
    pub partial_slabs: u32,
    /// Empty slabs the region keeps (between the watermarks).
    pub empty_slabs: u32,
    /// Slabs of objects larger than a slab.
    pub span_slabs: u32,
}

/// Counters of one allocator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Pages taken from the page source and not given back.
    pub pages: usize,
    /// Slabs in the free ranges.
    pub free_slabs: usize,
    /// Number of separate free ranges.
    pub free_ranges: usize,
    /// Regions alive, the root included.
    pub regions: usize,
    /// Regions ever created (root excluded).
    pub regions_created: u64,
    /// Regions freed (each descendant counts).
    pub regions_freed: u64,
    /// Objects allocated.
    pub allocs: u64,
    /// Objects freed one by one.
    pub frees: u64,
    /// Empty slabs taken back from regions above the low watermark.
    pub reclaimed_slabs: u64,
    /// Calls to the page source.
    pub page_takes: u64,
}

/// A region allocator (the Myrmics local layer).  Not shared between
/// threads: it is `Send`, and a program that needs one allocator for several
/// threads puts it behind a lock (as [`crate::global`] does).
pub struct RegionAllocator {
    pub(crate) cfg: Config,
    source: Box<dyn PageSource>,
    pub(crate) slab_shift: u32,
    page_mask: usize,
    /// Slabs per page.
    pub(crate) spp: usize,
    /// Bitmap words per slab.
    pub(crate) wps: usize,
    granule_shift: u32,
    /// Slots per slab for each class (index: granules).
    pub(crate) slots: Box<[u32]>,
    /// ceil(2^40 / slot size) for each class.
    inv: Box<[u64]>,
    pub(crate) pages: Vec<usize>,
    free_pages: Vec<u32>,
    chunks: Vec<(usize, usize)>,
    pub(crate) map: PageMap,
    pub(crate) slabs: Vec<Slab>,
    /// Free-slot bitmaps (1 = free), `wps` words per slab.
    pub(crate) bits: Vec<u64>,
    pub(crate) free: FreeRanges,
    pub(crate) regions: Vec<Region>,
    free_slots: Vec<u32>,
    reclaim_cursor: usize,
    pub(crate) stats: AllocatorStats,
}

// The slab and region lists are indices, not pointers, so these helpers take
// the slab table and the head separately.
pub(crate) fn push(slabs: &mut [Slab], head: &mut u32, s: u32) {
    let old = *head;
    slabs[s as usize].prev = NIL;
    slabs[s as usize].next = old;
    if old != NIL {
        slabs[old as usize].prev = s;
    }
    *head = s;
}

pub(crate) fn unlink(slabs: &mut [Slab], head: &mut u32, s: u32) {
    let Slab { prev, next, .. } = slabs[s as usize];
    if prev != NIL {
        slabs[prev as usize].next = next;
    } else {
        debug_assert_eq!(*head, s);
        *head = next;
    }
    if next != NIL {
        slabs[next as usize].prev = prev;
    }
    slabs[s as usize].prev = NIL;
    slabs[s as usize].next = NIL;
}

impl RegionAllocator {
    /// An allocator with the default configuration over Canopy's global heap.
    pub fn new() -> RegionAllocator {
        RegionAllocator::with_source(Config::default(), Box::new(GlobalHeap)).expect("the default configuration is valid")
    }

    /// An allocator with `cfg` over Canopy's global heap (the page size must
    /// be a multiple of 1 MiB).
    pub fn with_config(cfg: Config) -> Result<RegionAllocator, RegionError> {
        if cfg.page_size % (1 << 20) != 0 {
            return Err(RegionError::BadConfig(format!(
                "page size {} is not a multiple of the global heap's 1 MiB page",
                cfg.page_size
            )));
        }
        RegionAllocator::with_source(cfg, Box::new(GlobalHeap))
    }

    /// An allocator with `cfg` taking pages from `source`.
    pub fn with_source(cfg: Config, source: Box<dyn PageSource>) -> Result<RegionAllocator, RegionError> {
        cfg.validate()?;
        let classes = cfg.slab_size / cfg.granule + 1;
        let slots: Box<[u32]> =
            (0..classes).map(|c| if c == 0 { 0 } else { (cfg.slab_size / (c * cfg.granule)) as u32 }).collect();
        let inv: Box<[u64]> = (0..classes).map(|c| if c == 0 { 0 } else { (1u64 << 40) / (c * cfg.granule) as u64 + 1 }).collect();
        let mut root = Region::new(classes);
        root.alive = true;
        root.key = RegionId::ROOT.get();
        Ok(RegionAllocator {
            slab_shift: cfg.slab_size.trailing_zeros(),
            page_mask: cfg.page_size - 1,
            spp: cfg.page_size / cfg.slab_size,
            wps: (cfg.slab_size / cfg.granule).div_ceil(64),
            granule_shift: cfg.granule.trailing_zeros(),
            slots,
            inv,
            pages: Vec::new(),
            free_pages: Vec::new(),
            chunks: Vec::new(),
            map: PageMap::new(cfg.page_size),
            slabs: Vec::new(),
            bits: Vec::new(),
            free: FreeRanges::new(cfg.slab_size),
            regions: vec![root],
            free_slots: Vec::new(),
            reclaim_cursor: 0,
            stats: AllocatorStats { regions: 1, ..Default::default() },
            source,
            cfg,
        })
    }

    pub(crate) fn free_slots_push(&mut self, s: u32) {
        self.free_slots.push(s);
    }

    pub(crate) fn free_slots_remove(&mut self, s: u32) {
        if let Some(i) = self.free_slots.iter().position(|&x| x == s) {
            self.free_slots.swap_remove(i);
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    // -----------------------------------------------------------------
    // Lookups
    // -----------------------------------------------------------------

    /// The slot of a live region, or why there is none.
    #[inline]
    pub(crate) fn slot_of(&self, rid: RegionId) -> Result<usize, RegionError> {
        let s = rid.slot();
        match self.regions.get(s) {
            Some(r) if r.key == rid.get() => Ok(s),
            Some(r) if rid.gen() < r.gen || (rid.gen() == r.gen && !r.alive) => Err(RegionError::FreedRegion(rid)),
            _ => Err(RegionError::UnknownRegion(rid)),
        }
    }

    /// Whether `rid` names a live region.
    pub fn contains(&self, rid: RegionId) -> bool {
        self.slot_of(rid).is_ok()
    }

    /// The slab holding `addr`, if the allocator owns its page.
    #[inline]
    pub(crate) fn slab_of(&self, addr: usize) -> Option<u32> {
        let page = self.map.get(addr)? as usize;
        Some((page * self.spp + ((addr & self.page_mask) >> self.slab_shift)) as u32)
    }

    #[inline]
    fn class_of(&self, size: usize) -> usize {
        (size.max(1) + self.cfg.granule - 1) >> self.granule_shift
    }

    fn slot_size(&self, class: u16) -> usize {
        (class as usize) << self.granule_shift
    }

    // -----------------------------------------------------------------
    // Regions
    // -----------------------------------------------------------------

    /// Create a region under `parent` (`RegionId::ROOT` at the top).  The
    /// level hint is recorded (the global address space layer uses it to
    /// place the region on a server level).
    pub fn ralloc(&mut self, parent: RegionId, level_hint: i32) -> Result<RegionId, RegionError> {
        let p = self.slot_of(parent)?;
        let slot = match self.free_slots.pop() {
            Some(s) => s as usize,
            None => {
                if self.regions.len() >= u32::MAX as usize - 1 {
                    return Err(RegionError::OutOfMemory { size: 0, region: parent });
                }
                self.regions.push(Region::new(self.slots.len()));
                self.regions.len() - 1
            }
        };
        self.attach(slot, p, level_hint);
        self.stats.regions_created += 1;
        Ok(self.regions[slot].id(slot))
    }

    /// Make `slot` a live, empty child of `p`.
    pub(crate) fn attach(&mut self, slot: usize, p: usize, level_hint: i32) {
        let depth = self.regions[p].depth + 1;
        let old_first = self.regions[p].first_child;
        {
            let r = &mut self.regions[slot];
            debug_assert!(!r.alive && r.partial.iter().all(|&h| h == NIL));
            r.alive = true;
            r.parent = p as u32;
            r.first_child = NIL;
            r.prev_sib = NIL;
            r.next_sib = old_first;
            r.children = 0;
            r.level_hint = level_hint;
            r.depth = depth;
            r.full = NIL;
            r.empty = NIL;
            r.spans = NIL;
            r.n_partial = 0;
            r.n_full = 0;
            r.n_empty = 0;
            r.n_span_slabs = 0;
            r.span_objects = 0;
            r.hint = 0;
            r.owned.clear();
        }
        let key = self.regions[slot].id(slot).get();
        self.regions[slot].key = key;
        if old_first != NIL {
            self.regions[old_first as usize].prev_sib = slot as u32;
        }
        self.regions[p].first_child = slot as u32;
        self.regions[p].children += 1;
        self.stats.regions += 1;
    }

    /// Free a region, every object in it and every descendant region.  Costs
    /// time in proportion to the slabs and regions freed, not the objects.
    pub fn rfree(&mut self, rid: RegionId) -> Result<(), RegionError> {
        let s = self.slot_of(rid)?;
        if s == 0 {
            return Err(RegionError::RootNotFreeable);
        }
        self.detach(s);
        let mut stack = vec![s as u32];
        while let Some(x) = stack.pop() {
            let mut c = self.regions[x as usize].first_child;
            while c != NIL {
                stack.push(c);
                c = self.regions[c as usize].next_sib;
            }
            self.release_region_memory(x as usize);
            let r = &mut self.regions[x as usize];
            r.alive = false;
            r.key = 0;
            r.gen = r.gen.wrapping_add(1);
            r.first_child = NIL;
            r.children = 0;
            self.free_slots.push(x);
            self.stats.regions -= 1;
            self.stats.regions_freed += 1;
        }
        Ok(())
    }

    /// Unlink `s` from its parent's child list.
    fn detach(&mut self, s: usize) {
        let (p, prev, next) = {
            let r = &self.regions[s];
            (r.parent as usize, r.prev_sib, r.next_sib)
        };
        if prev != NIL {
            self.regions[prev as usize].next_sib = next;
        } else {
            self.regions[p].first_child = next;
        }
        if next != NIL {
            self.regions[next as usize].prev_sib = prev;
        }
        self.regions[p].children -= 1;
        let r = &mut self.regions[s];
        r.prev_sib = NIL;
        r.next_sib = NIL;
    }

    /// Give every slab of region `s` back to the free ranges: one pass over
    /// the ranges it took, in address order within each, merging neighbours
    /// on the fly (time in proportion to its slabs, no sorting).
    fn release_region_memory(&mut self, s: usize) {
        let owned = {
            let r = &mut self.regions[s];
            r.partial.iter_mut().for_each(|h| *h = NIL);
            r.full = NIL;
            r.empty = NIL;
            r.spans = NIL;
            r.n_partial = 0;
            r.n_full = 0;
            r.n_empty = 0;
            r.n_span_slabs = 0;
            r.span_objects = 0;
            core::mem::take(&mut r.owned)
        };
        let me = s as u32;
        let mut run: Option<(usize, usize)> = None;
        for &(addr, n) in &owned {
            let mut i = 0;
            while i < n {
                // One page-map lookup per page; slab indices are consecutive within a page.
                let a0 = addr + (i << self.slab_shift);
                let first = self.slab_of(a0).expect("owned slab is mapped") as usize;
                let in_page = (self.spp - first % self.spp).min(n - i);
                for k in 0..in_page {
                    let sl = &mut self.slabs[first + k];
                    let a = a0 + (k << self.slab_shift);
                    if sl.region == me && sl.state != state::FREE {
                        *sl = Slab::free_at(a);
                        run = match run {
                            Some((ra, rn)) if ra + (rn << self.slab_shift) == a => Some((ra, rn + 1)),
                            Some((ra, rn)) => {
                                self.free.insert(ra, rn);
                                Some((a, 1))
                            }
                            None => Some((a, 1)),
                        };
                    } else if let Some((ra, rn)) = run.take() {
                        self.free.insert(ra, rn);
                    }
                }
                i += in_page;
            }
        }
        if let Some((ra, rn)) = run {
            self.free.insert(ra, rn);
        }
        let mut owned = owned;
        owned.clear();
        self.regions[s].owned = owned;
    }

    /// Record that region `ri` took `n` slabs at `addr`.
    pub(crate) fn note_owned(&mut self, ri: usize, addr: usize, n: usize) {
        let shift = self.slab_shift;
        let r = &mut self.regions[ri];
        match r.owned.last_mut() {
            Some((a, k)) if *a + (*k << shift) == addr => *k += n,
            _ => r.owned.push((addr, n)),
        }
        let held = (r.n_partial + r.n_full + r.n_empty + r.n_span_slabs) as usize + n;
        if r.owned.len() > 64 && r.owned.len() > 2 * held {
            self.rebuild_owned(ri);
        }
    }

    /// Rebuild region `ri`'s owned ranges from its lists (amortised: runs
    /// only after the list doubled).
    #[cold]
    fn rebuild_owned(&mut self, ri: usize) {
        let mut v: Vec<(usize, usize)> = Vec::new();
        let me = ri as u32;
        for &(addr, n) in &self.regions[ri].owned {
            for i in 0..n {
                let a = addr + (i << self.slab_shift);
                let sid = self.slab_of(a).expect("owned slab is mapped") as usize;
                let sl = &self.slabs[sid];
                if sl.region == me && sl.state != state::FREE {
                    v.push((a, 1));
                }
            }
        }
        v.sort_unstable();
        v.dedup();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(v.len().min(64));
        for (a, n) in v {
            match merged.last_mut() {
                Some((ma, mn)) if *ma + (*mn << self.slab_shift) == a => *mn += n,
                _ => merged.push((a, n)),
            }
        }
        self.regions[ri].owned = merged;
    }

    // -----------------------------------------------------------------
    // Objects
    // -----------------------------------------------------------------

    /// Allocate `size` bytes (0 counts as 1) in region `rid`.  Objects up to
    /// a slab come from slots of the next multiple of the granule (aligned to
    /// the largest power of two dividing the slot size, at least the
    /// granule); larger ones span consecutive slabs (slab-aligned).
    #[inline]
    pub fn alloc(&mut self, size: usize, rid: RegionId) -> Result<NonNull<u8>, RegionError> {
        // Fast path: a live region, a small size, a partial slab whose first
        // bitmap word has a free slot and that does not fill up.  Everything
        // else is `alloc_slow`, out of line, so this stays short.
        let s = rid.slot();
        if let Some(r) = self.regions.get(s) {
            if r.key == rid.get() && size <= self.cfg.slab_size {
                let class = self.class_of(size);
                // SAFETY: class <= slab size / granule < partial.len().
                let sid = unsafe { *r.partial.get_unchecked(class) };
                if sid != NIL {
                    // SAFETY: list members index the slab table; `bits` has
                    // `wps` >= 1 words per slab.
                    // The slab's `span` field holds, for a slab of slots, the
                    // first bitmap word that may have a free slot (< wps).
                    unsafe {
                        let sl = &mut *self.slabs.as_mut_ptr().add(sid as usize);
                        let w = sl.span as usize;
                        debug_assert!(w < self.wps);
                        let word = &mut *self.bits.as_mut_ptr().add(sid as usize * self.wps + w);
                        let x = *word;
                        if x != 0 && sl.live + 1 < *self.slots.get_unchecked(class) {
                            *word = x & (x - 1);
                            sl.live += 1;
                            self.stats.allocs += 1;
                            let idx = w * 64 + x.trailing_zeros() as usize;
                            let addr = sl.addr + idx * (class << self.granule_shift);
                            return Ok(NonNull::new_unchecked(addr as *mut u8));
                        }
                    }
                }
            }
        }
        self.alloc_slow(size, rid)
    }

    #[cold]
    #[inline(never)]
    fn alloc_slow(&mut self, size: usize, rid: RegionId) -> Result<NonNull<u8>, RegionError> {
        let ri = self.slot_of(rid)?;
        let a = if size <= self.cfg.slab_size {
            self.alloc_small(ri, self.class_of(size))?
        } else {
            self.alloc_span(ri, size)?
        };
        self.stats.allocs += 1;
        // SAFETY: slab addresses are inside pages from the source, never 0.
        Ok(unsafe { NonNull::new_unchecked(a as *mut u8) })
    }

    #[inline]
    fn alloc_small(&mut self, ri: usize, class: usize) -> Result<usize, RegionError> {
        debug_assert!(ri < self.regions.len() && class < self.slots.len());
        // SAFETY: `ri` comes from `slot_of`, which checked it against the
        // region table; `class` <= slab size / granule < `partial.len()`
        // because the caller checked size <= slab size.
        let mut sid = unsafe { *self.regions.get_unchecked(ri).partial.get_unchecked(class) };
        if sid == NIL {
            sid = self.new_partial(ri, class)?;
        }
        debug_assert!(
            self.slabs[sid as usize].state == state::PARTIAL
                && self.slabs[sid as usize].region == ri as u32
                && self.slabs[sid as usize].class as usize == class,
            "partial list of region slot {ri} class {class} holds a wrong slab"
        );
        let wps = self.wps;
        // SAFETY: slab lists hold indices of the slab table, which has `wps`
        // bitmap words per slab in `bits`; a partial slab has a free slot, so
        // the scan stops inside its words.
        unsafe {
            let words = self.bits.as_mut_ptr().add(sid as usize * wps);
            let s = self.slabs.get_unchecked_mut(sid as usize);
            let mut w = s.span as usize;
            while *words.add(w) == 0 {
                w += 1;
            }
            debug_assert!(w < wps);
            s.span = w as u32;
            let x = *words.add(w);
            *words.add(w) = x & (x - 1);
            let idx = w * 64 + x.trailing_zeros() as usize;
            s.live += 1;
            let addr = s.addr + idx * (class << self.granule_shift);
            if s.live == *self.slots.get_unchecked(class) {
                self.slab_filled(ri, class, sid);
            }
            Ok(addr)
        }
    }

    #[cold]
    fn slab_filled(&mut self, ri: usize, class: usize, sid: u32) {
        let r = &mut self.regions[ri];
        unlink(&mut self.slabs, &mut r.partial[class], sid);
        push(&mut self.slabs, &mut r.full, sid);
        self.slabs[sid as usize].state = state::FULL;
        r.n_partial -= 1;
        r.n_full += 1;
    }

    /// Give region `ri` a fresh partial slab for `class`.
    #[cold]
    fn new_partial(&mut self, ri: usize, class: usize) -> Result<u32, RegionError> {
        let sid = if self.regions[ri].empty != NIL {
            let r = &mut self.regions[ri];
            let s = r.empty;
            unlink(&mut self.slabs, &mut r.empty, s);
            r.n_empty -= 1;
            s
        } else {
            let want = self.cfg.high_watermark.max(1);
            let (addr, got) = self.take_slabs(ri, 1, want, class << self.granule_shift)?;
            let first = self.slab_of(addr).expect("taken slab is mapped");
            for i in 1..got {
                let s = self.slab_of(addr + (i << self.slab_shift)).expect("taken slab is mapped");
                let r = &mut self.regions[ri];
                self.slabs[s as usize].state = state::EMPTY;
                self.slabs[s as usize].region = ri as u32;
                push(&mut self.slabs, &mut r.empty, s);
                r.n_empty += 1;
            }
            first
        };
        let n = self.slots[class] as usize;
        let base = sid as usize * self.wps;
        for w in 0..self.wps {
            let lo = w * 64;
            self.bits[base + w] = if n >= lo + 64 {
                !0
            } else if n > lo {
                (1u64 << (n - lo)) - 1
            } else {
                0
            };
        }
        let s = &mut self.slabs[sid as usize];
        s.state = state::PARTIAL;
        s.class = class as u16;
        s.live = 0;
        s.span = 0;
        s.region = ri as u32;
        let r = &mut self.regions[ri];
        push(&mut self.slabs, &mut r.partial[class], sid);
        r.n_partial += 1;
        Ok(sid)
    }

    fn alloc_span(&mut self, ri: usize, size: usize) -> Result<usize, RegionError> {
        let k = size.div_ceil(self.cfg.slab_size);
        if k > u32::MAX as usize / 2 {
            return Err(RegionError::SizeTooLarge(size));
        }
        let (addr, _) = self.take_slabs(ri, k, k, size)?;
        let head = self.slab_of(addr).expect("taken slab is mapped");
        for i in 1..k {
            let b = self.slab_of(addr + (i << self.slab_shift)).expect("taken slab is mapped") as usize;
            self.slabs[b].state = state::BODY;
            self.slabs[b].span = head;
            self.slabs[b].region = ri as u32;
        }
        let s = &mut self.slabs[head as usize];
        s.state = state::SPAN;
        s.span = k as u32;
        s.live = 1;
        s.region = ri as u32;
        let r = &mut self.regions[ri];
        push(&mut self.slabs, &mut r.spans, head);
        r.n_span_slabs += k as u32;
        r.span_objects += 1;
        Ok(addr)
    }

    /// Take `need` contiguous slabs for region `ri` (up to `want` when memory
    /// is plentiful), preferring the slabs right after the region's last ones.
    /// When no free range fits, first reclaim empty slabs that other regions
    /// keep above the low watermark, then take pages from the source.
    fn take_slabs(&mut self, ri: usize, need: usize, want: usize, size: usize) -> Result<(usize, usize), RegionError> {
        let (addr, got) = match self.try_take(ri, need, want) {
            Some(t) => t,
            None => {
                self.reclaim(need);
                match self.try_take(ri, need, need) {
                    Some(t) => t,
                    None => {
                        self.grow(need, self.regions[ri].id(ri), size)?;
                        self.try_take(ri, need, want).expect("fresh pages hold the request")
                    }
                }
            }
        };
        self.regions[ri].hint = addr + (got << self.slab_shift);
        self.note_owned(ri, addr, got);
        Ok((addr, got))
    }

    fn try_take(&mut self, ri: usize, need: usize, want: usize) -> Option<(usize, usize)> {
        let hint = self.regions[ri].hint;
        if hint != 0 {
            if need == 1 {
                if let Some(t) = self.free.take_at_start(hint, want) {
                    return Some(t);
                }
            } else if self.free.contains(hint, need) && self.free.take_exact(hint, need) {
                return Some((hint, need));
            }
        }
        if want > need && self.free.slabs() >= want * 4 {
            if let Some(a) = self.free.take_best_fit(want) {
                return Some((a, want));
            }
        }
        self.free.take_best_fit(need).map(|a| (a, need))
    }

    /// Take back empty slabs from regions above the low watermark, starting
    /// after the region visited last, until `need` contiguous slabs are free
    /// or every region has been visited.
    fn reclaim(&mut self, need: usize) {
        let n = self.regions.len();
        let low = self.cfg.low_watermark as u32;
        for step in 0..n {
            let s = (self.reclaim_cursor + step) % n;
            if !self.regions[s].alive || self.regions[s].n_empty <= low {
                continue;
            }
            while self.regions[s].n_empty > low {
                let r = &mut self.regions[s];
                let x = r.empty;
                unlink(&mut self.slabs, &mut r.empty, x);
                r.n_empty -= 1;
                let a = self.slabs[x as usize].addr;
                self.slabs[x as usize] = Slab::free_at(a);
                self.free.insert(a, 1);
                self.stats.reclaimed_slabs += 1;
            }
            if self.free.largest() >= need {
                self.reclaim_cursor = (s + 1) % n;
                return;
            }
        }
    }

    /// Take enough pages for `need` slabs from the source.
    fn grow(&mut self, need: usize, rid: RegionId, size: usize) -> Result<(), RegionError> {
        let bytes = need.checked_mul(self.cfg.slab_size).ok_or(RegionError::SizeTooLarge(size))?;
        let pages = bytes.div_ceil(self.cfg.page_size);
        if self.stats.pages.saturating_add(pages) > self.cfg.max_pages {
            return Err(RegionError::OutOfMemory { size, region: rid });
        }
        self.stats.page_takes += 1;
        let p = self
            .source
            .take(pages, self.cfg.page_size)
            .ok_or(RegionError::OutOfMemory { size, region: rid })?;
        let addr = p.as_ptr() as usize;
        if addr & self.page_mask != 0 {
            // SAFETY: the pages came from this source just now and are unused.
            unsafe { self.source.give_back(p, pages, self.cfg.page_size) };
            return Err(RegionError::BadConfig(format!(
                "page source {} returned {addr:#x}, not aligned to the page size {:#x}",
                self.source.describe(),
                self.cfg.page_size
            )));
        }
        self.register_pages(addr, pages);
        self.chunks.push((addr, pages));
        self.free.insert(addr, pages * self.spp);
        Ok(())
    }

    /// Record `pages` pages at `addr` in the page map, all slabs FREE (the
    /// caller puts them in the free ranges).
    pub(crate) fn register_pages(&mut self, addr: usize, pages: usize) {
        for i in 0..pages {
            let base = addr + i * self.cfg.page_size;
            let idx = match self.free_pages.pop() {
                Some(x) => {
                    self.pages[x as usize] = base;
                    x as usize
                }
                None => {
                    self.pages.push(base);
                    self.slabs.resize(self.pages.len() * self.spp, Slab::free_at(0));
                    self.bits.resize(self.slabs.len() * self.wps, 0);
                    self.pages.len() - 1
                }
            };
            for j in 0..self.spp {
                self.slabs[idx * self.spp + j] = Slab::free_at(base + (j << self.slab_shift));
            }
            self.map.set(base, Some(idx as u32));
        }
        self.stats.pages += pages;
    }

    /// Take the pages at `addr` from the source (unpacking).
    pub(crate) fn claim_pages_at(&mut self, addr: usize, pages: usize) -> Result<(), RegionError> {
        if self.stats.pages.saturating_add(pages) > self.cfg.max_pages {
            return Err(RegionError::Unpack(format!("{pages} more pages would pass the limit of {}", self.cfg.max_pages)));
        }
        self.source.take_at(addr, pages, self.cfg.page_size).map_err(RegionError::Unpack)?;
        self.stats.page_takes += 1;
        self.register_pages(addr, pages);
        self.chunks.push((addr, pages));
        self.free.insert(addr, pages * self.spp);
        Ok(())
    }

    /// Free one object.
    #[inline]
    pub fn free(&mut self, p: NonNull<u8>) -> Result<(), RegionError> {
        let a = p.as_ptr() as usize;
        let sid = self.slab_of(a).ok_or(RegionError::NotOwned(a))?;
        // SAFETY: `slab_of` gives page index * slabs per page + slab in page,
        // for a page recorded in the page map; the slab table has
        // `pages.len() * spp` entries.
        let s = unsafe { &mut *self.slabs.as_mut_ptr().add(sid as usize) };
        let st = s.state;
        if st == state::PARTIAL || st == state::FULL {
            let class = s.class as usize;
            let off = a.wrapping_sub(s.addr);
            // SAFETY: a slab of slots has a class in 1..classes.
            let (inv, slots) = unsafe { (*self.inv.get_unchecked(class), *self.slots.get_unchecked(class)) };
            // off / slot size without a division: off * ceil(2^40 / size) >> 40
            // is exact while off * size < 2^40 (slabs are at most 1 MiB).
            let idx = ((off as u64 * inv) >> 40) as usize;
            debug_assert_eq!(idx, off / (class << self.granule_shift));
            if idx < slots as usize && off == idx * (class << self.granule_shift) {
                // SAFETY: idx < slots <= 64 * wps, so the word is the slab's own.
                let word = unsafe { &mut *self.bits.as_mut_ptr().add(sid as usize * self.wps + idx / 64) };
                let bit = 1u64 << (idx % 64);
                if *word & bit == 0 {
                    *word |= bit;
                    s.span = s.span.min((idx / 64) as u32);
                    s.live -= 1;
                    let live = s.live;
                    self.stats.frees += 1;
                    if st == state::FULL || live == 0 {
                        let copy = *s;
                        self.slab_changed_list(sid, copy, live);
                    }
                    return Ok(());
                }
            }
        }
        let s = *s;
        self.free_slow(sid, s, a)
    }

    /// Frees of spanning objects, and every bad free.
    #[cold]
    fn free_slow(&mut self, sid: u32, s: Slab, a: usize) -> Result<(), RegionError> {
        match s.state {
            state::PARTIAL | state::FULL => return Err(self.small_index(sid, s, a).expect_err("the fast path refused it")),
            state::SPAN if a == s.addr => self.free_span(sid, s),
            state::SPAN => {
                return Err(RegionError::Interior { ptr: a, object: s.addr, region: self.rid(s.region) })
            }
            state::BODY => {
                let h = self.slabs[s.span as usize];
                return Err(RegionError::Interior { ptr: a, object: h.addr, region: self.rid(h.region) });
            }
            state::EMPTY => return Err(RegionError::NotAllocated { ptr: a, region: self.rid(s.region) }),
            _ => return Err(RegionError::NotOwned(a)),
        }
        self.stats.frees += 1;
        Ok(())
    }

    fn rid(&self, slot: u32) -> RegionId {
        self.regions[slot as usize].id(slot as usize)
    }

    /// Check that `a` starts a live slot of small slab `s`; return its index.
    fn small_index(&self, sid: u32, s: Slab, a: usize) -> Result<usize, RegionError> {
        let size = self.slot_size(s.class);
        let off = a - s.addr;
        let idx = off / size;
        if idx >= self.slots[s.class as usize] as usize {
            return Err(RegionError::NotAllocated { ptr: a, region: self.rid(s.region) });
        }
        let word = self.bits[sid as usize * self.wps + idx / 64];
        if word & (1 << (idx % 64)) != 0 {
            return Err(RegionError::NotAllocated { ptr: a, region: self.rid(s.region) });
        }
        if off != idx * size {
            return Err(RegionError::Interior { ptr: a, object: s.addr + idx * size, region: self.rid(s.region) });
        }
        Ok(idx)
    }

    /// A free made a full slab partial, or emptied a slab.
    #[cold]
    fn slab_changed_list(&mut self, sid: u32, s: Slab, live: u32) {
        let ri = s.region as usize;
        let class = s.class as usize;
        let r = &mut self.regions[ri];
        if s.state == state::FULL {
            unlink(&mut self.slabs, &mut r.full, sid);
            r.n_full -= 1;
            if live > 0 {
                push(&mut self.slabs, &mut r.partial[class], sid);
                r.n_partial += 1;
                self.slabs[sid as usize].state = state::PARTIAL;
            }
        } else {
            unlink(&mut self.slabs, &mut r.partial[class], sid);
            r.n_partial -= 1;
        }
        if live == 0 {
            self.retire_empty(ri, sid);
        }
    }

    /// An emptied slab stays with its region up to the high watermark.
    fn retire_empty(&mut self, ri: usize, sid: u32) {
        debug_assert!(self.slabs[sid as usize].live == 0 && self.slabs[sid as usize].prev == NIL);
        let r = &mut self.regions[ri];
        if (r.n_empty as usize) < self.cfg.high_watermark {
            push(&mut self.slabs, &mut r.empty, sid);
            r.n_empty += 1;
            let s = &mut self.slabs[sid as usize];
            s.state = state::EMPTY;
            s.class = 0;
        } else {
            let a = self.slabs[sid as usize].addr;
            self.slabs[sid as usize] = Slab::free_at(a);
            self.free.insert(a, 1);
        }
    }

    fn free_span(&mut self, head: u32, s: Slab) {
        let ri = s.region as usize;
        let k = s.span as usize;
        let r = &mut self.regions[ri];
        unlink(&mut self.slabs, &mut r.spans, head);
        r.n_span_slabs -= k as u32;
        r.span_objects -= 1;
        self.release_run(s.addr, k);
    }

    /// Mark `k` slabs from `addr` FREE and put them in the free ranges.
    fn release_run(&mut self, addr: usize, k: usize) {
        for i in 0..k {
            let a = addr + (i << self.slab_shift);
            let b = self.slab_of(a).expect("run is mapped");
            self.slabs[b as usize] = Slab::free_at(a);
        }
        self.free.insert(addr, k);
    }

    /// The region and usable size of the live object at `p`.
    pub fn object(&self, p: NonNull<u8>) -> Result<(RegionId, usize), RegionError> {
        let a = p.as_ptr() as usize;
        let sid = self.slab_of(a).ok_or(RegionError::NotOwned(a))?;
        let s = self.slabs[sid as usize];
        match s.state {
            state::PARTIAL | state::FULL => {
                self.small_index(sid, s, a)?;
                Ok((self.rid(s.region), self.slot_size(s.class)))
            }
            state::SPAN if a == s.addr => Ok((self.rid(s.region), (s.span as usize) << self.slab_shift)),
            state::SPAN => Err(RegionError::Interior { ptr: a, object: s.addr, region: self.rid(s.region) }),
            state::BODY => {
                let h = self.slabs[s.span as usize];
                Err(RegionError::Interior { ptr: a, object: h.addr, region: self.rid(h.region) })
            }
            state::EMPTY => Err(RegionError::NotAllocated { ptr: a, region: self.rid(s.region) }),
            _ => Err(RegionError::NotOwned(a)),
        }
    }

    /// The region whose memory holds `p` (any address inside a live object).
    pub fn region_of(&self, p: *const u8) -> Result<RegionId, RegionError> {
        let a = p as usize;
        let sid = self.slab_of(a).ok_or(RegionError::NotOwned(a))?;
        let s = self.slabs[sid as usize];
        match s.state {
            state::FREE => Err(RegionError::NotOwned(a)),
            _ => Ok(self.rid(s.region)),
        }
    }

    /// Resize the object at `p` to `new_size` and/or move it to region `to`
    /// (`None`: stay in its region).  Stays in place when the slot size (or
    /// span length) does not change, and a span shrinks or grows in place
    /// when the slabs after it are free; otherwise allocates, copies and frees.
    /// On error `p` is untouched and still valid.
    pub fn realloc(&mut self, p: NonNull<u8>, new_size: usize, to: Option<RegionId>) -> Result<NonNull<u8>, RegionError> {
        let (from, cap) = self.object(p)?;
        let target = to.unwrap_or(from);
        let ti = self.slot_of(target)?;
        if target == from {
            let a = p.as_ptr() as usize;
            if cap <= self.cfg.slab_size && new_size <= self.cfg.slab_size {
                if self.class_of(new_size) == cap >> self.granule_shift {
                    return Ok(p);
                }
            } else if cap > self.cfg.slab_size && new_size > self.cfg.slab_size {
                let k = cap >> self.slab_shift;
                let k2 = new_size.div_ceil(self.cfg.slab_size);
                if k2 <= k {
                    if k2 < k {
                        self.shrink_span(a, k, k2);
                    }
                    return Ok(p);
                }
                let end = a + cap;
                if self.free.contains(end, k2 - k) && self.free.take_exact(end, k2 - k) {
                    self.grow_span(a, k, k2);
                    self.note_owned(ti, end, k2 - k);
                    return Ok(p);
                }
            }
        }
        let q = self.alloc(new_size, self.regions[ti].id(ti))?;
        // SAFETY: both objects are live, distinct, and at least min(cap, new_size) long.
        unsafe { core::ptr::copy_nonoverlapping(p.as_ptr(), q.as_ptr(), cap.min(new_size)) };
        self.free(p).expect("the object was validated above");
        Ok(q)
    }

    fn shrink_span(&mut self, a: usize, k: usize, k2: usize) {
        let head = self.slab_of(a).expect("span head");
        let ri = self.slabs[head as usize].region as usize;
        self.slabs[head as usize].span = k2 as u32;
        let r = &mut self.regions[ri];
        r.n_span_slabs -= (k - k2) as u32;
        self.release_run(a + (k2 << self.slab_shift), k - k2);
    }

    fn grow_span(&mut self, a: usize, k: usize, k2: usize) {
        let head = self.slab_of(a).expect("span head");
        let ri = self.slabs[head as usize].region;
        for i in k..k2 {
            let b = self.slab_of(a + (i << self.slab_shift)).expect("taken slab is mapped") as usize;
            self.slabs[b].state = state::BODY;
            self.slabs[b].span = head;
            self.slabs[b].region = ri;
        }
        self.slabs[head as usize].span = k2 as u32;
        let r = &mut self.regions[ri as usize];
        r.n_span_slabs += (k2 - k) as u32;
    }

    /// Allocate `n` objects of `size` bytes in region `rid` in one call.  If
    /// memory runs out part way, the objects already allocated are freed and
    /// the error is returned.
    pub fn balloc(&mut self, size: usize, rid: RegionId, n: usize) -> Result<Vec<NonNull<u8>>, RegionError> {
        let mut out = Vec::with_capacity(n);
        self.balloc_into(size, rid, n, &mut out)?;
        Ok(out)
    }

    /// [`balloc`](Self::balloc) appending to `out`.
    pub fn balloc_into(
        &mut self,
        size: usize,
        rid: RegionId,
        n: usize,
        out: &mut Vec<NonNull<u8>>,
    ) -> Result<(), RegionError> {
        let start = out.len();
        out.reserve(n);
        let r = if size <= self.cfg.slab_size {
            self.slot_of(rid).and_then(|ri| self.balloc_small(ri, self.class_of(size), n, out))
        } else {
            (0..n).try_for_each(|_| self.alloc(size, rid).map(|p| out.push(p)))
        };
        if let Err(e) = r {
            for p in out.drain(start..) {
                self.free(p).expect("just allocated");
            }
            return Err(e);
        }
        Ok(())
    }

    /// `n` slots of `class` for region `ri`: whole bitmap words at a time,
    /// one slab after another, without looking the region up per object.
    fn balloc_small(&mut self, ri: usize, class: usize, n: usize, out: &mut Vec<NonNull<u8>>) -> Result<(), RegionError> {
        let size = class << self.granule_shift;
        let slots = self.slots[class];
        let mut left = n;
        while left > 0 {
            let mut sid = self.regions[ri].partial[class];
            if sid == NIL {
                sid = self.new_partial(ri, class)?;
            }
            let base = sid as usize * self.wps;
            let (addr, mut w, mut live) = {
                let sl = &self.slabs[sid as usize];
                (sl.addr, sl.span as usize, sl.live)
            };
            while left > 0 && w < self.wps {
                let mut x = self.bits[base + w];
                while x != 0 && left > 0 {
                    let idx = w * 64 + x.trailing_zeros() as usize;
                    x &= x - 1;
                    // SAFETY: slot addresses are inside a mapped slab, never 0.
                    out.push(unsafe { NonNull::new_unchecked((addr + idx * size) as *mut u8) });
                    live += 1;
                    left -= 1;
                }
                self.bits[base + w] = x;
                if x == 0 {
                    w += 1;
                }
            }
            let sl = &mut self.slabs[sid as usize];
            sl.live = live;
            sl.span = w.min(self.wps - 1) as u32;
            if live == slots {
                self.slab_filled(ri, class, sid);
            }
        }
        self.stats.allocs += n as u64;
        Ok(())
    }

    // -----------------------------------------------------------------
    // Introspection
    // -----------------------------------------------------------------

    /// What region `rid` holds.
    pub fn region_stats(&self, rid: RegionId) -> Result<RegionStats, RegionError> {
        let s = self.slot_of(rid)?;
        let r = &self.regions[s];
        // Small objects are counted from their slabs (no counter on the fast paths).
        let (mut objects, mut bytes) = (r.span_objects, (r.n_span_slabs as u64) << self.slab_shift);
        for &h in r.partial.iter().chain([&r.full]) {
            let mut x = h;
            while x != NIL {
                let sl = &self.slabs[x as usize];
                objects += sl.live as u64;
                bytes += sl.live as u64 * self.slot_size(sl.class) as u64;
                x = sl.next;
            }
        }
        Ok(RegionStats {
            id: rid,
            parent: if s == 0 { None } else { Some(self.rid(r.parent)) },
            level_hint: r.level_hint,
            depth: r.depth,
            children: r.children,
            objects,
            bytes,
            full_slabs: r.n_full,
            partial_slabs: r.n_partial,
            empty_slabs: r.n_empty,
            span_slabs: r.n_span_slabs,
        })
    }

    /// The children of `rid`, most recent first.
    pub fn children(&self, rid: RegionId) -> Result<Vec<RegionId>, RegionError> {
        let s = self.slot_of(rid)?;
        let mut v = Vec::new();
        let mut c = self.regions[s].first_child;
        while c != NIL {
            v.push(self.rid(c));
            c = self.regions[c as usize].next_sib;
        }
        Ok(v)
    }

    /// The allocator's counters.
    pub fn stats(&self) -> AllocatorStats {
        AllocatorStats { free_slabs: self.free.slabs(), free_ranges: self.free.ranges(), ..self.stats.clone() }
    }

    /// Give pages whose slabs are all free back to the page source (whole
    /// chunks as they were taken).  Returns the pages given back.
    pub fn trim(&mut self) -> usize {
        let mut given = 0;
        let mut i = 0;
        while i < self.chunks.len() {
            let (a, n) = self.chunks[i];
            let slabs = n * self.spp;
            if self.free.contains(a, slabs) && self.free.take_exact(a, slabs) {
                for j in 0..n {
                    let base = a + j * self.cfg.page_size;
                    let idx = self.map.get(base).expect("chunk page is mapped");
                    self.map.set(base, None);
                    self.pages[idx as usize] = 0;
                    self.free_pages.push(idx);
                }
                // SAFETY: every slab of the chunk was free, so nothing uses it.
                unsafe { self.source.give_back(NonNull::new(a as *mut u8).expect("non-null chunk"), n, self.cfg.page_size) };
                self.stats.pages -= n;
                given += n;
                self.chunks.swap_remove(i);
            } else {
                i += 1;
            }
        }
        given
    }

    /// Check every invariant: list membership matches slab states, counters
    /// match the lists, bitmaps match live counts, free ranges cover exactly
    /// the free slabs, the region tree is consistent.  For tests and debugging
    /// (it walks everything).
    pub fn check(&self) -> Result<(), String> {
        self.free.check()?;
        let mut seen = vec![false; self.slabs.len()];
        for (si, r) in self.regions.iter().enumerate() {
            if !r.alive {
                if r.partial.iter().any(|&h| h != NIL) || r.full != NIL || r.empty != NIL || r.spans != NIL {
                    return Err(format!("dead region slot {si} still has slabs"));
                }
                continue;
            }
            let covered: std::collections::BTreeSet<usize> = r
                .owned
                .iter()
                .flat_map(|&(a, n)| (0..n).map(move |i| a + (i << self.slab_shift)))
                .collect();
            let (mut np, mut nf, mut ne, mut ns, mut objs) = (0u32, 0u32, 0u32, 0u32, 0u64);
            let mut walk = |head: u32, want: u8, class: Option<usize>| -> Result<(), String> {
                let (mut x, mut prev) = (head, NIL);
                while x != NIL {
                    let s = &self.slabs[x as usize];
                    if seen[x as usize] {
                        return Err(format!("slab {:#x} is on two lists", s.addr));
                    }
                    seen[x as usize] = true;
                    if !covered.contains(&s.addr) {
                        return Err(format!("slab {:#x} of region slot {si} is not in its owned ranges", s.addr));
                    }
                    if s.state != want || s.region != si as u32 || s.prev != prev {
                        return Err(format!("slab {:#x}: state {} region {} on a list of state {want} of region {si}", s.addr, s.state, s.region));
                    }
                    match want {
                        state::PARTIAL | state::FULL => {
                            let c = s.class as usize;
                            if class.is_some_and(|k| k != c) {
                                return Err(format!("slab {:#x} of class {c} on another class's list", s.addr));
                            }
                            let free: u32 = (0..self.wps).map(|w| self.bits[x as usize * self.wps + w].count_ones()).sum();
                            let cursor = s.span as usize;
                            if cursor >= self.wps || (0..cursor).any(|w| self.bits[x as usize * self.wps + w] != 0) {
                                return Err(format!("slab {:#x}: free-word cursor {cursor} is past a free slot", s.addr));
                            }
                            if free + s.live != self.slots[c] || s.live == 0 || (want == state::FULL) != (free == 0) {
                                return Err(format!("slab {:#x}: {} live + {free} free != {} slots", s.addr, s.live, self.slots[c]));
                            }
                            if want == state::PARTIAL { np += 1 } else { nf += 1 }
                        }
                        state::EMPTY => ne += 1,
                        _ => {
                            objs += 1;
                            ns += s.span;
                            for i in 1..s.span as usize {
                                let b = self.slab_of(s.addr + (i << self.slab_shift)).ok_or("span body unmapped")?;
                                let bs = &self.slabs[b as usize];
                                if bs.state != state::BODY || bs.span != x || seen[b as usize] || !covered.contains(&bs.addr) {
                                    return Err(format!("span body {:#x} of {:#x} is wrong", bs.addr, s.addr));
                                }
                                seen[b as usize] = true;
                            }
                        }
                    }
                    prev = x;
                    x = s.next;
                }
                Ok(())
            };
            for (c, &h) in r.partial.iter().enumerate() {
                walk(h, state::PARTIAL, Some(c))?;
            }
            walk(r.full, state::FULL, None)?;
            walk(r.empty, state::EMPTY, None)?;
            walk(r.spans, state::SPAN, None)?;
            if (np, nf, ne, ns, objs) != (r.n_partial, r.n_full, r.n_empty, r.n_span_slabs, r.span_objects) {
                return Err(format!("region slot {si}: counters disagree with its lists"));
            }
            if ne as usize > self.cfg.high_watermark {
                return Err(format!("region slot {si} keeps {ne} empty slabs, above the high watermark"));
            }
            let mut kids = 0;
            let mut c = r.first_child;
            while c != NIL {
                let k = &self.regions[c as usize];
                if !k.alive || k.parent != si as u32 || k.depth != r.depth + 1 {
                    return Err(format!("region slot {c} is a wrong child of {si}"));
                }
                kids += 1;
                c = k.next_sib;
            }
            if kids != r.children {
                return Err(format!("region slot {si}: child count disagrees"));
            }
        }
        let mut free_slabs = 0;
        for (a, l) in self.free.iter() {
            for i in 0..l {
                let b = self.slab_of(a + (i << self.slab_shift)).ok_or_else(|| format!("free slab {a:#x} unmapped"))?;
                if self.slabs[b as usize].state != state::FREE || seen[b as usize] {
                    return Err(format!("free range slab {:#x} is in use", a + (i << self.slab_shift)));
                }
                seen[b as usize] = true;
                free_slabs += 1;
            }
        }
        for (p, &base) in self.pages.iter().enumerate() {
            if base == 0 {
                continue;
            }
            for j in 0..self.spp {
                if !seen[p * self.spp + j] {
                    return Err(format!("slab {:#x} is on no list and not free", base + (j << self.slab_shift)));
                }
            }
        }
        if free_slabs != self.free.slabs() {
            return Err("free slab count disagrees".into());
        }
        Ok(())
    }
}

impl Default for RegionAllocator {
    fn default() -> RegionAllocator {
        RegionAllocator::new()
    }
}

impl fmt::Debug for RegionAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionAllocator")
            .field("config", &self.cfg)
            .field("source", &self.source.describe())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Drop for RegionAllocator {
    fn drop(&mut self) {
        for &(a, n) in &self.chunks {
            // SAFETY: dropping the allocator ends every region and object in it.
            unsafe { self.source.give_back(NonNull::new(a as *mut u8).expect("non-null chunk"), n, self.cfg.page_size) };
        }
    }
}
