# Crash safety of the disk tier through `kvchat serve` on the demo model: SIGKILL the
# server at random moments during heavy writes, restart, check that no corrupt block is
# used and that replies equal cold runs.   python3 bench/disk_crash.py build/kvchat [rounds]

import json, os, random, signal, subprocess, sys, threading, time, urllib.request, shutil
BIN = sys.argv[1]; ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 50
PORT = 18232
ROOT = os.environ.get("TMPDIR", "/tmp") + "/kvchat-disk-crash"
shutil.rmtree(ROOT, ignore_errors=True)
os.makedirs(ROOT)
ENV = dict(os.environ, KVCHAT_CACHE=ROOT)
W = "river stone garden lamp quiet market silver window bread north candle forest letter".split()

def start(disk):
    p = subprocess.Popen([BIN, "serve", "--port", str(PORT), "-t", "1", "--parallel", "4",
                          "--cache-disk", str(disk)], env=ENV, stdout=subprocess.DEVNULL,
                         stderr=open(ROOT + "/serve.log", "a"))
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1).read(); return p
        except Exception:
            if p.poll() is not None: raise SystemExit("server died")
            time.sleep(0.05)
    raise SystemExit("no start")

def chat(msgs, key):
    body = json.dumps({"messages": msgs, "max_tokens": 16, "temperature": 0,
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

rnd = random.Random(7)
convs = [[{"role": "system", "content": "You are helpful."},
          {"role": "user", "content": " ".join(rnd.choice(W) for _ in range(150 + 40 * i))}]
         for i in range(4)]
p = start(0)                                  # cold references
turn2, cold = [], []
for i, c in enumerate(convs):
    r1, _ = chat(c, f"c{i}")
    t2 = c + [{"role": "assistant", "content": r1}, {"role": "user", "content": "more please"}]
    turn2.append(t2); cold.append(chat(t2, f"cold{i}")[0])
p.send_signal(signal.SIGTERM); p.wait()

bad = mismatches = 0; disk_tok = 0; loads = 0
for k in range(ROUNDS):
    p = start(64)                              # small budget: evictions on disk too
    loads += 1
    bad += metric("kvchat_disk_checksum_failures_total")
    def load(j):
        try:
            c = convs[j % 4] + [{"role": "assistant", "content": "ok"},
                                {"role": "user", "content": " ".join(rnd.choice(W) for _ in range(60))}]
            chat(c, f"x{k}-{j}")
        except Exception:
            pass
    ts = [threading.Thread(target=load, args=(j,)) for j in range(6)]
    for t in ts: t.start()
    time.sleep(rnd.random() * 1.5)
    p.send_signal(signal.SIGKILL); p.wait()
    for t in ts: t.join()
    p = start(64)
    i = k % 4
    got, u = chat(turn2[i], f"r{k}")
    mismatches += got != cold[i]
    disk_tok += u["prompt_tokens_details"].get("cached_disk_tokens", 0)
    bad += metric("kvchat_disk_checksum_failures_total")
    p.send_signal(signal.SIGKILL); p.wait()
files = os.listdir(ROOT + "/kv")
print(f"{ROUNDS} rounds: {2*ROUNDS} SIGKILLs (half during writes), {loads + ROUNDS} restarts; "
      f"checksum failures {int(bad)}; replies differing from cold runs {mismatches}; "
      f"cached tokens read from disk after restarts {disk_tok}; {len(files)} files in the tier")
sys.exit(1 if bad or mismatches else 0)
