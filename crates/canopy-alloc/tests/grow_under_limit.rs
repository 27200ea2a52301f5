//! Canopy started under a limit on address space (`RLIMIT_AS`, what
//! `ulimit -v` sets; no test harness, so nothing of Canopy runs before the
//! limit is set): the arena is not reserved whole but starts at 4 MiB, grows
//! as blocks need units, never past the limit, and refuses what does not
//! fit with null.  The fast paths' range check follows the arena as it
//! grows: a pointer past the mapped units is refused, not read.  (The
//! library's whole unit-test suite also runs under `ulimit -v` in
//! `scripts/test.sh`, so every path runs on an arena that grows.)

use canopy_alloc::arena;

const LIMIT: usize = 768 << 20;

fn main() {
    // The hard limit stays (it may not be raised: `scripts/test.sh` runs
    // this under `ulimit -v` too).
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: r is a valid out-pointer.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) }, 0, "getrlimit");
    assert!(r.rlim_max == libc::RLIM_INFINITY || r.rlim_max >= LIMIT as libc::rlim_t, "a hard limit below {LIMIT} bytes");
    r.rlim_cur = LIMIT as libc::rlim_t;
    // SAFETY: r is a valid rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &r) }, 0, "setrlimit");
    assert_eq!(canopy_sys::address_space_limit(), Some(LIMIT));

    let first = canopy_alloc::alloc(100);
    assert!(!first.is_null());
    assert!(arena::arena_grows(), "under a limit the arena grows");
    let units = arena::arena_units();
    assert_eq!(units, 4 * arena::PAGE_UNITS, "it starts at 4 MiB");
    assert_eq!(arena::arena_limit(), units * arena::UNIT);
    assert!(arena::arena_cap() * arena::UNIT <= LIMIT, "never past the limit");
    assert_eq!(arena::arena_base() % arena::base_align(), 0);
    assert_eq!(canopy_alloc::stats::snapshot().reserved_bytes as usize, units * arena::UNIT);

    // 256 MiB in small, medium and large blocks: the arena grows under them.
    let mut held = Vec::new();
    let mut total = 0usize;
    let mut x = 0x9e37_79b9u32;
    while total < 256 << 20 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let len = match x % 8 {
            0 => (1 << 20) + (x as usize % (2 << 20)),
            1 | 2 => 9000 + (x as usize % 100_000),
            _ => 1 + (x as usize % 2000),
        };
        let p = canopy_alloc::alloc(len);
        assert!(!p.is_null(), "{len} bytes after {total}");
        // SAFETY: p has len bytes.
        unsafe {
            p.write(held.len() as u8);
            p.add(len - 1).write(held.len() as u8);
        }
        held.push((p, len));
        total += len;
    }
    let grown = arena::arena_units();
    assert!(grown * arena::UNIT >= total && grown > units, "grew from {units} to {grown} units for {total} bytes");
    assert!(grown <= arena::arena_cap());
    assert_eq!(arena::arena_limit(), grown * arena::UNIT);
    let past_first = held.iter().filter(|&&(p, _)| p as usize >= arena::arena_base() + units * arena::UNIT).count();
    assert!(past_first * 2 > held.len(), "most blocks lie in units the arena grew by ({past_first} of {})", held.len());
    for (i, &(p, len)) in held.iter().enumerate() {
        // SAFETY: p has len bytes, written above.
        unsafe {
            assert_eq!(p.read(), i as u8);
            assert_eq!(p.add(len - 1).read(), i as u8);
        }
    }
    canopy_alloc::check_invariants().expect("invariants after growing");

    // A pointer past the mapped units (where a whole arena would have
    // units) and one among the tables below the base: refused, not read.
    // (Check mode, on in debug builds, aborts on them by design.)
    if !canopy_alloc::options().check {
        let beyond = (arena::arena_base() + arena::arena_cap() * arena::UNIT + (1 << 30)) as *mut u8;
        let below = (arena::arena_base() - (1 << 30) + 4096) as *mut u8;
        // SAFETY: refused with a message (the default mode), nothing read.
        assert_eq!(unsafe { canopy_alloc::usable_size(beyond) }, 0);
        // SAFETY: as above.
        unsafe {
            canopy_alloc::free(beyond);
            canopy_alloc::free(below);
        }
    }

    // What cannot fit under the limit is null; what was held is intact.
    let huge = canopy_alloc::alloc(LIMIT);
    assert!(huge.is_null(), "a block as large as the limit");
    for (p, _) in held.drain(..) {
        // SAFETY: allocated above, freed once.
        unsafe { canopy_alloc::free(p) };
    }
    // SAFETY: as above.
    unsafe { canopy_alloc::free(first) };
    canopy_alloc::check_invariants().expect("invariants after freeing");

    // Given back: the free span at the top goes back to the OS, addresses
    // included (under a limit they are what other mappings need).  Here
    // nothing is live above the first 3 MiB once `collect` has given back
    // the heap's empty medium page (it had been the arena's last page).
    let size_before = vm_size();
    canopy_alloc::collect();
    canopy_alloc::check_invariants().expect("invariants after giving the top back");
    let mapped = arena::mapped_units();
    assert!(mapped * 2 < grown, "the top given back: {mapped} of {grown} units still mapped");
    assert_eq!(arena::arena_units(), grown, "the descriptors stay");
    assert_eq!(canopy_alloc::stats::snapshot().reserved_bytes as usize, mapped * arena::UNIT);
    let size_after = vm_size();
    assert!(size_after + (((grown - mapped) * arena::UNIT) >> 10) / 2 < size_before, "VmSize {size_before} kB -> {size_after} kB");
    // A stale pointer into the given-back units is refused, not read.
    if !canopy_alloc::options().check {
        let stale = (arena::arena_base() + (grown - 1) * arena::UNIT) as *mut u8;
        // SAFETY: refused with a message, nothing read.
        unsafe { canopy_alloc::free(stale) };
    }
    // Mapped again when needed: the same again needs no more descriptors.
    let p = canopy_alloc::alloc(200 << 20);
    assert!(!p.is_null());
    // SAFETY: p has 200 MiB.
    unsafe {
        p.write_bytes(0x5a, 200 << 20);
        assert_eq!(p.add((200 << 20) - 1).read(), 0x5a);
    }
    assert_eq!(arena::arena_units(), grown, "mapped again, not grown");
    assert!(arena::mapped_units() > mapped);
    // SAFETY: as above.
    unsafe { canopy_alloc::free(p) };
    canopy_alloc::check_invariants().expect("invariants at the end");
    println!("grow_under_limit ok");
}

/// The process's mapped address space (`VmSize`, kB).
fn vm_size() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmSize:")).expect("a VmSize line");
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmSize in kB")
}
