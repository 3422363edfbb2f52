// 100+ malformed or hostile requests against a running loom serve: each gets
// the right 4xx with vLLM's JSON envelope ({"error": {message, type, param,
// code}}), none a 5xx, and the server keeps serving (a valid request after
// every 20 cases, and at the end). Run by tests/serve/with_server.sh
// (LOOM_URL, LOOM_MODEL; the server's context is 128 tokens, --max-n 16,
// --max-body-mb 1).
import assert from 'node:assert/strict';
import net from 'node:net';

const base = process.env.LOOM_URL, model = process.env.LOOM_MODEL;
const { port } = new URL(base);

// [name, path, body (object: JSON-encoded; string or Buffer: sent as is), status, param (optional)]
const cases = [];
const add = (name, path, body, status, param) => cases.push({ name, path, body, status, param });
const comp = (fields) => ({ model, prompt: 'Hello', max_tokens: 4, ...fields });
const chat = (fields) => ({ model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, ...fields });

// Broken bodies, on both routes.
for (const path of ['/v1/completions', '/v1/chat/completions']) {
  for (const [name, body] of [['empty', ''], ['open brace', '{'], ['cut', '{"model": "x", "prompt": '],
    ['null', 'null'], ['list', '[]'], ['string', '"hello"'], ['number', '42'], ['true', 'true'],
    ['trailing comma', '{"model": "x",}'], ['NaN', '{"temperature": NaN}'], ['single quotes', "{'model': 'x'}"],
    ['invalid UTF-8', Buffer.from([0x7b, 0x22, 0x6d, 0xff, 0xfe, 0x22, 0x3a, 0x31, 0x7d])],
    ['lone surrogate', '{"model": "\\ud800"}'], ['huge exponent', '{"max_tokens": 1e99999}'],
    ['deep nesting', '['.repeat(100000) + ']'.repeat(100000)], ['NUL bytes', '\0\0\0\0'],
    ['two objects', '{}{}']])
    add(`${path} ${name}`, path, body, 400);
}

// model
for (const [route, make] of [['completions', comp], ['chat', chat]]) {
  const path = route === 'chat' ? '/v1/chat/completions' : '/v1/completions';
  add(`${route} model missing`, path, (({ model: _, ...rest }) => rest)(make({})), 400, 'model');
  add(`${route} model number`, path, make({ model: 5 }), 400, 'model');
  add(`${route} model list`, path, make({ model: ['tiny'] }), 400, 'model');
  add(`${route} unknown model`, path, make({ model: 'gpt-9' }), 404, 'model');
  // Generation fields, shared by both routes.
  for (const [field, values] of [
    ['temperature', [-1, 2.5, 'hot', true, [], {}]],
    ['top_p', [0, 1.5, -0.1, 'x']],
    ['top_k', [-2, 1.5, 'x']],
    ['min_p', [2, -1, 'x']],
    ['n', [0, -1, 17, 1e9, '2', 1.5]],
    ['stop', [5, [1], [''], Array(20).fill('x'), '', {}]],
    ['seed', ['x', 1.5, []]],
    ['presence_penalty', [3, -3, 'x']],
    ['frequency_penalty', [5, -2.5]],
    ['repetition_penalty', [0, -1]],
    ['stream', ['yes', 1]],
    ['max_tokens', [0, -1, '5', 1.5, true, 1e20, 200, 2 ** 63]],
    ['min_tokens', [-1, 'x']],
    ['stop_token_ids', ['x', [-1], [1e9], [50257]]],
    ['ignore_eos', ['x', 0]],
    ['user', [5, []]],
  ]) {
    for (const v of values) {
      const param = field === 'max_tokens' && (v === 200 || v === 2 ** 63 || v === 1e20) ? undefined : field;
      add(`${route} ${field}=${JSON.stringify(v)}`, path, make({ [field]: v }), 400, param);
    }
  }
  add(`${route} stream_options without stream`, path, make({ stream_options: { include_usage: true } }), 400,
      'stream_options');
  add(`${route} stream_options not an object`, path, make({ stream: true, stream_options: 'x' }), 400,
      'stream_options');
  add(`${route} logit_bias`, path, make({ logit_bias: { 1: 5 } }), 400, 'logit_bias');
  // vLLM's extensions that would change the answer, not implemented: refused, not ignored.
  for (const [field, v] of [['guided_regex', '[0-9]+'], ['include_stop_str_in_output', true],
    ['continue_final_message', true], ['use_beam_search', true], ['structured_outputs', { regex: 'a' }],
    ['allowed_token_ids', [1, 2]], ['prompt_logprobs', 1]])
    add(`${route} ${field}=${JSON.stringify(v)}`, path, make({ [field]: v }), 400, field);
}

// prompt (completions)
for (const v of [undefined, 5, {}, [], [[]], [1.5], [-1], [50257], [1e30], '', ['a', 5], Array(70).fill('x'),
  [[['a']]], [true], 'x'.repeat(2000)])
  add(`prompt=${JSON.stringify(v)?.slice(0, 30)}`, '/v1/completions', comp({ prompt: v }), 400,
      v === undefined || typeof v !== 'string' || v === '' ? 'prompt' : 'max_tokens');
for (const [field, v] of [['echo', true], ['best_of', 3], ['suffix', 'x'], ['logprobs', 21], ['logprobs', -1],
  ['logprobs', 'x'], ['logprobs', true]])
  add(`completions ${field}=${JSON.stringify(v)}`, '/v1/completions', comp({ [field]: v }), 400, field);

// messages (chat)
for (const [name, v, param] of [
  ['missing', undefined, 'messages'], ['string', 'hi', 'messages'], ['empty', [], 'messages'],
  ['number item', [1], 'messages'], ['empty object', [{}], 'messages[0].role'],
  ['bad role', [{ role: 'robot', content: 'a' }], 'messages[0].role'],
  ['role number', [{ role: 1, content: 'a' }], 'messages[0].role'],
  ['content number', [{ role: 'user', content: 5 }], 'messages[0].content'],
  ['image part', [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }], 'messages[0].content'],
  ['text part without text', [{ role: 'user', content: [{ type: 'text' }] }], 'messages[0].content'],
  ['second bad', [{ role: 'user', content: 'a' }, { role: 'x', content: 'b' }], 'messages[1].role'],
])
  add(`messages ${name}`, '/v1/chat/completions', chat({ messages: v }), 400, param);
for (const [field, v] of [['tools', { type: 'function', function: { name: 'f' } }], ['tool_choice', 'always'],
  ['response_format', 'json'], ['top_logprobs', 3], ['logprobs', 'x'],
  ['max_completion_tokens', 0], ['max_completion_tokens', 500]])
  add(`chat ${field}=${JSON.stringify(v)}`, '/v1/chat/completions', chat({ [field]: v }), 400,
      field === 'max_completion_tokens' && v === 500 ? undefined : field);
add('chat long messages', '/v1/chat/completions', chat({ messages: [{ role: 'user', content: 'x '.repeat(300) }] }),
    400);
// No max_tokens: a prompt that fills the context is named, not the count the client never sent.
add('chat long messages, no max_tokens', '/v1/chat/completions',
    { model, messages: [{ role: 'user', content: 'x '.repeat(300) }] }, 400, 'messages');
add('long prompt, no max_tokens', '/v1/completions', { model, prompt: 'x '.repeat(300) }, 400, 'prompt');

// Routes, methods, sizes.
add('unknown route', '/v1/engines', comp({}), 404);
add('root', '/', comp({}), 404);
add('body over the limit', '/v1/completions', comp({ prompt: 'x'.repeat(2 << 20) }), 413);

async function send({ path, body }) {
  const data = typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body);
  return fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: data });
}

async function stillServes() {
  const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, prompt: 'Hello', max_tokens: 2 }) });
  assert.equal(r.status, 200, 'a valid request after the bad ones');
  await r.json();
}

function rawExchange(bytes) {
  return new Promise((resolve) => {
    const s = net.connect(Number(port), '127.0.0.1');
    let got = '';
    s.on('data', (d) => { got += d; });
    s.on('close', () => resolve(got));
    s.on('error', () => resolve(got));
    s.setTimeout(5000, () => s.destroy());
    s.write(bytes);
  });
}

let n = 0;
for (const c of cases) {
  const res = await send(c);
  const text = await res.text();
  let body;
  try { body = JSON.parse(text); } catch { assert.fail(`${c.name}: not JSON: ${text.slice(0, 200)}`); }
  assert.equal(res.status, c.status, `${c.name}: status ${res.status}, body ${text.slice(0, 300)}`);
  assert.equal(body.error?.code, c.status, `${c.name}: envelope ${text.slice(0, 300)}`);
  assert.ok(body.error.message.length > 0, c.name);
  assert.equal(typeof body.error.type, 'string', c.name);
  if (c.param !== undefined) assert.equal(body.error.param, c.param, `${c.name}: ${text.slice(0, 300)}`);
  if (++n % 20 === 0) await stillServes();
}

// HTTP itself: malformed request lines and headers, each answered with the envelope.
const rawCases = [
  ['garbage', 'GARBAGE\r\n\r\n', 400], ['bad version', 'GET /health HTTP/9.9\r\n\r\n', 400],
  ['bad content-length', 'POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n', 400],
  ['two content-lengths', 'POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}', 400],
  ['huge header', `GET /health HTTP/1.1\r\nX: ${'a'.repeat(40000)}\r\n\r\n`, 431],
  ['many headers', `GET /health HTTP/1.1\r\n${'X-A: b\r\n'.repeat(5000)}\r\n`, 431],
  ['declared huge body', 'POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n', 413],
  ['bad chunked', 'POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n', 400],
];
for (const [name, bytes, status] of rawCases) {
  const got = await rawExchange(bytes);
  assert.match(got, new RegExp(`^HTTP/1\\.1 ${status} `), `${name}: ${got.slice(0, 200)}`);
  const body = JSON.parse(got.slice(got.indexOf('\r\n\r\n') + 4));
  assert.equal(body.error.code, status, name);
  ++n;
}
await stillServes();
assert.equal((await fetch(`${base}/health`)).status, 200);
console.log(`bad_input: ${n} bad requests, each the right 4xx with the envelope; the server still serves`);
