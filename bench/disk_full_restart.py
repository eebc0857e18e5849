# A full disk tier after kill -9 (issue 30 item 3): six conversations under one shared
# system prompt fill a small tier (--cache-disk 2), the server is killed, restarted, and
# the newest conversation's next turn says how much of its history came back from disk.
# Eviction by stamp alone lost the shared prompt first (0 tokens); leaves first keeps the
# newest conversations whole.   python3 bench/disk_full_restart.py build/kvchat [MiB]
import os, signal, sys, shutil, random, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve import Server, tmp_root, WORDS

BIN = sys.argv[1]; MIB = sys.argv[2] if len(sys.argv) > 2 else "2"
PORT = 18233
ROOT = tmp_root("kvchat-disk-full-restart")
shutil.rmtree(ROOT, ignore_errors=True); os.makedirs(ROOT)
ENV = dict(os.environ, KVCHAT_CACHE=ROOT)
W = WORDS[:13]

def start():
    return Server(BIN, PORT, ["-t", "1", "--cache-disk", MIB], env=ENV, log=ROOT + "/serve.log")

rnd = random.Random(3)
system = "You are a helpful assistant. " + " ".join(rnd.choice(W) for _ in range(200))
convs = [[{"role": "system", "content": system}] for _ in range(6)]
p = start()
for turn in range(3):                         # in turns: conversation 5 is the newest
    for i, c in enumerate(convs):
        c.append({"role": "user", "content": " ".join(rnd.choice(W) for _ in range(80))})
        reply = p.chat(c, f"c{i}", 8, 120)[0]
        c.append({"role": "assistant", "content": reply})
for _ in range(200):                          # everything written down, then kill -9
    if p.metric("kvchat_tier_writes_pending") == 0: break
    time.sleep(0.05)
used, budget = p.metric("kvchat_disk_used_bytes"), p.metric("kvchat_disk_budget_bytes")
p.stop(signal.SIGKILL)
shutil.copytree(ROOT + "/kv", ROOT + "/kv-at-kill")
p = start()
out = []
for i in (5, 4, 0):
    c = convs[i] + [{"role": "user", "content": "and then?"}]
    u = p.chat(c, f"after{i}", 8, 120)[1]
    out.append((i, u["prompt_tokens"], u["prompt_tokens_details"].get("cached_disk_tokens", 0)))
p.stop()
print(f"tier {used/2**20:.2f} of {budget/2**20:.2f} MiB before kill -9; after the restart: " +
      "; ".join(f"conversation {i}: {d} of {n} prompt tokens from disk" for i, n, d in out))
sys.exit(0 if out[0][2] > 0.8 * out[0][1] else 1)
