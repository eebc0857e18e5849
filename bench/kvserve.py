# kvserve.py - what the bench scripts share about driving `kvchat serve` over HTTP:
# start it and wait for /health, send a chat turn, read /metrics, wait for the
# background writes, stop it (SIGTERM or SIGKILL). Python's standard library only.
#   from kvserve import Server
#   s = Server(BIN, PORT, ["-m", MODEL, "--cache-disk", "64"], env=..., log=PATH)
import json, os, signal, subprocess, time, urllib.request

WORDS = ("river stone garden lamp quiet market silver window bread north candle forest "
         "letter harbor violet engine paper summer clock salt").split()

def tmp_root(name):
    """$TMPDIR/<name> (or /tmp/<name>): where a script keeps its directories."""
    return os.path.join(os.environ.get("TMPDIR", "/tmp"), name)

class Server:
    """One `kvchat serve` process on 127.0.0.1:port with the given arguments."""

    def __init__(self, bin, port, args, env=None, log=None, wait_s=120):
        self.port = port
        cmd = [bin, "serve", "--port", str(port), *args]
        err = open(log, "a") if log else subprocess.DEVNULL
        self.p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        t_end = time.time() + wait_s
        while True:
            try:
                urllib.request.urlopen(self.url("/health"), timeout=1).read()
                return
            except Exception:
                if self.p.poll() is not None:
                    raise SystemExit(f"server died: {' '.join(cmd)}")
                if time.time() > t_end:
                    self.stop(signal.SIGKILL)
                    raise SystemExit("server did not start")
                time.sleep(0.05)

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def chat(self, msgs, key, max_tokens=16, timeout=1800):
        """A greedy chat turn: (reply text, usage, timings, seconds it took)."""
        body = json.dumps({"model": "m", "messages": msgs, "max_tokens": max_tokens,
                           "temperature": 0, "prompt_cache_key": key}).encode()
        req = urllib.request.Request(self.url("/v1/chat/completions"), body,
                                     {"Content-Type": "application/json"})
        t0 = time.time()
        r = json.loads(urllib.request.urlopen(req, timeout=timeout).read())
        return (r["choices"][0]["message"]["content"], r["usage"], r.get("timings", {}),
                time.time() - t0)

    def metrics(self):
        """/metrics as {name: value} (unlabelled samples only)."""
        out = {}
        for l in urllib.request.urlopen(self.url("/metrics")).read().decode().splitlines():
            if l and not l.startswith("#") and "{" not in l:
                name, v = l.split()[:2]
                out[name] = float(v)
        return out

    def metric(self, name):
        return self.metrics().get(name, -1)

    def settle(self, quiet_s=4.0):
        """Wait until background work (canonicalization, write-through) is done:
        nothing pending and the computed/written counters still for quiet_s."""
        keys = ("kvchat_computed_tokens_total", "kvchat_disk_blocks_written_total",
                "kvchat_tier_writes_pending", "kvchat_snapshots_written_total")
        last, still = None, 0.0
        while still < quiet_s:
            time.sleep(0.5)
            m = self.metrics()
            now = [m.get(k) for k in keys]
            still = still + 0.5 if now == last and m.get("kvchat_tier_writes_pending", 0) == 0 else 0
            last = now

    def stop(self, sig=signal.SIGTERM):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        self.p.wait()
