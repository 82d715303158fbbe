import { type Kysely, sql } from 'kysely';

/*
 * Organization roles (issue 15): a role is a set of permissions, and a membership's role decides
 * what its user may grant an application in that organization.
 *
 * - The built-in roles (owner, admin, member, and the new viewer) are defined in code
 *   (src/accounts/roles.ts), the same in every organization and not editable, so they need no
 *   rows: a million organizations do not carry four million copies of them, and a release that
 *   adds a permission to `admin` needs no data migration.
 * - roles: an organization's custom roles, each a name (unique per organization, ignoring case,
 *   never a built-in's) and its permissions.
 * - memberships.role and invitations.role name a built-in role, or are 'custom' with role_id
 *   naming one of the organization's custom roles (the composite key makes another
 *   organization's role impossible). Existing rows keep their built-in role: nothing changes for
 *   them. A custom role in use cannot be deleted (restrict): its members are moved first.
 * - grants.narrowed_from_grant_id: when a role change takes a permission from a member, each of
 *   their grants holding it is replaced by a narrower one (src/oauth/models/grants.ts,
 *   narrowGrantsInTransaction); the successor names the grant it replaced.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .createTable('roles')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('organization_id', 'bigint', (c) => c.notNull().references('organizations.id').onDelete('cascade'))
    .addColumn('name', 'text', (c) =>
      c.notNull().check(sql`length(name) between 1 and 64 and lower(name) not in ('owner', 'admin', 'member', 'viewer', 'custom')`),
    )
    .addColumn('description', 'text', (c) => c.notNull().defaultTo('').check(sql`length(description) <= 500`))
    .addColumn('permissions', sql`text[]`, (c) => c.notNull())
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('updated_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .execute();
  await db.schema.createIndex('roles_organization_id_id_key').on('roles').unique().columns(['organization_id', 'id']).execute();
  await sql`create unique index roles_organization_id_name_key on roles (organization_id, lower(name))`.execute(db);

  for (const table of ['memberships', 'invitations']) {
    await sql`alter table ${sql.table(table)} drop constraint ${sql.id(`${table}_role_check`)}`.execute(db);
    await sql`alter table ${sql.table(table)} add column role_id bigint`.execute(db);
    await sql`alter table ${sql.table(table)}
      add constraint ${sql.id(`${table}_role_check`)} check (role in ('owner', 'admin', 'member', 'viewer', 'custom') and (role = 'custom') = (role_id is not null)),
      add constraint ${sql.id(`${table}_role_fkey`)} foreign key (organization_id, role_id) references roles (organization_id, id)`.execute(db);
  }
  await sql`alter table grants add column narrowed_from_grant_id bigint`.execute(db);
  // The grant a narrowed one replaced: a replayed authorization code revokes the successor of the
  // grant it made (partial: the grants that were never narrowed, nearly all, are not in it).
  await sql`create index grants_narrowed_from_grant_id_idx on grants (narrowed_from_grant_id) where narrowed_from_grant_id is not null`.execute(db);
  // An organization's owners, locked by every change that could leave it without one (a handful
  // of rows, however many members it has).
  await sql`create index memberships_owners_idx on memberships (organization_id, user_id) where role = 'owner'`.execute(db);
  // A custom role's members (narrowing their grants when it loses a permission; moving them when it is deleted), in user id order.
  await sql`create index memberships_role_id_idx on memberships (organization_id, role_id, user_id) where role_id is not null`.execute(db);
  await sql`create index invitations_role_id_idx on invitations (organization_id, role_id) where role_id is not null`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`drop index memberships_owners_idx`.execute(db);
  await sql`drop index grants_narrowed_from_grant_id_idx`.execute(db);
  for (const table of ['memberships', 'invitations']) {
    // Before roles had permissions, 'member' was the least a membership could be: viewers and
    // custom roles become members again (they read and write the data) when this is undone.
    await sql`update ${sql.table(table)} set role = 'member', role_id = null where role in ('viewer', 'custom')`.execute(db);
    await sql`alter table ${sql.table(table)} drop constraint ${sql.id(`${table}_role_fkey`)}, drop constraint ${sql.id(`${table}_role_check`)}`.execute(db);
    await sql`alter table ${sql.table(table)} drop column role_id`.execute(db);
    await sql`alter table ${sql.table(table)} add constraint ${sql.id(`${table}_role_check`)} check (role in ('owner', 'admin', 'member'))`.execute(db);
  }
  await db.schema.dropTable('roles').execute();
  await sql`alter table grants drop column narrowed_from_grant_id`.execute(db);
}
