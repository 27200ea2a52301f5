//! What the tests that run under a limit on address space share.

/// Set the soft limit on address space (`RLIMIT_AS`) to `bytes`, leaving
/// the hard limit as it is (it may not be raised: `scripts/test.sh` runs
/// these tests under `ulimit -v` too, so it must allow `bytes`).
pub fn set_soft_limit(bytes: usize) {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: r is a valid out-pointer.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) }, 0, "getrlimit");
    assert!(r.rlim_max == libc::RLIM_INFINITY || r.rlim_max >= bytes as libc::rlim_t, "a hard limit below {bytes} bytes");
    r.rlim_cur = bytes as libc::rlim_t;
    // SAFETY: r is a valid rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &r) }, 0, "setrlimit");
}
