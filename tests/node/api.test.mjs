// api.test.mjs - kvchat's HTTP API through the official `openai` client.
//
// Starts `$KVC_BIN serve --port 0 --api-key ...` (the generated demo model),
// reads the port from its "listening on http://HOST:PORT" line, and checks:
// whole and streamed chat (the streamed text equals the whole one at
// temperature 0; usage arrives in a last chunk), completions, a multi-turn
// conversation whose cached_tokens grow every turn, and errors surfacing as
// the SDK's APIError subclasses with the right status, code and param.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer } from './serve.mjs';

const KEY = 'kvchat-test-key';
let server;
let baseURL;
let client;

before(async () => {
  const started = await startServer(['--api-key', KEY, '--parallel', '4']);
  server = started.proc;
  baseURL = `${started.root}/v1`;
  client = new OpenAI({ baseURL, apiKey: KEY, maxRetries: 0, timeout: 60000 });
});

after(async () => {
  if (!server || server.exitCode !== null)
    return;
  const exited = new Promise((resolve) => server.on('exit', resolve));
  server.kill('SIGTERM');
  let timer;
  const code = await Promise.race([
    exited, new Promise((r) => { timer = setTimeout(() => r('timeout'), 10000); })]);
  clearTimeout(timer);
  if (code === 'timeout')
    server.kill('SIGKILL');
  assert.equal(code, 0, 'the server exits cleanly on SIGTERM');
});

const ask = [{ role: 'user', content: 'Tell me about the sea.' }];

test('models', async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  assert.equal(typeof list.data[0].id, 'string');
  assert.equal(list.data[0].object, 'model');
});

test('chat, whole and streamed with usage', async () => {
  const whole = await client.chat.completions.create({
    model: 'any-name', messages: ask, max_tokens: 16, temperature: 0,
  });
  assert.match(whole.id, /^chatcmpl-/);
  assert.equal(whole.object, 'chat.completion');
  assert.equal(whole.model, 'any-name');
  const choice = whole.choices[0];
  assert.equal(choice.message.role, 'assistant');
  assert.equal(typeof choice.message.content, 'string');
  assert.ok(['stop', 'length'].includes(choice.finish_reason));
  const u = whole.usage;
  assert.ok(u.prompt_tokens > 0 && u.completion_tokens >= 1 && u.completion_tokens <= 16);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  assert.equal(typeof u.prompt_tokens_details.cached_tokens, 'number');

  const stream = await client.chat.completions.create({
    model: 'any-name', messages: ask, max_tokens: 16, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  let finish = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.choices.length) {
      text += chunk.choices[0].delta.content ?? '';
      finish = chunk.choices[0].finish_reason ?? finish;
    } else {
      usage = chunk.usage;
    }
  }
  assert.ok(chunks >= 3, `${chunks} chunks`);
  assert.equal(text, choice.message.content, 'streamed text equals the whole reply');
  assert.equal(finish, choice.finish_reason);
  assert.ok(usage, 'a usage chunk arrives last');
  assert.equal(usage.completion_tokens, u.completion_tokens);
  assert.equal(usage.prompt_tokens, u.prompt_tokens);
});

test('completions', async () => {
  const r = await client.completions.create({
    model: 'm', prompt: 'Once upon a time', max_tokens: 8, temperature: 0,
  });
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8);
});

test('a conversation: cached_tokens grow every turn', async () => {
  const messages = [{ role: 'system', content: 'You are a helpful assistant.' }];
  const turns = ['Hello!', 'What is a cache?', 'Why is it fast?', 'Give an example.',
                 'And a second one?', 'Thanks, bye.'];
  let prev = -1;
  for (const [i, t] of turns.entries()) {
    messages.push({ role: 'user', content: t });
    const r = await client.chat.completions.create({
      model: 'm', messages, max_tokens: 12, temperature: 0, prompt_cache_key: 'node-conv',
    });
    const cached = r.usage.prompt_tokens_details.cached_tokens;
    assert.ok(cached > prev, `turn ${i}: cached ${cached} after ${prev}`);
    assert.equal(r.timings.prompt_n, r.usage.prompt_tokens - cached);
    prev = cached;
    messages.push({ role: 'assistant', content: r.choices[0].message.content });
  }
  assert.ok(prev > 40, `the last turn reused ${prev} tokens`);
});

test('errors are APIErrors with status, code and param', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'm', messages: ask, temperature: 5 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'temperature' &&
           /temperature/.test(e.message));
  await assert.rejects(
    client.chat.completions.create({ model: 'm', messages: ask, n: 17 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'n');
  for (const stream of [false, true])
    await assert.rejects(
      client.chat.completions.create({ model: 'm', messages: ask, max_tokens: 1000000, stream }),
      (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded');
  const wrong = new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrong.models.list(),
                       (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  await assert.rejects(client.models.retrieve('no-such-model'),
                       (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
  // The server still answers afterwards.
  const r = await client.chat.completions.create({ model: 'm', messages: ask, max_tokens: 2 });
  assert.equal(r.choices.length, 1);
});
