#!/usr/bin/env bash
# Build and run the test suite: a Release build (with bench/ compiled, so it
# cannot rot), then the same tests under AddressSanitizer +
# UndefinedBehaviorSanitizer without NDEBUG (every assert() runs; KVC_ASSERT
# runs in both), then the libFuzzer targets, each fuzzed for a minute on its
# seeds (scripts/fuzz.sh). The Release tests include test_attention under
# valgrind (installed by --test): K/V the pool never wrote must never be
# used, even where it could not change a bit. Tests that need ../shared (reference models,
# vocabularies) skip their cases when it is absent.
#   scripts/test.sh           all three
#   scripts/test.sh --quick   the Release build only
# KVC_FUZZ_SECONDS: how long each fuzz target runs (60; 0 skips fuzzing).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --test
# Node.js and the official openai package, for the client tests (they skip without)
scripts/install-node-deps.sh || echo "node tests will skip" >&2

jobs=$(nproc)
stage() { echo "== test.sh: $1 ($((SECONDS / 60))m$((SECONDS % 60))s)"; }

stage "Release build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVC_BENCH=ON | grep '^-- kvchat:'
ninja -C build
stage "Release tests"
ctest --test-dir build --output-on-failure -j "$jobs"

if [ "${1:-}" != "--quick" ]; then
  stage "ASan + UBSan build"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVC_SANITIZE=ON |
    grep '^-- kvchat:'
  ninja -C build-asan
  stage "ASan + UBSan tests"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs"
  if [ "${KVC_FUZZ_SECONDS:-60}" != 0 ]; then
    stage "fuzzing"
    scripts/fuzz.sh "${KVC_FUZZ_SECONDS:-60}"
  fi
fi
