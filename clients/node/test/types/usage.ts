// Compiled by `npm run typecheck` (tsc --noEmit): the README's examples
// type-check against src/index.d.ts. It is never run.
import pg from 'pg';
import { connect, guardPool, guarded, retry, Code, GovernorError, type Lease, type Session, type Task } from '@governor/client';

export async function examples(): Promise<void> {
  const session: Session = await connect({ apiKey: process.env.PAYMENTS_KEY, addr: 'governor.internal:7600', caFile: '/etc/ca.pem', ttlMs: 10_000 });
  const scope: string = session.scopeId;
  const task: Task = await session.newTask({ name: 'checkout-42', deadlineMs: 3000, quotas: { retry: 3 }, limits: { psp: 2 } });
  const lease: Lease = await task.acquire('psp');
  const fence: string = lease.id;
  await lease.release({ latencyMs: 12, overloaded: false });
  await task.consume('tokens', 512);
  await task.consume('retry');
  const res = await guarded(task, 'psp', () => fetch('https://psp.example.com'), (r) => r?.status === 429);
  const status: number = res.status;
  const n: number = await retry(task, async () => 42);
  const db = guardPool(new pg.Pool({ max: 20 }));
  const rows = (await db.query<pg.QueryResult<{ one: number }>>(task, 'SELECT 1 AS one')).rows;
  await session.rpc('Validate', { leaseId: lease.id });
  try {
    await task.consume('retry');
  } catch (err) {
    if (err instanceof GovernorError && err.denied && err.code === Code.RESOURCE_EXHAUSTED) {
      const who: string | undefined = err.largestConsumerName;
      void who;
    }
  }
  const why: GovernorError = await session.done;
  await task.close();
  await session.close();
  void [scope, fence, status, n, rows, why];
}
