//! A packed region sent to another process: the child maps the same range at
//! the same base, unpacks the message there and walks the pointer-linked
//! structures without translating a single pointer.

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use canopy_region::{Config, FixedRange, RegionAllocator, RegionId};

const LEN: usize = 64 << 20;
const CHILD_ENV: &str = "CANOPY_REGION_TEST_CHILD_BASE";

/// A list of 32-byte nodes (next, value).
fn build_list(ra: &mut RegionAllocator, r: RegionId, n: u64) -> usize {
    let mut prev = 0usize;
    for i in 0..n {
        let p = ra.alloc(32, r).unwrap().as_ptr();
        // SAFETY: p is a live slot of at least 32 bytes.
        unsafe {
            (p as *mut usize).write(prev);
            (p.add(8) as *mut u64).write(i * 3);
        }
        prev = p as usize;
    }
    prev
}

/// An oct-tree, one region per level (the Barnes-Hut layout): node = 8 child pointers + a value.
fn build_octree(ra: &mut RegionAllocator, levels: &[RegionId], depth: usize) -> usize {
    let p = ra.alloc(72, levels[depth]).unwrap().as_ptr();
    let mut kids = [0usize; 8];
    if depth + 1 < levels.len() {
        for k in &mut kids {
            *k = build_octree(ra, levels, depth + 1);
        }
    }
    // SAFETY: p is a live slot of at least 72 bytes.
    unsafe {
        (p as *mut [usize; 8]).write(kids);
        (p.add(64) as *mut u64).write(depth as u64 + 1);
    }
    p as usize
}

fn walk_list(mut p: usize) -> (u64, u64) {
    let (mut n, mut sum) = (0, 0);
    while p != 0 {
        // SAFETY: nodes written by build_list, unpacked at their addresses.
        unsafe {
            sum += ((p + 8) as *const u64).read();
            p = (p as *const usize).read();
        }
        n += 1;
    }
    (n, sum)
}

fn walk_octree(p: usize) -> u64 {
    if p == 0 {
        return 0;
    }
    // SAFETY: nodes written by build_octree, unpacked at their addresses.
    let (kids, v) = unsafe { ((p as *const [usize; 8]).read(), ((p + 64) as *const u64).read()) };
    v + kids.iter().map(|&k| walk_octree(k)).sum::<u64>()
}

/// Child side: read roots then the message from stdin, unpack, walk, print.
fn child(base: usize) {
    let mut input = std::io::stdin().lock();
    let mut roots = [0u8; 16];
    input.read_exact(&mut roots).unwrap();
    let list = usize::from_le_bytes(roots[..8].try_into().unwrap());
    let tree = usize::from_le_bytes(roots[8..].try_into().unwrap());
    let range = FixedRange::reserve_at(base, LEN, 1 << 20).unwrap();
    let mut ra = RegionAllocator::with_source(Config::default(), Box::new(range)).unwrap();
    match ra.unpack_from(RegionId::ROOT, &mut input) {
        Ok(top) => {
            ra.check().unwrap();
            let (n, sum) = walk_list(list);
            println!("top {} list {n} {sum} octree {}", top, walk_octree(tree));
        }
        Err(e) => {
            println!("error: {e}");
            std::process::exit(3);
        }
    }
}

fn run_child(base: usize, input: &[u8]) -> (i32, String) {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "packed_regions_cross_processes", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, base.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(input).unwrap();
    let out = c.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn packed_regions_cross_processes() {
    if let Ok(b) = std::env::var(CHILD_ENV) {
        child(b.parse().unwrap());
        return;
    }
    let range = FixedRange::reserve(LEN, 1 << 20).unwrap();
    let base = range.base();
    let mut ra = RegionAllocator::with_source(Config::default(), Box::new(range)).unwrap();
    let top = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let list_region = ra.ralloc(top, 1).unwrap();
    let list = build_list(&mut ra, list_region, 30_000);
    let mut levels = vec![ra.ralloc(top, 1).unwrap()];
    for l in 1..5 {
        let r = ra.ralloc(levels[l - 1], l as i32 + 1).unwrap();
        levels.push(r);
    }
    let tree = build_octree(&mut ra, &levels, 0);
    // Noise in a sibling region that is not sent.
    let other = ra.ralloc(RegionId::ROOT, 0).unwrap();
    ra.balloc(200, other, 1000).unwrap();

    let list_runs = ra.pack_runs(list_region).unwrap();
    assert!(list_runs.len() <= 4, "30,000-node list packs into {} runs", list_runs.len());
    let packed = ra.pack(top).unwrap();
    let mut msg = Vec::new();
    msg.extend_from_slice(&list.to_le_bytes());
    msg.extend_from_slice(&tree.to_le_bytes());
    // SAFETY: the runs are live memory of `ra`, unchanged since pack.
    unsafe { packed.write_with_data(&mut msg).unwrap() };

    let nodes: u64 = (0..5).map(|d| 8u64.pow(d)).sum();
    let depth_sum: u64 = (0..5u64).map(|d| 8u64.pow(d as u32) * (d + 1)).sum();
    let (code, out) = run_child(base, &msg);
    assert_eq!(code, 0, "child said: {out}");
    let expect = format!("top {top} list 30000 {} octree {depth_sum}", (0..30_000u64).map(|i| i * 3).sum::<u64>());
    assert!(out.contains(&expect), "child said {out:?}, expected {expect:?} ({nodes} octree nodes)");

    // A message cut short is refused with a clear error, not a crash.
    let (code, out) = run_child(base, &msg[..msg.len() - 100]);
    assert_eq!(code, 3, "child said: {out}");
    assert!(out.contains("error: cannot unpack: filling the run"), "{out}");
    let (code, out) = run_child(base, &msg[..40]);
    assert_eq!(code, 3, "child said: {out}");
    assert!(out.contains("malformed"), "{out}");
}
