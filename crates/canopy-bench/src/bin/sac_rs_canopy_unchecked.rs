//! The SAC with-loop microbenchmark in Rust with `canopy_alloc::CanopyUnchecked`
//! as the global allocator: as `sac_rs_canopy`, but `dealloc` trusts the
//! layout and puts a small block of the thread's own heap straight onto its
//! kept list.
//!
//! Usage: `sac_rs_canopy_unchecked canopy-global|bound X N ITERS THREADS`

use canopy_bench::sac_kernel::{main_with, Mode};

#[global_allocator]
static A: canopy_alloc::CanopyUnchecked = canopy_alloc::CanopyUnchecked;

fn main() {
    main_with("sac_rs_canopy_unchecked", &[Mode::CanopyGlobal, Mode::Bound])
}
