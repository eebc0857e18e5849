#!/usr/bin/env python3
"""The pressure workload of issue 10 against running OpenAI-compatible servers,
one after the other: 16 conversations x 8 turns at once (one client thread
each), a shared system prompt, greedy replies. Per server: prompt tokens,
tokens computed (the server's `timings.prompt_n`, which llama-server reports
too) on turn 1 and on turns 2+, TTFT-less latency (whole replies: p50/p99 of
the request time), wall time, failed requests.

    python3 bench/pressure_servers.py URL NAME [URL NAME ...] [--conversations 16]
        [--turns 8] [--system-words 330] [--turn-words 26] [--max-tokens 32]

Start the servers yourself on the same model and threads, e.g. a kvchat serve
with a --kv-budget that holds about 4 conversations and its disk tier, and a
llama-server with 4 slots and its defaults (--cache-ram). Python's standard
library only.
"""
import json, random, statistics, sys, threading, time, urllib.request

WORDS = ("river stone garden lamp quiet market silver window bread north candle forest "
         "letter harbor violet engine paper summer clock salt meadow tower copper field "
         "winter lantern orchard bridge mirror valley").split()


def args():
    o = {"servers": [], "conversations": 16, "turns": 8, "system_words": 330,
         "turn_words": 26, "max_tokens": 32}
    a = sys.argv[1:]
    i = 0
    while i < len(a):
        if a[i].startswith("--"):
            o[a[i][2:].replace("-", "_")] = int(a[i + 1])
        else:
            o["servers"].append((a[i].rstrip("/"), a[i + 1]))
        i += 2
    if not o["servers"]:
        raise SystemExit(__doc__)
    return o


def words(rnd, n):
    return " ".join(rnd.choice(WORDS) for _ in range(n))


def ask(url, messages, max_tokens):
    body = json.dumps({"model": "m", "messages": messages, "max_tokens": max_tokens,
                       "temperature": 0, "cache_prompt": True}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    r = json.loads(urllib.request.urlopen(req, timeout=3600).read())
    dt = time.perf_counter() - t0
    t = r.get("timings") or {}
    return (r["choices"][0]["message"]["content"] or "", r["usage"]["prompt_tokens"],
            t.get("prompt_n"), dt)


def conversation(url, o, system, k, rows, errors):
    rnd = random.Random(1000 + k)
    msgs = [{"role": "system", "content": system}]
    for turn in range(o["turns"]):
        msgs.append({"role": "user", "content": f"Conversation {k}, question {turn + 1}: "
                                                + words(rnd, o["turn_words"])})
        try:
            reply, prompt, computed, dt = ask(url, msgs, o["max_tokens"])
        except Exception as e:                    # counted, and the conversation ends
            errors.append(f"conversation {k} turn {turn + 1}: {e}")
            return
        rows.append((turn, prompt, computed, dt))
        msgs.append({"role": "assistant", "content": reply})


def run(url, name, o):
    system = "You are a careful assistant. " + words(random.Random(7), o["system_words"])
    rows, errors = [], []
    t0 = time.perf_counter()
    th = [threading.Thread(target=conversation, args=(url, o, system, k, rows, errors))
          for k in range(o["conversations"])]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    lat = sorted(r[3] for r in rows)
    comp = lambda first: sum(r[2] or 0 for r in rows if (r[0] == 0) == first)
    p99 = lat[int(0.99 * (len(lat) - 1))] if lat else 0
    return {"name": name, "requests": len(rows), "errors": len(errors), "wall": wall,
            "prompt": sum(r[1] for r in rows), "computed_t1": comp(True),
            "computed_t2": comp(False), "p50": statistics.median(lat) if lat else 0, "p99": p99,
            "first_errors": errors[:3]}


def main():
    o = args()
    print(f"{o['conversations']} conversations x {o['turns']} turns at once, system prompt "
          f"{o['system_words']} words, messages {o['turn_words']} words, replies "
          f"{o['max_tokens']} tokens (greedy)\n")
    print("| server | requests | failed | wall s | prompt tokens | computed turn 1 | "
          "computed turns 2+ | request p50 s | p99 s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    res = []
    for url, name in o["servers"]:
        r = run(url, name, o)
        res.append(r)
        print(f"| {r['name']} | {r['requests']} | {r['errors']} | {r['wall']:.1f} | {r['prompt']} | "
              f"{r['computed_t1']} | {r['computed_t2']} | {r['p50']:.2f} | {r['p99']:.2f} |",
              flush=True)
        for e in r["first_errors"]:
            print("   ", e)
    base = res[0]
    for r in res[1:]:
        if base["computed_t2"]:
            print(f"{r['name']}: turns 2+ computed {r['computed_t2'] / base['computed_t2']:.2f}x "
                  f"{base['name']}'s")


main()
