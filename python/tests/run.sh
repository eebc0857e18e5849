#!/bin/sh
# CTest's test_python: the package's pytest tests, with the build's
# libkvchat.so (KVCHAT_LIB) and the source tree's package. Debian's
# /usr/bin/python3 first (where python3-cffi and python3-pytest install),
# else python3 on PATH. 77 (skipped) when none has cffi and pytest
# (scripts/install-deps.sh --test installs them).
here=$(cd "$(dirname "$0")/.." && pwd)
py=""
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c "import cffi, pytest" 2>/dev/null; then
    py=$p
    break
  fi
done
[ -n "$py" ] || { echo "test_python: no python3 with cffi and pytest (python3-cffi, python3-pytest), skipped"; exit 77; }
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" -m pytest -q -p no:cacheprovider "$here/tests"
