# Memory of one conversation on a hybrid recurrent model (issue 32): a chat of about
# WORDS words (~4 tokens each... see the printed count) through `kvchat serve`, its reply
# canonicalized in the background, then /metrics: the recurrent-state snapshots the
# conversation left in RAM (count, pool bytes, payload) against its K/V, and the live
# states beside the pool.
#   build/kvchat make-model -o /tmp/q36-4l.gguf --preset qwen3.6-35b-a3b --n-layer 4
#   python3 bench/snapshot_memory.py build/kvchat /tmp/q36-4l.gguf 4000 [-t 2] [--budget MIB]
import argparse, os, random, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve import Server, tmp_root, WORDS

ap = argparse.ArgumentParser()
ap.add_argument("bin"); ap.add_argument("model"); ap.add_argument("words", type=int)
ap.add_argument("-t", "--threads", type=int, default=2)
ap.add_argument("--budget", type=int, default=2048, help="--kv-budget MiB (room for every "
                "snapshot the conversation takes)")
ap.add_argument("--port", type=int, default=18234)
A = ap.parse_args()

ctx = (A.words * 4 + 2048) // 1024 * 1024
rnd = random.Random(A.words)
msgs = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Remember this text: " +
         " ".join(rnd.choice(WORDS) for _ in range(A.words))}]
s = Server(A.bin, A.port, ["-m", A.model, "--parallel", "1", "-c", str(ctx), "-t", str(A.threads),
                           "--kv-budget", str(A.budget), "--cache-disk", "0"],
           log=tmp_root("kvchat-snapshot-memory.log"), wait_s=600)
try:
    _, u, t, secs = s.chat(msgs, "conv1", 8)
    s.settle()                                # the reply's canonical tokens and their snapshot
    m = s.metrics()
finally:
    s.stop()
snap = m["kvchat_snapshot_bytes_held"]
kv = m["kvchat_kv_bytes_held"] - snap
n = m["kvchat_snapshots"]
print(f"{A.model}: a conversation of {u['prompt_tokens']} prompt tokens + 8 generated "
      f"(prefill {t.get('prompt_ms', 0) / 1000:.1f} s)")
print(f"  snapshots in RAM: {n:.0f}, {snap / 2**20:.1f} MiB of pool blocks "
      f"(payload {m['kvchat_snapshot_payload_bytes'] / 2**20:.1f} MiB, "
      f"{m['kvchat_snapshot_payload_bytes'] / max(n, 1) / 2**20:.2f} MiB each); "
      f"taken {m['kvchat_snapshots_taken_total']:.0f}, evicted {m['kvchat_snapshots_evicted_total']:.0f}")
print(f"  K/V: {kv / 2**20:.1f} MiB; snapshots / K/V = {snap / max(kv, 1):.2f}")
print(f"  live states: {m['kvchat_live_states']:.0f} ({m['kvchat_live_state_bytes'] / 2**20:.1f} MiB), "
      f"pool {m['kvchat_kv_blocks_total'] * m['kvchat_kv_block_bytes'] / 2**20:.0f} MiB "
      f"(--kv-budget {A.budget} MiB)")
