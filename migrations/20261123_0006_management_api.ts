import { type Kysely, sql } from 'kysely';

/*
 * The management API (issue 12).
 *
 * - Management scopes (applications.*, members.*, grants.*, audit.read) administer an
 *   organization; only its own private applications may hold them (SECURITY.md AD-1). The
 *   application code refuses them for public applications; this constraint makes it a property
 *   of the data, whoever writes it.
 * - PKCE is for redirects, which private applications never make; `orgauth app create --type
 *   private --require-pkce` used to accept the flag anyway. It is cleared on such rows (it never
 *   had an effect) and refused from now on, so every row passes the application's checks and
 *   can be edited or disabled.
 * - Connected apps (live grants) are listed per organization, newest first, a page at a time:
 *   a partial index holds only the live ones, so a page costs the same however many grants the
 *   organization has revoked over the years.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`alter table applications add constraint applications_management_scopes_check check (
    type = 'private' or not (scopes && array['applications.read', 'applications.write', 'members.read', 'members.write',
      'grants.read', 'grants.write', 'audit.read']::text[]))`.execute(db);
  await sql`update applications set require_pkce = false where type = 'private' and require_pkce`.execute(db);
  await sql`alter table applications add constraint applications_pkce_check check (type = 'public' or not require_pkce)`.execute(db);
  await db.schema
    .createIndex('grants_live_organization_id_id_idx')
    .on('grants')
    .columns(['organization_id', 'id'])
    .where(sql.ref('revoked_at'), 'is', null)
    .execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.dropIndex('grants_live_organization_id_id_idx').execute();
  await sql`alter table applications drop constraint applications_pkce_check`.execute(db);
  await sql`alter table applications drop constraint applications_management_scopes_check`.execute(db);
}
