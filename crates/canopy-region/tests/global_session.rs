//! Sessions of the process-wide region allocator (`canopy_region::global`):
//! one thread allocating in one region with the lock held once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use canopy_region::{global, RegionError, RegionId};

fn is_session_error(e: &RegionError, needle: &str) -> bool {
    matches!(e, RegionError::Session(m) if m.contains(needle))
}

#[test]
fn a_session_allocates_in_its_region_and_refuses_misuse() {
    let r = global::with(|ra| ra.ralloc(RegionId::ROOT, 0)).unwrap().unwrap();
    let s = global::session_begin(r).unwrap();
    let mut ps = Vec::new();
    for i in 0..5000usize {
        let p = global::session_alloc(s, 8 + i % 300).unwrap();
        // SAFETY: a fresh object of at least 8 bytes.
        unsafe { p.as_ptr().cast::<u64>().write_unaligned(i as u64) };
        ps.push(p);
    }
    global::session_free(s, ps.pop().unwrap()).unwrap();
    // The session's thread cannot make other calls (they would wait for its
    // own lock), nor begin a second session; wrong handles are refused.
    let e = global::with(|_| ()).unwrap_err();
    assert!(is_session_error(&e, "end it first"), "{e}");
    let e = global::session_begin(r).unwrap_err();
    assert!(is_session_error(&e, "end it first"), "{e}");
    let e = global::session_alloc(s + 1, 8).unwrap_err();
    assert!(is_session_error(&e, "not open"), "{e}");
    // Another thread: the handle is not its own; its own calls wait.
    let done = Arc::new(AtomicBool::new(false));
    let other = {
        let done = done.clone();
        std::thread::spawn(move || {
            let e = global::session_alloc(s, 8).unwrap_err();
            assert!(is_session_error(&e, "not open on this thread"), "{e}");
            let n = global::with(|ra| ra.region_stats(r).map(|st| st.objects)).unwrap().unwrap();
            done.store(true, Ordering::SeqCst);
            n
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(30));
    assert!(!done.load(Ordering::SeqCst), "another thread's call ran inside the session");
    global::session_end(s).unwrap();
    // The other thread saw every object the session made.
    assert_eq!(other.join().unwrap(), 4999);
    let e = global::session_end(s).unwrap_err();
    assert!(is_session_error(&e, "not open"), "{e}");
    for (i, p) in ps.iter().enumerate() {
        // SAFETY: written above; the region is alive.
        assert_eq!(unsafe { p.as_ptr().cast::<u64>().read_unaligned() }, i as u64);
    }
    global::with(|ra| ra.rfree(r)).unwrap().unwrap();
    let e = global::session_begin(r).unwrap_err();
    assert_eq!(e, RegionError::FreedRegion(r));
}

#[test]
fn a_thread_that_ends_inside_its_session_gives_the_lock_back() {
    let r = global::with(|ra| ra.ralloc(RegionId::ROOT, 0)).unwrap().unwrap();
    std::thread::spawn(move || {
        let s = global::session_begin(r).unwrap();
        global::session_alloc(s, 64).unwrap();
    })
    .join()
    .unwrap();
    let n = global::with(|ra| ra.region_stats(r).map(|st| st.objects)).unwrap().unwrap();
    assert_eq!(n, 1);
    global::with(|ra| ra.rfree(r)).unwrap().unwrap();
}

#[test]
fn a_session_begun_in_a_thread_local_destructor_is_ended_too() {
    struct Late(RegionId);
    impl Drop for Late {
        fn drop(&mut self) {
            // Begun as the thread ends, after any earlier session's hook
            // could have run, and never ended.
            if let Ok(s) = global::session_begin(self.0) {
                let _ = global::session_alloc(s, 32);
            }
        }
    }
    thread_local! {
        static LATE: std::cell::Cell<Option<Late>> = const { std::cell::Cell::new(None) };
    }
    let r = global::with(|ra| ra.ralloc(RegionId::ROOT, 0)).unwrap().unwrap();
    std::thread::spawn(move || {
        // `Late` first, then a session: whatever the session set up for
        // this thread's end after `Late` is in place may be gone by the time
        // `Late` is dropped.
        LATE.with(|l| l.set(Some(Late(r))));
        let s = global::session_begin(r).unwrap();
        global::session_end(s).unwrap();
    })
    .join()
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(global::with(|ra| ra.region_stats(r).map(|st| st.objects)).unwrap().unwrap());
    });
    let n = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the region lock was lost with a thread that ended");
    assert_eq!(n, 1);
    global::with(|ra| ra.rfree(r)).unwrap().unwrap();
}
