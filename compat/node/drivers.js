// The driver script of the compatibility matrix for node-postgres (pg),
// through a Client or a Pool: `node drivers.js client|pool`.
//
// compat/drivers_test.go runs it against PostgreSQL directly and through
// governor-proxy's pgwire listener. pg reads libpq's variables (PGHOST,
// PGPORT, PGUSER, PGPASSWORD, PGDATABASE); COMPAT_MODE is "direct" or
// "proxy". It prints one JSON object per cell:
// {"cell", "result": "ok" | "fail" | "unsupported" | "skip", "detail"}.
'use strict';

const pg = require('pg');
const { from: copyFrom, to: copyTo } = require('pg-copy-streams');
const { pipeline } = require('node:stream/promises');
const { Readable } = require('node:stream');

const how = process.argv[2];
const mode = process.env.COMPAT_MODE;
const WAIT = 20000; // ms: the bound of every wait, never a pause

const report = (cell, result, detail = '') => console.log(JSON.stringify({ cell, result, detail }));

let pool;
// connect returns a connected client and a function that gives it back:
// a Client of its own, or one of the Pool's.
async function connect() {
  if (how === 'pool') {
    pool ??= new pg.Pool({ max: 4, application_name: 'compat-pg-pool' });
    const c = await pool.connect();
    return { c, done: (err) => c.release(err) };
  }
  const c = new pg.Client({ application_name: 'compat-pg-client' });
  await c.connect();
  return { c, done: () => c.end().catch(() => {}) };
}

const one = async (c, text, values) => (await c.query({ text, values, rowMode: 'array' })).rows[0];

async function cellConnect() {
  const { c, done } = await connect();
  const [user] = await one(c, 'SELECT current_user');
  done();
  return user === process.env.PGUSER ? ['ok', `SCRAM-SHA-256 as ${user}`] : ['fail', `connected as ${user}`];
}

async function cellSimple() {
  const { c, done } = await connect();
  const res = await c.query('SELECT 1 AS a; SELECT 2 AS b'); // two statements: the simple protocol only
  done();
  return Array.isArray(res) && res[1].rows[0].b === 2 ? ['ok', ''] : ['fail', JSON.stringify(res)];
}

async function cellPrepared() {
  const { c, done } = await connect();
  let row;
  for (let i = 0; i < 2; i++) {
    row = (await c.query({ name: 'compat-q', text: 'SELECT $1::int + 1 AS n', values: [41] })).rows[0];
  }
  done();
  return row.n === 42 ? ['ok', 'extended protocol, named statement'] : ['fail', JSON.stringify(row)];
}

const count = async (c, where) => Number((await one(c, `SELECT count(*) FROM compat_items WHERE ${where}`))[0]);

async function cellTransactions() {
  const { c, done } = await connect();
  await c.query('BEGIN');
  await c.query("INSERT INTO compat_items VALUES (1, 'committed')");
  await c.query('COMMIT');
  await c.query('BEGIN');
  await c.query("INSERT INTO compat_items VALUES (2, 'rolled back')");
  await c.query('ROLLBACK');
  const got = [await count(c, 'id IN (1, 2)'), await count(c, 'id = 1')];
  done();
  return got[0] === 1 && got[1] === 1 ? ['ok', ''] : ['fail', `rows ${got}`];
}

async function cellDenial() {
  if (mode === 'direct') return ['skip', 'not governed'];
  const { c, done } = await connect();
  await c.query('BEGIN');
  await c.query("INSERT INTO compat_items VALUES (3, 'before the denial')");
  let state;
  try {
    await c.query('INSERT INTO compat_denied VALUES (1)');
    return ['fail', 'the denied INSERT raised no error'];
  } catch (e) {
    state = e.code;
  }
  const commit = await c.query('COMMIT'); // must not commit the first INSERT
  const got = [await count(c, 'id = 3'), Number((await one(c, 'SELECT count(*) FROM compat_denied'))[0])];
  done();
  if (state !== '53400' || got[0] !== 0 || got[1] !== 0) return ['fail', `SQLSTATE ${state}, rows ${got}`];
  return ['ok', `53400; COMMIT answered ${commit.command} and committed nothing; the connection went on`];
}

async function cellCopy() {
  const { c, done } = await connect();
  await pipeline(Readable.from(['10\tten\n11\televen\n12\ttwelve\n']), c.query(copyFrom('COPY compat_items FROM STDIN')));
  let got = '';
  const out = c.query(copyTo('COPY (SELECT id FROM compat_items WHERE id >= 10 ORDER BY id) TO STDOUT'));
  for await (const chunk of out) got += chunk.toString();
  done();
  return got === '10\n11\n12\n' ? ['ok', 'FROM STDIN and TO STDOUT (pg-copy-streams)'] : ['fail', JSON.stringify(got)];
}

async function cellListen() {
  const listener = await connect();
  const heard = new Promise((resolve, reject) => {
    listener.c.on('notification', (n) => resolve(n.payload));
    setTimeout(() => reject(new Error('no notification')), WAIT).unref();
  });
  await listener.c.query('LISTEN compat_channel');
  const sender = await connect();
  await sender.c.query("NOTIFY compat_channel, 'hello'");
  sender.done();
  const payload = await heard;
  await listener.c.query('UNLISTEN compat_channel');
  listener.done();
  return payload === 'hello' ? ['ok', ''] : ['fail', `got ${payload}`];
}

// waitActive waits until backend pid runs pg_sleep, so that a cancel meets
// it. Another session's state gives no signal: it polls.
async function waitActive(watcher, pid) {
  const deadline = Date.now() + WAIT;
  while (Date.now() < deadline) {
    const [n] = await one(watcher, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'active' AND query LIKE 'SELECT pg_sleep%'", [pid]);
    if (Number(n) > 0) return true;
    await new Promise((r) => setTimeout(r, 10));
  }
  return false;
}

async function cellCancel() {
  const { c, done } = await connect();
  const [pid] = await one(c, 'SELECT pg_backend_pid()');
  const watcher = await connect();
  const q = new pg.Query('SELECT pg_sleep(60)');
  const ended = new Promise((resolve) => {
    q.on('error', (e) => resolve(e.code));
    q.on('end', () => resolve('finished'));
  });
  c.query(q);
  if (!(await waitActive(watcher.c, pid))) return ['fail', 'the query never showed as active'];
  watcher.done();
  // node-postgres cancels through another Client's connection to the same
  // server, with the target's process id and secret key.
  new pg.Client().cancel(c, q);
  const state = await ended;
  if (state !== '57014') return ['fail', `the query ended with ${state}`];
  const [after] = await one(c, 'SELECT 1');
  done();
  return after === 1 ? ['ok', '57014 (Client.prototype.cancel); the connection went on'] : ['fail', String(after)];
}

async function cellDisconnect() {
  const { c, done } = await connect();
  const errors = [];
  c.on('error', (e) => errors.push(e)); // a Client emits the server's FATAL when idle
  const [pid] = await one(c, 'SELECT pg_backend_pid()');
  const other = await connect();
  await one(other.c, 'SELECT pg_terminate_backend($1)', [pid]);
  other.done();
  let err;
  try {
    await one(c, 'SELECT 1');
  } catch (e) {
    err = e;
  }
  if (!err) return ['fail', 'the terminated connection still answered'];
  done(err);
  const again = await connect();
  const [n] = await one(again.c, 'SELECT 1');
  again.done();
  if (n !== 1) return ['fail', 'no new connection'];
  // Whether the error is the server's 57P01 or the closed socket depends on
  // which the client reads first: the cell does not say.
  return ['ok', how === 'pool' ? 'the next query fails; the Pool drops the client' : 'the next query fails; the Client is unusable'];
}

const cells = [
  ['connect', cellConnect],
  ['simple', cellSimple],
  ['prepared', cellPrepared],
  ['transactions', cellTransactions],
  ['denial', cellDenial],
  ['copy', cellCopy],
  ['listen', cellListen],
  ['cancel', cellCancel],
  ['disconnect', cellDisconnect],
];

(async () => {
  report('version', 'ok', `pg ${require('pg/package.json').version} (${how === 'pool' ? 'Pool' : 'Client'}, Node.js ${process.versions.node.split('.')[0]})`);
  for (const [name, fn] of cells) {
    try {
      const [result, detail] = await fn();
      report(name, result, detail);
    } catch (e) {
      report(name, 'fail', `${e.code || ''} ${e.message}`.trim());
    }
  }
  if (pool) await pool.end();
})();
