#!/usr/bin/env bash
# Installs what Canopy needs from Debian's packages.
#   scripts/setup.sh --test    what the test suite needs: a C compiler (and git, python3, xz, sqlite3 for the LD_PRELOAD tests)
#   scripts/setup.sh --bench   also the anchor allocators and valgrind for the benchmarks
# As root it installs with apt-get; otherwise it lists what is missing and goes on.
set -uo pipefail
want=()
need() { command -v "$1" >/dev/null 2>&1 || want+=("$2"); }
need cc gcc
need git git
need python3 python3
need xz xz-utils
need sqlite3 sqlite3
if [[ "${1:-}" == "--bench" ]]; then
    need valgrind valgrind
    for pair in libjemalloc.so.2:libjemalloc2 libmimalloc.so.2:libmimalloc2.0 libtcmalloc_minimal.so.4:libtcmalloc-minimal4; do
        lib=${pair%%:*}; pkg=${pair##*:}
        ls /usr/lib/*/"$lib" >/dev/null 2>&1 || want+=("$pkg")
    done
fi
if ((${#want[@]} == 0)); then
    exit 0
fi
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: installing ${want[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq "${want[@]}" >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1; apt-get install -y -qq "${want[@]}" >/dev/null; }
else
    echo "setup: missing packages (install them as root): ${want[*]}" >&2
fi
exit 0
