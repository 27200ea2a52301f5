//! Heap records are recycled: after a run, none of its tasks' or merged
//! heaps' records is still alive. (A separate test binary, so no other test
//! runs task trees at the same time.)

#![cfg(not(canopy_loom))]

use canopy_hh::{live_heap_records, run, Val};

#[test]
fn every_record_of_a_run_is_recycled() {
    assert_eq!(live_heap_records(), 0);
    let n = run(|s| {
        let a = s.array(100, Val::Int(0));
        s.par_for(0..100, 1, |s, i| {
            let t = s.tuple(&[Val::Int(i as i64)]);
            s.set(a, i, Val::Obj(t));
        });
        s.collect();
        let mut n = 0;
        for i in 0..100 {
            let t = s.get(a, i).as_obj().unwrap();
            n += s.get_int(t, 0);
        }
        assert!(live_heap_records() >= 1);
        n
    });
    assert_eq!(n, 4950);
    assert_eq!(live_heap_records(), 0);
}
