//! Instructions per allocate+free pair, for `valgrind --tool=callgrind`:
//! `alloc_cost region|balloc|malloc|fresh|freshmalloc|none SIZE N` allocates N objects of SIZE bytes
//! and frees them, in rounds of BATCH (4th argument, default 1000) (in a region, or with Canopy's malloc);
//! `fresh` allocates each batch in a fresh region (allocation only; the region is freed whole),
//! `freshmalloc` the same batches with malloc (their frees counted too);
//! `none` runs the same loop without allocating, to subtract.  SIZE 0 means
//! mixed sizes (16..256 B, as in `canopy bench region-speed`), from a fixed
//! pseudo-random sequence.

use std::hint::black_box;
use std::ptr::NonNull;

use canopy_region::{RegionAllocator, RegionId};

#[inline(never)]
fn region_alloc(ra: &mut RegionAllocator, size: usize, r: RegionId) -> Result<NonNull<u8>, canopy_region::RegionError> {
    ra.alloc(size, r)
}

#[inline(never)]
fn region_free(ra: &mut RegionAllocator, p: NonNull<u8>) -> Result<(), canopy_region::RegionError> {
    ra.free(p)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map_or("region", String::as_str).to_owned();
    let size: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(64);
    const MIXED: [usize; 8] = [16, 32, 48, 64, 96, 128, 192, 256];
    let mut seed = 2013u64;
    let mut next_size = move || {
        if size != 0 {
            return size;
        }
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        MIXED[(seed >> 61) as usize]
    };
    let n: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let mut ra = RegionAllocator::new();
    let r = ra.ralloc(RegionId::ROOT, 0).unwrap();
    let mut ptrs: Vec<NonNull<u8>> = Vec::with_capacity(1000);
    let dummy = NonNull::<u8>::dangling();
    let batch: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let (mut ta, mut tf) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
    for _ in 0..n / batch {
        let t0 = std::time::Instant::now();
        match mode.as_str() {
            "region" => {
                for _ in 0..batch {
                    ptrs.push(region_alloc(&mut ra, black_box(next_size()), r).unwrap());
                }
                ta += t0.elapsed();
                let t1 = std::time::Instant::now();
                for p in ptrs.drain(..) {
                    region_free(&mut ra, p).unwrap();
                }
                tf += t1.elapsed();
            }
            "fresh" => {
                // Allocation only, each batch in a fresh region (freed whole):
                // every slab is new, so the slab set-up counts too.
                let fr = ra.ralloc(RegionId::ROOT, 0).unwrap();
                let mut inr = ra.in_region(fr).unwrap();
                for _ in 0..batch {
                    ptrs.push(inr.alloc(black_box(next_size())).unwrap());
                }
                ta += t0.elapsed();
                ptrs.clear();
                ra.rfree(fr).unwrap();
            }
            "freshmalloc" => {
                // The same for malloc: allocation, then the frees untimed.
                for _ in 0..batch {
                    ptrs.push(NonNull::new(canopy_alloc::alloc(black_box(next_size()))).unwrap());
                }
                ta += t0.elapsed();
                for p in ptrs.drain(..) {
                    // SAFETY: allocated just above, freed once.
                    unsafe { canopy_alloc::free(p.as_ptr()) };
                }
            }
            "balloc" => {
                ra.balloc_into(black_box(size), r, batch, &mut ptrs).unwrap();
                ta += t0.elapsed();
                let t1 = std::time::Instant::now();
                for p in ptrs.drain(..) {
                    region_free(&mut ra, p).unwrap();
                }
                tf += t1.elapsed();
            }
            "malloc" => {
                for _ in 0..batch {
                    ptrs.push(NonNull::new(canopy_alloc::alloc(black_box(next_size()))).unwrap());
                }
                ta += t0.elapsed();
                let t1 = std::time::Instant::now();
                for p in ptrs.drain(..) {
                    // SAFETY: allocated just above, freed once.
                    unsafe { canopy_alloc::free(p.as_ptr()) };
                }
                tf += t1.elapsed();
            }
            _ => {
                for _ in 0..batch {
                    black_box(next_size());
                    ptrs.push(black_box(dummy));
                }
                for p in ptrs.drain(..) {
                    black_box(p);
                }
            }
        }
    }
    let per = |t: std::time::Duration| t.as_nanos() as f64 / (n / batch * batch) as f64;
    println!("{mode} size {size} n {n} batch {batch}: {:.2} ns/alloc {:.2} ns/free", per(ta), per(tf));
}
