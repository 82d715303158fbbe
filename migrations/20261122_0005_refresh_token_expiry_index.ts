import { type Kysely } from 'kysely';

/*
 * Expired rows are now deleted (src/retention.ts), in batches found by expires_at. The other
 * tables it cleans (authorization_codes, revoked_access_tokens, sessions) have that index;
 * refresh_tokens lost it in 0004, when nothing deleted by it. Its entries are appended at the
 * right edge (expires_at grows with time), the cheapest kind of index insert.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema.createIndex('refresh_tokens_expires_at_idx').on('refresh_tokens').column('expires_at').execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.dropIndex('refresh_tokens_expires_at_idx').execute();
}
