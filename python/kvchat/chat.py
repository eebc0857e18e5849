"""A conversation over one sequence of a Model's context: every call sends the
whole conversation (as OpenAI clients do) and kvchat computes only the tokens
its cache does not hold, with the reply a cold run would give."""
import json
import queue
import threading

from ._lib import ffi, lib


class KvchatError(RuntimeError):
    """A kvchat call failed: .status is the library's KVC_ERR_* code."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def check(status, err):
    if status != 0:
        text = ffi.string(err).decode("utf-8", "replace") if err is not None else ""
        raise KvchatError(status, text or ffi.string(lib.kvc_strerror(status)).decode())


def _text(v):
    return v if isinstance(v, str) else "".join(
        p.get("text", "") for p in v if isinstance(p, dict) and p.get("type", "text") == "text")


class _Closing:
    """close() on leaving a with-block, and on collection (errors ignored
    then): the base of the classes that hold library handles."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class _Messages:
    """OpenAI-style message dicts as a kvc_chat_message array; the C strings
    live as long as this object."""

    def __init__(self, messages):
        self.keep = []
        self.array = ffi.new("kvc_chat_message[]", max(1, len(messages)))
        self.n = len(messages)
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m:
                raise ValueError("message %d: a dict with a 'role' is needed, got %r" % (i, m))
            c = self.array[i]
            c.role = self._str(m["role"])
            content = m.get("content")
            if content is not None and not isinstance(content, (str, list)):
                raise ValueError("message %d: content must be a string or a list of parts" % i)
            c.content = self._str(_text(content)) if content is not None else ffi.NULL
            c.name = self._str(m.get("name"))
            c.tool_call_id = self._str(m.get("tool_call_id"))
            tc = m.get("tool_calls")
            c.tool_calls_json = self._str(json.dumps(tc) if tc is not None else None)
            c.reasoning_content = self._str(m.get("reasoning_content"))

    def _str(self, s):
        if s is None:
            return ffi.NULL
        b = ffi.new("char[]", s.encode("utf-8"))
        self.keep.append(b)
        return b


def chat_params(max_tokens=None, temperature=None, top_p=None, top_k=None, min_p=None,
                repeat_penalty=None, presence_penalty=None, frequency_penalty=None, seed=None,
                stop=None, no_cache=False, keep=None):
    """A kvc_chat_params from keyword arguments; None keeps the library's default.
    `keep` (a list) holds the C strings the params point to."""
    p = lib.kvc_chat_default_params()
    if max_tokens is not None:
        p.max_tokens = max_tokens
    s = p.sampling
    for name, v in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k),
                    ("min_p", min_p), ("repeat_penalty", repeat_penalty),
                    ("presence_penalty", presence_penalty),
                    ("frequency_penalty", frequency_penalty), ("seed", seed)):
        if v is not None:
            setattr(s, name, v)
    p.sampling = s
    if stop:
        stops = [stop] if isinstance(stop, str) else list(stop)
        strs = [ffi.new("char[]", x.encode("utf-8")) for x in stops]
        arr = ffi.new("const char *[]", strs)
        keep.extend(strs + [arr])
        p.stop = arr
        p.n_stop = len(stops)
    p.no_cache = bool(no_cache)
    return p


def stats_dict(st):
    return {
        "prompt_tokens": st.prompt_tokens, "cached_tokens": st.cached_tokens,
        "cached_disk_tokens": st.cached_disk_tokens, "computed_tokens": st.computed_tokens,
        "output_tokens": st.output_tokens, "prompt_ms": st.prompt_ms, "ttft_ms": st.ttft_ms,
        "decode_ms": st.decode_ms, "total_ms": st.total_ms, "prompt_tps": st.prompt_tps,
        "decode_tps": st.decode_tps,
        "finish_reason": ffi.string(st.finish_reason).decode() if st.finish_reason else None,
    }


class ChatSession(_Closing):
    """One conversation on sequence `seq` of model's context (a Model makes
    them: Model.chat_session()). send() appends a user message and the reply
    to .messages; chat() answers any message list: an edit, a regeneration or
    a branch reuses the longest cached prefix."""

    def __init__(self, model, seq, system=None, chat_template=None):
        self.model = model
        self.seq = seq
        self.messages = [{"role": "system", "content": system}] if system else []
        self.last_stats = None
        err = ffi.new("char[512]")
        tmpl = ffi.new("char[]", chat_template.encode()) if chat_template else ffi.NULL
        with model._lock:
            self._s = lib.kvc_session_new(model._ctx, seq, tmpl, err, 512)
        if self._s == ffi.NULL:
            model._release_seq(seq)
            raise KvchatError(-5, ffi.string(err).decode("utf-8", "replace"))

    @property
    def template(self):
        """The chat template in use (e.g. "the model's Jinja chat template, family chatml")."""
        return ffi.string(lib.kvc_session_template(self._s)).decode()

    def prompt(self, messages=None):
        """The text the conversation renders to, exactly as it is tokenized."""
        msgs = _Messages(self.messages if messages is None else messages)
        out = ffi.new("char **")
        err = ffi.new("char[512]")
        with self.model._lock:
            check(lib.kvc_session_prompt(self._s, msgs.array, msgs.n, ffi.NULL, out, err, 512), err)
        try:
            return ffi.string(out[0]).decode("utf-8")
        finally:
            lib.free(out[0])

    def chat(self, messages, stream=False, **sampling):
        """The assistant's reply to `messages` (a list of OpenAI-style dicts):
        its text, or with stream=True an iterator of text pieces. The figures
        of the turn (prompt, cached, computed tokens, times) are .last_stats
        once it finished. Sampling keywords: max_tokens, temperature, top_p,
        top_k, min_p, repeat_penalty, presence_penalty, frequency_penalty,
        seed, stop, no_cache."""
        if stream:
            return self._stream(messages, sampling)
        return self._run(messages, sampling, None)

    def send(self, content, stream=False, **sampling):
        """Append a user message, generate the reply, append it; the reply
        (or, streaming, an iterator of its pieces; appended when it ends)."""
        self.messages.append({"role": "user", "content": content})
        if not stream:
            try:
                reply = self.chat(self.messages, **sampling)
            except Exception:
                self.messages.pop()
                raise
            self.messages.append({"role": "assistant", "content": reply})
            return reply

        def pieces():
            got = []
            try:
                for p in self.chat(self.messages, stream=True, **sampling):
                    got.append(p)
                    yield p
            except BaseException:
                self.messages.pop()
                raise
            self.messages.append({"role": "assistant", "content": "".join(got)})
        return pieces()

    def reset(self, system=None):
        """A new conversation (the cache keeps the old one's blocks for others)."""
        self.messages = [{"role": "system", "content": system}] if system else []
        with self.model._lock:
            lib.kvc_session_reset(self._s)

    def close(self):
        """Free the session and its sequence (its cached blocks stay in the
        context's prefix tree for others)."""
        if getattr(self, "_s", None) is not None and self._s != ffi.NULL:
            with self.model._lock:
                lib.kvc_session_free(self._s)
            self._s = None
            self.model._release_seq(self.seq)

    # ------------------------------------------------------------ running

    def _run(self, messages, sampling, on_piece):
        """Run one turn: the reply text; sets last_stats. on_piece(text) ->
        bool, when given, is called with each piece as it comes (False stops
        the reply)."""
        if self._s is None:
            raise KvchatError(-5, "the session is closed")
        keep = []
        msgs = _Messages(messages)
        params = ffi.new("kvc_chat_params *", chat_params(keep=keep, **sampling))
        stream_fn = ffi.NULL
        if on_piece is not None:
            @ffi.callback("bool(const char *, size_t, void *)", onerror=lambda *a: False)
            def stream_fn(text, length, user):
                return bool(on_piece(ffi.unpack(text, length).decode("utf-8", "replace")))
        reply = ffi.new("char **")
        st = ffi.new("kvc_chat_stats *")
        err = ffi.new("char[512]")
        with self.model._lock:
            rc = lib.kvc_session_chat(self._s, msgs.array, msgs.n, params, stream_fn, ffi.NULL,
                                      reply, st, err, 512)
        text = ""
        if reply[0] != ffi.NULL:
            text = ffi.string(reply[0]).decode("utf-8", "replace")
            lib.free(reply[0])
        check(rc, err)
        self.last_stats = stats_dict(st)
        return text

    def _stream(self, messages, sampling):
        """The turn on a worker thread (the C call blocks; cffi lets go of the
        GIL), its pieces handed over through a queue. Closing the iterator
        early stops the reply."""
        q = queue.Queue()
        stop = threading.Event()
        done = object()

        def on_piece(p):
            q.put(p)
            return not stop.is_set()

        def work():
            try:
                self._run(messages, sampling, on_piece)
                q.put(done)
            except BaseException as e:   # handed to the consumer
                q.put(e)

        t = threading.Thread(target=work, daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if item is done:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            t.join()
