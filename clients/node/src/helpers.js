// The helpers README.md's guides describe: a guarded call, retries drawn
// from a task's budget, and a node-postgres pool guarded by a lease class.

import { performance } from 'node:perf_hooks';
import { Code, GovernorError } from './errors.js';
import { backoff } from './session.js';

/**
 * guarded runs fn while holding a lease of cls on task, and releases the
 * lease however fn ends, reporting how long fn took and, through
 * isOverloaded(result, error), whether the other side pushed back.
 */
export async function guarded(task, cls, fn, isOverloaded = () => false) {
  const lease = await task.acquire(cls);
  const start = performance.now();
  let result;
  let failure;
  try {
    result = await fn();
    return result;
  } catch (err) {
    failure = err;
    throw err;
  } finally {
    let overloaded = false;
    try {
      overloaded = Boolean(isOverloaded(result, failure));
    } catch {
      // a faulty predicate must not keep the lease held
    }
    await lease.release({ latencyMs: performance.now() - start, overloaded });
  }
}

// The governor's own refusals: retrying the work cannot change them.
function refusal(err) {
  return err instanceof GovernorError &&
    (err.denied || err.sessionLost || [Code.FAILED_PRECONDITION, Code.UNAUTHENTICATED, Code.PERMISSION_DENIED, Code.NOT_FOUND].includes(err.code));
}

/**
 * retry runs fn until it succeeds. The first attempt is free; every retry
 * first consumes one unit of the task's retry quota (options.resource), so
 * every retry under the task draws from one budget. When the charge is
 * refused, the last error of fn is thrown, with the refusal as its
 * governorRefusal property when it is an object. Between attempts it waits
 * with jittered exponential backoff, and after a refusal for rate
 * (err.rateLimited) at least its retryAfterMs.
 */
export async function retry(task, fn, options = {}) {
  const { resource = 'retry', baseMs = 100, maxMs = 10_000, maxAttempts = 0, retryIf = (err) => !refusal(err) } = options;
  for (let attempt = 1; ; attempt++) {
    try {
      return await fn(attempt);
    } catch (err) {
      if (!retryIf(err) || (maxAttempts > 0 && attempt >= maxAttempts)) throw err;
      try {
        await task.consume(resource, 1);
      } catch (refused) {
        if (err !== null && typeof err === 'object') {
          Object.defineProperty(err, 'governorRefusal', { value: refused, configurable: true });
        }
        throw err;
      }
      const wait = Math.max(backoff(baseMs, maxMs, attempt - 1), err instanceof GovernorError ? err.retryAfterMs ?? 0 : 0);
      await new Promise((resolve) => setTimeout(resolve, wait));
    }
  }
}

// SQLSTATEs that say the server is overloaded: too many connections,
// cannot connect now, and statement timeout.
const PG_OVERLOADED = new Set(['53300', '57P03', '57014']);

/**
 * guardPool wraps a node-postgres Pool (or anything with query(text, values))
 * so that each query runs under a lease of cls (default "db") on the task
 * given, reporting its latency and overload to adaptive limits.
 */
export function guardPool(pool, { cls = 'db' } = {}) {
  return {
    query(task, text, values) {
      return guarded(task, cls, () => pool.query(text, values), (_result, err) => PG_OVERLOADED.has(err?.code));
    },
  };
}
