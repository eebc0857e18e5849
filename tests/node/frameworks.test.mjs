// frameworks.test.mjs - the agent frameworks people point at a local server,
// unmodified, against `kvchat serve` (issue 28): the Vercel AI SDK (`ai` with
// `@ai-sdk/openai-compatible`, chat completions), LangChain JS
// (`@langchain/openai`'s ChatOpenAI) and the OpenAI Agents SDK
// (`@openai/agents`, whose default model speaks the Responses API). Each: a
// chat, a stream whose text equals the whole reply at temperature 0, and a
// tool call round trip (the call forced, the tool run by the framework, its
// result sent back and answered, the second request reusing the first's
// cache). On the generated demo model with tests/node/hermes.jinja. Each
// framework's cases skip when its packages are not installed
// (scripts/install-node-deps.sh).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { optional, startHermesServer } from './serve.mjs';

const KEY = 'frameworks-node-key';
let server, root;

const [ai, compat, lc, lcMessages, lcTools, agents, zod] = await Promise.all([
  optional('ai'), optional('@ai-sdk/openai-compatible'), optional('@langchain/openai'),
  optional('@langchain/core/messages'), optional('@langchain/core/tools'),
  optional('@openai/agents'), optional('zod')]);
const skipAI = !(ai && compat && zod) && 'ai / @ai-sdk/openai-compatible not installed';
const skipLC = !(lc && lcMessages && lcTools && zod) && '@langchain/openai not installed';
const skipAgents = !(agents && zod) && '@openai/agents not installed';

before(async () => {
  ({ proc: server, root } = await startHermesServer(KEY));
});

after(() => { if (server && server.exitCode === null) server.kill('SIGTERM'); });

/* The server's counters (Prometheus text) by name. */
async function metrics() {
  const text = await (await fetch(`${root}/metrics`, { headers: { Authorization: `Bearer ${KEY}` } })).text();
  const out = {};
  for (const line of text.split('\n')) {
    const m = /^(kvchat_[a-z_]+) ([0-9.e+-]+)$/.exec(line);
    if (m)
      out[m[1]] = Number(m[2]);
  }
  return out;
}

const PROMPT = 'Tell me about the sea.';
const CITY_DOC = 'The weather in a city';
const calls = [];
function weatherOf(city) {
  calls.push(city);
  return `sunny in ${city}, 21 degrees`;
}

/* ------------------------------------------------------------ Vercel AI SDK */

test('AI SDK: generateText, streamText, a tool round trip', { skip: skipAI }, async () => {
  const { generateText, streamText, tool, stepCountIs } = ai;
  const { z } = zod;
  const provider = compat.createOpenAICompatible({
    name: 'kvchat', baseURL: `${root}/v1`, apiKey: KEY, includeUsage: true,
  });
  const model = provider.chatModel('kvchat-model');

  const whole = await generateText({ model, prompt: PROMPT, maxOutputTokens: 12, temperature: 0 });
  assert.equal(typeof whole.text, 'string');
  assert.ok(whole.text.length > 0);
  assert.equal(whole.finishReason, 'length');
  assert.equal(whole.usage.outputTokens, 12);
  assert.ok(whole.usage.inputTokens > 0);

  const s = streamText({ model, prompt: PROMPT, maxOutputTokens: 12, temperature: 0 });
  let streamed = '';
  for await (const piece of s.textStream)
    streamed += piece;
  assert.equal(streamed, whole.text, 'the stream says what the whole reply said');
  assert.equal(await s.finishReason, 'length');

  calls.length = 0;
  const before = await metrics();
  const r = await generateText({
    model, prompt: 'What is the weather in Paris?', temperature: 0, maxOutputTokens: 60,
    tools: {
      get_weather: tool({
        description: CITY_DOC,
        inputSchema: z.object({ city: z.string().max(12) }),
        execute: async ({ city }) => weatherOf(city),
      }),
    },
    stopWhen: stepCountIs(2),
    // the call forced first (a random model would not choose one), then an answer
    prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? 'required' : 'none' }),
  });
  assert.equal(r.steps.length, 2);
  const [call] = r.steps[0].toolCalls;
  assert.equal(call.toolName, 'get_weather');
  assert.equal(typeof call.input.city, 'string');
  assert.deepEqual(calls, [call.input.city], 'the SDK ran the tool with the call\'s input');
  assert.equal(r.steps[0].toolResults[0].output, weatherOf(call.input.city));
  assert.equal(typeof r.steps[1].text, 'string');
  const after = await metrics();
  assert.equal(after.kvchat_requests_total - before.kvchat_requests_total, 2);
  // the second request (with the call and its result) found the first's prompt cached
  assert.ok(r.steps[1].usage.cachedInputTokens >= r.steps[0].usage.inputTokens,
            `cached ${r.steps[1].usage.cachedInputTokens} of the first prompt's ` +
            `${r.steps[0].usage.inputTokens}`);
});

/* ---------------------------------------------------------- LangChain JS */

test('LangChain ChatOpenAI: invoke, stream, a tool round trip', { skip: skipLC }, async () => {
  const { ChatOpenAI } = lc;
  const { HumanMessage, ToolMessage } = lcMessages;
  const { z } = zod;
  const chat = new ChatOpenAI({
    model: 'kvchat-model', apiKey: KEY, temperature: 0, maxTokens: 12, maxRetries: 0,
    configuration: { baseURL: `${root}/v1` },
  });
  const whole = await chat.invoke([new HumanMessage(PROMPT)]);
  assert.equal(typeof whole.content, 'string');
  assert.ok(whole.content.length > 0);
  assert.equal(whole.response_metadata.finish_reason, 'length');
  assert.equal(whole.usage_metadata.output_tokens, 12);

  let streamed = '';
  for await (const chunk of await chat.stream([new HumanMessage(PROMPT)]))
    streamed += chunk.content;
  assert.equal(streamed, whole.content);

  calls.length = 0;
  const getWeather = lcTools.tool(async ({ city }) => weatherOf(city), {
    name: 'get_weather', description: CITY_DOC, schema: z.object({ city: z.string().max(12) }),
  });
  const chat60 = new ChatOpenAI({
    model: 'kvchat-model', apiKey: KEY, temperature: 0, maxTokens: 60, maxRetries: 0,
    configuration: { baseURL: `${root}/v1` },
  });
  const withTools = chat60.bindTools([getWeather], { tool_choice: 'required' });
  const history = [new HumanMessage('What is the weather in Paris?')];
  const ai1 = await withTools.invoke(history);
  assert.equal(ai1.tool_calls.length, 1);
  const call = ai1.tool_calls[0];
  assert.equal(call.name, 'get_weather');
  assert.equal(typeof call.args.city, 'string');
  const result = await getWeather.invoke(call);      // a ToolMessage answering the call
  assert.ok(result instanceof ToolMessage);
  assert.equal(result.tool_call_id, call.id);
  assert.deepEqual(calls, [call.args.city]);
  history.push(ai1, result);
  // the answer, with the same tools (the template renders them: the prompt
  // then continues the call's)
  const ai2 = await chat60.bindTools([getWeather], { tool_choice: 'none' }).invoke(history);
  assert.equal(typeof ai2.content, 'string');
  assert.ok(ai2.usage_metadata.input_tokens > ai1.usage_metadata.input_tokens);
  assert.ok(ai2.usage_metadata.input_token_details?.cache_read >= ai1.usage_metadata.input_tokens,
            'the answer reused the call\'s prompt');
});

/* ------------------------------------------------------ OpenAI Agents SDK */

test('Agents SDK: run, streamed run, a tool round trip', { skip: skipAgents }, async () => {
  const { Agent, run, tool, setDefaultOpenAIClient, setTracingDisabled } = agents;
  const { z } = zod;
  const { default: OpenAI } = await import('openai');
  setTracingDisabled(true);
  setDefaultOpenAIClient(new OpenAI({ baseURL: `${root}/v1`, apiKey: KEY, maxRetries: 0 }));

  // a reply cut by max_output_tokens is "incomplete", which the SDK throws
  // on: a structured output (text.format json_schema) ends by itself
  const Answer = z.object({ answer: z.string().max(24) });
  const plain = new Agent({
    name: 'plain', instructions: 'Be brief.', model: 'kvchat-model', outputType: Answer,
    modelSettings: { temperature: 0, maxTokens: 60 },
  });
  const whole = await run(plain, PROMPT);
  assert.equal(typeof whole.finalOutput.answer, 'string');

  const s = await run(plain, PROMPT, { stream: true });
  let streamed = '';
  for await (const piece of s.toTextStream())
    streamed += piece;
  await s.completed;
  assert.deepEqual(JSON.parse(streamed), whole.finalOutput);
  assert.deepEqual(s.finalOutput, whole.finalOutput);

  calls.length = 0;
  const getWeather = tool({
    name: 'get_weather', description: CITY_DOC,
    parameters: z.object({ city: z.string().max(12) }),
    execute: async ({ city }) => weatherOf(city),
  });
  // required for the first turn; the SDK resets the choice after a call
  // (resetToolChoice), so the second turn answers
  const withTool = new Agent({
    name: 'weather', instructions: 'Use the tool.', model: 'kvchat-model', tools: [getWeather],
    outputType: Answer,
    modelSettings: { temperature: 0, maxTokens: 60, toolChoice: 'required' },
  });
  const before = await metrics();
  const r = await run(withTool, 'What is the weather in Paris?', { maxTurns: 3 });
  const items = r.newItems.map((i) => i.type);
  assert.deepEqual(items.slice(0, 2), ['tool_call_item', 'tool_call_output_item']);
  assert.equal(calls.length, 1, 'the SDK ran the tool once');
  assert.equal(r.newItems[1].output, weatherOf(calls[0]));
  assert.equal(typeof r.finalOutput.answer, 'string');
  const after = await metrics();
  assert.equal(after.kvchat_requests_total - before.kvchat_requests_total, 2);
  assert.ok(r.rawResponses[1].usage.inputTokensDetails[0]?.cached_tokens >=
            r.rawResponses[0].usage.inputTokens, 'the answer reused the call\'s prompt');
});
