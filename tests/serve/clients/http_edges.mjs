// loom serve at its edges, over raw sockets and fetch: API keys, body and
// header limits, malformed HTTP, unknown routes, /health and /metrics, a
// client that goes away mid-generation (its request is aborted and its KV
// blocks freed at once), a client that sends too slowly, a full queue. Run
// by tests/serve/with_server.sh with --api-key secret --max-body-mb 0.05
// --timeout 2 --max-queue 4 --max-num-seqs 2 --allow-origin
// http://app.example (LOOM_URL, LOOM_MODEL set).
// Usage: node http_edges.mjs [CASE...]   (no CASE: every case)
import assert from 'node:assert/strict';
import net from 'node:net';

const base = process.env.LOOM_URL, model = process.env.LOOM_MODEL;
const { port } = new URL(base);
const auth = { authorization: 'Bearer secret', 'content-type': 'application/json' };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Sends raw bytes, returns everything the server sent before closing (or
// what came within waitMs), one character a byte (latin1: chunk sizes and
// Content-Length count bytes, and a generated text may hold any UTF-8).
function raw(bytes, waitMs = 3000) {
  return new Promise((resolve) => {
    const s = net.connect(Number(port), '127.0.0.1');
    let got = '';
    const timer = setTimeout(() => { s.destroy(); resolve(got); }, waitMs);
    s.on('data', (d) => { got += d.toString('latin1'); });
    s.on('close', () => { clearTimeout(timer); resolve(got); });
    s.on('error', () => {});
    s.write(bytes);
  });
}

// Splits what a server sent on one connection into its responses (bodies
// by Content-Length, chunked, or up to the close).
function responses(text) {
  const out = [];
  while (text.length) {
    const end = text.indexOf('\r\n\r\n');
    assert.ok(end > 0, `a response head: ${JSON.stringify(text.slice(0, 200))}`);
    const [statusLine, ...lines] = text.slice(0, end).split('\r\n');
    const headers = Object.fromEntries(lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(),
                                                         l.slice(l.indexOf(':') + 1).trim()]));
    let rest = text.slice(end + 4), body = '';
    if (headers['content-length'] !== undefined) {
      body = rest.slice(0, Number(headers['content-length']));
      rest = rest.slice(body.length);
    } else if (headers['transfer-encoding'] === 'chunked') {
      for (;;) {
        const eol = rest.indexOf('\r\n');
        const size = eol < 0 ? NaN : parseInt(rest.slice(0, eol), 16);
        assert.ok(Number.isInteger(size) && rest.length >= eol + 2 + size + 2,
                  `a whole chunk: ${JSON.stringify(rest.slice(0, 80))} (the response was cut short)`);
        body += rest.slice(eol + 2, eol + 2 + size);
        rest = rest.slice(eol + 2 + size + 2);
        if (size === 0) break;
      }
    } else {
      [body, rest] = [rest, ''];
    }
    out.push({ statusLine, headers, body });
    text = rest;
  }
  return out;
}

const completion = (extra) => JSON.stringify({ model, prompt: 'Hello', max_tokens: 6, ...extra });
const post = (version, body, more = '') =>
  `POST /v1/completions HTTP/${version}\r\nHost: x\r\nAuthorization: Bearer secret\r\n` +
  `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${more}\r\n${body}`;

async function expectEnvelope(res, status, pattern) {
  assert.equal(res.status, status);
  const body = await res.json();
  assert.equal(body.error.code, status);
  assert.equal(typeof body.error.type, 'string');
  if (pattern) assert.match(body.error.message, pattern);
}

function envelopeOf(response, status) {
  assert.match(response, new RegExp(`^HTTP/1\\.1 ${status} `));
  const body = JSON.parse(response.slice(response.indexOf('\r\n\r\n') + 4));
  assert.equal(body.error.code, status);
  return body.error;
}

async function metrics() {
  const text = await (await fetch(`${base}/metrics`)).text();
  // One series, or the sum over a family's model="..." series when the name has no labels.
  const value = (name) => {
    const re = name.includes('{') ? new RegExp(`^${name.replace(/[{}"]/g, '\\$&')} (\\S+)$`, 'gm')
                                  : new RegExp(`^${name}(?:\\{model="[^"]*"\\})? (\\S+)$`, 'gm');
    const all = [...text.matchAll(re)];
    return all.length ? all.reduce((a, m) => a + Number(m[1]), 0) : undefined;
  };
  return { text, value };
}

const generate = (extra) => fetch(`${base}/v1/completions`, { method: 'POST', headers: auth,
  body: JSON.stringify({ model, prompt: 'Hello', max_tokens: 8, ...extra }) });

const cases = {
  // --max-queue 4 --max-num-seqs 2: of 24 requests at once, those past the queue get 429 (the envelope), the rest
  // complete; none gets a 5xx.
  async fullQueueIs429() {
    const all = await Promise.all(Array.from({ length: 24 }, () => generate({ max_tokens: 40, ignore_eos: true })));
    const statuses = all.map((r) => r.status);
    assert.ok(statuses.every((s) => s === 200 || s === 429), statuses.join(','));
    assert.ok(statuses.includes(429) && statuses.includes(200), statuses.join(','));
    for (const r of all.filter((x) => x.status === 429)) {
      const body = await r.json();
      assert.equal(body.error.code, 429);
      assert.match(body.error.message, /queue is full/);
    }
    await Promise.all(all.filter((x) => x.status === 200).map((r) => r.json()));
  },

  async healthAndMetricsNeedNoKey() {
    const health = await fetch(`${base}/health`);
    assert.equal(health.status, 200);
    // --timeout 2: idle connections close after 2 s, and the server says so.
    assert.equal(health.headers.get('keep-alive'), 'timeout=2');
    const m = await metrics();
    assert.equal(m.value('loom_model_loaded{model="tiny"}'), 1);
    assert.equal(m.value('loom_models_loaded'), 1);
    assert.match(m.text, /# TYPE loom_time_to_first_token_seconds histogram/);
  },

  async apiKey() {
    await expectEnvelope(await fetch(`${base}/v1/models`), 401, /API key/);
    await expectEnvelope(await fetch(`${base}/v1/models`, { headers: { authorization: 'Bearer wrong' } }), 401);
    assert.equal((await fetch(`${base}/v1/models`, { headers: auth })).status, 200);
  },

  // Errors under /api/ are ollama's {"error": "..."}, also those the server gives before a route runs.
  async ollamaPathsGetOllamasEnvelope() {
    const ollamaError = (text, status) => {
      assert.match(text, new RegExp(`^HTTP/1\\.1 ${status} `));
      const body = JSON.parse(text.slice(text.indexOf('\r\n\r\n') + 4));
      assert.equal(typeof body.error, 'string', JSON.stringify(body));
      return body.error;
    };
    const tags = await fetch(`${base}/api/tags`);
    assert.equal(tags.status, 401);
    assert.match((await tags.json()).error, /API key/);
    const big = JSON.stringify({ model, prompt: 'x'.repeat(100_000) });
    assert.match(ollamaError(await raw(`POST /api/generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\n` +
                                       `Content-Length: ${big.length}\r\n\r\n${big}`), 413), /limit of 52428 bytes/);
    assert.match(ollamaError(await raw(`GET /api/tags HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`),
                             431), /headers/);
    ollamaError(await raw('POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Length: zzz\r\n\r\n'), 400);
    envelopeOf(await raw('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: zzz\r\n\r\n'), 400);
  },

  // The scheme of Authorization in any case; /api/version without a key; X-Request-Id echoed; one model by id.
  async clientConveniences() {
    for (const scheme of ['bearer', 'BEARER', 'Bearer'])
      assert.equal((await fetch(`${base}/v1/models`, { headers: { authorization: `${scheme} secret` } })).status, 200);
    await expectEnvelope(await fetch(`${base}/v1/models`, { headers: { authorization: 'Bearer secret2' } }), 401);
    await expectEnvelope(await fetch(`${base}/v1/models`, { headers: { authorization: 'Basic secret' } }), 401);
    const version = await fetch(`${base}/api/version`);
    assert.equal(version.status, 200);
    assert.equal(typeof (await version.json()).version, 'string');
    const tagged = await fetch(`${base}/v1/models`, { headers: { ...auth, 'x-request-id': 'req-42' } });
    assert.equal(tagged.headers.get('x-request-id'), 'req-42');
    const one = await fetch(`${base}/v1/models/${model}`, { headers: auth });
    assert.equal(one.status, 200);
    const body = await one.json();
    assert.equal(body.id, model);
    assert.equal(body.object, 'model');
    await expectEnvelope(await fetch(`${base}/v1/models/nope`, { headers: auth }), 404, /does not exist/);
  },

  // --allow-origin http://app.example: that origin gets CORS headers (and a preflight its answer), others none.
  async cors() {
    const allowed = await fetch(`${base}/v1/models`, { headers: { ...auth, origin: 'http://app.example' } });
    assert.equal(allowed.headers.get('access-control-allow-origin'), 'http://app.example');
    const other = await fetch(`${base}/v1/models`, { headers: { ...auth, origin: 'http://evil.example' } });
    assert.equal(other.headers.get('access-control-allow-origin'), null);
    const pre = await fetch(`${base}/v1/chat/completions`, { method: 'OPTIONS', headers: {
      origin: 'http://app.example', 'access-control-request-method': 'POST',
      'access-control-request-headers': 'authorization, content-type' } });
    assert.equal(pre.status, 204);
    assert.equal(pre.headers.get('access-control-allow-origin'), 'http://app.example');
    assert.match(pre.headers.get('access-control-allow-methods'), /POST/);
    assert.match(pre.headers.get('access-control-allow-headers'), /authorization/);
  },

  async limitsAndMalformedHttp() {
    await expectEnvelope(await generate({ prompt: 'x'.repeat(100_000) }), 413, /limit of 52428 bytes/);
    const big = envelopeOf(await raw(`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`), 431);
    assert.match(big.message, /headers/);
    envelopeOf(await raw('GARBAGE\r\n\r\n'), 400);
    envelopeOf(await raw('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: zzz\r\n\r\n'), 400);
    await expectEnvelope(await fetch(`${base}/nope`), 404);
    await expectEnvelope(await fetch(`${base}/v1/completions`, { headers: auth }), 405);
    await expectEnvelope(await fetch(`${base}/v1/completions`, { method: 'POST', headers: auth, body: '{"model":' }),
                         400, /JSON/);
    assert.equal((await generate({})).status, 200, 'the server still serves');
  },

  // Three requests in one write (HTTP/1.1 pipelining): a streamed completion, /health, /v1/models; three
  // responses in order, each whole, then the close the last one asked for.
  async pipelinedRequestsAnswerInOrder() {
    const got = await raw(post('1.1', completion({ stream: true })) + 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n' +
                          'GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\n' +
                          'Connection: close\r\n\r\n', 30000);
    const [sse, health, models, ...more] = responses(got);
    assert.equal(more.length, 0);
    assert.equal(sse.statusLine, 'HTTP/1.1 200 OK');
    assert.equal(sse.headers['content-type'].split(';')[0], 'text/event-stream');
    assert.ok(sse.body.endsWith('data: [DONE]\n\n'), sse.body.slice(-100));
    assert.equal(health.statusLine, 'HTTP/1.1 200 OK');
    assert.equal(models.statusLine, 'HTTP/1.1 200 OK');
    assert.equal(JSON.parse(models.body).data[0].id, model);
  },

  // HTTP/1.0: no chunked encoding (a 1.0 client cannot read it): a whole body with its length, or a stream that
  // ends when the server closes; keep-alive only when asked for.
  async http10GetsWholeBodiesAndTheClose() {
    const [health] = responses(await raw('GET /health HTTP/1.0\r\n\r\n'));
    assert.match(health.statusLine, /^HTTP\/1\.0 200 /);
    assert.equal(health.headers['transfer-encoding'], undefined);
    assert.equal(health.body, '{}');
    const one = responses(await raw(post('1.0', completion({})), 30000));
    assert.equal(one.length, 1);
    assert.equal(JSON.parse(one[0].body).choices.length, 1);
    const start = Date.now();
    const [sse] = responses(await raw(post('1.0', completion({ stream: true })), 30000));
    assert.ok(Date.now() - start < 29000, 'the server closed the stream');
    assert.equal(sse.headers['transfer-encoding'], undefined);
    assert.equal(sse.headers['content-type'].split(';')[0], 'text/event-stream', 'a stream sent whole is one still');
    assert.ok(sse.body.endsWith('data: [DONE]\n\n'), sse.body.slice(-100));
    const kept = responses(await raw('GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n' +
                                     'GET /health HTTP/1.0\r\n\r\n', 30000));
    assert.deepEqual(kept.map((r) => r.body), ['{}', '{}']);
  },

  async slowSenderIsCutOff() {
    // Half a request line, then nothing: dropped after --timeout (2 s).
    const start = Date.now();
    const got = await raw('POST /v1/completions HTTP/1.1\r\nHost: x\r\n', 6000);
    assert.equal(got, '');
    assert.ok(Date.now() - start < 5000, 'closed by the server, not by the test');
  },

  async clientThatGoesAwayIsAborted() {
    const before = (await metrics()).value('loom_request_success_total{model="tiny",finished_reason="abort"}');
    // A client starved of CPU (a loaded CI machine) can see the whole answer
    // before it goes away: such a try tests nothing and is made again, up to
    // 5 times; each mode must abort a running request once.
    const goAway = async (stream) => {
      const ctl = new AbortController();
      // 3 prompts x n 2 x 120 tokens, 2 sequences at a time (--max-num-seqs 2): far longer than it usually takes
      // to see it running and go away (the tiny model makes a token in well under a millisecond).
      const prompt = Array.from({ length: 3 }, (_, i) => `Hello number ${i}`);
      const res = fetch(`${base}/v1/completions`, { method: 'POST', headers: auth, signal: ctl.signal,
        body: JSON.stringify({ model, prompt, max_tokens: 120, ignore_eos: true, stream, n: 2 }) });
      if (stream) {
        const reader = (await res).body.getReader();
        await reader.read();  // the first event: the request runs
        ctl.abort();
        for (;;) {  // what arrived before the abort may still be read; then the read fails, unless the answer ended
          try {
            if ((await reader.read()).done) return false;
          } catch {
            return true;
          }
        }
      }
      while ((await metrics()).value('loom_num_requests_running') === 0) await sleep(2);  // running, no byte sent
      ctl.abort();
      try {
        await (await res).text();
        return false;
      } catch {
        return true;
      }
    };
    for (const stream of [true, false]) {
      let aborted = false;
      for (let i = 0; i < 5 && !aborted; ++i) aborted = await goAway(stream);
      assert.ok(aborted, `a ${stream ? 'streamed' : 'whole'} answer was never cut short by its client going away`);
    }
    // Freed at once: in flight 0 and the KV cache empty well before the 120 tokens could finish.
    let m;
    for (let i = 0; i < 50; ++i) {
      m = await metrics();
      if (m.value('loom_num_requests_in_flight') === 0) break;
      await sleep(100);
    }
    assert.equal(m.value('loom_num_requests_in_flight'), 0);
    assert.equal(m.value('loom_kv_cache_used_blocks'), 0);
    assert.ok(m.value('loom_request_success_total{model="tiny",finished_reason="abort"}') >= before + 2);
    const ok = await generate({});
    assert.equal(ok.status, 200);
  },
};

const names = process.argv.slice(2).length ? process.argv.slice(2) : Object.keys(cases);
for (const name of names) {
  assert.ok(cases[name], `no case ${name}`);
  await cases[name]();
  console.log(`ok ${name}`);
}
console.log(`http_edges: ${names.length} cases passed`);
