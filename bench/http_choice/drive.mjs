// Drives one of the http_choice servers with C concurrent streaming clients
// (each GET /stream?n=N&ms=MS) and prints one JSON line: how many streams
// completed with all N events, the time to the first event (p50 / p99 / max)
// and to the last (p50 / max) against the ideal (N-1)*MS (of the complete
// ones; a stream silent for 20 s is given up as lost), and the server's
// threads and resident memory at the peak (read from /proc/PID/status).
// Usage: node drive.mjs PORT SERVER_PID C N MS
import http from 'node:http';
import fs from 'node:fs';

const [port, pid, clients, n, ms] = process.argv.slice(2).map(Number);
const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });
let peakThreads = 0, peakRssKiB = 0;
const sample = setInterval(() => {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  peakThreads = Math.max(peakThreads, Number(/Threads:\s+(\d+)/.exec(status)[1]));
  peakRssKiB = Math.max(peakRssKiB, Number(/VmRSS:\s+(\d+)/.exec(status)[1]));
}, 50);

function one() {
  return new Promise((resolve) => {
    const start = performance.now();
    let first = null, events = 0, tail = '';
    const req = http.get({ port, host: '127.0.0.1', path: `/stream?n=${n}&ms=${ms}`, agent }, (res) => {
      res.setEncoding('utf8');
      res.on('data', (chunk) => {
        if (first === null) first = performance.now() - start;
        const parts = (tail + chunk).split('\n\n');
        tail = parts.pop();
        events += parts.filter((p) => p.startsWith('data: ')).length;
      });
      res.on('end', () => resolve({ ok: events === n, first, total: performance.now() - start }));
      res.on('error', () => resolve({ ok: false, first, total: performance.now() - start }));
    });
    req.on('error', () => resolve({ ok: false, first, total: performance.now() - start }));
    // A stream silent for 20 s counts as lost (a connection the server never took stays silent forever).
    req.setTimeout(20000, () => req.destroy(new Error('silent for 20 s')));
  });
}

const pct = (xs, p) => xs.length ? xs[Math.min(xs.length - 1, Math.floor(p * xs.length))] : null;
const results = await Promise.all(Array.from({ length: clients }, one));
clearInterval(sample);
const firsts = results.map((r) => r.first ?? Infinity).sort((a, b) => a - b);
const totals = results.map((r) => r.total).sort((a, b) => a - b);
const round = (x) => (Number.isFinite(x) ? Math.round(x) : null);
console.log(JSON.stringify({
  clients, events_per_stream: n, ms_between: ms, ideal_ms: (n - 1) * ms,
  complete: results.filter((r) => r.ok).length,
  first_ms: { p50: round(pct(firsts, 0.5)), p99: round(pct(firsts, 0.99)), max: round(firsts.at(-1)) },
  total_ms: { p50: round(pct(totals, 0.5)), max: round(totals.at(-1)) },
  server_threads: peakThreads, server_rss_mib: Math.round(peakRssKiB / 1024),
}));
