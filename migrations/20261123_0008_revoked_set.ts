import { type Kysely, sql } from 'kysely';

/*
 * Each instance loads the revocations that can still matter at start, a batch at a time in
 * (revoked_at, id) order (keyset pagination, src/oauth/models/revocation-list.ts), then follows new ones
 * the same way. Indexes in that order serve it straight: each batch is a range of the index,
 * read without a sort, and for grants without visiting the table (id and revoked_at are both in
 * the index). They replace the single-column indexes on revoked_at, which serve every query
 * those served (revoked_at leads), so the grants' write path keeps the same number of indexes.
 *
 * `if not exists`: an operator with a large table may build them beforehand with CREATE INDEX
 * CONCURRENTLY (README, "Migrations"), which cannot run in the migrator's transaction.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .createIndex('grants_revoked_at_id_idx')
    .ifNotExists()
    .on('grants')
    .columns(['revoked_at', 'id'])
    .where(sql.ref('revoked_at'), 'is not', null)
    .execute();
  await db.schema.dropIndex('grants_revoked_at_idx').ifExists().execute();
  await db.schema.createIndex('revoked_access_tokens_revoked_at_jti_idx').ifNotExists().on('revoked_access_tokens').columns(['revoked_at', 'jti']).execute();
  await db.schema.dropIndex('revoked_access_tokens_revoked_at_idx').ifExists().execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.createIndex('revoked_access_tokens_revoked_at_idx').on('revoked_access_tokens').column('revoked_at').execute();
  await db.schema.dropIndex('revoked_access_tokens_revoked_at_jti_idx').execute();
  await db.schema.createIndex('grants_revoked_at_idx').on('grants').column('revoked_at').where(sql.ref('revoked_at'), 'is not', null).execute();
  await db.schema.dropIndex('grants_revoked_at_id_idx').execute();
}
