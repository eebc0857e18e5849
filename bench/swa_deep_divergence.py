#!/usr/bin/env python3
"""Issue 31: a long conversation on a sliding-window model, then requests that
diverge at message starts deep inside it. Against a running server
(OpenAI chat completions): TURNS turns of a user message of about WORDS words
and a greedy reply of MAX_TOKENS tokens build the conversation (each turn
sends it whole); then, for each probed turn k, a request that carries the
conversation up to turn k's user message and replaces that message (it
diverges at the message's start). Printed per probe: the prompt tokens the
probe shares with the conversation's turn k (its prompt up to that message,
as /tokenize or the usage of turn k - 1 says), and the tokens the server
reused (usage.prompt_tokens_details.cached_tokens).

    python3 bench/swa_deep_divergence.py URL [--turns 16] [--words 700]
        [--max-tokens 8] [--probes 2,4,8,12,15]

Start the server yourself, e.g. on a model made with
`kvchat make-model --preset tiny-gpt-oss --sliding-window 128`:
`kvchat serve -m M.gguf -c 20000 --cache-disk 0` (the default pools), or
with a smaller --kv-budget. Python's standard library only.
"""
import json, random, sys, urllib.request

WORDS = ("river stone garden lamp quiet market silver window bread north candle forest "
         "letter harbor violet engine paper summer clock salt meadow tower copper field "
         "winter lantern orchard bridge mirror valley").split()


def args():
    o = {"url": None, "turns": 16, "words": 700, "max_tokens": 8, "probes": "2,4,8,12,15"}
    a = sys.argv[1:]
    i = 0
    while i < len(a):
        if a[i].startswith("--"):
            k = a[i][2:].replace("-", "_")
            o[k] = a[i + 1] if k == "probes" else int(a[i + 1])
            i += 2
        else:
            o["url"] = a[i].rstrip("/")
            i += 1
    if not o["url"]:
        raise SystemExit(__doc__)
    o["probes"] = [int(x) for x in o["probes"].split(",") if x]
    return o


def post(url, path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=3600).read())


def ask(url, messages, max_tokens):
    r = post(url, "/v1/chat/completions", {"model": "m", "messages": messages,
                                           "max_tokens": max_tokens, "temperature": 0})
    u = r["usage"]
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return r["choices"][0]["message"]["content"] or "", u["prompt_tokens"], cached


def main():
    o = args()
    rnd = random.Random(7)
    text = lambda: " ".join(rnd.choice(WORDS) for _ in range(o["words"]))
    msgs = [{"role": "system", "content": "You are terse."}]
    before = []   # prompt tokens of turn k's prompt before its user message
    for turn in range(o["turns"]):
        # what the conversation holds before this user message: the previous
        # turn's prompt and reply (the prompt of a request ending there)
        msgs.append({"role": "user", "content": text()})
        reply, n, cached = ask(o["url"], msgs, o["max_tokens"])
        msgs.append({"role": "assistant", "content": reply})
        print(f"turn {turn + 1}: {n} prompt tokens, {cached} cached", flush=True)
        before.append(n)
    total = 0
    for k in o["probes"]:
        if k < 1 or k >= o["turns"]:
            continue
        # turn k + 1's user message (index 2k + 1) replaced
        probe = msgs[:2 * k + 1] + [{"role": "user", "content": "A different question: " + text()}]
        _, n, cached = ask(o["url"], probe, o["max_tokens"])
        shared = before[k - 1]   # turn k's prompt: the history before message 2k + 1, and more
        print(f"probe at turn {k + 1}'s message (~{shared} tokens in): {n} prompt tokens, "
              f"{cached} cached", flush=True)
        total += cached
    print(f"reused over the probes: {total}")


if __name__ == "__main__":
    main()
