// The intercepted-HTTPS script of the compatibility matrix for Node.js:
// `node intercept.js undici|axios`.
//
// compat/intercept_test.go runs it with HTTPS_PROXY pointing at
// governor-proxy, which intercepts COMPAT_INTERCEPT_URL's host, and
// NODE_EXTRA_CA_CERTS naming the sidecar's CA. undici: fetch with one
// EnvHttpProxyAgent, which reads the proxy variables. axios: its Node
// adapter, which reads them itself. It sends six GETs with one client and
// prints one JSON object per cell, {"cell", "result", "detail"}:
// statuses (the six; "error": what was thrown), denied (the sixth's
// Governor-Denied) and protocol.
'use strict';

const client = process.argv[2];
const URL_ = process.env.COMPAT_INTERCEPT_URL;
const report = (cell, result, detail = '') => console.log(JSON.stringify({ cell, result, detail }));

let get;
if (client === 'axios') {
  const axios = require('axios');
  report('version', 'ok', `axios ${require('axios/package.json').version} (Node.js ${process.versions.node.split('.')[0]})`);
  get = async (url) => {
    const r = await axios.get(url, { timeout: 30000, validateStatus: () => true, responseType: 'text', transformResponse: (x) => x });
    return { status: r.status, header: (h) => r.headers[h.toLowerCase()] ?? '', body: r.data,
      protocol: `HTTP/${r.request?.res?.httpVersion ?? '?'}` };
  };
} else {
  const undici = require('undici');
  report('version', 'ok', `undici ${require('undici/package.json').version} (Node.js ${process.versions.node.split('.')[0]})`);
  const dispatcher = new undici.EnvHttpProxyAgent();
  get = async (url) => {
    const r = await undici.fetch(url, { dispatcher, signal: AbortSignal.timeout(30000) });
    // fetch does not say which version it spoke; undici 6 speaks HTTP/2
    // only when allowH2 is set, and it is not.
    return { status: r.status, header: (h) => r.headers.get(h) ?? '', body: await r.text(), protocol: 'HTTP/1.1' };
  };
}

(async () => {
  const statuses = [];
  let ok = true;
  let last;
  try {
    for (let i = 0; i < 6; i++) {
      last = await get(URL_);
      statuses.push(String(last.status));
      if (last.status === 200 && last.body !== 'hello') ok = false;
    }
  } catch (e) {
    const cause = e.cause ? ` (cause: ${e.cause.code || ''} ${e.cause.message})` : '';
    report('statuses', 'error', `${e.message}${cause}`);
    return;
  }
  report('statuses', ok ? 'ok' : 'fail', statuses.join(' '));
  report('denied', 'ok', last.header('Governor-Denied'));
  report('protocol', 'ok', last.protocol);
})();
