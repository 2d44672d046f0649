// @governor/client: a Node.js client for governord, Governor's daemon.
// README.md describes the API; src/index.d.ts types it.

export { connect, Session } from './session.js';
export { Task, Lease } from './task.js';
export { GovernorError, Code } from './errors.js';
export { guarded, retry, guardPool } from './helpers.js';
