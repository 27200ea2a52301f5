//! Options of the hierarchical heaps, read once from `CANOPY_HH_*`.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `CANOPY_HH_CHUNK_KB` | 64 | chunk size in KiB (a power of two, 8..=1024); objects larger than a quarter chunk get a chunk of their own |
//! | `CANOPY_HH_GC_MIN_KB` | 4096 | a task's heap is never collected below this size |
//! | `CANOPY_HH_GC_RATIO` | 2.0 | collect when the heap exceeds `max(min, (1 + ratio) x survived)`, survived = bytes after the last collection |
//! | `CANOPY_HH_VERIFY` | 0 (1 in debug builds) | run the heap verifier after every collection |
//! | `CANOPY_HH_GC` | 1 | 0 turns the collector off (heaps only grow; for measurements) |
//!
//! A value that is not a number, or is out of its range, is reported on
//! stderr when the options are first read, e.g. `canopy-hh:
//! CANOPY_HH_CHUNK_KB="100" is not a power of two from 8 to 1024; using 64`,
//! and the option keeps its default.  A `CANOPY_HH_` variable that is none
//! of these is reported too, with the option it probably meant.

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
        for (name, _) in std::env::vars_os() {
            if let Some(msg) = unknown_name(name.as_encoded_bytes()) {
                eprintln!("{msg}");
            }
        }
        Config::from_lookup(|name| std::env::var(name).ok(), |msg| eprintln!("{msg}"))
    }

    /// The options from `get` (the environment, or a test's table).  A
    /// value that is not a number or is out of range is reported through
    /// `warn` (the variable, its value, what is wrong, the value used) and
    /// the option keeps its default.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>, mut warn: impl FnMut(&str)) -> Config {
        let mut num = |name: &str, default: f64, ok: &dyn Fn(f64) -> bool, range: &str| -> f64 {
            let Some(raw) = get(name) else {
                return default;
            };
            match raw.trim().parse::<f64>() {
                Ok(v) if v.is_finite() && ok(v) => v,
                Ok(_) => {
                    warn(&format!("canopy-hh: {name}=\"{raw}\" is not {range}; using {default}"));
                    default
                }
                Err(_) => {
                    warn(&format!("canopy-hh: {name}=\"{raw}\" is not a number; using {default}"));
                    default
                }
            }
        };
        let kb = num(
            "CANOPY_HH_CHUNK_KB",
            64.0,
            &|v| v.fract() == 0.0 && (8.0..=1024.0).contains(&v) && (v as usize).is_power_of_two(),
            "a power of two from 8 to 1024",
        ) as usize;
        let gc_min_kb = num("CANOPY_HH_GC_MIN_KB", 4096.0, &|v| v >= 0.0, "zero or more");
        let gc_ratio = num("CANOPY_HH_GC_RATIO", 2.0, &|v| v >= 0.0, "zero or more");
        let verify = num(
            "CANOPY_HH_VERIFY",
            if cfg!(debug_assertions) { 1.0 } else { 0.0 },
            &|_| true,
            "a finite number",
        ) != 0.0;
        let gc = num("CANOPY_HH_GC", 1.0, &|_| true, "a finite number") != 0.0;
        Config {
            chunk_bytes: kb << 10,
            gc_min_bytes: (gc_min_kb as usize) << 10,
            gc_ratio,
            verify,
            gc,
        }
    }
}

/// Every `CANOPY_HH_` variable: the options above, and the switch the
/// entanglement test sets in its child process.
const NAMES: [&str; 6] = [
    "CANOPY_HH_CHUNK_KB",
    "CANOPY_HH_GC_MIN_KB",
    "CANOPY_HH_GC_RATIO",
    "CANOPY_HH_VERIFY",
    "CANOPY_HH_GC",
    "CANOPY_HH_ENTANGLE_CHILD",
];

/// The report for a variable `name` in the `CANOPY_HH_` namespace that is
/// none of [`NAMES`] (with the name it probably meant, if one is close);
/// `None` for any other name.
fn unknown_name(name: &[u8]) -> Option<String> {
    let meant = canopy_alloc::options::unknown_in_namespace(name, "CANOPY_HH_", &NAMES)?;
    let name_text = String::from_utf8_lossy(name);
    Some(match meant {
        Some(meant) => format!("canopy-hh: {name_text} is not an option and is ignored; did you mean {meant}?"),
        None => format!(
            "canopy-hh: {name_text} is not an option and is ignored (the options: {})",
            NAMES[..5].join(", ")
        ),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> (Config, Vec<String>) {
        let mut out = Vec::new();
        let c = Config::from_lookup(
            |name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()),
            |m| out.push(m.to_string()),
        );
        (c, out)
    }

    #[test]
    fn unknown_names_in_the_namespace_are_reported() {
        assert_eq!(
            unknown_name(b"CANOPY_HH_GC_RATO").as_deref(),
            Some("canopy-hh: CANOPY_HH_GC_RATO is not an option and is ignored; did you mean CANOPY_HH_GC_RATIO?")
        );
        let far = unknown_name(b"CANOPY_HH_THREADS").unwrap();
        assert!(far.starts_with("canopy-hh: CANOPY_HH_THREADS is not an option and is ignored (the options: CANOPY_HH_CHUNK_KB,"), "{far}");
        for ok in ["CANOPY_HH_GC", "CANOPY_HH_ENTANGLE_CHILD", "CANOPY_CHECK", "CANOPY_HHX", "PATH"] {
            assert_eq!(unknown_name(ok.as_bytes()), None, "{ok}");
        }
    }

    #[test]
    fn good_values_are_taken_silently() {
        let (c, out) = read(&[
            ("CANOPY_HH_CHUNK_KB", "256"),
            ("CANOPY_HH_GC_MIN_KB", "0"),
            ("CANOPY_HH_GC_RATIO", " 0.5 "),
            ("CANOPY_HH_VERIFY", "1"),
            ("CANOPY_HH_GC", "0"),
        ]);
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(c.chunk_bytes, 256 << 10);
        assert_eq!(c.gc_min_bytes, 0);
        assert_eq!(c.gc_ratio, 0.5);
        assert!(c.verify);
        assert!(!c.gc);
    }

    #[test]
    fn bad_values_are_reported_and_keep_the_defaults() {
        let (c, out) = read(&[
            ("CANOPY_HH_CHUNK_KB", "100"),
            ("CANOPY_HH_GC_MIN_KB", "-5"),
            ("CANOPY_HH_GC_RATIO", "fast"),
            ("CANOPY_HH_GC", "off"),
        ]);
        assert_eq!(c.chunk_bytes, 64 << 10);
        assert_eq!(c.gc_min_bytes, 4096 << 10);
        assert_eq!(c.gc_ratio, 2.0);
        assert!(c.gc);
        assert_eq!(
            out,
            [
                "canopy-hh: CANOPY_HH_CHUNK_KB=\"100\" is not a power of two from 8 to 1024; using 64",
                "canopy-hh: CANOPY_HH_GC_MIN_KB=\"-5\" is not zero or more; using 4096",
                "canopy-hh: CANOPY_HH_GC_RATIO=\"fast\" is not a number; using 2",
                "canopy-hh: CANOPY_HH_GC=\"off\" is not a number; using 1",
            ]
        );
        let (c, out) = read(&[("CANOPY_HH_GC", "inf")]);
        assert!(c.gc);
        assert_eq!(out, ["canopy-hh: CANOPY_HH_GC=\"inf\" is not a finite number; using 1"]);
        let (c, out) = read(&[("CANOPY_HH_CHUNK_KB", "2048")]);
        assert_eq!(c.chunk_bytes, 64 << 10);
        assert_eq!(out.len(), 1, "{out:?}");
    }
}
