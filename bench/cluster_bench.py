#!/usr/bin/env python3
"""cluster_bench.py - figures for the shared tier (README "Beyond one machine").

  ttft      TTFT of the next turn on a second instance, its history (H tokens)
            read from Redis, against the same turn recomputed (cache_prompt
            false), for each H in --history (default 1000,4000).
  workload  N conversations x T turns sharing a system prompt (as `kvchat bench
            sessions`), across 2 instances: requests alternating between them
            or routed by HAProxy, with and without Redis. Prints computed
            tokens on turns 2+, where cached tokens came from, and wall time.

Starts redis-server, kvchat serve instances and HAProxy on free loopback
ports (deploy/haproxy.cfg.in), and stops them all at the end. Debian's
python3 only; kvchat from --kvchat (default ./build/kvchat).
"""
import argparse, json, os, shutil, signal, socket, subprocess, sys, tempfile, time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
WORDS = ("river lantern copper meadow signal harbor thistle orbit pebble canyon violet engine "
         "marble falcon ember quiet north window garden silver").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def text(n_words, seed):
    return " ".join(WORDS[(i * 7 + seed * 13 + i // 5) % len(WORDS)] for i in range(n_words))


def post(port, body, timeout=3600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.load(r)
    out["_seconds"] = time.time() - t0
    return out


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        m = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#") and "{" not in line:
                k, v = line.split(" ", 1)
                m[k] = float(v)
        return m


class Cluster:
    def __init__(self, args, n, redis, router):
        self.procs, self.dir = [], tempfile.mkdtemp(prefix="kvc_bench_cluster_")
        self.redis_port = free_port() if redis else None
        if redis:
            self.spawn(["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
                        "--save", "", "--appendonly", "no", "--maxmemory", "4gb",
                        "--maxmemory-policy", "allkeys-lru", "--dir", self.dir])
            self.wait(lambda: subprocess.run(["redis-cli", "-p", str(self.redis_port), "ping"],
                                             capture_output=True).returncode == 0)
        self.ports = []
        for i in range(n):
            p = free_port()
            cmd = [args.kvchat, "serve", "-m", args.model, "--port", str(p), "-t",
                   str(args.threads), "--cache-dir", f"{self.dir}/disk-{i}"] + args.serve
            if redis:
                cmd += ["--cache-redis", f"redis://127.0.0.1:{self.redis_port}"]
            self.spawn(cmd)
            self.ports.append(p)
        for p in self.ports:
            self.wait(lambda: self.health(p), 300)
        self.router = None
        if router:
            self.router = free_port()
            servers = "".join(f"    server k{i} 127.0.0.1:{p} check\n"
                              for i, p in enumerate(self.ports))
            cfg = open(os.path.join(HERE, "../deploy/haproxy.cfg.in")).read()
            cfg = cfg.replace("@ROUTER_ADDR@", f"127.0.0.1:{self.router}")
            cfg = cfg.replace("@SERVERS@\n", servers)
            with open(f"{self.dir}/haproxy.cfg", "w") as f:
                f.write(cfg)
            haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
            self.spawn([haproxy, "-db", "-f", f"{self.dir}/haproxy.cfg"])
            self.wait(lambda: self.health(self.router))

    def spawn(self, cmd):
        self.procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                           stderr=open(f"{self.dir}/log-{len(self.procs)}", "w")))

    @staticmethod
    def health(port):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return True
        except Exception:
            return False

    @staticmethod
    def wait(ok, seconds=30):
        end = time.time() + seconds
        while not ok():
            if time.time() > end:
                raise RuntimeError("cluster did not start")
            time.sleep(0.1)

    def settle(self):
        """Background work done and writes to Redis stopped on every instance."""
        last, same = None, 0
        while same < 3:
            ms = [metrics(p) for p in self.ports]
            now = [m.get("kvchat_redis_blocks_written_total", 0) for m in ms]
            idle = all(m.get("kvchat_background_pending", 0) == 0 for m in ms)
            same = same + 1 if idle and now == last else 0
            last = now
            time.sleep(0.05)

    def stop(self):
        for p in reversed(self.procs):
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def ttft(args):
    c = Cluster(args, 2, redis=True, router=False)
    try:
        for h in args.history:
            words = h * 3 // 4                       # ~1.3 tokens a word for these words
            msgs = [{"role": "user", "content": text(words, h)}]
            first = post(c.ports[0], {"messages": msgs, "max_tokens": 8, "temperature": 0})
            msgs += [first["choices"][0]["message"],
                     {"role": "user", "content": "And what follows from that?"}]
            c.settle()
            body = {"messages": msgs, "max_tokens": 1, "temperature": 0}
            warm = post(c.ports[1], body)
            cold = post(c.ports[1], dict(body, cache_prompt=False))
            tw, tc = warm["timings"], cold["timings"]
            print(f"history {first['usage']['prompt_tokens']:5d} tokens: next turn "
                  f"({warm['usage']['prompt_tokens']} tokens) on the other instance: "
                  f"from Redis {warm['_seconds'] * 1000:7.0f} ms (cached "
                  f"{warm['usage']['prompt_tokens_details']['cached_tokens']}, from below RAM "
                  f"{tw.get('cache_disk_n', 0)}, computed {tw['prompt_n']}); recomputed "
                  f"{cold['_seconds'] * 1000:7.0f} ms (computed {tc['prompt_n']}); "
                  f"{cold['_seconds'] / warm['_seconds']:.1f}x", flush=True)
    finally:
        c.stop()


def workload(args, redis, router):
    c = Cluster(args, 2, redis=redis, router=router)
    try:
        system = {"role": "system", "content": text(args.system_words, 1)}
        convs = [[system] for _ in range(args.conversations)]
        computed = cached = below = prompt = 0
        t0 = time.time()
        n = 0
        for turn in range(args.turns):
            for i, msgs in enumerate(convs):
                msgs.append({"role": "user", "content": f"Conversation {i}, turn {turn}: " +
                             text(args.turn_words, i * 31 + turn)})
                port = c.router if router else c.ports[(i + turn) % 2]   # alternate
                n += 1
                r = post(port, {"messages": msgs, "max_tokens": args.reply_tokens,
                                "temperature": 0, "prompt_cache_key": f"conv-{i}"})
                msgs.append(r["choices"][0]["message"])
                if turn > 0:
                    u, t = r["usage"], r["timings"]
                    prompt += u["prompt_tokens"]
                    cached += u["prompt_tokens_details"]["cached_tokens"]
                    below += t.get("cache_disk_n", 0)
                    computed += t["prompt_n"]
        secs = time.time() - t0
        ms = [metrics(p) for p in c.ports]
        print(f"{'HAProxy' if router else 'alternating':11s} {'Redis' if redis else 'no Redis':8s}:"
              f" turns 2+ {prompt} prompt tokens, computed {computed}, cached {cached} "
              f"({below} from disk/Redis, {sum(m.get('kvchat_redis_tokens_total', 0) for m in ms):.0f}"
              f" Redis tokens in all); {secs:.1f} s for {n} requests", flush=True)
    finally:
        c.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["ttft", "workload"])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--kvchat", default=os.path.join(HERE, "../build/kvchat"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--history", default="1000,4000",
                    type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--system-words", type=int, default=380)   # ~500 tokens
    ap.add_argument("--turn-words", type=int, default=30)      # ~40 tokens
    ap.add_argument("--reply-tokens", type=int, default=32)
    ap.add_argument("--serve", nargs=argparse.REMAINDER, default=[],
                    help="the rest: extra `kvchat serve` options")
    args = ap.parse_args()
    if args.what == "ttft":
        ttft(args)
    else:
        for redis in (False, True):
            for router in (False, True):
                workload(args, redis, router)


if __name__ == "__main__":
    sys.exit(main())
