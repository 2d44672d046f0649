// The package as npm would publish it: it carries governor.proto and works
// from outside the repository.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { PAYMENTS_KEY, start } from './governord.js';

const pkg = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const repoProto = path.join(pkg, '..', '..', 'api', 'governorpb', 'governor.proto');

test('the packed package carries governor.proto and runs from outside the repository', async () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'governor-pack-'));
  const governord = await start();
  try {
    const [{ filename, files }] = JSON.parse(execFileSync('npm', ['pack', '--json', '--pack-destination', dir], { cwd: pkg, encoding: 'utf8' }));
    const packed = files.map((f) => f.path);
    assert.ok(packed.includes('proto/governor.proto'), `packed: ${packed.join(', ')}`);
    assert.ok(packed.includes('src/index.d.ts'));
    assert.ok(!packed.some((p) => p.startsWith('test/')), 'tests stay out of the package');
    assert.equal(existsSync(path.join(pkg, 'proto')), false, 'postpack removed the copy from the checkout');

    execFileSync('tar', ['-xzf', path.join(dir, filename), '-C', dir]);
    const unpacked = path.join(dir, 'package');
    assert.equal(readFileSync(path.join(unpacked, 'proto', 'governor.proto'), 'utf8'), readFileSync(repoProto, 'utf8'));
    symlinkSync(path.join(pkg, 'node_modules'), path.join(unpacked, 'node_modules'));
    // A program outside the repository: the protocol comes from the package.
    const script = `
      import { connect } from ${JSON.stringify(path.join(unpacked, 'src', 'index.js'))};
      import { protocol } from ${JSON.stringify(path.join(unpacked, 'src', 'proto.js'))};
      const session = await connect();
      const task = await session.newTask({ name: 'from-the-tarball' });
      await (await task.acquire('db')).release();
      await task.close();
      await session.close();
      console.log(protocol().file);`;
    const out = execFileSync(process.execPath, ['--input-type=module', '-e', script], {
      cwd: dir, encoding: 'utf8', env: { ...process.env, GOVERNOR_ADDR: governord.addr, GOVERNOR_API_KEY: PAYMENTS_KEY },
    });
    assert.equal(out.trim(), path.join(unpacked, 'proto', 'governor.proto'));
  } finally {
    await governord.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});
