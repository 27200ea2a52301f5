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
    let s = fold(
        &[0, big - 1, big - 1],
        &[2, big, big],
        0usize,
        |iv| iv[0] + 1,
        |a, b| a + b,
    );
    assert_eq!(s, 3);
}

/// An index space with more elements than a word counts: a clear panic,
/// never a silently truncated fold (in release builds the product wrapped:
/// 2^33 * 2^33 folded zero elements and returned the neutral element).
#[test]
#[should_panic(expected = "too many elements")]
fn fold_over_an_index_space_too_large_to_count_panics() {
    let big = 1usize << 33;
    let s = fold(&[0, 0], &[big, big], 0u64, |_| 1, |a, b| a + b);
    panic!("fold returned {s}");
}

/// A `genarray` shape with too many elements panics naming the shape (it
/// used to overflow while sizing the generators first, in debug builds).
#[test]
#[should_panic(expected = "too many elements")]
fn genarray_shape_too_large_panics_naming_it() {
    let big = 1usize << 40;
    let _a: canopy_rc::Array<u8> = canopy_rc::genarray(
        &[big, big, 1],
        0,
        &[canopy_rc::Gen::new(&[0, 0, 0], &[big, big, 1], |_| 1)],
    );
}
