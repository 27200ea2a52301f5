//! Panics inside with-loop expressions (own test binary: no other test's
//! with-loop may flush the rayon workers meanwhile).
#![cfg(not(canopy_loom))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use canopy_rc::{delegated, Array, Atomic, Delegated, Gen};

struct Tracked(Arc<AtomicUsize>);
impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The tests run one at a time: another test's with-loop would flush the
/// workers and hide a missing flush.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn wait_for(freed: &AtomicUsize) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        delegated::flush();
        if freed.load(Ordering::SeqCst) == 1 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// A parallel `modarray` whose expression clones a delegated array on the
/// workers and panics part-way: the workers' last clones are pending
/// increments; the with-loop must still ship them (as it does when it ends
/// normally), or the array outlives every reference for as long as the
/// workers do no other count operation.
#[test]
fn parallel_with_loop_panic_ships_workers_counts() {
    let _s = serial();
    let freed = Arc::new(AtomicUsize::new(0));
    let b: Array<Tracked, Delegated> = Array::from_fn(&[1], |_| Tracked(freed.clone()));
    let n = 1 << 15;
    let a: Array<Option<Array<Tracked, Delegated>>, Atomic> = Array::from_fn(&[n], |_| None);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        a.modarray(&[Gen::new(&[0], &[n], |iv| {
            if iv[0] == n - 3 {
                panic!("expression fails");
            }
            Some(b.clone())
        })
        .grain(64)])
    }));
    assert!(r.is_err(), "the expression's panic propagates");
    drop(b);
    assert!(
        wait_for(&freed),
        "array not freed after its last reference went (workers' increments left pending)"
    );
}

/// `modarray` of a shared array copies it in parallel (the workers clone the
/// elements); with a generator too small to run in parallel, nothing else
/// ships the workers' count operations afterwards.  Elements that are
/// delegated arrays must still be freed after their last reference.
#[test]
fn parallel_copy_in_modarray_ships_workers_counts() {
    let _s = serial();
    let freed = Arc::new(AtomicUsize::new(0));
    let b: Array<Tracked, Delegated> = Array::from_fn(&[1], |_| Tracked(freed.clone()));
    let n = 1 << 15;
    let a: Array<Array<Tracked, Delegated>, Atomic> = Array::from_fn(&[n], |_| b.clone());
    delegated::flush();
    let keep = a.clone(); // shared: modarray copies
    let m = a.modarray(&[Gen::update(
        &[0],
        &[1],
        |_, x: &Array<Tracked, Delegated>| x.clone(),
    )]);
    drop((m, keep, b));
    assert!(
        wait_for(&freed),
        "array not freed after its last reference went (workers' increments left pending)"
    );
}

/// An element whose drop panics once it is armed, counting every drop.
struct Fragile {
    armed: bool,
    drops: Arc<AtomicUsize>,
}
impl Clone for Fragile {
    fn clone(&self) -> Self {
        Fragile { armed: self.armed, drops: self.drops.clone() }
    }
}
impl Drop for Fragile {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
        if self.armed {
            panic!("element drop fails");
        }
    }
}

/// A `modarray` in which dropping a replaced element panics: the new value
/// is already in place (as with `*e = v`), so the array never holds a
/// dropped element, and dropping the array afterwards drops each of its
/// elements once (a drop before the write would drop that element twice).
#[test]
fn modarray_replaced_element_drop_panic_drops_nothing_twice() {
    let _s = serial();
    let drops = Arc::new(AtomicUsize::new(0));
    let n = 8;
    let a: Array<Fragile, Atomic> = Array::from_fn(&[n], |i| Fragile { armed: i == 3, drops: drops.clone() });
    // On the caller's thread (short vector), so the panic stops the loop
    // at element 3 and `a` is dropped while the panic unwinds.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        a.modarray(&[Gen::new(&[0], &[n], |_| Fragile { armed: false, drops: drops.clone() })])
    }));
    assert!(r.is_err(), "the element's panicking drop propagates");
    // Elements 0..=3 were replaced (their old values dropped: 4), then the
    // array went with the unwind: its 8 elements, each dropped once.
    assert_eq!(drops.load(Ordering::SeqCst), 4 + n);
}
