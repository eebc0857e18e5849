"""The Python package against the C library it wraps: each figure checked
against a reference that shares nothing with the warm path (a fresh Model, or
the kvchat command in another process)."""
import json
import os
import subprocess

import pytest

import kvchat

BIN = os.environ.get("KVC_BIN")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return kvchat.make_model(str(tmp_path_factory.mktemp("m") / "tiny.gguf"), "tiny")


@pytest.fixture(scope="module")
def model(model_path):
    with kvchat.Model(model_path, n_ctx=512, n_threads=1) as m:
        yield m


def fresh(model_path):
    return kvchat.Model(model_path, n_ctx=512, n_threads=1)


CONV = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there!"}]


def test_loads_the_library_it_was_pointed_at():
    if os.environ.get("KVCHAT_LIB"):
        assert kvchat.library_path == os.environ["KVCHAT_LIB"]
    assert kvchat.header_path.endswith("kvchat.h")


def test_info(model):
    assert model.info["arch"] == "qwen2" and model.info["n_layer"] == 2
    assert model.n_ctx == 512 and model.n_vocab == model.info["n_vocab"] > 256


def test_tokenize_round_trip_and_cli(model, model_path):
    text = "Hello world, this is kvchat."
    ids = model.tokenize(text, add_special=False)
    assert ids and model.detokenize(ids) == text
    if BIN:
        out = subprocess.run([BIN, "tokenize", "-m", model_path, "--ids", "--no-bos", text],
                             capture_output=True, text=True, check=True).stdout
        assert json.loads(out) == ids


def test_generate_is_the_cli_s(model, model_path):
    text = model.generate("Once upon a time", max_tokens=12)
    assert isinstance(text, str) and text
    if BIN:
        out = subprocess.run([BIN, "generate", "-m", model_path, "-p", "Once upon a time", "-n", "12",
                              "--json", "-t", "1"], capture_output=True, text=True, check=True).stdout
        assert json.loads(out)["text"] == text


def test_generate_reuses_a_prefix_and_equals_a_cold_run(model, model_path):
    model.generate("The river carried small boats past", max_tokens=4)
    warm = model.generate("The river carried small boats past old stone houses", max_tokens=10)
    with fresh(model_path) as cold:
        assert cold.generate("The river carried small boats past old stone houses", max_tokens=10) == warm


def test_generate_stream_and_stop(model):
    full = model.generate("Once upon a time", max_tokens=16)
    pieces = list(model.generate("Once upon a time", max_tokens=16, stream=True))
    assert len(pieces) > 1 and "".join(pieces) == full
    stop = full[len(full) // 2:len(full) // 2 + 2]
    cut = model.generate("Once upon a time", max_tokens=16, stop=[stop])
    assert cut == full[:full.find(stop)]


def test_session_reuses_the_cache_with_a_cold_run_s_replies(model, model_path):
    s = model.chat_session(system="Be brief.")
    r1 = s.send("Hello there!", max_tokens=8, temperature=0)
    st1 = s.last_stats
    r2 = s.send("Tell me about rivers.", max_tokens=8, temperature=0)
    st2 = s.last_stats
    assert st1["computed_tokens"] == st1["prompt_tokens"] - st1["cached_tokens"]
    # turn 2 computes only what follows turn 1 (canonicalized when it ended)
    assert st2["cached_tokens"] >= st1["prompt_tokens"] + st1["output_tokens"]
    assert st2["computed_tokens"] < st2["prompt_tokens"] / 2
    assert [m["role"] for m in s.messages] == ["system", "user", "assistant", "user", "assistant"]
    with fresh(model_path) as cold:
        c = cold.chat_session()
        assert c.chat(s.messages[:2], max_tokens=8, temperature=0, no_cache=True) == r1
        assert c.chat(s.messages[:4], max_tokens=8, temperature=0, no_cache=True) == r2
        assert c.last_stats["cached_tokens"] == 0
    # an edit of turn 1: the system prompt stays cached, the answer is a cold run's
    edited = [s.messages[0], {"role": "user", "content": "Good morning!"}]
    r = s.chat(edited, max_tokens=8, temperature=0)
    assert 0 < s.last_stats["cached_tokens"] < s.last_stats["prompt_tokens"]
    with fresh(model_path) as cold:
        assert cold.chat_session().chat(edited, max_tokens=8, temperature=0) == r
    s.close()


def test_session_stream(model):
    with model.chat_session() as s:
        whole = s.chat(CONV, max_tokens=12, temperature=0)
        pieces = list(s.chat(CONV, max_tokens=12, temperature=0, stream=True))
        assert "".join(pieces) == whole and s.last_stats["cached_tokens"] > 0
        it = s.chat(CONV, max_tokens=64, temperature=0, stream=True, stop=None)
        next(it)
        it.close()                       # stops the reply; the session is usable after
        assert s.chat(CONV, max_tokens=12, temperature=0) == whole


def test_create_chat_completion_shape_and_cache(model, model_path):
    r = model.create_chat_completion(CONV, max_tokens=6, temperature=0)
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
    assert r["model"] == model.info["name"] and isinstance(r["created"], int)
    ch = r["choices"][0]
    assert ch["index"] == 0 and ch["message"]["role"] == "assistant"
    assert ch["finish_reason"] in ("length", "stop")
    u = r["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] and u["completion_tokens"] <= 6
    conv2 = CONV + [ch["message"], {"role": "user", "content": "And then?"}]
    r2 = model.create_chat_completion(conv2, max_tokens=6, temperature=0)
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] >= u["prompt_tokens"]
    assert r2["timings"]["prompt_n"] < r2["usage"]["prompt_tokens"] / 2
    with fresh(model_path) as cold:
        c2 = cold.create_chat_completion(conv2, max_tokens=6, temperature=0)
        assert c2["choices"][0]["message"]["content"] == r2["choices"][0]["message"]["content"]
        assert c2["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_create_chat_completion_stream(model):
    whole = model.create_chat_completion(CONV, max_tokens=8, temperature=0)
    chunks = list(model.create_chat_completion(CONV, max_tokens=8, temperature=0, stream=True,
                                               stream_options={"include_usage": True}))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == \
        whole["usage"]["completion_tokens"]


def test_errors_say_what_was_wrong(model, tmp_path):
    with pytest.raises(kvchat.KvchatError, match="no-such.gguf"):
        kvchat.Model(str(tmp_path / "no-such.gguf"))
    with pytest.raises(ValueError, match="role"):
        model.create_chat_completion([{"content": "no role"}])
    with pytest.raises(ValueError, match="kv_type"):
        kvchat.Model("x.gguf", kv_type="q3")
    long = [{"role": "user", "content": "word " * 600}]
    with pytest.raises(kvchat.KvchatError) as e:
        model.create_chat_completion(long, max_tokens=8)
    assert e.value.status == -6     # KVC_ERR_CONTEXT_LENGTH
    with pytest.raises(kvchat.KvchatError, match="exceed the context"):
        model.generate("hi", max_tokens=1000)


def test_sessions_are_bounded_and_freed(model_path):
    with kvchat.Model(model_path, n_ctx=256, n_threads=1, n_seq=3) as m:
        s = m.chat_session()
        with pytest.raises(kvchat.KvchatError, match="every sequence"):
            m.chat_session()
        s.close()
        m.chat_session().close()       # its sequence came back
