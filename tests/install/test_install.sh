#!/bin/sh
# test_install.sh BUILD_DIR SOURCE_DIR - `cmake --install` into a temporary
# prefix, then what a user of the install does:
#   - build tests/install/hello.c against the installed kvchat.pc, with the
#     shared library and with the static one, and run both;
#   - libkvchat.so exports every function of kvchat.h and nothing else;
#   - the installed kvchat runs (--version).
# Exits 77 (skipped) without pkg-config or a C compiler.
set -eu
build=$1
src=$(cd "$2" && pwd)
command -v pkg-config >/dev/null 2>&1 || { echo "test_install: no pkg-config, skipped"; exit 77; }
cc=${CC:-cc}
command -v "$cc" >/dev/null 2>&1 || { echo "test_install: no C compiler, skipped"; exit 77; }
tmp=$(mktemp -d /tmp/kvc_test_install_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test_install: FAILED: $*"; exit 1; }

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" || fail "cmake --install: $(cat "$tmp/install.log")"
pc=$(find "$tmp/prefix" -name kvchat.pc)
[ -n "$pc" ] || fail "no kvchat.pc installed"
for f in bin/kvchat include/kvchat.h; do
  [ -f "$tmp/prefix/$f" ] || fail "$f not installed"
done
export PKG_CONFIG_PATH="$(dirname "$pc")"
libdir=$(pkg-config --variable=libdir kvchat)
[ -f "$libdir/libkvchat.a" ] || fail "no libkvchat.a in $libdir (from kvchat.pc)"
[ -f "$libdir/libkvchat.so" ] || fail "no libkvchat.so in $libdir (from kvchat.pc)"
case "$(cd "$libdir" && pwd -P)" in
  "$(cd "$tmp/prefix" && pwd -P)"/*) ;;
  *) fail "kvchat.pc's libdir $libdir is outside the prefix (not relocatable)" ;;
esac

# the shared library: only names kvchat.h declares
nm -D --defined-only "$libdir/libkvchat.so" | awk '$2 ~ /[TDBRVW]/ { print $3 }' | sort -u >"$tmp/exported"
[ -s "$tmp/exported" ] || fail "libkvchat.so exports nothing"
while read -r sym; do
  case "$sym" in
    _init|_fini|__bss_start|_edata|_end) continue ;;
  esac
  grep -qw "$sym" "$tmp/prefix/include/kvchat.h" || fail "libkvchat.so exports $sym, which kvchat.h does not declare"
done <"$tmp/exported"
for fn in $(grep -oE '\bkvc_[a-z0-9_]+ *\(' "$tmp/prefix/include/kvchat.h" | tr -d ' (' | sort -u); do
  grep -qx "$fn" "$tmp/exported" || fail "kvchat.h declares $fn, which libkvchat.so does not export"
done
echo "test_install: libkvchat.so exports $(wc -l <"$tmp/exported") symbols, all declared in kvchat.h"

# a user's program, shared
cd "$tmp"
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Wextra -Werror -o hello "$src/tests/install/hello.c" \
  $(pkg-config --cflags --libs kvchat) -Wl,-rpath,"$libdir" || fail "building against kvchat.pc"
ldd ./hello | grep -q "$libdir/libkvchat.so" || fail "hello does not use the installed libkvchat.so: $(ldd ./hello)"
./hello "$tmp/tiny.gguf" || fail "hello (shared) failed"
# and static: libkvchat.a with the shared libraries of what it requires
# (`pkg-config --static` would also want static libraries of those packages'
# own dependencies, which Debian does not always ship, e.g. libunistring's)
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Wextra -Werror -o hello_static "$src/tests/install/hello.c" \
  $(pkg-config --cflags kvchat) "$libdir/libkvchat.a" \
  $(pkg-config --libs $(pkg-config --print-requires-private kvchat)) -lm -pthread \
  || fail "building against libkvchat.a"
if ldd ./hello_static | grep -q libkvchat; then fail "hello_static uses a shared libkvchat"; fi
./hello_static "$tmp/tiny.gguf" || fail "hello (static) failed"

"$tmp/prefix/bin/kvchat" --version | grep -q '^kvchat ' || fail "installed kvchat --version"

# the Python package: `import kvchat` from the prefix's python path finds the
# prefix's libkvchat.so and kvchat.h (not the build tree's), and chats
init=$(find "$tmp/prefix" -path '*/kvchat/__init__.py')
[ -n "$init" ] || fail "the Python package is not installed"
[ -f "$(dirname "$init")/_paths.py" ] || fail "no _paths.py beside $init"
py=""
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c "import cffi" 2>/dev/null; then py=$p; break; fi
done
if [ -n "$py" ]; then
  out=$(cd / && env -u KVCHAT_LIB -u KVCHAT_HEADER PYTHONPATH="$(dirname "$(dirname "$init")")" "$py" -c "
import kvchat
kvchat.make_model('$tmp/py.gguf', 'tiny')
m = kvchat.Model('$tmp/py.gguf', n_ctx=256, n_threads=1)
r = m.create_chat_completion([{'role': 'user', 'content': 'Hi'}], max_tokens=4)
print(kvchat.library_path, kvchat.header_path, r['object'], kvchat.__version__)
") || fail "python3 -c 'import kvchat' from the install: $out"
  case "$out" in
    "$(cd "$libdir" && pwd)/libkvchat.so.0 $(dirname "$init")/kvchat.h chat.completion "*) ;;
    *) fail "the installed Python package uses: $out" ;;
  esac
  echo "test_install: python: $out"
else
  echo "test_install: no python3 with cffi: the Python import not checked"
fi
echo "test_install: ok"
