//! `hh-suite`: the parallel benchmark suite of paper 004 (Arora, Westrick,
//! Acar, "Efficient Parallel Functional Programming with Effects"), §5: the
//! programs of its cross-language comparison (§5.5, Figs. 9 and 10) plus fib
//! and nqueens, measured the way its §5.1 (Fig. 6) measures MPL against
//! MLton: T_1/T_s, T_p/T_s, the speedup, and peak RSS against the
//! sequential baseline.
//!
//! | program | what it computes | allocation in the rayon version |
//! |---|---|---|
//! | `primes` | segmented sieve up to n, every prime as `Vec<u32>` | one 64 KiB scratch map and one small `Vec` per segment, flattened |
//! | `msort-int64` | stable sort of hashed i64 into a fresh vector | the output and `par_sort`'s n/2 merge buffer |
//! | `tokens` | `Vec<&str>` of the whitespace-separated tokens | per-task `Vec`s joined by `collect` |
//! | `mcss` | maximum contiguous subsequence sum | none (a reduction of 4-word summaries) |
//! | `linefit` | least-squares line (exact integer sums) | none (a reduction of 5-word sums) |
//! | `sparse-mxv` | y = A·x, CSR | the output vector |
//! | `wc` | lines, words, bytes | none |
//! | `fib` | naive fib with a sequential cutoff | none (fork-join only) |
//! | `nqueens` | count of n-queens solutions, a fork per column | none (fork-join only) |
//!
//! **Variants.**  [`Variant::Seq`] is the sequential baseline (one thread, no
//! runtime, plain `Vec`: the analogue of the paper's MLton column);
//! [`Variant::Rayon`] forks with rayon on the system allocator, inside a
//! `rayon::ThreadPool` of the requested size built for each run;
//! [`Variant::Hh`] (`canopy-hh`, the paper's MPL column) is the program
//! written against Canopy's hierarchical heaps: a `canopy_hh::run` task tree
//! forking with `Scope::par` on the same kind of pool, everything the
//! algorithm allocates in the managed heap. Its child also reports the
//! collector's counters of the timed run.
//!
//! **Measurement.**  Every run is a child process (the `canopy` binary's
//! hidden `bench hh-suite-child` subcommand, or any command given in
//! [`HhOptions::child`]): it generates the input (untimed, in a temporary
//! thread pool it then drops), runs the variant `warmups` times untimed and
//! once timed, checks nothing itself, and prints one result line with the
//! time, the answer's checksum, its peak RSS (`VmHWM`) and the RSS before
//! the timed part (`VmRSS` after generating the input).  The harness runs the
//! configurations of a program interleaved (seq, rayon 1T, rayon 2T, seq,
//! ...), takes medians, and fails every run whose checksum differs from the
//! sequential baseline's, naming program, variant, threads and input.
//!
//! **Inputs** come from [`input`]: pure functions of the size and the seed.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::json;

use super::{failures_markdown, machine_markdown, Finished};
use crate::anchors::Contender;
use crate::plot::{BarChart, Group, Panel};
use crate::report::{
    self, fmt_kib, fmt_ratio, fmt_seconds, Machine, Report, RunRecord, Size, Table,
};
use crate::runner::Invocation;
use crate::stats;

pub mod input;
pub mod managed;
pub mod programs;

/// How a program is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// The sequential baseline: one thread, no runtime, plain `Vec`s.
    Seq,
    /// rayon fork-join on the system allocator.
    Rayon,
    /// canopy-hh fork-join (on a rayon pool) with a managed heap per task.
    #[serde(rename = "canopy-hh")]
    Hh,
}

impl Variant {
    /// Every variant, in report order.
    pub const ALL: [Variant; 3] = [Variant::Seq, Variant::Rayon, Variant::Hh];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Seq => "seq",
            Variant::Rayon => "rayon",
            Variant::Hh => "canopy-hh",
        }
    }

    /// Parse a name.
    pub fn parse(s: &str) -> Result<Variant> {
        Variant::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| anyhow!("unknown variant {s:?} (known: seq, rayon, canopy-hh)"))
    }

    /// Whether it runs in a thread pool (and so is measured per thread count).
    pub fn parallel(self) -> bool {
        self != Variant::Seq
    }
}

/// A program's size parameters: its main size `n` and a second number whose
/// meaning is the program's (fib's cutoff, nqueens' forked rows, the
/// entries per row of sparse-mxv; 0 when unused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Params {
    /// Main size.
    pub n: u64,
    /// Second parameter.
    pub grain: u64,
}

impl Params {
    /// Just `n`.
    pub fn n(n: u64) -> Params {
        Params { n, grain: 0 }
    }
}

/// A program's answer, as compared between variants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Must be equal for every variant.
    pub checksum: u64,
    /// Human-readable, `key:value` pairs separated by commas (no spaces).
    pub summary: String,
}

/// One benchmark program.  `run` is the timed part; `generate` and `answer`
/// are not timed.
pub trait Program: Sync {
    /// The generated input.
    type Input: Sync + Send;
    /// What a run produces (it may borrow the input, as tokens' `&str`s do).
    type Output<'a>: Send
    where
        Self: 'a;
    /// Name on the command line and in reports.
    fn name(&self) -> &'static str;
    /// One line on what it computes.
    fn about(&self) -> &'static str;
    /// Size parameters for a size.
    fn params(&self, size: Size) -> Params;
    /// The input described in a few words.
    fn label(&self, p: &Params) -> String;
    /// The input (deterministic in `p` and `seed`; may use the current rayon pool).
    fn generate(&self, p: &Params, seed: u64) -> Self::Input;
    /// One run of `variant` (rayon variants are called inside their pool).
    fn run<'a>(&self, variant: Variant, input: &'a Self::Input) -> Self::Output<'a>;
    /// The answer of an output.
    fn answer(&self, out: &Self::Output<'_>, input: &Self::Input) -> Answer;
}

/// What one measured run of a child leaves.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Seconds of the timed run.
    pub seconds: f64,
    /// Its answer.
    pub answer: Answer,
    /// Seconds spent generating the input.
    pub generate_seconds: f64,
    /// The canopy-hh counters of the timed run (canopy-hh variant only).
    pub hh_stats: Option<canopy_hh::Stats>,
}

/// A [`Program`] with its types erased, so that programs fit in one table.
pub trait Bench: Sync {
    /// Name.
    fn name(&self) -> &'static str;
    /// What it computes.
    fn about(&self) -> &'static str;
    /// Size parameters for a size.
    fn params(&self, size: Size) -> Params;
    /// The input in words.
    fn label(&self, p: &Params) -> String;
    /// Generate the input and measure one run of `variant` on `threads`
    /// threads after `warmups` untimed runs.  `before_timed` is called just
    /// before the timed run (the child reads its RSS there).
    fn measure(
        &self,
        variant: Variant,
        threads: usize,
        p: &Params,
        seed: u64,
        warmups: usize,
        before_timed: &mut dyn FnMut(),
    ) -> Result<Measured>;
}

impl<P: Program> Bench for P {
    fn name(&self) -> &'static str {
        Program::name(self)
    }
    fn about(&self) -> &'static str {
        Program::about(self)
    }
    fn params(&self, size: Size) -> Params {
        Program::params(self, size)
    }
    fn label(&self, p: &Params) -> String {
        Program::label(self, p)
    }
    fn measure(
        &self,
        variant: Variant,
        threads: usize,
        p: &Params,
        seed: u64,
        warmups: usize,
        before_timed: &mut dyn FnMut(),
    ) -> Result<Measured> {
        let t = Instant::now();
        let input = {
            let gen_pool = rayon::ThreadPoolBuilder::new()
                .thread_name(|i| format!("hh-gen-{i}"))
                .build()
                .context("building the input generator's thread pool")?;
            gen_pool.install(|| self.generate(p, seed))
        };
        let generate_seconds = t.elapsed().as_secs_f64();
        let pool = if variant.parallel() {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads.max(1))
                    .build()
                    .context("building the rayon thread pool")?,
            )
        } else {
            None
        };
        let once = || match &pool {
            Some(pool) => pool.install(|| self.run(variant, &input)),
            None => self.run(variant, &input),
        };
        for _ in 0..warmups {
            drop(std::hint::black_box(once()));
        }
        before_timed();
        let _ = managed::take_stats();
        let t = Instant::now();
        let out = std::hint::black_box(once());
        let seconds = t.elapsed().as_secs_f64();
        let hh_stats = managed::take_stats().filter(|_| variant == Variant::Hh);
        let answer = self.answer(&out, &input);
        drop(out);
        Ok(Measured {
            seconds,
            answer,
            generate_seconds,
            hh_stats,
        })
    }
}

/// Every program, in report order.
pub fn programs() -> Vec<&'static dyn Bench> {
    vec![
        &programs::Primes,
        &programs::Msort,
        &programs::Tokens,
        &programs::Mcss,
        &programs::Linefit,
        &programs::SparseMxv,
        &programs::Wc,
        &programs::Fib,
        &programs::Nqueens,
    ]
}

/// The program called `name`.
pub fn program(name: &str) -> Result<&'static dyn Bench> {
    programs()
        .into_iter()
        .find(|p| p.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = programs().iter().map(|p| p.name()).collect();
            anyhow!("unknown program {name:?} (known: {})", names.join(", "))
        })
}

/// A `/proc/self/status` field in KiB (`VmHWM`, `VmRSS`).
pub fn proc_status_kib(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// The 1-minute load average of the machine (other processes compete for
/// the cores; the report shows the load during the runs).
pub fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// What the child subcommand is asked to do.
#[derive(Debug, Clone)]
pub struct ChildArgs {
    /// Program name.
    pub program: String,
    /// Variant name.
    pub variant: String,
    /// Threads of the rayon pool (ignored by `seq`).
    pub threads: usize,
    /// Main size.
    pub n: u64,
    /// Second size parameter.
    pub grain: u64,
    /// Input seed.
    pub seed: u64,
    /// Untimed runs before the timed one.
    pub warmups: usize,
}

/// The child's work: measure one run and return its result line
/// (`checksum=... seconds=... peak_kib=... base_kib=... answer=... ...`; the
/// canopy-hh variant appends its counters: `gc_collections= gc_bytes_copied=
/// gc_seconds= gc_bytes_reclaimed= hh_forks= hh_bytes_allocated=
/// hh_peak_heap_kib=`).
pub fn child_main(a: &ChildArgs) -> Result<String> {
    let prog = program(&a.program)?;
    let variant = Variant::parse(&a.variant)?;
    let p = Params {
        n: a.n,
        grain: a.grain,
    };
    let mut base_kib = None;
    let m = prog.measure(variant, a.threads, &p, a.seed, a.warmups, &mut || {
        base_kib = proc_status_kib("VmRSS");
    })?;
    let peak = proc_status_kib("VmHWM").unwrap_or(0);
    let hh = m.hh_stats.map_or_else(String::new, |st| {
        format!(
            " gc_collections={} gc_bytes_copied={} gc_seconds={:.6} gc_bytes_reclaimed={} hh_forks={} hh_bytes_allocated={} hh_peak_heap_kib={}",
            st.collections,
            st.bytes_copied,
            st.gc_nanos as f64 * 1e-9,
            st.bytes_reclaimed,
            st.forks,
            st.bytes_allocated,
            st.peak_heap_bytes / 1024
        )
    });
    Ok(format!(
        "checksum={} seconds={:.6} peak_kib={} base_kib={} generate_seconds={:.3} loadavg={} answer={} program={} variant={} threads={}{}",
        m.answer.checksum,
        m.seconds,
        peak,
        base_kib.unwrap_or(0),
        m.generate_seconds,
        loadavg().map_or_else(|| "?".into(), |l| format!("{l:.2}")),
        m.answer.summary,
        a.program,
        variant.name(),
        if variant.parallel() { a.threads } else { 1 },
        hh,
    ))
}

/// How the harness starts a child: `program args... <child arguments>`.
#[derive(Debug, Clone)]
pub struct ChildCommand {
    /// The executable (normally the running `canopy` binary).
    pub program: PathBuf,
    /// Arguments before the child's own (`bench hh-suite-child`).
    pub args: Vec<String>,
}

/// Options of `hh-suite`.
#[derive(Debug, Clone)]
pub struct HhOptions {
    /// Programs to run (empty: all).
    pub programs: Vec<String>,
    /// Thread counts of the rayon and canopy-hh variants.
    pub threads: Vec<usize>,
    /// Untimed runs before the timed one, in each child.
    pub warmups: usize,
    /// Input seed.
    pub seed: u64,
    /// How to start a child.
    pub child: ChildCommand,
}

/// Thread counts by default: 1, 2 and then doubling up to the CPUs.
pub fn default_threads() -> Vec<usize> {
    super::sac::default_threads()
}

/// Settings for the run as a whole.
#[derive(Debug, Clone)]
pub struct HhCommon {
    /// Problem size.
    pub size: Size,
    /// Repetitions (`None`: the size's default).
    pub runs: Option<usize>,
    /// Where results go.
    pub results_dir: PathBuf,
    /// Kill a child after this long.
    pub timeout: Duration,
}

/// One measured configuration of one program.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Program.
    pub program: String,
    /// Variant (`seq`, `rayon`, `canopy-hh`).
    pub variant: String,
    /// Threads (1 for seq).
    pub threads: usize,
    /// Successful runs.
    pub ok_runs: usize,
    /// Failed runs.
    pub failed_runs: usize,
    /// Median seconds of the timed run.
    pub median_seconds: Option<f64>,
    /// Median peak RSS (VmHWM), KiB.
    pub median_peak_kib: Option<u64>,
    /// Median RSS just before the timed run (the input and the runtime), KiB.
    pub median_base_kib: Option<u64>,
    /// canopy-hh counters of the timed run (medians; `None` for the other variants).
    pub gc: Option<GcMedians>,
}

/// Medians of the canopy-hh counters of the timed runs of one configuration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct GcMedians {
    /// Leaf collections.
    pub collections: f64,
    /// Bytes the collector copied.
    pub bytes_copied: f64,
    /// Seconds spent collecting (summed over tasks, so it can exceed the wall time on p threads).
    pub gc_seconds: f64,
    /// Bytes of chunks the collector released.
    pub bytes_reclaimed: f64,
    /// Tasks forked.
    pub forks: f64,
    /// Bytes of managed objects allocated.
    pub bytes_allocated: f64,
    /// Largest task heap, KiB.
    pub peak_heap_kib: f64,
}

/// Derived numbers of one program.
#[derive(Debug, Clone, Serialize)]
pub struct ProgramSummary {
    /// Program.
    pub program: String,
    /// Its input.
    pub input: String,
    /// Size parameters.
    pub params: Params,
    /// The sequential answer.
    pub answer: Option<String>,
    /// T_s.
    pub t_seq: Option<f64>,
    /// (threads, T_p / T_s) of rayon.
    pub rel_seq: Vec<(usize, Option<f64>)>,
    /// T_1 / T_2 of rayon.
    pub speedup_1_to_2: Option<f64>,
    /// T_s / T_p at the most threads.
    pub speedup_vs_seq_max: Option<f64>,
    /// (threads, R_p / R_s) of rayon.
    pub rss_rel_seq: Vec<(usize, Option<f64>)>,
    /// (threads, T_p / T_s) of canopy-hh.
    pub hh_rel_seq: Vec<(usize, Option<f64>)>,
    /// T_1 / T_2 of canopy-hh.
    pub hh_speedup_1_to_2: Option<f64>,
    /// (threads, T_s / T_p) of canopy-hh.
    pub hh_speedup_vs_seq: Vec<(usize, Option<f64>)>,
    /// (threads, T_p(canopy-hh) / T_p(rayon)).
    pub hh_vs_rayon: Vec<(usize, Option<f64>)>,
    /// (threads, R_p / R_s) of canopy-hh.
    pub hh_rss_rel_seq: Vec<(usize, Option<f64>)>,
}

/// One of issue 5's targets for canopy-hh, checked against the geomeans.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// What is measured.
    pub metric: String,
    /// The bound, as text (`<= 1.3`).
    pub bound: String,
    /// canopy-hh's value.
    pub hh: Option<f64>,
    /// rayon's value of the same metric, where it has one.
    pub rayon: Option<f64>,
    /// The paper's reference value, as text.
    pub paper: String,
    /// Whether canopy-hh meets it (`None`: not measured).
    pub met: Option<bool>,
}

/// The summary in the JSON.
#[derive(Debug, Clone, Serialize)]
pub struct HhSummary {
    /// Per configuration medians.
    pub rows: Vec<Row>,
    /// Per program ratios.
    pub programs: Vec<ProgramSummary>,
    /// Geomeans over programs: (threads, geomean T_p/T_s) of rayon.
    pub geomean_rel_seq: Vec<(usize, Option<f64>)>,
    /// Geomean of T_1/T_2.
    pub geomean_speedup_1_to_2: Option<f64>,
    /// Geomeans of R_p/R_s.
    pub geomean_rss_rel_seq: Vec<(usize, Option<f64>)>,
    /// canopy-hh: (threads, geomean T_p/T_s).
    pub geomean_hh_rel_seq: Vec<(usize, Option<f64>)>,
    /// canopy-hh: geomean of T_1/T_2.
    pub geomean_hh_speedup_1_to_2: Option<f64>,
    /// canopy-hh: (threads, geomean T_s/T_p).
    pub geomean_hh_speedup_vs_seq: Vec<(usize, Option<f64>)>,
    /// (threads, geomean T_p(canopy-hh) / T_p(rayon)).
    pub geomean_hh_vs_rayon: Vec<(usize, Option<f64>)>,
    /// canopy-hh: (threads, geomean R_p/R_s).
    pub geomean_hh_rss_rel_seq: Vec<(usize, Option<f64>)>,
    /// Issue 5's targets against the geomeans.
    pub targets: Vec<Target>,
    /// Variants not measured, and why.
    pub missing: Vec<String>,
    /// The 1-minute load average at the end of each successful run, sorted.
    pub load_during: Vec<f64>,
}

fn config_label(prog: &str) -> String {
    prog.to_string()
}

fn variant_label(v: Variant, threads: usize) -> String {
    if v.parallel() {
        format!("{}-{threads}T", v.name())
    } else {
        v.name().to_string()
    }
}

/// Run the suite.
pub fn run(common: &HhCommon, opts: &HhOptions) -> Result<Finished> {
    let progs: Vec<&'static dyn Bench> = if opts.programs.is_empty() {
        programs()
    } else {
        opts.programs
            .iter()
            .map(|n| program(n))
            .collect::<Result<_>>()?
    };
    if opts.threads.is_empty() || opts.threads.contains(&0) {
        bail!("--threads needs positive thread counts");
    }
    let mut threads = opts.threads.clone();
    threads.sort_unstable();
    threads.dedup();
    let reps = common
        .runs
        .unwrap_or_else(|| common.size.default_runs())
        .max(1);
    let machine = Machine::describe();
    let glibc = Contender::glibc();
    let mut configs: Vec<(Variant, usize)> = vec![(Variant::Seq, 1)];
    configs.extend(threads.iter().map(|&t| (Variant::Rayon, t)));
    configs.extend(threads.iter().map(|&t| (Variant::Hh, t)));

    let total = (progs.len() * reps * configs.len()) as u64;
    let bar = crate::progress::bar(total, "hh-suite");
    let mut runs: Vec<RunRecord> = Vec::new();
    let mut answers: Vec<Option<String>> = Vec::new();
    for prog in &progs {
        let p = prog.params(common.size);
        let label = prog.label(&p);
        let mut reference: Option<(u64, String)> = None;
        let first = runs.len();
        for rep in 0..reps {
            for &(v, t) in &configs {
                let vl = variant_label(v, t);
                bar.set_message(format!("{} {vl} #{rep}", prog.name()));
                let mut args = opts.child.args.clone();
                args.extend([
                    "--program".into(),
                    prog.name().into(),
                    "--variant".into(),
                    v.name().into(),
                    "--threads".into(),
                    t.to_string(),
                    "--n".into(),
                    p.n.to_string(),
                    "--grain".into(),
                    p.grain.to_string(),
                    "--seed".into(),
                    opts.seed.to_string(),
                    "--warmups".into(),
                    opts.warmups.to_string(),
                ]);
                let inv = Invocation {
                    program: opts.child.program.clone(),
                    args,
                    preload: None,
                    wrapper: Vec::new(),
                    env: Vec::new(),
                    timeout: common.timeout,
                };
                let mut rec = super::measure(&inv, &config_label(prog.name()), &vl, &glibc, rep);
                rec.fields.insert("input".into(), label.clone());
                judge(
                    &mut rec,
                    &mut reference,
                    prog.name(),
                    &vl,
                    &label,
                    opts.seed,
                );
                runs.push(rec);
                bar.inc(1);
            }
        }
        // Runs before the first sequential answer could not be judged then.
        if let Some((c, _)) = &reference {
            for r in &mut runs[first..] {
                if r.ok && r.checksum != Some(*c) {
                    let v = r.variant.clone();
                    judge(
                        r,
                        &mut reference.clone(),
                        prog.name(),
                        &v,
                        &label,
                        opts.seed,
                    );
                }
            }
        } else {
            for r in &mut runs[first..] {
                if r.ok {
                    r.ok = false;
                    r.error = Some(format!(
                        "{}: {} on {label} (seed {}): no sequential run succeeded, so its answer cannot be checked",
                        prog.name(),
                        r.variant,
                        opts.seed
                    ));
                }
            }
        }
        answers.push(reference.map(|(_, s)| s));
    }
    bar.finish_and_clear();

    let rows = summarize_rows(&runs, &progs, &configs);
    let failures = super::failures_of(&runs);
    let mut summary = summarize(rows, &progs, common.size, &threads, answers);
    summary.load_during = runs
        .iter()
        .filter(|r| r.ok)
        .filter_map(|r| r.fields.get("loadavg")?.parse::<f64>().ok())
        .collect();
    summary.load_during.sort_by(f64::total_cmp);
    let markdown = markdown(&summary, &machine, common, reps, opts, &failures);
    let svg = crate::plot::render(&chart(&summary, &threads))
        .map_err(|e| eprintln!("warning: {e:#}"))
        .ok();
    let report = Report {
        experiment: "hh-suite".into(),
        title: "Parallel benchmark suite: sequential baseline, rayon and canopy-hh".into(),
        paper: "004 Arora et al. §5 (Figs. 6, 9, 10)".into(),
        size: common.size,
        params: json!({
            "programs": progs.iter().map(|p| json!({
                "name": p.name(), "about": p.about(), "params": p.params(common.size), "input": p.label(&p.params(common.size))
            })).collect::<Vec<_>>(),
            "threads": threads, "runs": reps, "warmups": opts.warmups, "seed": opts.seed,
            "variants": configs.iter().map(|&(v, t)| variant_label(v, t)).collect::<Vec<_>>(),
        }),
        machine,
        contenders: vec![glibc],
        skipped: summary.missing.clone(),
        summary,
        runs,
        failures: failures.clone(),
    };
    let written = report::write_all(&common.results_dir, &report, &markdown, svg.as_deref())?;
    Ok(Finished {
        name: "hh-suite".into(),
        markdown,
        written,
        failures,
    })
}

/// Check a run's answer against the sequential baseline's; the first
/// successful `seq` run sets the reference.
fn judge(
    rec: &mut RunRecord,
    reference: &mut Option<(u64, String)>,
    prog: &str,
    variant: &str,
    input: &str,
    seed: u64,
) {
    if !rec.ok {
        if let Some(e) = &mut rec.error {
            *e = format!("{prog}: {variant} on {input} (seed {seed}): {e}");
        }
        return;
    }
    let (Some(c), answer) = (
        rec.checksum,
        rec.fields.get("answer").cloned().unwrap_or_default(),
    ) else {
        return;
    };
    match reference {
        None if variant == Variant::Seq.name() => *reference = Some((c, answer)),
        None => {}
        Some((want, want_answer)) if c != *want => {
            rec.ok = false;
            rec.error = Some(format!(
                "{prog}: {variant} on {input} (seed {seed}) answered checksum={c} ({answer}), \
                 but the sequential baseline answered checksum={want} ({want_answer}); `{}`",
                rec.command
            ));
        }
        Some(_) => {}
    }
}

fn summarize_rows(
    runs: &[RunRecord],
    progs: &[&dyn Bench],
    configs: &[(Variant, usize)],
) -> Vec<Row> {
    let mut rows = Vec::new();
    for prog in progs {
        for &(v, t) in configs {
            let vl = variant_label(v, t);
            let mine: Vec<&RunRecord> = runs
                .iter()
                .filter(|r| r.config == prog.name() && r.variant == vl)
                .collect();
            let ok: Vec<&&RunRecord> = mine.iter().filter(|r| r.ok).collect();
            let secs: Vec<f64> = ok.iter().filter_map(|r| r.seconds).collect();
            let peak: Vec<u64> = ok.iter().filter_map(|r| r.max_rss_kib).collect();
            let base: Vec<u64> = ok
                .iter()
                .filter_map(|r| r.fields.get("base_kib")?.parse().ok())
                .filter(|&k| k > 0)
                .collect();
            let field = |key: &str| {
                let xs: Vec<f64> = ok
                    .iter()
                    .filter_map(|r| r.fields.get(key)?.parse().ok())
                    .collect();
                stats::median(&xs)
            };
            let gc = (v == Variant::Hh)
                .then(|| {
                    Some(GcMedians {
                        collections: field("gc_collections")?,
                        bytes_copied: field("gc_bytes_copied")?,
                        gc_seconds: field("gc_seconds")?,
                        bytes_reclaimed: field("gc_bytes_reclaimed").unwrap_or(0.0),
                        forks: field("hh_forks").unwrap_or(0.0),
                        bytes_allocated: field("hh_bytes_allocated").unwrap_or(0.0),
                        peak_heap_kib: field("hh_peak_heap_kib").unwrap_or(0.0),
                    })
                })
                .flatten();
            rows.push(Row {
                program: prog.name().into(),
                variant: v.name().into(),
                threads: t,
                ok_runs: ok.len(),
                failed_runs: mine.len() - ok.len(),
                median_seconds: stats::median(&secs),
                median_peak_kib: stats::median_u64(&peak),
                median_base_kib: stats::median_u64(&base),
                gc,
            });
        }
    }
    rows
}

fn find<'a>(rows: &'a [Row], prog: &str, v: Variant, t: usize) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.program == prog && r.variant == v.name() && (!v.parallel() || r.threads == t))
}

fn kib(k: Option<u64>) -> Option<f64> {
    k.map(|k| k as f64)
}

/// A per-thread-count series of a program's summary.
type PerThreadOf = dyn Fn(&ProgramSummary) -> &[(usize, Option<f64>)];

fn pick(v: &[(usize, Option<f64>)], t: usize) -> Option<f64> {
    v.iter().find(|x| x.0 == t).and_then(|x| x.1)
}

fn summarize(
    rows: Vec<Row>,
    progs: &[&dyn Bench],
    size: Size,
    threads: &[usize],
    answers: Vec<Option<String>>,
) -> HhSummary {
    let mut out = Vec::new();
    let both_1_2 = threads.contains(&1) && threads.contains(&2);
    for (prog, answer) in progs.iter().zip(answers) {
        let name = prog.name();
        let seq = find(&rows, name, Variant::Seq, 1);
        let t_seq = seq.and_then(|r| r.median_seconds);
        let r_seq = kib(seq.and_then(|r| r.median_peak_kib));
        let tp = |v: Variant, t: usize| find(&rows, name, v, t).and_then(|r| r.median_seconds);
        let rp = |v: Variant, t: usize| kib(find(&rows, name, v, t).and_then(|r| r.median_peak_kib));
        let per_t = |f: &dyn Fn(usize) -> Option<f64>| -> Vec<(usize, Option<f64>)> {
            threads.iter().map(|&t| (t, f(t))).collect()
        };
        let p = prog.params(size);
        out.push(ProgramSummary {
            program: name.into(),
            input: prog.label(&p),
            params: p,
            answer,
            t_seq,
            rel_seq: per_t(&|t| stats::ratio(tp(Variant::Rayon, t), t_seq)),
            speedup_1_to_2: if both_1_2 {
                stats::ratio(tp(Variant::Rayon, 1), tp(Variant::Rayon, 2))
            } else {
                None
            },
            speedup_vs_seq_max: threads
                .last()
                .and_then(|&t| stats::ratio(t_seq, tp(Variant::Rayon, t))),
            rss_rel_seq: per_t(&|t| stats::ratio(rp(Variant::Rayon, t), r_seq)),
            hh_rel_seq: per_t(&|t| stats::ratio(tp(Variant::Hh, t), t_seq)),
            hh_speedup_1_to_2: if both_1_2 {
                stats::ratio(tp(Variant::Hh, 1), tp(Variant::Hh, 2))
            } else {
                None
            },
            hh_speedup_vs_seq: per_t(&|t| stats::ratio(t_seq, tp(Variant::Hh, t))),
            hh_vs_rayon: per_t(&|t| stats::ratio(tp(Variant::Hh, t), tp(Variant::Rayon, t))),
            hh_rss_rel_seq: per_t(&|t| stats::ratio(rp(Variant::Hh, t), r_seq)),
        });
    }
    let geo = |f: &dyn Fn(&ProgramSummary) -> Option<f64>| {
        let xs: Vec<f64> = out.iter().filter_map(f).collect();
        if xs.len() == out.len() {
            stats::geomean(&xs)
        } else {
            None
        }
    };
    let geo_t = |f: &PerThreadOf| -> Vec<(usize, Option<f64>)> {
        threads.iter().map(|&t| (t, geo(&|s| pick(f(s), t)))).collect()
    };
    let geomean_rel_seq = geo_t(&|s| &s.rel_seq);
    let geomean_speedup_1_to_2 = geo(&|s| s.speedup_1_to_2);
    let geomean_rss_rel_seq = geo_t(&|s| &s.rss_rel_seq);
    let geomean_hh_rel_seq = geo_t(&|s| &s.hh_rel_seq);
    let geomean_hh_speedup_1_to_2 = geo(&|s| s.hh_speedup_1_to_2);
    let geomean_hh_speedup_vs_seq = geo_t(&|s| &s.hh_speedup_vs_seq);
    let geomean_hh_vs_rayon = geo_t(&|s| &s.hh_vs_rayon);
    let geomean_hh_rss_rel_seq = geo_t(&|s| &s.hh_rss_rel_seq);

    let at_most = |v: Option<f64>, bound: f64| v.map(|v| v <= bound);
    let mut targets = vec![
        Target {
            metric: "geomean T_1/T_s".into(),
            bound: "≤ 1.3".into(),
            hh: pick(&geomean_hh_rel_seq, 1),
            rayon: pick(&geomean_rel_seq, 1),
            paper: "1.34 (MPL* over MLton, Fig. 6)".into(),
            met: at_most(pick(&geomean_hh_rel_seq, 1), 1.3),
        },
        Target {
            metric: "geomean speedup T_1/T_2".into(),
            bound: "≥ 1.8".into(),
            hh: geomean_hh_speedup_1_to_2,
            rayon: geomean_speedup_1_to_2,
            paper: "–".into(),
            met: geomean_hh_speedup_1_to_2.map(|v| v >= 1.8),
        },
    ];
    for &t in threads {
        targets.push(Target {
            metric: format!("geomean T_{t}(canopy-hh)/T_{t}(rayon)"),
            bound: "≤ 1.5".into(),
            hh: pick(&geomean_hh_vs_rayon, t),
            rayon: None,
            paper: "≈ 1.6 (MPL* against C/C++, Fig. 9)".into(),
            met: at_most(pick(&geomean_hh_vs_rayon, t), 1.5),
        });
    }
    targets.push(Target {
        metric: "geomean R_2/R_s".into(),
        bound: "≤ 1.5".into(),
        hh: pick(&geomean_hh_rss_rel_seq, 2),
        rayon: pick(&geomean_rss_rel_seq, 2),
        paper: "R_72/R_s 0.68 (72 cores, Fig. 6)".into(),
        met: at_most(pick(&geomean_hh_rss_rel_seq, 2), 1.5),
    });
    let missing = if rows
        .iter()
        .any(|r| r.variant == Variant::Hh.name() && r.ok_runs > 0)
    {
        Vec::new()
    } else {
        vec!["canopy-hh: no successful run, so it has no numbers here (see the failures).".into()]
    };
    HhSummary {
        geomean_rel_seq,
        geomean_speedup_1_to_2,
        geomean_rss_rel_seq,
        geomean_hh_rel_seq,
        geomean_hh_speedup_1_to_2,
        geomean_hh_speedup_vs_seq,
        geomean_hh_vs_rayon,
        geomean_hh_rss_rel_seq,
        targets,
        programs: out,
        rows,
        missing,
        load_during: Vec::new(),
    }
}

fn bold(s: String) -> String {
    if s.is_empty() {
        s
    } else {
        format!("**{s}**")
    }
}

fn fmt_mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
}

fn markdown(
    s: &HhSummary,
    machine: &Machine,
    common: &HhCommon,
    reps: usize,
    opts: &HhOptions,
    failures: &[String],
) -> String {
    let mut md = String::new();
    let _ = write!(
        md,
        "# Parallel benchmark suite (paper 004 §5): sequential baseline, rayon and canopy-hh\n\n\
         The programs of paper 004's cross-language comparison (§5.5) plus fib and nqueens, reported like its Fig. 6 \
         (T_1/T_s, speedup, R_p/R_s). `seq` is the sequential baseline (one thread, no runtime: the MLton column's \
         analogue); `rayon-pT` is rayon with the system allocator (glibc) on a pool of p threads; `canopy-hh-pT` is the \
         program written against canopy-hh's hierarchical heaps (a heap per task, the MPL column's analogue) forking on \
         a pool of p threads. Every run is its own child process (peak RSS = its VmHWM, input included); median of \
         {reps} interleaved runs, {} untimed warm-up run(s) in each child before the timed one; input seed {}. Size `{}`.\n\n",
        opts.warmups,
        opts.seed,
        common.size.name()
    );
    md.push_str(&machine_markdown(machine));
    if let (Some(lo), Some(hi)) = (s.load_during.first(), s.load_during.last()) {
        let _ = writeln!(
            md,
            "Load average seen by the runs: median {:.2}, range {lo:.2}-{hi:.2} on {} CPUs (a load above the CPU count \
             means other processes competed with the measured ones).",
            stats::median(&s.load_during).unwrap_or(0.0),
            machine.nproc
        );
    }
    for m in &s.missing {
        let _ = write!(md, "\n> **Missing:** {m}\n");
    }

    md.push_str("\n## Programs and answers\n\n");
    let mut tb = Table::new(["program", "input", "answer (sequential)", "what"]);
    for (p, prog) in s.programs.iter().zip(programs_by_name(&s.programs)) {
        tb.row([
            format!("`{}`", p.program),
            p.input.clone(),
            p.answer.clone().unwrap_or_else(|| "–".into()),
            prog.map_or("", |b| b.about()).to_string(),
        ]);
    }
    md.push_str(&tb.render());

    let threads: Vec<usize> = s.geomean_rel_seq.iter().map(|x| x.0).collect();
    let both_1_2 = threads.contains(&1) && threads.contains(&2);

    md.push_str("\n## Issue 5's targets for canopy-hh (geomeans over the programs)\n\n");
    let mut tb = Table::new(["metric", "target", "canopy-hh", "rayon", "paper 004", "met"]);
    for t in &s.targets {
        tb.row([
            t.metric.clone(),
            t.bound.clone(),
            fmt_ratio(t.hh),
            fmt_ratio(t.rayon),
            t.paper.clone(),
            match t.met {
                Some(true) => "yes".into(),
                Some(false) => "**no**".into(),
                None => "–".into(),
            },
        ]);
    }
    md.push_str(&tb.render());

    md.push_str(
        "\n## canopy-hh against the sequential baseline and rayon (time: lower is better, except the speedups)\n\n",
    );
    let mut head = vec!["program".to_string(), "T_s".into()];
    for &t in &threads {
        head.push(format!("T_{t}"));
    }
    for &t in &threads {
        head.push(format!("T_{t}/T_s"));
    }
    if both_1_2 {
        head.push("T_1/T_2".into());
    }
    if let Some(&t) = threads.last() {
        head.push(format!("T_s/T_{t}"));
    }
    for &t in &threads {
        head.push(format!("hh/rayon {t}T"));
    }
    let mut tb = Table::new(head);
    for p in &s.programs {
        let mut row = vec![format!("`{}`", p.program), fmt_seconds(p.t_seq)];
        for &t in &threads {
            row.push(fmt_seconds(
                find(&s.rows, &p.program, Variant::Hh, t).and_then(|r| r.median_seconds),
            ));
        }
        row.extend(p.hh_rel_seq.iter().map(|&(_, r)| fmt_ratio(r)));
        if both_1_2 {
            row.push(fmt_ratio(p.hh_speedup_1_to_2));
        }
        if let Some(&t) = threads.last() {
            row.push(fmt_ratio(pick(&p.hh_speedup_vs_seq, t)));
        }
        row.extend(p.hh_vs_rayon.iter().map(|&(_, r)| fmt_ratio(r)));
        tb.row(row);
    }
    let mut row = vec!["**geomean**".to_string(), String::new()];
    row.extend(threads.iter().map(|_| String::new()));
    row.extend(s.geomean_hh_rel_seq.iter().map(|&(_, g)| bold(fmt_ratio(g))));
    if both_1_2 {
        row.push(bold(fmt_ratio(s.geomean_hh_speedup_1_to_2)));
    }
    if let Some(&t) = threads.last() {
        row.push(bold(fmt_ratio(pick(&s.geomean_hh_speedup_vs_seq, t))));
    }
    row.extend(s.geomean_hh_vs_rayon.iter().map(|&(_, g)| bold(fmt_ratio(g))));
    tb.row(row);
    md.push_str(&tb.render());

    md.push_str(
        "\n## rayon against the sequential baseline (lower is better; paper Fig. 6 T_1/T_s)\n\n",
    );
    let mut head = vec!["program".to_string(), "T_s".into()];
    for &t in &threads {
        head.push(format!("T_{t}"));
    }
    for &t in &threads {
        head.push(format!("T_{t}/T_s"));
    }
    head.push("T_1/T_2".into());
    let mut tb = Table::new(head);
    for p in &s.programs {
        let mut row = vec![format!("`{}`", p.program), fmt_seconds(p.t_seq)];
        for &t in &threads {
            row.push(fmt_seconds(
                find(&s.rows, &p.program, Variant::Rayon, t).and_then(|r| r.median_seconds),
            ));
        }
        for &(_, r) in &p.rel_seq {
            row.push(fmt_ratio(r));
        }
        row.push(fmt_ratio(p.speedup_1_to_2));
        tb.row(row);
    }
    let mut row = vec!["**geomean**".to_string(), String::new()];
    row.extend(threads.iter().map(|_| String::new()));
    row.extend(s.geomean_rel_seq.iter().map(|&(_, g)| bold(fmt_ratio(g))));
    row.push(bold(fmt_ratio(s.geomean_speedup_1_to_2)));
    tb.row(row);
    md.push_str(&tb.render());

    md.push_str(
        "\n## Peak RSS against the sequential baseline (lower is better; paper Fig. 6 R_p/R_s)\n\n",
    );
    md.push_str("`before` is the RSS just before the timed run (input, thread pool, warm-up leftovers).\n\n");
    let mut head = vec!["program".to_string(), "R_s".into(), "before (seq)".into()];
    for v in [Variant::Rayon, Variant::Hh] {
        for &t in &threads {
            head.push(format!("{} R_{t}", v.name()));
        }
    }
    for v in [Variant::Rayon, Variant::Hh] {
        for &t in &threads {
            head.push(format!("{} R_{t}/R_s", v.name()));
        }
    }
    let mut tb = Table::new(head);
    for p in &s.programs {
        let seq = find(&s.rows, &p.program, Variant::Seq, 1);
        let mut row = vec![
            format!("`{}`", p.program),
            fmt_kib(seq.and_then(|r| r.median_peak_kib)),
            fmt_kib(seq.and_then(|r| r.median_base_kib)),
        ];
        for v in [Variant::Rayon, Variant::Hh] {
            for &t in &threads {
                row.push(fmt_kib(
                    find(&s.rows, &p.program, v, t).and_then(|r| r.median_peak_kib),
                ));
            }
        }
        row.extend(p.rss_rel_seq.iter().map(|&(_, r)| fmt_ratio(r)));
        row.extend(p.hh_rss_rel_seq.iter().map(|&(_, r)| fmt_ratio(r)));
        tb.row(row);
    }
    let mut row = vec!["**geomean**".to_string(), String::new(), String::new()];
    row.extend(threads.iter().flat_map(|_| [String::new(), String::new()]));
    row.extend(s.geomean_rss_rel_seq.iter().map(|&(_, g)| bold(fmt_ratio(g))));
    row.extend(s.geomean_hh_rss_rel_seq.iter().map(|&(_, g)| bold(fmt_ratio(g))));
    tb.row(row);
    md.push_str(&tb.render());

    md.push_str(
        "\n## canopy-hh collector counters of the timed run (medians)\n\n\
         Per thread count: leaf collections, bytes copied by the collector, GC time (summed over the tasks that \
         collected), bytes of chunks released, tasks forked, bytes allocated in the managed heap, and the largest \
         task heap.\n\n",
    );
    let mut tb = Table::new([
        "program", "threads", "collections", "copied", "GC time", "reclaimed", "forks", "allocated", "peak task heap",
    ]);
    for p in &s.programs {
        for &t in &threads {
            let Some(g) = find(&s.rows, &p.program, Variant::Hh, t).and_then(|r| r.gc) else {
                continue;
            };
            tb.row([
                format!("`{}`", p.program),
                t.to_string(),
                format!("{:.0}", g.collections),
                fmt_mib(g.bytes_copied),
                fmt_seconds(Some(g.gc_seconds)),
                fmt_mib(g.bytes_reclaimed),
                format!("{:.0}", g.forks),
                fmt_mib(g.bytes_allocated),
                fmt_kib(Some(g.peak_heap_kib as u64)),
            ]);
        }
    }
    md.push_str(&tb.render());

    md.push_str(
        "\n## For comparison (paper 004)\n\n\
         Fig. 6: MPL* over MLton, geomean T_1/T_s = 1.34, R_72/R_s = 0.68 (72 cores). Fig. 9: MPL* about 1.6x slower than \
         C/C++ (C/M geomean 0.63). The issue's targets for canopy-hh: geomean T_1/T_s at most 1.3, T_1/T_2 at least 1.8, \
         time within 1.5x of rayon at the same thread count, peak RSS at most 1.5x R_s at 2 threads (the table above).\n",
    );
    md.push_str(&failures_markdown(failures));
    md
}

fn programs_by_name(ps: &[ProgramSummary]) -> Vec<Option<&'static dyn Bench>> {
    ps.iter().map(|p| program(&p.program).ok()).collect()
}

fn chart(s: &HhSummary, threads: &[usize]) -> BarChart {
    let mut series: Vec<String> = threads.iter().map(|&t| format!("rayon-{t}T")).collect();
    series.extend(threads.iter().map(|&t| format!("canopy-hh-{t}T")));
    let panel = |title: &str, rayon: &PerThreadOf, hh: &PerThreadOf| Panel {
        title: title.into(),
        groups: s
            .programs
            .iter()
            .map(|p| Group {
                label: p.program.clone(),
                values: threads
                    .iter()
                    .map(|&t| pick(rayon(p), t))
                    .chain(threads.iter().map(|&t| pick(hh(p), t)))
                    .collect(),
            })
            .collect(),
    };
    BarChart {
        title: "hh-suite: rayon and canopy-hh against the sequential baseline (1 = seq)".into(),
        y_label: "ratio to seq".into(),
        series,
        panels: vec![
            panel("time T_p / T_s", &|p| &p.rel_seq, &|p| &p.hh_rel_seq),
            panel("peak RSS R_p / R_s", &|p| &p.rss_rel_seq, &|p| &p.hh_rss_rel_seq),
        ],
        reference: Some(1.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every program's rayon and canopy-hh answers equal its sequential one
    /// on a small input, on 1 and on 2 threads; canopy-hh reports counters.
    #[test]
    fn parallel_answers_equal_sequential() {
        for prog in programs() {
            let p = prog.params(Size::Quick);
            let seq = prog.measure(Variant::Seq, 1, &p, 7, 0, &mut || {}).unwrap();
            assert!(seq.hh_stats.is_none());
            for v in [Variant::Rayon, Variant::Hh] {
                for threads in [1, 2] {
                    let par = prog.measure(v, threads, &p, 7, 1, &mut || {}).unwrap();
                    assert_eq!(
                        par.answer,
                        seq.answer,
                        "{} {} on {threads} threads",
                        prog.name(),
                        v.name()
                    );
                    assert_eq!(par.hh_stats.is_some(), v == Variant::Hh, "{}", prog.name());
                }
            }
            assert!(seq.seconds >= 0.0);
        }
    }

    /// The canopy-hh bodies on inputs with edge cases (empty, tiny, blocks
    /// that end inside a token, more than one segment or block, a stack of
    /// merges) against the sequential ones.
    #[test]
    fn hh_edge_cases_equal_sequential() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        pool.install(|| {
            for n in [0usize, 1, 2, 3, 10, 131_072 * 2 + 5, 1_000_000] {
                assert_eq!(
                    programs::Primes.run(Variant::Hh, &n),
                    programs::Primes.run(Variant::Seq, &n),
                    "primes n={n}"
                );
            }
            for n in [0usize, 1, 5, 32_768, 32_769, 200_003, 600_001, 1_100_000] {
                let xs = input::hashed_i64(n, 3);
                assert_eq!(programs::Msort.run(Variant::Hh, &xs), programs::Msort.run(Variant::Seq, &xs));
                // Many ties (stability cannot show in i64 values, but the split points must agree).
                let few: Vec<i64> = xs.iter().map(|x| x % 7).collect();
                assert_eq!(programs::Msort.run(Variant::Hh, &few), programs::Msort.run(Variant::Seq, &few));
                let small = input::small_i64(n.max(1), 4);
                assert_eq!(programs::Mcss.run(Variant::Hh, &small), programs::Mcss.run(Variant::Seq, &small));
                let pts = input::line_points(n, 5);
                assert_eq!(programs::Linefit.run(Variant::Hh, &pts), programs::Linefit.run(Variant::Seq, &pts));
            }
            for text in [
                String::new(),
                "   ".to_string(),
                "a".to_string(),
                " a\tbb\n".to_string(),
                "x".repeat(200_000),
                input::text(400_000, 6),
            ] {
                let seq = programs::Tokens.run(Variant::Seq, &text).spans(&text);
                let hh = programs::Tokens.run(Variant::Hh, &text).spans(&text);
                assert_eq!(hh, seq, "tokens of {} bytes", text.len());
                assert_eq!(programs::Wc.run(Variant::Hh, &text), programs::Wc.run(Variant::Seq, &text));
            }
            for (n, d) in [(1usize, 1usize), (1025, 3), (5000, 7)] {
                let m = input::sparse(n, d, 8);
                let (hh, seq) = (programs::SparseMxv.run(Variant::Hh, &m), programs::SparseMxv.run(Variant::Seq, &m));
                assert!(hh.to_vec().iter().map(|v| v.to_bits()).eq(seq.to_vec().iter().map(|v| v.to_bits())));
            }
            for (n, c) in [(0u64, 5u64), (1, 0), (20, 3), (25, 10)] {
                assert_eq!(programs::Fib.run(Variant::Hh, &(n, c)), programs::fib_seq(n));
            }
            for (n, d) in [(1u64, 1u64), (6, 2), (8, 8), (9, 3)] {
                assert_eq!(programs::Nqueens.run(Variant::Hh, &(n, d)), programs::Nqueens.run(Variant::Seq, &(n, 0)));
            }
        });
    }

    #[test]
    fn seeds_change_random_inputs() {
        let p = Bench::params(&programs::Msort, Size::Quick);
        let a = Bench::measure(&programs::Msort, Variant::Seq, 1, &p, 1, 0, &mut || {}).unwrap();
        let b = Bench::measure(&programs::Msort, Variant::Seq, 1, &p, 2, 0, &mut || {}).unwrap();
        assert_ne!(a.answer.checksum, b.answer.checksum);
    }

    #[test]
    fn child_line_parses() {
        let line = child_main(&ChildArgs {
            program: "nqueens".into(),
            variant: "rayon".into(),
            threads: 2,
            n: 8,
            grain: 2,
            seed: 0,
            warmups: 0,
        })
        .unwrap();
        let l = crate::parse::ResultLine::parse(&line).unwrap();
        assert_eq!(l.checksum().unwrap(), 92);
        assert_eq!(l.get("answer"), Some("solutions:92"));
        assert!(l.get("peak_kib").unwrap().parse::<u64>().unwrap() > 0);
        assert!(l.get("gc_collections").is_none());
        let line = child_main(&ChildArgs {
            program: "msort-int64".into(),
            variant: "canopy-hh".into(),
            threads: 2,
            n: 600_000,
            grain: 0,
            seed: 0,
            warmups: 0,
        })
        .unwrap();
        let l = crate::parse::ResultLine::parse(&line).unwrap();
        assert_eq!(l.get("variant"), Some("canopy-hh"));
        assert!(l.get("answer").unwrap().starts_with("len:600000,"));
        for key in ["gc_collections", "gc_bytes_copied", "gc_seconds", "hh_forks", "hh_bytes_allocated"] {
            assert!(l.get(key).unwrap().parse::<f64>().is_ok(), "{key} in {line}");
        }
        assert!(l.get("hh_forks").unwrap().parse::<u64>().unwrap() > 0);
        assert!(child_main(&ChildArgs {
            program: "nope".into(),
            variant: "seq".into(),
            threads: 1,
            n: 1,
            grain: 0,
            seed: 0,
            warmups: 0
        })
        .is_err());
    }

    fn rec(prog: &str, variant: &str, secs: f64, kib: u64, checksum: u64) -> RunRecord {
        RunRecord {
            config: prog.into(),
            variant: variant.into(),
            contender: "glibc".into(),
            rep: 0,
            ok: true,
            seconds: Some(secs),
            checksum: Some(checksum),
            max_rss_kib: Some(kib),
            ru_maxrss_kib: Some(kib),
            wall_seconds: secs,
            instructions: None,
            fields: [("answer".to_string(), format!("x:{checksum}"))]
                .into_iter()
                .collect(),
            exit: None,
            command: "canopy bench hh-suite-child".into(),
            error: None,
        }
    }

    #[test]
    fn wrong_answers_fail_and_name_the_run() {
        let mut reference = None;
        let mut s = rec("fib", "seq", 1.0, 10, 5);
        judge(&mut s, &mut reference, "fib", "seq", "fib(30)", 3);
        assert!(s.ok);
        let mut good = rec("fib", "rayon-2T", 0.5, 10, 5);
        judge(&mut good, &mut reference, "fib", "rayon-2T", "fib(30)", 3);
        assert!(good.ok);
        let mut bad = rec("fib", "rayon-2T", 0.5, 10, 6);
        judge(&mut bad, &mut reference, "fib", "rayon-2T", "fib(30)", 3);
        assert!(!bad.ok);
        let e = bad.error.unwrap();
        assert!(
            e.contains("fib")
                && e.contains("rayon-2T")
                && e.contains("fib(30)")
                && e.contains("checksum=6")
        );
    }

    #[test]
    fn ratios_and_geomeans() {
        let progs: Vec<&dyn Bench> = vec![&programs::Fib, &programs::Wc];
        let configs = [
            (Variant::Seq, 1),
            (Variant::Rayon, 1),
            (Variant::Rayon, 2),
            (Variant::Hh, 1),
            (Variant::Hh, 2),
        ];
        let mut runs = Vec::new();
        for (prog, k) in [("fib", 1.0), ("wc", 4.0)] {
            for i in 0..3 {
                runs.push(rec(prog, "seq", 1.0 * k, 100, 1));
                runs.push(rec(prog, "rayon-1T", 1.25 * k, 200, 1));
                runs.push(rec(prog, "rayon-2T", 0.625 * k, 400, 1));
                for (vl, secs) in [("canopy-hh-1T", 1.5 * k), ("canopy-hh-2T", 0.75 * k)] {
                    let mut r = rec(prog, vl, secs, 120, 1);
                    r.fields.insert("gc_collections".into(), (2 + i).to_string());
                    r.fields.insert("gc_bytes_copied".into(), "1048576".into());
                    r.fields.insert("gc_seconds".into(), "0.002".into());
                    runs.push(r);
                }
            }
            let mut failed = rec(prog, "rayon-2T", 1000.0, 1, 1);
            failed.ok = false;
            runs.push(failed);
        }
        let rows = summarize_rows(&runs, &progs, &configs);
        let r2 = rows
            .iter()
            .find(|r| r.program == "wc" && r.variant == "rayon" && r.threads == 2)
            .unwrap();
        assert_eq!(
            (r2.ok_runs, r2.failed_runs, r2.median_seconds),
            (3, 1, Some(2.5))
        );
        let s = summarize(rows, &progs, Size::Quick, &[1, 2], vec![None, None]);
        assert_eq!(
            s.programs[1].rel_seq,
            vec![(1, Some(1.25)), (2, Some(0.625))]
        );
        assert_eq!(s.programs[0].speedup_1_to_2, Some(2.0));
        assert_eq!(
            s.programs[0].rss_rel_seq,
            vec![(1, Some(2.0)), (2, Some(4.0))]
        );
        let g = s.geomean_rel_seq[0].1.unwrap();
        assert!((g - 1.25).abs() < 1e-12);
        assert!((s.geomean_speedup_1_to_2.unwrap() - 2.0).abs() < 1e-12);
        assert!(s.missing.is_empty());
        // canopy-hh: T_1/T_s 1.5, T_2/T_s 0.75, speedup 2, 1.2x rayon on both counts, R/R_s 1.2.
        assert_eq!(s.programs[1].hh_rel_seq, vec![(1, Some(1.5)), (2, Some(0.75))]);
        assert_eq!(s.programs[0].hh_speedup_1_to_2, Some(2.0));
        assert!((pick(&s.geomean_hh_vs_rayon, 1).unwrap() - 1.2).abs() < 1e-12);
        assert!((pick(&s.geomean_hh_vs_rayon, 2).unwrap() - 1.2).abs() < 1e-12);
        assert!((pick(&s.geomean_hh_rss_rel_seq, 2).unwrap() - 1.2).abs() < 1e-12);
        assert!((pick(&s.geomean_hh_speedup_vs_seq, 2).unwrap() - 1.0 / 0.75).abs() < 1e-12);
        let g = find(&s.rows, "wc", Variant::Hh, 2).unwrap().gc.unwrap();
        assert_eq!((g.collections, g.bytes_copied, g.gc_seconds), (3.0, 1048576.0, 0.002));
        assert!(find(&s.rows, "wc", Variant::Rayon, 2).unwrap().gc.is_none());
        let met: Vec<Option<bool>> = s.targets.iter().map(|t| t.met).collect();
        // T_1/T_s 1.5 > 1.3; speedup 2 >= 1.8; 1.2 <= 1.5 twice; RSS 1.2 <= 1.5.
        assert_eq!(met, vec![Some(false), Some(true), Some(true), Some(true), Some(true)]);
        let svg = crate::plot::render(&chart(&s, &[1, 2])).unwrap();
        assert!(svg.contains("<svg"));
    }

    /// The harness end to end, with a shell script standing in for the
    /// child: it answers correctly except rayon on 2 threads, which must be
    /// reported as a failure naming program, variant and input.
    #[test]
    fn harness_runs_children_and_reports_wrong_answers() {
        let dir =
            crate::artifacts::ScratchDir::new(&std::env::temp_dir(), "hh-suite-test").unwrap();
        // Arguments: --program P --variant V --threads T ...
        let script = r#"c=7; if [ "$4" = rayon ] && [ "$6" = 2 ]; then c=8; fi
                        g=""; if [ "$4" = canopy-hh ]; then g=" gc_collections=$6 gc_bytes_copied=4096 gc_seconds=0.001"; fi
                        echo "checksum=$c seconds=0.0$6 peak_kib=${6}00 base_kib=50 loadavg=0.5 answer=x:$c$g""#;
        let opts = HhOptions {
            programs: vec!["fib".into(), "nqueens".into()],
            threads: vec![2, 1],
            warmups: 0,
            seed: 1,
            child: ChildCommand {
                program: PathBuf::from("/bin/sh"),
                args: vec!["-c".into(), script.into(), "child".into()],
            },
        };
        let common = HhCommon {
            size: Size::Quick,
            runs: Some(2),
            results_dir: dir.path().to_path_buf(),
            timeout: Duration::from_secs(60),
        };
        let f = run(&common, &opts).unwrap();
        assert_eq!(f.failures.len(), 4, "{:?}", f.failures);
        assert!(f
            .failures
            .iter()
            .all(|e| e.contains("rayon-2T") && e.contains("checksum=8")));
        assert!(f.failures[0].starts_with("fib: rayon-2T on fib(30) cutoff 18 (seed 1)"));
        assert!(!f.markdown.contains("Missing"));
        assert!(f.markdown.contains("| `fib`"));
        assert!(f.markdown.contains("Issue 5's targets") && f.markdown.contains("hh/rayon 2T"));
        assert!(f.written.json.exists() && f.written.svg.as_ref().is_some_and(|p| p.exists()));
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&f.written.json).unwrap()).unwrap();
        let progs = json
            .pointer("/summary/programs")
            .unwrap()
            .as_array()
            .unwrap();
        // T_1 / T_s = 0.01 / 0.01; rayon-2T failed, so no T_2 and no geomean of it.
        assert_eq!(progs[0]["rel_seq"][0], json!([1, 1.0]));
        assert_eq!(progs[0]["rel_seq"][1], json!([2, null]));
        assert_eq!(progs[0]["answer"], json!("x:7"));
        assert_eq!(
            json.pointer("/summary/geomean_rss_rel_seq/0"),
            Some(&json!([1, 1.0]))
        );
        // canopy-hh ran (and answered right) on 1 and 2 threads.
        assert_eq!(progs[0]["hh_rel_seq"][1], json!([2, 2.0]));
        assert_eq!(progs[0]["hh_vs_rayon"][1], json!([2, null]));
        let rows = json.pointer("/summary/rows").unwrap().as_array().unwrap();
        let hh2 = rows
            .iter()
            .find(|r| r["program"] == "fib" && r["variant"] == "canopy-hh" && r["threads"] == 2)
            .unwrap();
        assert_eq!(hh2["gc"]["collections"], json!(2.0));
    }

    #[test]
    fn every_program_has_sizes_that_grow() {
        for prog in programs() {
            let (q, d, p) = (
                prog.params(Size::Quick),
                prog.params(Size::Default),
                prog.params(Size::Paper),
            );
            assert!(q.n <= d.n && d.n <= p.n, "{}", prog.name());
            assert!(!prog.label(&q).is_empty() && !prog.about().is_empty());
        }
        assert!(program("primes").is_ok() && program("nope").is_err());
    }
}
