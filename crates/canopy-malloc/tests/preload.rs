//! Real programs on Canopy through `LD_PRELOAD`: C programs of our own (API,
//! threads, process lifecycle, bad frees), Python (threads, and a process
//! pool forked while threads allocate), git, Node.js worker threads and a
//! JVM thread pool.  A program that is not installed is skipped with a
//! message.
//!
//! The shared library is taken from `CANOPY_MALLOC_LIB`, else
//! `target/release/libcanopy_malloc.so`, else it is built with
//! `cargo build --release -p canopy-malloc`.  Stress sizes scale with
//! `CANOPY_STRESS_SCALE` (default 1, the quick CI setting).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace().join("target"))
}

fn lib() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        if let Some(p) = std::env::var_os("CANOPY_MALLOC_LIB") {
            return PathBuf::from(p);
        }
        let p = target_dir().join("release/libcanopy_malloc.so");
        if !p.exists() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let st = Command::new(cargo)
                .args(["build", "--release", "-p", "canopy-malloc"])
                .current_dir(workspace())
                .status()
                .expect("run cargo to build libcanopy_malloc.so");
            assert!(st.success(), "building libcanopy_malloc.so failed");
        }
        assert!(p.exists(), "{} missing", p.display());
        if let Some(newer) = newer_source(&p) {
            panic!(
                "{} is older than {}: these tests would run the old allocator; \
                 run `cargo build --release -p canopy-malloc` first (scripts/test.sh does), \
                 or point CANOPY_MALLOC_LIB at a fresh build",
                p.display(),
                newer.display()
            );
        }
        p
    })
}

/// A source file of the library (or of a crate it is built from) changed
/// after `lib` was built, if any.  The crates' `tests.rs` (unit tests, not
/// part of the library) do not count: a change there rebuilds nothing.
fn newer_source(lib: &Path) -> Option<PathBuf> {
    let built = std::fs::metadata(lib).and_then(|m| m.modified()).ok()?;
    let mut stack: Vec<PathBuf> = ["canopy-malloc", "canopy-alloc", "canopy-region", "canopy-sys", "canopy-sync"]
        .iter()
        .flat_map(|c| ["src", "Cargo.toml", "build.rs", "hot-text.ld"].map(|f| workspace().join("crates").join(c).join(f)))
        .collect();
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::metadata(&p) else { continue };
        if m.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        } else if p.file_name().is_some_and(|n| n != "tests.rs") && m.modified().is_ok_and(|t| t > built) {
            return Some(p);
        }
    }
    None
}

fn scale() -> usize {
    std::env::var("CANOPY_STRESS_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1)
}

fn compile(name: &str) -> PathBuf {
    // One compilation per program, even when tests run in parallel.
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = built.iter().find(|(n, _)| n == name) {
        return p.clone();
    }
    let p = compile_now(name);
    built.push((name.to_string(), p.clone()));
    p
}

fn compile_now(name: &str) -> PathBuf {
    compile_with(name, &[])
}

/// Compile a program linked against libcanopy_malloc.so (found through rpath).
fn compile_linked(name: &str) -> PathBuf {
    let dir = lib().parent().expect("library directory").to_path_buf();
    let flags = [format!("-L{}", dir.display()), "-lcanopy_malloc".into(), format!("-Wl,-rpath,{}", dir.display())];
    compile_with(name, &flags)
}

fn compile_with(name: &str, link: &[String]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c").join(format!("{name}.c"));
    // The same program linked differently gets a name of its own.
    let flags = link.iter().flat_map(|s| s.bytes()).fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let file = if link.is_empty() { format!("canopy-c-{name}") } else { format!("canopy-c-{name}-{flags:016x}") };
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(file);
    let st = Command::new("cc")
        .args(["-O1", "-g", "-pthread", "-Wall", "-Wno-alloc-size-larger-than"])
        .arg("-I")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("include"))
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .arg("-ldl")
        .args(link)
        .status()
        .expect("a C compiler (cc) is needed for these tests");
    assert!(st.success(), "compiling {} failed", src.display());
    out
}

fn run(cmd: &mut Command, check_mode: bool) -> Output {
    cmd.env("LD_PRELOAD", lib()).env("CANOPY_CHECK", if check_mode { "1" } else { "0" });
    
    cmd.output().expect("run program")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn expect_ok(out: &Output, marker: &str, what: &str) {
    assert!(
        out.status.success() && text(&out.stdout).contains(marker),
        "{what}: status {:?}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn c_api_default_and_check_mode() {
    let exe = compile("api");
    for check in [false, true] {
        let out = run(&mut Command::new(&exe), check);
        expect_ok(&out, "api ok", &format!("api (check={check})"));
    }
}

/// glibc's extensions answer for Canopy under `LD_PRELOAD`: `mallinfo2` and
/// `mallinfo` count Canopy's blocks, `malloc_info` writes its XML,
/// `malloc_stats` its table, `mallopt` changes nothing (0), and blocks pass
/// between the `__libc_*` names and malloc/free (check mode would abort on
/// a foreign block).
#[test]
fn glibc_extensions_answer_for_canopy() {
    let exe = compile("glibcext");
    for check in [false, true] {
        let out = run(&mut Command::new(&exe), check);
        expect_ok(&out, "glibcext ok", &format!("glibcext (check={check})"));
        let err = text(&out.stderr);
        assert!(err.contains("canopy statistics") && err.contains("in_use_bytes"), "malloc_stats printed no Canopy table: {err}");
        assert!(!err.contains("was refused") && !err.contains("not allocated by Canopy"), "a block crossed allocators: {err}");
    }
}

#[test]
fn c_region_api_linked() {
    let exe = compile_linked("regions");
    // cargo points LD_LIBRARY_PATH at target/debug, which would win over the
    // rpath and load a debug build of the library: run with the rpath alone.
    let run = |check: &str, free_with_free: bool| {
        let mut c = Command::new(&exe);
        c.env_remove("LD_LIBRARY_PATH").env("CANOPY_CHECK", check);
        if free_with_free {
            c.env("REGIONS_FREE_REGION_OBJECT_WITH_FREE", "1");
        }
        c.output().expect("run regions")
    };
    for check in ["0", "1"] {
        let out = run(check, false);
        expect_ok(&out, "regions ok", &format!("regions (CANOPY_CHECK={check})"));
    }
    // free() of a region object is refused with a message naming the region API.
    let out = run("0", true);
    expect_ok(&out, "regions ok", "regions with free() of a region object");
    assert!(text(&out.stderr).contains("lent to a region allocator"), "stderr: {}", text(&out.stderr));
    let out = run("1", true);
    assert!(!out.status.success() && text(&out.stderr).contains("lent to a region allocator"), "check mode aborts: {}", text(&out.stderr));
}

#[test]
fn c_region_sessions_linked() {
    let exe = compile_linked("sessions");
    for check in ["0", "1"] {
        // As for `regions`: the rpath alone picks the library.
        let out = Command::new(&exe).env_remove("LD_LIBRARY_PATH").env("CANOPY_CHECK", check).output().expect("run sessions");
        expect_ok(&out, "sessions ok", &format!("sessions (CANOPY_CHECK={check})"));
        let err = text(&out.stderr);
        assert!(err.contains("a thread ended with region session") && err.contains("the session is ended"), "stderr: {err}");
    }
}

/// Run one case of `edges.c` (linked, like `regions`) in both modes.
fn edge_case(case: &str) {
    let exe = {
        static EDGES: OnceLock<PathBuf> = OnceLock::new();
        EDGES.get_or_init(|| compile_linked("edges")).clone()
    };
    for check in ["0", "1"] {
        let out = Command::new(&exe).arg(case).env_remove("LD_LIBRARY_PATH").env("CANOPY_CHECK", check).output().expect("run edges");
        expect_ok(&out, &format!("edges {case} ok"), &format!("edges {case} (CANOPY_CHECK={check})"));
    }
}

/// Frees of null before the first allocation do nothing (the arena's base
/// was 0 then, and a null pointer passed the fast path's range check).
#[test]
fn edge_null_freed_before_the_first_allocation() {
    edge_case("null-first");
}

/// Alignments above the arena's 1 GiB are refused with ENOMEM, not met
/// relative to the arena base (which left the block misaligned).
#[test]
fn edge_huge_alignment_is_met_or_refused() {
    edge_case("huge-alignment");
}

/// `canopy_region_realloc` of a span to a size near `SIZE_MAX`: the slab
/// count wrapped, the free-range check passed and the region allocator
/// panicked (an abort through the C API) instead of failing.
#[test]
fn edge_region_realloc_to_a_huge_size_fails_cleanly() {
    edge_case("region-realloc-huge");
}

/// A region request too large to express failed with EINVAL, while a merely
/// too large one got ENOMEM: both are memory that runs out.
#[test]
fn edge_region_sizes_too_large_are_enomem() {
    edge_case("region-too-large");
}

/// `canopy_region_balloc` of zero objects larger than a slab returned 0 for
/// a region that does not exist (only the small-object path looked it up).
#[test]
fn edge_region_balloc_of_nothing_checks_the_region() {
    edge_case("region-balloc-none");
}

/// `canopy_region_balloc` with a count whose pointer list cannot be
/// allocated aborted the process (`Vec::with_capacity` failing) instead of
/// returning -1 with ENOMEM.
#[test]
fn edge_region_balloc_of_an_impossible_count_is_enomem() {
    edge_case("region-balloc-huge-count");
}

#[test]
fn c_threads_with_cross_thread_frees() {
    let exe = compile("threads");
    let rounds = (20_000 * scale()).to_string();
    for check in [false, true] {
        let out = run(Command::new(&exe).args(["4", &rounds]), check);
        expect_ok(&out, "threads ok", &format!("threads (check={check})"));
    }
    // Remote frees in batches of one pointer, of a few, and of the most a
    // batch block holds (a larger setting is clamped to it).
    for batch in ["1", "3", "1021", "100000"] {
        let out = run(Command::new(&exe).args(["4", &rounds]).env("CANOPY_REMOTE_BATCH", batch), false);
        expect_ok(&out, "threads ok", &format!("threads (CANOPY_REMOTE_BATCH={batch})"));
        let clamped = text(&out.stderr).contains("CANOPY_REMOTE_BATCH=\"100000\" is above the maximum 1021");
        assert_eq!(clamped, batch == "100000", "stderr: {}", text(&out.stderr));
    }
}

#[test]
fn c_lifecycle_fork_churn_tls_destructors() {
    let exe = compile("lifecycle");
    let churn = (2000 * scale()).to_string();
    for check in [false, true] {
        let out = run(Command::new(&exe).arg(&churn), check);
        expect_ok(&out, "lifecycle ok", &format!("lifecycle (check={check})"));
    }
}

/// `badfree` cases and the words their report must contain.
/// Each case of `badfree.c`: its argument, the call the report names, and
/// words of the report in the default mode and in check mode (where a free
/// with a class checks the block's size first, and a freed block is no live
/// block).
const BAD_FREES: &[(&str, &str, &str, &str)] = &[
    ("double", "free", "double free", "double free"),
    ("foreign", "free", "not allocated by Canopy", "not allocated by Canopy"),
    ("interior", "free", "not the start of a live block", "not the start of a live block"),
    ("large", "free", "double free", "double free"),
    ("medium", "free", "double free", "double free"),
    ("unchecked", "free_class_unchecked", "double free", "not the start of a live block"),
];

#[test]
fn bad_frees_are_refused_in_default_mode() {
    let exe = compile("badfree");
    for &(what, call, words, _) in BAD_FREES {
        let out = run(Command::new(&exe).arg(what), false);
        expect_ok(&out, "survived", &format!("badfree {what}"));
        let err = text(&out.stderr);
        assert!(err.contains(&format!("canopy: {call}(0x")) && err.contains(words), "badfree {what}: message was {err:?}");
    }
}

#[test]
fn bad_frees_abort_in_check_mode() {
    let exe = compile("badfree");
    for &(what, call, _, words) in BAD_FREES {
        let out = run(Command::new(&exe).arg(what), true);
        assert!(!out.status.success(), "badfree {what} must abort in check mode");
        let err = text(&out.stderr);
        assert!(err.contains(&format!("canopy: {call}(0x")) && err.contains(words) && err.contains("aborting"), "badfree {what}: {err:?}");
        assert!(!text(&out.stdout).contains("survived"));
    }
}

#[test]
fn exhaustion_is_null_and_enomem() {
    let exe = compile("oom");
    for check in [false, true] {
        let out = run(Command::new(&exe).env("CANOPY_ARENA_GB", "1"), check);
        expect_ok(&out, "oom ok", &format!("oom (check={check})"));
    }
}

/// Under `ulimit -v` (a 512 MiB `RLIMIT_AS` the program sets before it runs
/// itself again) the arena starts small and grows: 300 MiB of blocks of
/// every kind and four threads freeing across threads work, exhaustion is
/// NULL and ENOMEM, and frees of pointers above the grown arena (inside
/// what a whole arena would span) and among its tables are refused, not a
/// crash.  Before the arena could grow, no allocation worked under a limit
/// below about 4.4 GB.
#[test]
fn address_space_limit_grows_the_arena() {
    let exe = compile("aslimit");
    for check in [false, true] {
        let out = run(&mut Command::new(&exe), check);
        expect_ok(&out, "aslimit ok", &format!("aslimit (check={check})"));
        if !check {
            let err = text(&out.stderr);
            assert_eq!(err.matches("pointer was not allocated by Canopy; the free was refused").count(), 2, "stderr: {err}");
        }
    }
}

/// `CANOPY_ARENA_GROW=1`: the arena grows (as under `ulimit -v`) without a
/// limit: four threads exchanging blocks work, in both modes, and the
/// statistics at exit show a few MiB reserved, not the 128 GiB of a whole
/// arena.
#[test]
fn arena_grow_option_without_a_limit() {
    let exe = compile("threads");
    let rounds = (20_000 * scale()).to_string();
    for check in [false, true] {
        let out = run(Command::new(&exe).args(["4", &rounds]).env("CANOPY_ARENA_GROW", "1").env("CANOPY_VERBOSE", "1"), check);
        expect_ok(&out, "threads ok", &format!("threads (CANOPY_ARENA_GROW=1, check={check})"));
        let err = text(&out.stderr);
        let reserved: u64 = err
            .lines()
            .find_map(|l| l.trim().strip_prefix("reserved_bytes").map(|v| v.trim().parse().expect("a number")))
            .unwrap_or_else(|| panic!("no reserved_bytes in the statistics: {err}"));
        assert!((4 << 20..1 << 30).contains(&reserved), "reserved {reserved} bytes");
    }
}

#[test]
fn verbose_mode_prints_statistics_at_exit() {
    let exe = compile("api");
    let out = run(Command::new(&exe).env("CANOPY_VERBOSE", "1"), false);
    expect_ok(&out, "api ok", "api (verbose)");
    let err = text(&out.stderr);
    assert!(err.contains("canopy statistics") && err.contains("allocations"), "stderr: {err}");
}

#[test]
fn bad_option_values_are_reported_and_the_program_runs() {
    let exe = compile("api");
    let out = run(
        Command::new(&exe)
            .env("CANOPY_REMOTE_BATCH", "lots")
            .env("CANOPY_ARENA_GB", "99999")
            .env("CANOPY_VERBOS", "1"),
        false,
    );
    expect_ok(&out, "api ok", "api (bad options)");
    let err = text(&out.stderr);
    assert!(
        err.contains("canopy: CANOPY_REMOTE_BATCH=\"lots\" is not a decimal number; using 32\n")
            && err.contains("canopy: CANOPY_ARENA_GB=\"99999\" is above the maximum 16384; using 16384\n")
            && err.contains(
                "canopy: CANOPY_VERBOS is not an option of the allocator and is ignored; \
                 did you mean CANOPY_VERBOSE?\n"
            ),
        "stderr: {err}"
    );
    // Reported once, when the allocator starts.
    assert_eq!(err.matches("CANOPY_REMOTE_BATCH").count(), 1, "stderr: {err}");
}

#[test]
fn python_allocation_heavy_script() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("python3 not found: skipping");
        return;
    }
    let script = r#"
import threading, json, random
random.seed(7)
d = {}
def work(k):
    local = []
    for i in range(60000):
        s = str(i) * (1 + i % 17)
        d[(k, i % 3000)] = s
        local.append([s, {i: s}])
        if len(local) > 500:
            local = local[250:]
ts = [threading.Thread(target=work, args=(k,)) for k in range(3)]
[t.start() for t in ts]
[t.join() for t in ts]
blob = json.dumps({str(k): v for k, v in d.items()})
back = json.loads(blob)
big = [bytearray(random.randrange(1, 3 << 20)) for _ in range(40)]
print(len(d), len(back), sum(len(b) > 0 for b in big))
"#;
    for check in [false, true] {
        let out = run(Command::new("python3").args(["-c", script]), check);
        assert!(out.status.success(), "python (check={check}): {}", text(&out.stderr));
        assert_eq!(text(&out.stdout).trim(), "9000 9000 40");
    }
    // The same under `ulimit -v` (1 GB): the arena grows instead.
    let out = run(Command::new("sh").args(["-c", "ulimit -v 1000000 && exec python3 -c \"$0\"", script]), false);
    assert!(out.status.success(), "python under ulimit -v: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "9000 9000 40");
}

#[test]
fn git_on_a_small_repository() {
    if Command::new("git").arg("--version").output().is_err() {
        eprintln!("git not found: skipping");
        return;
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("canopy-git-test");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..200 {
        std::fs::write(dir.join(format!("f{i}.txt")), format!("line {i}\n").repeat(i + 1)).unwrap();
    }
    let git = |args: &[&str]| {
        let out = run(
            Command::new("git")
                .args(["-c", "user.email=ci@canopy", "-c", "user.name=canopy", "-c", "init.defaultBranch=main"])
                .args(args)
                .current_dir(&dir),
            false,
        );
        assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    git(&["init", "-q"]);
    git(&["add", "."]);
    git(&["commit", "-qm", "first"]);
    for i in 0..50 {
        std::fs::write(dir.join(format!("f{i}.txt")), format!("changed {i}\n")).unwrap();
    }
    git(&["commit", "-qam", "second"]);
    let log = git(&["log", "--oneline"]);
    assert_eq!(log.lines().count(), 2);
    let diff = git(&["diff", "--stat", "HEAD~1"]);
    assert!(diff.contains("50 files changed"), "{diff}");
    git(&["gc", "-q"]);
    let fsck = run(Command::new("git").args(["fsck"]).current_dir(&dir), true);
    assert!(fsck.status.success(), "git fsck in check mode: {}", text(&fsck.stderr));
}

/// Whether `program --version` (or `-version`) runs; if not, say so.
fn have(program: &str, flag: &str) -> bool {
    let ok = Command::new(program).arg(flag).output().map(|o| o.status.success()).unwrap_or(false);
    if !ok {
        eprintln!("{program} not found: skipping");
    }
    ok
}

#[test]
fn python_process_pool_forked_while_threads_allocate() {
    if !have("python3", "--version") {
        return;
    }
    // The pool's workers are forked (explicitly, whatever the platform's
    // default) while four threads of the parent are allocating: each child
    // starts with a copy of a heap that other threads were changing.
    let script = r#"
import multiprocessing as mp, threading
def work(n):
    d = {i: str(i) * 5 for i in range(n)}
    return sum(len(v) for v in d.values()) % 1000003
out = []
ts = [threading.Thread(target=lambda: out.append(work(150000))) for _ in range(4)]
[t.start() for t in ts]
with mp.get_context("fork").Pool(3) as p:
    r = p.map(work, [40000] * 9)
[t.join() for t in ts]
print(len(set(r)), r[0] == work(40000), len(out), len(set(out)))
"#;
    for check in [false, true] {
        let out = run(Command::new("python3").args(["-c", script]), check);
        assert!(out.status.success(), "python (check={check}): {}", text(&out.stderr));
        assert_eq!(text(&out.stdout).trim(), "1 True 4 1", "python (check={check})");
    }
}

#[test]
fn node_worker_threads() {
    if !have("node", "--version") {
        return;
    }
    // Four V8 isolates on their own threads, each allocating buffers of
    // many sizes (Node's buffers outside V8's heap come from malloc) and
    // handing the last one's length back to the main thread.
    let script = r#"
const { Worker } = require("worker_threads");
const body = `
  const { parentPort } = require("worker_threads");
  let keep = [], total = 0;
  for (let i = 0; i < 300000; i++) {
    const b = Buffer.alloc((i * 7919) % 4000 + 1, i & 255);
    total += b.length;
    keep.push(b);
    if (keep.length > 20000) keep = keep.slice(10000);
  }
  parentPort.postMessage(total);
`;
let done = 0, sums = [];
for (let k = 0; k < 4; k++) {
  const w = new Worker(body, { eval: true });
  w.on("message", (t) => { sums.push(t); if (++done == 4) console.log(new Set(sums).size, sums[0]); });
  w.on("error", (e) => { console.error(e); process.exit(1); });
}
"#;
    // Expected total: the sum of the buffer lengths, computed here.
    let total: u64 = (0..300000u64).map(|i| (i * 7919) % 4000 + 1).sum();
    for check in [false, true] {
        let out = run(Command::new("node").args(["-e", script]), check);
        assert!(out.status.success(), "node (check={check}): {}", text(&out.stderr));
        assert_eq!(text(&out.stdout).trim(), format!("1 {total}"), "node (check={check})");
    }
}

#[test]
fn jvm_thread_pool() {
    if !have("java", "-version") || !have("javac", "-version") {
        return;
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("canopy-jvm-test");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Eight tasks on four pool threads fill and thin out hash maps; the JVM
    // itself (class loading, JIT compiler threads, GC threads) allocates
    // its native memory with malloc.
    std::fs::write(
        dir.join("Churn.java"),
        r#"
import java.util.*;
import java.util.concurrent.*;
public class Churn {
    public static void main(String[] args) throws Exception {
        ExecutorService ex = Executors.newFixedThreadPool(4);
        List<Future<Integer>> fs = new ArrayList<>();
        for (int t = 0; t < 8; t++) {
            fs.add(ex.submit(() -> {
                Map<String, int[]> m = new HashMap<>();
                for (int i = 0; i < 200000; i++) {
                    m.put("k" + i, new int[i % 64]);
                    if (i % 3 == 0) m.remove("k" + (i / 2));
                }
                return m.size();
            }));
        }
        Set<Integer> sizes = new HashSet<>();
        for (Future<Integer> f : fs) sizes.add(f.get());
        ex.shutdown();
        System.out.println(sizes.size() + " " + sizes.iterator().next());
    }
}
"#,
    )
    .unwrap();
    // javac is a Java program too: compile under Canopy.
    let out = run(Command::new("javac").arg("Churn.java").current_dir(&dir), false);
    assert!(out.status.success(), "javac: {}", text(&out.stderr));
    let mut expect = None;
    for check in [false, true] {
        let out = run(Command::new("java").args(["-Xmx256m", "-cp", "."]).arg("Churn").current_dir(&dir), check);
        assert!(out.status.success(), "java (check={check}): {}", text(&out.stderr));
        let got = text(&out.stdout).trim().to_owned();
        assert!(got.starts_with("1 "), "java (check={check}): every task must end with the same map size: {got}");
        // The same answer in both modes (and it is not 0).
        assert_ne!(got, "1 0");
        if let Some(e) = &expect {
            assert_eq!(&got, e, "java: the two modes disagree");
        }
        expect = Some(got);
    }
}

/// Deterministic text: `n` lines of pseudo-random words (xorshift), so the
/// tools below have something to compress and sort with many distinct lines.
/// (Their sizes follow `CANOPY_STRESS_SCALE` up to 4: these check real
/// programs, the stress tests elsewhere scale further.)
fn text_lines(n: usize, seed: u64) -> Vec<String> {
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..n)
        .map(|_| {
            let words = 1 + next() % 12;
            (0..words).map(|_| format!("{:x}", next() % (1 << (4 + next() % 40)))).collect::<Vec<_>>().join(" ")
        })
        .collect()
}

#[test]
fn xz_with_two_threads_round_trips() {
    if !have("xz", "--version") {
        return;
    }
    // xz -T2 hands blocks between its threads: buffers allocated by one
    // are freed by another.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("canopy-xz-test");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("in.txt");
    let data = text_lines(200_000 * scale().min(4), 0x7a).join("\n");
    std::fs::write(&src, &data).unwrap();
    for check in [false, true] {
        let packed = run(Command::new("xz").args(["-T2", "--block-size=1MiB", "-3", "-c"]).arg(&src), check);
        assert!(packed.status.success(), "xz -T2 (check={check}): {}", text(&packed.stderr));
        let xz_file = dir.join("in.txt.xz");
        std::fs::write(&xz_file, &packed.stdout).unwrap();
        let unpacked = run(Command::new("xz").args(["-T2", "-d", "-c"]).arg(&xz_file), check);
        assert!(unpacked.status.success(), "xz -T2 -d (check={check}): {}", text(&unpacked.stderr));
        assert!(unpacked.stdout == data.as_bytes(), "xz round trip (check={check}) changed the data");
    }
}

#[test]
fn parallel_sort_matches_a_sort_in_rust() {
    if !have("sort", "--version") {
        return;
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("canopy-sort-test");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("in.txt");
    let mut lines = text_lines(150_000 * scale().min(4), 0x50);
    std::fs::write(&src, lines.join("\n") + "\n").unwrap();
    lines.sort();
    let want = lines.join("\n") + "\n";
    for check in [false, true] {
        // A small buffer makes sort spill and merge; LC_ALL=C orders bytes
        // as Rust's sort does.
        let out = run(
            Command::new("sort").args(["--parallel=2", "-S", "2M", "-T"]).arg(&dir).arg(&src).env("LC_ALL", "C"),
            check,
        );
        assert!(out.status.success(), "sort (check={check}): {}", text(&out.stderr));
        assert!(out.stdout == want.as_bytes(), "sort --parallel=2 (check={check}) gave a different order");
    }
}

#[test]
fn sqlite_builds_an_index_and_aggregates() {
    if !have("sqlite3", "--version") {
        return;
    }
    let n = 100_000 * scale().min(4) as u64;
    let sql = format!(
        "create table t(k integer primary key, g integer, s text);
         with recursive c(x) as (select 1 union all select x + 1 from c where x < {n})
         insert into t select x, x % 97, printf('%08d-%x', x, x * 2654435761 % 4294967296) from c;
         create index tg on t(g, s);
         delete from t where k % 5 = 0;
         select count(*), sum(length(s)), count(distinct g) from t;
         select g, count(*) from t where g in (3, 50) group by g order by g;"
    );
    // The same figures computed here.
    let kept: Vec<u64> = (1..=n).filter(|k| k % 5 != 0).collect();
    let len = |x: u64| 9 + format!("{:x}", x * 2654435761 % 4294967296).len() as u64;
    let total: u64 = kept.iter().map(|&k| len(k)).sum();
    let in_group = |g: u64| kept.iter().filter(|&&k| k % 97 == g).count();
    let want = format!("{}|{}|97\n3|{}\n50|{}\n", kept.len(), total, in_group(3), in_group(50));
    for check in [false, true] {
        let out = run(Command::new("sqlite3").arg(":memory:").arg(&sql), check);
        assert!(out.status.success(), "sqlite3 (check={check}): {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), want, "sqlite3 (check={check})");
    }
}

/// The statics every thread touches sit alone in 128-byte blocks of the
/// built library: `FAST_KEYS` (the arena base and flight-tag key, read by
/// every `free`), the global heap and the options.  When the keys shared a
/// line with the global heap's lock, a thread freeing small blocks beside one
/// allocating large ones ran at half speed; link-time optimisation splits
/// the keys' struct into two globals unless its address escapes, so the
/// layout is checked on the library itself (`nm`, from binutils, which the C
/// programs here need anyway).
#[test]
fn hot_statics_sit_alone_in_their_cache_blocks() {
    let out = Command::new("nm")
        .args(["-C", "-S", "--defined-only"])
        .arg(lib())
        .output()
        .expect("run nm (binutils) on the library");
    assert!(out.status.success(), "nm failed: {}", String::from_utf8_lossy(&out.stderr));
    // (address, size, name) of every data symbol.
    let syms: Vec<(u64, u64, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(4, ' ');
            let (a, s, t, n) = (f.next()?, f.next()?, f.next()?, f.next()?);
            if !matches!(t, "d" | "D" | "b" | "B") {
                return None;
            }
            Some((u64::from_str_radix(a, 16).ok()?, u64::from_str_radix(s, 16).ok()?, n.to_string()))
        })
        .collect();
    for (name, exact) in [
        ("canopy_alloc::arena::FAST_KEYS", Some(128)),
        ("canopy_alloc::global::GLOBAL", None),
        ("canopy_alloc::OPTIONS", None),
    ] {
        let found: Vec<_> = syms.iter().filter(|s| s.2 == name).collect();
        assert_eq!(found.len(), 1, "{name}: expected one symbol, found {found:?} (split by LTO?)");
        let (addr, size, _) = found[0];
        if let Some(e) = exact {
            assert_eq!(*size, e, "{name}: size");
        }
        assert_eq!(addr % 128, 0, "{name} at {addr:#x}: not 128-byte aligned");
        let end = addr + size.div_ceil(128) * 128;
        let neighbours: Vec<_> = syms
            .iter()
            .filter(|s| s.2 != name && s.1 > 0 && s.0 < end && s.0 + s.1 > *addr)
            .collect();
        assert!(neighbours.is_empty(), "{name} ({addr:#x}..{end:#x}) shares its blocks with {neighbours:?}");
    }
}

/// The library exports the C allocation API and `canopy_*`, nothing else
/// (an exported `_Unwind_*` from the unwinder linked into it would take the
/// place of the program's own), and needs only libc and the dynamic loader:
/// the unwinder comes from libgcc_eh, linked in, so no process pays for
/// mapping libgcc_s (80-100 KiB of resident pages in a small program).
#[test]
fn the_library_exports_the_c_api_and_needs_only_libc() {
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(lib()).output().expect("run nm (binutils) on the library");
    assert!(out.status.success(), "nm failed: {}", text(&out.stderr));
    const C_API: &[&str] = &[
        "malloc", "free", "calloc", "realloc", "reallocarray", "posix_memalign", "aligned_alloc", "memalign", "valloc",
        "pvalloc", "malloc_usable_size", "free_sized", "free_aligned_sized", "cfree", "mallopt", "malloc_trim",
        "malloc_stats", "malloc_info", "mallinfo", "mallinfo2", "__libc_malloc", "__libc_free", "__libc_calloc",
        "__libc_realloc", "__libc_memalign", "__libc_valloc", "__libc_pvalloc",
    ];
    let exported: Vec<String> = text(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Global definitions only ("T", "D", "B", ...); "w"/"V" weak ones
            // from the C runtime's start files have no address in `-D` output.
            (f.len() == 3 && f[1].chars().all(|c| c.is_ascii_uppercase())).then(|| f[2].split('@').next().unwrap().to_string())
        })
        .collect();
    for must in ["malloc", "free", "free_sized", "canopy_alloc_class", "canopy_free_class", "canopy_free_class_unchecked", "canopy_ralloc"] {
        assert!(exported.iter().any(|s| s == must), "{must} is not exported: {exported:?}");
    }
    let stray: Vec<&String> = exported.iter().filter(|s| !s.starts_with("canopy_") && !C_API.contains(&s.as_str())).collect();
    assert!(stray.is_empty(), "the library exports symbols outside its API: {stray:?}");

    let out = Command::new("readelf").args(["-d"]).arg(lib()).output().expect("run readelf (binutils) on the library");
    assert!(out.status.success(), "readelf failed: {}", text(&out.stderr));
    let needed: Vec<String> = text(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split('[').nth(1)?.trim_end_matches(']').to_string()))
        .collect();
    assert!(needed.iter().any(|n| n.starts_with("libc.so")), "libc not among {needed:?}");
    let other: Vec<&String> = needed.iter().filter(|n| !n.starts_with("libc.so") && !n.starts_with("ld-linux")).collect();
    assert!(other.is_empty(), "the library needs more than libc: {other:?}");
}

/// A C program linked statically against `libcanopy_malloc.a` (what
/// `cargo build` also makes) gets Canopy's `malloc` and the rich interface
/// with the compiler's usual libraries, the unwinder included.
#[test]
fn c_program_linked_with_the_static_library() {
    let a = lib().with_file_name("libcanopy_malloc.a");
    if !a.exists() {
        panic!("{} missing: `cargo build --release -p canopy-malloc` makes it beside the shared library", a.display());
    }
    // -rdynamic: api.c looks the rich interface up with dlsym.
    let exe = compile_with("api", &["-rdynamic".into(), a.display().to_string(), "-lm".into()]);
    let out = Command::new(&exe).env("CANOPY_CHECK", "0").env_remove("LD_PRELOAD").output().expect("run program");
    expect_ok(&out, "api ok", "api.c linked with the static library");
}

/// An ELF section's address and size, from `readelf -SW`'s table.
fn section(sections: &str, name: &str) -> (u64, u64) {
    let line = sections
        .lines()
        .find(|l| l.split_whitespace().any(|w| w == name))
        .unwrap_or_else(|| panic!("no {name} section (was the library built with CANOPY_NO_HOT_TEXT?):\n{sections}"));
    // [Nr] Name Type Address Off Size ...
    let f: Vec<&str> = line.split(']').nth(1).unwrap().split_whitespace().collect();
    (u64::from_str_radix(f[2], 16).unwrap(), u64::from_str_radix(f[4], 16).unwrap())
}

/// Whether a function (mangled name) belongs in `.text.canopy_cold` (see
/// `hot-text.ld`): code no ordinary run executes.
fn cold_function(name: &str) -> bool {
    ["_ZN12canopy_alloc5stats", "_ZN12canopy_alloc6report", "_ZN12canopy_alloc5check", "_ZN12canopy_alloc7collect"]
        .iter()
        .any(|p| name.starts_with(p))
        || name.starts_with("_ZN12canopy_alloc7options19Reader") && name.contains("6report")
        || name.starts_with("_ZN12canopy_alloc7options12nearest_name")
        || name.starts_with("_ZN12canopy_alloc7options18report_misspelling")
        || [
            "_ZN12canopy_alloc5arena12init_growing",
            "_ZN12canopy_alloc5arena13ensure_mapped",
            "_ZN12canopy_alloc5arena9map_units",
            "_ZN12canopy_alloc6global11GlobalState9map_holes",
            "_ZN12canopy_alloc6global11GlobalState16decommit_down_to",
        ]
        .iter()
        .any(|p| name.starts_with(p))
}

/// The code every process runs sits together in `.text.canopy_hot` (see
/// `hot-text.ld`): the malloc family, the allocator's functions but the
/// cold ones, the platform and lock crates, `pthread_atfork` (from
/// libc_nonshared, called at load); with `.init` before it and the PLT
/// after it, it lies in one 64 KiB window of a code segment that starts on
/// a 64 KiB boundary.  The kernel maps code in such windows (fault-around):
/// spread over the library's code, it made every process map three of them
/// (about 190 KiB resident); in one section of 74 KiB with the PLT at the
/// end of the code, two and a half (144 KiB); now one.
#[test]
fn the_code_every_process_runs_sits_in_one_window() {
    let out = Command::new("readelf").args(["-SW"]).arg(lib()).output().expect("run readelf (binutils) on the library");
    assert!(out.status.success(), "readelf failed: {}", text(&out.stderr));
    let sections = text(&out.stdout);
    let (addr, size) = section(&sections, ".text.canopy_hot");
    let (plt, plt_size) = section(&sections, ".plt");
    let (cold, cold_size) = section(&sections, ".text.canopy_cold");
    let (init, _) = section(&sections, ".init");
    let (fini, _) = section(&sections, ".fini");
    const WINDOW: u64 = 64 << 10;
    let first = init.min(addr) / WINDOW;
    assert_eq!(first, (plt + plt_size - 1) / WINDOW, ".init at {init:#x}, .text.canopy_hot at {addr:#x} ({size} bytes) and .plt at {plt:#x}: not one 64 KiB window");
    assert_eq!((addr + size - 1) / WINDOW, first);
    assert_eq!(fini / WINDOW, first, ".fini at {fini:#x}, outside the hot window");
    let out = Command::new("readelf").args(["-lW"]).arg(lib()).output().expect("run readelf (binutils) on the library");
    let segments = text(&out.stdout);
    let code = segments
        .lines()
        .find(|l| l.trim_start().starts_with("LOAD") && l.contains("R E"))
        .unwrap_or_else(|| panic!("no code segment:\n{segments}"));
    // LOAD Offset VirtAddr PhysAddr FileSiz MemSiz Flg(2 words) Align
    let f: Vec<&str> = code.split_whitespace().collect();
    let vaddr = u64::from_str_radix(f[2].trim_start_matches("0x"), 16).unwrap();
    let align = u64::from_str_radix(f[f.len() - 1].trim_start_matches("0x"), 16).unwrap();
    assert!(align >= WINDOW && vaddr % WINDOW == 0 && vaddr / WINDOW == first, "the code segment {code:?} does not start the hot window on a 64 KiB boundary");
    let out = Command::new("nm").args(["--defined-only"]).arg(lib()).output().expect("run nm (binutils) on the library");
    assert!(out.status.success(), "nm failed: {}", text(&out.stderr));
    let mut outside = Vec::new();
    let (mut inside, mut cold_inside) = (0, 0);
    for l in text(&out.stdout).lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() != 3 || !matches!(f[1], "t" | "T") {
            continue;
        }
        let a = u64::from_str_radix(f[0], 16).unwrap();
        if cold_function(f[2]) {
            if (cold..cold + cold_size).contains(&a) {
                cold_inside += 1;
            } else {
                outside.push(format!("{} (cold)", f[2]));
            }
            continue;
        }
        let hot = ["malloc", "free", "calloc", "realloc", "pthread_atfork"].contains(&f[2])
            || ["_ZN12canopy_alloc", "_ZN10canopy_sys", "_ZN11canopy_sync"].iter().any(|p| f[2].starts_with(p));
        if hot {
            if (addr..addr + size).contains(&a) {
                inside += 1;
            } else {
                outside.push(f[2].to_string());
            }
        }
    }
    assert!(inside > 20, "only {inside} of the hot functions found");
    // The read-only data every process reads (the allocator's tables, the
    // strings read at start) sits with what the loader reads, in a first
    // segment that ends before the code; the rest of the read-only data
    // (.rodata, the unwinder's tables) in a segment after the code.
    let (hot_ro, hot_ro_size) = section(&sections, ".rodata.canopy_hot");
    let loads: Vec<(u64, u64, String)> = segments
        .lines()
        .filter(|l| l.trim_start().starts_with("LOAD"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let hex = |x: &str| u64::from_str_radix(x.trim_start_matches("0x"), 16).unwrap();
            (hex(f[2]), hex(f[5]), f[6..f.len() - 1].join(" "))
        })
        .collect();
    let (seg0, seg0_size, flags0) = &loads[0];
    assert_eq!(flags0, "R", "the first segment is not read-only data: {loads:?}");
    assert!(*seg0 <= hot_ro && hot_ro + hot_ro_size <= seg0 + seg0_size, ".rodata.canopy_hot at {hot_ro:#x} is not in the first segment {loads:?}");
    assert!(hot_ro_size > 0x100, ".rodata.canopy_hot holds only {hot_ro_size} bytes: the allocator's tables are elsewhere");
    for cold_ro in [".rodata", ".eh_frame", ".eh_frame_hdr", ".gcc_except_table"] {
        let (a, _) = section(&sections, cold_ro);
        assert!(a > plt, "{cold_ro} at {a:#x} lies before the code ({plt:#x}): it shares the loader's pages");
    }
    assert!(cold_inside > 3, "only {cold_inside} of the cold functions found");
    assert!(outside.is_empty(), "functions outside their section: {outside:?}");
}

/// What that layout gives a real program: `cat` under `LD_PRELOAD`, reading
/// its own `smaps`, has one 64 KiB window of the library's code resident
/// (the kernel's default fault-around), where it had 204 KiB.  The bound
/// allows 128 KiB: where the file sits in the page cache in larger folios
/// (a copy made with `cp`, here), a fault maps a whole folio.
#[test]
fn a_program_has_one_window_of_the_librarys_code_resident() {
    let out = Command::new("cat").arg("/proc/self/smaps").env("LD_PRELOAD", lib()).output().expect("run cat");
    assert!(out.status.success(), "cat failed: {}", text(&out.stderr));
    let smaps = text(&out.stdout);
    let mut lines = smaps.lines();
    let mut rss = None;
    while let Some(l) = lines.next() {
        if l.contains("libcanopy_malloc.so") && l.split_whitespace().nth(1) == Some("r-xp") {
            let r = lines.find(|l| l.starts_with("Rss:")).expect("an Rss line");
            rss = r.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok());
            break;
        }
    }
    let rss = rss.unwrap_or_else(|| panic!("no code mapping of the library in cat's smaps:\n{smaps}"));
    assert!(rss <= 128, "{rss} KiB of the library's code resident in cat: more than one 64 KiB window (or 128 KiB folio)");
    // The library's other mappings: the few pages of the first segment,
    // none of the read-only data after the code, the relocated data (12
    // KiB) and the writable data (16 KiB).  Before the first segment held
    // only the loader's pages and the hot tables, it had 64 KiB resident,
    // and the relocated data 20 KiB (a second image of the empty heap).
    let mut other = 0;
    let mut lines = smaps.lines();
    while let Some(l) = lines.next() {
        if l.contains("libcanopy_malloc.so") && l.split_whitespace().nth(1) != Some("r-xp") {
            let r = lines.find(|l| l.starts_with("Rss:")).expect("an Rss line");
            other += r.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    let out = Command::new("readelf").args(["-lW"]).arg(lib()).output().expect("run readelf (binutils) on the library");
    let first = text(&out.stdout)
        .lines()
        .find(|l| l.trim_start().starts_with("LOAD"))
        .map(|l| u64::from_str_radix(l.split_whitespace().nth(5).unwrap().trim_start_matches("0x"), 16).unwrap())
        .expect("a LOAD segment");
    // With packed relocations (a build against glibc 2.36 or later) the
    // first segment is under 16 KiB; without, `.rela.dyn` alone takes 42.
    let out = Command::new("readelf").args(["-SW"]).arg(lib()).output().expect("run readelf (binutils) on the library");
    let first = if text(&out.stdout).contains(".relr.dyn") { first.min(16 << 10) } else { first };
    let bound = first.div_ceil(4096) * 4 + 32;
    assert!(other <= bound, "{other} KiB of the library's data resident in cat: more than its first segment ({first} bytes), relocated and writable data ({bound} KiB)");
}
