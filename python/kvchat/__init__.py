"""kvchat for Python: the kvchat engine (libkvchat.so) through cffi.

    import kvchat
    m = kvchat.Model("model.gguf")
    m.create_chat_completion([{"role": "user", "content": "Hello!"}])   # OpenAI-shaped dict
    s = m.chat_session(system="Be brief.")
    s.send("Hello!"); s.send("And then?")     # turn 2 computes only its new tokens
    s.last_stats                              # prompt, cached, computed tokens, TTFT, ...
    m.tokenize("Hello"), m.generate("Once upon a time", max_tokens=16)
"""
from . import _lib
from .chat import ChatSession, KvchatError
from .model import Model, make_model

try:
    from ._paths import VERSION as __version__
except ImportError:
    __version__ = "dev"

library_path = _lib.path       # the libkvchat.so in use
header_path = _lib.header      # the kvchat.h its declarations were read from

__all__ = ["Model", "ChatSession", "KvchatError", "make_model", "library_path", "header_path",
           "__version__"]
