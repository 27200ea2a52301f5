//! The example in the workspace README compiles and computes what it says.

#[test]
fn readme_example() {
    let total = canopy_hh::run(|s| {
        let xs = s.raw_from::<i64>(&[3, 1, 4, 1, 5, 9, 2, 6]);
        s.par_reduce(0..8, 2, |s, r| s.raw_slice::<i64>(xs)[r].iter().sum::<i64>(), |a, b| a + b)
    });
    assert_eq!(total, 31);
}
