"""libkvchat.so through cffi's ABI mode: no compiler at install or import time.

The declarations given to cffi are read from kvchat.h itself (the copy
installed beside this package, else the source tree's include/kvchat.h), so
struct layouts and signatures are the C library's, never a second copy that
could drift from it.

Where the library is looked for, in order:
  $KVCHAT_LIB (a path to libkvchat.so);
  the install's libdir, which cmake --install wrote into _paths.py;
  the source tree's build/libkvchat.so (python/ beside build/);
  the dynamic linker's search path (libkvchat.so.0).
"""
import os
import re

import cffi

_HERE = os.path.dirname(os.path.abspath(__file__))
_TREE = os.path.dirname(os.path.dirname(_HERE))   # python/kvchat -> the checkout

try:
    from . import _paths   # written by cmake --install
except ImportError:        # the source tree
    _paths = None


def _header_path():
    candidates = [os.environ.get("KVCHAT_HEADER"),
                  os.path.join(_HERE, "kvchat.h"),
                  os.path.join(_TREE, "include", "kvchat.h")]
    for c in candidates:
        if c and os.path.isfile(c):
            return c
    raise ImportError("kvchat: kvchat.h not found (looked in %s); set KVCHAT_HEADER"
                      % ", ".join(c for c in candidates if c))


def cdef_of_header(text):
    """kvchat.h's text as cffi declarations: comments and preprocessor lines
    dropped (the C++ guard's contents with them), integer #defines kept as
    constants and substituted into array sizes."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    out, defines, skip = [], {}, 0
    for line in text.split("\n"):
        s = line.strip()
        if s.startswith("#"):
            d = s[1:].strip()
            if skip:
                skip += 1 if d.startswith("if") else -1 if d.startswith("endif") else 0
                continue
            if d == "ifdef __cplusplus":
                skip = 1
                continue
            m = re.match(r"define\s+(\w+)\s+(-?\d+)$", d)
            if m:
                defines[m.group(1)] = m.group(2)
                out.append("#define %s %s" % m.groups())
            continue
        if not skip:
            out.append(line)
    cdef = "\n".join(out)
    for name, value in defines.items():
        cdef = re.sub(r"\[\s*%s\s*\]" % name, "[%s]" % value, cdef)
    return cdef


def _library_path():
    env = os.environ.get("KVCHAT_LIB")
    if env:
        return env
    if _paths is not None:
        p = os.path.normpath(os.path.join(_HERE, _paths.LIBDIR, "libkvchat.so.0"))
        if os.path.exists(p):
            return p
    p = os.path.join(_TREE, "build", "libkvchat.so")
    if os.path.exists(p):
        return p
    return "libkvchat.so.0"


ffi = cffi.FFI()
header = _header_path()
with open(header, encoding="utf-8") as f:
    ffi.cdef(cdef_of_header(f.read()))
ffi.cdef("void free(void *);")   # the library's malloc'd strings (found through its libc)
path = _library_path()
try:
    lib = ffi.dlopen(path)
except OSError as e:
    raise ImportError("kvchat: cannot load %s (%s); build it (ninja -C build kvchat_shared) "
                      "or set KVCHAT_LIB" % (path, e)) from None
