//! The examples in the workspace README and the crate README compile and
//! compute what they say.

#![cfg(not(canopy_loom))]

#[test]
fn readme_example() {
    let total = canopy_hh::run(|s| {
        let xs = s.raw_from::<i64>(&[3, 1, 4, 1, 5, 9, 2, 6]);
        s.par_reduce(0..8, 2, |s, r| s.raw_slice::<i64>(xs)[r].iter().sum::<i64>(), |a, b| a + b)
    });
    assert_eq!(total, 31);
}

#[test]
fn crate_readme_example() {
    use canopy_hh::{run, Val};
    let n = run(|s| {
        let shared = s.array(2, Val::Int(0));
        s.par(
            |s| {
                let t = s.tuple(&[Val::Int(40)]);
                s.set(shared, 0, Val::Obj(t));
            },
            |s| {
                let t = s.tuple(&[Val::Int(2)]);
                s.set(shared, 1, Val::Obj(t));
            },
        );
        let a = s.get(shared, 0).as_obj().unwrap();
        let b = s.get(shared, 1).as_obj().unwrap();
        s.get_int(a, 0) + s.get_int(b, 0)
    });
    assert_eq!(n, 42);
}
