// Keeping a session alive, and losing it.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { connect, Code } from '../src/index.js';
import { PAYMENTS_KEY, baseConfig, start, within } from './governord.js';

const TTL_MS = 600;

test('heartbeats keep a session alive over 3 TTLs', async () => {
  const governord = await start();
  const session = await connect({ apiKey: PAYMENTS_KEY, addr: governord.addr, ttlMs: TTL_MS });
  try {
    assert.equal(session.ttlMs, TTL_MS);
    const task = await session.newTask({ name: 'long-lived' });
    const lease = await task.acquire('db');
    const firstDeadline = session.expiresAt;
    // Time has to pass for this test: three TTLs without any call of ours.
    await new Promise((resolve) => setTimeout(resolve, 3 * TTL_MS));
    assert.equal(session.error, null, 'the session is still alive');
    // The last heartbeat went out at most a third of a TTL ago (slack: 150 ms).
    assert.ok(session.expiresAt >= firstDeadline + 3 * TTL_MS - TTL_MS / 3 - 150,
      `heartbeats moved the local deadline by ${(session.expiresAt - firstDeadline).toFixed(0)} ms`);
    // governord still knows the session and its lease.
    await lease.validate();
    await lease.release();
    await task.close();
  } finally {
    await session.close();
    await governord.stop();
  }
});

test('a session is lost 80% of the TTL after the last good heartbeat was sent, when governord stops', async () => {
  const governord = await start();
  const beforeOpen = performance.now();
  const session = await connect({ apiKey: PAYMENTS_KEY, addr: governord.addr, ttlMs: TTL_MS });
  const afterOpen = performance.now();
  // OpenSession is the first heartbeat: it was sent between the two readings.
  assert.ok(session.expiresAt >= beforeOpen + 0.8 * TTL_MS && session.expiresAt <= afterOpen + 0.8 * TTL_MS,
    `local deadline ${(session.expiresAt - beforeOpen).toFixed(1)} ms after the open began, ${(session.expiresAt - afterOpen).toFixed(1)} after it ended`);
  const task = await session.newTask({ name: 'orphan', limits: { psp: 1 } });
  await task.acquire('psp');
  const waiting = task.acquire('psp'); // queued behind the first
  waiting.catch(() => {});
  const deadline = session.expiresAt; // sent time of the last good heartbeat + 80% of the TTL
  await governord.stop('SIGKILL');
  const killedAt = performance.now();
  // The last good heartbeat cannot have been extended after the kill.
  const reason = await within(session.done, 5000, 'session lost');
  const lostAt = performance.now();
  assert.equal(reason.sessionLost, true);
  assert.equal(reason.code, Code.UNAVAILABLE);
  assert.match(reason.message, /80% of the 600 ms TTL/);
  assert.ok(lostAt >= Math.max(deadline, killedAt) - 1, `lost ${(deadline - lostAt).toFixed(1)} ms before the local deadline`);
  assert.ok(lostAt - killedAt <= TTL_MS * 0.8 + 200, `lost ${(lostAt - killedAt).toFixed(0)} ms after governord stopped`);
  // The acquire that was waiting is cut off, and nothing new is admitted.
  await assert.rejects(waiting, (err) => err.sessionLost && err.code === Code.UNAVAILABLE);
  const refusedAt = performance.now();
  await assert.rejects(task.consume('x'), (err) => err.sessionLost);
  await assert.rejects(session.newTask({ name: 'more' }), (err) => err.sessionLost);
  assert.ok(performance.now() - refusedAt < 100, 'refused at once, without trying governord');
  await session.close(); // nothing to tell governord; closes the connection
});

test('a session governord forgot is lost with UNAUTHENTICATED', async () => {
  const first = await start();
  // A longer TTL: the second governord must be up before the local deadline.
  const session = await connect({ apiKey: PAYMENTS_KEY, addr: first.addr, ttlMs: 3000 });
  await first.stop('SIGKILL');
  // A new governord on the same address, with the memory store: it has never
  // heard of the session. The next heartbeat finds it there.
  const second = await start(baseConfig().replace('listen: 127.0.0.1:0', `listen: ${first.addr}`));
  try {
    const reason = await within(session.done, 5000, 'session lost');
    assert.equal(reason.sessionLost, true);
    assert.equal(reason.code, Code.UNAUTHENTICATED, reason.message);
  } finally {
    await session.close();
    await second.stop();
  }
});
