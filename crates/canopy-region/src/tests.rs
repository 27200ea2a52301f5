use core::ptr::NonNull;

use crate::*;

fn fill(p: NonNull<u8>, len: usize, v: u8) {
    // SAFETY: callers pass live objects of at least len bytes.
    unsafe { core::ptr::write_bytes(p.as_ptr(), v, len) };
}

fn holds(p: NonNull<u8>, len: usize, v: u8) -> bool {
    // SAFETY: callers pass live objects of at least len bytes.
    unsafe { core::slice::from_raw_parts(p.as_ptr(), len).iter().all(|&b| b == v) }
}

#[test]
fn objects_are_distinct_aligned_and_sized() {
    let mut ra = RegionAllocator::new();
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let sizes = [0usize, 1, 63, 64, 65, 192, 1000, 1536, 4096, 4097, 50048, 3 << 20];
    let mut objs = Vec::new();
    for (i, &s) in sizes.iter().enumerate() {
        let p = ra.alloc(s, r).unwrap();
        let (rid, usable) = ra.object(p).unwrap();
        assert_eq!(rid, r);
        assert!(usable >= s.max(1), "size {s}: usable {usable}");
        if let Some(slot) = ra.slot_size_for(s) {
            assert_eq!(usable, slot, "size {s}: the usable size is the slot");
            let align = 1 << slot.trailing_zeros();
            assert!(align >= 16 && (s < 64 || align >= 64), "size {s}: slot {slot}");
            assert_eq!(p.as_ptr() as usize % align, 0, "size {s}: slots are aligned to their size's power of two");
        }
        if s > 4096 {
            assert_eq!(p.as_ptr() as usize % 4096, 0, "spans are slab aligned");
        }
        fill(p, s, i as u8);
        objs.push((p, s, i as u8));
    }
    for &(p, s, v) in &objs {
        assert!(holds(p, s, v));
    }
    ra.check().unwrap();
    let st = ra.region_stats(r).unwrap();
    assert_eq!(st.objects, sizes.len() as u64);
    for (p, _, _) in objs {
        ra.free(p).unwrap();
    }
    assert_eq!(ra.region_stats(r).unwrap().objects, 0);
    ra.check().unwrap();
}

#[test]
fn in_region_allocates_like_alloc_and_refuses_dead_regions() {
    let mut ra = RegionAllocator::new();
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let other = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let mut inr = ra.in_region(r).unwrap();
    let mut ps = Vec::new();
    // Every slot size, a size 0, and objects spanning slabs.
    for (k, &s) in [0usize, 1, 16, 17, 48, 64, 65, 200, 4096, 4097, 100_000].iter().cycle().take(2000).enumerate() {
        let p = inr.alloc(s).unwrap();
        fill(p, s, k as u8);
        ps.push((p, s, k as u8));
    }
    let (p0, _, _) = ps.swap_remove(0);
    inr.free(p0).unwrap();
    assert!(matches!(inr.free(p0), Err(RegionError::NotAllocated { .. })));
    assert_eq!(inr.allocator().region_stats(r).unwrap().objects, ps.len() as u64);
    let mut seen = std::collections::HashSet::new();
    for &(p, s, v) in &ps {
        assert!(holds(p, s, v), "object of {s} B changed");
        assert!(seen.insert(p.as_ptr() as usize), "two objects at one address");
    }
    assert_eq!(ra.region_stats(other).unwrap().objects, 0);
    ra.rfree(r).unwrap();
    assert!(matches!(ra.in_region(r), Err(RegionError::FreedRegion(_))));
    assert!(matches!(ra.in_region(RegionId::from_raw(0xdead_0001).unwrap()), Err(RegionError::UnknownRegion(_))));
}

/// The fast path leaves the cursor on the word it empties (the next
/// allocation of the slot size moves it): a slab filled that way is still the
/// head of its partial list, but counts as full, and a slab that comes back
/// to the partial list, or a free into the filled slab, sorts it out.
/// `slab_counts` says what `region_stats` says about slabs.
fn counts_agree(ra: &RegionAllocator, r: RegionId) {
    let st = ra.region_stats(r).unwrap();
    let c = ra.slab_counts(r).unwrap();
    assert_eq!(
        (c.full, c.partial, c.empty, c.span),
        (st.full_slabs, st.partial_slabs, st.empty_slabs, st.span_slabs),
        "slab_counts and region_stats of {r:?}"
    );
}

#[test]
fn a_slab_filled_on_the_fast_path_counts_as_full_until_the_cursor_moves() {
    let mut ra = RegionAllocator::new();
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    // 64 B slots: one bitmap word, 64 slots, per 4 KiB slab.
    let per = ra.config().slab_size / 64;
    let mut inr = ra.in_region(r).unwrap();
    let a: Vec<_> = (0..per).map(|_| inr.alloc(64).unwrap()).collect();
    let st = inr.allocator().region_stats(r).unwrap();
    assert_eq!((st.full_slabs, st.partial_slabs, st.objects), (1, 0, per as u64));
    counts_agree(inr.allocator(), r);
    inr.allocator().check().unwrap();
    // A free into the filled head: its slot is the next one handed out.
    inr.free(a[10]).unwrap();
    assert_eq!(inr.allocator().region_stats(r).unwrap().partial_slabs, 1);
    assert_eq!(inr.alloc(64).unwrap(), a[10]);
    // A second slab, filled the same way; then a slot of the first (now on
    // the full list) is freed, which puts it back at the head of the partial
    // list: the filled second slab goes to the full list first.
    let b: Vec<_> = (0..per).map(|_| inr.alloc(64).unwrap()).collect();
    let st = inr.allocator().region_stats(r).unwrap();
    assert_eq!((st.full_slabs, st.partial_slabs), (2, 0));
    counts_agree(inr.allocator(), r);
    inr.free(a[3]).unwrap();
    inr.allocator().check().unwrap();
    let st = inr.allocator().region_stats(r).unwrap();
    assert_eq!((st.full_slabs, st.partial_slabs), (1, 1));
    counts_agree(inr.allocator(), r);
    assert_eq!(inr.alloc(64).unwrap(), a[3]);
    // By id too, and a size-0 request next to a live cursor.
    let c = ra.alloc(64, r).unwrap();
    assert!(!a.contains(&c) && !b.contains(&c));
    ra.alloc(0, r).unwrap();
    ra.alloc(3 * ra.config().slab_size, r).unwrap();
    ra.check().unwrap();
    assert_eq!(ra.region_stats(r).unwrap().objects, 2 * per as u64 + 3);
    counts_agree(&ra, r);
    ra.rfree(r).unwrap();
    assert!(ra.slab_counts(r).is_err(), "a freed region has no counts");
}

#[test]
fn a_slab_of_several_words_is_filled_word_by_word_then_its_holes() {
    // 16 B slots: 256 slots in four bitmap words per 4 KiB slab.  Filling a
    // fresh region goes through the words in order (the cursor steps to the
    // next word); a slot freed below the cursor is taken again only once the
    // words above are full, before a second slab is started; a slab whose
    // words are all full is swapped for an empty one in one step.
    let mut ra = RegionAllocator::new();
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let per = ra.config().slab_size / 16;
    assert!(per > 128, "the test wants slabs of several bitmap words");
    let mut inr = ra.in_region(r).unwrap();
    let a: Vec<usize> = (0..100).map(|_| inr.alloc(16).unwrap().as_ptr() as usize).collect();
    assert!(a.windows(2).all(|w| w[1] == w[0] + 16), "one run of slots across the first two words");
    inr.free(NonNull::new(a[5] as *mut u8).unwrap()).unwrap();
    inr.allocator().check().unwrap();
    let b: Vec<usize> = (100..per).map(|_| inr.alloc(16).unwrap().as_ptr() as usize).collect();
    assert_eq!(b[0], a[99] + 16);
    assert!(b.windows(2).all(|w| w[1] == w[0] + 16), "the words above the hole, in order");
    assert_eq!(inr.alloc(16).unwrap().as_ptr() as usize, a[5], "the hole before a new slab");
    let st = inr.allocator().region_stats(r).unwrap();
    assert_eq!((st.full_slabs, st.partial_slabs, st.objects), (1, 0, per as u64));
    // The next slab starts at its slot 0, and fills the same way.
    let slab = inr.allocator().config().slab_size;
    let c: Vec<usize> = (0..per + 3).map(|_| inr.alloc(16).unwrap().as_ptr() as usize).collect();
    assert_eq!(c[0] % slab, 0, "a fresh slab starts at its first slot");
    assert!(c[..per].windows(2).all(|w| w[1] == w[0] + 16));
    let st = inr.allocator().region_stats(r).unwrap();
    assert_eq!((st.full_slabs, st.partial_slabs, st.objects), (2, 1, 2 * per as u64 + 3));
    inr.allocator().check().unwrap();
    ra.rfree(r).unwrap();
    ra.check().unwrap();
}

#[test]
fn in_region_keeps_allocating_right_while_the_allocator_grows() {
    // `InRegion` keeps raw views of the allocator's tables; growing (new
    // pages, hence a longer slab bitmap) moves them, and the handle must
    // take its views again after every slow path.  This loop makes the
    // allocator take a dozen pages, one at a time.
    let mut ra = RegionAllocator::new();
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let mut inr = ra.in_region(r).unwrap();
    let mut ps = Vec::new();
    for k in 0..100_000usize {
        let s = [24usize, 64, 200][k % 3];
        let p = inr.alloc(s).unwrap();
        fill(p, s, k as u8);
        ps.push((p, s, k as u8));
    }
    assert_eq!(inr.allocator().region_stats(r).unwrap().objects, ps.len() as u64);
    inr.allocator().check().unwrap();
    for &(p, s, v) in &ps {
        assert!(holds(p, s, v), "object of {s} B changed");
    }
    for &(p, _, _) in ps.iter().step_by(2) {
        inr.free(p).unwrap();
    }
    ra.check().unwrap();
    assert_eq!(ra.region_stats(r).unwrap().objects, (ps.len() / 2) as u64);
    ra.rfree(r).unwrap();
}

/// An id whose low 32 bits (the slot + 1) are 0 names no slot: every call
/// that takes it refuses it as unknown, in debug builds too (the slot was
/// computed as `low bits - 1`, which overflowed there and panicked).
#[test]
fn an_id_with_no_slot_bits_is_an_unknown_region() {
    let mut ra = RegionAllocator::new();
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    for raw in [1u64 << 32, 0xdead_0000_0000, u64::MAX << 32] {
        let bad = RegionId::from_raw(raw).unwrap();
        assert!(format!("{bad:?}").contains("slot"));
        assert!(!ra.contains(bad));
        assert!(matches!(ra.in_region(bad), Err(RegionError::UnknownRegion(b)) if b == bad));
        assert_eq!(ra.alloc(16, bad), Err(RegionError::UnknownRegion(bad)));
        assert_eq!(ra.ralloc(bad, 0), Err(RegionError::UnknownRegion(bad)));
        assert_eq!(ra.rfree(bad), Err(RegionError::UnknownRegion(bad)));
        assert_eq!(ra.region_stats(bad), Err(RegionError::UnknownRegion(bad)));
        assert!(ra.pack(bad).is_err());
        // A pack naming such a region is refused with a clear error.
        let p = Packed {
            slab_size: ra.config().slab_size,
            granule: ra.config().granule,
            regions: vec![PackedRegion { id: bad, parent: None, level_hint: 0 }],
            slabs: Vec::new(),
            runs: Vec::new(),
        };
        match ra.unpack(RegionId::ROOT, &p, |_, _| Ok(())) {
            Err(RegionError::Unpack(m)) => assert!(m.contains("names no slot"), "{m}"),
            other => panic!("unpacking region {bad} gave {other:?}"),
        }
    }
    assert!(ra.contains(r));
    assert_eq!(ra.stats().regions, 2);
    ra.check().unwrap();
}

#[test]
fn a_region_filled_in_one_pass_runs_upwards_through_its_memory() {
    // Slabs taken together for a growing region are handed out in address
    // order, so consecutive objects are at increasing addresses (prefetchers
    // follow); also after the memory went back and was taken again.
    let mut ra = RegionAllocator::new();
    for _ in 0..2 {
        let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
        let ps: Vec<usize> = (0..64 * 40).map(|_| ra.alloc(64, r).unwrap().as_ptr() as usize).collect();
        let back: Vec<_> = ps.windows(2).enumerate().filter(|(_, w)| w[1] < w[0]).map(|(i, w)| (i, w[0], w[1])).collect();
        assert!(back.is_empty(), "{} of {} steps went down, first: {:x?}", back.len(), ps.len() - 1, back.first());
        assert!(ps.windows(2).all(|w| w[1] == w[0] + 64), "a region grown in one pass is one run of slots");
        for &p in &ps {
            ra.free(NonNull::new(p as *mut u8).unwrap()).unwrap();
        }
        ra.rfree(r).unwrap();
    }
}

#[test]
fn region_tree_and_ids() {
    let mut ra = RegionAllocator::new();
    let a = ra.ralloc(RegionId::ROOT, 1).unwrap();
    let b = ra.ralloc(a, 2).unwrap();
    let c = ra.ralloc(b, 3).unwrap();
    let d = ra.ralloc(a, 2).unwrap();
    for id in [a, b, c, d] {
        assert_ne!(id.get(), 0);
        assert_ne!(id, RegionId::ROOT);
    }
    assert_eq!(ra.children(a).unwrap(), vec![d, b]);
    assert_eq!(ra.region_stats(c).unwrap().depth, 3);
    assert_eq!(ra.region_stats(c).unwrap().level_hint, 3);
    assert_eq!(ra.region_stats(b).unwrap().parent, Some(a));
    let pc = ra.balloc(100, c, 500).unwrap();
    let pd = ra.alloc(10, d).unwrap();
    ra.rfree(b).unwrap();
    assert_eq!(ra.rfree(b), Err(RegionError::FreedRegion(b)));
    assert_eq!(ra.alloc(8, c), Err(RegionError::FreedRegion(c)));
    assert!(matches!(ra.free(pc[0]), Err(RegionError::NotOwned(_) | RegionError::NotAllocated { .. })));
    assert_eq!(ra.children(a).unwrap(), vec![d]);
    assert_eq!(ra.object(pd).unwrap().0, d);
    // A new region may take the freed slot, but never the freed id.
    let e = ra.ralloc(RegionId::ROOT, 0).unwrap();
    assert!(e != b && e != c);
    assert_eq!(ra.alloc(8, b), Err(RegionError::FreedRegion(b)));
    assert_eq!(ra.rfree(RegionId::ROOT), Err(RegionError::RootNotFreeable));
    let bogus = RegionId::from_raw(12345).unwrap();
    assert_eq!(ra.alloc(8, bogus), Err(RegionError::UnknownRegion(bogus)));
    assert_eq!(ra.ralloc(bogus, 0), Err(RegionError::UnknownRegion(bogus)));
    ra.check().unwrap();
    assert_eq!(ra.stats().regions, 4); // root, a, d, e
}

#[test]
fn bad_frees_are_refused_and_change_nothing() {
    let mut ra = RegionAllocator::new();
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let p = ra.alloc(192, r).unwrap();
    let q = ra.alloc(192, r).unwrap();
    let big = ra.alloc(20000, r).unwrap();
    fill(q, 192, 7);
    let local = 5u64;
    let foreign = NonNull::from(&local).cast::<u8>();
    assert!(matches!(ra.free(foreign), Err(RegionError::NotOwned(_))));
    // SAFETY: offsets inside live objects.
    let inner = unsafe { NonNull::new_unchecked(p.as_ptr().add(8)) };
    assert_eq!(ra.free(inner), Err(RegionError::Interior { ptr: inner.as_ptr() as usize, object: p.as_ptr() as usize, region: r }));
    // SAFETY: as above.
    let inner_big = unsafe { NonNull::new_unchecked(big.as_ptr().add(8192)) };
    assert!(matches!(ra.free(inner_big), Err(RegionError::Interior { object, .. }) if object == big.as_ptr() as usize));
    ra.free(p).unwrap();
    assert_eq!(ra.free(p), Err(RegionError::NotAllocated { ptr: p.as_ptr() as usize, region: r }));
    ra.free(big).unwrap();
    assert!(ra.free(big).is_err());
    assert!(holds(q, 192, 7));
    assert_eq!(ra.region_stats(r).unwrap().objects, 1);
    ra.check().unwrap();
    let msg = ra.free(p).unwrap_err().to_string();
    assert!(msg.contains("double free") && msg.contains(&format!("{:#x}", p.as_ptr() as usize)), "{msg}");
}

#[test]
fn realloc_keeps_contents_and_moves_between_regions() {
    let mut ra = RegionAllocator::new();
    let a = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let b = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let p = ra.alloc(100, a).unwrap();
    fill(p, 100, 3);
    assert_eq!(ra.realloc(p, 120, None).unwrap(), p, "same 128 B slot");
    let q = ra.realloc(p, 1000, None).unwrap();
    assert!(holds(q, 100, 3));
    let q2 = ra.realloc(q, 1000, Some(b)).unwrap();
    assert_eq!(ra.object(q2).unwrap().0, b);
    assert!(holds(q2, 100, 3));
    let big = ra.realloc(q2, 40000, None).unwrap();
    assert!(holds(big, 100, 3));
    fill(big, 40000, 9);
    let smaller = ra.realloc(big, 10000, None).unwrap();
    assert_eq!(smaller, big, "spans shrink in place");
    assert_eq!(ra.object(smaller).unwrap().1, 12288);
    let grown = ra.realloc(smaller, 16000, None).unwrap();
    assert!(holds(grown, 10000, 9));
    let bogus = RegionId::from_raw(99).unwrap();
    assert!(ra.realloc(grown, 10, Some(bogus)).is_err());
    assert!(holds(grown, 10000, 9), "a failed realloc leaves the object alone");
    assert_eq!(ra.region_stats(a).unwrap().objects, 0);
    assert_eq!(ra.region_stats(b).unwrap().objects, 1);
    ra.check().unwrap();
}

#[test]
fn out_of_memory_loses_nothing() {
    let cfg = Config { max_pages: 1, ..Config::default() };
    let mut ra = RegionAllocator::with_config(cfg).unwrap();
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let keep = ra.alloc(64, r).unwrap();
    fill(keep, 64, 1);
    // 1 MiB holds 256 slabs of 64 slots: 20000 objects do not fit.
    let e = ra.balloc(64, r, 20000).unwrap_err();
    assert!(matches!(e, RegionError::OutOfMemory { .. }), "{e}");
    assert_eq!(ra.region_stats(r).unwrap().objects, 1);
    assert!(holds(keep, 64, 1));
    assert!(ra.alloc(2 << 20, r).is_err());
    ra.check().unwrap();
    assert!(ra.balloc(64, r, 1000).is_ok());
}

#[test]
fn empty_slabs_stay_between_the_watermarks() {
    let cfg = Config { max_pages: 2, high_watermark: 8, low_watermark: 1, ..Config::default() };
    let mut ra = RegionAllocator::with_config(cfg).unwrap();
    // Many regions each holding one object: each keeps up to 8 empty slabs
    // while memory is plentiful; when it runs short, the others give theirs
    // back down to the low watermark.
    let mut regions = Vec::new();
    for _ in 0..300 {
        let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
        ra.alloc(64, r).unwrap();
        regions.push(r);
    }
    ra.check().unwrap();
    assert!(ra.stats().reclaimed_slabs > 0);
    for r in &regions {
        assert!(ra.region_stats(*r).unwrap().empty_slabs <= 8);
    }
    // Freed objects leave empty slabs, at most `high` per region.
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let v = ra.balloc(4096, r, 20).unwrap();
    for p in v {
        ra.free(p).unwrap();
    }
    assert!(ra.region_stats(r).unwrap().empty_slabs <= 8);
    ra.check().unwrap();
}

#[test]
fn holes_are_filled_before_new_slabs() {
    let mut ra = RegionAllocator::new();
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let v = ra.balloc(192, r, 2100).unwrap(); // 21 slots per slab: 100 slabs
    let before = ra.region_stats(r).unwrap();
    assert_eq!(before.full_slabs, 100);
    for p in v.iter().step_by(2) {
        ra.free(*p).unwrap();
    }
    let mid = ra.region_stats(r).unwrap();
    assert_eq!(mid.partial_slabs, 100);
    ra.balloc(192, r, 1050).unwrap();
    let after = ra.region_stats(r).unwrap();
    assert_eq!((after.full_slabs, after.partial_slabs), (100, 0), "every hole plugged, no new slab");
    ra.check().unwrap();
}

#[test]
fn a_live_region_survives_trim_of_pages_it_once_used() {
    // A region frees an object whose pages then go back to the page source
    // (`trim`); the region keeps living, allocates again (maybe on those
    // addresses, mapped anew), and is freed: its record of the ranges it
    // took still names the pages given back, which must be skipped, not
    // taken for lost slabs.
    let mut ra = RegionAllocator::new();
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let keep = ra.alloc(64, r).unwrap();
    let big = ra.alloc(3 << 20, r).unwrap();
    ra.free(big).unwrap();
    let pages = ra.stats().pages;
    let given = ra.trim();
    assert!(given >= 3, "the spanning object's pages go back ({given} of {pages})");
    ra.check().unwrap();
    let again = ra.alloc(3 << 20, r).unwrap();
    let small: Vec<_> = (0..1000).map(|_| ra.alloc(48, r).unwrap()).collect();
    ra.check().unwrap();
    assert_eq!(ra.region_stats(r).unwrap().objects, 1002);
    // Many small ranges, so the region's record of them is rebuilt too.
    for _ in 0..200 {
        let p = ra.alloc(3 << 20, r).unwrap();
        ra.free(p).unwrap();
        ra.trim();
    }
    ra.check().unwrap();
    ra.free(again).unwrap();
    for p in small {
        ra.free(p).unwrap();
    }
    ra.free(keep).unwrap();
    ra.rfree(r).unwrap();
    ra.check().unwrap();
    ra.trim();
    assert_eq!(ra.stats().pages, 0, "every page back once the region is gone");
    ra.check().unwrap();
}

#[test]
fn region_free_returns_memory_for_reuse_and_trim() {
    let mut ra = RegionAllocator::new();
    let before = canopy_alloc::stats::snapshot().lent_bytes;
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    ra.balloc(256, r, 100_000).unwrap();
    let pages = ra.stats().pages;
    assert!(pages >= 25);
    ra.rfree(r).unwrap();
    let r2 = ra.ralloc(RegionId::ROOT, 0).unwrap();
    ra.balloc(256, r2, 100_000).unwrap();
    assert_eq!(ra.stats().pages, pages, "the second region reuses the first one's pages");
    ra.rfree(r2).unwrap();
    assert_eq!(ra.trim(), pages);
    assert_eq!(ra.stats().pages, 0);
    ra.check().unwrap();
    drop(ra);
    assert!(canopy_alloc::stats::snapshot().lent_bytes <= before + (64 << 20), "pages went back to the global heap");
}

#[test]
fn packed_list_is_a_few_runs() {
    let mut ra = RegionAllocator::new();
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let mut prev: *mut u8 = core::ptr::null_mut();
    for i in 0..30_000u64 {
        let p = ra.alloc(32, r).unwrap().as_ptr();
        // SAFETY: p is a live 64-byte slot.
        unsafe {
            (p as *mut *mut u8).write(prev);
            (p.add(8) as *mut u64).write(i);
        }
        prev = p;
    }
    let runs = ra.pack_runs(r).unwrap();
    assert!(runs.len() <= 4, "{} runs", runs.len());
    let packed = ra.pack(r).unwrap();
    assert_eq!(packed.runs, runs);
    let per_slab = 4096 / ra.slot_size_for(32).unwrap();
    assert_eq!(per_slab, 128, "32 B nodes take 32 B slots");
    assert_eq!(packed.bytes(), 30_000usize.div_ceil(per_slab) * 4096);
    // A slab's bitmap in the description has the words its slots need.
    for s in &packed.slabs {
        if let PackedSlab::Slots { slot_size, allocated, .. } = s {
            assert_eq!((*slot_size, allocated.len()), (32, 2));
        }
    }
    assert_eq!(Packed::decode(&packed.encode()).unwrap(), packed);
}

#[test]
fn packing_stops_at_a_depth() {
    let mut ra = RegionAllocator::new();
    let mut levels = vec![ra.ralloc(RegionId::ROOT, 0).unwrap()];
    for d in 1..4 {
        let r = ra.ralloc(levels[d - 1], d as i32).unwrap();
        levels.push(r);
    }
    for (d, &r) in levels.iter().enumerate() {
        ra.balloc(64, r, 64 * (d + 1)).unwrap(); // d + 1 full slabs per level
    }
    let bytes = |runs: &[Run]| runs.iter().map(|r| r.len).sum::<usize>();
    assert_eq!(bytes(&ra.pack_runs_to_depth(levels[0], 0).unwrap()), 4096);
    assert_eq!(bytes(&ra.pack_runs_to_depth(levels[0], 1).unwrap()), 3 * 4096);
    assert_eq!(bytes(&ra.pack_runs(levels[0]).unwrap()), 10 * 4096);
    let p = ra.pack_to_depth(levels[1], 1).unwrap();
    assert_eq!(p.regions.iter().map(|r| r.id).collect::<Vec<_>>(), vec![levels[1], levels[2]]);
    assert_eq!(p.bytes(), 5 * 4096);
}

#[test]
fn malformed_packs_are_refused() {
    let mut ra = RegionAllocator::new();
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let c = ra.ralloc(r, 0).unwrap();
    ra.balloc(100, c, 10).unwrap();
    ra.alloc(9000, r).unwrap();
    let enc = ra.pack(r).unwrap().encode();
    for cut in [0, 7, 8, 20, enc.len() - 1] {
        let e = Packed::decode(&enc[..cut]).unwrap_err();
        assert!(matches!(e, RegionError::Malformed(_)), "{e}");
    }
    let mut bad = enc.clone();
    bad[0] = b'X';
    assert!(Packed::decode(&bad).unwrap_err().to_string().contains("magic"));
    let mut long = enc.clone();
    long.push(0);
    assert!(Packed::decode(&long).is_err());
    // Unpacking where the memory or the ids are in use is refused.
    let p = ra.pack(r).unwrap();
    let e = ra.unpack(RegionId::ROOT, &p, |_, _| Ok(())).unwrap_err();
    assert!(matches!(e, RegionError::Unpack(_)), "{e}");
    ra.check().unwrap();
    // The global heap cannot place pages at given addresses.
    let mut other = RegionAllocator::new();
    let e = other.unpack(RegionId::ROOT, &p, |_, _| Ok(())).unwrap_err();
    assert!(e.to_string().contains("FixedRange"), "{e}");
    other.check().unwrap();
}

/// A 1 MiB-aligned base of `len` bytes of address space that is free now
/// (reserved once to find it, then released), for allocators over a
/// `FixedRange` at the same addresses.
fn free_base(len: usize) -> usize {
    FixedRange::reserve(len, 1 << 20).unwrap().base()
}

/// Run `f` at a base of `len` bytes of free address space.  `f` gives
/// `None` when it could not reserve its range at that base: between one
/// allocator's unmapping and the next one's mapping at the same base,
/// another thread's mapping (tests run in parallel) may land there.  Then it
/// runs again at a new base.
fn at_a_free_base<T>(len: usize, mut f: impl FnMut(usize) -> Option<T>) -> T {
    for _ in 0..8 {
        if let Some(t) = f(free_base(len)) {
            return t;
        }
    }
    panic!("no range of {len} bytes stayed free from one reservation to the next in 8 attempts");
}

/// The bytes of `p`'s runs, in order, copied out of `ra` (right after `pack`).
fn run_bytes(_ra: &RegionAllocator, p: &Packed) -> Vec<u8> {
    let mut bytes = Vec::new();
    for r in &p.runs {
        // SAFETY: the runs are live memory of `ra`, which the borrow keeps
        // alive and unchanged.
        bytes.extend_from_slice(unsafe { core::slice::from_raw_parts(r.addr as *const u8, r.len) });
    }
    bytes
}

/// Unpack `p` under the root of `rb`, filling each run from `bytes` (the
/// runs' contents in order, as [`run_bytes`] made them).
fn unpack_with(rb: &mut RegionAllocator, p: &Packed, bytes: &[u8]) -> Result<RegionId, RegionError> {
    let mut off = 0;
    rb.unpack(RegionId::ROOT, p, |run, mem| {
        mem.copy_from_slice(&bytes[off..off + run.len]);
        off += run.len;
        Ok(())
    })
}

/// Build a linked list and a binary tree in regions of an allocator over a
/// fixed range, pack them, drop the allocator (unmapping the range), and
/// unpack into a new allocator at the same base: the pointers still work.
#[test]
fn unpack_at_the_same_addresses_in_a_new_allocator() {
    let len = 64 << 20;
    at_a_free_base(len, |base| {
        let cfg = Config::default();
        let (enc, bytes, list_head, tree_root) = {
            let mut ra = RegionAllocator::with_source(cfg.clone(), Box::new(FixedRange::reserve_at(base, len, 1 << 20).ok()?)).unwrap();
            let top = ra.ralloc(RegionId::ROOT, 0).unwrap();
            let lists = ra.ralloc(top, 1).unwrap();
            let trees = ra.ralloc(top, 1).unwrap();
            let head = crate::tests::build_list(&mut ra, lists, 5000);
            let root = crate::tests::build_tree(&mut ra, trees, 12);
            let p = ra.pack(top).unwrap();
            (p.encode(), run_bytes(&ra, &p), head as usize, root as usize)
        };
        let p = Packed::decode(&enc).unwrap();
        let mut rb = RegionAllocator::with_source(cfg, Box::new(FixedRange::reserve_at(base, len, 1 << 20).ok()?)).unwrap();
        let top = unpack_with(&mut rb, &p, &bytes).unwrap();
        rb.check().unwrap();
        assert_eq!(top, p.regions[0].id);
        assert_eq!(walk_list(list_head as *const u8), (5000, (0..5000u64).sum()));
        assert_eq!(walk_tree(tree_root as *const u8), (1 << 12) - 1);
        // The unpacked objects are ordinary objects here: free one, free the rest.
        rb.free(NonNull::new(list_head as *mut u8).unwrap()).unwrap();
        rb.rfree(top).unwrap();
        rb.check().unwrap();
        Some(())
    })
}

/// A list of `n` 32-byte nodes (next pointer, value), newest first.
/// A pack holds slots smaller than the granule; an allocator whose slot
/// sizes are granule multiples only (Myrmics' layout) has no such slots and
/// refuses it, naming the slab and the size, and changes nothing.
#[test]
fn unpack_refuses_slot_sizes_the_receiver_does_not_have() {
    let len = 16 << 20;
    at_a_free_base(len, |base| {
        let enc = {
            let mut ra =
                RegionAllocator::with_source(Config::default(), Box::new(FixedRange::reserve_at(base, len, 1 << 20).ok()?))
                    .unwrap();
            let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
            build_list(&mut ra, r, 100);
            ra.pack(r).unwrap().encode()
        };
        let p = Packed::decode(&enc).unwrap();
        let myrmics = Config { min_slot: 64, ..Config::default() };
        let mut rb = RegionAllocator::with_source(myrmics, Box::new(FixedRange::reserve_at(base, len, 1 << 20).ok()?)).unwrap();
        let e = rb.unpack(RegionId::ROOT, &p, |_, _| Ok(())).unwrap_err();
        assert!(matches!(e, RegionError::Unpack(_)), "{e}");
        assert!(e.to_string().contains("slot size 32"), "{e}");
        assert_eq!(rb.stats().regions, 1);
        rb.check().unwrap();
        Some(())
    })
}

/// A pack's slot sizes decide whether a receiver can hold it, not the
/// smallest slot of the sender: a pack of 64 B and larger slots from an
/// allocator with 16 B slots (whose slabs have bitmaps of four words) unpacks
/// into one with Myrmics' layout (one word for 64 slots), and 32 B slots into
/// one whose smallest slot is 32 B.
#[test]
fn unpack_takes_slot_sizes_the_receiver_has_from_a_smaller_smallest_slot() {
    let len = 16 << 20;
    at_a_free_base(len, |base| {
        for (min_slot, sizes) in [(64, [64usize, 100, 4096]), (32, [32, 64, 96])] {
            let (enc, bytes, objs) = {
                let mut ra = RegionAllocator::with_source(
                    Config::default(),
                    Box::new(FixedRange::reserve_at(base, len, 1 << 20).ok()?),
                )
                .unwrap();
                let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
                let mut objs = Vec::new();
                for (i, &s) in sizes.iter().enumerate() {
                    for p in ra.balloc(s, r, 70).unwrap() {
                        fill(p, s, i as u8 + 1);
                        objs.push((p.as_ptr() as usize, s, i as u8 + 1));
                    }
                }
                let p = ra.pack(r).unwrap();
                (p.encode(), run_bytes(&ra, &p), objs)
            };
            let p = Packed::decode(&enc).unwrap();
            let cfg = Config { min_slot, ..Config::default() };
            let mut rb = RegionAllocator::with_source(cfg, Box::new(FixedRange::reserve_at(base, len, 1 << 20).ok()?)).unwrap();
            let top = unpack_with(&mut rb, &p, &bytes).unwrap_or_else(|e| panic!("smallest slot {min_slot}: {e}"));
            rb.check().unwrap();
            assert_eq!(rb.region_stats(top).unwrap().objects, objs.len() as u64);
            for &(a, s, v) in &objs {
                let q = NonNull::new(a as *mut u8).unwrap();
                assert!(holds(q, s, v));
                assert_eq!(rb.object(q).unwrap(), (top, rb.slot_size_for(s).unwrap()));
            }
            rb.rfree(top).unwrap();
            rb.check().unwrap();
        }
        Some(())
    })
}

/// Objects below the granule take slots of the next multiple of the smallest
/// slot, four 16 B objects to a 64 B line; with the smallest slot at the
/// granule every slot is a granule multiple.
#[test]
fn small_objects_take_small_slots() {
    let mut ra = RegionAllocator::new();
    for (s, slot) in [(1, 16), (16, 16), (17, 32), (32, 32), (33, 48), (48, 48), (49, 64), (64, 64), (65, 128), (4096, 4096)] {
        assert_eq!(ra.slot_size_for(s), Some(slot), "size {s}");
    }
    assert_eq!(ra.slot_size_for(4097), None);
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let v = ra.balloc(16, r, 1000).unwrap();
    // 256 slots per 4 KiB slab: 3 full slabs and one partial.
    let st = ra.region_stats(r).unwrap();
    assert_eq!((st.full_slabs, st.partial_slabs, st.bytes), (3, 1, 16_000));
    let mut addrs: Vec<usize> = v.iter().map(|p| p.as_ptr() as usize).collect();
    addrs.sort_unstable();
    assert!(addrs.windows(2).all(|w| w[1] - w[0] >= 16), "16 B objects do not overlap");
    for (i, p) in v.iter().enumerate() {
        fill(*p, 16, i as u8);
    }
    for (i, p) in v.iter().enumerate() {
        assert!(holds(*p, 16, i as u8));
        assert_eq!(ra.object(*p).unwrap(), (r, 16));
    }
    ra.check().unwrap();
    // Interior pointers of a 16 B slot are not objects.
    let inner = NonNull::new(v[0].as_ptr().wrapping_add(8)).unwrap();
    assert!(matches!(ra.free(inner), Err(RegionError::Interior { .. })));
    for p in v {
        ra.free(p).unwrap();
    }
    ra.check().unwrap();

    let mut m = RegionAllocator::with_config(Config { min_slot: 64, ..Config::default() }).unwrap();
    for (s, slot) in [(1, 64), (16, 64), (48, 64), (64, 64), (65, 128)] {
        assert_eq!(m.slot_size_for(s), Some(slot), "size {s}, Myrmics' layout");
    }
    let r = m.ralloc(RegionId::ROOT, 0).unwrap();
    let p = m.alloc(16, r).unwrap();
    assert_eq!(m.object(p).unwrap(), (r, 64));
    m.check().unwrap();
}

/// Shapes of slot sizes the tests below go through: the default, granule
/// multiples throughout (16 B, and Myrmics' 64 B), a smallest slot between
/// 16 B and the granule, the smallest slot and the granule at their largest
/// for the slab, and large slabs.
fn slot_shapes() -> Vec<Config> {
    [
        (64, 16, 4096),
        (16, 16, 4096),
        (128, 32, 4096),
        (64, 64, 4096),
        (4096, 16, 4096),
        (64, 16, 64 << 10),
        (64, 64, 256 << 10),
        (1024, 256, 1 << 20),
    ]
    .into_iter()
    .map(|(granule, min_slot, slab_size)| Config { granule, min_slot, slab_size, page_size: slab_size.max(1 << 20), ..Config::default() })
    .collect()
}

/// For every request size up to the slab (and one past it), in every shape:
/// the slot is the next multiple of the smallest slot below the granule and
/// of the granule from there; classes are dense (1..=tiny the small slots,
/// then the granule multiples); and the fast path's table, indexed by the
/// request's 16 B multiple up to slab size / 16, agrees with the formula.
#[test]
fn slot_classes_agree_with_the_table_in_every_shape() {
    for cfg in slot_shapes() {
        let ra = RegionAllocator::with_config(cfg.clone()).unwrap();
        let tiny = cfg.granule / cfg.min_slot - 1;
        for size in 0..=cfg.slab_size + 1 {
            let s = size.max(1);
            let want = if s < cfg.granule { s.next_multiple_of(cfg.min_slot) } else { s.next_multiple_of(cfg.granule) };
            if size > cfg.slab_size {
                assert_eq!(ra.slot_size_for(size), None, "{cfg:?}: size {size}");
                continue;
            }
            assert_eq!(ra.slot_size_for(size), Some(want), "{cfg:?}: size {size}");
            let (table, formula, len) = ra.slot_lookups(size);
            assert_eq!(len, cfg.slab_size / 16 + 1, "{cfg:?}");
            assert_eq!(table, formula, "{cfg:?}: size {size}");
            if size == 0 {
                assert_eq!(table, (0, 0), "size 0 takes the slow path");
                continue;
            }
            let class = if want < cfg.granule { want / cfg.min_slot } else { tiny + want / cfg.granule };
            assert_eq!(table, (class, want), "{cfg:?}: size {size}");
        }
    }
}

/// Every slot size of every shape: a slab's worth and more by `alloc` and
/// by `balloc`, each object aligned to its slot size's power of two, apart
/// from the others, counted in the region's bytes, with interior pointers
/// refused, reallocs within the slot kept in place, and every free taken.
#[test]
fn every_slot_size_of_every_shape() {
    for cfg in slot_shapes() {
        let mut ra = RegionAllocator::with_config(cfg.clone()).unwrap();
        let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
        let mut slots: Vec<usize> = (1..).map(|k| k * cfg.min_slot).take_while(|&s| s < cfg.granule).collect();
        slots.extend((1..=cfg.slab_size / cfg.granule).map(|k| k * cfg.granule));
        for slot in slots {
            let step = if slot <= cfg.granule { cfg.min_slot } else { cfg.granule };
            let smallest = slot + 1 - step.min(slot);
            let n = (cfg.slab_size / slot).min(300);
            let mut v: Vec<NonNull<u8>> = (0..n + 2).map(|_| ra.alloc(smallest, r).unwrap()).collect();
            v.extend(ra.balloc(slot, r, n + 3).unwrap());
            let mut addrs: Vec<usize> = v.iter().map(|p| p.as_ptr() as usize).collect();
            addrs.sort_unstable();
            assert!(addrs.windows(2).all(|w| w[1] - w[0] >= slot), "{cfg:?}: slot {slot}");
            for &p in &v {
                assert_eq!(ra.object(p).unwrap(), (r, slot), "{cfg:?}");
                assert_eq!(p.as_ptr() as usize % (1 << slot.trailing_zeros()), 0, "{cfg:?}: slot {slot}");
            }
            assert_eq!(ra.region_stats(r).unwrap().bytes, (v.len() * slot) as u64);
            for &p in &v[..2] {
                for off in [1, 8, 16, slot / 2, slot - 1] {
                    if off == 0 || off >= slot {
                        continue;
                    }
                    let q = NonNull::new(p.as_ptr().wrapping_add(off)).unwrap();
                    assert!(matches!(ra.free(q), Err(RegionError::Interior { .. })), "{cfg:?}: slot {slot} + {off}");
                }
                assert_eq!(ra.realloc(p, smallest, None).unwrap(), p);
                assert_eq!(ra.realloc(p, slot, None).unwrap(), p);
            }
            ra.check().unwrap();
            for p in v {
                ra.free(p).unwrap();
            }
            assert_eq!(ra.region_stats(r).unwrap().objects, 0);
            ra.check().unwrap();
        }
    }
}

/// A description whose region ids lie far beyond the region table would make
/// the receiver create every table entry up to them: refused, nothing made.
#[test]
fn unpack_refuses_region_ids_far_beyond_the_table() {
    let mut ra = RegionAllocator::new();
    let before = ra.stats();
    for slot in [u32::MAX - 1, (MAX_UNPACK_GROWTH + 10) as u32] {
        let p = Packed {
            slab_size: ra.config().slab_size,
            granule: ra.config().granule,
            regions: vec![PackedRegion { id: RegionId::new(slot, 7), parent: None, level_hint: 0 }],
            slabs: Vec::new(),
            runs: Vec::new(),
        };
        let p = Packed::decode(&p.encode()).unwrap();
        let e = ra.unpack(RegionId::ROOT, &p, |_, _| Ok(())).unwrap_err();
        assert!(matches!(e, RegionError::Unpack(_)), "{e}");
        assert!(e.to_string().contains("region table"), "{e}");
    }
    assert_eq!(ra.stats(), before);
    ra.check().unwrap();
    // Within the bound the table grows, and the unused entries cost no lists.
    let p = Packed {
        slab_size: ra.config().slab_size,
        granule: ra.config().granule,
        regions: vec![PackedRegion { id: RegionId::new(1000, 3), parent: None, level_hint: 2 }],
        slabs: Vec::new(),
        runs: Vec::new(),
    };
    let top = ra.unpack(RegionId::ROOT, &p, |_, _| Ok(())).unwrap();
    assert_eq!(top, RegionId::new(1000, 3));
    ra.check().unwrap();
    // The slots skipped over serve new regions.
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let x = ra.alloc(40, r).unwrap();
    ra.free(x).unwrap();
    ra.rfree(top).unwrap();
    ra.rfree(r).unwrap();
    ra.check().unwrap();
}

/// A pointer past the last slot of a slab (into its unused tail) is not an
/// object, and the error says so rather than suggesting a double free.
#[test]
fn a_pointer_into_a_slab_tail_is_named_as_such() {
    let mut ra = RegionAllocator::new();
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let p = ra.alloc(48, r).unwrap(); // 85 slots of 48 B, 16 B of tail
    let slab = p.as_ptr() as usize & !4095;
    let tail = NonNull::new((slab + 85 * 48) as *mut u8).unwrap();
    let e = ra.free(tail).unwrap_err();
    assert!(matches!(e, RegionError::Invalid(_)) && e.to_string().contains("unused tail"), "{e}");
    ra.free(p).unwrap();
    ra.check().unwrap();
}

pub(crate) fn build_list(ra: &mut RegionAllocator, r: RegionId, n: u64) -> *mut u8 {
    let mut prev: *mut u8 = core::ptr::null_mut();
    for i in 0..n {
        let p = ra.alloc(32, r).unwrap().as_ptr();
        // SAFETY: p is a live slot of at least 32 bytes.
        unsafe {
            (p as *mut *mut u8).write(prev);
            (p.add(8) as *mut u64).write(i);
        }
        prev = p;
    }
    prev
}

pub(crate) fn walk_list(mut p: *const u8) -> (u64, u64) {
    let (mut n, mut sum) = (0, 0);
    while !p.is_null() {
        // SAFETY: nodes built by build_list.
        unsafe {
            sum += (p.add(8) as *const u64).read();
            p = (p as *const *const u8).read();
        }
        n += 1;
    }
    (n, sum)
}

/// A complete binary tree of depth `d` (nodes: left, right, one payload word).
pub(crate) fn build_tree(ra: &mut RegionAllocator, r: RegionId, d: u32) -> *mut u8 {
    let p = ra.alloc(24, r).unwrap().as_ptr();
    let (l, rt) = if d > 1 { (build_tree(ra, r, d - 1), build_tree(ra, r, d - 1)) } else { (core::ptr::null_mut(), core::ptr::null_mut()) };
    // SAFETY: p is a live slot of at least 24 bytes.
    unsafe {
        (p as *mut *mut u8).write(l);
        (p.add(8) as *mut *mut u8).write(rt);
        (p.add(16) as *mut u64).write(1);
    }
    p
}

pub(crate) fn walk_tree(p: *const u8) -> u64 {
    if p.is_null() {
        return 0;
    }
    // SAFETY: nodes built by build_tree.
    unsafe { (p.add(16) as *const u64).read() + walk_tree((p as *const *const u8).read()) + walk_tree((p.add(8) as *const *const u8).read()) }
}

/// A region's list of the ranges it took is rebuilt from its slabs when it
/// grows long; the slabs being taken at that moment are not marked yet and
/// must stay on it, or freeing the region leaves them behind.
#[test]
fn owned_ranges_keep_the_slabs_being_taken() {
    let mut ra = RegionAllocator::new();
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let q = ra.ralloc(RegionId::ROOT, 0).unwrap();
    // Each round r takes a two-slab span and gives it back, and q takes the
    // slabs right after it, so r's next take does not extend its last range:
    // r's list grows by one range a round while r holds almost nothing, and
    // the 65th take rebuilds it.
    for _ in 0..64 {
        let p = ra.alloc(8192, r).unwrap();
        ra.alloc(8192, q).unwrap();
        ra.free(p).unwrap();
    }
    let last = ra.alloc(8192, r).unwrap();
    ra.check().unwrap();
    ra.rfree(r).unwrap();
    ra.check().unwrap();
    assert!(ra.region_of(last.as_ptr()).is_err(), "the region's last span went back with it");
}

#[test]
fn config_from_variables() {
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    };
    assert_eq!(Config::from_vars(vars(&[])).unwrap(), Config::default());
    let c = Config::from_vars(vars(&[("CANOPY_REGION_SLAB", "16K"), ("CANOPY_REGION_HIGH", "4")])).unwrap();
    assert_eq!((c.slab_size, c.high_watermark, c.min_slot), (16384, 4, 16));
    // A slab of 256 KiB holds at most 4096 slots: the smallest slot grows
    // to 64 B unless it is set, and set too small it is an error saying so.
    let c = Config::from_vars(vars(&[("CANOPY_REGION_SLAB", "256K"), ("CANOPY_REGION_PAGE", "1M")])).unwrap();
    assert_eq!(c.min_slot, 64);
    let e = Config::from_vars(vars(&[("CANOPY_REGION_SLAB", "256K"), ("CANOPY_REGION_MIN_SLOT", "16")])).unwrap_err();
    assert!(e.to_string().contains("at least 64 B"), "{e}");
    // With a granule below that, the smallest slot cannot grow alone.
    let e = Config::from_vars(vars(&[("CANOPY_REGION_SLAB", "256K"), ("CANOPY_REGION_GRANULE", "32")])).unwrap_err();
    assert!(e.to_string().contains("the granule and the smallest slot at least 64 B"), "{e}");
    let e = Config::from_vars(vars(&[("CANOPY_REGION_MIN_SLOT", "lots")])).unwrap_err();
    assert!(e.to_string().contains("CANOPY_REGION_MIN_SLOT"), "{e}");
    let c = Config::from_vars(vars(&[("CANOPY_REGION_MIN_SLOT", "64")])).unwrap();
    assert_eq!(c.min_slot, 64);
    // A slab size that is not a power of two is reported as such, not as a
    // smallest slot the user never set.
    for slab in ["100000", "200K"] {
        let e = Config::from_vars(move |name: &str| (name == "CANOPY_REGION_SLAB").then(|| slab.to_string())).unwrap_err();
        assert!(e.to_string().starts_with("bad region configuration: slab size"), "{slab}: {e}");
    }
}

#[test]
fn config_is_checked() {
    for bad in [
        Config { granule: 48, ..Config::default() },
        Config { slab_size: 1000, ..Config::default() },
        Config { page_size: 2048, ..Config::default() },
        Config { low_watermark: 9, high_watermark: 8, ..Config::default() },
    ] {
        assert!(matches!(RegionAllocator::with_config(bad), Err(RegionError::BadConfig(_))));
    }
    assert!(RegionAllocator::with_config(Config { page_size: 1 << 19, ..Config::default() }).is_err());
    for bad in [
        Config { min_slot: 8, ..Config::default() },
        Config { min_slot: 128, ..Config::default() },
        Config { min_slot: 24, ..Config::default() },
        Config { min_slot: 16, slab_size: 128 << 10, ..Config::default() },
    ] {
        let e = RegionAllocator::with_config(bad.clone()).err();
        assert!(matches!(e, Some(RegionError::BadConfig(_))), "{bad:?}: {e:?}");
    }
    let ok = Config { granule: 16, min_slot: 16, slab_size: 16384, page_size: 2 << 20, ..Config::default() };
    let mut ra = RegionAllocator::with_config(ok).unwrap();
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let v = ra.balloc(16, r, 5000).unwrap(); // 1024 slots per slab: 16 bitmap words
    assert_eq!(ra.region_stats(r).unwrap().full_slabs, 4);
    for p in v {
        ra.free(p).unwrap();
    }
    ra.check().unwrap();
    assert_eq!(crate::config::parse_size("64K"), Some(65536));
    assert_eq!(crate::config::parse_size("x"), None);
}

mod model {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        NewRegion(usize),
        Alloc(usize, usize),
        Free(usize),
        Realloc(usize, usize, Option<usize>),
        FreeRegion(usize),
        Balloc(usize, usize, usize),
        /// Several allocations through one `in_region` handle.
        InRegion(usize, Vec<usize>),
    }

    fn size() -> impl Strategy<Value = usize> {
        prop_oneof![4 => 0usize..300, 2 => 300usize..4200, 1 => 4200usize..70000]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            1 => any::<usize>().prop_map(Op::NewRegion),
            6 => (any::<usize>(), size()).prop_map(|(r, s)| Op::Alloc(r, s)),
            4 => any::<usize>().prop_map(Op::Free),
            2 => (any::<usize>(), size(), proptest::option::of(any::<usize>())).prop_map(|(o, s, r)| Op::Realloc(o, s, r)),
            1 => any::<usize>().prop_map(Op::FreeRegion),
            1 => (any::<usize>(), 1usize..200, 1usize..100).prop_map(|(r, s, n)| Op::Balloc(r, s, n)),
            2 => (any::<usize>(), proptest::collection::vec(size(), 1..40)).prop_map(|(r, v)| Op::InRegion(r, v)),
        ]
    }

    struct Obj {
        p: NonNull<u8>,
        size: usize,
        region: RegionId,
        v: u8,
    }

    fn cases() -> u32 {
        std::env::var("CANOPY_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]
        #[test]
        fn behaves_like_the_model(ops in proptest::collection::vec(op(), 1..160), shape in 0..3usize) {
            // Slot sizes: 16 B multiples below 64 B and 64 B multiples from
            // there (the default); 64 B multiples only (Myrmics); 16 B
            // multiples throughout.  16 B slots make slabs of 256 slots: four
            // bitmap words.
            let (granule, min_slot) = [(64, 16), (64, 64), (16, 16)][shape];
            let cfg = Config { granule, min_slot, high_watermark: 3, low_watermark: 1, max_pages: 8, ..Config::default() };
            let mut ra = RegionAllocator::with_config(cfg).unwrap();
            // Model: live regions (with parents) and live objects.
            let mut regions: Vec<(RegionId, Option<RegionId>)> = vec![(RegionId::ROOT, None)];
            let mut objs: Vec<Obj> = Vec::new();
            let mut tick = 0u8;
            for op in ops {
                tick = tick.wrapping_add(1);
                match op {
                    Op::NewRegion(i) => {
                        let parent = regions[i % regions.len()].0;
                        let r = ra.ralloc(parent, 0).unwrap();
                        regions.push((r, Some(parent)));
                    }
                    Op::Alloc(i, s) => {
                        let r = regions[i % regions.len()].0;
                        match ra.alloc(s, r) {
                            Ok(p) => { fill(p, s, tick); objs.push(Obj { p, size: s, region: r, v: tick }); }
                            Err(RegionError::OutOfMemory { .. }) => {}
                            Err(e) => prop_assert!(false, "{e}"),
                        }
                    }
                    Op::InRegion(i, sizes) => {
                        let r = regions[i % regions.len()].0;
                        let mut inr = ra.in_region(r).unwrap();
                        prop_assert_eq!(inr.id(), r);
                        for s in sizes {
                            match inr.alloc(s) {
                                Ok(p) => { fill(p, s, tick); objs.push(Obj { p, size: s, region: r, v: tick }); }
                                Err(RegionError::OutOfMemory { .. }) => {}
                                Err(e) => prop_assert!(false, "{e}"),
                            }
                        }
                    }
                    Op::Balloc(i, s, n) => {
                        let r = regions[i % regions.len()].0;
                        match ra.balloc(s, r, n) {
                            Ok(v) => for p in v { fill(p, s, tick); objs.push(Obj { p, size: s, region: r, v: tick }); },
                            Err(RegionError::OutOfMemory { .. }) => {}
                            Err(e) => prop_assert!(false, "{e}"),
                        }
                    }
                    Op::Free(i) => {
                        if objs.is_empty() { continue; }
                        let o = objs.swap_remove(i % objs.len());
                        prop_assert!(holds(o.p, o.size, o.v));
                        ra.free(o.p).unwrap();
                        prop_assert!(ra.free(o.p).is_err());
                    }
                    Op::Realloc(i, s, to) => {
                        if objs.is_empty() { continue; }
                        let k = i % objs.len();
                        let target = to.map(|t| regions[t % regions.len()].0);
                        let o = &mut objs[k];
                        match ra.realloc(o.p, s, target) {
                            Ok(q) => {
                                prop_assert!(holds(q, o.size.min(s), o.v));
                                fill(q, s, tick);
                                *o = Obj { p: q, size: s, region: target.unwrap_or(o.region), v: tick };
                            }
                            Err(RegionError::OutOfMemory { .. }) => prop_assert!(holds(o.p, o.size, o.v)),
                            Err(e) => prop_assert!(false, "{e}"),
                        }
                    }
                    Op::FreeRegion(i) => {
                        if regions.len() == 1 { continue; }
                        let victim = regions[1 + i % (regions.len() - 1)].0;
                        ra.rfree(victim).unwrap();
                        // Remove the victim and its descendants from the model.
                        let mut dead = vec![victim];
                        loop {
                            let before = dead.len();
                            for &(r, p) in &regions {
                                if p.is_some_and(|p| dead.contains(&p)) && !dead.contains(&r) { dead.push(r); }
                            }
                            if dead.len() == before { break; }
                        }
                        regions.retain(|(r, _)| !dead.contains(r));
                        objs.retain(|o| !dead.contains(&o.region));
                        for d in dead { prop_assert!(ra.alloc(1, d).is_err()); }
                    }
                }
                ra.check().map_err(TestCaseError::fail)?;
            }
            for o in &objs {
                prop_assert!(holds(o.p, o.size, o.v));
                prop_assert_eq!(ra.object(o.p).unwrap().0, o.region);
            }
            for &(r, _) in &regions {
                let n = objs.iter().filter(|o| o.region == r).count() as u64;
                prop_assert_eq!(ra.region_stats(r).unwrap().objects, n);
            }
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = Packed::decode(&bytes);
            let mut with_magic = b"CNPYRGN1".to_vec();
            with_magic.extend_from_slice(&bytes);
            let _ = Packed::decode(&with_magic);
        }
    }
}

#[test]
fn the_allocation_and_free_counters_count_every_object_once_by_every_path() {
    let mut ra = RegionAllocator::new();
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let before = ra.stats();
    // Through `in_region`: the fast path and its refills (several slabs of
    // each of three slot sizes), and a spanning object.
    let mut inr = ra.in_region(r).unwrap();
    let mut ps = Vec::new();
    for i in 0..3000 {
        ps.push(inr.alloc([16, 64, 192][i % 3]).unwrap());
    }
    ps.push(inr.alloc(3 * 4096 + 5).unwrap());
    assert_eq!(inr.allocator().stats().allocs - before.allocs, 3001);
    // By id, many at once, and spanning.
    for _ in 0..500 {
        ps.push(ra.alloc(48, r).unwrap());
    }
    ps.extend(ra.balloc(96, r, 700).unwrap());
    ps.push(ra.alloc(9000, r).unwrap());
    let st = ra.stats();
    assert_eq!(st.allocs - before.allocs, 3001 + 500 + 700 + 1);
    assert_eq!(st.frees, before.frees);
    // Frees one by one count once each; a refused double free not at all.
    for p in ps.drain(..1000) {
        ra.free(p).unwrap();
    }
    let p = ps.pop().unwrap();
    ra.free(p).unwrap();
    assert!(ra.free(p).is_err());
    let st = ra.stats();
    assert_eq!(st.frees - before.frees, 1001);
    assert_eq!(ra.region_stats(r).unwrap().objects, (3001 + 500 + 700 + 1 - 1001) as u64);
    // Freeing the region frees the rest without counting them one by one.
    ra.rfree(r).unwrap();
    assert_eq!(ra.stats().frees - before.frees, 1001);
    assert_eq!(ra.stats().allocs - before.allocs, 4202);
}

/// Damaged descriptions: a valid pack's bytes with some bytes changed, cut
/// or repeated.  Decoding and unpacking never panic and never leave the
/// receiver inconsistent: each is refused with an error, or (when the damage
/// still describes a possible pack) unpacked into an allocator over a fixed
/// range at the sender's base, whose invariants then hold.
mod damaged_packs {
    use super::*;
    use proptest::prelude::*;

    fn cases() -> u32 {
        std::env::var("CANOPY_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48)
    }

    /// The encoded description of a small tree of regions (a list, spans,
    /// a child region) built in an allocator over a fixed range at `base`.
    /// `None` if the range was taken meanwhile (tests run in parallel, and
    /// another thread's mapping may land in a range found free a moment ago).
    fn sample(base: usize, len: usize) -> Option<Vec<u8>> {
        let mut ra =
            RegionAllocator::with_source(Config::default(), Box::new(FixedRange::reserve_at(base, len, 1 << 20).ok()?))
                .unwrap();
        let top = ra.ralloc(RegionId::ROOT, 2).unwrap();
        let child = ra.ralloc(top, 3).unwrap();
        build_list(&mut ra, top, 300);
        ra.balloc(48, child, 40).unwrap();
        ra.alloc(9000, child).unwrap();
        ra.alloc(200, top).unwrap();
        Some(ra.pack(top).unwrap().encode())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]
        #[test]
        fn are_refused_or_unpacked_consistently(
            edits in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..6),
            cut in proptest::option::of(any::<proptest::sample::Index>()),
        ) {
            let len = 16 << 20;
            let base = FixedRange::reserve(len, 1 << 20).unwrap().base();
            let enc = sample(base, len);
            prop_assume!(enc.is_some(), "the range was taken by another mapping");
            let mut enc = enc.unwrap();
            for (at, v) in &edits {
                let i = at.index(enc.len());
                enc[i] = *v;
            }
            if let Some(c) = cut {
                enc.truncate(c.index(enc.len() + 1));
            }
            let Ok(p) = Packed::decode(&enc) else { return Ok(()) };
            let range = FixedRange::reserve_at(base, len, 1 << 20);
            prop_assume!(range.is_ok(), "the range was taken by another mapping");
            let mut rb = RegionAllocator::with_source(Config::default(), Box::new(range.unwrap())).unwrap();
            let r = rb.unpack(RegionId::ROOT, &p, |_, mem| {
                mem.fill(0);
                Ok(())
            });
            prop_assert!(rb.check().is_ok(), "after unpack ({:?}): {}", r.as_ref().err(), rb.check().unwrap_err());
            if let Ok(top) = r {
                // What was unpacked behaves: a new object in it, then the
                // whole tree freed.
                let q = rb.alloc(64, top);
                prop_assert!(q.is_ok(), "{:?}", q.err());
                rb.rfree(top).unwrap();
                prop_assert!(rb.check().is_ok(), "{}", rb.check().unwrap_err());
            }
        }
    }
}
