//! `sac`: the with-loop microbenchmark of Grelck & Scholz (paper 000, Fig. 1)
//! and its X sweep (Figs. 5 and 6).
//!
//! For every X and thread count, each variant runs `runs` times, interleaved:
//!
//! - one row per contender: `c/sac.c malloc` with that allocator preloaded;
//! - `canopy-rich`: `c/sac.c rich` on Canopy (class computed once, alloc/free by class);
//! - `canopy-unchecked`: `c/sac.c unchecked`, the same freeing with
//!   `canopy_free_class_unchecked` (no checks: the caller vouches for the block);
//! - `bound`: `c/sac.c bound`, the compute-only lower bound (one temporary per thread);
//! - the Rust kernel (`sac_rs`, `sac_rs_canopy`, `sac_rs_canopy_unchecked`):
//!   `rs-system` (std's System, i.e. glibc), `rs-canopy-global` (Canopy as
//!   `#[global_allocator]`), `rs-canopy-global-unchecked` (`CanopyUnchecked`),
//!   `rs-canopy-rich` (`alloc_class`/`free_class`), `rs-canopy-unchecked`
//!   (`alloc_class`/`free_class_unchecked`) and `rs-bound`.
//!
//! Reported: median time; time relative to glibc at the same X and thread
//! count (paper Fig. 5, with glibc in the place of the Solaris allocator;
//! Rust rows are relative to `rs-system`, which is glibc reached from Rust);
//! speedup over glibc on one thread (Fig. 6); and the share of time spent in
//! the allocator, `(t - t_bound) / t`, against the bound of the same language.

use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;
use serde_json::json;

use super::{
    contenders_markdown, failures_markdown, failures_of, machine_markdown, measure, Common,
    Finished,
};
use crate::anchors::Contender;
use crate::artifacts::{CProgram, Lookup, SAC_RS};
use crate::plot::{BarChart, Group, Panel};
use crate::report::{
    self, fmt_percent, fmt_ratio, fmt_seconds, Machine, Report, RunRecord, Size, Table,
};
use crate::runner::Invocation;
use crate::sac_kernel::expected_checksum;
use crate::stats;

/// The paper's problem size N and iteration count.
pub const PAPER_N: usize = 10_000_000;
/// The paper's iteration count.
pub const PAPER_ITERS: usize = 50;
/// The paper's X sweep.
pub const PAPER_XS: &[usize] = &[1000, 250, 100, 25];

/// Options of the `sac` experiment.
#[derive(Debug, Clone)]
pub struct SacOptions {
    /// Temporary lengths X.
    pub xs: Vec<usize>,
    /// Thread counts.
    pub threads: Vec<usize>,
    /// Override N.
    pub n: Option<usize>,
    /// Override the iteration count.
    pub iters: Option<usize>,
    /// Include the Rust kernel.
    pub rust: bool,
}

impl Default for SacOptions {
    fn default() -> Self {
        SacOptions {
            xs: PAPER_XS.to_vec(),
            threads: default_threads(),
            n: None,
            iters: None,
            rust: true,
        }
    }
}

/// 1, 2, 4, ... up to the number of CPUs, plus the number of CPUs itself.
pub fn default_threads() -> Vec<usize> {
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .max(2);
    let mut v: Vec<usize> = std::iter::successors(Some(1usize), |t| Some(t * 2))
        .take_while(|t| *t <= n)
        .collect();
    if v.last() != Some(&n) {
        v.push(n);
    }
    v
}

/// N and iterations for a size.
pub fn problem_size(size: Size) -> (usize, usize) {
    match size {
        Size::Quick => (1_000_000, 10),
        Size::Default => (PAPER_N, 10),
        Size::Paper => (PAPER_N, PAPER_ITERS),
    }
}

/// Which program a variant runs.
#[derive(Debug, Clone)]
pub(crate) enum Program {
    C(PathBuf),
    Rust(PathBuf),
}

/// One row of the report: a program, a mode and the allocator it runs on.
#[derive(Debug, Clone)]
pub(crate) struct Variant {
    pub label: String,
    pub program: Program,
    pub mode: &'static str,
    pub contender: Contender,
    /// The label of the variant this one's bound is taken from.
    pub bound: &'static str,
    /// The label of its glibc reference: `glibc` for C rows, `rs-system`
    /// (glibc reached from Rust) for Rust rows.
    pub reference: &'static str,
}

impl Variant {
    pub fn invocation(
        &self,
        x: usize,
        n: usize,
        iters: usize,
        threads: usize,
        timeout: std::time::Duration,
    ) -> Invocation {
        let prog = match &self.program {
            Program::C(p) | Program::Rust(p) => p.clone(),
        };
        let args = vec![
            self.mode.to_string(),
            x.to_string(),
            n.to_string(),
            iters.to_string(),
            threads.to_string(),
        ];
        Invocation::new(prog, args, &self.contender, timeout)
    }
}

/// The variants of the SAC kernel on these contenders.  Also returns notes
/// on what had to be left out.
pub(crate) fn variants(
    common: &Common,
    rust: bool,
    with_bound: bool,
) -> Result<(Vec<Variant>, Vec<String>)> {
    let sac = CProgram::Sac.compile()?;
    let mut notes = Vec::new();
    let mut out = Vec::new();
    let glibc = Contender::glibc();
    for c in &common.contenders.list {
        out.push(Variant {
            label: c.name.clone(),
            program: Program::C(sac.clone()),
            mode: "malloc",
            contender: c.clone(),
            bound: "bound",
            reference: "glibc",
        });
    }
    if let Some(c) = common.contenders.get("canopy") {
        out.push(Variant {
            label: "canopy-rich".into(),
            program: Program::C(sac.clone()),
            mode: "rich",
            contender: c.clone(),
            bound: "bound",
            reference: "glibc",
        });
        out.push(Variant {
            label: "canopy-unchecked".into(),
            program: Program::C(sac.clone()),
            mode: "unchecked",
            contender: c.clone(),
            bound: "bound",
            reference: "glibc",
        });
    }
    if with_bound {
        out.push(Variant {
            label: "bound".into(),
            program: Program::C(sac.clone()),
            mode: "bound",
            contender: glibc.clone(),
            bound: "bound",
            reference: "glibc",
        });
    }
    if rust {
        match SAC_RS.locate(Lookup::FindOrBuild) {
            Ok(bins) => {
                let (rs, rs_canopy, rs_canopy_unchecked) = (bins[0].clone(), bins[1].clone(), bins[2].clone());
                out.push(Variant {
                    label: "rs-system".into(),
                    program: Program::Rust(rs.clone()),
                    mode: "system",
                    contender: glibc.clone(),
                    bound: "rs-bound",
                    reference: "rs-system",
                });
                let mut builtin = glibc.clone();
                builtin.name = "canopy (linked in)".into();
                builtin.version = Some("canopy_alloc linked into the binary".into());
                out.push(Variant {
                    label: "rs-canopy-global".into(),
                    program: Program::Rust(rs_canopy),
                    mode: "canopy-global",
                    contender: builtin.clone(),
                    bound: "rs-bound",
                    reference: "rs-system",
                });
                out.push(Variant {
                    label: "rs-canopy-global-unchecked".into(),
                    program: Program::Rust(rs_canopy_unchecked),
                    mode: "canopy-global",
                    contender: builtin.clone(),
                    bound: "rs-bound",
                    reference: "rs-system",
                });
                out.push(Variant {
                    label: "rs-canopy-rich".into(),
                    program: Program::Rust(rs.clone()),
                    mode: "canopy-rich",
                    contender: builtin.clone(),
                    bound: "rs-bound",
                    reference: "rs-system",
                });
                out.push(Variant {
                    label: "rs-canopy-unchecked".into(),
                    program: Program::Rust(rs.clone()),
                    mode: "canopy-unchecked",
                    contender: builtin,
                    bound: "rs-bound",
                    reference: "rs-system",
                });
                if with_bound {
                    out.push(Variant {
                        label: "rs-bound".into(),
                        program: Program::Rust(rs),
                        mode: "bound",
                        contender: glibc,
                        bound: "rs-bound",
                        reference: "rs-system",
                    });
                }
            }
            Err(e) => notes.push(format!("Rust kernel: {e:#}")),
        }
    }
    Ok((out, notes))
}

/// One row of the summary.
#[derive(Debug, Clone, Serialize)]
pub struct SacRow {
    /// Temporary length.
    pub x: usize,
    /// Threads.
    pub threads: usize,
    /// Variant label.
    pub variant: String,
    /// Allocator.
    pub contender: String,
    /// malloc/free pairs per run.
    pub pairs: u64,
    /// Successful runs.
    pub ok_runs: usize,
    /// Failed runs.
    pub failed_runs: usize,
    /// Median kernel time, seconds.
    pub median_seconds: Option<f64>,
    /// Median peak RSS, KiB.
    pub median_rss_kib: Option<u64>,
    /// Median time / glibc's median time (same X, threads); for Rust rows
    /// glibc is `rs-system`.
    pub rel_glibc: Option<f64>,
    /// Median time / the bound's median time (same X, threads, language).
    pub rel_bound: Option<f64>,
    /// (t - t_bound) / t.
    pub alloc_share: Option<f64>,
    /// glibc's median time on one thread / this median time (paper Fig. 6);
    /// for Rust rows glibc is `rs-system`.
    pub speedup_vs_glibc_1t: Option<f64>,
    /// Nanoseconds per pair above the bound: (t - t_bound) / pairs.
    pub ns_per_pair: Option<f64>,
}

/// The derived numbers of a `sac` run.
#[derive(Debug, Clone, Serialize)]
pub struct SacSummary {
    /// N.
    pub n: usize,
    /// Iterations.
    pub iters: usize,
    /// Repetitions per configuration.
    pub runs: usize,
    /// One row per (X, threads, variant).
    pub rows: Vec<SacRow>,
}

fn config_label(x: usize, threads: usize) -> String {
    format!("x={x} threads={threads}")
}

/// Compute the summary from the raw runs.
pub(crate) fn summarize(
    runs: &[RunRecord],
    variants: &[Variant],
    xs: &[usize],
    threads: &[usize],
    n: usize,
    iters: usize,
) -> Vec<SacRow> {
    let med = |cfg: &str, label: &str| {
        let v: Vec<f64> = runs
            .iter()
            .filter(|r| r.ok && r.config == cfg && r.variant == label)
            .filter_map(|r| r.seconds)
            .collect();
        stats::median(&v)
    };
    let mut rows = Vec::new();
    for &t in threads {
        for &x in xs {
            let cfg = config_label(x, t);
            for v in variants {
                let of_v: Vec<&RunRecord> = runs
                    .iter()
                    .filter(|r| r.config == cfg && r.variant == v.label)
                    .collect();
                let ok = of_v.iter().filter(|r| r.ok).count();
                let rss: Vec<u64> = of_v
                    .iter()
                    .filter(|r| r.ok)
                    .filter_map(|r| r.max_rss_kib)
                    .collect();
                let m = med(&cfg, &v.label);
                let glibc = med(&cfg, v.reference);
                let glibc_1t = med(&config_label(x, 1), v.reference);
                let b = med(&cfg, v.bound);
                let pairs = ((n / x) * iters) as u64;
                let is_bound = v.label == v.bound;
                rows.push(SacRow {
                    x,
                    threads: t,
                    variant: v.label.clone(),
                    contender: v.contender.name.clone(),
                    pairs,
                    ok_runs: ok,
                    failed_runs: of_v.len() - ok,
                    median_seconds: m,
                    median_rss_kib: stats::median_u64(&rss),
                    rel_glibc: stats::ratio(m, glibc),
                    rel_bound: stats::ratio(m, b),
                    alloc_share: if is_bound {
                        None
                    } else {
                        stats::alloc_share(m, b)
                    },
                    speedup_vs_glibc_1t: stats::ratio(glibc_1t, m),
                    ns_per_pair: match (m, b) {
                        (Some(m), Some(b)) if !is_bound && pairs > 0 => {
                            Some((m - b) * 1e9 / pairs as f64)
                        }
                        _ => None,
                    },
                });
            }
        }
    }
    rows
}

/// Run the experiment.
pub fn run(common: &Common, opts: &SacOptions) -> Result<Finished> {
    let (def_n, def_iters) = problem_size(common.size);
    let n = opts.n.unwrap_or(def_n);
    let iters = opts.iters.unwrap_or(def_iters);
    let reps = common.runs();
    let machine = Machine::describe();
    for &x in &opts.xs {
        anyhow::ensure!(x >= 1 && x <= n, "X={x} must be between 1 and N={n}");
    }
    anyhow::ensure!(
        opts.threads.iter().all(|&t| t >= 1),
        "thread counts must be at least 1"
    );
    let (variants, notes) = variants(common, opts.rust, true)?;
    for n in &notes {
        eprintln!("warning: {n}");
    }

    let total = (opts.threads.len() * opts.xs.len() * reps * variants.len()) as u64;
    let pb = crate::progress::bar(total, "sac");
    let mut runs = Vec::new();
    for &t in &opts.threads {
        for &x in &opts.xs {
            let cfg = config_label(x, t);
            let expected = expected_checksum(x as u64, n as u64, iters as u64);
            for rep in 0..reps {
                for v in super::rotated(&variants, rep) {
                    pb.set_message(format!("X={x} T={t} {} ({}/{reps})", v.label, rep + 1));
                    let inv = v.invocation(x, n, iters, t, common.timeout);
                    let mut rec = measure(&inv, &cfg, &v.label, &v.contender, rep);
                    rec.check_checksum(expected);
                    if let Some(e) = rec.error.as_ref().filter(|_| !rec.ok) {
                        pb.suspend(|| eprintln!("error: {e}"));
                    }
                    runs.push(rec);
                    pb.inc(1);
                }
            }
        }
    }
    pb.finish_and_clear();

    let rows = summarize(&runs, &variants, &opts.xs, &opts.threads, n, iters);
    let failures = failures_of(&runs);
    let mut skipped = common.contenders.skipped.clone();
    skipped.extend(notes);
    let labels: Vec<String> = variants.iter().map(|v| v.label.clone()).collect();
    let mut markdown = format!(
        "# SAC with-loop microbenchmark (paper 000, Figs. 1, 5, 6)\n\n\
         Grelck & Scholz's kernel: a vector A of N/X elements, {iters} iterations; every element allocates, fills, sums and \
         frees a temporary int vector of length X, so N·iterations additions are done for every X while the number of \
         malloc/free pairs grows as X shrinks. Size `{}`: N = {n}, {iters} iterations, median of {reps} interleaved runs, the order turned by one variant each run.\n\n",
        common.size.name()
    );
    markdown.push_str(&machine_markdown(&machine));
    markdown.push('\n');
    let mut cts = common.contenders.clone();
    cts.skipped = skipped.clone();
    markdown.push_str(&contenders_markdown(&cts));
    markdown.push_str(&variants_legend());
    markdown.push_str(&tables(&rows, &labels, &opts.xs, &opts.threads));
    markdown.push_str(&failures_markdown(&failures));

    let chart = BarChart {
        title: format!("SAC microbenchmark: time relative to glibc, Rust rows to rs-system (N={n}, {iters} iterations; lower is better)"),
        y_label: "time / glibc".into(),
        series: labels.clone(),
        panels: opts
            .threads
            .iter()
            .map(|&t| Panel {
                title: format!("{t} thread{}", if t == 1 { "" } else { "s" }),
                groups: opts
                    .xs
                    .iter()
                    .map(|&x| Group {
                        label: format!("X={x}"),
                        values: labels
                            .iter()
                            .map(|l| rows.iter().find(|r| r.x == x && r.threads == t && &r.variant == l).and_then(|r| r.rel_glibc))
                            .collect(),
                    })
                    .collect(),
            })
            .collect(),
        reference: Some(1.0),
    };
    let svg = crate::plot::render(&chart)
        .map_err(|e| eprintln!("warning: {e:#}"))
        .ok();

    let report = Report {
        experiment: "sac".into(),
        title: "SAC with-loop microbenchmark, X sweep".into(),
        paper: "000 Grelck & Scholz, Figs. 1, 5, 6".into(),
        size: common.size,
        params: json!({ "n": n, "iters": iters, "xs": opts.xs, "threads": opts.threads, "runs": reps, "rust": opts.rust,
                        "variants": labels }),
        machine,
        contenders: common.contenders.list.clone(),
        skipped,
        summary: SacSummary {
            n,
            iters,
            runs: reps,
            rows,
        },
        runs,
        failures: failures.clone(),
    };
    let written = report::write_all(&common.results_dir, &report, &markdown, svg.as_deref())?;
    Ok(Finished {
        name: "sac".into(),
        markdown,
        written,
        failures,
    })
}

fn variants_legend() -> String {
    "\nRows: one per allocator running `c/sac.c malloc` (malloc/free per element); `canopy-rich`: Canopy's rich interface \
     (`canopy_alloc_class`/`canopy_free_class`, class computed once); `canopy-unchecked`: the same freeing with \
     `canopy_free_class_unchecked`, which trusts the pointer and the class (the caller vouches for them; a second free of \
     a block is still refused); `bound`: compute only (one temporary per thread); \
     `rs-*`: the same kernel in Rust (`rs-system` on std's System allocator, i.e. glibc; `rs-canopy-global` with Canopy as \
     `#[global_allocator]`; `rs-canopy-global-unchecked` with `canopy_alloc::CanopyUnchecked` as `#[global_allocator]`, \
     whose `dealloc` trusts the layout; `rs-canopy-rich` with `canopy_alloc::alloc_class`; `rs-canopy-unchecked` with \
     `free_class_unchecked`; `rs-bound`). \
     The C kernel is compiled by `cc -O2`, the Rust one by rustc, so compare rows within a language; \
     `rs-*` rows take their bound from `rs-bound` and their glibc reference from `rs-system`.\n"
        .into()
}

fn col(x: usize, t: usize) -> String {
    format!("X={x} · {t}T")
}

fn tables(rows: &[SacRow], labels: &[String], xs: &[usize], threads: &[usize]) -> String {
    let cols: Vec<(usize, usize)> = threads
        .iter()
        .flat_map(|&t| xs.iter().map(move |&x| (x, t)))
        .collect();
    let find = |l: &str, x: usize, t: usize| {
        rows.iter()
            .find(|r| r.variant == l && r.x == x && r.threads == t)
    };
    let table = |f: &dyn Fn(&SacRow) -> String, cols: &[(usize, usize)], skip_bound: bool| {
        let mut tb = Table::new(
            std::iter::once("variant".to_string()).chain(cols.iter().map(|&(x, t)| col(x, t))),
        );
        for l in labels {
            if skip_bound && (l == "bound" || l == "rs-bound") {
                continue;
            }
            tb.row(
                std::iter::once(l.clone()).chain(
                    cols.iter()
                        .map(|&(x, t)| find(l, x, t).map_or_else(|| "–".into(), f)),
                ),
            );
        }
        tb.render()
    };
    let mut s = String::new();
    s.push_str(
        "\n## Time relative to glibc (same X and threads; `rs-*` rows relative to `rs-system`; lower is better; paper Fig. 5)\n\n",
    );
    s.push_str(&table(&|r| fmt_ratio(r.rel_glibc), &cols, false));
    s.push_str("\n## Median time of the kernel\n\n");
    s.push_str(&table(&|r| fmt_seconds(r.median_seconds), &cols, false));
    s.push_str("\n## Time relative to the compute-only bound (same language, X and threads)\n\n");
    s.push_str(&table(&|r| fmt_ratio(r.rel_bound), &cols, true));
    s.push_str("\n## Share of time in the allocator: (t − t_bound) / t\n\n");
    s.push_str(&table(&|r| fmt_percent(r.alloc_share), &cols, true));
    s.push_str("\n## Cost per malloc+free pair above the bound (ns)\n\n");
    s.push_str(&table(
        &|r| {
            r.ns_per_pair
                .map_or_else(|| "–".into(), |v| format!("{v:.1}"))
        },
        &cols,
        true,
    ));
    let multi: Vec<(usize, usize)> = cols.iter().copied().filter(|&(_, t)| t > 1).collect();
    if !multi.is_empty() && threads.contains(&1) {
        s.push_str("\n## Speedup over glibc on one thread (`rs-*` rows: over `rs-system`; paper Fig. 6; higher is better)\n\n");
        s.push_str(&table(&|r| fmt_ratio(r.speedup_vs_glibc_1t), &multi, false));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_defaults_include_one_and_nproc() {
        let t = default_threads();
        assert_eq!(t[0], 1);
        assert!(t.contains(&2));
        assert!(t.windows(2).all(|w| w[0] < w[1]));
    }

    fn variant(label: &str, bound: &'static str, reference: &'static str) -> Variant {
        Variant {
            label: label.into(),
            program: Program::C(PathBuf::from("/x/sac")),
            mode: "malloc",
            contender: Contender::glibc(),
            bound,
            reference,
        }
    }

    fn rec(cfg: &str, variant: &str, secs: f64, ok: bool) -> RunRecord {
        RunRecord {
            config: cfg.into(),
            variant: variant.into(),
            contender: "glibc".into(),
            rep: 0,
            ok,
            seconds: Some(secs),
            checksum: Some(0),
            max_rss_kib: Some(100),
            ru_maxrss_kib: Some(100),
            wall_seconds: secs,
            instructions: None,
            fields: Default::default(),
            exit: None,
            command: String::new(),
            error: None,
        }
    }

    #[test]
    fn summary_ratios_use_the_right_references() {
        let vs = vec![
            variant("glibc", "bound", "glibc"),
            variant("canopy", "bound", "glibc"),
            variant("bound", "bound", "glibc"),
            variant("rs-system", "rs-bound", "rs-system"),
            variant("rs-canopy-global", "rs-bound", "rs-system"),
            variant("rs-bound", "rs-bound", "rs-system"),
        ];
        let c1 = config_label(25, 1);
        let c2 = config_label(25, 2);
        let mut runs = Vec::new();
        for (cfg, scale) in [(&c1, 1.0), (&c2, 0.5)] {
            for (v, t) in [
                ("glibc", 4.0),
                ("canopy", 2.0),
                ("bound", 1.0),
                ("rs-system", 2.0),
                ("rs-canopy-global", 1.0),
                ("rs-bound", 0.5),
            ] {
                runs.push(rec(cfg, v, t * scale, true));
                runs.push(rec(cfg, v, t * scale * 3.0, true));
                runs.push(rec(cfg, v, t * scale / 3.0, true));
                runs.push(rec(cfg, v, 1000.0, false)); // failed runs do not count
            }
        }
        let rows = summarize(&runs, &vs, &[25], &[1, 2], 1000, 2);
        let row = |v: &str, t: usize| {
            rows.iter()
                .find(|r| r.variant == v && r.threads == t)
                .unwrap()
        };
        let canopy = row("canopy", 1);
        assert_eq!(canopy.median_seconds, Some(2.0));
        assert_eq!(canopy.rel_glibc, Some(0.5));
        assert_eq!(canopy.rel_bound, Some(2.0));
        assert_eq!(canopy.alloc_share, Some(0.5));
        assert_eq!(canopy.ok_runs, 3);
        assert_eq!(canopy.failed_runs, 1);
        assert_eq!(canopy.pairs, 80);
        assert!((canopy.ns_per_pair.unwrap() - 1e9 / 80.0).abs() < 1e-3);
        let rs = row("rs-canopy-global", 1);
        assert_eq!(rs.rel_glibc, Some(0.5)); // against rs-system, not C glibc
        assert_eq!(rs.alloc_share, Some(0.5));
        assert_eq!(row("bound", 1).alloc_share, None);
        // Fig. 6: glibc on one thread over this row on two threads.
        assert_eq!(row("canopy", 2).speedup_vs_glibc_1t, Some(4.0));
        assert_eq!(row("rs-canopy-global", 2).speedup_vs_glibc_1t, Some(4.0));
    }

    #[test]
    fn sizes() {
        assert_eq!(problem_size(Size::Paper), (10_000_000, 50));
        let (n, i) = problem_size(Size::Quick);
        assert!(n * i < 10_000_000 * 50 / 10);
    }
}
