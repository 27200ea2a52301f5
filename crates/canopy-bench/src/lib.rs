//! canopy-bench: the papers' experiments, run side by side against anchor
//! allocators, with results as JSON, Markdown tables and SVG charts.
//!
//! How a measurement is made (see `shared/DESIGN.md`, "Measuring"):
//!
//! - every benchmark program runs as a child process, once per allocator
//!   ("contender": glibc, Canopy through `LD_PRELOAD`, jemalloc, mimalloc,
//!   tcmalloc), and reports its own kernel time and a checksum on one line;
//! - contenders run interleaved, several times, and the median is kept;
//! - every contender must print the same checksum, or the run is a failure
//!   that the report names;
//! - speed is always a ratio against an anchor measured in the same run;
//!   instruction counts from callgrind give repeatable per-operation costs.
//!
//! Modules, in the order a measurement passes through them: [`anchors`]
//! (who runs), [`artifacts`] (what runs: C programs compiled on demand,
//! Canopy's own libraries and binaries), [`runner`] (one child, its peak RSS
//! and exit), [`parse`] (result lines, callgrind totals), [`stats`] (medians,
//! ratios, geomeans), [`experiments`], [`report`] and [`plot`] (files).
//! [`sac_kernel`] is the Rust SAC kernel of the `sac_rs*` binaries.

#![deny(missing_docs)]

pub mod anchors;
pub mod artifacts;
pub mod experiments;
pub mod parse;
pub mod plot;
pub mod progress;
pub mod report;
pub mod runner;
pub mod sac_kernel;
pub mod stats;

pub use report::Size;
