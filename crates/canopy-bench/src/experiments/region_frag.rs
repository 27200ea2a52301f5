//! `region-frag`: the fragmentation runs of paper 002 (Myrmics), §6.2 and
//! Fig. 4a-c.  A serial program allocates and frees objects in one region:
//! at each step it either allocates a new object (with probability p) or
//! frees a randomly chosen live one.
//!
//! - part a: one size, 192 B, p = 0.6 throughout (Fig. 4a);
//! - part b: 192 B, phases of alternating allocation-heavy and free-heavy p (Fig. 4b);
//! - part c: the phases of b, each allocation of one of six sizes picked at
//!   random: 64, 1024, 4096, 192, 1536, 50048 B (Fig. 4c).
//!
//! Sampled over time, as in the paper's figures: the requested bytes of the
//! live objects (summed by the program) against the region's full and
//! partial slabs (and its empty and spanning slabs).
//!
//! Beside the allocator's own counters, the program keeps an independent
//! model of every slab (which slab each object landed in, how many of its
//! slots are live) and checks two things with it: the allocator's counters
//! agree with the model, and *holes are filled first*: an allocation never
//! lands in a slab holding no live object while a slab of its slot size has
//! a free slot.  The other claim of §6.2, that partial slabs stay a small
//! constant while the region grows, is checked on part a: the mean number of
//! partial slabs over the run is at most 8 and the mean over the last
//! quarter of the run exceeds the mean over the first quarter by at most 2,
//! while the region grows several-fold between them.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::ptr::NonNull;
use std::time::Instant;

use anyhow::{anyhow, Result};
use canopy_region::{RegionAllocator, RegionId, RegionStats, SlabCounts};
use plotters::prelude::*;
use serde::Serialize;
use serde_json::json;

use super::machine_markdown;
use super::region::{fmt_bytes, verdict, RegionCommon, Rng};
use super::Finished;
use crate::report::{self, Machine, Report, Size, Table};

/// The six sizes of Fig. 4c: three multiples of 64 B that divide the slab
/// (64, 1024, 4096) and three that do not (192, 1536, 50048).
pub const SIX_SIZES: [usize; 6] = [64, 1024, 4096, 192, 1536, 50048];

/// Allocation probability of each phase in parts b and c: allocation-heavy
/// and free-heavy phases alternating, each free-heavy phase giving back
/// most of what the phase before it added.
pub const PHASES: [f64; 8] = [0.8, 0.3, 0.75, 0.35, 0.8, 0.3, 0.75, 0.35];

/// Mean partial slabs part a may show over its run ("a small constant").
pub const PARTIAL_MEAN_MAX: f64 = 8.0;
/// How much the mean of the last quarter may exceed that of the first.
pub const PARTIAL_GROWTH_MAX: f64 = 2.0;

/// Options of `region-frag`.
#[derive(Debug, Clone)]
pub struct FragOptions {
    /// Steps (allocate-or-free operations) per part (`None`: by size).
    pub steps: Option<usize>,
    /// Seed of the random choices.
    pub seed: u64,
    /// Samples per part for the chart and the JSON.
    pub samples: usize,
    /// Parts to run (`a`, `b`, `c`).
    pub parts: Vec<String>,
}

impl Default for FragOptions {
    fn default() -> Self {
        FragOptions {
            steps: None,
            seed: 2013,
            samples: 400,
            parts: vec!["a".into(), "b".into(), "c".into()],
        }
    }
}

/// Steps per part for a size.
pub fn steps_for(size: Size) -> usize {
    match size {
        Size::Quick => 20_000,
        Size::Default => 200_000,
        Size::Paper => 1_000_000,
    }
}

/// One part of the experiment.
#[derive(Debug, Clone, Copy)]
pub struct Part {
    /// `a`, `b` or `c`.
    pub key: &'static str,
    /// What it is.
    pub title: &'static str,
    /// Object sizes, picked uniformly at each allocation.
    pub sizes: &'static [usize],
    /// Allocation probability per phase (equal-length phases).
    pub phases: &'static [f64],
}

/// The three parts of Fig. 4.
pub const PARTS: [Part; 3] = [
    Part {
        key: "a",
        title: "(a) 192 B objects, 60% allocs, 40% frees",
        sizes: &[192],
        phases: &[0.6],
    },
    Part {
        key: "b",
        title: "(b) 192 B objects, varying probabilities",
        sizes: &[192],
        phases: &PHASES,
    },
    Part {
        key: "c",
        title: "(c) 6 object sizes, varying probabilities",
        sizes: &SIX_SIZES,
        phases: &PHASES,
    },
];

/// The state of the region at one moment.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Sample {
    /// Operations done.
    pub step: usize,
    /// Bytes the program asked for, summed over live objects.
    pub requested: u64,
    /// Live objects.
    pub objects: u64,
    /// Full slabs.
    pub full: u32,
    /// Partial slabs.
    pub partial: u32,
    /// Empty slabs the region keeps.
    pub empty: u32,
    /// Slabs of objects larger than a slab.
    pub span: u32,
}

impl Sample {
    fn of(step: usize, requested: u64, objects: u64, c: &SlabCounts) -> Sample {
        Sample { step, requested, objects, full: c.full, partial: c.partial, empty: c.empty, span: c.span }
    }

    /// Slabs holding live objects.
    pub fn in_use(&self) -> u64 {
        self.full as u64 + self.partial as u64 + self.span as u64
    }
}

/// One phase of a part.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseRow {
    /// Index from 0.
    pub phase: usize,
    /// Allocation probability.
    pub p_alloc: f64,
    /// Allocations in the phase.
    pub allocs: u64,
    /// Frees in the phase.
    pub frees: u64,
    /// Free slots in partial slabs when the phase began (holes).
    pub holes_at_start: u64,
    /// Partial slabs when the phase began.
    pub partial_at_start: u32,
    /// Allocations before the first one that landed in a slab with no live
    /// object (`None`: none did).
    pub allocs_before_new_slab: Option<u64>,
    /// Allocations that landed in a slab with no live object.
    pub new_slabs: u64,
    /// The state at the end of the phase.
    pub end: Sample,
    /// Most partial slabs during the phase.
    pub peak_partial: u32,
}

/// A target and whether it was met.
#[derive(Debug, Clone, Serialize)]
pub struct Criterion {
    /// Short name.
    pub name: String,
    /// The rule, in words.
    pub rule: String,
    /// The measured value(s), in words.
    pub measured: String,
    /// Met or not.
    pub met: bool,
}

/// The outcome of one part.
#[derive(Debug, Clone, Serialize)]
pub struct PartResult {
    /// `a`, `b`, `c`.
    pub part: String,
    /// Title.
    pub title: String,
    /// Sizes.
    pub sizes: Vec<usize>,
    /// Allocation probability per phase.
    pub phases: Vec<f64>,
    /// Steps.
    pub steps: usize,
    /// Allocations.
    pub allocs: u64,
    /// Frees.
    pub frees: u64,
    /// The state at the end.
    pub end: Sample,
    /// Most requested bytes at any step.
    pub peak_requested: u64,
    /// Most slabs in use (full + partial + span) at any step.
    pub peak_in_use: u64,
    /// Most partial slabs at any step.
    pub peak_partial: u32,
    /// Mean partial slabs over every step.
    pub mean_partial: f64,
    /// 99th percentile of partial slabs over every step.
    pub p99_partial: u32,
    /// Mean partial slabs over the first quarter of the steps.
    pub mean_partial_first_quarter: f64,
    /// Mean partial slabs over the last quarter of the steps.
    pub mean_partial_last_quarter: f64,
    /// Mean slabs in use over the first quarter.
    pub mean_in_use_first_quarter: f64,
    /// Mean slabs in use over the last quarter.
    pub mean_in_use_last_quarter: f64,
    /// Slab bytes in use / requested bytes at the end.
    pub slab_bytes_per_requested_end: Option<f64>,
    /// The same counting the empty slabs the region keeps.
    pub slab_bytes_with_empty_per_requested_end: Option<f64>,
    /// Slab bytes in use / requested bytes at the step of peak requested bytes.
    pub slab_bytes_per_requested_at_peak: Option<f64>,
    /// Allocations made while a slab of their slot size had a free slot.
    pub allocs_with_holes: u64,
    /// Of those, allocations that landed in a slab with no live object.
    pub hole_first_violations: u64,
    /// Samples where the allocator's account (`region_stats`: objects and
    /// slabs) disagreed with the model, or its step-by-step `slab_counts`
    /// with that account.
    pub model_mismatches: u64,
    /// Seconds the part took (allocator and model together).
    pub seconds: f64,
    /// Per phase.
    pub phase_rows: Vec<PhaseRow>,
    /// Targets.
    pub criteria: Vec<Criterion>,
    /// The state over time.
    pub samples: Vec<Sample>,
}

/// The summary written to JSON.
#[derive(Debug, Clone, Serialize)]
pub struct FragSummary {
    /// Seed.
    pub seed: u64,
    /// Steps per part.
    pub steps: usize,
    /// Slab size of the region allocator.
    pub slab_size: usize,
    /// Granule (slot sizes are multiples of it).
    pub granule: usize,
    /// The parts.
    pub parts: Vec<PartResult>,
}

/// An independent model of the region's small-object slabs, built from the
/// addresses the allocator returns: slab address -> (class, live objects),
/// where a class is a slot size in units of the smallest slot.  Spanning
/// objects are only counted.
struct Model {
    slab: usize,
    granule: usize,
    min_slot: usize,
    slabs: HashMap<usize, (usize, u32)>,
    /// Partial slabs per class.
    partial: Vec<u64>,
    /// Free slots in partial slabs per class.
    holes: Vec<u64>,
    full: u64,
    span: u64,
}

impl Model {
    fn new(slab: usize, granule: usize, min_slot: usize) -> Model {
        let classes = slab / min_slot + 1;
        Model {
            slab,
            granule,
            min_slot,
            slabs: HashMap::new(),
            partial: vec![0; classes],
            holes: vec![0; classes],
            full: 0,
            span: 0,
        }
    }

    /// Slot sizes: multiples of the smallest slot below the granule, of the
    /// granule from there up to the slab.
    fn class(&self, size: usize) -> Option<usize> {
        let size = size.max(1);
        let slot = if size < self.granule { size.next_multiple_of(self.min_slot) } else { size.next_multiple_of(self.granule) };
        (size <= self.slab).then_some(slot / self.min_slot)
    }

    fn slots(&self, class: usize) -> u32 {
        (self.slab / (class * self.min_slot)) as u32
    }

    fn holes_total(&self) -> u64 {
        self.holes.iter().sum()
    }

    /// Record an allocation; returns (had holes of its class before, landed
    /// in a slab that held live objects).
    fn alloc(&mut self, addr: usize, size: usize) -> (bool, bool) {
        let Some(c) = self.class(size) else {
            self.span += size.div_ceil(self.slab) as u64;
            return (false, false);
        };
        let had_holes = self.holes[c] > 0;
        let slots = self.slots(c);
        let key = addr & !(self.slab - 1);
        match self.slabs.get_mut(&key) {
            Some((k, live)) => {
                debug_assert_eq!(*k, c, "slab {key:#x} changed slot size while live");
                *live += 1;
                self.holes[c] -= 1;
                if *live == slots {
                    self.partial[c] -= 1;
                    self.full += 1;
                }
                (had_holes, true)
            }
            None => {
                self.slabs.insert(key, (c, 1));
                if slots == 1 {
                    self.full += 1;
                } else {
                    self.partial[c] += 1;
                    self.holes[c] += (slots - 1) as u64;
                }
                (had_holes, false)
            }
        }
    }

    fn free(&mut self, addr: usize, size: usize) {
        let Some(c) = self.class(size) else {
            self.span -= size.div_ceil(self.slab) as u64;
            return;
        };
        let slots = self.slots(c);
        let key = addr & !(self.slab - 1);
        let e = self
            .slabs
            .get_mut(&key)
            .expect("the model knows every live object's slab");
        let live = e.1;
        e.1 -= 1;
        if live == slots {
            self.full -= 1;
            if live > 1 {
                self.partial[c] += 1;
                self.holes[c] += 1;
            }
        } else if live == 1 {
            self.partial[c] -= 1;
            self.holes[c] -= (slots - 1) as u64;
        } else {
            self.holes[c] += 1;
        }
        if live == 1 {
            self.slabs.remove(&key);
        }
    }

    /// Whether the region's own account (`region_stats`, which walks its
    /// slabs) matches the model's, and its cheap counts match that account.
    fn agrees(&self, st: &RegionStats, c: &SlabCounts, objects: u64) -> bool {
        st.objects == objects
            && (st.full_slabs, st.partial_slabs, st.empty_slabs, st.span_slabs) == (c.full, c.partial, c.empty, c.span)
            && self.agrees_counts(st)
    }

    fn agrees_counts(&self, st: &RegionStats) -> bool {
        self.full == st.full_slabs as u64
            && self.partial.iter().sum::<u64>() == st.partial_slabs as u64
            && self.span == st.span_slabs as u64
            && self.slabs.len() as u64 == (st.full_slabs + st.partial_slabs) as u64
    }
}

fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

fn mean(xs: &[u32]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().map(|&x| x as f64).sum::<f64>() / xs.len() as f64
    }
}

fn mean_u64(xs: &[u64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().map(|&x| x as f64).sum::<f64>() / xs.len() as f64
    }
}

/// Run one part in a fresh allocator.
pub fn run_part(part: &Part, steps: usize, seed: u64, samples: usize) -> Result<PartResult> {
    let mut ra = RegionAllocator::new();
    let slab = ra.config().slab_size;
    let granule = ra.config().granule;
    let min_slot = ra.config().min_slot;
    let rid = ra
        .ralloc(RegionId::ROOT, 0)
        .map_err(|e| anyhow!("ralloc: {e}"))?;
    let mut rng = Rng::new(seed ^ ((part.key.as_bytes()[0] as u64) << 56));
    let mut model = Model::new(slab, granule, min_slot);
    let mut live: Vec<(NonNull<u8>, usize)> = Vec::new();
    let mut requested = 0u64;
    let every = (steps / samples.max(1)).max(1);
    let nph = part.phases.len();
    let mut out = Vec::with_capacity(samples + 2);
    let mut partial_trace: Vec<u32> = Vec::with_capacity(steps);
    let mut in_use_trace: Vec<u64> = Vec::with_capacity(steps);
    let (mut allocs, mut frees, mut with_holes, mut violations, mut mismatches) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut peak_req, mut peak_in_use, mut peak_partial) = (0u64, 0u64, 0u32);
    let mut at_peak = None;
    let mut phase_rows: Vec<PhaseRow> = Vec::new();
    // Each step reads the slab counts (a look at each slot size); the
    // samples also read `region_stats`, which walks every slab, and check it.
    let counts = |ra: &RegionAllocator| {
        ra.slab_counts(rid)
            .map_err(|e| anyhow!("slab_counts: {e}"))
    };
    let stats = |ra: &RegionAllocator| {
        ra.region_stats(rid)
            .map_err(|e| anyhow!("region_stats: {e}"))
    };
    out.push(Sample::of(0, 0, 0, &counts(&ra)?));
    let t0 = Instant::now();
    for step in 0..steps {
        let ph = step * nph / steps;
        if phase_rows.len() == ph {
            let st = counts(&ra)?;
            phase_rows.push(PhaseRow {
                phase: ph,
                p_alloc: part.phases[ph],
                allocs: 0,
                frees: 0,
                holes_at_start: model.holes_total(),
                partial_at_start: st.partial,
                allocs_before_new_slab: None,
                new_slabs: 0,
                end: Sample::default(),
                peak_partial: st.partial,
            });
        }
        let row = phase_rows.last_mut().expect("pushed above");
        if live.is_empty() || rng.chance(part.phases[ph]) {
            let size = part.sizes[rng.below(part.sizes.len())];
            let p = ra
                .alloc(size, rid)
                .map_err(|e| anyhow!("alloc({size}) at step {step}: {e}"))?;
            let (had_holes, existing) = model.alloc(p.as_ptr() as usize, size);
            if size <= slab {
                if had_holes {
                    with_holes += 1;
                    if !existing {
                        violations += 1;
                    }
                }
                if !existing {
                    row.new_slabs += 1;
                    if row.allocs_before_new_slab.is_none() {
                        row.allocs_before_new_slab = Some(row.allocs);
                    }
                }
            }
            live.push((p, size));
            requested += size as u64;
            allocs += 1;
            row.allocs += 1;
        } else {
            let (p, size) = live.swap_remove(rng.below(live.len()));
            ra.free(p)
                .map_err(|e| anyhow!("free at step {step}: {e}"))?;
            model.free(p.as_ptr() as usize, size);
            requested -= size as u64;
            frees += 1;
            row.frees += 1;
        }
        let st = counts(&ra)?;
        let s = Sample::of(step + 1, requested, live.len() as u64, &st);
        partial_trace.push(st.partial);
        in_use_trace.push(s.in_use());
        row.peak_partial = row.peak_partial.max(st.partial);
        row.end = s;
        peak_partial = peak_partial.max(st.partial);
        peak_in_use = peak_in_use.max(s.in_use());
        if requested > peak_req {
            peak_req = requested;
            at_peak = Some(s);
        }
        if (step + 1) % every == 0 || step + 1 == steps {
            if !model.agrees(&stats(&ra)?, &st, live.len() as u64) {
                mismatches += 1;
            }
            out.push(s);
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    let end = *out.last().expect("at least the first sample");
    if let Err(e) = ra.check() {
        anyhow::bail!(
            "region allocator invariants broken after part {}: {e}",
            part.key
        );
    }
    let mut sorted = partial_trace.clone();
    sorted.sort_unstable();
    let p99 = sorted
        .get((sorted.len() * 99 / 100).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0);
    let q = steps / 4;
    let (mq1, mq4) = (mean(&partial_trace[..q]), mean(&partial_trace[steps - q..]));
    let (uq1, uq4) = (
        mean_u64(&in_use_trace[..q]),
        mean_u64(&in_use_trace[steps - q..]),
    );
    let mean_partial = mean(&partial_trace);
    let slab_u = slab as u64;
    let mut criteria = Vec::new();
    if part.phases.len() == 1 {
        criteria.push(Criterion {
            name: "partial slabs stay a small constant (Fig. 4a)".into(),
            rule: format!(
                "mean partial slabs over the run <= {PARTIAL_MEAN_MAX}, and mean over the last quarter <= mean over the first quarter + {PARTIAL_GROWTH_MAX} while slabs in use grow"
            ),
            measured: format!(
                "mean {mean_partial:.2} (peak {peak_partial}, p99 {p99}); first quarter {mq1:.2}, last quarter {mq4:.2}; slabs in use {uq1:.0} -> {uq4:.0} ({:.1}x)",
                if uq1 > 0.0 { uq4 / uq1 } else { 0.0 }
            ),
            met: mean_partial <= PARTIAL_MEAN_MAX && mq4 <= mq1 + PARTIAL_GROWTH_MAX && uq4 > uq1,
        });
    }
    criteria.push(Criterion {
        name: "holes are filled before new slabs are taken (Fig. 4b)".into(),
        rule: "no allocation lands in a slab holding no live object while a slab of its slot size has a free slot".into(),
        measured: format!("{violations} of {with_holes} allocations made while holes existed"),
        met: violations == 0 && with_holes > 0,
    });
    criteria.push(Criterion {
        name: "the allocator's slab counters agree with an independent model".into(),
        rule: "at every sample, region_stats' full, partial and spanning slab counts equal those of the program's own model of every slab, its objects the program's live objects, and the step-by-step slab_counts equal region_stats'".into(),
        measured: format!("{mismatches} of {} samples disagree", out.len() - 1),
        met: mismatches == 0,
    });
    let _ = ra.rfree(rid);
    Ok(PartResult {
        part: part.key.into(),
        title: part.title.into(),
        sizes: part.sizes.to_vec(),
        phases: part.phases.to_vec(),
        steps,
        allocs,
        frees,
        end,
        peak_requested: peak_req,
        peak_in_use,
        peak_partial,
        mean_partial,
        p99_partial: p99,
        mean_partial_first_quarter: mq1,
        mean_partial_last_quarter: mq4,
        mean_in_use_first_quarter: uq1,
        mean_in_use_last_quarter: uq4,
        slab_bytes_per_requested_end: ratio(end.in_use() * slab_u, end.requested),
        slab_bytes_with_empty_per_requested_end: ratio(
            (end.in_use() + end.empty as u64) * slab_u,
            end.requested,
        ),
        slab_bytes_per_requested_at_peak: at_peak
            .and_then(|s| ratio(s.in_use() * slab_u, s.requested)),
        allocs_with_holes: with_holes,
        hole_first_violations: violations,
        model_mismatches: mismatches,
        seconds,
        phase_rows,
        criteria,
        samples: out,
    })
}

/// Run the experiment.
pub fn run(common: &RegionCommon, opts: &FragOptions) -> Result<Finished> {
    let parts: Vec<&Part> = PARTS
        .iter()
        .filter(|p| opts.parts.iter().any(|k| k == p.key))
        .collect();
    anyhow::ensure!(!parts.is_empty(), "no part selected (known: a, b, c)");
    let machine = Machine::describe();
    let steps = opts.steps.unwrap_or_else(|| steps_for(common.size)).max(16);
    let pb = crate::progress::bar(parts.len() as u64, "region-frag");
    let mut results = Vec::new();
    for p in &parts {
        pb.set_message(format!("part {} ({steps} steps)", p.key));
        results.push(run_part(p, steps, opts.seed, opts.samples)?);
        pb.inc(1);
    }
    pb.finish_and_clear();
    let cfg = canopy_region::Config::default();
    let markdown = markdown(&results, steps, opts.seed, common.size, &machine, &cfg);
    let svg = render(&results)
        .map_err(|e| eprintln!("warning: {e:#}"))
        .ok();
    let failures: Vec<String> = results
        .iter()
        .flat_map(|r| {
            r.criteria
                .iter()
                .filter(|c| !c.met && c.name.contains("agree"))
                .map(move |c| format!("part {}: {}: {}", r.part, c.name, c.measured))
        })
        .collect();
    let report = Report {
        experiment: "region-frag".into(),
        title: "Fragmentation in a region: requested bytes against full and partial slabs".into(),
        paper: "002 Myrmics §6.2, Fig. 4a-c".into(),
        size: common.size,
        params: json!({ "steps": steps, "seed": opts.seed, "samples": opts.samples,
                        "parts": parts.iter().map(|p| p.key).collect::<Vec<_>>(), "phases": PHASES, "six_sizes": SIX_SIZES }),
        machine,
        contenders: Vec::new(),
        skipped: Vec::new(),
        summary: FragSummary {
            seed: opts.seed,
            steps,
            slab_size: cfg.slab_size,
            granule: cfg.granule,
            parts: results,
        },
        runs: Vec::new(),
        failures: failures.clone(),
    };
    let written = report::write_all(&common.results_dir, &report, &markdown, svg.as_deref())?;
    Ok(Finished {
        name: "region-frag".into(),
        markdown,
        written,
        failures,
    })
}

fn opt_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "–".into(), |r| format!("{r:.3}"))
}

fn markdown(
    results: &[PartResult],
    steps: usize,
    seed: u64,
    size: Size,
    machine: &Machine,
    cfg: &canopy_region::Config,
) -> String {
    let mut md = format!(
        "# Fragmentation in a region (paper 002, §6.2, Fig. 4a-c)\n\n\
         One region of Canopy's region allocator (slabs {} KiB, slot sizes multiples of {} B from {} B up and of {} B below, \
         pages {} MiB; every size here is at least {} B). At each of \
         {steps} steps the program allocates an object with probability p, else frees a random live one (seed {seed}, size \
         `{}`). Parts b and c run {} equal phases with p = {}. Part c picks each size among {} B.\n\n\
         \"Slab bytes / requested\" counts full, partial and spanning slabs against the bytes the program asked for. \
         A *new slab* is one that held no live object before the allocation; a *hole* is a free slot in a partial slab. \
         In part c a 4096 B object fills a slab alone, so it always takes a new slab without breaking the hole-first rule; \
         50048 B objects span 13 slabs and are counted as span slabs, outside the hole-first check.\n\n",
        cfg.slab_size / 1024,
        cfg.granule,
        cfg.granule,
        cfg.min_slot,
        cfg.page_size >> 20,
        SIX_SIZES.iter().min().copied().unwrap_or(0).min(192),
        size.name(),
        PHASES.len(),
        PHASES.iter().map(|p| format!("{p}")).collect::<Vec<_>>().join(", "),
        SIX_SIZES.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", "),
    );
    md.push_str(&machine_markdown(machine));
    md.push_str("\n## Summary\n\n");
    let mut t = Table::new([
        "part",
        "objects (end)",
        "requested (end)",
        "full",
        "partial",
        "empty",
        "span",
        "peak partial",
        "mean partial",
        "p99 partial",
        "slab bytes / requested (end)",
        "at peak requested",
        "with empty slabs (end)",
    ]);
    for r in results {
        t.row([
            r.part.clone(),
            r.end.objects.to_string(),
            fmt_bytes(r.end.requested),
            r.end.full.to_string(),
            r.end.partial.to_string(),
            r.end.empty.to_string(),
            r.end.span.to_string(),
            r.peak_partial.to_string(),
            format!("{:.2}", r.mean_partial),
            r.p99_partial.to_string(),
            opt_ratio(r.slab_bytes_per_requested_end),
            opt_ratio(r.slab_bytes_per_requested_at_peak),
            opt_ratio(r.slab_bytes_with_empty_per_requested_end),
        ]);
    }
    md.push_str(&t.render());
    md.push_str("\n## Targets\n\n");
    let mut t = Table::new(["part", "target", "rule", "measured", "verdict"]);
    for r in results {
        for c in &r.criteria {
            t.row([
                r.part.clone(),
                c.name.clone(),
                c.rule.clone(),
                c.measured.clone(),
                verdict(c.met).to_string(),
            ]);
        }
    }
    md.push_str(&t.render());
    for r in results.iter().filter(|r| r.phases.len() > 1) {
        let _ = write!(md, "\n## Phases of part {}\n\n", r.part);
        let mut t = Table::new([
            "phase",
            "p(alloc)",
            "allocs",
            "frees",
            "holes at start",
            "partial at start",
            "allocs before a new slab",
            "new slabs",
            "requested (end)",
            "full (end)",
            "partial (end)",
            "peak partial",
        ]);
        for p in &r.phase_rows {
            t.row([
                p.phase.to_string(),
                format!("{:.2}", p.p_alloc),
                p.allocs.to_string(),
                p.frees.to_string(),
                p.holes_at_start.to_string(),
                p.partial_at_start.to_string(),
                p.allocs_before_new_slab
                    .map_or_else(|| "none taken".into(), |n| n.to_string()),
                p.new_slabs.to_string(),
                fmt_bytes(p.end.requested),
                p.end.full.to_string(),
                p.end.partial.to_string(),
                p.peak_partial.to_string(),
            ]);
        }
        md.push_str(&t.render());
    }
    md
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing the chart failed: {e:?}")
}

const GREY: RGBColor = RGBColor(0x88, 0x88, 0x88);
const FULL_C: RGBColor = RGBColor(0x1b, 0x9e, 0x77);
const PARTIAL_C: RGBColor = RGBColor(0xd9, 0x5f, 0x02);
const SPAN_C: RGBColor = RGBColor(0x1f, 0x78, 0xb4);
const EMPTY_C: RGBColor = RGBColor(0x75, 0x70, 0xb3);

fn fmt_steps(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.1}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.0}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// The chart: per part, on top the paper's view (requested MiB on the left
/// axis, full / partial / spanning slabs on the right), below it partial and
/// empty slabs on their own scale.
pub fn render(results: &[PartResult]) -> Result<String> {
    let n = results.len().max(1);
    let (w, h) = (520 * n as u32 + 20, 820u32);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let root = root
            .titled(
                "Fragmentation in one region (paper 002, Fig. 4): requested bytes vs. slabs",
                ("sans-serif", 20),
            )
            .map_err(err)?;
        let (legend, body) = root.split_vertically(30);
        let items: [(&str, RGBColor); 5] = [
            ("requested MiB (left axis)", GREY),
            ("full slabs", FULL_C),
            ("partial slabs", PARTIAL_C),
            ("span slabs", SPAN_C),
            ("empty slabs kept", EMPTY_C),
        ];
        let mut x = 60;
        for (name, c) in items {
            legend
                .draw(&Rectangle::new([(x, 8), (x + 12, 20)], c.filled()))
                .map_err(err)?;
            legend
                .draw(&Text::new(
                    name,
                    (x + 17, 7),
                    ("sans-serif", 13).into_font(),
                ))
                .map_err(err)?;
            x += 40 + 7 * name.len() as i32;
        }
        let (top, bottom) = body.split_vertically(500);
        let tops = top.split_evenly((1, n));
        let bottoms = bottom.split_evenly((1, n));
        for (i, r) in results.iter().enumerate() {
            let xmax = r.steps.max(1) as f64;
            let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
            let ymax = (mib(r.peak_requested) * 1.1).max(0.01);
            let smax = r
                .samples
                .iter()
                .map(|s| s.full.max(s.partial).max(s.span))
                .max()
                .unwrap_or(1)
                .max(1) as f64
                * 1.1;
            let mut cc = ChartBuilder::on(&tops[i])
                .caption(&r.title, ("sans-serif", 15))
                .margin(8)
                .x_label_area_size(28)
                .y_label_area_size(50)
                .right_y_label_area_size(50)
                .build_cartesian_2d(0f64..xmax, 0f64..ymax)
                .map_err(err)?
                .set_secondary_coord(0f64..xmax, 0f64..smax);
            cc.configure_mesh()
                .disable_x_mesh()
                .light_line_style(WHITE)
                .x_label_formatter(&|x| fmt_steps(*x))
                .x_labels(6)
                .y_desc("requested MiB")
                .draw()
                .map_err(err)?;
            cc.configure_secondary_axes()
                .y_desc("slabs")
                .y_label_formatter(&|y| format!("{y:.0}"))
                .draw()
                .map_err(err)?;
            let pts = |f: &dyn Fn(&Sample) -> f64| {
                r.samples
                    .iter()
                    .map(|s| (s.step as f64, f(s)))
                    .collect::<Vec<_>>()
            };
            cc.draw_series(std::iter::once(PathElement::new(
                pts(&|s| mib(s.requested)),
                GREY.stroke_width(3),
            )))
            .map_err(err)?;
            cc.draw_secondary_series(std::iter::once(PathElement::new(
                pts(&|s| s.full as f64),
                FULL_C.stroke_width(2),
            )))
            .map_err(err)?;
            cc.draw_secondary_series(std::iter::once(PathElement::new(
                pts(&|s| s.partial as f64),
                PARTIAL_C.stroke_width(2),
            )))
            .map_err(err)?;
            if r.samples.iter().any(|s| s.span > 0) {
                cc.draw_secondary_series(std::iter::once(PathElement::new(
                    pts(&|s| s.span as f64),
                    SPAN_C.stroke_width(2),
                )))
                .map_err(err)?;
            }
            let pmax = r
                .samples
                .iter()
                .map(|s| s.partial.max(s.empty))
                .max()
                .unwrap_or(1)
                .max(1) as f64
                * 1.15;
            let mut cb = ChartBuilder::on(&bottoms[i])
                .caption(
                    format!("part {}: partial and empty slabs", r.part),
                    ("sans-serif", 13),
                )
                .margin(8)
                .x_label_area_size(28)
                .y_label_area_size(50)
                .right_y_label_area_size(50)
                .build_cartesian_2d(0f64..xmax, 0f64..pmax)
                .map_err(err)?;
            cb.configure_mesh()
                .disable_x_mesh()
                .light_line_style(WHITE)
                .x_label_formatter(&|x| fmt_steps(*x))
                .x_labels(6)
                .x_desc("operations")
                .y_desc("slabs")
                .y_label_formatter(&|y| format!("{y:.0}"))
                .draw()
                .map_err(err)?;
            let nph = r.phases.len();
            if nph > 1 {
                let bounds = (1..nph).map(|k| {
                    let x = (k * r.steps / nph) as f64;
                    PathElement::new(vec![(x, 0.0), (x, pmax)], BLACK.mix(0.15))
                });
                cb.draw_series(bounds).map_err(err)?;
            }
            cb.draw_series(std::iter::once(PathElement::new(
                pts(&|s| s.empty as f64),
                EMPTY_C.stroke_width(1),
            )))
            .map_err(err)?;
            cb.draw_series(std::iter::once(PathElement::new(
                pts(&|s| s.partial as f64),
                PARTIAL_C.stroke_width(2),
            )))
            .map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_parts_meet_their_targets_and_agree_with_the_model() {
        for p in &PARTS {
            let r = run_part(p, 3000, 1, 50).unwrap();
            assert_eq!(r.allocs + r.frees, 3000);
            assert_eq!(r.model_mismatches, 0, "part {}", p.key);
            assert_eq!(r.hole_first_violations, 0, "part {}", p.key);
            assert!(r.samples.len() >= 50);
            assert_eq!(r.phase_rows.len(), p.phases.len());
        }
        let svg = render(&[run_part(&PARTS[2], 2000, 3, 20).unwrap()]).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("partial"));
    }

    #[test]
    fn model_counts_full_and_partial() {
        let mut m = Model::new(4096, 64, 16);
        // 192 B: 21 slots per slab, class 192 / 16 = 12.
        for i in 0..21 {
            m.alloc(0x10000 + i * 192, 192);
        }
        assert_eq!((m.full, m.partial[12], m.holes[12]), (1, 0, 0));
        m.free(0x10000, 192);
        assert_eq!((m.full, m.partial[12], m.holes[12]), (0, 1, 1));
        // 20 B: a 32 B slot, 128 to a slab.
        m.alloc(0x30000, 20);
        assert_eq!((m.partial[2], m.holes[2]), (1, 127));
        assert_eq!(m.alloc(0x10000, 192), (true, true));
        m.alloc(0x20000, 4096);
        assert_eq!(m.full, 2);
        m.alloc(0x40000, 50048);
        assert_eq!(m.span, 13);
    }
}
