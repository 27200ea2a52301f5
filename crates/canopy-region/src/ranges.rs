//! Free slab ranges, kept ordered by address (to give a growing region the
//! slabs right after its last ones, so regions stay compact) and by length
//! (best fit in logarithmic time).  Adjacent ranges are merged on insert.
//!
//! Single slabs given back one at a time (a region emptied a slab beyond its
//! high watermark) wait in a short list and are merged in bulk, sorted, the
//! next time the ranges are read or the list is full: Myrmics' "lazily
//! returning free slabs" (002 §3.2), which spares two ordered-map updates
//! per slab when a region's objects are freed one by one.
//!
//! The range a growing region is taking slabs from, a few at a time from
//! its start (`take_at_start` at the region's hint), is likewise kept out
//! of the maps while it is being used up (the *carve*): each take then moves
//! its start instead of removing it from both maps and putting the rest
//! back.  Any other read puts it back first, as it merges the pending slabs.

use std::collections::{BTreeMap, BTreeSet};

/// Free ranges of slabs; addresses in bytes, lengths in slabs.
#[derive(Debug, Default)]
pub(crate) struct FreeRanges {
    by_addr: BTreeMap<usize, usize>,
    by_len: BTreeSet<(usize, usize)>,
    /// Free single slabs not merged into the maps yet (`insert_lazy`).
    pending: Vec<usize>,
    /// A free range (address, slabs > 0) out of the maps, which
    /// `take_at_start` takes slabs from the start of; disjoint from the
    /// maps' ranges and the pending slabs.
    carve: Option<(usize, usize)>,
    slab_shift: u32,
    /// Free slabs, pending ones included.
    slabs: usize,
}

/// Pending slabs that make `insert_lazy` merge them.
const PENDING_MAX: usize = 1024;

impl FreeRanges {
    pub(crate) fn new(slab_size: usize) -> FreeRanges {
        FreeRanges { slab_shift: slab_size.trailing_zeros(), ..Default::default() }
    }

    /// Total free slabs.
    pub(crate) fn slabs(&self) -> usize {
        self.slabs
    }

    /// Length of the longest range.
    pub(crate) fn largest(&mut self) -> usize {
        self.flush();
        self.by_len.last().map_or(0, |&(l, _)| l)
    }

    /// Number of separate ranges (as if the pending slabs and the carve
    /// were merged).
    pub(crate) fn ranges(&self) -> usize {
        if self.pending.is_empty() && self.carve.is_none() {
            return self.by_addr.len();
        }
        // Ranges + loose runs - adjacencies between a run and a range.
        let runs = self.loose_runs();
        let mut n = self.by_addr.len() + runs.len();
        for &(a, l) in &runs {
            if self.by_addr.range(..a).next_back().is_some_and(|(&pa, &pl)| self.end(pa, pl) == a) {
                n -= 1;
            }
            if self.by_addr.contains_key(&self.end(a, l)) {
                n -= 1;
            }
        }
        n
    }

    /// The pending slabs and the carve, outside the maps, as sorted, merged
    /// runs.
    fn loose_runs(&self) -> Vec<(usize, usize)> {
        let mut p: Vec<(usize, usize)> = self.pending.iter().map(|&a| (a, 1)).chain(self.carve).collect();
        p.sort_unstable();
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for (a, l) in p {
            match runs.last_mut() {
                Some((ra, rl)) if self.end(*ra, *rl) == a => *rl += l,
                _ => runs.push((a, l)),
            }
        }
        runs
    }

    /// Add one free slab at `addr`, merged with its neighbours later (before
    /// the ranges are next read).
    pub(crate) fn insert_lazy(&mut self, addr: usize) {
        self.pending.push(addr);
        self.slabs += 1;
        if self.pending.len() >= PENDING_MAX {
            self.flush();
        }
    }

    /// Merge the carve and the pending slabs into the maps: the slabs
    /// sorted, as runs.
    fn flush(&mut self) {
        if let Some((a, l)) = self.carve.take() {
            self.merge(a, l);
        }
        if self.pending.is_empty() {
            return;
        }
        let mut p = core::mem::take(&mut self.pending);
        p.sort_unstable();
        let mut run: Option<(usize, usize)> = None;
        for &a in &p {
            run = match run {
                Some((ra, rl)) if self.end(ra, rl) == a => Some((ra, rl + 1)),
                Some((ra, rl)) => {
                    self.merge(ra, rl);
                    Some((a, 1))
                }
                None => Some((a, 1)),
            };
        }
        if let Some((ra, rl)) = run {
            self.merge(ra, rl);
        }
        p.clear();
        self.pending = p;
    }

    fn end(&self, addr: usize, len: usize) -> usize {
        addr + (len << self.slab_shift)
    }

    fn put(&mut self, addr: usize, len: usize) {
        self.by_addr.insert(addr, len);
        self.by_len.insert((len, addr));
    }

    fn remove(&mut self, addr: usize, len: usize) {
        self.by_addr.remove(&addr);
        self.by_len.remove(&(len, addr));
    }

    /// Add `len` free slabs at `addr`, merging with neighbours.
    pub(crate) fn insert(&mut self, addr: usize, len: usize) {
        debug_assert!(len > 0);
        self.slabs += len;
        self.merge(addr, len);
    }

    /// Put `len` slabs at `addr` (already counted) in the maps, merging with
    /// neighbours.
    fn merge(&mut self, mut addr: usize, mut len: usize) {
        if let Some((&pa, &pl)) = self.by_addr.range(..addr).next_back() {
            debug_assert!(self.end(pa, pl) <= addr, "free range overlap at {addr:#x}");
            if self.end(pa, pl) == addr {
                self.remove(pa, pl);
                addr = pa;
                len += pl;
            }
        }
        let end = self.end(addr, len);
        if let Some(&nl) = self.by_addr.get(&end) {
            self.remove(end, nl);
            len += nl;
        }
        self.put(addr, len);
    }

    /// Take up to `want` (at least 1) slabs from the range starting exactly
    /// at `addr`.  What is left of the range becomes the carve, so the next
    /// take at its start (a region growing on) costs no map update.
    pub(crate) fn take_at_start(&mut self, addr: usize, want: usize) -> Option<(usize, usize)> {
        debug_assert!(want > 0);
        let len = match self.carve {
            Some((a, l)) if a == addr => {
                self.carve = None;
                l
            }
            _ => {
                // The carve back first: the range at `addr` may be a pending
                // slab's neighbour, or the carve may end at `addr`.
                self.flush();
                let len = *self.by_addr.get(&addr)?;
                self.remove(addr, len);
                len
            }
        };
        let got = len.min(want);
        if got < len {
            self.carve = Some((self.end(addr, got), len - got));
        }
        self.slabs -= got;
        Some((addr, got))
    }

    /// Take exactly `n` slabs from the shortest range that has them (the
    /// lowest address among equals), from its start.
    pub(crate) fn take_best_fit(&mut self, n: usize) -> Option<usize> {
        self.flush();
        let &(len, addr) = self.by_len.range((n, 0)..).next()?;
        self.remove(addr, len);
        if n < len {
            self.put(self.end(addr, n), len - n);
        }
        self.slabs -= n;
        Some(addr)
    }

    /// Remove exactly `[addr, addr + n slabs)`, which must lie inside one free range.
    pub(crate) fn take_exact(&mut self, addr: usize, n: usize) -> bool {
        self.flush();
        let Some((&ra, &rl)) = self.by_addr.range(..=addr).next_back() else { return false };
        let (rend, end) = (self.end(ra, rl), self.end(addr, n));
        if end > rend {
            return false;
        }
        self.remove(ra, rl);
        if ra < addr {
            self.put(ra, (addr - ra) >> self.slab_shift);
        }
        if end < rend {
            self.put(end, (rend - end) >> self.slab_shift);
        }
        self.slabs -= n;
        true
    }

    /// Whether `[addr, addr + n slabs)` lies inside one free range.
    pub(crate) fn contains(&mut self, addr: usize, n: usize) -> bool {
        self.flush();
        match self.by_addr.range(..=addr).next_back() {
            Some((&ra, &rl)) => self.end(addr, n) <= self.end(ra, rl),
            None => false,
        }
    }

    /// All ranges in address order, then the carve, then the pending
    /// slabs (unmerged, in the order given back).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.by_addr.iter().map(|(&a, &l)| (a, l)).chain(self.carve).chain(self.pending.iter().map(|&a| (a, 1)))
    }

    /// Check the two indexes agree and no ranges touch or overlap.
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut total = 0;
        let mut prev_end = 0;
        for (&a, &l) in &self.by_addr {
            if l == 0 || !self.by_len.contains(&(l, a)) {
                return Err(format!("free range {a:#x}+{l}: missing from the length index"));
            }
            if a <= prev_end && prev_end != 0 {
                return Err(format!("free range {a:#x} touches or overlaps the one before"));
            }
            prev_end = self.end(a, l);
            total += l;
        }
        for (a, l) in self.loose_runs() {
            if self.by_addr.range(..self.end(a, l)).next_back().is_some_and(|(&ra, &rl)| self.end(ra, rl) > a) {
                return Err(format!("pending free slabs or carve {a:#x}+{l} overlap a free range"));
            }
            total += l;
        }
        let mut p = self.pending.clone();
        p.sort_unstable();
        if p.windows(2).any(|w| w[0] == w[1]) || self.pending.len() >= PENDING_MAX {
            return Err("pending free slabs repeat or overflow".into());
        }
        if let Some((a, l)) = self.carve {
            if l == 0 || p.iter().any(|&x| x >= a && x < self.end(a, l)) {
                return Err(format!("carve {a:#x}+{l} is empty or holds a pending slab"));
            }
        }
        if self.by_len.len() != self.by_addr.len() || total != self.slabs {
            return Err("free range counters disagree".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_take_and_split() {
        let mut f = FreeRanges::new(4096);
        f.insert(0x10000, 2);
        f.insert(0x14000, 2);
        assert_eq!(f.ranges(), 2);
        f.insert(0x12000, 2); // fills the gap: one range of 6
        assert_eq!(f.iter().collect::<Vec<_>>(), vec![(0x10000, 6)]);
        assert!(f.take_exact(0x12000, 1));
        assert_eq!(f.iter().collect::<Vec<_>>(), vec![(0x10000, 2), (0x13000, 3)]);
        assert_eq!(f.take_best_fit(2), Some(0x10000));
        assert_eq!(f.take_at_start(0x13000, 10), Some((0x13000, 3)));
        assert_eq!(f.slabs(), 0);
        assert!(!f.take_exact(0x13000, 1));
        f.check().unwrap();
    }

    #[test]
    fn taking_from_a_range_start_by_start_keeps_the_rest_as_the_carve() {
        let mut f = FreeRanges::new(4096);
        f.insert(0x10000, 10);
        f.insert(0x40000, 1);
        assert_eq!(f.take_at_start(0x10000, 4), Some((0x10000, 4)));
        assert_eq!(f.carve, Some((0x14000, 6)));
        // The next take at the carve's start moves it, with the maps untouched.
        assert_eq!(f.take_at_start(0x14000, 4), Some((0x14000, 4)));
        assert_eq!((f.carve, f.by_addr.len()), (Some((0x18000, 2)), 1));
        f.check().unwrap();
        assert_eq!((f.slabs(), f.ranges()), (3, 2));
        assert_eq!(f.iter().collect::<Vec<_>>(), vec![(0x40000, 1), (0x18000, 2)]);
        // Slabs given back next to it count as one range with it...
        f.insert(0x16000, 2);
        f.insert_lazy(0x1a000);
        f.check().unwrap();
        assert_eq!((f.slabs(), f.ranges()), (6, 2));
        // ...and any other read merges it back into the maps.
        assert_eq!(f.largest(), 5);
        assert_eq!(f.carve, None);
        assert_eq!(f.iter().collect::<Vec<_>>(), vec![(0x16000, 5), (0x40000, 1)]);
        // A take elsewhere puts the carve back before it looks.
        assert_eq!(f.take_at_start(0x16000, 1), Some((0x16000, 1)));
        assert_eq!(f.take_at_start(0x40000, 8), Some((0x40000, 1)));
        assert_eq!(f.carve, None, "a range used up leaves no carve");
        assert_eq!(f.take_at_start(0x17000, 9), Some((0x17000, 4)));
        assert_eq!(f.take_at_start(0x1b000, 1), None);
        assert_eq!(f.slabs(), 0);
        f.check().unwrap();
    }

    #[test]
    fn lazy_slabs_merge_before_reads() {
        let mut f = FreeRanges::new(4096);
        f.insert(0x10000, 2);
        f.insert(0x20000, 1);
        for a in [0x13000, 0x12000, 0x1f000, 0x30000] {
            f.insert_lazy(a);
        }
        f.check().unwrap();
        assert_eq!(f.slabs(), 7);
        // 0x10000+4 (range + two pending), 0x1f000+2 (pending + range), 0x30000.
        assert_eq!(f.ranges(), 3);
        assert_eq!(f.largest(), 4);
        assert_eq!(f.iter().collect::<Vec<_>>(), vec![(0x10000, 4), (0x1f000, 2), (0x30000, 1)]);
        for i in 0..PENDING_MAX {
            f.insert_lazy(0x100_0000 + (i << 12));
        }
        f.check().unwrap();
        assert_eq!(f.ranges(), 4, "merged when the list filled");
    }
}
