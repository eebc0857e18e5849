#!/usr/bin/env bash
# Install what building kvchat needs (no test packages) and build the kvchat
# command (Release) into build/: build/kvchat. Not the tests (scripts/test.sh),
# nor the shared library (ninja -C build kvchat_shared; `ninja -C build` builds all).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build kvchat
