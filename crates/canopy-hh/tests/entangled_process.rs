//! An entangling program, run as its own process, is stopped with a message
//! naming both tasks and the object, and a non-zero exit status: never a
//! crash, a hang or a silent result. (The child is this test binary, re-run
//! with `CANOPY_HH_ENTANGLE_CHILD=1` on the `child` test.)

#![cfg(not(canopy_loom))]

use canopy_hh::{run, Val};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

#[test]
fn child() {
    if std::env::var_os("CANOPY_HH_ENTANGLE_CHILD").is_none() {
        return;
    }
    run(|s| {
        let shared = s.new_ref(Val::Int(0));
        let published = AtomicBool::new(false);
        s.par(
            |s| {
                let mine = s.array(3, Val::Int(7));
                s.set(shared, 0, Val::Obj(mine));
                published.store(true, Ordering::Release);
            },
            |s| {
                while !published.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                let v = s.get(shared, 0);
                // Never reached: the read above stops the program.
                println!("UNREACHABLE read {v:?}");
            },
        );
    });
}

#[test]
fn an_entangling_program_stops_with_a_clear_message() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env("CANOPY_HH_ENTANGLE_CHILD", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the entangled program exited successfully:\n{stdout}\n{stderr}");
    assert!(!stdout.contains("UNREACHABLE"), "{stdout}");
    assert!(stderr.contains("entanglement detected"), "{stderr}");
    assert!(stderr.contains("root/L") && stderr.contains("root/R"), "{stderr}");
    assert!(stderr.contains("from mutable object"), "{stderr}");
}
