// TLS with a CA file, against a governord serving a certificate openssl made.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { connect, Code } from '../src/index.js';
import { PAYMENTS_KEY, baseConfig, start } from './governord.js';

let dir;
let governord;
let port;

/** selfSigned makes a CA-less self-signed certificate for localhost. */
function selfSigned(name) {
  const cert = path.join(dir, `${name}.pem`);
  const key = path.join(dir, `${name}.key`);
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
    '-keyout', key, '-out', cert, '-days', '1', '-subj', '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost'],
  { stdio: 'ignore' });
  return { cert, key };
}

before(async () => {
  dir = mkdtempSync(path.join(tmpdir(), 'governor-tls-'));
  const server = selfSigned('server');
  governord = await start(baseConfig({ extra: `tls: {cert_file: ${server.cert}, key_file: ${server.key}}\n` }));
  port = governord.port;
});

after(async () => {
  await governord?.stop();
  rmSync(dir, { recursive: true, force: true });
});

test('caFile turns TLS on and trusts the file', async () => {
  const session = await connect({ apiKey: PAYMENTS_KEY, addr: `localhost:${port}`, caFile: path.join(dir, 'server.pem') });
  const task = await session.newTask({ name: 'over-tls' });
  const lease = await task.acquire('db');
  await lease.release();
  await task.close();
  await session.close();
});

test('GOVERNOR_CA_FILE does the same', async () => {
  const saved = { ...process.env };
  Object.assign(process.env, { GOVERNOR_ADDR: `localhost:${port}`, GOVERNOR_API_KEY: PAYMENTS_KEY, GOVERNOR_CA_FILE: path.join(dir, 'server.pem') });
  delete process.env.GOVERNOR_TLS;
  try {
    const session = await connect();
    assert.equal(typeof session.scopeId, 'string');
    await session.close();
  } finally {
    process.env = saved;
  }
});

test('a CA file that did not sign governord\'s certificate is refused', async () => {
  const other = selfSigned('other');
  await assert.rejects(connect({ apiKey: PAYMENTS_KEY, addr: `localhost:${port}`, caFile: other.cert, dialTimeoutMs: 500 }),
    (err) => err.code === Code.UNAVAILABLE);
});

test('the system roots do not trust a self-signed certificate', async () => {
  await assert.rejects(connect({ apiKey: PAYMENTS_KEY, addr: `localhost:${port}`, tls: true, dialTimeoutMs: 500 }),
    (err) => err.code === Code.UNAVAILABLE);
});

test('plaintext to a TLS governord fails', async () => {
  await assert.rejects(connect({ apiKey: PAYMENTS_KEY, addr: `localhost:${port}`, dialTimeoutMs: 500 }),
    (err) => err.code === Code.UNAVAILABLE);
});

test('a file with no certificate is refused at connect', async () => {
  const junk = path.join(dir, 'junk.pem');
  writeFileSync(junk, 'not a certificate\n');
  await assert.rejects(connect({ apiKey: PAYMENTS_KEY, addr: `localhost:${port}`, caFile: junk }),
    (err) => err.code === Code.INVALID_ARGUMENT && /no PEM certificate/.test(err.message));
});
