//! Canopy as the Rust global allocator for a whole test binary: the shared
//! suite of `global_suite` (collections, threads that hand memory to each
//! other, thread churn, over-aligned types).  Not a benchmark.

#[global_allocator]
static GLOBAL: canopy_alloc::Canopy = canopy_alloc::Canopy;

mod global_suite;
