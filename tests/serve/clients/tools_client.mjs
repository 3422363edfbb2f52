// Tool calls and structured output through the official clients (openai and
// ollama from data/node_modules) against a random tiny model with loom's
// plain template (tools in the hermes form). A random model never calls a
// tool of its own accord, so the calls are asked for with tool_choice
// "required" or a named function (constrained decoding); what the test
// proves is the round trip: the call is rendered, generated, parsed, sent
// back as the API's tool_calls (streamed and not), answered with a tool
// message and continued. Structured output: sampled answers at temperature
// 1 all parse and are valid for their schema by Python's jsonschema
// (/usr/bin/python3, Debian's python3-jsonschema).
// Run by tests/serve/with_server.sh (LOOM_URL, LOOM_MODEL set).
// Usage: node tools_client.mjs DATA_DIR [GENERATIONS] [CASE...]
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';

const [dataDir, generationsArg, ...only] = process.argv.slice(2);
const generations = Number(generationsArg ?? 1000);
const require = createRequire(`${dataDir}/`);
const { OpenAI } = require('openai');
const { Ollama } = require('ollama');
const model = process.env.LOOM_MODEL;
const openai = new OpenAI({ baseURL: `${process.env.LOOM_URL}/v1`, apiKey: 'none', maxRetries: 0 });
const ollama = new Ollama({ host: process.env.LOOM_URL });

const weatherParams = {
  type: 'object',
  properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['celsius', 'fahrenheit'] } },
  required: ['city', 'unit'],
};
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather in a city', parameters: weatherParams } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } },
];

// Every value valid for its schema, by Python's jsonschema: [[schema, value], ...].
function validate(pairs) {
  const script = 'import json, sys, jsonschema\n' +
    'bad = [i for i, (s, v) in enumerate(json.load(sys.stdin)) if not jsonschema.Draft202012Validator(s).is_valid(v)]\n' +
    'print(json.dumps(bad))';
  const r = spawnSync('/usr/bin/python3', ['-c', script], { input: JSON.stringify(pairs), encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  const bad = JSON.parse(r.stdout);
  assert.deepEqual(bad, [], `invalid: ${bad.slice(0, 3).map((i) => JSON.stringify(pairs[i][1])).join(' ')}`);
}

// An OpenAI call of one of the tools, its arguments valid for its parameters.
function checkCall(call, name) {
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
  const tool = tools.find((t) => t.function.name === call.function.name);
  assert.ok(tool, `a call of ${call.function.name}, which was not offered`);
  if (name) assert.equal(call.function.name, name);
  const args = JSON.parse(call.function.arguments);
  validate([[tool.function.parameters, args]]);
  return args;
}
const checkWeatherCall = (call) => checkCall(call, 'get_weather');

const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

const cases = {
  async openaiRequiredCallRoundTrip() {
    const r = await openai.chat.completions.create({ model, messages, tools, tool_choice: 'required',
                                                     parallel_tool_calls: false, temperature: 1, seed: 3 });
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    const msg = r.choices[0].message;
    assert.equal(msg.tool_calls.length, 1);
    checkCall(msg.tool_calls[0]);
    const call = msg.tool_calls[0];
    const next = await openai.chat.completions.create({
      model, tools, max_tokens: 8, temperature: 0,
      messages: [...messages, msg, { role: 'tool', tool_call_id: call.id, content: '18 degrees and sunny' }],
    });
    assert.equal(next.choices[0].message.role, 'assistant');
    assert.ok(['stop', 'length', 'tool_calls'].includes(next.choices[0].finish_reason));
    assert.ok(next.usage.prompt_tokens > r.usage.prompt_tokens, 'the call and its result are in the prompt');
  },

  async openaiNamedFunctionIsCalled() {
    for (const seed of [1, 2, 3]) {
      const r = await openai.chat.completions.create({
        model, messages, tools, temperature: 1, seed,
        tool_choice: { type: 'function', function: { name: 'get_weather' } } });
      assert.equal(r.choices[0].finish_reason, 'tool_calls');
      assert.equal(r.choices[0].message.content, null);
      checkWeatherCall(r.choices[0].message.tool_calls[0]);
    }
  },

  async openaiStreamedCallsAccumulate() {
    const stream = await openai.chat.completions.create({
      model, messages, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } }, temperature: 1,
      seed: 5, stream: true });
    const calls = [];
    let finish = null, content = '';
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        content += c.delta.content ?? '';
        for (const t of c.delta.tool_calls ?? []) {
          calls[t.index] ??= { id: t.id, type: t.type, function: { name: '', arguments: '' } };
          calls[t.index].function.name += t.function?.name ?? '';
          calls[t.index].function.arguments += t.function?.arguments ?? '';
        }
        finish = c.finish_reason ?? finish;
      }
    }
    assert.equal(finish, 'tool_calls');
    assert.equal(content, '', 'nothing of the call leaks as content');
    assert.equal(calls.length, 1);
    checkWeatherCall(calls[0]);
    // The SDK's own accumulator reads the same stream into a message.
    const runner = openai.chat.completions.stream({
      model, messages, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } }, temperature: 1,
      seed: 5 });
    const final = await runner.finalChatCompletion();
    assert.equal(final.choices[0].finish_reason, 'tool_calls');
    assert.deepEqual(final.choices[0].message.tool_calls[0].function, calls[0].function);
  },

  async openaiJsonSchemaOutputsAreAlwaysValid() {
    const schema = {
      type: 'object',
      properties: {
        name: { type: 'string', maxLength: 10 }, age: { type: 'integer', minimum: 0, maximum: 120 },
        tags: { type: 'array', items: { type: 'string', maxLength: 6 }, maxItems: 3 },
        member: { type: 'boolean' }, score: { type: 'number' },
        kind: { enum: ['a', 'b', 'c'] }, note: { anyOf: [{ type: 'null' }, { type: 'string', maxLength: 8 }] },
      },
      required: ['name', 'age', 'kind'], additionalProperties: false,
    };
    const n = 16, pairs = [];
    const rounds = Math.ceil(generations / n);
    const started = Date.now();
    for (let k = 0; k < rounds; ++k) {
      const r = await openai.chat.completions.create({
        model, messages: [{ role: 'user', content: `Person ${k} as JSON` }], n, temperature: 1, seed: 1000 + k,
        max_tokens: 300, response_format: { type: 'json_schema', json_schema: { name: 'person', schema } } });
      for (const c of r.choices) {
        assert.equal(c.finish_reason, 'stop', `cut short: ${c.message.content}`);
        pairs.push([schema, JSON.parse(c.message.content)]);
      }
    }
    validate(pairs);
    console.log(`openai: ${pairs.length} json_schema generations at temperature 1 all valid ` +
                `(${((Date.now() - started) / 1000).toFixed(1)} s)`);
  },

  async openaiJsonObjectAndCompletionsAndChoice() {
    // Any object: its strings are unbounded, so a random model's may be cut by max_tokens ("length").
    const r = await openai.chat.completions.create({ model, messages, n: 8, temperature: 1, seed: 9, max_tokens: 40,
                                                     response_format: { type: 'json_object' } });
    for (const c of r.choices) {
      if (c.finish_reason === 'stop') assert.equal(typeof JSON.parse(c.message.content), 'object');
      else assert.ok(c.message.content.startsWith('{'), c.message.content);
    }
    const c = await openai.completions.create({ model, prompt: 'JSON:', n: 4, temperature: 1, seed: 4, max_tokens: 60,
                                                response_format: { type: 'json_schema', json_schema: { name: 'x',
                                                  schema: { type: 'array', items: { type: 'integer' }, maxItems: 4 } } } });
    for (const ch of c.choices) if (ch.finish_reason === 'stop') assert.ok(Array.isArray(JSON.parse(ch.text)));
    const g = await openai.chat.completions.create({ model, messages, temperature: 1, seed: 2, n: 8,
                                                     guided_choice: ['yes', 'no', 'maybe'] });
    for (const ch of g.choices) assert.ok(['yes', 'no', 'maybe'].includes(ch.message.content), ch.message.content);
  },

  async openaiBadSchemasAreTheClientsErrors() {
    for (const [body, param] of [
      [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', not: {} } } } },
       'response_format.json_schema.schema'],
      [{ response_format: { type: 'yaml' } }, 'response_format.type'],
      [{ tools, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice'],
      [{ tool_choice: 'required' }, 'tool_choice'],
      [{ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: {
        x: { type: 'number', multipleOf: 3 } } } } }], tool_choice: 'required' }, 'tools[0].function.parameters'],
    ]) {
      await assert.rejects(openai.chat.completions.create({ model, messages, ...body }), (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, `${e.constructor.name}: ${e.message}`);
        assert.equal(e.param, param, e.message);
        return true;
      });
    }
  },

  // A --model server answers /api/show for its model, with the tools capability ollama clients check.
  async ollamaShowOnADirectoryServer() {
    const show = await ollama.show({ model });
    assert.deepEqual(show.capabilities, ['completion', 'tools']);
    assert.equal(show.model_info['general.architecture'], 'gpt2');
    assert.equal(show.model_info['gpt2.context_length'], 512);
  },

  async ollamaToolCallRoundTrip() {
    const r = await ollama.chat({ model, messages, tools, tool_choice: 'required', stream: false,
                                  options: { temperature: 1, seed: 8 } });
    const calls = r.message.tool_calls;
    assert.ok(calls.length >= 1 && calls.length <= 4, JSON.stringify(calls));
    for (const call of calls) {
      assert.ok(['get_weather', 'get_time'].includes(call.function.name));
      assert.equal(typeof call.function.arguments, 'object', 'ollama: arguments are an object');
      if (call.function.name === 'get_weather') validate([[weatherParams, call.function.arguments]]);
    }
    const next = await ollama.chat({
      model, tools, stream: false, options: { temperature: 0, num_predict: 8 },
      messages: [...messages, { role: 'assistant', content: '', tool_calls: calls },
                 { role: 'tool', content: '18 degrees', tool_name: calls[0].function.name }] });
    assert.equal(next.done, true);
    assert.ok(next.prompt_eval_count > r.prompt_eval_count);
    // Streamed: the calls come in a part of their own, then the final part.
    const parts = [];
    for await (const part of await ollama.chat({ model, messages, tools, stream: true, options: { seed: 8 },
                                                 tool_choice: { type: 'function', function: { name: 'get_weather' } } }))
      parts.push(part);
    const withCalls = parts.filter((p) => p.message?.tool_calls?.length);
    assert.equal(withCalls.length, 1);
    validate([[weatherParams, withCalls[0].message.tool_calls[0].function.arguments]]);
    assert.equal(parts.at(-1).done, true);
  },

  async ollamaFormatJsonAndSchema() {
    const schema = { type: 'object', properties: { ok: { type: 'boolean' }, n: { type: 'integer' } },
                     required: ['ok', 'n'] };
    const pairs = [];
    for (const seed of [1, 2, 3, 4]) {
      const r = await ollama.chat({ model, messages, format: schema, stream: false, options: { temperature: 1, seed } });
      pairs.push([schema, JSON.parse(r.message.content)]);
      const g = await ollama.generate({ model, prompt: 'JSON please', format: 'json', stream: false,
                                        options: { temperature: 1, seed, num_predict: 40 } });
      if (g.done_reason === 'stop') pairs.push([{ type: 'object' }, JSON.parse(g.response)]);
      else assert.ok(g.response.startsWith('{'), g.response);  // any object: a string may run past num_predict
    }
    validate(pairs);
    await assert.rejects(ollama.chat({ model, messages, format: { type: 'object', not: {} }, stream: false }),
                         (e) => e.status_code === 400 && /format/.test(e.error ?? e.message));
  },
};

let passed = 0;
for (const [name, run] of Object.entries(cases)) {
  if (only.length && !only.includes(name)) continue;
  await run();
  console.log(`ok ${name}`);
  ++passed;
}
console.log(`tools_client: ${passed} cases passed`);
