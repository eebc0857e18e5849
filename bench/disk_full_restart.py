# A full disk tier after kill -9 (issue 30 item 3): six conversations under one shared
# system prompt fill a small tier (--cache-disk 2), the server is killed, restarted, and
# the newest conversation's next turn says how much of its history came back from disk.
# Eviction by stamp alone lost the shared prompt first (0 tokens); leaves first keeps the
# newest conversations whole.   python3 bench/disk_full_restart.py build/kvchat [MiB]
import json, os, signal, subprocess, sys, time, urllib.request, shutil, random

BIN = sys.argv[1]; MIB = sys.argv[2] if len(sys.argv) > 2 else "2"
PORT = 18233
ROOT = os.environ.get("TMPDIR", "/tmp") + "/kvchat-disk-full-restart"
shutil.rmtree(ROOT, ignore_errors=True); os.makedirs(ROOT)
ENV = dict(os.environ, KVCHAT_CACHE=ROOT)
W = "river stone garden lamp quiet market silver window bread north candle forest letter".split()

def start():
    p = subprocess.Popen([BIN, "serve", "--port", str(PORT), "-t", "1", "--cache-disk", MIB],
                         env=ENV, stdout=subprocess.DEVNULL, stderr=open(ROOT + "/serve.log", "a"))
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1).read(); return p
        except Exception:
            if p.poll() is not None: raise SystemExit("server died")
            time.sleep(0.05)
    raise SystemExit("no start")

def chat(msgs, key):
    body = json.dumps({"messages": msgs, "max_tokens": 8, "temperature": 0,
                       "prompt_cache_key": key}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    r = json.loads(urllib.request.urlopen(req, timeout=120).read())
    return r["choices"][0]["message"]["content"], r["usage"]

def metric(name):
    t = urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics").read().decode()
    for l in t.splitlines():
        if l.startswith(name + " "): return float(l.split()[1])
    return -1

rnd = random.Random(3)
system = "You are a helpful assistant. " + " ".join(rnd.choice(W) for _ in range(200))
convs = [[{"role": "system", "content": system}] for _ in range(6)]
p = start()
for turn in range(3):                         # in turns: conversation 5 is the newest
    for i, c in enumerate(convs):
        c.append({"role": "user", "content": " ".join(rnd.choice(W) for _ in range(80))})
        reply, _ = chat(c, f"c{i}")
        c.append({"role": "assistant", "content": reply})
for _ in range(200):                          # everything written down, then kill -9
    if metric("kvchat_tier_writes_pending") == 0: break
    time.sleep(0.05)
used, budget = metric("kvchat_disk_used_bytes"), metric("kvchat_disk_budget_bytes")
p.send_signal(signal.SIGKILL); p.wait()
shutil.copytree(ROOT + "/kv", ROOT + "/kv-at-kill")
p = start()
out = []
for i in (5, 4, 0):
    c = convs[i] + [{"role": "user", "content": "and then?"}]
    _, u = chat(c, f"after{i}")
    out.append((i, u["prompt_tokens"], u["prompt_tokens_details"].get("cached_disk_tokens", 0)))
p.send_signal(signal.SIGTERM); p.wait()
print(f"tier {used/2**20:.2f} of {budget/2**20:.2f} MiB before kill -9; after the restart: " +
      "; ".join(f"conversation {i}: {d} of {n} prompt tokens from disk" for i, n, d in out))
sys.exit(0 if out[0][2] > 0.8 * out[0][1] else 1)
