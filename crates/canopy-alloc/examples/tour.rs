//! A short tour of `canopy-alloc` from Rust:
//!
//! 1. Canopy under everything with one line (`#[global_allocator]`; or
//!    `CanopyUnchecked`, whose `dealloc` trusts the layout): a few threads
//!    build strings and vectors and hand them to each other, so some frees
//!    are remote frees (messages to the owning thread's heap).
//! 2. The rich interface: a size class computed at compile time, allocation
//!    and free by class, the unchecked free for code that vouches for its
//!    blocks, sized free, a descriptor allocated with its data.
//! 3. What a bad free does in the default mode: it is refused and reported,
//!    and nothing else is touched (also a second `dealloc` through
//!    `CanopyUnchecked`).
//! 4. The statistics table (also printed at exit with `CANOPY_VERBOSE=1`).
//!
//! Run with `cargo run --release -p canopy-alloc --example tour`.

use canopy_alloc::{Canopy, SizeClass};
use std::sync::mpsc;

#[global_allocator]
static GLOBAL: Canopy = Canopy;

/// The class of a 100-byte block, chosen by the compiler.
const CLASS_100: SizeClass = match SizeClass::of(100) {
    Some(c) => c,
    None => panic!("100 bytes has a size class"),
};

fn main() {
    // 1. Threads that allocate and pass their blocks on: the receiver frees
    //    what the sender allocated.
    let (tx, rx) = mpsc::channel::<Vec<String>>();
    let producers: Vec<_> = (0..3)
        .map(|t| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for round in 0..200 {
                    let batch: Vec<String> = (0..100).map(|i| format!("thread {t} round {round} item {i}")).collect();
                    tx.send(batch).unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    let consumer = std::thread::spawn(move || rx.iter().map(|b| b.iter().map(String::len).sum::<usize>()).sum::<usize>());
    for p in producers {
        p.join().unwrap();
    }
    let bytes = consumer.join().unwrap();
    println!("1. 60000 strings built on three threads and freed on a fourth: {bytes} bytes of text");

    // 2. The rich interface.
    let p = canopy_alloc::alloc_class(CLASS_100);
    assert!(!p.is_null());
    // SAFETY: the block has CLASS_100.size() >= 100 bytes.
    unsafe { p.write_bytes(7, 100) };
    // SAFETY: p came from alloc_class(CLASS_100) and is freed once.
    unsafe { canopy_alloc::free_class(p, CLASS_100) };
    // The unchecked free: the block goes onto this thread's list for its
    // class, and the next allocation of the class takes it back (outside
    // check mode; debug builds check, and take the lowest free slot).
    let r = canopy_alloc::alloc_class(CLASS_100);
    assert!(!r.is_null());
    // SAFETY: r came from alloc_class(CLASS_100), is freed once and not used after.
    unsafe { canopy_alloc::free_class_unchecked(r, CLASS_100) };
    let again = canopy_alloc::alloc_class(CLASS_100);
    let same = again == r;
    // SAFETY: as above.
    unsafe { canopy_alloc::free_class_unchecked(again, CLASS_100) };
    let q = canopy_alloc::alloc(300);
    // SAFETY: q is a live block of 300 bytes.
    unsafe { canopy_alloc::free_sized(q, 300) };
    let (desc, data) = canopy_alloc::alloc_with_descriptor(32, 4096, 64).expect("memory");
    assert_eq!(data as usize % 64, 0);
    // SAFETY: freeing the descriptor frees the data too.
    unsafe { canopy_alloc::free(desc) };
    println!(
        "2. rich interface: class {} holds {} bytes; a 32-byte descriptor and 4 KiB of data came from one block; \
         a block freed unchecked came back on the next allocation of its class: {same}",
        CLASS_100.index(),
        CLASS_100.size()
    );

    // 3. A double free in the default mode (CANOPY_CHECK=1, and debug builds,
    //    abort instead).
    if !canopy_alloc::options().check {
        let before = canopy_alloc::stats::snapshot().bad_frees;
        let r = canopy_alloc::alloc(48);
        // SAFETY: r is live; the second free is the mistake shown here, and
        // Canopy refuses it without touching memory.
        unsafe {
            canopy_alloc::free(r);
            canopy_alloc::free(r);
        }
        // The same through CanopyUnchecked's GlobalAlloc calls: its dealloc
        // trusts the layout, but a block already freed is still refused.
        let layout = std::alloc::Layout::new::<[u64; 6]>();
        // SAFETY: as above; the layout is non-zero and the block's own.
        unsafe {
            use std::alloc::GlobalAlloc;
            let u = canopy_alloc::CanopyUnchecked.alloc(layout);
            canopy_alloc::CanopyUnchecked.dealloc(u, layout);
            canopy_alloc::CanopyUnchecked.dealloc(u, layout);
        }
        let after = canopy_alloc::stats::snapshot().bad_frees;
        println!(
            "3. a double free and a double dealloc through CanopyUnchecked were refused and reported ({} reported so far)",
            after - before
        );
    } else {
        println!("3. (check mode is on: a double free would abort with a message, so it is not shown)");
    }

    // 4. Statistics.  The producers exited while the consumer was still
    //    freeing their strings: those frees sit in the inboxes of the heaps
    //    the producers left behind, until a thread adopts one of them, the
    //    global heap is asked for a page, or `collect` takes them in.
    let held = canopy_alloc::stats::snapshot().in_use_bytes;
    canopy_alloc::collect();
    let s = canopy_alloc::stats::snapshot();
    println!(
        "4. bytes in use: {held} before collect() (frees waiting in exited threads' heaps), {} after; statistics:",
        s.in_use_bytes
    );
    canopy_alloc::stats::write_table(&s, &mut |b| print!("{}", String::from_utf8_lossy(b)));
}
