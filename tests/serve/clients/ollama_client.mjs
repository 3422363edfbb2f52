// loom serve's ollama API through the official ollama client (ollama@0.6.4
// from data/node_modules, fetched by scripts/fetch-data.sh), against a store
// holding "tiny" (temperature 0, a SYSTEM prompt). Run by
// tests/serve/with_server.sh --store (LOOM_URL, LOOM_MODEL set).
// Usage: node ollama_client.mjs DATA_DIR [CASE...]   (no CASE: every case)
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';

const [dataDir, ...only] = process.argv.slice(2);
const { Ollama } = createRequire(`${dataDir}/`)('ollama');
const ollama = new Ollama({ host: process.env.LOOM_URL });
const model = process.env.LOOM_MODEL;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function expectStatus(promise, status, pattern) {
  await assert.rejects(promise, (e) => {
    assert.equal(e.status_code, status, `${e.name}: ${e.message}`);
    if (pattern) assert.match(e.error ?? e.message, pattern);
    return true;
  });
}

function checkFinal(r, maxTokens) {
  assert.equal(r.done, true);
  assert.ok(['stop', 'length'].includes(r.done_reason), r.done_reason);
  assert.ok(r.prompt_eval_count > 0 && r.eval_count >= 1 && r.eval_count <= maxTokens);
  assert.ok(Number.isInteger(r.total_duration) && r.total_duration > 1000, 'durations in nanoseconds');
  assert.ok(r.eval_duration <= r.total_duration && r.load_duration <= r.total_duration);
  assert.ok(!Number.isNaN(Date.parse(r.created_at)));
}

const cases = {
  async listShowsTheStore() {
    const { models } = await ollama.list();
    assert.deepEqual(models.map((m) => m.name), ['tiny:latest']);
    assert.equal(models[0].details.family, 'gpt2');
    assert.match(models[0].digest, /^[0-9a-f]{64}$/);
    assert.ok(models[0].size > 1e6);
    const show = await ollama.show({ model });
    assert.equal(show.system, 'You are terse.');
    assert.match(show.parameters, /temperature/);
    assert.match(show.modelfile, /FROM tiny:latest/);
    assert.equal(show.model_info['general.architecture'], 'gpt2');
    assert.deepEqual(show.capabilities, ['completion', 'tools']);  // loom's plain template offers tools
  },

  async generateStreamedAndNotAgree() {
    const whole = await ollama.generate({ model, prompt: 'Once upon a time', options: { num_predict: 10 } });
    checkFinal(whole, 10);
    assert.equal(typeof whole.response, 'string');
    let text = '', last = null;
    for await (const part of await ollama.generate({ model, prompt: 'Once upon a time', stream: true,
                                                     options: { num_predict: 10 } })) {
      text += part.response;
      last = part;
    }
    checkFinal(last, 10);
    assert.equal(text, whole.response, 'temperature 0 from the Modelfile: the same text');
    assert.equal(last.eval_count, whole.eval_count);
  },

  async chatStreamedAndNotAgree() {
    const messages = [{ role: 'user', content: 'Tell me about the sea' }];
    const whole = await ollama.chat({ model, messages, options: { num_predict: 8 } });
    checkFinal(whole, 8);
    assert.equal(whole.message.role, 'assistant');
    let text = '';
    for await (const part of await ollama.chat({ model, messages, stream: true, options: { num_predict: 8 } })) {
      assert.equal(part.message.role, 'assistant');
      text += part.message.content;
    }
    assert.equal(text, whole.message.content);
  },

  async keepAliveLoadsAndUnloads() {
    const loaded = await ollama.generate({ model, prompt: '' });
    assert.equal(loaded.done_reason, 'load');
    assert.deepEqual((await ollama.ps()).models.map((m) => m.name), ['tiny:latest']);
    const unloaded = await ollama.generate({ model, prompt: '', keep_alive: 0 });
    assert.equal(unloaded.done_reason, 'unload');
    let ps;
    for (let i = 0; i < 40; ++i) {
      ps = await ollama.ps();
      if (ps.models.length === 0) break;
      await sleep(100);
    }
    assert.deepEqual(ps.models, [], 'unloaded without a restart');
    const again = await ollama.generate({ model, prompt: 'Back again', options: { num_predict: 3 },
                                          keep_alive: '10m' });
    checkFinal(again, 3);
    const expires = Date.parse((await ollama.ps()).models[0].expires_at);
    assert.ok(expires > Date.now() + 8 * 60e3 && expires < Date.now() + 11 * 60e3, 'keep_alive 10m');
  },

  async createCopyDeleteThroughTheApi() {
    const template = '{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}' +
                     '{% if add_generation_prompt %}<|assistant|>{% endif %}';
    const created = await ollama.create({ model: 'tiny-chat', from: model, system: 'Be nice.', template,
                                          parameters: { temperature: 0, stop: ['<|user|>'], num_predict: 6 } });
    assert.equal(created.status, 'success');
    const show = await ollama.show({ model: 'tiny-chat' });
    assert.equal(show.template, template);
    assert.equal(show.system, 'Be nice.');
    const reply = await ollama.chat({ model: 'tiny-chat', messages: [{ role: 'user', content: 'Hi' }] });
    checkFinal(reply, 6);
    await ollama.copy({ source: 'tiny-chat', destination: 'tiny-copy:v2' });
    assert.deepEqual((await ollama.list()).models.map((m) => m.name).sort(),
                     ['tiny-chat:latest', 'tiny-copy:v2', 'tiny:latest']);
    await ollama.delete({ model: 'tiny-copy:v2' });
    await ollama.delete({ model: 'tiny-chat' });
    assert.deepEqual((await ollama.list()).models.map((m) => m.name), ['tiny:latest']);
    await expectStatus(ollama.delete({ model: 'tiny-chat' }), 404, /not found/);
  },

  // A loaded model re-created is served in its new form from the next
  // request on; removed, it answers 404 and leaves memory (ollama reads the
  // manifest per request).
  async recreatedAndRemovedModelsAreNotServedStale() {
    const digestOf = async (name) => (await ollama.list()).models.find((m) => m.name === name).digest;
    const loadedDigest = async (name) => (await ollama.ps()).models.find((m) => m.name === name)?.digest;
    const messages = [{ role: 'user', content: 'Hi' }];
    await ollama.create({ model: 'lifecycle', from: model, system: 'First.', parameters: { num_predict: 2 } });
    const before = await ollama.chat({ model: 'lifecycle', messages });
    const first = await digestOf('lifecycle:latest');
    assert.equal(await loadedDigest('lifecycle:latest'), first);
    await ollama.create({ model: 'lifecycle', from: model, system: 'Second, longer.', parameters: { num_predict: 2 } });
    const second = await digestOf('lifecycle:latest');
    assert.notEqual(second, first);
    const reply = await ollama.chat({ model: 'lifecycle', messages });
    assert.equal(await loadedDigest('lifecycle:latest'), second, 'the new model answers');
    assert.ok(reply.prompt_eval_count > before.prompt_eval_count, 'the new, longer SYSTEM is in the prompt');
    await ollama.delete({ model: 'lifecycle' });
    await expectStatus(ollama.chat({ model: 'lifecycle', messages }), 404, /not found/);
    let ps;
    for (let i = 0; i < 40; ++i) {  // gone from memory within the manager's check (about a second)
      ps = await ollama.ps();
      if (!ps.models.some((m) => m.name === 'lifecycle:latest')) break;
      await sleep(100);
    }
    assert.ok(!ps.models.some((m) => m.name === 'lifecycle:latest'), JSON.stringify(ps.models));
  },

  // keep_alive 0 while a request runs: the model unloads when it ends (the
  // last keep_alive asked for wins over the running request's).
  async keepAliveZeroDuringARequestUnloadsAfterIt() {
    const long = ollama.generate({ model, prompt: 'Tell a long story', keep_alive: '10m', stream: false,
                                   options: { num_predict: 60, temperature: 0 } });
    await sleep(150);
    const unloaded = await ollama.generate({ model, prompt: '', keep_alive: 0 });
    assert.equal(unloaded.done_reason, 'unload');
    await long;
    let ps;
    for (let i = 0; i < 40; ++i) {
      ps = await ollama.ps();
      if (!ps.models.some((m) => m.name === 'tiny:latest')) break;
      await sleep(100);
    }
    assert.ok(!ps.models.some((m) => m.name === 'tiny:latest'), 'unloaded once the request ended');
  },

  // ollama's fields that shape the prompt: context continues a previous
  // answer, system reaches a model without a template of its own,
  // num_ctx bounds the context, think is refused for a model that does not think.
  async contextSystemNumCtxAndThink() {
    const first = await ollama.generate({ model, prompt: 'One', stream: false, options: { num_predict: 3 } });
    assert.ok(Array.isArray(first.context) && first.context.length === first.prompt_eval_count + first.eval_count);
    const next = await ollama.generate({ model, prompt: ' two', context: first.context, stream: false,
                                         options: { num_predict: 3 } });
    const alone = await ollama.generate({ model, prompt: ' two', stream: false, options: { num_predict: 3 } });
    assert.ok(next.prompt_eval_count > alone.prompt_eval_count, 'the context is in the prompt');
    assert.deepEqual(next.context.slice(0, first.context.length), first.context);
    // The store's tiny has no template of its own but a SYSTEM: a different system is a different prompt.
    const other = await ollama.generate({ model, prompt: ' two', system: 'A much longer system prompt than before.',
                                          stream: false, options: { num_predict: 3 } });
    assert.ok(other.prompt_eval_count > alone.prompt_eval_count, 'system reaches the prompt');
    await expectStatus(ollama.generate({ model, prompt: 'x', options: { num_ctx: 4, num_predict: 8 } }), 400,
                       /maximum context length is 4 tokens/);
    const bounded = await ollama.generate({ model, prompt: 'x', stream: false, options: { num_ctx: 16 } });
    assert.ok(bounded.prompt_eval_count + bounded.eval_count <= 16, 'num_ctx bounds prompt and answer');
    await expectStatus(ollama.chat({ model, messages: [{ role: 'user', content: 'x' }], think: true }), 400,
                       /does not support thinking/);
    await expectStatus(ollama.create({ model: 'q', from: model, quantize: 'q4_K_M' }), 400, /quantize/);
    assert.ok(!(await ollama.list()).models.some((m) => m.name === 'q:latest'), 'nothing created');
  },

  // Run with --max-loaded 2: a third model unloads the least recently used idle one.
  async leastRecentlyUsedGoesFirst() {
    await ollama.copy({ source: model, destination: 'tiny-a' });
    await ollama.copy({ source: model, destination: 'tiny-b' });
    for (const m of [model, 'tiny-a', model, 'tiny-b'])  // tiny-a is now the least recently used
      await ollama.generate({ model: m, prompt: 'Hi', options: { num_predict: 2 } });
    assert.deepEqual((await ollama.ps()).models.map((m) => m.name).sort(), ['tiny-b:latest', 'tiny:latest']);
    await ollama.delete({ model: 'tiny-a' });
    await ollama.delete({ model: 'tiny-b' });
  },

  // Run alone with --memory-budget-mb 25 (one tiny model is ~17 MB with its KV cache): loading a second model
  // unloads the first, idle one. Not among the default cases.
  async memoryBudget() {
    await ollama.copy({ source: model, destination: 'tiny-m' });
    await ollama.generate({ model, prompt: 'Hi', options: { num_predict: 2 } });
    const one = (await ollama.ps()).models;
    // Everything it holds: weights, KV cache and working buffers, the logits alone 512 tokens x 50257 x 4 B.
    assert.ok(one.length === 1 && one[0].size > 512 * 50257 * 4 && one[0].size < 200 * 1048576, JSON.stringify(one));
    await ollama.generate({ model: 'tiny-m', prompt: 'Hi', options: { num_predict: 2 } });
    assert.deepEqual((await ollama.ps()).models.map((m) => m.name), ['tiny-m:latest']);
    await ollama.delete({ model: 'tiny-m' });
  },

  // The server runs where a folder ./tiny also lies: FROM tiny is the store's (its SYSTEM and PARAMETERs come
  // along), never the folder on the server's disk.
  async createFromTheStoreNeverReadsAFolder() {
    await ollama.create({ model: 'from-store', from: 'tiny' });
    const show = await ollama.show({ model: 'from-store' });
    assert.equal(show.system, 'You are terse.');
    assert.match(show.parameters, /temperature/);
    await ollama.delete({ model: 'from-store' });
  },

  // What /api/create cannot honour is refused by name (uploaded files, adapters, a role chats would refuse),
  // nothing created; an empty template or system is one not given, as ollama's create reads them.
  async createRefusesWhatItCannotHonourAndEmptyIsNotGiven() {
    const digest = 'sha256:' + '0'.repeat(64);
    await expectStatus(ollama.create({ model: 'f', from: model, files: { 'x.gguf': digest } }), 400, /^files is not/);
    await expectStatus(ollama.create({ model: 'f', from: model, adapters: { 'a.safetensors': digest } }), 400,
                       /^adapters is not supported.*--lora NAME=DIR.*lora merge/);
    await expectStatus(ollama.create({ model: 'f', from: model, messages: [{ role: 'bogus', content: 'x' }] }), 400,
                       /role 'bogus' is invalid/);
    assert.ok(!(await ollama.list()).models.some((m) => m.name === 'f:latest'), 'nothing created');
    await ollama.create({ model: 'empty', from: model, template: '', system: '', parameters: { num_predict: 2 } });
    const show = await ollama.show({ model: 'empty' });
    assert.equal(show.system, 'You are terse.');
    assert.equal(show.template, '');
    checkFinal(await ollama.chat({ model: 'empty', messages: [{ role: 'user', content: 'Hi' }] }), 2);
    await ollama.delete({ model: 'empty' });
  },

  // show's modelfile creates the same model again: values with quotes and lines read back whole.
  async showModelfileRoundTripsThroughCreate() {
    const system = 'Always answer "yes"', license = 'MIT\n"quoted" line\nCC-BY-4.0';
    await ollama.create({ model: 'quoted', from: model, system, license, parameters: { stop: ['User:', '"'] } });
    const { modelfile } = await ollama.show({ model: 'quoted' });
    await ollama.create({ model: 'again', modelfile });
    const again = await ollama.show({ model: 'again' });
    assert.equal(again.system, system);
    assert.equal(again.license, license);
    assert.equal(again.parameters, (await ollama.show({ model: 'quoted' })).parameters);
    await ollama.delete({ model: 'quoted' });
    await ollama.delete({ model: 'again' });
  },

  // No registry is reached: a model already here is pulled at once (clients pull before use); another is a 404.
  async pullSucceedsForAModelHereOnly() {
    assert.equal((await ollama.pull({ model, stream: false })).status, 'success');
    let last = null;
    for await (const part of await ollama.pull({ model, stream: true })) last = part;
    assert.equal(last.status, 'success');
    await expectStatus(ollama.pull({ model: 'not-here', stream: false }), 404, /no registry/);
    await expectStatus(ollama.push({ model, stream: false }), 400, /no registry/);
  },

  async errors() {
    await expectStatus(ollama.generate({ model: 'nope', prompt: 'x' }), 404, /nope/);
    await expectStatus(ollama.generate({ model, prompt: 'x', options: { temperature: 9 } }), 400,
                       /options\.temperature/);
    await expectStatus(ollama.generate({ model, prompt: 'x', keep_alive: 'soon' }), 400, /keep_alive/);
    // mirostat is refused rather than ignored; repeat_last_n is the repeat_penalty's window.
    await expectStatus(ollama.generate({ model, prompt: 'x', options: { mirostat: 2 } }), 400, /options\.mirostat/);
    await expectStatus(ollama.generate({ model, prompt: 'x', options: { repeat_last_n: -5 } }), 400,
                       /options\.repeat_last_n/);
    const windowed = await ollama.generate({ model, prompt: 'x', stream: false,
                                             options: { repeat_last_n: 64, repeat_penalty: 1.1, num_predict: 2 } });
    if (windowed.eval_count !== 2) throw new Error(`repeat_last_n 64: ${JSON.stringify(windowed)}`);
    await expectStatus(ollama.show({ model: 'nope' }), 404);
    await expectStatus(ollama.create({ model: 'x', from: 'nothing-here' }), 400, /FROM/);
    // A malformed request is answered before its model would load, and loads nothing (both APIs).
    await ollama.copy({ source: model, destination: 'never-loaded' });
    await expectStatus(ollama.chat({ model: 'never-loaded', messages: [{ role: 'user', content: 'x' }],
                                     options: { top_p: 7 } }), 400, /options\.top_p/);
    const openaiBad = await fetch(`${process.env.LOOM_URL}/v1/chat/completions`, {
      method: 'POST', body: JSON.stringify({ model: 'never-loaded', messages: [{ role: 'user', content: 'x' }],
                                             response_format: { type: 'json_schema', json_schema: { name: 'x',
                                               schema: { type: 'number', multipleOf: 2 } } } }) });
    assert.equal(openaiBad.status, 400);
    assert.equal((await openaiBad.json()).error.param, 'response_format.json_schema.schema');
    assert.ok(!(await ollama.ps()).models.some((m) => m.name === 'never-loaded:latest'), 'nothing was loaded');
    await ollama.delete({ model: 'never-loaded' });
    // A NUL does not cut the message; a path is told apart from a name; a Go template is named as one.
    await expectStatus(ollama.show({ model: 'a\u0000b' }), 400, /'a\\x00b' holds a control character/);
    await expectStatus(ollama.show({ model: '/abs/model' }), 400, /looks like a path/);
    await expectStatus(ollama.create({ model: 'go', from: model, template: '{{ .System }} {{ .Prompt }}' }), 400,
                       /^template: .*ollama Go template/);
    await expectStatus(ollama.chat({ model, messages: [{ role: 'user', content: 'x', images: ['aGk='] }] }), 400);
    // Flags are booleans, as ollama checks them; a prompt that fills the context says so.
    for (const [field, v] of [['stream', 'no'], ['stream', 0], ['raw', 'yes']]) {
      const r = await fetch(`${process.env.LOOM_URL}/api/generate`, {
        method: 'POST', body: JSON.stringify({ model, prompt: 'x', [field]: v }) });
      assert.equal(r.status, 400, `${field}=${JSON.stringify(v)}`);
      assert.match((await r.json()).error, new RegExp(`${field} must be true or false`));
    }
    await expectStatus(ollama.generate({ model, prompt: 'x '.repeat(40), options: { num_ctx: 8 } }), 400,
                       /fills the model's context of 8 tokens/);
  },
};

const names = only.length ? only : Object.keys(cases).filter((n) => n !== 'memoryBudget');
for (const name of names) {
  assert.ok(cases[name], `no case ${name}`);
  await cases[name]();
  console.log(`ok ${name}`);
}
console.log(`ollama_client: ${names.length} cases passed`);
