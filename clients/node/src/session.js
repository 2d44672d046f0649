// The session with governord: opening it, keeping it alive, and making calls
// through it with the Go SDK's retry rules.
//
// Rules, as in the Go SDK (governor/client.go):
//   - Heartbeats go out three times per TTL (the interval the server gives).
//   - The session is given up at 80% of the TTL after the last heartbeat that
//     succeeded, measured from when that heartbeat was sent. From then on
//     every call fails at once and the calls in flight are cut off.
//   - A call that meets UNAVAILABLE is tried again with the same request id,
//     with backoff, until it is answered or the session is given up, so a
//     lost reply never charges twice.
//   - A call the server cancelled while the caller still waits did nothing,
//     so it is tried again under a new id, at most three times.
//   - UNAUTHENTICATED means the server forgot the session: it is given up.
//   - A grant (Acquire, ChargeAndAcquire, ResizeBlock, Reserve) whose caller
//     gave up before the answer came is abandoned: the same request is sent
//     again with abandon set, so governord gives back what it granted.

import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import * as grpc from '@grpc/grpc-js';
import { resolveConfig } from './config.js';
import { Code, GovernorError, fromGrpc, invalid } from './errors.js';
import { protocol } from './proto.js';
import { Task, taskRequest } from './task.js';
import { durationMs, msDuration } from './time.js';

const LOCAL_DEADLINE_SHARE = 0.8;
const RETRY_BASE_MS = 25;
const RETRY_MAX_MS = 1000;
const SERVER_CANCEL_RETRIES = 3;
// Bounds the close of a session or task and an abandon, so that a hung
// governord cannot hang a shutdown.
const CLEANUP_TIMEOUT_MS = 10_000;
const GRANTING = new Set(['Acquire', 'ChargeAndAcquire', 'ResizeBlock', 'Reserve']);
// grpc-js's own retries are off: this client retries by the rules above,
// under one request id. Channelz bookkeeping is off: it costs about a
// quarter of a call's time, and nothing here reads it.
const CHANNEL_DEFAULTS = { 'grpc.enable_retries': 0, 'grpc.enable_channelz': 0 };

/** backoff is a jittered exponential delay for attempt try (0-based). */
export function backoff(baseMs, maxMs, attempt) {
  const ceiling = Math.min(maxMs, baseMs * 2 ** Math.min(attempt, 30));
  return ceiling / 2 + Math.random() * (ceiling / 2);
}

/**
 * connect opens a session with governord as the tenant whose API key it
 * uses, and keeps it alive until close(). See README.md, "Connecting".
 */
export async function connect(options = {}) {
  const cfg = resolveConfig(options);
  const { Governor } = protocol();
  const creds = cfg.tls ? grpc.credentials.createSsl(cfg.rootCerts) : grpc.credentials.createInsecure();
  const channelOptions = { ...CHANNEL_DEFAULTS, ...cfg.channelOptions };
  if (cfg.interceptors.length > 0) channelOptions.interceptors = cfg.interceptors;
  const client = new Governor(cfg.addr, creds, channelOptions);
  const session = new Session(client, cfg);
  try {
    await session._open(cfg);
  } catch (err) {
    client.close();
    throw err;
  }
  return session;
}

/** sleep waits ms, or rejects with stop's reason when stop settles first. */
function sleep(ms, stops) {
  return new Promise((resolve, reject) => {
    const t = setTimeout(done, ms);
    const cleanups = [];
    function done() {
      cleanups.forEach((c) => c());
      resolve();
    }
    for (const { signal, reason } of stops) {
      if (!signal) continue;
      if (signal.aborted) {
        clearTimeout(t);
        reject(reason());
        return;
      }
      const onAbort = () => {
        clearTimeout(t);
        cleanups.forEach((c) => c());
        reject(reason());
      };
      signal.addEventListener('abort', onAbort, { once: true });
      cleanups.push(() => signal.removeEventListener('abort', onAbort));
    }
  });
}

/** Session is one session with governord. Use connect() to open one. */
export class Session {
  constructor(client, cfg) {
    this._client = client;
    this._channel = client.getChannel();
    this._viaClient = cfg.interceptors.length > 0;
    this._addr = cfg.addr;
    this._token = '';
    this._bearer = '';
    this.scopeId = '0';
    this.ttlMs = 0;
    this._everyMs = 0;
    this._expiresAt = 0; // performance.now() at which the session is given up
    this._inflight = new Set();
    this._life = new AbortController(); // aborted, with the reason, when the session ends
    this._closing = null;
    this._heartbeatTimer = null;
    this._watchdog = null;
    this._heartbeatFailures = 0;
    let resolveDone;
    this.done = new Promise((r) => { resolveDone = r; });
    this._resolveDone = resolveDone;
  }

  /** The session's local deadline, in performance.now() milliseconds. */
  get expiresAt() {
    return this._expiresAt;
  }

  /** Why the session ended (a GovernorError), or null while it is alive. */
  get error() {
    return this._life.signal.aborted ? this._life.signal.reason : null;
  }

  async _open(cfg) {
    const started = performance.now();
    const request = { apiKey: cfg.apiKey };
    if (cfg.ttlMs > 0) request.ttl = msDuration(cfg.ttlMs);
    for (let attempt = 0; ; attempt++) {
      const sent = performance.now();
      const left = cfg.dialTimeoutMs - (sent - started);
      try {
        const res = await this._invoke('OpenSession', request, { deadline: new Date(Date.now() + left), noToken: true });
        this._token = res.sessionToken;
        this._bearer = `Bearer ${res.sessionToken}`;
        this.scopeId = res.scopeNodeId;
        this.ttlMs = durationMs(res.ttl);
        this._everyMs = durationMs(res.heartbeatInterval);
        if (!this._token || this.scopeId === '0' || this.ttlMs <= 0) {
          throw new GovernorError(Code.INTERNAL, `governor: connect: governord at ${cfg.addr} sent no token, scope or TTL`, { op: 'connect' });
        }
        if (this._everyMs <= 0 || this._everyMs > this.ttlMs / 2) this._everyMs = this.ttlMs / 3;
        // OpenSession counts as the first heartbeat.
        this._expiresAt = sent + this.ttlMs * LOCAL_DEADLINE_SHARE;
        this._armWatchdog();
        this._scheduleHeartbeat(this._everyMs);
        return;
      } catch (err) {
        if (err instanceof GovernorError) throw err;
        const spent = performance.now() - started >= cfg.dialTimeoutMs;
        // The dial timeout is the only deadline an attempt has.
        if (err.code === Code.DEADLINE_EXCEEDED || (spent && err.code === Code.UNAVAILABLE)) {
          throw new GovernorError(Code.UNAVAILABLE,
            `governor: connect: governord at ${cfg.addr} not reachable within ${cfg.dialTimeoutMs} ms (last attempt: ${err.details || err.message})`,
            { op: 'connect', cause: err });
        }
        if (err.code !== Code.UNAVAILABLE) {
          const e = fromGrpc('connect', err);
          e.message += ` (governord at ${cfg.addr})`;
          throw e;
        }
        await sleep(Math.min(backoff(RETRY_BASE_MS, RETRY_MAX_MS, attempt), Math.max(0, cfg.dialTimeoutMs - (performance.now() - started))), []);
      }
    }
  }

  // ---- Keeping the session alive ----

  _scheduleHeartbeat(ms) {
    this._heartbeatTimer = setTimeout(() => this._heartbeat(), ms);
    // The session does not keep the process alive by itself; a process
    // that ends without close() has its leases freed after one TTL.
    this._heartbeatTimer.unref();
  }

  async _heartbeat() {
    if (this.error) return;
    const sent = performance.now();
    // A reply after the local deadline is useless: the session is given up.
    const deadline = new Date(Date.now() + Math.max(1, this._expiresAt - sent));
    try {
      const res = await this._invoke('Heartbeat', {}, { deadline });
      const ttl = durationMs(res.ttl) || this.ttlMs;
      this._extend(sent + ttl * LOCAL_DEADLINE_SHARE);
      this._heartbeatFailures = 0;
      if (!this.error) this._scheduleHeartbeat(this._everyMs);
    } catch (err) {
      if (this.error) return;
      if (err.code === Code.UNAUTHENTICATED) {
        this._end(forgotten(err));
        return;
      }
      this._heartbeatFailures++;
      this._scheduleHeartbeat(backoff(this._everyMs / 8, this._everyMs, this._heartbeatFailures - 1));
    }
  }

  _extend(expiresAt) {
    if (this.error || expiresAt <= this._expiresAt) return;
    this._expiresAt = expiresAt;
    // The watchdog rearms itself when it fires early; no need to reset it.
  }

  _armWatchdog() {
    this._watchdog = setTimeout(() => this._checkDeadline(), Math.max(0, this._expiresAt - performance.now()));
    this._watchdog.unref();
  }

  _checkDeadline() {
    if (this.error) return;
    if (performance.now() < this._expiresAt) {
      this._armWatchdog(); // extended since it was armed
      return;
    }
    this._end(new GovernorError(Code.UNAVAILABLE,
      `governor: session lost: no heartbeat succeeded in time (local deadline: ${LOCAL_DEADLINE_SHARE * 100}% of the ${this.ttlMs} ms TTL after the last good one was sent)`,
      { op: 'Heartbeat', sessionLost: true }));
  }

  /** _end ends the session locally: timers stop, calls in flight are cut off. */
  _end(reason) {
    if (this.error) return;
    this._life.abort(reason);
    clearTimeout(this._heartbeatTimer);
    clearTimeout(this._watchdog);
    for (const call of this._inflight) call.cancel();
    this._inflight.clear();
    this._resolveDone(reason);
  }

  // ---- Calls ----

  /**
   * _invoke makes one attempt of method, with the session token unless
   * noToken, and rejects with a grpc-js style error ({ code, details,
   * metadata }) on failure.
   *
   * It goes straight to the grpc-js channel, as the generated client does
   * underneath, with the messages encoded from the same governor.proto:
   * grpc-js's client layer (interceptor chain, async-context binding, a
   * call object per call) took about 40% of a call's CPU. With interceptors
   * configured, calls go through the client so that they run.
   */
  _invoke(method, request, { deadline, signal, noToken = false } = {}) {
    if (this._viaClient) return this._invokeClient(method, request, { deadline, signal, noToken });
    const m = protocol().methods.get(method);
    return new Promise((resolve, reject) => {
      let bytes;
      try {
        bytes = m.encode(request);
      } catch (err) {
        reject({ code: Code.INVALID_ARGUMENT, details: `bad ${method} request: ${err.message}` });
        return;
      }
      const md = new grpc.Metadata();
      if (!noToken) md.set('authorization', this._bearer);
      const call = this._channel.createCall(m.path, deadline ?? Infinity, undefined, null, 0);
      const entry = { cancel: () => call.cancelWithStatus(Code.CANCELLED, 'Cancelled on client') };
      let reply;
      let onAbort;
      call.start(md, {
        onReceiveMetadata() {},
        onReceiveMessage(message) {
          reply = message;
        },
        onReceiveStatus: (st) => {
          this._inflight.delete(entry);
          if (onAbort) signal.removeEventListener('abort', onAbort);
          if (st.code !== Code.OK) {
            reject(st);
            return;
          }
          try {
            resolve(m.decode(reply ?? Buffer.alloc(0)));
          } catch (err) {
            reject({ code: Code.INTERNAL, details: `undecodable ${method} response: ${err.message}`, metadata: st.metadata });
          }
        },
      });
      this._inflight.add(entry);
      if (signal) {
        onAbort = entry.cancel;
        signal.addEventListener('abort', onAbort, { once: true });
      }
      call.sendMessageWithContext({}, bytes);
      call.halfClose();
      call.startRead();
    });
  }

  /** _invokeClient is _invoke through the generated grpc-js client. */
  _invokeClient(method, request, { deadline, signal, noToken }) {
    return new Promise((resolve, reject) => {
      const md = new grpc.Metadata();
      if (!noToken) md.set('authorization', this._bearer);
      let onAbort;
      const call = this._client[method](request, md, deadline ? { deadline } : {}, (err, res) => {
        this._inflight.delete(call);
        if (onAbort) signal.removeEventListener('abort', onAbort);
        if (err) reject(err);
        else resolve(res);
      });
      this._inflight.add(call);
      if (signal) {
        onAbort = () => call.cancel();
        signal.addEventListener('abort', onAbort, { once: true });
      }
    });
  }

  _ended(op, last) {
    const reason = this.error;
    const fields = { op, sessionLost: true, cause: last ?? reason };
    return new GovernorError(reason.code, `governor: ${op}: ${reason.message.replace(/^governor: /, '')}`, fields);
  }

  /**
   * _call runs method until it succeeds or fails for good, under the retry
   * rules at the top of this file. signal (an AbortSignal) withdraws it;
   * timeoutMs bounds it.
   */
  async _call(op, method, request, { signal, timeoutMs } = {}) {
    const info = protocol().methods.get(method);
    if (!info) throw invalid(op, `governor.proto has no method ${JSON.stringify(method)}`);
    if (info.stream) throw invalid(op, `${method} is a streaming call; session.rpc makes unary calls only`);
    let req = request;
    if (info.takesRequestId && !req.requestId) req = { ...req, requestId: randomUUID() };
    const deadline = timeoutMs === undefined ? undefined : new Date(Date.now() + timeoutMs);
    let last;
    const stops = [
      { signal: this._life.signal, reason: () => this._ended(op, last) },
      { signal, reason: () => aborted(op, signal) },
    ];
    let cancels = 0;
    let unanswered = false; // an attempt under req.requestId may have been applied unseen
    for (let attempt = 0; ; attempt++) {
      if (this.error) throw this._ended(op, last);
      if (signal?.aborted) throw aborted(op, signal);
      try {
        return await this._invoke(method, req, { deadline, signal });
      } catch (err) {
        if (this.error) throw this._ended(op, last ?? err); // what it held ends with the session
        const code = err.code;
        if (signal?.aborted || (deadline && Date.now() >= deadline.getTime())) {
          if (code === Code.CANCELLED || code === Code.DEADLINE_EXCEEDED || code === Code.UNAVAILABLE) unanswered = true;
          if (unanswered && GRANTING.has(method)) await this._abandon(method, req);
          throw signal?.aborted ? aborted(op, signal) : fromGrpc(op, err);
        }
        if (code === Code.UNAVAILABLE) {
          unanswered = true;
          last = err;
        } else if (code === Code.CANCELLED || code === Code.DEADLINE_EXCEEDED) {
          // governord's own answer: nothing was done under this id.
          if (++cancels > SERVER_CANCEL_RETRIES) throw fromGrpc(op, err);
          last = err;
          if (info.takesRequestId) req = { ...req, requestId: randomUUID() };
        } else if (code === Code.UNAUTHENTICATED && !this._closing) {
          const e = fromGrpc(op, err);
          this._end(forgotten(err));
          throw e;
        } else {
          throw fromGrpc(op, err);
        }
      }
      try {
        await sleep(backoff(RETRY_BASE_MS, RETRY_MAX_MS, attempt), stops);
      } catch (stopped) {
        if (!this.error && unanswered && GRANTING.has(method)) await this._abandon(method, req);
        throw stopped;
      }
    }
  }

  /**
   * _abandon sends req again with abandon set, so that governord gives back
   * what the unanswered attempt granted, trying while governord is
   * unavailable, for at most CLEANUP_TIMEOUT_MS.
   */
  async _abandon(method, req) {
    const until = performance.now() + CLEANUP_TIMEOUT_MS;
    for (let attempt = 0; !this.error && performance.now() < until; attempt++) {
      try {
        await this._invoke(method, { ...req, abandon: true }, { deadline: new Date(Date.now() + CLEANUP_TIMEOUT_MS) });
        return;
      } catch (err) {
        if (this.error || err.code !== Code.UNAVAILABLE) return; // the session's end gives it all back
      }
      await sleep(backoff(RETRY_BASE_MS, RETRY_MAX_MS, attempt), [{ signal: this._life.signal, reason: () => null }]).catch(() => {});
    }
  }

  // ---- The API ----

  /**
   * newTask creates a task under the session's tenant. deadlineMs ends it
   * that long after now; quotas and limits are its own caps.
   */
  async newTask(spec = {}) {
    const { request, deadlineAt } = taskRequest('newTask', this.scopeId, spec);
    const node = await this._call('newTask', 'CreateNode', request);
    return new Task(this, node, deadlineAt, null);
  }

  /**
   * rpc calls any unary method of governor.proto as this session. Requests
   * and responses use the proto's field names in camelCase, with 64-bit
   * integers as strings. A method that takes a request id gets a fresh one
   * unless the request carries one; retries reuse it.
   */
  rpc(method, request = {}, options = {}) {
    if (typeof method !== 'string') return Promise.reject(invalid('rpc', 'method must be a string, such as "GetNode"'));
    if (method === 'OpenSession') return Promise.reject(invalid('rpc', 'OpenSession opens a new session; use connect()'));
    return this._call(method, method, request ?? {}, options);
  }

  /**
   * close ends the session at governord, which frees every lease it holds,
   * and closes the connection. Calling it again returns the first result.
   */
  close() {
    this._closing ??= (async () => {
      let failure = null;
      if (!this.error) {
        const timeoutMs = Math.max(1, Math.min(CLEANUP_TIMEOUT_MS, this._expiresAt - performance.now()));
        try {
          await this._call('close', 'CloseSession', {}, { timeoutMs });
        } catch (err) {
          // UNAUTHENTICATED: the session is already gone, which is what close wants.
          if (err.code !== Code.UNAUTHENTICATED) failure = err;
        }
      }
      this._end(new GovernorError(Code.CANCELLED, 'governor: session closed', { op: 'close', sessionLost: true }));
      this._client.close();
      if (failure) throw failure;
    })();
    return this._closing;
  }
}

function aborted(op, signal) {
  return new GovernorError(Code.CANCELLED, `governor: ${op}: aborted${signal.reason?.message ? `: ${signal.reason.message}` : ''}`,
    { op, cause: signal.reason });
}

function forgotten(err) {
  return new GovernorError(Code.UNAUTHENTICATED, `governor: session lost: governord no longer knows it (${err.details || err.message})`,
    { op: 'Heartbeat', sessionLost: true, cause: err });
}
