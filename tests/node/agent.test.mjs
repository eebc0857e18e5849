// agent.test.mjs - the agent API (issue 13) through the official `openai`
// client: forced tool calls valid against their schema (ajv), streamed tool
// calls assembled by the client, a 30-step agent loop whose turns compute
// only their new tokens, 20 json_schema response formats on a random-weight
// model, n = 4 computing the prompt once (/metrics), stream: true with n = 2
// assembled per choice by the client, and streamed logprobs in every chunk.
//
// The server runs the generated demo model with tests/node/hermes.jinja, a
// Hermes/Qwen-style template that renders tools and tool calls.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import OpenAI from 'openai';
import Ajv from 'ajv';
import { startServer } from './serve.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
let server, root, client;

before(async () => {
  ({ proc: server, root } = await startServer(['--parallel', '4', '--cache-disk', '0',
                                              '--chat-template-file',
                                              path.join(here, 'hermes.jinja')]));
  client = new OpenAI({ baseURL: `${root}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
});

after(() => { if (server && server.exitCode === null) server.kill('SIGTERM'); });

const ajv = new Ajv({ strict: false });
ajv.addFormat('date', /^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$/);
ajv.addFormat('time', /^([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)?$/i);
ajv.addFormat('uuid', /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i);

const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string', maxLength: 16 },
        unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
        days: { type: 'integer', minimum: 1, maximum: 7 },
      },
      required: ['city', 'unit'],
    },
  },
};
const search = {
  type: 'function',
  function: {
    name: 'search',
    parameters: {
      type: 'object',
      properties: { query: { type: 'string', maxLength: 24 }, top: { type: 'integer', minimum: 1, maximum: 9 } },
      required: ['query'],
    },
  },
};
const next = {
  type: 'function',
  function: { name: 'next_step', parameters: { type: 'object', properties: { n: { type: 'integer', minimum: 0, maximum: 9 } }, required: ['n'] } },
};
const tools = [weather, search, next];
const schemaOf = (name) => tools.find((t) => t.function.name === name).function.parameters;

function checkCall(call) {
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_/);
  const fn = call.function;
  assert.ok(['get_weather', 'search', 'next_step'].includes(fn.name), fn.name);
  const args = JSON.parse(fn.arguments);
  const validate = ajv.compile(schemaOf(fn.name));
  assert.ok(validate(args), `${fn.arguments}: ${ajv.errorsText(validate.errors)}`);
  return args;
}

async function metric(name) {
  const text = await (await fetch(`${root}/metrics`)).text();
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : NaN;
}

test('tool_choice required: a call whose arguments validate against the schema', async () => {
  for (let seed = 1; seed <= 5; seed++) {
    const r = await client.chat.completions.create({
      messages: [{ role: 'user', content: `What is the weather like? (${seed})` }],
      tools, tool_choice: 'required', parallel_tool_calls: false, max_tokens: 400, seed,
    });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls');
    assert.equal(c.message.content, null);
    assert.equal(c.message.tool_calls.length, 1);
    checkCall(c.message.tool_calls[0]);
  }
});

test('tool_choice naming a function forces that one', async () => {
  const r = await client.chat.completions.create({
    messages: [{ role: 'user', content: 'Find me something.' }], tools, max_tokens: 400,
    tool_choice: { type: 'function', function: { name: 'search' } }, seed: 3,
  });
  const calls = r.choices[0].message.tool_calls;
  assert.ok(calls.length >= 1);
  for (const c of calls) {
    assert.equal(c.function.name, 'search');
    checkCall(c);
  }
});

test('streamed tool calls assembled by the client equal the whole answer', async () => {
  const req = {
    messages: [{ role: 'user', content: 'Weather in Lisbon, please.' }], tools,
    tool_choice: 'required', max_tokens: 400, temperature: 0,
  };
  const whole = await client.chat.completions.create(req);
  const stream = client.chat.completions.stream({ ...req, stream: true });
  const final = await stream.finalChatCompletion();
  const a = whole.choices[0].message.tool_calls, b = final.choices[0].message.tool_calls;
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  assert.equal(b.length, a.length);
  for (let i = 0; i < a.length; i++) {
    assert.equal(b[i].function.name, a[i].function.name);
    assert.equal(b[i].function.arguments, a[i].function.arguments);
    checkCall(b[i]);
  }
});

// The tokens of what a request adds to the conversation before it: its
// rendered prompt's tokens past the common prefix with the prompt of the
// conversation without its last message.
async function newTokens(messages) {
  const tok = async (msgs) => {
    const p = await (await fetch(`${root}/apply-template`, {
      method: 'POST', body: JSON.stringify({ messages: msgs, tools }) })).json();
    return (await (await fetch(`${root}/tokenize`, {
      method: 'POST', body: JSON.stringify({ content: p.prompt }) })).json()).tokens;
  };
  const a = await tok(messages), b = await tok(messages.slice(0, -1));
  let k = 0;
  while (k < a.length && k < b.length && a[k] === b[k]) k++;
  return a.length - k;
}

async function settled() {                 // the tool "runs" while the engine canonicalizes
  for (let i = 0; i < 500 && (await metric('kvchat_background_pending')) > 0; i++)
    await new Promise((r) => setTimeout(r, 10));
}

test('a 30-step agent loop computes at most 1.05x the new tokens per turn', async () => {
  const messages = [{ role: 'system', content: 'You are an agent. Use the tools.' },
                    { role: 'user', content: 'Plan a trip: check the weather, search for hotels.' }];
  const key = `agent-${process.pid}`;
  let worst = 0, computed = 0, fresh = 0;
  for (let step = 0; step < 30; step++) {
    const r = await client.chat.completions.create({
      messages, tools, tool_choice: { type: 'function', function: { name: 'next_step' } },
      parallel_tool_calls: false, max_tokens: 60, temperature: 0, prompt_cache_key: key,
    });
    const msg = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    checkCall(msg.tool_calls[0]);
    if (step > 0) {
      const n = await newTokens(messages);
      const done = r.timings.prompt_n;
      computed += done;
      fresh += n;
      worst = Math.max(worst, done / n);
      assert.ok(done <= Math.ceil(1.05 * n), `step ${step}: computed ${done}, new ${n}`);
    }
    messages.push({ role: 'assistant', content: msg.content, tool_calls: msg.tool_calls });
    messages.push({ role: 'tool', tool_call_id: msg.tool_calls[0].id,
                    content: `ok ${step}` });
    await settled();
  }
  console.log(`agent loop: turns 2-30 computed ${computed} tokens for ${fresh} new ` +
              `(worst turn ${worst.toFixed(3)}x)`);
});

// 20 schemas: objects, arrays, enums, consts, nested, anyOf, $ref, patterns,
// formats, number ranges. Random weights: only the mask makes them valid.
const schemas = [
  { type: 'object', properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer' } }, required: ['name', 'age'] },
  { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'] },
  { type: 'object', properties: { tags: { type: 'array', items: { type: 'string', maxLength: 6 }, maxItems: 3 } }, required: ['tags'] },
  { type: 'object', properties: { color: { enum: ['red', 'green', 'blue'] } }, required: ['color'] },
  { type: 'object', properties: { v: { const: 42 } }, required: ['v'] },
  { type: 'object', properties: { p: { type: 'object', properties: { x: { type: 'number' }, y: { type: 'number' } }, required: ['x', 'y'] } }, required: ['p'] },
  { type: 'array', items: { type: 'integer', minimum: 0, maximum: 99 }, minItems: 1, maxItems: 4 },
  { type: 'object', properties: { id: { anyOf: [{ type: 'integer' }, { type: 'string', maxLength: 5 }] } }, required: ['id'] },
  { type: 'object', properties: { d: { type: 'string', format: 'date' } }, required: ['d'] },
  { type: 'object', properties: { u: { type: 'string', format: 'uuid' } }, required: ['u'] },
  { type: 'object', properties: { code: { type: 'string', pattern: '^[A-Z]{3}-[0-9]{2}$' } }, required: ['code'] },
  { type: 'object', properties: { n: { type: ['integer', 'null'] } }, required: ['n'] },
  { $defs: { pt: { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] } }, type: 'object', properties: { first: { $ref: '#/$defs/pt' }, second: { $ref: '#/$defs/pt' } }, required: ['first', 'second'] },
  { type: 'object', properties: { s: { type: 'string', minLength: 2, maxLength: 4 } }, required: ['s'] },
  { type: 'object', properties: { k: { type: 'integer', minimum: -5, maximum: 5 } }, required: ['k'] },
  { type: 'object', properties: { list: { type: 'array', items: { type: 'object', properties: { q: { type: 'boolean' } }, required: ['q'] }, maxItems: 2 } }, required: ['list'] },
  { type: 'object', properties: { opt: { type: 'string', maxLength: 3 }, req: { type: 'integer' } }, required: ['req'] },
  { type: 'object', properties: { t: { type: 'string', format: 'time' } }, required: ['t'] },
  { type: 'object', properties: { pair: { type: 'array', items: { type: 'integer' }, minItems: 2, maxItems: 2 } }, required: ['pair'] },
  { type: 'object', properties: { level: { enum: [1, 2, 3] }, label: { type: 'string', enum: ['lo', 'hi'] } }, required: ['level', 'label'] },
];

test('response_format json_schema: 20 schemas, every output parses and validates', async () => {
  let masks = 0, maskMs = 0;
  for (const [i, schema] of schemas.entries()) {
    const r = await client.chat.completions.create({
      messages: [{ role: 'user', content: `Answer in JSON (${i}).` }], max_tokens: 300, seed: i,
      response_format: { type: 'json_schema', json_schema: { name: `s${i}`, schema, strict: true } },
    });
    const text = r.choices[0].message.content;
    assert.equal(r.choices[0].finish_reason, 'stop', `schema ${i}: ${text}`);
    const v = JSON.parse(text);
    const validate = ajv.compile(schema);
    assert.ok(validate(v), `schema ${i}: ${text}: ${ajv.errorsText(validate.errors)}`);
    masks += r.timings.grammar_masks;
    maskMs += r.timings.grammar_mask_ms;
  }
  console.log(`json_schema: ${masks} masks, ${(1000 * maskMs / masks).toFixed(1)} us per token`);
});

test('response_format json_object gives a JSON object; unsupported features are 400s', async () => {
  const r = await client.chat.completions.create({
    messages: [{ role: 'user', content: 'JSON please' }], max_tokens: 200, seed: 9,
    response_format: { type: 'json_object' },
  });
  assert.equal(typeof JSON.parse(r.choices[0].message.content), 'object');
  await assert.rejects(client.chat.completions.create({
    messages: [{ role: 'user', content: 'x' }],
    response_format: { type: 'json_schema', json_schema: { name: 'u', schema: { type: 'array', uniqueItems: true } } },
  }), (e) => e.status === 400 && /uniqueItems/.test(e.message));
});

test('n = 4 computes the prompt once', async () => {
  const long = Array.from({ length: 40 }, (_, i) => `fact ${i}: the sea is deep.`).join(' ');
  const before = await metric('kvchat_computed_tokens_total');
  const r = await client.chat.completions.create({
    messages: [{ role: 'user', content: `${long} (${process.pid})` }], n: 4, max_tokens: 8,
  });
  const after = await metric('kvchat_computed_tokens_total');
  assert.equal(r.choices.length, 4);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
  const prompt = r.usage.prompt_tokens, done = after - before;
  console.log(`n=4: prompt ${prompt} tokens, computed ${done}`);
  // once, plus at most the last partial block (< 16 tokens) for each other choice
  assert.ok(done < prompt + 3 * 16, `computed ${done} for a prompt of ${prompt}`);
});

test('stream: true with n = 2: the client assembles each choice as the whole answer', async () => {
  const req = { messages: [{ role: 'user', content: 'Tell me about the sea.' }], n: 2,
                max_tokens: 16, temperature: 1, seed: 9 };
  const whole = await client.chat.completions.create(req);
  const stream = client.chat.completions.stream({ ...req, stream: true });
  const final = await stream.finalChatCompletion();
  assert.equal(final.choices.length, 2);
  for (const c of whole.choices) {
    const s = final.choices.find((x) => x.index === c.index);
    assert.equal(s.message.content, c.message.content, `choice ${c.index}`);
    assert.equal(s.finish_reason, c.finish_reason);
  }
});

test('streamed logprobs come in each chunk with its text', async () => {
  const req = { messages: [{ role: 'user', content: 'Tell me about the sea.' }], max_tokens: 16,
                temperature: 1, seed: 4, logprobs: true, top_logprobs: 2 };
  const whole = await client.chat.completions.create(req);
  const stream = await client.chat.completions.create({ ...req, stream: true });
  const got = [];
  let text = '';
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c)
      continue;
    const content = c.delta.content ?? '';
    if (content) {
      const lp = c.logprobs?.content ?? [];
      assert.ok(lp.length > 0, `chunk '${content}' without logprobs`);
      const bytes = Buffer.from(lp.flatMap((t) => t.bytes));
      assert.equal(bytes.toString('utf8'), content);
      text += content;
    }
    got.push(...(c.logprobs?.content ?? []));
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.deepEqual(got, whole.choices[0].logprobs.content);
});
