// chat_page.mjs - the chat page of `kvchat serve` in a real browser: Debian's
// headless Chromium, driven over the W3C WebDriver protocol by Debian's
// chromedriver (plain HTTP from Node's fetch: no npm package needed).
//
//   node tests/webui/chat_page.mjs      KVC_BIN=path/to/kvchat
//   KVC_WEBUI_SHOTS=DIR: where the screenshots go (default: a temporary dir,
//   left in place; everything else the test makes is removed)
//
// Exits 77 (CTest's skip) when KVC_BIN, chromium or chromedriver is absent.
// On a model made by `kvchat make-model` it checks, as a person would use it:
//   - the page loads with no console error (a Content-Security-Policy
//     violation or a missing file would be one) and names the model;
//   - settings (system prompt, temperature, seed, max tokens) are kept and
//     sent;
//   - three turns, each reply seen streaming (its text grows in several
//     steps while the request runs) and ending with its figures: prompt
//     tokens equal to the server's own count of the rendered conversation
//     (/apply-template + /tokenize), cached + computed = prompt, and turns 2
//     and 3 reusing at least the previous request's prompt;
//   - an edit of turn 1: a new branch (1/2 ‹ ›) whose reply reports exactly
//     the common token prefix of the old and new first message as cached;
//   - a regeneration: everything cached but the last token, and the old
//     reply kept as a sibling; switching back to the first branch shows it
//     whole;
//   - the figures the page shows add up to /metrics' prompt and cached token
//     counters;
//   - an assistant message edited to Markdown renders code highlighting,
//     math and tables, and a script in it is sanitized away;
//   - the conversation survives a reload (localStorage);
//   - max tokens past the context shows context_length_exceeded; Stop ends
//     a long reply (the server's request ends too), and so does a reload in
//     its middle, after which the reply shows as stopped;
//   - a server with --api-key: the page asks for the key, then chats;
//   - reasoning_content (a template that opens <think>) is shown apart from
//     the answer, folded once the reply is done;
//   - with the disk tier, after the server restarts (same port: the same
//     page and conversation), a regeneration shows its cached tokens as
//     read from disk.
// Screenshots: turn 3, the edit's branch, the Markdown, the key dialog and
// chat, the reasoning, the reply served from disk.
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import assert from 'node:assert/strict';
import test, { after } from 'node:test';

const SKIP = 77;
const bin = process.env.KVC_BIN;
const which = (name) => {
  const r = spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : null;
};
const chromium = process.env.CHROMIUM_BIN ||
  (existsSync('/usr/lib/chromium/chromium') ? '/usr/lib/chromium/chromium' : which('chromium'));
const chromedriver = process.env.CHROMEDRIVER_BIN || which('chromedriver');
const missing = !bin || !existsSync(bin) ? 'KVC_BIN (the kvchat binary)'
  : !chromium ? 'chromium (apt-get install chromium)'
  : !chromedriver ? 'chromedriver (apt-get install chromium-driver)' : null;
if (missing) {
  console.log(`chat_page: skipped: no ${missing}`);
  process.exit(SKIP);
}

const work = mkdtempSync(join(tmpdir(), 'kvc_webui_'));
const shots = process.env.KVC_WEBUI_SHOTS || join(work, 'screenshots');
mkdirSync(shots, { recursive: true });
const children = [];
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// `kvchat serve ARGS` on port (0: any free one), with the disk tier in
// cacheDir (none by default): resolves its root URL once it listens.
function serve(args, { port = 0, cacheDir = null } = {}) {
  return new Promise((resolve, reject) => {
    const disk = cacheDir ? ['--cache-dir', cacheDir, '--cache-disk', '64'] : ['--cache-disk', '0'];
    const proc = spawn(bin, ['serve', '--port', String(port), ...disk, '-t', '2', ...args],
                       { stdio: ['ignore', 'ignore', 'pipe'] });
    children.push(proc);
    let log = '';
    const timer = setTimeout(() => reject(new Error('server did not start:\n' + log)), 60000);
    proc.stderr.on('data', (d) => {
      log += d;
      const m = /listening on (http:\/\/\S+)/.exec(log);
      if (m) {
        clearTimeout(timer);
        resolve({ proc, root: m[1] });
      }
    });
    proc.on('exit', (code) => reject(new Error(`server exited (${code}):\n${log}`)));
  });
}

// ============================================================ WebDriver
const ELEM = 'element-6066-11e4-a52e-4f735466cecf';
let driverUrl = '', sid = '';

async function wd(method, path, body) {
  const res = await fetch(driverUrl + path, {
    method, headers: { 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body) });
  const j = await res.json();
  if (!res.ok) throw new Error(`${method} ${path}: ${j.value.error}: ${j.value.message}`);
  return j.value;
}
const s = (p) => `/session/${sid}${p}`;
const find = async (css) => (await wd('POST', s('/element'), { using: 'css selector', value: css }))[ELEM];
const findAll = async (css) =>
  (await wd('POST', s('/elements'), { using: 'css selector', value: css })).map((e) => e[ELEM]);
const click = (el) => wd('POST', s(`/element/${el}/click`), {});
const typeInto = (el, text) => wd('POST', s(`/element/${el}/value`), { text });
const clear = (el) => wd('POST', s(`/element/${el}/clear`), {});
const js = (script, ...args) => wd('POST', s('/execute/sync'), { script, args });
const hover = (el) => wd('POST', s('/actions'), { actions: [{ type: 'pointer', id: 'mouse',
  parameters: { pointerType: 'mouse' },
  actions: [{ type: 'pointerMove', duration: 0, origin: { [ELEM]: el }, x: 0, y: 0 }] }] });
const ENTER = '\uE007';

async function screenshot(name) {
  const png = await wd('GET', s('/screenshot'));
  writeFileSync(join(shots, name), Buffer.from(png, 'base64'));
}

async function waitFor(what, fn, timeoutMs = 30000) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error('timed out waiting for ' + what);
    await sleep(50);
  }
}

// The browser's errors since the last call (chromedriver's log of its console).
async function browserErrors() {
  const log = await wd('POST', s('/se/log'), { type: 'browser' });
  return log.filter((e) => e.level === 'SEVERE').map((e) => e.message);
}
// ... but a 404 of /props (the page asks for it when /v1/models does not
// give the context length, and a server may not have it) and the
// Content-Security-Policy blocking the inline handler of the Markdown test
// (seen when that message is sanitized: checked there).
const CSP_BLOCK = /Executing inline event handler violates .*Content Security Policy/;
const consoleErrors = async () => (await browserErrors())
  .filter((m) => !/\/props - .* 404/.test(m) && !CSP_BLOCK.test(m));

async function startBrowser() {
  const port = await freePort();
  const proc = spawn(chromedriver, [`--port=${port}`], { stdio: 'ignore' });
  children.push(proc);
  driverUrl = `http://127.0.0.1:${port}`;
  await waitFor('chromedriver', async () => {
    try { return (await wd('GET', '/status')).ready; } catch (e) { return false; }
  });
  const v = await wd('POST', '/session', { capabilities: { alwaysMatch: {
    browserName: 'chrome',
    'goog:loggingPrefs': { browser: 'ALL' },
    'goog:chromeOptions': { binary: chromium, args: [
      '--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
      '--window-size=1280,900', '--no-first-run', '--disable-extensions',
      '--disable-background-networking', `--user-data-dir=${join(work, 'profile')}`] } } } });
  sid = v.sessionId;
}

// ============================================================ the page
// The page's view of the conversation shown (window.kvchatPage, app.js).
const conversation = () => js('return window.kvchatPage.conversation()');
const busy = () => js('return window.kvchatPage.busy()');

// The branch shown, root first.
function shownPath(c) {
  const path = [];
  for (let n = c.nodes[c.leaf]; n; n = n.parent && c.nodes[n.parent]) path.unshift(n);
  return path;
}

// Record, while a reply streams, the lengths of the text shown in the
// message being generated (a MutationObserver in the page).
const watchStream = () => js(`
  window.__lens = [];
  const box = document.getElementById('messages');
  window.__obs && window.__obs.disconnect();
  window.__obs = new MutationObserver(() => {
    const c = box.querySelector('article.pending .content');
    if (c) window.__lens.push(c.textContent.replace('…', '').length);
  });
  window.__obs.observe(box, { childList: true, subtree: true, characterData: true });`);
const streamLens = () => js('window.__obs.disconnect(); return window.__lens;');

async function sendMessage(text) {
  const input = await find('#input');
  await watchStream();
  await typeInto(input, text);
  await typeInto(input, ENTER);
  await waitFor('the reply to start', busy, 10000).catch(() => {});   // it may be over already
  await waitFor('the reply to end', async () => !(await busy()), 60000);
}

// The figures the last assistant message shows (data-* of its .stats).
const lastStats = () => js(`
  const a = [...document.querySelectorAll('article.assistant')].pop();
  const st = a && a.querySelector('.stats');
  return st ? { ...st.dataset, text: st.textContent } : null;`);

async function openSettingsAndSet(fields) {
  await click(await find('#open-settings'));
  for (const [id, value] of Object.entries(fields)) {
    const el = await find('#' + id);
    await clear(el);
    if (value !== '') await typeInto(el, String(value));
  }
  await click(await find('#settings-save'));
  await waitFor('the dialog to close', async () => !(await js("return document.getElementById('settings').open")));
}

// ============================================================ the server's counts
let root = '';
async function api(path, body) {
  const r = await fetch(root + path, { method: body ? 'POST' : 'GET',
    headers: { 'Content-Type': 'application/json' }, body: body && JSON.stringify(body) });
  assert.equal(r.status, 200, `${path}: ${r.status}`);
  return path === '/metrics' ? r.text() : r.json();
}
// The tokens of a request's messages as the server renders and tokenizes them.
async function tokensOf(messages) {
  const { prompt } = await api('/apply-template', { messages });
  return (await api('/tokenize', { content: prompt, add_special: true, parse_special: true })).tokens;
}
const commonPrefix = (a, b) => {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
};
const prom = (text, name) => {
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : NaN;
};

const SYSTEM = 'You are a terse assistant.';
const requestOf = (c, uptoNodeId) => {
  const msgs = [{ role: 'system', content: SYSTEM }];
  const path = shownPath({ ...c, leaf: uptoNodeId });
  for (const n of path) msgs.push({ role: n.role, content: n.content });
  return msgs;
};

// ============================================================ the test
test('the chat page in Chromium', { timeout: 540000 }, async (t) => {
  const t0 = Date.now();
  const model = join(work, 'model.gguf');
  // big enough that a reply takes a few hundred ms: its streaming is seen
  const mk = spawnSync(bin, ['make-model', '-o', model, '--n-layer', '8', '--n-embd', '512',
                             '--n-head', '8', '--n-head-kv', '2', '--n-ff', '1536'],
                       { encoding: 'utf8' });
  assert.equal(mk.status, 0, mk.stderr);
  const srv = await serve(['-m', model]);
  root = srv.root;
  await startBrowser();
  t.after(async () => {
    if (sid) await wd('DELETE', s('')).catch(() => {});
  });

  await t.test('loads, names the model, no console error', async () => {
    await wd('POST', s('/url'), { url: root + '/' });
    assert.equal(await wd('GET', s('/title')), 'kvchat');
    const name = await waitFor('the model name', async () => {
      const n = await js("return document.getElementById('model-name').textContent");
      return n !== '…' && n;
    });
    assert.match(name, /random/);
    const libs = await js('return window.kvcMarkdown.libraries');
    assert.deepEqual(libs, { marked: true, dompurify: true, highlight: true, katex: true });
    assert.deepEqual(await consoleErrors(), []);
  });

  await t.test('settings are kept', async () => {
    await openSettingsAndSet({ 'set-system': SYSTEM, 'set-temperature': 1, 'set-seed': 42,
                               'set-max-tokens': 64 });
    const kept = await js("return JSON.parse(localStorage.getItem('kvchat.settings'))");
    assert.equal(kept.system, SYSTEM);
    assert.equal(kept.maxTokens, '64');
  });

  const turns = ['Hello! What can you do?', 'Tell me about caches.', 'And the prefix tree?'];
  let prevTokens = null;
  for (let i = 0; i < turns.length; i++) {
    await t.test(`turn ${i + 1}: streamed, with its figures`, async () => {
      await sendMessage(turns[i]);
      const lens = await streamLens();
      const c = await conversation();
      const path = shownPath(c);
      assert.equal(path.length, 2 * (i + 1));
      const reply = path[path.length - 1];
      assert.equal(reply.role, 'assistant');
      assert.ok(!reply.error, JSON.stringify(reply.error));
      assert.ok(reply.content.length > 0, 'an empty reply');
      const growing = [...new Set(lens.filter((n) => n > 0 && n < reply.content.length))];
      assert.ok(growing.length >= 2, `the reply was not seen streaming: lengths ${lens}`);
      const st = await lastStats();
      const tokens = await tokensOf(requestOf(c, path[path.length - 2].id));
      assert.equal(Number(st.prompt), tokens.length, 'prompt tokens');
      assert.equal(Number(st.cached) + Number(st.computed), Number(st.prompt));
      assert.equal(Number(st.output), 64);          // max tokens, as set
      if (prevTokens)
        assert.ok(Number(st.cached) >= commonPrefix(prevTokens, tokens),
                  `turn ${i + 1} cached ${st.cached} < ${commonPrefix(prevTokens, tokens)}`);
      prevTokens = tokens;
      assert.match(st.text, /cached/);
    });
  }
  await screenshot('1-three-turns.png');

  let editedTokens = null;
  await t.test('edit turn 1: a new branch, its common prefix cached', async () => {
    const first = await find('article.user');
    await hover(first);
    await click(await find('article.user .meta button.edit'));
    const ta = await find('article.user .editor textarea');
    await clear(ta);
    await watchStream();
    await typeInto(ta, 'Hello! What can you not do?');
    await click(await find('article.user .editor button[type=submit]'));
    await waitFor('the reply to end', async () => !(await busy()) &&
      (await conversation()).nodes && shownPath(await conversation()).length === 2, 60000);
    const c = await conversation();
    const path = shownPath(c);
    assert.equal(path[0].content, 'Hello! What can you not do?');
    assert.equal(c.roots.length, 2, 'the old first message is kept as a sibling');
    const pos = await js("return document.querySelector('article.user .branch-pos').textContent");
    assert.equal(pos, '2/2');
    const st = await lastStats();
    editedTokens = await tokensOf(requestOf(c, path[0].id));
    const oldTokens = await tokensOf(requestOf(c, c.roots[0]));
    const common = commonPrefix(oldTokens, editedTokens);
    assert.equal(Number(st.prompt), editedTokens.length);
    assert.ok(common > 0 && common < editedTokens.length);
    assert.equal(Number(st.cached), common, 'cached = the tokens before the edit');
    assert.equal(Number(st.computed), editedTokens.length - common);
  });
  await screenshot('2-edited-branch.png');

  await t.test('regenerate: all but the last token cached, old reply kept', async () => {
    const reply = await find('article.assistant');
    await hover(reply);
    await click(await find('article.assistant .meta button.regen'));
    await waitFor('the reply to end', async () => !(await busy()) &&
      !(await js("return !!document.querySelector('article.pending')")), 60000);
    const c = await conversation();
    const path = shownPath(c);
    assert.equal(c.nodes[path[0].id].children.length, 2);
    const st = await lastStats();
    assert.equal(Number(st.prompt), editedTokens.length);
    assert.equal(Number(st.computed), 1, 'only the last prompt token is run again');
    assert.equal(Number(st.cached), editedTokens.length - 1);
    const pos = await js("return document.querySelector('article.assistant .branch-pos').textContent");
    assert.equal(pos, '2/2');
  });

  await t.test('switch back to the first branch', async () => {
    await hover(await find('article.user'));
    await click(await find('article.user .branch button.prev'));
    const c = await conversation();
    assert.equal(shownPath(c).length, 6);
    assert.equal(await js("return document.querySelectorAll('#messages article').length"), 6);
    assert.equal(await js("return document.querySelector('article.user .user-text').textContent"),
                 turns[0]);
  });

  await t.test('the figures shown add up to /metrics', async () => {
    const totals = await js("const t = document.getElementById('totals'); return { ...t.dataset, text: t.textContent }");
    const m = await api('/metrics');
    assert.equal(Number(totals.prompt), prom(m, 'kvchat_prompt_tokens_total'));
    assert.equal(Number(totals.cached), prom(m, 'kvchat_cached_tokens_total'));
    assert.ok(Number(totals.cached) > 0);
    assert.match(totals.text, /^5 replies/);
  });

  await t.test('Markdown, highlighting and math render; scripts do not', async () => {
    const last = (await findAll('article.assistant')).pop();
    await hover(last);
    await click((await findAll('article.assistant .meta button.edit')).pop());
    const ta = await find('article.assistant .editor textarea');
    await clear(ta);
    await js(`const ta = document.querySelector('article.assistant .editor textarea');
      ta.value = arguments[0];`, '## Result\n\n**Bold**, `code`, and $e^{i\\pi}+1=0$.\n\n' +
      '```js\nconst x = 1; // one\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n' +
      '<img src="data:image/png;base64,AAAA" onerror="window.__pwned=1">' +
      '<script>window.__pwned=2</script>');
    await click(await find('article.assistant .editor button[type=submit]'));
    const r = await js(`const a = [...document.querySelectorAll('article.assistant')].pop();
      return { h2: !!a.querySelector('h2'), strong: !!a.querySelector('strong'),
               katex: !!a.querySelector('.katex'), kw: !!a.querySelector('pre .hljs-keyword'),
               copy: !!a.querySelector('pre button.code-copy'),
               table: !!a.querySelector('table'), onerror: !!a.querySelector('[onerror]'),
               script: !!a.querySelector('script'), pwned: window.__pwned || 0 };`);
    assert.deepEqual(r, { h2: true, strong: true, katex: true, kw: true, copy: true, table: true,
                          onerror: false, script: false, pwned: 0 });
    await sleep(200);   // the img's load error, had it had its handler
    assert.equal(await js('return window.__pwned || 0'), 0);
    const errors = await browserErrors();
    assert.ok(errors.some((m) => CSP_BLOCK.test(m)), 'the policy is in force: ' + errors.join('\n'));
    assert.deepEqual(errors.filter((m) => !CSP_BLOCK.test(m)), []);
  });
  await screenshot('3-markdown.png');

  await t.test('the conversation survives a reload', async () => {
    const before = await conversation();
    await wd('POST', s('/refresh'), {});
    await waitFor('the page', async () => js("return !!window.kvchatPage && document.querySelectorAll('#messages article').length"));
    const after = await conversation();
    assert.equal(after.id, before.id);
    assert.equal(Object.keys(after.nodes).length, Object.keys(before.nodes).length);
    assert.equal(await js("return document.querySelectorAll('#conversations .conv').length"), 1);
  });

  await t.test('past the context: context_length_exceeded is shown', async () => {
    await openSettingsAndSet({ 'set-max-tokens': 100000 });
    await sendMessage('Write a very long story.');
    const err = await js("const e = [...document.querySelectorAll('.error-box')].pop(); return e && e.textContent");
    assert.match(err || '', /Error 400.*context/s);
    const errors = await consoleErrors();   // the browser's note of the 400
    assert.ok(errors.length === 1 && /400/.test(errors[0]), errors.join('\n'));
  });

  await t.test('Stop ends a long reply, here and on the server', async () => {
    await openSettingsAndSet({ 'set-max-tokens': 3000 });
    const input = await find('#input');
    await typeInto(input, 'Count to a thousand.');
    await typeInto(input, ENTER);
    await waitFor('text to stream', async () =>
      js("const c = document.querySelector('article.pending .content'); return c && c.textContent.length > 5"));
    await click(await find('#stop'));
    await waitFor('the stop', async () => !(await busy()), 10000);
    const c = await conversation();
    const reply = shownPath(c).pop();
    assert.equal(reply.stopped, true);
    assert.ok(reply.content.length > 0);
    assert.match((await lastStats()).text, /stopped/);
    await waitFor('the server to end the request', async () =>
      prom(await api('/metrics'), 'kvchat_requests_running') === 0, 10000);
    assert.deepEqual(await consoleErrors(), []);
  });

  await t.test('a reload in the middle of a reply leaves it stopped, not pending', async () => {
    const input = await find('#input');   // max tokens are still 3000
    await typeInto(input, 'Count to two thousand.');
    await typeInto(input, ENTER);
    await waitFor('text to stream', async () =>
      js("const c = document.querySelector('article.pending .content'); return c && c.textContent.length > 5"));
    await wd('POST', s('/refresh'), {});
    await waitFor('the page', async () => js("return !!window.kvchatPage && document.querySelectorAll('#messages article').length > 0"));
    assert.equal(await js("return document.querySelectorAll('article.pending').length"), 0);
    const reply = shownPath(await conversation()).pop();
    assert.equal(reply.role, 'assistant');
    assert.equal(reply.stopped, true);
    assert.equal(await js("return !!document.querySelector('article.assistant:last-child .meta button.regen')"), true);
    await waitFor('the server to end the request', async () =>
      prom(await api('/metrics'), 'kvchat_requests_running') === 0, 10000);
  });

  await t.test('--api-key: the page asks for the key, then chats', async () => {
    const keyed = await serve(['-m', model, '--api-key', 'sekrit-webui']);
    await js('localStorage.clear()');
    await wd('POST', s('/url'), { url: keyed.root + '/' });
    await waitFor('the key dialog', async () => js(
      "return document.getElementById('settings').open && !document.getElementById('key-needed').hidden"));
    await screenshot('4-api-key.png');
    await typeInto(await find('#set-api-key'), 'sekrit-webui');
    await typeInto(await find('#set-max-tokens'), '16');   // this origin's settings are new
    await click(await find('#settings-save'));
    await waitFor('the model name', async () => /random/.test(
      await js("return document.getElementById('model-name').textContent")));
    await sendMessage('Hi with a key');
    await screenshot('5-api-key-chat.png');
    const reply = shownPath(await conversation()).pop();
    assert.ok(!reply.error, JSON.stringify(reply.error));
    assert.ok(reply.content.length > 0);
    // the 401s of the first load are the console's only errors
    const errors = (await consoleErrors()).filter((m) => !/401/.test(m));
    assert.deepEqual(errors, []);
  });

  await t.test('reasoning is shown apart, folded', async () => {
    // a template whose generation prompt opens <think>: the server sends the
    // reply as reasoning_content until </think> (a random model never closes it)
    const tmpl = join(work, 'think.jinja');
    writeFileSync(tmpl, '{%- for m in messages %}<|im_start|>{{ m.role }}\n' +
      '{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n{% endif %}' +
      '{{ m.content }}<|im_end|>\n{% endfor %}' +
      '{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}');
    const thinking = await serve(['-m', model, '--chat-template-file', tmpl]);
    await wd('POST', s('/url'), { url: thinking.root + '/' });
    await waitFor('the model name', async () => /random/.test(
      await js("return document.getElementById('model-name').textContent")));
    await openSettingsAndSet({ 'set-max-tokens': 24, 'set-temperature': 1, 'set-seed': 42 });
    await sendMessage('Think first.');
    const reply = shownPath(await conversation()).pop();
    assert.ok(reply.reasoning.length > 0, 'no reasoning_content came');
    assert.equal(reply.content, '');
    const r = await js(`const d = document.querySelector('article.assistant details.reasoning');
      return d && { open: d.open, summary: d.querySelector('summary').textContent,
                    text: d.querySelector('.reasoning-body').textContent };`);
    assert.ok(r, 'no reasoning block');
    assert.equal(r.open, false, 'folded once the reply is done');
    assert.match(r.summary, /^Reasoning \(\d+ characters\)$/);
    assert.ok(r.text.trim().length > 0);
    await click(await find('article.assistant details.reasoning summary'));
    await screenshot('6-reasoning.png');
    assert.deepEqual(await consoleErrors(), []);
  });

  await t.test('after a restart, a regeneration is served from the disk tier', async () => {
    const port = await freePort(), cacheDir = join(work, 'kv');
    let srv1 = await serve(['-m', model], { port, cacheDir });
    root = srv1.root;
    await wd('POST', s('/url'), { url: root + '/' });   // a new origin: new settings
    await openSettingsAndSet({ 'set-max-tokens': 16, 'set-temperature': 1, 'set-seed': 3,
                               'set-system': SYSTEM });
    await sendMessage('Remember this conversation, even across a restart of the server.');
    await waitFor('the blocks on disk', async () => {
      const m = await api('/metrics');
      return prom(m, 'kvchat_disk_blocks') > 0 && prom(m, 'kvchat_tier_writes_pending') === 0;
    }, 30000);
    const stopped = new Promise((r) => srv1.proc.once('exit', r));
    srv1.proc.kill('SIGTERM');
    await stopped;
    const srv2 = await serve(['-m', model], { port, cacheDir });
    assert.equal(srv2.root, root);
    await wd('POST', s('/refresh'), {});
    await waitFor('the page', async () => js("return !!window.kvchatPage && document.querySelectorAll('#messages article').length === 2"));
    await hover(await find('article.assistant'));
    await click(await find('article.assistant .meta button.regen'));
    await waitFor('the reply to end', async () => !(await busy()) &&
      !(await js("return !!document.querySelector('article.pending')")), 60000);
    const st = await lastStats();
    assert.ok(Number(st.disk) > 0, `nothing from disk: ${st.text}`);
    assert.equal(Number(st.disk), Number(st.cached), 'RAM was empty: all cached came from disk');
    assert.match(st.text, new RegExp(`disk ${st.disk}`));
    await screenshot('7-from-disk.png');
  });

  console.log(`chat_page: screenshots in ${shots}; ${((Date.now() - t0) / 1000).toFixed(1)} s`);
});

after(() => {
  for (const p of children) if (p.exitCode === null) p.kill('SIGTERM');
  // all but the screenshots when they are in work (KVC_WEBUI_SHOTS unset)
  for (const f of ['model.gguf', 'profile', 'kv', 'think.jinja'])
    rmSync(join(work, f), { recursive: true, force: true });
  if (process.env.KVC_WEBUI_SHOTS) rmSync(work, { recursive: true, force: true });
});
