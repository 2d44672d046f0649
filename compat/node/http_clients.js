// The HTTP script of the compatibility matrix for Node.js:
// `node http_clients.js undici|undici-plain|builtin|axios`.
//
// compat/http_test.go runs it with HTTP_PROXY and HTTPS_PROXY pointing at
// governor-proxy and NODE_EXTRA_CA_CERTS naming the test origin's
// certificate. undici: fetch with undici's EnvHttpProxyAgent, which reads
// the proxy variables (undici-plain: with proxyTunnel: false). builtin: Node's own fetch with no setting but
// NODE_USE_ENV_PROXY=1 (honoured from Node 22.21 and 24.5). axios: its
// Node adapter, which reads the variables itself. COMPAT_HTTP_BASE and
// COMPAT_HTTPS_BASE are the origins. It prints one JSON object per cell:
// {"cell", "result": "ok" | "fail" | "unsupported" | "skip", "detail"}.
'use strict';

const { Readable } = require('node:stream');

const client = process.argv[2];
const HTTP = process.env.COMPAT_HTTP_BASE;
const HTTPS = process.env.COMPAT_HTTPS_BASE;
const TIMEOUT = 30000;
const UPLOAD = 1 << 20;

const report = (cell, result, detail = '') => console.log(JSON.stringify({ cell, result, detail }));

// A response as the cells need it: status, a header getter, and the body
// as lines read as they arrive.
let request;
let version;
if (client === 'axios') {
  const axios = require('axios');
  version = `axios ${require('axios/package.json').version}`;
  request = async (url, { method = 'GET', body, stream } = {}) => {
    const r = await axios({ url, method, data: body, timeout: TIMEOUT, validateStatus: () => true,
      responseType: stream ? 'stream' : 'text', transformResponse: (x) => x });
    return { status: r.status, header: (h) => r.headers[h.toLowerCase()], body: r.data, stream: r.data };
  };
} else {
  let fetchFn = globalThis.fetch;
  let opts = {};
  version = `Node.js ${process.versions.node.split('.')[0]} built-in fetch`;
  if (client.startsWith('undici')) {
    const undici = require('undici');
    fetchFn = undici.fetch;
    // proxyTunnel: false sends plain http:// requests as proxy requests
    // rather than through a CONNECT tunnel.
    opts = { dispatcher: new undici.EnvHttpProxyAgent(client === 'undici-plain' ? { proxyTunnel: false } : {}) };
    version = `undici ${require('undici/package.json').version} (Node.js ${process.versions.node.split('.')[0]})`;
  }
  request = async (url, { method = 'GET', body, stream } = {}) => {
    const init = { ...opts, method, signal: AbortSignal.timeout(TIMEOUT) };
    if (body) Object.assign(init, { body, duplex: 'half' });
    const r = await fetchFn(url, init);
    return { status: r.status, header: (h) => r.headers.get(h), body: stream ? null : await r.text(), stream: r.body };
  };
}

// An upload of unknown length: a stream, so no Content-Length.
const uploadBody = () => {
  const chunks = Array.from({ length: 16 }, () => Buffer.alloc(UPLOAD / 16, 'x'));
  if (client === 'axios') return Readable.from(chunks);
  return Readable.toWeb(Readable.from(chunks));
};

async function cellHTTP() {
  const r = await request(`${HTTP}/hello`);
  return r.status === 200 && r.body === 'hello' ? ['ok', ''] : ['fail', `${r.status} ${r.body}`];
}

async function cellHTTPS() {
  const r = await request(`${HTTPS}/secure`);
  return r.status === 200 && r.body === 'hello' ? ['ok', ''] : ['fail', `${r.status} ${r.body}`];
}

async function cellUpload() {
  const r = await request(`${HTTP}/upload`, { method: 'POST', body: uploadBody() });
  if (r.status !== 200 || r.body !== `received ${UPLOAD}`) return ['fail', `${r.status} ${r.body}`];
  return ['ok', `the origin got it ${r.header('Compat-Received-As')}`];
}

async function cellSSE() {
  const r = await request(`${HTTP}/sse?id=${client}`, { stream: true });
  const events = [];
  let buf = '';
  const decoder = new TextDecoder();
  for await (const chunk of r.stream) {
    buf += typeof chunk === 'string' ? chunk : decoder.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      if (!line.startsWith('data: ')) continue;
      events.push(line.slice(6));
      if (events.length === 1) await request(`${HTTP}/sse-ack?id=${client}`);
    }
    if (events.length >= 2) break;
  }
  if (r.stream.destroy) r.stream.destroy();
  return events.join(',') === 'one,two' ? ['ok', ''] : ['fail', `events ${events}`];
}

async function denial(url, status, cause) {
  let r;
  try {
    r = await request(url);
  } catch (e) {
    if (client === 'builtin') throw e; // went direct: see below
    // A denied CONNECT: undici throws instead of returning the response.
    const cause = e.cause ? ` (cause: "${e.cause.message}")` : '';
    const seen = `${e.message}${cause}`.includes(String(status)) ? 'the status is in the message' : 'neither the status nor Governor-Denied is seen';
    return ['error', `threw "${e.message}"${cause}; ${seen}`];
  }
  if (r.status !== status || r.header('Governor-Denied') !== cause) return ['fail', `${r.status} ${r.header('Governor-Denied')}`];
  let detail = `${status} ${cause}`;
  if (r.header('x-should-retry')) detail += `, x-should-retry: ${r.header('x-should-retry')}`;
  if (r.header('Retry-After')) detail += ', Retry-After';
  return ['ok', `${detail}; returned the response`];
}

async function tunnelDenial(url) {
  try {
    const r = await request(url);
    return ['ok', `returned ${r.status} ${r.header('Governor-Denied')}`];
  } catch (e) {
    if (client === 'builtin') throw e; // went direct: see below
    // The raw message: the test keeps what it shows.
    return ['error', `${e.message} ${e.cause ? e.cause.message : ''}`];
  }
}

const cells = [
  ['http', cellHTTP],
  ['https', cellHTTPS],
  ['chunked upload', cellUpload],
  ['sse', cellSSE],
  ['429', () => denial(process.env.COMPAT_QUOTA_URL, 429, 'quota')],
  ['503', () => denial(process.env.COMPAT_SLOW_URL, 503, 'wait-timeout')],
  ['429 on CONNECT', () => tunnelDenial(process.env.COMPAT_TUNNEL_URL)],
];

(async () => {
  report('version', 'ok', version);
  for (const [name, fn] of cells) {
    let result;
    try {
      result = await fn();
    } catch (e) {
      const code = e.code || (e.cause && e.cause.code) || '';
      // A fetch that ignores the proxy goes to origin.test itself, a name
      // only the proxy resolves.
      if (client === 'builtin' && ['ENOTFOUND', 'EAI_AGAIN'].includes(code)) {
        report(name, 'unsupported', 'ignores HTTP_PROXY: it went direct (NODE_USE_ENV_PROXY=1 needs Node.js 22.21 or 24.5)');
        continue;
      }
      result = ['fail', `${code} ${e.message}`.trim()];
    }
    report(name, ...result);
  }
})();
