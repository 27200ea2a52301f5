//! The region allocator: one instance is what a Myrmics scheduler holds for
//! its local regions (002 §4).  Each region is a slab pool of its own; all
//! metadata (slab table, bitmaps, lists, the region tree) lives in ordinary
//! heap memory of the process, never inside the slabs, so a region's memory
//! is only data and can be described as (address, length) runs.
//!
//! The slab is [`canopy_alloc::slab`], the same implementation the
//! allocator's small-object slabs use: a slot size's geometry
//! ([`SlotShape`]: slots per slab, the multiplier that locates a slot from
//! an offset) and the bitmap operations (fill a fresh slab, take the lowest
//! free slot, release a slot exactly once, count free slots).  The region
//! layer has no slot or bitmap arithmetic of its own; it keeps its own lists
//! (per region: partial slabs per slot size with an allocation cursor, full,
//! empty up to the watermarks, spans) and its bitmap vector (`bits`: `wps`
//! words per slab, enough for the smallest slot; a shape with fewer words
//! leaves the rest 0).

use core::fmt;
use core::num::NonZeroU64;
use core::ptr::NonNull;

use canopy_alloc::slab::{self, SlotShape};

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

/// A region's id: unique and non-zero.  An id is a slot and a generation;
/// freeing a region bumps its slot's generation, so a stale id is reported
/// as freed instead of reaching the slot's next region.  (The generation is
/// 32 bits: only after 2^32 regions have been freed in one slot could an id
/// come back.)
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

    /// The slot the id names.  An id whose low 32 bits are 0 (possible
    /// from [`from_raw`](Self::from_raw)) names none: it maps to slot
    /// `u32::MAX`, which no region ever has (`ralloc` stops below it and
    /// unpacking refuses such ids), so every lookup finds it unknown rather
    /// than overflowing.
    pub(crate) fn slot(self) -> usize {
        (self.0.get() as u32).wrapping_sub(1) as usize
    }

    /// Whether the id names a slot (see [`slot`](Self::slot)).
    pub(crate) fn names_a_slot(self) -> bool {
        self.0.get() as u32 != 0
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
    /// SPAN: slabs in the object; BODY: the head's index; otherwise 0.
    /// (A slab of slots counts its live objects from its bitmap.)
    pub(crate) span: u32,
    /// Slot size class (PARTIAL, FULL; see `RegionAllocator::tiny`), 0 otherwise.
    pub(crate) class: u16,
    pub(crate) state: u8,
}

impl Slab {
    fn free_at(addr: usize) -> Slab {
        Slab { addr, region: NIL, prev: NIL, next: NIL, span: 0, class: 0, state: state::FREE }
    }
}

/// The index in `RegionAllocator::bits` of a word that is always 0: the
/// cursor of a slot size with no partial slab points at it, so the
/// allocation fast path finds "no free slot" without a separate test.
pub(crate) const NO_WORD: u32 = 0;

/// A region's slabs of one slot size: the head of its partial list, and the
/// allocation cursor into that head.
///
/// Invariant: `word == NO_WORD`, or `word` is a bitmap word of slab `head`
/// and `base` is the address of that word's slot 0.  The word may have no
/// free slot left: the fast path takes the last slot of a word and leaves
/// the cursor there, and the next allocation of the slot size (the slow
/// path, which finds the word empty) moves it on (`cursor_exhausted`).  So
/// the head of a partial list may be full while the cursor is on one of its
/// words; every other partial slab has a free slot.  Any change of the head
/// resets the cursor; the slow path sets it again.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SizeList {
    /// Address of slot 0 of the cursor word.
    pub(crate) base: usize,
    /// Index in `bits` of the cursor word, or `NO_WORD`.
    pub(crate) word: u32,
    /// Head of the partial list, or `NIL`.
    pub(crate) head: u32,
}

impl SizeList {
    const EMPTY: SizeList = SizeList { base: 0, word: NO_WORD, head: NIL };
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
    /// Partial list and allocation cursor of each slot size (index: class;
    /// entry 0 is never used, so its cursor stays `NO_WORD`).
    pub(crate) sizes: Box<[SizeList]>,
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
    /// An entry for a slot that no region uses yet: it gets its slot-size
    /// lists when a region is attached to it.
    pub(crate) fn new_dead() -> Region {
        Region::new(0)
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
            sizes: vec![SizeList::EMPTY; classes].into_boxed_slice(),
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

/// How many slabs of each state one region holds
/// (`RegionAllocator::slab_counts`): the slab fields of [`RegionStats`]
/// without its walk over the slabs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlabCounts {
    /// Slabs with every slot in use.
    pub full: u32,
    /// Slabs with some slots in use.
    pub partial: u32,
    /// Empty slabs the region keeps (between the watermarks).
    pub empty: u32,
    /// Slabs of objects larger than a slab.
    pub span: u32,
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

/// A slot size class and the slot size in bytes (`RegionAllocator::by16`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SlotOf {
    class: u32,
    size: u32,
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
    /// log2 of the smallest slot.
    min_shift: u32,
    /// Slot sizes below the granule (`granule / min_slot - 1`): classes
    /// `1..=tiny` are `class * min_slot`, class `tiny + k` is `k * granule`.
    tiny: usize,
    /// The slot of a request of `16 * i - 15 ..= 16 * i` bytes, for `i` up
    /// to the slab size / 16 (every slot size is a multiple of 16, so the
    /// request's 16 B multiple decides): one load instead of the
    /// computation of `class_raw` on the allocation fast path.
    by16: Box<[SlotOf]>,
    /// The slab geometry of each class (index: class, see `tiny`; class 0
    /// is `SlotShape::EMPTY`, whose magic 0 sends every slab that is not a
    /// slab of slots to the slow path of `free`).
    pub(crate) shapes: Box<[SlotShape]>,
    pub(crate) pages: Vec<usize>,
    free_pages: Vec<u32>,
    chunks: Vec<(usize, usize)>,
    pub(crate) map: PageMap,
    pub(crate) slabs: Vec<Slab>,
    /// Free-slot bitmaps (1 = free): word `NO_WORD` (0), always 0, then
    /// `wps` words per slab (`word_index`).
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
        let tiny = cfg.granule / cfg.min_slot - 1;
        let classes = tiny + cfg.slab_size / cfg.granule + 1;
        let size_of = |c: usize| if c <= tiny { c * cfg.min_slot } else { (c - tiny) * cfg.granule };
        // Slot sizes are 16 B to the slab size, and slabs at most 1 MiB
        // (`Config::validate`), as `SlotShape::new` requires.
        let shapes: Box<[SlotShape]> = (0..classes)
            .map(|c| if c == 0 { SlotShape::EMPTY } else { SlotShape::new(size_of(c), cfg.slab_size) })
            .collect();
        let class_raw = |size: usize| {
            if size < cfg.granule {
                size.div_ceil(cfg.min_slot)
            } else {
                tiny + size.div_ceil(cfg.granule)
            }
        };
        let by16: Box<[SlotOf]> = (0..=cfg.slab_size / 16)
            .map(|i| {
                let c = class_raw(i * 16);
                SlotOf { class: c as u32, size: if c == 0 { 0 } else { size_of(c) as u32 } }
            })
            .collect();
        let mut root = Region::new(classes);
        root.alive = true;
        root.key = RegionId::ROOT.get();
        Ok(RegionAllocator {
            slab_shift: cfg.slab_size.trailing_zeros(),
            page_mask: cfg.page_size - 1,
            spp: cfg.page_size / cfg.slab_size,
            wps: (cfg.slab_size / cfg.min_slot).div_ceil(64),
            granule_shift: cfg.granule.trailing_zeros(),
            min_shift: cfg.min_slot.trailing_zeros(),
            tiny,
            by16,
            shapes,
            pages: Vec::new(),
            free_pages: Vec::new(),
            chunks: Vec::new(),
            map: PageMap::new(cfg.page_size),
            slabs: Vec::new(),
            bits: vec![0; 1],
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

    /// Index in `bits` of word `w` of slab `sid`.
    #[inline]
    pub(crate) fn word_index(&self, sid: u32, w: usize) -> usize {
        1 + sid as usize * self.wps + w
    }

    /// The `wps` bitmap words of slab `sid` (words past its shape's are 0).
    pub(crate) fn bitmap(&self, sid: u32) -> &[u64] {
        let i = self.word_index(sid, 0);
        &self.bits[i..i + self.wps]
    }

    /// [`bitmap`](Self::bitmap), to change.
    pub(crate) fn bitmap_mut(&mut self, sid: u32) -> &mut [u64] {
        let i = self.word_index(sid, 0);
        &mut self.bits[i..i + self.wps]
    }

    /// Free slots of slab `sid` (a slab of slots), from its bitmap.
    pub(crate) fn free_count(&self, sid: u32) -> u32 {
        slab::count_free(self.bitmap(sid))
    }

    /// Live objects in slab `sid` (a slab of slots).
    pub(crate) fn live_count(&self, sid: u32) -> u32 {
        self.shapes[self.slabs[sid as usize].class as usize].slots - self.free_count(sid)
    }

    /// The class of a request of `size` bytes (`size <= slab size`; 0
    /// for 0): the smallest slot that holds it.
    #[inline(always)]
    fn class_raw(&self, size: usize) -> usize {
        if size < self.cfg.granule {
            (size + self.cfg.min_slot - 1) >> self.min_shift
        } else {
            self.tiny + ((size + self.cfg.granule - 1) >> self.granule_shift)
        }
    }

    #[inline]
    pub(crate) fn class_of(&self, size: usize) -> usize {
        self.class_raw(size.max(1))
    }

    pub(crate) fn slot_size(&self, class: u16) -> usize {
        self.shapes[class as usize].size as usize
    }

    /// The slot a request of `size` bytes gets: its size in bytes, or
    /// `None` for a request larger than a slab (it spans whole slabs).
    /// Sizes below the granule round up to a multiple of the smallest slot,
    /// larger ones to a multiple of the granule.
    pub fn slot_size_for(&self, size: usize) -> Option<usize> {
        (size <= self.cfg.slab_size).then(|| self.slot_size(self.class_of(size) as u16))
    }

    /// For tests: the class and slot size of a request of `size` bytes
    /// (`size <= slab size`) as the allocation fast path finds them in
    /// `by16`, and as `class_raw` and the class table give them; and the
    /// length of `by16`.
    #[cfg(test)]
    pub(crate) fn slot_lookups(&self, size: usize) -> ((usize, usize), (usize, usize), usize) {
        let t = self.by16[(size + 15) >> 4];
        let c = self.class_raw(size);
        ((t.class as usize, t.size as usize), (c, self.slot_size(c as u16)), self.by16.len())
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
                self.regions.push(Region::new(self.shapes.len()));
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
        let classes = self.shapes.len();
        {
            let r = &mut self.regions[slot];
            if r.sizes.len() != classes {
                r.sizes = vec![SizeList::EMPTY; classes].into_boxed_slice();
            }
            debug_assert!(!r.alive && r.sizes.iter().all(|l| l.head == NIL && l.word == NO_WORD));
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
            r.sizes.iter_mut().for_each(|l| *l = SizeList::EMPTY);
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
        let shift = self.slab_shift;
        // The run of released slabs being collected: (start, slabs); 0 slabs
        // is none.  Runs go to the free ranges whole.
        let (mut run_at, mut run_n) = (0usize, 0usize);
        for &(addr, n) in &owned {
            let mut i = 0;
            while i < n {
                // One page-map lookup per page; slab indices are consecutive within a page.
                let a0 = addr + (i << shift);
                let in_page = (self.spp - ((a0 & self.page_mask) >> shift)).min(n - i);
                let Some(first) = self.slab_of(a0) else {
                    // A page `trim` gave back (every slab of it was free, so
                    // none of it is this region's any more): the range is
                    // stale there.
                    i += in_page;
                    continue;
                };
                let first = first as usize;
                debug_assert_eq!(first % self.spp, (a0 & self.page_mask) >> shift);
                if run_n != 0 && run_at + (run_n << shift) != a0 {
                    self.free.insert(run_at, run_n);
                    run_n = 0;
                }
                for (k, sl) in self.slabs[first..first + in_page].iter_mut().enumerate() {
                    if sl.region == me && sl.state != state::FREE {
                        let a = a0 + (k << shift);
                        // As `Slab::free_at`; the address stays.  (Class 0
                        // matters: the free fast path sends a slab of class
                        // 0 to the slow path without looking at its state.)
                        *sl = Slab::free_at(sl.addr);
                        debug_assert_eq!(sl.addr, a);
                        if run_n == 0 {
                            run_at = a;
                        }
                        run_n += 1;
                    } else if run_n != 0 {
                        self.free.insert(run_at, run_n);
                        run_n = 0;
                    }
                }
                i += in_page;
            }
        }
        if run_n != 0 {
            self.free.insert(run_at, run_n);
        }
        let mut owned = owned;
        owned.clear();
        self.regions[s].owned = owned;
    }

    /// Record that region `ri` took `n` slabs at `addr`.  The caller marks
    /// them as the region's afterwards, so a rebuild of the list (which keeps
    /// only slabs marked so) runs before they are added.
    pub(crate) fn note_owned(&mut self, ri: usize, addr: usize, n: usize) {
        let shift = self.slab_shift;
        let r = &self.regions[ri];
        let held = (r.n_partial + r.n_full + r.n_empty + r.n_span_slabs) as usize + n;
        if r.owned.len() >= 64 && r.owned.len() + 1 > 2 * held {
            self.rebuild_owned(ri);
        }
        let r = &mut self.regions[ri];
        match r.owned.last_mut() {
            Some((a, k)) if *a + (*k << shift) == addr => *k += n,
            _ => r.owned.push((addr, n)),
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
                // (No slab: a page `trim` gave back, whose slabs were all free.)
                let Some(sid) = self.slab_of(a) else { continue };
                let sl = &self.slabs[sid as usize];
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
    /// a slab come from slots (see [`slot_size_for`](Self::slot_size_for)),
    /// aligned to the largest power of two dividing the slot size (at least
    /// the smallest slot, 16 B by default); larger ones span consecutive
    /// slabs (slab-aligned).
    ///
    /// Always inlined: the fast path is a few instructions and everything
    /// else is one call, so a caller's loop keeps it in place whatever the
    /// compiler decides about the loop (left to `#[inline]`, a loop whose
    /// size is a constant got it inlined and the same loop over varying
    /// sizes a call per object).
    #[inline(always)]
    pub fn alloc(&mut self, size: usize, rid: RegionId) -> Result<NonNull<u8>, RegionError> {
        // Fast path: a live region, a small size, and a cursor word with a
        // free slot.  Everything else (no cursor, size 0 or above a slab, a
        // bad id) is `alloc_slow`, out of line.
        let s = rid.slot();
        if matches!(self.regions.get(s), Some(r) if r.key == rid.get()) {
            if let Some(p) = self.take_slot(s, size) {
                return Ok(p);
            }
        }
        self.alloc_slow(size, rid)
    }

    /// The fast path of allocation in the live region of slot `s`: the
    /// lowest free bit of the cursor word of the request's slot size, or
    /// `None` when there is no cursor (or the size is 0 or above a slab).
    /// The same code as `InRegion::alloc_fast` ([`FastView::take`]).
    #[inline(always)]
    fn take_slot(&mut self, s: usize, size: usize) -> Option<NonNull<u8>> {
        debug_assert!(s < self.regions.len() && self.regions[s].alive, "take_slot on a dead region slot {s}");
        debug_assert!(size == 0 || size > usize::MAX - 15 || self.by16.get((size + 15) >> 4).map_or(true, |o| (o.class as usize, o.size as usize) == (self.class_raw(size), self.slot_size(self.class_raw(size) as u16))));
        // SAFETY: callers pass the slot of a live region (`alloc` checked
        // its key), so the view is of current tables.
        let view = FastView {
            by16: self.by16.as_ptr(),
            by16_len: self.by16.len(),
            sizes: unsafe { self.regions.get_unchecked_mut(s) }.sizes.as_mut_ptr(),
            bits: self.bits.as_mut_ptr(),
        };
        // SAFETY: the view was just taken from the allocator's tables.
        let p = unsafe { view.take(size) }?;
        self.stats.allocs += 1;
        Some(p)
    }

    /// Allocation in region `rid` without checking the id on every call:
    /// the id is checked once, here, and the returned [`InRegion`] borrows
    /// the allocator, so the region cannot be freed while it exists.  Its
    /// `alloc` is this allocator's `alloc` less the id check, for loops that
    /// allocate many objects in one region.
    ///
    /// ```
    /// use canopy_region::{RegionAllocator, RegionId};
    ///
    /// let mut ra = RegionAllocator::new();
    /// let r = ra.ralloc(RegionId::ROOT, 0)?;
    /// let mut inr = ra.in_region(r)?;
    /// let ps: Vec<_> = (0..100).map(|_| inr.alloc(24)).collect::<Result<_, _>>()?;
    /// inr.free(ps[0])?;
    /// assert_eq!(inr.allocator().region_stats(r)?.objects, 99);
    /// ra.rfree(r)?;
    /// # Ok::<(), canopy_region::RegionError>(())
    /// ```
    pub fn in_region(&mut self, rid: RegionId) -> Result<InRegion<'_>, RegionError> {
        let slot = self.slot_of(rid)?;
        let view = FastView::of(self, slot);
        Ok(InRegion { ra: self, slot, rid, view })
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

    /// A slot of `class` for region `ri` when the fast path found none: the
    /// cursor is `NO_WORD`, or on the word the fast path emptied, which moves
    /// it on first.  Then: a slot of the cursor's word; or the cursor set
    /// on the head of the partial list and a slot from it; or slot 0 of a new
    /// slab if the list is empty.  The word a slot is taken from keeps the
    /// cursor even if that empties it, as on the fast path.
    fn alloc_small(&mut self, ri: usize, class: usize) -> Result<usize, RegionError> {
        debug_assert!(class > 0 && class < self.shapes.len() && ri < self.regions.len() && self.regions[ri].alive);
        // SAFETY: callers pass a live region's slot (`slot_of`, or an
        // `InRegion`'s) and a class below `classes`, the length of every
        // region's `sizes`; a cursor word is NO_WORD (index 0) or a word of a
        // slab in `bits` (`SizeList` invariant).
        let (w, wv) = unsafe {
            let w = self.regions.get_unchecked(ri).sizes.get_unchecked(class).word;
            (w, *self.bits.get_unchecked(w as usize))
        };
        if w != NO_WORD {
            // (A cursor with a free slot comes here for a size-0 request,
            // whose class is the smallest one's but not on its fast path.)
            if wv == 0 {
                if let Some(addr) = self.step_cursor(ri, class, w as usize) {
                    return Ok(addr);
                }
                self.cursor_exhausted(ri, class);
            }
            let l = self.regions[ri].sizes[class];
            if l.word != NO_WORD {
                let (bit, _) =
                    slab::take_lowest(&mut self.bits[l.word as usize]).expect("a cursor set on a word has a free slot");
                return Ok(l.base + bit as usize * self.slot_size(class as u16));
            }
        }
        let sid = self.regions[ri].sizes[class].head;
        if sid == NIL {
            // A fresh slab: every slot free, so slot 0 (bit 0 of word 0)
            // is the lowest, and the cursor goes on word 0 without a look.
            let (sid, w) = self.new_partial(ri, class)?;
            let addr = self.slabs[sid as usize].addr;
            let word = &mut self.bits[w];
            debug_assert!(*word & 1 == 1, "a fresh slab has slot 0 free");
            *word &= !1;
            let l = &mut self.regions[ri].sizes[class];
            l.word = w as u32;
            l.base = addr;
            return Ok(addr);
        }
        debug_assert!(
            self.slabs[sid as usize].state == state::PARTIAL
                && self.slabs[sid as usize].region == ri as u32
                && self.slabs[sid as usize].class as usize == class,
            "partial list of region slot {ri} class {class} holds a wrong slab"
        );
        self.set_cursor(ri, class, sid);
        let l = self.regions[ri].sizes[class];
        let (bit, _) = slab::take_lowest(&mut self.bits[l.word as usize]).expect("a partial slab has a free slot");
        Ok(l.base + bit as usize * self.slot_size(class as u16))
    }

    /// The cursor word `w` of (`ri`, `class`) has no free slot: the two
    /// common next steps of a region being filled, [`next_word`] and
    /// [`swap_filled_head`].
    ///
    /// [`next_word`]: Self::next_word
    /// [`swap_filled_head`]: Self::swap_filled_head
    #[inline]
    fn step_cursor(&mut self, ri: usize, class: usize, w: usize) -> Option<usize> {
        debug_assert_eq!(self.bits[w], 0);
        if let Some(addr) = self.next_word(ri, class, w) {
            return Some(addr);
        }
        self.swap_filled_head(ri, class)
    }

    /// The cursor word `w` of (`ri`, `class`), a word of the head slab, has
    /// no free slot and the next word of that slab has one (a slab being
    /// filled word by word): move the cursor there and take its lowest free
    /// slot.  `None`, with nothing changed, for a slab of one word, at the
    /// slab's last word, or when the next word is full too
    /// (`cursor_exhausted` then looks at every word).
    #[inline]
    fn next_word(&mut self, ri: usize, class: usize, w: usize) -> Option<usize> {
        let shape = self.shapes[class];
        if shape.words == 1 {
            return None;
        }
        let l = &mut self.regions[ri].sizes[class];
        let first = 1 + l.head as usize * self.wps; // word_index(head, 0)
        debug_assert!(l.head != NIL && (first..first + shape.words as usize).contains(&w), "cursor off its head slab");
        let nw = w + 1;
        if nw - first >= shape.words as usize {
            return None;
        }
        let (rest, bit) = slab::take_lowest_bits(self.bits[nw])?;
        self.bits[nw] = rest;
        l.word = nw as u32;
        l.base += 64 * shape.size as usize;
        Some(l.base + bit as usize * shape.size as usize)
    }

    /// The common case of a region growing through one slot size, in one
    /// step: the head of the partial list of (`ri`, `class`) is a slab that
    /// the fast path filled (every word of its slot size 0), it is the only
    /// partial slab, and the region has an empty slab at hand.  The head goes
    /// to the full list, the empty slab becomes the head with every slot free
    /// but slot 0, which is returned, and the cursor goes on its first word.
    /// `None`, with nothing changed, in any other case (`cursor_exhausted`
    /// and the general path then do the same in several steps).
    #[inline]
    fn swap_filled_head(&mut self, ri: usize, class: usize) -> Option<usize> {
        let shape = self.shapes[class];
        let wps = self.wps;
        let r = &mut self.regions[ri];
        let old = r.sizes[class].head;
        let new = r.empty;
        if new == NIL || old == NIL {
            return None;
        }
        let slabs = self.slabs.as_mut_ptr();
        let bits = self.bits.as_mut_ptr();
        debug_assert!(
            (old as usize) < self.slabs.len()
                && (new as usize) < self.slabs.len()
                && self.bits.len() == 1 + self.slabs.len() * wps
                && wps >= shape.words as usize,
            "swap_filled_head: slab ids or tables out of step"
        );
        // SAFETY (every access through `slabs` and `bits` below): `old` is the
        // head of a partial list, `new` the head of the region's empty list,
        // `full` and `next` are the heads or links of lists of the region:
        // all ids of slabs in the table (the lists' invariant, checked by
        // `check`), so below `slabs.len()`; a slab's bitmap is the `wps`
        // words from `word_index(id, 0)`, inside `bits` (1 + slabs × wps
        // words); `shape.words <= wps`.  The table is not resized here.
        unsafe {
            if (*slabs.add(old as usize)).next != NIL {
                return None;
            }
            let ow = 1 + old as usize * wps; // word_index(old, 0)
            // (A slab of one word: its word is the cursor's, which the caller
            // found empty.)
            debug_assert!(shape.words > 1 || *bits.add(ow) == 0);
            if shape.words > 1 && (0..shape.words as usize).any(|i| *bits.add(ow + i) != 0) {
                return None;
            }
            debug_assert!((*slabs.add(old as usize)).state == state::PARTIAL && (*slabs.add(old as usize)).prev == NIL);
            // The filled head onto the full list.
            let full = r.full;
            let o = &mut *slabs.add(old as usize);
            o.next = full;
            o.state = state::FULL;
            if full != NIL {
                (*slabs.add(full as usize)).prev = old;
            }
            r.full = old;
            r.n_full += 1;
            // The first empty slab off its list, as the partial list's only slab.
            let sn = &mut *slabs.add(new as usize);
            let next = sn.next;
            let addr = sn.addr;
            *sn = Slab { addr, region: ri as u32, prev: NIL, next: NIL, span: 0, class: class as u16, state: state::PARTIAL };
            if next != NIL {
                (*slabs.add(next as usize)).prev = NIL;
            }
            r.empty = next;
            r.n_empty -= 1;
            // Every slot free but slot 0, the slab's words past its slots 0.
            let w = 1 + new as usize * wps; // word_index(new, 0)
            let words = core::slice::from_raw_parts_mut(bits.add(w), wps);
            if shape.words == 1 {
                // (The common case, 64 B slots and up in 4 KiB slabs, spelled
                // out: `fill`'s select per word costs more than the stores, and
                // a loop over the other words becomes a call to memset.)
                match words {
                    [a, b, c, d] => {
                        // The default shape: 16 B slots at least in 4 KiB slabs.
                        (*a, *b, *c, *d) = (shape.last_full & !1, 0, 0, 0);
                    }
                    [first, rest @ ..] => {
                        *first = shape.last_full & !1;
                        rest.fill(0);
                    }
                    [] => unreachable!("a slab has a bitmap word"),
                }
            } else {
                shape.fill(words);
                words[0] &= !1;
            }
            let l = &mut r.sizes[class];
            l.head = new;
            l.word = w as u32;
            l.base = addr;
            Some(addr)
        }
    }

    /// Point the cursor of (`ri`, `class`) at the first word of slab `sid`
    /// (the head of the partial list) with a free slot.  False, with the
    /// cursor `NO_WORD`, if the slab has none.
    fn set_cursor(&mut self, ri: usize, class: usize, sid: u32) -> bool {
        let first = self.word_index(sid, 0);
        // Only the class's words can have free slots (`fill` clears the rest).
        let words = self.shapes[class].words as usize;
        let w = slab::first_free_word(&self.bitmap(sid)[..words]);
        let addr = self.slabs[sid as usize].addr;
        let size = self.slot_size(class as u16);
        let l = &mut self.regions[ri].sizes[class];
        match w {
            Some(w) => {
                l.word = (first + w) as u32;
                l.base = addr + w * 64 * size;
                true
            }
            None => {
                l.word = NO_WORD;
                false
            }
        }
    }

    /// The cursor word of (`ri`, `class`) has no free slot left: move the
    /// cursor to another word of the head slab, or move the slab, now full,
    /// to the full list and the cursor on to the next partial slab.  With no
    /// partial slab left the cursor is `NO_WORD`: the slow path makes one (a
    /// partial slab always has a live object, so it is not made before it is
    /// needed).  It only relinks slabs and moves the cursor: the slab, bitmap
    /// and region tables stay where they are.
    #[cold]
    #[inline(never)]
    fn cursor_exhausted(&mut self, ri: usize, class: usize) {
        let sid = self.regions[ri].sizes[class].head;
        // A slab of one bitmap word is full now; otherwise look for another
        // word with a free slot (a free may have released one below).
        if self.shapes[class].words > 1 && self.set_cursor(ri, class, sid) {
            return;
        }
        self.slab_filled(ri, class, sid);
        let next = self.regions[ri].sizes[class].head;
        if next != NIL {
            self.set_cursor(ri, class, next);
        }
    }

    /// Slab `sid`, the head of the partial list of (`ri`, `class`), has no
    /// free slot: move it to the full list.
    fn slab_filled(&mut self, ri: usize, class: usize, sid: u32) {
        self.partial_unlink(ri, class, sid);
        let r = &mut self.regions[ri];
        push(&mut self.slabs, &mut r.full, sid);
        self.slabs[sid as usize].state = state::FULL;
        r.n_full += 1;
    }

    /// Put slab `sid` at the head of the partial list of (`ri`, `class`)
    /// (the cursor moves to it on the next allocation).
    pub(crate) fn partial_push(&mut self, ri: usize, class: usize, sid: u32) {
        // A head the fast path filled goes to the full list first: below
        // the head every partial slab has a free slot.
        let w = self.regions[ri].sizes[class].word;
        if w != NO_WORD && self.bits[w as usize] == 0 {
            self.cursor_exhausted(ri, class);
        }
        let r = &mut self.regions[ri];
        let l = &mut r.sizes[class];
        push(&mut self.slabs, &mut l.head, sid);
        l.word = NO_WORD;
        r.n_partial += 1;
    }

    /// Take slab `sid` off the partial list of (`ri`, `class`).
    fn partial_unlink(&mut self, ri: usize, class: usize, sid: u32) {
        let r = &mut self.regions[ri];
        let l = &mut r.sizes[class];
        if l.head == sid {
            l.word = NO_WORD;
        }
        unlink(&mut self.slabs, &mut l.head, sid);
        r.n_partial -= 1;
    }

    /// Give region `ri`, whose partial list of `class` is empty, a fresh
    /// slab of `class` as the only slab of that list, from its empty slabs
    /// (taking more first if it has none).  Returns the slab and the index in
    /// `bits` of its first word; the cursor stays `NO_WORD`.
    #[inline]
    fn new_partial(&mut self, ri: usize, class: usize) -> Result<(u32, usize), RegionError> {
        if self.regions[ri].empty == NIL {
            self.take_empty(ri, class)?;
        }
        let shape = self.shapes[class];
        let wps = self.wps;
        let r = &mut self.regions[ri];
        debug_assert!(r.sizes[class].head == NIL && r.sizes[class].word == NO_WORD);
        let slabs = &mut self.slabs[..];
        let sid = r.empty;
        // Off the empty list (its head) and onto the partial list, the
        // slab's record written once...
        let s = &mut slabs[sid as usize];
        let next = s.next;
        *s = Slab { addr: s.addr, region: ri as u32, prev: NIL, next: NIL, span: 0, class: class as u16, state: state::PARTIAL };
        if next != NIL {
            slabs[next as usize].prev = NIL;
        }
        r.empty = next;
        r.n_empty -= 1;
        r.sizes[class].head = sid;
        r.n_partial += 1;
        // ...with every slot free, and the slab's words past them 0.
        let w = 1 + sid as usize * wps; // word_index(sid, 0)
        shape.fill(&mut self.bits[w..w + wps]);
        Ok((sid, w))
    }

    /// Region `ri` has no empty slab: take a group of them (up to the high
    /// watermark, contiguous, right after its last ones when possible) onto
    /// its empty list.  `class` is the slot size that needs one (for the
    /// error if memory is exhausted).
    fn take_empty(&mut self, ri: usize, class: usize) -> Result<(), RegionError> {
        let want = self.cfg.high_watermark.max(1);
        let (addr, got) = self.take_slabs(ri, 1, want, self.slot_size(class as u16))?;
        let first = self.slab_of(addr).expect("taken slab is mapped");
        // Slabs of one page have consecutive indexes in the slab table.
        let one_page = (addr & !self.page_mask) == ((addr + ((got - 1) << self.slab_shift)) & !self.page_mask);
        // Onto the empty list in address order: a region filled in one pass
        // then runs through its memory upwards, as hardware prefetchers
        // expect, instead of backwards within each group of slabs taken
        // together.
        let r = &mut self.regions[ri];
        debug_assert!(r.empty == NIL, "take_empty: the region has empty slabs");
        if one_page {
            // Consecutive records: linked as the whole list in one pass.
            let last = first + got as u32 - 1;
            for (i, sl) in self.slabs[first as usize..=last as usize].iter_mut().enumerate() {
                let sid = first + i as u32;
                sl.state = state::EMPTY;
                sl.region = ri as u32;
                sl.prev = if sid == first { NIL } else { sid - 1 };
                sl.next = if sid == last { NIL } else { sid + 1 };
            }
            r.empty = first;
            r.n_empty += got as u32;
            return Ok(());
        }
        // Pushed last to first.
        for i in (0..got).rev() {
            let s = if one_page {
                first + i as u32
            } else {
                self.slab_of(addr + (i << self.slab_shift)).expect("taken slab is mapped")
            };
            debug_assert_eq!(Some(s), self.slab_of(addr + (i << self.slab_shift)));
            let r = &mut self.regions[ri];
            self.slabs[s as usize].state = state::EMPTY;
            self.slabs[s as usize].region = ri as u32;
            push(&mut self.slabs, &mut r.empty, s);
            r.n_empty += 1;
        }
        Ok(())
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
        if self.stats.pages.saturating_add(pages) > self.cfg.max_pages || !self.words_fit(pages) {
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

    /// Whether `pages` more pages keep every bitmap word index within a
    /// `u32` (the cursors store them so).
    fn words_fit(&self, pages: usize) -> bool {
        let slabs = (self.pages.len() + pages).saturating_mul(self.spp);
        slabs.saturating_mul(self.wps) < u32::MAX as usize
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
                    self.bits.resize(1 + self.slabs.len() * self.wps, 0);
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
        if self.stats.pages.saturating_add(pages) > self.cfg.max_pages || !self.words_fit(pages) {
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
        let Some(sid) = self.slab_of(a) else { return Err(RegionError::NotOwned(a)) };
        // SAFETY: `slab_of` gives page index * slabs per page + slab in page,
        // for a page recorded in the page map; the slab table has
        // `pages.len() * spp` entries.
        let s = unsafe { &*self.slabs.as_ptr().add(sid as usize) };
        // A slab of slots has a class in 1..classes; every other slab has
        // class 0, whose shape is `SlotShape::EMPTY`: its magic 0 makes
        // `start` false, so the test below sends it to `free_slow` without
        // a look at its state.
        // SAFETY: classes are < shapes.len() (the slot sizes of a slab).
        let shape = unsafe { self.shapes.get_unchecked(s.class as usize) };
        // The slot `a` starts, without a division: off < slab size <= 1 MiB
        // (within `slab::MAX_SLAB`), so the shape's multiplier is exact.
        // This is `SlotShape::locate` with its two tests kept as branches:
        // as one `Option` they compile to a flag and a test more, and the
        // shape borrowed (not copied) saves a register.
        let off = a - s.addr;
        let (idx, start) = slab::split(shape.magic, off);
        debug_assert!(
            s.class == 0
                || (idx, start) == (off / shape.size as usize, off % shape.size as usize == 0)
        );
        if start && idx < shape.slots as usize {
            let i = self.word_index(sid, idx / 64);
            // SAFETY: idx < slots <= 64 * wps, so the word is the slab's own.
            let word = unsafe { &mut *self.bits.as_mut_ptr().add(i) };
            if let Ok(x) = slab::release(word, idx) {
                let now = *word;
                self.stats.frees += 1;
                // A word that had no free slot may be a full slab's (it
                // turns partial); a word with every slot free may be an
                // empty slab's.
                if x == 0 || shape.may_be_empty(now) {
                    self.slab_may_move(sid);
                }
                return Ok(());
            }
        }
        self.free_slow(sid, a)
    }

    /// Frees of spanning objects, and every bad free.
    #[cold]
    #[inline(never)]
    fn free_slow(&mut self, sid: u32, a: usize) -> Result<(), RegionError> {
        let s = self.slabs[sid as usize];
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
        let shape = self.shapes[s.class as usize];
        let size = shape.size as usize;
        let (idx, start) = slab::split(shape.magic, a - s.addr);
        if idx >= shape.slots as usize {
            return Err(RegionError::Invalid(format!(
                "{a:#x} is in the unused tail of a slab of {size} B slots in region {}, past its last slot",
                self.rid(s.region)
            )));
        }
        if slab::is_free(self.bits[self.word_index(sid, idx / 64)], idx) {
            return Err(RegionError::NotAllocated { ptr: a, region: self.rid(s.region) });
        }
        if !start {
            return Err(RegionError::Interior { ptr: a, object: s.addr + idx * size, region: self.rid(s.region) });
        }
        Ok(idx)
    }

    /// A free made a full slab partial, or filled a bitmap word with free
    /// slots: move the slab to the list its free slots call for.
    #[cold]
    #[inline(never)]
    fn slab_may_move(&mut self, sid: u32) {
        let s = self.slabs[sid as usize];
        let (ri, class) = (s.region as usize, s.class as usize);
        let empty = self.shapes[class].is_all_free(self.bitmap(sid));
        debug_assert!(s.state == state::PARTIAL || s.state == state::FULL);
        if s.state == state::FULL {
            let r = &mut self.regions[ri];
            unlink(&mut self.slabs, &mut r.full, sid);
            r.n_full -= 1;
            if !empty {
                self.slabs[sid as usize].state = state::PARTIAL;
                self.partial_push(ri, class, sid);
            }
        } else if empty {
            self.partial_unlink(ri, class, sid);
        }
        if empty {
            self.retire_empty(ri, sid);
        }
    }

    /// An emptied slab stays with its region up to the high watermark.
    fn retire_empty(&mut self, ri: usize, sid: u32) {
        debug_assert!(self.slabs[sid as usize].prev == NIL && self.slabs[sid as usize].next == NIL);
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
            self.free.insert_lazy(a);
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
        // As alloc_span refuses it: a slab count this large would wrap the
        // address arithmetic of the in-place growth below.
        if new_size.div_ceil(self.cfg.slab_size) > u32::MAX as usize / 2 {
            return Err(RegionError::SizeTooLarge(new_size));
        }
        if target == from {
            let a = p.as_ptr() as usize;
            if cap <= self.cfg.slab_size && new_size <= self.cfg.slab_size {
                if self.slot_size(self.class_of(new_size) as u16) == cap {
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
            // Checked first: with n == 0 no alloc would check it.
            self.slot_of(rid).and_then(|_| (0..n).try_for_each(|_| self.alloc(size, rid).map(|p| out.push(p))))
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
        let shape = self.shapes[class];
        let size = shape.size as usize;
        let mut left = n;
        while left > 0 {
            let mut sid = self.regions[ri].sizes[class].head;
            if sid == NIL {
                sid = self.new_partial(ri, class)?.0;
            }
            let addr = self.slabs[sid as usize].addr;
            // The slab's words past its shape's are 0: no slot to take there.
            let words = &mut self.bitmap_mut(sid)[..shape.words as usize];
            for (w, word) in words.iter_mut().enumerate() {
                while left > 0 {
                    let Some((bit, _)) = slab::take_lowest(word) else { break };
                    let idx = w * 64 + bit as usize;
                    // SAFETY: slot addresses are inside a mapped slab, never 0.
                    out.push(unsafe { NonNull::new_unchecked((addr + idx * size) as *mut u8) });
                    left -= 1;
                }
                if left == 0 {
                    break;
                }
            }
            // The cursor may point at a word just emptied: set it again.
            if !self.set_cursor(ri, class, sid) {
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
        for h in r.sizes.iter().map(|l| l.head).chain([r.full]) {
            let mut x = h;
            while x != NIL {
                let sl = &self.slabs[x as usize];
                let live = self.live_count(x) as u64;
                objects += live;
                bytes += live * self.slot_size(sl.class) as u64;
                x = sl.next;
            }
        }
        let c = self.counts_of(s);
        Ok(RegionStats {
            id: rid,
            parent: if s == 0 { None } else { Some(self.rid(r.parent)) },
            level_hint: r.level_hint,
            depth: r.depth,
            children: r.children,
            objects,
            bytes,
            full_slabs: c.full,
            partial_slabs: c.partial,
            empty_slabs: c.empty,
            span_slabs: c.span,
        })
    }

    /// The slab counts of [`region_stats`](Self::region_stats) alone, in
    /// time proportional to the number of slot sizes (not to the region's
    /// slabs or objects): for a program that watches a region grow step by
    /// step.
    pub fn slab_counts(&self, rid: RegionId) -> Result<SlabCounts, RegionError> {
        Ok(self.counts_of(self.slot_of(rid)?))
    }

    fn counts_of(&self, s: usize) -> SlabCounts {
        let r = &self.regions[s];
        // A head the fast path filled is still on its partial list until the
        // next allocation of its slot size moves it: count it as full.
        let filled = r.sizes.iter().filter(|l| l.word != NO_WORD && self.bits[l.word as usize] == 0 && self.free_count(l.head) == 0).count() as u32;
        SlabCounts { full: r.n_full + filled, partial: r.n_partial - filled, empty: r.n_empty, span: r.n_span_slabs }
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
        if self.bits.len() != 1 + self.slabs.len() * self.wps || self.bits[NO_WORD as usize] != 0 {
            return Err("the bitmap has the wrong length, or its always-zero word is not 0".into());
        }
        let mut seen = vec![false; self.slabs.len()];
        // A slab's bitmap with every slot free (`SlotShape::fill`).
        let mut all_free = vec![0u64; self.wps];
        for (si, r) in self.regions.iter().enumerate() {
            if !r.alive {
                if r.sizes.iter().any(|l| l.head != NIL || l.word != NO_WORD) || r.full != NIL || r.empty != NIL || r.spans != NIL {
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
                            let free = self.free_count(x);
                            let shape = self.shapes[c];
                            shape.fill(&mut all_free);
                            let stray = self.bitmap(x).iter().zip(&all_free).any(|(&b, &m)| b & !m != 0);
                            // The head of a partial list may be full while the
                            // cursor is on its emptied word (see `SizeList`).
                            let filled_head = want == state::PARTIAL && prev == NIL && class.is_some_and(|k| {
                                let w = r.sizes[k].word;
                                w != NO_WORD && self.bits[w as usize] == 0
                            });
                            let full_ok = (want == state::FULL) == (free == 0) || (filled_head && free == 0);
                            if stray || free >= shape.slots || !full_ok || s.span != 0 {
                                return Err(format!("slab {:#x} ({}): {free} of {} slots free", s.addr, if want == state::FULL { "full" } else { "partial" }, shape.slots));
                            }
                            if want == state::PARTIAL { np += 1 } else { nf += 1 }
                        }
                        state::EMPTY if s.class != 0 => return Err(format!("empty slab {:#x} has class {}", s.addr, s.class)),
                        state::EMPTY => ne += 1,
                        _ if s.class != 0 => return Err(format!("span slab {:#x} has class {}", s.addr, s.class)),
                        _ => {
                            objs += 1;
                            ns += s.span;
                            for i in 1..s.span as usize {
                                let b = self.slab_of(s.addr + (i << self.slab_shift)).ok_or("span body unmapped")?;
                                let bs = &self.slabs[b as usize];
                                if bs.state != state::BODY || bs.class != 0 || bs.span != x || seen[b as usize] || !covered.contains(&bs.addr) {
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
            for (c, l) in r.sizes.iter().enumerate() {
                walk(l.head, state::PARTIAL, Some(c))?;
            }
            for (c, l) in r.sizes.iter().enumerate() {
                if l.word == NO_WORD {
                    continue;
                }
                let w = (l.word as usize).wrapping_sub(self.word_index(l.head, 0));
                // The word may be empty: the fast path leaves the cursor on the
                // word it emptied, for the next allocation to move.
                let ok = l.head != NIL
                    && w < self.wps
                    && l.base == self.slabs[l.head as usize].addr + w * 64 * self.slot_size(c as u16);
                if !ok {
                    return Err(format!("region slot {si}, class {c}: the cursor is not on a word of the partial head"));
                }
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
                if self.slabs[b as usize].state != state::FREE || self.slabs[b as usize].class != 0 || seen[b as usize] {
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

/// Allocation in one region with its id checked once
/// ([`RegionAllocator::in_region`]).  It holds the allocator borrowed
/// mutably, so nothing can free the region (or any other) while it exists.
pub struct InRegion<'a> {
    ra: &'a mut RegionAllocator,
    /// The region's slot: live for as long as `ra` is borrowed.
    slot: usize,
    rid: RegionId,
    /// Raw views of the allocator's tables for the fast path, taken again
    /// after every call that may change them (see [`FastView`]).
    view: FastView,
}

/// The tables the allocation fast path reads, as raw pointers held in the
/// `InRegion` itself: the compiler keeps them in registers across a loop of
/// allocations, where through `&mut RegionAllocator` it reloads each one
/// after every store into a bitmap word.  Only the slow path (growing the
/// allocator reallocates `bits`) changes them, and `InRegion` takes the view
/// again after each call into the allocator.
#[derive(Clone, Copy)]
struct FastView {
    by16: *const SlotOf,
    by16_len: usize,
    sizes: *mut SizeList,
    bits: *mut u64,
}

impl FastView {
    /// The fast path of allocation: the lowest free slot of the cursor word
    /// of `size`'s slot size, or `None` (no free slot under the cursor, size
    /// 0, or a size above a slab).
    ///
    /// # Safety
    /// The view is current: taken from the allocator's tables after the last
    /// call that may have moved them, for a live region.
    #[inline(always)]
    unsafe fn take(&self, size: usize) -> Option<NonNull<u8>> {
        // Size 0 gives class 0, whose cursor is always NO_WORD; a size above
        // the slab (or near usize::MAX, which wraps to index 0) has no entry
        // or class 0.  by16 has an entry for every index up to slab size / 16.
        let g = size.wrapping_add(15) >> 4;
        if g >= self.by16_len {
            return None;
        }
        // SAFETY: g < by16_len; the view is current (caller's contract);
        // class < classes = the region's `sizes` length; a cursor word index
        // is NO_WORD (index 0) or a word of a slab in `bits` (`SizeList`
        // invariant).
        unsafe {
            let SlotOf { class, size: slot } = *self.by16.add(g);
            let l = self.sizes.add(class as usize);
            let word = self.bits.add((*l).word as usize);
            let (rest, bit) = slab::take_lowest_bits(*word)?;
            // A word emptied here keeps the cursor: the next allocation of
            // this slot size moves it on (`alloc_small`).
            *word = rest;
            let addr = (*l).base + bit as usize * slot as usize;
            // Slot addresses are inside pages from the source, never 0.
            Some(NonNull::new_unchecked(addr as *mut u8))
        }
    }

    fn of(ra: &mut RegionAllocator, slot: usize) -> FastView {
        FastView {
            by16: ra.by16.as_ptr(),
            by16_len: ra.by16.len(),
            sizes: ra.regions[slot].sizes.as_mut_ptr(),
            bits: ra.bits.as_mut_ptr(),
        }
    }
}

impl InRegion<'_> {
    /// The region.
    pub fn id(&self) -> RegionId {
        self.rid
    }

    /// Allocate `size` bytes in the region, as
    /// [`RegionAllocator::alloc`] does (and, like it, always inlined: the
    /// fast path with one call for the rest).
    #[inline(always)]
    pub fn alloc(&mut self, size: usize) -> Result<NonNull<u8>, RegionError> {
        match self.alloc_fast(size) {
            Some(p) => Ok(p),
            None => self.alloc_refill(size),
        }
    }

    /// The fast path of [`alloc`](Self::alloc) alone, with no call in it: a
    /// slot of the cursor word of the size's slot size, or `None` (no free
    /// slot under the cursor, size 0, or a size above a slab) for
    /// [`alloc_refill`](Self::alloc_refill).  A caller that keeps the two
    /// apart (the C session) keeps the fast path free of a stack frame.
    #[inline(always)]
    pub(crate) fn alloc_fast(&mut self, size: usize) -> Option<NonNull<u8>> {
        let v = self.view;
        debug_assert!(
            core::ptr::eq(v.bits, self.ra.bits.as_ptr()) && core::ptr::eq(v.sizes, self.ra.regions[self.slot].sizes.as_ptr()),
            "InRegion's view of the allocator's tables is stale"
        );
        // SAFETY: the view is current (taken again after every call into
        // the allocator); the region lives while `self` borrows it.
        let p = unsafe { v.take(size) }?;
        self.ra.stats.allocs += 1;
        Some(p)
    }

    /// [`alloc`](Self::alloc) when [`alloc_fast`](Self::alloc_fast) found
    /// no slot: the next word, a partial slab, or a new one for a slot size
    /// (class 0 is size 0, which goes the slow way), or a spanning object.
    #[inline(never)]
    pub(crate) fn alloc_refill(&mut self, size: usize) -> Result<NonNull<u8>, RegionError> {
        let g = size.wrapping_add(15) >> 4;
        if let Some(&SlotOf { class, .. }) = self.ra.by16.get(g) {
            if class != 0 {
                let r = self.ra.alloc_small(self.slot, class as usize);
                self.view = FastView::of(self.ra, self.slot);
                let a = r?;
                self.ra.stats.allocs += 1;
                // SAFETY: slot addresses are inside pages from the source, never 0.
                return Ok(unsafe { NonNull::new_unchecked(a as *mut u8) });
            }
        }
        let r = self.ra.alloc_slow(size, self.rid);
        self.view = FastView::of(self.ra, self.slot);
        r
    }

    /// Free one object (of this region or any other of the allocator), as
    /// [`RegionAllocator::free`] does.
    #[inline]
    pub fn free(&mut self, p: NonNull<u8>) -> Result<(), RegionError> {
        // A free never reallocates the tables the view holds.
        self.ra.free(p)
    }

    /// The allocator, for reading (statistics, lookups).
    pub fn allocator(&self) -> &RegionAllocator {
        self.ra
    }
}

impl core::fmt::Debug for InRegion<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("InRegion").field("region", &self.rid).finish_non_exhaustive()
    }
}
