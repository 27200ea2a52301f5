//! Packing a region (with its descendants) into (address, length) runs, and
//! unpacking it at the same addresses in another allocator (002 §4.3).
//!
//! A pack has two parts: the runs, which are the region's memory and nothing
//! else (metadata never lives inside slabs), and a small description of the
//! regions and slabs so the receiver can rebuild its metadata.  The
//! description travels as bytes ([`Packed::encode`], [`Packed::decode`]);
//! the runs are copied by whatever transport moves the pack, straight from
//! and into memory.

use std::collections::BTreeSet;

use canopy_alloc::slab;

use crate::allocator::{push, state, RegionAllocator, NIL};
use crate::{RegionError, RegionId};

/// `len` bytes at `addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Run {
    /// First byte.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
}

/// One region of a pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedRegion {
    /// Its id.
    pub id: RegionId,
    /// Its parent; `None` for the pack's top region.
    pub parent: Option<RegionId>,
    /// The level hint it was created with.
    pub level_hint: i32,
}

/// One slab (or spanning object) of a pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PackedSlab {
    /// A slab of equal slots.
    Slots {
        /// Its address.
        addr: usize,
        /// The region it belongs to.
        region: RegionId,
        /// Slot size in bytes.
        slot_size: u32,
        /// One bit per slot: allocated.
        allocated: Vec<u64>,
    },
    /// An object spanning consecutive slabs.
    Span {
        /// Its address.
        addr: usize,
        /// The region it belongs to.
        region: RegionId,
        /// Slabs it spans.
        slabs: u32,
    },
}

impl PackedSlab {
    /// Address of the slab.
    pub fn addr(&self) -> usize {
        match *self {
            PackedSlab::Slots { addr, .. } | PackedSlab::Span { addr, .. } => addr,
        }
    }

    fn region(&self) -> RegionId {
        match *self {
            PackedSlab::Slots { region, .. } | PackedSlab::Span { region, .. } => region,
        }
    }

    fn slabs(&self) -> usize {
        match *self {
            PackedSlab::Slots { .. } => 1,
            PackedSlab::Span { slabs, .. } => slabs as usize,
        }
    }
}

/// A packed region tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    /// Slab size of the sender (the receiver's must match).
    pub slab_size: usize,
    /// Granule of the sender (the receiver's must match).
    pub granule: usize,
    /// The regions, parents before children; the first is the top.
    pub regions: Vec<PackedRegion>,
    /// Slabs in use, in address order.
    pub slabs: Vec<PackedSlab>,
    /// The memory to move, in address order, adjacent slabs coalesced.
    pub runs: Vec<Run>,
}

const MAGIC: &[u8; 8] = b"CNPYRGN1";

/// How many entries unpacking may add to the region table: packed ids keep
/// their slots, and a slot far beyond the table's end would make the
/// receiver create every entry up to it (a hostile description of a few
/// bytes could ask for billions).  Entries never used take no slot-size
/// lists, about 128 bytes each.
pub const MAX_UNPACK_GROWTH: usize = 1 << 20;

impl Packed {
    /// Bytes of memory in the runs.
    pub fn bytes(&self) -> usize {
        self.runs.iter().map(|r| r.len).sum()
    }

    /// The description (everything but the runs' contents) as bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(48 + self.regions.len() * 24 + self.slabs.len() * 32 + self.runs.len() * 16);
        b.extend_from_slice(MAGIC);
        for v in [self.slab_size, self.granule, self.regions.len(), self.slabs.len(), self.runs.len()] {
            b.extend_from_slice(&(v as u64).to_le_bytes());
        }
        for r in &self.regions {
            b.extend_from_slice(&r.id.get().to_le_bytes());
            b.extend_from_slice(&r.parent.map_or(0, RegionId::get).to_le_bytes());
            b.extend_from_slice(&(r.level_hint as i64).to_le_bytes());
        }
        for s in &self.slabs {
            match s {
                PackedSlab::Slots { addr, region, slot_size, allocated } => {
                    b.push(1);
                    b.extend_from_slice(&(*addr as u64).to_le_bytes());
                    b.extend_from_slice(&region.get().to_le_bytes());
                    b.extend_from_slice(&slot_size.to_le_bytes());
                    b.extend_from_slice(&(allocated.len() as u32).to_le_bytes());
                    for w in allocated {
                        b.extend_from_slice(&w.to_le_bytes());
                    }
                }
                PackedSlab::Span { addr, region, slabs } => {
                    b.push(2);
                    b.extend_from_slice(&(*addr as u64).to_le_bytes());
                    b.extend_from_slice(&region.get().to_le_bytes());
                    b.extend_from_slice(&slabs.to_le_bytes());
                    b.extend_from_slice(&0u32.to_le_bytes());
                }
            }
        }
        for r in &self.runs {
            b.extend_from_slice(&(r.addr as u64).to_le_bytes());
            b.extend_from_slice(&(r.len as u64).to_le_bytes());
        }
        b
    }

    /// Read a description written by [`encode`](Self::encode).  Any
    /// truncation, bad tag or impossible count is an error saying where.
    pub fn decode(bytes: &[u8]) -> Result<Packed, RegionError> {
        let mut r = Reader { b: bytes, at: 0 };
        if r.take(8, "magic")? != MAGIC {
            return Err(RegionError::Malformed("bad magic (not a packed Canopy region)".into()));
        }
        let slab_size = r.u64("slab size")? as usize;
        let granule = r.u64("granule")? as usize;
        let nreg = r.count(24, "region count")?;
        let nslab = r.count(25, "slab count")?;
        let nrun = r.count(16, "run count")?;
        let mut regions = Vec::with_capacity(nreg);
        for i in 0..nreg {
            let id = RegionId::from_raw(r.u64("region id")?)
                .ok_or_else(|| RegionError::Malformed(format!("region {i} has id 0")))?;
            let parent = RegionId::from_raw(r.u64("region parent")?);
            let level_hint = r.u64("level hint")? as i64;
            let level_hint = i32::try_from(level_hint)
                .map_err(|_| RegionError::Malformed(format!("region {id}: level hint {level_hint} out of range")))?;
            regions.push(PackedRegion { id, parent, level_hint });
        }
        let mut slabs = Vec::with_capacity(nslab);
        for i in 0..nslab {
            let tag = r.take(1, "slab tag")?[0];
            let addr = r.u64("slab address")? as usize;
            let region = RegionId::from_raw(r.u64("slab region")?)
                .ok_or_else(|| RegionError::Malformed(format!("slab {i} belongs to region 0")))?;
            let n = r.u32("slab size field")?;
            let words = r.u32("bitmap length")? as usize;
            slabs.push(match tag {
                1 => {
                    if words > 64 || words * 8 > r.left() {
                        return Err(RegionError::Malformed(format!("slab {i}: bitmap of {words} words")));
                    }
                    let mut allocated = Vec::with_capacity(words);
                    for _ in 0..words {
                        allocated.push(r.u64("bitmap word")?);
                    }
                    PackedSlab::Slots { addr, region, slot_size: n, allocated }
                }
                2 if words == 0 => PackedSlab::Span { addr, region, slabs: n },
                t => return Err(RegionError::Malformed(format!("slab {i}: unknown tag {t} at byte {}", r.at))),
            });
        }
        let mut runs = Vec::with_capacity(nrun);
        for _ in 0..nrun {
            let addr = r.u64("run address")? as usize;
            let len = r.u64("run length")? as usize;
            runs.push(Run { addr, len });
        }
        if r.left() != 0 {
            return Err(RegionError::Malformed(format!("{} bytes left over after the runs", r.left())));
        }
        Ok(Packed { slab_size, granule, regions, slabs, runs })
    }
}

impl Packed {
    /// Write the pack as one message: the description's length (8 bytes,
    /// little-endian), the description, then the bytes of every run in order.
    /// [`RegionAllocator::unpack_from`] reads it.
    ///
    /// # Safety
    /// The runs must be memory of a live allocator that still holds the
    /// packed regions unchanged (as right after [`RegionAllocator::pack`]).
    pub unsafe fn write_with_data(&self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        let desc = self.encode();
        w.write_all(&(desc.len() as u64).to_le_bytes())?;
        w.write_all(&desc)?;
        for r in &self.runs {
            // SAFETY: the caller guarantees the runs are live memory.
            w.write_all(unsafe { core::slice::from_raw_parts(r.addr as *const u8, r.len) })?;
        }
        Ok(())
    }
}

/// Longest description `unpack_from` accepts.
const MAX_DESCRIPTION: u64 = 1 << 30;

impl RegionAllocator {
    /// Read a message written by [`Packed::write_with_data`] and unpack it
    /// under `parent` (see [`unpack`](Self::unpack)).  A short or malformed
    /// message is an error and leaves the allocator as it was.
    pub fn unpack_from(&mut self, parent: RegionId, r: &mut impl std::io::Read) -> Result<RegionId, RegionError> {
        let mut len = [0u8; 8];
        r.read_exact(&mut len)
            .map_err(|e| RegionError::Malformed(format!("reading the description length: {e}")))?;
        let len = u64::from_le_bytes(len);
        if len > MAX_DESCRIPTION {
            return Err(RegionError::Malformed(format!("description of {len} bytes is longer than {MAX_DESCRIPTION}")));
        }
        let mut desc = vec![0u8; len as usize];
        r.read_exact(&mut desc)
            .map_err(|e| RegionError::Malformed(format!("reading the {len}-byte description: {e}")))?;
        let packed = Packed::decode(&desc)?;
        self.unpack(parent, &packed, |run, mem| {
            r.read_exact(mem).map_err(|e| format!("reading {} bytes: {e}", run.len))
        })
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn left(&self) -> usize {
        self.b.len() - self.at
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], RegionError> {
        if self.left() < n {
            return Err(RegionError::Malformed(format!(
                "truncated at byte {} of {} while reading the {what}",
                self.at,
                self.b.len()
            )));
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn u64(&mut self, what: &str) -> Result<u64, RegionError> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }

    fn u32(&mut self, what: &str) -> Result<u32, RegionError> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }

    /// A count of records of at least `min` bytes each, checked against what is left.
    fn count(&mut self, min: usize, what: &str) -> Result<usize, RegionError> {
        let n = self.u64(what)?;
        if n > (self.left() / min) as u64 {
            return Err(RegionError::Malformed(format!("{what} {n} is more than the message can hold")));
        }
        Ok(n as usize)
    }
}

/// Coalesce address-sorted (address, length) pairs into runs.
fn coalesce(mut v: Vec<(usize, usize)>) -> Vec<Run> {
    v.sort_unstable();
    let mut runs: Vec<Run> = Vec::with_capacity(v.len().min(64));
    for (a, l) in v {
        match runs.last_mut() {
            Some(r) if r.addr + r.len == a => r.len += l,
            _ => runs.push(Run { addr: a, len: l }),
        }
    }
    runs
}

impl RegionAllocator {
    /// The regions of the subtree at `rid`, parents before children.
    fn subtree(&self, rid: RegionId, max_depth: u32) -> Result<Vec<u32>, RegionError> {
        let s = self.slot_of(rid)?;
        let top = self.regions[s].depth;
        let mut order = Vec::new();
        let mut stack = vec![s as u32];
        while let Some(x) = stack.pop() {
            order.push(x);
            if self.regions[x as usize].depth - top >= max_depth {
                continue;
            }
            let mut c = self.regions[x as usize].first_child;
            while c != NIL {
                stack.push(c);
                c = self.regions[c as usize].next_sib;
            }
        }
        Ok(order)
    }

    /// Visit every slab in use (partial, full, span heads) of region slot `s`.
    fn for_each_used_slab(&self, s: u32, mut f: impl FnMut(u32)) {
        let r = &self.regions[s as usize];
        for h in r.sizes.iter().map(|l| l.head).chain([r.full, r.spans]) {
            let mut x = h;
            while x != NIL {
                f(x);
                x = self.slabs[x as usize].next;
            }
        }
    }

    /// The memory of region `rid` and all its descendants as (address,
    /// length) runs in address order, adjacent slabs coalesced.  Empty slabs
    /// kept by the regions are not included.
    pub fn pack_runs(&self, rid: RegionId) -> Result<Vec<Run>, RegionError> {
        self.pack_runs_to_depth(rid, u32::MAX)
    }

    /// [`pack_runs`](Self::pack_runs) of `rid` and its descendants at most
    /// `depth` levels below it (0: the region alone), e.g. the top levels of
    /// a tree kept one region per level.
    pub fn pack_runs_to_depth(&self, rid: RegionId, depth: u32) -> Result<Vec<Run>, RegionError> {
        let mut v = Vec::new();
        for s in self.subtree(rid, depth)? {
            self.for_each_used_slab(s, |x| {
                let sl = &self.slabs[x as usize];
                let n = if sl.state == state::SPAN { sl.span as usize } else { 1 };
                v.push((sl.addr, n << self.slab_shift));
            });
        }
        Ok(coalesce(v))
    }

    /// Pack region `rid` and its descendants: the runs plus the description
    /// a receiver needs to rebuild them.
    pub fn pack(&self, rid: RegionId) -> Result<Packed, RegionError> {
        self.pack_to_depth(rid, u32::MAX)
    }

    /// [`pack`](Self::pack) of `rid` and its descendants at most `depth`
    /// levels below it (0: the region alone).
    pub fn pack_to_depth(&self, rid: RegionId, depth: u32) -> Result<Packed, RegionError> {
        let order = self.subtree(rid, depth)?;
        let mut regions = Vec::with_capacity(order.len());
        let mut slabs = Vec::new();
        let mut v = Vec::new();
        for (i, &s) in order.iter().enumerate() {
            let r = &self.regions[s as usize];
            let id = r.id(s as usize);
            let parent = if i == 0 { None } else { Some(self.regions[r.parent as usize].id(r.parent as usize)) };
            regions.push(PackedRegion { id, parent, level_hint: r.level_hint });
            self.for_each_used_slab(s, |x| {
                let sl = &self.slabs[x as usize];
                if sl.state == state::SPAN {
                    v.push((sl.addr, (sl.span as usize) << self.slab_shift));
                    slabs.push(PackedSlab::Span { addr: sl.addr, region: id, slabs: sl.span });
                } else {
                    v.push((sl.addr, 1 << self.slab_shift));
                    // As many words as the slab's slots need (a slab of
                    // 64 B slots one, of 16 B slots four): every slot, less
                    // the free ones.
                    let shape = self.shapes[sl.class as usize];
                    let mut allocated = vec![0u64; shape.words as usize];
                    shape.fill(&mut allocated);
                    for (a, &free) in allocated.iter_mut().zip(self.bitmap(x)) {
                        *a &= !free;
                    }
                    slabs.push(PackedSlab::Slots {
                        addr: sl.addr,
                        region: id,
                        slot_size: self.slot_size(sl.class) as u32,
                        allocated,
                    });
                }
            });
        }
        slabs.sort_unstable_by_key(PackedSlab::addr);
        Ok(Packed { slab_size: self.cfg.slab_size, granule: self.cfg.granule, regions, slabs, runs: coalesce(v) })
    }

    /// Rebuild a packed region tree at the same addresses, under `parent`.
    ///
    /// The regions keep their ids (ids are global in the global address
    /// space); a pack of the root puts its objects and children into this
    /// allocator's root.  Memory at the pack's addresses is taken from the
    /// page source (which must be able to place pages, like a
    /// [`FixedRange`](crate::FixedRange) at the sender's base) or must be
    /// free here.  `fill` is called once per run with the memory to fill
    /// (the transport copies the sender's bytes there).
    ///
    /// Everything is checked before anything changes; if `fill` fails, the
    /// memory is released again and nothing else has changed (pages taken
    /// from the source stay with this allocator, free).
    pub fn unpack(
        &mut self,
        parent: RegionId,
        packed: &Packed,
        mut fill: impl FnMut(Run, &mut [u8]) -> Result<(), String>,
    ) -> Result<RegionId, RegionError> {
        let ps = self.slot_of(parent)?;
        self.validate_pack(packed, ps)?;
        // Claim pages this allocator does not have yet.
        let mut need_pages = BTreeSet::new();
        let page = self.cfg.page_size;
        for s in &packed.slabs {
            let end = s.addr() + (s.slabs() << self.slab_shift);
            let mut p = s.addr() & !(page - 1);
            while p < end {
                if self.map.get(p).is_none() {
                    need_pages.insert(p);
                }
                p += page;
            }
        }
        for &p in &need_pages {
            self.claim_pages_at(p, 1)?;
        }
        for s in &packed.slabs {
            let ok = self.free.take_exact(s.addr(), s.slabs());
            assert!(ok, "validated as free");
        }
        for &run in &packed.runs {
            // SAFETY: every slab of every run was just taken out of the free
            // ranges, so this allocator owns the bytes and nothing uses them.
            let mem = unsafe { core::slice::from_raw_parts_mut(run.addr as *mut u8, run.len) };
            if let Err(e) = fill(run, mem) {
                for s in &packed.slabs {
                    self.free.insert(s.addr(), s.slabs());
                }
                return Err(RegionError::Unpack(format!("filling the run at {:#x}: {e}", run.addr)));
            }
        }
        // Regions.
        let top = &packed.regions[0];
        let top_slot = if top.id == RegionId::ROOT { 0 } else { self.revive(top.id, ps, top.level_hint) };
        for r in &packed.regions[1..] {
            self.revive(r.id, r.parent.expect("validated").slot(), r.level_hint);
        }
        // Slabs.
        for s in &packed.slabs {
            let ri = s.region().slot();
            self.note_owned(ri, s.addr(), s.slabs());
            let sid = self.slab_of(s.addr()).expect("claimed") as usize;
            match s {
                PackedSlab::Slots { slot_size, allocated, .. } => {
                    let class = self.class_of(*slot_size as usize) as u16;
                    // Every slot free (the words past them 0), less the
                    // allocated ones (validated: none past the slots).
                    let shape = self.shapes[class as usize];
                    let words = self.bitmap_mut(sid as u32);
                    shape.fill(words);
                    for (x, &a) in words.iter_mut().zip(allocated) {
                        *x &= !a;
                    }
                    let full = slab::count_free(words) == 0;
                    let sl = &mut self.slabs[sid];
                    sl.region = ri as u32;
                    sl.class = class;
                    sl.span = 0;
                    sl.state = if full { state::FULL } else { state::PARTIAL };
                    if full {
                        let r = &mut self.regions[ri];
                        push(&mut self.slabs, &mut r.full, sid as u32);
                        r.n_full += 1;
                    } else {
                        self.partial_push(ri, class as usize, sid as u32);
                    }
                }
                PackedSlab::Span { addr, slabs, .. } => {
                    for i in 1..*slabs as usize {
                        let b = self.slab_of(addr + (i << self.slab_shift)).expect("claimed") as usize;
                        self.slabs[b].state = state::BODY;
                        self.slabs[b].span = sid as u32;
                        self.slabs[b].region = ri as u32;
                    }
                    let sl = &mut self.slabs[sid];
                    sl.state = state::SPAN;
                    sl.span = *slabs;
                    sl.region = ri as u32;
                    let r = &mut self.regions[ri];
                    push(&mut self.slabs, &mut r.spans, sid as u32);
                    r.n_span_slabs += slabs;
                    r.span_objects += 1;
                }
            }
        }
        #[cfg(debug_assertions)]
        if let Err(e) = self.check() {
            panic!("region allocator inconsistent after unpack: {e}");
        }
        Ok(self.regions[top_slot].id(top_slot))
    }

    /// Bring region `id` to life in its own slot under slot `p`.
    fn revive(&mut self, id: RegionId, p: usize, level_hint: i32) -> usize {
        let slot = id.slot();
        while self.regions.len() <= slot {
            self.regions.push(crate::allocator::Region::new_dead());
            let s = self.regions.len() - 1;
            if s != slot {
                self.free_slots_push(s as u32);
            }
        }
        self.free_slots_remove(slot as u32);
        self.regions[slot].gen = id.gen();
        self.attach(slot, p, level_hint);
        self.stats.regions_created += 1;
        slot
    }

    /// Check a pack against this allocator without changing anything.
    fn validate_pack(&self, p: &Packed, parent_slot: usize) -> Result<(), RegionError> {
        let bad = |m: String| Err(RegionError::Unpack(m));
        if p.slab_size != self.cfg.slab_size || p.granule != self.cfg.granule {
            return bad(format!(
                "packed with slab size {} and granule {}, this allocator uses {} and {}",
                p.slab_size, p.granule, self.cfg.slab_size, self.cfg.granule
            ));
        }
        let Some(top) = p.regions.first() else { return bad("the pack has no regions".into()) };
        if top.parent.is_some() {
            return bad(format!("top region {} has a parent in the pack", top.id));
        }
        if top.id == RegionId::ROOT && parent_slot != 0 {
            return bad("a pack of the root region can only be unpacked into the root".into());
        }
        let mut ids = BTreeSet::new();
        let mut slots = BTreeSet::new();
        for (i, r) in p.regions.iter().enumerate() {
            if !r.id.names_a_slot() {
                return bad(format!("region id {} names no slot (its low 32 bits, the slot + 1, are 0)", r.id));
            }
            if !slots.insert(r.id.slot()) {
                return bad(format!("region {} shares its slot with another region of the pack", r.id));
            }
            if i > 0 {
                match r.parent {
                    Some(q) if ids.contains(&q) => {}
                    _ => return bad(format!("region {} comes before its parent or has none", r.id)),
                }
                if r.id == RegionId::ROOT {
                    return bad("the root region appears below the top".into());
                }
            }
            if !ids.insert(r.id) {
                return bad(format!("region {} appears twice", r.id));
            }
            if r.id.slot() >= self.regions.len().saturating_add(MAX_UNPACK_GROWTH) {
                return bad(format!(
                    "region {} would grow this allocator's region table from {} to {} entries (unpacking adds at most {})",
                    r.id,
                    self.regions.len(),
                    r.id.slot() as u64 + 1,
                    MAX_UNPACK_GROWTH
                ));
            }
            if r.id != RegionId::ROOT {
                if let Some(here) = self.regions.get(r.id.slot()) {
                    if here.alive {
                        return bad(format!("region id {} is in use here (by region {})", r.id, here.id(r.id.slot())));
                    }
                    if here.gen > r.id.gen() {
                        return bad(format!("region id {} was used and freed here; it cannot be reused", r.id));
                    }
                }
            }
        }
        let mut prev_end = 0usize;
        for s in &p.slabs {
            let a = s.addr();
            if !ids.contains(&s.region()) {
                return bad(format!("slab {a:#x} belongs to region {} which is not in the pack", s.region()));
            }
            if a & (self.cfg.slab_size - 1) != 0 || a < prev_end || a == 0 {
                return bad(format!("slab {a:#x} is misaligned, null or overlaps the one before"));
            }
            let n = s.slabs();
            if n == 0 || n > u32::MAX as usize / 2 {
                return bad(format!("slab {a:#x} spans {n} slabs"));
            }
            let end = a
                .checked_add(n << self.slab_shift)
                .filter(|&e| e < 1 << 47)
                .ok_or_else(|| RegionError::Unpack(format!("slab {a:#x} is beyond the address space")))?;
            if let PackedSlab::Slots { slot_size, allocated, .. } = s {
                let sz = *slot_size as usize;
                if sz == 0 || self.slot_size_for(sz) != Some(sz) {
                    return bad(format!(
                        "slab {a:#x}: slot size {sz} is not one of this allocator's (multiples of {} below {}, of {} up to the slab size {})",
                        self.cfg.min_slot, self.cfg.granule, self.cfg.granule, self.cfg.slab_size
                    ));
                }
                let shape = self.shapes[self.class_of(sz)];
                let live: u32 = allocated.iter().map(|w| w.count_ones()).sum();
                let mut all = vec![0u64; allocated.len()];
                shape.fill(&mut all);
                let beyond = allocated.iter().zip(&all).any(|(&x, &m)| x & !m != 0);
                // The sender's bitmaps have as many words as its smallest
                // slot needs, which may be more than this allocator's: the
                // words past the slab's slots must be 0, not absent.
                if live == 0 || beyond {
                    return bad(format!("slab {a:#x}: allocation bitmap is empty or marks slots beyond the {} it has", shape.slots));
                }
            }
            // Memory: each slab either free here or in a page this allocator lacks.
            let mut x = a;
            while x < end {
                if let Some(sid) = self.slab_of(x) {
                    if self.slabs[sid as usize].state != state::FREE {
                        return bad(format!("memory at {x:#x} is in use here (region {})", self.regions[self.slabs[sid as usize].region as usize].id(self.slabs[sid as usize].region as usize)));
                    }
                }
                x += self.cfg.slab_size;
            }
            prev_end = end;
        }
        // Runs must be exactly the slabs.
        let mut v: Vec<(usize, usize)> = p.slabs.iter().map(|s| (s.addr(), s.slabs() << self.slab_shift)).collect();
        v.sort_unstable();
        if coalesce(v) != p.runs {
            return bad("the runs do not match the slabs".into());
        }
        Ok(())
    }
}
