//! `workloads`: general allocation patterns from `c/workloads.c` on every
//! contender (Larson server simulation, producer/consumer, cache-scratch and
//! cache-thrash false sharing, a random size walk, thread churn, small
//! blocks beside large ones, large blocks after a phase that freed a lot).
//!
//! Reported per workload: median time and median peak RSS, each as a ratio to
//! the best anchor (the fastest, or smallest, of the allocators other than
//! Canopy) and to mimalloc, and the geometric mean of those ratios over the
//! workloads.  Every contender must print the checksum glibc printed.

use anyhow::Result;
use serde::Serialize;
use serde_json::json;

use super::{
    contenders_markdown, failures_markdown, failures_of, machine_markdown, measure, Common,
    Finished,
};
use crate::artifacts::CProgram;
use crate::plot::{BarChart, Group, Panel};
use crate::report::{
    self, fmt_kib, fmt_ratio, fmt_seconds, Machine, Report, RunRecord, Size, Table,
};
use crate::runner::Invocation;
use crate::stats;

/// A workload of `c/workloads.c`.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Name (the program's first argument).
    pub name: &'static str,
    /// What it does.
    pub about: &'static str,
}

/// All workloads, in report order.
pub const WORKLOADS: &[Workload] = &[
    Workload { name: "larson", about: "server simulation: random frees and 16..1024 B allocations in tables handed between threads" },
    Workload { name: "prodcons", about: "one thread allocates mixed sizes, another frees them (bounded queue)" },
    Workload { name: "cache-scratch", about: "passive false sharing: objects from the main thread freed and reused by workers" },
    Workload { name: "cache-thrash", about: "active false sharing: each thread allocates and writes its own small objects" },
    Workload { name: "sizewalk", about: "one thread, live pool of 8 B..4 MiB blocks, frees and reallocs, touches every byte" },
    Workload { name: "churn", about: "thousands of short-lived threads; a quarter of their blocks freed by the parent" },
    Workload { name: "mixed", about: "one thread's small blocks while the others allocate and free 64..544 KiB blocks" },
    Workload { name: "phases", about: "64 MiB of 1 MiB blocks built and freed, then 256..544 KiB blocks; then 8..208 KiB blocks beside a heap with every other block freed" },
];

/// Options of the `workloads` experiment.
#[derive(Debug, Clone)]
pub struct WorkloadOptions {
    /// Workload names (a subset of [`WORKLOADS`]).
    pub only: Vec<String>,
    /// Threads for the multi-threaded workloads.
    pub threads: usize,
    /// Override the scale factor.
    pub scale: Option<usize>,
}

impl Default for WorkloadOptions {
    fn default() -> Self {
        WorkloadOptions {
            only: WORKLOADS.iter().map(|w| w.name.to_string()).collect(),
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .max(2),
            scale: None,
        }
    }
}

/// Runs per workload and contender by default: 3 quick, 11 otherwise.  The
/// programs are short (cache-scratch and cache-thrash take about 45 ms at
/// the default size) and a run's time moves by a fifth on this kind of VM:
/// five runs left cache-scratch at 1.10-1.20x jemalloc in run after run,
/// where 21 interleaved runs of the three fastest give Canopy 47.4 ms,
/// mimalloc 47.5 and jemalloc 48.5.
pub fn default_runs(size: Size) -> usize {
    match size {
        Size::Quick => 3,
        _ => 11,
    }
}

/// The scale factor (work per workload) for a size.
pub fn scale(size: Size) -> usize {
    match size {
        Size::Quick => 1,
        Size::Default => 8,
        Size::Paper => 32,
    }
}

/// One (workload, contender) cell of the summary.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadRow {
    /// Workload.
    pub workload: String,
    /// Contender.
    pub contender: String,
    /// Successful runs.
    pub ok_runs: usize,
    /// Failed runs.
    pub failed_runs: usize,
    /// Median time, seconds.
    pub median_seconds: Option<f64>,
    /// Median peak RSS, KiB.
    pub median_rss_kib: Option<u64>,
    /// Median time / the best anchor's median time.
    pub time_vs_best_anchor: Option<f64>,
    /// Median time / mimalloc's.
    pub time_vs_mimalloc: Option<f64>,
    /// Median RSS / the smallest anchor median RSS.
    pub rss_vs_best_anchor: Option<f64>,
    /// Median RSS / mimalloc's.
    pub rss_vs_mimalloc: Option<f64>,
}

/// The best anchors of one workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BestAnchor {
    /// Workload.
    pub workload: String,
    /// The anchor with the lowest median time.
    pub fastest: Option<String>,
    /// The anchor with the lowest median peak RSS.
    pub smallest: Option<String>,
}

impl BestAnchor {
    fn new(workload: &str, fastest: Option<&str>, smallest: Option<&str>) -> Self {
        BestAnchor {
            workload: workload.into(),
            fastest: fastest.map(Into::into),
            smallest: smallest.map(Into::into),
        }
    }
}

/// Geometric means over the workloads, per contender.
#[derive(Debug, Clone, Serialize)]
pub struct Geomean {
    /// Contender.
    pub contender: String,
    /// Workloads that have every ratio below.
    pub workloads: usize,
    /// Geomean of time / best anchor.
    pub time_vs_best_anchor: Option<f64>,
    /// Geomean of time / mimalloc.
    pub time_vs_mimalloc: Option<f64>,
    /// Geomean of RSS / best anchor.
    pub rss_vs_best_anchor: Option<f64>,
    /// Geomean of RSS / mimalloc.
    pub rss_vs_mimalloc: Option<f64>,
}

/// The derived numbers.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadSummary {
    /// Threads.
    pub threads: usize,
    /// Scale factor.
    pub scale: usize,
    /// Repetitions.
    pub runs: usize,
    /// Per (workload, contender).
    pub rows: Vec<WorkloadRow>,
    /// Per workload: the anchor with the best median time and with the smallest RSS.
    pub best_anchors: Vec<BestAnchor>,
    /// Per contender.
    pub geomeans: Vec<Geomean>,
}

/// Compute the summary from the raw runs.
pub fn summarize(
    runs: &[RunRecord],
    workloads: &[&str],
    contenders: &[(String, bool)],
) -> (Vec<WorkloadRow>, Vec<BestAnchor>, Vec<Geomean>) {
    let mut rows = Vec::new();
    let mut best = Vec::new();
    for &w in workloads {
        let cell = |c: &str| {
            let of: Vec<&RunRecord> = runs
                .iter()
                .filter(|r| r.config == w && r.variant == c)
                .collect();
            let secs: Vec<f64> = of
                .iter()
                .filter(|r| r.ok)
                .filter_map(|r| r.seconds)
                .collect();
            let rss: Vec<u64> = of
                .iter()
                .filter(|r| r.ok)
                .filter_map(|r| r.max_rss_kib)
                .collect();
            (
                of.len(),
                secs.len(),
                stats::median(&secs),
                stats::median_u64(&rss),
            )
        };
        let anchors: Vec<(&str, Option<f64>, Option<u64>)> = contenders
            .iter()
            .filter(|(_, a)| *a)
            .map(|(c, _)| (c.as_str(), cell(c).2, cell(c).3))
            .collect();
        let best_t = anchors
            .iter()
            .filter_map(|(c, t, _)| t.map(|t| (*c, t)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let best_r = anchors
            .iter()
            .filter_map(|(c, _, r)| r.map(|r| (*c, r)))
            .min_by_key(|a| a.1);
        best.push(BestAnchor::new(w, best_t.map(|b| b.0), best_r.map(|b| b.0)));
        let (_, _, mi_t, mi_r) = cell("mimalloc");
        for (c, _) in contenders {
            let (all, ok, t, r) = cell(c);
            rows.push(WorkloadRow {
                workload: w.to_string(),
                contender: c.clone(),
                ok_runs: ok,
                failed_runs: all - ok,
                median_seconds: t,
                median_rss_kib: r,
                time_vs_best_anchor: stats::ratio(t, best_t.map(|b| b.1)),
                time_vs_mimalloc: stats::ratio(t, mi_t),
                rss_vs_best_anchor: stats::ratio(r.map(|v| v as f64), best_r.map(|b| b.1 as f64)),
                rss_vs_mimalloc: stats::ratio(r.map(|v| v as f64), mi_r.map(|v| v as f64)),
            });
        }
    }
    let geomeans = contenders
        .iter()
        .map(|(c, _)| {
            let mine: Vec<&WorkloadRow> = rows.iter().filter(|r| &r.contender == c).collect();
            let g = |f: fn(&WorkloadRow) -> Option<f64>| {
                let v: Vec<f64> = mine.iter().filter_map(|r| f(r)).collect();
                if v.len() == mine.len() {
                    stats::geomean(&v)
                } else {
                    None
                }
            };
            Geomean {
                contender: c.clone(),
                workloads: mine.iter().filter(|r| r.median_seconds.is_some()).count(),
                time_vs_best_anchor: g(|r| r.time_vs_best_anchor),
                time_vs_mimalloc: g(|r| r.time_vs_mimalloc),
                rss_vs_best_anchor: g(|r| r.rss_vs_best_anchor),
                rss_vs_mimalloc: g(|r| r.rss_vs_mimalloc),
            }
        })
        .collect();
    (rows, best, geomeans)
}

/// Run the experiment.
pub fn run(common: &Common, opts: &WorkloadOptions) -> Result<Finished> {
    for w in &opts.only {
        anyhow::ensure!(
            WORKLOADS.iter().any(|k| k.name == w),
            "unknown workload {w:?} (known: {})",
            WORKLOADS
                .iter()
                .map(|k| k.name)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let selected: Vec<&Workload> = WORKLOADS
        .iter()
        .filter(|w| opts.only.iter().any(|o| o == w.name))
        .collect();
    let machine = Machine::describe();
    let sc = opts.scale.unwrap_or_else(|| scale(common.size)).max(1);
    let threads = opts.threads.max(1);
    let reps = common.runs.unwrap_or_else(|| default_runs(common.size)).max(1);
    let prog = CProgram::Workloads.compile()?;
    let contenders = &common.contenders.list;

    let pb = crate::progress::bar(
        (selected.len() * reps * contenders.len()) as u64,
        "workloads",
    );
    let mut runs = Vec::new();
    for w in &selected {
        let mut mine = Vec::new();
        for rep in 0..reps {
            for c in super::rotated(contenders, rep) {
                pb.set_message(format!("{} on {} ({}/{reps})", w.name, c.name, rep + 1));
                let args = vec![w.name.to_string(), threads.to_string(), sc.to_string()];
                let inv = Invocation::new(prog.clone(), args, c, common.timeout);
                let rec = measure(&inv, w.name, &c.name, c, rep);
                if let Some(e) = rec.error.as_ref().filter(|_| !rec.ok) {
                    pb.suspend(|| eprintln!("error: {e}"));
                }
                mine.push(rec);
                pb.inc(1);
            }
        }
        // Every contender must agree with glibc's checksum (or, if glibc
        // failed, with the first successful run).
        let reference = mine
            .iter()
            .find(|r| r.ok && r.contender == "glibc")
            .or_else(|| mine.iter().find(|r| r.ok))
            .and_then(|r| r.checksum);
        if let Some(expected) = reference {
            for r in &mut mine {
                let was_ok = r.ok;
                r.check_checksum(expected);
                if was_ok && !r.ok {
                    if let Some(e) = &r.error {
                        pb.suspend(|| eprintln!("error: {e}"));
                    }
                }
            }
        }
        runs.extend(mine);
    }
    pb.finish_and_clear();

    let names: Vec<&str> = selected.iter().map(|w| w.name).collect();
    let cs: Vec<(String, bool)> = contenders
        .iter()
        .map(|c| (c.name.clone(), c.is_anchor()))
        .collect();
    let (rows, best, geomeans) = summarize(&runs, &names, &cs);
    let failures = failures_of(&runs);

    let mut markdown = format!(
        "# General allocation workloads\n\n\
         `c/workloads.c` on every allocator: {threads} threads, scale {sc} (size `{}`), median of {reps} interleaved runs, the order turned by one contender each run. \
         Time is measured inside the program; peak RSS is the program's VmHWM (the JSON also has `ru_maxrss` from `wait4`, \
         which on Linux includes the harness's own size at fork). \
         \"Best anchor\" is the fastest (or smallest) allocator other than Canopy for that workload.\n\n",
        common.size.name()
    );
    markdown.push_str(&machine_markdown(&machine));
    markdown.push('\n');
    markdown.push_str(&contenders_markdown(&common.contenders));
    markdown.push_str("\nWorkloads:\n\n");
    for w in &selected {
        markdown.push_str(&format!("- `{}`: {}\n", w.name, w.about));
    }
    markdown.push_str(&tables(&rows, &best, &geomeans, &names, &cs));
    markdown.push_str(&failures_markdown(&failures));

    let series: Vec<String> = cs.iter().map(|c| c.0.clone()).collect();
    let panel =
        |title: &str, f: fn(&WorkloadRow) -> Option<f64>, g: fn(&Geomean) -> Option<f64>| Panel {
            title: title.into(),
            groups: names
                .iter()
                .map(|w| Group {
                    label: w.to_string(),
                    values: series
                        .iter()
                        .map(|c| {
                            rows.iter()
                                .find(|r| &r.workload == w && &r.contender == c)
                                .and_then(f)
                        })
                        .collect(),
                })
                .chain(std::iter::once(Group {
                    label: "geomean".into(),
                    values: series
                        .iter()
                        .map(|c| geomeans.iter().find(|x| &x.contender == c).and_then(g))
                        .collect(),
                }))
                .collect(),
        };
    let chart = BarChart {
        title: format!("Allocation workloads relative to the best anchor ({threads} threads, scale {sc}; lower is better)"),
        y_label: "ratio to best anchor".into(),
        series: series.clone(),
        panels: vec![
            panel("time", |r| r.time_vs_best_anchor, |g| g.time_vs_best_anchor),
            panel("peak RSS", |r| r.rss_vs_best_anchor, |g| g.rss_vs_best_anchor),
        ],
        reference: Some(1.0),
    };
    let svg = crate::plot::render(&chart)
        .map_err(|e| eprintln!("warning: {e:#}"))
        .ok();

    let report = Report {
        experiment: "workloads".into(),
        title: "General allocation workloads: time and peak RSS".into(),
        paper: "Larson, producer/consumer, false sharing (Hoard), size walk, thread churn, mixed sizes, phases".into(),
        size: common.size,
        params: json!({ "threads": threads, "scale": sc, "runs": reps, "workloads": names }),
        machine,
        contenders: contenders.clone(),
        skipped: common.contenders.skipped.clone(),
        summary: WorkloadSummary {
            threads,
            scale: sc,
            runs: reps,
            rows,
            best_anchors: best,
            geomeans,
        },
        runs,
        failures: failures.clone(),
    };
    let written = report::write_all(&common.results_dir, &report, &markdown, svg.as_deref())?;
    Ok(Finished {
        name: "workloads".into(),
        markdown,
        written,
        failures,
    })
}

fn tables(
    rows: &[WorkloadRow],
    best: &[BestAnchor],
    geo: &[Geomean],
    names: &[&str],
    cs: &[(String, bool)],
) -> String {
    let header = || std::iter::once("workload".to_string()).chain(cs.iter().map(|c| c.0.clone()));
    let cell = |w: &str, c: &str| rows.iter().find(|r| r.workload == w && r.contender == c);
    let mut s = String::new();
    let plain = |title: &str, f: &dyn Fn(&WorkloadRow) -> String, best_col: Option<usize>| {
        let mut t = Table::new(header().chain(best_col.map(|_| "best anchor".to_string())));
        for (i, w) in names.iter().enumerate() {
            let b = best_col.and_then(|k| {
                let e = &best[i];
                if k == 1 {
                    e.fastest.clone()
                } else {
                    e.smallest.clone()
                }
            });
            t.row(
                std::iter::once(w.to_string())
                    .chain(
                        cs.iter()
                            .map(|(c, _)| cell(w, c).map_or_else(|| "–".into(), f)),
                    )
                    .chain(best_col.map(|_| b.unwrap_or_else(|| "–".into()))),
            );
        }
        format!("\n## {title}\n\n{}", t.render())
    };
    let ratios = |title: &str,
                  f: fn(&WorkloadRow) -> Option<f64>,
                  g: fn(&Geomean) -> Option<f64>| {
        let mut t = Table::new(header());
        for w in names {
            t.row(
                std::iter::once(w.to_string())
                    .chain(cs.iter().map(|(c, _)| fmt_ratio(cell(w, c).and_then(f)))),
            );
        }
        t.row(
            std::iter::once("**geomean**".to_string()).chain(
                cs.iter()
                    .map(|(c, _)| fmt_ratio(geo.iter().find(|x| &x.contender == c).and_then(g))),
            ),
        );
        format!("\n## {title}\n\n{}", t.render())
    };
    s.push_str(&plain(
        "Median time",
        &|r| fmt_seconds(r.median_seconds),
        Some(1),
    ));
    s.push_str(&ratios(
        "Time relative to the best anchor (lower is better)",
        |r| r.time_vs_best_anchor,
        |g| g.time_vs_best_anchor,
    ));
    s.push_str(&ratios(
        "Time relative to mimalloc",
        |r| r.time_vs_mimalloc,
        |g| g.time_vs_mimalloc,
    ));
    s.push_str(&plain(
        "Median peak RSS",
        &|r| fmt_kib(r.median_rss_kib),
        Some(2),
    ));
    s.push_str(&ratios(
        "Peak RSS relative to the best anchor (lower is better)",
        |r| r.rss_vs_best_anchor,
        |g| g.rss_vs_best_anchor,
    ));
    s.push_str(&ratios(
        "Peak RSS relative to mimalloc",
        |r| r.rss_vs_mimalloc,
        |g| g.rss_vs_mimalloc,
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(w: &str, c: &str, secs: f64, rss: u64, ok: bool) -> RunRecord {
        RunRecord {
            config: w.into(),
            variant: c.into(),
            contender: c.into(),
            rep: 0,
            ok,
            seconds: Some(secs),
            checksum: Some(1),
            max_rss_kib: Some(rss),
            ru_maxrss_kib: Some(rss),
            wall_seconds: secs,
            instructions: None,
            fields: Default::default(),
            exit: None,
            command: String::new(),
            error: None,
        }
    }

    #[test]
    fn ratios_and_geomeans() {
        let runs = vec![
            rec("a", "glibc", 2.0, 100, true),
            rec("a", "mimalloc", 1.0, 200, true),
            rec("a", "canopy", 0.5, 50, true),
            rec("b", "glibc", 4.0, 100, true),
            rec("b", "mimalloc", 8.0, 100, true),
            rec("b", "canopy", 8.0, 400, true),
            rec("b", "canopy", 99.0, 1, false),
        ];
        let cs = vec![
            ("glibc".to_string(), true),
            ("canopy".to_string(), false),
            ("mimalloc".to_string(), true),
        ];
        let (rows, best, geo) = summarize(&runs, &["a", "b"], &cs);
        let get = |w: &str, c: &str| {
            rows.iter()
                .find(|r| r.workload == w && r.contender == c)
                .unwrap()
        };
        assert_eq!(
            best[0],
            BestAnchor::new("a", Some("mimalloc"), Some("glibc"))
        );
        assert_eq!(best[1], BestAnchor::new("b", Some("glibc"), Some("glibc")));
        assert_eq!(get("a", "canopy").time_vs_best_anchor, Some(0.5));
        assert_eq!(get("b", "canopy").time_vs_best_anchor, Some(2.0));
        assert_eq!(get("b", "canopy").failed_runs, 1);
        assert_eq!(get("a", "canopy").rss_vs_mimalloc, Some(0.25));
        let g = geo.iter().find(|g| g.contender == "canopy").unwrap();
        assert!((g.time_vs_best_anchor.unwrap() - 1.0).abs() < 1e-12);
        assert!((g.rss_vs_best_anchor.unwrap() - 2f64.sqrt()).abs() < 1e-12); // 0.5 and 4
        assert_eq!(g.workloads, 2);
    }
}
