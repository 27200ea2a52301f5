//! `in-process`: the allocators side by side inside one process
//! (`c/inprocess.c`), in alternating bursts.
//!
//! The other experiments run one process per allocator and take medians of
//! interleaved runs.  On a shared virtual machine that still leaves a run's
//! time at the mercy of the minute it ran in: Larson's 160 barrier-separated
//! rounds took 35 ms in one run and 90 ms in the next on the same library,
//! mostly waiting for the hypervisor to wake a thread.  Here one process
//! loads every allocator (`dlopen`, each called through its own `malloc` and
//! `free`), runs a loop in short bursts on each in turn, the order turned by
//! one every burst, and times only the loop's work (in `larson`, each
//! thread's own work between barriers).  A slow minute falls on all of them
//! alike.
//!
//! Loops: `same` (one 64-byte block freed and allocated again), `four` (four
//! live 64-byte blocks, one replaced at random each step), `random` (the
//! same with sizes 16..256: the small half of the `mixed` workload),
//! `prodcons` (one thread allocates 16..4096-byte blocks, the other frees
//! them, through a bounded queue), `sac` and `sac2` (the SAC kernel of
//! paper 000 at X = 25 on one and two threads, also run on the compute-only
//! bound, a `malloc` that hands each thread its one temporary, and, with
//! Canopy, on its unchecked rich interface: the `canopy-unchecked` column,
//! `canopy_alloc_class` + `canopy_free_class_unchecked`) and `larson`
//! (two threads, tables of 1000 blocks of 16..1024 bytes, each
//! round on the other thread's table).  Reported: nanoseconds per operation
//! (one free and one allocation), median over the bursts, then median over
//! the processes; ratios to the best anchor and to mimalloc.
//!
//! The SAC loops also run in Rust (`sac_rs_inprocess`, one more process per
//! loop and repetition), with the ways a Rust program gets its temporaries
//! side by side: std's `System`, Canopy's two global allocators (`Canopy`,
//! `CanopyUnchecked`) called through `GlobalAlloc`, the unchecked rich
//! interface and the Rust bound.  They get a table of their own, against the
//! Rust bound.
//!
//! jemalloc uses initial-exec TLS, which a library loaded by `dlopen` can
//! have only from the static TLS block's spare room; the child runs with
//! `GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536` to make room.

use anyhow::Result;
use serde_json::json;

use super::{
    contenders_markdown, failures_markdown, failures_of, machine_markdown, Common, Finished,
};
use crate::anchors::Contender;
use crate::artifacts::{CProgram, Lookup, SAC_RS};
use crate::parse::ResultLine;
use crate::plot::{BarChart, Group, Panel};
use crate::report::{self, fmt_ratio, Machine, Report, RunRecord, Size, Table};
use crate::runner::{self, Invocation};

use super::workloads::{summarize, Geomean, WorkloadRow, WorkloadSummary};

/// A loop of `c/inprocess.c`.
#[derive(Debug, Clone, Copy)]
pub struct Loop {
    /// Name (the program's first argument).
    pub name: &'static str,
    /// What it does.
    pub about: &'static str,
    /// Also run on the compute-only bound (the program's `bound` library).
    pub with_bound: bool,
    /// Threads the loop runs on.
    pub threads: usize,
}

/// The summary's thread count: the loops differ, so it is the most any of
/// `selected` runs on (each loop's own count is in the JSON's
/// `params.loop_threads`).
pub fn summary_threads(selected: &[&Loop]) -> usize {
    selected.iter().map(|l| l.threads).max().unwrap_or(1)
}

/// The name of the compute-only bound in the reports.
pub const BOUND: &str = "bound";

/// All loops, in report order.
pub const LOOPS: &[Loop] = &[
    Loop { name: "same", about: "free a 64-byte block and allocate one again (one block live)", with_bound: false, threads: 1 },
    Loop { name: "four", about: "four live 64-byte blocks, one freed at random and replaced each step", with_bound: false, threads: 1 },
    Loop { name: "random", about: "four live blocks of 16..256 bytes at random (the small half of `mixed`)", with_bound: false, threads: 1 },
    Loop { name: "prodcons", about: "one thread allocates blocks of 16..4096 B and passes them through a bounded queue to the other, which frees them; the burst is timed whole", with_bound: false, threads: 2 },
    Loop { name: "sac", about: "the SAC kernel of paper 000 at X = 25 on one thread: per element a 100-byte temporary allocated, filled, summed, freed; also on the compute-only bound (one temporary)", with_bound: true, threads: 1 },
    Loop { name: "sac2", about: "the same on two threads, each on half of the vector; each thread's work timed between barriers", with_bound: true, threads: 2 },
    Loop { name: "larson", about: "two threads, tables of 1000 blocks of 16..1024 B, each round on the other thread's table; each thread's work timed between barriers", with_bound: false, threads: 2 },
];

/// The glibc tunable that gives `dlopen`ed libraries with initial-exec TLS
/// room in the static TLS block (jemalloc needs it).
pub const STATIC_TLS_TUNABLE: &str = "glibc.rtld.optional_static_tls=65536";

/// Options of the `in-process` experiment.
#[derive(Debug, Clone)]
pub struct InProcessOptions {
    /// Loop names (a subset of [`LOOPS`]).
    pub only: Vec<String>,
    /// Bursts per library per process (`None`: the size's default).
    pub bursts: Option<usize>,
    /// Work per burst (`None`: the size's default).
    pub scale: Option<usize>,
    /// Also run the SAC loops' Rust program (`sac_rs_inprocess`).
    pub rust: bool,
}

impl Default for InProcessOptions {
    fn default() -> Self {
        InProcessOptions { only: LOOPS.iter().map(|l| l.name.to_string()).collect(), bursts: None, scale: None, rust: true }
    }
}

/// Processes per loop by default: 1 quick, 5 otherwise.  Within a process
/// the bursts agree to a few per cent, but a whole process can be off: in
/// about one process in eight, glibc, tcmalloc and mimalloc ran the `four`
/// loop a third faster than in the others (Canopy and jemalloc did not), and
/// moving the loop's stack frame from burst to burst did not change that.
/// The median over five processes keeps one such process out of the result.
pub fn default_runs(size: Size) -> usize {
    match size {
        Size::Quick => 1,
        _ => 5,
    }
}

/// Bursts per library for a size.
pub fn bursts(size: Size) -> usize {
    match size {
        Size::Quick => 5,
        Size::Default => 21,
        Size::Paper => 41,
    }
}

/// Work per burst for a size (per unit: 250 000 steps; `prodcons`: 50 000
/// blocks; `larson`: 5 rounds of 5000 operations per thread).
pub fn scale(size: Size) -> usize {
    match size {
        Size::Quick => 1,
        Size::Default => 2,
        Size::Paper => 4,
    }
}

/// The compute-only bound as a contender of the records (not an allocator:
/// the program's `bound` library hands every thread its one temporary).
pub fn bound_contender() -> Contender {
    Contender { name: BOUND.into(), preload: None, version: Some("compute only: one temporary per thread".into()) }
}

/// The column of Canopy's unchecked rich interface in the SAC loops
/// (`unchecked:PATH` to the program): `canopy_alloc_class` and
/// `canopy_free_class_unchecked` on the `canopy` contender's library.
pub const UNCHECKED: &str = "canopy-unchecked";

/// The pseudo-contender of [`UNCHECKED`] for `canopy`'s library.
pub fn unchecked_contender(canopy: &Contender) -> Contender {
    Contender {
        name: UNCHECKED.into(),
        preload: canopy.preload.clone(),
        version: Some("canopy_alloc_class + canopy_free_class_unchecked, on the canopy library".into()),
    }
}

/// Each contender's median time over the bound's, for the loops that run
/// on the bound.
pub fn vs_bound(rows: &[WorkloadRow], lp: &str, contender: &str) -> Option<f64> {
    ratio_to(rows, lp, contender, BOUND)
}

fn ratio_to(rows: &[WorkloadRow], lp: &str, contender: &str, bound: &str) -> Option<f64> {
    let t = |c: &str| rows.iter().find(|r| r.workload == lp && r.contender == c).and_then(|r| r.median_seconds);
    crate::stats::ratio(t(contender), t(bound))
}

/// The ways of `sac_rs_inprocess`, in the order of its `lib=` indices, and
/// what each is.
pub const RUST_WAYS: [(&str, &str); 5] = [
    ("rs-system", "GlobalAlloc calls on std's System (glibc's malloc)"),
    ("rs-canopy-global", "GlobalAlloc calls on canopy_alloc::Canopy (as #[global_allocator])"),
    ("rs-canopy-global-unchecked", "GlobalAlloc calls on canopy_alloc::CanopyUnchecked (as #[global_allocator])"),
    ("rs-canopy-unchecked", "canopy_alloc::alloc_class + free_class_unchecked, the class computed once"),
    (RUST_BOUND, "compute only: one temporary per thread"),
];

/// The Rust program's compute-only bound.
pub const RUST_BOUND: &str = "rs-bound";

/// The pseudo-contenders of [`RUST_WAYS`].
pub fn rust_contenders() -> Vec<Contender> {
    RUST_WAYS
        .iter()
        .map(|(name, what)| Contender { name: (*name).into(), preload: None, version: Some((*what).into()) })
        .collect()
}

/// The Rust program's table: nanoseconds per element and the ratio to the
/// Rust bound, per SAC loop.
fn rust_table(rows: &[WorkloadRow], loops: &[&str]) -> String {
    let ways: Vec<&str> = RUST_WAYS.iter().map(|w| w.0).collect();
    let mut t = Table::new(std::iter::once("loop".to_string()).chain(ways.iter().map(|w| w.to_string())));
    for &l in loops {
        t.row(std::iter::once(format!("{l} (ns)")).chain(ways.iter().map(|&w| {
            rows.iter()
                .find(|r| r.workload == l && r.contender == w)
                .and_then(|r| r.median_seconds)
                .map_or("—".into(), |s| format!("{:.2}", s * 1e9))
        })));
        t.row(std::iter::once(format!("{l} (× bound)")).chain(ways.iter().map(|&w| fmt_ratio(ratio_to(rows, l, w, RUST_BOUND)))));
    }
    format!(
        "\n## The Rust kernel in one process (`sac_rs_inprocess`)\n\n\
         The same kernel in Rust, its temporaries taken five ways ({}): nanoseconds per element (median burst, then \
         median of the processes) and the ratio to the Rust bound. Compare these with each other, not with the C columns above \
         (another compiler, another `fill_and_sum`).\n\n{}",
        RUST_WAYS.iter().map(|(n, w)| format!("`{n}`: {w}")).collect::<Vec<_>>().join("; "),
        t.render()
    )
}

fn bound_table(rows: &[WorkloadRow], selected: &[&Loop], cs: &[(String, bool)]) -> String {
    let with: Vec<&&Loop> = selected.iter().filter(|l| l.with_bound).collect();
    if with.is_empty() {
        return String::new();
    }
    let mut t = Table::new(std::iter::once("loop".to_string()).chain(cs.iter().filter(|c| c.0 != BOUND).map(|c| c.0.clone())));
    for l in with {
        t.row(std::iter::once(l.name.to_string()).chain(cs.iter().filter(|c| c.0 != BOUND).map(|(c, _)| fmt_ratio(vs_bound(rows, l.name, c)))));
    }
    format!("\n## Time relative to the compute-only bound (SAC loops; issue target: within 1.15x)\n\n{}", t.render())
}

/// The program's argument naming `c`'s library: its path, or `glibc`.
pub fn lib_arg_of(c: &Contender) -> String {
    match &c.preload {
        Some(p) => p.display().to_string(),
        None => "glibc".into(),
    }
}

/// The `GLIBC_TUNABLES` value for the child: `base` (the caller's own, if
/// any) with [`STATIC_TLS_TUNABLE`] added.
pub fn tunables(base: Option<&str>) -> String {
    match base {
        Some(b) if !b.is_empty() => format!("{b}:{STATIC_TLS_TUNABLE}"),
        _ => STATIC_TLS_TUNABLE.to_string(),
    }
}

/// Turn one process's output into one record per contender.  Every
/// contender must print the same checksum (the loops do the same work on
/// each); a contender whose line is missing or disagrees gets a failed
/// record that says so.
pub fn records_of(
    lp: &str,
    rep: usize,
    contenders: &[Contender],
    inv: &Invocation,
    out: Result<&runner::Outcome, String>,
) -> Vec<RunRecord> {
    let mut recs: Vec<RunRecord> = Vec::new();
    let base = |c: &Contender| RunRecord::unmeasured(lp, &c.name, c, rep, inv);
    let out = match out {
        Ok(o) if o.success() => o,
        Ok(o) => {
            let msg = format!("in-process {lp}: `{}` failed: {}; stderr:\n{}", inv.display(), o.exit, o.stderr_tail(5));
            return contenders.iter().map(|c| RunRecord { error: Some(msg.clone()), exit: Some(o.exit.clone()), ..base(c) }).collect();
        }
        Err(e) => {
            let msg = format!("in-process {lp}: could not run `{}`: {e}", inv.display());
            return contenders.iter().map(|c| RunRecord { error: Some(msg.clone()), ..base(c) }).collect();
        }
    };
    let lines: Vec<ResultLine> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("lib="))
        .filter_map(|l| ResultLine::parse(l).ok())
        .collect();
    for (i, c) in contenders.iter().enumerate() {
        let mut r = base(c);
        r.wall_seconds = out.wall_seconds;
        let Some(line) = lines.iter().find(|l| l.fields.get("lib").and_then(|v| v.parse::<usize>().ok()) == Some(i)) else {
            r.error = Some(format!("in-process {lp}: no result line for {} (lib={i}) in the output of `{}`", c.name, inv.display()));
            recs.push(r);
            continue;
        };
        r.fields = line.fields.clone();
        r.checksum = line.fields.get("checksum").and_then(|v| v.parse().ok());
        r.seconds = line.fields.get("median_ns").and_then(|v| v.parse::<f64>().ok()).map(|ns| ns * 1e-9);
        r.ok = r.seconds.is_some() && r.checksum.is_some();
        if !r.ok {
            r.error = Some(format!("in-process {lp}: malformed result line for {}: {:?}", c.name, line.fields));
        }
        recs.push(r);
    }
    // The first contender's checksum is the reference (glibc's, when it runs).
    if let Some(expected) = recs.iter().find(|r| r.ok).and_then(|r| r.checksum) {
        for r in &mut recs {
            r.check_checksum(expected);
        }
    }
    recs
}

/// Run the experiment.
pub fn run(common: &Common, opts: &InProcessOptions) -> Result<Finished> {
    for l in &opts.only {
        anyhow::ensure!(
            LOOPS.iter().any(|k| k.name == l),
            "unknown loop {l:?} (known: {})",
            LOOPS.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
        );
    }
    let selected: Vec<&Loop> = LOOPS.iter().filter(|l| opts.only.iter().any(|o| o == l.name)).collect();
    let contenders = &common.contenders.list;
    anyhow::ensure!(!contenders.is_empty(), "no contenders to compare");
    // The SAC loops also load the bound and, with Canopy, its unchecked column.
    let extra = if selected.iter().any(|l| l.with_bound) {
        1 + usize::from(contenders.iter().any(|c| c.name == "canopy" && c.preload.is_some()))
    } else {
        0
    };
    anyhow::ensure!(
        contenders.len() + extra <= 8,
        "at most 8 libraries fit in one process ({} contenders and {extra} for the SAC loops' bound and unchecked column)",
        contenders.len()
    );
    let machine = Machine::describe();
    let nb = opts.bursts.unwrap_or_else(|| bursts(common.size)).clamp(1, 1000);
    let sc = opts.scale.unwrap_or_else(|| scale(common.size)).clamp(1, 1000);
    let reps = common.runs.unwrap_or_else(|| default_runs(common.size)).max(1);
    let prog = CProgram::InProcess.compile()?;
    let tun = tunables(std::env::var("GLIBC_TUNABLES").ok().as_deref());
    let bound_loops: Vec<&str> = selected.iter().filter(|l| l.with_bound).map(|l| l.name).collect();
    // The Rust program for the SAC loops: built with the other Rust SAC
    // binaries; without it the C tables still come out, and the report says
    // why the Rust one is missing.
    let mut rust_missing: Option<String> = None;
    let rust_prog = if opts.rust && !bound_loops.is_empty() {
        match SAC_RS.locate(Lookup::FindOrBuild) {
            Ok(bins) => bins.into_iter().find(|p| p.file_name().is_some_and(|f| f == "sac_rs_inprocess")),
            Err(e) => {
                eprintln!("warning: in-process: the Rust SAC program is not available, its table is left out: {e:#}");
                rust_missing = Some(format!("{e:#}"));
                None
            }
        }
    } else {
        None
    };
    let rust_cs = rust_contenders();
    let mut rust_runs = Vec::new();

    let steps = selected.len() + if rust_prog.is_some() { bound_loops.len() } else { 0 };
    let pb = crate::progress::bar((steps * reps) as u64, "in-process");
    let mut runs = Vec::new();
    for l in &selected {
        for rep in 0..reps {
            pb.set_message(format!("{} ({}/{reps})", l.name, rep + 1));
            let mut args = vec![l.name.to_string(), nb.to_string(), sc.to_string()];
            args.extend(contenders.iter().map(lib_arg_of));
            let mut these = contenders.clone();
            if l.with_bound {
                if let Some(c) = contenders.iter().find(|c| c.name == "canopy" && c.preload.is_some()) {
                    args.push(format!("unchecked:{}", lib_arg_of(c)));
                    these.push(unchecked_contender(c));
                }
                args.push(BOUND.into());
                these.push(bound_contender());
            }
            let glibc = Contender::glibc();
            let mut inv = Invocation::new(prog.clone(), args, &glibc, common.timeout);
            inv.env.push(("GLIBC_TUNABLES".into(), tun.clone()));
            let out = runner::run(&inv);
            let recs = records_of(l.name, rep, &these, &inv, out.as_ref().map_err(|e| format!("{e:#}")));
            for r in recs.iter().filter(|r| !r.ok) {
                if let Some(e) = &r.error {
                    pb.suspend(|| eprintln!("error: {e}"));
                }
            }
            runs.extend(recs);
            pb.inc(1);
            if let (Some(rp), true) = (&rust_prog, l.with_bound) {
                pb.set_message(format!("{} in Rust ({}/{reps})", l.name, rep + 1));
                let args = vec![l.name.to_string(), nb.to_string(), sc.to_string()];
                let inv = Invocation::new(rp.clone(), args, &Contender::glibc(), common.timeout);
                let out = runner::run(&inv);
                let recs = records_of(l.name, rep, &rust_cs, &inv, out.as_ref().map_err(|e| format!("{e:#}")));
                for r in recs.iter().filter(|r| !r.ok) {
                    if let Some(e) = &r.error {
                        pb.suspend(|| eprintln!("error: {e}"));
                    }
                }
                rust_runs.extend(recs);
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();

    let names: Vec<&str> = selected.iter().map(|l| l.name).collect();
    let mut cs: Vec<(String, bool)> = contenders.iter().map(|c| (c.name.clone(), c.is_anchor())).collect();
    if selected.iter().any(|l| l.with_bound) {
        // Columns of their own, never the best anchor (and no geomean: they
        // run the SAC loops only).
        if contenders.iter().any(|c| c.name == "canopy" && c.preload.is_some()) {
            cs.push((UNCHECKED.to_string(), false));
        }
        cs.push((BOUND.to_string(), false));
    }
    let (mut rows, best, geomeans) = summarize(&runs, &names, &cs);
    let rust_rows = if rust_prog.is_some() {
        let rcs: Vec<(String, bool)> = RUST_WAYS.iter().map(|w| (w.0.to_string(), false)).collect();
        summarize(&rust_runs, &bound_loops, &rcs).0
    } else {
        Vec::new()
    };
    runs.extend(rust_runs);
    let failures = failures_of(&runs);

    let mut markdown = format!(
        "# Allocators side by side in one process\n\n\
         `c/inprocess.c`: every allocator loaded into one process with `dlopen`; each loop runs {nb} bursts on each, \
         the order turned by one every burst, timing only the loop's own work (in `larson`, each thread's work between \
         the barriers that start and end a round, summed over the threads). Nanoseconds per operation (one free and one \
         allocation): the median burst, then the median of {reps} such process(es). Scale {sc} (size `{}`). \
         \"Best anchor\" is the fastest allocator other than Canopy in that loop.\n\n",
        common.size.name()
    );
    markdown.push_str(&machine_markdown(&machine));
    markdown.push('\n');
    markdown.push_str(&contenders_markdown(&common.contenders));
    markdown.push_str("\nLoops:\n\n");
    for l in &selected {
        markdown.push_str(&format!("- `{}`: {}\n", l.name, l.about));
    }
    markdown.push_str(&tables(&rows, &geomeans, &best, &names, &cs));
    markdown.push_str(&bound_table(&rows, &selected, &cs));
    if !rust_rows.is_empty() {
        markdown.push_str(&rust_table(&rust_rows, &bound_loops));
    } else if let Some(why) = &rust_missing {
        markdown.push_str(&format!("\n## The Rust kernel in one process\n\nNot run: the program `sac_rs_inprocess` is not available ({why}).\n"));
    }
    markdown.push_str(&failures_markdown(&failures));

    let series: Vec<String> = cs.iter().map(|c| c.0.clone()).filter(|c| c != BOUND).collect();
    let panel = Panel {
        title: "time per operation".into(),
        groups: names
            .iter()
            .map(|l| Group {
                label: l.to_string(),
                values: series
                    .iter()
                    .map(|c| rows.iter().find(|r| &r.workload == l && &r.contender == c).and_then(|r| r.time_vs_best_anchor))
                    .collect(),
            })
            .chain(std::iter::once(Group {
                label: "geomean".into(),
                values: series.iter().map(|c| geomeans.iter().find(|g| &g.contender == c).and_then(|g| g.time_vs_best_anchor)).collect(),
            }))
            .collect(),
    };
    let chart = BarChart {
        title: "Allocators in one process, alternating bursts: time relative to the best anchor (lower is better)".into(),
        y_label: "ratio to best anchor".into(),
        series,
        panels: vec![panel],
        reference: Some(1.0),
    };
    let svg = crate::plot::render(&chart).map_err(|e| eprintln!("warning: {e:#}")).ok();

    // The Rust ways' rows go into the JSON summary too, after the chart.
    rows.extend(rust_rows);
    let report = Report {
        experiment: "in-process".into(),
        title: "Allocators side by side in one process, alternating bursts".into(),
        paper: "Larson and small-block loops; a steadier measure on shared machines".into(),
        size: common.size,
        params: json!({
            "bursts": nb,
            "scale": sc,
            "runs": reps,
            "loops": names,
            "loop_threads": selected.iter().map(|l| json!({ "loop": l.name, "threads": l.threads })).collect::<Vec<_>>(),
            "glibc_tunables": tun,
            "rust": rust_prog.as_ref().map(|p| p.display().to_string()),
        }),
        machine,
        contenders: contenders.clone(),
        skipped: common.contenders.skipped.clone(),
        summary: WorkloadSummary { threads: summary_threads(&selected), scale: sc, runs: reps, rows, best_anchors: best, geomeans },
        runs,
        failures: failures.clone(),
    };
    let written = report::write_all(&common.results_dir, &report, &markdown, svg.as_deref())?;
    Ok(Finished { name: "in-process".into(), markdown, written, failures })
}

fn tables(
    rows: &[WorkloadRow],
    geo: &[Geomean],
    best: &[super::workloads::BestAnchor],
    names: &[&str],
    cs: &[(String, bool)],
) -> String {
    let header = || std::iter::once("loop".to_string()).chain(cs.iter().map(|c| c.0.clone()));
    let cell = |l: &str, c: &str| rows.iter().find(|r| r.workload == l && r.contender == c);
    let mut s = String::new();
    let mut t = Table::new(header().chain(std::iter::once("best anchor".to_string())));
    for (i, l) in names.iter().enumerate() {
        t.row(
            std::iter::once(l.to_string())
                .chain(cs.iter().map(|(c, _)| {
                    cell(l, c).and_then(|r| r.median_seconds).map_or_else(|| "–".into(), |v| format!("{:.2} ns", v * 1e9))
                }))
                .chain(std::iter::once(best[i].fastest.clone().unwrap_or_else(|| "–".into()))),
        );
    }
    s.push_str(&format!("\n## Median time per operation\n\n{}", t.render()));
    let ratios = |title: &str, f: fn(&WorkloadRow) -> Option<f64>, g: fn(&Geomean) -> Option<f64>| {
        let mut t = Table::new(header());
        for l in names {
            t.row(std::iter::once(l.to_string()).chain(cs.iter().map(|(c, _)| fmt_ratio(cell(l, c).and_then(f)))));
        }
        t.row(
            std::iter::once("**geomean**".to_string())
                .chain(cs.iter().map(|(c, _)| fmt_ratio(geo.iter().find(|x| &x.contender == c).and_then(g)))),
        );
        format!("\n## {title}\n\n{}", t.render())
    };
    s.push_str(&ratios("Time relative to the best anchor (lower is better)", |r| r.time_vs_best_anchor, |g| g.time_vs_best_anchor));
    s.push_str(&ratios("Time relative to mimalloc", |r| r.time_vs_mimalloc, |g| g.time_vs_mimalloc));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::{Exit, Outcome};
    use std::path::PathBuf;
    use std::time::Duration;

    fn contenders() -> Vec<Contender> {
        vec![
            Contender::glibc(),
            Contender { name: "canopy".into(), preload: Some(PathBuf::from("/x/libcanopy_malloc.so")), version: None },
        ]
    }

    fn outcome(stdout: &str, code: i32) -> Outcome {
        Outcome {
            exit: Exit::Code { code },
            stdout: stdout.into(),
            stderr: "oops\n".into(),
            max_rss_kib: 0,
            wall_seconds: 1.0,
            user_seconds: 0.0,
            sys_seconds: 0.0,
        }
    }

    /// A summary row of loop `l` for contender `c` with median time `secs`.
    fn row(l: &str, c: &str, secs: Option<f64>) -> WorkloadRow {
        WorkloadRow {
            workload: l.into(),
            contender: c.into(),
            ok_runs: 1,
            failed_runs: 0,
            median_seconds: secs,
            median_rss_kib: None,
            time_vs_best_anchor: None,
            time_vs_mimalloc: None,
            rss_vs_best_anchor: None,
            rss_vs_mimalloc: None,
        }
    }

    fn inv() -> Invocation {
        Invocation::new(PathBuf::from("/bin/inprocess"), vec![], &Contender::glibc(), Duration::from_secs(1))
    }

    #[test]
    fn each_library_line_becomes_a_record_and_checksums_must_agree() {
        let cs = contenders();
        assert_eq!(lib_arg_of(&cs[0]), "glibc");
        assert_eq!(lib_arg_of(&cs[1]), "/x/libcanopy_malloc.so");
        let good = "lib=0 name=glibc loop=same median_ns=10.5 checksum=7\nlib=1 name=x loop=same median_ns=5.25 checksum=7\nchecksum=7 libs=2\n";
        let recs = records_of("same", 0, &cs, &inv(), Ok(&outcome(good, 0)));
        assert_eq!(recs.len(), 2);
        assert!(recs.iter().all(|r| r.ok));
        assert!((recs[1].seconds.unwrap() - 5.25e-9).abs() < 1e-18);
        assert_eq!(recs[1].contender, "canopy");
        let bad = "lib=0 name=glibc loop=same median_ns=10.5 checksum=7\nlib=1 name=x loop=same median_ns=5.25 checksum=8\n";
        let recs = records_of("same", 0, &cs, &inv(), Ok(&outcome(bad, 0)));
        assert!(recs[0].ok && !recs[1].ok, "a checksum that differs from the reference fails that contender");
        let missing = "lib=0 name=glibc loop=same median_ns=10.5 checksum=7\n";
        let recs = records_of("same", 0, &cs, &inv(), Ok(&outcome(missing, 0)));
        assert!(!recs[1].ok);
        assert!(recs[1].error.as_deref().unwrap().contains("no result line for canopy"));
        let failed = records_of("same", 0, &cs, &inv(), Ok(&outcome(good, 2)));
        assert!(failed.iter().all(|r| !r.ok && r.error.as_deref().unwrap().contains("oops")));
        let unrun = records_of("same", 0, &cs, &inv(), Err("no such file".into()));
        assert!(unrun.iter().all(|r| !r.ok && r.error.as_deref().unwrap().contains("no such file")));
    }

    #[test]
    fn ratios_to_the_bound_use_the_bound_row_of_the_same_loop() {
        let rows = vec![
            row("sac", "canopy", Some(3.0)),
            row("sac", BOUND, Some(2.0)),
            row("sac2", "canopy", Some(5.0)),
            row("sac2", BOUND, None),
        ];
        assert_eq!(vs_bound(&rows, "sac", "canopy"), Some(1.5));
        assert_eq!(vs_bound(&rows, "sac2", "canopy"), None, "no bound measured");
        assert_eq!(vs_bound(&rows, "same", "canopy"), None, "no such loop");
    }

    #[test]
    fn the_rust_table_compares_each_way_with_the_rust_bound() {
        // The program's lines become records of the Rust ways, in order.
        let out: String = RUST_WAYS
            .iter()
            .enumerate()
            .map(|(i, (n, _))| format!("lib={i} name={n} loop=sac median_ns={} checksum=9\n", 4 + 2 * i))
            .collect();
        let recs = records_of("sac", 0, &rust_contenders(), &inv(), Ok(&outcome(&out, 0)));
        assert!(recs.iter().all(|r| r.ok));
        assert_eq!(recs[2].contender, "rs-canopy-global-unchecked");
        assert!((recs[4].seconds.unwrap() - 12e-9).abs() < 1e-18);
        let rows = vec![
            row("sac", "rs-canopy-global", Some(9e-9)),
            row("sac", RUST_BOUND, Some(6e-9)),
            row("sac", BOUND, Some(1e-9)),
        ];
        let t = rust_table(&rows, &["sac", "sac2"]);
        assert!(t.contains("| sac (ns)"), "{t}");
        assert!(t.contains("9.00") && t.contains("1.50×"), "against rs-bound, not the C bound: {t}");
        assert!(!t.contains("9.00×"));
        assert!(t.contains("| sac2 (ns)"), "a loop without rows still gets its line: {t}");
    }

    #[test]
    fn the_summary_counts_the_threads_of_the_loops_that_ran() {
        let pick = |names: &[&str]| -> Vec<&Loop> { LOOPS.iter().filter(|l| names.contains(&l.name)).collect() };
        assert_eq!(summary_threads(&pick(&["same", "four", "random", "sac"])), 1);
        assert_eq!(summary_threads(&pick(&["same", "larson"])), 2);
        assert_eq!(summary_threads(&pick(&["sac2"])), 2);
        assert_eq!(summary_threads(&[]), 1);
    }

    #[test]
    fn the_tunable_is_added_to_the_callers_own() {
        assert_eq!(tunables(None), STATIC_TLS_TUNABLE);
        assert_eq!(tunables(Some("")), STATIC_TLS_TUNABLE);
        assert_eq!(tunables(Some("glibc.malloc.arena_max=2")), format!("glibc.malloc.arena_max=2:{STATIC_TLS_TUNABLE}"));
    }
}
