import { type Kysely, sql } from 'kysely';

/*
 * The token endpoint writes a refresh token per code redemption and per refresh, and updates
 * one code or one refresh token each time; this keeps that write path lean.
 *
 * - refresh_tokens.organization_id's own foreign key to organizations is redundant: the
 *   composite key (organization_id, grant_id) -> grants (organization_id, id) already requires
 *   the organization (grants reference it) and cascades its deletion. Checking it share-locked
 *   the organization's row on every insert, one row all of an organization's refreshes contend
 *   for (measured on the refresh statement alone, 20 concurrent callers: 5436-5652/s with it,
 *   6044-6167/s without).
 * - refresh_tokens (grant_id) is covered by (organization_id, grant_id): every query names both.
 * - refresh_tokens.parent_id records which token a rotation replaced; nothing looks tokens up by
 *   it, and a parent only goes when its grant goes, with all its tokens. Its foreign key (a check
 *   per refresh) and index (an insert per token) bought nothing.
 * - refresh_tokens (expires_at) served no query: nothing prunes by it.
 * - Codes and refresh tokens are updated once each (consumed, rotated), grants at each refresh
 *   (last_used_at), on columns no index holds: free space on their pages lets PostgreSQL do that
 *   as a HOT update, without new entries in the tables' indexes (five on grants).
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`alter table refresh_tokens drop constraint refresh_tokens_organization_id_fkey`.execute(db);
  await db.schema.dropIndex('refresh_tokens_grant_id_idx').execute();
  await sql`alter table refresh_tokens drop constraint refresh_tokens_parent_id_fkey`.execute(db);
  await db.schema.dropIndex('refresh_tokens_parent_id_idx').execute();
  await db.schema.dropIndex('refresh_tokens_expires_at_idx').execute();
  await sql`alter table refresh_tokens set (fillfactor = 80)`.execute(db);
  await sql`alter table authorization_codes set (fillfactor = 80)`.execute(db);
  await sql`alter table grants set (fillfactor = 80)`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`alter table grants reset (fillfactor)`.execute(db);
  await sql`alter table authorization_codes reset (fillfactor)`.execute(db);
  await sql`alter table refresh_tokens reset (fillfactor)`.execute(db);
  await db.schema.createIndex('refresh_tokens_expires_at_idx').on('refresh_tokens').column('expires_at').execute();
  await db.schema.createIndex('refresh_tokens_parent_id_idx').on('refresh_tokens').column('parent_id').execute();
  await sql`alter table refresh_tokens add constraint refresh_tokens_parent_id_fkey foreign key (parent_id) references refresh_tokens (id) on delete set null`.execute(db);
  await db.schema.createIndex('refresh_tokens_grant_id_idx').on('refresh_tokens').column('grant_id').execute();
  await sql`alter table refresh_tokens add constraint refresh_tokens_organization_id_fkey foreign key (organization_id) references organizations (id) on delete cascade`.execute(db);
}
