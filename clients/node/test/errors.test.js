// Each status code governord answers, as a GovernorError with its denied
// flag and details; and the input the client refuses before any call.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { connect, Code, GovernorError, retry } from '../src/index.js';
import { PAYMENTS_KEY, RECON_KEY, start } from './governord.js';

let governord;
let session;

before(async () => {
  governord = await start();
  session = await connect({ apiKey: PAYMENTS_KEY, addr: governord.addr });
});

after(async () => {
  await session?.close();
  await governord?.stop();
});

/** isError returns an assert.rejects check for a GovernorError of code. */
function isError(code, { denied = false, ...fields } = {}) {
  return (err) => {
    assert.ok(err instanceof GovernorError, `not a GovernorError: ${err}`);
    assert.equal(err.code, code, err.message);
    assert.equal(err.denied, denied, 'denied');
    for (const [k, v] of Object.entries(fields)) assert.deepEqual(err[k], v, k);
    return true;
  };
}

describe('codes', () => {
  test('RESOURCE_EXHAUSTED: denied, with the denial as fields', async () => {
    const task = await session.newTask({ name: 'denied' });
    const sub = await task.newTask({ name: 'spender' });
    await sub.consume('retry', 3); // the task's default quota: retry 3
    await assert.rejects(task.consume('retry'), isError(Code.RESOURCE_EXHAUSTED, {
      denied: true, codeName: 'RESOURCE_EXHAUSTED', resource: 'retry', nodeId: task.id, nodeName: 'denied',
      used: 3, limit: 3, amount: 1, largestConsumerId: sub.id, largestConsumerName: 'spender', largestConsumerUsed: 3,
    }));
    await task.close();
  });

  test('RESOURCE_EXHAUSTED for a quota with a period: denied, with resetAtMs', async () => {
    const task = await session.newTask({ name: 'windowed' });
    await session.rpc('SetCaps', { nodeId: task.id, quotas: { pages: 2 }, quotaPeriods: { pages: 'hour' } });
    await task.consume('pages', 2);
    let refusal;
    await assert.rejects(task.consume('pages'), (err) => {
      refusal = err;
      return isError(Code.RESOURCE_EXHAUSTED, { denied: true, resource: 'pages', nodeId: task.id, used: 2, limit: 2 })(err);
    });
    const hour = 3600_000;
    const next = (Math.floor(Date.now() / hour) + 1) * hour; // governord's time_zone is UTC here
    assert.ok(Math.abs(refusal.resetAtMs - next) <= 1000, `resetAtMs ${refusal.resetAtMs}, want about ${next}`);
    await task.close();
  });

  test('RESOURCE_EXHAUSTED for a rate: rateLimited, not denied, with the wait; retry() waits it', async () => {
    const task = await session.newTask({ name: 'paced' });
    // One call per 300 ms, one at a time.
    await session.rpc('SetCaps', { nodeId: task.id, rates: { calls: { units: 1, per: { seconds: 0, nanos: 300_000_000 } } } });
    await task.consume('calls');
    let refusal;
    await assert.rejects(task.consume('calls'), (err) => {
      refusal = err;
      return isError(Code.RESOURCE_EXHAUSTED, { denied: false, rateLimited: true, resource: 'calls', nodeId: task.id,
        nodeName: 'paced', level: 0, amount: 1 })(err);
    });
    assert.ok(refusal.retryAfterMs > 0 && refusal.retryAfterMs <= 300, `retryAfterMs ${refusal.retryAfterMs}`);
    // A 1 ms backoff would spend the three retries (the task's default
    // quota) before the bucket refills; waiting retryAfterMs, the second
    // attempt fits.
    let attempts = 0;
    const start = performance.now();
    await retry(task, () => { attempts++; return task.consume('calls'); }, { baseMs: 1, maxMs: 1 });
    assert.equal(attempts, 2);
    assert.ok(performance.now() - start >= 100, 'retry waited the rate out');
    await task.close();
  });

  test('waitForRate: a charge a rate refuses waits for it; an aborted wait charges nothing', async () => {
    const task = await session.newTask({ name: 'waits' });
    await session.rpc('SetCaps', { nodeId: task.id, rates: { calls: { units: 1, per: { seconds: 0, nanos: 200_000_000 } } } });
    assert.equal(await task.chargeAndAcquire('', { calls: 1 }), null);
    await assert.rejects(task.chargeAndAcquire('', { calls: 1 }), isError(Code.RESOURCE_EXHAUSTED, { rateLimited: true }));
    await assert.rejects(task.chargeAndAcquire('', { calls: 1 }, { waitForRate: 'yes' }), /waitForRate must be a boolean/);
    const ac = new AbortController();
    const gaveUp = task.chargeAndAcquire('', { calls: 1 }, { waitForRate: true, signal: ac.signal });
    setTimeout(() => ac.abort(new Error('caller went away')), 20);
    await assert.rejects(gaveUp, (err) => err instanceof GovernorError && err.code === Code.CANCELLED);
    const start = performance.now();
    assert.equal(await task.chargeAndAcquire('', { calls: 1 }, { waitForRate: true }), null);
    const waited = performance.now() - start;
    assert.ok(waited >= 100 && waited < 350, `granted after ${waited} ms; the next token was under 200 ms away`);
    const node = await session.rpc('GetNode', { nodeId: task.id });
    assert.equal(node.used.calls, '2');
    await task.close();
  });

  test('FAILED_PRECONDITION: the task ended, with the node that ended', async () => {
    const task = await session.newTask({ name: 'ended' });
    await session.rpc('CloseNode', { nodeId: task.id }); // behind the Task's back: governord must say it
    await assert.rejects(task.consume('x'), isError(Code.FAILED_PRECONDITION, { nodeEnded: { nodeId: task.id, nodeName: 'ended', state: 'CLOSED' } }));
    // Now the client knows, and refuses without asking.
    await assert.rejects(task.acquire('db'), isError(Code.FAILED_PRECONDITION));
  });

  test('FAILED_PRECONDITION: the lease was revoked', async () => {
    const task = await session.newTask({ name: 'revoked' });
    const lease = await task.acquire('db');
    await task.close();
    await assert.rejects(lease.release(), isError(Code.FAILED_PRECONDITION, { leaseEnded: { leaseId: lease.id, reason: 'REVOKED' } }));
  });

  test('FAILED_PRECONDITION: the deadline passed, known without asking', async () => {
    const task = await session.newTask({ name: 'late', deadlineMs: 0 });
    await assert.rejects(task.consume('x'), isError(Code.FAILED_PRECONDITION, { nodeEnded: { nodeId: task.id, nodeName: 'late', state: 'EXPIRED' } }));
  });

  test('UNAUTHENTICATED: a wrong API key', async () => {
    await assert.rejects(connect({ apiKey: 'not-a-key-0000000000', addr: governord.addr }), isError(Code.UNAUTHENTICATED, { sessionLost: false }));
  });

  test('PERMISSION_DENIED: a change to the scope node itself', async () => {
    await assert.rejects(session.rpc('SetCaps', { nodeId: session.scopeId, quotas: { x: 1 } }), isError(Code.PERMISSION_DENIED));
    await assert.rejects(session.rpc('CloseNode', { nodeId: session.scopeId }), isError(Code.PERMISSION_DENIED));
  });

  test('NOT_FOUND: another tenant\'s node is not shown to exist', async () => {
    const recon = await connect({ apiKey: RECON_KEY, addr: governord.addr });
    try {
      const theirs = await recon.newTask({ name: 'theirs' });
      await assert.rejects(session.rpc('GetNode', { nodeId: theirs.id }), isError(Code.NOT_FOUND));
    } finally {
      await recon.close();
    }
  });

  test('NOT_FOUND: no such node or lease', async () => {
    await assert.rejects(session.rpc('GetNode', { nodeId: '999999' }), isError(Code.NOT_FOUND));
    await assert.rejects(session.rpc('Validate', { leaseId: '999999' }), isError(Code.NOT_FOUND));
  });

  test('ALREADY_EXISTS: an open sibling has the name', async () => {
    const task = await session.newTask({ name: 'twin' });
    await assert.rejects(session.newTask({ name: 'twin' }), isError(Code.ALREADY_EXISTS));
    await task.close();
  });

  test('INVALID_ARGUMENT: governord refuses a malformed request', async () => {
    const task = await session.newTask({ name: 'malformed' });
    await assert.rejects(task.consume('tokens', 0), isError(Code.INVALID_ARGUMENT));
    await assert.rejects(session.newTask({ name: 'negative', quotas: { tokens: -2 } }), isError(Code.INVALID_ARGUMENT));
    await task.close();
  });

  test('UNAVAILABLE: nothing listens at the address', async () => {
    const server = net.createServer();
    await new Promise((r) => server.listen(0, '127.0.0.1', r));
    const { port } = server.address();
    await new Promise((r) => server.close(r)); // the port is free now, and refuses
    await assert.rejects(connect({ apiKey: PAYMENTS_KEY, addr: `127.0.0.1:${port}`, dialTimeoutMs: 300 }), isError(Code.UNAVAILABLE));
  });

  test('CANCELLED: the caller aborted', async () => {
    const task = await session.newTask({ name: 'aborted' });
    await assert.rejects(task.acquire('db', { signal: AbortSignal.abort() }), isError(Code.CANCELLED));
    await task.close();
  });
});

describe('bad input, refused before any call', () => {
  const bad = (promise, pattern) => assert.rejects(promise, isError(Code.INVALID_ARGUMENT, {})).then(() =>
    promise.catch((err) => assert.match(err.message, pattern)));

  test('amounts and caps must be 64-bit integers', async () => {
    const task = await session.newTask({ name: 'input' });
    await bad(task.consume('tokens', 1.5), /amount: 1.5 is not a 64-bit integer/);
    await bad(task.consume('tokens', '12abc'), /amount/);
    await bad(task.consume('', 1), /resource/);
    await bad(session.newTask({ quotas: { x: 'lots' } }), /quotas.x/);
    await bad(session.newTask({ deadlineMs: -5 }), /deadlineMs/);
    await bad(session.newTask({ name: 42 }), /name/);
    await bad(task.acquire(''), /class/);
    await task.close();
  });

  test('GOVERNOR_TLS takes only true, false, 1 or 0', async () => {
    const saved = process.env.GOVERNOR_TLS;
    try {
      for (const value of ['yes', 'TRUE', 'on', ' 1']) {
        process.env.GOVERNOR_TLS = value;
        await bad(connect({ apiKey: PAYMENTS_KEY, addr: governord.addr }), /GOVERNOR_TLS/);
      }
      process.env.GOVERNOR_TLS = '0';
      const s = await connect({ apiKey: PAYMENTS_KEY, addr: governord.addr });
      await s.close();
    } finally {
      if (saved === undefined) delete process.env.GOVERNOR_TLS;
      else process.env.GOVERNOR_TLS = saved;
    }
  });

  test('TLS needs a host name, and an address a port', async () => {
    await bad(connect({ apiKey: PAYMENTS_KEY, addr: '127.0.0.1:7600', tls: true }), /host name/);
    await bad(connect({ apiKey: PAYMENTS_KEY, addr: 'governor.internal' }), /host:port/);
    await bad(connect({ apiKey: PAYMENTS_KEY, addr: 'localhost:7600', tls: 'yes' }), /tls must be/);
  });

  test('a list of addresses waits for standby support', async () => {
    await bad(connect({ apiKey: PAYMENTS_KEY, addr: 'a:7600,b:7600' }), /list/);
  });

  test('no API key, a missing CA file', async () => {
    const saved = process.env.GOVERNOR_API_KEY;
    delete process.env.GOVERNOR_API_KEY;
    try {
      await assert.rejects(connect({ addr: governord.addr }), isError(Code.UNAUTHENTICATED));
    } finally {
      if (saved !== undefined) process.env.GOVERNOR_API_KEY = saved;
    }
    await bad(connect({ apiKey: PAYMENTS_KEY, addr: 'localhost:7600', caFile: '/nonexistent/ca.pem' }), /caFile/);
  });
});
