//! Chunks: the blocks a task heap bumps through.
//!
//! A chunk is `chunk_bytes` long and aligned to its size, taken from
//! `canopy-alloc`; an object larger than a quarter chunk gets a chunk of its
//! own (as long as the object, same alignment), so an object's chunk is
//! always found by masking its address. The chunk header holds the heap record
//! the chunk was allocated for; merged heaps are found from it by union-find
//! (see `heap.rs`).

use crate::heap::HeapRecord;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// Bytes reserved at the start of a chunk for its header.
pub(crate) const HEADER_BYTES: usize = 64;
const MAGIC: usize = 0x6361_6e6f_7079_6868; // "canopyhh"

#[repr(C)]
pub(crate) struct Chunk {
    /// `MAGIC ^ address` while the chunk is live, 0 once freed.
    magic: AtomicUsize,
    /// The heap record this chunk was allocated for.
    pub(crate) heap: AtomicPtr<HeapRecord>,
    /// Next chunk of the same heap.
    pub(crate) next: *mut Chunk,
    /// One past the last byte of the chunk.
    pub(crate) end: usize,
    /// One past the last allocated byte (kept up to date when the chunk stops
    /// being the bump chunk, and by the collector).
    pub(crate) top: usize,
    /// Id of the collection this chunk is from-space of (0: none).  Atomic
    /// (relaxed): a collection can read the id of a sibling's chunk, through
    /// a remembered field the sibling overwrote, while the sibling's own
    /// collection writes it; the reader only needs to see an id that is not
    /// its own collection's.
    pub(crate) gc_id: AtomicU64,
    /// The chunk holds one large object.
    pub(crate) large: bool,
}

const _: () = assert!(std::mem::size_of::<Chunk>() <= HEADER_BYTES);

static MASK: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn init_mask() {
    MASK.store(!(crate::config::config().chunk_bytes - 1), Ordering::Relaxed);
}

#[inline]
pub(crate) fn mask() -> usize {
    let m = MASK.load(Ordering::Relaxed);
    if m != 0 {
        m
    } else {
        init_mask();
        MASK.load(Ordering::Relaxed)
    }
}

/// The chunk of the object at `addr` (an object start).
#[inline]
pub(crate) fn chunk_of(addr: u64) -> *mut Chunk {
    (addr as usize & mask()) as *mut Chunk
}

impl Chunk {
    /// First object address of the chunk.
    #[inline]
    pub(crate) fn start(c: *mut Chunk) -> usize {
        c as usize + HEADER_BYTES
    }

    /// Is this a live chunk (magic intact)? Used by checks that may see a
    /// pointer into reclaimed memory; chunks are carved from `canopy-alloc`'s
    /// arena, which stays mapped, so the read itself is safe.
    pub(crate) fn is_live(c: *mut Chunk) -> bool {
        // SAFETY: see above: the caller passes the mask of an address that the
        // program obtained from a managed value; the arena stays mapped.
        unsafe { (*c).magic.load(Ordering::Acquire) == MAGIC ^ c as usize }
    }
}

/// Free standard-size chunks kept for reuse, so a collection's from-space
/// becomes the next chunks without a trip through the OS (page faults and
/// zeroing). A thread keeps up to `LOCAL_KEEP` chunks; beyond that they go to
/// a shared pool of up to `SHARED_KEEP`, and beyond that back to canopy-alloc.
const LOCAL_KEEP: usize = 64;
const SHARED_KEEP: usize = 256;
static SHARED: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
/// A thread's chunks; at thread exit they go to the shared pool or back to
/// canopy-alloc, so short-lived threads leak nothing.
struct LocalPool(Vec<usize>);

impl Drop for LocalPool {
    fn drop(&mut self) {
        let mut g = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        for c in self.0.drain(..) {
            if g.len() < SHARED_KEEP {
                g.push(c);
            } else {
                // SAFETY: pooled chunks came from canopy_alloc::alloc_aligned
                // and nothing refers to them.
                unsafe { canopy_alloc::free(c as *mut u8) };
            }
        }
    }
}

impl std::ops::Deref for LocalPool {
    type Target = Vec<usize>;
    fn deref(&self) -> &Vec<usize> {
        &self.0
    }
}

impl std::ops::DerefMut for LocalPool {
    fn deref_mut(&mut self) -> &mut Vec<usize> {
        &mut self.0
    }
}

thread_local! {
    static LOCAL: std::cell::RefCell<LocalPool> = const { std::cell::RefCell::new(LocalPool(Vec::new())) };
}

fn take_pooled() -> Option<usize> {
    if let Some(c) = LOCAL.try_with(|l| l.borrow_mut().pop()).ok().flatten() {
        return Some(c);
    }
    let mut g = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    let c = g.pop()?;
    // Take a few more for this thread while the lock is held.
    let n = g.len().min(LOCAL_KEEP / 4);
    let from = g.len() - n;
    let more: Vec<usize> = g.drain(from..).collect();
    drop(g);
    let _ = LOCAL.try_with(|l| l.borrow_mut().extend(more));
    Some(c)
}

/// Keep a freed standard chunk; false if the pools are full.
fn keep_pooled(c: usize) -> bool {
    let kept = LOCAL
        .try_with(|l| {
            let mut l = l.borrow_mut();
            if l.len() < LOCAL_KEEP {
                l.push(c);
                true
            } else {
                false
            }
        })
        .unwrap_or(false);
    if kept {
        return true;
    }
    let mut g = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if g.len() < SHARED_KEEP {
        g.push(c);
        true
    } else {
        false
    }
}

/// Allocate a chunk for `heap` with room for `words` words of objects.
/// Returns the chunk and whether it is a large chunk.
pub(crate) fn new_chunk(heap: *mut HeapRecord, words: usize, large: bool) -> *mut Chunk {
    let size = crate::config::config().chunk_bytes;
    let need = HEADER_BYTES + words * 8;
    // A large chunk asks for what its object needs: canopy-alloc gives whole
    // 64 KiB units, and keeps the pages past `need` out of memory (it trims
    // the tail of a reused span), so a 20 KiB object costs about 20 KiB.
    let bytes = if large { need } else { size };
    let pooled = if large { None } else { take_pooled() };
    let p = pooled.unwrap_or_else(|| canopy_alloc::alloc_aligned(bytes, size) as usize) as *mut Chunk;
    if p.is_null() {
        panic!("canopy-hh: out of memory: could not get a {bytes}-byte chunk from canopy-alloc");
    }
    // SAFETY: p is a fresh, aligned block of `bytes` >= HEADER_BYTES bytes.
    unsafe {
        ptr::write(
            p,
            Chunk {
                magic: AtomicUsize::new(MAGIC ^ p as usize),
                heap: AtomicPtr::new(heap),
                next: ptr::null_mut(),
                end: p as usize + bytes,
                top: p as usize + HEADER_BYTES,
                gc_id: AtomicU64::new(0),
                large,
            },
        );
        HeapRecord::add_ref(heap);
    }
    p
}

/// Free a chunk and drop its reference to its heap record.
///
/// # Safety
/// `c` is a live chunk no longer on any list, and nothing will use objects in it.
pub(crate) unsafe fn free_chunk(c: *mut Chunk) {
    // SAFETY: c is live (caller).
    let heap = unsafe { (*c).heap.load(Ordering::Relaxed) };
    // SAFETY: as above.
    let large = unsafe { (*c).large };
    // SAFETY: as above.
    unsafe { (*c).magic.store(0, Ordering::Release) };
    if large || !keep_pooled(c as usize) {
        // SAFETY: c came from canopy_alloc::alloc_aligned.
        unsafe { canopy_alloc::free(c as *mut u8) };
    }
    // SAFETY: the chunk held one reference.
    unsafe { HeapRecord::unref(heap) };
}

/// Bytes of a chunk (header included).
#[inline]
pub(crate) fn chunk_bytes(c: *mut Chunk) -> usize {
    // SAFETY: c is live (callers walk their own lists).
    unsafe { (*c).end - c as usize }
}
