// env-proxy.cjs has Node's built-in fetch, which the openai and
// @anthropic-ai/sdk packages call, send its requests through HTTP_PROXY and
// HTTPS_PROXY (NO_PROXY excepted): Node 20 ignores them, and Node 22.21 and
// 24.5 honour them only with NODE_USE_ENV_PROXY=1. It is preloaded without a
// change to the program, by its environment alone:
//
//	NODE_OPTIONS=--require=/path/to/env-proxy.cjs
//
// undici's EnvHttpProxyAgent becomes the global dispatcher, which the
// built-in fetch reads on each call. Use an undici of the same major
// version as the one Node bundles (process.versions.undici): 6 for Node 20
// and 22.
'use strict';
const { EnvHttpProxyAgent, setGlobalDispatcher } = require('undici');

setGlobalDispatcher(new EnvHttpProxyAgent());
