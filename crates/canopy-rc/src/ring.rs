//! A bounded single-producer single-consumer ring of words: the wire between
//! one sending thread and one counting thread (a batch travels as the address
//! of its box, and comes back the same way to be reused).
//!
//! Invariant: `0 <= tail - head <= cap`, where only the producer writes
//! `tail` and only the consumer writes `head`; slot `i % cap` holds an item
//! exactly when `head <= i < tail`.

use canopy_sync::CachePadded;

use crate::prim::{AtomicUsize, Ordering};

/// The ring.  `push` may only be called by one thread at a time (the
/// producer), `pop` by one thread at a time (the consumer).
#[derive(Debug)]
pub(crate) struct Ring {
    slots: Box<[AtomicUsize]>,
    mask: usize,
    /// Next slot to read; written by the consumer only.
    head: CachePadded<AtomicUsize>,
    /// Next slot to write; written by the producer only.
    tail: CachePadded<AtomicUsize>,
}

impl Ring {
    /// A ring of `cap` slots (rounded up to a power of two, at least 1).
    pub(crate) fn new(cap: usize) -> Self {
        let cap = cap.max(1).next_power_of_two();
        Ring {
            slots: (0..cap).map(|_| AtomicUsize::new(0)).collect(),
            mask: cap - 1,
            head: CachePadded::new(AtomicUsize::new(0)),
            tail: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    /// Producer: append `v`; false when the ring is full.
    pub(crate) fn push(&self, v: usize) -> bool {
        let t = self.tail.load(Ordering::Relaxed);
        // Acquire: pairs with the Release store of `head` in `pop`, so the
        // consumer's read of the slot happens before we overwrite it.
        let h = self.head.load(Ordering::Acquire);
        if t.wrapping_sub(h) > self.mask {
            return false;
        }
        self.slots[t & self.mask].store(v, Ordering::Relaxed);
        // Release: publishes the slot (and everything the item points to) to
        // the Acquire load of `tail` in `pop`.
        self.tail.store(t.wrapping_add(1), Ordering::Release);
        true
    }

    /// Consumer: take the oldest item.
    pub(crate) fn pop(&self) -> Option<usize> {
        let h = self.head.load(Ordering::Relaxed);
        // Acquire: pairs with the Release store of `tail` in `push`.
        let t = self.tail.load(Ordering::Acquire);
        if h == t {
            return None;
        }
        let v = self.slots[h & self.mask].load(Ordering::Relaxed);
        // Release: pairs with the Acquire load of `head` in `push`.
        self.head.store(h.wrapping_add(1), Ordering::Release);
        Some(v)
    }

    /// Whether the ring looks empty (exact when called by the consumer with
    /// the producer quiescent).
    pub(crate) fn is_empty(&self) -> bool {
        self.head.load(Ordering::Acquire) == self.tail.load(Ordering::Acquire)
    }
}

#[cfg(all(test, not(canopy_loom)))]
mod tests {
    use super::Ring;

    #[test]
    fn fifo_and_bounded() {
        let r = Ring::new(3);
        assert!(r.push(1) && r.push(2) && r.push(3) && r.push(4));
        assert!(!r.push(5), "a ring of 4 slots holds 4 items");
        assert_eq!(r.pop(), Some(1));
        assert!(r.push(5));
        assert_eq!((r.pop(), r.pop(), r.pop(), r.pop(), r.pop()), (Some(2), Some(3), Some(4), Some(5), None));
        assert!(r.is_empty());
    }

    #[test]
    fn two_threads_keep_order() {
        let r = std::sync::Arc::new(Ring::new(8));
        let p = r.clone();
        let h = std::thread::spawn(move || {
            for i in 1..=100_000usize {
                while !p.push(i) {
                    std::hint::spin_loop();
                }
            }
        });
        let mut next = 1;
        while next <= 100_000 {
            if let Some(v) = r.pop() {
                assert_eq!(v, next);
                next += 1;
            }
        }
        h.join().unwrap();
    }
}
