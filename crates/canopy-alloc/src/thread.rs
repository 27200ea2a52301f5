//! Thread lifecycle: how a thread finds its heap, and what happens at start
//! (lazy), exit (abandon), and `fork()`.
//!
//! The heap pointer lives in an `initial-exec` thread-local (x86-64 Linux): two
//! instructions, no `__tls_get_addr` call, even inside `libcanopy_malloc.so`.
//! Stable Rust cannot choose the TLS model of `thread_local!`, so the slot is
//! declared in assembly.  It starts out pointing at `EMPTY_HEAP`, whose slabs
//! are all empty, so a thread's first allocation falls into the slow path,
//! which gives the thread a heap: an abandoned one if there is one (adoption),
//! else a new one.
//!
//! Exit: a `pthread_key_t` destructor abandons the heap.  Allocation from later
//! thread-local destructors is fine: it re-acquires a heap and re-arms the key.
//!
//! `fork()`: handlers take the global lock in `prepare` and release it in the
//! parent; in the child, heaps of threads that no longer exist are marked dead
//! (their memory is never reused; the child usually calls `exec`).

use crate::heap::{empty_heap, Heap};
use crate::{global, solo};
use canopy_sync::prim::{AtomicU8, AtomicUsize, Ordering};
use canopy_sync::RawLock;
use core::ptr;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
core::arch::global_asm!(
    ".pushsection .tdata.canopy_tls_heap,\"awT\",@progbits",
    ".p2align 3",
    ".globl canopy_tls_heap_v1",
    ".hidden canopy_tls_heap_v1",
    ".type canopy_tls_heap_v1,@object",
    ".size canopy_tls_heap_v1, 8",
    "canopy_tls_heap_v1:",
    ".quad {empty}",
    ".popsection",
    empty = sym crate::heap::EMPTY_HEAP,
);

/// This thread's heap (`EMPTY_HEAP` until its first allocation).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
pub(crate) fn tls_heap() -> *mut Heap {
    let h: *mut Heap;
    // SAFETY: reads this thread's slot through its initial-exec TP offset;
    // the GOT entry is filled by the dynamic linker before any code runs.
    unsafe {
        core::arch::asm!(
            "mov {h}, qword ptr [rip + canopy_tls_heap_v1@GOTTPOFF]",
            "mov {h}, qword ptr fs:[{h}]",
            h = out(reg) h,
            options(nostack, readonly, preserves_flags, pure),
        );
    }
    h
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) fn set_tls_heap(heap: *mut Heap) {
    // SAFETY: writes this thread's slot (see tls_heap).
    unsafe {
        core::arch::asm!(
            "mov {t}, qword ptr [rip + canopy_tls_heap_v1@GOTTPOFF]",
            "mov qword ptr fs:[{t}], {h}",
            t = out(reg) _,
            h = in(reg) heap,
            options(nostack, preserves_flags),
        );
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
std::thread_local! {
    static TLS_HEAP: core::cell::Cell<*mut Heap> = const { core::cell::Cell::new(&crate::heap::EMPTY_HEAP.0 as *const Heap as *mut Heap) };
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
#[inline(always)]
pub(crate) fn tls_heap() -> *mut Heap {
    TLS_HEAP.with(|c| c.get())
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
pub(crate) fn set_tls_heap(heap: *mut Heap) {
    TLS_HEAP.with(|c| c.set(heap))
}

/// Heaps owned by live threads.
pub(crate) static LIVE_HEAPS: AtomicUsize = AtomicUsize::new(0);

const UNINIT: u8 = 0;
const READY: u8 = 2;
const FAILED: u8 = 3;
static INIT: AtomicU8 = AtomicU8::new(UNINIT);
static INIT_LOCK: RawLock = RawLock::new();
static HOOKS: AtomicU8 = AtomicU8::new(0);
static mut KEY: libc::pthread_key_t = 0;

/// Start the allocator if needed.  Returns false if the address space could
/// not be reserved.
#[inline]
pub(crate) fn ensure_init() -> bool {
    match INIT.load(Ordering::Acquire) {
        READY => true,
        FAILED => false,
        _ => init_slow(),
    }
}

#[cold]
fn init_slow() -> bool {
    INIT_LOCK.lock();
    if INIT.load(Ordering::Acquire) == UNINIT {
        let opts = crate::options::Options::from_env();
        let ok = crate::arena::init_arena(opts.arena_gb, opts.arena_grow, opts.huge_pages)
            && crate::meta::init()
            && (!opts.check || crate::check::init());
        if ok {
            crate::arena::init_free_key();
            crate::set_options(opts);
            // The thread that starts the allocator is the solo thread until
            // another thread enters the global heap.
            solo::init(opts.solo_unlocked, canopy_sys::thread_id());
            // SAFETY: KEY is written once here, before READY is published;
            // pthread_key_create does not allocate.
            unsafe {
                libc::pthread_key_create(ptr::addr_of_mut!(KEY), Some(thread_exit));
            }
            INIT.store(READY, Ordering::Release);
        } else {
            INIT.store(FAILED, Ordering::Release);
            canopy_sys::write_stderr(b"canopy: could not reserve address space for the heap; allocations will fail with ENOMEM\n");
        }
    }
    INIT_LOCK.unlock();
    let ready = INIT.load(Ordering::Acquire) == READY;
    if ready && HOOKS.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
        // These may allocate (through us): the allocator is ready by now.
        // SAFETY: the handlers are extern "C" functions valid for the process.
        unsafe {
            libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
            if crate::options().verbose {
                libc::atexit(print_stats_at_exit);
            }
        }
    }
    ready
}

extern "C" fn print_stats_at_exit() {
    let s = crate::stats::snapshot();
    crate::stats::write_table(&s, &mut |b| canopy_sys::write_stderr(b));
}

/// Whether the calling thread has a heap of its own.
pub(crate) fn has_live_heap() -> bool {
    tls_heap() != empty_heap()
}

/// Give the calling thread a heap (slow path of its first allocation).
/// Returns null if the allocator cannot start or is out of metadata.
#[cold]
pub(crate) fn acquire_heap() -> *mut Heap {
    if !ensure_init() {
        return ptr::null_mut();
    }
    let tid = canopy_sys::thread_id();
    let locked = solo::lock();
    // SAFETY: we hold the global lock.
    let (heap, adopted) = unsafe {
        let g = global::state();
        if !g.abandoned.is_null() {
            let h = g.abandoned;
            g.abandoned = (*h).next_abandoned;
            (*h).next_abandoned = ptr::null_mut();
            g.stats.heaps_adopted += 1;
            crate::heap::ABANDONED.fetch_sub(1, Ordering::Relaxed);
            (h, true)
        } else {
            let h = crate::meta::alloc_heap();
            if !h.is_null() {
                Heap::init_at(h, g.stats.heaps_created as usize);
                (*h).next_all = g.heaps;
                g.heaps = h;
                g.stats.heaps_created += 1;
            }
            (h, false)
        }
    };
    solo::unlock(locked);
    if heap.is_null() {
        return heap;
    }
    // SAFETY: the heap is ours now.
    unsafe {
        if adopted {
            (*heap).adopt(tid);
        } else {
            (*heap).tid = tid;
        }
    }
    // Set the slot before anything that may allocate.
    set_tls_heap(heap);
    LIVE_HEAPS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: KEY was created before READY; setspecific for a low key does not
    // allocate, and if it did, the allocation would find our heap in the slot.
    unsafe { libc::pthread_setspecific(KEY, heap as *const libc::c_void) };
    heap
}

/// The key destructor: the thread is exiting.
extern "C" fn thread_exit(arg: *mut libc::c_void) {
    let heap = arg as *mut Heap;
    if heap.is_null() || heap == empty_heap() {
        return;
    }
    if tls_heap() == heap {
        set_tls_heap(empty_heap());
    }
    // SAFETY: the exiting thread owns its heap.
    unsafe { (*heap).abandon() };
    // SAFETY: as above.
    if unsafe { (*heap).inbox_broken } {
        // Retired, not abandoned: its inbox cannot be trusted (see
        // Heap::inbox_broken), so no thread adopts it.
        LIVE_HEAPS.fetch_sub(1, Ordering::Relaxed);
        return;
    }
    let locked = solo::lock();
    // SAFETY: global lock held.
    unsafe {
        let g = global::state();
        (*heap).next_abandoned = g.abandoned;
        g.abandoned = heap;
        g.stats.heaps_abandoned += 1;
        crate::heap::ABANDONED.fetch_add(1, Ordering::Relaxed);
    }
    solo::unlock(locked);
    LIVE_HEAPS.fetch_sub(1, Ordering::Relaxed);
}

/// `fork()` handlers of a layer above the allocator (see
/// [`crate::set_fork_hooks`]).
pub struct ForkHooks {
    /// Runs before the allocator's locks are taken.
    pub prepare: extern "C" fn(),
    /// Runs in the parent after the allocator's locks are released.
    pub parent: extern "C" fn(),
    /// Runs in the child after the allocator is reset.
    pub child: extern "C" fn(),
}

/// The hooks, or null.  Set by one atomic store (no "being set" state a
/// fork could catch half way).
static FORK_HOOKS: core::sync::atomic::AtomicPtr<ForkHooks> = core::sync::atomic::AtomicPtr::new(ptr::null_mut());

pub(crate) fn set_fork_hooks(h: &'static ForkHooks) {
    FORK_HOOKS.store(h as *const ForkHooks as *mut ForkHooks, core::sync::atomic::Ordering::Release);
}

fn fork_hooks() -> Option<&'static ForkHooks> {
    // SAFETY: the pointer is null or came from a `&'static ForkHooks`.
    unsafe { FORK_HOOKS.load(core::sync::atomic::Ordering::Acquire).as_ref() }
}

extern "C" fn fork_prepare() {
    // The layer's locks first: its calls allocate, so its lock is taken
    // before the allocator's (the same order as in those calls).
    if let Some(h) = fork_hooks() {
        (h.prepare)();
    }
    solo::lock_for_fork();
}

extern "C" fn fork_parent() {
    solo::unlock_after_fork_parent();
    if let Some(h) = fork_hooks() {
        (h.parent)();
    }
}

extern "C" fn fork_child() {
    // SAFETY: the child has one thread, and we hold the global lock.
    unsafe {
        let me = tls_heap();
        let g = global::state();
        let mut h = g.heaps;
        while !h.is_null() {
            if h != me && (*h).tid != 0 && (*h).tid != crate::heap::DEAD_TID {
                // Its thread does not exist here; its state may be mid-update.
                (*h).tid = crate::heap::DEAD_TID;
            }
            h = (*h).next_all;
        }
    }
    // The heaps of the threads that did not come along are dead: only this
    // thread's can be live (the statistics, and solo periods, which begin
    // only when one heap is live).
    LIVE_HEAPS.store(usize::from(has_live_heap()), Ordering::Relaxed);
    solo::unlock_after_fork_child();
    if let Some(h) = fork_hooks() {
        (h.child)();
    }
}
