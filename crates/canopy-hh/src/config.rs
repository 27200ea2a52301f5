//! Options of the hierarchical heaps, read once from `CANOPY_HH_*`.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `CANOPY_HH_CHUNK_KB` | 64 | chunk size in KiB (a power of two, 8..=1024); objects larger than a quarter chunk get a chunk of their own |
//! | `CANOPY_HH_GC_MIN_KB` | 4096 | a task's heap is never collected below this size |
//! | `CANOPY_HH_GC_RATIO` | 2.0 | collect when the heap exceeds `max(min, (1 + ratio) x survived)`, survived = bytes after the last collection |
//! | `CANOPY_HH_VERIFY` | 0 (1 in debug builds) | run the heap verifier after every collection |
//! | `CANOPY_HH_GC` | 1 | 0 turns the collector off (heaps only grow; for measurements) |

use std::sync::OnceLock;

/// The options in force (see the module table).
#[derive(Clone, Debug)]
pub struct Config {
    /// Chunk size in bytes (power of two).
    pub chunk_bytes: usize,
    /// Minimum heap size before a collection, bytes.
    pub gc_min_bytes: usize,
    /// Growth allowed over the survivors of the last collection.
    pub gc_ratio: f64,
    /// Verify the heap after each collection.
    pub verify: bool,
    /// Collect at all.
    pub gc: bool,
}

impl Config {
    fn from_env() -> Config {
        fn num(name: &str) -> Option<f64> {
            std::env::var(name).ok().and_then(|v| v.trim().parse::<f64>().ok())
        }
        let kb = num("CANOPY_HH_CHUNK_KB").map(|v| v as usize).unwrap_or(64);
        let kb = if kb.is_power_of_two() { kb.clamp(8, 1024) } else { 64 };
        Config {
            chunk_bytes: kb << 10,
            gc_min_bytes: (num("CANOPY_HH_GC_MIN_KB").unwrap_or(4096.0).max(0.0) as usize) << 10,
            gc_ratio: num("CANOPY_HH_GC_RATIO").unwrap_or(2.0).max(0.0),
            verify: num("CANOPY_HH_VERIFY").map(|v| v != 0.0).unwrap_or(cfg!(debug_assertions)),
            gc: num("CANOPY_HH_GC").map(|v| v != 0.0).unwrap_or(true),
        }
    }
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// The options, read from the environment on first use.
pub fn config() -> &'static Config {
    CONFIG.get_or_init(Config::from_env)
}

/// Install options before the first use (tests and benchmarks). Returns false
/// if options were already read.
pub fn set_config(c: Config) -> bool {
    let ok = CONFIG.set(c).is_ok();
    if ok {
        crate::chunk::init_mask();
    }
    ok
}
