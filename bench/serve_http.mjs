// The same workload as `loom bench serve --mode throughput` (N requests of
// random token ids, input-len prompt tokens and exactly output-len new ones,
// all sent at once) through a running `loom serve`'s /v1/completions, over
// loopback HTTP: what the server adds to the engine. Prints the figures and
// the command that reproduces them; compare with bench serve's output
// tokens/s for the same N and lengths on the same model (BENCHMARKS.md
// "Server overhead").
// Usage: node bench/serve_http.mjs URL MODEL [N=32] [INPUT_LEN=64] [OUTPUT_LEN=64] [VOCAB=50257] [stream|json]
const [url, model, n = '32', inputLen = '64', outputLen = '64', vocab = '50257', mode = 'stream'] =
  process.argv.slice(2);
if (!url || !model) {
  console.error('usage: node bench/serve_http.mjs URL MODEL [N] [INPUT_LEN] [OUTPUT_LEN] [VOCAB] [stream|json]');
  process.exit(2);
}
const N = Number(n), I = Number(inputLen), O = Number(outputLen), V = Number(vocab);
let seed = 1;
const next = () => (seed = (seed * 1103515245 + 12345) % 2147483648);
const prompts = Array.from({ length: N }, () => Array.from({ length: I }, () => next() % V));

async function one(prompt) {
  const body = { model, prompt, max_tokens: O, temperature: 0, ignore_eos: true, stream: mode === 'stream' };
  const r = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body) });
  if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  const text = await r.text();
  if (mode === 'stream') {
    const events = text.split('\n\n').filter((e) => e.startsWith('data: ') && e !== 'data: [DONE]');
    return events.filter((e) => JSON.parse(e.slice(6)).choices?.[0]?.text !== undefined).length;
  }
  return JSON.parse(text).usage.completion_tokens;
}

await one(prompts[0]);  // warm: the model loaded, its first step done
const start = performance.now();
const counts = await Promise.all(prompts.map(one));
const seconds = (performance.now() - start) / 1000;
const tokens = mode === 'stream' ? N * O : counts.reduce((a, b) => a + b, 0);
console.log(JSON.stringify({ requests: N, input_len: I, output_len: O, mode, seconds: +seconds.toFixed(3),
  request_throughput: +(N / seconds).toFixed(3), output_throughput: +(tokens / seconds).toFixed(1),
  command: `node bench/serve_http.mjs ${process.argv.slice(2).join(' ')}` }));
