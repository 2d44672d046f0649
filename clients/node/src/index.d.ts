// Type definitions for @governor/client. README.md describes the API.

/** A 64-bit integer: ids and amounts travel as decimal strings; numbers and bigints are taken too. */
export type Int64 = number | bigint | string;

export interface ConnectOptions {
  /** The tenant's API key (or the operator's admin key). Default: GOVERNOR_API_KEY. */
  apiKey?: string;
  /** governord's host:port. Default: GOVERNOR_ADDR, else 127.0.0.1:7600. A list is refused until standbys are supported. */
  addr?: string;
  /** TLS on or off. Default: GOVERNOR_TLS (true, false, 1 or 0), else off. A caFile turns it on whatever this says. */
  tls?: boolean;
  /** A PEM file of the certificates to trust; turns TLS on. Default: GOVERNOR_CA_FILE, else the system's roots. */
  caFile?: string;
  /** The session TTL to ask for, in ms; governord may clamp it. 0: the server's default. Default: 10000. */
  ttlMs?: number;
  /** How long connect keeps trying while governord is unavailable, in ms. Default: 10000. */
  dialTimeoutMs?: number;
  /** Options for the grpc-js channel, such as 'grpc.keepalive_time_ms'. */
  channelOptions?: Record<string, string | number>;
  /** grpc-js client interceptors, run on every call. */
  interceptors?: unknown[];
}

export interface TaskSpec {
  /** Unique among the parent's open children, 1 to 255 bytes. Default: a random name. */
  name?: string;
  /** Ends the task (and its subtasks) this many ms from now. */
  deadlineMs?: number;
  /** Budgets that never refill, e.g. { retry: 3, tokens: 50000 }. -1: no cap, even where defaults give one. */
  quotas?: Record<string, Int64>;
  /** The most leases of a class held at once in the task's subtree, e.g. { db: 10 }. */
  limits?: Record<string, Int64>;
  /** Quotas each subtask created later gets. */
  defaultQuotas?: Record<string, Int64>;
  /** Limits each subtask created later gets. */
  defaultLimits?: Record<string, Int64>;
  /** Queue priority within the tenant (higher first). */
  priority?: Int64;
}

export interface CallOptions {
  /** Withdraws the call; a lease granted at that instant is given back. */
  signal?: AbortSignal;
  /** Bounds the call, retries included. */
  timeoutMs?: number;
}

export interface ReleaseOptions {
  /** How long the call under the lease took; 0 or absent: no sample. */
  latencyMs?: number;
  /** The other side pushed back (HTTP 429 or 503, too many connections...). */
  overloaded?: boolean;
}

export declare class Session {
  private constructor();
  /** The id of the tenant's node (the root, "1", for the admin key). */
  readonly scopeId: string;
  /** The TTL governord granted, in ms. */
  readonly ttlMs: number;
  /** The local deadline, in performance.now() ms: the session is given up then unless a heartbeat succeeds. */
  readonly expiresAt: number;
  /** Why the session ended, or null while it is alive. */
  readonly error: GovernorError | null;
  /** Resolves, with why, when the session ends: lost, forgotten by governord, or closed. Never rejects. */
  readonly done: Promise<GovernorError>;
  newTask(spec?: TaskSpec): Promise<Task>;
  /** Calls any unary method of governor.proto as this session; fields in camelCase, 64-bit integers as strings. */
  rpc<T = any>(method: string, request?: Record<string, unknown>, options?: CallOptions): Promise<T>;
  /** Ends the session at governord, freeing every lease it holds, and closes the connection. */
  close(): Promise<void>;
}

export declare class Task {
  private constructor();
  /** The task's node id. */
  readonly id: string;
  readonly name: string;
  consume(resource: string, amount?: Int64): Promise<void>;
  acquire(cls: string, options?: { signal?: AbortSignal }): Promise<Lease>;
  chargeAndAcquire(cls: string, charges: Record<string, Int64>, options?: { signal?: AbortSignal; waitForRate?: boolean }): Promise<Lease | null>;
  newTask(spec?: TaskSpec): Promise<Task>;
  close(): Promise<void>;
  cancel(): Promise<void>;
}

export declare class Lease {
  private constructor();
  /** The lease id, which only grows from lease to lease: a fencing token. */
  readonly id: string;
  readonly nodeId: string;
  readonly class: string;
  release(options?: ReleaseOptions): Promise<void>;
  validate(): Promise<void>;
}

export declare const Code: Readonly<{
  OK: 0; CANCELLED: 1; UNKNOWN: 2; INVALID_ARGUMENT: 3; DEADLINE_EXCEEDED: 4; NOT_FOUND: 5;
  ALREADY_EXISTS: 6; PERMISSION_DENIED: 7; RESOURCE_EXHAUSTED: 8; FAILED_PRECONDITION: 9;
  ABORTED: 10; OUT_OF_RANGE: 11; UNIMPLEMENTED: 12; INTERNAL: 13; UNAVAILABLE: 14;
  DATA_LOSS: 15; UNAUTHENTICATED: 16;
}>;

export declare class GovernorError extends Error {
  /** The gRPC status code. */
  readonly code: number;
  /** The code's name, e.g. "RESOURCE_EXHAUSTED". */
  readonly codeName: string;
  /** The call that failed, e.g. "consume". */
  readonly op: string;
  /** A quota refused the call: the budget is spent. */
  readonly denied: boolean;
  /**
   * A rate refused the call (RESOURCE_EXHAUSTED with a RateLimited
   * detail): nothing was charged, and the same call fits after
   * retryAfterMs unless something else takes from the bucket. retry()
   * waits at least that long.
   */
  readonly rateLimited: boolean;
  /** The units in the refusing rate's bucket, when rateLimited. */
  readonly level?: number;
  /** How long until the rate's bucket holds the amount, when rateLimited. */
  readonly retryAfterMs?: number;
  /** The session has ended; nothing more is admitted through it. */
  readonly sessionLost: boolean;
  /**
   * Why governord refused work, by its name on the wire (the Cause of
   * governor.proto): 'quota', 'rate', 'task-ended', 'suspended',
   * 'read-only', 'bound', ...; '' when the call refused no work.
   */
  readonly causeName: string;
  // The denial, when denied.
  readonly resource?: string;
  readonly nodeId?: string;
  readonly nodeName?: string;
  readonly used?: number;
  readonly limit?: number;
  readonly amount?: number;
  readonly largestConsumerId?: string;
  readonly largestConsumerName?: string;
  readonly largestConsumerUsed?: number;
  /** When a quota with a period resets, in ms since the epoch (used counts since the last reset). */
  readonly resetAtMs?: number;
  /** FAILED_PRECONDITION because a task ended: which node, and how. */
  readonly nodeEnded?: { nodeId: string; nodeName: string; state: 'CLOSED' | 'CANCELLED' | 'EXPIRED' };
  /** FAILED_PRECONDITION because a lease ended: which, and why. */
  readonly leaseEnded?: { leaseId: string; reason: 'RELEASED' | 'EXPIRED' | 'REVOKED' };
}

export declare function connect(options?: ConnectOptions): Promise<Session>;

/** Runs fn holding a lease of cls on task, and releases it with fn's latency and isOverloaded's verdict. */
export declare function guarded<T>(task: Task, cls: string, fn: () => Promise<T> | T,
  isOverloaded?: (result: T | undefined, error: unknown) => boolean): Promise<T>;

export interface RetryOptions {
  /** The quota each retry spends one unit of. Default: "retry". */
  resource?: string;
  /** The first backoff and its ceiling, in ms. Defaults: 100 and 10000. */
  baseMs?: number;
  maxMs?: number;
  /** Attempts in all, the first included, on top of the budget; 0: only the budget stops it. */
  maxAttempts?: number;
  /** Which errors are worth a retry. Default: all but the governor's own refusals. */
  retryIf?: (err: unknown) => boolean;
}

/** Runs fn until it succeeds; every retry after the first attempt spends one unit of the task's retry quota. */
export declare function retry<T>(task: Task, fn: (attempt: number) => Promise<T> | T, options?: RetryOptions): Promise<T>;

/** A node-postgres Pool (or anything with query(text, values)) whose queries each run under a lease of cls (default "db"). */
export declare function guardPool(pool: { query(text: string, values?: any[]): Promise<any> } | { query: (...args: any[]) => any },
  options?: { cls?: string }): { query<R = any>(task: Task, text: string, values?: unknown[]): Promise<R> };
