# TTFT of a conversation's next turn from RAM, from disk (after kill -9 and a restart) and
# recomputed, through `kvchat serve`, and whether the three replies agree. For hybrid
# recurrent models (qwen35, lfm2, ...) the restart must find the recurrent-state snapshot
# at the previous turn's end on disk as well as the blocks: the figures say how many
# snapshots were read back and what they weigh against the K/V.
#   python3 bench/disk_ttft.py build/kvchat MODEL.gguf WORDS... [-t THREADS] [--no-ram]
#   (WORDS e.g. 270 1080 4320: ~1k, ~4k, ~16k tokens; the context is sized to the history)
# Qwen3.5-9B shape, layers cut (issue 32):
#   build/kvchat make-model -o /tmp/q35-9b-4l.gguf --preset qwen3.5-9b --n-layer 4
#   python3 bench/disk_ttft.py build/kvchat /tmp/q35-9b-4l.gguf 1000 --no-ram
import argparse, os, random, shutil, signal, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve import Server, tmp_root, WORDS

ap = argparse.ArgumentParser()
ap.add_argument("bin"); ap.add_argument("model"); ap.add_argument("words", type=int, nargs="+")
ap.add_argument("-t", "--threads", type=int, default=2)
ap.add_argument("--no-ram", action="store_true", help="skip the RAM run (the slowest part: "
                "it computes turn 1 once more)")
ap.add_argument("--port", type=int, default=18231)
A = ap.parse_args()
LOG = tmp_root("kvchat-disk-ttft.log")

def start(cache_mib, cache_dir, ctx):
    return Server(A.bin, A.port, ["-m", A.model, "--parallel", "1", "-c", str(ctx),
                                  "-t", str(A.threads), "--cache-disk", str(cache_mib),
                                  "--cache-dir", cache_dir], log=LOG, wait_s=600)

def conv(n_words, seed):
    rnd = random.Random(seed)
    text = " ".join(rnd.choice(WORDS) for _ in range(n_words))
    return [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Remember this text: " + text}]

def line(name, u, t, secs):
    d = u["prompt_tokens_details"]
    return (f"  {name:10s} prompt {u['prompt_tokens']:5d}  cached {d['cached_tokens']:5d} "
            f"(disk {d.get('cached_disk_tokens', 0):5d})  computed {t['prompt_n']:5d}  "
            f"TTFT {t['ttft_ms']:8.1f} ms  (request {secs * 1000:8.1f} ms)")

def run(n_words, seed):
    ctx = max(6144, (n_words * 4 + 2048) // 1024 * 1024)
    d = tmp_root(f"kvchat-disk-ttft-{n_words}")
    shutil.rmtree(d, ignore_errors=True)
    c1 = conv(n_words, seed)
    out = {}
    if not A.no_ram:                      # A: turn 1 cold, turn 2 from RAM
        p = start(4096, d, ctx)
        r1 = p.chat(c1, "conv1", 12)[0]
        c2 = c1 + [{"role": "assistant", "content": r1}, {"role": "user", "content": "And then?"}]
        p.settle()                        # background canonicalization + write-through
        out["RAM"] = p.chat(c2, "conv1", 12)
        p.stop()
        shutil.rmtree(d, ignore_errors=True)
    # B: turn 1 on an empty tier, kill -9 once written, restart: turn 2 from disk
    p = start(4096, d, ctx)
    r1 = p.chat(c1, "conv1", 12)[0]
    c2 = c1 + [{"role": "assistant", "content": r1}, {"role": "user", "content": "And then?"}]
    p.settle()
    before = p.metrics()
    p.stop(signal.SIGKILL)
    p = start(4096, d, ctx)
    out["disk"] = p.chat(c2, "conv1", 12)
    after = p.metrics()
    p.stop()
    # C: recomputed (no tier, a fresh process)
    p = start(0, d, ctx)
    out["recompute"] = p.chat(c2, "conv1", 12)
    p.stop()
    cold = out["recompute"][0]
    print(f"history {out['recompute'][1]['prompt_tokens']} tokens ({A.model}, {A.threads} threads):")
    for name, (_, u, t, secs) in out.items():
        print(line(name, u, t, secs))
    print("  replies equal to the recomputed one: " +
          ", ".join(f"{k} {v[0] == cold}" for k, v in out.items() if k != "recompute"))
    if before.get("kvchat_snapshots_taken_total", 0) > 0:
        kv = before["kvchat_kv_bytes_held"] - before["kvchat_snapshot_bytes_held"]
        print(f"  before the kill: {before['kvchat_snapshots']:.0f} snapshots in RAM, "
              f"{before['kvchat_snapshot_bytes_held'] / 2**20:.1f} MiB of pool blocks "
              f"(payload {before['kvchat_snapshot_payload_bytes'] / 2**20:.1f} MiB) vs K/V "
              f"{kv / 2**20:.1f} MiB; {before['kvchat_snapshots_written_total']:.0f} written to disk")
        print(f"  after the restart: {after['kvchat_snapshots_fetched_total']:.0f} snapshot(s) read "
              f"from disk, {after['kvchat_snapshots_restored_total']:.0f} restored")
    for k in ("kvchat_disk_blocks_read_total", "kvchat_disk_bytes_read_total",
              "kvchat_disk_checksum_failures_total"):
        if k in after:
            print(f"    {k} {after[k]:.0f}")
    return out

for n in A.words:
    o = run(n, n)
    ok = o["disk"][0] == o["recompute"][0] and \
        o["disk"][1]["prompt_tokens_details"]["cached_tokens"] > 0
    if not ok:
        sys.exit(1)
