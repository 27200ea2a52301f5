//! The SAC with-loop microbenchmark in Rust with Canopy as the global
//! allocator: every `Box` and `Vec` of the kernel, and std's own allocations,
//! go through `canopy_alloc::Canopy`.
//!
//! Usage: `sac_rs_canopy canopy-global|bound X N ITERS THREADS`

use canopy_bench::sac_kernel::{main_with, Mode};

#[global_allocator]
static A: canopy_alloc::Canopy = canopy_alloc::Canopy;

fn main() {
    main_with("sac_rs_canopy", &[Mode::CanopyGlobal, Mode::Bound])
}
