//! A panicking element `Drop` run by a counting thread (own test binary:
//! before the fix it killed the process's only counting thread).
#![cfg(not(canopy_loom))]

use std::sync::mpsc;
use std::time::Duration;

use canopy_rc::{delegated, Array, Delegated};

struct PanicsOnDrop;
impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("element drop fails");
    }
}

/// The counting thread frees an array whose element's `Drop` panics: the
/// counting thread must survive it (it held the drain lock while freeing,
/// so every later `getrc` spun for ever and every full lane blocked).
#[test]
fn counting_thread_survives_a_panicking_element_drop() {
    let a: Array<PanicsOnDrop, Delegated> = Array::from_fn(&[1], |_| PanicsOnDrop);
    drop(a);
    delegated::flush();
    std::thread::sleep(Duration::from_millis(200));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let b: Array<u8, Delegated> = Array::filled(&[4], 1);
        let c = b.clone();
        let n = c.getrc();
        drop(c);
        tx.send((n, b.getrc())).unwrap();
    });
    let r = rx.recv_timeout(Duration::from_secs(5));
    assert_eq!(
        r,
        Ok((2, 1)),
        "getrc did not answer after the counting thread's release panicked"
    );
}
