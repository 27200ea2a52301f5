#!/usr/bin/env bash
# Loom models of Canopy's lock-free protocols (remote-free MPSC queue, raw lock,
# the solo lock's hand-off with membarrier modelled as fences, the one-winner claim
# on a large chunk that racing frees and the large cache use; canopy-rc's delegated
# counting: lanes, increments-first rounds, getrc; canopy-hh's fork link, the hand-off
# between a collection of an ancestor's heap and the start of the fork's second child).
# LOOM_MAX_PREEMPTIONS bounds the search: 3 for CI, 4 or more for a release check.
set -euo pipefail
cd "$(dirname "$0")/.."
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"
RUSTFLAGS="--cfg canopy_loom" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom" \
    cargo test --release -p canopy-sync --test loom
RUSTFLAGS="--cfg canopy_loom" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom" \
    cargo test --release -p canopy-rc --test loom
RUSTFLAGS="--cfg canopy_loom" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom" \
    cargo test --release -p canopy-hh --test loom
