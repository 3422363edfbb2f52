// LoRA adapters served unmerged (loom serve --lora NAME=DIR), through the
// official OpenAI client (openai from data/node_modules) and ollama's HTTP
// routes. Run by tests/serve/lora_serve.sh under with_server.sh, with three
// adapters a1, a2, a3 on the model LOOM_MODEL.
// - /v1/models lists the model and its adapters (vLLM's parent), /api/tags too.
// - 32 requests mixed over the base and the adapters (8 each; greedy and
//   seeded sampling), all at once: every request's text and log-probabilities
//   are bitwise those it gets alone.
// - The adapters act: one prompt gets four different answers.
// - A name that is neither the model nor an adapter is a 404.
// Usage: node lora_client.mjs DATA_DIR
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';

const [dataDir] = process.argv.slice(2);
const { OpenAI, NotFoundError } = createRequire(`${dataDir}/`)('openai');
const base = process.env.LOOM_MODEL, url = process.env.LOOM_URL;
const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0 });
const models = [base, 'a1', 'a2', 'a3'];
let cases = 0;

const listed = await client.models.list();
const parents = Object.fromEntries(listed.data.map((m) => [m.id, m.parent]));
assert.deepEqual(parents, { [base]: null, a1: base, a2: base, a3: base });
const tags = await (await fetch(`${url}/api/tags`)).json();
for (const a of ['a1', 'a2', 'a3'])
  assert.equal(tags.models.find((m) => m.name === a).details.parent_model, base);
++cases;

const words = ['The quick brown fox', 'Once upon a time', 'In the beginning', 'A long way from home',
               'Numbers: one two three', 'She said that', 'The river ran', 'It was the best of times'];
const requests = [];
for (let i = 0; i < 32; ++i)
  requests.push({ model: models[i % 4], prompt: `${words[Math.floor(i / 4)]} (${i % 3})`, max_tokens: 6 + (i % 5),
                  temperature: i % 2 ? 0.9 : 0, seed: 1000 + i, logprobs: 1 });
const answer = async (r) => {
  const c = await client.completions.create(r);
  assert.equal(c.model, r.model);
  const ch = c.choices[0];
  return JSON.stringify({ text: ch.text, logprobs: ch.logprobs.token_logprobs, tokens: ch.logprobs.tokens });
};
const alone = [];
for (const r of requests) alone.push(await answer(r));
const together = await Promise.all(requests.map(answer));
for (let i = 0; i < requests.length; ++i)
  assert.equal(together[i], alone[i], `request ${i} (model ${requests[i].model}) differs in a mixed batch`);
++cases;

for (let g = 0; g < 32; g += 4)  // the same prompt under the base and each adapter: four answers
  if (requests[g].temperature === 0) {
    const first = [0, 1, 2, 3].map((k) => JSON.parse(alone[g + k]).logprobs[0]);
    assert.equal(new Set(first).size, 4, `group ${g / 4}: ${first}`);
  }
++cases;

const chat = await client.chat.completions.create({ model: 'a2', messages: [{ role: 'user', content: 'Hi' }],
                                                    max_tokens: 4, temperature: 0 });
assert.equal(chat.model, 'a2');
assert.equal(chat.choices[0].finish_reason, 'length');
const ollama = await (await fetch(`${url}/api/generate`, {
  method: 'POST', body: JSON.stringify({ model: 'a3', prompt: 'Hi', stream: false, options: { num_predict: 3 } }),
})).json();
assert.equal(ollama.model, 'a3');
assert.equal(ollama.done, true);
++cases;

await assert.rejects(client.completions.create({ model: 'a4', prompt: 'x', max_tokens: 1 }),
                     (e) => e instanceof NotFoundError && /a4/.test(e.message));
++cases;
console.log(`lora_client: ${cases} cases passed (32 requests over the base and 3 adapters equal alone)`);
