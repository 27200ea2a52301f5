//! `region-pack`: the cost of packing regions into (address, length) runs,
//! and how many runs they make (paper 002, §4.3 "region packing", and the
//! Barnes-Hut layout of §6.3).
//!
//! Structures, each built with Canopy's region allocator:
//!
//! - a 30,000-node linked list (64 B nodes) in a fresh region (the size of
//!   the paper's UPC comparison, §6.5);
//! - the same list built while a second list grows in another region, one
//!   node each in turn (regions interleaved in time);
//! - the fresh list after every other node was freed (holes in every slab);
//! - a Barnes-Hut oct-tree of random bodies, one region per tree level, the
//!   region of level k a child of the region of level k-1 (§6.3): packing
//!   the level-k region packs levels k and deeper.
//!
//! For each: the runs of `pack_runs`, their bytes, and the time of
//! `pack_runs`, `pack` (runs plus the slab description a receiver needs)
//! and `Packed::encode`, against the naive alternative of one run per object
//! found by walking the structure.  Each structure is walked after packing to
//! check it is intact.

use std::fmt::Write as _;
use std::ptr::{self, NonNull};
use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use canopy_region::{RegionAllocator, RegionId};
use plotters::prelude::*;
use serde::Serialize;
use serde_json::json;

use super::machine_markdown;
use super::region::{fmt_bytes, fmt_ns, verdict, RegionCommon, Rng};
use super::Finished;
use crate::report::{self, Machine, Report, Size, Table};
use crate::stats;

/// Nodes in the list (the paper's 30K objects).
pub const LIST_NODES: usize = 30_000;
/// Most runs a packed fresh 30,000-node list may have ("a handful").
pub const HANDFUL: usize = 5;

/// Options of `region-pack`.
#[derive(Debug, Clone)]
pub struct PackOptions {
    /// Bodies in the oct-tree (`None`: by size).
    pub bodies: Option<usize>,
    /// Seed of the body positions.
    pub seed: u64,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            bodies: None,
            seed: 2013,
        }
    }
}

/// Bodies for a size (paper: the 1.1M bodies of Fig. 4e-f).
pub fn bodies_for(size: Size) -> usize {
    match size {
        Size::Quick => 10_000,
        Size::Default => 100_000,
        Size::Paper => 1_100_000,
    }
}

/// A list node: 64 bytes.
#[repr(C)]
struct Node {
    next: *mut Node,
    value: u64,
    pad: [u64; 6],
}

/// An oct-tree cell: 128 bytes.  A cell with no children is a leaf holding
/// one body at `com` (mass 1).
#[repr(C)]
struct Cell {
    child: [*mut Cell; 8],
    center: [f64; 3],
    half: f64,
    com: [f64; 3],
    mass: f64,
}

/// One packed structure (or subtree), measured.
#[derive(Debug, Clone, Serialize)]
pub struct PackRow {
    /// What was packed.
    pub structure: String,
    /// Objects in it.
    pub objects: u64,
    /// Regions packed.
    pub regions: usize,
    /// Runs of `pack_runs`.
    pub runs: usize,
    /// Bytes in the runs.
    pub run_bytes: u64,
    /// Bytes of the objects themselves.
    pub object_bytes: u64,
    /// Median ns of `pack_runs`.
    pub pack_runs_ns: Option<f64>,
    /// Median ns of `pack`.
    pub pack_ns: Option<f64>,
    /// Median ns of `encode` of the pack.
    pub encode_ns: Option<f64>,
    /// Bytes of the encoded description.
    pub description_bytes: usize,
    /// Median ns to walk the structure collecting one run per object.
    pub walk_ns: Option<f64>,
}

/// A target and whether it was met.
#[derive(Debug, Clone, Serialize)]
pub struct PackTarget {
    /// The target.
    pub target: String,
    /// What was measured.
    pub measured: String,
    /// Met.
    pub met: bool,
}

/// The summary written to JSON.
#[derive(Debug, Clone, Serialize)]
pub struct PackSummary {
    /// Bodies in the oct-tree.
    pub bodies: usize,
    /// Levels of the oct-tree (= regions).
    pub levels: usize,
    /// Cells per level.
    pub cells_per_level: Vec<u64>,
    /// Rows.
    pub rows: Vec<PackRow>,
    /// Targets.
    pub targets: Vec<PackTarget>,
}

fn e(err: canopy_region::RegionError) -> anyhow::Error {
    anyhow!("region allocator: {err}")
}

fn time<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed().as_nanos() as f64)
}

/// Allocate a list node in `rid` holding `value`, linked before `head`.
fn push_node(
    ra: &mut RegionAllocator,
    rid: RegionId,
    value: u64,
    head: *mut Node,
) -> Result<*mut Node> {
    let p = ra
        .alloc(std::mem::size_of::<Node>(), rid)
        .map_err(e)?
        .as_ptr() as *mut Node;
    // SAFETY: p is a fresh, slot-aligned (64 B) object of 64 bytes.
    unsafe {
        p.write(Node {
            next: head,
            value,
            pad: [0; 6],
        })
    };
    Ok(p)
}

/// Walk a list: (nodes, sum of values, one run per node).
fn walk_list(mut p: *mut Node, runs: &mut Vec<(usize, usize)>) -> (u64, u64) {
    let (mut n, mut s) = (0, 0u64);
    runs.clear();
    while !p.is_null() {
        runs.push((p as usize, std::mem::size_of::<Node>()));
        // SAFETY: every node of the list is live and was written by push_node.
        let node = unsafe { &*p };
        n += 1;
        s = s.wrapping_add(node.value);
        p = node.next;
    }
    (n, s)
}

/// A walk of a structure that collects one run per object and returns the
/// objects it found (0 when the contents are wrong).
type Walk<'a> = dyn FnMut(&mut Vec<(usize, usize)>) -> u64 + 'a;

/// Time `pack_runs`, `pack`, `encode` and a walk, `reps` times interleaved.
fn measure(
    ra: &RegionAllocator,
    rid: RegionId,
    structure: String,
    objects: u64,
    object_size: usize,
    reps: usize,
    walk: &mut Walk<'_>,
) -> Result<PackRow> {
    let (mut tr, mut tp, mut te, mut tw) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut runs = Vec::new();
    let mut desc = 0;
    let mut regions = 0;
    let mut scratch = Vec::new();
    for _ in 0..reps {
        let (r, t) = time(|| ra.pack_runs(rid));
        runs = r.map_err(e)?;
        tr.push(t);
        let (p, t) = time(|| ra.pack(rid));
        let p = p.map_err(e)?;
        tp.push(t);
        if p.runs != runs {
            bail!("{structure}: pack and pack_runs give different runs");
        }
        regions = p.regions.len();
        let (bytes, t) = time(|| p.encode());
        te.push(t);
        desc = bytes.len();
        let (n, t) = time(|| walk(&mut scratch));
        tw.push(t);
        if n != objects {
            bail!("{structure}: walked {n} objects, expected {objects}");
        }
    }
    Ok(PackRow {
        structure,
        objects,
        regions,
        runs: runs.len(),
        run_bytes: runs.iter().map(|r| r.len as u64).sum(),
        object_bytes: objects * object_size as u64,
        pack_runs_ns: stats::median(&tr),
        pack_ns: stats::median(&tp),
        encode_ns: stats::median(&te),
        description_bytes: desc,
        walk_ns: stats::median(&tw),
    })
}

fn list_rows(reps: usize) -> Result<Vec<PackRow>> {
    let mut rows = Vec::new();
    let mut ra = RegionAllocator::new();
    let rid = ra.ralloc(RegionId::ROOT, 0).map_err(e)?;
    let mut head = ptr::null_mut();
    for i in 0..LIST_NODES {
        head = push_node(&mut ra, rid, i as u64, head)?;
    }
    let want: u64 = (0..LIST_NODES as u64).sum();
    let mut walk = |runs: &mut Vec<(usize, usize)>| {
        let (n, s) = walk_list(head, runs);
        if s == want {
            n
        } else {
            0
        }
    };
    rows.push(measure(
        &ra,
        rid,
        format!("list, {LIST_NODES} x 64 B nodes, fresh region"),
        LIST_NODES as u64,
        64,
        reps,
        &mut walk,
    )?);

    // Free every other node (relinking the rest): holes in every slab.
    let mut p = head;
    let mut kept = 0u64;
    let mut sum = 0u64;
    while !p.is_null() {
        // SAFETY: p is a live node; its successor is live until freed here.
        unsafe {
            kept += 1;
            sum = sum.wrapping_add((*p).value);
            let q = (*p).next;
            if !q.is_null() {
                (*p).next = (*q).next;
                ra.free(NonNull::new_unchecked(q as *mut u8)).map_err(e)?;
            }
            p = (*p).next;
        }
    }
    let mut walk = |runs: &mut Vec<(usize, usize)>| {
        let (n, s) = walk_list(head, runs);
        if s == sum {
            n
        } else {
            0
        }
    };
    rows.push(measure(
        &ra,
        rid,
        "the same list after freeing every other node".into(),
        kept,
        64,
        reps,
        &mut walk,
    )?);
    drop(ra);

    let mut ra = RegionAllocator::new();
    let a = ra.ralloc(RegionId::ROOT, 0).map_err(e)?;
    let b = ra.ralloc(RegionId::ROOT, 0).map_err(e)?;
    let (mut ha, mut hb) = (ptr::null_mut(), ptr::null_mut());
    for i in 0..LIST_NODES {
        ha = push_node(&mut ra, a, i as u64, ha)?;
        hb = push_node(&mut ra, b, i as u64, hb)?;
    }
    let mut walk = |runs: &mut Vec<(usize, usize)>| {
        let (n, s) = walk_list(ha, runs);
        if s == want {
            n
        } else {
            0
        }
    };
    rows.push(measure(
        &ra,
        a,
        format!("list, {LIST_NODES} nodes, built in turn with a list in another region"),
        LIST_NODES as u64,
        64,
        reps,
        &mut walk,
    )?);
    let _ = hb;
    Ok(rows)
}

/// An oct-tree with one region per level.
struct Tree {
    ra: RegionAllocator,
    levels: Vec<RegionId>,
    root: *mut Cell,
    per_level: Vec<u64>,
}

impl Tree {
    fn level(&mut self, d: usize) -> Result<RegionId> {
        while self.levels.len() <= d {
            let parent = self.levels.last().copied().unwrap_or(RegionId::ROOT);
            let k = self.levels.len();
            self.levels
                .push(self.ra.ralloc(parent, k as i32).map_err(e)?);
            self.per_level.push(0);
        }
        Ok(self.levels[d])
    }

    fn cell(
        &mut self,
        d: usize,
        center: [f64; 3],
        half: f64,
        body: Option<[f64; 3]>,
    ) -> Result<*mut Cell> {
        let rid = self.level(d)?;
        let p = self
            .ra
            .alloc(std::mem::size_of::<Cell>(), rid)
            .map_err(e)?
            .as_ptr() as *mut Cell;
        let (com, mass) = body.map_or(([0.0; 3], 0.0), |b| (b, 1.0));
        // SAFETY: p is a fresh, 128-B-aligned object of 128 bytes.
        unsafe {
            p.write(Cell {
                child: [ptr::null_mut(); 8],
                center,
                half,
                com,
                mass,
            })
        };
        self.per_level[d] += 1;
        Ok(p)
    }

    fn octant(c: &Cell, x: &[f64; 3]) -> (usize, [f64; 3]) {
        let mut o = 0;
        let mut center = c.center;
        let h = c.half / 2.0;
        for k in 0..3 {
            if x[k] >= c.center[k] {
                o |= 1 << k;
                center[k] += h;
            } else {
                center[k] -= h;
            }
        }
        (o, center)
    }

    fn insert(&mut self, x: [f64; 3]) -> Result<()> {
        let mut c = self.root;
        let mut d = 0;
        loop {
            if d > 60 {
                bail!("oct-tree deeper than 60 levels (two bodies at one point?)");
            }
            // SAFETY: c is a live cell of the tree; the tree is only reached through self.
            let cell = unsafe { &mut *c };
            let leaf = cell.child.iter().all(|p| p.is_null());
            if leaf && cell.mass == 0.0 {
                cell.com = x;
                cell.mass = 1.0;
                return Ok(());
            }
            if leaf {
                // Push the body already here one level down.
                let old = cell.com;
                let (o, center) = Tree::octant(cell, &old);
                let h = cell.half / 2.0;
                let child = self.cell(d + 1, center, h, Some(old))?;
                // SAFETY: as above; self.cell did not move or free c.
                unsafe { (*c).child[o] = child };
            }
            // SAFETY: as above.
            let cell = unsafe { &mut *c };
            let (o, center) = Tree::octant(cell, &x);
            if cell.child[o].is_null() {
                let h = cell.half / 2.0;
                let child = self.cell(d + 1, center, h, Some(x))?;
                // SAFETY: as above.
                unsafe { (*c).child[o] = child };
                return Ok(());
            }
            c = cell.child[o];
            d += 1;
        }
    }

    /// Walk the subtree of every cell at depth `from` or deeper: (cells, bodies).
    fn walk(&self, from: usize, runs: &mut Vec<(usize, usize)>) -> (u64, u64) {
        runs.clear();
        let mut stack = vec![(self.root, 0usize)];
        let (mut cells, mut bodies) = (0, 0);
        while let Some((c, d)) = stack.pop() {
            // SAFETY: every pointer in the tree is a live cell.
            let cell = unsafe { &*c };
            if d >= from {
                runs.push((c as usize, std::mem::size_of::<Cell>()));
                cells += 1;
            }
            let mut leaf = true;
            for &k in &cell.child {
                if !k.is_null() {
                    leaf = false;
                    stack.push((k, d + 1));
                }
            }
            if leaf && cell.mass > 0.0 {
                bodies += 1;
            }
        }
        (cells, bodies)
    }
}

fn tree_rows(bodies: usize, seed: u64, reps: usize) -> Result<(Vec<PackRow>, Vec<u64>)> {
    let mut t = Tree {
        ra: RegionAllocator::new(),
        levels: Vec::new(),
        root: ptr::null_mut(),
        per_level: Vec::new(),
    };
    t.root = t.cell(0, [0.5; 3], 0.5, None)?;
    let mut rng = Rng::new(seed);
    for _ in 0..bodies {
        t.insert([rng.unit(), rng.unit(), rng.unit()])?;
    }
    let (_, b) = t.walk(0, &mut Vec::new());
    if b != bodies as u64 {
        bail!("oct-tree holds {b} bodies, inserted {bodies}");
    }
    let mut rows = Vec::new();
    let levels = t.levels.len();
    let mut froms = vec![0usize];
    froms.extend(
        (1..levels)
            .filter(|k| k % 2 == 0 || *k + 2 >= levels)
            .filter(|&k| t.per_level[k..].iter().sum::<u64>() > 0),
    );
    froms.dedup();
    for from in froms {
        let objects: u64 = t.per_level[from..].iter().sum();
        let label = if from == 0 {
            format!("oct-tree, {bodies} bodies: all {levels} levels (level-0 region and its descendants)")
        } else {
            format!(
                "oct-tree: levels {from}..{} (level-{from} region and its descendants)",
                levels - 1
            )
        };
        let tree = &t;
        let mut walk = |runs: &mut Vec<(usize, usize)>| tree.walk(from, runs).0;
        rows.push(measure(
            &t.ra,
            t.levels[from],
            label,
            objects,
            128,
            reps,
            &mut walk,
        )?);
    }
    Ok((rows, t.per_level.clone()))
}

/// Run the experiment.
pub fn run(common: &RegionCommon, opts: &PackOptions) -> Result<Finished> {
    let machine = Machine::describe();
    let bodies = opts
        .bodies
        .unwrap_or_else(|| bodies_for(common.size))
        .max(8);
    let reps = common.runs();
    let pb = crate::progress::spinner(format!(
        "region-pack: lists of {LIST_NODES} nodes, oct-tree of {bodies} bodies"
    ));
    let mut rows = list_rows(reps)?;
    let (tree, per_level) = tree_rows(bodies, opts.seed, reps)?;
    rows.extend(tree);
    pb.finish_and_clear();
    let fresh = &rows[0];
    let targets = vec![PackTarget {
        target: format!("a packed {LIST_NODES}-node list in a fresh region is at most a handful ({HANDFUL}) of runs"),
        measured: format!("{} runs ({}) for {} nodes", fresh.runs, fmt_bytes(fresh.run_bytes), fresh.objects),
        met: fresh.runs <= HANDFUL,
    }];
    let markdown = markdown(
        &rows,
        &targets,
        &per_level,
        bodies,
        reps,
        common.size,
        &machine,
    );
    let svg = render(&rows).map_err(|e| eprintln!("warning: {e:#}")).ok();
    let report = Report {
        experiment: "region-pack".into(),
        title: "Packing regions: runs and cost for a 30,000-node list and a Barnes-Hut oct-tree"
            .into(),
        paper: "002 Myrmics §4.3, §6.3".into(),
        size: common.size,
        params: json!({ "list_nodes": LIST_NODES, "bodies": bodies, "seed": opts.seed, "runs": reps }),
        machine,
        contenders: Vec::new(),
        skipped: Vec::new(),
        summary: PackSummary {
            bodies,
            levels: per_level.len(),
            cells_per_level: per_level,
            rows,
            targets,
        },
        runs: Vec::new(),
        failures: Vec::new(),
    };
    let written = report::write_all(&common.results_dir, &report, &markdown, svg.as_deref())?;
    Ok(Finished {
        name: "region-pack".into(),
        markdown,
        written,
        failures: Vec::new(),
    })
}

fn markdown(
    rows: &[PackRow],
    targets: &[PackTarget],
    per_level: &[u64],
    bodies: usize,
    reps: usize,
    size: Size,
    machine: &Machine,
) -> String {
    let mut md = format!(
        "# Packing regions (paper 002, §4.3 and the Barnes-Hut layout of §6.3)\n\n\
         Size `{}`: a {LIST_NODES}-node list of 64 B nodes, and an oct-tree of {bodies} random bodies in the unit cube with \
         one region per level (128 B cells; the level-k region is a child of the level-(k-1) region). Times are medians of \
         {reps} runs. \"Naive runs\" is one (address, length) pair per object, what a sender without regions would \
         describe; \"walk\" is the time to collect those pairs by walking the structure.\n\n",
        size.name()
    );
    md.push_str(&machine_markdown(machine));
    md.push('\n');
    let mut t = Table::new([
        "structure",
        "objects (naive runs)",
        "regions",
        "runs",
        "bytes in runs",
        "object bytes",
        "pack_runs",
        "pack",
        "encode",
        "description",
        "walk (naive)",
    ]);
    for r in rows {
        t.row([
            r.structure.clone(),
            r.objects.to_string(),
            r.regions.to_string(),
            r.runs.to_string(),
            fmt_bytes(r.run_bytes),
            fmt_bytes(r.object_bytes),
            fmt_ns(r.pack_runs_ns),
            fmt_ns(r.pack_ns),
            fmt_ns(r.encode_ns),
            fmt_bytes(r.description_bytes as u64),
            fmt_ns(r.walk_ns),
        ]);
    }
    md.push_str(&t.render());
    md.push_str("\n## Oct-tree cells per level (one region each)\n\n");
    let mut t = Table::new(["level", "cells"]);
    for (k, c) in per_level.iter().enumerate() {
        t.row([k.to_string(), c.to_string()]);
    }
    md.push_str(&t.render());
    md.push_str("\n## Targets\n\n");
    let mut t = Table::new(["target", "measured", "verdict"]);
    for x in targets {
        t.row([
            x.target.clone(),
            x.measured.clone(),
            verdict(x.met).to_string(),
        ]);
    }
    md.push_str(&t.render());
    let _ = writeln!(md);
    md
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing the chart failed: {e:?}")
}

/// The chart: runs after packing vs. objects (one run each), log scale.
pub fn render(rows: &[PackRow]) -> Result<String> {
    let series: [(&str, RGBColor); 2] = [
        ("runs after packing", RGBColor(0x1b, 0x9e, 0x77)),
        ("objects (naive: one run each)", RGBColor(0xbb, 0xbb, 0xbb)),
    ];
    let mut svg = String::new();
    {
        let g = rows.len().max(1) as i32;
        let root =
            SVGBackend::with_string(&mut svg, ((170 * g as u32).max(700), 560)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let root = root
            .titled(
                "Region packing (paper 002 §4.3): runs vs. objects (log scale)",
                ("sans-serif", 20),
            )
            .map_err(err)?;
        let (legend, body) = root.split_vertically(30);
        let mut x = 60;
        for (name, c) in series {
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
        let ymax = rows
            .iter()
            .map(|r| r.objects.max(1) as f64)
            .fold(10.0, f64::max)
            .log10()
            .ceil()
            + 0.2;
        let labels: Vec<String> = rows
            .iter()
            .map(|r| {
                if r.structure.starts_with("the same") {
                    "list, every other freed".to_string()
                } else if r.structure.contains("in turn") {
                    "list, built beside another".to_string()
                } else if r.structure.starts_with("list") {
                    "list, fresh region".to_string()
                } else {
                    format!(
                        "tree {}",
                        r.structure
                            .split(':')
                            .nth(1)
                            .unwrap_or("")
                            .split('(')
                            .next()
                            .unwrap_or("")
                            .trim()
                    )
                }
            })
            .collect();
        let mut cc = ChartBuilder::on(&body)
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(
                (0..g * 1000).with_key_points((0..g).map(|i| i * 1000 + 500).collect::<Vec<_>>()),
                0.0..ymax,
            )
            .map_err(err)?;
        cc.configure_mesh()
            .disable_x_mesh()
            .light_line_style(WHITE)
            .x_label_formatter(&|x| {
                if x % 1000 == 500 {
                    labels.get((x / 1000) as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_labels(ymax as usize + 1)
            .y_label_formatter(&|y| format!("{:.0}", 10f64.powf(*y)))
            .y_desc("count")
            .draw()
            .map_err(err)?;
        for (si, (_, c)) in series.iter().enumerate() {
            let rects = rows.iter().enumerate().map(|(gi, r)| {
                let v = if si == 0 { r.runs } else { r.objects as usize };
                let x0 = gi as i32 * 1000 + 100 + si as i32 * 400;
                Rectangle::new(
                    [(x0, 0.0), (x0 + 360, (v.max(1) as f64).log10().max(0.02))],
                    c.filled(),
                )
            });
            cc.draw_series(rects).map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_and_tree_pack_and_walk() {
        let rows = list_rows(1).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].objects, LIST_NODES as u64);
        assert!(rows[0].runs >= 1 && rows[0].run_bytes >= rows[0].object_bytes);
        assert_eq!(rows[1].objects, LIST_NODES as u64 / 2);
        let (tree, per_level) = tree_rows(2000, 1, 1).unwrap();
        assert_eq!(tree[0].objects, per_level.iter().sum::<u64>());
        assert!(tree[0].regions == per_level.len());
        assert!(render(&rows).unwrap().starts_with("<svg"));
    }
}
