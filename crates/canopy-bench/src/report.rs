//! Writing results: `results/<name>.json` (every raw run, the medians and the
//! machine), `results/<name>.md` (Markdown tables), `results/<name>.svg` (a
//! chart) and `results/README.md`, an index of the latest results.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::anchors::Contender;
use crate::artifacts::workspace_root;
use crate::runner::{Exit, Invocation, Outcome};

/// The benchmark sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Size {
    /// Seconds: CI smoke runs and the tour.
    Quick,
    /// Between quick and paper.
    Default,
    /// The paper's problem size.
    Paper,
}

impl Size {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Size::Quick => "quick",
            Size::Default => "default",
            Size::Paper => "paper",
        }
    }

    /// Default number of repetitions per configuration.
    pub fn default_runs(self) -> usize {
        match self {
            Size::Quick => 3,
            _ => 5,
        }
    }
}

/// The machine a result was measured on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// Hardware threads available to the process.
    pub nproc: usize,
    /// CPU model from /proc/cpuinfo.
    pub cpu: Option<String>,
    /// `uname -sr`.
    pub kernel: String,
    /// UTC time the experiment started, ISO 8601.
    pub date: String,
    /// `git rev-parse HEAD` of the workspace (with `-dirty` when the tree has changes).
    pub git_commit: Option<String>,
    /// `cc --version`, first line.
    pub cc: Option<String>,
    /// Machine load average (1 minute) when the experiment started.
    pub loadavg: Option<f64>,
}

impl Machine {
    /// Describe this machine now.
    pub fn describe() -> Self {
        let cpu = fs::read_to_string("/proc/cpuinfo").ok().and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        });
        let loadavg = fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|t| t.split_whitespace().next()?.parse().ok());
        Machine {
            nproc: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            cpu,
            kernel: uname(),
            date: utc_now_iso(),
            git_commit: git_commit(),
            cc: first_line_of(
                Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into())).arg("--version"),
            ),
            loadavg,
        }
    }
}

fn first_line_of(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(|l| l.trim().to_string())
}

fn uname() -> String {
    // SAFETY: utsname is plain data; uname fills it with NUL-terminated strings.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: u is a valid utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return "unknown".into();
    }
    let field = |f: &[libc::c_char]| {
        // SAFETY: uname NUL-terminates each field within its array.
        unsafe { std::ffi::CStr::from_ptr(f.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    };
    format!(
        "{} {} {}",
        field(&u.sysname),
        field(&u.release),
        field(&u.machine)
    )
}

fn git_commit() -> Option<String> {
    let ws = workspace_root()?;
    let head = first_line_of(
        Command::new("git")
            .arg("-C")
            .arg(&ws)
            .args(["rev-parse", "HEAD"]),
    )?;
    let dirty = Command::new("git")
        .arg("-C")
        .arg(&ws)
        .args(["status", "--porcelain", "--untracked-files=no"])
        .stderr(Stdio::null())
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    Some(if dirty { format!("{head}-dirty") } else { head })
}

/// Days since 1970-01-01 to a (year, month, day) civil date (proleptic Gregorian).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn iso_utc(secs: i64) -> String {
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}Z",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

fn utc_now_iso() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    iso_utc(secs)
}

/// One run of one program on one contender.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    /// Configuration label, e.g. `x=25 threads=2` or `larson`.
    pub config: String,
    /// Variant label, e.g. `jemalloc`, `canopy-rich`, `bound`.
    pub variant: String,
    /// The contender (allocator) it ran on.
    pub contender: String,
    /// Repetition index (runs are interleaved across variants).
    pub rep: usize,
    /// Whether it produced a valid result with the expected checksum.
    pub ok: bool,
    /// Kernel time the program reported, seconds.
    pub seconds: Option<f64>,
    /// Checksum it printed.
    pub checksum: Option<u64>,
    /// Peak resident set size in KiB: the `peak_kib` the program reports
    /// (its VmHWM) when present, else `ru_maxrss_kib`.
    pub max_rss_kib: Option<u64>,
    /// `ru_maxrss` of `wait4`, KiB.  Linux keeps a process's maximum RSS
    /// across exec, so this includes the harness's RSS at fork time.
    pub ru_maxrss_kib: Option<u64>,
    /// Spawn-to-exit time, seconds.
    pub wall_seconds: f64,
    /// Callgrind's total instruction count (callgrind runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instructions: Option<u64>,
    /// Other fields of the result line (pairs, ops, ...).
    pub fields: std::collections::BTreeMap<String, String>,
    /// How the child ended.
    pub exit: Option<Exit>,
    /// The command line.
    pub command: String,
    /// What went wrong, when `ok` is false.
    pub error: Option<String>,
}

impl RunRecord {
    /// A record for a run that could not be judged yet: filled in from its outcome.
    pub fn from_outcome(
        config: &str,
        variant: &str,
        contender: &Contender,
        rep: usize,
        inv: &Invocation,
        out: &Outcome,
    ) -> Self {
        let mut rec = RunRecord {
            config: config.into(),
            variant: variant.into(),
            contender: contender.name.clone(),
            rep,
            ok: false,
            seconds: None,
            checksum: None,
            max_rss_kib: Some(out.max_rss_kib),
            ru_maxrss_kib: Some(out.max_rss_kib),
            wall_seconds: out.wall_seconds,
            instructions: None,
            fields: Default::default(),
            exit: Some(out.exit.clone()),
            command: inv.display(),
            error: None,
        };
        if !out.success() {
            let tail = out.stderr_tail(5);
            rec.error = Some(format!(
                "{}: `{}` failed: {}{}",
                who(variant, &contender.name),
                inv.display(),
                out.exit,
                if tail.is_empty() {
                    String::new()
                } else {
                    format!("; stderr:\n{tail}")
                }
            ));
            return rec;
        }
        match crate::parse::ResultLine::find_in(&out.stdout)
            .and_then(|l| Ok((l.checksum()?, l.seconds()?, l)))
        {
            Ok((c, s, l)) => {
                rec.checksum = Some(c);
                rec.seconds = Some(s);
                if let Some(k) = l
                    .get("peak_kib")
                    .and_then(|k| k.parse::<u64>().ok())
                    .filter(|k| *k > 0)
                {
                    rec.max_rss_kib = Some(k);
                }
                rec.fields = l.fields;
                rec.fields.remove("checksum");
                rec.fields.remove("seconds");
                rec.ok = true;
            }
            Err(e) => {
                rec.error = Some(format!(
                    "{}: `{}`: {e:#}",
                    who(variant, &contender.name),
                    inv.display()
                ));
            }
        }
        rec
    }

    /// A record of `inv` with nothing measured yet: not ok, no error.
    pub fn unmeasured(config: &str, variant: &str, contender: &Contender, rep: usize, inv: &Invocation) -> Self {
        RunRecord {
            config: config.into(),
            variant: variant.into(),
            contender: contender.name.clone(),
            rep,
            ok: false,
            seconds: None,
            checksum: None,
            max_rss_kib: None,
            ru_maxrss_kib: None,
            wall_seconds: 0.0,
            instructions: None,
            fields: Default::default(),
            exit: None,
            command: inv.display(),
            error: None,
        }
    }

    /// A record for a program that could not even be started.
    pub fn spawn_failure(
        config: &str,
        variant: &str,
        contender: &Contender,
        rep: usize,
        inv: &Invocation,
        err: &anyhow::Error,
    ) -> Self {
        RunRecord {
            error: Some(format!(
                "{}: could not run `{}`: {err:#}",
                who(variant, &contender.name),
                inv.display()
            )),
            ..RunRecord::unmeasured(config, variant, contender, rep, inv)
        }
    }

    /// Mark the run failed because its checksum is not `expected`.
    pub fn check_checksum(&mut self, expected: u64) {
        if let Some(c) = self.checksum {
            if self.ok && c != expected {
                self.ok = false;
                self.error = Some(format!(
                    "{}: checksum mismatch: printed checksum={c}, expected {expected} (`{}`)",
                    who(&self.variant, &self.contender),
                    self.command
                ));
            }
        }
    }
}

/// `canopy` when the variant is the contender, else `canopy-rich (on canopy)`.
pub fn who(variant: &str, contender: &str) -> String {
    if variant == contender {
        contender.to_string()
    } else {
        format!("{variant} (on {contender})")
    }
}

/// One experiment's complete result, as written to `<name>.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report<S: Serialize> {
    /// Experiment name (`sac`, `sac-callgrind`, `workloads`).
    pub experiment: String,
    /// One-line title.
    pub title: String,
    /// The paper (and figure) it reproduces.
    pub paper: String,
    /// quick / default / paper.
    pub size: Size,
    /// Parameters as run.
    pub params: serde_json::Value,
    /// Where it ran.
    pub machine: Machine,
    /// The allocators it ran on.
    pub contenders: Vec<Contender>,
    /// Contenders skipped and why.
    pub skipped: Vec<String>,
    /// Medians, ratios and other derived numbers.
    pub summary: S,
    /// Every run, in the order they ran.
    pub runs: Vec<RunRecord>,
    /// The error of every failed run.
    pub failures: Vec<String>,
}

/// Where the files of one experiment went.
#[derive(Debug, Clone)]
pub struct Written {
    /// `<dir>/<name>.json`.
    pub json: PathBuf,
    /// `<dir>/<name>.md`.
    pub markdown: PathBuf,
    /// `<dir>/<name>.svg`, when a chart could be drawn.
    pub svg: Option<PathBuf>,
}

/// Write `<name>.json`, `<name>.md` and (given) the chart, then refresh the index.
pub fn write_all<S: Serialize>(
    dir: &Path,
    report: &Report<S>,
    markdown: &str,
    svg: Option<&str>,
) -> Result<Written> {
    fs::create_dir_all(dir).with_context(|| format!("could not create {}", dir.display()))?;
    let name = &report.experiment;
    let json = dir.join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(report)?;
    fs::write(&json, text + "\n").with_context(|| format!("could not write {}", json.display()))?;
    let md = dir.join(format!("{name}.md"));
    fs::write(&md, markdown).with_context(|| format!("could not write {}", md.display()))?;
    let svg_path = match svg {
        Some(s) => {
            let p = dir.join(format!("{name}.svg"));
            fs::write(&p, s).with_context(|| format!("could not write {}", p.display()))?;
            Some(p)
        }
        None => None,
    };
    write_index(dir)?;
    Ok(Written {
        json,
        markdown: md,
        svg: svg_path,
    })
}

/// Rewrite `<dir>/README.md` from the JSON results present in `dir`.
pub fn write_index(dir: &Path) -> Result<()> {
    let mut entries = Vec::new();
    let mut files: Vec<PathBuf> = fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    // The experiments in the order of `canopy tour`, then any others by name.
    const ORDER: &[&str] = &["sac", "sac-callgrind", "workloads"];
    files.sort_by_key(|p| {
        let stem = p
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_string();
        (
            ORDER.iter().position(|o| *o == stem).unwrap_or(ORDER.len()),
            stem,
        )
    });
    for p in files {
        let Ok(text) = fs::read_to_string(&p) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        let Some(name) = v.get("experiment").and_then(|x| x.as_str()) else {
            continue;
        };
        let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
        let date = v
            .pointer("/machine/date")
            .and_then(|x| x.as_str())
            .unwrap_or("")
            .to_string();
        let commit = v
            .pointer("/machine/git_commit")
            .and_then(|x| x.as_str())
            .unwrap_or("none")
            .to_string();
        let failures = v
            .get("failures")
            .and_then(|x| x.as_array())
            .map_or(0, Vec::len);
        let has_svg = dir.join(format!("{name}.svg")).exists();
        entries.push((
            name.to_string(),
            s("title"),
            s("paper"),
            s("size"),
            date,
            commit,
            failures,
            has_svg,
        ));
    }
    let mut md = String::new();
    md.push_str("# Canopy benchmark results\n\n");
    md.push_str("Written by `canopy bench ...` / `canopy tour`; every number is a median of runs interleaved across ");
    md.push_str("allocators on the machine named in each JSON file. Ratios below 1 mean faster (or smaller) than the reference.\n\n");
    md.push_str("| experiment | what | paper | size | date (UTC) | commit | failures | files |\n");
    md.push_str("|---|---|---|---|---|---|---|---|\n");
    for (name, title, paper, size, date, commit, failures, has_svg) in entries {
        let short = commit.get(..12).unwrap_or(&commit);
        let files = if has_svg {
            format!("[table]({name}.md) · [chart]({name}.svg) · [data]({name}.json)")
        } else {
            format!("[table]({name}.md) · [data]({name}.json)")
        };
        let _ = writeln!(
            md,
            "| `{name}` | {title} | {paper} | {size} | {date} | {short} | {failures} | {files} |"
        );
    }
    let path = dir.join("README.md");
    fs::write(&path, md).with_context(|| format!("could not write {}", path.display()))?;
    Ok(())
}

/// A Markdown table built row by row.
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers (numeric columns are right-aligned).
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(header: I) -> Self {
        Table {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Append a row.
    pub fn row<I: IntoIterator<Item = S>, S: Into<String>>(&mut self, cells: I) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// Is the table body empty?
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Render as Markdown with padded columns (readable in a terminal too).
    pub fn render(&self) -> String {
        let cols = self
            .header
            .len()
            .max(self.rows.iter().map(Vec::len).max().unwrap_or(0));
        let cell = |r: &Vec<String>, i: usize| r.get(i).cloned().unwrap_or_default();
        let mut width = vec![3usize; cols];
        for r in std::iter::once(&self.header).chain(&self.rows) {
            for (i, w) in width.iter_mut().enumerate() {
                *w = (*w).max(cell(r, i).chars().count());
            }
        }
        // A column is right-aligned when every body cell reads as a number.
        let numeric = |c: &str| {
            c.is_empty() || c.starts_with(|ch: char| ch.is_ascii_digit() || "-–+.".contains(ch))
        };
        let right: Vec<bool> = (0..cols)
            .map(|i| i > 0 && self.rows.iter().all(|r| numeric(&cell(r, i))))
            .collect();
        let line = |r: &Vec<String>| {
            let mut s = String::from("|");
            for (i, w) in width.iter().enumerate() {
                let c = cell(r, i);
                if !right[i] {
                    let _ = write!(s, " {c:<w$} |");
                } else {
                    let _ = write!(s, " {c:>w$} |");
                }
            }
            s.push('\n');
            s
        };
        let mut out = line(&self.header);
        out.push('|');
        for (i, w) in width.iter().enumerate() {
            if !right[i] {
                let _ = write!(out, "{}|", "-".repeat(w + 2));
            } else {
                let _ = write!(out, "{}:|", "-".repeat(w + 1));
            }
        }
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
        }
        out
    }
}

/// `1.234×`, or `–` when missing.
pub fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "–".into(), |r| format!("{r:.2}×"))
}

/// Seconds with three significant digits, or `–`.
pub fn fmt_seconds(s: Option<f64>) -> String {
    match s {
        None => "–".into(),
        Some(s) if s >= 100.0 => format!("{s:.0} s"),
        Some(s) if s >= 10.0 => format!("{s:.1} s"),
        Some(s) if s >= 1.0 => format!("{s:.2} s"),
        Some(s) => format!("{:.1} ms", s * 1e3),
    }
}

/// A percentage, or `–`.
pub fn fmt_percent(p: Option<f64>) -> String {
    p.map_or_else(|| "–".into(), |p| format!("{:.0}%", p * 100.0))
}

/// KiB as MiB with one decimal, or `–`.
pub fn fmt_kib(k: Option<u64>) -> String {
    k.map_or_else(|| "–".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
}

/// The default results directory: `<workspace>/results` when the current
/// directory is inside Canopy's workspace, else `./results`.
pub fn default_results_dir() -> PathBuf {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    match workspace_root() {
        Some(ws)
            if cwd
                .canonicalize()
                .map(|c| c.starts_with(&ws))
                .unwrap_or(false) =>
        {
            ws.join("results")
        }
        _ => cwd.join("results"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(iso_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso_utc(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn table_renders_aligned() {
        let mut t = Table::new(["variant", "X=25"]);
        t.row(["glibc", "1.00×"]);
        t.row(["canopy-rich", "0.50×"]);
        let s = t.render();
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[1].starts_with("|---"));
        assert!(lines[1].ends_with(":|"));
        assert!(lines
            .iter()
            .all(|l| l.chars().count() == lines[0].chars().count()));
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_ratio(Some(1.2345)), "1.23×");
        assert_eq!(fmt_ratio(None), "–");
        assert_eq!(fmt_seconds(Some(0.0123)), "12.3 ms");
        assert_eq!(fmt_seconds(Some(2.5)), "2.50 s");
        assert_eq!(fmt_percent(Some(0.256)), "26%");
        assert_eq!(fmt_kib(Some(2048)), "2.0 MiB");
    }

    #[test]
    fn checksum_mismatch_marks_failure() {
        let mut r = RunRecord {
            config: "x=25".into(),
            variant: "canopy".into(),
            contender: "canopy".into(),
            rep: 0,
            ok: true,
            seconds: Some(1.0),
            checksum: Some(5),
            max_rss_kib: Some(1),
            ru_maxrss_kib: Some(1),
            wall_seconds: 1.0,
            instructions: None,
            fields: Default::default(),
            exit: Some(Exit::Code { code: 0 }),
            command: "sac malloc 25".into(),
            error: None,
        };
        r.check_checksum(5);
        assert!(r.ok);
        r.check_checksum(6);
        assert!(!r.ok);
        let e = r.error.unwrap();
        assert!(e.contains("canopy") && e.contains("sac malloc 25") && e.contains("expected 6"));
    }
}
