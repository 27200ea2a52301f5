//! An intrusive multi-producer single-consumer queue (Vyukov's design).
//!
//! Producers append a whole pre-linked chain `first ..= last` with **one atomic
//! swap** on `tail` followed by one release store that links the chain after
//! the previous tail.  The single consumer walks from `head`.  The allocator
//! uses it for remote frees: a batch (a block holding the freed pointers for
//! one owner) or a lone freed block is queued by its first word, its
//! [`Node`], and the owner drains its queue on its slow path; and to hand
//! emptied batches back to the heap that made them.
//!
//! ```text
//!   head (consumer)                          tail (producers swap)
//!     |                                          |
//!     v                                          v
//!   [stub] -> [a] -> [b] -> ... -> [y] ->    [z] -> null
//! ```
//!
//! Between a producer's swap and its link store the chain is briefly cut: the
//! consumer then sees `next == null` on a node that is not the tail and stops
//! (it will see the rest on a later drain).  Nothing is lost and no node is
//! returned twice.
//!
//! Invariants:
//! - `tail` is never null after [`MpscQueue::init`]; the stub node is in the
//!   queue whenever the queue holds no other node that the consumer has not
//!   returned.
//! - A node returned by [`MpscQueue::pop`] is never referenced by the queue or
//!   a producer again (pop never returns the current tail).

use crate::prim::{AtomicPtr, Ordering};
use core::cell::UnsafeCell;
use core::ptr;

/// The link embedded at the start of every queued element.
#[derive(Debug)]
#[repr(C)]
pub struct Node {
    /// Next node; written by the producer that appends after this node.
    pub next: AtomicPtr<Node>,
}

impl Node {
    /// A node with no successor.
    #[cfg(not(canopy_loom))]
    pub const fn new() -> Self {
        Node { next: AtomicPtr::new(ptr::null_mut()) }
    }

    /// A node with no successor.
    #[cfg(canopy_loom)]
    pub fn new() -> Self {
        Node { next: AtomicPtr::new(ptr::null_mut()) }
    }
}

#[cfg(not(canopy_loom))]
impl Default for Node {
    fn default() -> Self {
        Self::new()
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct MpscQueue {
    /// Producers' end.  Written by every producer with one swap each.
    tail: AtomicPtr<Node>,
    /// Consumer's end.  Only the consumer reads or writes it.
    head: UnsafeCell<*mut Node>,
    /// The placeholder that keeps the queue non-empty.
    stub: Node,
}

// SAFETY: `tail` and the nodes' links are atomics; `head` is touched only by
// the single consumer, which the `pop` contract requires.
unsafe impl Sync for MpscQueue {}
// SAFETY: as above; the queue holds only raw pointers to nodes its users own.
unsafe impl Send for MpscQueue {}

impl MpscQueue {
    /// A queue that must be [`init`](Self::init)ialised in its final place
    /// before use (it points at its own stub).
    #[cfg(not(canopy_loom))]
    pub const fn new() -> Self {
        MpscQueue { tail: AtomicPtr::new(ptr::null_mut()), head: UnsafeCell::new(ptr::null_mut()), stub: Node::new() }
    }

    /// A queue that must be [`init`](Self::init)ialised in its final place
    /// before use (it points at its own stub).
    #[cfg(canopy_loom)]
    pub fn new() -> Self {
        MpscQueue { tail: AtomicPtr::new(ptr::null_mut()), head: UnsafeCell::new(ptr::null_mut()), stub: Node::new() }
    }

    /// Point the queue at its stub.
    ///
    /// # Safety
    /// The queue must not move afterwards and no other thread may use it
    /// during this call.
    pub unsafe fn init(&self) {
        let stub = &self.stub as *const Node as *mut Node;
        self.stub.next.store(ptr::null_mut(), Ordering::Relaxed);
        // SAFETY: exclusive access during init (caller's contract).
        unsafe { *self.head.get() = stub };
        self.tail.store(stub, Ordering::Release);
    }

    /// Whether `init` has run.
    pub fn is_initialised(&self) -> bool {
        !self.tail.load(Ordering::Relaxed).is_null()
    }

    /// Append the chain `first ..= last` (already linked through `next`; the
    /// link of `last` is overwritten).  One atomic swap.
    ///
    /// # Safety
    /// The nodes must be valid, owned by the caller, in no queue, and stay
    /// valid until the consumer pops them.
    #[inline]
    pub unsafe fn push_chain(&self, first: *mut Node, last: *mut Node) {
        // SAFETY: last is valid and ours (caller's contract).
        unsafe { (*last).next.store(ptr::null_mut(), Ordering::Relaxed) };
        // AcqRel: Release publishes the chain's contents to the consumer;
        // Acquire orders our link store below after the previous producer's
        // swap.  Pairs with the Acquire loads in `pop`.
        let prev = self.tail.swap(last, Ordering::AcqRel);
        // SAFETY: prev was the tail, so it has not been returned by pop (pop
        // never returns the tail) and stays valid.
        unsafe { (*prev).next.store(first, Ordering::Release) };
    }

    /// Append one node.
    ///
    /// # Safety
    /// As for [`push_chain`](Self::push_chain).
    #[inline]
    pub unsafe fn push(&self, node: *mut Node) {
        // SAFETY: forwarded contract.
        unsafe { self.push_chain(node, node) }
    }

    /// Whether the queue looks empty (racy; a hint for the consumer).
    #[inline]
    pub fn is_empty_hint(&self) -> bool {
        core::ptr::eq(self.tail.load(Ordering::Relaxed), &self.stub)
    }

    /// Take the oldest node, or null if the queue is empty or a producer is
    /// between its swap and its link (try again later).
    ///
    /// # Safety
    /// Only one thread at a time may be the consumer.
    pub unsafe fn pop(&self) -> *mut Node {
        let stub = &self.stub as *const Node as *mut Node;
        // SAFETY: only the consumer touches head (caller's contract).
        let head_slot = unsafe { &mut *self.head.get() };
        let mut head = *head_slot;
        // SAFETY: head is the stub or a node not yet returned; both valid.
        let mut next = unsafe { (*head).next.load(Ordering::Acquire) };
        if head == stub {
            if next.is_null() {
                return ptr::null_mut();
            }
            *head_slot = next;
            head = next;
            // SAFETY: as above.
            next = unsafe { (*head).next.load(Ordering::Acquire) };
        }
        if !next.is_null() {
            *head_slot = next;
            return head;
        }
        let tail = self.tail.load(Ordering::Acquire);
        if head != tail {
            // A producer swapped tail but has not linked yet.
            return ptr::null_mut();
        }
        // head is the last node: put the stub behind it so it can be returned.
        // SAFETY: the stub is not in the queue (head != stub here) and lives
        // as long as the queue.
        unsafe { self.push(stub) };
        // SAFETY: head is still valid (not returned yet).
        next = unsafe { (*head).next.load(Ordering::Acquire) };
        if !next.is_null() {
            *head_slot = next;
            return head;
        }
        ptr::null_mut()
    }
}

#[cfg(not(canopy_loom))]
impl Default for MpscQueue {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY (every unsafe block in these tests): each queue is initialised in
// its final place (boxed or in an Arc) before use, every node comes from
// `item` and is pushed exactly once, and only the test's main thread pops.
#[cfg(all(test, not(canopy_loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[repr(C)]
    struct Item {
        node: Node,
        value: usize,
    }

    fn item(v: usize) -> *mut Node {
        Box::into_raw(Box::new(Item { node: Node::new(), value: v })) as *mut Node
    }

    fn take(n: *mut Node) -> usize {
        // SAFETY: n came from item() (Item is repr(Rust) but node is the first
        // field we cast from, see below).
        unsafe { Box::from_raw(n as *mut Item).value }
    }

    #[test]
    fn fifo_single_thread() {
        let q = Box::new(MpscQueue::new());
        unsafe { q.init() };
        assert!(unsafe { q.pop() }.is_null());
        for v in 0..10 {
            unsafe { q.push(item(v)) };
        }
        let got: Vec<usize> = (0..10).map(|_| take(unsafe { q.pop() })).collect();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        assert!(unsafe { q.pop() }.is_null());
        assert!(q.is_empty_hint());
    }

    #[test]
    fn chains_keep_order() {
        let q = Box::new(MpscQueue::new());
        unsafe { q.init() };
        let nodes: Vec<*mut Node> = (0..5).map(item).collect();
        for w in nodes.windows(2) {
            unsafe { (*w[0]).next.store(w[1], Ordering::Relaxed) };
        }
        unsafe { q.push_chain(nodes[0], nodes[4]) };
        unsafe { q.push(item(5)) };
        let got: Vec<usize> = (0..6).map(|_| take(unsafe { q.pop() })).collect();
        assert_eq!(got, vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn stress_many_producers() {
        // Not a benchmark: checks that every pushed node is popped exactly once.
        let scale: usize = std::env::var("CANOPY_STRESS_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
        let per = 20_000 * scale;
        let q = Arc::new({
            
            MpscQueue::new()
        });
        // Move into Arc first, then init in place.
        unsafe { q.init() };
        let producers: Vec<_> = (0..3)
            .map(|t| {
                let q = q.clone();
                std::thread::spawn(move || {
                    for i in 0..per {
                        unsafe { q.push(item(t * per + i)) };
                    }
                })
            })
            .collect();
        let mut seen = vec![false; 3 * per];
        let mut count = 0;
        while count < 3 * per {
            let n = unsafe { q.pop() };
            if n.is_null() {
                std::hint::spin_loop();
                continue;
            }
            let v = take(n);
            assert!(!seen[v], "value {v} popped twice");
            seen[v] = true;
            count += 1;
        }
        for p in producers {
            p.join().unwrap();
        }
        assert!(unsafe { q.pop() }.is_null());
    }
}
