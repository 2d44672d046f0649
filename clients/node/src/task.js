// Tasks and leases: the nodes work is charged to, and the slots it holds.

import { randomUUID } from 'node:crypto';
import { Code, GovernorError, invalid } from './errors.js';
import { msDuration, msTimestamp, timestampMs } from './time.js';

/**
 * int64 checks a 64-bit integer given as a number, a bigint or a decimal
 * string, and returns it in a form protobufjs takes without losing digits.
 */
export function int64(op, what, value) {
  if (typeof value === 'number' && Number.isSafeInteger(value)) return value;
  if (typeof value === 'bigint') return value.toString();
  if (typeof value === 'string' && /^-?\d{1,19}$/.test(value)) return value;
  throw invalid(op, `${what}: ${JSON.stringify(typeof value === 'bigint' ? value.toString() : value) ?? String(value)} is not a 64-bit integer`);
}

function caps(op, what, map) {
  if (map === undefined || map === null) return {};
  if (typeof map !== 'object' || Array.isArray(map)) throw invalid(op, `${what} must be an object such as { retry: 3 }`);
  const out = {};
  for (const [key, value] of Object.entries(map)) out[key] = int64(op, `${what}.${key}`, value);
  return out;
}

/**
 * taskRequest builds the CreateNodeRequest for spec under parentId, and
 * when the task's deadline falls (ms since the epoch, or 0 for none).
 */
export function taskRequest(op, parentId, spec) {
  if (spec === null || typeof spec !== 'object') throw invalid(op, 'spec must be an object such as { name: "checkout-42" }');
  const { name = `task-${randomUUID().slice(0, 12)}`, deadlineMs, quotas, limits, defaultQuotas, defaultLimits, priority } = spec;
  if (typeof name !== 'string' || name === '') throw invalid(op, 'name must be a non-empty string');
  const nodeSpec = {
    name,
    quotas: caps(op, 'quotas', quotas),
    limits: caps(op, 'limits', limits),
    defaultQuotas: caps(op, 'defaultQuotas', defaultQuotas),
    defaultLimits: caps(op, 'defaultLimits', defaultLimits),
  };
  if (priority !== undefined) nodeSpec.priority = int64(op, 'priority', priority);
  let deadlineAt = 0;
  if (deadlineMs !== undefined && deadlineMs !== null) {
    if (typeof deadlineMs !== 'number' || !Number.isFinite(deadlineMs) || deadlineMs < 0) {
      throw invalid(op, `deadlineMs ${JSON.stringify(deadlineMs)}: want milliseconds from now`);
    }
    deadlineAt = Date.now() + deadlineMs;
    nodeSpec.deadline = msTimestamp(deadlineAt);
  }
  return { request: { parentId, spec: nodeSpec }, deadlineAt };
}

/**
 * Task is a node of the tree that work is charged to: a task under the
 * session's tenant, or a subtask under another task.
 */
export class Task {
  constructor(session, node, deadlineAt, parent) {
    this._session = session;
    this.id = node.id;
    this.name = node.name;
    this._parent = parent;
    this._deadlineAt = deadlineAt || timestampMs(node.deadline);
    this._ended = null; // why the task ended, once this client knows
  }

  /**
   * _alive throws, without asking governord, when the task or an ancestor
   * is known to have ended or has passed its deadline.
   */
  _alive(op) {
    const now = Date.now();
    for (let t = this; t; t = t._parent) {
      const ended = t._ended ?? (t._deadlineAt && now >= t._deadlineAt ? { nodeId: t.id, nodeName: t.name, state: 'EXPIRED' } : null);
      if (ended) {
        throw new GovernorError(Code.FAILED_PRECONDITION,
          `governor: ${op}: task ended: ${JSON.stringify(ended.nodeName)} (node ${ended.nodeId}) is ${ended.state.toLowerCase()}`,
          { op, nodeEnded: ended });
      }
    }
  }

  /** _observe notes that the server said this task or an ancestor ended. */
  _observe(err) {
    const ended = err?.nodeEnded;
    if (!ended) return;
    let target = this;
    for (let t = this; t; t = t._parent) {
      target = t;
      if (t.id === ended.nodeId) break;
    }
    target._ended ??= ended;
  }

  async _run(op, method, request, options) {
    this._alive(op);
    try {
      return await this._session._call(op, method, request, options);
    } catch (err) {
      this._observe(err);
      throw err;
    }
  }

  /**
   * consume charges amount (default 1) of resource to the task and every
   * ancestor, all or none. A spent quota throws a GovernorError with denied
   * set and the denial's details.
   */
  async consume(resource, amount = 1) {
    if (typeof resource !== 'string' || resource === '') throw invalid('consume', 'resource must be a non-empty string');
    await this._run('consume', 'Consume', { nodeId: this.id, resource, amount: int64('consume', 'amount', amount) });
  }

  /**
   * acquire waits for a lease of cls on the task. options.signal (an
   * AbortSignal) withdraws the wait; a lease granted at that instant is
   * given back.
   */
  async acquire(cls, options = {}) {
    if (typeof cls !== 'string' || cls === '') throw invalid('acquire', 'class must be a non-empty string');
    const lease = await this._run('acquire', 'Acquire', { nodeId: this.id, class: cls }, { signal: options.signal });
    return new Lease(this._session, lease);
  }

  /**
   * chargeAndAcquire charges quotas and takes a lease of cls in one step: the
   * charges apply when the lease is granted, or not at all. With cls empty it
   * only charges and resolves to null. A rate that refuses the charges
   * rejects with rateLimited at once, unless options.waitForRate: then the
   * charge waits for the rate at governord (tenants taking turns by weight)
   * until options.signal aborts.
   */
  async chargeAndAcquire(cls, charges, options = {}) {
    if (typeof cls !== 'string') throw invalid('chargeAndAcquire', 'class must be a string');
    if (options.waitForRate !== undefined && typeof options.waitForRate !== 'boolean') {
      throw invalid('chargeAndAcquire', 'waitForRate must be a boolean');
    }
    const res = await this._run('chargeAndAcquire', 'ChargeAndAcquire',
      { nodeId: this.id, class: cls, charges: caps('chargeAndAcquire', 'charges', charges), waitForRate: options.waitForRate === true },
      { signal: options.signal });
    return res.lease ? new Lease(this._session, res.lease) : null;
  }

  /** newTask creates a subtask of this task; spec is as session.newTask's. */
  async newTask(spec = {}) {
    this._alive('newTask');
    const { request, deadlineAt } = taskRequest('newTask', this.id, spec);
    const node = await this._run('newTask', 'CreateNode', request);
    return new Task(this._session, node, deadlineAt, this);
  }

  /**
   * close ends the task and its subtasks normally: their leases are revoked
   * and their waiting acquires fail. Closing an ended task is not an error.
   */
  close() {
    return this._finish('close', 'CloseNode', 'CLOSED');
  }

  /** cancel ends the task abnormally; otherwise it is close. */
  cancel() {
    return this._finish('cancel', 'CancelNode', 'CANCELLED');
  }

  async _finish(op, method, state) {
    if (this._finished) return;
    try {
      await this._session._call(op, method, { nodeId: this.id }, { timeoutMs: 10_000 });
      this._finished = true;
    } finally {
      this._ended ??= { nodeId: this.id, nodeName: this.name, state };
    }
  }
}

/**
 * Lease is a slot of a class held on a task. Its id only grows from lease to
 * lease, so it is also a fencing token.
 */
export class Lease {
  constructor(session, lease) {
    this._session = session;
    this.id = lease.id;
    this.nodeId = lease.nodeId;
    this.class = lease.class;
  }

  /**
   * release frees the slot and reports how the call went: latencyMs and
   * overloaded drive adaptive limits. A second release is a no-op; one after
   * the lease expired or was revoked throws FAILED_PRECONDITION.
   */
  async release({ latencyMs = 0, overloaded = false } = {}) {
    if (typeof latencyMs !== 'number' || !Number.isFinite(latencyMs) || latencyMs < 0) {
      throw invalid('release', `latencyMs ${JSON.stringify(latencyMs)}: want milliseconds, 0 for no sample`);
    }
    const request = { leaseId: this.id, overloaded: Boolean(overloaded) };
    if (latencyMs > 0) request.latency = msDuration(latencyMs);
    await this._session._call('release', 'Release', request);
  }

  /** validate throws unless governord still holds the lease. */
  async validate() {
    await this._session._call('validate', 'Validate', { leaseId: this.id });
  }
}
