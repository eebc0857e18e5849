"""A GGUF model and its context: tokenize, generate, chat sessions, and
create_chat_completion returning OpenAI-shaped dicts as llama-cpp-python does."""
import os
import threading
import time
import uuid
import weakref

from ._lib import ffi, lib
from .chat import ChatSession, KvchatError, _Closing, check

_KV_TYPES = {"f16": 0, "f32": 1, "q8_0": 2}
_SEQ_COMPLETION = 0   # create_chat_completion's session
_SEQ_GENERATE = 1     # generate()'s raw sequence
_SEQ_FIRST_FREE = 2   # chat_session()'s


def make_model(path, preset="demo", **shape):
    """Write a random-weight GGUF (kvchat make-model): a preset ("demo",
    "tiny", "tiny-llama", "tiny-qwen3", "qwen2.5-0.5b") with any of its fields
    overridden (arch, ftype, n_embd, n_layer, ..., seed). Returns path."""
    p = ffi.new("kvc_gen_params *")
    check(lib.kvc_gen_preset(preset.encode(), p), None)
    keep = []
    for k, v in shape.items():
        if not hasattr(p, k):
            raise ValueError("make_model: no field %r in kvc_gen_params" % k)
        if isinstance(v, str):
            v = ffi.new("char[]", v.encode())
            keep.append(v)
        setattr(p, k, v)
    err = ffi.new("char[512]")
    check(lib.kvc_gen_write(p, os.fsencode(path), err, 512), err)
    return path


class Model(_Closing):
    """A GGUF model loaded with one context of n_seq sequences sharing a KV
    pool (and its prefix tree: a prefix any sequence computed is reused by the
    others). Sequence 0 serves create_chat_completion, 1 generate(), the rest
    chat_session()s. One call at a time runs on the context (a lock).

    n_ctx: longest sequence (0 = the model's); n_batch: tokens per forward
    pass (0 = 512); n_threads (0 = all cores); kv_type "f16", "f32" or "q8_0";
    kv_blocks: the pool in blocks of 16 tokens (0 = n_seq full contexts);
    cache_dir / cache_disk_mib: a disk tier (the KV cache kept across runs)."""

    def __init__(self, model_path, n_ctx=0, n_batch=0, n_threads=0, n_seq=4, kv_type="f16",
                 kv_blocks=0, cache_dir=None, cache_disk_mib=0, chat_template=None):
        if n_seq < 3:
            raise ValueError("n_seq must be at least 3 (completions, generate, one session)")
        if kv_type not in _KV_TYPES:
            raise ValueError("kv_type must be one of %s, got %r" % (", ".join(_KV_TYPES), kv_type))
        self._lock = threading.RLock()
        self._model = self._ctx = None
        self.model_path = os.fspath(model_path)
        self.chat_template = chat_template
        err = ffi.new("char[512]")
        mp = ffi.new("kvc_model_params *", lib.kvc_model_default_params())
        out = ffi.new("kvc_model **")
        check(lib.kvc_model_load(os.fsencode(self.model_path), mp, out, err, 512), err)
        self._model = out[0]
        cp = ffi.new("kvc_context_params *", lib.kvc_context_default_params())
        cp.n_ctx, cp.n_batch, cp.n_threads, cp.n_seq = n_ctx, n_batch, n_threads, n_seq
        cp.kv_type, cp.kv_blocks = _KV_TYPES[kv_type], kv_blocks
        ctx = ffi.new("kvc_context **")
        check(lib.kvc_context_new(self._model, cp, ctx, err, 512), err)
        self._ctx = ctx[0]
        if cache_disk_mib:
            check(lib.kvc_context_enable_disk(self._ctx, os.fsencode(self.model_path),
                                              os.fsencode(cache_dir) if cache_dir else ffi.NULL,
                                              cache_disk_mib, err, 512), err)
        self._free_seqs = list(range(n_seq - 1, _SEQ_FIRST_FREE - 1, -1))
        self._sessions = weakref.WeakSet()   # closed before the context is freed
        self._gen_tokens = []      # what sequence 1 holds
        self._completion = ChatSession(self, _SEQ_COMPLETION, chat_template=chat_template)
        info = ffi.new("kvc_model_info *")
        lib.kvc_model_get_info(self._model, info)
        self.info = {k: (ffi.string(getattr(info, k)).decode() if k in ("name", "arch")
                         else getattr(info, k))
                     for k in ("name", "arch", "n_vocab", "n_ctx_train", "n_embd", "n_layer",
                               "n_head", "n_head_kv", "head_dim", "n_ff", "n_params",
                               "weight_bytes")}

    # ------------------------------------------------------------ basics

    @property
    def n_ctx(self):
        return lib.kvc_context_n_ctx(self._ctx)

    @property
    def n_vocab(self):
        return self.info["n_vocab"]

    def token_bos(self):
        return lib.kvc_model_token_bos(self._model)

    def token_eos(self):
        return lib.kvc_model_token_eos(self._model)

    def tokenize(self, text, add_special=True, parse_special=False):
        """Token ids of text (str or bytes). add_special: BOS as the vocabulary
        asks; parse_special: control-token text becomes those tokens."""
        b = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        n = lib.kvc_model_tokenize(self._model, b, len(b), add_special, parse_special, ffi.NULL, 0)
        if n < 0:
            check(n, None)
        out = ffi.new("int32_t[]", max(1, n))
        lib.kvc_model_tokenize(self._model, b, len(b), add_special, parse_special, out, n)
        return list(out[0:n])

    def detokenize(self, tokens, render_special=False):
        """The text of tokens, as one string (invalid UTF-8 becomes U+FFFD)."""
        d = lib.kvc_detokenizer_new(self._model, render_special)
        if d == ffi.NULL:
            raise MemoryError
        try:
            parts = [self._feed(d, t) for t in tokens]
            parts.append(self._feed(d, -1))
            return "".join(parts)
        finally:
            lib.kvc_detokenizer_free(d)

    def _feed(self, d, token):
        """The text token completes (-1: what is held back)."""
        cap = 64
        while True:
            buf = ffi.new("char[]", cap)
            k = lib.kvc_detokenizer_feed(d, token, buf, cap) if token >= 0 else \
                lib.kvc_detokenizer_flush(d, buf, cap)
            if k < 0:
                raise KvchatError(-5, "token %d is not in the vocabulary" % token)
            if k <= cap:
                return ffi.unpack(buf, k).decode("utf-8", "replace")
            cap = k

    # ------------------------------------------------------------ generate

    def generate(self, prompt, max_tokens=128, temperature=0.0, top_k=40, top_p=0.95,
                 min_p=0.05, repeat_penalty=1.0, seed=0, stop=None, ignore_eos=False,
                 stream=False):
        """Continue prompt (text, tokenized with BOS and special tokens, or a
        list of token ids) by up to max_tokens tokens; stops at an
        end-of-generation token or a stop string (not included). The text, or
        with stream=True an iterator of text pieces. Greedy by default. The
        longest prefix the previous generate() shares with this prompt is not
        computed again."""
        it = self._generate(prompt, max_tokens, temperature, top_k, top_p, min_p,
                            repeat_penalty, seed, stop, ignore_eos)
        return it if stream else "".join(it)

    def _generate(self, prompt, max_tokens, temperature, top_k, top_p, min_p, repeat_penalty,
                  seed, stop, ignore_eos):
        toks = list(prompt) if isinstance(prompt, (list, tuple)) else \
            self.tokenize(prompt, add_special=True, parse_special=True)
        if not toks:
            raise ValueError("generate: an empty prompt")
        if len(toks) + max_tokens > self.n_ctx:
            raise KvchatError(-6, "prompt (%d tokens) + %d to generate exceed the context of %d"
                              % (len(toks), max_tokens, self.n_ctx))
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        sp = ffi.new("kvc_sampler_params *", lib.kvc_sampler_default_params())
        sp.temperature, sp.top_k, sp.top_p, sp.min_p = temperature, top_k, top_p, min_p
        sp.repeat_penalty, sp.seed = repeat_penalty, seed
        smp = lib.kvc_sampler_new(sp, self.n_vocab)
        d = lib.kvc_detokenizer_new(self._model, False)
        err = ffi.new("char[512]")
        try:
            with self._lock:
                # reuse what sequence 1 holds of this prompt; at least the last
                # token is run again, for its logits
                keep = 0
                while keep < min(len(toks) - 1, len(self._gen_tokens)) and \
                        self._gen_tokens[keep] == toks[keep]:
                    keep += 1
                check(lib.kvc_context_seq_truncate(self._ctx, _SEQ_GENERATE, keep), None)
                self._gen_tokens = toks[:keep]
                new = toks[keep:]
                check(lib.kvc_context_decode(self._ctx, _SEQ_GENERATE,
                                             ffi.new("int32_t[]", new), len(new), False, err, 512),
                      err)
                self._gen_tokens = list(toks)
            for t in toks:
                lib.kvc_sampler_accept(smp, t)
            text, sent = "", 0
            for i in range(max_tokens):
                with self._lock:
                    tok = lib.kvc_sampler_sample(smp, lib.kvc_context_logits(self._ctx, -1))
                if not ignore_eos and lib.kvc_model_token_is_eog(self._model, tok):
                    break
                lib.kvc_sampler_accept(smp, tok)
                text += self._feed(d, tok)
                cut = min((text.find(s) for s in stops if s in text), default=-1)
                if cut >= 0:
                    text = text[:cut]
                    break
                # hold back what could still become a stop string
                hold = max((len(s) - 1 for s in stops), default=0)
                if len(text) - hold > sent:
                    yield text[sent:len(text) - hold]
                    sent = len(text) - hold
                if i + 1 < max_tokens:
                    with self._lock:
                        check(lib.kvc_context_decode(self._ctx, _SEQ_GENERATE,
                                                     ffi.new("int32_t[]", [tok]), 1, False, err,
                                                     512), err)
                        self._gen_tokens.append(tok)
            else:
                text += self._feed(d, -1)
            if len(text) > sent:
                yield text[sent:]
        finally:
            lib.kvc_detokenizer_free(d)
            lib.kvc_sampler_free(smp)

    # ------------------------------------------------------------ chat

    def chat_session(self, system=None):
        """A new conversation on a sequence of its own (n_seq - 2 at once;
        close() one to free its sequence)."""
        with self._lock:
            if not self._free_seqs:
                raise KvchatError(-10, "every sequence has a session: close one, or make the "
                                       "Model with a larger n_seq")
            seq = self._free_seqs.pop()
        s = ChatSession(self, seq, system=system, chat_template=self.chat_template)
        self._sessions.add(s)
        return s

    def _release_seq(self, seq):
        if seq >= _SEQ_FIRST_FREE:
            with self._lock:
                self._free_seqs.append(seq)

    def create_chat_completion(self, messages, max_tokens=None, temperature=0.2, top_p=0.95,
                               top_k=40, min_p=0.05, repeat_penalty=1.0, presence_penalty=0.0,
                               frequency_penalty=0.0, seed=None, stop=None, stream=False,
                               stream_options=None, model=None, cache_prompt=True):
        """An OpenAI chat completion, as llama-cpp-python's Llama returns it
        (same defaults): a dict {"id", "object": "chat.completion", "created",
        "model", "choices": [{"index", "message": {"role", "content"},
        "logprobs", "finish_reason"}], "usage": {"prompt_tokens",
        "completion_tokens", "total_tokens", "prompt_tokens_details":
        {"cached_tokens"}}} plus llama-server's "timings"; with stream=True an
        iterator of "chat.completion.chunk" dicts. Successive calls with a
        growing conversation compute only the new tokens."""
        sampling = dict(max_tokens=max_tokens if max_tokens is not None else 0,
                        temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                        repeat_penalty=repeat_penalty, presence_penalty=presence_penalty,
                        frequency_penalty=frequency_penalty,
                        seed=seed if seed is not None else int.from_bytes(os.urandom(8), "little"),
                        stop=stop, no_cache=not cache_prompt)
        cid = "chatcmpl-" + uuid.uuid4().hex
        created = int(time.time())
        name = model or self.info["name"]
        s = self._completion
        if not stream:
            reply = s.chat(messages, **sampling)
            return {"id": cid, "object": "chat.completion", "created": created, "model": name,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                                 "logprobs": None,
                                 "finish_reason": s.last_stats["finish_reason"]}],
                    "usage": _usage(s.last_stats), "timings": _timings(s.last_stats)}

        def chunks():
            def chunk(delta, finish=None):
                return {"id": cid, "object": "chat.completion.chunk", "created": created,
                        "model": name, "choices": [{"index": 0, "delta": delta,
                                                    "logprobs": None, "finish_reason": finish}]}
            yield chunk({"role": "assistant"})
            for piece in s.chat(messages, stream=True, **sampling):
                yield chunk({"content": piece})
            last = chunk({}, s.last_stats["finish_reason"])
            last["timings"] = _timings(s.last_stats)
            yield last
            if stream_options and stream_options.get("include_usage"):
                yield {"id": cid, "object": "chat.completion.chunk", "created": created,
                       "model": name, "choices": [], "usage": _usage(s.last_stats)}
        return chunks()

    # ------------------------------------------------------------ lifetime

    def close(self):
        """Free the context and the model, and close its sessions."""
        for sess in list(getattr(self, "_sessions", ())):
            sess.close()
        if getattr(self, "_completion", None) is not None:
            self._completion.close()
            self._completion = None
        if getattr(self, "_ctx", None) is not None:
            lib.kvc_context_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None) is not None:
            lib.kvc_model_free(self._model)
            self._model = None


def _usage(st):
    return {"prompt_tokens": st["prompt_tokens"], "completion_tokens": st["output_tokens"],
            "total_tokens": st["prompt_tokens"] + st["output_tokens"],
            "prompt_tokens_details": {"cached_tokens": st["cached_tokens"]}}


def _timings(st):
    return {"prompt_n": st["computed_tokens"], "cache_n": st["cached_tokens"],
            "prompt_ms": st["prompt_ms"], "predicted_n": st["output_tokens"],
            "predicted_ms": st["decode_ms"], "ttft_ms": st["ttft_ms"]}
