//! `sac-callgrind`: instructions per malloc+free pair in the SAC kernel,
//! counted by valgrind's callgrind.
//!
//! Instruction counts of a single-threaded run are repeatable, unlike times on
//! a shared machine.  Each variant runs once in its allocating mode and once
//! in `bound` mode on the same allocator and binary; the difference divided
//! by the number of pairs is the cost of one malloc+free pair, start-up and
//! compute cancelling out:
//!
//! `instructions per pair = (Ir(mode) - Ir(bound)) / pairs`
//!
//! N is chosen per X so that every X performs the same number of pairs.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Result;
use serde::Serialize;
use serde_json::json;

use super::sac::{variants, Variant};
use super::{
    contenders_markdown, failures_markdown, failures_of, machine_markdown, measure, Common,
    Finished,
};
use crate::artifacts::ScratchDir;
use crate::parse::callgrind_total_ir;
use crate::plot::{BarChart, Group, Panel};
use crate::report::{self, Machine, Report, RunRecord, Size, Table};
use crate::runner::Invocation;
use crate::sac_kernel::expected_checksum;
use crate::stats;

/// Options of the `sac-callgrind` experiment.
#[derive(Debug, Clone)]
pub struct CallgrindOptions {
    /// Temporary lengths X.
    pub xs: Vec<usize>,
    /// Override the number of pairs per run.
    pub pairs: Option<usize>,
    /// Include the Rust kernel.
    pub rust: bool,
    /// Parallel valgrind jobs (counts do not depend on it).
    pub jobs: usize,
}

impl Default for CallgrindOptions {
    fn default() -> Self {
        CallgrindOptions {
            xs: super::sac::PAPER_XS.to_vec(),
            pairs: None,
            rust: true,
            jobs: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
        }
    }
}

/// (pairs per run, iterations) for a size.
pub fn problem_size(size: Size) -> (usize, usize) {
    match size {
        Size::Quick => (10_000, 2),
        Size::Default => (50_000, 3),
        Size::Paper => (200_000, 5),
    }
}

/// Where valgrind is, if installed.
pub fn find_valgrind() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.push(PathBuf::from("/usr/bin"));
    dirs.into_iter()
        .map(|d| d.join("valgrind"))
        .find(|p| p.is_file())
}

/// One row of the summary.
#[derive(Debug, Clone, Serialize)]
pub struct CallgrindRow {
    /// Temporary length.
    pub x: usize,
    /// Variant label.
    pub variant: String,
    /// N used for this X.
    pub n: usize,
    /// Pairs performed.
    pub pairs: u64,
    /// Instructions of the allocating run.
    pub ir_mode: Option<u64>,
    /// Instructions of the bound run.
    pub ir_bound: Option<u64>,
    /// (ir_mode - ir_bound) / pairs.
    pub instructions_per_pair: Option<f64>,
}

/// The derived numbers.
#[derive(Debug, Clone, Serialize)]
pub struct CallgrindSummary {
    /// Iterations.
    pub iters: usize,
    /// One row per (X, variant).
    pub rows: Vec<CallgrindRow>,
    /// Set when valgrind was not available.
    pub skipped: Option<String>,
}

struct Job {
    x: usize,
    variant: String,
    is_bound: bool,
    inv: Invocation,
    contender: crate::anchors::Contender,
    expected: u64,
    out_file: PathBuf,
}

/// Run the experiment.
pub fn run(common: &Common, opts: &CallgrindOptions) -> Result<Finished> {
    let machine = Machine::describe();
    let (def_pairs, iters) = problem_size(common.size);
    let pairs = opts.pairs.unwrap_or(def_pairs).max(1);
    let n_for = |x: usize| (pairs * x).div_ceil(iters);
    let mut markdown = format!(
        "# SAC kernel under callgrind: instructions per malloc+free pair (paper 000)\n\n\
         Single-threaded SAC kernel, {pairs} pairs per run ({iters} iterations, N = pairs·X/iterations), counted by \
         valgrind's callgrind. Per pair = (Ir(mode) − Ir(bound)) / pairs, with the bound run on the same allocator and binary, \
         so start-up and the fill/sum work cancel out. Counts are repeatable: one run each.\n\n"
    );
    markdown.push_str(&machine_markdown(&machine));
    markdown.push('\n');

    if find_valgrind().is_none() && common.install {
        // Debian's valgrind, like the anchors: installed when we may.
        if let Err(e) = crate::anchors::apt_install(&["valgrind"]) {
            eprintln!("warning: {e}");
        }
    }
    let Some(valgrind) = find_valgrind() else {
        let why =
            "valgrind not found: install it (`apt-get install valgrind`) to run this experiment"
                .to_string();
        eprintln!("warning: {why}; skipping sac-callgrind");
        markdown.push_str(&format!("\n**Skipped:** {why}.\n"));
        let report = Report {
            experiment: "sac-callgrind".into(),
            title: "SAC kernel: instructions per malloc+free pair (callgrind)".into(),
            paper: "000 Grelck & Scholz".into(),
            size: common.size,
            params: json!({ "pairs": pairs, "iters": iters, "xs": opts.xs }),
            machine,
            contenders: common.contenders.list.clone(),
            skipped: vec![why.clone()],
            summary: CallgrindSummary {
                iters,
                rows: Vec::new(),
                skipped: Some(why),
            },
            runs: Vec::new(),
            failures: Vec::new(),
        };
        let written = report::write_all(&common.results_dir, &report, &markdown, None)?;
        return Ok(Finished {
            name: "sac-callgrind".into(),
            markdown,
            written,
            failures: Vec::new(),
        });
    };

    let (vars, notes) = variants(common, opts.rust, false)?;
    for n in &notes {
        eprintln!("warning: {n}");
    }
    let scratch = ScratchDir::new(&common.results_dir, "callgrind")?;
    let mut jobs = Vec::new();
    for &x in &opts.xs {
        let n = n_for(x);
        let expected = expected_checksum(x as u64, n as u64, iters as u64);
        for v in &vars {
            for is_bound in [false, true] {
                let mut inv = v.invocation(x, n, iters, 1, common.timeout);
                if is_bound {
                    inv.args[0] = "bound".into();
                }
                let out_file = scratch.path().join(format!("{}.out", jobs.len()));
                inv.wrapper = wrapper(&valgrind, &out_file);
                jobs.push(Job {
                    x,
                    variant: v.label.clone(),
                    is_bound,
                    inv,
                    contender: v.contender.clone(),
                    expected,
                    out_file,
                });
            }
        }
    }

    let pb = crate::progress::bar(jobs.len() as u64, "sac-callgrind");
    let results: Mutex<Vec<(usize, RunRecord)>> = Mutex::new(Vec::new());
    let next = Mutex::new(0usize);
    std::thread::scope(|s| {
        for _ in 0..opts.jobs.max(1) {
            s.spawn(|| loop {
                let i = {
                    let mut g = next.lock().unwrap_or_else(|e| e.into_inner());
                    let i = *g;
                    *g += 1;
                    i
                };
                let Some(job) = jobs.get(i) else { break };
                let label = if job.is_bound {
                    format!("{} (bound)", job.variant)
                } else {
                    job.variant.clone()
                };
                pb.set_message(format!("X={} {label}", job.x));
                let rec = run_job(job, &label);
                if !rec.ok {
                    if let Some(e) = &rec.error {
                        pb.suspend(|| eprintln!("error: {e}"));
                    }
                }
                results
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((i, rec));
                pb.inc(1);
            });
        }
    });
    pb.finish_and_clear();
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    results.sort_by_key(|(i, _)| *i);
    let runs: Vec<RunRecord> = results.into_iter().map(|(_, r)| r).collect();
    drop(scratch);

    let rows = summarize(&runs, &vars, &opts.xs, iters, n_for);
    let failures = failures_of(&runs);
    let labels: Vec<String> = vars.iter().map(|v| v.label.clone()).collect();
    let mut skipped = common.contenders.skipped.clone();
    skipped.extend(notes);
    let mut cts = common.contenders.clone();
    cts.skipped = skipped.clone();
    markdown.push_str(&contenders_markdown(&cts));
    markdown.push_str(&table(&rows, &labels, &opts.xs));
    let negative: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            r.instructions_per_pair
                .filter(|&v| v < 0.0)
                .map(|v| format!("{} at X={} ({v:.1})", r.variant, r.x))
        })
        .collect();
    if !negative.is_empty() {
        let _ = writeln!(
            markdown,
            "\nNegative counts (the run took fewer instructions than its compute-only bound on the same \
             allocator, so the difference is not a per-pair cost; no bar in the chart): {}.",
            negative.join(", ")
        );
    }
    markdown.push_str(&failures_markdown(&failures));

    let chart = BarChart {
        title: format!("SAC kernel: instructions per malloc+free pair (callgrind, {pairs} pairs)"),
        y_label: "instructions per pair".into(),
        series: labels.clone(),
        panels: vec![Panel {
            title: "1 thread".into(),
            groups: opts
                .xs
                .iter()
                .map(|&x| Group {
                    label: format!("X={x}"),
                    values: labels
                        .iter()
                        .map(|l| {
                            rows.iter()
                                .find(|r| r.x == x && &r.variant == l)
                                .and_then(|r| r.instructions_per_pair)
                        })
                        // A negative count (the run counted fewer instructions
                        // than its bound) has no bar; the table and the note
                        // below give it.
                        .map(|v| v.filter(|&v| v >= 0.0))
                        .collect(),
                })
                .collect(),
        }],
        reference: None,
    };
    let svg = crate::plot::render(&chart)
        .map_err(|e| eprintln!("warning: {e:#}"))
        .ok();
    let report = Report {
        experiment: "sac-callgrind".into(),
        title: "SAC kernel: instructions per malloc+free pair (callgrind)".into(),
        paper: "000 Grelck & Scholz".into(),
        size: common.size,
        params: json!({ "pairs": pairs, "iters": iters, "xs": opts.xs, "rust": opts.rust, "variants": labels,
                        "valgrind": valgrind }),
        machine,
        contenders: common.contenders.list.clone(),
        skipped,
        summary: CallgrindSummary {
            iters,
            rows,
            skipped: None,
        },
        runs,
        failures: failures.clone(),
    };
    let written = report::write_all(&common.results_dir, &report, &markdown, svg.as_deref())?;
    Ok(Finished {
        name: "sac-callgrind".into(),
        markdown,
        written,
        failures,
    })
}

fn wrapper(valgrind: &Path, out_file: &Path) -> Vec<OsString> {
    let mut file_opt = OsString::from("--callgrind-out-file=");
    file_opt.push(out_file);
    vec![
        valgrind.as_os_str().to_owned(),
        "--tool=callgrind".into(),
        file_opt,
    ]
}

fn run_job(job: &Job, label: &str) -> RunRecord {
    let config = format!("x={}", job.x);
    let mut rec = measure(&job.inv, &config, label, &job.contender, 0);
    rec.check_checksum(job.expected);
    if rec.ok {
        match std::fs::read_to_string(&job.out_file)
            .map_err(anyhow::Error::from)
            .and_then(|t| callgrind_total_ir(&t))
        {
            Ok(ir) => rec.instructions = Some(ir),
            Err(e) => {
                rec.ok = false;
                rec.error = Some(format!(
                    "{}: `{}`: could not read callgrind's output {}: {e:#}",
                    report::who(label, &job.contender.name),
                    job.inv.display(),
                    job.out_file.display()
                ));
            }
        }
    }
    rec
}

fn summarize(
    runs: &[RunRecord],
    vars: &[Variant],
    xs: &[usize],
    iters: usize,
    n_for: impl Fn(usize) -> usize,
) -> Vec<CallgrindRow> {
    let ir = |x: usize, label: &str| {
        let cfg = format!("x={x}");
        runs.iter()
            .find(|r| r.ok && r.config == cfg && r.variant == label)
            .and_then(|r| r.instructions)
    };
    let mut rows = Vec::new();
    for &x in xs {
        let n = n_for(x);
        let real_pairs = ((n / x) * iters) as u64;
        for v in vars {
            let m = ir(x, &v.label);
            let b = ir(x, &format!("{} (bound)", v.label));
            rows.push(CallgrindRow {
                x,
                variant: v.label.clone(),
                n,
                pairs: real_pairs,
                ir_mode: m,
                ir_bound: b,
                instructions_per_pair: match (m, b) {
                    (Some(m), Some(b)) => stats::per_pair(m, b, real_pairs),
                    _ => None,
                },
            });
        }
    }
    rows
}

fn table(rows: &[CallgrindRow], labels: &[String], xs: &[usize]) -> String {
    let mut tb = Table::new(
        std::iter::once("variant".to_string()).chain(xs.iter().map(|x| format!("X={x}"))),
    );
    for l in labels {
        tb.row(std::iter::once(l.clone()).chain(xs.iter().map(|&x| {
            rows.iter()
                .find(|r| r.x == x && &r.variant == l)
                .and_then(|r| r.instructions_per_pair)
                .map_or_else(|| "–".into(), |v| format!("{v:.1}"))
        })));
    }
    format!(
        "\n## Instructions per malloc+free pair (lower is better)\n\n{}",
        tb.render()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_keep_pairs_constant() {
        let (pairs, iters) = problem_size(Size::Quick);
        for x in [1000usize, 250, 100, 25] {
            let n = (pairs * x).div_ceil(iters);
            assert!((n / x) * iters >= pairs);
        }
    }
}
