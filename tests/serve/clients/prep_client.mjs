// A request's preparation (its chat template rendered, its prompt
// tokenized) runs on the server's preparation pool, not on the HTTP thread
// that writes other streams: while a chat whose template renders for about a
// third of a second (then hits the loop budget) is prepared, a stream already running keeps getting its
// tokens (slower, as the rendering takes a core: 2-8 times here on 2 cores;
// before the preparation pool, none at all). The server runs with one HTTP thread (with_server.sh's default),
// so before the preparation pool that stream stopped for as long as the
// tokenization took.
// Run by tests/serve/with_server.sh (LOOM_URL, LOOM_MODEL set).
// Usage: node prep_client.mjs DATA_DIR
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';

const [dataDir] = process.argv.slice(2);
const require = createRequire(`${dataDir}/`);
const { OpenAI } = require('openai');
const base = process.env.LOOM_URL;
const model = process.env.LOOM_MODEL;
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0 });

// The model's context is 4096 tokens (LOOM_SERVE_MAX_SEQ): the stream outlasts the long prompt.
const stream = await openai.completions.create({ model, prompt: 'Once', max_tokens: 4000, temperature: 0,
  ignore_eos: true, stream: true });
const times = [];
let bigStart = 0, bigEnd = 0, bigStatus = 0;
// 2500 messages of words never seen twice, through a template whose
// rendering grows as the square of the messages (tests/serve/slow_template.jinja):
// it stops at the evaluator's loop budget (1M iterations, serve/jinja/jinja_eval.h),
// answered 400, after ~0.3 s on a fast core (Sapphire Rapids), more on slower ones.
let seed = 7;
const letter = () => String.fromCharCode(97 + ((seed = (seed * 1103515245 + 12345) % 2147483648) % 26));
const words = (n) => Array.from({ length: n }, () => letter() + letter() + letter() + letter() + letter()).join(' ');
const big = Array.from({ length: 2500 }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: words(2) }));
for await (const chunk of stream) {
  times.push(performance.now());
  if (times.length === 50) {  // the stream's pace is known: now the long preparation
    bigStart = performance.now();
    fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model, messages: big, max_tokens: 1 }) }).then(async (r) => {
      bigStatus = r.status;
      await r.text();
      bigEnd = performance.now();
    });
  }
  if (bigEnd && performance.now() > bigEnd + 200) break;
}
const took = bigEnd - bigStart;
const pace = 45 / (times[49] - times[4]);  // tokens per ms before
const during = times.filter((t) => t > bigStart && t <= bigEnd).length / took;
console.log(`the long request answered ${bigStatus} in ${took.toFixed(0)} ms; the running stream got ` +
  `${(during * 1000).toFixed(0)} tokens/s meanwhile, ${(pace * 1000).toFixed(0)} before`);
assert.equal(bigStatus, 400, 'the prompt is longer than the context');
assert.ok(times.length < 4000, 'the stream ended before the long request was answered');
assert.ok(took > 150, `the long request took ${took} ms: too quick to show anything`);
// Blocked, it would get none (that was 0 tokens/s before the preparation pool);
// the rendering thread takes one of the machine's cores from the engine
// meanwhile, and under a loaded CI (8 MPI ranks beside it on 2 cores) the
// stream has run at 1/21 of its pace: 1/50 still tells running from blocked.
assert.ok(during > pace / 50 && during * took >= 5, 'the running stream stopped while the long request was prepared');
console.log('prep_client: passed');
