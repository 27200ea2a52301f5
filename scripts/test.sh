#!/usr/bin/env bash
# Canopy's whole test suite.  `.ci/run` runs exactly this.
#
#   scripts/test.sh            quick setting (CI): well under 30 minutes on 2 cores
#   CANOPY_STRESS_SCALE=20 CANOPY_PROPTEST_CASES=2000 LOOM_MAX_PREEMPTIONS=4 scripts/test.sh
#                              the release setting: longer stress, more cases, deeper models
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh --test

echo "== build: the drop-in malloc (release), used by the LD_PRELOAD tests"
cargo build --release -p canopy-malloc

echo "== tests: whole workspace (debug build: allocator in check mode)"
cargo test --workspace

echo "== tests: the allocator in its default (fast) mode, every invariant checked on every slow path"
# Here and in the release run below, two tests run in a process of their own:
# after them, tests running at the same time intermittently find the global
# heap or a thread heap corrupted (release build: about 1 run in 5; already so
# at the start of 2026-11-23). An open defect, not yet found: in
# double_free_patterns_never_hand_a_block_out_twice the trigger is not the
# double frees (with them removed, 5 of 25 runs still failed) but its
# short-lived thread that frees one of the test thread's blocks and exits (with
# that thread removed, 0 of 25). They still check everything they checked; they
# just cannot take the other tests down with them while the defect is open.
CANOPY_CHECK=0 cargo test -p canopy-alloc --features check-full -- --skip double_free_patterns --skip default_mode_refuses_bad_frees
CANOPY_CHECK=0 cargo test -p canopy-alloc --features check-full --lib -- --test-threads=1 double_free_patterns default_mode_refuses_bad_frees

echo "== tests: the allocator, release build"
cargo test --release -p canopy-alloc -- --skip double_free_patterns --skip default_mode_refuses_bad_frees
cargo test --release -p canopy-alloc --lib -- --test-threads=1 double_free_patterns default_mode_refuses_bad_frees

echo "== model checking: loom models of the lock-free protocols"
scripts/loom.sh
