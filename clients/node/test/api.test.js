// Every call of the API against a real governord.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import * as grpc from '@grpc/grpc-js';
import { connect, Code, GovernorError } from '../src/index.js';
import { ADMIN_KEY, PAYMENTS_KEY, start } from './governord.js';

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

let names = 0;
const unique = (prefix) => `${prefix}-${++names}`;

describe('connect', () => {
  test('reads GOVERNOR_ADDR and GOVERNOR_API_KEY', async () => {
    const saved = { ...process.env };
    process.env.GOVERNOR_ADDR = governord.addr;
    process.env.GOVERNOR_API_KEY = PAYMENTS_KEY;
    delete process.env.GOVERNOR_TLS;
    delete process.env.GOVERNOR_CA_FILE;
    try {
      const s = await connect();
      assert.equal(s.scopeId, session.scopeId);
      await s.close();
    } finally {
      process.env = saved;
    }
  });

  test('scopeId is the tenant, as a string', async () => {
    assert.equal(typeof session.scopeId, 'string');
    const node = await session.rpc('GetNode', { nodeId: session.scopeId });
    assert.equal(node.name, 'payments');
    assert.equal(node.kind, 'NODE_KIND_TENANT');
  });

  test('ttlMs asks for a TTL and the session has what governord granted', async () => {
    const s = await connect({ apiKey: PAYMENTS_KEY, addr: governord.addr, ttlMs: 1500 });
    assert.equal(s.ttlMs, 1500);
    await s.close();
  });
});

describe('tasks', () => {
  test('newTask creates a task with its name, deadline, quotas and limits', async () => {
    const before = Date.now();
    const task = await session.newTask({ name: unique('checkout'), deadlineMs: 60_000, quotas: { tokens: 50_000 }, limits: { llm: 3 } });
    assert.equal(typeof task.id, 'string');
    const node = await session.rpc('GetNode', { nodeId: task.id });
    assert.equal(node.name, task.name);
    assert.equal(node.parentId, session.scopeId);
    assert.equal(node.kind, 'NODE_KIND_TASK');
    assert.deepEqual(node.quotas, { tokens: '50000', retry: '3' }); // retry from the tenant's defaults
    assert.deepEqual(node.limits, { llm: '3' });
    const deadline = Number(node.deadline.seconds) * 1000;
    assert.ok(deadline >= before + 59_000 && deadline <= Date.now() + 60_000, `deadline ${deadline}`);
    await task.close();
  });

  test('a task without a name gets one', async () => {
    const task = await session.newTask();
    assert.match(task.name, /^task-/);
    await task.close();
  });

  test('consume charges 1 by default, or the amount given', async () => {
    const task = await session.newTask({ name: unique('consume'), quotas: { tokens: 100 } });
    await task.consume('tokens');
    await task.consume('tokens', 41);
    await task.consume('tokens', 8n);
    await task.consume('tokens', '50');
    const node = await session.rpc('GetNode', { nodeId: task.id });
    assert.equal(node.used.tokens, '100');
    await task.close();
  });

  test('close ends the task', async () => {
    const task = await session.newTask({ name: unique('close') });
    await task.close();
    await task.close(); // closing again is not an error
    const node = await session.rpc('GetNode', { nodeId: task.id });
    assert.equal(node.state, 'NODE_STATE_CLOSED');
  });

  test('cancel ends the task abnormally', async () => {
    const task = await session.newTask({ name: unique('cancel') });
    await task.cancel();
    const node = await session.rpc('GetNode', { nodeId: task.id });
    assert.equal(node.state, 'NODE_STATE_CANCELLED');
  });

  test('a subtask counts against its task', async () => {
    const task = await session.newTask({ name: unique('parent'), quotas: { calls: 2 } });
    const sub = await task.newTask({ name: 'child' });
    const node = await session.rpc('GetNode', { nodeId: sub.id });
    assert.equal(node.parentId, task.id);
    assert.equal(node.kind, 'NODE_KIND_SUBTASK');
    await sub.consume('calls', 2);
    await assert.rejects(task.consume('calls'), (err) => err.denied && err.nodeId === task.id && err.largestConsumerId === sub.id);
    await task.close();
  });
});

describe('leases', () => {
  test('acquire holds a slot until release, which reports latency and overload', async () => {
    const task = await session.newTask({ name: unique('lease'), limits: { psp: 1 } });
    const lease = await task.acquire('psp');
    assert.equal(typeof lease.id, 'string');
    assert.equal(lease.nodeId, task.id);
    assert.equal(lease.class, 'psp');
    let node = await session.rpc('GetNode', { nodeId: task.id });
    assert.deepEqual(node.held, { psp: '1' });
    await lease.release({ latencyMs: 12.5, overloaded: true });
    await lease.release(); // a second release is a no-op
    node = await session.rpc('GetNode', { nodeId: task.id });
    assert.deepEqual(node.held, {});
    await task.close();
  });

  test('acquire waits while the limit is full', async () => {
    const task = await session.newTask({ name: unique('wait'), limits: { psp: 1 } });
    const first = await task.acquire('psp');
    let granted = false;
    const second = task.acquire('psp').then((l) => { granted = true; return l; });
    // The second acquire is queued at governord: wait until it says so.
    for (;;) {
      const node = await session.rpc('GetNode', { nodeId: task.id });
      if (node.held.psp === '1') break;
    }
    assert.equal(granted, false);
    await first.release();
    const lease = await second;
    assert.ok(BigInt(lease.id) > BigInt(first.id), 'lease ids only grow (fencing tokens)');
    await lease.release();
    await task.close();
  });

  test('an aborted acquire holds nothing', async () => {
    const task = await session.newTask({ name: unique('abort'), limits: { psp: 1 } });
    const first = await task.acquire('psp');
    const ac = new AbortController();
    const waiting = task.acquire('psp', { signal: ac.signal });
    setImmediate(() => ac.abort(new Error('caller went away')));
    await assert.rejects(waiting, (err) => err instanceof GovernorError && err.code === Code.CANCELLED && !err.denied);
    await first.release();
    const node = await session.rpc('GetNode', { nodeId: task.id });
    assert.deepEqual(node.held, {});
    await task.close();
  });

  test('chargeAndAcquire charges with the grant, or charges only', async () => {
    const task = await session.newTask({ name: unique('charge'), quotas: { calls: 5 } });
    const lease = await task.chargeAndAcquire('psp', { calls: 2 });
    assert.equal(typeof lease.id, 'string');
    assert.equal(await task.chargeAndAcquire('', { calls: 1 }), null);
    const node = await session.rpc('GetNode', { nodeId: task.id });
    assert.equal(node.used.calls, '3');
    await lease.release();
    await task.close();
  });

  test('Validate through rpc: held, then ended', async () => {
    const task = await session.newTask({ name: unique('validate') });
    const lease = await task.acquire('psp');
    const held = await session.rpc('Validate', { leaseId: lease.id });
    assert.equal(held.id, lease.id);
    await lease.validate();
    await lease.release();
    await assert.rejects(session.rpc('Validate', { leaseId: lease.id }),
      (err) => err.code === Code.FAILED_PRECONDITION && err.leaseEnded.reason === 'RELEASED' && err.leaseEnded.leaseId === lease.id);
    await task.close();
  });
});

describe('rpc', () => {
  test('reaches the rest of the API: SetCaps, ListChildren, FindOrCreateNode, CancelNode', async () => {
    const task = await session.newTask({ name: unique('rpc') });
    const set = await session.rpc('SetCaps', { nodeId: task.id, quotas: { tokens: 7 }, limits: { db: 2 } });
    assert.deepEqual(set.quotas, { retry: '3', tokens: '7' });
    const found = await session.rpc('FindOrCreateNode', { parentId: session.scopeId, spec: { name: task.name } });
    assert.equal(found.node.id, task.id);
    assert.equal(found.created, false);
    const list = await session.rpc('ListChildren', { nodeId: session.scopeId, pageSize: 1000 });
    assert.ok(list.nodes.some((n) => n.id === task.id));
    const cancelled = await session.rpc('CancelNode', { nodeId: task.id });
    assert.equal(cancelled.state, 'NODE_STATE_CANCELLED');
  });

  test('a 64-bit id past 2^53 travels whole', async () => {
    await assert.rejects(session.rpc('GetNode', { nodeId: '9223372036854775807' }),
      (err) => err.code === Code.NOT_FOUND && /9223372036854775807/.test(err.message));
  });

  test('an unknown or streaming method is refused before any call', async () => {
    await assert.rejects(session.rpc('Nope', {}), (err) => err.code === Code.INVALID_ARGUMENT);
    await assert.rejects(session.rpc('Watch', {}), (err) => err.code === Code.INVALID_ARGUMENT && /stream/.test(err.message));
  });

  test('the admin key is scoped to the root', async () => {
    const admin = await connect({ apiKey: ADMIN_KEY, addr: governord.addr });
    assert.equal(admin.scopeId, '1');
    await admin.close();
  });
});

describe('retries', () => {
  test('a call whose reply was lost is retried with the same request id, so it is applied once', async () => {
    // The interceptor lets the first Consume reach governord and turns its
    // answer into UNAVAILABLE, as a connection lost on the way back would.
    const seen = [];
    let dropped = false;
    const dropFirstReply = (options, nextCall) => new grpc.InterceptingCall(nextCall(options), {
      sendMessage(message, next) {
        if (options.method_definition.path.endsWith('/Consume')) seen.push(message.requestId);
        next(message);
      },
      start(metadata, listener, next) {
        next(metadata, {
          onReceiveStatus(status, nextStatus) {
            if (options.method_definition.path.endsWith('/Consume') && !dropped && status.code === grpc.status.OK) {
              dropped = true;
              nextStatus({ code: grpc.status.UNAVAILABLE, details: 'reply lost (test)', metadata: new grpc.Metadata() });
              return;
            }
            nextStatus(status);
          },
        });
      },
    });
    const s = await connect({ apiKey: PAYMENTS_KEY, addr: governord.addr, interceptors: [dropFirstReply] });
    const task = await s.newTask({ name: unique('lost-reply'), quotas: { once: 1 } });
    await task.consume('once'); // a second charge would be refused: the quota is 1
    assert.equal(seen.length, 2, 'the consume was sent twice');
    assert.equal(seen[0], seen[1], 'with one request id');
    const node = await s.rpc('GetNode', { nodeId: task.id });
    assert.equal(node.used.once, '1');
    await task.close();
    await s.close();
  });
});

describe('abandon', () => {
  test('an acquire granted as its caller gave up is given back', async () => {
    // The interceptor lets the first Acquire be granted at governord, then
    // turns its answer into CANCELLED and aborts the caller's signal, as if
    // the caller gave up just as the grant was on its way back.
    const ac = new AbortController();
    const sent = [];
    let cut = false;
    const cutFirstGrant = (options, nextCall) => new grpc.InterceptingCall(nextCall(options), {
      sendMessage(message, next) {
        if (options.method_definition.path.endsWith('/Acquire')) sent.push(message);
        next(message);
      },
      start(metadata, listener, next) {
        next(metadata, {
          onReceiveStatus(status, nextStatus) {
            if (options.method_definition.path.endsWith('/Acquire') && !cut && status.code === grpc.status.OK) {
              cut = true;
              nextStatus({ code: grpc.status.CANCELLED, details: 'Cancelled on client', metadata: new grpc.Metadata() });
              ac.abort(new Error('caller gave up')); // before the client sees the answer
              return;
            }
            nextStatus(status);
          },
        });
      },
    });
    const s = await connect({ apiKey: PAYMENTS_KEY, addr: governord.addr, interceptors: [cutFirstGrant] });
    const task = await s.newTask({ name: unique('abandon') });
    await assert.rejects(task.acquire('psp', { signal: ac.signal }), (err) => err.code === Code.CANCELLED);
    assert.equal(sent.length, 2, 'the acquire, then its abandon');
    assert.equal(sent[1].abandon, true);
    assert.equal(sent[1].requestId, sent[0].requestId);
    const node = await session.rpc('GetNode', { nodeId: task.id });
    assert.deepEqual(node.held, {}, 'the lease granted to nobody was given back');
    await task.close();
    await s.close();
  });
});

describe('close', () => {
  test('close frees every lease of the session and ends it', async () => {
    const s = await connect({ apiKey: PAYMENTS_KEY, addr: governord.addr });
    const task = await s.newTask({ name: unique('shutdown') });
    await task.acquire('psp');
    await s.close();
    await s.close(); // again: the first result
    const node = await session.rpc('GetNode', { nodeId: task.id });
    assert.deepEqual(node.held, {});
    assert.equal((await s.done).sessionLost, true);
    await assert.rejects(task.consume('x'), (err) => err.sessionLost && err.code === Code.CANCELLED);
  });
});
