// GovernorError: every failure this package reports.

import { status as Status } from '@grpc/grpc-js';
import { statusDetails } from './proto.js';
import { timestampMs } from './time.js';

/** The gRPC status codes, by name, as numbers (err.code is one of them). */
export const Code = Object.freeze({
  OK: 0,
  CANCELLED: 1,
  UNKNOWN: 2,
  INVALID_ARGUMENT: 3,
  DEADLINE_EXCEEDED: 4,
  NOT_FOUND: 5,
  ALREADY_EXISTS: 6,
  PERMISSION_DENIED: 7,
  RESOURCE_EXHAUSTED: 8,
  FAILED_PRECONDITION: 9,
  ABORTED: 10,
  OUT_OF_RANGE: 11,
  UNIMPLEMENTED: 12,
  INTERNAL: 13,
  UNAVAILABLE: 14,
  DATA_LOSS: 15,
  UNAUTHENTICATED: 16,
});

const codeNames = Object.fromEntries(Object.entries(Code).map(([k, v]) => [v, k]));

/**
 * GovernorError is a failed call: the gRPC status code in code (a number,
 * codeName spells it), the reason in message, and what the server explained
 * as fields. denied is true when a quota refused the call (the budget is
 * spent: retrying will not help); the denial's cap, node, used/limit and
 * largest consumer are then fields of the error, and resetAtMs when the
 * quota has a period (when it resets: waiting until then helps). rateLimited is true when
 * a rate refused it instead (retryable: nothing was charged): the rate's
 * resource, node, level (units in its bucket), amount and retryAfterMs
 * (how long until the bucket holds the amount) are then fields.
 * causeName is why governord refused work, as the sidecar's
 * Governor-Denied header names it ('quota', 'rate', 'task-ended',
 * 'suspended', 'read-only', 'bound'), '' for a failure that refused
 * nothing. (err.cause stays the underlying error, as everywhere in
 * JavaScript.) 64-bit ids are strings, amounts are numbers.
 */
export class GovernorError extends Error {
  constructor(code, message, fields = {}) {
    super(message, fields.cause === undefined ? undefined : { cause: fields.cause });
    this.name = 'GovernorError';
    this.code = code;
    this.codeName = codeNames[code] ?? `CODE_${code}`;
    this.op = fields.op ?? '';
    this.rateLimited = Boolean(fields.rateLimited);
    this.denied = code === Code.RESOURCE_EXHAUSTED && !this.rateLimited;
    // Set when the session ended: the client gave it up at its local
    // deadline, the server forgot it, or it was closed. Nothing more is
    // admitted through it; connect again.
    this.sessionLost = Boolean(fields.sessionLost);
    this.causeName = fields.causeName ?? '';
    for (const key of ['resource', 'nodeId', 'nodeName', 'used', 'limit', 'amount',
      'largestConsumerId', 'largestConsumerName', 'largestConsumerUsed', 'resetAtMs', 'nodeEnded', 'leaseEnded', 'level', 'retryAfterMs']) {
      if (fields[key] !== undefined) this[key] = fields[key];
    }
  }
}

/**
 * fromGrpc turns a grpc-js error into a GovernorError for the call op,
 * decoding the details governord attaches (Denial, NodeEnded, LeaseEnded).
 */
export function fromGrpc(op, err) {
  if (err instanceof GovernorError) return err;
  const code = typeof err?.code === 'number' ? err.code : Code.UNKNOWN;
  const reason = err?.details || err?.message || String(err);
  const details = statusDetails(err?.metadata);
  const fields = { op, cause: err };
  const denial = details.Denial;
  if (code === Status.RESOURCE_EXHAUSTED && denial) {
    Object.assign(fields, {
      resource: denial.resource,
      nodeId: denial.nodeId,
      nodeName: denial.nodeName,
      used: Number(denial.used),
      limit: Number(denial.limit),
      amount: Number(denial.amount),
      largestConsumerId: denial.largestConsumerId,
      largestConsumerName: denial.largestConsumerName,
      largestConsumerUsed: Number(denial.largestConsumerUsed),
    });
    // A quota with a period: when it resets (ms since the epoch), and
    // used counts since the last reset. Unset for one that never resets.
    if (denial.resetAt) fields.resetAtMs = timestampMs(denial.resetAt);
  }
  const rate = details.RateLimited;
  if (code === Status.RESOURCE_EXHAUSTED && rate) {
    const wait = rate.retryAfter ?? {};
    Object.assign(fields, {
      rateLimited: true,
      resource: rate.resource,
      nodeId: rate.nodeId,
      nodeName: rate.nodeName,
      level: Number(rate.level),
      amount: Number(rate.amount),
      retryAfterMs: Number(wait.seconds ?? 0) * 1000 + Math.ceil(Number(wait.nanos ?? 0) / 1e6),
    });
  }
  if (details.NodeEnded) {
    const { nodeId, nodeName, state } = details.NodeEnded;
    fields.nodeEnded = { nodeId, nodeName, state: state.replace(/^NODE_STATE_/, '') };
  }
  if (details.LeaseEnded) {
    const { leaseId, reason: why } = details.LeaseEnded;
    fields.leaseEnded = { leaseId, reason: why.replace(/^LEASE_END_REASON_/, '') };
  }
  fields.causeName = refusalCause(details);
  return new GovernorError(code, `governor: ${op}: ${reason}`, fields);
}

/**
 * causeWireName is a Cause of governor.proto as the wire names it:
 * CAUSE_WAIT_TIMEOUT is 'wait-timeout'; '' for none, 'cause(N)' for a
 * number this governor.proto does not name.
 */
export function causeWireName(cause) {
  if (typeof cause === 'number') return cause === 0 ? '' : `cause(${cause})`;
  if (!cause || cause === 'CAUSE_UNSPECIFIED') return '';
  return cause.replace(/^CAUSE_/, '').toLowerCase().replaceAll('_', '-');
}

/**
 * refusalCause is the cause the detail of a refusal names (Denial,
 * RateLimited, NodeEnded, TenantRefusal, BoundReached); from a governord
 * that names none, the detail's kind tells it.
 */
function refusalCause(details) {
  for (const detail of Object.values(details)) {
    const named = causeWireName(detail?.cause);
    if (named) return named;
  }
  if (details.Denial) return 'quota';
  if (details.RateLimited) return 'rate';
  if (details.NodeEnded) return 'task-ended';
  return '';
}

/** invalid is a GovernorError for bad input caught before any call. */
export function invalid(op, reason) {
  return new GovernorError(Code.INVALID_ARGUMENT, `governor: ${op}: ${reason}`, { op });
}
