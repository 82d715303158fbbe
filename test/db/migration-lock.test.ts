/**
 * The migration lock of src/db/migration-lock.ts on a direct PostgreSQL connection (PgBouncer's
 * side is in test/pgbouncer.test.ts): instances opening one empty database at once apply each
 * migration once and leave no lock behind, and a migrator holding Kysely's own session-level
 * lock (an `orgauth migrate` of an older release) makes them wait for it.
 *
 * PostgreSQL only: the embedded database opens in one process, which migrates it alone.
 */
import { readdirSync } from 'node:fs';
import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Config } from '../../src/config.js';
import type { DatabaseHandle } from '../../src/db/connect.js';
import { MIGRATIONS_URL } from '../../src/db/migrate.js';
import { openDatabase } from '../../src/runtime.js';
import { testConfig } from '../helpers/app.js';
import { createEmptyDatabase, TEST_DATABASE_URL, type TestDatabase } from '../helpers/db.js';

/** Kysely's PostgresAdapter lock id, which src/db/migration-lock.ts takes inside the transaction. */
const KYSELY_MIGRATION_LOCK_ID = '3853314791062309107';

const migrationNames = () =>
  readdirSync(MIGRATIONS_URL).filter((f) => /\.(js|ts)$/.test(f) && !f.endsWith('.d.ts')).map((f) => f.replace(/\.(js|ts)$/, '')).sort();

async function advisoryLocks(url: string): Promise<number> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rows } = await client.query<{ n: number }>(`select count(*)::int as n from pg_locks where locktype = 'advisory' and database = (select oid from pg_database where datname = current_database())`);
    return rows[0]?.n ?? 0;
  } finally {
    await client.end();
  }
}

describe.skipIf(!TEST_DATABASE_URL)('the migration lock, taken inside the migration transaction (PostgreSQL)', () => {
  const databases: TestDatabase[] = [];
  const handles: DatabaseHandle[] = [];
  const open = async (config: Config) => {
    const opened = await openDatabase(config);
    handles.push(opened.handle);
    return opened;
  };

  let database: TestDatabase;
  beforeAll(async () => {
    database = await createEmptyDatabase();
    databases.push(database);
  });
  afterAll(async () => {
    for (const handle of handles) await handle.close();
    for (const db of databases) await db.drop();
  });

  it('three instances opening an empty database at once apply each migration once and leave no lock', async () => {
    const config = testConfig(database.env);
    const opened = await Promise.all([open(config), open(config), open(config)]);
    const applied = opened.flatMap((o) => o.applied).sort();
    expect(applied).toEqual(migrationNames());
    const { rows } = await sql<{ name: string }>`select name from kysely_migration order by name`.execute(opened[0]!.handle.db);
    expect(rows.map((r) => r.name)).toEqual(migrationNames());
    expect(await advisoryLocks(database.env.DATABASE_URL!)).toBe(0);
  });

  it('waits for a migrator holding Kysely’s session-level lock on the same id', async () => {
    const other = await createEmptyDatabase();
    databases.push(other);
    const holder = new pg.Client({ connectionString: other.env.DATABASE_URL });
    await holder.connect();
    try {
      await holder.query(`select pg_advisory_lock(${KYSELY_MIGRATION_LOCK_ID})`);
      let done = false;
      const opening = open(testConfig(other.env)).then((o) => {
        done = true;
        return o;
      });
      // Until the opener is seen waiting for the lock: its request in pg_locks, not granted.
      // (PostgreSQL announces no lock wait, so pg_locks is read again until it shows one.) An
      // opener that finished instead did not wait for the holder, and fails here.
      const waiting = async () =>
        (await holder.query(`select 1 from pg_locks where locktype = 'advisory' and not granted and database = (select oid from pg_database where datname = current_database())`)).rowCount! > 0;
      let failed = false;
      opening.catch(() => (failed = true));
      while (!done && !failed && !(await waiting())) await new Promise((r) => setTimeout(r, 20));
      expect(done).toBe(false);
      await holder.query(`select pg_advisory_unlock(${KYSELY_MIGRATION_LOCK_ID})`);
      expect((await opening).applied).toEqual(migrationNames());
    } finally {
      await holder.end();
    }
  });
});
