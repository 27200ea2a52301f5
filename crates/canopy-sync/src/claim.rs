//! One-winner claims on an object that racing threads may each try to give
//! up: the allocator's large chunks, which have no owner to ask when two
//! frees of one chunk (a program's double free from two threads) meet.
//!
//! The object has a *claim word* that holds a value of its own, `live`,
//! exactly while the object is live and no thread holds it: no other object
//! that may share the word's place ever stores `live` there.
//!
//! - Whoever makes the object live (first, or again after holding it)
//!   writes the object's fields, then [`publish`]es `live` (release).
//! - A thread that would give the object up [`claim`]s it: `live` to a
//!   `claimed` value, acquire.  Of racing claims exactly one succeeds; a
//!   claim of an object that is not live (held, gone, its memory reused for
//!   something else) fails without writing anything, so it cannot disturb
//!   whatever owns the word now.  The winner sees the fields written before
//!   the `publish` it took the word from.
//! - The holder keeps the object (a cache: the word stays `claimed`) and
//!   later publishes it again, or ends it and writes the word as the
//!   object's memory is reused (any value but `live`).
//!
//! `tests/loom.rs` models two racing claims with a third thread that reuses
//! the memory, and a claim of an object cached and published again.

use crate::prim::{AtomicUsize, Ordering};

/// Claim the object: its word from `live` to `claimed`.  True if this
/// thread now holds it; false, writing nothing, if it was not live.
#[inline]
pub fn claim(word: &AtomicUsize, live: usize, claimed: usize) -> bool {
    debug_assert_ne!(live, claimed);
    word.compare_exchange(live, claimed, Ordering::Acquire, Ordering::Relaxed).is_ok()
}

/// Make the object live, after its fields are written: a claim that takes
/// the word from here sees them.
#[inline]
pub fn publish(word: &AtomicUsize, live: usize) {
    word.store(live, Ordering::Release);
}
