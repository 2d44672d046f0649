// Options for connect, read from the environment every Governor client
// reads (GOVERNOR_ADDR, GOVERNOR_API_KEY, GOVERNOR_TLS, GOVERNOR_CA_FILE),
// with the caller's options over them.

import { readFileSync } from 'node:fs';
import { isIP } from 'node:net';
import { Code, GovernorError, invalid } from './errors.js';

export const DEFAULT_ADDR = '127.0.0.1:7600';
export const DEFAULT_TTL_MS = 10_000;
export const DEFAULT_DIAL_TIMEOUT_MS = 10_000;

/** parseBool reads GOVERNOR_TLS strictly: a typo must not mean plaintext. */
function parseTLS(value) {
  switch (value) {
    case 'true': case '1': return true;
    case 'false': case '0': return false;
  }
  throw invalid('connect', `GOVERNOR_TLS=${JSON.stringify(value)}: want true, false, 1 or 0`);
}

/** hostOf returns the host part of host:port or [v6]:port, or throws. */
function hostOf(addr) {
  const m = /^\[([^\]]+)\]:(\d+)$/.exec(addr) ?? /^([^:[\]]+):(\d+)$/.exec(addr);
  if (!m || Number(m[2]) > 65535) {
    throw invalid('connect', `address ${JSON.stringify(addr)}: want host:port`);
  }
  return m[1];
}

/**
 * resolveConfig merges options over the environment and checks them. It
 * reads the CA file, so a missing or empty one fails here, at connect.
 */
export function resolveConfig(options = {}, env = process.env) {
  const cfg = {
    addr: options.addr ?? (env.GOVERNOR_ADDR || DEFAULT_ADDR),
    apiKey: options.apiKey ?? env.GOVERNOR_API_KEY ?? '',
    tls: false,
    caFile: options.caFile ?? (env.GOVERNOR_CA_FILE || ''),
    ttlMs: options.ttlMs ?? DEFAULT_TTL_MS,
    dialTimeoutMs: options.dialTimeoutMs ?? DEFAULT_DIAL_TIMEOUT_MS,
    channelOptions: options.channelOptions ?? {},
    interceptors: options.interceptors ?? [],
    rootCerts: null,
  };
  if (env.GOVERNOR_TLS !== undefined && env.GOVERNOR_TLS !== '') cfg.tls = parseTLS(env.GOVERNOR_TLS);
  if (options.tls !== undefined) {
    if (typeof options.tls !== 'boolean') throw invalid('connect', `tls must be true or false, not ${JSON.stringify(options.tls)}`);
    cfg.tls = options.tls;
  }
  if (cfg.addr.includes(',')) {
    // A list names governord's standbys; following the leader among them
    // comes with governord's standby support (issue 14).
    throw invalid('connect', `address ${JSON.stringify(cfg.addr)} is a list; this client connects to one governord, ` +
      'following a leader among standbys is not supported yet');
  }
  const host = hostOf(cfg.addr);
  if (!cfg.apiKey) {
    throw new GovernorError(Code.UNAUTHENTICATED, 'governor: connect: no API key (set apiKey or GOVERNOR_API_KEY)', { op: 'connect' });
  }
  if (!Number.isFinite(cfg.ttlMs) || cfg.ttlMs < 0) throw invalid('connect', `ttlMs ${cfg.ttlMs}: want a duration in milliseconds, 0 for the server's default`);
  if (!Number.isFinite(cfg.dialTimeoutMs) || cfg.dialTimeoutMs <= 0) throw invalid('connect', `dialTimeoutMs ${cfg.dialTimeoutMs}: want a positive number`);
  if (cfg.caFile) {
    // A CA file always means TLS: it is never dropped in favour of plaintext.
    cfg.tls = true;
    let pem;
    try {
      pem = readFileSync(cfg.caFile);
    } catch (err) {
      throw invalid('connect', `caFile ${JSON.stringify(cfg.caFile)}: ${err.message}`);
    }
    if (!pem.includes('-----BEGIN CERTIFICATE-----')) {
      throw invalid('connect', `caFile ${JSON.stringify(cfg.caFile)} holds no PEM certificate`);
    }
    cfg.rootCerts = pem;
  }
  if (cfg.tls && isIP(host)) {
    throw invalid('connect', `with TLS, give governord's address as a host name its certificate names (such as localhost:7600), not the IP address ${host}`);
  }
  return cfg;
}
