//! The hand-off that lets a task collect its ancestors' heaps.
//!
//! A fork runs its first child `A` on the forking thread and offers the second,
//! `B`, to thieves. While `B` has not started, `A` is the only task that can
//! reach the parent's heap, so `A` may collect it too (MPL's leaf collector
//! takes the levels of the heap tree its processor alone owns). rayon does not
//! say whether `B` may still be stolen, so the fork carries a link with one
//! state word:
//!
//! * `IDLE`: `B` has not started and nobody collects the parent.
//! * `STARTED`: `B` runs (or ran); the parent is shared from now on.
//! * `COLLECTING`: `A` collects the parent's heap; `B` waits to start.
//!
//! `B` moves `IDLE -> STARTED` before it touches anything; `A` moves `IDLE ->
//! COLLECTING` and back to `IDLE` when done. The two compare-and-swaps make the
//! collection and `B`'s whole run mutually exclusive, and the release store
//! that ends a collection happens-before `B`'s acquire, so `B` sees the moved
//! objects and the updated handle slots. The model test is `tests/loom.rs`.

use super::sync::{spin, AtomicU8, Ordering};

const IDLE: u8 = 0;
const STARTED: u8 = 1;
const COLLECTING: u8 = 2;

/// The state word of one fork (see the module notes).
pub(crate) struct ForkLink {
    state: AtomicU8,
}

impl ForkLink {
    pub(crate) fn new() -> ForkLink {
        ForkLink { state: AtomicU8::new(IDLE) }
    }

    /// The second child is about to start: wait out a collection of the
    /// parent by the first child, then mark the parent shared.
    pub(crate) fn start_second(&self) {
        loop {
            match self.state.compare_exchange(IDLE, STARTED, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return,
                Err(STARTED) => return, // started already (not expected; harmless)
                Err(_) => spin(),
            }
        }
    }

    /// The first child wants to collect the parent's heap: true if the second
    /// child has not started; it will not start until `end_collect`.
    pub(crate) fn try_collect(&self) -> bool {
        self.state.compare_exchange(IDLE, COLLECTING, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// End a collection begun by a successful `try_collect`.
    pub(crate) fn end_collect(&self) {
        debug_assert_eq!(self.state.load(Ordering::Relaxed), COLLECTING);
        self.state.store(IDLE, Ordering::Release);
    }
}
