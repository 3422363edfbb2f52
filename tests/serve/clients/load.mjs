// Load on a running loom serve (loopback, bounded in time), as the issue
// asks: C concurrent streaming clients, each sending one streamed completion
// after another for S seconds: no 5xx, every stream complete and well-formed
// (JSON events, one finish reason, usage equal to the tokens streamed, then
// [DONE]), and /metrics moved by exactly what the clients counted. Then C
// clients that disconnect 0.5 s into their streams; after them a normal
// request completes within 5 s and /metrics shows nothing in flight and the
// KV cache empty.
// Usage: node load.mjs [CLIENTS=200] [SECONDS=30]
import assert from 'node:assert/strict';
import http from 'node:http';

const base = process.env.LOOM_URL, model = process.env.LOOM_MODEL;
const clients = Number(process.argv[2] ?? 200), seconds = Number(process.argv[3] ?? 30);
const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });

async function metrics() {
  const text = await (await fetch(`${base}/metrics`)).text();
  const sum = (re) => [...text.matchAll(re)].reduce((a, m) => a + Number(m[1]), 0);
  return {
    text,
    tokens: sum(/^loom_generation_tokens_total\{[^}]*\} (\S+)$/gm),
    sequences: sum(/^loom_request_success_total\{[^}]*\} (\S+)$/gm),
    aborted: sum(/^loom_request_success_total\{[^}]*finished_reason="abort"\} (\S+)$/gm),
    ok: sum(/^loom_http_responses_total\{code="200"\} (\S+)$/gm),
    server_errors: sum(/^loom_http_responses_total\{code="5\d\d"\} (\S+)$/gm),
    in_flight: sum(/^loom_num_requests_in_flight\{[^}]*\} (\S+)$/gm),
    kv_used: sum(/^loom_kv_cache_used_blocks\{[^}]*\} (\S+)$/gm),
  };
}

// One streamed completion over node:http; resolves with what it saw.
function stream(i, abortAfterMs) {
  const body = JSON.stringify({ model, prompt: `Client ${i} asks about`, max_tokens: 8 + (i % 24), stream: true,
                                stream_options: { include_usage: true }, temperature: 0.8, seed: i,
                                ignore_eos: abortAfterMs !== undefined });
  return new Promise((resolve, reject) => {
    const url = new URL(`${base}/v1/completions`);
    const req = http.request({ host: url.hostname, port: url.port, path: url.pathname, method: 'POST', agent,
                               headers: { 'content-type': 'application/json' } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { text += d; });
      res.on('end', () => resolve({ status: res.statusCode, text }));
      res.on('error', (e) => (abortAfterMs !== undefined ? resolve({ aborted: true }) : reject(e)));
    });
    req.on('error', (e) => (abortAfterMs !== undefined ? resolve({ aborted: true }) : reject(e)));
    if (abortAfterMs !== undefined) setTimeout(() => req.destroy(), abortAfterMs);
    req.end(body);
  });
}

// Checks one stream's events; returns its completion tokens.
function check(text, maxTokens, label) {
  const events = text.split('\n\n').filter((e) => e.length);
  assert.equal(events.at(-1), 'data: [DONE]', `${label}: ends with [DONE]`);
  let finish = 0, usage = null, streamed = '';
  for (const e of events.slice(0, -1)) {
    assert.ok(e.startsWith('data: '), `${label}: ${e.slice(0, 80)}`);
    const chunk = JSON.parse(e.slice(6));
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      assert.equal(c.index, 0, label);
      assert.equal(typeof c.text, 'string', label);
      streamed += c.text;
      if (c.finish_reason) ++finish;
    }
  }
  assert.equal(finish, 1, `${label}: one finish reason`);
  assert.ok(usage && usage.completion_tokens >= 1 && usage.completion_tokens <= maxTokens, `${label}: usage`);
  assert.equal(usage.prompt_tokens + usage.completion_tokens, usage.total_tokens, label);
  return usage.completion_tokens;
}

const before = await metrics();
const deadline = Date.now() + seconds * 1000;
let requests = 0, tokens = 0;
await Promise.all(Array.from({ length: clients }, async (_, c) => {
  for (let k = 0; Date.now() < deadline; ++k) {
    const r = await stream(c * 1000 + k);
    assert.equal(r.status, 200, `client ${c}: status ${r.status}: ${r.text.slice(0, 200)}`);
    tokens += check(r.text, 8 + ((c * 1000 + k) % 24), `client ${c} request ${k}`);
    ++requests;
  }
}));
// A response is counted when its last byte is written, which the client may
// see first: give the server a moment to count the last ones, then compare.
// Every GET /metrics before the last one read is a 200 of its own.
let after = await metrics(), reads = 1;
for (; reads <= 20 && after.ok - before.ok < requests + reads; ++reads) {
  await new Promise((res) => setTimeout(res, 100));
  after = await metrics();
}
assert.equal(after.server_errors, 0, 'no 5xx');
assert.equal(after.ok - before.ok, requests + reads, '/metrics counted every 200 the clients got');
assert.equal(after.tokens - before.tokens, tokens, '/metrics counted every token the clients got');
assert.equal(after.sequences - before.sequences, requests, 'one finished sequence per request');
console.log(`load: ${clients} streaming clients for ${seconds} s: ${requests} streams, ${tokens} tokens ` +
            `(${(tokens / seconds).toFixed(0)} tokens/s), all complete; /metrics agrees`);

// Clients that go away half a second in.
const gone = await Promise.all(Array.from({ length: clients }, (_, c) => stream(50000 + c, 500)));
assert.ok(gone.every((r) => r.aborted || r.status === 200));
const start = Date.now();
const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
  body: JSON.stringify({ model, prompt: 'After the storm', max_tokens: 8 }) });
assert.equal(r.status, 200);
await r.json();
const took = Date.now() - start;
assert.ok(took < 5000, `a normal request took ${took} ms after the disconnects`);
let m;
for (let i = 0; i < 50; ++i) {
  m = await metrics();
  if (m.in_flight === 0 && m.kv_used === 0) break;
  await new Promise((res) => setTimeout(res, 100));
}
assert.equal(m.in_flight, 0, 'nothing in flight');
assert.equal(m.kv_used, 0, 'the KV cache is empty');
assert.equal(m.server_errors, 0, 'no 5xx');
console.log(`load: ${clients} clients disconnected after 0.5 s (${m.aborted - after.aborted} aborted); ` +
            `a normal request then took ${took} ms; KV cache empty`);
agent.destroy();
