// agents.test.mjs - Codex CLI (`codex exec`, Responses API) and Claude Code
// (`claude -p`, Messages API) unmodified against `kvchat serve` (issue 28).
//
// Each agent gets a two-step task: a tool call that writes hello.txt, then a
// final answer after the tool's result. The model has random weights, so a
// proxy between the agent and the server adds a `grammar` (llama.cpp's GBNF
// field, which kvchat honours) to each request: the tool call in the
// template's syntax first, then "Done." once the request carries the tool's
// output. Everything else - the agents' own requests (Claude Code's is
// ~51,000 tokens, Codex's ~23,000), tools, streaming, the answers - is
// theirs and kvchat's. The second step must compute at most 1.05x its new
// tokens (usage: input - cached vs what the first step did not hold).
//
// Skips unless scripts/install-agent-deps.sh has installed the agents.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { spawn, execFileSync } from 'node:child_process';
import http from 'node:http';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer } from './serve.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const bin = path.join(here, 'agents', 'node_modules', '.bin');
const have = fs.existsSync(path.join(bin, 'codex')) && fs.existsSync(path.join(bin, 'claude'));
const skip = have ? false : 'run scripts/install-agent-deps.sh to install Codex CLI and Claude Code';

let server, proxy, proxyPort, tmp, steps = [];

// The grammar of a reply that is one tool call in hermes.jinja's syntax.
const callGrammar = (name, args) =>
  `root ::= ${JSON.stringify('<tool_call>\n' + JSON.stringify({ name, arguments: args }) + '\n</tool_call>')}`;

// Forward to kvchat, adding the grammar; keep each answer's usage.
function startProxy(target) {
  return new Promise((resolve) => {
    const p = http.createServer((req, res) => {
      const chunks = [];
      req.on('data', (d) => chunks.push(d));
      req.on('end', () => {
        let body = Buffer.concat(chunks);
        let step = null;
        if (req.method === 'POST' && body.length) {
          const j = JSON.parse(body.toString());
          const convo = JSON.stringify(j.input ?? j.messages ?? '');
          const final = /function_call_output|tool_result/.test(convo);
          j.grammar = final ? 'root ::= "Done."'
                    : j.input ? callGrammar('exec_command', { cmd: 'echo hello > hello.txt' })
                    : callGrammar('Bash', { command: 'echo hello > hello.txt', description: 'write' });
          step = { api: j.input ? 'responses' : 'messages', final };
          body = Buffer.from(JSON.stringify(j));
        }
        const headers = { ...req.headers, 'content-length': body.length };
        const f = http.request({ host: '127.0.0.1', port: target, path: req.url, method: req.method,
                                 headers }, (r) => {
          res.writeHead(r.statusCode, r.headers);
          const out = [];
          r.on('data', (d) => { out.push(d); res.write(d); });
          r.on('end', () => {
            if (step) {
              const t = Buffer.concat(out).toString();
              const u = [...t.matchAll(/"usage":(\{[^{}]*(\{[^{}]*\}[^{}]*)*\})/g)].pop();
              step.status = r.statusCode;
              step.usage = u ? JSON.parse(u[1]) : null;
              steps.push(step);
            }
            res.end();
          });
        });
        f.end(body);
      });
    });
    p.listen(0, '127.0.0.1', () => resolve(p));
  });
}

// Prompt tokens, computed tokens and output tokens of a step, either API.
function figures(s) {
  const u = s.usage;
  if (s.api === 'responses')
    return { prompt: u.input_tokens, computed: u.input_tokens - u.input_tokens_details.cached_tokens,
             output: u.output_tokens };
  return { prompt: u.input_tokens + u.cache_read_input_tokens, computed: u.input_tokens,
           output: u.output_tokens };
}

function run(cmd, args, opts) {
  return new Promise((resolve) => {
    const p = spawn(cmd, args, { ...opts, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { out += d; });
    const timer = setTimeout(() => p.kill('SIGKILL'), 240000);
    p.on('exit', (code) => { clearTimeout(timer); resolve({ code, out }); });
  });
}

before(async () => {
  if (!have)
    return;
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvc-agents-'));
  const model = path.join(tmp, 'long.gguf');   // Claude Code's first prompt is ~51k tokens
  execFileSync(process.env.KVC_BIN, ['make-model', '-o', model, '--preset', 'tiny',
                                     '--n-ctx', '131072'], { stdio: 'ignore' });
  let root;
  ({ proc: server, root } = await startServer(['-m', model, '--parallel', '2', '--cache-disk', '0',
                                              '--chat-template-file', path.join(here, 'hermes.jinja')]));
  proxy = await startProxy(Number(new URL(root).port));
  proxyPort = proxy.address().port;
});

after(() => {
  if (server && server.exitCode === null)
    server.kill('SIGTERM');
  if (proxy)
    proxy.close();
  if (tmp)
    fs.rmSync(tmp, { recursive: true, force: true });
});

// The task's two steps: the file written, the second step computing only
// what is new to it.
function checkTask(work, api, out) {
  assert.equal(fs.readFileSync(path.join(work, 'hello.txt'), 'utf8'), 'hello\n', out);
  assert.match(out, /Done\./);
  const mine = steps.filter((s) => s.api === api);
  const first = mine.find((s) => !s.final), last = mine.findLast((s) => s.final);
  assert.ok(first && last, JSON.stringify(steps));
  assert.ok(mine.every((s) => s.status === 200), JSON.stringify(mine));
  const a = figures(first), b = figures(last);
  const fresh = b.prompt - (a.prompt + a.output);
  console.log(`${api}: step 1 ${a.prompt} prompt tokens; step 2 ${b.prompt}, of which ` +
              `${fresh} new, ${b.computed} computed`);
  assert.ok(b.computed <= 1.05 * fresh + 1, `step 2 computed ${b.computed} for ${fresh} new tokens`);
}

test('codex exec completes a tool-calling task over /v1/responses', { skip, timeout: 300000 }, async () => {
  const home = path.join(tmp, 'codex'), work = path.join(tmp, 'codex-work');
  fs.mkdirSync(home);
  fs.mkdirSync(work);
  fs.writeFileSync(path.join(home, 'config.toml'),
    `model = "kvchat-model"\nmodel_provider = "kvchat"\n\n[model_providers.kvchat]\n` +
    `name = "kvchat"\nbase_url = "http://127.0.0.1:${proxyPort}/v1"\nwire_api = "responses"\n`);
  const r = await run(path.join(bin, 'codex'),
    ['exec', '--skip-git-repo-check', '--dangerously-bypass-approvals-and-sandbox',
     'write hello to hello.txt'],
    { cwd: work, env: { ...process.env, CODEX_HOME: home, OPENAI_API_KEY: 'none' } });
  assert.equal(r.code, 0, r.out);
  checkTask(work, 'responses', r.out);
});

test('claude -p completes a tool-calling task over /v1/messages', { skip, timeout: 300000 }, async () => {
  const home = path.join(tmp, 'claude'), work = path.join(tmp, 'claude-work');
  fs.mkdirSync(home);
  fs.mkdirSync(work);
  const r = await run(path.join(bin, 'claude'),
    ['-p', 'write hello to hello.txt', '--model', 'claude-sonnet-4-5', '--allowedTools', 'Bash'],
    { cwd: work, env: { ...process.env, HOME: home, ANTHROPIC_BASE_URL: `http://127.0.0.1:${proxyPort}`,
                        ANTHROPIC_API_KEY: 'none', DISABLE_TELEMETRY: '1', DISABLE_AUTOUPDATER: '1',
                        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1' } });
  assert.equal(r.code, 0, r.out);
  checkTask(work, 'messages', r.out);
});
