#!/usr/bin/env bash
# Build and run the test suite: a Release build, then the same tests under
# AddressSanitizer + UndefinedBehaviorSanitizer. Tests that need ../shared
# (reference models, vocabularies) skip their cases when it is absent.
#   scripts/test.sh           both builds
#   scripts/test.sh --quick   the Release build only
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --test
# Node.js and the official openai package, for the client tests (they skip without)
scripts/install-node-deps.sh || echo "node tests will skip" >&2

jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build
ctest --test-dir build --output-on-failure -j "$jobs"

if [ "${1:-}" != "--quick" ]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVC_SANITIZE=ON >/dev/null
  ninja -C build-asan
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs"
fi
