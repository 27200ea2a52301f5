//! The slab: one building block for every pool of equal-sized slots in
//! Canopy.  The thread heaps' small-object slabs (64 KiB, one size class
//! each) and the region layer's slab pools (4 KiB by default, one slot size
//! each) are both made of it.
//!
//! A slab is `slots` slots of `size` bytes from its first byte, and a bitmap
//! of one bit per slot kept *apart* from the slab (as in Myrmics): a set bit
//! is a free slot.  Nothing is ever written into a free slot, so a slab's
//! memory is only the program's data: it can be described as address runs
//! and sent elsewhere without carrying any allocator state.
//!
//! What this module gives each pool:
//! - [`SlotShape`]: the geometry of a slot size in a slab size, with the
//!   multiplier that turns an offset into a slot index and says whether the
//!   offset starts a slot, with one multiplication and no division;
//! - the bitmap operations: fill a fresh slab ([`SlotShape::fill`]), take
//!   the lowest free slot of a word ([`take_lowest`]), give a slot back
//!   exactly once ([`release`]: a slot already free is refused, so a double
//!   free is caught without a scan), find a word with a free slot
//!   ([`first_free_word`]), count free slots ([`count_free`]).
//!
//! What stays with each pool is where its bitmaps live and which lists its
//! slabs are on: a thread heap keeps its bitmaps in a table beside the
//! arena's descriptors and hands frees from other threads to the owner as
//! messages; a region allocator keeps them in a vector indexed by slab.
//!
//! Slots are taken lowest first within a word, and pools move their cursor
//! to the lowest word with a free slot, so a slab fills upwards through its
//! memory and a slot freed below the cursor word is found again when the
//! cursor moves (address-ordered first fit, which keeps slabs compact).

/// The geometry of slots of one size in slabs of one size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotShape {
    /// `ceil(2^64 / size)` (0 for the empty shape): for an offset `off`
    /// below 2^32 the high half of `off * magic` is `off / size`, and the low
    /// half is below `magic` exactly when `size` divides `off` (Lemire, Kaser
    /// and Kurz, "Faster remainder by direct computation", 2019).
    pub magic: u64,
    /// A slab's last bitmap word when all its slots are free.
    pub last_full: u64,
    /// Slots per slab.
    pub slots: u32,
    /// Bitmap words per slab (`ceil(slots / 64)`).
    pub words: u32,
    /// Slot size in bytes (0 for the empty shape).
    pub size: u32,
}

/// Why a slot could not be given back (see [`release`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlreadyFree;

/// Largest slab this module describes: offsets must stay below 2^32 for
/// [`SlotShape::magic`] to be exact.
pub const MAX_SLAB: usize = 1 << 31;

impl SlotShape {
    /// The shape that no slab has: its `magic` is 0, so [`locate`](Self::locate)
    /// finds no slot in it.  Pools give it to slabs that hold no slots.
    pub const EMPTY: SlotShape = SlotShape { magic: 0, last_full: 0, slots: 0, words: 0, size: 0 };

    /// Slots of `size` bytes in a slab of `slab` bytes.  `size` is at least
    /// 2 (a multiplier for 1 would be 2^64) and at most `slab`, and `slab` at most [`MAX_SLAB`].
    pub const fn new(size: usize, slab: usize) -> SlotShape {
        assert!(size >= 2 && size <= slab && slab <= MAX_SLAB);
        let slots = slab / size;
        let words = slots.div_ceil(64);
        let tail = slots - (words - 1) * 64;
        SlotShape {
            magic: u64::MAX / size as u64 + 1,
            last_full: if tail == 64 { !0 } else { (1u64 << tail) - 1 },
            slots: slots as u32,
            words: words as u32,
            size: size as u32,
        }
    }

    /// The slot that offset `off` (from the slab's start, below [`MAX_SLAB`])
    /// starts, or `None` if `off` is inside a slot, past the last slot, or
    /// the shape is [`EMPTY`](Self::EMPTY).
    #[inline(always)]
    pub fn locate(&self, off: usize) -> Option<usize> {
        locate(self.magic, self.slots, off)
    }

    /// Set the bits of every slot of a fresh slab (`words` holds exactly
    /// [`words`](Self::words) words or more; words past the slots are cleared).
    #[inline]
    pub fn fill(&self, words: &mut [u64]) {
        // One select per word, no call: pools fill a handful of words, where
        // a memset call would cost more than the stores.
        let n = self.words as usize;
        for (w, x) in words.iter_mut().enumerate() {
            *x = if w + 1 < n {
                !0
            } else if w + 1 == n {
                self.last_full
            } else {
                0
            };
        }
    }

    /// Word `w` of a fresh slab's bitmap (every slot free; 0 past the slots).
    #[inline]
    pub const fn fresh_word(&self, w: usize) -> u64 {
        let n = self.slots as usize;
        let lo = w * 64;
        if n >= lo + 64 {
            !0
        } else if n > lo {
            (1u64 << (n - lo)) - 1
        } else {
            0
        }
    }

    /// Whether a word that just gained a free slot may complete an empty
    /// slab: it is now all free (a full word, or the last word's slots).
    /// Only then need a pool look at the whole bitmap.
    #[inline(always)]
    pub fn may_be_empty(&self, now: u64) -> bool {
        now == !0 || now == self.last_full
    }

    /// Whether every slot of the slab is free.
    pub fn is_all_free(&self, words: &[u64]) -> bool {
        count_free(&words[..self.words as usize]) == self.slots
    }
}

/// `(off / size, size divides off)` from the shape's multiplier, for
/// `off` below 2^32: the high and low halves of one 64x64-bit product.
/// With `magic == 0` the second is always false.
#[inline(always)]
pub fn split(magic: u64, off: usize) -> (usize, bool) {
    let m = off as u128 * magic as u128;
    ((m >> 64) as usize, (m as u64) < magic)
}

/// [`SlotShape::locate`] from the shape's `magic` and `slots` alone (what a
/// pool keeps beside each slab).
#[inline(always)]
pub fn locate(magic: u64, slots: u32, off: usize) -> Option<usize> {
    let (idx, start) = split(magic, off);
    if start && idx < slots as usize {
        Some(idx)
    } else {
        None
    }
}

/// For slabs of at most 64 KiB and slots of at most 8 KiB, the free fast
/// path's test in one multiplication and one comparison: `(divc, limit)`
/// for [`locate_small`].  `divc = floor(2^32 / size) + 1`; for an offset
/// `off` below 2^16, the 64-bit product `off * divc` has the slot index in
/// its high half (exact: 32 >= 16 + log2 of the size), and a low half of
/// `k * step` when `off` is `k` slots (`step = size * divc - 2^32`, with
/// `0 < step <= size`), but at least `divc` otherwise; `limit = slots * step`
/// is at most `divc`, so `low half < limit` says both "starts a slot" and
/// "below the last slot".
pub const fn small_test(size: usize, slots: usize) -> (u32, u32) {
    assert!(size >= 2 && size <= 1 << 13 && slots * size <= 1 << 16);
    let divc = ((1u64 << 32) / size as u64 + 1) as u32;
    let step = (size as u32).wrapping_mul(divc);
    (divc, slots as u32 * step)
}

/// The slot that offset `off` (below 2^16) starts, from [`small_test`]'s
/// `(divc, limit)`; `None` inside a slot or past the last.
#[inline(always)]
pub fn locate_small(divc: u32, limit: u32, off: u32) -> Option<usize> {
    let m = off as u64 * divc as u64;
    if (m as u32) < limit {
        Some((m >> 32) as usize)
    } else {
        None
    }
}

/// The lowest free slot of bitmap word `x`: `(x without it, its bit number)`,
/// or `None` if `x` has no free slot.  (For pools that load and store their
/// words themselves; [`take_lowest`] works on a word in place.)
#[inline(always)]
pub fn take_lowest_bits(x: u64) -> Option<(u64, u32)> {
    if x == 0 {
        return None;
    }
    Some((x & (x - 1), x.trailing_zeros()))
}

/// Word `x` with slot `bit` given back, or [`AlreadyFree`] if it is free
/// already.  (The value form of [`release`].)
#[inline(always)]
pub fn release_bits(x: u64, bit: usize) -> Result<u64, AlreadyFree> {
    let now = x | 1u64 << (bit % 64);
    if now == x {
        return Err(AlreadyFree);
    }
    Ok(now)
}

/// Take the lowest free slot of a bitmap word: its bit number and whether
/// the word is now exhausted; `None` if the word has no free slot.
#[inline(always)]
pub fn take_lowest(word: &mut u64) -> Option<(u32, bool)> {
    let (rest, bit) = take_lowest_bits(*word)?;
    *word = rest;
    Some((bit, rest == 0))
}

/// Give slot `bit` of a word back.  Returns the word's previous value, or
/// [`AlreadyFree`] (changing nothing) if the slot is free already.
#[inline(always)]
pub fn release(word: &mut u64, bit: usize) -> Result<u64, AlreadyFree> {
    let x = *word;
    *word = release_bits(x, bit)?;
    Ok(x)
}

/// Whether slot `bit` of a word is free.
#[inline(always)]
pub fn is_free(word: u64, bit: usize) -> bool {
    word & (1u64 << (bit % 64)) != 0
}

/// Index of the first word with a free slot.
#[inline]
pub fn first_free_word(words: &[u64]) -> Option<usize> {
    words.iter().position(|&x| x != 0)
}

/// Free slots in a bitmap.
#[inline]
pub fn count_free(words: &[u64]) -> u32 {
    words.iter().map(|w| w.count_ones()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_is_exact_for_every_offset_of_small_slabs() {
        for size in (16..=8192).step_by(16).chain([2, 3, 7, 48, 100, 192, 1536]) {
            let s = SlotShape::new(size, 1 << 16);
            for off in 0..(1usize << 16) {
                let want = (off % size == 0 && off / size < s.slots as usize).then_some(off / size);
                assert_eq!(s.locate(off), want, "size {size} off {off}");
            }
        }
    }

    #[test]
    fn the_small_test_is_exact_for_every_offset() {
        for size in (16..=8192).step_by(16).chain([2, 3, 7, 48, 100, 1000]) {
            for slab in [1usize << 16, 4096, 12_345] {
                if size > slab {
                    continue;
                }
                let slots = slab / size;
                let (divc, limit) = small_test(size, slots);
                for off in 0..(1u32 << 16) {
                    let o = off as usize;
                    let want = (o % size == 0 && o / size < slots).then_some(o / size);
                    assert_eq!(locate_small(divc, limit, off), want, "size {size} slab {slab} off {off}");
                }
            }
        }
    }

    #[test]
    fn locate_is_exact_near_the_top_of_large_slabs() {
        for size in [64usize, 192, 1000, 4096, 50048, 1 << 20, (1 << 20) - 64] {
            let s = SlotShape::new(size, 1 << 20);
            for k in [0usize, 1, 2, s.slots as usize - 1, s.slots as usize] {
                for d in [0usize, 1, size - 1] {
                    let off = k * size + d;
                    if off >= 1 << 20 {
                        continue;
                    }
                    let want = (d == 0 && k < s.slots as usize).then_some(k);
                    assert_eq!(s.locate(off), want, "size {size} off {off}");
                }
            }
        }
        // Offsets up to 2^31 in the largest slab.
        let s = SlotShape::new(3 * 64, MAX_SLAB);
        for off in [MAX_SLAB - 1, MAX_SLAB - 64, (MAX_SLAB / 192) * 192, (MAX_SLAB / 192 - 1) * 192 + 1] {
            assert_eq!(s.locate(off), (off % 192 == 0 && off / 192 < s.slots as usize).then_some(off / 192));
        }
    }

    #[test]
    fn the_empty_shape_has_no_slot() {
        for off in [0usize, 1, 16, 4096, 65535] {
            assert_eq!(SlotShape::EMPTY.locate(off), None);
        }
    }

    #[test]
    fn fill_writes_every_fresh_word_over_any_old_bits() {
        for shape in [SlotShape::EMPTY, SlotShape::new(16, 4096), SlotShape::new(64, 4096), SlotShape::new(192, 4096), SlotShape::new(48, 1 << 16)] {
            for extra in [0usize, 1, 3] {
                let mut words = vec![0x5a5a_5a5a_5a5a_5a5a_u64; shape.words as usize + extra];
                shape.fill(&mut words);
                for (w, &x) in words.iter().enumerate() {
                    assert_eq!(x, shape.fresh_word(w), "shape {shape:?}, word {w}");
                }
            }
        }
    }

    #[test]
    fn fill_take_release_round_trip() {
        for size in [16usize, 48, 100, 4096] {
            let s = SlotShape::new(size, 1 << 16);
            let mut words = vec![0u64; s.words as usize + 1];
            s.fill(&mut words);
            assert_eq!(count_free(&words), s.slots);
            assert_eq!(words[s.words as usize], 0);
            assert!(s.is_all_free(&words));
            let mut taken = Vec::new();
            while let Some(w) = first_free_word(&words) {
                let (bit, _) = take_lowest(&mut words[w]).expect("a word with a free slot");
                taken.push(w * 64 + bit as usize);
            }
            // Lowest first: the slots come out in address order.
            assert_eq!(taken, (0..s.slots as usize).collect::<Vec<_>>());
            assert_eq!(count_free(&words), 0);
            for &i in taken.iter().rev() {
                let old = release(&mut words[i / 64], i).expect("live slot");
                assert!(!is_free(old, i));
                assert_eq!(release(&mut words[i / 64], i), Err(AlreadyFree));
            }
            assert!(s.is_all_free(&words));
            assert!(s.may_be_empty(words[s.words as usize - 1]));
        }
    }

    #[test]
    fn take_lowest_reports_exhaustion() {
        let mut w = 0b1010u64;
        assert_eq!(take_lowest(&mut w), Some((1, false)));
        assert_eq!(take_lowest(&mut w), Some((3, true)));
        assert_eq!(take_lowest(&mut w), None);
    }
}
