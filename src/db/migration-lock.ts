/**
 * The PostgreSQL dialect of the connection that runs migrations (runtime.ts opens one for them),
 * with Kysely's migration lock moved into the migration transaction.
 *
 * Kysely's Migrator takes a session-level advisory lock (pg_advisory_lock) in a statement of its
 * own, runs the pending migrations in a transaction, and unlocks in a third statement. Behind a
 * transaction-pooling PgBouncer those three can land on three different PostgreSQL sessions: the
 * unlock then fails ("you don't own a lock"), the lock stays with a pooled session that other
 * clients keep using, and the next migrator to reach another session waits for it (for up to
 * Kysely's lock_timeout, an hour). Here each transaction of this connection instead starts with
 * pg_advisory_xact_lock on Kysely's lock id, before the Migrator reads which migrations are
 * pending, and the lock ends with the transaction, committed or not, on whatever session it ran.
 * Instances starting together still apply each migration once; an `orgauth migrate` of an older
 * release (Kysely's session lock, same id) and this one exclude each other too.
 *
 * The same transaction turns statement_timeout off: operators behind a pooler give the role a
 * server-side timeout (src/db/pooler.ts), which must not cut a migration that builds an index.
 */
import { CompiledQuery, type DatabaseConnection, PostgresAdapter, PostgresDialect, PostgresDriver, type TransactionSettings } from 'kysely';

/** Kysely's PostgresAdapter lock id (not exported by Kysely): one lock whichever way it is taken. */
const KYSELY_MIGRATION_LOCK_ID = '3853314791062309107';
/** How long a migrator waits for another one, as Kysely's own lock does. */
const LOCK_TIMEOUT = '1h';

/** Takes the lock inside each transaction instead (MigrationLockDriver), so nothing is left to take or release around it. */
class TransactionLockAdapter extends PostgresAdapter {
  override async acquireMigrationLock(): Promise<void> {}
  override async releaseMigrationLock(): Promise<void> {}
}

class MigrationLockDriver extends PostgresDriver {
  override async beginTransaction(connection: DatabaseConnection, settings: TransactionSettings): Promise<void> {
    await super.beginTransaction(connection, settings);
    // The settings first, in a statement of their own: a statement's timeout is armed when it
    // starts, so set_config in the statement that waits would leave that wait under the role's
    // statement_timeout (behind a pooler, seconds), and a migrator waiting for another one's
    // longer migrations was cut off (test/pgbouncer.test.ts, once migrations took longer).
    await connection.executeQuery(CompiledQuery.raw(`select set_config('lock_timeout', '${LOCK_TIMEOUT}', true), set_config('statement_timeout', '0', true)`));
    await connection.executeQuery(CompiledQuery.raw(`select pg_advisory_xact_lock(${KYSELY_MIGRATION_LOCK_ID})`));
  }
}

/** PostgresDialect for a connection used only to migrate: every transaction holds the migration lock. */
export class MigrationDialect extends PostgresDialect {
  constructor(private readonly dialectConfig: ConstructorParameters<typeof PostgresDialect>[0]) {
    super(dialectConfig);
  }

  override createAdapter(): PostgresAdapter {
    return new TransactionLockAdapter();
  }

  override createDriver(): PostgresDriver {
    return new MigrationLockDriver(this.dialectConfig);
  }
}
