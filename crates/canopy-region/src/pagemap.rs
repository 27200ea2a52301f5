//! Which page of an allocator holds an address: a two-level radix table over
//! the 47-bit user address space, one entry per page.  Constant-time lookup
//! (two dependent loads); leaves are made on first use.

const ADDR_BITS: u32 = 47;
const LEAF_BITS: u32 = 12;

/// Page number (address >> page shift) to page index + 1 (0: none).
#[derive(Debug)]
pub(crate) struct PageMap {
    shift: u32,
    top: Vec<Option<Box<[u32; 1 << LEAF_BITS]>>>,
}

impl PageMap {
    pub(crate) fn new(page_size: usize) -> PageMap {
        let shift = page_size.trailing_zeros();
        let bits = ADDR_BITS.saturating_sub(shift);
        let top_bits = bits.saturating_sub(LEAF_BITS);
        PageMap { shift, top: (0..1usize << top_bits).map(|_| None).collect() }
    }

    /// The page index of `addr`, if one is recorded.
    #[inline]
    pub(crate) fn get(&self, addr: usize) -> Option<u32> {
        let n = addr >> self.shift;
        let leaf = self.top.get(n >> LEAF_BITS)?.as_ref()?;
        match leaf[n & ((1 << LEAF_BITS) - 1)] {
            0 => None,
            v => Some(v - 1),
        }
    }

    /// Record (`Some`) or clear (`None`) the page at `addr`.
    pub(crate) fn set(&mut self, addr: usize, page: Option<u32>) {
        let n = addr >> self.shift;
        let Some(slot) = self.top.get_mut(n >> LEAF_BITS) else {
            // Outside the user address space: nothing can be recorded there.
            debug_assert!(page.is_none(), "address {addr:#x} beyond the page map");
            return;
        };
        let leaf = slot.get_or_insert_with(|| {
            vec![0u32; 1 << LEAF_BITS].into_boxed_slice().try_into().expect("leaf of the right length")
        });
        leaf[n & ((1 << LEAF_BITS) - 1)] = page.map_or(0, |p| p + 1);
    }
}
