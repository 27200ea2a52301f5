//! Unit tests of the allocator (in-process, through the Rust API).
//!
//! SAFETY (every unsafe block here): pointers passed to `free`, `realloc`,
//! `usable_size` and read through `fill`/`verify` come from this allocator and
//! are live, except where a test frees a bad pointer on purpose to check that
//! the allocator refuses it (those tests run only in the default mode).
use super::*;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Tests that compare global counters before and after run alone.
static GLOBAL_COUNTERS: RwLock<()> = RwLock::new(());
fn serial() -> RwLockWriteGuard<'static, ()> {
    GLOBAL_COUNTERS.write().unwrap_or_else(|e| e.into_inner())
}
fn shared() -> RwLockReadGuard<'static, ()> {
    GLOBAL_COUNTERS.read().unwrap_or_else(|e| e.into_inner())
}

fn fill(p: *mut u8, n: usize, seed: u8) {
    for i in 0..n {
        // SAFETY: p has n bytes.
        unsafe { *p.add(i) = seed.wrapping_add(i as u8) };
    }
}

fn verify(p: *mut u8, n: usize, seed: u8) -> bool {
    (0..n).all(|i| unsafe { *p.add(i) } == seed.wrapping_add(i as u8))
}

#[test]
fn small_blocks_are_distinct_aligned_and_reused() {
    let _g = shared();
    let mut ps = Vec::new();
    for i in 0..10_000usize {
        let n = 1 + i % 200;
        let p = alloc(n);
        assert!(!p.is_null());
        assert_eq!(p as usize % 16, 0);
        fill(p, n, i as u8);
        ps.push((p, n, i as u8));
    }
    for &(p, n, s) in &ps {
        assert!(verify(p, n, s));
    }
    check_invariants().unwrap();
    let first = ps[0].0;
    for (p, _, _) in ps {
        unsafe { free(p) };
    }
    check_invariants().unwrap();
    // LIFO reuse: the last freed block of the class comes back first.
    let q = alloc(1);
    assert!(!q.is_null());
    unsafe { free(q) };
    let _ = first;
}

#[test]
fn every_class_round_trips() {
    let _g = shared();
    for c in 0..NUM_CLASSES {
        let cls = SizeClass::from_index(c).unwrap();
        let p = alloc_class(cls);
        assert!(!p.is_null(), "class {c}");
        assert!(unsafe { usable_size(p) } >= cls.size());
        fill(p, cls.size(), c as u8);
        assert!(verify(p, cls.size(), c as u8));
        unsafe { free_class(p, cls) };
    }
    check_invariants().unwrap();
}

#[test]
fn medium_split_and_coalesce() {
    let _g = shared();
    let sizes = [10_000usize, 20_000, 50_000, 100_000, 200_000, 256 * 1024];
    let mut ps = Vec::new();
    for round in 0..8 {
        for (i, &n) in sizes.iter().enumerate() {
            let p = alloc(n);
            assert!(!p.is_null());
            fill(p, n, (round * 7 + i) as u8);
            ps.push((p, n, (round * 7 + i) as u8));
        }
    }
    check_invariants().unwrap();
    // Free every other one, then ask for big ones so coalescing must happen.
    let mut keep = Vec::new();
    for (i, x) in ps.into_iter().enumerate() {
        if i % 2 == 0 {
            unsafe { free(x.0) };
        } else {
            keep.push(x);
        }
    }
    check_invariants().unwrap();
    for _ in 0..20 {
        let p = alloc(240_000);
        assert!(!p.is_null());
        fill(p, 240_000, 3);
        keep.push((p, 240_000, 3));
    }
    for &(p, n, s) in &keep {
        assert!(verify(p, n, s));
    }
    check_invariants().unwrap();
    for (p, _, _) in keep {
        unsafe { free(p) };
    }
    check_invariants().unwrap();
}

/// Deferred coalescing is paid for by frees: in a heap whose free chunks
/// cannot merge (every other chunk live), requests that no bin can serve
/// take new pages without walking the heap again and again; a pass comes
/// back once a 64th of the heap's pages has been freed since the last.
#[test]
fn a_heap_that_cannot_merge_walks_its_chunks_again_only_after_enough_is_freed() {
    let _g = shared();
    std::thread::spawn(|| {
        // 3000 chunks of 20 000 bytes (about 58 pages), every other one freed.
        let ps: Vec<*mut u8> = (0..3000).map(|_| alloc(20_000)).collect();
        assert!(ps.iter().all(|p| !p.is_null()));
        for p in ps.iter().step_by(2) {
            unsafe { free(*p) };
        }
        let h = thread::tls_heap();
        // SAFETY: this thread's own heap, read between its own calls.
        let (passes0, pages0) = unsafe { ((*h).counters.coalescings, (*h).medium.pages) };
        assert!(pages0 >= 50, "{pages0} medium pages");
        // 200 blocks of 250 000 bytes, kept: larger than any free chunk, so
        // every time the page being bumped is full the request misses.
        let big: Vec<*mut u8> = (0..200).map(|_| alloc(250_000)).collect();
        assert!(big.iter().all(|p| !p.is_null()));
        let (passes1, pages1) = unsafe { ((*h).counters.coalescings, (*h).medium.pages) };
        assert!(pages1 >= pages0 + 40, "the 200 blocks took pages ({pages0} -> {pages1})");
        // The frees before were worth one pass (1500 chunks, far more than a
        // 64th of the heap); nothing was freed after it, so no other pass.
        assert!(passes1 - passes0 <= 1, "{} passes for {} misses", passes1 - passes0, pages1 - pages0);
        // Free a 64th of the heap and more: the next miss walks it again.
        let heap_bytes = pages1 * arena::PAGE;
        let mut freed = 0;
        let mut kept = Vec::new();
        for (i, p) in big.into_iter().enumerate() {
            if freed < heap_bytes / 64 + 250_000 && i % 2 == 0 {
                unsafe { free(p) };
                freed += 250_000;
            } else {
                kept.push(p);
            }
        }
        // Requests of 254 000 bytes fit no freed chunk of 250 000 (their
        // bins differ) until a pass merges neighbours.
        let more: Vec<*mut u8> = (0..12).map(|_| alloc(254_000)).collect();
        assert!(more.iter().all(|p| !p.is_null()));
        let passes2 = unsafe { (*h).counters.coalescings };
        assert!(passes2 > passes1, "no pass after {freed} bytes freed in a heap of {heap_bytes}");
        for p in ps.iter().skip(1).step_by(2).chain(kept.iter()).chain(more.iter()) {
            unsafe { free(*p) };
        }
        check_invariants().unwrap();
    })
    .join()
    .unwrap();
}

#[test]
fn large_chunks_are_reused_not_unmapped() {
    let _g = serial();
    let before = stats::snapshot();
    for i in 0..50 {
        let n = (1 << 20) + i * 4096;
        let p = alloc(n);
        assert!(!p.is_null());
        fill(p, 4096, i as u8);
        unsafe { free(p) };
    }
    let after = stats::snapshot();
    assert!(after.large_allocs - before.large_allocs >= 50);
    assert_eq!(after.large_frees - before.large_frees, after.large_allocs - before.large_allocs);
    check_invariants().unwrap();
}

#[test]
fn alignment_requests() {
    let _g = shared();
    for &align in &[32usize, 64, 128, 256, 4096, 8192, 65536, 1 << 20] {
        for &size in &[1usize, 24, 100, 5000, 70_000, 2 << 20] {
            let p = alloc_aligned(size, align);
            assert!(!p.is_null());
            assert_eq!(p as usize % align, 0, "size {size} align {align}");
            fill(p, size, 9);
            assert!(verify(p, size, 9));
            unsafe { free(p) };
        }
    }
    assert!(alloc_aligned(16, 3).is_null());
}

#[test]
fn realloc_keeps_contents() {
    let _g = shared();
    let mut p = alloc(10);
    fill(p, 10, 1);
    let mut n = 10;
    for &m in &[20usize, 100, 3000, 9000, 40_000, 300_000, 3 << 20, 1000, 16] {
        let q = unsafe { realloc(p, m) };
        assert!(!q.is_null());
        assert!(verify(q, n.min(m), 1));
        fill(q, m, 1);
        p = q;
        n = m;
    }
    unsafe { free(p) };
    assert!(!unsafe { realloc(ptr::null_mut(), 5) }.is_null());
}

#[test]
fn calloc_zeroes_and_checks_overflow() {
    let _g = shared();
    assert!(calloc(usize::MAX / 2, 3).is_null());
    for &n in &[1usize, 100, 20_000, 1 << 20, 5 << 20] {
        let p = alloc(n);
        fill(p, n, 0xAB);
        unsafe { free(p) };
        let z = calloc(1, n);
        assert!((0..n).all(|i| unsafe { *z.add(i) } == 0), "calloc({n}) not zeroed");
        unsafe { free(z) };
    }
}

#[test]
fn descriptor_and_data_in_one_block() {
    let _g = shared();
    let (d, data) = alloc_with_descriptor(40, 1000, 64).unwrap();
    assert_eq!(data as usize % 64, 0);
    assert!(data as usize >= d as usize + 40);
    fill(d, 40, 1);
    fill(data, 1000, 2);
    assert!(verify(d, 40, 1) && verify(data, 1000, 2));
    unsafe { free(d) };
    assert!(alloc_with_descriptor(8, 8, 3).is_none());
}

#[test]
fn cross_thread_frees_come_home() {
    let _g = serial();
    let ptrs: Vec<usize> = (0..5000).map(|i| {
        let p = alloc(48 + i % 64);
        fill(p, 48, 5);
        p as usize
    }).collect();
    let before = stats::snapshot();
    std::thread::spawn(move || {
        // Give this thread a heap so its frees travel in batches.
        let own = alloc(16);
        for p in ptrs {
            unsafe { free(p as *mut u8) };
        }
        unsafe { free(own) };
    })
    .join()
    .unwrap();
    // Our next slow paths drain the inbox.
    let mut more = Vec::new();
    for _ in 0..20_000 {
        more.push(alloc(64));
    }
    let after = stats::snapshot();
    assert!(after.remote_frees - before.remote_frees >= 5000);
    assert!(after.remote_batches - before.remote_batches < 5000, "frees travel in batches");
    assert!(after.remote_frees_received > before.remote_frees_received);
    check_invariants().unwrap();
    for p in more {
        unsafe { free(p) };
    }
    check_invariants().unwrap();
}

#[test]
fn heaps_of_exited_threads_are_adopted() {
    let _g = serial();
    let before = stats::snapshot();
    for _ in 0..20 {
        std::thread::spawn(|| {
            let v: Vec<usize> = (0..100).map(|i| alloc(16 + i) as usize).collect();
            for p in v.iter().step_by(2) {
                unsafe { free(*p as *mut u8) };
            }
            // the other half stays live in the abandoned heap
            std::mem::forget(v);
        })
        .join()
        .unwrap();
    }
    let after = stats::snapshot();
    assert!(after.heaps_adopted > before.heaps_adopted, "a later thread adopts an exited thread's heap");
    assert!(after.heaps_created - before.heaps_created < 20, "heaps are reused, not created per thread");
}

/// Thread churn: each thread allocates blocks of two classes in a heap it
/// adopted, frees most of them and hands the rest to the parent, which frees
/// them after the join (into the abandoned heap).  The next thread's heap
/// takes those frees in and allocates from the same slabs again: a slab's
/// unit keeps its class instead of going back to the free units and being
/// taken by the other class, which had left every unit touched by every
/// class it ever held.
#[test]
fn a_class_keeps_its_slab_when_threads_come_and_go() {
    let _g = serial();
    if options().check {
        return; // check mode keeps every slab off the fast path; not this policy's concern
    }
    let unit_of = |p: usize| p >> UNIT_SHIFT;
    let mut class_of_unit: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    let (a, b) = (200usize, 480usize);
    for round in 0..60 {
        let (handed, seen) = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut handed = Vec::new();
            for size in [a, b] {
                let ps: Vec<usize> = (0..48).map(|_| alloc(size) as usize).collect();
                for (i, &p) in ps.iter().enumerate() {
                    fill(p as *mut u8, size, i as u8);
                    seen.push((unit_of(p), size));
                    if i % 4 == 3 {
                        handed.push((p, size, i as u8));
                    } else {
                        unsafe { free(p as *mut u8) };
                    }
                }
            }
            (handed, seen)
        })
        .join()
        .unwrap();
        for (p, size, seed) in handed {
            assert!(verify(p as *mut u8, size, seed), "round {round}: a handed block changed");
            unsafe { free(p as *mut u8) };
        }
        for (u, size) in seen {
            let first = *class_of_unit.entry(u).or_insert(size);
            assert_eq!(first, size, "round {round}: unit {u:#x} held {first} B blocks, now {size} B blocks");
        }
    }
    check_invariants().unwrap();
}

/// The free fast path keeps no count of a slab's live blocks, so slabs that
/// a thread's own frees empty are found by the heap's sweep on its slow
/// path: a thread that frees all its 64 B blocks and then allocates many
/// 16 B blocks keeps no empty 64 B slab on its `avail` list (the class's
/// current slab stays), and `collect` sweeps too.
#[test]
fn slabs_emptied_by_the_owners_frees_are_swept() {
    let _g = serial();
    let (c64, c16) = (small_class_index(64), small_class_index(16));
    // SAFETY (in the closure): reads of this thread's own heap.
    let empty = |c: usize| unsafe { (*tls_heap()).empty_avail_slabs(c) };
    let (after_frees, after_other_class, c16_after_collect) = std::thread::spawn(move || {
        // 40 slabs of 64 B blocks (1024 per slab), written, then freed by
        // their owner in an order that leaves every slab empty only at the end.
        let ps: Vec<usize> = (0..40 * 1024).map(|_| alloc(64) as usize).collect();
        for (i, &p) in ps.iter().enumerate() {
            fill(p as *mut u8, 64, i as u8);
        }
        for k in 0..4 {
            for (i, &p) in ps.iter().enumerate() {
                if i % 4 == k {
                    assert!(verify(p as *mut u8, 64, i as u8), "a live 64 B block changed");
                    unsafe { free(p as *mut u8) };
                }
            }
        }
        let after_frees = empty(c64);
        check_invariants().unwrap();
        // Another class: 30 slabs' worth of 16 B blocks, about 1,900 visits
        // to the slow path (one per bitmap word), so the periodic sweep runs.
        let qs: Vec<usize> = (0..30 * 4096).map(|_| alloc(16) as usize).collect();
        for (i, &q) in qs.iter().enumerate() {
            fill(q as *mut u8, 16, i as u8);
        }
        let after_other_class = empty(c64);
        check_invariants().unwrap();
        for (i, &q) in qs.iter().enumerate() {
            assert!(verify(q as *mut u8, 16, i as u8), "a live 16 B block changed");
            unsafe { free(q as *mut u8) };
        }
        collect();
        check_invariants().unwrap();
        (after_frees, after_other_class, empty(c16))
    })
    .join()
    .unwrap();
    assert!(
        after_other_class == 0,
        "{after_other_class} empty slabs of 64 B blocks left on the avail list ({after_frees} right after the frees) after 30 slabs' worth of 16 B allocations: the sweep did not release them"
    );
    assert!(
        c16_after_collect == 0,
        "{c16_after_collect} empty slabs of 16 B blocks left on the avail list after every block was freed and collect() ran"
    );
}

/// A change of phase: a thread frees its small blocks and then allocates
/// only large chunks.  The large allocations sweep the heap first (once
/// they add up to a sixteenth of its slab pages), so the emptied slabs go
/// back and their pages can serve the large chunks.
#[test]
fn large_allocations_after_small_frees_sweep_the_heap() {
    let _g = serial();
    let c64 = small_class_index(64);
    // SAFETY (in the closure): reads of this thread's own heap.
    let empty = |c: usize| unsafe { (*tls_heap()).empty_avail_slabs(c) };
    let (after_frees, after_large) = std::thread::spawn(move || {
        let ps: Vec<usize> = (0..40 * 1024).map(|_| alloc(64) as usize).collect();
        for &p in ps.iter().rev() {
            unsafe { free(p as *mut u8) };
        }
        let after_frees = empty(c64);
        let big: Vec<usize> = (0..8).map(|_| alloc(1 << 20) as usize).collect();
        assert!(big.iter().all(|&b| b != 0), "a 1 MiB allocation failed");
        let after_large = empty(c64);
        check_invariants().unwrap();
        for b in big {
            unsafe { free(b as *mut u8) };
        }
        (after_frees, after_large)
    })
    .join()
    .unwrap();
    assert_eq!(
        after_large, 0,
        "{after_large} empty slabs of 64 B blocks left on the avail list ({after_frees} right after the frees) after 8 MiB of large chunks: the large allocations did not sweep"
    );
}

#[test]
fn default_mode_refuses_bad_frees() {
    let _g = serial();
    if options().check {
        return; // check mode aborts instead; covered by the process tests.
    }
    let before = report::bad_frees();
    let p = alloc(100);
    unsafe { free(p) };
    unsafe { free(p) }; // double free: refused
    let q = alloc(100);
    let r = alloc(100);
    assert_ne!(q, r, "a double free must not hand a block out twice");
    unsafe { free(q.add(8)) }; // interior pointer: refused
    let mut local = 0u64;
    unsafe { free(&mut local as *mut u64 as *mut u8) }; // foreign: refused
    let m = alloc(50_000);
    unsafe { free(m) };
    unsafe { free(m) };
    let l = alloc(3 << 20);
    unsafe { free(l) };
    unsafe { free(l) };
    assert_eq!(report::bad_frees() - before, 5);
    unsafe { free(q) };
    unsafe { free(r) };
    check_invariants().unwrap();
}

#[test]
fn stats_report_in_use_and_classes() {
    let _g = serial();
    let p = alloc(1000);
    let s = stats::snapshot();
    assert!(s.in_use_bytes >= 1008);
    // Reserved whole, at least 1 GiB; grown (under `ulimit -v`), at least
    // its first 4 MiB and all it holds.
    assert!(s.reserved_bytes >= if arena::arena_grows() { (4 << 20).max(s.committed_bytes) } else { 1 << 30 });
    assert!(s.allocations > 0);
    let text = s.to_string();
    assert!(text.contains("in_use_bytes"));
    let mut json = Vec::new();
    s.write_json(&mut |b| json.extend_from_slice(b));
    let json = String::from_utf8(json).unwrap();
    assert!(json.starts_with('{') && json.ends_with('}') && json.contains("\"classes\":["));
    let mut cells = 0;
    stats::for_each_arena(|_| cells += 1);
    assert!(cells > 0);
    unsafe { free(p) };
}

#[test]
fn mallinfo2_and_xml_views_of_the_statistics() {
    let _g = serial();
    let m0 = stats::snapshot().mallinfo2();
    let medium = alloc(100_000);
    let large = alloc(8 << 20);
    assert!(!medium.is_null() && !large.is_null());
    fill(large, 8 << 20, 7);
    let s = stats::snapshot();
    let m = s.mallinfo2();
    // The identities glibc's callers rely on.
    assert_eq!(m.uordblks + m.fordblks, m.arena);
    assert_eq!(m.uordblks + m.hblkhd, s.in_use_bytes as usize);
    assert_eq!(m.arena + m.hblkhd, s.committed_bytes as usize);
    assert_eq!(m.hblkhd, s.large_bytes as usize);
    assert_eq!((m.ordblks, m.smblks, m.usmblks, m.fsmblks, m.keepcost), (0, 0, 0, 0, 0));
    // The two blocks are counted where they belong.
    assert!(m.hblks > m0.hblks && m.hblkhd >= m0.hblkhd + (8 << 20), "{m0:?} -> {m:?}");
    assert!(m.uordblks >= m0.uordblks + 100_000, "{m0:?} -> {m:?}");
    let mut xml = Vec::new();
    s.write_xml(&mut |b| xml.extend_from_slice(b));
    let xml = String::from_utf8(xml).unwrap();
    assert!(xml.starts_with("<malloc version=\"1\" allocator=\"canopy\">\n") && xml.ends_with("</malloc>\n"), "{xml}");
    assert!(xml.contains(&format!("<total type=\"large\" count=\"{}\" size=\"{}\"/>", m.hblks, m.hblkhd)), "{xml}");
    assert!(xml.contains(&format!("<figure name=\"committed_bytes\" value=\"{}\"/>", s.committed_bytes)), "{xml}");
    assert!(xml.contains("<class nr=\""), "{xml}");
    // Every element is closed on its line.
    assert!(xml.lines().skip(1).take_while(|l| *l != "</malloc>").all(|l| l.starts_with('<') && l.ends_with("/>")), "{xml}");
    unsafe {
        free(large);
        free(medium);
    }
    let m1 = stats::snapshot().mallinfo2();
    assert!(m1.hblkhd + (8 << 20) <= m.hblkhd, "{m:?} -> {m1:?}");
}

#[test]
fn stats_count_blocks_the_fast_path_took_before_its_cursor_moved() {
    let _g = serial();
    // The fast path counts in the class's cursor and settles into the
    // slab's count only when the cursor moves; statistics must see both.
    std::thread::spawn(|| {
        let c = small_class_index(48);
        let first = alloc(48);
        let before = stats::snapshot();
        let ps: Vec<*mut u8> = (0..40).map(|_| alloc(48)).collect();
        let after = stats::snapshot();
        assert!(after.allocations - before.allocations >= 40);
        assert_eq!(after.classes[c].blocks_in_use - before.classes[c].blocks_in_use, 40);
        check_invariants().unwrap();
        for p in ps {
            unsafe { free(p) };
        }
        let freed = stats::snapshot();
        assert_eq!(after.classes[c].blocks_in_use - freed.classes[c].blocks_in_use, 40);
        check_invariants().unwrap();
        unsafe { free(first) };
    })
    .join()
    .unwrap();
}

#[test]
fn collect_returns_memory() {
    let _g = serial();
    let ps: Vec<_> = (0..8).map(|_| alloc(8 << 20)).collect();
    for &p in &ps {
        fill(p, 8 << 20, 1);
    }
    for p in ps {
        unsafe { free(p) };
    }
    let n = collect();
    let s = stats::snapshot();
    assert!(n > 0 || s.bytes_returned_to_os > 0, "freed large chunks go back to the OS past the retain limit or on collect");
    check_invariants().unwrap();
}

/// Committed free memory in the global heap, in bytes.
fn free_committed() -> usize {
    let locked = solo::lock();
    // SAFETY: global lock held; a read of a counter.
    let n = unsafe { global::state().free_committed_units } * arena::UNIT;
    solo::unlock(locked);
    n
}

fn global_decay_running() -> bool {
    let locked = solo::lock();
    // SAFETY: global lock held.
    let r = unsafe { global::state().decay_running() };
    solo::unlock(locked);
    r
}

#[test]
fn free_memory_above_the_retain_limit_goes_back_after_the_delay() {
    let _g = serial();
    let o = options();
    let retain = o.retain_bytes;
    let chunk = 8 << 20;
    let n = retain / chunk * 2 + 2;
    collect();
    let t0 = 1_000_000_000u64;
    global::TEST_NOW_MS.store(t0, core::sync::atomic::Ordering::Relaxed);
    let returned = || stats::snapshot().bytes_returned_to_os;
    let before = returned();
    let ps: Vec<_> = (0..n).map(|_| alloc(chunk)).collect();
    assert!(ps.iter().all(|p| !p.is_null()));
    for p in ps {
        unsafe { free(p) };
    }
    let over = free_committed();
    let churn = |t: u64| {
        global::TEST_NOW_MS.store(t, core::sync::atomic::Ordering::Relaxed);
        let p = alloc(chunk);
        assert!(!p.is_null());
        unsafe { free(p) };
    };
    if o.decay_ms == 0 {
        // Decommitted at once (CANOPY_DECAY_MS=0 in the environment).
        assert!(over <= retain / 2, "{over} bytes committed and free, the limit {retain}");
        assert!(returned() > before);
    } else {
        assert!(over > retain, "{over} bytes committed and free after freeing {} bytes", n * chunk);
        assert_eq!(returned(), before, "nothing decommitted within the delay");
        // Calls within the delay keep it; the first one past it gives the excess back.
        churn(t0 + o.decay_ms - 1);
        assert_eq!(returned(), before);
        assert!(free_committed() > retain);
        global::TEST_NOW_MS.store(t0 + o.decay_ms, core::sync::atomic::Ordering::Relaxed);
        let p = alloc(chunk);
        assert!(!p.is_null());
        assert!(returned() > before, "decommitted once the delay is over (by an allocation)");
        assert!(!global_decay_running(), "the delay stops once the excess is gone");
        assert!(free_committed() <= retain / 2);
        unsafe { free(p) };
        // Below the limit the clock starts again.
        churn(t0 + 10 * o.decay_ms);
        let ps: Vec<_> = (0..n).map(|_| alloc(chunk)).collect();
        let mid = returned();
        for p in ps {
            unsafe { free(p) };
        }
        churn(t0 + 10 * o.decay_ms + o.decay_ms / 2);
        assert_eq!(returned(), mid, "a new excess waits its own delay");
        assert!(global_decay_running());
        // collect() gives everything back at once and stops the delay.
        collect();
        assert!(returned() > mid);
        assert!(!global_decay_running(), "collect stops the delay");
        let mid = returned();
        let ps: Vec<_> = (0..n).map(|_| alloc(chunk)).collect();
        for p in ps {
            unsafe { free(p) };
        }
        churn(t0 + 11 * o.decay_ms);
        // A free past the delay gives it back too.
        let p = alloc(chunk);
        assert!(!p.is_null());
        global::TEST_NOW_MS.store(t0 + 12 * o.decay_ms, core::sync::atomic::Ordering::Relaxed);
        unsafe { free(p) };
        assert!(returned() > mid, "decommitted by a free once the delay is over");
        assert!(free_committed() <= retain / 2);
    }
    // Decommitted at once with no delay.
    let locked = solo::lock();
    // SAFETY: global lock held.
    unsafe { global::state().apply_retain_policy(retain, 0, || 0, true) };
    solo::unlock(locked);
    assert!(free_committed() <= retain / 2);
    global::TEST_NOW_MS.store(0, core::sync::atomic::Ordering::Relaxed);
    check_invariants().unwrap();
}

/// A span that `alloc_span` takes whole from the top of the heap just as a
/// decommit delay runs out is the caller's, although its units still carry a
/// free span's kinds until the caller marks them: the retain policy that
/// `alloc_span` runs after taking it decommits other free spans, but must not
/// give it back as the free top.  In an arena that grows (under `ulimit -v`,
/// as `scripts/test.sh` runs this suite a second time) a policy that did
/// unlinked the span a second time, unmapped it and lowered the top under
/// the caller (ec501f8, fixed in a9dbec6); this sets that case up exactly.
#[test]
fn a_span_taken_from_the_top_as_the_delay_runs_out_stays_the_callers() {
    let _g = serial();
    assert!(thread::ensure_init(), "the arena is there");
    let o = options();
    let retain_units = o.retain_bytes / arena::UNIT;
    let decommits = stats::snapshot().decommits;
    let locked = solo::lock();
    // SAFETY: the global lock is held throughout; every span is taken from
    // the global heap, marked as a large chunk's at once (as `alloc_large`
    // does before it lets go of the lock) and given back exactly once.
    let (t, n, top, guard, drained) = unsafe {
        let g = global::state();
        // Every free span taken out of the bins (one unit at a time), so
        // what follows comes from the top in order.
        let mut drained = Vec::new();
        while g.free_units > 0 {
            let (idx, _) = g.alloc_span(1, 1).expect("a free unit");
            arena::mark_units(idx, 1, arena::kind::LARGE_BODY);
            drained.push(idx);
        }
        // B: more committed free memory than the retain limit, once freed;
        // G: a guard, so T does not coalesce with B; T: ends at the top.
        let big = retain_units + 32;
        let n = 8;
        let (b, _) = g.alloc_span(big, 1).expect("units for B");
        let (guard, _) = g.alloc_span(1, 1).expect("a unit for G");
        let (t, _) = g.alloc_span(n, 1).expect("units for T");
        assert_eq!((guard, t, t + n), (b + big, guard + 1, g.top), "B, G and T from the top, in order");
        for (idx, len) in [(b, big), (guard, 1), (t, n)] {
            arena::mark_units(idx, len, arena::kind::LARGE_BODY);
        }
        // Both freed as holding memory, with no policy applied yet.
        g.free_span(b, big, true, usize::MAX, None);
        g.free_span(t, n, true, usize::MAX, None);
        g.check().expect("B and T free");
        assert!(g.free_committed_units > retain_units, "over the retain limit");
        // The delay started long ago: the next allocation applies the policy.
        global::TEST_NOW_MS.store(1_000_000 + o.decay_ms, core::sync::atomic::Ordering::Relaxed);
        g.start_decay_at(1_000_000);
        let (got, _) = g.alloc_span(n, 1).expect("T again");
        assert_eq!(got, t, "T is the one free span of its length");
        arena::mark_units(t, n, arena::kind::LARGE_BODY);
        let top = g.top;
        g.check().expect("the bins after the policy ran with T taken");
        assert!(g.free_committed_units * arena::UNIT <= o.retain_bytes / 2, "the policy ran: B was decommitted");
        (t, n, top, guard, drained)
    };
    solo::unlock(locked);
    global::TEST_NOW_MS.store(0, core::sync::atomic::Ordering::Relaxed);
    assert_eq!(top, t + n, "the top stays above T");
    assert!(arena::mapped_units() >= t + n, "T's units stay mapped");
    assert!(stats::snapshot().decommits > decommits, "the policy decommitted B");
    // T's memory is there to use.
    let base = arena::arena_base() + t * arena::UNIT;
    // SAFETY: T's n units are mapped (checked above) and ours.
    unsafe {
        core::ptr::write_bytes(base as *mut u8, 0xa5, n * arena::UNIT);
        assert_eq!(*((base + n * arena::UNIT - 1) as *const u8), 0xa5);
    }
    let locked = solo::lock();
    // SAFETY: the lock is held; T, G and the drained units are ours to
    // give back, once (as holding memory: some may have held none).
    unsafe {
        let g = global::state();
        g.free_span(t, n, true, usize::MAX, None);
        g.free_span(guard, 1, true, usize::MAX, None);
        for idx in drained {
            g.free_span(idx, 1, true, usize::MAX, None);
        }
        g.check().expect("T, G and the drained units given back");
    }
    solo::unlock(locked);
    check_invariants().unwrap();
}

/// Spans cut from a long free span, with and without alignment, and given
/// back in a scrambled order, committed or clean: after every step the bins,
/// the body marks, the back links, the committed-unit counts and the word of
/// non-empty bins agree (`GlobalState::check`).  A split rewrites only the
/// units at the ends of the pieces, a merge only the units freed and the
/// joined heads, so this is what checks that the marks it leaves alone were
/// right already.
#[test]
fn chunks_cut_from_a_long_free_span_and_given_back_keep_the_bins_sound() {
    let _g = serial();
    assert!(thread::ensure_init(), "the arena is there");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move |n: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    let locked = solo::lock();
    // SAFETY: the global lock is held throughout; every span is taken from
    // the global heap, marked as a large chunk's at once (as `alloc_large`
    // does before it lets go of the lock) and given back exactly once.
    unsafe {
        let g = global::state();
        let (base, _) = g.alloc_span(300, 1).expect("300 units");
        arena::mark_units(base, 300, arena::kind::LARGE_BODY);
        g.free_span(base, 300, true, usize::MAX, None);
        g.check().expect("one long free span");
        let mut live: Vec<(usize, usize)> = Vec::new();
        for step in 0..2000 {
            if live.len() < 24 && (live.is_empty() || rnd(3) != 0) {
                let n = 1 + rnd(20) as usize;
                let align = 1 << rnd(5);
                let (idx, _) = g.alloc_span(n, align).expect("units");
                assert_eq!(idx % align, 0, "step {step}: alignment {align}");
                arena::mark_units(idx, n, arena::kind::LARGE_BODY);
                live.push((idx, n));
            } else {
                let (idx, n) = live.swap_remove(rnd(live.len() as u64) as usize);
                if rnd(4) == 0 {
                    canopy_sys::decommit(arena::unit_addr(desc(idx)), n * arena::UNIT).expect("decommit");
                    g.free_span(idx, n, false, usize::MAX, None);
                } else {
                    g.free_span(idx, n, true, usize::MAX, Some(rnd(n as u64 * arena::UNIT as u64) as usize));
                }
            }
            if let Err(e) = g.check() {
                panic!("step {step}: {e}");
            }
        }
        for (idx, n) in live {
            g.free_span(idx, n, true, usize::MAX, None);
        }
        g.check().expect("all given back");
    }
    solo::unlock(locked);
    check_invariants().unwrap();
}

#[test]
fn a_span_merged_from_clean_and_committed_pieces_counts_only_the_committed() {
    let _g = serial();
    assert!(thread::ensure_init(), "the arena is there");
    let locked = solo::lock();
    // SAFETY: the global lock is held throughout; the four units are taken
    // from the global heap and given back, and the two given back as clean
    // are decommitted first, so they do read as zero.
    let (c1, after_merge, decommitted, done, returned) = unsafe {
        let g = global::state();
        let (idx, _) = g.alloc_span(4, 1).expect("four units");
        arena::mark_units(idx, 4, arena::kind::LARGE_BODY);
        let c1 = g.free_committed_units;
        canopy_sys::decommit(arena::unit_addr(desc(idx)), 2 * arena::UNIT).expect("decommit");
        g.free_span(idx, 2, false, usize::MAX, None);
        assert_eq!(g.free_committed_units, c1, "clean units add nothing");
        // The second half merges with the clean first half (and with
        // whatever free neighbours the span has, whose counts stay theirs).
        g.free_span(idx + 2, 2, true, usize::MAX, None);
        let after_merge = g.free_committed_units;
        g.check().expect("free spans");
        let before = g.stats.bytes_decommitted;
        let committed = g.free_committed_units;
        let done = g.decommit_down_to(0, true);
        (c1, after_merge, committed, done, g.stats.bytes_decommitted - before)
    };
    solo::unlock(locked);
    assert_eq!(after_merge, c1 + 2, "only the two committed units count after the merge");
    assert_eq!(done, decommitted * arena::UNIT, "a decommit of everything gives back what was counted");
    assert_eq!(returned as usize, done, "and reports that, not the clean units it also covered");
    check_invariants().unwrap();
}

#[test]
fn frees_from_threads_without_a_heap() {
    let _g = shared();
    let ptrs: Vec<usize> = (0..1000).map(|_| alloc(32 + 1) as usize).collect();
    let m: Vec<usize> = (0..10).map(|_| alloc(20_000) as usize).collect();
    std::thread::spawn(move || {
        for p in ptrs.into_iter().chain(m) {
            unsafe { free(p as *mut u8) };
        }
    })
    .join()
    .unwrap();
    let mut v = Vec::new();
    for _ in 0..5000 {
        v.push(alloc(33));
    }
    v.push(alloc(20_000));
    check_invariants().unwrap();
    for p in v {
        unsafe { free(p) };
    }
    check_invariants().unwrap();
}

struct Rng(u32);
impl Rng {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }
    fn pick(&mut self) -> usize {
        let r = self.next() % 100;
        (if r < 80 {
            self.next() % 512
        } else if r < 97 {
            512 + self.next() % 16000
        } else if r < 99 {
            16000 + self.next() % 250_000
        } else {
            300_000 + self.next() % 3_000_000
        }) as usize
    }
}

#[test]
fn random_walk_keeps_every_byte() {
    let _g = shared();
    let mut rng = Rng(2654435761);
    let mut slots: Vec<Option<(usize, usize, u8)>> = vec![None; 4096];
    for round in 0..40_000 {
        let n = rng.pick();
        let p = if rng.next() & 7 == 0 { calloc(1, n) } else { alloc(n) };
        assert!(!p.is_null());
        let seed = rng.next() as u8;
        fill(p, n, seed);
        let (mut p, mut n) = (p, n);
        if rng.next() & 15 == 0 {
            let m = rng.pick();
            let q = unsafe { realloc(p, m) };
            assert!(!q.is_null() || m == 0);
            assert!(verify(q, n.min(m), seed), "round {round}: realloc {n} -> {m} lost data");
            p = q;
            n = m;
            fill(p, n, seed);
        }
        let k = rng.next() as usize % slots.len();
        if let Some((op, on, os)) = slots[k].replace((p as usize, n, seed)) {
            assert!(verify(op as *mut u8, on, os), "round {round}: block of {on} bytes at {op:#x} corrupted");
            unsafe { free(op as *mut u8) };
        }
        if round % 5000 == 0 {
            check_invariants().unwrap();
        }
    }
    for s in slots.into_iter().flatten() {
        assert!(verify(s.0 as *mut u8, s.1, s.2));
        unsafe { free(s.0 as *mut u8) };
    }
    check_invariants().unwrap();
}

fn exchange_stress(threads: usize, rounds: usize, pick: fn(&mut Rng) -> usize) {
    exchange_stress_with(threads, rounds, pick, false)
}

/// As `exchange_stress`; with `resize`, a third of the blocks are resized
/// with `realloc` (grown or shrunk, in place or moved) before they are handed
/// on, and a received block is sometimes resized before it is freed.
fn exchange_stress_with(threads: usize, rounds: usize, pick: fn(&mut Rng) -> usize, resize: bool) {
    use std::sync::Mutex;
    // A slot holds (address, size, fill byte) of a block in transit.
    type Slot = Mutex<Option<(usize, usize, u8)>>;
    let slots: std::sync::Arc<Vec<Slot>> = std::sync::Arc::new((0..1024).map(|_| Mutex::new(None)).collect());
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let slots = slots.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(0x9e37_79b9 ^ (t as u32 * 7919 + 1));
                for _ in 0..rounds {
                    let mut n = pick(&mut rng);
                    let mut p = alloc(n);
                    assert!(!p.is_null());
                    let seed = rng.next() as u8;
                    fill(p, n, seed);
                    if resize && rng.next() % 3 == 0 {
                        let m = pick(&mut rng).max(1);
                        let q = unsafe { realloc(p, m) };
                        assert!(!q.is_null());
                        assert!(verify(q, n.min(m), seed), "realloc {n} -> {m} lost data");
                        fill(q, m, seed);
                        (p, n) = (q, m);
                    }
                    let k = rng.next() as usize % slots.len();
                    let old = slots[k].lock().unwrap().replace((p as usize, n, seed));
                    if let Some((op, on, os)) = old {
                        assert!(verify(op as *mut u8, on, os), "block of {on} bytes corrupted in transit");
                        let mut op = op as *mut u8;
                        if resize && rng.next() % 4 == 0 {
                            // A remote block resized by the thread that received it.
                            let m = pick(&mut rng).max(1);
                            op = unsafe { realloc(op, m) };
                            assert!(!op.is_null());
                            assert!(verify(op, on.min(m), os), "realloc of a received block {on} -> {m} lost data");
                        }
                        unsafe { free(op) };
                    }
                }
                check_invariants().unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    for s in slots.iter() {
        if let Some((p, n, seed)) = s.lock().unwrap().take() {
            assert!(verify(p as *mut u8, n, seed));
            unsafe { free(p as *mut u8) };
        }
    }
}

#[test]
fn exchange_small() {
    let _g = shared();
    exchange_stress(4, 20_000, |r| (r.next() % 512) as usize);
}

#[test]
fn exchange_medium() {
    let _g = shared();
    exchange_stress(4, 5_000, |r| 9000 + (r.next() % 200_000) as usize);
}

#[test]
fn exchange_large() {
    let _g = shared();
    exchange_stress(4, 400, |r| 300_000 + (r.next() % 1_500_000) as usize);
}

#[test]
fn exchange_mixed() {
    let _g = shared();
    exchange_stress(4, 20_000, |r| r.pick());
}

#[test]
fn exchange_with_realloc() {
    let _g = shared();
    let rounds = if cfg!(debug_assertions) { 3_000 } else { 20_000 };
    exchange_stress_with(4, rounds, |r| r.pick(), true);
    exchange_stress_with(3, rounds / 20, |r| 100_000 + (r.next() % 1_000_000) as usize, true);
}

#[test]
fn frees_to_exited_threads_are_taken_back() {
    let _g = serial();
    let cls = SizeClass::of(64).unwrap().index();
    let before = stats::snapshot().classes[cls].blocks_in_use;
    let ptrs: Vec<usize> = std::thread::spawn(|| (0..20_000).map(|_| alloc(64) as usize).collect()).join().unwrap();
    let mid = stats::snapshot().classes[cls].blocks_in_use;
    // Other heaps' figures are as of their last slow path, so compare loosely.
    assert!(mid >= 20_000, "{before} -> {mid}");
    for p in ptrs {
        unsafe { free(p as *mut u8) };
    }
    collect();
    let after = stats::snapshot().classes[cls].blocks_in_use;
    assert!(after + 19_000 < mid, "blocks freed to an exited thread's heap are taken back ({before} -> {mid} -> {after})");
    check_invariants().unwrap();
}

/// Allocate `n` blocks of `size` and check that none is handed out twice.
fn assert_distinct(what: &str, size: usize, n: usize) -> Vec<*mut u8> {
    let v: Vec<*mut u8> = (0..n).map(|_| alloc(size)).collect();
    let mut sorted: Vec<usize> = v.iter().map(|&p| p as usize).collect();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), n, "{what}: a block was handed out twice");
    v
}

#[test]
fn double_free_patterns_never_hand_a_block_out_twice() {
    let _g = serial();
    if options().check {
        return; // check mode aborts on the first one; see the LD_PRELOAD tests.
    }
    let before = report::bad_frees();
    // 1. free(p); free(q); free(p) in the current slab.
    let (p, q) = (alloc(48), alloc(48));
    unsafe {
        free(p);
        free(q);
        free(p);
    }
    let v = assert_distinct("free(p) free(q) free(p)", 48, 5000);
    // 2. a double free that empties a (non-current) slab.
    let w: Vec<*mut u8> = (0..2000).map(|_| alloc(1000)).collect();
    let _more = assert_distinct("filler", 1000, 200); // moves the current slab on
    unsafe {
        free(w[0]);
        for &x in &w {
            free(x);
        }
    }
    let v2 = assert_distinct("double free emptying a slab", 1000, 3000);
    // 3. a block freed by another thread and then again by its owner.
    let r = alloc(64) as usize;
    std::thread::spawn(move || unsafe { free(r as *mut u8) }).join().unwrap();
    unsafe { free(r as *mut u8) };
    let v3 = assert_distinct("remote then owner", 64, 5000);
    assert!(report::bad_frees() - before >= 3, "each double free is reported");
    check_invariants().unwrap();
    for x in v.into_iter().chain(v2).chain(v3).chain(_more) {
        unsafe { free(x) };
    }
    check_invariants().unwrap();
}

#[test]
fn a_block_freed_again_while_in_flight_is_refused_and_the_inbox_stays_whole() {
    let _g = serial();
    if options().check {
        return; // check mode aborts on the first bad free.
    }
    let before = report::bad_frees();
    // The owner frees a block again after another thread's free of it has
    // put it in the owner's inbox.  The owner's slab is current, so this is
    // the free fast path's case: it must not link the block a second time.
    let r = alloc(64) as usize;
    std::thread::spawn(move || unsafe { free(r as *mut u8) }).join().unwrap();
    unsafe { free(r as *mut u8) };
    assert_eq!(report::bad_frees() - before, 1, "the second free is refused at once");
    // The inbox still works: more remote frees arrive and are reused.
    let blocks: Vec<usize> = (0..1000).map(|_| alloc(64) as usize).collect();
    let sent = blocks.clone();
    std::thread::spawn(move || {
        for p in sent {
            unsafe { free(p as *mut u8) };
        }
    })
    .join()
    .unwrap();
    let v = assert_distinct("after a double free of a block in flight", 64, 5000);
    // SAFETY: our own heap, read by its owner.
    assert!(!unsafe { (*tls_heap()).inbox_broken }, "the inbox was not damaged");
    assert_eq!(report::bad_frees() - before, 1, "nothing else was reported");
    check_invariants().unwrap();
    for x in v {
        unsafe { free(x) };
    }
    check_invariants().unwrap();
}

/// Run `f` on a thread that has a heap (it allocates first), so that its
/// frees of other threads' blocks travel in batches.
fn on_thread_with_heap<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    std::thread::spawn(move || {
        let own = alloc(24);
        assert!(!own.is_null());
        let r = f();
        unsafe { free(own) };
        r
    })
    .join()
    .unwrap()
}

#[test]
fn remote_frees_travel_in_batches_that_go_back_to_their_maker() {
    let _g = shared();
    let (cap, _) = crate::heap::batch_shape_for_tests();
    let n = 10 * cap + 3;
    // SAFETY (reads of our own heap's counters): the heap is this thread's.
    let received = || unsafe { (*tls_heap()).counters.remote_frees_received };
    let blocks: Vec<usize> = (0..n).map(|_| alloc(64) as usize).collect();
    // (After the first allocation: this thread's heap may be an adopted one.)
    let before = received();
    // Another thread with a heap frees them in two rounds; between the rounds
    // we drain, which hands its batches back: the second round reuses them
    // and allocates nothing of its own.
    let (tx, rx) = std::sync::mpsc::channel::<Vec<usize>>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<u64>();
    let t = std::thread::spawn(move || {
        on_thread_with_heap(move || {
            let mut made = Vec::new();
            for round in rx {
                // SAFETY: our own heap.
                let allocs = || unsafe { (*tls_heap()).allocs };
                let a0 = allocs();
                for p in round {
                    unsafe { free(p as *mut u8) };
                }
                collect(); // sends the last, partial batch
                made.push(allocs() - a0);
                done_tx.send(0).unwrap();
            }
            made
        })
    });
    let (first, second) = blocks.split_at(n / 2);
    tx.send(first.to_vec()).unwrap();
    done_rx.recv().unwrap();
    collect();
    assert_eq!(received() - before, first.len() as u64, "every block of the first round came back");
    tx.send(second.to_vec()).unwrap();
    drop(tx);
    done_rx.recv().unwrap();
    collect();
    assert_eq!(received() - before, n as u64, "and of the second");
    let made = t.join().unwrap();
    // (The first round may find spare batches in a heap its thread adopted.)
    assert!(made[0] <= (n / 2 / cap + 2) as u64, "the first round made at most a batch block per batch: {}", made[0]);
    assert_eq!(made[1], 0, "the second round reused the batches handed back");
    // The blocks are free in their slabs: allocating again finds them.
    let again: std::collections::HashSet<usize> = (0..n).map(|_| alloc(64) as usize).collect();
    assert!(blocks.iter().filter(|p| again.contains(p)).count() >= n / 2, "the freed blocks are reused");
    check_invariants().unwrap();
    for p in again {
        unsafe { free(p as *mut u8) };
    }
}

#[test]
fn batch_blocks_are_metadata_not_the_programs_allocations_or_blocks_in_use() {
    let _g = shared();
    let (cap, bc) = crate::heap::batch_shape_for_tests();
    let n = 5 * cap + 1;
    let blocks: Vec<usize> = (0..n).map(|_| alloc(64) as usize).collect();
    let (made, allocs, batch_blocks, batch_bytes) = on_thread_with_heap(move || {
        let h = tls_heap();
        // SAFETY: our own heap, published and read by its owner.
        let published = || unsafe {
            (*h).publish();
            let p = &(*h).published;
            (
                p.small_allocs.load(core::sync::atomic::Ordering::Relaxed),
                p.blocks[bc].load(core::sync::atomic::Ordering::Relaxed),
                p.batch_bytes.load(core::sync::atomic::Ordering::Relaxed),
            )
        };
        let made0 = unsafe { (*h).batches_made };
        let (a0, b0, _) = published();
        for p in blocks {
            unsafe { free(p as *mut u8) };
        }
        let (a1, b1, bytes) = published();
        let made = unsafe { (*h).batches_made } - made0;
        (made, a1 - a0, b1 as i64 - b0 as i64, (bytes, made))
    });
    // Five full batches went out (they may have reused spares of an adopted
    // heap, which were made before) and none counted as the program's.
    assert!(made <= 6, "{made} batch blocks for {n} frees");
    assert_eq!(allocs, 0, "batch blocks counted as allocations");
    assert_eq!(batch_blocks, 0, "batch blocks counted as blocks in use");
    let (bytes, _) = batch_bytes;
    assert_eq!(bytes % crate::heap::SHAPES[bc].size as u64, 0);
    if made > 0 {
        assert!(bytes >= made * crate::heap::SHAPES[bc].size as u64, "batch blocks are metadata: {bytes} bytes");
    }
    collect();
    check_invariants().unwrap();
}

#[test]
fn a_block_freed_by_its_owner_while_in_a_batch_is_dropped_and_the_inbox_stays_whole() {
    let _g = serial();
    if options().check {
        return; // check mode aborts at the second free
    }
    let before = report::bad_frees();
    let (cap, _) = crate::heap::batch_shape_for_tests();
    let blocks: Vec<usize> = (0..3 * cap).map(|_| alloc(64) as usize).collect();
    let r = blocks[cap + 1];
    // Another thread with a heap frees them all (r among them, in the
    // second batch).  The owner then frees r again as if its free had raced
    // ahead of the other thread's (the tag check passed before the
    // in-flight tag landed), simulated by clearing the tag.
    let sent = blocks.clone();
    on_thread_with_heap(move || {
        for p in sent {
            unsafe { free(p as *mut u8) };
        }
    });
    // SAFETY: r is a block of this heap, in flight to it.
    unsafe {
        (*(r as *mut arena::Block)).tag = 0;
        free(r as *mut u8);
    }
    collect();
    assert_eq!(report::bad_frees() - before, 1, "the batch's stale entry is reported");
    // SAFETY: our own heap, read by its owner.
    assert!(!unsafe { (*tls_heap()).inbox_broken }, "a batch entry cannot break the inbox");
    check_invariants().unwrap();
    // Every block is free exactly once: allocating until r comes back gives
    // distinct blocks.
    let mut again: Vec<usize> = Vec::new();
    while again.len() < 100_000 && !again.contains(&r) {
        again.extend((0..1000).map(|_| alloc(64) as usize));
    }
    let set: std::collections::HashSet<usize> = again.iter().copied().collect();
    assert_eq!(set.len(), again.len(), "no block handed out twice");
    assert!(set.contains(&r), "r is free once, and found again");
    for p in again {
        unsafe { free(p as *mut u8) };
    }
    check_invariants().unwrap();
}

/// Free small block `r` of this thread's heap as a thread that has no heap
/// and cannot take one (one freeing after its heap was given up) does: the
/// block alone, linked into the owner's inbox through its own first word.
fn free_as_a_thread_without_a_heap(r: usize) {
    // SAFETY: r is a live small block of this thread's heap; this is what
    // `send_remote` does for such a thread.
    unsafe {
        let d = desc(arena::unit_index(r));
        let owner = (*d).heap.load(core::sync::atomic::Ordering::Relaxed);
        assert_eq!(owner, tls_heap());
        (*(r as *mut arena::Block)).tag = arena::flight_tag();
        crate::heap::push_direct(owner, r as *mut u8);
    }
}

#[test]
fn a_thread_that_only_frees_gets_a_heap_and_batches_its_frees() {
    let _g = serial();
    let before = report::bad_frees();
    let direct = || crate::heap::DIRECT_REMOTE_FREES.load(core::sync::atomic::Ordering::Relaxed);
    // Blocks of a thread that has exited: its heap is abandoned, and the
    // freeing thread below, which has no heap, may adopt it as it takes one
    // for its first free (the free is then its own).
    let gone: Vec<usize> = std::thread::spawn(|| (0..500).map(|_| alloc(48) as usize).collect()).join().unwrap();
    let live: Vec<usize> = (0..500).map(|_| alloc(48) as usize).collect();
    let d0 = direct();
    let (had, batches) = std::thread::spawn(move || {
        assert!(!thread::has_live_heap());
        // The first free takes a heap, perhaps an adopted one whose counters
        // count its earlier thread's batches: counted from there on.
        unsafe { free(gone[0] as *mut u8) };
        // SAFETY: our own heap, read by its owner.
        let sent = || unsafe { (*tls_heap()).counters.remote_batches_sent };
        let b0 = sent();
        for &p in gone[1..].iter().chain(&live) {
            unsafe { free(p as *mut u8) };
        }
        (thread::has_live_heap(), sent() - b0)
    })
    .join()
    .unwrap();
    assert!(had, "the freeing thread took a heap");
    assert_eq!(direct(), d0, "no free went alone");
    let (cap, _) = crate::heap::batch_shape_for_tests();
    // Two owners at most (the main thread's heap and the exited thread's,
    // unless this thread adopted it), each sent full batches but the last.
    assert!(batches <= (2 * 500usize.div_ceil(cap) + 1) as u64, "{batches} batches for 1000 frees");
    assert_eq!(report::bad_frees() - before, 0);
    check_invariants().unwrap();
}

#[test]
fn pages_taken_and_given_back_at_once_keep_the_span_bins_sound() {
    let _g = shared();
    // Two threads each take four 1 MiB pages of slabs and give two back per
    // round (a heap keeps two), a third allocates and frees large chunks of
    // one to four units: page takes race with frees of neighbouring spans.
    let rounds = if cfg!(debug_assertions) { 40 } else { 400 };
    let before = crate::stats::snapshot().pages_from_heaps;
    let hs: Vec<_> = (0..3usize)
        .map(|t| {
            std::thread::spawn(move || {
                for r in 0..rounds {
                    let v: Vec<usize> = if t == 2 {
                        (0..8).map(|i| alloc(((i + r) % 4 + 1) * UNIT - 100) as usize).collect()
                    } else {
                        (0..4096).map(|_| alloc(1024) as usize).collect()
                    };
                    for p in v {
                        assert!(p != 0);
                        unsafe { free(p as *mut u8) };
                    }
                }
                check_invariants().unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let back = crate::stats::snapshot().pages_from_heaps - before;
    assert!(back >= rounds as u64, "pages went back to the global heap ({back} in {rounds} rounds)");
    check_invariants().unwrap();
}

/// A thread that frees what it is sent, one request at a time, so that its
/// frees are remote frees (batched through its own heap) that happen before
/// the sender's next step.
struct Freer {
    tx: std::sync::mpsc::Sender<Option<usize>>,
    done: std::sync::mpsc::Receiver<()>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Freer {
    fn new() -> Freer {
        let (tx, rx) = std::sync::mpsc::channel::<Option<usize>>();
        let (dtx, done) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            // A heap of its own, so its frees are batched, not pushed one by one.
            unsafe { free(alloc(32)) };
            while let Ok(Some(p)) = rx.recv() {
                unsafe { free(p as *mut u8) };
                dtx.send(()).unwrap();
            }
        });
        Freer { tx, done, handle: Some(handle) }
    }

    fn free(&self, p: usize) {
        self.tx.send(Some(p)).unwrap();
        self.done.recv().unwrap();
    }
}

impl Drop for Freer {
    fn drop(&mut self) {
        let _ = self.tx.send(None);
        if let Some(h) = self.handle.take() {
            h.join().unwrap();
        }
    }
}

#[test]
fn random_local_and_remote_double_frees_are_each_refused_and_lose_nothing() {
    let _g = serial();
    if options().check {
        return; // check mode aborts on the first bad free.
    }
    let steps = if cfg!(debug_assertions) { 3000 } else { 20000 };
    for seed in 1..=3u32 {
        let before = report::bad_frees();
        let freer = Freer::new();
        let mut rng = Rng(0x2545_f491 ^ seed.wrapping_mul(0x9e37_79b9));
        // Live blocks: address -> (size, fill byte).
        let mut live: std::collections::HashMap<usize, (usize, u8)> = Default::default();
        // Freed blocks whose address no allocation has handed out since.
        let mut freed: Vec<usize> = Vec::new();
        let mut double_frees = 0usize;
        let size = |rng: &mut Rng| match rng.next() % 100 {
            0..=79 => 1 + rng.next() as usize % 512,
            80..=97 => 513 + rng.next() as usize % 16000,
            _ => 100_000 + rng.next() as usize % 200_000,
        };
        for step in 0..steps {
            let r = rng.next() % 100;
            if r < 40 || live.is_empty() {
                let n = size(&mut rng);
                let p = alloc(n) as usize;
                assert!(p != 0);
                assert!(!live.contains_key(&p), "seed {seed} step {step}: block {p:#x} handed out twice");
                freed.retain(|&f| f != p);
                let seed_byte = rng.next() as u8;
                fill(p as *mut u8, n, seed_byte);
                live.insert(p, (n, seed_byte));
            } else if r < 88 {
                let k = rng.next() as usize % live.len();
                let p = *live.keys().nth(k).unwrap();
                let (n, b) = live.remove(&p).unwrap();
                assert!(verify(p as *mut u8, n, b), "seed {seed} step {step}: block {p:#x} of {n} B corrupted");
                if r < 64 {
                    unsafe { free(p as *mut u8) };
                } else {
                    freer.free(p);
                }
                freed.push(p);
            } else if !freed.is_empty() {
                let p = freed[rng.next() as usize % freed.len()];
                double_frees += 1;
                if r < 94 {
                    unsafe { free(p as *mut u8) };
                } else {
                    freer.free(p);
                }
            }
        }
        for (&p, &(n, b)) in &live {
            assert!(verify(p as *mut u8, n, b), "seed {seed}: block {p:#x} of {n} B corrupted");
            unsafe { free(p as *mut u8) };
        }
        drop(freer);
        assert_eq!(
            report::bad_frees() - before,
            double_frees,
            "seed {seed}: every double free is refused and reported once, and nothing else is"
        );
        check_invariants().unwrap();
    }
}

#[test]
fn large_realloc_grows_and_shrinks_in_place() {
    let _g = serial();
    let mut p = alloc(1 << 20);
    fill(p, 1 << 20, 4);
    let mut in_place = 0;
    let mut n = 1usize << 20;
    for _ in 0..6 {
        let m = n * 2;
        let q = unsafe { realloc(p, m) };
        assert!(!q.is_null());
        assert!(verify(q, n, 4));
        if q == p {
            in_place += 1;
        }
        fill(q, m, 4);
        p = q;
        n = m;
    }
    assert!(in_place > 0, "growth into free or fresh space happens in place");
    let q = unsafe { realloc(p, 300_000) };
    assert_eq!(q, p, "shrinking a large chunk keeps it in place");
    assert!(verify(q, 300_000, 4));
    assert!(unsafe { usable_size(q) } < n);
    check_invariants().unwrap();
    unsafe { free(q) };
    check_invariants().unwrap();
}

#[test]
fn slot_location_is_exact_for_every_class_and_offset() {
    // The free path's one-multiply test (`slab::locate` with the slab's
    // `magic` and `slots`) agrees with `off % size == 0 && off / size < slots`
    // for every small class and every offset in a unit.
    for c in 0..SMALL_CLASSES {
        let size = size_class::class_size(c);
        let shape = heap::SHAPES[c];
        assert_eq!((shape.size as usize, shape.slots as usize), (size, UNIT / size), "class {c}");
        for off in 0..UNIT {
            let want = (off % size == 0 && off / size < UNIT / size).then_some(off / size);
            assert_eq!(crate::slab::locate(shape.magic, shape.slots, off), want, "class {c} off {off}");
        }
    }
}

#[test]
fn full_slabs_take_the_slow_path_and_come_back() {
    let _g = serial();
    if options().check {
        return;
    }
    let before = report::bad_frees();
    // Fill several slabs of one class so that some go to the full list
    // (16 blocks of 4 KiB per slab).
    let size = 4096;
    let v = assert_distinct("fill", size, 64);
    check_invariants().unwrap();
    // An interior pointer into a full slab is refused.
    unsafe { free(v[0].add(16)) };
    // A free slot of the current slab (above the blocks taken so far) is
    // refused: its bit says it is free.
    let p = alloc(size);
    let off = p as usize & (UNIT - 1);
    if off + 2 * size < UNIT {
        unsafe { free(p.add(2 * size)) };
    } else {
        unsafe { free(p.sub(off).add(1)) }; // not a block start either
    }
    assert_eq!(report::bad_frees() - before, 2);
    check_invariants().unwrap();
    // The first free into a full slab takes the slow path and makes it
    // available again; a second free of the same block (on the fast path
    // now) finds its bit set and is refused.
    unsafe { free(v[1]) };
    check_invariants().unwrap();
    unsafe { free(v[1]) };
    assert_eq!(report::bad_frees() - before, 3);
    let again = assert_distinct("after a double free into a full slab", size, 64);
    check_invariants().unwrap();
    unsafe { free(p) };
    for &x in v.iter().skip(2).chain(&again) {
        unsafe { free(x) };
    }
    unsafe { free(v[0]) };
    check_invariants().unwrap();
}

#[test]
fn remote_frees_into_full_slabs_and_emptied_words_come_back_exactly() {
    // Blocks freed by another thread come back through batches.  Most take
    // the short way in (a slab with room whose word does not become wholly
    // free); a slab that was full, and a word that a free makes wholly free,
    // take the general way, which moves the slab between its lists.  Both
    // must give every block back exactly once.
    let _g = serial();
    let size = 1024; // 64 blocks per slab, one bitmap word
    let c = size_class::class_index(size);
    let n = 64 * 3 + 5;
    // SAFETY (our own heap's counters and bitmaps): the heap is this thread's.
    let received = || unsafe { (*tls_heap()).counters.remote_frees_received };
    let live = || unsafe {
        let h = tls_heap();
        (*h).publish();
        (*h).published.blocks[c].load(canopy_sync::prim::Ordering::Relaxed)
    };
    let blocks = assert_distinct("fill", size, n);
    check_invariants().unwrap();
    let (before, live_before, bad) = (received(), live(), report::bad_frees());
    let sent = blocks.iter().map(|&p| p as usize).collect::<Vec<_>>();
    on_thread_with_heap(move || {
        for &p in &sent {
            unsafe { free(p as *mut u8) };
        }
        collect(); // sends the last, partial batch
    });
    collect(); // takes the batches in
    assert_eq!(received() - before, n as u64, "every block came back");
    assert_eq!(report::bad_frees(), bad, "and none was refused");
    assert_eq!(live(), live_before - n as u64, "each block is free again, once");
    check_invariants().unwrap();
    let again = assert_distinct("again", size, n);
    assert_eq!(live(), live_before, "and is handed out once");
    for p in again {
        unsafe { free(p) };
    }
    check_invariants().unwrap();
}

#[test]
fn size_indexed_slabs_match_the_classes() {
    let _g = shared();
    // Every size up to SMALL_MAX gets a block of its class from the
    // size-indexed fast path, and the class-indexed path agrees.
    for size in 0..=SMALL_MAX {
        let p = alloc(size);
        assert!(!p.is_null());
        let u = unsafe { usable_size(p) };
        assert_eq!(u, SizeClass::of(size).unwrap().size(), "size {size}");
        unsafe { free(p) };
    }
    check_invariants().unwrap();
}

#[test]
fn a_block_sent_home_and_freed_again_does_not_derail_the_inbox() {
    let _g = serial();
    if options().check {
        return; // check mode aborts at the second free
    }
    let before = report::bad_frees();
    let blocks: Vec<usize> = (0..64).map(|_| alloc(64) as usize).collect();
    let r = blocks[0];
    // Another thread frees r (sent to us); then we free it again.  The free
    // is refused (r's mark says it is in flight); before the fast path read
    // the mark, the owner's free list (as small slabs had then) reused the
    // word that links r in the inbox, and this test checked that draining
    // stopped at r.
    std::thread::spawn(move || unsafe { free(r as *mut u8) }).join().unwrap();
    unsafe { free(r as *mut u8) };
    // A block comes back to the program, which writes a pointer to a live
    // block into its first word (where an inbox link would be).
    let q = alloc(64);
    unsafe { *(q as *mut usize) = blocks[1] };
    // More frees come home from another thread.
    let rest: Vec<usize> = blocks[2..].to_vec();
    std::thread::spawn(move || {
        for p in rest {
            unsafe { free(p as *mut u8) }
        }
    })
    .join()
    .unwrap();
    // Draining never follows a link into live blocks.
    let v = assert_distinct("after a derailed inbox", 64, 5000);
    assert!(report::bad_frees() > before, "the double free is reported");
    check_invariants().unwrap();
    for x in v {
        unsafe { free(x) };
    }
    unsafe {
        free(blocks[1] as *mut u8);
        free(q);
    }
    check_invariants().unwrap();
}

#[test]
fn a_heap_whose_inbox_broke_is_retired_with_its_memory() {
    let _g = serial();
    if options().check {
        return; // check mode aborts at the second free
    }
    let before = report::bad_frees();
    // The owner thread: a block of its heap is freed by a thread that has no
    // heap (so it sits alone in the owner's inbox, linked through its own
    // first word; frees from threads with heaps travel in batches, where a
    // stale entry breaks nothing), and the owner frees it again as if its
    // free had raced ahead of the other thread's (the tag check passed before
    // the in-flight tag landed).  Sequential double frees are refused, so the
    // race is simulated by clearing the tag.
    let kept: usize = std::thread::spawn(|| {
        let blocks: Vec<usize> = (0..64).map(|_| alloc(64) as usize).collect();
        // Blocks of other classes, in other slabs (some on a second page);
        // the last one outlives this thread.
        let others: Vec<usize> = (0..24).map(|c| alloc_class_index(4 + c) as usize).collect();
        let r = blocks[0];
        free_as_a_thread_without_a_heap(r);
        // SAFETY: r is a block of this heap, in flight to it; clearing its
        // tag stands in for the racing free described above.
        unsafe {
            (*(r as *mut arena::Block)).tag = 0;
            free(r as *mut u8);
        }
        // The drain finds r no longer in flight: the inbox is given up.
        collect();
        // SAFETY: our own heap, read by its owner.
        assert!(unsafe { (*tls_heap()).inbox_broken }, "the crossed inbox was noticed");
        // Everything but one block is freed here: slabs empty, pages free up.
        for &p in blocks[1..].iter().chain(&others[..others.len() - 1]) {
            unsafe { free(p as *mut u8) };
        }
        others[others.len() - 1]
    })
    .join()
    .unwrap();
    // The owner has exited: its heap is retired, not abandoned, and keeps
    // all its pages.  Fill memory with live blocks of our own, then free the
    // owner's last block: it goes to the dead inbox, and the write through
    // the inbox's stale tail must land in the retired heap's memory, not in
    // any of ours.
    let mine: Vec<usize> = (0..40_000).map(|_| alloc(64) as usize).collect();
    for (i, &p) in mine.iter().enumerate() {
        fill(p as *mut u8, 64, i as u8);
    }
    unsafe { free(kept as *mut u8) };
    collect();
    for (i, &p) in mine.iter().enumerate() {
        assert!(verify(p as *mut u8, 64, i as u8), "block {p:#x} was written by a free to the retired heap");
    }
    // No new thread adopts the retired heap.
    let adopted_broken = std::thread::spawn(|| {
        let p = alloc(64);
        // SAFETY: our own heap, read by its owner.
        let broken = unsafe { (*tls_heap()).inbox_broken };
        unsafe { free(p) };
        broken
    })
    .join()
    .unwrap();
    assert!(!adopted_broken, "a retired heap was adopted");
    assert!(report::bad_frees() > before, "the crossed inbox is reported");
    check_invariants().unwrap();
    for p in mine {
        unsafe { free(p as *mut u8) };
    }
    check_invariants().unwrap();
}

/// Pages of `[p, p + len)` in memory (mincore; `p` page aligned).
fn resident_pages(p: *mut u8, len: usize) -> usize {
    let page = canopy_sys::page_size();
    let mut v = vec![0u8; len.div_ceil(page)];
    // SAFETY: the range lies in the arena's reservation; mincore only reads
    // the page tables.
    let r = unsafe { libc::mincore(p as *mut libc::c_void, len, v.as_mut_ptr()) };
    assert_eq!(r, 0, "mincore failed");
    v.iter().filter(|&&b| b & 1 != 0).count()
}

#[test]
fn a_reused_span_keeps_in_memory_only_what_the_new_chunk_asked_for() {
    let _g = serial();
    let page = canopy_sys::page_size();
    // A long chunk, every page touched, then freed: its span stays committed
    // in the global heap (far below CANOPY_RETAIN_MB) and is reused.  (Too
    // long for the thread's large cache, which would keep it.)
    const BIG: usize = (large_cache::CACHE_MAX_UNITS + 4) * UNIT;
    let big = alloc_aligned(BIG, UNIT);
    assert!(!big.is_null());
    fill(big, BIG, 1);
    let span = big as usize..big as usize + BIG;
    unsafe { free(big) };
    assert!(resident_pages(big, BIG) > 0, "the freed span should still be in memory");
    // Short chunks (one 64 KiB unit each, 20 KiB asked for): whatever span
    // each comes from, the pages past what it asked for are not in memory.
    let ask: usize = 20 << 10;
    let tail_from = ask.next_multiple_of(page);
    let (mut chunks, mut inside) = (Vec::new(), 0);
    while inside < 8 && chunks.len() < 4096 {
        let p = alloc_aligned(ask, UNIT);
        assert!(!p.is_null());
        assert_eq!(p as usize % UNIT, 0);
        // SAFETY: the chunk's span is one unit; only its tail is inspected.
        let tail = unsafe { p.add(tail_from) };
        assert_eq!(resident_pages(tail, UNIT - tail_from), 0, "tail of the chunk at {p:p} is in memory");
        fill(p, ask, 2);
        inside += usize::from(span.contains(&(p as usize)));
        chunks.push(p);
    }
    assert!(inside > 0, "no chunk reused the freed span");
    for p in chunks {
        assert!(verify(p, ask, 2));
        unsafe { free(p) };
    }
    check_invariants().unwrap();
}

#[test]
fn a_span_whose_tail_is_known_clean_is_not_trimmed_again() {
    let _g = serial();
    if options().huge_pages {
        return; // no trims at all with huge pages
    }
    let page = canopy_sys::page_size();
    let ask: usize = 20 << 10;
    let tail_from = ask.next_multiple_of(page);
    // A committed span with no hint: a whole unit touched, then freed.
    let full = alloc_aligned(UNIT, UNIT);
    assert!(!full.is_null());
    fill(full, UNIT, 3);
    unsafe { free(full) };
    let decommits = || {
        let locked = solo::lock();
        // SAFETY: global lock held.
        let n = unsafe { global::state().stats.decommits };
        solo::unlock(locked);
        n
    };
    // The same short chunk allocated and freed over and over (canopy-hh's
    // large objects do this): the first may trim its span's tail; after
    // that the span's hint says the tail is clean, and no madvise is needed.
    let before = decommits();
    let rounds = 200;
    for round in 0..rounds {
        let p = alloc_aligned(ask, UNIT);
        assert!(!p.is_null());
        // SAFETY: only the chunk's own unit is inspected.
        let tail = unsafe { p.add(tail_from) };
        assert_eq!(resident_pages(tail, UNIT - tail_from), 0, "round {round}: tail of {p:p} is in memory");
        fill(p, ask, round as u8);
        assert!(verify(p, ask, round as u8));
        unsafe { free(p) };
    }
    let trims = decommits() - before;
    assert!(trims <= 4, "{trims} trims in {rounds} rounds of the same short chunk");
    check_invariants().unwrap();
}

/// The first unit of the 1 MiB page holding `p`.
fn page_of(p: *mut u8) -> usize {
    unit_index(p as usize) & !(arena::PAGE_UNITS - 1)
}

/// In the calling thread: fill one medium page (`P`) with 10 KiB chunks of
/// its own, move the current page on, and free every chunk of `P` but the
/// first `keep`.  Returns `P` and the chunks still live (those of `P` kept,
/// and the ones on other pages).
fn a_medium_page_freed_down_to(keep: usize) -> (usize, Vec<*mut u8>) {
    let size = 10 << 10;
    let mut live: Vec<*mut u8> = Vec::new();
    // (The thread may have adopted a heap with free chunks in its bins: a
    // page counts only once it holds 90 of ours, of the ~100 that fit.)
    let (mut target, mut ours) = (None, 0);
    loop {
        let p = alloc(size);
        assert!(!p.is_null());
        live.push(p);
        let off = p as usize & (arena::PAGE - 1);
        match target {
            Some(t) if page_of(p) == t => ours += 1,
            Some(_) if ours >= 90 => break, // P is full, current moved on
            // A chunk at the start of a page: the page may be bumped from 0.
            _ if off == 16 => (target, ours) = (Some(page_of(p)), 1),
            _ => target = None,
        }
        assert!(live.len() < 10_000, "no medium page filled");
    }
    let t = target.unwrap();
    let mut on_t = 0;
    live.retain(|&p| {
        if page_of(p) != t {
            return true;
        }
        on_t += 1;
        if on_t <= keep {
            return true;
        }
        unsafe { free(p) };
        false
    });
    (t, live)
}

#[test]
fn free_medium_memory_of_a_page_that_is_not_current_is_reused() {
    let _g = shared();
    // Page P keeps one live chunk at its start; the rest of it is free.
    // Requests too large for P's free chunks one by one must get P's free
    // run once chunks are coalesced, not new pages.
    let (landed, left) = std::thread::spawn(|| {
        let (t, live) = a_medium_page_freed_down_to(1);
        let big: Vec<*mut u8> = (0..48).map(|_| alloc(200 << 10)).collect();
        let landed = big.iter().filter(|&&p| page_of(p) == t).count();
        check_invariants().unwrap();
        let left = unsafe { (*tls_heap()).medium.pages };
        for p in big.into_iter().chain(live) {
            unsafe { free(p) };
        }
        check_invariants().unwrap();
        (landed, left)
    })
    .join()
    .unwrap();
    assert!(landed >= 3, "{landed} of 48 chunks of 200 KiB reused the free ~1 MiB of a page with one live chunk ({left} pages)");
}

#[test]
fn a_heap_whose_inbox_broke_still_reuses_its_empty_medium_pages() {
    let _g = serial();
    if options().check {
        return; // check mode aborts at the double free that breaks the inbox
    }
    let (landed, pages) = std::thread::spawn(|| {
        // Break this heap's inbox as `a_heap_whose_inbox_broke_is_retired_with_its_memory` does.
        let r = alloc(64) as usize;
        free_as_a_thread_without_a_heap(r);
        // SAFETY: r is a block of this heap in flight to it; clearing its
        // tag stands in for a racing second free.
        unsafe {
            (*(r as *mut arena::Block)).tag = 0;
            free(r as *mut u8);
        }
        collect();
        // SAFETY: our own heap, read by its owner.
        assert!(unsafe { (*tls_heap()).inbox_broken });
        // Page P empties; the heap keeps it, and must be able to use it
        // for chunks larger than the ones it held.
        let (t, live) = a_medium_page_freed_down_to(0);
        let big: Vec<*mut u8> = (0..48).map(|_| alloc(200 << 10)).collect();
        let landed = big.iter().filter(|&&p| page_of(p) == t).count();
        check_invariants().unwrap();
        let pages = unsafe { (*tls_heap()).medium.pages };
        for p in big.into_iter().chain(live) {
            unsafe { free(p) };
        }
        (landed, pages)
    })
    .join()
    .unwrap();
    assert!(landed >= 3, "{landed} of 48 chunks of 200 KiB reused an empty page kept by a heap whose inbox broke ({pages} pages)");
}

#[test]
fn a_large_chunk_grown_in_its_span_by_realloc_leaves_no_false_clean_mark() {
    let _g = serial();
    if options().huge_pages {
        return; // no trims at all with huge pages
    }
    let page = canopy_sys::page_size();
    let ask: usize = 20 << 10;
    let tail_from = ask.next_multiple_of(page);
    for round in 0..50 {
        // A one-unit chunk asked for 20 KiB, grown by realloc to 60 KiB
        // (within its span: same pointer), written, freed.
        let p = alloc_aligned(ask, UNIT);
        assert!(!p.is_null());
        let q = unsafe { realloc(p, 60 << 10) };
        assert_eq!(q, p, "realloc within the span moves nothing");
        fill(q, 60 << 10, round as u8);
        unsafe { free(q) };
        // The next short chunk from that span must not find its tail in
        // memory: the marks must not say the written pages are clean.
        let r = alloc_aligned(ask, UNIT);
        assert!(!r.is_null());
        // SAFETY: only the chunk's own unit is inspected.
        let tail = unsafe { r.add(tail_from) };
        assert_eq!(resident_pages(tail, UNIT - tail_from), 0, "round {round}: tail of {r:p} (the grown chunk was {q:p}) is in memory");
        unsafe { free(r) };
    }
    check_invariants().unwrap();
}

#[test]
fn after_fork_the_child_counts_only_its_own_live_heap() {
    let _g = serial();
    let p = alloc(64); // this thread has a heap
    assert!(!p.is_null());
    // Another thread with a heap, alive across the fork.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        let q = alloc(64);
        ready_tx.send(()).unwrap();
        rx.recv().unwrap();
        unsafe { free(q) };
    });
    ready_rx.recv().unwrap();
    // SAFETY: the child only reads atomics and the TLS slot, then _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let live = crate::thread::LIVE_HEAPS.load(canopy_sync::prim::Ordering::Relaxed);
        let want = usize::from(crate::thread::has_live_heap());
        // SAFETY: _exit ends the child without running the parent's handlers.
        unsafe { libc::_exit(if live == want { 0 } else { 10 + live.min(100) as i32 }) };
    }
    let mut status = 0;
    // SAFETY: pid is our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    tx.send(()).unwrap();
    other.join().unwrap();
    unsafe { free(p) };
    assert!(libc::WIFEXITED(status));
    let code = libc::WEXITSTATUS(status);
    assert_eq!(code, 0, "the child counted {} live heaps, it has one thread (with a heap)", code - 10);
}

#[test]
fn a_chunk_of_the_largest_medium_class_takes_only_what_it_needs_from_a_long_free_run() {
    let _g = shared();
    // As in `free_medium_memory_of_a_page_that_is_not_current_is_reused`,
    // with requests of the largest medium class, whose bin holds every free
    // run longer than it: the ~1 MiB run of page P holds three of them.
    let landed = std::thread::spawn(|| {
        let (t, live) = a_medium_page_freed_down_to(1);
        let big: Vec<*mut u8> = (0..48).map(|_| alloc(250 << 10)).collect();
        let landed = big.iter().filter(|&&p| page_of(p) == t).count();
        check_invariants().unwrap();
        for p in big.into_iter().chain(live) {
            unsafe { free(p) };
        }
        check_invariants().unwrap();
        landed
    })
    .join()
    .unwrap();
    assert!(landed >= 3, "{landed} of 48 chunks of 250 KiB were cut from the free ~1 MiB of a page with one live chunk");
}

/// `CANOPY_STRESS_SCALE` (default 1): multiplies the work of the race tests.
fn stress_scale() -> usize {
    std::env::var("CANOPY_STRESS_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1)
}

/// Two threads meeting, spinning: a blocking barrier wakes its waiters
/// microseconds apart, too far apart to race two frees.
struct SpinMeet(std::sync::atomic::AtomicUsize);

impl SpinMeet {
    /// Arrive for the `step`-th time (from 0); return once the other thread has.
    fn at(&self, step: usize) {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        self.0.fetch_add(1, AcqRel);
        let mut spins = 0u32;
        while self.0.load(Acquire) < 2 * (step + 1) {
            spins = spins.wrapping_add(1);
            if spins % 4096 == 0 {
                std::thread::yield_now();
            } else {
                core::hint::spin_loop();
            }
        }
    }
}

/// A short delay that differs from round to round, so that the two racing
/// frees start at every offset of a small range from each other.
fn jitter(rng: &mut Rng) {
    let r = rng.next();
    // Half the rounds start at once, the rest up to ~15 pause hints apart.
    let n = if r & 1 == 0 { 0 } else { (r >> 1) % 16 };
    for _ in 0..n {
        core::hint::spin_loop();
    }
}

/// Size of the chunks raced by `race_frees_of_one_medium_chunk` (a medium class).
const RACED: usize = 20_000;

/// Free one medium chunk twice at the same moment, `rounds` times: by its
/// owner and by a remote thread (`owner_frees`), or by two remote threads.
/// `with_heap[i]`: remote thread `i` has a heap (its free is batched and
/// sent when it next allocates) rather than pushing the free straight to the
/// owner's inbox.  After each race the owner checks that exactly one of the
/// two frees was refused and reported, that the chunk was freed once (four
/// chunks of its size come out distinct, the inbox is not broken), and
/// every 16 rounds the heap's invariants.  Returns the first round that failed, with what failed.
fn race_frees_of_one_medium_chunk(rounds: usize, owner_frees: bool, with_heap: [bool; 2]) -> Result<(), String> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    use std::sync::{Arc, Barrier};
    let remotes = if owner_frees { 1 } else { 2 };
    let posted = Arc::new(Barrier::new(remotes + 1));
    let done = Arc::new(Barrier::new(remotes + 1));
    let meet = Arc::new(SpinMeet(AtomicUsize::new(0)));
    let slot = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let hs: Vec<_> = (0..remotes)
        .map(|i| {
            let (posted, done, meet, slot, stop) = (posted.clone(), done.clone(), meet.clone(), slot.clone(), stop.clone());
            let with_heap = with_heap[i];
            std::thread::spawn(move || {
                if with_heap {
                    unsafe { free(alloc(RACED)) };
                }
                let mut rng = Rng(0x6c07_8965 ^ (i as u32 + 1).wrapping_mul(0x9e37_79b9));
                for round in 0..rounds {
                    posted.wait();
                    if stop.load(Relaxed) {
                        return;
                    }
                    let p = slot.load(Relaxed) as *mut u8;
                    meet.at(round);
                    jitter(&mut rng);
                    unsafe { free(p) };
                    if with_heap {
                        // The slow path of a medium allocation sends the batch.
                        unsafe { free(alloc(RACED)) };
                    }
                    done.wait();
                }
            })
        })
        .collect();
    let mut rng = Rng(0x2f69_3a1d);
    let mut failure = None;
    for round in 0..rounds {
        let before = report::bad_frees();
        let p = alloc(RACED);
        slot.store(p as usize, Relaxed);
        posted.wait();
        if owner_frees {
            meet.at(round);
            jitter(&mut rng);
            unsafe { free(p) };
        }
        done.wait();
        // The medium allocations drain the inbox first: a free that won
        // its race from another thread comes home here.
        let v: Vec<usize> = (0..4).map(|_| alloc(RACED) as usize).collect();
        let mut sorted = v.clone();
        sorted.sort_unstable();
        sorted.dedup();
        // SAFETY: our own heap, read by its owner.
        let broken = unsafe { (*tls_heap()).inbox_broken };
        let reported = report::bad_frees() - before;
        let what = if sorted.len() != v.len() || v.contains(&0) {
            Some(format!("a chunk was handed out twice: {v:x?} (the raced chunk was {p:?})"))
        } else if broken {
            Some(format!("the chunk {p:?} was freed by both and crossed the inbox, which broke"))
        } else if reported != 1 {
            Some(format!("{reported} of the two frees of {p:?} were reported as bad (1 expected)"))
        } else if round % 16 == 0 {
            check_invariants().err().map(|e| format!("invariant broken: {e}"))
        } else {
            None
        };
        if let Some(what) = what {
            failure = Some(format!("round {round} of {rounds}: {what}"));
            break;
        }
        for x in v {
            unsafe { free(x as *mut u8) };
        }
    }
    if failure.is_some() {
        // Release the remote threads (they wait for the next round).
        stop.store(true, Relaxed);
        posted.wait();
    }
    for h in hs {
        h.join().unwrap();
    }
    if let Some(f) = failure {
        return Err(f);
    }
    check_invariants().map_err(|e| format!("invariant broken at the end: {e}"))
}

#[test]
fn racing_frees_of_one_medium_chunk_free_it_once_and_report_the_other() {
    let _g = serial();
    if options().check {
        return; // check mode aborts on the first bad free.
    }
    let rounds = if cfg!(debug_assertions) { 200 } else { 2500 } * stress_scale();
    // Each case on a fresh owner thread.  A case that fails leaves a broken
    // heap, which the next case's thread may adopt: stop at the first.
    let cases: [(&str, bool, [bool; 2]); 4] = [
        ("owner and a thread without a heap", true, [false, false]),
        ("owner and a thread with a heap", true, [true, false]),
        ("two threads without a heap", false, [false, false]),
        ("a thread with a heap and one without", false, [true, false]),
    ];
    for (name, owner_frees, with_heap) in cases {
        let r = std::thread::spawn(move || race_frees_of_one_medium_chunk(rounds, owner_frees, with_heap)).join().unwrap();
        if let Err(e) = r {
            panic!("racing frees of one medium chunk, {name}: {e}");
        }
    }
}

#[test]
fn a_thread_gets_the_large_chunks_it_freed_back_from_its_cache() {
    let _g = serial();
    let budget = options().large_cache_bytes;
    if budget < 2 << 20 {
        return; // the cache is off or too small for this test's chunks
    }
    let base = stats::snapshot();
    std::thread::spawn(move || {
        let cached = || stats::snapshot().large_cached_bytes - base.large_cached_bytes;
        let hits = || stats::snapshot().large_cache_hits - base.large_cache_hits;
        // 400 KiB: seven units.  Freed, it waits in this thread's cache.
        let p = alloc(400 << 10);
        fill(p, 400 << 10, 7);
        unsafe { free(p) };
        assert_eq!(cached(), 7 * UNIT as u64, "the freed chunk is cached");
        check_invariants().unwrap();
        // A request of the same units gets it back; another does not.
        let q = alloc(420 << 10);
        assert_eq!(q, p, "a request of the same units takes the cached chunk");
        assert_eq!(hits(), 1);
        assert_eq!(cached(), 0);
        fill(q, 420 << 10, 8);
        let r = alloc(600 << 10);
        assert_ne!(r, q);
        assert!(verify(q, 420 << 10, 8));
        assert_eq!(hits(), 1, "ten units are not seven");
        unsafe {
            free(q);
            free(r);
        }
        assert_eq!(cached(), 17 * UNIT as u64);
        // A cached chunk of larger alignment than a unit is not used for an aligned request.
        let a = alloc_aligned(400 << 10, 4 * UNIT);
        assert_eq!(a as usize % (4 * UNIT), 0);
        assert_eq!(hits(), 1, "an over-aligned request goes to the global heap");
        unsafe { free(a) };
        // Frees beyond the budget send the cache back to the global heap;
        // it never holds more than the budget.
        let many: Vec<*mut u8> = (0..budget / (1 << 20) + 3).map(|_| alloc(1 << 20)).collect();
        for &m in &many {
            fill(m, 4096, 9);
            unsafe { free(m) };
            assert!(cached() <= budget as u64, "{} cached above the budget {budget}", cached());
            check_invariants().unwrap();
        }
        // Stats: every large allocation and free counted once.
        let s = stats::snapshot();
        assert_eq!(s.large_allocs - base.large_allocs, s.large_frees - base.large_frees);
        // canopy_collect empties the cache.
        collect();
        assert_eq!(cached(), 0, "collect gives the cached chunks back");
        check_invariants().unwrap();
        // What stays cached at exit goes back with the heap.
        let last = alloc(300 << 10);
        unsafe { free(last) };
        assert_eq!(cached(), 5 * UNIT as u64);
    })
    .join()
    .unwrap();
    assert_eq!(stats::snapshot().large_cached_bytes, base.large_cached_bytes, "an exiting thread's cache is emptied");
    check_invariants().unwrap();
}

#[test]
fn a_second_free_of_a_cached_large_chunk_is_refused() {
    let _g = serial();
    if options().check || options().large_cache_bytes < 1 << 20 {
        return; // check mode aborts on the first bad free; see the LD_PRELOAD tests.
    }
    std::thread::spawn(|| {
        let before = report::bad_frees();
        let p = alloc(500 << 10);
        unsafe {
            free(p);
            free(p);
        }
        assert_eq!(report::bad_frees() - before, 1, "the second free is refused");
        assert_eq!(unsafe { usable_size(p) }, 0, "a cached chunk is not a live block");
        let (a, b) = (alloc(500 << 10), alloc(500 << 10));
        assert_ne!(a, b, "the chunk was cached once");
        check_invariants().unwrap();
        unsafe {
            free(a);
            free(b);
        }
        check_invariants().unwrap();
    })
    .join()
    .unwrap();
}

/// Two threads with heaps free one large chunk at the same moment, `rounds`
/// times, in sizes their caches take and one they do not.  Each round checks
/// that exactly one free was refused and that the chunk was freed once: the
/// two threads then take two chunks of the size each, and all four differ.
#[test]
fn racing_frees_of_one_large_chunk_free_it_once_and_report_the_other() {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use std::sync::{Arc, Barrier, Mutex};
    let _g = serial();
    if options().check {
        return; // check mode aborts on the first bad free.
    }
    let rounds = if cfg!(debug_assertions) { 150 } else { 1500 } * stress_scale();
    // Five, eleven and sixteen units (cached), and 48 (never cached).
    const SIZES: [usize; 4] = [300 << 10, 700 << 10, 1 << 20, 3 << 20];
    let barrier = Arc::new(Barrier::new(2));
    let meet = Arc::new(SpinMeet(AtomicUsize::new(0)));
    let slot = Arc::new(AtomicUsize::new(0));
    let taken = Arc::new(Mutex::new(Vec::<usize>::new()));
    let failure = Arc::new(Mutex::new(None::<String>));
    let threads: Vec<_> = (0..2u32)
        .map(|t| {
            let (barrier, meet, slot, taken, failure) =
                (barrier.clone(), meet.clone(), slot.clone(), taken.clone(), failure.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x9e37_79b9 ^ (t + 1));
                let start = report::bad_frees();
                for round in 0..rounds {
                    let size = SIZES[round % SIZES.len()];
                    if t == 0 {
                        let p = alloc(size);
                        fill(p, 64, round as u8);
                        slot.store(p as usize, Relaxed);
                    }
                    barrier.wait();
                    let p = slot.load(Relaxed) as *mut u8;
                    meet.at(round);
                    jitter(&mut rng);
                    unsafe { free(p) };
                    barrier.wait();
                    if t == 0 && report::bad_frees() - start != round + 1 {
                        failure.lock().unwrap().get_or_insert(format!(
                            "round {round}, {size} bytes: {} bad frees reported, want {}",
                            report::bad_frees() - start,
                            round + 1
                        ));
                    }
                    let mine = [alloc(size), alloc(size)];
                    for (k, &m) in mine.iter().enumerate() {
                        fill(m, 64, (round + k) as u8 ^ t as u8);
                    }
                    taken.lock().unwrap().extend(mine.iter().map(|&m| m as usize));
                    barrier.wait();
                    if t == 0 {
                        let mut all = std::mem::take(&mut *taken.lock().unwrap());
                        all.sort_unstable();
                        if all.windows(2).any(|w| w[1] - w[0] < size) {
                            failure.lock().unwrap().get_or_insert(format!(
                                "round {round}, {size} bytes: chunks handed out twice or overlapping: {all:x?}"
                            ));
                        }
                    }
                    barrier.wait();
                    for (k, &m) in mine.iter().enumerate() {
                        if !verify(m, 64, (round + k) as u8 ^ t as u8) {
                            failure.lock().unwrap().get_or_insert(format!("round {round}: a chunk's bytes changed"));
                        }
                        unsafe { free(m) };
                    }
                    if round % 16 == 0 {
                        if let Err(e) = check_invariants() {
                            failure.lock().unwrap().get_or_insert(format!("round {round}: {e}"));
                        }
                    }
                }
            })
        })
        .collect();
    for h in threads {
        h.join().unwrap();
    }
    if let Some(f) = failure.lock().unwrap().take() {
        panic!("racing frees of one large chunk: {f}");
    }
    check_invariants().unwrap();
}

#[test]
fn a_buffer_grown_by_realloc_moves_a_logarithmic_number_of_times() {
    let _g = shared();
    // A medium block grown just past the medium sizes moves into a large
    // chunk with room: half its old size again.
    let m = alloc(250 << 10);
    fill(m, 250 << 10, 1);
    let l = unsafe { realloc(m, 260 << 10) };
    assert!(verify(l, 250 << 10, 1));
    assert!(unsafe { usable_size(l) } >= 375 << 10, "usable {} KiB", unsafe { usable_size(l) } >> 10);
    unsafe { free(l) };
    // Four buffers grown side by side, 16 KiB at a time, from 300 KiB to
    // 2 MiB: each blocks the others' growth in place, so without room each
    // would move about once per 64 KiB unit (some 27 times).
    const STEP: usize = 16 << 10;
    let mut bufs: Vec<(*mut u8, usize)> = (0..4).map(|_| (alloc(300 << 10), 300 << 10)).collect();
    for (i, &(b, n)) in bufs.iter().enumerate() {
        fill(b, n, i as u8);
    }
    let mut moves = 0;
    while bufs[0].1 < 2 << 20 {
        for (i, buf) in bufs.iter_mut().enumerate() {
            let (b, n) = *buf;
            let q = unsafe { realloc(b, n + STEP) };
            assert!(!q.is_null());
            moves += usize::from(q != b);
            // The old bytes came along; the new ones are written.
            assert!(verify(q, n, i as u8), "buffer {i} lost its bytes at {n}");
            fill(q, n + STEP, i as u8);
            *buf = (q, n + STEP);
        }
    }
    // With room: 18 here (log 1.5 of 2 MiB / 300 KiB is 4.7 per buffer); 38 without.
    assert!(moves <= 4 * 6, "{moves} moves for four buffers grown from 300 KiB to 2 MiB");
    for (b, _) in bufs {
        unsafe { free(b) };
    }
    check_invariants().unwrap();
}

#[test]
fn many_threads_together_cache_no_more_than_the_retain_limit() {
    use std::sync::{Arc, Barrier};
    let _g = serial();
    let o = options();
    // More threads than MiB in the retain limit: each one's share is below
    // 1 MiB, so a chunk of 16 units is not cached but one of 5 is.
    let n = (o.retain_bytes >> 20) + 16;
    if o.large_cache_bytes < 1 << 20 || n > 256 {
        return;
    }
    let barrier = Arc::new(Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let small = alloc(64); // a heap of its own
                barrier.wait();
                let (big, short) = (alloc(1 << 20), alloc(300 << 10));
                unsafe {
                    free(big);
                    free(short);
                }
                // SAFETY: this thread's own heap, read by its owner.
                let cached = unsafe { (*tls_heap()).large_cache.bytes };
                barrier.wait();
                unsafe { free(small) };
                cached
            })
        })
        .collect();
    for t in threads {
        let cached = t.join().unwrap();
        assert_eq!(cached, 5 * UNIT, "only the 5-unit chunk fits a share of {} KiB", (o.retain_bytes / n) >> 10);
    }
    check_invariants().unwrap();
}

// ----- kept lists: other heaps' blocks a thread freed, reused by it -----

/// Allocate and free one block of `size` on this thread, so that its heap
/// allocates in that class (a thread keeps only blocks of such classes).
fn activate(size: usize) {
    let p = alloc(size);
    assert!(!p.is_null());
    unsafe { free(p) };
    // The free kept the block (an own block goes onto the kept list while it
    // has room): back into its slab, so that the tests count only what they
    // free themselves.
    // SAFETY: our own heap.
    unsafe { (*tls_heap()).return_kept(true) };
}

/// Blocks the calling thread's heap keeps for class `c`, and its room.
fn kept_of(c: usize) -> (usize, u32) {
    let h = tls_heap();
    // SAFETY: our own heap, read by its owner.
    unsafe {
        let k = &(*h).cursors[c];
        let mut n = 0;
        let mut b = k.kept;
        while !b.is_null() {
            n += 1;
            b = (*b).next;
        }
        (n, k.kept_room)
    }
}

#[test]
fn a_thread_keeps_the_blocks_of_other_heaps_it_frees_and_reuses_them_first() {
    let _g = shared();
    let c = small_class_index(256);
    let cap = crate::heap::kept_cap(c, options().keep_bytes) as usize;
    if cap < 2 {
        return; // CANOPY_KEEP_KB=0 (or below 512 bytes): nothing or too little is kept
    }
    assert_eq!(cap, options().keep_bytes / 256);
    let blocks: Vec<usize> = (0..cap / 2).map(|_| alloc(256) as usize).collect();
    let check_mode = options().check;
    let (kept_after_frees, reused, room_after) = on_thread_with_heap(move || {
        activate(256);
        // SAFETY: our own heap.
        let kept0 = unsafe { (*tls_heap()).counters.remote_frees_kept };
        for &p in &blocks {
            unsafe { free(p as *mut u8) };
        }
        let kept = unsafe { (*tls_heap()).counters.remote_frees_kept } - kept0;
        assert_eq!(kept_of(c).0 as u64, kept);
        check_invariants().unwrap();
        // The most recently freed comes back first, then the others, newest
        // first; a size of another class does not take them.
        let other = alloc(300);
        let mine: Vec<usize> = (0..blocks.len()).map(|_| alloc(240) as usize).collect();
        let reused = if check_mode {
            0
        } else {
            assert_eq!(mine[0], *blocks.last().unwrap(), "the last block freed is the first reused");
            let back: Vec<usize> = blocks.iter().rev().copied().collect();
            assert_eq!(mine, back, "kept blocks come back newest first");
            mine.len()
        };
        let room = kept_of(c).1;
        check_invariants().unwrap();
        for p in mine {
            unsafe { free(p as *mut u8) };
        }
        unsafe { free(other) };
        (kept, reused, room)
    });
    if check_mode {
        assert_eq!(kept_after_frees, 0, "check mode keeps nothing: every free is checked at home");
        assert_eq!(room_after, 0);
    } else {
        assert_eq!(kept_after_frees as usize, cap / 2, "every free was kept");
        assert_eq!(reused, cap / 2);
        assert_eq!(room_after as usize, cap, "taking them gave the room back");
    }
    collect();
    check_invariants().unwrap();
}

#[test]
fn a_kept_list_is_bounded_and_the_rest_travels_home_in_batches() {
    let _g = shared();
    let c = small_class_index(1024);
    let cap = crate::heap::kept_cap(c, options().keep_bytes) as usize;
    let n = 3 * cap + 5;
    let blocks: Vec<usize> = (0..n).map(|_| alloc(1024) as usize).collect();
    let (kept, sent, kept_now) = on_thread_with_heap(move || {
        activate(1024);
        // SAFETY: our own heap.
        let counters = || unsafe { ((*tls_heap()).counters.remote_frees_kept, (*tls_heap()).counters.remote_frees_sent) };
        let (k0, s0) = counters();
        for p in blocks {
            unsafe { free(p as *mut u8) };
        }
        let (k1, s1) = counters();
        let now = kept_of(c).0;
        check_invariants().unwrap();
        (k1 - k0, s1 - s0, now)
    });
    if options().check {
        assert_eq!((kept, sent), (0, n as u64));
    } else {
        assert_eq!(kept as usize, cap, "the list holds its cap");
        assert_eq!(kept_now, cap);
        assert_eq!(sent as usize, n - cap, "the rest is sent to the owner");
    }
    // The thread exited: what it kept went home too.  Draining takes all of
    // them back, and the blocks are free in their slabs again.
    collect();
    let again: std::collections::HashSet<usize> = (0..n).map(|_| alloc(1024) as usize).collect();
    assert_eq!(again.len(), n);
    check_invariants().unwrap();
    for p in again {
        unsafe { free(p as *mut u8) };
    }
}

#[test]
fn blocks_that_share_cache_lines_are_never_kept() {
    let _g = shared();
    for size in [16, 48, 80, 112, 160, 224] {
        let c = small_class_index(size);
        assert!(crate::size_class::class_size(c) % 64 != 0);
        assert!(!crate::heap::keeps_remote(crate::size_class::class_size(c)), "class of {size} B");
        let blocks: Vec<usize> = (0..8).map(|_| alloc(size) as usize).collect();
        let kept = on_thread_with_heap(move || {
            activate(size);
            // SAFETY: our own heap.
            let k0 = unsafe { (*tls_heap()).counters.remote_frees_kept };
            for p in blocks {
                unsafe { free(p as *mut u8) };
            }
            (unsafe { (*tls_heap()).counters.remote_frees_kept } - k0, kept_of(c).0)
        });
        assert_eq!(kept, (0, 0), "{size} B blocks were kept");
    }
    for size in [64, 128, 192, 256, 320, 8192] {
        let c = small_class_index(size);
        assert!(crate::heap::keeps_remote(crate::size_class::class_size(c)), "{size} B blocks are whole lines");
        assert!(crate::heap::kept_cap(c, 4096) >= 1);
        assert_eq!(crate::heap::kept_cap(small_class_index(size), 0), 0, "CANOPY_KEEP_KB=0 keeps nothing");
    }
    collect();
}

#[test]
fn a_kept_block_freed_again_is_refused_by_its_keeper_and_its_owner() {
    let _g = serial();
    if options().check || options().keep_bytes == 0 {
        return; // check mode aborts on the first bad free (and keeps nothing).
    }
    let before = report::bad_frees();
    let x = alloc(512) as usize;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (back_tx, back_rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        on_thread_with_heap(move || {
            activate(512);
            let c = small_class_index(512);
            unsafe { free(x as *mut u8) };
            assert_eq!(kept_of(c).0, 1, "the block is kept");
            // Its keeper frees it again: refused, the list unchanged.
            unsafe { free(x as *mut u8) };
            assert_eq!(report::bad_frees() - before, 1);
            assert_eq!(kept_of(c).0, 1);
            check_invariants().unwrap();
            back_tx.send(()).unwrap();
            // The owner frees it too (below); then the block is reused here.
            rx.recv().unwrap();
            let y = alloc(512) as usize;
            assert_eq!(y, x, "the kept block is still good");
            unsafe { free(y as *mut u8) };
            check_invariants().unwrap();
        })
    });
    back_rx.recv().unwrap();
    // The owner's free of a block another thread keeps: refused (it is in
    // flight), not set free in its slab.
    unsafe { free(x as *mut u8) };
    assert_eq!(report::bad_frees() - before, 2);
    let v = assert_distinct("after double frees of a kept block", 512, 3000);
    assert!(!v.contains(&(x as *mut u8)), "the owner handed out a block another thread keeps");
    tx.send(()).unwrap();
    t.join().unwrap();
    collect();
    assert_eq!(report::bad_frees() - before, 2, "nothing else was reported");
    check_invariants().unwrap();
    for p in v {
        unsafe { free(p) };
    }
    check_invariants().unwrap();
}

#[test]
fn kept_blocks_go_home_on_collect() {
    let _g = shared();
    if options().check || options().keep_bytes == 0 {
        return; // nothing is kept in check mode or with CANOPY_KEEP_KB=0
    }
    let c = small_class_index(4096);
    let cap = crate::heap::kept_cap(c, options().keep_bytes) as usize;
    assert!(cap >= 1);
    let blocks: Vec<usize> = (0..cap).map(|_| alloc(4096) as usize).collect();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (kept_tx, kept_rx) = std::sync::mpsc::channel::<usize>();
    let t = std::thread::spawn(move || {
        on_thread_with_heap(move || {
            activate(4096);
            for p in blocks {
                unsafe { free(p as *mut u8) };
            }
            kept_tx.send(kept_of(c).0).unwrap();
            rx.recv().unwrap();
            // SAFETY: our own heap.
            let sent0 = unsafe { (*tls_heap()).counters.remote_frees_sent };
            collect();
            let sent = unsafe { (*tls_heap()).counters.remote_frees_sent } - sent0;
            assert_eq!(kept_of(c), (0, cap as u32), "collect empties the kept list");
            kept_tx.send(sent as usize).unwrap();
            rx.recv().unwrap();
        })
    });
    assert_eq!(kept_rx.recv().unwrap(), cap);
    // SAFETY: our own heap.
    let received = || unsafe { (*tls_heap()).counters.remote_frees_received };
    tx.send(()).unwrap();
    assert_eq!(kept_rx.recv().unwrap(), cap, "collect sent every kept block home");
    let r0 = received();
    collect();
    assert_eq!(received() - r0, cap as u64, "and they arrived");
    tx.send(()).unwrap();
    t.join().unwrap();
    check_invariants().unwrap();
}

#[test]
fn a_thread_that_does_not_allocate_a_class_keeps_none_of_its_blocks() {
    let _g = shared();
    // The consumer of a producer/consumer pair, or a counting thread: it
    // frees other threads' blocks of classes it never allocates, and every
    // free goes home (kept blocks would sit in it until it exits).
    let blocks: Vec<usize> = (0..40).map(|_| alloc(1024) as usize).collect();
    let (kept, sent) = on_thread_with_heap(move || {
        // SAFETY: our own heap.
        let counters = || unsafe { ((*tls_heap()).counters.remote_frees_kept, (*tls_heap()).counters.remote_frees_sent) };
        let (k0, s0) = counters();
        for p in blocks {
            unsafe { free(p as *mut u8) };
        }
        let (k1, s1) = counters();
        check_invariants().unwrap();
        (k1 - k0, s1 - s0)
    });
    assert_eq!((kept, sent), (0, 40), "a class the thread does not allocate is not kept");
    collect();
    check_invariants().unwrap();
}

/// The way-prediction hash of AMD Zen's L1 data cache for the page at
/// `va` (eight bits, each the exclusive or of two of virtual address bits
/// 12 to 27; see `arena::BITMAP_PAGES`).
fn zen_way_hash(va: usize) -> u8 {
    const PAIRS: [(u32, u32); 8] = [(12, 27), (13, 26), (14, 25), (15, 20), (16, 21), (17, 22), (18, 23), (19, 24)];
    PAIRS
        .iter()
        .enumerate()
        .fold(0u8, |h, (i, &(a, b))| h | ((((va >> a) ^ (va >> b)) & 1) as u8) << i)
}

/// The metadata pages every slab of the first heaps touches on its fast
/// paths (the bitmap table's pages for units 0 to 71, the descriptor
/// table's page for units 0 to 55 and the first five heaps) share their way hash with no page of the
/// first 64 units except pages of the last two units of a 1 MiB heap page
/// (14 and 15 of each 16), the slabs a heap makes last; with the tables at
/// the start of their gigabytes, the bitmap's first page and the arena's
/// first page (the first slab's first blocks) had the same hash.  Checked
/// on the addresses of this process's arena.
#[test]
fn metadata_pages_share_way_hashes_only_with_late_units() {
    let _g = serial();
    assert!(thread::ensure_init(), "the arena is there");
    let base = arena::arena_base();
    assert_eq!(base % arena::ARENA_ALIGN, 0, "the arena is 1 GiB aligned");
    // The hash sees what moved: the tables' old first pages match the
    // arena's first page.
    assert_eq!(zen_way_hash(base - (2 << 30)), zen_way_hash(base));
    assert_eq!(zen_way_hash(base - (1 << 30)), zen_way_hash(base));
    let bitmap_pages = (0..9).map(|j| (arena::bitmap_at(base, 8 * j) as usize) & !4095);
    let table_page = std::iter::once(arena::desc_at(base, 0) as usize & !4095);
    // The first five heaps' pages (the area is laid out the same in every
    // process, whichever thread's heap each is).
    let heap_pages = (0..5 * crate::meta::heap_stride()).step_by(4096).map(|off| crate::meta::base() + off);
    assert_eq!(crate::meta::base() % (1 << 30), crate::meta::META_PAGES << 12);
    for meta in bitmap_pages.chain(table_page).chain(heap_pages) {
        for page in 0..64 * 16 {
            let unit = page / 16;
            if zen_way_hash(base + page * 4096) == zen_way_hash(meta) {
                assert!(
                    unit % 16 >= 14,
                    "metadata page {meta:#x} shares its way hash with page {} of unit {unit}",
                    page % 16
                );
            }
        }
    }
}

// ----- the unchecked rich free -----

/// Whether small block `p` is free in its slab's bitmap.
fn free_in_bitmap(p: usize) -> bool {
    // SAFETY: p lies in a SMALL unit that a live block of the test pins.
    unsafe {
        let d = desc(unit_index(p));
        assert_eq!((*d).kind, kind::SMALL);
        crate::heap::small_slot(d, p as *mut u8).expect("p starts a slot").1
    }
}

#[test]
fn unchecked_frees_are_kept_and_the_next_allocations_of_the_class_take_them_newest_first() {
    let _g = shared();
    let c = small_class_index(100);
    let cls = SizeClass::from_index(c).unwrap();
    let check_mode = options().check;
    let cap = if check_mode { 0 } else { crate::heap::kept_cap(c, options().keep_bytes) as usize };
    on_thread_with_heap(move || {
        let n = cap + 3;
        let blocks: Vec<usize> = (0..n).map(|_| alloc_class(cls) as usize).collect();
        assert_eq!(kept_of(c), (0, cap as u32));
        for &p in &blocks {
            // SAFETY: live blocks of class cls, each freed once.
            unsafe { free_class_unchecked(p as *mut u8, cls) };
        }
        // The first `cap` frees are kept (live for the heap), the others go
        // the checked way, into their slab.
        assert_eq!(kept_of(c), (cap, 0));
        for (i, &p) in blocks.iter().enumerate() {
            assert_eq!(free_in_bitmap(p), i >= cap, "block {i} of {n}");
        }
        check_invariants().unwrap();
        // Allocations by size and by class take them back, newest first.
        let again: Vec<usize> = (0..cap).map(|i| if i % 2 == 0 { alloc(100) } else { alloc_class(cls) } as usize).collect();
        let want: Vec<usize> = blocks[..cap].iter().rev().copied().collect();
        assert_eq!(again, want);
        assert_eq!(kept_of(c), (0, cap as u32));
        for p in again {
            unsafe { free(p as *mut u8) };
        }
        check_invariants().unwrap();
    });
}

#[test]
fn a_block_freed_unchecked_is_refused_by_a_checked_free_and_handed_out_once() {
    let _g = serial();
    if options().check || options().keep_bytes == 0 {
        return; // check mode takes the checked path (and aborts on the bad free)
    }
    let before = report::bad_frees();
    let cls = SizeClass::of(100).unwrap();
    on_thread_with_heap(move || {
        let p = alloc_class(cls);
        unsafe { free_class_unchecked(p, cls) };
        // Both refused: the kept block is marked in flight.
        unsafe { free(p) };
        unsafe { free_class(p, cls) };
        let a = alloc_class(cls);
        let b = alloc_class(cls);
        assert_eq!(a, p);
        assert_ne!(b, p);
        unsafe {
            free(a);
            free(b);
        }
        check_invariants().unwrap();
    });
    assert_eq!(report::bad_frees(), before + 2);
}

#[test]
fn blocks_freed_unchecked_go_home_at_collect_and_at_thread_exit() {
    let _g = serial();
    let before = report::bad_frees();
    let cls = SizeClass::of(48).unwrap();
    let c = cls.index();
    let kept_mode = !options().check && options().keep_bytes != 0;
    // The test thread's blocks, freed unchecked by another thread; a pin
    // keeps their slab from going back while the test looks at it.
    let pin = alloc_class(cls) as usize;
    let theirs: Vec<usize> = (0..3).map(|_| alloc_class(cls) as usize).collect();
    let theirs2 = theirs.clone();
    let (own_pin, own_late) = on_thread_with_heap(move || {
        let pin = alloc_class(cls) as usize;
        let mine: Vec<usize> = (0..3).map(|_| alloc_class(cls) as usize).collect();
        for &p in mine.iter().chain(&theirs2) {
            unsafe { free_class_unchecked(p as *mut u8, cls) };
        }
        let cap = crate::heap::kept_cap(c, options().keep_bytes) as usize;
        assert_eq!(kept_of(c).0, if kept_mode { cap.min(6) } else { 0 });
        for &p in &mine {
            assert_eq!(free_in_bitmap(p), !kept_mode, "own block kept: live for its slab");
        }
        check_invariants().unwrap();
        // collect() sends the kept blocks home: this heap's back into the
        // slab, the others to their owner.
        collect();
        assert_eq!(kept_of(c).0, 0);
        for &p in &mine {
            assert!(free_in_bitmap(p), "own block back in its slab after collect");
        }
        check_invariants().unwrap();
        // Kept again, then the thread exits with them.
        let late: Vec<usize> = (0..3).map(|_| alloc_class(cls) as usize).collect();
        for &p in &late {
            unsafe { free_class_unchecked(p as *mut u8, cls) };
        }
        (pin, late)
    });
    // The exited thread's kept blocks went back into its (abandoned) slab.
    for &p in &own_late {
        assert!(free_in_bitmap(p), "own block back in its slab at thread exit");
    }
    // Ours came home in a batch, which collect() takes in.
    collect();
    for &p in &theirs {
        assert!(free_in_bitmap(p), "the owner's block back in its slab");
    }
    check_invariants().unwrap();
    unsafe {
        free(own_pin as *mut u8);
        free(pin as *mut u8);
    }
    assert_eq!(report::bad_frees(), before, "no free was refused");
}

#[test]
fn unchecked_frees_of_medium_blocks_take_the_checked_path() {
    let _g = shared();
    on_thread_with_heap(|| {
        for size in [10_000usize, 200_000] {
            let cls = SizeClass::of(size).unwrap();
            let p = alloc_class(cls);
            assert!(!p.is_null());
            fill(p, size, 7);
            // SAFETY: a live block of class cls, freed once.
            unsafe { free_class_unchecked(p, cls) };
            // Freed into its bin, whose next allocation of the class it is.
            let q = alloc_class(cls);
            assert_eq!(q, p, "{size} B");
            unsafe { free_class_unchecked(q, cls) };
        }
        check_invariants().unwrap();
    });
}

#[test]
fn descriptor_blocks_freed_unchecked_come_back_for_the_same_shape() {
    let _g = serial();
    let before = report::bad_frees();
    let kept_mode = !options().check && options().keep_bytes != 0;
    on_thread_with_heap(move || {
        for &(desc, data, align) in &[(24usize, 100usize, 8usize), (48, 4000, 16), (16, 8160, 4), (40, 20_000, 8), (32, 100, 64), (32, 300_000, 16)] {
            let (d, x) = alloc_with_descriptor(desc, data, align).unwrap();
            fill(d, desc, 1);
            fill(x, data, 2);
            // SAFETY: a live block of these arguments, freed once.
            unsafe { free_with_descriptor_unchecked(d, desc, data, align) };
            let (d2, x2) = alloc_with_descriptor(desc, data, align).unwrap();
            // A small block with data aligned to at most 16 bytes was kept
            // and is the next one of its class.
            let small = align <= 16 && ((desc + 15) & !15) + data <= SMALL_MAX;
            if kept_mode && small {
                assert_eq!((d2, x2), (d, x), "desc {desc}, data {data}, align {align}");
            }
            fill(x2, data, 3);
            unsafe { free_with_descriptor_unchecked(d2, desc, data, align) };
        }
        check_invariants().unwrap();
    });
    assert_eq!(report::bad_frees(), before);
}

/// Threads that allocate by class, hand half their blocks to the next
/// thread, and free everything with `free_class_unchecked`: their own
/// blocks and the others', kept and reused, sent home as threads exit (a
/// new wave of threads every round) and at `collect()`.  Every block's
/// bytes are checked before it is freed (a block handed out twice while
/// live would have the second owner's pattern), no free is refused, and
/// the heaps' invariants hold.  Scaled by `CANOPY_STRESS_SCALE`.
#[test]
fn unchecked_frees_across_threads_and_thread_exits_lose_nothing() {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use std::sync::{mpsc, Arc};
    let _g = serial();
    let before = report::bad_frees();
    let waves = 6 * stress_scale();
    const THREADS: usize = 4;
    const PER: usize = 400;
    let checked = Arc::new(AtomicUsize::new(0));
    for wave in 0..waves {
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| mpsc::channel::<Vec<(usize, usize, u8)>>()).unzip();
        let mut rxs: Vec<Option<mpsc::Receiver<_>>> = rxs.into_iter().map(Some).collect();
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let to_next = txs[(t + 1) % THREADS].clone();
                let from_prev = rxs[t].take().unwrap();
                let checked = checked.clone();
                std::thread::spawn(move || {
                    let mut rng = Rng(0x51ed_2701 ^ ((wave * THREADS + t) as u32).wrapping_mul(0x9e37_79b9));
                    let mut mine: Vec<(usize, usize, u8)> = Vec::new();
                    for i in 0..PER {
                        let c = rng.next() as usize % SMALL_CLASSES;
                        let cls = SizeClass::from_index(c).unwrap();
                        let p = alloc_class(cls);
                        assert!(!p.is_null());
                        let seed = (i as u8) ^ (t as u8).wrapping_mul(37);
                        fill(p, cls.size(), seed);
                        mine.push((p as usize, c, seed));
                        // Free some at once (kept, then reused by the next
                        // allocations of the class).
                        if rng.next() % 3 == 0 {
                            let (q, c, seed) = mine.swap_remove(rng.next() as usize % mine.len());
                            let cls = SizeClass::from_index(c).unwrap();
                            assert!(verify(q as *mut u8, cls.size(), seed), "a live block changed");
                            unsafe { free_class_unchecked(q as *mut u8, cls) };
                            checked.fetch_add(1, Relaxed);
                        }
                    }
                    // Half to the next thread, which frees them unchecked.
                    let give: Vec<_> = mine.split_off(mine.len() / 2);
                    to_next.send(give).unwrap();
                    drop(to_next);
                    let got = from_prev.recv().unwrap();
                    for (q, c, seed) in got.into_iter().chain(mine) {
                        let cls = SizeClass::from_index(c).unwrap();
                        assert!(verify(q as *mut u8, cls.size(), seed), "a live block changed");
                        unsafe { free_class_unchecked(q as *mut u8, cls) };
                        checked.fetch_add(1, Relaxed);
                    }
                    if t == 0 && wave % 2 == 0 {
                        collect();
                    }
                    check_invariants().unwrap();
                })
            })
            .collect();
        drop(txs);
        for h in hs {
            h.join().unwrap();
        }
    }
    collect();
    check_invariants().unwrap();
    assert_eq!(checked.load(Relaxed), waves * THREADS * PER);
    assert_eq!(report::bad_frees(), before, "no free was refused");
}

// ----- CanopyUnchecked, the trusting global allocator -----

fn layout(size: usize, align: usize) -> Layout {
    Layout::from_size_align(size, align).unwrap()
}

#[test]
fn unchecked_dealloc_keeps_the_threads_own_small_blocks_newest_first() {
    let _g = shared();
    let c = small_class_index(100);
    let cap = if options().check { 0 } else { crate::heap::kept_cap(c, options().keep_bytes) as usize };
    on_thread_with_heap(move || {
        let a = CanopyUnchecked;
        let l = layout(100, 8);
        let n = cap + 3;
        // SAFETY: GlobalAlloc calls with a non-zero layout; each block is
        // freed once with the layout it was allocated with.
        unsafe {
            let blocks: Vec<usize> = (0..n).map(|_| a.alloc(l) as usize).collect();
            for &p in &blocks {
                a.dealloc(p as *mut u8, l);
            }
            // The first `cap` are kept (live for their slab), the others go
            // the checked way, into their slab.
            assert_eq!(kept_of(c), (cap, 0));
            for (i, &p) in blocks.iter().enumerate() {
                assert_eq!(free_in_bitmap(p), i >= cap, "block {i} of {n}");
            }
            check_invariants().unwrap();
            // A size of the same class takes them back, newest first.
            let again: Vec<usize> = (0..cap).map(|i| a.alloc(layout(97 + i % 16, 16)) as usize).collect();
            let want: Vec<usize> = blocks[..cap].iter().rev().copied().collect();
            assert_eq!(again, want);
            for (i, p) in again.into_iter().enumerate() {
                a.dealloc(p as *mut u8, layout(97 + i % 16, 16));
            }
        }
        collect();
        assert_eq!(kept_of(c), (0, cap as u32));
        check_invariants().unwrap();
    });
}

#[test]
fn unchecked_dealloc_checks_other_heaps_blocks_and_over_aligned_and_big_ones() {
    let _g = shared();
    let c = small_class_index(100);
    on_thread_with_heap(move || {
        let a = CanopyUnchecked;
        let l = layout(100, 8);
        // Another thread's block (class 112, not whole lines: never kept
        // from another heap) is sent home, not kept.
        let theirs = on_thread_with_heap(move || unsafe { CanopyUnchecked.alloc(l) } as usize);
        let before = kept_of(c);
        // SAFETY: a live block of that layout, freed once.
        unsafe { a.dealloc(theirs as *mut u8, l) };
        assert_eq!(kept_of(c), before, "another heap's block is not kept");
        // Over-aligned, medium and large blocks take the checked path: medium
        // and large ones change no kept list; a small over-aligned block of
        // this heap, checked, goes onto the kept list of the class its slab
        // says (as every checked free of an own small block does while the
        // list has room), never onto another class's.
        for (size, align) in [(64usize, 64usize), (100, 32), (20_000, 8), (300_000, 16)] {
            // SAFETY: as above.
            unsafe {
                let p = a.alloc(layout(size, align));
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0);
                fill(p, size, 3);
                let kept_before: Vec<_> = (0..SMALL_CLASSES).map(kept_of).collect();
                let class = (size <= crate::size_class::SMALL_MAX)
                    .then(|| (*crate::arena::desc(crate::arena::unit_index(p as usize))).class as usize);
                a.dealloc(p, layout(size, align));
                let kept_after: Vec<_> = (0..SMALL_CLASSES).map(kept_of).collect();
                for c in 0..SMALL_CLASSES {
                    let grew = Some(c) == class && !options().check;
                    let (b, a) = (kept_before[c], kept_after[c]);
                    let want = if grew { (b.0 + 1, b.1 - 1) } else { b };
                    assert_eq!(a, want, "{size} B aligned to {align}: class {c}");
                }
            }
        }
        collect();
        check_invariants().unwrap();
    });
}

#[test]
fn a_block_freed_by_the_unchecked_dealloc_is_refused_by_a_checked_free_and_handed_out_once() {
    let _g = serial();
    if options().check || options().keep_bytes == 0 {
        return; // nothing is kept; check mode aborts on the bad free
    }
    let before = report::bad_frees();
    on_thread_with_heap(move || {
        let a = CanopyUnchecked;
        let l = layout(48, 8);
        // SAFETY: the checked frees below are the bad frees under test, which
        // the allocator refuses; the block is allocated again once.
        unsafe {
            let p = a.alloc(l);
            a.dealloc(p, l);
            free(p);
            Canopy.dealloc(p, l);
            let x = a.alloc(l);
            let y = a.alloc(l);
            assert_eq!(x, p);
            assert_ne!(y, p);
            a.dealloc(x, l);
            a.dealloc(y, l);
        }
        check_invariants().unwrap();
    });
    assert_eq!(report::bad_frees(), before + 2);
}

#[test]
fn unchecked_realloc_keeps_each_small_block_in_its_sizes_class() {
    let _g = shared();
    on_thread_with_heap(|| {
        let a = CanopyUnchecked;
        // Sizes that walk up and down through small, medium and large,
        // including shrinks that Canopy's own realloc would do in place.
        let sizes = [
            24usize, 100, 104, 4000, 1000, 600, 64, 8192, 8193, 9000, 6000, 150_000, 120_000, 2_000_000, 300, 16, 1,
        ];
        // SAFETY: each step reallocates the live block with its current
        // layout; the last block is freed once with its layout.
        unsafe {
            let mut p = a.alloc(layout(sizes[0], 16));
            fill(p, sizes[0], 1);
            for w in sizes.windows(2) {
                let (old, new) = (w[0], w[1]);
                let q = a.realloc(p, layout(old, 16), new);
                assert!(!q.is_null());
                assert!(verify(q, old.min(new), 1), "{old} -> {new}: contents kept");
                if new <= SMALL_MAX {
                    assert_eq!(usable_size(q), crate::size_class::class_size(small_class_index(new)), "{old} -> {new}: the block is of its size's class");
                    if old <= SMALL_MAX && small_class_index(old) == small_class_index(new) {
                        assert_eq!(q, p, "{old} -> {new}: same class, same block");
                    }
                }
                fill(q, new, 1);
                p = q;
            }
            a.dealloc(p, layout(*sizes.last().unwrap(), 16));
        }
        collect();
        check_invariants().unwrap();
    });
}

#[test]
fn a_second_unchecked_dealloc_is_refused_not_linked_twice() {
    let _g = serial();
    if options().check || options().keep_bytes == 0 {
        return; // nothing is kept; check mode aborts on the bad free
    }
    let before = report::bad_frees();
    let c = small_class_index(48);
    on_thread_with_heap(move || {
        let a = CanopyUnchecked;
        let l = layout(48, 8);
        // SAFETY: the second dealloc is the bad free under test, refused.
        unsafe {
            let p = a.alloc(l);
            a.dealloc(p, l);
            let (n, room) = kept_of(c);
            a.dealloc(p, l);
            assert_eq!(kept_of(c), (n, room), "the block is on the list once");
            let x = a.alloc(l);
            let y = a.alloc(l);
            assert_eq!(x, p);
            assert_ne!(y, p);
            a.dealloc(x, l);
            a.dealloc(y, l);
            // Freed into its slab and freed again: refused too.
            collect();
            assert!(free_in_bitmap(p as usize));
            a.dealloc(p, l);
            assert!(free_in_bitmap(p as usize));
        }
        collect();
        check_invariants().unwrap();
    });
    assert_eq!(report::bad_frees(), before + 2);
}

#[test]
fn unchecked_dealloc_keeps_own_blocks_of_slabs_that_are_not_current() {
    let _g = shared();
    if options().check || options().keep_bytes == 0 {
        return;
    }
    on_thread_with_heap(|| {
        let a = CanopyUnchecked;
        let l = layout(4000, 16);
        let c = small_class_index(4000);
        let slots = crate::heap::SHAPES[c].slots as usize;
        // SAFETY: live blocks of that layout, each freed once.
        unsafe {
            let blocks: Vec<*mut u8> = (0..2 * slots + 3).map(|_| a.alloc(l)).collect();
            // The first block's slab is full and no longer current: the
            // descriptor names this heap, so the block is kept.
            let first = blocks[0];
            assert_ne!(unit_index(first as usize), unit_index(*blocks.last().unwrap() as usize));
            let (n, room) = kept_of(c);
            assert!(room > 0);
            a.dealloc(first, l);
            assert_eq!(kept_of(c), (n + 1, room - 1));
            assert!(!free_in_bitmap(first as usize), "kept, live for its slab");
            for &p in &blocks[1..] {
                a.dealloc(p, l);
            }
        }
        collect();
        check_invariants().unwrap();
    });
}

#[test]
fn a_sweep_puts_the_heaps_own_kept_blocks_back_and_keeps_the_others() {
    let _g = shared();
    if options().check || options().keep_bytes == 0 {
        return;
    }
    let c = small_class_index(100);
    let cls = SizeClass::from_index(c).unwrap();
    // The other heap's thread stays alive meanwhile (an exited thread's heap
    // would be adopted by the next thread, ours).
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        tx.send(alloc_class(cls) as usize).unwrap();
        done_rx.recv().unwrap();
    });
    let theirs = rx.recv().unwrap();
    on_thread_with_heap(move || {
        let cap = crate::heap::kept_cap(c, options().keep_bytes);
        let mine: Vec<*mut u8> = (0..3).map(|_| alloc_class(cls)).collect();
        // SAFETY: live blocks of class cls, each freed once.
        unsafe {
            free_class_unchecked(theirs as *mut u8, cls);
            for &p in &mine {
                CanopyUnchecked.dealloc(p, layout(100, 16));
            }
        }
        assert_eq!(kept_of(c), (4, cap - 4));
        // SAFETY: our own heap, on its thread.
        unsafe { (*tls_heap()).sweep_empty() };
        assert_eq!(kept_of(c), (1, cap - 1), "only the other heap's block stays kept");
        for &p in &mine {
            assert!(free_in_bitmap(p as usize), "back in its slab");
        }
        assert!(!free_in_bitmap(theirs), "the other heap's block is still in flight");
        check_invariants().unwrap();
        collect();
        assert_eq!(kept_of(c), (0, cap));
        check_invariants().unwrap();
    });
    done_tx.send(()).unwrap();
    other.join().unwrap();
}

#[test]
fn a_second_unchecked_free_is_refused_not_linked_twice() {
    let _g = serial();
    if options().check || options().keep_bytes == 0 {
        return; // nothing is kept; check mode aborts on the bad free
    }
    let before = report::bad_frees();
    let c = small_class_index(64);
    let cls = SizeClass::from_index(c).unwrap();
    on_thread_with_heap(move || {
        let p = alloc_class(cls);
        // SAFETY: the second and third frees are the bad frees under test,
        // refused.
        unsafe {
            free_class_unchecked(p, cls);
            let kept = kept_of(c);
            free_class_unchecked(p, cls);
            assert_eq!(kept_of(c), kept, "the block is on the list once");
            collect();
            assert!(free_in_bitmap(p as usize));
            free_class_unchecked(p, cls);
            assert!(free_in_bitmap(p as usize), "a block free in its slab is refused too");
        }
        check_invariants().unwrap();
    });
    assert_eq!(report::bad_frees(), before + 2);
}

#[test]
fn a_kept_list_in_a_cycle_is_reported_not_walked_forever() {
    let _g = serial();
    if options().check || options().keep_bytes == 0 {
        return;
    }
    let before = report::bad_frees();
    let c = small_class_index(64);
    let cls = SizeClass::from_index(c).unwrap();
    on_thread_with_heap(move || {
        let p = alloc_class(cls);
        // SAFETY: none for the heap's state: the block is pushed twice by
        // hand, the cycle (p -> p) no free can make any more, to check that
        // a flush still ends.
        unsafe {
            let k = core::ptr::addr_of_mut!((*tls_heap()).cursors).cast::<crate::heap::Cursor>().add(c);
            (*(p as *mut Block)).tag = flight_tag();
            crate::heap::Cursor::push_kept(k, p as *mut Block);
            crate::heap::Cursor::push_kept(k, p as *mut Block);
        }
        // Flushing the list stops at its cap, reports it, and leaves the
        // heap consistent, the block back in its slab once.
        collect();
        assert_eq!(kept_of(c), (0, crate::heap::kept_cap(c, options().keep_bytes)));
        assert!(free_in_bitmap(p as usize));
        check_invariants().unwrap();
    });
    assert_eq!(report::bad_frees(), before + 1, "the broken list was reported, once");
}

#[test]
fn an_own_block_freed_goes_onto_the_kept_list_and_comes_back_first_once() {
    let _g = serial();
    if options().check || options().keep_bytes == 0 {
        return; // nothing is kept; check mode aborts on the bad free
    }
    let before = report::bad_frees();
    let c = small_class_index(96);
    let cap = crate::heap::kept_cap(c, options().keep_bytes);
    on_thread_with_heap(move || {
        activate(96);
        let (n0, room0) = kept_of(c);
        assert_eq!((n0, room0), (0, cap));
        let blocks: Vec<*mut u8> = (0..cap as usize + 3).map(|_| alloc(96)).collect();
        let in_use = stats::snapshot().classes[c].blocks_in_use;
        // SAFETY: live blocks of this thread, freed once (the second free of
        // `blocks[0]` below is the bad free under test, refused).
        unsafe {
            free(blocks[0]);
            assert_eq!(kept_of(c), (1, cap - 1), "the free kept the block");
            assert!(!free_in_bitmap(blocks[0] as usize), "a kept block is live in its slab");
            free(blocks[0]);
            assert_eq!(kept_of(c), (1, cap - 1), "a second free is refused, not linked twice");
            // Its statistics say free.
            assert_eq!(stats::snapshot().classes[c].blocks_in_use, in_use - 1);
            // The list takes the room it has; the rest go back into the slab.
            for &p in &blocks[1..] {
                free(p);
            }
            assert_eq!(kept_of(c), (cap as usize, 0));
            assert_eq!(blocks.iter().filter(|&&p| free_in_bitmap(p as usize)).count(), 3);
            assert_eq!(stats::snapshot().classes[c].blocks_in_use, in_use - blocks.len() as u64);
            // Newest first, each once.
            let again: Vec<*mut u8> = (0..cap as usize).map(|_| alloc(96)).collect();
            let want: Vec<*mut u8> = blocks[..cap as usize].iter().rev().copied().collect();
            assert_eq!(again, want);
            assert_eq!(kept_of(c), (0, cap));
            for p in again {
                free(p);
            }
            collect();
            assert_eq!(kept_of(c), (0, cap), "collect() puts the kept blocks back");
            assert!(blocks.iter().all(|&p| free_in_bitmap(p as usize)));
        }
        check_invariants().unwrap();
    });
    assert_eq!(report::bad_frees(), before + 1);
}
