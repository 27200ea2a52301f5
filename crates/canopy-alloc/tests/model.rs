//! Property tests: random sequences of allocation operations against a model.
//!
//! The model is a map from live blocks to (size, fill byte).  After every
//! operation each live block must still hold its bytes, blocks must not
//! overlap, alignments must hold, and the allocator's own invariants
//! (`check_invariants`) must pass.  Sizes range from 0 to 6 MiB.  The
//! operations are the allocator's functions and the `GlobalAlloc` calls of
//! `CanopyUnchecked`, whose unchecked `dealloc` trusts the layouts.

use canopy_alloc::CanopyUnchecked;
use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout};

#[derive(Debug, Clone)]
enum Op {
    Alloc(usize),
    Zeroed(usize),
    Aligned(usize, u32),
    Realloc(usize, usize),
    Free(usize),
    Class(usize),
    /// `free_class_unchecked` of a block from `Alloc` or `Class` (others
    /// are freed with `free`: the unchecked free needs the class the block
    /// was allocated with).
    FreeUnchecked(usize),
    /// `CanopyUnchecked`'s `alloc` of a layout (size, log2 of the alignment).
    GlobalAlloc(usize, u32),
    /// `CanopyUnchecked`'s `realloc` of a block from `GlobalAlloc` (others
    /// are left alone: only such blocks have a layout).
    GlobalRealloc(usize, usize),
    /// `CanopyUnchecked`'s `dealloc` of a block from `GlobalAlloc` (others
    /// are freed with `free`).
    GlobalDealloc(usize),
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        8 => 0usize..=256,
        4 => 257usize..=8192,
        2 => 8193usize..=262_144,
        1 => 262_145usize..=(6 << 20),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => size().prop_map(Op::Alloc),
        1 => size().prop_map(Op::Zeroed),
        1 => (size(), 4u32..=21).prop_map(|(s, a)| Op::Aligned(s, a)),
        2 => (any::<usize>(), size()).prop_map(|(i, s)| Op::Realloc(i, s)),
        4 => any::<usize>().prop_map(Op::Free),
        1 => (0usize..canopy_alloc::NUM_CLASSES).prop_map(Op::Class),
        2 => any::<usize>().prop_map(Op::FreeUnchecked),
        2 => (size(), 0u32..=7).prop_map(|(s, a)| Op::GlobalAlloc(s, a)),
        1 => (any::<usize>(), size()).prop_map(|(i, s)| Op::GlobalRealloc(i, s)),
        2 => any::<usize>().prop_map(Op::GlobalDealloc),
    ]
}

struct Live {
    p: *mut u8,
    n: usize,
    byte: u8,
    /// The class the block was allocated with (`Alloc`, `Class`).
    cls: Option<canopy_alloc::SizeClass>,
    /// The layout of a block of `CanopyUnchecked` (`GlobalAlloc`, `GlobalRealloc`).
    layout: Option<Layout>,
}

fn fill(l: &Live) {
    // SAFETY: l.p has l.n bytes.
    unsafe { std::ptr::write_bytes(l.p, l.byte, l.n) };
}

fn intact(l: &Live) -> bool {
    // SAFETY: l.p has l.n bytes.
    let s = unsafe { std::slice::from_raw_parts(l.p, l.n) };
    s.iter().all(|&b| b == l.byte)
}

/// Whether the `n` bytes at `p` (at least one) overlap no live block.
fn disjoint_from(live: &[Live], p: *mut u8, n: usize) -> bool {
    live.iter().all(|l| p as usize + n.max(1) <= l.p as usize || l.p as usize + l.n.max(1) <= p as usize)
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut live: Vec<Live> = Vec::new();
    let mut next_byte = 1u8;
    for op in ops {
        next_byte = next_byte.wrapping_add(1).max(1);
        match op {
            Op::Alloc(n) | Op::Zeroed(n) | Op::Aligned(n, _) | Op::Class(n) => {
                let (p, n, align) = match op {
                    Op::Alloc(_) => (canopy_alloc::alloc(n), n, 16),
                    Op::Zeroed(_) => {
                        let p = canopy_alloc::alloc_zeroed(n);
                        // SAFETY: p has n bytes.
                        let z = unsafe { std::slice::from_raw_parts(p, n) };
                        prop_assert!(z.iter().all(|&b| b == 0), "alloc_zeroed({}) not zeroed", n);
                        (p, n, 16)
                    }
                    Op::Aligned(_, a) => (canopy_alloc::alloc_aligned(n, 1 << a), n, 1usize << a),
                    Op::Class(c) => {
                        let cls = canopy_alloc::SizeClass::from_index(c).unwrap();
                        (canopy_alloc::alloc_class(cls), cls.size(), 16)
                    }
                    _ => unreachable!(),
                };
                prop_assert!(!p.is_null());
                prop_assert_eq!(p as usize % align, 0);
                // SAFETY: p is live.
                let usable = unsafe { canopy_alloc::usable_size(p) };
                prop_assert!(usable >= n, "usable size {} < {}", usable, n);
                prop_assert!(disjoint_from(&live, p, n), "new block overlaps a live one");
                let cls = match op {
                    Op::Alloc(_) => canopy_alloc::SizeClass::of(n.max(1)),
                    Op::Class(c) => canopy_alloc::SizeClass::from_index(c),
                    _ => None,
                };
                let l = Live { p, n, byte: next_byte, cls, layout: None };
                fill(&l);
                live.push(l);
            }
            Op::Realloc(i, n) => {
                if live.is_empty() {
                    continue;
                }
                let k = i % live.len();
                let old = live.swap_remove(k);
                prop_assert!(intact(&old));
                // SAFETY: old.p is live.
                let q = unsafe { canopy_alloc::realloc(old.p, n) };
                if n == 0 {
                    prop_assert!(q.is_null());
                    continue;
                }
                prop_assert!(!q.is_null());
                let kept = Live { p: q, n: old.n.min(n), byte: old.byte, cls: None, layout: None };
                prop_assert!(intact(&kept), "realloc {} -> {} lost data", old.n, n);
                let l = Live { p: q, n, byte: next_byte, cls: None, layout: None };
                fill(&l);
                live.push(l);
            }
            Op::Free(i) => {
                if live.is_empty() {
                    continue;
                }
                let l = live.swap_remove(i % live.len());
                prop_assert!(intact(&l));
                // SAFETY: l.p is live.
                unsafe { canopy_alloc::free(l.p) };
            }
            Op::FreeUnchecked(i) => {
                if live.is_empty() {
                    continue;
                }
                let l = live.swap_remove(i % live.len());
                prop_assert!(intact(&l));
                // SAFETY: l.p is live, allocated with class cls (or a size in
                // it), and freed once.
                unsafe {
                    match l.cls {
                        Some(c) => canopy_alloc::free_class_unchecked(l.p, c),
                        None => canopy_alloc::free(l.p),
                    }
                }
            }
            Op::GlobalAlloc(n, a) => {
                let layout = Layout::from_size_align(n.max(1), 1 << a).unwrap();
                // SAFETY: a layout of non-zero size.
                let p = unsafe { CanopyUnchecked.alloc(layout) };
                prop_assert!(!p.is_null());
                prop_assert_eq!(p as usize % layout.align(), 0);
                prop_assert!(disjoint_from(&live, p, layout.size()), "new block overlaps a live one");
                let l = Live { p, n: layout.size(), byte: next_byte, cls: None, layout: Some(layout) };
                fill(&l);
                live.push(l);
            }
            Op::GlobalRealloc(i, n) => {
                let Some(k) = (!live.is_empty()).then(|| i % live.len()).filter(|&k| live[k].layout.is_some()) else {
                    continue;
                };
                let old = live.swap_remove(k);
                prop_assert!(intact(&old));
                let layout = old.layout.unwrap();
                let n = n.max(1);
                // SAFETY: old.p is live with this layout; n > 0.
                let q = unsafe { CanopyUnchecked.realloc(old.p, layout, n) };
                prop_assert!(!q.is_null());
                prop_assert_eq!(q as usize % layout.align(), 0);
                let kept = Live { p: q, n: old.n.min(n), byte: old.byte, cls: None, layout: None };
                prop_assert!(intact(&kept), "realloc {} -> {} lost data", old.n, n);
                let layout = Layout::from_size_align(n, layout.align()).unwrap();
                let l = Live { p: q, n, byte: next_byte, cls: None, layout: Some(layout) };
                fill(&l);
                live.push(l);
            }
            Op::GlobalDealloc(i) => {
                if live.is_empty() {
                    continue;
                }
                let l = live.swap_remove(i % live.len());
                prop_assert!(intact(&l));
                // SAFETY: l.p is live (with l.layout where it has one) and
                // freed once.
                unsafe {
                    match l.layout {
                        Some(layout) => CanopyUnchecked.dealloc(l.p, layout),
                        None => canopy_alloc::free(l.p),
                    }
                }
            }
        }
        for l in &live {
            prop_assert!(intact(l), "a live block of {} bytes was overwritten", l.n);
        }
    }
    prop_assert_eq!(canopy_alloc::check_invariants(), Ok(()));
    for l in live {
        // SAFETY: l.p is live.
        unsafe { canopy_alloc::free(l.p) };
    }
    prop_assert_eq!(canopy_alloc::check_invariants(), Ok(()));
    // Kept blocks back home, so that no case starts with the last one's.
    canopy_alloc::collect();
    prop_assert_eq!(canopy_alloc::check_invariants(), Ok(()));
    Ok(())
}

fn cases() -> u32 {
    std::env::var("CANOPY_PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_match_the_model(ops in proptest::collection::vec(op(), 1..200)) {
        run(ops)?;
    }
}
