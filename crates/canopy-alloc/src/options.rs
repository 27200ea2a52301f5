//! Every tunable of the allocator, read once from `CANOPY_*` environment
//! variables when the allocator starts.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `CANOPY_CHECK` | 0 (1 in debug builds) | check mode: every free is validated precisely; a double free or a foreign pointer is reported with the pointer and the call, then the process aborts |
//! | `CANOPY_ARENA_GB` | 128 | address space reserved for the heap (GiB); halved until the OS grants it |
//! | `CANOPY_RETAIN_MB` | 64 | free memory the global heap keeps committed; what is above it for `CANOPY_DECAY_MS` is decommitted (largest spans first) down to half of it |
//! | `CANOPY_DECAY_MS` | 1000 | how long free memory may stay above `CANOPY_RETAIN_MB` before it is decommitted (0: at once); a program that frees and allocates the same memory again within that time keeps it committed |
//! | `CANOPY_HEAP_RETAIN_PAGES` | 2 | fully free 1 MiB pages a thread heap keeps before giving them back to the global heap |
//! | `CANOPY_REMOTE_BATCH` | 32 | frees to another thread's memory collected per destination before one swap sends them (at most 1021, the pointers a batch block holds) |
//! | `CANOPY_HUGE_PAGES` | 0 | ask for transparent huge pages on the arena |
//! | `CANOPY_SOLO_UNLOCKED` | 1 | the global heap takes no lock while only one thread has a heap |
//! | `CANOPY_VERBOSE` | 0 | print the statistics table to stderr at exit (and warnings about bad frees in the default mode) |

use canopy_sys::getenv;

/// The options in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Check mode.
    pub check: bool,
    /// Arena reservation in GiB.
    pub arena_gb: usize,
    /// Committed free memory the global heap keeps, in bytes.
    pub retain_bytes: usize,
    /// Delay before committed free memory above `retain_bytes` is decommitted, in ms.
    pub decay_ms: u64,
    /// Free pages a thread heap keeps.
    pub heap_retain_pages: usize,
    /// Remote frees per batch.
    pub remote_batch: usize,
    /// Transparent huge pages.
    pub huge_pages: bool,
    /// Skip the global lock while single-threaded.
    pub solo_unlocked: bool,
    /// Verbose output.
    pub verbose: bool,
}

impl Options {
    /// The defaults (what the table above lists).
    pub const DEFAULT: Options = Options {
        check: cfg!(debug_assertions),
        arena_gb: 128,
        retain_bytes: 64 << 20,
        decay_ms: 1000,
        heap_retain_pages: 2,
        remote_batch: 32,
        huge_pages: false,
        solo_unlocked: true,
        verbose: false,
    };

    /// Read the environment (without allocating).
    pub fn from_env() -> Options {
        let mut o = Options::DEFAULT;
        if let Some(v) = num(c"CANOPY_CHECK") {
            o.check = v != 0;
        }
        if let Some(v) = num(c"CANOPY_ARENA_GB") {
            o.arena_gb = v.clamp(1, 1 << 14);
        }
        if let Some(v) = num(c"CANOPY_RETAIN_MB") {
            o.retain_bytes = v.saturating_mul(1 << 20);
        }
        if let Some(v) = num(c"CANOPY_DECAY_MS") {
            o.decay_ms = v as u64;
        }
        if let Some(v) = num(c"CANOPY_HEAP_RETAIN_PAGES") {
            o.heap_retain_pages = v;
        }
        if let Some(v) = num(c"CANOPY_REMOTE_BATCH") {
            o.remote_batch = v.clamp(1, 1 << 20);
        }
        if let Some(v) = num(c"CANOPY_HUGE_PAGES") {
            o.huge_pages = v != 0;
        }
        if let Some(v) = num(c"CANOPY_SOLO_UNLOCKED") {
            o.solo_unlocked = v != 0;
        }
        if let Some(v) = num(c"CANOPY_VERBOSE") {
            o.verbose = v != 0;
        }
        o
    }
}

/// Parse a decimal environment variable; `None` if unset or not a number.
fn num(name: &core::ffi::CStr) -> Option<usize> {
    let bytes = getenv(name)?;
    parse_usize(bytes)
}

pub(crate) fn parse_usize(bytes: &[u8]) -> Option<usize> {
    if bytes.is_empty() {
        return None;
    }
    let mut v: usize = 0;
    for &b in bytes {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((b - b'0') as usize)?;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_decimals_only() {
        assert_eq!(parse_usize(b"0"), Some(0));
        assert_eq!(parse_usize(b"128"), Some(128));
        assert_eq!(parse_usize(b""), None);
        assert_eq!(parse_usize(b"12x"), None);
        assert_eq!(parse_usize(b"99999999999999999999999"), None);
    }
}
