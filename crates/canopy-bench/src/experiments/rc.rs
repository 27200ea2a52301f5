//! The experiments of the reference-counting layer (`canopy-rc`), run in
//! process (no allocator is preloaded: the harness itself uses glibc, so
//! `Vec` and `Arc` below are "Vec + glibc"; `Array` allocates through
//! Canopy's rich interface).  Variants run interleaved, several times, and
//! the median is kept.
//!
//! | experiment | what | paper |
//! |---|---|---|
//! | `rc-sac` | the with-loop microbenchmark with `Array`, A updated in place | 000 Fig. 1 |
//! | `rc-kernel` | the synthetic kernel per policy and thread count; count-op costs | 003 Figs. 5-8 |
//! | `rc-fft` | 2-D FFT 128x128, Danielson-Lanczos, with and without reuse | 003 §5.2 |
//! | `rc-reuse` | reuse accuracy of delegated counting after k concurrent tasks | 003 §4 |

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use canopy_rc::{
    delegated, genarray, genarray_fn, Array, Atomic, Biased, Delegated, Gen, Local, Policy,
};
use rayon::prelude::*;
use serde::Serialize;
use serde_json::json;

use super::Finished;
use crate::plot::{self, BarChart, Group, Panel};
use crate::report::{self, fmt_ratio, Machine, Report, Size, Table};
use crate::stats::median;

/// Settings of the rc experiments.
#[derive(Debug, Clone)]
pub struct RcCommon {
    /// Problem size.
    pub size: Size,
    /// Repetitions per configuration (`None`: the size's default).
    pub runs: Option<usize>,
    /// Where results go.
    pub results_dir: PathBuf,
}

impl RcCommon {
    fn runs(&self) -> usize {
        self.runs.unwrap_or_else(|| self.size.default_runs()).max(1)
    }
}

fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("could not build a thread pool")
}

fn max_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The thread counts 1, 2, 4, ... up to the CPUs (and the CPU count).
fn thread_counts() -> Vec<usize> {
    let n = max_threads();
    let mut v = Vec::new();
    let mut t = 1;
    while t < n {
        v.push(t);
        t *= 2;
    }
    v.push(n);
    v
}

/// Time `f` once, in seconds.
fn time<R>(f: impl FnOnce() -> R) -> (f64, R) {
    let t = Instant::now();
    let r = f();
    (t.elapsed().as_secs_f64(), r)
}

/// Median of the times of the runs whose result was correct: a run with a
/// wrong result is reported as a failure and its time is not a measurement.
fn median_correct(samples: &[(f64, bool)]) -> Option<f64> {
    let good: Vec<f64> = samples.iter().filter(|s| s.1).map(|s| s.0).collect();
    median(&good)
}

fn fmt_ns(s: Option<f64>) -> String {
    s.map_or_else(|| "—".into(), |v| format!("{v:.2}"))
}

/// Write the report.  `what` is (experiment name, title, paper).
fn finish<S: Serialize>(
    c: &RcCommon,
    (name, title, paper): (&str, &str, &str),
    params: serde_json::Value,
    summary: S,
    markdown: String,
    svg: Option<String>,
    failures: Vec<String>,
) -> Result<Finished> {
    let report = Report {
        experiment: name.into(),
        title: title.into(),
        paper: paper.into(),
        size: c.size,
        params,
        machine: Machine::describe(),
        contenders: Vec::new(),
        skipped: Vec::new(),
        summary,
        runs: Vec::new(),
        failures: failures.clone(),
    };
    let markdown = markdown + &super::failures_markdown(&failures);
    let written = report::write_all(&c.results_dir, &report, &markdown, svg.as_deref())?;
    Ok(Finished {
        name: name.into(),
        markdown,
        written,
        failures,
    })
}

fn header(title: &str, c: &RcCommon, note: &str) -> String {
    format!(
        "# {title}\n\n{}Size: {}, {} runs per configuration (median), variants interleaved. {note}\n\n",
        super::machine_markdown(&Machine::describe()),
        c.size.name(),
        c.runs()
    )
}

// ---------------------------------------------------------------------------
// rc-sac: paper 000 Fig. 1 with Array and with-loops
// ---------------------------------------------------------------------------

/// One measured configuration of `rc-sac`.
#[derive(Debug, Clone, Serialize)]
pub struct SacRow {
    /// Temporary length X.
    pub x: usize,
    /// Threads.
    pub threads: usize,
    /// Median seconds per variant: array, vec-glibc, arc-glibc, array-fn.
    pub seconds: [Option<f64>; 4],
    /// Iterations after the first in which A was reallocated (array variant).
    pub a_allocs_after_first: u64,
    /// In-place updates of A (array variant, one run).
    pub a_reuses: u64,
    /// Temporaries allocated per iteration (array variant).
    pub temps_per_iter: u64,
    /// vec-glibc time / array time.
    pub speedup_vs_vec: Option<f64>,
    /// arc-glibc time / array time.
    pub speedup_vs_arc: Option<f64>,
    /// vec-glibc time / array-fn time.
    pub fn_speedup_vs_vec: Option<f64>,
    /// Iterations after the first in which A was reallocated (array-fn).
    pub fn_a_allocs_after_first: u64,
}

/// Sum of `idx + i` over `i < x`, written and read through a temporary.
#[inline(always)]
fn temp_sum(t: &[i32]) -> u64 {
    t.iter()
        .fold(0u64, |s, &v| s.wrapping_add(u64::from(v as u32)))
}

fn sac_array(n: usize, x: usize, iters: usize) -> (u64, u64, u64, u64) {
    let m = n / x;
    let mut a: Array<u64, Atomic> = Array::filled(&[m], 0);
    let mut a_allocs_after_first = 0;
    let mut reuses = 0;
    let mut temps = 0;
    for it in 0..iters {
        let all = canopy_rc::stats();
        let addr = a.addr();
        a = a.modarray(&[Gen::all_update(&[m], move |iv: &[usize], old: &u64| {
            let idx = iv[0];
            let t: Array<i32, Local> = Array::from_fn(&[x], |i| (idx + i) as i32);
            let t = black_box(t);
            old.wrapping_add(temp_sum(t.as_slice()))
        })]);
        let da = canopy_rc::stats().since(&all);
        // A is reallocated exactly when modarray had to copy it.
        if it > 0 && a.addr() != addr {
            a_allocs_after_first += 1;
        }
        reuses += da.reuses;
        temps = da.allocations - da.copies;
    }
    let sum = a.as_slice().iter().fold(0u64, |s, &v| s.wrapping_add(v));
    (sum, a_allocs_after_first, reuses, temps)
}

/// [`sac_array`] with the monomorphised with-loop (`modarray_fn`): the
/// expression is a generic closure the compiler inlines into the loop, not a
/// generator object called through a pointer.
fn sac_array_fn(n: usize, x: usize, iters: usize) -> (u64, u64) {
    let m = n / x;
    let mut a: Array<u64, Atomic> = Array::filled(&[m], 0);
    let mut a_allocs_after_first = 0;
    for it in 0..iters {
        let addr = a.addr();
        a = a.modarray_fn(&[0], &[m], move |iv: &[usize], old: &u64| {
            let idx = iv[0];
            let t: Array<i32, Local> = Array::from_fn(&[x], |i| (idx + i) as i32);
            let t = black_box(t);
            old.wrapping_add(temp_sum(t.as_slice()))
        });
        // A is reallocated exactly when modarray_fn had to copy it.
        if it > 0 && a.addr() != addr {
            a_allocs_after_first += 1;
        }
    }
    (a.as_slice().iter().fold(0u64, |s, &v| s.wrapping_add(v)), a_allocs_after_first)
}

fn sac_vec(n: usize, x: usize, iters: usize) -> u64 {
    let m = n / x;
    let mut a: Vec<u64> = vec![0; m];
    for _ in 0..iters {
        a.par_iter_mut()
            .with_min_len(2048)
            .enumerate()
            .for_each(|(idx, v)| {
                let t: Vec<i32> = (0..x).map(|i| (idx + i) as i32).collect();
                let t = black_box(t);
                *v = v.wrapping_add(temp_sum(&t));
            });
    }
    a.iter().fold(0u64, |s, &v| s.wrapping_add(v))
}

fn sac_arc(n: usize, x: usize, iters: usize) -> u64 {
    let m = n / x;
    let mut a: Arc<[u64]> = vec![0u64; m].into();
    for _ in 0..iters {
        if Arc::get_mut(&mut a).is_none() {
            a = a.to_vec().into();
        }
        let s = Arc::get_mut(&mut a).expect("unique after the copy");
        s.par_iter_mut()
            .with_min_len(2048)
            .enumerate()
            .for_each(|(idx, v)| {
                let t: Arc<[i32]> = (0..x).map(|i| (idx + i) as i32).collect();
                let t = black_box(t);
                *v = v.wrapping_add(temp_sum(&t));
            });
    }
    a.iter().fold(0u64, |s, &v| s.wrapping_add(v))
}

/// `rc-sac`: the SAC microbenchmark with `Array` (A updated in place by
/// `modarray`, temporaries `Array<i32, Local>`), against `Vec` and `Arc<[T]>`
/// on glibc.
pub fn run_sac(c: &RcCommon, xs: &[usize]) -> Result<Finished> {
    let (n, iters) = match c.size {
        Size::Quick => (1_000_000, 5),
        Size::Default => (4_000_000, 20),
        Size::Paper => (10_000_000, 50),
    };
    let runs = c.runs();
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let bar = crate::progress::bar((xs.len() * thread_counts().len() * runs) as u64, "rc-sac");
    for &x in xs {
        for t in thread_counts() {
            let p = pool(t)?;
            let expect = crate::sac_kernel::expected_checksum(x as u64, n as u64, iters as u64);
            let mut secs: [Vec<(f64, bool)>; 4] = Default::default();
            let (mut allocs_after, mut reuses, mut temps, mut fn_allocs_after) = (0, 0, 0, 0);
            for _ in 0..runs {
                let (s, (sum, aa, r, tp)) = p.install(|| time(|| sac_array(n, x, iters)));
                secs[0].push((s, sum == expect));
                (allocs_after, reuses, temps) = (aa, r, tp);
                let (s1, sum1) = p.install(|| time(|| sac_vec(n, x, iters)));
                secs[1].push((s1, sum1 == expect));
                let (s2, sum2) = p.install(|| time(|| sac_arc(n, x, iters)));
                secs[2].push((s2, sum2 == expect));
                let (s3, (sum3, fn_aa)) = p.install(|| time(|| sac_array_fn(n, x, iters)));
                secs[3].push((s3, sum3 == expect));
                fn_allocs_after = fn_aa;
                for (v, got) in [("array", sum), ("vec-glibc", sum1), ("arc-glibc", sum2), ("array-fn", sum3)] {
                    if got != expect {
                        failures.push(format!(
                            "rc-sac x={x} threads={t} {v}: checksum {got}, expected {expect}"
                        ));
                    }
                }
                bar.inc(1);
            }
            let med = [
                median_correct(&secs[0]),
                median_correct(&secs[1]),
                median_correct(&secs[2]),
                median_correct(&secs[3]),
            ];
            rows.push(SacRow {
                x,
                threads: t,
                seconds: med,
                a_allocs_after_first: allocs_after,
                a_reuses: reuses,
                temps_per_iter: temps,
                speedup_vs_vec: crate::stats::ratio(med[1], med[0]),
                speedup_vs_arc: crate::stats::ratio(med[2], med[0]),
                fn_speedup_vs_vec: crate::stats::ratio(med[1], med[3]),
                fn_a_allocs_after_first: fn_allocs_after,
            });
        }
    }
    bar.finish_and_clear();
    let mut md = header(
        "rc-sac: the SAC with-loop microbenchmark on Array (paper 000, Fig. 1)",
        c,
        &format!(
            "N = {n}, {iters} iterations. `array`: A = modarray(A) in place, temporaries `Array<i32, Local>` \
             (descriptor + data in one Canopy block); `vec-glibc`: A a Vec updated in place, temporaries Vec<i32>; \
             `arc-glibc`: A an Arc<[u64]> (get_mut), temporaries Arc<[i32]>; `array-fn`: `array` with the monomorphised \
             with-loop `modarray_fn` (the expression a generic closure inlined into the loop, not a generator object)."
        ),
    );
    let mut tb = Table::new([
        "X",
        "threads",
        "array s",
        "array-fn s",
        "vec-glibc s",
        "arc-glibc s",
        "vec/array",
        "vec/array-fn",
        "arc/array",
        "A allocs after 1st iter (array, array-fn)",
        "A in-place updates",
        "temps/iter",
    ]);
    for r in &rows {
        tb.row([
            r.x.to_string(),
            r.threads.to_string(),
            report::fmt_seconds(r.seconds[0]),
            report::fmt_seconds(r.seconds[3]),
            report::fmt_seconds(r.seconds[1]),
            report::fmt_seconds(r.seconds[2]),
            fmt_ratio(r.speedup_vs_vec),
            fmt_ratio(r.fn_speedup_vs_vec),
            fmt_ratio(r.speedup_vs_arc),
            format!("{}, {}", r.a_allocs_after_first, r.fn_a_allocs_after_first),
            r.a_reuses.to_string(),
            r.temps_per_iter.to_string(),
        ]);
    }
    md.push_str(&tb.render());
    let chart = BarChart {
        title: "rc-sac: time relative to array (higher = slower than array)".into(),
        y_label: "time / array time".into(),
        series: vec!["array".into(), "vec-glibc".into(), "arc-glibc".into(), "array-fn".into()],
        panels: thread_counts()
            .into_iter()
            .map(|t| Panel {
                title: format!("{t} thread(s)"),
                groups: rows
                    .iter()
                    .filter(|r| r.threads == t)
                    .map(|r| Group {
                        label: format!("X={}", r.x),
                        values: r
                            .seconds
                            .iter()
                            .map(|s| crate::stats::ratio(*s, r.seconds[0]))
                            .collect(),
                    })
                    .collect(),
            })
            .collect(),
        reference: Some(1.0),
    };
    let svg = plot::render(&chart).ok();
    finish(
        c,
        (
            "rc-sac",
            "SAC with-loop microbenchmark on canopy-rc arrays",
            "000 Fig. 1",
        ),
        json!({ "n": n, "iters": iters, "xs": xs, "threads": thread_counts() }),
        rows,
        md,
        svg,
        failures,
    )
}

// ---------------------------------------------------------------------------
// rc-kernel: paper 003 Fig. 5, per policy and thread count; count-op costs
// ---------------------------------------------------------------------------

/// Cost of one count operation pattern.
#[derive(Debug, Clone, Serialize)]
pub struct OpCost {
    /// What was measured.
    pub what: String,
    /// Median nanoseconds per increment+decrement pair (or per getrc), per thread.
    pub ns: Option<f64>,
}

/// One kernel configuration.
#[derive(Debug, Clone, Serialize)]
pub struct KernelRow {
    /// Vector length.
    pub n: usize,
    /// Work units per element.
    pub w: usize,
    /// `none` (counting removed), `atomic`, `biased`, `delegated`.
    pub policy: String,
    /// Mutator threads (delegated adds its counting thread).
    pub threads: usize,
    /// Median seconds per with-loop.
    pub seconds: Option<f64>,
    /// T(none, 1 thread) / T.
    pub speedup: Option<f64>,
}

/// One thread's pending-operation trace of a delegated kernel run.
#[derive(Debug, Clone, Serialize)]
pub struct PendingTrace {
    /// Mutator threads.
    pub threads: usize,
    /// (microseconds from the run's start, pending operations).
    pub samples: Vec<(f64, u64)>,
}

/// Everything `rc-kernel` reports.
#[derive(Debug, Clone, Serialize)]
pub struct KernelSummary {
    /// Count-op costs (the per-pair figures).
    pub costs: Vec<OpCost>,
    /// Kernel rows.
    pub rows: Vec<KernelRow>,
    /// Pending operations over time, delegated, n = 512, W = 100.
    pub traces: Vec<PendingTrace>,
    /// Counting threads used by `Delegated`.
    pub counting_threads: usize,
}

/// W units of work: the paper's `for (j = 0; j < vect[i]; j++) r = r + 1`.
#[inline(never)]
fn work(w: u64) -> u64 {
    let mut r = 0u64;
    for _ in 0..w {
        r = black_box(r + 1);
    }
    r
}

fn kernel_loop<P: Policy>(v: &Array<u64, P>, n: usize, count: bool) -> Array<u64, Atomic>
where
    Array<u64, P>: Send + Sync,
{
    genarray(
        &[n],
        0,
        &[Gen::all(&[n], |iv| {
            let x = if count {
                let c = v.clone();
                let x = c.as_slice()[iv[0]];
                drop(c);
                x
            } else {
                v.as_slice()[iv[0]]
            };
            work(x)
        })
        .grain(1)],
    )
}

/// Median seconds per with-loop of the kernel for policy `P`.
fn kernel_time<P: Policy>(
    p: &rayon::ThreadPool,
    n: usize,
    w: usize,
    reps: usize,
    count: bool,
) -> (f64, bool)
where
    Array<u64, P>: Send + Sync,
{
    p.install(|| {
        // Created on a pool thread: for Biased, one mutator is the owner.
        let v: Array<u64, P> = Array::filled(&[n], w as u64);
        let mut ok = true;
        let (s, ()) = time(|| {
            for _ in 0..reps {
                let r = kernel_loop(&v, n, count);
                ok &= r.as_slice().iter().all(|&x| x == w as u64);
            }
        });
        (s / reps as f64, ok)
    })
}

/// Nanoseconds per clone+drop pair of `a` on each of `threads` threads at once.
fn pair_cost<P: Policy>(
    make: impl Fn() -> Array<u64, P> + Sync,
    threads: usize,
    pairs: usize,
) -> f64
where
    Array<u64, P>: Send + Sync,
{
    let a = make();
    let start = std::sync::Barrier::new(threads);
    let total: f64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let (a, start) = (&a, &start);
                s.spawn(move || {
                    start.wait();
                    let (t, ()) = time(|| {
                        for _ in 0..pairs {
                            let c = black_box(a.clone());
                            drop(c);
                        }
                    });
                    delegated::flush();
                    t
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("cost thread")).sum()
    });
    total / threads as f64 / pairs as f64 * 1e9
}

/// Nanoseconds per clone+drop pair on the creating thread itself (the
/// owner, for Biased; for Local, the only thread it can run on).
fn pair_cost_here<P: Policy>(pairs: usize) -> f64 {
    let a: Array<u64, P> = Array::filled(&[1], 1);
    let (t, ()) = time(|| {
        for _ in 0..pairs {
            let c = black_box(a.clone());
            drop(c);
        }
    });
    delegated::flush();
    t / pairs as f64 * 1e9
}

fn getrc_cost(n: usize) -> f64 {
    let a: Array<u64, Delegated> = Array::filled(&[1], 1);
    let (t, bad) = time(|| (0..n).filter(|_| a.getrc() != 1).count());
    assert_eq!(bad, 0, "getrc of a private array must be 1");
    t / n as f64 * 1e9
}

fn measure_costs(pairs: usize, runs: usize) -> Vec<OpCost> {
    let nt = max_threads().max(2);
    type Probe = Box<dyn Fn() -> f64>;
    let probes: Vec<(String, Probe)> = vec![
        (
            "local (Rc-like), 1 thread".into(),
            Box::new(move || pair_cost_here::<Local>(pairs)),
        ),
        (
            "atomic, private per thread, 1 thread".into(),
            Box::new(move || pair_cost_here::<Atomic>(pairs)),
        ),
        (
            format!("atomic, one array shared by {nt} threads"),
            Box::new(move || pair_cost::<Atomic>(|| Array::filled(&[1], 1), nt, pairs / 4)),
        ),
        (
            "biased, owner thread".into(),
            Box::new(move || pair_cost_here::<Biased>(pairs)),
        ),
        (
            format!("biased, one array, {nt} non-owner threads"),
            Box::new(move || pair_cost::<Biased>(|| Array::filled(&[1], 1), nt, pairs / 4)),
        ),
        (
            "delegated, mutator side, 1 thread".into(),
            Box::new(move || pair_cost_here::<Delegated>(pairs)),
        ),
        (
            format!("delegated, mutator side, one array shared by {nt} threads"),
            Box::new(move || pair_cost::<Delegated>(|| Array::filled(&[1], 1), nt, pairs / 4)),
        ),
        (
            "delegated getrc round trip (ns per call)".into(),
            Box::new(move || getrc_cost((pairs / 200).max(1000))),
        ),
    ];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); probes.len()];
    for _ in 0..runs {
        for (i, (_, f)) in probes.iter().enumerate() {
            samples[i].push(f());
        }
    }
    probes
        .iter()
        .zip(samples)
        .map(|((w, _), s)| OpCost {
            what: w.clone(),
            ns: median(&s),
        })
        .collect()
}

fn line_chart(traces: &[PendingTrace]) -> Option<String> {
    use plotters::prelude::*;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 420)).into_drawing_area();
        root.fill(&WHITE).ok()?;
        let xmax = traces
            .iter()
            .flat_map(|t| t.samples.iter().map(|s| s.0))
            .fold(1.0f64, f64::max);
        let ymax = traces
            .iter()
            .flat_map(|t| t.samples.iter().map(|s| s.1))
            .max()
            .unwrap_or(1)
            .max(1) as f64;
        let mut ch = ChartBuilder::on(&root)
            .caption(
                "rc-kernel: pending count operations over time (delegated, n=512, W=100)",
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..xmax * 1.02, 0f64..ymax * 1.1)
            .ok()?;
        ch.configure_mesh()
            .x_desc("time (µs)")
            .y_desc("pending operations")
            .draw()
            .ok()?;
        for (i, t) in traces.iter().enumerate() {
            let c = [
                RGBColor(0x1b, 0x9e, 0x77),
                RGBColor(0xd9, 0x5f, 0x02),
                RGBColor(0x75, 0x70, 0xb3),
            ][i % 3];
            ch.draw_series(LineSeries::new(
                t.samples.iter().map(|&(x, y)| (x, y as f64)),
                c.stroke_width(2),
            ))
            .ok()?
            .label(format!("{} mutator(s)", t.threads))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        }
        ch.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .ok()?;
        root.present().ok()?;
    }
    Some(svg)
}

/// `rc-kernel`: the synthetic kernel of paper 003 (Fig. 5) for every policy
/// and thread count, speedups against one thread with counting removed
/// (Fig. 8), pending operations over time (Figs. 6-7), and the cost of
/// count operations.
pub fn run_kernel(c: &RcCommon) -> Result<Finished> {
    let runs = c.runs();
    let (budget, pairs) = match c.size {
        Size::Quick => (10_000_000usize, 2_000_000usize),
        Size::Default => (40_000_000, 10_000_000),
        Size::Paper => (150_000_000, 20_000_000),
    };
    let counting_threads = delegated::counting_threads();
    let costs = measure_costs(pairs, runs);
    let mut rows = Vec::new();
    let mut traces = Vec::new();
    let mut failures = Vec::new();
    let ts = thread_counts();
    let policies = ["none", "atomic", "biased", "delegated"];
    let bar = crate::progress::bar((4 * ts.len() * runs) as u64, "rc-kernel");
    for &(n, w) in &[(512usize, 100usize), (4096, 100), (512, 1000), (4096, 1000)] {
        let reps = (budget / (n * w)).max(2);
        let mut base = None;
        for &t in &ts {
            let p = pool(t)?;
            let mut secs: Vec<Vec<(f64, bool)>> = vec![Vec::new(); policies.len()];
            for r in 0..runs {
                for (k, pol) in policies.iter().enumerate() {
                    let trace = *pol == "delegated" && n == 512 && w == 100 && r == 0;
                    let t0 = delegated::trace_clock();
                    if trace {
                        delegated::trace_start();
                    }
                    let (s, ok) = match *pol {
                        "none" => kernel_time::<Atomic>(&p, n, w, reps, false),
                        "atomic" => kernel_time::<Atomic>(&p, n, w, reps, true),
                        "biased" => kernel_time::<Biased>(&p, n, w, reps, true),
                        _ => kernel_time::<Delegated>(&p, n, w, reps, true),
                    };
                    if trace {
                        let all = delegated::trace_take();
                        let mut samples: Vec<(f64, u64)> = all
                            .into_iter()
                            .flatten()
                            .filter(|s| s.0 >= t0)
                            .map(|(tt, v)| ((tt - t0) as f64 / 1e3, v))
                            .collect();
                        samples.sort_by(|a, b| a.0.total_cmp(&b.0));
                        let step = samples.len().div_ceil(600).max(1);
                        traces.push(PendingTrace {
                            threads: t,
                            samples: samples.into_iter().step_by(step).collect(),
                        });
                    }
                    if !ok {
                        failures.push(format!(
                            "rc-kernel n={n} W={w} {pol} threads={t}: wrong result"
                        ));
                    }
                    secs[k].push((s, ok));
                }
            }
            bar.inc(runs as u64);
            for (k, pol) in policies.iter().enumerate() {
                let m = median_correct(&secs[k]);
                if *pol == "none" && t == 1 {
                    base = m;
                }
                rows.push(KernelRow {
                    n,
                    w,
                    policy: pol.to_string(),
                    threads: t,
                    seconds: m,
                    speedup: crate::stats::ratio(base, m),
                });
            }
        }
    }
    bar.finish_and_clear();
    let mut md = header(
        "rc-kernel: the synthetic kernel of paper 003 (Fig. 5) per counting policy",
        c,
        &format!(
            "Each element clones and drops the shared input vector (two count operations) and does W units of \
             work; `none` removes the counting. Delegated uses {counting_threads} counting thread(s) on top of \
             the mutators. Speedup = time(none, 1 thread) / time."
        ),
    );
    md.push_str("## Count operations (ns per clone+drop pair, per thread)\n\n");
    let mut tc = Table::new(["what", "ns"]);
    for o in &costs {
        tc.row([o.what.clone(), fmt_ns(o.ns)]);
    }
    md.push_str(&tc.render());
    md.push_str("\n## Kernel: seconds per with-loop and speedup\n\n");
    let mut tb = Table::new(["n", "W", "policy", "mutators", "µs / with-loop", "speedup"]);
    for r in &rows {
        tb.row([
            r.n.to_string(),
            r.w.to_string(),
            r.policy.clone(),
            r.threads.to_string(),
            r.seconds
                .map_or_else(|| "—".into(), |s| format!("{:.1}", s * 1e6)),
            fmt_ratio(r.speedup),
        ]);
    }
    md.push_str(&tb.render());
    let tmax = *ts.last().unwrap_or(&1);
    let find = |n: usize, w: usize, pol: &str, t: usize| {
        rows.iter()
            .find(|r| r.n == n && r.w == w && r.policy == pol && r.threads == t)
            .and_then(|r| r.seconds)
    };
    md.push_str(&format!("\n## Checks at {tmax} mutators\n\n"));
    let mut tk = Table::new(["check", "n", "value"]);
    for n in [512, 4096] {
        tk.row([
            "biased throughput / atomic, W=100".to_string(),
            n.to_string(),
            fmt_ratio(crate::stats::ratio(
                find(n, 100, "atomic", tmax),
                find(n, 100, "biased", tmax),
            )),
        ]);
        for pol in ["atomic", "biased", "delegated"] {
            tk.row([
                format!("{pol} speedup / none speedup, W=1000"),
                n.to_string(),
                fmt_ratio(crate::stats::ratio(
                    find(n, 1000, "none", tmax),
                    find(n, 1000, pol, tmax),
                )),
            ]);
        }
    }
    md.push_str(&tk.render());
    md.push_str("\nThe chart plots the pending operations (published to the counting thread and not yet applied when a round begins; a mutator's unpublished decrements are not included), sampled by the counting thread in the first run of n=512, W=100.\n");
    let svg = line_chart(&traces);
    finish(
        c,
        (
            "rc-kernel",
            "Synthetic reference-counting kernel per policy",
            "003 Figs. 5-8",
        ),
        json!({ "budget_elements_x_w": budget, "pairs": pairs, "threads": ts }),
        KernelSummary {
            costs,
            rows,
            traces,
            counting_threads,
        },
        md,
        svg,
        failures,
    )
}

// ---------------------------------------------------------------------------
// rc-fft: 2-D FFT by Danielson-Lanczos (paper 003 §5.2)
// ---------------------------------------------------------------------------

/// A complex number.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct C64 {
    /// Real part.
    pub re: f64,
    /// Imaginary part.
    pub im: f64,
}

impl core::ops::Add for C64 {
    type Output = C64;
    fn add(self, o: C64) -> C64 {
        C64 {
            re: self.re + o.re,
            im: self.im + o.im,
        }
    }
}
impl core::ops::Sub for C64 {
    type Output = C64;
    fn sub(self, o: C64) -> C64 {
        C64 {
            re: self.re - o.re,
            im: self.im - o.im,
        }
    }
}
impl core::ops::Mul for C64 {
    type Output = C64;
    fn mul(self, o: C64) -> C64 {
        C64 {
            re: self.re * o.re - self.im * o.im,
            im: self.re * o.im + self.im * o.re,
        }
    }
}

/// Twiddle factors exp(-2 pi i k / N) for k < N/2.
struct Twiddles {
    n: usize,
    w: Vec<C64>,
}

impl Twiddles {
    fn new(n: usize) -> Self {
        let w = (0..n / 2)
            .map(|k| {
                let a = -2.0 * std::f64::consts::PI * k as f64 / n as f64;
                C64 {
                    re: a.cos(),
                    im: a.sin(),
                }
            })
            .collect();
        Twiddles { n, w }
    }
    /// exp(-2 pi i k / len).
    #[inline(always)]
    fn get(&self, k: usize, len: usize) -> C64 {
        self.w[k * (self.n / len)]
    }
}

/// Danielson-Lanczos on `Array`s: split into even and odd, recurse, then
/// scale the odd half by the twiddles (modarray on it) and combine into the
/// argument's memory (modarray on the argument).  With `reuse` both updates
/// find count 1 and run in place; without, an extra reference forces them
/// to copy (the same code with reuse disabled).
fn fft_arr(v: Array<C64, Atomic>, reuse: bool, tw: &Twiddles) -> Array<C64, Atomic> {
    let n = v.len();
    if n == 1 {
        return v;
    }
    let h = n / 2;
    let vs = v.as_slice();
    let ev: Array<C64, Atomic> = genarray_fn(&[h], |iv| vs[2 * iv[0]]);
    let od: Array<C64, Atomic> = genarray_fn(&[h], |iv| vs[2 * iv[0] + 1]);
    let e = fft_arr(ev, reuse, tw);
    let o = fft_arr(od, reuse, tw);
    let keep_o = (!reuse).then(|| o.clone());
    let t = o.modarray_fn(&[0], &[h], |iv, &x| x * tw.get(iv[0], n));
    drop(keep_o);
    let keep_v = (!reuse).then(|| v.clone());
    let (es, ts) = (e.as_slice(), t.as_slice());
    // The two generators of the combination, as two in-place passes (the
    // second finds the result of the first at count 1).
    let r = v.modarray_fn(&[0], &[h], |iv, _| es[iv[0]] + ts[iv[0]]);
    let r = r.modarray_fn(&[h], &[n], |iv, _| es[iv[0] - h] - ts[iv[0] - h]);
    drop(keep_v);
    r
}

/// The same recursion on `Vec` (glibc), allocating every vector.
fn fft_vec(v: &[C64], tw: &Twiddles) -> Vec<C64> {
    let n = v.len();
    if n == 1 {
        return vec![v[0]];
    }
    let h = n / 2;
    let ev: Vec<C64> = (0..h).map(|i| v[2 * i]).collect();
    let od: Vec<C64> = (0..h).map(|i| v[2 * i + 1]).collect();
    let e = fft_vec(&ev, tw);
    let o = fft_vec(&od, tw);
    let mut r = vec![C64::default(); n];
    for i in 0..h {
        let t = o[i] * tw.get(i, n);
        r[i] = e[i] + t;
        r[i + h] = e[i] - t;
    }
    r
}

/// FFT every row, then transpose (so two passes give the 2-D FFT).
fn pass_arr(m: &Array<C64, Atomic>, n: usize, reuse: bool, tw: &Twiddles) -> Array<C64, Atomic> {
    let src = m.as_slice();
    let rows: Vec<Array<C64, Atomic>> = (0..n)
        .into_par_iter()
        .map(|r| fft_arr(Array::from_fn(&[n], |j| src[r * n + j]), reuse, tw))
        .collect();
    let out = genarray(
        &[n, n],
        C64::default(),
        &[Gen::all(&[n, n], |iv| rows[iv[1]].as_slice()[iv[0]])],
    );
    out
}

fn fft2_arr(m: &Array<C64, Atomic>, n: usize, reuse: bool, tw: &Twiddles) -> Array<C64, Atomic> {
    let a = pass_arr(m, n, reuse, tw);
    pass_arr(&a, n, reuse, tw)
}

fn pass_vec(m: &[C64], n: usize, tw: &Twiddles) -> Vec<C64> {
    let rows: Vec<Vec<C64>> = (0..n)
        .into_par_iter()
        .map(|r| fft_vec(&m[r * n..(r + 1) * n], tw))
        .collect();
    let mut out = vec![C64::default(); n * n];
    out.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        for (j, x) in row.iter_mut().enumerate() {
            *x = rows[j][i];
        }
    });
    out
}

fn fft2_vec(m: &[C64], n: usize, tw: &Twiddles) -> Vec<C64> {
    let a = pass_vec(m, n, tw);
    pass_vec(&a, n, tw)
}

/// One `rc-fft` configuration.
#[derive(Debug, Clone, Serialize)]
pub struct FftRow {
    /// Threads.
    pub threads: usize,
    /// Median seconds per 2-D FFT: array-reuse, array-noreuse, vec-glibc.
    pub seconds: [Option<f64>; 3],
    /// noreuse / reuse.
    pub reuse_speedup: Option<f64>,
    /// vec / reuse.
    pub vs_vec: Option<f64>,
    /// Array allocations per 2-D FFT: reuse, noreuse.
    pub allocations: [u64; 2],
    /// In-place updates per 2-D FFT: reuse, noreuse.
    pub reuses: [u64; 2],
}

/// `rc-fft`: 2-D FFT of 128x128 complex numbers, Danielson-Lanczos, with and
/// without reuse, against plain Rust on `Vec`.
pub fn run_fft(c: &RcCommon) -> Result<Finished> {
    const N: usize = 128;
    let runs = c.runs();
    let reps = match c.size {
        Size::Quick => 10,
        Size::Default => 40,
        Size::Paper => 200,
    };
    let tw = Twiddles::new(N);
    let input: Vec<C64> = (0..N * N)
        .map(|i| C64 {
            re: ((i * 7919) % 1000) as f64 / 1000.0,
            im: ((i * 104_729) % 997) as f64 / 997.0,
        })
        .collect();
    let m: Array<C64, Atomic> = Array::from_vec(&[N, N], input.clone());
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let reference = fft2_vec(&input, N, &tw);
    for t in [1, max_threads()]
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
    {
        let p = pool(t)?;
        let mut secs: [Vec<(f64, bool)>; 3] = Default::default();
        let mut allocs = [0u64; 2];
        let mut reuses = [0u64; 2];
        for _ in 0..runs {
            for (k, reuse) in [(0, true), (1, false)] {
                let before = canopy_rc::stats();
                let (s, out) = p.install(|| {
                    time(|| {
                        let mut out = None;
                        for _ in 0..reps {
                            out = Some(fft2_arr(&m, N, reuse, &tw));
                        }
                        out
                    })
                });
                let d = canopy_rc::stats().since(&before);
                allocs[k] = d.allocations / reps as u64;
                reuses[k] = d.reuses / reps as u64;
                let out = out.expect("reps >= 1");
                let err = out
                    .as_slice()
                    .iter()
                    .zip(&reference)
                    .map(|(a, b)| (a.re - b.re).abs().max((a.im - b.im).abs()))
                    .fold(0.0, f64::max);
                secs[k].push((s / reps as f64, err <= 1e-6));
                if err > 1e-6 {
                    failures.push(format!(
                        "rc-fft threads={t} reuse={reuse}: differs from the Vec result by {err}"
                    ));
                }
            }
            let (s, out) = p.install(|| {
                time(|| {
                    let mut out = Vec::new();
                    for _ in 0..reps {
                        out = fft2_vec(black_box(&input), N, &tw);
                    }
                    out
                })
            });
            black_box(out);
            secs[2].push((s / reps as f64, true));
        }
        let med = [
            median_correct(&secs[0]),
            median_correct(&secs[1]),
            median_correct(&secs[2]),
        ];
        rows.push(FftRow {
            threads: t,
            seconds: med,
            reuse_speedup: crate::stats::ratio(med[1], med[0]),
            vs_vec: crate::stats::ratio(med[2], med[0]),
            allocations: allocs,
            reuses,
        });
    }
    // A check on the transform itself: the DC term is the sum of the input.
    let sum = input.iter().fold(C64::default(), |a, &b| a + b);
    if (reference[0].re - sum.re).abs() > 1e-6 || (reference[0].im - sum.im).abs() > 1e-6 {
        failures.push("rc-fft: the DC term is not the sum of the input".into());
    }
    let mut md = header(
        "rc-fft: 2-D FFT 128x128 by Danielson-Lanczos (paper 003 §5.2)",
        c,
        &format!(
            "{reps} transforms per run. Rows in parallel; each row FFT recurses on even/odd `Array`s. \
             `array-reuse`: the twiddle scaling and the combination run in place (modarray on arrays of count 1); \
             `array-noreuse`: the same code with an extra reference held, so both copy; `vec-glibc`: the same \
             recursion on Vec."
        ),
    );
    let mut tb = Table::new([
        "threads",
        "array-reuse ms",
        "array-noreuse ms",
        "vec-glibc ms",
        "noreuse/reuse",
        "vec/reuse",
        "allocs reuse / noreuse",
        "in-place updates reuse / noreuse",
    ]);
    for r in &rows {
        let ms = |s: Option<f64>| s.map_or_else(|| "—".into(), |v| format!("{:.3}", v * 1e3));
        tb.row([
            r.threads.to_string(),
            ms(r.seconds[0]),
            ms(r.seconds[1]),
            ms(r.seconds[2]),
            fmt_ratio(r.reuse_speedup),
            fmt_ratio(r.vs_vec),
            format!("{} / {}", r.allocations[0], r.allocations[1]),
            format!("{} / {}", r.reuses[0], r.reuses[1]),
        ]);
    }
    md.push_str(&tb.render());
    let chart = BarChart {
        title: "rc-fft: time relative to array-reuse".into(),
        y_label: "time / array-reuse time".into(),
        series: vec![
            "array-reuse".into(),
            "array-noreuse".into(),
            "vec-glibc".into(),
        ],
        panels: vec![Panel {
            title: "2-D FFT 128x128".into(),
            groups: rows
                .iter()
                .map(|r| Group {
                    label: format!("{} thread(s)", r.threads),
                    values: r
                        .seconds
                        .iter()
                        .map(|s| crate::stats::ratio(*s, r.seconds[0]))
                        .collect(),
                })
                .collect(),
        }],
        reference: Some(1.0),
    };
    let svg = plot::render(&chart).ok();
    finish(
        c,
        ("rc-fft", "2-D FFT with and without reuse", "003 §5.2"),
        json!({ "n": N, "reps": reps }),
        rows,
        md,
        svg,
        failures,
    )
}

// ---------------------------------------------------------------------------
// rc-reuse: reuse accuracy after k concurrent tasks
// ---------------------------------------------------------------------------

/// One `rc-reuse` configuration.
#[derive(Debug, Clone, Serialize)]
pub struct ReuseRow {
    /// Counting policy.
    pub policy: String,
    /// Concurrent tasks holding a reference.
    pub k: usize,
    /// Trials.
    pub trials: usize,
    /// getrc answered 1 while the k tasks held references (must be 0).
    pub false_unique: usize,
    /// getrc answered less than k+1 while they held references (must be 0).
    pub under_reports: usize,
    /// After the tasks ended, the update copied although the count was 1.
    pub false_shared: usize,
}

fn reuse_trials<P: Policy>(k: usize, trials: usize) -> ReuseRow
where
    Array<u64, P>: Send + Sync,
{
    let (mut fu, mut ur, mut fs) = (0, 0, 0);
    for trial in 0..trials {
        let a: Array<u64, P> = Array::filled(&[64], trial as u64);
        let release = std::sync::atomic::AtomicBool::new(false);
        let started = std::sync::Barrier::new(k + 1);
        let a = std::thread::scope(|s| {
            for _ in 0..k {
                let c = a.clone();
                let (release, started) = (&release, &started);
                s.spawn(move || {
                    black_box(c.as_slice().iter().sum::<u64>());
                    started.wait();
                    while !release.load(std::sync::atomic::Ordering::Acquire) {
                        std::thread::yield_now();
                    }
                    drop(c);
                    delegated::flush();
                });
            }
            started.wait();
            let n = a.getrc();
            if n == 1 {
                fu += 1;
            }
            if n < k + 1 {
                ur += 1;
            }
            release.store(true, std::sync::atomic::Ordering::Release);
            a
        });
        // Every task has ended (joined): the true count is 1.
        let addr = a.addr();
        let b = a.modarray(&[Gen::new(&[0], &[1], |_| 1)]);
        if b.addr() != addr {
            fs += 1;
        }
    }
    ReuseRow {
        policy: P::NAME.into(),
        k,
        trials,
        false_unique: fu,
        under_reports: ur,
        false_shared: fs,
    }
}

/// `rc-reuse`: an array is given to k concurrent tasks, then updated; how
/// often the update copies although the count is 1 (false "shared"), and
/// whether `getrc` ever says 1 while the tasks hold references.
pub fn run_reuse(c: &RcCommon) -> Result<Finished> {
    let trials = match c.size {
        Size::Quick => 200,
        Size::Default => 1000,
        Size::Paper => 5000,
    };
    let mut rows = Vec::new();
    for k in [1, 2, 4, 8] {
        rows.push(reuse_trials::<Delegated>(k, trials));
        rows.push(reuse_trials::<Atomic>(k, trials));
        rows.push(reuse_trials::<Biased>(k, trials));
    }
    let mut failures = Vec::new();
    for r in &rows {
        if r.false_unique > 0 || r.under_reports > 0 {
            failures.push(format!(
                "rc-reuse {} k={}: {} false unique, {} under-reports",
                r.policy, r.k, r.false_unique, r.under_reports
            ));
        }
    }
    let mut md = header(
        "rc-reuse: reuse accuracy after k concurrent tasks (paper 003 §4)",
        &RcCommon { runs: Some(1), ..c.clone() },
        &format!(
            "{trials} trials per row. Each task holds a clone, reads it, waits, drops it and flushes; the \
             owner asks getrc while they hold (must be >= k+1), then after joining them updates the array \
             (modarray): a copy there is a false \"shared\" (the count was 1)."
        ),
    );
    let mut tb = Table::new([
        "policy",
        "k",
        "trials",
        "false unique",
        "under-reports",
        "false shared",
        "false shared %",
    ]);
    for r in &rows {
        tb.row([
            r.policy.clone(),
            r.k.to_string(),
            r.trials.to_string(),
            r.false_unique.to_string(),
            r.under_reports.to_string(),
            r.false_shared.to_string(),
            format!("{:.1}", 100.0 * r.false_shared as f64 / r.trials as f64),
        ]);
    }
    md.push_str(&tb.render());
    finish(
        c,
        ("rc-reuse", "Reuse accuracy of delegated counting", "003 §4"),
        json!({ "trials": trials }),
        rows,
        md,
        None,
        failures,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_with_a_wrong_result_are_not_in_the_median() {
        // Two correct runs and two wrong ones: the wrong runs are failures,
        // not measurements (the median of all four would be 6 s).
        let s = [(1.0, true), (10.0, false), (10.0, false), (2.0, true)];
        assert_eq!(median(&s.map(|x| x.0)), Some(6.0));
        assert_eq!(median_correct(&s), Some(1.5));
        assert_eq!(median_correct(&[(3.0, false)]), None);
        assert_eq!(median_correct(&[(2.0, true), (4.0, true)]), Some(3.0));
    }
}
