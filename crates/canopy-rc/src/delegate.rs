//! The delegated counting protocol (paper 003 §4), independent of arrays
//! and of the allocator so that `tests/loom.rs` can model it.
//!
//! Glossary:
//! - *counting thread*: owns the counts of the objects mapped to it
//!   ([`Domain::counter_of`], a fixed function of the address).  After
//!   creation those counts are read and written only by whoever holds the
//!   counter's *drain lock* and runs a *round*: the counting thread, or an
//!   asker helping in `getrc` (see "Helping" below).
//! - *sender*: one per mutator thread, with one *lane* per counting thread.
//! - *lane*: a bounded ring of words from one sender to one counting thread
//!   (`ring.rs`), so a sender's operations on an object arrive in the order
//!   it issued them.
//! - *message*: one word, the object's address with the operation in the two
//!   low bits (objects are 16-byte aligned): increment, decrement or query;
//!   a query is followed by a second word, the address of the reply slot.
//!
//! ## Order across threads
//! Per-sender order is not enough once references travel: thread A clones
//! (increment) and hands the clone to B, which drops it (decrement); if B's
//! decrement were applied before A's increment, the count could reach zero,
//! or `getrc` answer 1, while A still holds a reference.  The Microgrid gets
//! this order from its delegation network.  Here:
//! 1. **Pending increment.**  A sender keeps its last increment per lane in
//!    the lane's `pending` word (the object's address) instead of sending it:
//!    a decrement of the same object cancels it (clone then drop costs two
//!    plain stores to a line only this thread writes), another increment
//!    *evicts* it (writes the increment word, publishes the lane's tail, and
//!    only then overwrites `pending`).  `pending` is readable by the counting
//!    thread (a Release store, a plain store on x86).  Decrements are written
//!    to the lane and published at the next eviction, query, flush, or when
//!    the lane holds [`PUBLISH_EVERY`] unpublished words; flush, `getrc` and
//!    the sender's end evict the pending increments first.
//! 2. **Rounds.**  The counting thread first reads every lane's tail (the
//!    extent of this round's decrements and queries), applies every increment
//!    published up to tails read after those, then the decrements (counts are
//!    signed).  A decision that could be wrong if an increment were missing,
//!    i.e. freeing an object whose count is 0 and answering a query, is taken
//!    only after a *check*: read every lane's `pending` (Acquire), then apply
//!    the increments published up to tails read after that, then decide with
//!    `count + (lanes whose pending names the object)`.  An object is freed
//!    when that is exactly 0; otherwise, if its count is <= 0, it stays on the
//!    counter's *zero list* and is checked again every round (its holder will
//!    cancel, or evict, or end and flush).
//!
//! Why no false "unique" and no early free: let a decrement or query applied
//! in a round be published before the round's first tail read (time s).  Any
//! increment that causally precedes it (the clone that produced the
//! reference) happened before s, so when the check later reads that sender's
//! `pending`, the increment is either still there (counted), or was evicted,
//! i.e. published before `pending` changed, and so is seen by the tail read
//! that follows the check's `pending` read (Acquire/Release, then coherence),
//! or was cancelled by a decrement of the same sender, which removed a
//! reference just as well.  So `count + pending` never falls below the
//! number of references alive; applying an increment early only raises it.
//!
//! Hence a query from S is answered after all of S's earlier operations (its
//! pending increment is evicted first) and every increment that causally
//! precedes any applied decrement: the answer may be too high, never too low.
//!
//! ## Helping
//! An asker does not wait for the counting thread to be scheduled: after
//! publishing its query it takes the counter's drain lock if it is free
//! (Acquire; released with Release, so rounds are ordered like one thread's)
//! and runs the round itself.  A helper does not run release functions
//! (one may drop a delegated array and so re-enter the asker's own sender):
//! objects it finds dead go to a list the counting thread frees.
//!
//! ## Back-pressure
//! A full lane makes a mutator publish and wait for the counting thread;
//! counting threads never wait for a mutator, so this cannot deadlock.  A
//! counting thread that itself sends (dropping an object whose elements are
//! delegated arrays) is a non-blocking sender: words that do not fit wait in
//! a local overflow list, in order, and only decrements may be sent that way.

use std::collections::VecDeque;

use crate::prim::{
    fence, lock, spin_hint, Arc, AtomicBool, AtomicU64, AtomicUsize, Cell, Mutex, Ordering,
};
use crate::ring::Ring;

/// Words per lane (the bound of the queue).
#[cfg(not(canopy_loom))]
pub(crate) const LANE_WORDS: usize = 1 << 14;
#[cfg(canopy_loom)]
pub(crate) const LANE_WORDS: usize = 4;

/// Unpublished decrements a lane may hold before they are published.
#[cfg(not(canopy_loom))]
pub const PUBLISH_EVERY: usize = 256;
/// Unpublished decrements a lane may hold before they are published.
#[cfg(canopy_loom)]
pub const PUBLISH_EVERY: usize = 2;

const OP_INC: usize = 0;
const OP_DEC: usize = 1;
const OP_QUERY: usize = 2;
const OP_MASK: usize = 3;
/// Reply slot value meaning "not answered yet".
const NO_REPLY: usize = usize::MAX;

/// A delegated count, the first field of an object's descriptor.  After the
/// object is created (count 1), only its counting thread touches `count`.
/// Signed: a decrement may be applied while the increment that balances it
/// still sits in its sender's `pending` word (module notes).
#[repr(C, align(16))]
pub struct DCount {
    count: Cell<isize>,
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
        DCount {
            count: Cell::new(1),
            release,
        }
    }
}

/// One sender's lane to one counting thread.
#[derive(Debug)]
pub(crate) struct Lane {
    ring: Ring,
    /// The sender's pending increment: an object address or 0.  Written by
    /// the sender only (Release), read by the counting thread (Acquire).
    /// On its own cache line: the sender writes it on every clone and drop.
    pending: canopy_sync::CachePadded<AtomicUsize>,
    /// Set by the sender after its last publication; the counter then drops the lane.
    closed: AtomicBool,
}

/// The counter's view of a lane.
#[derive(Debug)]
struct Inbound {
    lane: Arc<Lane>,
    /// Increments before this position have been applied.
    inc_done: usize,
    /// Tail read in the first step of the current round.
    round_tail: usize,
}

/// Pending-operation trace: (nanoseconds since the domain started, operations
/// published to the counter but not yet applied).
pub type TraceSample = (u64, u64);

/// One counting thread's state.
#[derive(Debug)]
pub struct Counter {
    /// Lanes registered since the counter last looked (written by senders).
    new_lanes: Mutex<Vec<Arc<Lane>>>,
    generation: AtomicUsize,
    /// The counter's own list of lanes (drain-lock holder only).
    lanes: Cell<Vec<Inbound>>,
    seen_generation: Cell<usize>,
    /// Objects whose count is <= 0 but that a pending increment (or a not
    /// yet applied one) may keep alive; checked every round (drainer only).
    zero: Cell<Vec<usize>>,
    /// Held by whoever runs a round: the counting thread, or an asker that
    /// helps (`Sender::getrc`).  The `Cell` fields are touched only by the
    /// holder; Acquire on taking it, Release on leaving it.
    drain_lock: canopy_sync::CachePadded<AtomicBool>,
    /// Dead objects found by a helping asker, freed by the counting thread
    /// (an asker must not run `release`: it may send, through the asker's
    /// own sender, which is in use).
    deferred: Mutex<Vec<usize>>,
    /// `deferred` is not empty.
    has_deferred: AtomicBool,
    /// Operations applied (written by the counting thread only).
    pub(crate) applied: AtomicU64,
    /// Words published and not consumed when the last round began.
    pub(crate) backlog: AtomicU64,
    /// Objects freed by this counter.
    pub(crate) released: AtomicU64,
    /// The counting thread is about to park or parked.
    pub(crate) sleeping: AtomicBool,
    /// Set by an asker after publishing a query: the counting thread, which
    /// otherwise polls the lanes only every few microseconds (so that
    /// mutators' stores to their lanes rarely meet its reads), starts a
    /// round at once.  On its own cache line: written rarely, read often.
    pub(crate) poke: canopy_sync::CachePadded<AtomicBool>,
    /// Record `trace` samples.
    #[cfg_attr(canopy_loom, allow(dead_code))]
    pub(crate) tracing: AtomicBool,
    #[cfg_attr(canopy_loom, allow(dead_code))]
    pub(crate) trace: Mutex<Vec<TraceSample>>,
}

// SAFETY: the `Cell` fields are touched only by the holder of `drain_lock`
// (taken with Acquire, left with Release); the rest is atomics and mutexes.
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
            zero: Cell::new(Vec::new()),
            drain_lock: canopy_sync::CachePadded::new(AtomicBool::new(false)),
            deferred: Mutex::new(Vec::new()),
            has_deferred: AtomicBool::new(false),
            applied: AtomicU64::new(0),
            backlog: AtomicU64::new(0),
            released: AtomicU64::new(0),
            sleeping: AtomicBool::new(false),
            poke: canopy_sync::CachePadded::new(AtomicBool::new(false)),
            tracing: AtomicBool::new(false),
            trace: Mutex::new(Vec::new()),
        }
    }

    fn register(&self, lane: Arc<Lane>) {
        lock(&self.new_lanes).push(lane);
        // Release: pairs with the Acquire in `drain`, which then takes the lock.
        self.generation.fetch_add(1, Ordering::Release);
    }

    #[cfg_attr(not(canopy_loom), allow(dead_code))]
    /// One round on the counting thread (waits for a helping asker to
    /// finish its round first), and frees the objects helpers found dead;
    /// returns how many operations were applied.
    ///
    /// # Safety
    /// Only one thread, the counting thread, calls this on a counter.
    pub unsafe fn drain(&self) -> usize {
        loop {
            if let Some(n) = self.try_round(true) {
                return n;
            }
            spin_hint();
            #[cfg(canopy_loom)]
            loom::thread::yield_now();
        }
    }

    /// Run a round if no one else is running one.  `release`: free dead
    /// objects now (the counting thread), else leave them to it.
    pub(crate) fn try_round(&self, release: bool) -> Option<usize> {
        // Acquire: the previous holder's cell writes happen before ours.
        if self.drain_lock.load(Ordering::Relaxed)
            || self
                .drain_lock
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return None;
        }
        // SAFETY: we hold the drain lock.
        let n = unsafe { self.round(release) };
        // Release: pairs with the Acquire above.
        self.drain_lock.store(false, Ordering::Release);
        if release && self.has_deferred.load(Ordering::Acquire) {
            self.has_deferred.store(false, Ordering::Relaxed);
            let dead = core::mem::take(&mut *lock(&self.deferred));
            for &o in &dead {
                let c = o as *const DCount;
                // SAFETY: a helper found the object dead (count 0, nothing
                // pending); no reference and no message about it is left.
                unsafe { run_release(c) };
            }
            if !dead.is_empty() {
                self.released
                    .fetch_add(dead.len() as u64, Ordering::Relaxed);
            }
        }
        Some(n)
    }

    /// One round: apply every operation published now (increments first,
    /// then decrements, then the check and the answers; see the module
    /// notes); returns how many operations were applied.
    ///
    /// # Safety
    /// The caller holds the drain lock; `release` only on the counting
    /// thread.
    unsafe fn round(&self, release: bool) -> usize {
        let mut applied = 0usize;
        let mut freed = 0u64;
        let mut backlog = 0u64;
        // SAFETY: drain-lock holder only; `release` (run here only on the
        // counting thread) may send through that thread's own non-blocking
        // sender but never touches this counter's lane list or zero list.
        self.lanes.with_mut(|lanes| unsafe {
            let lanes = &mut *lanes;
            self.adopt_new_lanes(lanes);
            // Objects whose count went to <= 0 this round, plus last round's.
            let mut zero: Vec<usize> = self.zero.with_mut(|z| core::mem::take(&mut *z));
            // Step 1: the extent of this round's decrements and queries.
            // (Closed is read first: a lane seen closed here has published
            // everything by the tail read after it.)
            let mut closed = Vec::new();
            for (i, ib) in lanes.iter_mut().enumerate() {
                if ib.lane.closed.load(Ordering::Acquire) {
                    closed.push(i);
                }
                ib.round_tail = ib.lane.ring.tail();
                backlog += ib.round_tail.wrapping_sub(ib.lane.ring.head()) as u64;
            }
            // Step 2: every increment published up to a tail read now.
            applied += apply_increments(lanes, &mut zero);
            // Step 3: decrements in lane order; queries are answered after
            // the check (an asker's own operations all precede its query;
            // the others' only make the answer closer to the truth, and its
            // own reference keeps the object alive).
            let mut queries: Vec<(usize, usize)> = Vec::new();
            for ib in lanes.iter_mut() {
                let mut p = ib.lane.ring.head();
                let t = ib.round_tail;
                while p != t {
                    let w = ib.lane.ring.read(p);
                    match w & OP_MASK {
                        OP_INC => {}
                        OP_DEC => {
                            if dec(w) {
                                zero.push(w & !OP_MASK);
                            }
                            applied += 1;
                        }
                        OP_QUERY => {
                            p = p.wrapping_add(1);
                            queries.push((w & !OP_MASK, ib.lane.ring.read(p)));
                            applied += 1;
                        }
                        _ => unreachable!("delegated count: bad message {w:#x}"),
                    }
                    p = p.wrapping_add(1);
                }
                ib.lane.ring.set_head(t);
            }
            // Step 4, the check: every sender's pending increment, then the
            // increments published up to tails read after those.
            if !zero.is_empty() || !queries.is_empty() {
                // Lanes registered since the round began: a sender that
                // registered before a decrement or query of this round was
                // published (step 1 read its tail, Acquire) may hold a
                // pending increment that causally precedes it; without its
                // lane the check would miss it (a false 1, an early free).
                self.adopt_new_lanes(lanes);
                let mut pend: Vec<usize> = Vec::new();
                for ib in lanes.iter() {
                    // Acquire: pairs with the Release stores in `Sender`: an
                    // eviction published its word before changing `pending`.
                    let x = ib.lane.pending.load(Ordering::Acquire);
                    if x != 0 {
                        pend.push(x);
                    }
                }
                applied += apply_increments(lanes, &mut zero);
                let pending_of = |o: usize| pend.iter().filter(|&&x| x == o).count() as isize;
                zero.sort_unstable();
                zero.dedup();
                let mut keep = Vec::new();
                for o in zero {
                    let c = o as *const DCount;
                    let n = (*c).count.with(|n| *n);
                    if n > 0 {
                        continue; // alive again: an increment arrived
                    }
                    if n == 0 && pending_of(o) == 0 {
                        // No reference is left, and no message about the
                        // object can follow.
                        if release {
                            run_release(c);
                            freed += 1;
                        } else {
                            lock(&self.deferred).push(o);
                            self.has_deferred.store(true, Ordering::Release);
                        }
                    } else {
                        keep.push(o);
                    }
                }
                self.zero.with_mut(|z| *z = keep);
                for (o, reply) in queries {
                    let n = (*(o as *const DCount)).count.with(|n| *n) + pending_of(o);
                    answer(n, reply);
                }
            }
            // Drop lanes whose sender is gone and that are fully consumed.
            for &i in closed.iter().rev() {
                let ib = &lanes[i];
                if ib.lane.ring.tail() == ib.round_tail {
                    lanes.swap_remove(i);
                }
            }
        });
        if freed > 0 {
            self.released.fetch_add(freed, Ordering::Relaxed);
        }
        self.backlog.store(backlog, Ordering::Relaxed);
        if applied > 0 {
            let total = self.applied.load(Ordering::Relaxed) + applied as u64;
            self.applied.store(total, Ordering::Release);
        }
        applied
    }

    /// Add the lanes registered since the last look to `lanes` (their words
    /// from the current head on are this counter's to apply).
    ///
    /// # Safety
    /// The caller holds the drain lock; `lanes` is the counter's lane list.
    unsafe fn adopt_new_lanes(&self, lanes: &mut Vec<Inbound>) {
        // Acquire: pairs with the Release in `register`; a generation read
        // after the registration (in happens-before order) sees it.
        let gen = self.generation.load(Ordering::Acquire);
        // SAFETY (cells): we hold the drain lock (contract).
        if self.seen_generation.with(|g| unsafe { *g }) != gen {
            let fresh = core::mem::take(&mut *lock(&self.new_lanes));
            for lane in fresh {
                let h = lane.ring.head();
                lanes.push(Inbound {
                    lane,
                    inc_done: h,
                    round_tail: h,
                });
            }
            self.seen_generation.with_mut(|g| unsafe { *g = gen });
        }
    }

    /// Words published to this counter and not consumed when its last round
    /// began (the pending operations; a query counts two words).
    pub fn backlog(&self) -> u64 {
        self.backlog.load(Ordering::Relaxed)
    }

    /// Whether some lane has published words not consumed (counting thread
    /// only, best effort).
    #[cfg_attr(canopy_loom, allow(dead_code))]
    pub(crate) fn has_work(&self) -> bool {
        if self.has_deferred.load(Ordering::Relaxed) {
            return true;
        }
        if self
            .drain_lock
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return true; // a helper is running a round
        }
        // SAFETY (cells): we hold the drain lock.
        let w = self.generation.load(Ordering::Acquire)
            != self.seen_generation.with(|g| unsafe { *g })
            || self.lanes.with(|l| unsafe {
                (*l).iter()
                    .any(|x| x.lane.ring.tail() != x.lane.ring.head())
            });
        // Release: pairs with the Acquire of the next holder.
        self.drain_lock.store(false, Ordering::Release);
        w
    }
}

/// Run the release function of a dead object on the counting thread.  A
/// panic (an element's `Drop`) is caught and the rest of the object leaked:
/// unwinding would end the counting thread, inside a round (holding the
/// drain lock), and every later `getrc` and full lane would wait for ever.
///
/// # Safety
/// `c` heads a dead object (no reference, no message about it left), which
/// is released once, here.
unsafe fn run_release(c: *const DCount) {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: contract.
        unsafe { ((*c).release)(c as *const u8) }
    }));
    // The panic hook has reported it; the counting thread goes on.
    drop(r);
}

/// Step 2 of a round (and of the check): apply every increment published in
/// any lane up to a tail read now; objects whose count is still <= 0 go on
/// `zero`.  Returns the number applied.
///
/// # Safety
/// Counting thread of these lanes.
unsafe fn apply_increments(lanes: &mut [Inbound], zero: &mut Vec<usize>) -> usize {
    let mut applied = 0;
    for ib in lanes.iter_mut() {
        let t = ib.lane.ring.tail();
        let mut p = ib.inc_done;
        while p != t {
            let w = ib.lane.ring.read(p);
            match w & OP_MASK {
                OP_INC => {
                    // SAFETY: counting thread (contract); the sender held a
                    // reference when it sent the word.
                    if unsafe { inc(w) } {
                        zero.push(w & !OP_MASK);
                    }
                    applied += 1;
                }
                OP_QUERY => p = p.wrapping_add(1),
                _ => {}
            }
            p = p.wrapping_add(1);
        }
        ib.inc_done = t;
    }
    applied
}

/// Returns whether the count is still <= 0 (the object stays on the zero
/// list).
///
/// # Safety
/// Counting thread of the object named by `w`, which is not freed (its
/// sender held a reference when it issued the message).
unsafe fn inc(w: usize) -> bool {
    let c = (w & !OP_MASK) as *const DCount;
    // SAFETY: see contract.
    unsafe {
        (*c).count.with_mut(|n| {
            *n += 1;
            *n <= 0
        })
    }
}

/// Returns whether the count reached <= 0 (the object goes on the zero
/// list; it is freed by the check, not here).
///
/// # Safety
/// As for `inc`.
unsafe fn dec(w: usize) -> bool {
    let c = (w & !OP_MASK) as *const DCount;
    // SAFETY: see contract.
    unsafe {
        (*c).count.with_mut(|n| {
            *n -= 1;
            *n <= 0
        })
    }
}

/// # Safety
/// `reply` is the asker's reply slot, live until answered.
unsafe fn answer(n: isize, reply: usize) {
    debug_assert!(n >= 1, "delegated count: query answered {n}");
    // Release: pairs with the Acquire in `Sender::getrc`; every decrement
    // applied so far (and the uses before it) happens before the asker acts
    // on the answer.  The slot lives on the asker's stack until it sees the
    // answer; nothing here touches it afterwards.
    // SAFETY: see contract.
    unsafe { (*(reply as *const AtomicUsize)).store(n.max(1) as usize, Ordering::Release) };
}

/// A set of counting threads and the fixed mapping of objects to them.
#[derive(Debug)]
pub struct Domain {
    /// The counting threads' states, indexed by [`Domain::counter_of`].
    pub counters: Vec<Arc<Counter>>,
    /// Wakes a parked counting thread (unused under loom).
    #[cfg_attr(canopy_loom, allow(dead_code))]
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
    pub fn counter_of(&self, addr: usize) -> usize {
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

    /// Wake counter `i` if it is parked.
    #[inline]
    fn wake(&self, i: usize) {
        // SeqCst fence: pairs with the SeqCst store of `sleeping` and the
        // fence in the counting thread's park path (Dekker): either the
        // counter sees our words when it re-checks, or we see it sleeping.
        fence(Ordering::SeqCst);
        if self.counters[i].sleeping.load(Ordering::Relaxed) {
            #[cfg(not(canopy_loom))]
            if let Some(t) = lock(&self.waker)[i].as_ref() {
                t.unpark();
            }
        }
    }
}

/// A thread's sending side: one lane per counting thread.
pub struct Sender {
    domain: Arc<Domain>,
    lanes: Vec<Arc<Lane>>,
    /// Non-blocking senders only: words waiting for room, per lane.
    overflow: Vec<VecDeque<usize>>,
    /// Mutators wait on a full lane; counting threads never do.
    blocking: bool,
}

impl core::fmt::Debug for Sender {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sender")
            .field("lanes", &self.lanes.len())
            .field("blocking", &self.blocking)
            .finish()
    }
}

impl Sender {
    /// Register a lane with every counting thread of `domain`.
    pub fn new(domain: Arc<Domain>, blocking: bool) -> Self {
        let lanes: Vec<Arc<Lane>> = domain
            .counters
            .iter()
            .map(|c| {
                let lane = Arc::new(Lane {
                    ring: Ring::new(LANE_WORDS),
                    pending: canopy_sync::CachePadded::new(AtomicUsize::new(0)),
                    closed: AtomicBool::new(false),
                });
                c.register(lane.clone());
                lane
            })
            .collect();
        let overflow = lanes.iter().map(|_| VecDeque::new()).collect();
        Sender {
            domain,
            lanes,
            overflow,
            blocking,
        }
    }

    /// Asynchronous increment of the object at `obj`: it becomes the lane's
    /// pending increment; the one it replaces is sent and published first.
    #[inline(always)]
    pub fn inc(&mut self, obj: *const DCount) {
        debug_assert!(
            self.blocking,
            "a counting thread must not clone a delegated array"
        );
        let c = self.domain.counter_of(obj as usize);
        // Relaxed: only this thread writes `pending`.
        let old = self.lanes[c].pending.load(Ordering::Relaxed);
        if old != 0 {
            self.evict(c, old);
        }
        // Release: pairs with the Acquire in the counter's check (the
        // eviction above is published before `pending` changes).
        self.lanes[c].pending.store(obj as usize, Ordering::Release);
    }

    /// Number of lanes (one per counting thread).
    #[cfg(not(canopy_loom))]
    pub(crate) fn lane_count(&self) -> usize {
        self.lanes.len()
    }

    /// The pending-increment word of lane `c`: the fast paths in
    /// `delegated.rs` do what [`Sender::inc`] and [`Sender::dec`] do when no
    /// eviction and no lane word is needed, through this pointer (valid while
    /// the sender lives; written by the sender's thread only).
    #[cfg(not(canopy_loom))]
    pub(crate) fn pending_slot(&self, c: usize) -> *const AtomicUsize {
        &*self.lanes[c].pending as *const AtomicUsize
    }

    /// Send and publish the pending increment `old` of lane `c` (`pending`
    /// is overwritten by the caller, after the publication).
    #[inline(always)]
    fn evict(&mut self, c: usize, old: usize) {
        self.put(c, old | OP_INC, 1);
        self.lanes[c].ring.publish();
    }

    /// Send lane `c`'s pending increment, if any, and clear it.
    #[inline]
    fn evict_pending(&mut self, c: usize) {
        let old = self.lanes[c].pending.load(Ordering::Relaxed);
        if old != 0 {
            self.evict(c, old);
            // Release: after the publication (see `inc`).
            self.lanes[c].pending.store(0, Ordering::Release);
        }
    }

    /// Asynchronous decrement of the object at `obj`; the counting thread
    /// frees it when no reference is left.  Cancels the lane's pending
    /// increment if that is of the same object; otherwise written to the
    /// lane and published with the lane's next eviction, query or flush, or
    /// after [`PUBLISH_EVERY`] words.
    #[inline(always)]
    pub fn dec(&mut self, obj: *const DCount) {
        let c = self.domain.counter_of(obj as usize);
        if self.lanes[c].pending.load(Ordering::Relaxed) == obj as usize {
            // Release: a cancelled increment needs no order, but keep every
            // store to `pending` Release (a plain store on x86).
            self.lanes[c].pending.store(0, Ordering::Release);
            return;
        }
        self.put(c, obj as usize | OP_DEC, 1);
        if self.lanes[c].ring.unpublished() >= PUBLISH_EVERY {
            self.lanes[c].ring.publish();
        }
    }

    /// Write a word (the first of `n` to come) into lane `c`.
    #[inline(always)]
    fn put(&mut self, c: usize, w: usize, n: usize) {
        if self.blocking {
            if !self.lanes[c].ring.has_room(n) {
                self.wait_room(c, n);
            }
            self.lanes[c].ring.write(w);
        } else {
            self.put_nonblocking(c, w);
        }
    }

    /// Lane `c` is full: publish, wake the counter, wait for room.
    #[cold]
    #[inline(never)]
    fn wait_room(&mut self, c: usize, n: usize) {
        let ring = &self.lanes[c].ring;
        ring.publish();
        let mut spins = 0u32;
        while !ring.has_room(n) {
            self.domain.wake(c);
            spins += 1;
            if spins < 64 {
                spin_hint();
            } else {
                yield_now();
            }
        }
    }

    #[cold]
    fn put_nonblocking(&mut self, c: usize, w: usize) {
        self.overflow[c].push_back(w);
        self.retry_lane(c);
    }

    fn retry_lane(&mut self, c: usize) {
        let ring = &self.lanes[c].ring;
        let q = &mut self.overflow[c];
        while let Some(&w) = q.front() {
            if !ring.has_room(1) {
                break;
            }
            ring.write(w);
            q.pop_front();
        }
        ring.publish();
    }

    /// Non-blocking senders: move words left in overflow into their lanes.
    pub fn retry(&mut self) {
        for c in 0..self.lanes.len() {
            if !self.overflow[c].is_empty() {
                self.retry_lane(c);
            }
        }
    }

    /// Publish every written word (a mutator at a synchronisation point, or
    /// before its thread ends) and wake counting threads that sleep.
    pub fn flush(&mut self) {
        for c in 0..self.lanes.len() {
            if self.lanes[c].ring.unpublished() > 0
                || self.lanes[c].pending.load(Ordering::Relaxed) != 0
            {
                self.evict_pending(c);
                self.lanes[c].ring.publish();
                self.domain.wake(c);
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
        self.evict_pending(c);
        self.put(c, obj as usize | OP_QUERY, 2);
        self.lanes[c]
            .ring
            .write(&reply as *const AtomicUsize as usize);
        self.lanes[c].ring.publish();
        // Help: run a round ourselves rather than wait for the counting
        // thread to be scheduled and notice (it may share a busy core).  A
        // helper leaves dead objects to the counting thread.
        let counter = &self.domain.counters[c];
        let mut spins = 0u32;
        loop {
            // Acquire: pairs with the Release store in `answer`.
            let n = reply.load(Ordering::Acquire);
            if n != NO_REPLY {
                return n;
            }
            if counter.try_round(false).is_some() {
                if counter.has_deferred.load(Ordering::Relaxed) {
                    // Dead objects for the counting thread to free.
                    self.domain.wake(c);
                }
                continue;
            }
            // The counting thread is in a round that may have read our tail
            // before we published: make it run the next one at once.
            if spins == 0 {
                counter.poke.store(true, Ordering::Release);
            }
            spins += 1;
            if spins < 1 << 10 {
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
        self.retry();
        self.flush();
        // A non-blocking sender (counting thread) only ends with the process;
        // words still in its overflow lists are lost with it.
        for l in &self.lanes {
            // Release: pairs with the Acquire in `Counter::drain`.
            l.closed.store(true, Ordering::Release);
        }
    }
}
