//! The C benchmark programs at a tiny size: every mode of `sac` prints the
//! checksum of the formula, and every workload prints the same checksum on
//! every contender present.  Canopy is included when `libcanopy_malloc.so` is
//! already built (these tests never run cargo); otherwise it is skipped with
//! a message.  Nothing here looks at elapsed time.

use std::io::Write;
use std::time::Duration;

use canopy_bench::anchors::{find_anchor, Contender, ANCHORS};
use canopy_bench::artifacts::{CProgram, Lookup, CANOPY_MALLOC};
use canopy_bench::parse::ResultLine;
use canopy_bench::runner::{run, Exit, Invocation};
use canopy_bench::sac_kernel::expected_checksum;

const TIMEOUT: Duration = Duration::from_secs(120);

/// Print past the test harness's output capture, so a skip is always visible.
fn note(msg: String) {
    let _ = writeln!(std::io::stderr(), "note: {msg}");
}

fn canopy() -> Option<Contender> {
    match CANOPY_MALLOC.locate(Lookup::FindOnly) {
        Ok(p) => Some(Contender {
            name: "canopy".into(),
            preload: Some(p[0].clone()),
            version: None,
        }),
        Err(e) => {
            note(format!("skipping the canopy contender: {e:#}"));
            None
        }
    }
}

/// glibc, Canopy if built, and the anchors that are installed.
fn contenders() -> Vec<Contender> {
    let mut v = vec![Contender::glibc()];
    v.extend(canopy());
    for a in ANCHORS {
        match find_anchor(a) {
            Some(p) => v.push(Contender {
                name: a.name.into(),
                preload: Some(p),
                version: None,
            }),
            None => note(format!(
                "skipping {}: {} not installed (package {})",
                a.name, a.lib, a.package
            )),
        }
    }
    v
}

fn run_ok(prog: &std::path::Path, args: &[String], c: &Contender) -> ResultLine {
    let inv = Invocation::new(prog.to_path_buf(), args.to_vec(), c, TIMEOUT);
    let out = run(&inv).unwrap_or_else(|e| panic!("could not run {}: {e:#}", inv.display()));
    assert!(
        out.success(),
        "{} on {}: {}\nstderr:\n{}",
        inv.display(),
        c.name,
        out.exit,
        out.stderr
    );
    ResultLine::find_in(&out.stdout)
        .unwrap_or_else(|e| panic!("{}: {e:#}\nstdout:\n{}", inv.display(), out.stdout))
}

#[test]
fn sac_modes_agree_with_the_formula() {
    let sac = CProgram::Sac.compile().expect("compile c/sac.c");
    let (n, iters) = (20_000usize, 3usize);
    let mut cs = vec![Contender::glibc()];
    cs.extend(canopy());
    for c in &cs {
        let mut modes = vec!["malloc", "bound"];
        if c.is_canopy() {
            modes.push("rich");
        }
        for x in [1000usize, 250, 100, 25, 7] {
            let expected = expected_checksum(x as u64, n as u64, iters as u64);
            for threads in [1usize, 2, 3] {
                for mode in &modes {
                    let args: Vec<String> = vec![
                        mode.to_string(),
                        x.to_string(),
                        n.to_string(),
                        iters.to_string(),
                        threads.to_string(),
                    ];
                    let line = run_ok(&sac, &args, c);
                    assert_eq!(
                        line.checksum().unwrap(),
                        expected,
                        "sac {} on {}",
                        args.join(" "),
                        c.name
                    );
                    assert_eq!(
                        line.require::<u64>("pairs").unwrap(),
                        ((n / x) * iters) as u64
                    );
                    assert!(line.require::<i64>("peak_kib").unwrap() > 0);
                    line.seconds().unwrap();
                }
            }
        }
    }
}

#[test]
fn sac_rich_mode_without_canopy_fails_clearly() {
    let sac = CProgram::Sac.compile().expect("compile c/sac.c");
    let inv = Invocation::new(
        sac,
        ["rich", "25", "1000", "1", "1"].map(String::from).to_vec(),
        &Contender::glibc(),
        TIMEOUT,
    );
    let out = run(&inv).unwrap();
    assert_eq!(out.exit, Exit::Code { code: 2 });
    assert!(
        out.stderr.contains("LD_PRELOAD=libcanopy_malloc.so"),
        "{}",
        out.stderr
    );
}

#[test]
fn workloads_give_the_same_checksum_on_every_contender() {
    let prog = CProgram::Workloads
        .compile()
        .expect("compile c/workloads.c");
    let cs = contenders();
    for w in canopy_bench::experiments::workloads::WORKLOADS {
        let args: Vec<String> = vec![w.name.into(), "2".into(), "1".into()];
        let reference = run_ok(&prog, &args, &cs[0]).checksum().unwrap();
        for c in &cs[1..] {
            let got = run_ok(&prog, &args, c).checksum().unwrap();
            assert_eq!(got, reference, "workload {} on {} vs glibc", w.name, c.name);
        }
    }
}

#[test]
fn workloads_are_deterministic() {
    // The same workload twice gives the same checksum (no timing dependence).
    let prog = CProgram::Workloads
        .compile()
        .expect("compile c/workloads.c");
    for name in ["larson", "prodcons", "churn", "mixed", "phases"] {
        let args: Vec<String> = vec![name.into(), "3".into(), "1".into()];
        let a = run_ok(&prog, &args, &Contender::glibc())
            .checksum()
            .unwrap();
        let b = run_ok(&prog, &args, &Contender::glibc())
            .checksum()
            .unwrap();
        assert_eq!(a, b, "{name}");
    }
}

#[test]
fn unknown_workload_is_an_error() {
    let prog = CProgram::Workloads
        .compile()
        .expect("compile c/workloads.c");
    let inv = Invocation::new(
        prog,
        ["nope", "1", "1"].map(String::from).to_vec(),
        &Contender::glibc(),
        TIMEOUT,
    );
    let out = run(&inv).unwrap();
    assert!(!out.success());
    assert!(out.stderr.contains("unknown workload"));
}

/// Run `c/inprocess.c` with every contender loaded at once and parse its
/// per-library lines.
fn inprocess_lines(loop_name: &str, cs: &[Contender]) -> Vec<ResultLine> {
    use canopy_bench::experiments::in_process::{lib_arg_of, tunables};
    let prog = CProgram::InProcess.compile().expect("compile c/inprocess.c");
    let mut args: Vec<String> = vec![loop_name.into(), "2".into(), "1".into()];
    args.extend(cs.iter().map(lib_arg_of));
    let mut inv = Invocation::new(prog, args, &Contender::glibc(), TIMEOUT);
    inv.env.push(("GLIBC_TUNABLES".into(), tunables(None)));
    let out = run(&inv).unwrap_or_else(|e| panic!("could not run {}: {e:#}", inv.display()));
    assert!(out.success(), "{} failed: {}\n{}", inv.display(), out.exit, out.stderr);
    out.stdout
        .lines()
        .filter(|l| l.starts_with("lib="))
        .map(|l| ResultLine::parse(l).unwrap())
        .collect()
}

#[test]
fn inprocess_loops_do_the_same_work_on_every_contender() {
    let cs = contenders();
    for l in canopy_bench::experiments::in_process::LOOPS {
        let lines = inprocess_lines(l.name, &cs);
        assert_eq!(lines.len(), cs.len(), "one line per library in loop {}", l.name);
        let reference = &lines[0].fields["checksum"];
        for (line, c) in lines.iter().zip(&cs) {
            assert_eq!(&line.fields["checksum"], reference, "loop {} on {} vs glibc", l.name, c.name);
            let ns: f64 = line.fields["median_ns"].parse().unwrap();
            assert!(ns > 0.0 && ns.is_finite(), "loop {} on {}: {ns}", l.name, c.name);
        }
    }
}

#[test]
fn inprocess_sac_on_the_bound_does_the_same_work() {
    use canopy_bench::experiments::in_process::tunables;
    let prog = CProgram::InProcess.compile().expect("compile c/inprocess.c");
    for l in ["sac", "sac2"] {
        let args: Vec<String> = [l, "2", "1", "glibc", "bound"].map(String::from).to_vec();
        let mut inv = Invocation::new(prog.clone(), args, &Contender::glibc(), TIMEOUT);
        inv.env.push(("GLIBC_TUNABLES".into(), tunables(None)));
        let out = run(&inv).unwrap();
        assert!(out.success(), "{}: {}", inv.display(), out.stderr);
        let lines: Vec<ResultLine> =
            out.stdout.lines().filter(|x| x.starts_with("lib=")).map(|x| ResultLine::parse(x).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1].fields["name"], "bound");
        assert_eq!(lines[0].fields["checksum"], lines[1].fields["checksum"], "{l}: glibc and the bound");
    }
}

#[test]
fn inprocess_rejects_an_unknown_loop_and_a_missing_library() {
    let prog = CProgram::InProcess.compile().expect("compile c/inprocess.c");
    for (args, says) in [
        (["nope", "2", "1", "glibc"], "unknown loop"),
        (["same", "2", "1", "/nonexistent/libnothing.so"], "cannot load"),
        (["same", "0", "1", "glibc"], "BURSTS must be"),
        (["four", "2", "1", "bound"], "for the loops sac and sac2 only"),
    ] {
        let inv = Invocation::new(prog.clone(), args.map(String::from).to_vec(), &Contender::glibc(), TIMEOUT);
        let out = run(&inv).unwrap();
        assert_eq!(out.exit, Exit::Code { code: 2 }, "{}", inv.display());
        assert!(out.stderr.contains(says), "{}: {}", inv.display(), out.stderr);
    }
}
