// copy-proto copies the repository's governor.proto into proto/ so that the
// packed package carries it (npm runs this as prepack). The copy is not kept
// in the repository: api/governorpb/governor.proto is the one source.
import { copyFileSync, mkdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

const pkg = path.join(path.dirname(fileURLToPath(import.meta.url)), '..');
const source = path.join(pkg, '..', '..', 'api', 'governorpb', 'governor.proto');
mkdirSync(path.join(pkg, 'proto'), { recursive: true });
copyFileSync(source, path.join(pkg, 'proto', 'governor.proto'));
