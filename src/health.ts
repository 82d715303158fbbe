import { sql } from 'kysely';
import type { FastifyInstance } from 'fastify';
import type { DB } from './db/connect.js';
import { ServiceUnavailableError } from './errors.js';

/** Under R-3's 2 s, like every request that needs the database. */
const READY_TIMEOUT_MS = 1500;

/** Probed every few seconds by orchestrators: not worth a log line each unless they fail. */
export const HEALTH_PATHS = new Set(['/healthz', '/readyz']);

/** Resolves when the database answers a trivial query within the timeout; rejects otherwise. */
async function pingDatabase(db: DB): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${READY_TIMEOUT_MS} ms`)), READY_TIMEOUT_MS);
  });
  try {
    await Promise.race([sql`select 1`.execute(db), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Liveness (the process runs) and readiness (the database answers), for load balancers and orchestrators. */
export async function healthRoutes(app: FastifyInstance, { db }: { db: DB }): Promise<void> {
  app.addHook('onSend', async (_req, reply) => {
    reply.header('cache-control', 'no-store');
  });
  app.get('/healthz', async () => ({ status: 'ok' }));
  app.get('/readyz', async () => {
    try {
      await pingDatabase(db);
    } catch (err) {
      throw new ServiceUnavailableError('the database is not answering', { cause: err });
    }
    return { status: 'ready' };
  });
}
