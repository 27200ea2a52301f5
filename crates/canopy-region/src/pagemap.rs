//! Which page of an allocator holds an address: a two-level radix table over
//! the 47-bit user address space, one entry per page.  Constant-time lookup
//! (two dependent loads); leaves are made on first use.  A part of the
//! address space with no leaf points at one shared leaf of zeros, so a
//! lookup never tests for a missing leaf.

const ADDR_BITS: u32 = 47;
const LEAF_BITS: u32 = 12;

type Leaf = [u32; 1 << LEAF_BITS];

/// The leaf of every part of the address space with no page recorded.
/// Never written: `set` makes a leaf of its own first.
static NO_LEAF: Leaf = [0; 1 << LEAF_BITS];

/// Page number (address >> page shift) to page index + 1 (0: none).
#[derive(Debug)]
pub(crate) struct PageMap {
    shift: u32,
    /// `NO_LEAF`, or a leaf this map owns (made by `Box::into_raw`).
    top: Vec<*mut Leaf>,
}

// SAFETY: the leaves are owned by the map (or are the immutable `NO_LEAF`)
// and are reached only through `&self` / `&mut self`, like a `Vec<Box<Leaf>>`.
unsafe impl Send for PageMap {}

fn no_leaf() -> *mut Leaf {
    &NO_LEAF as *const Leaf as *mut Leaf
}

impl PageMap {
    pub(crate) fn new(page_size: usize) -> PageMap {
        let shift = page_size.trailing_zeros();
        let bits = ADDR_BITS.saturating_sub(shift);
        let top_bits = bits.saturating_sub(LEAF_BITS);
        PageMap { shift, top: vec![no_leaf(); 1usize << top_bits] }
    }

    /// The page index of `addr`, if one is recorded.
    #[inline]
    pub(crate) fn get(&self, addr: usize) -> Option<u32> {
        let n = addr >> self.shift;
        let leaf = *self.top.get(n >> LEAF_BITS)?;
        // SAFETY: every entry of `top` points at NO_LEAF or at a live leaf of
        // this map; leaves are only written through `&mut self`.
        match unsafe { (*leaf)[n & ((1 << LEAF_BITS) - 1)] } {
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
        if *slot == no_leaf() {
            if page.is_none() {
                return;
            }
            let leaf: Box<Leaf> =
                vec![0u32; 1 << LEAF_BITS].into_boxed_slice().try_into().expect("leaf of the right length");
            *slot = Box::into_raw(leaf);
        }
        // SAFETY: not NO_LEAF, so a leaf this map owns; `&mut self` makes
        // this the only access.
        let leaf = unsafe { &mut **slot };
        leaf[n & ((1 << LEAF_BITS) - 1)] = page.map_or(0, |p| p + 1);
    }
}

impl Drop for PageMap {
    fn drop(&mut self) {
        for &leaf in &self.top {
            if leaf != no_leaf() {
                // SAFETY: made by `Box::into_raw` in `set` and dropped once, here.
                drop(unsafe { Box::from_raw(leaf) });
            }
        }
    }
}
