# TTFT of the next turn from RAM, from disk (after kill -9 and a restart) and
# recomputed, through `kvchat serve`, and whether the three replies agree.
#   python3 bench/disk_ttft.py build/kvchat MODEL.gguf WORDS... (e.g. 270 1080 4320: ~1k, ~4k,
#   ~16k tokens; the context is sized to the history)
import json, os, signal, subprocess, sys, time, urllib.request, shutil, random

BIN = sys.argv[1]
MODEL = sys.argv[2]
PORT = 18231
WORDS = ("river stone garden lamp quiet market silver window bread north candle forest "
         "letter harbor violet engine paper summer clock salt").split()

CTX = 6144

def start(cache_mib, cache_dir, extra=()):
    args = [BIN, "serve", "-m", MODEL, "--port", str(PORT), "--parallel", "1", "-c", str(CTX),
            "-t", "2", "--cache-disk", str(cache_mib), "--cache-dir", cache_dir, *extra]
    log = open(os.environ.get("TMPDIR", "/tmp") + "/kvchat-disk-ttft.log", "a")
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1).read()
            return p
        except Exception:
            if p.poll() is not None:
                raise SystemExit("server died")
            time.sleep(0.1)
    raise SystemExit("server did not start")

def chat(msgs, key="conv1"):
    body = json.dumps({"model": "m", "messages": msgs, "max_tokens": 12, "temperature": 0,
                       "prompt_cache_key": key}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    r = json.loads(urllib.request.urlopen(req, timeout=1800).read())
    return r["choices"][0]["message"]["content"], r["usage"], r["timings"]

def metrics():
    return urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics").read().decode()

def settle():
    """Wait until the background work (canonicalization, write-through) is done:
    the disk writes stop moving for 4 s."""
    last, same = None, 0
    while same < 8:
        time.sleep(0.5)
        w = [l for l in metrics().splitlines() if l.startswith("kvchat_disk_blocks_written_total")
             or l.startswith("kvchat_computed_tokens_total")]
        same = same + 1 if w == last else 0
        last = w

def conv(n_words, seed):
    rnd = random.Random(seed)
    text = " ".join(rnd.choice(WORDS) for _ in range(n_words))
    return [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Remember this text: " + text}]

def stop(p, sig=signal.SIGTERM):
    p.send_signal(sig)
    p.wait()

def run(n_words, seed):
    global CTX
    CTX = max(6144, (n_words * 4 + 2048) // 1024 * 1024)
    d = f"{os.environ.get('TMPDIR', '/tmp')}/kvchat-disk-ttft-{n_words}"
    shutil.rmtree(d, ignore_errors=True)
    c1 = conv(n_words, seed)
    # A: turn 1 cold, turn 2 from RAM
    p = start(4096, d)
    r1, u1, t1 = chat(c1)
    c2 = c1 + [{"role": "assistant", "content": r1}, {"role": "user", "content": "And then?"}]
    settle()                              # background canonicalization + write-through
    r2_ram, u2_ram, t2_ram = chat(c2)
    stop(p)
    # B: the same directory wiped, turn 1 again, kill -9, restart: turn 2 from disk
    shutil.rmtree(d, ignore_errors=True)
    p = start(4096, d)
    chat(c1)
    settle()
    stop(p, signal.SIGKILL)
    p = start(4096, d)
    r2_disk, u2_disk, t2_disk = chat(c2)
    m = metrics()
    stop(p)
    # C: recomputed (no disk, fresh)
    p = start(0, d)
    r2_cold, u2_cold, t2_cold = chat(c2)
    stop(p)
    line = lambda name, u, t: (f"  {name:10s} prompt {u['prompt_tokens']:5d}  cached "
                               f"{u['prompt_tokens_details']['cached_tokens']:5d} (disk "
                               f"{u['prompt_tokens_details'].get('cached_disk_tokens', 0):5d})  "
                               f"computed {t['prompt_n']:5d}  TTFT {t['ttft_ms']:8.1f} ms")
    print(f"history {u2_cold['prompt_tokens']} tokens:")
    print(line("RAM", u2_ram, t2_ram))
    print(line("disk", u2_disk, t2_disk))
    print(line("recompute", u2_cold, t2_cold))
    print(f"  replies equal: RAM {r2_ram == r2_cold}, disk {r2_disk == r2_cold}")
    for l in m.splitlines():
        if l.startswith("kvchat_disk") or l.startswith("kvchat_cached_tokens_by_tier"):
            print("   ", l)

for n in [int(x) for x in sys.argv[3:]]:
    run(n, n)
