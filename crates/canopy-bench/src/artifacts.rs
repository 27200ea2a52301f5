//! Finding and building what the experiments run: the workspace, cargo's
//! target directory, Canopy's own artifacts (`libcanopy_malloc.so`, the Rust
//! SAC binaries) and the C benchmark programs.
//!
//! The C programs are embedded in this crate with `include_str!`, so the
//! harness works from any directory: at run time each source is written to a
//! cache directory and compiled with `cc -O2 -pthread` when the binary is
//! missing or older than the source.  The binary's name carries a hash of the
//! source and the flags, so a changed source can never reuse a stale binary.

use std::ffi::OsString;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::SystemTime;

use anyhow::{anyhow, bail, Context, Result};

use crate::progress;

/// The workspace root this crate was compiled in (`CARGO_MANIFEST_DIR/../..`),
/// if it still exists and looks like Canopy's workspace.
pub fn workspace_root() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = dir.canonicalize().ok()?;
    let manifest = fs::read_to_string(dir.join("Cargo.toml")).ok()?;
    (manifest.contains("[workspace]") && manifest.contains("canopy-bench")).then_some(dir)
}

/// The cargo target directory the running executable lives in: the parent of
/// the nearest `debug` or `release` ancestor that has cargo's `CACHEDIR.TAG`
/// next to it.  Test binaries live in `<target>/debug/deps`.
pub fn exe_target_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let mut dir = exe.parent();
    while let Some(d) = dir {
        let name = d.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name == "debug" || name == "release" {
            if let Some(parent) = d.parent() {
                if parent.join("CACHEDIR.TAG").exists() {
                    return Some(parent.to_path_buf());
                }
            }
        }
        dir = d.parent();
    }
    None
}

/// The target directory to build into: the one holding the running
/// executable, else `CARGO_TARGET_DIR`, else `<workspace>/target`.
pub fn target_dir() -> Option<PathBuf> {
    exe_target_dir()
        .or_else(|| std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from))
        .or_else(|| workspace_root().map(|w| w.join("target")))
}

/// The directory where C programs are compiled: `CANOPY_BENCH_CACHE`, else
/// `<target>/canopy-bench-c`, else a per-user cache directory.
pub fn c_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CANOPY_BENCH_CACHE") {
        return PathBuf::from(dir);
    }
    if let Some(t) = target_dir() {
        return t.join("canopy-bench-c");
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("canopy-bench").join("c")
}

/// The newest modification time of any file under `dirs` (recursively).
fn newest_mtime(dirs: &[PathBuf]) -> Option<SystemTime> {
    fn walk(dir: &Path, best: &mut Option<SystemTime>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                walk(&path, best);
            } else if let Ok(m) = meta.modified() {
                if best.map_or(true, |b| m > b) {
                    *best = Some(m);
                }
            }
        }
    }
    let mut best = None;
    for d in dirs {
        if d.is_file() {
            if let Ok(m) = fs::metadata(d).and_then(|m| m.modified()) {
                if best.map_or(true, |b| m > b) {
                    best = Some(m);
                }
            }
        } else {
            walk(d, &mut best);
        }
    }
    best
}

fn mtime(p: &Path) -> Option<SystemTime> {
    fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// A Rust artifact of this workspace that the experiments run.
#[derive(Debug, Clone, Copy)]
pub struct CargoArtifact {
    /// What to call it in messages.
    pub what: &'static str,
    /// Environment variable that names the file (or, for several files, the directory).
    pub env: &'static str,
    /// File names, all in one directory.
    pub files: &'static [&'static str],
    /// Arguments to `cargo build --release` that produce them.
    pub cargo_args: &'static [&'static str],
    /// Workspace-relative paths whose sources the artifact is built from.
    pub sources: &'static [&'static str],
}

/// What `libcanopy_malloc.so` is built from (sources and manifests; not tests).
const ALLOCATOR_SOURCES: &[&str] = &[
    "Cargo.toml",
    "crates/canopy-sys/src",
    "crates/canopy-sys/Cargo.toml",
    "crates/canopy-sync/src",
    "crates/canopy-sync/Cargo.toml",
    "crates/canopy-alloc/src",
    "crates/canopy-alloc/Cargo.toml",
    "crates/canopy-malloc/src",
    "crates/canopy-malloc/Cargo.toml",
];

/// `libcanopy_malloc.so`, the LD_PRELOAD form of Canopy.
pub const CANOPY_MALLOC: CargoArtifact = CargoArtifact {
    what: "libcanopy_malloc.so",
    env: "CANOPY_MALLOC_LIB",
    files: &["libcanopy_malloc.so"],
    cargo_args: &["-p", "canopy-malloc"],
    sources: ALLOCATOR_SOURCES,
};

/// The Rust SAC microbenchmark binaries.
pub const SAC_RS: CargoArtifact = CargoArtifact {
    what: "the Rust SAC binaries (sac_rs, sac_rs_canopy, sac_rs_canopy_unchecked, sac_rs_inprocess)",
    env: "CANOPY_SAC_RS_DIR",
    files: &["sac_rs", "sac_rs_canopy", "sac_rs_canopy_unchecked", "sac_rs_inprocess"],
    cargo_args: &[
        "-p",
        "canopy-bench",
        "--bin",
        "sac_rs",
        "--bin",
        "sac_rs_canopy",
        "--bin",
        "sac_rs_canopy_unchecked",
        "--bin",
        "sac_rs_inprocess",
    ],
    sources: &[
        "Cargo.toml",
        "crates/canopy-sys/src",
        "crates/canopy-sync/src",
        "crates/canopy-alloc/src",
        "crates/canopy-bench/src",
        "crates/canopy-bench/Cargo.toml",
    ],
};

/// How to look for an artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Only look (tests): never run cargo.
    FindOnly,
    /// Look, and build with cargo when missing or older than its sources.
    FindOrBuild,
}

impl CargoArtifact {
    /// Where the artifact's files are, building them if allowed and needed.
    /// Returns one path per entry of `files`.
    pub fn locate(&self, lookup: Lookup) -> Result<Vec<PathBuf>> {
        // 1. The environment variable, taken as given.
        if let Some(v) = std::env::var_os(self.env) {
            let p = PathBuf::from(v);
            let paths: Vec<PathBuf> = if self.files.len() == 1 && !p.is_dir() {
                vec![p]
            } else {
                self.files.iter().map(|f| p.join(f)).collect()
            };
            if let Some(missing) = paths.iter().find(|p| !p.exists()) {
                bail!(
                    "{} names {}, which does not exist",
                    self.env,
                    missing.display()
                );
            }
            return Ok(paths);
        }
        // 2. Next to the running executable, or in the release directory of its target dir.
        //    A debug build is good enough for tests (checksums), never for measurements:
        //    an executable in <target>/debug does not vouch for its neighbours.
        let mut dirs = Vec::new();
        if let Some(dir) = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf))
        {
            let in_debug = exe_target_dir().is_some_and(|t| dir.starts_with(t.join("debug")));
            if lookup == Lookup::FindOnly || !in_debug {
                dirs.push(dir);
            }
        }
        if let Some(t) = target_dir() {
            dirs.push(t.join("release"));
            if lookup == Lookup::FindOnly {
                dirs.push(t.join("debug"));
            }
        }
        let ws = workspace_root();
        let sources_mtime = ws.as_ref().and_then(|w| {
            newest_mtime(&self.sources.iter().map(|s| w.join(s)).collect::<Vec<_>>())
        });
        let mut stale = None;
        for dir in &dirs {
            let paths: Vec<PathBuf> = self.files.iter().map(|f| dir.join(f)).collect();
            if paths.iter().all(|p| p.exists()) {
                let oldest = paths.iter().filter_map(|p| mtime(p)).min();
                let fresh = match (oldest, sources_mtime) {
                    (Some(built), Some(src)) => built >= src,
                    _ => true,
                };
                if fresh || lookup == Lookup::FindOnly || ws.is_none() {
                    return Ok(paths);
                }
                stale.get_or_insert(dir.clone());
            }
        }
        if lookup == Lookup::FindOnly {
            bail!(
                "{} is not built (looked in {}); build it with `cargo build --release {}` or set {}",
                self.what,
                dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
                self.cargo_args.join(" "),
                self.env
            );
        }
        // 3. Build it.
        let Some(ws) = ws else {
            bail!(
                "{} not found next to the executable and the Canopy workspace is not available to build it; set {}",
                self.what,
                self.env
            );
        };
        let reason = if stale.is_some() {
            "older than its sources; rebuilding"
        } else {
            "not built yet; building"
        };
        let built = cargo_build_release(&ws, self, reason).with_context(|| {
            format!(
                "could not build {} (set {} to use a prebuilt one)",
                self.what, self.env
            )
        })?;
        Ok(built)
    }
}

/// Run `cargo build --release <args>` in the workspace with a spinner and
/// return the paths of the requested files, read from cargo's JSON messages.
fn cargo_build_release(ws: &Path, art: &CargoArtifact, reason: &str) -> Result<Vec<PathBuf>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(ws)
        .arg("build")
        .arg("--release")
        .args(art.cargo_args)
        .arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(t) = exe_target_dir() {
        cmd.env("CARGO_TARGET_DIR", t);
    }
    let spinner = progress::spinner(format!(
        "{}: {reason} (cargo build --release {})",
        art.what,
        art.cargo_args.join(" ")
    ));
    let mut child = cmd
        .spawn()
        .with_context(|| format!("could not run {}", Path::new(&cargo).display()))?;
    let stderr = child.stderr.take().expect("stderr is piped");
    let err_thread = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let mut found: Vec<Option<PathBuf>> = vec![None; art.files.len()];
    let stdout = child.stdout.take().expect("stdout is piped");
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if msg.get("reason").and_then(|r| r.as_str()) != Some("compiler-artifact") {
            continue;
        }
        if let Some(name) = msg.pointer("/target/name").and_then(|n| n.as_str()) {
            spinner.set_message(format!("{}: {reason}: compiled {name}", art.what));
        }
        let mut candidates: Vec<String> = Vec::new();
        if let Some(files) = msg.get("filenames").and_then(|f| f.as_array()) {
            candidates.extend(files.iter().filter_map(|f| f.as_str().map(String::from)));
        }
        if let Some(exe) = msg.get("executable").and_then(|e| e.as_str()) {
            candidates.push(exe.to_string());
        }
        for c in candidates {
            let p = PathBuf::from(&c);
            if let Some(i) = art
                .files
                .iter()
                .position(|f| p.file_name().and_then(|n| n.to_str()) == Some(f))
            {
                found[i] = Some(p);
            }
        }
    }
    let status = child.wait()?;
    let err = err_thread.join().unwrap_or_default();
    spinner.finish_and_clear();
    if !status.success() {
        let tail: Vec<&str> = err
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        bail!("cargo build failed ({status}):\n{}", tail.join("\n"));
    }
    found
        .into_iter()
        .zip(art.files)
        .map(|(p, f)| p.ok_or_else(|| anyhow!("cargo built nothing named {f}")))
        .collect()
}

/// A C benchmark program embedded in this crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CProgram {
    /// `c/sac.c`: the SAC with-loop microbenchmark.
    Sac,
    /// `c/workloads.c`: Larson, producer/consumer, false sharing, size walk, thread churn,
    /// mixed sizes, phases.
    Workloads,
    /// `c/inprocess.c`: allocators loaded side by side into one process and
    /// run in alternating bursts.
    InProcess,
}

/// Flags every C program is compiled with.
pub const C_FLAGS: &[&str] = &["-O2", "-g", "-pthread"];

impl CProgram {
    /// The program's name (and its source's file stem).
    pub fn name(self) -> &'static str {
        match self {
            CProgram::Sac => "sac",
            CProgram::Workloads => "workloads",
            CProgram::InProcess => "inprocess",
        }
    }

    /// The embedded source text.
    pub fn source(self) -> &'static str {
        match self {
            CProgram::Sac => include_str!("../c/sac.c"),
            CProgram::Workloads => include_str!("../c/workloads.c"),
            CProgram::InProcess => include_str!("../c/inprocess.c"),
        }
    }

    /// Compile the program into `dir` (if needed) and return the binary's path.
    pub fn compile_into(self, dir: &Path) -> Result<PathBuf> {
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
        fs::create_dir_all(dir).with_context(|| format!("could not create {}", dir.display()))?;
        let src = dir.join(format!("{}.c", self.name()));
        let text = self.source();
        // Rewrite the source only when it changed, so its mtime means something.
        if fs::read_to_string(&src).ok().as_deref() != Some(text) {
            write_atomically(&src, text.as_bytes())?;
        }
        let key = fnv1a(&[text, &cc, &C_FLAGS.join(" ")]);
        let bin = dir.join(format!("{}-{key:016x}", self.name()));
        let up_to_date = match (mtime(&bin), mtime(&src)) {
            (Some(b), Some(s)) => b >= s,
            _ => false,
        };
        if up_to_date {
            return Ok(bin);
        }
        let tmp = dir.join(format!(".{}-{}.tmp", self.name(), unique_suffix()));
        let out = Command::new(&cc)
            .args(C_FLAGS)
            .arg("-o")
            .arg(&tmp)
            .arg(&src)
            .arg("-ldl")
            .output()
            .with_context(|| {
                format!("could not run the C compiler `{cc}` (install gcc, or set CC)")
            })?;
        if !out.status.success() {
            let _ = fs::remove_file(&tmp);
            bail!(
                "compiling {} failed:\n{}",
                src.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        fs::rename(&tmp, &bin)
            .with_context(|| format!("could not move the binary to {}", bin.display()))?;
        Ok(bin)
    }

    /// Compile into the default cache directory.
    pub fn compile(self) -> Result<PathBuf> {
        self.compile_into(&c_cache_dir())
    }
}

/// A name part no other temporary file of this machine's processes has: the
/// process id and a per-process count.  (The process id alone was not
/// enough: tests running in parallel threads of one process compiled the
/// same program at once, and one thread's rename took the other's
/// half-written file.)
fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp{}", unique_suffix()));
    fs::write(&tmp, bytes).with_context(|| format!("could not write {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("could not write {}", path.display()))?;
    Ok(())
}

/// FNV-1a over several strings (with a separator): a stable cache key.
pub fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// A short-lived scratch directory under the results directory's `tmp/`
/// (ignored by git), removed on drop.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// Create `<base>/tmp/<name>-<pid>`.
    pub fn new(base: &Path, name: &str) -> Result<Self> {
        let path = base
            .join("tmp")
            .join(format!("{name}-{}", std::process::id()));
        fs::create_dir_all(&path)
            .with_context(|| format!("could not create {}", path.display()))?;
        Ok(ScratchDir { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
        if let Some(parent) = self.path.parent() {
            let _ = fs::remove_dir(parent); // only if empty
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_is_stable_and_separates_parts() {
        assert_eq!(fnv1a(&[]), 0xcbf2_9ce4_8422_2325);
        assert_ne!(fnv1a(&["ab", "c"]), fnv1a(&["a", "bc"]));
        assert_eq!(fnv1a(&["x"]), fnv1a(&["x"]));
    }

    #[test]
    fn sources_are_embedded() {
        assert!(CProgram::Sac.source().contains("checksum="));
        assert!(CProgram::Workloads.source().contains("workload="));
        assert!(CProgram::InProcess.source().contains("median_ns="));
    }

    #[test]
    fn threads_compiling_one_program_at_once_all_get_a_working_binary() {
        // Tests run in threads of one process and compile the same programs;
        // each must get the whole binary, not another thread's half-written one.
        let dir = std::env::temp_dir().join(format!("canopy-compile-race-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let bins: Vec<PathBuf> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4).map(|_| s.spawn(|| CProgram::InProcess.compile_into(&dir).unwrap())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for b in &bins {
            assert_eq!(b, &bins[0]);
            let out = Command::new(b).output().unwrap();
            assert_eq!(out.status.code(), Some(2), "the binary runs and prints its usage");
            assert!(String::from_utf8_lossy(&out.stderr).contains("usage: inprocess"));
        }
        let leftovers: Vec<_> = fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().contains("tmp")).collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
        let _ = fs::remove_dir_all(&dir);
    }
}
