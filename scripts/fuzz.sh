#!/usr/bin/env bash
# Build the libFuzzer targets (fuzz/fuzz_*.c, any added later too) with clang
# into build-fuzz/, then fuzz each for SECONDS (default 60) on its committed
# seeds (fuzz/corpus/<target>/) through CTest: one test run_<target> per
# target, which prints its execs and findings; a finding fails it (the input
# and the report stay in build-fuzz/fuzz-out/<target>/).
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DKVC_FUZZ=ON -DKVC_FUZZ_SECONDS="$secs" | grep '^-- kvchat:'
ninja -C build-fuzz fuzzers
# -V: each test's summary line (execs, findings) shows when it passes too
ctest --test-dir build-fuzz -L fuzz -V -j "$(nproc)"
