//! Holes under threads: an arena that grows (a 1 GiB `RLIMIT_AS` set
//! before Canopy starts), with no free memory retained
//! (`CANOPY_RETAIN_MB=0`, `CANOPY_DECAY_MS=0`, no large cache), so that
//! every free of a large chunk unmaps free spans, below live memory too
//! (holes), while other threads allocate: each hole is mapped again when
//! its units are handed out.  Four threads allocate blocks of every kind
//! (small to 3 MiB), fill them, hand some to the next thread (whose free is
//! remote), free the rest in random order, and one calls `collect()` now and
//! then; every block's bytes are checked before it is freed.  At the end the
//! invariants hold and `collect()` leaves little mapped.  Work scales with
//! `CANOPY_STRESS_SCALE` (default 1; no test harness, so nothing of Canopy
//! runs before the limit and the options are set).

mod common;

use std::sync::{Arc, Barrier, Mutex};

const LIMIT: usize = 1 << 30;
const THREADS: usize = 4;

fn scale() -> usize {
    std::env::var("CANOPY_STRESS_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1)
}

/// A block: address, length, the byte it is filled with.
#[derive(Clone, Copy)]
struct Block(usize, usize, u8);

fn fill(b: Block) {
    // SAFETY: b.0 has b.1 bytes, ours.
    unsafe { core::ptr::write_bytes(b.0 as *mut u8, b.2, b.1) };
}

fn check_and_free(b: Block) {
    let p = b.0 as *const u8;
    let step = (b.1 / 61).max(1);
    // SAFETY: b.0 has b.1 bytes, written by `fill`.
    unsafe {
        for i in (0..b.1).step_by(step).chain([b.1 - 1]) {
            assert_eq!(p.add(i).read(), b.2, "byte {i} of a {}-byte block at {p:p}", b.1);
        }
        canopy_alloc::free(b.0 as *mut u8);
    }
}

fn main() {
    common::set_soft_limit(LIMIT);
    // Read when Canopy starts (below): one thread so far.
    std::env::set_var("CANOPY_RETAIN_MB", "0");
    std::env::set_var("CANOPY_DECAY_MS", "0");
    std::env::set_var("CANOPY_LARGE_CACHE_KB", "0");
    let first = canopy_alloc::alloc(100);
    assert!(!first.is_null());
    assert!(canopy_alloc::arena::arena_grows(), "under a limit the arena grows");
    assert_eq!(canopy_alloc::options().retain_bytes, 0);

    let rounds = 400 * scale();
    let inboxes: Arc<Vec<Mutex<Vec<Block>>>> = Arc::new((0..THREADS).map(|_| Mutex::new(Vec::new())).collect());
    let barrier = Arc::new(Barrier::new(THREADS));
    let decommits_before = canopy_alloc::stats::snapshot().decommits;
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let inboxes = inboxes.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
                let mut rnd = move |n: usize| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % n as u64) as usize
                };
                barrier.wait();
                let mut live: Vec<Block> = Vec::new();
                for round in 0..rounds {
                    let len = match rnd(10) {
                        0 | 1 => (64 << 10) + rnd(3 << 20),
                        2 | 3 => 9000 + rnd(120_000),
                        _ => 1 + rnd(4000),
                    };
                    let p = canopy_alloc::alloc(len);
                    assert!(!p.is_null(), "thread {t}, round {round}: {len} bytes");
                    let b = Block(p as usize, len, (round as u8) ^ (t as u8) << 5);
                    fill(b);
                    if rnd(4) == 0 {
                        inboxes[(t + 1) % THREADS].lock().unwrap().push(b);
                    } else {
                        live.push(b);
                    }
                    // Keep the live set small: most of the arena's free
                    // memory then lies below live blocks.
                    while live.len() > 24 {
                        check_and_free(live.swap_remove(rnd(live.len())));
                    }
                    if round % 8 == 0 {
                        let theirs = std::mem::take(&mut *inboxes[t].lock().unwrap());
                        theirs.into_iter().for_each(check_and_free);
                    }
                    if t == 0 && round % 50 == 0 {
                        canopy_alloc::collect();
                    }
                }
                live.into_iter().for_each(check_and_free);
                barrier.wait();
                let theirs = std::mem::take(&mut *inboxes[t].lock().unwrap());
                theirs.into_iter().for_each(check_and_free);
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a worker failed");
    }
    // SAFETY: allocated above, freed once.
    unsafe { canopy_alloc::free(first) };
    canopy_alloc::check_invariants().expect("invariants after the threads");
    let s = canopy_alloc::stats::snapshot();
    assert!(s.decommits > decommits_before + rounds as u64 / 10, "memory went back as it was freed ({} decommits)", s.decommits - decommits_before);
    canopy_alloc::collect();
    canopy_alloc::check_invariants().expect("invariants after collect");
    let s = canopy_alloc::stats::snapshot();
    assert!(s.reserved_bytes < 128 << 20, "{} bytes still reserved after collect", s.reserved_bytes);
    println!("holes_stress ok ({rounds} rounds x {THREADS} threads, {} decommits, {} bytes reserved at the end)", s.decommits - decommits_before, s.reserved_bytes);
}
