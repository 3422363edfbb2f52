// Embeddings through the official clients (openai and ollama from
// data/node_modules) and raw HTTP: OpenAI's /v1/embeddings (the client asks
// for base64 by default; float asked for explicitly must give the same f32
// values), ollama's /api/embed and the older /api/embeddings (the model's
// vector unscaled). What must hold whatever the model: every vector is the
// model's width, unit length where the API scales it, the scaled vector is
// the unscaled one divided by its length, dimensions keeps the first ones
// (scaled again), an input's vector does not depend on the other inputs of
// its request or on how many there are (100 inputs run 32 at a time), token
// ids embed as their text does, and what a client gets wrong is a 400 in its
// API's envelope. The numbers themselves are proven against PyTorch by
// tests/infer/test_embed.cpp.
// Run by tests/serve/with_server.sh --store (LOOM_URL, LOOM_MODEL set).
// Usage: node embed_client.mjs DATA_DIR
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';

const [dataDir] = process.argv.slice(2);
const require = createRequire(`${dataDir}/`);
const { OpenAI } = require('openai');
const { Ollama } = require('ollama');
const base = process.env.LOOM_URL;
const model = process.env.LOOM_MODEL;
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0 });
const ollama = new Ollama({ host: base });

let passed = 0;
async function check(name, fn) {
  await fn();
  passed += 1;
  console.log(`ok ${name}`);
}

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const scaled = (v) => v.map((x) => x / norm(v));
function close(a, b, tol, what) {
  assert.equal(a.length, b.length, `${what}: lengths`);
  for (let i = 0; i < a.length; i += 1)
    assert.ok(Math.abs(a[i] - b[i]) <= tol, `${what}: element ${i}: ${a[i]} vs ${b[i]}`);
}
async function post(path, body) {
  const r = await fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

const texts = ['The quick brown fox', 'jumps over', 'the lazy dog. '.repeat(5), 'a'];
// The reference vectors: one request per text through the older route (unscaled).
const raw = [];
for (const prompt of texts) raw.push((await ollama.embeddings({ model, prompt })).embedding);
const width = raw[0].length;

await check('the older /api/embeddings: the model\'s width, not scaled', async () => {
  assert.ok(width >= 8, `width ${width}`);
  for (const v of raw) assert.equal(v.length, width);
  assert.ok(raw.some((v) => Math.abs(norm(v) - 1) > 1e-3), 'some vector is not of unit length');
});

await check('openai (base64, the client\'s default): unit length, the unscaled vector scaled, in input order', async () => {
  const r = await openai.embeddings.create({ model, input: texts });
  assert.equal(r.object, 'list');
  assert.equal(r.model, model);
  assert.deepEqual(r.data.map((d) => [d.object, d.index]), texts.map((_, i) => ['embedding', i]));
  r.data.forEach((d, i) => {
    assert.ok(Math.abs(norm(d.embedding) - 1) < 1e-5);
    close(d.embedding, scaled(raw[i]), 1e-6, `input ${i}`);
  });
  assert.ok(r.usage.prompt_tokens > texts.length && r.usage.total_tokens === r.usage.prompt_tokens);
});

await check('openai: encoding_format float gives the same f32 values as base64', async () => {
  const b = await openai.embeddings.create({ model, input: texts[0] });
  const f = await openai.embeddings.create({ model, input: texts[0], encoding_format: 'float' });
  assert.deepEqual(f.data[0].embedding.map(Math.fround), Array.from(b.data[0].embedding));
});

await check('an input\'s vector does not depend on its batch: 100 inputs, 32 at a time', async () => {
  const many = Array.from({ length: 100 }, (_, i) => texts[i % texts.length]);
  const r = await openai.embeddings.create({ model, input: many, encoding_format: 'float' });
  const alone = await openai.embeddings.create({ model, input: texts, encoding_format: 'float' });
  assert.equal(r.data.length, 100);
  r.data.forEach((d, i) => {
    assert.equal(d.index, i);
    assert.deepEqual(d.embedding, alone.data[i % texts.length].embedding, `input ${i}`);
  });
});

await check('dimensions: the first ones, scaled to unit length again', async () => {
  const r = await openai.embeddings.create({ model, input: texts[1], dimensions: 8, encoding_format: 'float' });
  close(r.data[0].embedding, scaled(raw[1].slice(0, 8)), 1e-6, 'dimensions 8');
  const o = await ollama.embed({ model, input: texts[1], dimensions: 8 });
  assert.deepEqual(o.embeddings[0], r.data[0].embedding);
});

await check('token ids embed as their text does', async () => {
  // The text's ids: ollama's /api/generate returns them as context (with one answer token after).
  const g = await ollama.generate({ model, prompt: texts[0], raw: true, options: { num_predict: 1 } });
  const ids = g.context.slice(0, -1);
  const r = await openai.embeddings.create({ model, input: [ids, texts[0]], encoding_format: 'float' });
  assert.deepEqual(r.data[0].embedding, r.data[1].embedding);
  const one = await openai.embeddings.create({ model, input: ids, encoding_format: 'float' });
  assert.deepEqual(one.data[0].embedding, r.data[0].embedding);
});

await check('ollama /api/embed: the OpenAI vectors, counts and durations', async () => {
  const o = await ollama.embed({ model, input: texts });
  const r = await openai.embeddings.create({ model, input: texts, encoding_format: 'float' });
  assert.equal(o.embeddings.length, texts.length);
  o.embeddings.forEach((v, i) => assert.deepEqual(v, r.data[i].embedding));
  assert.equal(o.prompt_eval_count, r.usage.prompt_tokens);
  assert.ok(o.total_duration > 0 && o.load_duration >= 0);
  const single = await ollama.embed({ model, input: texts[2] });
  assert.deepEqual(single.embeddings, [r.data[2].embedding]);
});

await check('ollama: an empty input only loads the model', async () => {
  assert.deepEqual((await ollama.embed({ model, input: [] })).embeddings, []);
  assert.deepEqual((await ollama.embeddings({ model, prompt: '' })).embedding, []);
});

await check('too long: openai 400 naming the lengths; ollama truncates unless truncate is false', async () => {
  const long = 'word '.repeat(400);
  await assert.rejects(openai.embeddings.create({ model, input: ['ok', long] }), (e) => {
    assert.equal(e.status, 400);
    assert.match(e.message, /input 1 has \d+ tokens: this model embeds at most \d+/);
    return true;
  });
  const cut = await ollama.embed({ model, input: long, options: { num_ctx: 64 } });
  assert.equal(cut.prompt_eval_count, 63);
  assert.equal(cut.embeddings[0].length, width);
  const r = await post('/api/embed', { model, input: long, truncate: false });
  assert.equal(r.status, 400);
  assert.match(r.body.error, /truncate: true cuts it to fit/);
});

await check('what a client gets wrong is a 400 in its API\'s envelope', async () => {
  const cases = [
    ['/v1/embeddings', { model, input: '' }, /input 0 is empty/],
    ['/v1/embeddings', { model, input: [] }, /input/],
    ['/v1/embeddings', { model }, /input is required/],
    ['/v1/embeddings', { model, input: [1.5] }, /input/],
    ['/v1/embeddings', { model, input: [[-1]] }, /token ids are integers from 0 to/],
    ['/v1/embeddings', { model, input: 'x', encoding_format: 'int8' }, /encoding_format/],
    ['/v1/embeddings', { model, input: 'x', dimensions: 0 }, /dimensions must be a positive integer/],
    ['/v1/embeddings', { model, input: 'x', dimensions: width + 1 }, /embedding size/],
    ['/api/embed', { model, input: [1, 2] }, /input must be a string or a list of strings/],
    ['/api/embed', { model, input: 'x', truncate: 'yes' }, /truncate must be true or false/],
    ['/api/embeddings', { model, prompt: ['x'] }, /prompt must be a string/],
  ];
  for (const [path, body, message] of cases) {
    const r = await post(path, body);
    assert.equal(r.status, 400, `${path} ${JSON.stringify(body)}: ${JSON.stringify(r.body)}`);
    const text = path.startsWith('/v1/') ? r.body.error.message : r.body.error;
    assert.equal(typeof text, 'string', JSON.stringify(r.body));
    assert.match(text, message);
  }
  const missing = await post('/v1/embeddings', { model: 'no-such-model', input: 'x' });
  assert.equal(missing.status, 404);
  assert.equal(missing.body.error.type, 'NotFoundError');
});

console.log(`embed_client: ${passed} cases passed`);
