# Start time and memory of `kvchat serve` with a given disk tier directory (issue 30: the
# disk tier at its default size). Fill a directory first with bench_block_store (a full
# 4 GiB tier of Qwen2.5-0.5B-shaped blocks is 21,800 files):
#   ./bench_block_store /tmp/full4g 21800
#   python3 bench/disk_start.py build/kvchat /tmp/full4g [runs]
# Prints, per run, the seconds to a healthy /health, the peak and current RSS, and the
# blocks the tier indexed. The first run after writing may find the files' headers cold.
import subprocess, sys, time, urllib.request

BIN, DIR = sys.argv[1], sys.argv[2]
RUNS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
PORT = 18241
for _ in range(RUNS):
    t0 = time.time()
    p = subprocess.Popen([BIN, "serve", "--port", str(PORT), "-t", "1", "--cache-dir", DIR],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1).read()
            break
        except Exception:
            if p.poll() is not None:
                raise SystemExit("the server died")
            time.sleep(0.02)
    t = time.time() - t0
    st = {l.split(":")[0]: l.split()[1] for l in open(f"/proc/{p.pid}/status")
          if l.startswith(("VmRSS", "VmHWM"))}
    m = urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics").read().decode()
    blocks = next((l.split()[1] for l in m.splitlines() if l.startswith("kvchat_disk_blocks ")),
                  "?")
    p.terminate()
    p.wait()
    print(f"start {t:.2f} s; peak RSS {int(st['VmHWM']) / 1024:.1f} MiB, RSS "
          f"{int(st['VmRSS']) / 1024:.1f} MiB; {blocks} blocks indexed")
