//! Loom model of the fork link (`src/forklink.rs`): the first child's
//! collection of the parent's heap and the second child's run never overlap,
//! and the second child sees everything the collection wrote.
//! Run by `scripts/loom.sh` (`RUSTFLAGS="--cfg canopy_loom"`).
#![cfg(canopy_loom)]

mod sync {
    pub use loom::sync::atomic::{AtomicU8, Ordering};
    pub fn spin() {
        loom::thread::yield_now();
    }
}

#[path = "../src/forklink.rs"]
#[allow(dead_code)]
mod forklink;

use forklink::ForkLink;
use loom::cell::UnsafeCell;
use loom::sync::Arc;

/// The parent's heap, as a plain (non-atomic) cell: loom reports any access
/// by the two children that is not ordered by the link.
struct Parent {
    link: ForkLink,
    heap: UnsafeCell<u64>,
}

// SAFETY (model): the link orders every access to `heap`; loom checks it.
unsafe impl Sync for Parent {}

#[test]
fn collection_and_second_child_never_overlap() {
    loom::model(|| {
        let p = Arc::new(Parent { link: ForkLink::new(), heap: UnsafeCell::new(1) });
        let q = p.clone();
        // The first child: try twice to collect the parent (move its objects).
        let a = loom::thread::spawn(move || {
            let mut collected = 0;
            for _ in 0..2 {
                if q.link.try_collect() {
                    q.heap.with_mut(|h| unsafe { *h += 10 });
                    q.link.end_collect();
                    collected += 1;
                }
            }
            collected
        });
        // The second child: starts, then reads the parent's heap twice; it
        // must see the same value both times (no collection after its start).
        p.link.start_second();
        let first = p.heap.with(|h| unsafe { *h });
        let second = p.heap.with(|h| unsafe { *h });
        assert_eq!(first, second);
        let collected = a.join().unwrap();
        // Every collection the first child made happened before the second
        // child started: none after.
        assert_eq!(first, 1 + 10 * collected);
    });
}
