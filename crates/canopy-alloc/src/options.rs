//! Every tunable of the allocator, read once from `CANOPY_*` environment
//! variables when the allocator starts.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `CANOPY_CHECK` | 0 (1 in debug builds) | check mode: every free is validated precisely; a double free or a foreign pointer is reported with the pointer and the call, then the process aborts |
//! | `CANOPY_ARENA_GB` | 128 | address space reserved for the heap (GiB); halved until the OS grants it; under a limit on address space (`ulimit -v`) the most the arena grows to, with the limit |
//! | `CANOPY_ARENA_GROW` | 0 | start the arena at 4 MiB and grow it as needed, giving the free top's addresses back, as under a limit on address space, even without one (only what is used is reserved; a later `setrlimit(RLIMIT_AS)` then leaves room for other mappings) |
//! | `CANOPY_RETAIN_MB` | 64 | free memory the global heap keeps committed; what is above it for `CANOPY_DECAY_MS` is decommitted (largest spans first) down to half of it |
//! | `CANOPY_DECAY_MS` | 1000 | how long free memory may stay above `CANOPY_RETAIN_MB` before it is decommitted (0: at once); a program that frees and allocates the same memory again within that time keeps it committed |
//! | `CANOPY_HEAP_RETAIN_PAGES` | 2 | fully free 1 MiB pages a thread heap keeps before giving them back to the global heap |
//! | `CANOPY_LARGE_CACHE_KB` | 4096 | freed large chunks of up to 1 MiB a thread keeps for its next large requests of the same size, without the global lock (0: none); at most `CANOPY_RETAIN_MB` divided by the threads with heaps |
//! | `CANOPY_KEEP_KB` | 16 | blocks a thread frees that it keeps for its own next allocations of the same size class, per class: its own heap's, and other threads' where they are whole cache lines (multiples of 64 bytes) (0: none; at least one block of each); the rest go into their slabs or home in batches |
//! | `CANOPY_REMOTE_BATCH` | 32 | frees to another thread's memory collected per destination before one swap sends them (at most 1021, the pointers a batch block holds) |
//! | `CANOPY_HUGE_PAGES` | 0 | ask for transparent huge pages on the arena |
//! | `CANOPY_SOLO_UNLOCKED` | 1 | the global heap takes no lock while only one thread has a heap (if Canopy started in a process with one thread: `solo::init`) |
//! | `CANOPY_VERBOSE` | 0 | print the statistics table to stderr at exit (and warnings about bad frees in the default mode) |
//!
//! A variable set to something that is not a decimal number, or to a number
//! out of its range, is reported on stderr when the allocator starts, e.g.
//! `canopy: CANOPY_ARENA_GB="abc" is not a decimal number; using 128`; the
//! option keeps its default, or the nearest bound.  Switches take 0 (off) or
//! any other number (on).
//! A `CANOPY_` variable that is not one of these but one or two typing slips
//! from one (`CANOPY_CHEK`) is reported with the name it probably meant; other
//! `CANOPY_` names (other layers', a program's own) are left alone.

use canopy_sys::getenv;

/// The options in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Check mode.
    pub check: bool,
    /// Arena reservation in GiB.
    pub arena_gb: usize,
    /// Grow the arena (as under `ulimit -v`) even without a limit.
    pub arena_grow: bool,
    /// Committed free memory the global heap keeps, in bytes.
    pub retain_bytes: usize,
    /// Delay before committed free memory above `retain_bytes` is decommitted, in ms.
    pub decay_ms: u64,
    /// Free pages a thread heap keeps.
    pub heap_retain_pages: usize,
    /// Bytes of freed large chunks a thread keeps (its large cache).
    pub large_cache_bytes: usize,
    /// Bytes of other threads' freed blocks a thread keeps per size class.
    pub keep_bytes: usize,
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
        arena_grow: false,
        retain_bytes: 64 << 20,
        decay_ms: 1000,
        heap_retain_pages: 2,
        large_cache_bytes: 4 << 20,
        keep_bytes: 16 << 10,
        remote_batch: 32,
        huge_pages: false,
        solo_unlocked: true,
        verbose: false,
    };

    /// Read the environment (without allocating).  A value that is not a
    /// decimal number, or is out of range, is reported on stderr with the
    /// value used instead (see [`Options::from_lookup`]).
    pub fn from_env() -> Options {
        canopy_sys::for_each_env(|entry| report_misspelling(entry, &mut canopy_sys::write_stderr));
        Options::from_lookup(getenv, canopy_sys::write_stderr)
    }

    /// The options from `get` (the environment, or a test's table).  Each
    /// variable set to something that is not a decimal number, or to a
    /// number out of its range, is reported through `warn` (one line naming
    /// the variable, its value and the value used) and the option keeps its
    /// default or is clamped.  Never allocates.
    pub fn from_lookup<'v>(
        get: impl Fn(&core::ffi::CStr) -> Option<&'v [u8]>,
        mut warn: impl FnMut(&[u8]),
    ) -> Options {
        let d = Options::DEFAULT;
        let mut r = Reader { get: &get, warn: &mut warn };
        Options {
            check: r.flag(canopy_sys::hot_cstr!("CANOPY_CHECK"), d.check),
            arena_gb: r.num(canopy_sys::hot_cstr!("CANOPY_ARENA_GB"), d.arena_gb, 1, 1 << 14, ""),
            arena_grow: r.flag(canopy_sys::hot_cstr!("CANOPY_ARENA_GROW"), d.arena_grow),
            retain_bytes: r
                .num(canopy_sys::hot_cstr!("CANOPY_RETAIN_MB"), d.retain_bytes >> 20, 0, usize::MAX >> 20, "")
                << 20,
            decay_ms: r.num(canopy_sys::hot_cstr!("CANOPY_DECAY_MS"), d.decay_ms as usize, 0, usize::MAX, "") as u64,
            heap_retain_pages: r.num(canopy_sys::hot_cstr!("CANOPY_HEAP_RETAIN_PAGES"), d.heap_retain_pages, 0, usize::MAX, ""),
            large_cache_bytes: r
                .num(canopy_sys::hot_cstr!("CANOPY_LARGE_CACHE_KB"), d.large_cache_bytes >> 10, 0, usize::MAX >> 10, "")
                << 10,
            keep_bytes: r.num(canopy_sys::hot_cstr!("CANOPY_KEEP_KB"), d.keep_bytes >> 10, 0, 1024, "") << 10,
            remote_batch: r.num(
                canopy_sys::hot_cstr!("CANOPY_REMOTE_BATCH"),
                d.remote_batch,
                1,
                crate::heap::MAX_BATCH,
                " (the pointers a batch block holds)",
            ),
            huge_pages: r.flag(canopy_sys::hot_cstr!("CANOPY_HUGE_PAGES"), d.huge_pages),
            solo_unlocked: r.flag(canopy_sys::hot_cstr!("CANOPY_SOLO_UNLOCKED"), d.solo_unlocked),
            verbose: r.flag(canopy_sys::hot_cstr!("CANOPY_VERBOSE"), d.verbose),
        }
    }
}

/// The allocator's variables (the table above).
const NAMES: [&str; 12] = [
    "CANOPY_CHECK",
    "CANOPY_ARENA_GB",
    "CANOPY_ARENA_GROW",
    "CANOPY_RETAIN_MB",
    "CANOPY_DECAY_MS",
    "CANOPY_HEAP_RETAIN_PAGES",
    "CANOPY_LARGE_CACHE_KB",
    "CANOPY_KEEP_KB",
    "CANOPY_REMOTE_BATCH",
    "CANOPY_HUGE_PAGES",
    "CANOPY_SOLO_UNLOCKED",
    "CANOPY_VERBOSE",
];

/// Prefixes of the other layers' variables, never taken for misspellings.
const OTHER_LAYERS: [&str; 3] = ["CANOPY_HH_", "CANOPY_RC_", "CANOPY_REGION_"];

/// If the environment entry `entry` (`NAME=value`) is a `CANOPY_` variable
/// that is not one of the allocator's but is one or two typing slips away
/// from one (`CANOPY_CHEK`, `CANOPY_VERBOS`, `CANOPY_ARENA_GIB`), report it
/// through `warn` with the name it probably meant: such a variable would
/// otherwise be ignored without a word.  Other `CANOPY_` names (other
/// layers', the test harness's, a program's own) are left alone.
pub fn report_misspelling(entry: &[u8], warn: &mut impl FnMut(&[u8])) {
    let name = entry.split(|&b| b == b'=').next().unwrap_or(entry);
    if !name.starts_with(b"CANOPY_")
        || NAMES.iter().any(|n| n.as_bytes() == name)
        || OTHER_LAYERS.iter().any(|p| name.starts_with(p.as_bytes()))
    {
        return;
    }
    if let Some(meant) = nearest_name(name, 7, &NAMES) {
        let mut b = crate::report::Buf::new();
        b.str("canopy: ")
            .bytes(&name[..name.len().min(64)])
            .str(" is not an option of the allocator and is ignored; did you mean ")
            .str(meant)
            .str("?\n");
        warn(b.as_bytes());
    }
}

/// The name of `known` that `name` is most likely a misspelling of: the
/// nearest by edit distance, comparing what follows the first `skip` bytes
/// (a shared prefix such as `CANOPY_`), if it is one typing slip away (two
/// when that part has six bytes or more).  `None` for a name in `known` or
/// far from all of them.  For the other layers' checks of their own
/// variables, too.  Never allocates.
pub fn nearest_name<'k>(name: &[u8], skip: usize, known: &[&'k str]) -> Option<&'k str> {
    let tail = name.get(skip..)?;
    let (d, best) = known
        .iter()
        .filter_map(|k| Some((edit_distance(tail, k.as_bytes().get(skip..)?), *k)))
        .min_by_key(|(d, _)| *d)?;
    (d > 0 && d <= if tail.len() >= 6 { 2 } else { 1 }).then_some(best)
}

/// For a layer's check of its own namespace (`prefix`, such as
/// `CANOPY_HH_`): `None` if `name` is outside it or one of `known`;
/// otherwise `Some` of the name it probably meant (see [`nearest_name`]),
/// if one is close.  Never allocates.
pub fn unknown_in_namespace<'k>(name: &[u8], prefix: &str, known: &[&'k str]) -> Option<Option<&'k str>> {
    if !name.starts_with(prefix.as_bytes()) || known.iter().any(|k| k.as_bytes() == name) {
        return None;
    }
    Some(nearest_name(name, prefix.len(), known))
}

/// Edit distance (insertions, deletions, substitutions and swaps of two
/// neighbours, each 1) between two names, without allocating; names longer
/// than 31 bytes count as far from everything.
fn edit_distance(a: &[u8], b: &[u8]) -> usize {
    const M: usize = 32;
    if a.len() >= M || b.len() >= M {
        return usize::MAX;
    }
    // Three rows of the table: i - 2, i - 1 and i.
    let mut rows = [[0usize; M]; 3];
    for (j, c) in rows[0].iter_mut().enumerate().take(b.len() + 1) {
        *c = j;
    }
    for i in 1..=a.len() {
        let (cur, prev, prev2) = (i % 3, (i + 2) % 3, (i + 1) % 3);
        rows[cur][0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (rows[prev][j] + 1).min(rows[cur][j - 1] + 1).min(rows[prev][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(rows[prev2][j - 2] + 1);
            }
            rows[cur][j] = v;
        }
    }
    rows[a.len() % 3][b.len()]
}

/// Reads variables for [`Options::from_lookup`] and reports bad values.
struct Reader<'a, G, W> {
    get: &'a G,
    warn: &'a mut W,
}

impl<'v, G: Fn(&core::ffi::CStr) -> Option<&'v [u8]>, W: FnMut(&[u8])> Reader<'_, G, W> {
    /// A number in `lo..=hi`: the default if unset or not a number, the
    /// nearest bound if outside (both reported).
    fn num(&mut self, name: &core::ffi::CStr, default: usize, lo: usize, hi: usize, why: &str) -> usize {
        let Some(raw) = (self.get)(name) else {
            return default;
        };
        match parse_usize(raw) {
            None => {
                self.report(name, raw, "is not a decimal number", None, default);
                default
            }
            Some(v) if v < lo => {
                self.report(name, raw, "is below the minimum", Some((lo, "")), lo);
                lo
            }
            Some(v) if v > hi => {
                self.report(name, raw, "is above the maximum", Some((hi, why)), hi);
                hi
            }
            Some(v) => v,
        }
    }

    /// A switch: 0 is off, any other number on; anything else keeps the
    /// default (reported).
    fn flag(&mut self, name: &core::ffi::CStr, default: bool) -> bool {
        let Some(raw) = (self.get)(name) else {
            return default;
        };
        match parse_usize(raw) {
            Some(v) => v != 0,
            None => {
                self.report(name, raw, "is not 0 or 1", None, default as usize);
                default
            }
        }
    }

    /// One line: the variable, its value (cut at 64 bytes), what is wrong
    /// with it (and the bound it crossed, with why that bound), the value used.
    fn report(
        &mut self,
        name: &core::ffi::CStr,
        raw: &[u8],
        what: &str,
        bound: Option<(usize, &str)>,
        used: usize,
    ) {
        let mut b = crate::report::Buf::new();
        b.str("canopy: ")
            .bytes(name.to_bytes())
            .str("=\"")
            .bytes(&raw[..raw.len().min(64)])
            .str(if raw.len() > 64 { "...\" " } else { "\" " })
            .str(what);
        if let Some((v, why)) = bound {
            b.str(" ").dec(v).str(why);
        }
        b.str("; using ").dec(used).str("\n");
        (self.warn)(b.as_bytes());
    }
}

/// Parse a decimal number; `None` if empty, not all digits, or too large.
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

    /// The options read from `vars`, and the warnings printed.
    fn read(vars: &[(&str, &str)]) -> (Options, String) {
        let mut out = String::new();
        let o = Options::from_lookup(
            |name| {
                vars.iter()
                    .find(|(n, _)| n.as_bytes() == name.to_bytes())
                    .map(|(_, v)| v.as_bytes())
            },
            |msg| out.push_str(core::str::from_utf8(msg).unwrap()),
        );
        (o, out)
    }

    #[test]
    fn unset_variables_give_the_defaults_silently() {
        assert_eq!(read(&[]), (Options::DEFAULT, String::new()));
    }

    #[test]
    fn good_values_are_taken_silently() {
        let (o, out) = read(&[
            ("CANOPY_CHECK", "1"),
            ("CANOPY_ARENA_GB", "16"),
            ("CANOPY_ARENA_GROW", "1"),
            ("CANOPY_RETAIN_MB", "8"),
            ("CANOPY_DECAY_MS", "0"),
            ("CANOPY_HEAP_RETAIN_PAGES", "5"),
            ("CANOPY_LARGE_CACHE_KB", "0"),
            ("CANOPY_KEEP_KB", "16"),
            ("CANOPY_REMOTE_BATCH", "128"),
            ("CANOPY_HUGE_PAGES", "1"),
            ("CANOPY_SOLO_UNLOCKED", "0"),
            ("CANOPY_VERBOSE", "2"),
        ]);
        assert_eq!(out, "");
        let want = Options {
            check: true,
            arena_gb: 16,
            arena_grow: true,
            retain_bytes: 8 << 20,
            decay_ms: 0,
            heap_retain_pages: 5,
            large_cache_bytes: 0,
            keep_bytes: 16 << 10,
            remote_batch: 128,
            huge_pages: true,
            solo_unlocked: false,
            verbose: true,
        };
        assert_eq!(o, want);
    }

    #[test]
    fn bad_values_are_reported_with_the_value_used() {
        let (o, out) = read(&[
            ("CANOPY_ARENA_GB", "abc"),
            ("CANOPY_CHECK", "yes"),
            ("CANOPY_REMOTE_BATCH", "0"),
            ("CANOPY_HEAP_RETAIN_PAGES", "-1"),
        ]);
        assert_eq!(o.arena_gb, Options::DEFAULT.arena_gb);
        assert_eq!(o.check, Options::DEFAULT.check);
        assert_eq!(o.remote_batch, 1);
        assert_eq!(o.heap_retain_pages, Options::DEFAULT.heap_retain_pages);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "canopy: CANOPY_CHECK=\"yes\" is not 0 or 1; using ".to_string()
                    + if Options::DEFAULT.check { "1" } else { "0" },
                "canopy: CANOPY_ARENA_GB=\"abc\" is not a decimal number; using 128".into(),
                "canopy: CANOPY_HEAP_RETAIN_PAGES=\"-1\" is not a decimal number; using 2".into(),
                "canopy: CANOPY_REMOTE_BATCH=\"0\" is below the minimum 1; using 1".into(),
            ]
        );
    }

    #[test]
    fn out_of_range_values_are_clamped_and_reported() {
        let (o, out) = read(&[("CANOPY_ARENA_GB", "100000000"), ("CANOPY_REMOTE_BATCH", "5000")]);
        assert_eq!(o.arena_gb, 1 << 14);
        assert_eq!(o.remote_batch, crate::heap::MAX_BATCH);
        assert_eq!(
            out,
            format!(
                "canopy: CANOPY_ARENA_GB=\"100000000\" is above the maximum 16384; using 16384\n\
                 canopy: CANOPY_REMOTE_BATCH=\"5000\" is above the maximum {m} (the pointers a batch \
                 block holds); using {m}\n",
                m = crate::heap::MAX_BATCH
            )
        );
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance(b"CHECK", b"CHECK"), 0);
        assert_eq!(edit_distance(b"CHEK", b"CHECK"), 1);
        assert_eq!(edit_distance(b"CHCEK", b"CHECK"), 1);
        assert_eq!(edit_distance(b"ARENA_GIB", b"ARENA_GB"), 1);
        assert_eq!(edit_distance(b"", b"ABC"), 3);
        assert_eq!(edit_distance(b"KITTEN", b"SITTING"), 3);
        assert_eq!(edit_distance(&[b'A'; 40], b"A"), usize::MAX);
    }

    fn misspelling(entry: &str) -> String {
        let mut out = String::new();
        report_misspelling(entry.as_bytes(), &mut |m: &[u8]| {
            out.push_str(core::str::from_utf8(m).unwrap())
        });
        out
    }

    #[test]
    fn near_misses_of_option_names_are_reported() {
        assert_eq!(
            misspelling("CANOPY_CHEK=1"),
            "canopy: CANOPY_CHEK is not an option of the allocator and is ignored; did you mean CANOPY_CHECK?\n"
        );
        assert!(misspelling("CANOPY_VERBOS=1").ends_with("did you mean CANOPY_VERBOSE?\n"));
        assert!(misspelling("CANOPY_ARENA_GIB=4").ends_with("did you mean CANOPY_ARENA_GB?\n"));
        assert!(misspelling("CANOPY_REMOTE_BATHC=8").ends_with("did you mean CANOPY_REMOTE_BATCH?\n"));
    }

    #[test]
    fn nearest_names() {
        let known = ["CANOPY_HH_GC", "CANOPY_HH_GC_RATIO", "CANOPY_HH_CHUNK_KB"];
        assert_eq!(nearest_name(b"CANOPY_HH_GC_RATO", 10, &known), Some("CANOPY_HH_GC_RATIO"));
        assert_eq!(nearest_name(b"CANOPY_HH_CG", 10, &known), Some("CANOPY_HH_GC"));
        assert_eq!(nearest_name(b"CANOPY_HH_GC", 10, &known), None);
        assert_eq!(nearest_name(b"CANOPY_HH_VERBOSE", 10, &known), None);
        assert_eq!(nearest_name(b"CANOPY", 10, &known), None);
    }

    #[test]
    fn other_canopy_names_are_left_alone() {
        for e in [
            "CANOPY_CHECK=1",
            "CANOPY_VERBOSE=1",
            "CANOPY_HH_GC=0",
            "CANOPY_HH_CHECK=1",
            "CANOPY_RC_COUNTERS=2",
            "CANOPY_REGION_SLAB=64K",
            "CANOPY_STRESS_SCALE=20",
            "CANOPY_PROPTEST_CASES=2000",
            "CANOPY_MALLOC_LIB=/x",
            "CANOPY_BENCH_CACHE=/y",
            "CANOPY_SAC_RS_DIR=/z",
            "CANOPY_TEST_VAR=1",
            "CANOPY_X=1",
            "CANOPY_=1",
            "CANOPY",
            "PATH=/bin",
        ] {
            assert_eq!(misspelling(e), "", "{e}");
        }
    }

    #[test]
    fn unknown_names_in_a_layers_namespace() {
        let known = ["CANOPY_XY_SPEED", "CANOPY_XY_DEPTH"];
        assert_eq!(unknown_in_namespace(b"CANOPY_XY_SPEED", "CANOPY_XY_", &known), None);
        assert_eq!(unknown_in_namespace(b"CANOPY_CHECK", "CANOPY_XY_", &known), None);
        assert_eq!(unknown_in_namespace(b"CANOPY_XY_SPED", "CANOPY_XY_", &known), Some(Some("CANOPY_XY_SPEED")));
        assert_eq!(unknown_in_namespace(b"CANOPY_XY_COLOUR", "CANOPY_XY_", &known), Some(None));
    }

    #[test]
    fn a_long_value_is_cut_in_the_report() {
        let long = "9".repeat(300);
        let (o, out) = read(&[("CANOPY_DECAY_MS", &long)]);
        assert_eq!(o.decay_ms, Options::DEFAULT.decay_ms);
        assert!(out.starts_with(&format!("canopy: CANOPY_DECAY_MS=\"{}...\" is not a decimal number", &long[..64])), "{out}");
        assert!(out.ends_with("; using 1000\n"), "{out}");
    }
}
