import { type Kysely, sql } from 'kysely';

/*
 * Directories: SCIM 2.0 directory sync per organization (issue 43; docs/directory.md).
 *
 * - directories: an organization's SCIM clients (an Okta or Entra ID app each). The bearer token
 *   the client sends is random, shown once and kept as its SHA-256 only (token_hash); rotating
 *   it replaces the hash, so the old token stops at once. A disabled directory answers no SCIM
 *   request. default_role: the built-in role a provisioned member gets when no mapped group
 *   gives one (never owner).
 * - directory_group_roles: group -> role mappings. `group_ref` names a SCIM group by its
 *   displayName or its id (compared without case); the highest role of a member's mapped groups
 *   wins. Built-in roles below owner only, as for the default.
 * - applications_management_scopes_check also keeps the new management scopes (directory.read,
 *   directory.write) off public applications.
 */
const MANAGEMENT_SCOPES_BEFORE = sql`array['applications.read', 'applications.write', 'members.read', 'members.write', 'grants.read', 'grants.write', 'audit.read', 'sso.read', 'sso.write', 'webhooks.read', 'webhooks.write']::text[]`;
const MANAGEMENT_SCOPES = sql`array['applications.read', 'applications.write', 'members.read', 'members.write', 'grants.read', 'grants.write', 'audit.read', 'sso.read', 'sso.write', 'webhooks.read', 'webhooks.write', 'directory.read', 'directory.write']::text[]`;

async function checkManagementScopes(db: Kysely<any>, scopes: typeof MANAGEMENT_SCOPES): Promise<void> {
  await sql`alter table applications drop constraint applications_management_scopes_check`.execute(db);
  await sql`alter table applications add constraint applications_management_scopes_check check (type = 'private' or not (scopes && ${scopes}))`.execute(db);
}

export async function up(db: Kysely<any>): Promise<void> {
  await checkManagementScopes(db, MANAGEMENT_SCOPES);

  await db.schema
    .createTable('directories')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('organization_id', 'bigint', (c) => c.notNull().references('organizations.id').onDelete('cascade'))
    .addColumn('name', 'text', (c) => c.notNull().check(sql`length(name) between 1 and 200`))
    .addColumn('state', 'text', (c) => c.notNull().defaultTo('active').check(sql`state in ('active', 'disabled')`))
    .addColumn('default_role', 'text', (c) => c.notNull().defaultTo('member').check(sql`default_role in ('admin', 'member', 'viewer')`))
    .addColumn('token_hash', 'text', (c) => c.notNull().unique().check(sql`token_hash ~ '^[0-9a-f]{64}$'`))
    .addColumn('token_created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('updated_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .execute();
  await db.schema.createIndex('directories_organization_id_idx').on('directories').columns(['organization_id', 'id']).execute();

  await db.schema
    .createTable('directory_group_roles')
    .addColumn('directory_id', 'bigint', (c) => c.notNull().references('directories.id').onDelete('cascade'))
    .addColumn('group_ref', 'text', (c) => c.notNull().check(sql`length(group_ref) between 1 and 256`))
    .addColumn('role', 'text', (c) => c.notNull().check(sql`role in ('admin', 'member', 'viewer')`))
    .execute();
  await sql`create unique index directory_group_roles_group_key on directory_group_roles (directory_id, lower(group_ref))`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.dropTable('directory_group_roles').execute();
  await db.schema.dropTable('directories').execute();
  await sql`update applications set scopes = array(select s from unnest(scopes) s where s not in ('directory.read', 'directory.write'))`.execute(db);
  await checkManagementScopes(db, MANAGEMENT_SCOPES_BEFORE);
}
