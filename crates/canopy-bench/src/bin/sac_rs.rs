//! The SAC with-loop microbenchmark in Rust on std's system allocator (so an
//! `LD_PRELOAD`ed allocator applies), plus Canopy's rich interface.
//!
//! Usage: `sac_rs system|canopy-rich|canopy-unchecked|bound X N ITERS THREADS`

use canopy_bench::sac_kernel::{main_with, Mode};

fn main() {
    main_with("sac_rs", &[Mode::System, Mode::CanopyRich, Mode::CanopyUnchecked, Mode::Bound])
}
