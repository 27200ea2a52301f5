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
# Here and in the release run below, the two tests that make deliberate double
# frees in the default mode run in a process of their own: after them, other
# tests running at the same time have found the heap corrupted, intermittently
# (a known defect in how the default mode contains a double free, present since
# the foundation: see the note on issue 2). They still check everything they
# checked; they just cannot take the other tests down with them while the
# defect is open.
CANOPY_CHECK=0 cargo test -p canopy-alloc --features check-full -- --skip double_free_patterns --skip default_mode_refuses_bad_frees
CANOPY_CHECK=0 cargo test -p canopy-alloc --features check-full --lib -- --test-threads=1 double_free_patterns default_mode_refuses_bad_frees

echo "== tests: the allocator, release build"
cargo test --release -p canopy-alloc -- --skip double_free_patterns --skip default_mode_refuses_bad_frees
cargo test --release -p canopy-alloc --lib -- --test-threads=1 double_free_patterns default_mode_refuses_bad_frees

echo "== model checking: loom models of the lock-free protocols"
scripts/loom.sh
