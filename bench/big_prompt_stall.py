#!/usr/bin/env python3
"""Does a flood of huge prompts delay another request's tokens? (issue 11)

Starts `kvchat serve`, streams an 80-token reply and records the gaps between
its chunks, idle and then while 8 requests with 7.5 MB prompts are in flight
(rendered and tokenized in the server's HTTP threads, never on the engine
thread; one large body at a time). Prints median and p99 gaps and the ratio.

    python3 bench/big_prompt_stall.py build/kvchat -m model.gguf
"""
import json, subprocess, time, urllib.request, re, threading, statistics, sys, tempfile, os
BIN=sys.argv[1]
LOG=os.path.join(tempfile.mkdtemp(prefix="kvchat-stall-"), "serve.log")
log=open(LOG,"w")
p=subprocess.Popen([BIN,"serve","--port","0","-t","2","--cache-disk","0","--max-body","9"]+sys.argv[2:],stderr=log)
port=None
for _ in range(300):
    m=re.search(r"listening on http://127.0.0.1:(\d+)",open(LOG).read())
    if m: port=int(m.group(1)); break
    time.sleep(0.1)
def stream_gaps():
    body={"messages":[{"role":"user","content":"Tell me a long story."}],"max_tokens":80,"temperature":0,"stream":True}
    req=urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",json.dumps(body).encode(),{"content-type":"application/json"})
    r=urllib.request.urlopen(req,timeout=300); last=None; gaps=[]
    for line in r:
        if line.startswith(b"data: {") and b'"content"' in line:
            now=time.perf_counter()
            if last is not None: gaps.append((now-last)*1e3)
            last=now
    return gaps
def big():
    text=("word "*1500000)[:7_500_000]
    body=json.dumps({"messages":[{"role":"user","content":text}],"max_tokens":1}).encode()
    try:
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",body,{"content-type":"application/json"}),timeout=300).read()
    except Exception as e: pass
def p99(g): g=sorted(g); return g[int(0.99*(len(g)-1))]
idle=stream_gaps()
ths=[threading.Thread(target=big) for _ in range(8)]
for t in ths: t.start()
time.sleep(0.2)
loaded=stream_gaps()
for t in ths: t.join()
print(f"idle: {len(idle)} gaps, median {statistics.median(idle):.2f} ms, p99 {p99(idle):.2f} ms")
print(f"with 8 x 7.5 MB prompts in flight: {len(loaded)} gaps, median {statistics.median(loaded):.2f} ms, p99 {p99(loaded):.2f} ms, ratio {p99(loaded)/p99(idle):.2f}x")
p.terminate(); p.wait()
