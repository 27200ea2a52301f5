//! Heap records are recycled: after a run, none of its tasks' or merged
//! heaps' records is still alive. (A separate test binary, so no other test
//! runs task trees at the same time.)

#![cfg(not(canopy_loom))]

use canopy_hh::{live_heap_records, run, run_keep, Val};

#[test]
fn every_record_of_a_run_is_recycled() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
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

#[test]
fn a_kept_heap_holds_its_records_until_dropped() {
    // The tests of this binary run on separate threads: SERIAL keeps their
    // runs apart so that the counts compare.
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let kept = run_keep(|s| {
        let (a, b) = s.par_gc(|s| s.tuple(&[Val::Int(1)]), |s| s.tuple(&[Val::Int(2)]));
        s.tuple(&[Val::Obj(a), Val::Obj(b)])
    });
    assert!(live_heap_records() >= 1, "the kept heap's record is alive");
    let sum = kept.read(|s, p| {
        (0..2).map(|i| s.get_int(s.get(p, i).as_obj().unwrap(), 0)).sum::<i64>()
    });
    assert_eq!(sum, 3);
    drop(kept);
    assert_eq!(live_heap_records(), 0);
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
