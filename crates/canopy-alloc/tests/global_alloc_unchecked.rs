//! `CanopyUnchecked` as the Rust global allocator for a whole test binary:
//! the shared suite of `global_suite`, plus a program that reallocates
//! across classes (the invariant its unchecked `dealloc` relies on) and frees
//! on other threads.  Not a benchmark.

#[global_allocator]
static GLOBAL: canopy_alloc::CanopyUnchecked = canopy_alloc::CanopyUnchecked;

mod global_suite;

/// Vectors and strings grown and shrunk through every small class and into
/// medium and large sizes, on four threads, handed to the next thread to be
/// shrunk and dropped there: every byte checked, the heaps consistent.
#[test]
fn buffers_resized_across_classes_and_threads_keep_every_byte() {
    let rounds = 40 * global_suite::scale();
    let hs: Vec<_> = (0..4u8)
        .map(|t| {
            std::thread::spawn(move || {
                let mut out = Vec::new();
                for r in 0..rounds {
                    let mut v: Vec<u8> = Vec::new();
                    let target = 1 + (r * 7919 + t as usize * 104_729) % 300_000;
                    while v.len() < target {
                        v.push((v.len() % 251) as u8 ^ t);
                    }
                    v.truncate(target / 3 + 1);
                    v.shrink_to_fit();
                    let mut s = String::with_capacity(8);
                    for i in 0..(r % 200) {
                        s.push_str(&i.to_string());
                    }
                    s.shrink_to_fit();
                    out.push((v, s));
                }
                out
            })
        })
        .collect();
    let all: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    let checkers: Vec<_> = all
        .into_iter()
        .enumerate()
        .map(|(t, out)| {
            std::thread::spawn(move || {
                for (r, (mut v, s)) in out.into_iter().enumerate() {
                    assert!(v.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8 ^ t as u8), "round {r}");
                    let want: String = (0..(r % 200)).map(|i| i.to_string()).collect();
                    assert_eq!(s, want);
                    v.truncate(v.len() / 2 + 1);
                    v.shrink_to_fit();
                    assert!(v.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8 ^ t as u8));
                }
                canopy_alloc::check_invariants().unwrap();
            })
        })
        .collect();
    for h in checkers {
        h.join().unwrap();
    }
    canopy_alloc::check_invariants().unwrap();
}
