// compare_servers.mjs - the same 10-turn conversation against two OpenAI-compatible
// servers, one after the other: per turn, the prompt tokens each computed and
// the time to first token as the client sees it (streamed).
//
//   node bench/compare_servers.mjs URL_A NAME_A URL_B NAME_B [--turns 10] [--max-tokens 16]
//
// e.g. kvchat serve on :8080 and a llama-server you built yourself on :8081,
// both on the same model with 2 threads. Computed tokens come from each server's
// `timings.prompt_n` (llama-server reports it too); a server that does not report
// it shows '-'. Greedy (temperature 0); each turn appends the reply and a new
// user message, as a chat client does. No npm packages: Node's fetch.

function parseArgs(argv) {
  const o = { servers: [], turns: 10, maxTokens: 16 };
  for (let i = 2; i < argv.length; i++) {
    if (argv[i] === '--turns') o.turns = +argv[++i];
    else if (argv[i] === '--max-tokens') o.maxTokens = +argv[++i];
    else { o.servers.push({ url: argv[i].replace(/\/$/, ''), name: argv[i + 1] }); i++; }
  }
  if (o.servers.length < 1) {
    console.error('usage: compare_servers.mjs URL NAME [URL NAME] [--turns N] [--max-tokens N]');
    process.exit(2);
  }
  return o;
}

const paragraph = 'The river carried small boats past old stone houses while children watched ' +
  'from the bridges and merchants counted their coins under a bright summer sky. ';

// One streamed turn: { reply, ttft_ms, prompt_n, cache_n, prompt_tokens }.
async function turn(url, messages, maxTokens) {
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', messages, max_tokens: maxTokens, temperature: 0, stream: true,
                           stream_options: { include_usage: true }, cache_prompt: true }),
  });
  if (!res.ok) throw new Error(`${url}: HTTP ${res.status}: ${await res.text()}`);
  let reply = '', ttft = null, buf = '', last = {};
  const dec = new TextDecoder();
  for await (const chunk of res.body) {
    buf += dec.decode(chunk, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k); buf = buf.slice(k + 2);
      const line = ev.split('\n').find((l) => l.startsWith('data: '));
      if (!line || line === 'data: [DONE]') continue;
      const j = JSON.parse(line.slice(6));
      const d = j.choices && j.choices[0] && j.choices[0].delta;
      if (d && d.content) {
        if (ttft === null) ttft = performance.now() - t0;
        reply += d.content;
      }
      if (j.usage) last.usage = j.usage;
      if (j.timings) last.timings = j.timings;
    }
  }
  const t = last.timings || {};
  return { reply, ttft_ms: ttft ?? performance.now() - t0, prompt_n: t.prompt_n, cache_n: t.cache_n,
           prompt_tokens: last.usage ? last.usage.prompt_tokens : undefined };
}

async function conversation(server, o) {
  const messages = [{ role: 'system', content: 'You are a helpful assistant.' }];
  const rows = [];
  for (let t = 0; t < o.turns; t++) {
    messages.push({ role: 'user', content: `Question ${t + 1}: ${paragraph.repeat(2)}What happened next?` });
    const r = await turn(server.url, messages, o.maxTokens);
    rows.push(r);
    messages.push({ role: 'assistant', content: r.reply });
  }
  return rows;
}

const o = parseArgs(process.argv);
const results = [];
for (const s of o.servers) results.push(await conversation(s, o));
const head = o.servers.map((s) => `${s.name} prompt | ${s.name} computed | ${s.name} TTFT ms`).join(' | ');
console.log(`| turn | ${head} |`);
console.log(`|---:|${o.servers.map(() => '---:|---:|---:').join('|')}|`);
for (let t = 0; t < o.turns; t++) {
  const cells = results.map((rows) => {
    const r = rows[t];
    return `${r.prompt_tokens ?? '-'} | ${r.prompt_n ?? '-'} | ${r.ttft_ms.toFixed(1)}`;
  });
  console.log(`| ${t + 1} | ${cells.join(' | ')} |`);
}
const sum = (rows, f) => rows.reduce((a, r) => a + (f(r) || 0), 0);
for (let i = 0; i < o.servers.length; i++)
  console.log(`${o.servers[i].name}: ${sum(results[i], (r) => r.prompt_n)} prompt tokens computed in total, ` +
              `mean TTFT ${(sum(results[i], (r) => r.ttft_ms) / o.turns).toFixed(1)} ms`);
