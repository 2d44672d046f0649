// Starting a real governord for the tests, built from this repository's
// cmd/governord. Readiness is the "governord ready" line it logs with the
// address it bound (listen: 127.0.0.1:0), never a sleep.

import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

export const PAYMENTS_KEY = 'payments-key-for-tests-0001';
export const RECON_KEY = 'recon-key-for-tests-000000001';
export const ADMIN_KEY = 'admin-key-for-tests-000000001';

let built;

/** binary returns governord's path: GOVERNORD_BIN, or a fresh go build. */
export function binary() {
  if (process.env.GOVERNORD_BIN) return process.env.GOVERNORD_BIN;
  if (!built) {
    const dir = mkdtempSync(path.join(tmpdir(), 'governord-bin-'));
    built = path.join(dir, 'governord');
    execFileSync('go', ['build', '-o', built, './cmd/governord'], { cwd: repo, stdio: ['ignore', 'inherit', 'inherit'] });
    process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
  }
  return built;
}

/** The configuration most tests use: two tenants and a db limit at the root. */
export function baseConfig({ ttl = '2s', extra = '' } = {}) {
  return `listen: 127.0.0.1:0
metrics_listen: ""
session_ttl: ${ttl}
admin_key: ${ADMIN_KEY}
store: {driver: memory}
root:
  limits: {db: 4}
tenants:
  - name: payments
    api_key: ${PAYMENTS_KEY}
    weight: 4
    defaults: {quotas: {retry: 3}}
  - name: recon
    api_key: ${RECON_KEY}
    weight: 1
${extra}`;
}

/**
 * start runs governord with config and resolves once it is ready, with its
 * address and a stop function. A governord that exits first rejects with
 * what it printed.
 */
export function start(config = baseConfig()) {
  const dir = mkdtempSync(path.join(tmpdir(), 'governord-'));
  const file = path.join(dir, 'governor.yaml');
  writeFileSync(file, config);
  const proc = spawn(binary(), ['-config', file], { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
  // A test that fails before stopping its governord must not hang the run:
  // once ready, the child does not keep this process alive, and dies with it.
  const killOnExit = () => proc.kill('SIGKILL');
  process.on('exit', killOnExit);
  let stderr = '';
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => {
    process.off('exit', killOnExit);
    resolve({ code, signal });
  }));
  let ready = false;
  return new Promise((resolve, reject) => {
    proc.stderr.setEncoding('utf8');
    proc.stderr.on('data', (chunk) => {
      stderr += chunk;
      const m = /msg="governord ready" listen=(\S+)/.exec(stderr);
      if (m && !ready) {
        ready = true;
        proc.unref();
        proc.stderr.unref();
        resolve({
          addr: m[1],
          port: Number(m[1].slice(m[1].lastIndexOf(':') + 1)),
          proc,
          exited,
          stderr: () => stderr,
          async stop(signal = 'SIGTERM') {
            proc.ref(); // keep the process alive until the exit is seen
            if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
            await exited;
            rmSync(dir, { recursive: true, force: true });
          },
        });
      }
    });
    exited.then(({ code, signal }) => reject(new Error(`governord exited (${code ?? signal}) before it was ready:\n${stderr}`)));
  });
}

/**
 * within resolves as promise does, or rejects once ms pass; its timer keeps
 * the process alive while a test waits on timers the client unrefs.
 */
export function within(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}
