# Crash safety of the disk tier through `kvchat serve` on the demo model: SIGKILL the
# server at random moments during heavy writes, restart, check that no corrupt block is
# used and that replies equal cold runs.   python3 bench/disk_crash.py build/kvchat [rounds]

import os, random, signal, sys, threading, time, shutil
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve import Server, tmp_root, WORDS
BIN = sys.argv[1]; ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 50
PORT = 18232
ROOT = tmp_root("kvchat-disk-crash")
shutil.rmtree(ROOT, ignore_errors=True)
os.makedirs(ROOT)
ENV = dict(os.environ, KVCHAT_CACHE=ROOT)
W = WORDS[:13]

def start(disk):
    return Server(BIN, PORT, ["-t", "1", "--parallel", "4", "--cache-disk", str(disk)], env=ENV,
                  log=ROOT + "/serve.log")

rnd = random.Random(7)
convs = [[{"role": "system", "content": "You are helpful."},
          {"role": "user", "content": " ".join(rnd.choice(W) for _ in range(150 + 40 * i))}]
         for i in range(4)]
p = start(0)                                  # cold references
turn2, cold = [], []
for i, c in enumerate(convs):
    r1 = p.chat(c, f"c{i}", 16, 120)[0]
    t2 = c + [{"role": "assistant", "content": r1}, {"role": "user", "content": "more please"}]
    turn2.append(t2); cold.append(p.chat(t2, f"cold{i}", 16, 120)[0])
p.stop()

bad = mismatches = 0; disk_tok = 0; loads = 0
for k in range(ROUNDS):
    p = start(64)                              # small budget: evictions on disk too
    loads += 1
    bad += p.metric("kvchat_disk_checksum_failures_total")
    def load(j):
        try:
            c = convs[j % 4] + [{"role": "assistant", "content": "ok"},
                                {"role": "user", "content": " ".join(rnd.choice(W) for _ in range(60))}]
            p.chat(c, f"x{k}-{j}", 16, 120)
        except Exception:
            pass
    ts = [threading.Thread(target=load, args=(j,)) for j in range(6)]
    for t in ts: t.start()
    time.sleep(rnd.random() * 1.5)
    p.stop(signal.SIGKILL)
    for t in ts: t.join()
    p = start(64)
    i = k % 4
    got, u, _, _ = p.chat(turn2[i], f"r{k}", 16, 120)
    mismatches += got != cold[i]
    disk_tok += u["prompt_tokens_details"].get("cached_disk_tokens", 0)
    bad += p.metric("kvchat_disk_checksum_failures_total")
    p.stop(signal.SIGKILL)
files = os.listdir(ROOT + "/kv")
print(f"{ROUNDS} rounds: {2*ROUNDS} SIGKILLs (half during writes), {loads + ROUNDS} restarts; "
      f"checksum failures {int(bad)}; replies differing from cold runs {mismatches}; "
      f"cached tokens read from disk after restarts {disk_tok}; {len(files)} files in the tier")
sys.exit(1 if bad or mismatches else 0)
