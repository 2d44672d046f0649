// The guides of README.md, run as tests: each does what its guide shows,
// with real parts (an HTTP server for the payment gateway, node-postgres
// against the test PostgreSQL for the database).

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { connect, guardPool, guarded, retry, Code, GovernorError } from '../src/index.js';
import { PAYMENTS_KEY, start, within } from './governord.js';

const PG_DSN = process.env.GOVERNOR_TEST_PG_DSN;

let governord;
let session;
let psp; // a stand-in payment gateway: /capture answers 200, /busy 429
let pspURL;

before(async () => {
  governord = await start();
  session = await connect({ apiKey: PAYMENTS_KEY, addr: governord.addr });
  psp = http.createServer((req, res) => {
    res.statusCode = req.url === '/busy' ? 429 : 200;
    res.end();
  });
  await new Promise((resolve) => psp.listen(0, '127.0.0.1', resolve));
  pspURL = `http://127.0.0.1:${psp.address().port}`;
});

after(async () => {
  await session?.close();
  await governord?.stop();
  psp?.close();
});

const held = async (task) => (await session.rpc('GetNode', { nodeId: task.id })).held;

test('quick start: a lease around one call, released with how it went', async () => {
  const task = await session.newTask({ name: 'checkout-42', deadlineMs: 3000 });
  try {
    const lease = await task.acquire('psp');
    const start = performance.now();
    const res = await fetch(`${pspURL}/capture`, { method: 'POST' });
    await lease.release({ latencyMs: performance.now() - start, overloaded: res.status === 429 });
    assert.equal(res.status, 200);
    assert.deepEqual(await held(task), {});
  } finally {
    await task.close();
  }
});

describe('guarding a call', () => {
  test('guarded holds the lease while fn runs and returns its result', async () => {
    const task = await session.newTask({ name: 'guarded' });
    let during;
    const res = await guarded(task, 'psp', async () => {
      during = await held(task);
      return fetch(`${pspURL}/busy`, { method: 'POST' });
    }, (r) => r?.status === 429);
    assert.equal(res.status, 429);
    assert.deepEqual(during, { psp: '1' });
    assert.deepEqual(await held(task), {});
    await task.close();
  });

  test('guarded releases the lease when fn throws, and rethrows', async () => {
    const task = await session.newTask({ name: 'guarded-throws' });
    await assert.rejects(guarded(task, 'psp', async () => { throw new Error('gateway down'); }), /gateway down/);
    assert.deepEqual(await held(task), {});
    await task.close();
  });
});

describe('retrying within a budget', () => {
  test('the first attempt is free and each retry spends one unit of the task\'s retry quota', async () => {
    const task = await session.newTask({ name: 'retries' }); // retry: 3 from the tenant's defaults
    let attempts = 0;
    const failure = new Error('flaky');
    await assert.rejects(retry(task, async () => { attempts++; throw failure; }, { baseMs: 1, maxMs: 2 }), (err) => {
      assert.equal(err, failure, 'the original error is the one reported');
      assert.ok(err.governorRefusal instanceof GovernorError && err.governorRefusal.denied);
      return true;
    });
    assert.equal(attempts, 4);
    const node = await session.rpc('GetNode', { nodeId: task.id });
    assert.equal(node.used.retry, '3');
    await task.close();
  });

  test('nested retries draw from the same budget, so they cannot multiply', async () => {
    const task = await session.newTask({ name: 'nested' });
    let calls = 0;
    const opts = { baseMs: 1, maxMs: 2 };
    await assert.rejects(retry(task, () => retry(task, async () => { calls++; throw new Error('down'); }, opts), opts), /down/);
    // 3 retries in all: each inner run has one free attempt, and so has the outer.
    assert.ok(calls <= 1 + 3 + 1, `${calls} calls`);
    await task.close();
  });

  test('a success stops the retries', async () => {
    const task = await session.newTask({ name: 'recovers' });
    let attempts = 0;
    const value = await retry(task, async () => {
      if (++attempts < 3) throw new Error('not yet');
      return 'ok';
    }, { baseMs: 1, maxMs: 2 });
    assert.equal(value, 'ok');
    assert.equal((await session.rpc('GetNode', { nodeId: task.id })).used.retry, '2');
    await task.close();
  });

  test('the governor\'s own refusals are not retried', async () => {
    const task = await session.newTask({ name: 'refused', quotas: { calls: 0 } });
    let attempts = 0;
    await assert.rejects(retry(task, async () => { attempts++; await task.consume('calls'); }, { baseMs: 1, maxMs: 2 }),
      (err) => err.denied);
    assert.equal(attempts, 1);
    await task.close();
  });
});

test('deadlines: calls are refused and leases freed once deadlineMs has passed', async () => {
  const task = await session.newTask({ name: 'order-7', deadlineMs: 300 });
  await task.acquire('psp');
  // The deadline is what this test is about: let it pass.
  await new Promise((resolve) => setTimeout(resolve, 350));
  await assert.rejects(task.consume('tokens'), (err) => err.code === Code.FAILED_PRECONDITION && err.nodeEnded.state === 'EXPIRED');
  const node = await session.rpc('GetNode', { nodeId: task.id });
  assert.equal(node.state, 'NODE_STATE_EXPIRED');
  assert.deepEqual(node.held, {});
});

test('budgets for a task: 20 LLM calls, at most 3 at once', async () => {
  const run = await session.newTask({ name: 'research-agent', quotas: { llm_calls: 20, tokens: 50_000 }, limits: { llm: 3 } });
  for (let i = 0; i < 20; i++) await run.consume('llm_calls');
  await assert.rejects(run.consume('llm_calls'), (err) => err.denied && err.resource === 'llm_calls' && err.limit === 20);
  await run.consume('tokens', 49_000);
  await assert.rejects(run.consume('tokens', 1_001), (err) => err.denied && err.used === 49_000 && err.amount === 1_001);
  const leases = await Promise.all([run.acquire('llm'), run.acquire('llm'), run.acquire('llm')]);
  let fourth = false;
  const waiting = run.acquire('llm').then((l) => { fourth = true; return l; });
  assert.deepEqual(await held(run), { llm: '3' });
  assert.equal(fourth, false);
  await leases[0].release();
  await (await waiting).release();
  await Promise.all(leases.slice(1).map((l) => l.release()));
  await run.close();
});

test('a batch job: workers share one task and its caps', async () => {
  const job = await session.newTask({ name: 'nightly-reconciliation', limits: { psp: 2 } });
  let running = 0;
  let most = 0;
  let bothIn;
  const twoRunning = new Promise((resolve) => { bothIn = resolve; });
  const worker = async () => {
    for (let i = 0; i < 5; i++) {
      await guarded(job, 'psp', async () => {
        most = Math.max(most, ++running);
        if (running === 2) bothIn();
        await twoRunning; // the first two hold on until both are in, so the overlap is seen
        await fetch(`${pspURL}/capture`, { method: 'POST' });
        running--;
      });
    }
  };
  await within(Promise.all([worker(), worker(), worker(), worker()]), 10_000, 'the workers');
  assert.equal(most, 2, 'the job\'s limit held the workers to 2 at once');
  await job.close();
});

describe('with PostgreSQL', { skip: PG_DSN ? false : 'GOVERNOR_TEST_PG_DSN is not set' }, () => {
  let pool;
  before(() => {
    pool = new pg.Pool({ connectionString: PG_DSN, max: 20 });
  });
  after(() => pool?.end());

  test('guarding a database: a large pool, and the db limit holds the queries running at once', async () => {
    const task = await session.newTask({ name: 'db-guard', limits: { db: 2 } });
    const db = guardPool(pool);
    const marker = `governor_guard_${process.pid}`;
    // Each query counts the queries of this test running in the server as it runs.
    const text = `SELECT pg_sleep(0.05), (SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%${marker}%' AND pid <> 0)::int AS running -- ${marker}`;
    const results = await Promise.all(Array.from({ length: 8 }, () => db.query(task, text)));
    const most = Math.max(...results.map((r) => r.rows[0].running));
    assert.equal(most, 2, `at most 2 queries ran at once (saw ${most}); the pool alone would have run 8`);
    assert.deepEqual(await held(task), {});
    await task.close();
  });

  test('fencing writes: a lease id guards the row against a stale writer', async () => {
    const client = await pool.connect(); // temp tables live in one connection
    try {
      await client.query('CREATE TEMP TABLE payments (id int PRIMARY KEY, status text, fence bigint NOT NULL DEFAULT 0)');
      await client.query("INSERT INTO payments (id, status) VALUES (1, 'pending')");
      const task = await session.newTask({ name: 'fenced' });
      const stale = await task.acquire('db'); // a worker that then pauses for a long time
      const fresh = await task.acquire('db'); // the worker that took over
      assert.ok(BigInt(fresh.id) > BigInt(stale.id));
      const write = (lease, status) => client.query(
        'UPDATE payments SET status = $3, fence = $1 WHERE id = $2 AND fence < $1', [lease.id, 1, status]);
      assert.equal((await write(fresh, 'captured')).rowCount, 1);
      assert.equal((await write(stale, 'failed')).rowCount, 0, 'the stale writer cannot overwrite newer work');
      const row = (await client.query('SELECT status, fence::text FROM payments WHERE id = 1')).rows[0];
      assert.deepEqual(row, { status: 'captured', fence: fresh.id });
      await task.close();
      // Validate before a step that cannot be undone: the task's close revoked it.
      await assert.rejects(session.rpc('Validate', { leaseId: fresh.id }),
        (err) => err.code === Code.FAILED_PRECONDITION && err.leaseEnded.reason === 'REVOKED');
    } finally {
      client.release();
    }
  });
});
