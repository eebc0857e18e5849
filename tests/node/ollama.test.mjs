// ollama.test.mjs - Ollama's API (issue 29) through the official `ollama`
// npm client against `kvchat serve` on the generated demo model with
// tests/node/hermes.jinja (a template with tools): list, show, ps, version;
// chat and generate, whole and streamed (the streamed text equals the whole
// one); a second chat turn reuses the first's cache; options mapped
// (num_predict, temperature, stop) and refused (mirostat, num_ctx past the
// context); format as a JSON schema; tool calls in the history; the errors
// the client throws. Skips when the `ollama` package is not installed.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { optional, startHermesServer } from './serve.mjs';

const KEY = 'ollama-node-key';
const { Ollama = null } = (await optional('ollama')) ?? {};   // null: every test below skips
const skip = Ollama ? false : 'the ollama npm package is not installed (scripts/install-node-deps.sh)';
let server, root, ollama;

before(async () => {
  if (skip)
    return;
  ({ proc: server, root } = await startHermesServer(KEY, ['-c', '1024']));
  ollama = new Ollama({ host: root, headers: { Authorization: `Bearer ${KEY}` } });
});

after(() => { if (server && server.exitCode === null) server.kill('SIGTERM'); });

const question = [{ role: 'system', content: 'You are terse.' },
                  { role: 'user', content: 'Tell me about the sea.' }];

test('ollama: list, show, ps, version', { skip }, async () => {
  const tags = await ollama.list();
  assert.equal(tags.models.length, 1);
  const m = tags.models[0];
  assert.match(m.name, /:latest$/);
  assert.equal(m.details.format, 'gguf');
  assert.equal(m.details.family, 'qwen2');
  assert.match(m.digest, /^[0-9a-f]{64}$/);
  assert.ok(m.size > 0);

  const show = await ollama.show({ model: m.name });
  assert.equal(show.model_info['general.architecture'], 'qwen2');
  assert.ok(show.model_info['general.parameter_count'] > 0);
  assert.ok(show.capabilities.includes('completion'));
  assert.ok(show.capabilities.includes('tools'));        // hermes.jinja renders tools
  assert.match(show.template, /tool_call/);

  const ps = await ollama.ps();
  assert.equal(ps.models[0].name, m.name);
  assert.equal(ps.models[0].context_length, 1024);

  const v = await ollama.version();
  assert.match(v.version, /^\d+\.\d+\.\d+$/);
});

test('ollama: chat, whole and streamed, and a second turn from the cache', { skip }, async () => {
  const body = { model: 'kvchat', messages: question, options: { temperature: 0, num_predict: 8 } };
  const whole = await ollama.chat(body);
  assert.equal(whole.done, true);
  assert.equal(whole.done_reason, 'length');
  assert.equal(whole.message.role, 'assistant');
  assert.equal(typeof whole.message.content, 'string');
  assert.equal(whole.eval_count, 8);
  assert.ok(whole.prompt_eval_count > 10);
  assert.ok(whole.total_duration > 0 && whole.eval_duration > 0);

  let text = '', last, parts = 0;
  for await (const part of await ollama.chat({ ...body, stream: true })) {
    text += part.message.content;
    last = part;
    parts++;
  }
  assert.equal(text, whole.message.content);
  assert.equal(last.done, true);
  assert.equal(last.eval_count, 8);
  assert.ok(parts >= 2);

  // the next turn carries the whole conversation: everything before it is cached
  const next = await ollama.chat({
    ...body, messages: [...question, whole.message, { role: 'user', content: 'And tides?' }],
  });
  assert.ok(next.timings.cache_n >= whole.prompt_eval_count,
            `cached ${next.timings.cache_n} of ${next.prompt_eval_count}; turn 1 had ${whole.prompt_eval_count}`);
  assert.equal(next.timings.cache_n + next.timings.prompt_n, next.prompt_eval_count);
  console.log(`ollama chat: turn 2 ${next.prompt_eval_count} prompt tokens, ` +
              `${next.timings.cache_n} from the cache, ${next.timings.prompt_n} computed`);
});

test('ollama: generate, streamed and whole, raw and templated', { skip }, async () => {
  const body = { model: 'kvchat', prompt: 'Once upon a time', system: 'Tell stories.',
                 options: { temperature: 0, num_predict: 6 } };
  const whole = await ollama.generate(body);
  assert.equal(whole.done, true);
  assert.equal(whole.eval_count, 6);
  let text = '';
  for await (const part of await ollama.generate({ ...body, stream: true }))
    text += part.response;
  assert.equal(text, whole.response);

  // raw: the prompt as it is, no template: fewer tokens than with it
  const raw = await ollama.generate({ model: 'kvchat', prompt: 'Once upon a time', raw: true,
                                      options: { temperature: 0, num_predict: 3 } });
  assert.ok(raw.prompt_eval_count < whole.prompt_eval_count);
  assert.equal(raw.eval_count, 3);

  // an empty prompt loads the model
  const load = await ollama.generate({ model: 'kvchat', prompt: '' });
  assert.equal(load.done_reason, 'load');
});

test('ollama: options, format, tools in the history', { skip }, async () => {
  const schema = { type: 'object', properties: { city: { type: 'string', maxLength: 8 } },
                   required: ['city'] };
  const r = await ollama.chat({ model: 'kvchat', messages: question, format: schema,
                                options: { temperature: 0, num_predict: 40 } });
  assert.equal(typeof JSON.parse(r.message.content).city, 'string');

  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const t = await ollama.chat({
    model: 'kvchat', tools, options: { temperature: 0, num_predict: 4, num_gpu: 0 },
    messages: [{ role: 'user', content: 'Weather in Oslo?' },
               { role: 'assistant', content: '', tool_calls: [{ function: { name: 'get_weather',
                 arguments: { city: 'Oslo' } } }] },
               { role: 'tool', content: 'sunny', tool_name: 'get_weather' }],
  });
  assert.equal(t.eval_count, 4);

  await assert.rejects(ollama.chat({ model: 'kvchat', messages: question, options: { mirostat: 2 } }),
                       (e) => e.status_code === 400 && /mirostat/.test(e.error));
  await assert.rejects(ollama.chat({ model: 'kvchat', messages: question, options: { num_ctx: 4096 } }),
                       (e) => e.status_code === 400 && /num_ctx/.test(e.error));
  await assert.rejects(ollama.embed({ model: 'kvchat', input: 'x' }),
                       (e) => e.status_code === 501 && /embeddings/.test(e.error));
  const bad = new Ollama({ host: root, headers: { Authorization: 'Bearer wrong' } });
  await assert.rejects(bad.list(), (e) => e.status_code === 401);
});
