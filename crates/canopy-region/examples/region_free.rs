//! Time to free N objects: one region free against freeing them one by one
//! (in a region, and with Canopy's malloc).  `region_free N SIZE`.

use std::time::Instant;

use canopy_region::{RegionAllocator, RegionId};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let size: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(64);
    let mut ra = RegionAllocator::new();
    for round in 0..3 {
        let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
        let v = ra.balloc(size, r, n).unwrap();
        let t = Instant::now();
        ra.rfree(r).unwrap();
        let t_rfree = t.elapsed();
        drop(v);
        let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
        let v = ra.balloc(size, r, n).unwrap();
        let t = Instant::now();
        for p in &v {
            ra.free(*p).unwrap();
        }
        let t_each = t.elapsed();
        ra.rfree(r).unwrap();
        let m: Vec<*mut u8> = (0..n).map(|_| canopy_alloc::alloc(size)).collect();
        let t = Instant::now();
        for p in m {
            // SAFETY: allocated above, freed once.
            unsafe { canopy_alloc::free(p) };
        }
        let t_malloc = t.elapsed();
        println!(
            "round {round}: n {n} size {size}: rfree {:?}, region free one by one {:?} ({:.0}x), malloc free one by one {:?} ({:.0}x)",
            t_rfree,
            t_each,
            t_each.as_secs_f64() / t_rfree.as_secs_f64(),
            t_malloc,
            t_malloc.as_secs_f64() / t_rfree.as_secs_f64()
        );
    }
}
