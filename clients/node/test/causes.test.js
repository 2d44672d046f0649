// The cause governord names on every refusal, as err.causeName: the word
// the sidecar's Governor-Denied header uses.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { connect, GovernorError } from '../src/index.js';
import { causeWireName } from '../src/errors.js';
import { ADMIN_KEY, PAYMENTS_KEY, start } from './governord.js';

let governord;
let session;
let admin;

before(async () => {
  governord = await start();
  session = await connect({ apiKey: PAYMENTS_KEY, addr: governord.addr });
  admin = await connect({ apiKey: ADMIN_KEY, addr: governord.addr });
});

after(async () => {
  await session?.close();
  await admin?.close();
  await governord?.stop();
});

/** refusedFor returns an assert.rejects check for a GovernorError of causeName. */
function refusedFor(causeName) {
  return (err) => {
    assert.ok(err instanceof GovernorError, `not a GovernorError: ${err}`);
    assert.equal(err.causeName, causeName, err.message);
    return true;
  };
}

describe('causeName', () => {
  test('a spent quota, a rate, an ended task, nothing refused', async () => {
    const task = await session.newTask({ name: 'causes', quotas: { tokens: 1 } });
    await session.rpc('SetCaps', { nodeId: task.id, rates: { calls: { units: 1, per: { seconds: 3600, nanos: 0 } } } });
    await task.consume('calls');
    await assert.rejects(task.consume('tokens', 2), refusedFor('quota'));
    await assert.rejects(task.consume('calls'), refusedFor('rate'));
    await assert.rejects(session.rpc('GetNode', { nodeId: 1 }), refusedFor(''));
    await task.close();
    await assert.rejects(session.rpc('Consume', { nodeId: task.id, resource: 'tokens', amount: 1 }), refusedFor('task-ended'));
  });

  test('a suspended tenant', async () => {
    const task = await session.newTask({ name: 'suspended' });
    const tenant = session.scopeId;
    await admin.rpc('SetTenantState', { nodeId: tenant, state: 'suspended', reason: 'test' });
    try {
      await assert.rejects(task.consume('tokens'), refusedFor('suspended'));
    } finally {
      await admin.rpc('SetTenantState', { nodeId: tenant, state: 'active', reason: 'test' });
    }
    await task.close();
  });

  test('the names of governor.proto', () => {
    assert.equal(causeWireName('CAUSE_WAIT_TIMEOUT'), 'wait-timeout');
    assert.equal(causeWireName('CAUSE_READ_ONLY'), 'read-only');
    assert.equal(causeWireName('CAUSE_QUOTA'), 'quota');
    assert.equal(causeWireName('CAUSE_UNSPECIFIED'), '');
    assert.equal(causeWireName(undefined), '');
    assert.equal(causeWireName(0), '');
    assert.equal(causeWireName(999), 'cause(999)');
  });
});
