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
CANOPY_CHECK=0 cargo test -p canopy-alloc --features check-full

echo "== tests: the allocator, release build"
cargo test --release -p canopy-alloc
echo "== tests: the allocator under a limit on address space (ulimit -v 3 GB): the arena starts small and grows (release; default mode with every invariant checked)"
(ulimit -v 3000000 && cargo test --release -p canopy-alloc --lib --tests)
(ulimit -v 3000000 && CANOPY_CHECK=0 cargo test -p canopy-alloc --features check-full --lib --tests)
echo "== tests: the layers above the allocator under the same limit (regions lend the allocator's units; debug build, check mode)"
(ulimit -v 3000000 && cargo test -p canopy-region -p canopy-rc -p canopy-hh)
echo "== the allocator's example runs"
cargo run --release -q -p canopy-alloc --example tour > /dev/null

echo "== model checking: loom models of the lock-free protocols"
scripts/loom.sh
