//! The delegated counting protocol (paper 003 §4), independent of arrays
//! and of the allocator so that `tests/loom.rs` can model it.
//!
//! Glossary:
//! - *counting thread*: owns the counts of the objects mapped to it
//!   ([`Domain::counter_of`], a fixed function of the address); it alone
//!   reads or writes those counts after creation.
//! - *sender*: one per mutator thread; buffers count operations in a
//!   *batch* per counting thread and ships a full batch over its *lane*.
//! - *lane*: one sender's wire to one counting thread: a `full` ring of
//!   batches (sender to counter) and an `empty` ring (batches sent back for
//!   reuse).  One lane per (sender, counter) pair, so a sender's operations
//!   reach its counting thread in the order issued.
//! - *message*: one word, the object's address with the operation in the two
//!   low bits (objects are 16-byte aligned): increment, decrement, or query;
//!   a query is followed by a second word, the address of the reply slot.
//!
//! Correctness (no false "unique"): a query from thread S is applied after
//! every operation S issued earlier (FIFO lane).  If it answers 1, S's own
//! reference is the one counted; any other thread that held a reference has
//! had its decrement applied, and that decrement was issued after its last
//! use of the object (Release on the ring, Acquire by the counter, Release on
//! the reply, Acquire by S).  The answer can be too high (another thread's
//! decrement still in flight), never too low.
//!
//! Back-pressure: a full ring makes a blocking sender (a mutator) wait for
//! the counting thread; counting threads never wait for a mutator, so this
//! cannot deadlock.  A counting thread that itself sends (while dropping an
//! object whose elements are delegated arrays) is a non-blocking sender: its
//! batches wait in a local overflow list, still in order.

use std::collections::VecDeque;

use crate::prim::{fence, lock, spin_hint, Arc, AtomicBool, AtomicU64, AtomicUsize, Cell, Mutex, Ordering};
use crate::ring::Ring;

/// Words per batch.
#[cfg(not(canopy_loom))]
pub(crate) const BATCH_WORDS: usize = 256;
#[cfg(canopy_loom)]
pub(crate) const BATCH_WORDS: usize = 4;

/// Batches in flight per lane (the bound of the queue).
#[cfg(not(canopy_loom))]
pub(crate) const LANE_BATCHES: usize = 64;
#[cfg(canopy_loom)]
pub(crate) const LANE_BATCHES: usize = 1;

const OP_INC: usize = 0;
const OP_DEC: usize = 1;
const OP_QUERY: usize = 2;
const OP_MASK: usize = 3;
/// Reply slot value meaning "not answered yet".
const NO_REPLY: usize = usize::MAX;

/// A delegated count, the first field of an object's descriptor.  After the
/// object is created (count 1), only its counting thread touches `count`.
#[repr(C, align(16))]
pub struct DCount {
    count: Cell<usize>,
    /// Frees the object; called by the counting thread at count zero.
    release: unsafe fn(*const u8),
}

impl core::fmt::Debug for DCount {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("DCount { .. }")
    }
}

impl DCount {
    /// A count of 1; `release` frees the object it heads.
    pub fn new(release: unsafe fn(*const u8)) -> Self {
        DCount { count: Cell::new(1), release }
    }
}

/// A batch of messages.
pub(crate) struct Batch {
    len: usize,
    words: [usize; BATCH_WORDS],
}

impl Batch {
    fn boxed() -> Box<Batch> {
        Box::new(Batch { len: 0, words: [0; BATCH_WORDS] })
    }
}

/// One sender's wire to one counting thread.
#[derive(Debug)]
pub(crate) struct Lane {
    full: Ring,
    empty: Ring,
    /// Set by the sender after its last batch; the counter then drops the lane.
    closed: AtomicBool,
}

/// Pending-operation trace: (nanoseconds since the domain started, operations
/// shipped to the counter but not yet applied).
pub type TraceSample = (u64, u64);

/// One counting thread's state.
#[derive(Debug)]
pub struct Counter {
    /// Lanes registered since the counter last looked (written by senders).
    new_lanes: Mutex<Vec<Arc<Lane>>>,
    generation: AtomicUsize,
    /// The counter's own list of lanes (counting thread only).
    lanes: Cell<Vec<Arc<Lane>>>,
    seen_generation: Cell<usize>,
    /// Operations shipped to this counter (senders add a batch at a time).
    pub(crate) shipped: AtomicU64,
    /// Operations applied (written by the counting thread only).
    pub(crate) applied: AtomicU64,
    /// Objects freed by this counter.
    pub(crate) released: AtomicU64,
    /// The counting thread is about to park or parked.
    pub(crate) sleeping: AtomicBool,
    /// Record `trace` samples.
    pub(crate) tracing: AtomicBool,
    pub(crate) trace: Mutex<Vec<TraceSample>>,
}

// SAFETY: the `Cell` fields are touched only by the counting thread (the one
// calling `drain`, see its contract); the rest is atomics and mutexes.
unsafe impl Sync for Counter {}
// SAFETY: as above; a Counter owns only Arcs and plain data.
unsafe impl Send for Counter {}

impl Counter {
    fn new() -> Self {
        Counter {
            new_lanes: Mutex::new(Vec::new()),
            generation: AtomicUsize::new(0),
            lanes: Cell::new(Vec::new()),
            seen_generation: Cell::new(0),
            shipped: AtomicU64::new(0),
            applied: AtomicU64::new(0),
            released: AtomicU64::new(0),
            sleeping: AtomicBool::new(false),
            tracing: AtomicBool::new(false),
            trace: Mutex::new(Vec::new()),
        }
    }

    fn register(&self, lane: Arc<Lane>) {
        lock(&self.new_lanes).push(lane);
        // Release: pairs with the Acquire in `drain`, which then takes the lock.
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Apply every operation queued now; returns how many were applied.
    ///
    /// # Safety
    /// Only one thread, the counting thread, ever calls this on a counter.
    pub unsafe fn drain(&self) -> usize {
        let gen = self.generation.load(Ordering::Acquire);
        if self.seen_generation.with(|g| unsafe { *g }) != gen {
            let mut fresh = core::mem::take(&mut *lock(&self.new_lanes));
            // SAFETY: counting thread only (contract).
            self.lanes.with_mut(|l| unsafe { (*l).append(&mut fresh) });
            // SAFETY: as above.
            self.seen_generation.with_mut(|g| unsafe { *g = gen });
        }
        let mut applied = 0;
        let mut freed = 0u64;
        // SAFETY: counting thread only; `apply` may run `release`, which may
        // send (through this thread's non-blocking sender) but never touches
        // this counter's lane list.
        self.lanes.with_mut(|lanes| unsafe {
            let lanes = &mut *lanes;
            let mut i = 0;
            while i < lanes.len() {
                let lane = &lanes[i];
                while let Some(b) = lane.full.pop() {
                    let b = b as *mut Batch;
                    applied += apply(&*b, &mut freed);
                    (*b).len = 0;
                    if !lane.empty.push(b as usize) {
                        drop(Box::from_raw(b));
                    }
                }
                // Acquire: pairs with the Release in `Sender::drop`; the
                // sender's last push then is visible to the pop below.
                if lane.closed.load(Ordering::Acquire) && lane.full.is_empty() {
                    let lane = lanes.swap_remove(i);
                    while let Some(b) = lane.empty.pop() {
                        drop(Box::from_raw(b as *mut Batch));
                    }
                    continue;
                }
                i += 1;
            }
        });
        if freed > 0 {
            self.released.fetch_add(freed, Ordering::Relaxed);
        }
        if applied > 0 {
            let total = self.applied.load(Ordering::Relaxed) + applied as u64;
            self.applied.store(total, Ordering::Release);
        }
        applied
    }

    /// Operations shipped to this counter and not applied yet.
    pub fn pending(&self) -> u64 {
        let applied = self.applied.load(Ordering::Acquire);
        self.shipped.load(Ordering::Acquire).saturating_sub(applied)
    }

    /// Whether a lane has batches waiting (counting thread only, best effort).
    pub(crate) fn has_work(&self) -> bool {
        self.generation.load(Ordering::Acquire) != self.seen_generation.with(|g| unsafe { *g })
            || self.lanes.with(|l| unsafe { (*l).iter().any(|x| !x.full.is_empty()) })
    }
}

/// Apply one batch; returns the number of operations.
///
/// # Safety
/// Counting thread of every object named in the batch.
unsafe fn apply(b: &Batch, freed: &mut u64) -> usize {
    let mut i = 0;
    let mut ops = 0;
    while i < b.len {
        let w = b.words[i];
        let obj = (w & !OP_MASK) as *const DCount;
        // SAFETY: a message names a live object: its sender held a reference
        // when it issued the message, and that reference's decrement comes
        // later in the same lane, or in another lane after a hand-over.
        let c = unsafe { &*obj };
        match w & OP_MASK {
            OP_INC => c.count.with_mut(|n| unsafe {
                debug_assert!(*n > 0, "delegated count: increment of a dead object {obj:p}");
                *n += 1;
            }),
            OP_DEC => {
                let last = c.count.with_mut(|n| unsafe {
                    debug_assert!(*n > 0, "delegated count: decrement below zero of {obj:p}");
                    *n -= 1;
                    *n == 0
                });
                if last {
                    // SAFETY: the count reached zero: no reference is left,
                    // and no message about the object can follow.
                    unsafe { (c.release)(obj as *const u8) };
                    *freed += 1;
                }
            }
            OP_QUERY => {
                i += 1;
                let reply = b.words[i] as *const AtomicUsize;
                let n = c.count.with(|n| unsafe { *n });
                // Release: pairs with the Acquire in `Sender::getrc`; every
                // decrement applied so far (and the uses before it) happens
                // before the asker acts on the answer.  The slot lives on the
                // asker's stack until it sees the answer; nothing here
                // touches it afterwards.
                unsafe { (*reply).store(n, Ordering::Release) };
            }
            _ => unreachable!("delegated count: bad message {w:#x}"),
        }
        ops += 1;
        i += 1;
    }
    ops
}

/// A set of counting threads and the fixed mapping of objects to them.
#[derive(Debug)]
pub struct Domain {
    /// The counting threads' states, indexed by [`Domain::counter_of`].
    pub counters: Vec<Arc<Counter>>,
    /// Wakes a parked counting thread (unused under loom).
    waker: Mutex<Vec<Option<Waker>>>,
}

#[cfg(not(canopy_loom))]
type Waker = std::thread::Thread;
#[cfg(canopy_loom)]
type Waker = ();

impl Domain {
    /// A domain of `n` counting threads (at least 1).  The threads are not
    /// started here: the caller runs `Counter::drain` on each counter.
    pub fn new(n: usize) -> Self {
        let n = n.max(1);
        Domain {
            counters: (0..n).map(|_| Arc::new(Counter::new())).collect(),
            waker: Mutex::new((0..n).map(|_| None).collect()),
        }
    }

    /// The counting thread of the object at `addr` (a fixed function of the
    /// address).
    #[inline(always)]
    pub(crate) fn counter_of(&self, addr: usize) -> usize {
        let n = self.counters.len();
        if n == 1 {
            0
        } else {
            let h = ((addr as u64) >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
            (h % n as u64) as usize
        }
    }

    #[cfg(not(canopy_loom))]
    pub(crate) fn set_waker(&self, i: usize, w: Waker) {
        lock(&self.waker)[i] = Some(w);
    }

    /// Wake counter `i` if it is parked.  Called after shipping a batch.
    #[inline]
    fn wake(&self, i: usize) {
        // SeqCst fence: pairs with the SeqCst store of `sleeping` and the
        // fence in the counting thread's park path (Dekker): either the
        // counter sees our batch when it re-checks, or we see it sleeping.
        fence(Ordering::SeqCst);
        if self.counters[i].sleeping.load(Ordering::Relaxed) {
            #[cfg(not(canopy_loom))]
            if let Some(t) = lock(&self.waker)[i].as_ref() {
                t.unpark();
            }
        }
    }
}

struct SendLane {
    lane: Arc<Lane>,
    cur: Box<Batch>,
    overflow: VecDeque<Box<Batch>>,
}

/// A thread's sending side: a current batch and a lane per counting thread.
pub struct Sender {
    domain: Arc<Domain>,
    lanes: Vec<SendLane>,
    /// Mutators block on a full lane; counting threads never do.
    blocking: bool,
}

impl core::fmt::Debug for Sender {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sender").field("lanes", &self.lanes.len()).field("blocking", &self.blocking).finish()
    }
}

impl Sender {
    /// Register a lane with every counting thread of `domain`.
    pub fn new(domain: Arc<Domain>, blocking: bool) -> Self {
        let lanes = domain
            .counters
            .iter()
            .map(|c| {
                let lane = Arc::new(Lane {
                    full: Ring::new(LANE_BATCHES),
                    empty: Ring::new(LANE_BATCHES),
                    closed: AtomicBool::new(false),
                });
                c.register(lane.clone());
                SendLane { lane, cur: Batch::boxed(), overflow: VecDeque::new() }
            })
            .collect();
        Sender { domain, lanes, blocking }
    }

    /// Asynchronous increment of the object at `obj`.
    #[inline(always)]
    pub fn inc(&mut self, obj: *const DCount) {
        self.push(obj as usize | OP_INC);
    }

    /// Asynchronous decrement of the object at `obj`; the counting thread
    /// frees it if the count reaches zero.
    #[inline(always)]
    pub fn dec(&mut self, obj: *const DCount) {
        self.push(obj as usize | OP_DEC);
    }

    #[inline(always)]
    fn push(&mut self, w: usize) {
        let c = self.domain.counter_of(w);
        // SAFETY: counter_of returns an index below counters.len() ==
        // lanes.len().
        let sl = unsafe { self.lanes.get_unchecked_mut(c) };
        let b = &mut *sl.cur;
        b.words[b.len] = w;
        b.len += 1;
        if b.len == BATCH_WORDS {
            self.ship(c);
        }
    }

    /// Send lane `c`'s current batch (if not empty) and start a new one.
    #[cold]
    #[inline(never)]
    fn ship(&mut self, c: usize) {
        let sl = &mut self.lanes[c];
        if sl.cur.len == 0 {
            return;
        }
        let fresh = match sl.lane.empty.pop() {
            // SAFETY: the counter sent back a box it got from us, emptied.
            Some(b) => unsafe { Box::from_raw(b as *mut Batch) },
            None => Batch::boxed(),
        };
        let full = core::mem::replace(&mut sl.cur, fresh);
        self.domain.counters[c].shipped.fetch_add(full.len as u64, Ordering::AcqRel);
        sl.overflow.push_back(full);
        self.send_overflow(c);
    }

    /// Push lane `c`'s waiting batches into its ring, oldest first.  A
    /// blocking sender waits until all are in (back-pressure); a non-blocking
    /// one leaves the rest for `retry`.
    fn send_overflow(&mut self, c: usize) {
        let mut spins = 0u32;
        loop {
            let sl = &mut self.lanes[c];
            while let Some(b) = sl.overflow.pop_front() {
                let p = Box::into_raw(b);
                if !sl.lane.full.push(p as usize) {
                    // SAFETY: the push failed, so the box is still ours.
                    sl.overflow.push_front(unsafe { Box::from_raw(p) });
                    break;
                }
            }
            let done = sl.overflow.is_empty();
            self.domain.wake(c);
            if done || !self.blocking {
                return;
            }
            spins += 1;
            if spins < 64 {
                spin_hint();
            } else {
                yield_now();
            }
        }
    }

    /// Ship every partial batch (a mutator at a synchronisation point, or
    /// before its thread ends).
    pub fn flush(&mut self) {
        for c in 0..self.lanes.len() {
            self.ship(c);
            if !self.lanes[c].overflow.is_empty() {
                self.send_overflow(c);
            }
        }
    }

    /// Non-blocking senders: try again to send batches left in overflow.
    pub(crate) fn retry(&mut self) {
        for c in 0..self.lanes.len() {
            if !self.lanes[c].overflow.is_empty() {
                self.send_overflow(c);
            }
        }
    }

    /// Synchronous count read: the count of `obj` after every operation this
    /// sender issued before.  May over-report (another thread's decrement
    /// still in flight), never under-reports.
    ///
    /// Must not be called by a counting thread (it would wait for itself).
    pub fn getrc(&mut self, obj: *const DCount) -> usize {
        debug_assert!(self.blocking, "getrc from a counting thread");
        let reply = AtomicUsize::new(NO_REPLY);
        let c = self.domain.counter_of(obj as usize);
        if self.lanes[c].cur.len + 2 > BATCH_WORDS {
            self.ship(c);
        }
        let b = &mut *self.lanes[c].cur;
        b.words[b.len] = obj as usize | OP_QUERY;
        b.words[b.len + 1] = &reply as *const AtomicUsize as usize;
        b.len += 2;
        self.ship(c);
        let mut spins = 0u32;
        loop {
            // Acquire: pairs with the Release store in `apply`.
            let n = reply.load(Ordering::Acquire);
            if n != NO_REPLY {
                return n;
            }
            spins += 1;
            if spins < 1 << 12 {
                spin_hint();
            } else {
                self.domain.wake(c);
                yield_now();
            }
        }
    }
}

#[inline]
fn yield_now() {
    #[cfg(canopy_loom)]
    loom::thread::yield_now();
    #[cfg(not(canopy_loom))]
    std::thread::yield_now();
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.flush();
        // A non-blocking sender (counting thread) only ends with the process;
        // whatever it still holds is dropped with it.
        for sl in &self.lanes {
            // Release: pairs with the Acquire in `Counter::drain`.
            sl.lane.closed.store(true, Ordering::Release);
        }
    }
}
