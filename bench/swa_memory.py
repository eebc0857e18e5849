#!/usr/bin/env python3
"""Issue 31's memory figure through a running server's /metrics: a prompt of
N token ids (default 16000), a streamed reply of GEN tokens; while it decodes,
/metrics is read: the blocks in use (every full layer's K/V: block bytes) and
the window chunks a sequence holds (window chunk bytes). Printed beside what
the issue allows: the full layers' K/V of every position, one window per
windowed layer (ceil(w / B) + 1 chunks) and a block. Then the next turn
(prompt + reply's text as tokens + 50 ids) and the tokens it reused.

    python3 bench/swa_memory.py URL WINDOW [--n 16000] [--gen 64]

E.g. `kvchat make-model -o g.gguf --preset gemma3-4b --n-layer 6 --n-embd 64
--n-ff 64 --type f32` (the Gemma-3-4B KV layout: 4 KV heads of 256, window
1024, one global layer in six; the rest small), `kvchat serve -m g.gguf -c
17000 --parallel 1 --cache-disk 0`. Python's standard library only.
"""
import json, sys, threading, time, urllib.request


def post(url, path, body, stream=False):
    req = urllib.request.Request(url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    r = urllib.request.urlopen(req, timeout=7200)
    return r if stream else json.loads(r.read())


def metrics(url):
    out = {}
    for line in urllib.request.urlopen(url + "/metrics", timeout=60).read().decode().splitlines():
        if line.startswith("kvchat_kv_"):
            k, v = line.split()
            out[k] = float(v)
    return out


def main():
    a = sys.argv[1:]
    if len(a) < 2:
        raise SystemExit(__doc__)
    url, w = a[0].rstrip("/"), int(a[1])
    o = {"n": 16000, "gen": 64}
    for i in range(2, len(a) - 1, 2):
        o[a[i][2:]] = int(a[i + 1])
    prompt = [1000 + (2654435761 * (i + 1)) % 150000 for i in range(o["n"])]
    peak = {"held": 0}
    done = threading.Event()

    def poll():
        while not done.is_set():
            m = metrics(url)
            held = m["kvchat_kv_blocks_used"] * m["kvchat_kv_block_bytes"] + \
                m["kvchat_kv_window_chunks_held"] * m["kvchat_kv_window_chunk_bytes"]
            if m["kvchat_kv_window_chunks_held"] > 0 and held > peak["held"]:
                peak.update(held=held, m=m)
            time.sleep(0.05)

    th = threading.Thread(target=poll)
    t0 = time.time()
    r = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": o["gen"], "temperature": 0,
                                      "stream": True,
                                      "stream_options": {"include_usage": True}}, stream=True)
    text, started = "", False
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        for c in ev.get("choices") or []:
            text += c.get("text") or ""
            if not started:   # decoding: the prompt is in; watch from now on
                started = True
                th.start()
    done.set()
    if started:
        th.join()
    print(f"prompt {o['n']} tokens + {o['gen']} generated in {time.time() - t0:.0f} s")
    m = peak.get("m")
    if not m:
        raise SystemExit("no reading while decoding")
    B = m["kvchat_kv_block_tokens"]
    n = o["n"] + o["gen"]
    blocks = -(-n // B)
    full = blocks * m["kvchat_kv_block_bytes"]
    win = (-(-w // B) + 1) * m["kvchat_kv_window_chunk_bytes"]
    held = peak["held"]
    every = blocks * (m["kvchat_kv_block_bytes"] + m["kvchat_kv_window_chunk_bytes"])
    mib = lambda x: f"{x / 2**20:.1f} MiB"
    print(f"held while decoding (/metrics): {mib(held)} = {m['kvchat_kv_blocks_used']:.0f} blocks "
          f"x {m['kvchat_kv_block_bytes']:.0f} B + {m['kvchat_kv_window_chunks_held']:.0f} window "
          f"chunks x {m['kvchat_kv_window_chunk_bytes']:.0f} B")
    print(f"allowed: full layers {mib(full)} + one window {mib(win)} + one block "
          f"{mib(m['kvchat_kv_block_bytes'] + m['kvchat_kv_window_chunk_bytes'])} = "
          f"{mib(full + win + m['kvchat_kv_block_bytes'] + m['kvchat_kv_window_chunk_bytes'])}; "
          f"every layer's K/V: {mib(every)} ({every / held:.2f}x)")
    toks = post(url, "/tokenize", {"content": text, "add_special": False,
                                   "parse_special": False})["tokens"]
    nxt = prompt + toks + [1000 + i for i in range(50)]
    u = post(url, "/v1/completions", {"prompt": nxt, "max_tokens": 4, "temperature": 0})["usage"]
    print(f"next turn: {u['prompt_tokens']} prompt tokens, "
          f"{u['prompt_tokens_details']['cached_tokens']} cached "
          f"(shares {o['n'] + len(toks)} with the first)")


if __name__ == "__main__":
    main()
