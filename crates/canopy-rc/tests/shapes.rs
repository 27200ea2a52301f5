//! Index-space arithmetic at the edges: boxes far from the origin, index
//! spaces whose element count overflows.
#![cfg(not(canopy_loom))]

use canopy_rc::fold;

/// A two-element fold over a box far from the origin: only the box's
/// volume matters, not the extent of `hi` (whose row-major strides
/// overflow a word).
#[test]
fn fold_over_a_small_box_far_from_the_origin() {
    let big = 1usize << 40;
    let s = fold(&[0, big - 1, big - 1], &[2, big, big], 0usize, |iv| iv[0] + 1, |a, b| a + b);
    assert_eq!(s, 3);
}
