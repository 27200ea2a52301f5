//! Canopy started by a process with one thread (no test harness): solo
//! periods are on, so the global heap is entered without its lock.

fn main() {
    assert_eq!(canopy_sys::thread_count(), Some(1), "the process has one thread before Canopy starts");
    assert!(!canopy_alloc::solo_mode(), "no solo period before the start");
    let p = canopy_alloc::alloc(100);
    assert!(!p.is_null());
    assert!(canopy_alloc::solo_mode(), "started alone: a solo period");
    // A large block enters the global heap: without the lock.
    let before = canopy_alloc::stats::snapshot().unlocked_global_entries;
    let big = canopy_alloc::alloc(8 << 20);
    assert!(!big.is_null());
    // SAFETY: both blocks came from alloc and are freed once.
    unsafe {
        canopy_alloc::free(big);
        canopy_alloc::free(p);
    }
    let after = canopy_alloc::stats::snapshot().unlocked_global_entries;
    assert!(after > before, "unlocked entries {before} -> {after}");
    println!("start_alone ok");
}
