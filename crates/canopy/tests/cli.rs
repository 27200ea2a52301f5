//! The `canopy` tool end to end, on glibc only (no cargo build, no anchors
//! needed): help text, one tiny `sac` and `workloads` run writing results.
//! Nothing here looks at elapsed time.

use std::path::PathBuf;
use std::process::Command;

fn canopy() -> Command {
    Command::new(env!("CARGO_BIN_EXE_canopy"))
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("canopy-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn help_explains_the_experiments_and_the_paper() {
    let out = canopy().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "sac-callgrind",
        "workloads",
        "in-process",
        "Grelck & Scholz",
        "SAC private heap manager",
        "--quick",
        "--paper",
    ] {
        assert!(text.contains(needle), "--help lacks {needle:?}:\n{text}");
    }
    let out = canopy().args(["bench", "sac", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("--threads") && text.contains("--runs") && text.contains("--x"));
}

#[test]
fn sac_on_glibc_writes_json_markdown_svg_and_index() {
    let dir = scratch("sac");
    let out = canopy()
        .args(["--no-install", "--results-dir"])
        .arg(&dir)
        .args([
            "bench",
            "sac",
            "--quick",
            "--x",
            "25",
            "--threads",
            "1,2",
            "--runs",
            "1",
        ])
        .args([
            "--n",
            "20000",
            "--iters",
            "2",
            "--contenders",
            "glibc",
            "--no-rust",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("| glibc"), "{stdout}");
    for f in ["sac.json", "sac.md", "sac.svg", "README.md"] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    let json = std::fs::read_to_string(dir.join("sac.json")).unwrap();
    assert!(json.contains("\"experiment\": \"sac\"") && json.contains("\"failures\": []"));
    let index = std::fs::read_to_string(dir.join("README.md")).unwrap();
    assert!(index.contains("[table](sac.md)"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn workloads_on_glibc() {
    let dir = scratch("workloads");
    let out = canopy()
        .args(["--no-install", "--results-dir"])
        .arg(&dir)
        .args([
            "bench",
            "workloads",
            "--quick",
            "--only",
            "larson,cache-thrash",
            "--runs",
            "1",
            "--contenders",
            "glibc",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md = std::fs::read_to_string(dir.join("workloads.md")).unwrap();
    assert!(md.contains("larson") && md.contains("geomean"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn in_process_on_glibc_writes_its_tables() {
    let dir = scratch("in-process");
    let out = canopy()
        .args(["--no-install", "--results-dir"])
        .arg(&dir)
        .args(["bench", "in-process", "--quick", "--only", "same,larson", "--bursts", "2", "--contenders", "glibc"])
        .output()
        .unwrap();
    assert!(out.status.success(), "stderr:\n{}", String::from_utf8_lossy(&out.stderr));
    let md = std::fs::read_to_string(dir.join("in-process.md")).unwrap();
    assert!(md.contains("| same") && md.contains("| larson") && md.contains("geomean"), "{md}");
    assert!(!md.contains("Failures"), "{md}");
    let json = std::fs::read_to_string(dir.join("in-process.json")).unwrap();
    assert!(json.contains("\"median_ns\""), "the raw per-library fields are kept");
    let out = canopy()
        .args(["--no-install", "--results-dir"])
        .arg(&dir)
        .args(["bench", "in-process", "--quick", "--only", "nope", "--contenders", "glibc"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown loop \"nope\""));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_contender_is_an_error() {
    let dir = scratch("bad");
    let out = canopy()
        .args(["--no-install", "--results-dir"])
        .arg(&dir)
        .args(["bench", "workloads", "--quick", "--contenders", "hoard"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown contender"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn region_speed_runs_every_contender_in_child_processes() {
    let dir = scratch("region-speed");
    let out = canopy()
        .args(["--no-install", "--results-dir"])
        .arg(&dir)
        .args(["bench", "region-speed", "--quick", "--n", "300", "--max-n", "1000", "--runs", "1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "stderr:\n{}", String::from_utf8_lossy(&out.stderr));
    let md = std::fs::read_to_string(dir.join("region-speed.md")).unwrap();
    assert!(md.contains("one child process per repetition and contender"), "{md}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("region-speed.json")).unwrap()).unwrap();
    assert_eq!(json["params"]["isolation"], "children");
    assert!(json["failures"].as_array().unwrap().is_empty(), "{}", json["failures"]);
    // Every contender measured every size it fits: 3 fixed sizes and the
    // mixed one at 300 objects for 6 contenders, the fixed ones for 2.
    let rounds = json["summary"]["rounds"].as_array().unwrap();
    let at_300 = rounds.iter().filter(|r| r["n"] == 300).count();
    assert!(at_300 >= 6 * 4 + 2 * 3, "{at_300} rounds at 300 objects");
    // Instruction counts: one per contender and size when they were taken
    // (the loop's own work is a dozen instructions at least), else the
    // reason, which can only be that valgrind is missing here.
    let ir = &json["summary"]["instructions"];
    if ir["skipped"].is_null() {
        let cells = ir["cells"].as_array().unwrap();
        assert_eq!(cells.len(), 6 * 4 + 2 * 3, "{ir}");
        assert!(cells.iter().all(|c| c["per_object"].as_f64().unwrap() > 10.0), "{ir}");
        assert!(md.contains("## Instructions per allocation (callgrind"), "{md}");
    } else {
        assert!(ir["skipped"].as_str().unwrap().contains("valgrind"), "{ir}");
    }
    // The child refuses what does not exist, naming it.
    let out = canopy()
        .args(["bench", "region-speed-child", "--contender", "hoard", "--config", "0", "--n", "300", "--max-n", "1000", "--seed", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown contender `hoard`"));
    let _ = std::fs::remove_dir_all(&dir);
}
