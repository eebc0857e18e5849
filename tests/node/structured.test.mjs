// structured.test.mjs - structured outputs through the agent frameworks,
// unmodified, against `kvchat serve` (issue 28): the AI SDK's generateObject
// and LangChain's withStructuredOutput with zod schemas (integers, formats
// such as email and uuid, a recursive tree), each result parsed and
// validated against its schema by the framework and again here. The server
// steers decoding with a grammar made from the schema, so the generated
// random-weight demo model answers within it. Each framework's cases skip
// when its packages are not installed (scripts/install-node-deps.sh).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { optional, startHermesServer } from './serve.mjs';

const KEY = 'structured-node-key';
let server, root;

const [ai, compat, lc, zod] = await Promise.all([
  optional('ai'), optional('@ai-sdk/openai-compatible'), optional('@langchain/openai'),
  optional('zod')]);
const skipAI = !(ai && compat && zod) && 'ai / @ai-sdk/openai-compatible / zod not installed';
const skipLC = !(lc && zod) && '@langchain/openai / zod not installed';

before(async () => {
  ({ proc: server, root } = await startHermesServer(KEY));
});

after(() => { if (server && server.exitCode === null) server.kill('SIGTERM'); });

/* The schemas: built lazily so that a missing zod only skips. */
function schemas() {
  const { z } = zod;
  const Contact = z.object({
    age: z.number().int().min(0).max(150),
    count: z.number().int(),
    email: z.email(),
    backup: z.string().email(),
    id: z.uuid(),
  });
  // recursive, the getter form zod 4 documents ...
  const Tree = z.object({
    name: z.string().max(8),
    get children() { return z.array(Tree).max(2); },
  });
  // ... and z.lazy
  const Lazy = z.lazy(() => z.object({ value: z.number().int(), kids: z.array(Lazy).max(2) }));
  const Forest = z.object({ name: z.string().max(8), children: z.array(Tree).min(1).max(2) });
  return { Contact, Tree, Lazy, Forest };
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const EMAIL = /^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$/;

/* Checks a Contact beyond zod's own parse. */
function checkContact(o) {
  assert.ok(Number.isInteger(o.age) && o.age >= 0 && o.age <= 150, `age ${o.age}`);
  assert.ok(Number.isInteger(o.count), `count ${o.count}`);
  assert.match(o.email, EMAIL);
  assert.match(o.backup, EMAIL);
  assert.match(o.id, UUID);
}

/* The depth of a tree whose children are under `key`. */
function depth(t, key) {
  return 1 + Math.max(0, ...t[key].map((c) => depth(c, key)));
}

/* ------------------------------------------------------------ Vercel AI SDK */

function aiModel() {
  const provider = compat.createOpenAICompatible({
    name: 'kvchat', baseURL: `${root}/v1`, apiKey: KEY, includeUsage: true,
    supportsStructuredOutputs: true,
  });
  return provider.chatModel('kvchat-model');
}

test('AI SDK generateObject: int, email, uuid, recursive', { skip: skipAI }, async () => {
  const { generateObject } = ai;
  const { Contact, Tree, Lazy, Forest } = schemas();
  const model = aiModel();
  const opts = { model, temperature: 0, maxOutputTokens: 400, maxRetries: 0 };

  const c = await generateObject({ ...opts, schema: Contact, prompt: 'A contact.' });
  assert.equal(c.finishReason, 'stop');
  Contact.parse(c.object);
  checkContact(c.object);

  const t = await generateObject({ ...opts, schema: Tree, prompt: 'A tree.' });
  Tree.parse(t.object);
  assert.ok(depth(t.object, 'children') >= 1);

  const l = await generateObject({ ...opts, schema: Lazy, prompt: 'A tree of numbers.' });
  Lazy.parse(l.object);

  // a root that must have children, each a recursive Tree: a $ref into $defs
  const f = await generateObject({ ...opts, schema: Forest, prompt: 'A forest.' });
  Forest.parse(f.object);
  assert.ok(depth(f.object, 'children') >= 2);
  assert.ok(depth(l.object, 'kids') >= 1);
});

/* ---------------------------------------------------------- LangChain JS */

test('LangChain withStructuredOutput: jsonSchema (default), functionCalling', { skip: skipLC },
     async () => {
  const { ChatOpenAI } = lc;
  const { Contact, Forest } = schemas();
  const chat = new ChatOpenAI({
    model: 'kvchat-model', apiKey: KEY, temperature: 0, maxTokens: 400, maxRetries: 0,
    configuration: { baseURL: `${root}/v1` },
  });
  for (const method of [undefined, 'functionCalling']) {
    const c = await chat.withStructuredOutput(Contact, { method, includeRaw: true })
      .invoke('A contact.');
    Contact.parse(c.parsed);
    checkContact(c.parsed);
    // @langchain/core 1.x recurses without end on a recursive zod schema
    // (interopZodTransformInputSchema: "Maximum call stack size exceeded",
    // before any request): give it the schema as JSON Schema, check with zod
    const forest = { name: 'Forest', ...zod.z.toJSONSchema(Forest) };
    const f = await chat.withStructuredOutput(forest, { method }).invoke('A forest.');
    Forest.parse(f);
    assert.ok(depth(f, 'children') >= 2);
  }
});

/* ------------------------------------------------------ a max_tokens sweep */

test('AI SDK generateObject under max_tokens 1..60: an object or finish "length"',
     { skip: skipAI }, async () => {
  const { generateObject, NoObjectGeneratedError } = ai;
  const { Contact, Forest } = schemas();
  const model = aiModel();
  const seen = { stop: 0, length: 0 };
  for (const schema of [Contact, Forest]) {
    for (const n of [1, 2, 3, 5, 8, 13, 21, 34, 60]) {
      try {
        const r = await generateObject({ model, schema, prompt: 'Go.', temperature: 0,
                                         maxOutputTokens: n, maxRetries: 0 });
        // a whole object: valid JSON, valid against the schema, within n
        assert.equal(r.finishReason, 'stop', `max_tokens ${n}`);
        assert.ok(r.usage.outputTokens <= n, `${r.usage.outputTokens} tokens > ${n}`);
        schema.parse(r.object);
        seen.stop++;
      } catch (e) {
        if (!NoObjectGeneratedError.isInstance(e))
          throw e;
        // a cut one: said so, and it is cut at n tokens
        assert.equal(e.finishReason, 'length', `max_tokens ${n}: ${e.message} ${e.text}`);
        assert.equal(e.usage.outputTokens, n);
        assert.throws(() => JSON.parse(e.text), SyntaxError, `max_tokens ${n}: ${e.text}`);
        seen.length++;
      }
    }
  }
  assert.ok(seen.length > 0 && seen.stop > 0, JSON.stringify(seen));
});
