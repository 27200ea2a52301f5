//! Build a binary tree in parallel (each subtree in its own task's heap,
//! spliced into the parent's at the join), sum it in parallel, and print the
//! collector's counters.
//!
//! ```text
//! cargo run --release -p canopy-hh --example tree [depth]
//! ```

use canopy_hh::{run_with_stats, Gc, Scope, Val};

/// A tree node is an immutable tuple (value, left, right); leaves have 0s.
fn build<'s>(s: &mut Scope<'s>, depth: u32, v: i64) -> Gc<'s> {
    if depth == 0 {
        return s.tuple(&[Val::Int(v), Val::Int(0), Val::Int(0)]);
    }
    if depth < 10 {
        // Sequential below the cutoff: no fork, same heap.
        let l = build(s, depth - 1, 2 * v);
        let r = build(s, depth - 1, 2 * v + 1);
        return s.tuple(&[Val::Int(v), Val::Obj(l), Val::Obj(r)]);
    }
    let (l, r) = s.par_gc(|s| build(s, depth - 1, 2 * v), |s| build(s, depth - 1, 2 * v + 1));
    s.tuple(&[Val::Int(v), Val::Obj(l), Val::Obj(r)])
}

fn sum(s: &mut Scope<'_>, t: Gc<'_>, depth: u32) -> i64 {
    let v = s.get_int(t, 0);
    if depth == 0 {
        return v;
    }
    // Reading immutable fields needs no barrier; each child gets its own scope.
    let (l, r) = (s.get(t, 1).as_obj().unwrap(), s.get(t, 2).as_obj().unwrap());
    if depth < 10 {
        return v + s.scope(|s| sum(s, l, depth - 1)) + s.scope(|s| sum(s, r, depth - 1));
    }
    let (a, b) = s.par(|s| sum(s, l, depth - 1), |s| sum(s, r, depth - 1));
    v + a + b
}

fn main() {
    let depth: u32 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20);
    let t0 = std::time::Instant::now();
    let (total, st) = run_with_stats(|s| {
        let t = build(s, depth, 1);
        // Some garbage, then a collection of the root heap: the tree survives.
        for _ in 0..4 {
            s.scope(|s| {
                build(s, 16, 0);
            });
        }
        s.collect();
        sum(s, t, depth)
    });
    let n = (1u64 << (depth + 1)) - 1;
    assert_eq!(total as u64, n * (n + 1) / 2, "the sum of 1..=n over the heap-ordered tree");
    println!("tree of depth {depth}: {n} nodes, sum {total}, {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
    println!(
        "forks {}, allocated {:.1} MB, collections {}, copied {:.1} MB, reclaimed {:.1} MB, GC {:.1} ms, peak task heap {:.1} MB",
        st.forks,
        st.bytes_allocated as f64 / 1e6,
        st.collections,
        st.bytes_copied as f64 / 1e6,
        st.bytes_reclaimed as f64 / 1e6,
        st.gc_nanos as f64 / 1e6,
        st.peak_heap_bytes as f64 / 1e6
    );
}
