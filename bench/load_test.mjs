// load_test.mjs - many concurrent multi-turn conversations against `kvchat serve`.
//
//   node bench/load_test.mjs --bin build/kvchat [--clients 32] [--turns 10]
//   node bench/load_test.mjs --url http://127.0.0.1:8080 [--api-key KEY]
//
// With --bin it starts `kvchat serve --port 0` itself (extra server flags after
// `--`); with --url it uses a running server. No npm packages: Node's fetch.
//
// Phase 1 (solo): each conversation alone, one after another: the reference.
// Phase 2 (load): all conversations at once, each turn streamed (SSE with
// include_usage), under fresh session keys. Every turn appends the reply as
// the assistant message and a new user message, as a chat client does.
//
// Passes (exit 0) when no request failed and every greedy (temperature 0)
// reply of phase 2 equals its phase-1 reply: the result must not depend on
// batching, concurrency or what was cached. Prints TTFT p50/p99 (as the client
// saw it and as the server measured it), throughput and the cache hit ratio.
// Bounded: gives up after --time-limit seconds (default 600).
import { spawn } from 'node:child_process';

function parseArgs(argv) {
  const o = { clients: 32, turns: 10, maxTokens: 32, timeLimit: 600, parallel: 8, url: null,
              bin: null, apiKey: process.env.KVCHAT_API_KEY || '', serverArgs: [] };
  for (let i = 2; i < argv.length; i++) {
    const a = argv[i], v = argv[i + 1];
    if (a === '--') { o.serverArgs = argv.slice(i + 1); break; }
    else if (a === '--clients') { o.clients = +v; i++; }
    else if (a === '--turns') { o.turns = +v; i++; }
    else if (a === '--max-tokens') { o.maxTokens = +v; i++; }
    else if (a === '--time-limit') { o.timeLimit = +v; i++; }
    else if (a === '--parallel') { o.parallel = +v; i++; }
    else if (a === '--url') { o.url = v.replace(/\/$/, ''); i++; }
    else if (a === '--bin') { o.bin = v; i++; }
    else if (a === '--api-key') { o.apiKey = v; i++; }
    else { console.error(`load_test: unknown option ${a}`); process.exit(2); }
  }
  if (!o.url && !o.bin) o.bin = process.env.KVC_BIN;
  if (!o.url && !o.bin) { console.error('load_test: give --bin KVCHAT or --url URL'); process.exit(2); }
  return o;
}

function startServer(o) {
  return new Promise((resolve, reject) => {
    const p = spawn(o.bin, ['serve', '--port', '0', '--parallel', String(o.parallel),
                            '--max-queue', String(4 * o.clients), ...o.serverArgs],
                    { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    p.stderr.on('data', (d) => {
      log += d;
      const m = /listening on (http:\/\/\S+)/.exec(log);
      if (m) resolve({ proc: p, url: m[1] });
    });
    p.on('exit', (c) => reject(new Error(`server exited (${c}):\n${log}`)));
  });
}

const topics = ['the sea', 'mountains', 'a city at night', 'old trains', 'bees', 'the moon',
                'coffee', 'a library', 'winter', 'rivers', 'clocks', 'gardens'];
const followUps = ['Tell me more.', 'Why is that?', 'Give an example.', 'What else?',
                   'Can you summarise?', 'And then?', 'Is that true?', 'Go on.',
                   'What would you add?', 'Thank you.'];

// One request, streamed; resolves to { text, usage, timings, ttftMs } or throws.
async function turn(url, apiKey, messages, key, maxTokens) {
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...(apiKey ? { Authorization: `Bearer ${apiKey}` } : {}) },
    body: JSON.stringify({ model: 'load', messages, max_tokens: maxTokens, temperature: 0,
                           stream: true, stream_options: { include_usage: true }, prompt_cache_key: key }),
  });
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const dec = new TextDecoder();
  let buf = '', text = '', usage = null, timings = null, ttftMs = null, done = false;
  for await (const part of res.body) {
    buf += dec.decode(part, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ')) continue;
      const data = ev.slice(6);
      if (data === '[DONE]') { done = true; continue; }
      const c = JSON.parse(data);
      if (c.error) throw new Error(`stream error: ${c.error.message}`);
      if (c.choices.length && c.choices[0].delta.content) {
        if (ttftMs === null) ttftMs = performance.now() - t0;
        text += c.choices[0].delta.content;
      }
      if (c.usage) { usage = c.usage; timings = c.timings; }
    }
  }
  if (!done || !usage) throw new Error('stream ended without usage and [DONE]');
  return { text, usage, timings, ttftMs: ttftMs ?? performance.now() - t0 };
}

// Conversation c: its turns' replies and per-turn stats.
async function conversation(o, url, c, keyPrefix, stats) {
  const messages = [{ role: 'system', content: `You are assistant number ${c}. Talk about ${topics[c % topics.length]}.` }];
  const replies = [];
  for (let t = 0; t < o.turns; t++) {
    messages.push({ role: 'user', content: `(${c}.${t}) ${followUps[(c + t) % followUps.length]}` });
    try {
      const r = await turn(url, o.apiKey, messages, `${keyPrefix}-${c}`, o.maxTokens);
      stats.push({ ttft: r.ttftMs, serverTtft: r.timings?.ttft_ms ?? 0, out: r.usage.completion_tokens,
                   prompt: r.usage.prompt_tokens, cached: r.usage.prompt_tokens_details.cached_tokens });
      replies.push(r.text);
      messages.push({ role: 'assistant', content: r.text });
    } catch (e) {
      stats.errors = (stats.errors || 0) + 1;
      console.error(`conversation ${c} turn ${t}: ${e.message}`);
      break;
    }
  }
  return replies;
}

function pct(xs, p) {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p / 100 * s.length))];
}

function report(name, stats, wallMs) {
  const out = stats.reduce((a, s) => a + s.out, 0);
  const prompt = stats.reduce((a, s) => a + s.prompt, 0);
  const cached = stats.reduce((a, s) => a + s.cached, 0);
  const ttft = stats.map((s) => s.ttft), sttft = stats.map((s) => s.serverTtft);
  console.log(`${name}: ${stats.length} requests in ${(wallMs / 1000).toFixed(2)} s, ` +
              `${(stats.length / wallMs * 1000).toFixed(1)} req/s, ` +
              `${(out / wallMs * 1000).toFixed(0)} output tok/s, errors ${stats.errors || 0}`);
  console.log(`  TTFT client p50 ${pct(ttft, 50).toFixed(1)} ms, p99 ${pct(ttft, 99).toFixed(1)} ms; ` +
              `server p50 ${pct(sttft, 50).toFixed(1)} ms, p99 ${pct(sttft, 99).toFixed(1)} ms`);
  console.log(`  prompt tokens ${prompt}, cached ${cached} (${(100 * cached / Math.max(prompt, 1)).toFixed(1)}%)`);
}

async function main() {
  const o = parseArgs(process.argv);
  let server = null, url = o.url;
  const limit = setTimeout(() => {
    console.error(`load_test: over the time limit of ${o.timeLimit} s`);
    server?.proc.kill('SIGKILL');
    process.exit(1);
  }, o.timeLimit * 1000);
  if (!url) { server = await startServer(o); url = server.url; }
  const run = Date.now().toString(36);
  console.log(`load_test: ${o.clients} clients x ${o.turns} turns, max_tokens ${o.maxTokens}, ${url}`);

  const soloStats = [], solo = [];
  let t0 = performance.now();
  for (let c = 0; c < o.clients; c++)
    solo.push(await conversation(o, url, c, `solo-${run}`, soloStats));
  report('solo', soloStats, performance.now() - t0);

  const loadStats = [];
  t0 = performance.now();
  const load = await Promise.all([...Array(o.clients).keys()].map(
    (c) => conversation(o, url, c, `load-${run}`, loadStats)));
  report(`load (${o.clients} at once)`, loadStats, performance.now() - t0);

  let mismatches = 0;
  for (let c = 0; c < o.clients; c++)
    for (let t = 0; t < o.turns; t++)
      if (solo[c][t] !== load[c][t]) {
        if (mismatches++ < 5)
          console.error(`mismatch: conversation ${c} turn ${t}: solo ${JSON.stringify(solo[c][t])} ` +
                        `load ${JSON.stringify(load[c][t])}`);
      }
  const errors = (soloStats.errors || 0) + (loadStats.errors || 0);
  console.log(`replies equal to their solo run: ${o.clients * o.turns - mismatches} of ${o.clients * o.turns}`);
  clearTimeout(limit);
  if (server) server.proc.kill('SIGTERM');
  const ok = errors === 0 && mismatches === 0;
  console.log(ok ? 'PASS' : 'FAIL');
  process.exit(ok ? 0 : 1);
}

main().catch((e) => { console.error(e); process.exit(1); });
