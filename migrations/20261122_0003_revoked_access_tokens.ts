import { type Kysely, sql } from 'kysely';

/*
 * Access tokens revoked one by one, until they expire. The tokens a private application gets for
 * itself share one grant (src/oauth/models/client-grants.ts), so revoking one of them must not revoke
 * the grant: its jti goes here instead, and instances load and follow this table as they do
 * revoked grants (src/oauth/models/revocation-list.ts). Rows past expires_at are useless and are pruned.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .createTable('revoked_access_tokens')
    .addColumn('jti', 'text', (c) => c.primaryKey().check(sql`length(jti) between 1 and 200`))
    .addColumn('organization_id', 'bigint', (c) => c.notNull().references('organizations.id').onDelete('cascade'))
    .addColumn('grant_id', 'bigint', (c) => c.notNull())
    .addColumn('expires_at', 'timestamptz', (c) => c.notNull())
    .addColumn('revoked_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addForeignKeyConstraint('revoked_access_tokens_grant_fkey', ['organization_id', 'grant_id'], 'grants', ['organization_id', 'id'], (fk) =>
      fk.onDelete('cascade'),
    )
    .execute();
  await db.schema
    .createIndex('revoked_access_tokens_organization_id_grant_id_idx')
    .on('revoked_access_tokens')
    .columns(['organization_id', 'grant_id'])
    .execute();
  await db.schema.createIndex('revoked_access_tokens_revoked_at_idx').on('revoked_access_tokens').column('revoked_at').execute();
  await db.schema.createIndex('revoked_access_tokens_expires_at_idx').on('revoked_access_tokens').column('expires_at').execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.dropTable('revoked_access_tokens').execute();
}
