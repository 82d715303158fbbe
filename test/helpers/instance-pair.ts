/**
 * Two app instances on one test database, for tests of what one instance's change does on the
 * other: on PostgreSQL the second has its own pool and LISTEN connection, as another process
 * would; on PGlite (one connection) they share the handle.
 */
import type { FastifyInstance } from 'fastify';
import { connectDatabase } from '../../src/db/connect.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { buildTestApp, TEST_SECRET_KEY } from './app.js';
import { createTestDatabase } from './db.js';

export interface InstancePair {
  t: Awaited<ReturnType<typeof createTestDatabase>>;
  app: FastifyInstance;
  second: FastifyInstance;
  close(): Promise<void>;
}

/** `env`: configuration both instances get (JOB_WORKERS=0: neither runs jobs, the test finishes them when it chooses). */
export async function startInstancePair(options: { env?: Record<string, string> } = {}): Promise<InstancePair> {
  const t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  const env = options.env ?? {};
  const app = await buildTestApp(t.handle.db, { env, listen: t.handle.listen });
  const secondHandle = t.target.kind === 'postgres' ? await connectDatabase(t.target) : undefined;
  const other = secondHandle ?? t.handle;
  const second = await buildTestApp(other.db, { env, listen: other.listen });
  return {
    t,
    app,
    second,
    close: async () => {
      await app.close();
      await second.close();
      await secondHandle?.close();
      await t.close();
    },
  };
}
