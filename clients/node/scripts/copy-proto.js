// copy-proto puts the repository's governor.proto into proto/ so that the
// packed package carries it (npm runs it as prepack), and with --remove
// takes it away again (postpack): api/governorpb/governor.proto stays the
// one source, and a checkout never reads a stale copy.
import { copyFileSync, mkdirSync, rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

const pkg = path.join(path.dirname(fileURLToPath(import.meta.url)), '..');
const dir = path.join(pkg, 'proto');
if (process.argv.includes('--remove')) {
  rmSync(dir, { recursive: true, force: true });
} else {
  mkdirSync(dir, { recursive: true });
  copyFileSync(path.join(pkg, '..', '..', 'api', 'governorpb', 'governor.proto'), path.join(dir, 'governor.proto'));
}
