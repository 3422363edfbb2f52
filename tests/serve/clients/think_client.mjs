// A thinking model through the official clients (openai and ollama from
// data/node_modules): the think block of the output as OpenAI's
// reasoning_content (vLLM's field) and ollama's thinking, the rest as
// content, streamed and not; ollama's think: false reaching the template as
// enable_thinking = false; think on a model that does not think refused.
// The model is the random tiny one with a template written here that thinks
// as DeepSeek-R1's does (its generation prompt opens the block) and closes
// the block at once when enable_thinking is false (Qwen3's switch). A random
// model never closes the block by itself, so where the test needs an answer
// after the reasoning it asks for it with guided_grammar (constrained
// decoding): the split is then known exactly.
// Run by tests/serve/with_server.sh --store (LOOM_URL, LOOM_MODEL set).
// Usage: node think_client.mjs DATA_DIR
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';

const [dataDir] = process.argv.slice(2);
const require = createRequire(`${dataDir}/`);
const { OpenAI } = require('openai');
const { Ollama } = require('ollama');
const base = process.env.LOOM_URL;
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0 });
const ollama = new Ollama({ host: base });

const template =
  '{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}' +
  '{% if add_generation_prompt %}assistant: <think>' +
  '{% if enable_thinking is defined and not enable_thinking %}</think>{% endif %}\n{% endif %}';
const thinker = 'thinker';
const messages = [{ role: 'user', content: 'What is two and two?' }];
// Reasoning of 2-6 letters, the block closed, an answer of 2-6 letters.
const guided_grammar = 'root ::= [a-z]{2,6} "</think>" " "? [a-z]{2,6}';
const split = /^([a-z]{2,6})<\/think> ?([a-z]{2,6})$/;

let passed = 0;
async function check(name, fn) {
  await fn();
  passed += 1;
  console.log(`ok ${name}`);
}

// The chat as the template renders it (with the SYSTEM the model inherits
// from with_server.sh's Modelfile; trim_blocks drops the newline after the
// last endif), closed: as enable_thinking = false does.
const rendered = (closed) =>
  `system: You are terse.\nuser: What is two and two?\nassistant: <think>${closed ? '</think>' : ''}`;
// The raw output of the same request without the split: /v1/completions on
// the rendered chat (the template has no special tokens).
async function raw(maxTokens, grammar = guided_grammar, closed = false) {
  const r = await openai.completions.create({ model: thinker, prompt: rendered(closed), max_tokens: maxTokens,
    temperature: 0, ...(grammar ? { guided_grammar: grammar } : {}) });
  return r.choices[0].text;
}

await ollama.create({ model: thinker, from: process.env.LOOM_MODEL, template });

await check('openai: the think block is reasoning_content, the rest content', async () => {
  const text = await raw(20);
  const [, reasoning, content] = text.match(split) ?? assert.fail(`raw output ${JSON.stringify(text)}`);
  const r = await openai.chat.completions.create({ model: thinker, messages, max_tokens: 20, temperature: 0,
    guided_grammar });
  assert.equal(r.choices[0].message.reasoning_content, reasoning);
  assert.equal(r.choices[0].message.content, content);
});

await check('openai streamed: reasoning_content deltas, then content deltas', async () => {
  const r = await openai.chat.completions.create({ model: thinker, messages, max_tokens: 20, temperature: 0,
    guided_grammar, stream: true });
  let reasoning = '', content = '', sawContentFirst = false;
  for await (const chunk of r) {
    const d = chunk.choices[0]?.delta ?? {};
    if (d.reasoning_content) reasoning += d.reasoning_content;
    if (d.content) {
      if (!reasoning) sawContentFirst = true;
      content += d.content;
    }
  }
  const [, r0, c0] = (await raw(20)).match(split);
  assert.deepEqual([reasoning, content, sawContentFirst], [r0, c0, false]);
});

await check('openai: an output that never closes the block is all reasoning', async () => {
  const r = await openai.chat.completions.create({ model: thinker, messages, max_tokens: 8, temperature: 0 });
  const text = await raw(8, null);
  assert.ok(!text.includes('</think>'), 'the random model closed the block');
  assert.equal(r.choices[0].message.reasoning_content, text.trim());
  assert.equal(r.choices[0].message.content, '');
});

await check('ollama think: true gives message.thinking, streamed and not', async () => {
  const options = { temperature: 0, num_predict: 8 };
  const r = await ollama.chat({ model: thinker, messages, think: true, options });
  const whole = await openai.chat.completions.create({ model: thinker, messages, max_tokens: 8, temperature: 0 });
  assert.equal(r.message.thinking, whole.choices[0].message.reasoning_content);
  assert.equal(r.message.content, '');
  let thinking = '';
  for await (const part of await ollama.chat({ model: thinker, messages, think: true, options, stream: true }))
    thinking += part.message.thinking ?? '';
  assert.equal(thinking, r.message.thinking);
  const g = await ollama.generate({ model: thinker, prompt: messages[0].content, think: true, options });
  assert.equal(g.thinking, r.message.thinking);
  assert.equal(g.response, '');
});

await check('ollama think: false reaches the template, and nothing is split', async () => {
  const options = { temperature: 0, num_predict: 8 };
  const r = await ollama.chat({ model: thinker, messages, think: false, options });
  assert.equal(r.message.thinking, undefined);
  assert.equal(r.message.content, await raw(8, null, true));
});

await check('think on a model that does not think, or neither a boolean nor a level, is a 400', async () => {
  await assert.rejects(ollama.chat({ model: process.env.LOOM_MODEL, messages, think: true }),
    (e) => e.status_code === 400 && /does not support thinking/.test(e.message));
  await assert.rejects(ollama.chat({ model: thinker, messages, think: 'max' }),
    (e) => e.status_code === 400 && /think must be true, false, or a level/.test(e.message));
  // A level (gpt-oss's reasoning effort) turns thinking on for any thinking template.
  const r = await ollama.chat({ model: thinker, messages, think: 'high', stream: false, options: { num_predict: 4 } });
  assert.equal(typeof r.message.thinking, 'string');
  await assert.rejects(openai.chat.completions.create({ model: thinker, messages, chat_template_kwargs: { messages: [] } }),
    (e) => e.status === 400 && /chat_template_kwargs.messages/.test(e.message));
});

console.log(`think_client: ${passed} cases passed`);
