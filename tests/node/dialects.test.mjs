// dialects.test.mjs - kvchat's other API dialects (issue 28) through their
// official clients: the @anthropic-ai/sdk against /v1/messages (create,
// stream, a forced tool call, countTokens, errors) and the openai package's
// responses.create (plain, streamed, a forced function call), against
// `kvchat serve` on the generated demo model with tests/node/hermes.jinja.
// Greedy replies must agree between whole and streamed answers and across
// the APIs, and a conversation continued through another API hits its
// cache.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startHermesServer } from './serve.mjs';

const KEY = 'dialects-node-key';
let server, root, openai, anthropic;

before(async () => {
  ({ proc: server, root } = await startHermesServer(KEY));
  openai = new OpenAI({ baseURL: `${root}/v1`, apiKey: KEY, maxRetries: 0, timeout: 120000 });
  // the SDK sends the key as x-api-key and anthropic-version, as Claude Code does
  anthropic = new Anthropic({ baseURL: root, apiKey: KEY, maxRetries: 0, timeout: 120000 });
});

after(() => { if (server && server.exitCode === null) server.kill('SIGTERM'); });

const weather = {
  name: 'get_weather',
  description: 'The weather in a city',
  input_schema: {
    type: 'object',
    properties: { city: { type: 'string', maxLength: 16 } },
    required: ['city'],
  },
};

const question = [{ role: 'user', content: 'Tell me about the sea.' }];

test('anthropic: messages.create', async () => {
  const m = await anthropic.messages.create({
    model: 'claude-sonnet-4-5', max_tokens: 12, temperature: 0, system: 'Be brief.',
    messages: question,
  });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_/);
  assert.equal(m.content[0].type, 'text');
  assert.equal(typeof m.content[0].text, 'string');
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.usage.output_tokens, 12);
  assert.ok(m.usage.input_tokens + m.usage.cache_read_input_tokens > 5);
});

test('anthropic: messages.stream gives the text of create', async () => {
  const body = { model: 'claude', max_tokens: 10, temperature: 0, messages: question };
  const whole = await anthropic.messages.create(body);
  const stream = anthropic.messages.stream(body);
  let text = '';
  stream.on('text', (t) => { text += t; });
  const final = await stream.finalMessage();
  assert.equal(text, whole.content[0].text);
  assert.equal(final.content[0].text, whole.content[0].text);
  assert.equal(final.stop_reason, 'max_tokens');
  assert.equal(final.usage.output_tokens, 10);
});

test('anthropic: a forced tool call, whole and streamed', async () => {
  const body = {
    model: 'claude', max_tokens: 60, temperature: 0, tools: [weather],
    tool_choice: { type: 'tool', name: 'get_weather', disable_parallel_tool_use: true },
    messages: [{ role: 'user', content: 'Weather in Oslo?' }],
  };
  const m = await anthropic.messages.create(body);
  const use = m.content.find((b) => b.type === 'tool_use');
  assert.ok(use, JSON.stringify(m.content));
  assert.equal(use.name, 'get_weather');
  assert.equal(typeof use.input.city, 'string');
  assert.equal(m.stop_reason, 'tool_use');

  const final = await anthropic.messages.stream(body).finalMessage();
  const su = final.content.find((b) => b.type === 'tool_use');
  assert.deepEqual(su.input, use.input);   // the SDK assembled input_json_delta

  // the result sent back continues the conversation
  const next = await anthropic.messages.create({
    ...body, tool_choice: { type: 'auto' },
    messages: [...body.messages, { role: 'assistant', content: m.content },
               { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny' }] }],
    max_tokens: 6,
  });
  assert.ok(next.usage.cache_read_input_tokens > 0, JSON.stringify(next.usage));
});

test('anthropic: countTokens equals the usage of the request', async () => {
  const body = { model: 'claude', messages: question, system: 'Be brief.' };
  const c = await anthropic.messages.countTokens(body);
  const m = await anthropic.messages.create({ ...body, max_tokens: 1 });
  assert.equal(c.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
});

test('anthropic: errors arrive as the SDK\'s errors', async () => {
  await assert.rejects(
    anthropic.messages.create({ model: 'c', max_tokens: 3,
      messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'http://x' } }] }] }),
    (e) => e instanceof Anthropic.BadRequestError && /image/.test(e.message));
  const bad = new Anthropic({ baseURL: root, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.messages.create({ model: 'c', max_tokens: 3, messages: question }),
    (e) => e instanceof Anthropic.AuthenticationError);
});

test('openai: responses.create, plain and streamed', async () => {
  const body = { model: 'm', input: 'Tell me about the sea.', instructions: 'Be brief.',
                 max_output_tokens: 10, temperature: 0, store: false };
  const r = await openai.responses.create(body);
  assert.equal(r.object, 'response');
  assert.equal(r.status, 'incomplete');
  assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.equal(typeof r.output_text, 'string');      // the SDK's convenience over output
  assert.ok(r.output_text.length > 0);
  assert.equal(r.usage.output_tokens, 10);

  const stream = await openai.responses.create({ ...body, stream: true });
  let text = '', last;
  const seen = new Set();
  for await (const ev of stream) {
    seen.add(ev.type);
    if (ev.type === 'response.output_text.delta')
      text += ev.delta;
    last = ev;
  }
  assert.equal(text, r.output_text);
  for (const t of ['response.created', 'response.in_progress', 'response.output_item.added',
                   'response.content_part.added', 'response.output_text.done',
                   'response.output_item.done'])
    assert.ok(seen.has(t), t);
  assert.equal(last.type, 'response.incomplete');
  assert.equal(last.response.output[0].content[0].text, text);
});

test('openai: responses.stream helper and a forced function call', async () => {
  const tools = [{ type: 'function', name: 'get_weather', description: 'The weather in a city',
                   parameters: weather.input_schema }];
  const r = await openai.responses.create({
    model: 'm', input: 'Weather in Oslo?', tools, parallel_tool_calls: false,
    tool_choice: { type: 'function', name: 'get_weather' }, max_output_tokens: 60, temperature: 0,
  });
  const call = r.output.find((o) => o.type === 'function_call');
  assert.ok(call, JSON.stringify(r.output));
  assert.equal(call.name, 'get_weather');
  assert.equal(typeof JSON.parse(call.arguments).city, 'string');

  // the call and its output sent back as items: the conversation goes on, cached
  const next = await openai.responses.create({
    model: 'm', tools, max_output_tokens: 5, temperature: 0,
    input: [{ role: 'user', content: 'Weather in Oslo?' },
            { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments },
            { type: 'function_call_output', call_id: call.call_id, output: 'sunny' }],
  });
  assert.ok(next.usage.input_tokens_details.cached_tokens > 0, JSON.stringify(next.usage));

  const s = openai.responses.stream({ model: 'm', input: 'Hello', max_output_tokens: 6, temperature: 0 });
  let deltas = '';
  s.on('response.output_text.delta', (e) => { deltas += e.delta; });
  const fin = await s.finalResponse();    // the helper's snapshot (it adds no output_text)
  assert.ok(deltas.length > 0);
  assert.equal(fin.output[0].content[0].text, deltas);
});

test('one conversation through chat, Responses and Messages', async () => {
  const chat = await openai.chat.completions.create({
    model: 'm', max_tokens: 8, temperature: 0,
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi there' },
               { role: 'assistant', content: 'Hello!' }, { role: 'user', content: 'More please' }],
  });
  const resp = await openai.responses.create({
    model: 'm', max_output_tokens: 8, temperature: 0, instructions: 'Be brief.',
    input: [{ role: 'user', content: 'Hi there' }, { role: 'assistant', content: 'Hello!' },
            { role: 'user', content: 'More please' }],
  });
  const msg = await anthropic.messages.create({
    model: 'c', max_tokens: 8, temperature: 0, system: 'Be brief.',
    messages: [{ role: 'user', content: 'Hi there' }, { role: 'assistant', content: 'Hello!' },
               { role: 'user', content: 'More please' }],
  });
  const text = chat.choices[0].message.content;
  assert.equal(resp.output_text, text);
  assert.equal(msg.content[0].text, text);
  assert.equal(resp.usage.input_tokens, chat.usage.prompt_tokens);
  assert.ok(resp.usage.input_tokens_details.cached_tokens >= chat.usage.prompt_tokens - 16);
  assert.ok(msg.usage.cache_read_input_tokens >= chat.usage.prompt_tokens - 16);
});
