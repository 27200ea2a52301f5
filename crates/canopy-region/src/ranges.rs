//! Free slab ranges, kept ordered by address (to give a growing region the
//! slabs right after its last ones, so regions stay compact) and by length
//! (best fit in logarithmic time).  Adjacent ranges are merged on insert.

use std::collections::{BTreeMap, BTreeSet};

/// Free ranges of slabs; addresses in bytes, lengths in slabs.
#[derive(Debug, Default)]
pub(crate) struct FreeRanges {
    by_addr: BTreeMap<usize, usize>,
    by_len: BTreeSet<(usize, usize)>,
    slab_shift: u32,
    slabs: usize,
}

impl FreeRanges {
    pub(crate) fn new(slab_size: usize) -> FreeRanges {
        FreeRanges { slab_shift: slab_size.trailing_zeros(), ..Default::default() }
    }

    /// Total free slabs.
    pub(crate) fn slabs(&self) -> usize {
        self.slabs
    }

    /// Length of the longest range.
    pub(crate) fn largest(&self) -> usize {
        self.by_len.last().map_or(0, |&(l, _)| l)
    }

    /// Number of separate ranges.
    pub(crate) fn ranges(&self) -> usize {
        self.by_addr.len()
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
    pub(crate) fn insert(&mut self, mut addr: usize, mut len: usize) {
        debug_assert!(len > 0);
        self.slabs += len;
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

    /// Take up to `want` (at least 1) slabs from the range starting exactly at `addr`.
    pub(crate) fn take_at_start(&mut self, addr: usize, want: usize) -> Option<(usize, usize)> {
        let len = *self.by_addr.get(&addr)?;
        let got = len.min(want);
        self.remove(addr, len);
        if got < len {
            self.put(self.end(addr, got), len - got);
        }
        self.slabs -= got;
        Some((addr, got))
    }

    /// Take exactly `n` slabs from the shortest range that has them (the
    /// lowest address among equals), from its start.
    pub(crate) fn take_best_fit(&mut self, n: usize) -> Option<usize> {
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
    pub(crate) fn contains(&self, addr: usize, n: usize) -> bool {
        match self.by_addr.range(..=addr).next_back() {
            Some((&ra, &rl)) => self.end(addr, n) <= self.end(ra, rl),
            None => false,
        }
    }

    /// All ranges in address order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.by_addr.iter().map(|(&a, &l)| (a, l))
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
}
