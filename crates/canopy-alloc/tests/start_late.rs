//! Canopy started by a process that already has other threads (no test
//! harness; one thread of ours is alive): no solo period, since registering
//! for the membarrier that ends one would wait for an RCU grace period
//! (see `solo::init`).  The global heap works with its lock.

use std::sync::mpsc;

fn main() {
    let (go, wait) = mpsc::channel::<()>();
    let (ready, is_ready) = mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        ready.send(()).unwrap();
        wait.recv().unwrap();
    });
    is_ready.recv().unwrap();
    assert!(canopy_sys::thread_count().unwrap() >= 2);
    let p = canopy_alloc::alloc(100);
    assert!(!p.is_null());
    assert!(!canopy_alloc::solo_mode(), "started with two threads: no solo period");
    let before = canopy_alloc::stats::snapshot();
    let big = canopy_alloc::alloc(8 << 20);
    assert!(!big.is_null());
    // SAFETY: both blocks came from alloc and are freed once.
    unsafe {
        canopy_alloc::free(big);
        canopy_alloc::free(p);
    }
    let after = canopy_alloc::stats::snapshot();
    assert_eq!(after.unlocked_global_entries, before.unlocked_global_entries, "every entry took the lock");
    assert!(after.large_allocs > before.large_allocs);
    go.send(()).unwrap();
    other.join().unwrap();
    // Alone again with the lock: leaving the global heap may begin a solo
    // period only where the kernel's barrier was registered, so none here.
    let q = canopy_alloc::alloc(8 << 20);
    // SAFETY: q came from alloc and is freed once.
    unsafe { canopy_alloc::free(q) };
    assert_eq!(canopy_alloc::stats::snapshot().solo_periods, 0);
    println!("start_late ok");
}
