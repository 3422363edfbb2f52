// Run by tests/serve/drain_deadline.sh: four long requests (OpenAI and
// ollama, streamed and not) are cut by a 1 s drain; each must end saying it
// was aborted, not that it finished.
import assert from 'node:assert/strict';

const base = process.env.LOOM_URL, pid = Number(process.env.LOOM_SERVER_PID);
const post = (path, body) => fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' },
                                                        body: JSON.stringify(body) });
const long = { model: 'm', prompt: 'Hello', max_tokens: 4000, ignore_eos: true };
const ollamaLong = { model: 'm', prompt: 'Hello', raw: true, options: { num_predict: 4000 } };
const started = [
  post('/v1/completions', { ...long, stream: true }),
  post('/v1/completions', long),
  post('/api/generate', { ...ollamaLong, stream: true }),
  post('/api/generate', { ...ollamaLong, stream: false }),
];
await new Promise((r) => setTimeout(r, 500));
process.kill(pid, 'SIGTERM');
const [sse, whole, ndjson, one] = await Promise.all(started);
const events = (await sse.text()).split('\n\n').filter((e) => e.startsWith('data: {')).map((e) => JSON.parse(e.slice(6)));
assert.equal(events.at(-1).choices[0].finish_reason, 'abort', JSON.stringify(events.at(-1)));
assert.equal((await whole.json()).choices[0].finish_reason, 'abort');
const lines = (await ndjson.text()).trim().split('\n').map((l) => JSON.parse(l));
assert.equal(lines.at(-1).done_reason, 'abort', JSON.stringify(lines.at(-1)));
assert.equal((await one.json()).done_reason, 'abort');
console.log('drain deadline: every request cut by it reports abort');
