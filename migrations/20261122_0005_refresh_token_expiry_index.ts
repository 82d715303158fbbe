import { type Kysely, sql } from 'kysely';

/*
 * Expired rows are now deleted (src/retention.ts), in batches found by expires_at. The other
 * tables it cleans (authorization_codes, revoked_access_tokens, sessions) have that index;
 * refresh_tokens lost it in 0004, when nothing deleted by it. Its entries are appended at the
 * right edge (expires_at grows with time), the cheapest kind of index insert.
 *
 * `if not exists`: an operator with a large table may build it beforehand with CREATE INDEX
 * CONCURRENTLY (README, "Migrations"), which cannot run in the migrator's transaction.
 *
 * Deleting expired tokens also deletes parents that later tokens name in parent_id (0004's
 * "a parent only goes when its grant goes" no longer holds); `down` clears those references, so
 * that 0004's `down` can restore its foreign key.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema.createIndex('refresh_tokens_expires_at_idx').ifNotExists().on('refresh_tokens').column('expires_at').execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`update refresh_tokens r set parent_id = null
    where parent_id is not null and not exists (select 1 from refresh_tokens p where p.id = r.parent_id)`.execute(db);
  await db.schema.dropIndex('refresh_tokens_expires_at_idx').execute();
}
