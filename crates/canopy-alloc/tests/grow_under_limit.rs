//! Canopy started under a limit on address space (`RLIMIT_AS`, what
//! `ulimit -v` sets; no test harness, so nothing of Canopy runs before the
//! limit is set): the arena is not reserved whole but starts at 4 MiB, grows
//! as blocks need units, never past the limit, and refuses what does not
//! fit with null.  The fast paths' range check follows the arena as it
//! grows: a pointer past the mapped units is refused, not read.  (The
//! library's whole unit-test suite also runs under `ulimit -v` in
//! `scripts/test.sh`, so every path runs on an arena that grows.)

mod common;

use canopy_alloc::arena;
use common::set_soft_limit;

const LIMIT: usize = 768 << 20;

fn main() {
    set_soft_limit(LIMIT);
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
    // Below the top, free spans are holes now (see below): not reserved.
    assert!(canopy_alloc::stats::snapshot().reserved_bytes as usize <= mapped * arena::UNIT);
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
    canopy_alloc::check_invariants().expect("invariants after mapping the top again");

    // Below live memory: a free span there becomes a hole, its addresses
    // given back too, and is mapped again when it is handed out.
    const A: usize = 96 << 20;
    let a = canopy_alloc::alloc(A);
    let c = canopy_alloc::alloc(8 << 20);
    assert!(!a.is_null() && !c.is_null());
    assert!((c as usize) >= a as usize + A, "C lies above A: a {a:p}, c {c:p}, base {:#x}", arena::arena_base());
    // SAFETY: a has A bytes, c 8 MiB.
    unsafe {
        a.write_bytes(0x11, A);
        c.write_bytes(0x22, 8 << 20);
        canopy_alloc::free(a);
    }
    let size_before = vm_size();
    let reserved_before = canopy_alloc::stats::snapshot().reserved_bytes as usize;
    canopy_alloc::collect();
    canopy_alloc::check_invariants().expect("invariants after making a hole");
    let size_after = vm_size();
    let reserved_after = canopy_alloc::stats::snapshot().reserved_bytes as usize;
    assert!(size_after + (A >> 10) <= size_before, "VmSize {size_before} kB -> {size_after} kB: A's addresses given back");
    assert!(reserved_after + A <= reserved_before, "reserved {reserved_before} -> {reserved_after} bytes");
    // A stale pointer into the hole is refused, not read.
    if !canopy_alloc::options().check {
        // SAFETY: refused with a message, nothing read.
        unsafe { canopy_alloc::free(a.add(A / 2)) };
    }
    // The hole is handed out again, mapped and clean.
    let z = canopy_alloc::calloc(1, A);
    assert!(!z.is_null());
    assert!(z as usize >= a as usize && (z as usize) < a as usize + A, "A's units taken again");
    // SAFETY: z has A bytes; c 8 MiB, still live.
    unsafe {
        assert!((0..A).step_by(4096).all(|i| z.add(i).read() == 0), "calloc'd memory from a hole reads as zero");
        z.write_bytes(0x33, A);
        assert_eq!(z.add(A - 1).read(), 0x33);
        assert!((0..8 << 20).step_by(4096).all(|i| c.add(i).read() == 0x22), "C untouched");
    }
    assert!(canopy_alloc::stats::snapshot().reserved_bytes as usize >= reserved_after + A);
    canopy_alloc::check_invariants().expect("invariants after mapping the hole again");

    // The program maps a page of its own in a hole: Canopy never hands out
    // those units, never unmaps the page, and keeps growing past it.
    // SAFETY: z has A bytes and is not used again.
    unsafe { canopy_alloc::free(z) };
    canopy_alloc::collect();
    canopy_alloc::check_invariants().expect("invariants after making the hole again");
    // At the limit, a hole is not mapped again: null, nothing lost.
    set_soft_limit((vm_size() << 10) + (2 << 20));
    let p = canopy_alloc::calloc(1, A);
    assert!(p.is_null(), "no room under the limit for the hole to be mapped again");
    canopy_alloc::check_invariants().expect("invariants after a hole was refused");
    set_soft_limit(LIMIT);
    let theirs = (a as usize + A / 2) & !4095;
    // SAFETY: a fixed mapping where nothing is mapped (the kernel refuses otherwise).
    let m = unsafe {
        libc::mmap(
            theirs as *mut libc::c_void,
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    assert_eq!(m as usize, theirs, "the hole is free for the program's own mapping");
    // SAFETY: the page just mapped.
    unsafe { (m as *mut u64).write(0x7e57_da7a) };
    let mut held = Vec::new();
    for _ in 0..3 {
        let p = canopy_alloc::calloc(1, A);
        assert!(!p.is_null(), "allocated past the hole the program took");
        assert!(p as usize + A <= theirs || p as usize > theirs, "never over the program's page");
        // SAFETY: p has A bytes.
        unsafe { p.write_bytes(0x44, A) };
        held.push(p);
    }
    for p in held {
        // SAFETY: allocated above, freed once.
        unsafe { canopy_alloc::free(p) };
    }
    // SAFETY: c is live, freed once; nothing is live above the hole after it.
    unsafe { canopy_alloc::free(c) };
    canopy_alloc::collect();
    canopy_alloc::check_invariants().expect("invariants with the program's page in a hole");
    // SAFETY: the program's page, still mapped (a read would fault otherwise).
    unsafe {
        assert_eq!((m as *const u64).read(), 0x7e57_da7a, "the program's page survived collect");
        libc::munmap(m, 4096);
    }
    let p = canopy_alloc::calloc(1, A);
    assert!(!p.is_null());
    // SAFETY: p has A bytes.
    unsafe {
        p.write_bytes(0x55, A);
        canopy_alloc::free(p);
    }
    canopy_alloc::check_invariants().expect("invariants after the program's page went");

    // Holes that join the top: a block freed above a hole merges with it into
    // the free span at the top.  `collect` maps the holes again (they are
    // still empty) and gives the whole span back, lowering the top; a span
    // at the top whose holes cannot be mapped at that moment (here the limit
    // is lowered) stays, and a request longer than it starts in it rather
    // than above it, so its positions are not stranded: either way 500 MiB
    // fit in the 768 MiB the arena may span.
    const BIG: usize = 300 << 20;
    for refused in [false, true] {
        let a = canopy_alloc::alloc(BIG);
        assert!(!a.is_null());
        // C above A (free spans below A may take the first tries).
        let mut below = Vec::new();
        let c = loop {
            let c = canopy_alloc::alloc(8 << 20);
            assert!(!c.is_null());
            if c as usize >= a as usize + BIG {
                break c;
            }
            below.push(c);
        };
        for b in below {
            // SAFETY: allocated above, freed once.
            unsafe { canopy_alloc::free(b) };
        }
        // SAFETY: a has BIG bytes, c 8 MiB; each freed once.
        unsafe {
            a.write_bytes(0x66, BIG);
            c.write_bytes(0x77, 8 << 20);
            canopy_alloc::free(a);
        }
        canopy_alloc::collect();
        // SAFETY: as above.
        unsafe { canopy_alloc::free(c) };
        if refused {
            set_soft_limit((vm_size() << 10) + (2 << 20));
        }
        canopy_alloc::collect();
        set_soft_limit(LIMIT);
        canopy_alloc::check_invariants().expect("invariants after the top's holes");
        let reserved = canopy_alloc::stats::snapshot().reserved_bytes as usize;
        assert!(reserved < 64 << 20, "{reserved} bytes reserved with nothing large live (refused: {refused})");
        if !refused {
            let mapped = arena::mapped_units() * arena::UNIT;
            assert!(mapped < 64 << 20, "the top lowered over the joined span: {mapped} bytes still mapped");
        }
        let p = canopy_alloc::alloc(500 << 20);
        assert!(!p.is_null(), "500 MiB after the top's holes (refused: {refused})");
        if refused {
            assert_eq!(p, a, "the request starts in the span of holes at the top");
        }
        // SAFETY: p has 500 MiB.
        unsafe {
            p.write_bytes(0x88, 500 << 20);
            assert_eq!(p.add((500 << 20) - 1).read(), 0x88);
            canopy_alloc::free(p);
        }
        canopy_alloc::collect();
        canopy_alloc::check_invariants().expect("invariants after 500 MiB");
    }
    canopy_alloc::check_invariants().expect("invariants at the end");
    println!("grow_under_limit ok");
}

/// The process's mapped address space (`VmSize`, kB).
fn vm_size() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmSize:")).expect("a VmSize line");
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmSize in kB")
}
