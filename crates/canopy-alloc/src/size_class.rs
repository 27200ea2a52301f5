//! Size classes: the rows of the SAC arena matrix.
//!
//! Classes 0..=7 are 16..=128 bytes in steps of 16; above 128 bytes every
//! power of two is split into four classes (160, 192, 224, 256, 320, ...).
//! Classes `0..SMALL_CLASSES` (up to 8 KiB) are served from slabs (the SAC
//! *subheaps*); classes `SMALL_CLASSES..NUM_CLASSES` (up to 256 KiB) from the
//! thread's local heap pages with splitting and deferred coalescing (the SAC
//! *local heap*); anything larger comes from the global heap.
//!
//! Every power of two from 16 to 8192 is a class size, and slabs are 64 KiB
//! aligned, so a block of a power-of-two class is aligned to its size.
//! `SizeClass::of` is a `const fn`: with a constant size the class is chosen
//! at compile time, as the SAC compiler does through its rich interface.

/// Number of size classes.
pub const NUM_CLASSES: usize = 52;
/// Number of slab (small) classes.
pub const SMALL_CLASSES: usize = 32;
/// Largest size served from slabs.
pub const SMALL_MAX: usize = 8 * 1024;
/// Largest size served from a thread's local heap pages.
pub const MEDIUM_MAX: usize = 256 * 1024;

/// A size class.  `SizeClass::of(n).size() >= n`, and the waste is below 25 %
/// for sizes above 128 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SizeClass(u8);

/// Block size of class `c` (no bounds check).
#[inline]
pub const fn class_size(c: usize) -> usize {
    if c < 8 {
        (c + 1) * 16
    } else {
        let k = 7 + (c - 8) / 4;
        let j = (c - 8) % 4;
        (1 << k) + (j + 1) * (1 << (k - 2))
    }
}

/// Class index of `size` for `1 <= size <= MEDIUM_MAX` (and 0 for 0).
#[inline]
pub const fn class_index(size: usize) -> usize {
    if size <= 128 {
        if size == 0 {
            0
        } else {
            (size - 1) >> 4
        }
    } else {
        let m = size - 1;
        let k = (usize::BITS - 1 - m.leading_zeros()) as usize;
        8 + (k - 7) * 4 + ((m - (1 << k)) >> (k - 2))
    }
}

const LUT_LEN: usize = SMALL_MAX / 16 + 1;

const fn build_small_lut() -> [u8; LUT_LEN] {
    let mut t = [0u8; LUT_LEN];
    let mut i = 0;
    while i < LUT_LEN {
        t[i] = class_index(i * 16) as u8;
        i += 1;
    }
    t
}

/// Class of sizes up to `SMALL_MAX`, indexed by `(size + 15) / 16`.
pub(crate) static SMALL_LUT: [u8; LUT_LEN] = build_small_lut();

/// Class index for a size known to be at most `SMALL_MAX`: one table load.
#[inline(always)]
pub(crate) fn small_class_index(size: usize) -> usize {
    debug_assert!(size <= SMALL_MAX);
    // SAFETY: size <= SMALL_MAX, so the index is < LUT_LEN.
    unsafe { *SMALL_LUT.get_unchecked((size + 15) >> 4) as usize }
}

impl SizeClass {
    /// The class for a request of `size` bytes, or `None` above [`MEDIUM_MAX`].
    #[inline]
    pub const fn of(size: usize) -> Option<SizeClass> {
        if size > MEDIUM_MAX {
            None
        } else {
            Some(SizeClass(class_index(size) as u8))
        }
    }

    /// The class with index `i`, if it exists.
    #[inline]
    pub const fn from_index(i: usize) -> Option<SizeClass> {
        if i < NUM_CLASSES {
            Some(SizeClass(i as u8))
        } else {
            None
        }
    }

    /// Block size of this class in bytes.
    #[inline]
    pub const fn size(self) -> usize {
        class_size(self.0 as usize)
    }

    /// Index of this class (0..NUM_CLASSES).
    #[inline]
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// Whether blocks of this class come from slabs.
    #[inline]
    pub const fn is_small(self) -> bool {
        (self.0 as usize) < SMALL_CLASSES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_formula_and_is_monotone() {
        assert_eq!(class_size(0), 16);
        assert_eq!(class_size(7), 128);
        assert_eq!(class_size(8), 160);
        assert_eq!(class_size(11), 256);
        assert_eq!(class_size(SMALL_CLASSES - 1), SMALL_MAX);
        assert_eq!(class_size(NUM_CLASSES - 1), MEDIUM_MAX);
        for c in 1..NUM_CLASSES {
            assert!(class_size(c) > class_size(c - 1));
            assert_eq!(class_size(c) % 16, 0);
        }
    }

    #[test]
    fn every_size_gets_the_smallest_fitting_class() {
        for n in 0..=MEDIUM_MAX {
            let c = SizeClass::of(n).unwrap();
            assert!(c.size() >= n, "size {n}");
            if c.index() > 0 {
                assert!(class_size(c.index() - 1) < n.max(1), "size {n} class {c:?} not the smallest");
            }
            if n <= SMALL_MAX {
                assert_eq!(small_class_index(n), c.index());
            }
        }
        assert_eq!(SizeClass::of(MEDIUM_MAX + 1), None);
    }

    #[test]
    fn powers_of_two_are_class_sizes() {
        let mut p = 16;
        while p <= SMALL_MAX {
            assert_eq!(SizeClass::of(p).unwrap().size(), p);
            p *= 2;
        }
    }

    #[test]
    fn const_evaluation() {
        const C: Option<SizeClass> = SizeClass::of(100);
        assert_eq!(C.unwrap().size(), 112);
    }
}
