// bench measures acquire+release round trips per second from this client
// with 1 and 64 concurrent callers, and the Go SDK's (gosdk/) in the same
// run against the same governord, in turns. Run it from clients/node:
//
//   npm run bench -- [seconds per run, default 5] [rounds, default 3]
//
// It builds governord and gosdk with `go build`, and prints a Markdown table.

import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { connect } from '../src/index.js';
import { PAYMENTS_KEY, baseConfig, start } from '../test/governord.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..', '..', '..');
const seconds = Number(process.argv[2] ?? 5);
const rounds = Number(process.argv[3] ?? 3);

async function nodeRun(addr, callers) {
  const session = await connect({ apiKey: PAYMENTS_KEY, addr });
  const task = await session.newTask({ name: `bench-node-${callers}-${Date.now()}` });
  let measuring = false;
  let stop = false;
  let ops = 0;
  const caller = async () => {
    while (!stop) {
      const lease = await task.acquire('bench');
      await lease.release();
      if (measuring) ops++;
    }
  };
  const running = Array.from({ length: callers }, caller);
  await new Promise((r) => setTimeout(r, 1000)); // warm-up
  measuring = true;
  const began = performance.now();
  await new Promise((r) => setTimeout(r, seconds * 1000));
  measuring = false;
  const elapsed = (performance.now() - began) / 1000;
  stop = true;
  await Promise.all(running);
  await task.close();
  await session.close();
  return ops / elapsed;
}

function goRun(bin, addr, callers) {
  const out = execFileSync(bin, ['-addr', addr, '-key', PAYMENTS_KEY, '-callers', String(callers), '-duration', `${seconds}s`], { encoding: 'utf8' });
  return JSON.parse(out).per_second;
}

const dir = mkdtempSync(path.join(tmpdir(), 'governor-bench-'));
const gosdk = path.join(dir, 'gosdk');
execFileSync('go', ['build', '-o', gosdk, './clients/node/bench/gosdk'], { cwd: repo, stdio: 'inherit' });
const governord = await start(baseConfig({ ttl: '10s' }));
const results = { node: { 1: [], 64: [] }, go: { 1: [], 64: [] } };
try {
  for (let round = 0; round < rounds; round++) {
    for (const callers of [1, 64]) {
      results.node[callers].push(await nodeRun(governord.addr, callers));
      results.go[callers].push(goRun(gosdk, governord.addr, callers));
    }
  }
} finally {
  await governord.stop();
  rmSync(dir, { recursive: true, force: true });
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
console.log(`node ${process.version}, ${rounds} rounds of ${seconds} s each, median (all runs)`);
console.log('| callers | Node.js (ops/s) | Go SDK (ops/s) | Node / Go |');
console.log('| ---: | ---: | ---: | ---: |');
for (const callers of [1, 64]) {
  const n = median(results.node[callers]);
  const g = median(results.go[callers]);
  const all = (xs) => xs.map((x) => x.toFixed(0)).join(', ');
  console.log(`| ${callers} | ${n.toFixed(0)} (${all(results.node[callers])}) | ${g.toFixed(0)} (${all(results.go[callers])}) | ${((100 * n) / g).toFixed(0)}% |`);
}
