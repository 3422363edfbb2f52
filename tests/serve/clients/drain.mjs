// Run by tests/serve/drain_twice.sh: a long stream runs; SIGTERM; /health and
// a new request get 503 while the stream goes on; a second SIGTERM ends the
// server at once.
import assert from 'node:assert/strict';

const base = process.env.LOOM_URL, pid = Number(process.env.LOOM_SERVER_PID);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const res = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
  body: JSON.stringify({ model: 'm', prompt: 'Hello', max_tokens: 2000, ignore_eos: true, stream: true }) });
const reader = res.body.getReader();
await reader.read();
process.kill(pid, 'SIGTERM');
await sleep(300);
assert.equal((await fetch(`${base}/health`)).status, 503);
const refused = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
  body: JSON.stringify({ model: 'm', prompt: 'Hi', max_tokens: 2 }) });
assert.equal(refused.status, 503);
assert.equal((await refused.json()).error.code, 503);
const more = await reader.read();
assert.ok(!more.done && more.value.length > 0, 'the stream in flight goes on while draining');
console.log('drain: 503 for new work, the stream goes on');
process.kill(pid, 'SIGTERM');
const start = Date.now();
await assert.rejects((async () => { for (;;) { const r = await reader.read(); if (r.done) throw new Error('ended'); } })());
console.log(`second SIGTERM: the server went in ${Date.now() - start < 2000 ? 'under 2 s' : 'too long'}`);
