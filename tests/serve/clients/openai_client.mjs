// loom serve through the official OpenAI client (openai@5.23.2 from
// data/node_modules, fetched by scripts/fetch-data.sh). Run by
// tests/serve/with_server.sh, which sets LOOM_URL and LOOM_MODEL.
// Usage: node openai_client.mjs DATA_DIR [CASE...]   (no CASE: every case)
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';

const [dataDir, ...only] = process.argv.slice(2);
const { OpenAI } = createRequire(`${dataDir}/`)('openai');
const model = process.env.LOOM_MODEL;
const client = new OpenAI({ baseURL: `${process.env.LOOM_URL}/v1`, apiKey: process.env.LOOM_API_KEY ?? 'none',
                            maxRetries: 0 });

// Collects a streamed completion: the text of each choice, its finish
// reason, the usage chunk, and checks every chunk's shape on the way.
async function collect(stream) {
  const texts = [], finish = [];
  let usage = null, chunks = 0, id = null;
  for await (const chunk of stream) {
    ++chunks;
    assert.equal(chunk.object, 'text_completion');
    id ??= chunk.id;
    assert.equal(chunk.id, id, 'every chunk carries the same id');
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      texts[c.index] = (texts[c.index] ?? '') + c.text;
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  }
  return { texts, finish, usage, chunks };
}

async function expectError(promise, cls, status, pattern) {
  await assert.rejects(promise, (e) => {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${e.constructor.name}: ${e.message}`);
    assert.equal(e.status, status);
    if (pattern) assert.match(e.message, pattern);
    return true;
  });
}

// A greedy answer's token ids, through ollama's /api/generate: its context
// is the prompt's ids, then the answer's.
async function greedyIds(prompt, n) {
  const headers = { authorization: `Bearer ${process.env.LOOM_API_KEY ?? 'none'}`,
                    'content-type': 'application/json' };
  const body = { model, prompt, raw: true, stream: false, options: { temperature: 0, num_predict: n } };
  const r = await (await fetch(`${process.env.LOOM_URL}/api/generate`,
                               { method: 'POST', headers, body: JSON.stringify(body) })).json();
  return { prompt: r.context.slice(0, -r.eval_count), answer: r.context.slice(-r.eval_count) };
}

const cases = {
  async models() {
    const page = await client.models.list();
    assert.deepEqual(page.data.map((m) => m.id), [model]);
    assert.equal(page.data[0].object, 'model');
    // By any name the other routes take for it.
    for (const id of [model, `${model}:latest`]) assert.equal((await client.models.retrieve(id)).id, model);
    await expectError(client.models.retrieve('gpt-9'), OpenAI.NotFoundError, 404, /gpt-9/);
  },

  // The directory this server was started on (--model) is described as ollama describes a model: its weights'
  // file format and type (loom init-model writes f32 safetensors), not empty strings.
  async aDirectoryModelsDetailsNameItsWeights() {
    const headers = { authorization: `Bearer ${process.env.LOOM_API_KEY ?? 'none'}` };
    const { models } = await (await fetch(`${process.env.LOOM_URL}/api/tags`, { headers })).json();
    assert.equal(models.length, 1);
    assert.equal(models[0].details.format, 'safetensors', JSON.stringify(models[0]));
    assert.equal(models[0].details.quantization_level, 'F32', JSON.stringify(models[0]));
  },

  // No max_tokens: 16, or the room the prompt leaves when that is less (120 of the 128 tokens: 8).
  async theDefaultLengthFitsTheContext() {
    const r = await client.completions.create({ model, prompt: Array(120).fill(87), temperature: 0 });
    assert.equal(r.usage.prompt_tokens, 120);
    assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8, JSON.stringify(r.usage));
  },

  async completionAndStreamAgree() {
    const body = { model, prompt: 'The quick brown fox', max_tokens: 12, temperature: 0 };
    const whole = await client.completions.create(body);
    assert.equal(whole.object, 'text_completion');
    assert.equal(whole.choices.length, 1);
    assert.equal(whole.choices[0].finish_reason, 'length');
    assert.deepEqual(whole.usage, { prompt_tokens: 4, completion_tokens: 12, total_tokens: 16 });
    const streamed = await collect(await client.completions.create(
      { ...body, stream: true, stream_options: { include_usage: true } }));
    assert.equal(streamed.texts[0], whole.choices[0].text);
    assert.equal(streamed.finish[0], 'length');
    assert.deepEqual(streamed.usage, whole.usage);
    assert.ok(streamed.chunks >= 2);
  },

  async nThreeWithSeedIsReproducible() {
    const body = { model, prompt: 'Once upon a time', max_tokens: 10, n: 3, temperature: 1.0, seed: 1234 };
    const a = await client.completions.create(body);
    const b = await client.completions.create(body);
    assert.deepEqual(a.choices.map((c) => c.index), [0, 1, 2]);
    assert.deepEqual(a.choices.map((c) => c.text), b.choices.map((c) => c.text));
    assert.equal(a.usage.completion_tokens, 30);
    const other = await client.completions.create({ ...body, seed: 99 });
    assert.notDeepEqual(other.choices.map((c) => c.text), a.choices.map((c) => c.text));
    const streamed = await collect(await client.completions.create({ ...body, stream: true }));
    assert.deepEqual(streamed.texts, a.choices.map((c) => c.text));
  },

  async stopStringCutsTheText() {
    const body = { model, prompt: 'Hello there', max_tokens: 16, temperature: 0 };
    const full = (await client.completions.create(body)).choices[0].text;
    const stop = full.slice(6, 9);  // three characters well inside the greedy text
    assert.equal(stop.length, 3);
    const cut = await client.completions.create({ ...body, stop: [stop] });
    assert.equal(cut.choices[0].text, full.slice(0, full.indexOf(stop)));
    assert.equal(cut.choices[0].finish_reason, 'stop');
    const streamed = await collect(await client.completions.create({ ...body, stop, stream: true }));
    assert.equal(streamed.texts[0], cut.choices[0].text);
    assert.equal(streamed.finish[0], 'stop');
  },

  async logprobs() {
    const r = await client.completions.create({ model, prompt: 'Hi', max_tokens: 5, temperature: 0, logprobs: 3 });
    const lp = r.choices[0].logprobs;
    assert.equal(lp.tokens.length, 5);
    assert.equal(lp.token_logprobs.length, 5);
    assert.equal(lp.tokens.join(''), r.choices[0].text);
    lp.token_logprobs.forEach((x, i) => {
      assert.ok(x <= 0);
      const top = Object.values(lp.top_logprobs[i]);
      assert.ok(top.length >= 1 && top.length <= 4);
      assert.ok(Math.abs(Math.max(...top) - x) < 1e-5, 'greedy: the chosen token is the most likely');
    });
    assert.deepEqual(lp.text_offset, lp.tokens.map((_, i) => lp.tokens.slice(0, i).join('').length));
  },

  // As vLLM: the token that ends a choice through stop_token_ids adds no text, whole or streamed.
  async aStopTokensTextIsLeftOut() {
    const { prompt, answer } = await greedyIds('The quick brown fox', 10);
    const k = answer.findIndex((t, i) => i > 0 && !answer.slice(0, i).includes(t));
    assert.ok(k > 0, JSON.stringify(answer));
    const body = { model, prompt, max_tokens: 10, temperature: 0, stop_token_ids: [answer[k]] };
    const before = (await client.completions.create({ ...body, stop_token_ids: [], max_tokens: k })).choices[0].text;
    const cut = await client.completions.create(body);
    assert.equal(cut.choices[0].text, before);
    assert.equal(cut.choices[0].finish_reason, 'stop');
    assert.equal(cut.usage.completion_tokens, k + 1);
    const streamed = await collect(await client.completions.create({ ...body, stream: true }));
    assert.equal(streamed.texts[0], before);
    assert.equal(streamed.finish[0], 'stop');
  },

  // As vLLM's output processor: a stop string in the last allowed token overrides the length.
  async aStopStringInTheLastAllowedTokenIsAStop() {
    const body = { model, prompt: 'The quick brown fox', temperature: 0 };
    const full = await client.completions.create({ ...body, max_tokens: 12, logprobs: 0 });
    const { tokens } = full.choices[0].logprobs, text = full.choices[0].text;
    const at = (i) => tokens.slice(0, i).join('').length;
    let last = tokens.length;
    while (last > 1 && (!tokens[last - 1] || tokens[last - 1].startsWith('bytes:') ||
                        text.indexOf(tokens[last - 1]) !== at(last - 1))) --last;
    assert.ok(last > 1 && text.startsWith(tokens.slice(0, last).join('')), JSON.stringify(tokens));
    const stop = { ...body, max_tokens: last, stop: [tokens[last - 1]] };
    const r = await client.completions.create(stop);
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.choices[0].text, text.slice(0, at(last - 1)));
    const streamed = await collect(await client.completions.create({ ...stop, stream: true }));
    assert.equal(streamed.finish[0], 'stop');
    assert.equal(streamed.texts[0], r.choices[0].text);
  },

  // As vLLM's detokenizer: no stop string ends in the text of the first min_tokens tokens.
  async minTokensHoldsOffStopStrings() {
    const body = { model, prompt: 'The quick brown fox', temperature: 0, max_tokens: 12 };
    const full = await client.completions.create({ ...body, logprobs: 0 });
    const { tokens } = full.choices[0].logprobs, text = full.choices[0].text;
    const stop = tokens[0], quiet = tokens.slice(0, 4).join('');
    assert.ok(stop && !stop.startsWith('bytes:') && text.startsWith(quiet), JSON.stringify(tokens));
    const at = text.indexOf(stop, Math.max(0, quiet.length - stop.length + 1));
    const r = await client.completions.create({ ...body, stop: [stop], min_tokens: 4 });
    assert.equal(r.choices[0].text, at < 0 ? text : text.slice(0, at));
    assert.ok(r.usage.completion_tokens >= 5, JSON.stringify(r.usage));
  },

  // OpenAI: "up to logprobs+1" alternatives; the sampled token is always one of them (vLLM merges it in).
  async legacyTopLogprobsHoldTheSampledToken() {
    for (const logprobs of [0, 1]) {
      const r = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 16,
                                                  temperature: 1.5, seed: 3, logprobs });
      const lp = r.choices[0].logprobs;
      lp.tokens.forEach((t, i) => {
        const top = lp.top_logprobs[i];
        assert.equal(top[t], lp.token_logprobs[i], `logprobs ${logprobs}, step ${i}: ${JSON.stringify(top)}`);
        assert.ok(Object.keys(top).length <= logprobs + 1, JSON.stringify(top));
      });
    }
  },

  async tokenIdPromptsAndSeveralPrompts() {
    const ids = await client.completions.create({ model, prompt: [15496, 995], max_tokens: 4, temperature: 0 });
    const text = await client.completions.create({ model, prompt: 'Hello world', max_tokens: 4, temperature: 0 });
    assert.equal(ids.choices[0].text, text.choices[0].text);
    const two = await client.completions.create({ model, prompt: ['Hello world', 'Hi'], max_tokens: 4,
                                                  temperature: 0 });
    assert.deepEqual(two.choices.map((c) => c.index), [0, 1]);
    assert.equal(two.choices[0].text, text.choices[0].text);
  },

  async errorsAreTheClientsTypedErrors() {
    await expectError(client.completions.create({ model: 'nope', prompt: 'x' }), OpenAI.NotFoundError, 404,
                      /nope/);
    await expectError(client.completions.create({ model, prompt: 'x', max_tokens: 1000 }),
                      OpenAI.BadRequestError, 400, /maximum context length is 128 tokens.*1001 tokens/);
    await expectError(client.completions.create({ model, prompt: 'x', temperature: -1 }), OpenAI.BadRequestError,
                      400, /temperature/);
    await expectError(client.completions.create({ model, prompt: 'x', n: 1000 }), OpenAI.BadRequestError, 400, /n/);
  },

  // Chat: the plain template of a base model renders "System\n\nUser: ...\nAssistant:"; the answer is the
  // completion of that text with the template's stop strings.
  async chatMatchesTheCompletionOfItsRenderedPrompt() {
    const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say hi' }];
    const r = await client.chat.completions.create({ model, messages, max_tokens: 10, temperature: 0 });
    assert.equal(r.object, 'chat.completion');
    assert.match(r.id, /^chatcmpl-/);
    assert.equal(r.choices[0].message.role, 'assistant');
    const same = await client.completions.create({ model, prompt: 'You are terse.\n\nUser: Say hi\nAssistant:',
                                                   max_tokens: 10, temperature: 0, stop: ['\nUser:', '\nAssistant:'] });
    assert.equal(r.choices[0].message.content, same.choices[0].text);
    assert.equal(r.choices[0].finish_reason, same.choices[0].finish_reason);
    assert.deepEqual(r.usage, same.usage);
  },

  async chatStreamStartsWithTheRoleAndAgrees() {
    const body = { model, messages: [{ role: 'user', content: 'Tell me a story' }], max_completion_tokens: 12,
                   temperature: 0.9, seed: 5, n: 2 };
    const whole = await client.chat.completions.create(body);
    assert.deepEqual(whole.choices.map((c) => c.index), [0, 1]);
    const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
    const texts = ['', ''], roles = [], finish = [];
    let usage = null, first = true;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk');
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        if (first) assert.equal(c.delta.role, 'assistant', 'the first chunk names the role');
        if (c.delta.role) roles.push(c.index);
        texts[c.index] += c.delta.content ?? '';
        if (c.finish_reason) finish[c.index] = c.finish_reason;
      }
      first = false;
    }
    assert.deepEqual(roles, [0, 1]);
    assert.deepEqual(texts, whole.choices.map((c) => c.message.content));
    assert.deepEqual(finish, whole.choices.map((c) => c.finish_reason));
    assert.deepEqual(usage, whole.usage);
  },

  async chatLogprobs() {
    const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Hi' }],
                                                     max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 2 });
    const content = r.choices[0].logprobs.content;
    assert.equal(content.length, r.usage.completion_tokens);
    for (const t of content) {
      assert.ok(t.logprob <= 0 && Array.isArray(t.bytes) && t.top_logprobs.length === 2);
      assert.ok(Math.abs(t.top_logprobs[0].logprob - t.logprob) < 1e-5, 'greedy: the chosen token is the top one');
    }
    await expectError(client.chat.completions.create({ model, messages: [{ role: 'wizard', content: 'x' }] }),
                      OpenAI.BadRequestError, 400, /role/);
  },

  // The determinism through the server: 64 concurrent requests give
  // bitwise the tokens (and logprobs) each gives alone.
  async concurrentRequestsGiveWhatEachGivesAlone() {
    const body = (i) => ({ model, prompt: `Request number ${i} says`, max_tokens: 8, logprobs: 1,
                           temperature: i % 2 ? 0.8 : 0, seed: 1000 + i });
    const alone = [];
    for (let i = 0; i < 64; ++i) alone.push(await client.completions.create(body(i)));
    const together = await Promise.all(Array.from({ length: 64 }, (_, i) => client.completions.create(body(i))));
    for (let i = 0; i < 64; ++i) {
      assert.deepEqual(together[i].choices[0].logprobs.tokens, alone[i].choices[0].logprobs.tokens, `request ${i}`);
      assert.deepEqual(together[i].choices[0].logprobs.token_logprobs, alone[i].choices[0].logprobs.token_logprobs,
                       `request ${i}`);
    }
  },
};

const names = only.length ? only : Object.keys(cases);
for (const name of names) {
  assert.ok(cases[name], `no case ${name}`);
  await cases[name]();
  console.log(`ok ${name}`);
}
console.log(`openai_client: ${names.length} cases passed`);
