//! The experiments.  Each one runs its programs on every contender, runs the
//! contenders interleaved so that a change in machine load hits all of them
//! alike, with the order turned by one each repetition (A B C, B C A, C A B:
//! [`rotated`]) so that no contender always runs right after the same other
//! one, takes medians, and writes `results/<name>.{json,md,svg}`.
//!
//! | experiment | what | paper |
//! |---|---|---|
//! | [`sac`] | the with-loop microbenchmark, X = 1000/250/100/25, 1..n threads | 000 Figs. 1, 5, 6 |
//! | [`sac_callgrind`] | instructions per malloc+free pair in the same kernel | 000 |
//! | [`workloads`] | Larson, producer/consumer, false sharing, size walk, thread churn, mixed sizes, phases | — |
//! | [`in_process`] | the same allocators loaded into one process, small-block loops and Larson in alternating bursts | — |
//! | [`region_frag`] | random allocate/free in one region: requested bytes vs. full and partial slabs | 002 §6.2, Fig. 4a-c |
//! | [`region_speed`] | allocate/free in a region and free a whole region, vs. malloc, bumpalo, typed-arena, slab | 002 §4.3 |
//! | [`region_pack`] | packing a 30,000-node list and a per-level-region oct-tree into runs | 002 §4.3, §6.3 |
//! | [`rc`] | canopy-rc: SAC on `Array`, the synthetic RC kernel, 2-D FFT, reuse accuracy | 000 Fig. 1, 003 |
//! | [`hh_suite`] | primes, msort-int64, tokens, mcss, linefit, sparse-mxv, wc, fib, nqueens: sequential vs rayon vs canopy-hh | 004 §5, Figs. 6, 9, 10 |

use std::path::PathBuf;
use std::time::Duration;

use crate::anchors::{Contender, Contenders};
use crate::report::{RunRecord, Size, Written};
use crate::runner::{self, Invocation};

pub mod hh_suite;
pub mod in_process;
pub mod region;
pub mod region_frag;
pub mod region_pack;
pub mod region_speed;
pub mod rc;
pub mod sac;
pub mod sac_callgrind;
pub mod workloads;

/// Settings every experiment shares.
#[derive(Debug, Clone)]
pub struct Common {
    /// Problem size.
    pub size: Size,
    /// Repetitions per configuration (`None`: the size's default).
    pub runs: Option<usize>,
    /// Where results go.
    pub results_dir: PathBuf,
    /// The allocators to compare.
    pub contenders: Contenders,
    /// Kill a benchmark child after this long.
    pub timeout: Duration,
    /// Install missing Debian packages (anchors, valgrind) when root.
    pub install: bool,
}

impl Common {
    /// Repetitions per configuration.
    pub fn runs(&self) -> usize {
        self.runs.unwrap_or_else(|| self.size.default_runs()).max(1)
    }
}

/// What a finished experiment leaves for the caller.
#[derive(Debug, Clone)]
pub struct Finished {
    /// Experiment name.
    pub name: String,
    /// The Markdown report (also in `written.markdown`).
    pub markdown: String,
    /// Files written.
    pub written: Written,
    /// One message per failed run (checksum mismatch, crash, timeout, ...).
    pub failures: Vec<String>,
}

/// Run one invocation and turn it into a record (never fails: a child that
/// cannot be started becomes a failed record).
pub fn measure(
    inv: &Invocation,
    config: &str,
    variant: &str,
    contender: &Contender,
    rep: usize,
) -> RunRecord {
    match runner::run(inv) {
        Ok(out) => RunRecord::from_outcome(config, variant, contender, rep, inv, &out),
        Err(e) => RunRecord::spawn_failure(config, variant, contender, rep, inv, &e),
    }
}

/// The items of `v` starting at `rep % len` and wrapping around: the order
/// of repetition `rep`.  (With a fixed order, Canopy ran right after glibc in
/// every run of `workloads` and `sac`, so whatever glibc's runs left behind,
/// such as the 0.15-0.2 s of false sharing of its cache-scratch, fell on
/// Canopy's alone.)
pub fn rotated<T>(v: &[T], rep: usize) -> impl Iterator<Item = &T> {
    let n = v.len();
    (0..n).map(move |j| &v[(j + rep) % n])
}

/// The error messages of the failed runs, in run order.
pub fn failures_of(runs: &[RunRecord]) -> Vec<String> {
    runs.iter()
        .filter(|r| !r.ok)
        .filter_map(|r| r.error.clone())
        .collect()
}

/// Markdown lines describing the contenders and skipped ones.
pub fn contenders_markdown(c: &Contenders) -> String {
    let mut s = String::from("Contenders: ");
    let names: Vec<String> = c
        .list
        .iter()
        .map(|x| match &x.version {
            Some(v) => format!("`{}` ({v})", x.name),
            None => format!("`{}`", x.name),
        })
        .collect();
    s.push_str(&names.join(", "));
    s.push_str(".\n");
    for k in &c.skipped {
        s.push_str(&format!("\n> Skipped: {k}\n"));
    }
    s
}

/// A Markdown section listing failures (empty when there are none).
pub fn failures_markdown(failures: &[String]) -> String {
    if failures.is_empty() {
        return String::new();
    }
    let mut s = format!("\n## Failures ({})\n\n", failures.len());
    for f in failures {
        s.push_str("- ");
        s.push_str(&f.replace('\n', "\n  "));
        s.push('\n');
    }
    s
}

/// The Markdown header shared by the experiments' reports.
pub fn machine_markdown(m: &crate::report::Machine) -> String {
    format!(
        "Machine: {} CPUs ({}), {}, load {}; {} UTC; commit {}.\n",
        m.nproc,
        m.cpu.as_deref().unwrap_or("unknown CPU"),
        m.kernel,
        m.loadavg.map_or_else(|| "?".into(), |l| format!("{l:.2}")),
        m.date,
        m.git_commit.as_deref().unwrap_or("none")
    )
}

#[cfg(test)]
mod rotation_tests {
    use super::rotated;

    #[test]
    fn every_repetition_has_every_item_once_and_each_leads_in_turn() {
        let v = ["a", "b", "c"];
        let orders: Vec<Vec<&str>> = (0..4).map(|r| rotated(&v, r).copied().collect()).collect();
        assert_eq!(orders[0], ["a", "b", "c"]);
        assert_eq!(orders[1], ["b", "c", "a"]);
        assert_eq!(orders[2], ["c", "a", "b"]);
        assert_eq!(orders[3], orders[0]);
        let empty: [u8; 0] = [];
        assert_eq!(rotated(&empty, 3).count(), 0);
    }
}
