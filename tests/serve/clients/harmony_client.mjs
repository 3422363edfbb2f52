// gpt-oss's harmony format through the official clients (openai and ollama
// from data/node_modules): the random tiny model given gpt-oss's published
// chat template (read from ../shared/jinja-cases, passed as the template of
// a model created here). A random model never writes harmony of its own
// accord, so its answers are asked for with guided_grammar, tool_choice or
// a schema (constrained decoding), spelled with GPT-2's tokens: the
// vocabulary has no harmony tokens, and the reader reads text. What the test
// proves: the analysis channel comes back as reasoning (OpenAI's
// reasoning_content, ollama's thinking), the final channel as content, a
// message to functions.get_weather as a tool call (streamed and not) that
// round-trips through the template with its tool result, and a JSON answer
// is the final message's text.
// Run by tests/serve/with_server.sh --store (LOOM_URL, LOOM_MODEL set).
// Usage: node harmony_client.mjs DATA_DIR TEMPLATE
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';

const [dataDir, templatePath] = process.argv.slice(2);
if (!existsSync(templatePath)) {
  console.log(`harmony_client: skipped: ${templatePath} is not here`);
  process.exit(0);
}
const require = createRequire(`${dataDir}/`);
const { OpenAI } = require('openai');
const { Ollama } = require('ollama');
const openai = new OpenAI({ baseURL: `${process.env.LOOM_URL}/v1`, apiKey: 'none', maxRetries: 0 });
const ollama = new Ollama({ host: process.env.LOOM_URL });
const model = 'oss';

const messages = [{ role: 'user', content: 'What is the weather in Oslo?' }];
const weatherParams = { type: 'object', properties: { city: { type: 'string', maxLength: 10 } }, required: ['city'] };
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather', parameters: weatherParams } }];
// Thoughts of 2-6 letters, then an answer of 2-6 letters, in harmony's messages.
const guided_grammar = 'root ::= "<|channel|>analysis<|message|>" [a-z]{2,6} ' +
  '"<|end|><|start|>assistant<|channel|>final<|message|>" [a-z]{2,6}';
const word = /^[a-z]{2,6}$/;

let passed = 0;
async function check(name, fn) {
  await fn();
  passed += 1;
  console.log(`ok ${name}`);
}

await ollama.create({ model, from: process.env.LOOM_MODEL, template: readFileSync(templatePath, 'utf8') });

await check('openai: analysis is reasoning_content, final is content, streamed the same', async () => {
  const r = await openai.chat.completions.create({ model, messages, max_tokens: 60, temperature: 0, guided_grammar });
  const msg = r.choices[0].message;
  assert.match(msg.reasoning_content, word);
  assert.match(msg.content, word);
  assert.equal(r.choices[0].finish_reason, 'stop');
  let reasoning = '', content = '';
  for await (const chunk of await openai.chat.completions.create({ model, messages, max_tokens: 60, temperature: 0,
                                                                   guided_grammar, stream: true })) {
    reasoning += chunk.choices[0]?.delta?.reasoning_content ?? '';
    content += chunk.choices[0]?.delta?.content ?? '';
  }
  assert.equal(reasoning, msg.reasoning_content);
  assert.equal(content, msg.content);
});

await check('openai: a call round-trips through the template with its result', async () => {
  const r = await openai.chat.completions.create({ model, messages, tools, temperature: 1, seed: 4,
    tool_choice: { type: 'function', function: { name: 'get_weather' } } });
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  const msg = r.choices[0].message;
  assert.equal(msg.content, null);
  const call = msg.tool_calls[0];
  assert.equal(call.function.name, 'get_weather');
  assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
  assert.equal(typeof JSON.parse(call.function.arguments).city, 'string');
  const next = await openai.chat.completions.create({ model, tools, max_tokens: 8, temperature: 0,
    messages: [...messages, msg, { role: 'tool', tool_call_id: call.id, content: '18 degrees' }] });
  assert.ok(['stop', 'length', 'tool_calls'].includes(next.choices[0].finish_reason));
  assert.ok(next.usage.prompt_tokens > r.usage.prompt_tokens, 'the call and its result are in the prompt');
  // Streamed: the call comes as delta.tool_calls, nothing of its message as content.
  const calls = [];
  let content = '', finish = null;
  for await (const chunk of await openai.chat.completions.create({ model, messages, tools, temperature: 1, seed: 4,
    tool_choice: 'required', stream: true })) {
    for (const c of chunk.choices) {
      content += c.delta.content ?? '';
      for (const t of c.delta.tool_calls ?? []) calls.push(t);
      finish = c.finish_reason ?? finish;
    }
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(content, '');
  assert.equal(calls.length, 1);
  assert.deepEqual(JSON.parse(calls[0].function.arguments), JSON.parse(call.function.arguments));
});

await check('openai: a json_schema answer is the final message\'s text', async () => {
  const schema = { type: 'object', properties: { ok: { type: 'boolean' }, n: { type: 'integer' } },
                   required: ['ok', 'n'], additionalProperties: false };
  const r = await openai.chat.completions.create({ model, messages, n: 4, temperature: 1, seed: 2, max_tokens: 60,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } });
  for (const c of r.choices) {
    assert.equal(c.finish_reason, 'stop', c.message.content);
    const v = JSON.parse(c.message.content);
    assert.equal(typeof v.ok, 'boolean');
    assert.ok(Number.isInteger(v.n));
  }
});

await check('openai: reasoning_effort is checked', async () => {
  await assert.rejects(openai.chat.completions.create({ model, messages, max_tokens: 1, reasoning_effort: 'max' }),
                       (e) => e.status === 400 && e.param === 'reasoning_effort');
  const r = await openai.chat.completions.create({ model, messages, max_tokens: 1, reasoning_effort: 'low' });
  assert.equal(r.choices.length, 1);
});

await check('ollama: a call with its arguments as an object, and think levels', async () => {
  const r = await ollama.chat({ model, messages, tools, stream: false, options: { temperature: 1, seed: 4 },
                                tool_choice: { type: 'function', function: { name: 'get_weather' } } });
  const calls = r.message.tool_calls;
  assert.equal(calls.length, 1);
  assert.equal(calls[0].function.name, 'get_weather');
  assert.equal(typeof calls[0].function.arguments.city, 'string');
  assert.equal(r.message.content, '');
  const next = await ollama.chat({ model, tools, stream: false, options: { temperature: 0, num_predict: 8 },
    messages: [...messages, { role: 'assistant', content: '', tool_calls: calls },
               { role: 'tool', content: '18 degrees', tool_name: 'get_weather' }] });
  assert.ok(next.prompt_eval_count > r.prompt_eval_count);
  for (const think of [true, false, 'low', 'high']) {
    const t = await ollama.chat({ model, messages, think, stream: false, options: { num_predict: 4 } });
    assert.equal(t.done, true);
    if (think === false) assert.equal(t.message.thinking, undefined);
  }
  await assert.rejects(ollama.chat({ model, messages, think: 'max', stream: false }), (e) => e.status_code === 400);
  const f = await ollama.chat({ model, messages, stream: false, options: { temperature: 1, seed: 3 },
                                format: { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'] } });
  assert.equal(typeof JSON.parse(f.message.content).ok, 'boolean');
});

console.log(`harmony_client: ${passed} cases passed`);
