//! A bounded single-producer single-consumer ring of words: the lane from
//! one sending thread to one counting thread.
//!
//! The producer writes words at its private `end` and makes them visible by
//! publishing `tail = end` (a Release store, a plain store on x86); so a
//! word can be written without being published yet (decrements wait for the
//! next publication, increments publish at once).
//!
//! Invariant: `head <= tail <= end <= head + cap`; only the producer writes
//! `tail` (and `end`, which only it reads), only the consumer writes `head`;
//! slots `head..tail` hold published words.

use canopy_sync::CachePadded;

use crate::prim::{AtomicUsize, Cell, Ordering};

/// The ring.  Producer methods (`write`, `publish`, `free_slots`) are called
/// by one thread at a time; consumer methods (`tail`, `read`, `set_head`) by
/// one thread at a time.
#[derive(Debug)]
pub(crate) struct Ring {
    slots: Box<[AtomicUsize]>,
    mask: usize,
    /// Next word to consume; written by the consumer.
    head: CachePadded<AtomicUsize>,
    /// End of the published words; written by the producer.
    tail: CachePadded<AtomicUsize>,
    /// Producer-private: end of the written words, and the last head seen
    /// (on their own cache line: the producer writes `end` on every word,
    /// the consumer reads `slots` and `mask` on every word).
    prod: CachePadded<Prod>,
}

#[derive(Debug)]
struct Prod {
    end: Cell<usize>,
    head_seen: Cell<usize>,
}

// SAFETY: `end` and `head_seen` are touched by the producer only (contract
// of the producer methods); the rest is atomics.
unsafe impl Sync for Ring {}
// SAFETY: as above.
unsafe impl Send for Ring {}

impl Ring {
    /// A ring of `cap` words (rounded up to a power of two, at least 2).
    pub(crate) fn new(cap: usize) -> Self {
        let cap = cap.max(2).next_power_of_two();
        Ring {
            slots: (0..cap).map(|_| AtomicUsize::new(0)).collect(),
            mask: cap - 1,
            head: CachePadded::new(AtomicUsize::new(0)),
            tail: CachePadded::new(AtomicUsize::new(0)),
            prod: CachePadded::new(Prod {
                end: Cell::new(0),
                head_seen: Cell::new(0),
            }),
        }
    }

    /// Producer: room for `n` more words?  Reloads the consumer's head only
    /// when the cached one says no.
    #[inline(always)]
    pub(crate) fn has_room(&self, n: usize) -> bool {
        // SAFETY (cells): producer only.
        let end = self.prod.end.with(|e| unsafe { *e });
        if end.wrapping_sub(self.prod.head_seen.with(|h| unsafe { *h })) + n <= self.mask + 1 {
            return true;
        }
        // Acquire: pairs with the Release in `set_head`: the consumer's reads
        // of those slots happen before we overwrite them.
        let h = self.head.load(Ordering::Acquire);
        self.prod.head_seen.with_mut(|p| unsafe { *p = h });
        end.wrapping_sub(h) + n <= self.mask + 1
    }

    /// Producer: write one word (unpublished).  Caller checked `has_room`.
    #[inline(always)]
    pub(crate) fn write(&self, w: usize) {
        // SAFETY (cell): producer only.
        let end = self.prod.end.with(|e| unsafe { *e });
        debug_assert!(end.wrapping_sub(self.head.load(Ordering::Relaxed)) <= self.mask);
        self.slots[end & self.mask].store(w, Ordering::Relaxed);
        self.prod
            .end
            .with_mut(|e| unsafe { *e = end.wrapping_add(1) });
    }

    /// Producer: make every written word visible to the consumer.
    #[inline(always)]
    pub(crate) fn publish(&self) {
        // SAFETY (cell): producer only.
        let end = self.prod.end.with(|e| unsafe { *e });
        // Release: publishes the slots (and everything this thread did
        // before) to the consumer's Acquire load in `tail`.
        self.tail.store(end, Ordering::Release);
    }

    /// Producer: words written but not published.
    #[inline(always)]
    pub(crate) fn unpublished(&self) -> usize {
        // SAFETY (cell): producer only.
        self.prod
            .end
            .with(|e| unsafe { *e })
            .wrapping_sub(self.tail.load(Ordering::Relaxed))
    }

    /// Consumer: the published end.
    #[inline(always)]
    pub(crate) fn tail(&self) -> usize {
        // Acquire: pairs with the Release in `publish`.
        self.tail.load(Ordering::Acquire)
    }

    /// Consumer: the word at position `i` (`head <= i < tail`).
    #[inline(always)]
    pub(crate) fn read(&self, i: usize) -> usize {
        self.slots[i & self.mask].load(Ordering::Relaxed)
    }

    /// Consumer: current head.
    pub(crate) fn head(&self) -> usize {
        self.head.load(Ordering::Relaxed)
    }

    /// Consumer: words before `h` are consumed.
    pub(crate) fn set_head(&self, h: usize) {
        // Release: pairs with the Acquire in `has_room`.
        self.head.store(h, Ordering::Release);
    }
}

#[cfg(all(test, not(canopy_loom)))]
mod tests {
    use super::Ring;

    #[test]
    fn publish_makes_words_visible_in_order() {
        let r = Ring::new(4);
        assert!(r.has_room(4) && !r.has_room(5));
        r.write(1);
        r.write(2);
        assert_eq!(r.tail(), 0, "unpublished words are invisible");
        r.publish();
        assert_eq!((r.tail(), r.read(0), r.read(1)), (2, 1, 2));
        r.write(3);
        r.write(4);
        assert!(!r.has_room(1));
        r.set_head(2);
        assert!(r.has_room(2));
    }

    #[test]
    fn two_threads_keep_order() {
        let r = std::sync::Arc::new(Ring::new(8));
        let p = r.clone();
        let h = std::thread::spawn(move || {
            for i in 1..=100_000usize {
                while !p.has_room(1) {
                    std::hint::spin_loop();
                }
                p.write(i);
                if i % 3 == 0 || i == 100_000 {
                    p.publish();
                }
            }
        });
        let mut next = 1;
        while next <= 100_000 {
            let (h0, t) = (r.head(), r.tail());
            for i in h0..t {
                assert_eq!(r.read(i), next);
                next += 1;
            }
            r.set_head(t);
        }
        h.join().unwrap();
    }
}
