//! Delegated asynchronous reference counting (paper 003 §4) as a runtime:
//! the counting threads, and one sender per mutator thread.
//!
//! - Counting threads start on the first use of a [`Delegated`] array; their
//!   number is fixed then: [`set_counting_threads`] before first use, else
//!   `CANOPY_RC_COUNTERS` (1 to 1024; another value, or another
//!   `CANOPY_RC_` name, is reported on stderr),
//!   else 1.  An object's counting thread is a fixed
//!   function of its address.
//! - `clone` makes the object the calling thread's *pending increment* for
//!   that counting thread (a plain store to a word the counting thread can
//!   read); a `drop` of the same object cancels it; the next `clone` of
//!   another object sends it (one word in the thread's lane, published).
//!   Other decrements append a one-word message to the lane, published in
//!   batches of up to 256 words (no atomic read-modify-write, no waiting).
//!   A lane holds 16 Ki words; a full lane makes the mutator wait
//!   (back-pressure).
//! - [`flush`] sends the calling thread's pending increments and publishes
//!   its decrements; with-loops flush every worker at their end, and a
//!   thread flushes when it ends.  Until then they are pending (an object
//!   can outlive its last reference by that long).
//! - `getrc` sends the pending increment, publishes a query, and runs the
//!   counting round itself if no one else is running one (else waits).
//! - A counting thread spins while work arrives, then yields, then parks;
//!   a sender wakes a parked one.
//!
//! The protocol itself is in `delegate.rs` and modelled in `tests/loom.rs`.
//!
//! Restriction: code that runs on a counting thread (the `Drop` of an
//! element type, when the counting thread frees an array) may drop delegated
//! arrays but must not clone them or ask `getrc` (debug builds assert this;
//! a `getrc` there would wait for itself).
//!
//! [`Delegated`]: crate::Delegated

use std::cell::Cell;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use canopy_sync::prim::{fence, AtomicUsize, Ordering};

use crate::delegate::{DCount, Domain, Sender, TraceSample};

static REQUESTED: AtomicUsize = AtomicUsize::new(0);
static DOMAIN: OnceLock<Arc<Domain>> = OnceLock::new();
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// The counting threads have already started with this many threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlreadyStarted(pub usize);

impl core::fmt::Display for AlreadyStarted {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "delegated counting already started with {} counting thread(s)",
            self.0
        )
    }
}

impl std::error::Error for AlreadyStarted {}

/// Choose the number of counting threads (at least 1).  Only before the
/// first delegated array exists; afterwards the mapping of objects to
/// counting threads is fixed and this returns an error.
pub fn set_counting_threads(n: usize) -> Result<(), AlreadyStarted> {
    if let Some(d) = DOMAIN.get() {
        return if d.counters.len() == n.max(1) {
            Ok(())
        } else {
            Err(AlreadyStarted(d.counters.len()))
        };
    }
    REQUESTED.store(n.max(1), Ordering::Relaxed);
    match DOMAIN.get() {
        Some(d) if d.counters.len() != n.max(1) => Err(AlreadyStarted(d.counters.len())),
        _ => Ok(()),
    }
}

/// The number of counting threads (starting them if needed).
pub fn counting_threads() -> usize {
    domain().counters.len()
}

fn domain() -> &'static Arc<Domain> {
    DOMAIN.get_or_init(|| {
        let mut n = REQUESTED.load(Ordering::Relaxed);
        if n == 0 {
            n = counters_from(std::env::var("CANOPY_RC_COUNTERS").ok().as_deref(), |m| eprintln!("{m}"));
        }
        for (name, _) in std::env::vars_os() {
            if let Some(msg) = unknown_name(name.as_encoded_bytes()) {
                eprintln!("{msg}");
            }
        }
        let d = Arc::new(Domain::new(n.max(1)));
        EPOCH.get_or_init(Instant::now);
        for i in 0..d.counters.len() {
            let dd = d.clone();
            let h = std::thread::Builder::new()
                .name(format!("canopy-rc-count-{i}"))
                .spawn(move || counting_thread(dd, i))
                .expect("canopy-rc: cannot start a counting thread");
            d.set_waker(i, h.thread().clone());
        }
        d
    })
}

/// The number of counting threads `CANOPY_RC_COUNTERS` asks for: 1 when
/// unset; a value that is not a whole number from 1 to 1024 is reported
/// through `warn` and 1 is used.
fn counters_from(v: Option<&str>, warn: impl FnOnce(&str)) -> usize {
    let Some(raw) = v else {
        return 1;
    };
    match raw.trim().parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => n,
        _ => {
            warn(&format!(
                "canopy-rc: CANOPY_RC_COUNTERS=\"{raw}\" is not a whole number from 1 to 1024; using 1"
            ));
            1
        }
    }
}

/// Every `CANOPY_RC_` variable: the option, and the switch of the loom
/// models' deep setting.
const NAMES: [&str; 2] = ["CANOPY_RC_COUNTERS", "CANOPY_RC_LOOM_DEEP"];

/// The report for a variable `name` in the `CANOPY_RC_` namespace that is
/// none of [`NAMES`] (with the name it probably meant, if one is close);
/// `None` for any other name.
fn unknown_name(name: &[u8]) -> Option<String> {
    let meant = canopy_alloc::options::unknown_in_namespace(name, "CANOPY_RC_", &NAMES)?;
    let text = String::from_utf8_lossy(name);
    Some(match meant {
        Some(meant) => format!("canopy-rc: {text} is not an option and is ignored; did you mean {meant}?"),
        None => format!("canopy-rc: {text} is not an option and is ignored (the option: CANOPY_RC_COUNTERS)"),
    })
}

thread_local! {
    /// This thread's sender, owned by `SENDER_GUARD` (null until first use
    /// and after the thread's teardown began).  A const TLS slot with no
    /// destructor: the fast path is one load.
    static SENDER: Cell<*mut Sender> = const { Cell::new(core::ptr::null_mut()) };
    /// Owns the sender; dropping it (thread exit) publishes and closes lanes.
    static SENDER_GUARD: SenderGuard = const { SenderGuard(Cell::new(core::ptr::null_mut())) };
    /// With one counting thread: the pending-increment word of this thread's
    /// only lane (null before the sender exists, after its teardown began,
    /// and with several counting threads).  Lets `clone` and `drop` skip the
    /// chain of loads to the lane (sender, domain, lanes, lane).
    static PENDING: Cell<*const AtomicUsize> = const { Cell::new(core::ptr::null()) };
}

/// `clone` of a delegated array: make `c` this thread's pending increment
/// (fast path: no pending increment yet), else [`Sender::inc`].
#[inline(always)]
pub(crate) fn inc(c: *const DCount) {
    let p = PENDING.try_with(|s| s.get()).unwrap_or(core::ptr::null());
    if !p.is_null() {
        // SAFETY: p is the pending word of this thread's sender's lane, alive
        // while PENDING holds it (SenderGuard clears PENDING before dropping
        // the sender); only this thread writes it.  Same loads and stores as
        // `Sender::inc` without an eviction: Relaxed load of our own word,
        // Release store.
        let slot = unsafe { &*p };
        if slot.load(Ordering::Relaxed) == 0 {
            slot.store(c as usize, Ordering::Release);
            return;
        }
    }
    inc_slow(c);
}

/// Out of line, so that the fast path needs no stack frame.
#[cold]
#[inline(never)]
fn inc_slow(c: *const DCount) {
    with_sender(|s| s.inc(c));
}

/// Out of line, as `inc_slow`.
#[cold]
#[inline(never)]
fn dec_slow(c: *const DCount) {
    with_sender(|s| s.dec(c));
}

/// `drop` of a delegated array: cancel this thread's pending increment if it
/// is of `c` (fast path), else [`Sender::dec`].
#[inline(always)]
pub(crate) fn dec(c: *const DCount) {
    let p = PENDING.try_with(|s| s.get()).unwrap_or(core::ptr::null());
    if !p.is_null() {
        // SAFETY: as in `inc`; same as `Sender::dec`'s cancelling path.
        let slot = unsafe { &*p };
        if slot.load(Ordering::Relaxed) == c as usize {
            slot.store(0, Ordering::Release);
            return;
        }
    }
    dec_slow(c);
}

struct SenderGuard(Cell<*mut Sender>);

impl Drop for SenderGuard {
    fn drop(&mut self) {
        let p = self.0.replace(core::ptr::null_mut());
        let _ = PENDING.try_with(|s| s.set(core::ptr::null()));
        let _ = SENDER.try_with(|s| s.set(core::ptr::null_mut()));
        if !p.is_null() {
            // SAFETY: p came from Box::into_raw in `install_sender` and is
            // dropped once, here; SENDER no longer points to it.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

/// Create this thread's sender (`blocking`: a mutator) and register it for
/// teardown; null when the thread is already tearing down.
#[cold]
fn install_sender(blocking: bool) -> *mut Sender {
    let p = Box::into_raw(Box::new(Sender::new(domain().clone(), blocking)));
    let ok = SENDER_GUARD.try_with(|g| g.0.set(p)).is_ok() && SENDER.try_with(|s| s.set(p)).is_ok();
    if ok {
        // SAFETY: p was just created and is alive; read only.
        let one_lane = blocking && unsafe { (*p).lane_count() } == 1;
        if one_lane {
            // SAFETY: as above.
            let slot = unsafe { (*p).pending_slot(0) };
            let _ = PENDING.try_with(|s| s.set(slot));
        }
        p
    } else {
        let _ = SENDER_GUARD.try_with(|g| g.0.set(core::ptr::null_mut()));
        // SAFETY: not registered anywhere; dropped once.
        drop(unsafe { Box::from_raw(p) });
        core::ptr::null_mut()
    }
}

/// Run `f` on this thread's sender (created on first use).  During thread
/// teardown, on a temporary sender that is flushed at once.
#[inline(always)]
pub(crate) fn with_sender<R>(f: impl FnOnce(&mut Sender) -> R) -> R {
    let mut p = SENDER
        .try_with(|s| s.get())
        .unwrap_or(core::ptr::null_mut());
    if p.is_null() {
        p = install_sender(true);
    }
    if p.is_null() {
        let mut s = Sender::new(domain().clone(), true);
        let r = f(&mut s);
        drop(s); // publishes and closes its lanes
        return r;
    }
    // SAFETY: p is this thread's sender, alive until SenderGuard drops it
    // (which nulls SENDER first).  No `&mut` to it is live: the sender's
    // methods never run user code, so `with_sender` is never re-entered
    // while `f` runs.
    f(unsafe { &mut *p })
}

/// The calling thread's sender, if it has one (no creation).
fn existing_sender() -> Option<&'static mut Sender> {
    let p = SENDER.try_with(|s| s.get()).ok()?;
    // SAFETY: as in `with_sender`; the reference is used immediately by the
    // caller and not kept.
    (!p.is_null()).then(|| unsafe { &mut *p })
}

/// Ship the calling thread's pending count operations to the counting
/// threads (they are applied soon after, without waiting here).
pub fn flush() {
    if DOMAIN.get().is_none() {
        return;
    }
    if let Some(s) = existing_sender() {
        s.flush();
    }
}

/// [`flush`] on every thread of the current rayon pool and on the caller.
pub(crate) fn flush_all_workers() {
    if DOMAIN.get().is_none() {
        return;
    }
    rayon::broadcast(|_| flush());
    flush();
}

/// Count operations published to the counting threads and not yet applied
/// when their last round began (unpublished decrements are not included).
pub fn pending() -> u64 {
    DOMAIN
        .get()
        .map_or(0, |d| d.counters.iter().map(|c| c.backlog()).sum())
}

/// Count operations applied by the counting threads so far.
pub fn applied() -> u64 {
    DOMAIN.get().map_or(0, |d| {
        d.counters
            .iter()
            .map(|c| c.applied.load(Ordering::Acquire))
            .sum()
    })
}

/// Objects freed by the counting threads so far.
pub fn released() -> u64 {
    DOMAIN.get().map_or(0, |d| {
        d.counters
            .iter()
            .map(|c| c.released.load(Ordering::Relaxed))
            .sum()
    })
}

/// Start recording, on each counting thread, the number of pending
/// operations over time (clears earlier samples).
pub fn trace_start() {
    let d = domain();
    for c in &d.counters {
        c.trace.lock().unwrap_or_else(|p| p.into_inner()).clear();
        c.tracing.store(true, Ordering::Release);
    }
}

/// Stop recording and take the samples: per counting thread, (nanoseconds
/// since the counting threads started, pending operations).
pub fn trace_take() -> Vec<Vec<TraceSample>> {
    let Some(d) = DOMAIN.get() else {
        return Vec::new();
    };
    d.counters
        .iter()
        .map(|c| {
            c.tracing.store(false, Ordering::Release);
            core::mem::take(&mut *c.trace.lock().unwrap_or_else(|p| p.into_inner()))
        })
        .collect()
}

/// Nanoseconds since the counting threads started (the trace's clock).
pub fn trace_clock() -> u64 {
    EPOCH.get().map_or(0, |e| e.elapsed().as_nanos() as u64)
}

const TRACE_MAX: usize = 1 << 20;
/// Pause between rounds (a lane holds 16 Ki words, far more than a
/// mutator issues in this time).
const PAUSE: Duration = Duration::from_micros(2);

fn counting_thread(d: Arc<Domain>, i: usize) {
    // This thread sends too (dropping objects whose elements are delegated
    // arrays), but must never wait for a mutator: a non-blocking sender.
    let _ = install_sender(false);
    let c = d.counters[i].clone();
    let epoch = *EPOCH.get_or_init(Instant::now);
    let mut idle: u32 = 0;
    let mut last_sample = 0u64;
    loop {
        // Cleared before the round: a query published after the round read
        // its lane sets it again and cuts the next pause short.
        c.poke.store(false, Ordering::Relaxed);
        // A helping asker may be running a round: then skip this one.
        let n = c.try_round(true).unwrap_or(1);
        if n > 0 {
            idle = 0;
        }
        if c.tracing.load(Ordering::Relaxed) {
            let t = epoch.elapsed().as_nanos() as u64;
            if t >= last_sample + 1_000 || n == 0 && idle == 1 {
                last_sample = t;
                let mut tr = c.trace.lock().unwrap_or_else(|p| p.into_inner());
                if tr.len() < TRACE_MAX {
                    tr.push((t, c.backlog()));
                }
            }
        }
        if let Some(s) = existing_sender() {
            s.retry();
            s.flush();
        }
        // Pause between rounds so mutators' lane stores rarely meet our
        // reads (each meeting costs the mutator a cache-line transfer); a
        // query cuts the pause short.
        let until = Instant::now() + PAUSE;
        // Yielding, not spinning: on a machine with more runnable threads
        // than cores the mutators get the core meanwhile.
        while Instant::now() < until && !c.poke.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        if n > 0 {
            continue;
        }
        idle += 1;
        if idle < 2_000 {
            // (the pause above is the spin)
        } else if idle < 2_200 {
            std::thread::yield_now();
        } else {
            // SeqCst store + fence: pairs with the fence in `Domain::wake`.
            c.sleeping.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if !c.has_work() {
                std::thread::park_timeout(Duration::from_millis(20));
            }
            c.sleeping.store(false, Ordering::SeqCst);
            idle = 1_900;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{counters_from, unknown_name};

    #[test]
    fn unknown_names_in_the_namespace_are_reported() {
        assert_eq!(
            unknown_name(b"CANOPY_RC_COUNTER").as_deref(),
            Some("canopy-rc: CANOPY_RC_COUNTER is not an option and is ignored; did you mean CANOPY_RC_COUNTERS?")
        );
        assert_eq!(
            unknown_name(b"CANOPY_RC_THREADS").as_deref(),
            Some("canopy-rc: CANOPY_RC_THREADS is not an option and is ignored (the option: CANOPY_RC_COUNTERS)")
        );
        for ok in ["CANOPY_RC_COUNTERS", "CANOPY_RC_LOOM_DEEP", "CANOPY_CHECK", "HOME"] {
            assert_eq!(unknown_name(ok.as_bytes()), None, "{ok}");
        }
    }

    #[test]
    fn counting_threads_from_the_environment() {
        let mut warned = Vec::new();
        assert_eq!(counters_from(None, |m| warned.push(m.to_string())), 1);
        assert_eq!(counters_from(Some(" 3 "), |m| warned.push(m.to_string())), 3);
        assert!(warned.is_empty(), "{warned:?}");
        assert_eq!(counters_from(Some("two"), |m| warned.push(m.to_string())), 1);
        assert_eq!(counters_from(Some("0"), |m| warned.push(m.to_string())), 1);
        assert_eq!(
            warned,
            [
                "canopy-rc: CANOPY_RC_COUNTERS=\"two\" is not a whole number from 1 to 1024; using 1",
                "canopy-rc: CANOPY_RC_COUNTERS=\"0\" is not a whole number from 1 to 1024; using 1",
            ]
        );
    }
}
