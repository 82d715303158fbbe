import { type Kysely, sql } from 'kysely';

/*
 * Setup links (issue 43; docs/directory.md "Setup link"): an owner (or the operator) hands a
 * customer's IT admin a link that lets whoever opens it, signed in, verify the organization's
 * domains, configure its SSO connections and create its SCIM directories, and nothing else.
 *
 * - features: what the link opens, a non-empty subset of domains, sso, directory.
 * - token_hash: SHA-256 (hex) of the random token in the link's URL; the token is shown once.
 * - created_by_user_id: the owner who made it (null: the operator's CLI). A link works only while
 *   its creator is still an owner of the organization; deleting the user deletes their links.
 * - expires_at: at most 30 days after creation (7 by default); revoked_at ends it sooner.
 * - last_used_at: when a signed-in person last used it.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .createTable('setup_links')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('organization_id', 'bigint', (c) => c.notNull().references('organizations.id').onDelete('cascade'))
    .addColumn('features', sql`text[]`, (c) =>
      c.notNull().check(sql`cardinality(features) between 1 and 3 and features <@ array['domains', 'sso', 'directory']::text[]`),
    )
    .addColumn('token_hash', 'text', (c) => c.notNull().unique().check(sql`token_hash ~ '^[0-9a-f]{64}$'`))
    .addColumn('created_by_user_id', 'bigint', (c) => c.references('users.id').onDelete('cascade'))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('expires_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now() + interval '7 days'`))
    .addColumn('revoked_at', 'timestamptz')
    .addColumn('last_used_at', 'timestamptz')
    .addCheckConstraint('setup_links_expiry_check', sql`expires_at > created_at and expires_at <= created_at + interval '30 days'`)
    .execute();
  // The organization's links (the dashboard's list, the count of live ones), and the retention sweep by expiry.
  await db.schema.createIndex('setup_links_organization_id_idx').on('setup_links').columns(['organization_id', 'id']).execute();
  await db.schema.createIndex('setup_links_expires_at_idx').on('setup_links').column('expires_at').execute();
  await db.schema.createIndex('setup_links_created_by_user_id_idx').on('setup_links').column('created_by_user_id').execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.dropTable('setup_links').execute();
}
