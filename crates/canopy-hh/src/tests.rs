//! Unit and property tests of chunks, heap merging, the object model and the
//! collector. The collector runs with small chunks and a low threshold here,
//! and the verifier checks the heap after every collection.

use crate::*;
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

pub(crate) fn setup() {
    let _ = set_config(Config { chunk_bytes: 8 << 10, gc_min_bytes: 32 << 10, gc_ratio: 1.0, verify: true, gc: true });
}

fn list<'s>(s: &mut Scope<'s>, n: i64) -> Gc<'s> {
    let mut l = Val::Int(0);
    for i in (1..=n).rev() {
        l = Val::Obj(s.scope_keep(|s| s.tuple(&[Val::Int(i), l])));
    }
    l.as_obj().unwrap()
}

fn list_sum(s: &mut Scope<'_>, l: Gc<'_>) -> (i64, usize) {
    s.scope(|s| {
        let (mut sum, mut n) = (0, 0);
        let mut cur = Val::Obj(s.rebind(l));
        while let Val::Obj(c) = cur {
            sum += s.get_int(c, 0);
            n += 1;
            cur = s.get(c, 1);
        }
        (sum, n)
    })
}

#[test]
fn objects_of_every_kind_read_back() {
    setup();
    run(|s| {
        let t = s.tuple(&[Val::Int(INT_MIN), Val::Int(INT_MAX), Val::Int(-7)]);
        assert_eq!(s.kind(t), Kind::Tuple);
        assert_eq!(s.len(t), 3);
        assert_eq!((s.get_int(t, 0), s.get_int(t, 1), s.get_int(t, 2)), (INT_MIN, INT_MAX, -7));
        let a = s.array(4, Val::Obj(t));
        assert_eq!(s.kind(a), Kind::Array);
        s.set(a, 2, Val::Int(9));
        assert_eq!(s.get_int(a, 2), 9);
        assert_eq!(s.get_int(s.get(a, 1).as_obj().unwrap(), 2), -7);
        let r = s.new_ref(Val::Int(1));
        s.set(r, 0, Val::Obj(a));
        assert_eq!(s.kind(s.get(r, 0).as_obj().unwrap()), Kind::Array);
        let raw = s.raw::<u32>(5);
        s.raw_mut::<u32>(raw)[3] = 77;
        assert_eq!(s.raw_get::<u32>(raw, 3), 77);
        assert_eq!(s.raw_len::<u32>(raw), 5);
        s.freeze(raw);
        assert_eq!(s.kind(raw), Kind::Raw);
        let bytes = s.raw_from(b"hello, heap");
        assert_eq!(s.raw_slice::<u8>(bytes), b"hello, heap");
        let part = s.raw_copy::<u8>(bytes, 7..11);
        assert_eq!(s.raw_slice::<u8>(part), b"heap");
        s.freeze(a);
        assert_eq!(s.kind(a), Kind::Vector);
        let f = s.raw_from(&[1.5f64, -2.25]);
        assert_eq!(s.raw_slice::<f64>(f), &[1.5, -2.25]);
        s.verify().unwrap();
    });
}

#[test]
fn bad_uses_are_refused_with_messages() {
    setup();
    let msg = |f: Box<dyn FnOnce() + std::panic::UnwindSafe>| {
        let e = std::panic::catch_unwind(f).unwrap_err();
        e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
    };
    let m = msg(Box::new(|| run(|s| {
        let t = s.tuple(&[Val::Int(1)]);
        s.set(t, 0, Val::Int(2));
    })));
    assert!(m.contains("immutable Tuple"), "{m}");
    let m = msg(Box::new(|| run(|s| {
        let t = s.array(2, Val::Int(1));
        s.get_int(t, 5);
    })));
    assert!(m.contains("index 5 out of bounds"), "{m}");
    let m = msg(Box::new(|| run(|s| {
        let t = s.array(2, Val::Int(1));
        s.raw_get::<u8>(t, 0);
    })));
    assert!(m.contains("raw_get of a Array"), "{m}");
    let m = msg(Box::new(|| run(|s| {
        s.tuple(&[Val::Int(i64::MAX)]);
    })));
    assert!(m.contains("does not fit"), "{m}");
    let m = msg(Box::new(|| run(|_| run(|_| ()))));
    assert!(m.contains("inside a task"), "{m}");
    // Still refused in a child, and in the parent after a join.
    let m = msg(Box::new(|| run(|s| {
        s.par(|_| run(|_| ()), |_| ());
    })));
    assert!(m.contains("inside a task"), "{m}");
    let m = msg(Box::new(|| run(|s| {
        s.par(|_| (), |_| ());
        run(|_| ())
    })));
    assert!(m.contains("inside a task"), "{m}");
    // A mutable raw array of the parent cannot be viewed as a slice by a child.
    let m = msg(Box::new(|| run(|s| {
        let a = s.raw::<u64>(4);
        s.par(|s| s.raw_slice::<u64>(a).len(), |_| ());
    })));
    assert!(m.contains("raw_slice of a mutable raw array of another task"), "{m}");
    let m = msg(Box::new(|| run(|s| {
        let a = s.raw::<u64>(4);
        s.par(|s| s.freeze(a), |_| ());
    })));
    assert!(m.contains("outside this task's own heap"), "{m}");
}

#[test]
fn a_collection_keeps_what_handles_reach_and_frees_the_rest() {
    setup();
    let (_, st) = run_with_stats(|s| {
        let l = list(s, 20_000);
        for round in 0..20 {
            // Garbage: lists that die at the end of the scope.
            s.scope(|s| {
                let g = list(s, 2_000);
                assert_eq!(list_sum(s, g).1, 2_000);
            });
            if round % 5 == 0 {
                s.collect();
            }
        }
        assert_eq!(list_sum(s, l), (20_000 * 20_001 / 2, 20_000));
        s.collect();
        assert_eq!(list_sum(s, l), (20_000 * 20_001 / 2, 20_000));
        // 20,000 three-word tuples survive; the heap is near that.
        assert!(s.heap_bytes() < 2 * 20_000 * 24 + (64 << 10), "heap {}", s.heap_bytes());
    });
    assert!(st.collections >= 4);
    assert!(st.bytes_copied > 0 && st.bytes_reclaimed > 0);
}

#[test]
fn large_objects_stay_in_place_and_survive() {
    setup();
    run(|s| {
        let big = s.raw::<u64>(100_000);
        for (i, x) in s.raw_mut::<u64>(big).iter_mut().enumerate() {
            *x = i as u64 * 3;
        }
        let arr = s.array(10_000, Val::Int(5));
        s.set(arr, 9_999, Val::Obj(big));
        let t = s.tuple(&[Val::Obj(arr)]);
        for _ in 0..3 {
            s.scope(|s| {
                list(s, 5_000);
            });
            s.collect();
        }
        let arr2 = s.get(t, 0).as_obj().unwrap();
        let big2 = s.get(arr2, 9_999).as_obj().unwrap();
        assert_eq!(s.raw_slice::<u64>(big2)[77_777], 77_777 * 3);
        assert_eq!(s.get_int(arr2, 0), 5);
        assert!(s.stats().large_kept >= 3);
    });
}

#[test]
fn children_heaps_merge_at_the_join() {
    setup();
    run(|s| {
        let (a, b) = s.par_gc(|s| list(s, 3_000), |s| list(s, 4_000));
        assert_eq!(s.depth(), 0);
        // The children's objects are in this heap now: collect and walk.
        s.collect();
        assert_eq!(list_sum(s, a).1, 3_000);
        assert_eq!(list_sum(s, b).1, 4_000);
        let (da, db) = s.par(|s| s.depth(), |s| s.par(|s| s.depth(), |_| 0).0);
        assert_eq!((da, db), (1, 2));
    });
}

#[test]
fn down_pointers_survive_child_collections() {
    setup();
    run(|s| {
        let shared = s.array(64, Val::Int(0));
        s.par_for(0..64, 4, |s, i| {
            // Each child puts its own list into the parent's array, then makes
            // garbage and collects; the array slot is a remembered root.
            let l = list(s, 200 + i as i64);
            s.set(shared, i, Val::Obj(l));
            for _ in 0..3 {
                s.scope(|s| {
                    list(s, 1_000);
                });
                s.collect();
            }
            let back = s.get(shared, i).as_obj().unwrap();
            assert_eq!(list_sum(s, back).1, 200 + i);
        });
        s.collect();
        for i in 0..64 {
            let l = s.get(shared, i).as_obj().unwrap();
            let n = 200 + i as i64;
            assert_eq!(list_sum(s, l), (n * (n + 1) / 2, n as usize));
        }
        assert!(s.stats().remset_entries >= 64);
    });
}

#[test]
fn grandchildren_record_into_an_ancestor_remembered_set() {
    setup();
    run(|s| {
        let outer = s.array(4, Val::Int(0));
        s.par(
            |s| {
                // The child's own array, written by its children (the
                // grandchildren of the root): entries go to the child's heap...
                let mid = s.array(2, Val::Int(0));
                s.par(|s| {
                    let l = list(s, 50);
                    s.set(mid, 0, Val::Obj(l));
                    // ...and one into the root's array, pointing to this heap.
                    s.set(outer, 0, Val::Obj(l));
                }, |s| {
                    let l = list(s, 60);
                    s.set(mid, 1, Val::Obj(l));
                });
                for _ in 0..3 {
                    s.scope(|s| {
                        list(s, 2_000);
                    });
                    s.collect();
                }
                let a = s.get(mid, 0).as_obj().unwrap();
                let b = s.get(mid, 1).as_obj().unwrap();
                (list_sum(s, a).1, list_sum(s, b).1)
            },
            |_| (),
        );
        let l = s.get(outer, 0).as_obj().unwrap();
        assert_eq!(list_sum(s, l).1, 50);
    });
}

#[test]
fn an_entangled_read_stops_the_program_naming_both_tasks() {
    setup();
    let r = std::panic::catch_unwind(|| {
        run(|s| {
            let shared = s.new_ref(Val::Int(0));
            let published = AtomicBool::new(false);
            s.par(
                |s| {
                    let mine = s.tuple(&[Val::Int(42)]);
                    s.set(shared, 0, Val::Obj(mine));
                    published.store(true, Ordering::Release);
                },
                |s| {
                    // Wait for the sibling's write, then read it: entangled.
                    while !published.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                    s.get(shared, 0);
                },
            );
        })
    });
    let e = r.unwrap_err();
    let m = e.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(m.contains("entanglement detected"), "{m}");
    assert!(m.contains("root/R") && m.contains("root/L"), "{m}");
}

#[test]
fn reading_a_childs_write_after_the_join_is_not_entangled() {
    setup();
    run(|s| {
        let shared = s.new_ref(Val::Int(0));
        s.par(
            |s| {
                let mine = s.tuple(&[Val::Int(42)]);
                s.set(shared, 0, Val::Obj(mine));
            },
            |_| (),
        );
        let t = s.get(shared, 0).as_obj().unwrap();
        assert_eq!(s.get_int(t, 0), 42);
        assert!(s.stats().frontier_checks >= 1);
    });
}

#[test]
fn deep_and_wide_fork_trees() {
    setup();
    fn deep(s: &mut Scope<'_>, d: u32) -> i64 {
        if d == 0 {
            return 0;
        }
        let (a, b) = s.par(|s| deep(s, d - 1), |s| s.scope(|s| {
            let t = s.tuple(&[Val::Int(1)]);
            s.get_int(t, 0)
        }));
        a + b
    }
    let r = run(|s| deep(s, 1_000));
    assert_eq!(r, 1_000);
    fn wide(s: &mut Scope<'_>, lo: i64, hi: i64) -> i64 {
        if hi - lo == 1 {
            let t = s.tuple(&[Val::Int(lo)]);
            return s.get_int(t, 0);
        }
        let mid = (lo + hi) / 2;
        let (a, b) = s.par(|s| wide(s, lo, mid), |s| wide(s, mid, hi));
        a + b
    }
    let (r, st) = run_with_stats(|s| wide(s, 0, 100_000));
    assert_eq!(r, 100_000 * 99_999 / 2);
    assert_eq!(st.forks, 2 * 99_999);
    let v = run(|s| {
        let out = s.raw::<i64>(10_000);
        s.par_for(0..10_000, 16, |s, i| s.raw_set(out, i, (i * i) as i64));
        s.raw_slice::<i64>(out).iter().enumerate().all(|(i, &x)| x == (i * i) as i64)
    });
    assert!(v);
    let sum = run(|s| s.par_reduce(0..1_000_000, 1_000, |_, r| r.map(|x| x as u64).sum::<u64>(), |a, b| a + b));
    assert_eq!(sum, 999_999 * 1_000_000 / 2);
}

// ---- the model test -----------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Int(i64),
    Tuple(usize, usize),
    Array(u8, usize),
    Set(usize, u8, usize),
    Get(usize, u8),
    Collect,
    CollectAll,
    Fork(Vec<Op>, Vec<Op>),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let leaf = prop_oneof![
        (-1000i64..1000).prop_map(Op::Int),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Op::Tuple(a, b)),
        (1u8..6, any::<usize>()).prop_map(|(n, a)| Op::Array(n, a)),
        (any::<usize>(), any::<u8>(), any::<usize>()).prop_map(|(a, i, v)| Op::Set(a, i, v)),
        (any::<usize>(), any::<u8>()).prop_map(|(a, i)| Op::Get(a, i)),
        Just(Op::Collect),
        Just(Op::CollectAll),
    ];
    leaf.prop_recursive(3, 200, 24, |inner| {
        prop_oneof![
            4 => inner.clone(),
            1 => (prop::collection::vec(inner.clone(), 0..24), prop::collection::vec(inner, 0..24))
                .prop_map(|(a, b)| Op::Fork(a, b)),
        ]
    })
}

/// The model: objects in an arena, values are ints or arena ids.
#[derive(Clone, Copy, Debug, PartialEq)]
enum MVal {
    Int(i64),
    Obj(usize),
}

#[derive(Default)]
struct Model {
    objs: Vec<(bool, Vec<MVal>)>, // (mutable, fields)
}

/// Run `ops` on the managed heap and the model side by side. `regs` are the
/// task's registers (managed, model). `parity = Some((m, r, own_from))`
/// restricts which fields of mutable arrays made before this task started
/// (model ids below `own_from`) it may touch: those with `field % m == r`.
/// A child of a task with `(m, r)` gets `(2m, r)` or `(2m, r + m)`, so
/// concurrent tasks never touch the same field and the outcome does not
/// depend on the schedule.
fn exec<'s>(
    s: &mut Scope<'s>,
    model: &std::sync::Mutex<Model>,
    ops: &[Op],
    regs: &mut Vec<(Val<'s>, MVal)>,
    parity: Option<(usize, usize, usize)>,
) {
    let pick = |regs: &Vec<(Val<'s>, MVal)>, i: usize| regs[i % regs.len()];
    let allowed = |model: &Model, id: usize, field: usize, own_from: usize| -> bool {
        match parity {
            None => true,
            Some((m, r, _)) if id < own_from => field % m == r && model.objs[id].0,
            Some(_) => true,
        }
    };
    let own_from = parity.map(|p| p.2).unwrap_or(0);
    let (m, r) = parity.map(|p| (p.0, p.1)).unwrap_or((1, 0));
    for op in ops {
        match op {
            Op::Int(i) => regs.push((Val::Int(*i), MVal::Int(*i))),
            Op::Tuple(a, b) => {
                let (va, ma) = pick(regs, *a);
                let (vb, mb) = pick(regs, *b);
                let g = s.tuple(&[va, vb]);
                let mut m = model.lock().unwrap();
                m.objs.push((false, vec![ma, mb]));
                regs.push((Val::Obj(g), MVal::Obj(m.objs.len() - 1)));
            }
            Op::Array(n, a) => {
                let (va, ma) = pick(regs, *a);
                let g = s.array(*n as usize, va);
                let mut m = model.lock().unwrap();
                m.objs.push((true, vec![ma; *n as usize]));
                regs.push((Val::Obj(g), MVal::Obj(m.objs.len() - 1)));
            }
            Op::Set(a, i, v) => {
                let (va, ma) = pick(regs, *a);
                let (vv, mv) = pick(regs, *v);
                if let (Val::Obj(g), MVal::Obj(id)) = (va, ma) {
                    let mut m = model.lock().unwrap();
                    let len = m.objs[id].1.len();
                    let f = *i as usize % len;
                    // Only a value the sibling cannot see may go into an
                    // ancestor's array (else the sibling could read it: that
                    // is entanglement, tested separately).
                    if m.objs[id].0 && allowed(&m, id, f, own_from) {
                        m.objs[id].1[f] = mv;
                        drop(m);
                        s.set(g, f, vv);
                    }
                }
            }
            Op::Get(a, i) => {
                let (va, ma) = pick(regs, *a);
                if let (Val::Obj(g), MVal::Obj(id)) = (va, ma) {
                    let m = model.lock().unwrap();
                    let len = m.objs[id].1.len();
                    let f = *i as usize % len;
                    if allowed(&m, id, f, own_from) || !m.objs[id].0 {
                        let mv = m.objs[id].1[f];
                        drop(m);
                        let v = s.get(g, f);
                        regs.push((v, mv));
                    }
                }
            }
            Op::Collect => s.collect(),
            Op::CollectAll => {
                s.collect_with_ancestors();
            }
            Op::Fork(l, rops) => {
                let parent_regs: &Vec<(Val<'s>, MVal)> = regs;
                // Children start from the parent's registers; their new
                // objects are numbered from here on in the model.
                let start = model.lock().unwrap().objs.len();
                let ((va, ma), (vb, mb)) = {
                    let ms = std::sync::Mutex::new((MVal::Int(0), MVal::Int(0)));
                    let (va, vb) = s.par_val(
                        |s| {
                            let (v, mv) = run_child(s, parent_regs, model, l, (2 * m, r, start));
                            ms.lock().unwrap().0 = mv;
                            v
                        },
                        |s| {
                            let (v, mv) = run_child(s, parent_regs, model, rops, (2 * m, r + m, start));
                            ms.lock().unwrap().1 = mv;
                            v
                        },
                    );
                    let (ma, mb) = *ms.lock().unwrap();
                    ((va, ma), (vb, mb))
                };
                regs.push((va, ma));
                regs.push((vb, mb));
            }
        }
        if regs.len() > 64 {
            regs.drain(..regs.len() - 64);
        }
    }
}

fn run_child<'c>(
    s: &mut Scope<'c>,
    parent_regs: &[(Val<'_>, MVal)],
    model: &std::sync::Mutex<Model>,
    ops: &[Op],
    parity: (usize, usize, usize),
) -> (Val<'c>, MVal) {
    let mut r: Vec<_> = parent_regs.iter().map(|&(v, m)| (s.rebind_val(v), m)).collect();
    exec(s, model, ops, &mut r, Some(parity));
    *r.last().unwrap()
}

/// Compare the managed graph reachable from `v` with the model's from `m`.
fn same(s: &mut Scope<'_>, v: Val<'_>, m: MVal, model: &Model, seen: &mut HashMap<usize, u64>) -> Result<(), String> {
    match (v, m) {
        (Val::Int(a), MVal::Int(b)) if a == b => Ok(()),
        (Val::Obj(g), MVal::Obj(id)) => {
            let w = g.word();
            if let Some(&prev) = seen.get(&id) {
                return if prev == w { Ok(()) } else { Err(format!("model object {id} is two managed objects")) };
            }
            seen.insert(id, w);
            let (mutable, fields) = &model.objs[id];
            let kind = s.kind(g);
            if kind.is_mutable() != *mutable || s.len(g) != fields.len() {
                return Err(format!("object {id}: kind {kind:?} len {} vs model {mutable} {}", s.len(g), fields.len()));
            }
            for (i, &mf) in fields.iter().enumerate() {
                s.scope(|s| {
                    let fv = s.get(g, i);
                    same(s, fv, mf, model, seen)
                })?;
            }
            Ok(())
        }
        (a, b) => Err(format!("{a:?} vs {b:?}")),
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("CANOPY_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48),
        .. ProptestConfig::default()
    })]
    #[test]
    fn random_graphs_across_forks_match_the_model(ops in prop::collection::vec(op_strategy(), 1..80)) {
        setup();
        let model = std::sync::Mutex::new(Model::default());
        let res = run(|s| {
            let mut regs = vec![(Val::Int(0), MVal::Int(0))];
            exec(s, &model, &ops, &mut regs, None);
            s.collect();
            let m = model.lock().unwrap();
            let mut seen = HashMap::new();
            for &(v, mv) in regs.iter() {
                same(s, v, mv, &m, &mut seen)?;
            }
            s.verify()
        });
        prop_assert!(res.is_ok(), "{:?}", res);
    }
}

#[test]
fn par_fill_hands_out_disjoint_pieces_and_guards_the_array() {
    setup();
    run(|s| {
        let a = s.raw::<u64>(100_003);
        s.par_fill::<u64, _>(a, 1_000, |s, off, piece| {
            // Children may allocate while they hold their piece.
            let t = s.tuple(&[Val::Int(off as i64)]);
            let base = s.get_int(t, 0) as u64;
            for (i, x) in piece.iter_mut().enumerate() {
                *x = (base + i as u64) * 3;
            }
        });
        assert!(s.raw_slice::<u64>(a).iter().enumerate().all(|(i, &x)| x == i as u64 * 3));
        // A small array still fills in a child.
        let b = s.raw::<u8>(5);
        s.par_fill::<u8, _>(b, 64, |_, _, p| p.fill(9));
        assert_eq!(s.raw_slice::<u8>(b), &[9; 5]);
        let c = s.raw::<i32>(10);
        s.raw_set_range(c, 4, &[1, 2, 3]);
        assert_eq!(s.raw_slice::<i32>(c), &[0, 0, 0, 0, 1, 2, 3, 0, 0, 0]);
    });
    let e = std::panic::catch_unwind(|| {
        run(|s| {
            let a = s.raw::<u64>(64);
            s.par_fill::<u64, _>(a, 8, |s, _, _| {
                s.raw_get::<u64>(a, 0);
            });
        })
    })
    .unwrap_err();
    let m = e.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(m.contains("while par_fill has it in pieces"), "{m}");
    // The busy mark is cleared after a panic inside par_fill.
    let ok = run(|s| {
        let a = s.raw::<u64>(4);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            s.par_fill::<u64, _>(a, 1, |_, off, _| assert!(off != 2, "piece 2 fails"));
        }));
        assert!(r.is_err());
        s.raw_get::<u64>(a, 0) == 0
    });
    assert!(ok);
}

#[test]
fn a_first_child_collects_its_ancestors_heaps() {
    setup();
    // One worker: the second child cannot start before the first ends, so
    // the first child may collect both ancestors' heaps.
    let pool = rayon_core::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let (levels, st) = pool.install(|| {
        run_with_stats(|s| {
            let keep = list(s, 3_000);
            let shared = s.array(4, Val::Int(0));
            s.scope(|s| {
                list(s, 10_000); // garbage in the root heap
            });
            let levels = s.par(
                |s| {
                    let (levels, _) = s.par(
                        |s| {
                            // A down-pointer from the root's array into this heap:
                            // its remembered entry must follow the array's move.
                            let mine = list(s, 100);
                            s.set(shared, 0, Val::Obj(mine));
                            let levels = s.collect_with_ancestors();
                            // Then this heap alone, through the rebuilt entry.
                            s.scope(|s| {
                                list(s, 2_000);
                            });
                            s.collect();
                            let back = s.get(shared, 0).as_obj().unwrap();
                            assert_eq!(list_sum(s, back), (5050, 100));
                            let k = s.rebind(keep);
                            assert_eq!(list_sum(s, k).1, 3_000);
                            levels
                        },
                        |s| list_sum(s, keep).1,
                    );
                    levels
                },
                |s| {
                    // The second child of the root sees the moved objects.
                    let (sum, n) = list_sum(s, keep);
                    assert_eq!((sum, n), (3_000 * 3_001 / 2, 3_000));
                },
            );
            let back = s.get(shared, 0).as_obj().unwrap();
            assert_eq!(list_sum(s, back), (5050, 100));
            levels.0
        })
    });
    assert_eq!(levels, 2);
    assert!(st.ancestor_levels >= 2);
    // The garbage of the root heap was reclaimed by the first child.
    assert!(st.bytes_reclaimed > 10_000 * 24);
}

#[test]
fn a_second_child_blocks_ancestor_collection() {
    setup();
    run(|s| {
        let keep = list(s, 500);
        let (_, levels) = s.par(|s| list_sum(s, keep).1, |s| s.collect_with_ancestors());
        // The second child's parent is shared with the first child.
        assert_eq!(levels, 0);
        assert_eq!(list_sum(s, keep).1, 500);
    });
}

#[test]
fn a_parent_without_chunks_never_bumps_into_a_childs_large_chunk() {
    setup();
    run(|s| {
        // The root has no chunk; its first child allocates only a large array.
        let (big, _) = s.par_gc(
            |s| {
                let a = s.raw::<u64>(40_000);
                s.raw_mut::<u64>(a)[39_999] = 5;
                a
            },
            |s| s.tuple(&[]),
        );
        // Small objects now must go to a chunk of their own.
        let mut l = Val::Int(0);
        for i in 0..5_000 {
            l = Val::Obj(s.scope_keep(|s| s.tuple(&[Val::Int(i), l])));
        }
        s.verify().unwrap();
        s.collect();
        assert_eq!(s.raw_slice::<u64>(big)[39_999], 5);
        let l = l.as_obj().unwrap();
        assert_eq!(list_sum(s, l).1, 5_000);
    });
}

#[test]
fn raw_build_and_with_raw_mut_read_one_array_while_writing_another() {
    setup();
    run(|s| {
        let a = s.raw_from::<i64>(&[1, 4, 9, 16]);
        let b = s.raw_from::<i64>(&[2, 3, 10]);
        // A merge straight into a new array: no zeroing, no staging.
        let (m, n) = s.raw_build::<i64, usize>(7, |s, out| {
            let (x, y) = (s.raw_slice::<i64>(a), s.raw_slice::<i64>(b));
            let (mut i, mut j) = (0, 0);
            while i < x.len() && j < y.len() {
                if x[i] <= y[j] {
                    out.push(x[i]);
                    i += 1;
                } else {
                    out.push(y[j]);
                    j += 1;
                }
            }
            out.extend_from_slice(&x[i..]);
            out.extend_from_slice(&y[j..]);
            out.len()
        });
        assert_eq!(n, 7);
        assert_eq!(s.raw_slice::<i64>(m), &[1, 2, 3, 4, 9, 10, 16]);
        let d = s.raw::<i64>(4);
        s.with_raw_mut::<i64, ()>(d, |s, w| {
            for (o, &x) in w.iter_mut().zip(s.raw_slice::<i64>(a)) {
                *o = x * 10;
            }
        });
        assert_eq!(s.raw_slice::<i64>(d), &[10, 40, 90, 160]);
    });
    let m = |f: Box<dyn FnOnce() + std::panic::UnwindSafe>| {
        let e = std::panic::catch_unwind(f).unwrap_err();
        e.downcast_ref::<String>().cloned().unwrap_or_default()
    };
    let e = m(Box::new(|| run(|s| {
        s.raw_build::<u8, ()>(4, |_, out| out.push(1));
    })));
    assert!(e.contains("fill appended 1"), "{e}");
    let e = m(Box::new(|| run(|s| {
        s.raw_build::<u8, ()>(1, |_, out| out.extend_from_slice(&[1, 2]));
    })));
    assert!(e.contains("more than 1 elements"), "{e}");
    let e = m(Box::new(|| run(|s| {
        let d = s.raw::<u8>(4);
        s.with_raw_mut::<u8, ()>(d, |s, _| {
            s.raw_slice::<u8>(d);
        });
    })));
    assert!(e.contains("with_raw_mut") || e.contains("raw_slice"), "{e}");
}

#[test]
fn a_task_that_only_forks_collects_at_the_joins() {
    setup();
    let (_, st) = run_with_stats(|s| {
        let keep = list(s, 100);
        s.par_for(0..64, 1, |s, _| {
            // Below the children's own threshold: they never collect.
            list(s, 300);
        });
        assert_eq!(list_sum(s, keep).1, 100);
    });
    assert!(st.collections >= 1, "{st:?}");
}

/// A merge sort whose outputs are built in child tasks: the halves die in
/// each parent, and the collections at the joins above must reclaim them
/// (a child's survivors once counted as the parent's, which kept every
/// threshold too high to ever collect).
#[test]
fn garbage_left_by_joined_children_is_collected_at_later_joins() {
    setup();
    fn sort<'a>(s: &mut Scope<'a>, n: usize) -> Gc<'a> {
        if n <= 1 << 12 {
            let g = s.raw::<i64>(n);
            s.freeze(g);
            return g;
        }
        s.scope_keep(|s| {
            let (a, b) = s.par_gc(|s| sort(s, n / 2), |s| sort(s, n - n / 2));
            let len = s.raw_len::<i64>(a) + s.raw_len::<i64>(b);
            let (out, _) = s.par_gc(
                |s| {
                    let (g, ()) = s.raw_build::<i64, ()>(len, |s, f| {
                        f.extend_from_slice(s.raw_slice::<i64>(a));
                        f.extend_from_slice(s.raw_slice::<i64>(b));
                    });
                    s.freeze(g);
                    g
                },
                |s| s.raw::<i64>(0),
            );
            out
        })
    }
    let (_, st) = run_with_stats(|s| {
        let r = sort(s, 1 << 17);
        assert_eq!(s.raw_len::<i64>(r), 1 << 17);
    });
    assert!(st.bytes_reclaimed > st.bytes_allocated / 4, "{st:?}");
    assert!(st.peak_heap_bytes < st.bytes_allocated / 2, "{st:?}");
}

#[test]
fn a_handle_used_in_another_task_tree_is_refused() {
    setup();
    let e = std::panic::catch_unwind(|| {
        run(|s| {
            let t = s.tuple(&[Val::Int(5)]);
            std::thread::scope(|sc| {
                sc.spawn(move || {
                    // Another run on another thread: its task tree must not
                    // read the first tree's slot.
                    run(|s2| s2.get_int(t, 0))
                })
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
            })
        })
    })
    .unwrap_err();
    let m = e.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(m.contains("used in task tree"), "{m}");
    // Also as a value stored into the other tree's objects.
    let e = std::panic::catch_unwind(|| {
        run(|s| {
            let t = s.tuple(&[Val::Int(5)]);
            std::thread::scope(|sc| {
                sc.spawn(move || run(|s2| {
                    s2.tuple(&[Val::Obj(t)]);
                }))
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
            })
        })
    })
    .unwrap_err();
    let m = e.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(m.contains("used in task tree"), "{m}");
}

#[test]
fn a_kept_result_outlives_its_run_and_reads_in_place() {
    setup();
    // A list built across forks and collected on the way: what the run
    // returns stays readable after it, at the address it had at the end.
    let kept = run_keep(|s| {
        let (a, b) = s.par_gc(|s| list(s, 300), |s| list(s, 200));
        s.collect();
        let pair = s.tuple(&[Val::Obj(a), Val::Obj(b)]);
        s.collect_with_ancestors();
        pair
    });
    assert!(kept.heap_bytes() > 0);
    assert!(kept.stats().objects_allocated >= 501);
    fn walk<'k>(s: &Scope<'k>, l: Gc<'k>) -> (i64, usize) {
        let (mut sum, mut n, mut cur) = (0, 0, Val::Obj(l));
        while let Val::Obj(c) = cur {
            sum += s.get_int(c, 0);
            n += 1;
            cur = s.get(c, 1);
        }
        (sum, n)
    }
    let (first, handles_after) = kept.read(|s, pair| {
        let a = walk(s, s.get(pair, 0).as_obj().unwrap());
        let b = walk(s, s.get(pair, 1).as_obj().unwrap());
        // Nested reads see the same heap and release their own handles.
        let inner = kept.read(|s2, p2| walk(s2, s2.get(p2, 1).as_obj().unwrap()));
        assert_eq!(inner, b);
        ((a, b), s.handles())
    });
    assert_eq!(first, ((300 * 301 / 2, 300), (200 * 201 / 2, 200)));
    // The handles of a read are released when it returns.
    let handles_next = kept.read(|s, _| s.handles());
    assert!(handles_next < handles_after, "{handles_next} handles after a read, {handles_after} during one");
    let again = kept.read(|s, pair| walk(s, s.get(pair, 0).as_obj().unwrap()));
    assert_eq!(again, first.0);
    drop(kept);
}

#[test]
fn a_kept_raw_array_is_read_as_a_slice() {
    setup();
    let kept = run_keep(|s| {
        let (l, r) = s.par_gc(|s| s.raw_from::<u32>(&[1, 2, 3]), |s| s.raw_from::<u32>(&[4, 5]));
        let both = s.raw_build::<u32, ()>(5, |s, out| {
            out.extend_from_slice(s.raw_slice::<u32>(l));
            out.extend_from_slice(s.raw_slice::<u32>(r));
        });
        both.0
    });
    assert_eq!(kept.read(|s, a| s.raw_slice::<u32>(a).to_vec()), vec![1, 2, 3, 4, 5]);
    // A handle of another tree is refused in a kept heap's scope too.
    let other = run_keep(|s| s.raw_from::<u32>(&[9]));
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        kept.read(|s, _| other.read(|_, g| s.raw_len::<u32>(g)))
    }));
    assert!(refused.is_err());
}

#[test]
fn a_collection_takes_objects_whose_pointers_became_internal_off_the_frontier() {
    setup();
    run(|s| {
        let shared = s.new_ref(Val::Int(0));
        s.par(
            |s| {
                let mine = s.tuple(&[Val::Int(42)]);
                s.set(shared, 0, Val::Obj(mine));
            },
            |_| (),
        );
        // After the join the pointer is within the root's heap, but its
        // holder is still on the frontier: reads take the check.
        let before = s.stats().frontier_checks;
        let t = s.get(shared, 0).as_obj().unwrap();
        assert_eq!(s.get_int(t, 0), 42);
        assert_eq!(s.stats().frontier_checks, before + 1);
        s.collect();
        let expired = s.stats().frontier_expired;
        assert!(expired >= 1);
        let before = s.stats().frontier_checks;
        let t = s.get(shared, 0).as_obj().unwrap();
        assert_eq!(s.get_int(t, 0), 42);
        assert_eq!(s.stats().frontier_checks, before, "no check once the holder left the frontier");
        // A large object (kept in place by the collector) as the target.
        let arr = s.array(3, Val::Int(0));
        s.par(
            |s| {
                let big = s.raw::<u64>(20_000);
                s.set(arr, 1, Val::Obj(big));
            },
            |_| (),
        );
        s.collect();
        assert!(s.stats().frontier_expired > expired);
        let before = s.stats().frontier_checks;
        let big = s.get(arr, 1).as_obj().unwrap();
        assert_eq!(s.raw_len::<u64>(big), 20_000);
        assert_eq!(s.stats().frontier_checks, before);
        // A pointer that still points down keeps its holder on the frontier
        // across a child's collection (its own heap, and the root's when the
        // other child has not started yet).
        s.par(
            |s| {
                let young = s.tuple(&[Val::Int(7)]);
                s.set(shared, 0, Val::Obj(young));
                s.collect_with_ancestors();
                let c0 = s.stats().frontier_checks;
                let y = s.get(shared, 0).as_obj().unwrap();
                assert_eq!(s.get_int(y, 0), 7);
                assert_eq!(s.stats().frontier_checks, c0 + 1, "the holder still points down into this heap");
            },
            |_| (),
        );
    });
}

#[test]
fn a_kept_heap_collects_down_to_its_result() {
    setup();
    // Garbage made by the run's last task stays in the kept heap (no
    // collection came after it) until the Kept is collected.
    let mut kept = run_keep(|s| {
        let result = list(s, 50);
        for i in 0..2000 {
            s.scope(|s| {
                s.tuple(&[Val::Int(i), Val::Int(i)]);
            });
        }
        let big = s.raw::<u64>(10_000); // a large object, garbage too
        s.raw_set(big, 0, 1u64);
        result
    });
    let before = kept.heap_bytes();
    kept.collect();
    assert!(kept.heap_bytes() < before, "{} bytes after, {before} before", kept.heap_bytes());
    kept.verify().unwrap();
    let sum = kept.read(|s, l| {
        let (mut sum, mut cur) = (0, Val::Obj(l));
        while let Val::Obj(c) = cur {
            sum += s.get_int(c, 0);
            cur = s.get(c, 1);
        }
        sum
    });
    assert_eq!(sum, 50 * 51 / 2);
    assert!(kept.stats().collections >= 1);
}

#[test]
fn a_handle_made_by_an_outer_kept_read_inside_a_nested_one_keeps_its_object() {
    setup();
    let kept = run_keep(|s| {
        let a = s.tuple(&[Val::Int(1)]);
        let b = s.tuple(&[Val::Int(2)]);
        s.tuple(&[Val::Obj(a), Val::Obj(b)])
    });
    kept.read(|outer, pair| {
        // The outer scope makes a handle while a nested read is open; its
        // brand is the outer read's, so it may leave the nested read.
        let a = kept.read(|_inner, _| outer.get(pair, 0).as_obj().unwrap());
        // The next handle of the outer read must not take a's slot.
        let b = outer.get(pair, 1).as_obj().unwrap();
        assert_eq!(outer.get_int(b, 0), 2);
        assert_eq!(outer.get_int(a, 0), 1, "the handle made inside the nested read now names another object");
    });
}

#[test]
fn a_panicking_kept_read_releases_its_handles() {
    setup();
    let kept = run_keep(|s| {
        let a = s.tuple(&[Val::Int(1)]);
        s.tuple(&[Val::Obj(a)])
    });
    let base = kept.read(|s, _| s.handles());
    for _ in 0..3 {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            kept.read(|s, p| {
                let _ = s.get(p, 0);
                s.get_int(p, 0) // panics: field 0 holds an object
            })
        }));
        assert!(r.is_err());
    }
    assert_eq!(kept.read(|s, _| s.handles()), base, "handles of panicked reads stay rooted");
}

#[test]
fn a_down_pointer_written_into_an_expired_holder_is_still_checked() {
    setup();
    run(|s| {
        let o = s.new_ref(Val::Int(0));
        s.par(
            |s| {
                let t = s.tuple(&[Val::Int(1)]);
                s.set(o, 0, Val::Obj(t));
            },
            |_| (),
        );
        s.collect();
        assert!(s.stats().frontier_expired >= 1, "the holder left the frontier");
        // The first child collects the root's heap too when it can (the
        // holder is scanned again and stays off the frontier), then points it
        // down into its own heap; the second child reads the pointer.
        let written = AtomicBool::new(false);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            s.par(
                |a| {
                    a.collect_with_ancestors();
                    let t = a.tuple(&[Val::Int(7)]);
                    a.set(o, 0, Val::Obj(t));
                    written.store(true, Ordering::Release);
                },
                |b| {
                    while !written.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                    b.get(o, 0);
                },
            )
        }));
        let e = r.expect_err("the entangled read went unchecked");
        let m = e.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(m.contains("entanglement detected"), "{m}");
    });
}
