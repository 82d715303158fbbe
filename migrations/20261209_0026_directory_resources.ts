import { type Kysely, sql } from 'kysely';

/*
 * What a SCIM directory pushes (issue 43; docs/directory.md, src/directory/).
 *
 * - directory_users: a SCIM User of one directory, linked to the orgauth account it created or
 *   claimed (user_id). `id` is the SCIM id orgauth assigns (a UUID); `seq` orders lists and
 *   keyset-pages them. user_name (unique per directory without case, as RFC 7643 §4.1.1's
 *   caseExact=false userName compares), external_id, display_name and active are columns because
 *   filters and the Directory page read them; `resource` holds the rest of the representation as
 *   the client sent it (name, emails, the enterprise extension, ...). `version` is the ETag
 *   (W/"<version>"), bumped by every change. `role` is what the directory last gave the member
 *   (null: the member is an owner, whom a directory never changes).
 * - directory_groups: a SCIM Group; display_name unique per directory without case (group
 *   mappings name groups by it).
 * - directory_group_members: which users a group holds; both sides in the same directory.
 * - directory_requests: the last requests of each directory, for the Directory page: method,
 *   path, status and scimType only (never the token or a body). Trimmed by retention.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .createTable('directory_users')
    .addColumn('id', 'uuid', (c) => c.primaryKey().defaultTo(sql`gen_random_uuid()`))
    .addColumn('seq', 'bigint', (c) => c.notNull().generatedAlwaysAsIdentity())
    .addColumn('directory_id', 'bigint', (c) => c.notNull().references('directories.id').onDelete('cascade'))
    .addColumn('user_id', 'bigint', (c) => c.notNull().references('users.id').onDelete('cascade'))
    .addColumn('user_name', 'text', (c) => c.notNull().check(sql`length(user_name) between 1 and 254`))
    .addColumn('external_id', 'text', (c) => c.check(sql`length(external_id) <= 256`))
    .addColumn('display_name', 'text', (c) => c.check(sql`length(display_name) <= 256`))
    .addColumn('active', 'boolean', (c) => c.notNull().defaultTo(true))
    .addColumn('resource', 'jsonb', (c) => c.notNull())
    .addColumn('role', 'text', (c) => c.check(sql`role in ('admin', 'member', 'viewer')`))
    .addColumn('version', 'bigint', (c) => c.notNull().defaultTo(1))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('updated_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .execute();
  await sql`create unique index directory_users_user_name_key on directory_users (directory_id, lower(user_name))`.execute(db);
  await db.schema.createIndex('directory_users_user_key').on('directory_users').columns(['directory_id', 'user_id']).unique().execute();
  await db.schema.createIndex('directory_users_seq_idx').on('directory_users').columns(['directory_id', 'seq']).unique().execute();
  await db.schema.createIndex('directory_users_external_id_idx').on('directory_users').columns(['directory_id', 'external_id']).execute();
  await db.schema.createIndex('directory_users_user_id_idx').on('directory_users').column('user_id').execute();

  await db.schema
    .createTable('directory_groups')
    .addColumn('id', 'uuid', (c) => c.primaryKey().defaultTo(sql`gen_random_uuid()`))
    .addColumn('seq', 'bigint', (c) => c.notNull().generatedAlwaysAsIdentity())
    .addColumn('directory_id', 'bigint', (c) => c.notNull().references('directories.id').onDelete('cascade'))
    .addColumn('display_name', 'text', (c) => c.notNull().check(sql`length(display_name) between 1 and 256`))
    .addColumn('external_id', 'text', (c) => c.check(sql`length(external_id) <= 256`))
    .addColumn('version', 'bigint', (c) => c.notNull().defaultTo(1))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('updated_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .execute();
  await sql`create unique index directory_groups_display_name_key on directory_groups (directory_id, lower(display_name))`.execute(db);
  await db.schema.createIndex('directory_groups_seq_idx').on('directory_groups').columns(['directory_id', 'seq']).unique().execute();
  await db.schema.createIndex('directory_groups_external_id_idx').on('directory_groups').columns(['directory_id', 'external_id']).execute();

  await db.schema
    .createTable('directory_group_members')
    .addColumn('group_id', 'uuid', (c) => c.notNull().references('directory_groups.id').onDelete('cascade'))
    .addColumn('user_id', 'uuid', (c) => c.notNull().references('directory_users.id').onDelete('cascade'))
    .addPrimaryKeyConstraint('directory_group_members_pkey', ['group_id', 'user_id'])
    .execute();
  await db.schema.createIndex('directory_group_members_user_idx').on('directory_group_members').columns(['user_id', 'group_id']).execute();

  await db.schema
    .createTable('directory_requests')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('directory_id', 'bigint', (c) => c.notNull().references('directories.id').onDelete('cascade'))
    .addColumn('method', 'text', (c) => c.notNull())
    .addColumn('path', 'text', (c) => c.notNull())
    .addColumn('status', 'integer', (c) => c.notNull())
    .addColumn('scim_type', 'text')
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .execute();
  await db.schema.createIndex('directory_requests_directory_idx').on('directory_requests').columns(['directory_id', 'id']).execute();
  await db.schema.createIndex('directory_requests_created_at_idx').on('directory_requests').column('created_at').execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.dropTable('directory_requests').execute();
  await db.schema.dropTable('directory_group_members').execute();
  await db.schema.dropTable('directory_groups').execute();
  await db.schema.dropTable('directory_users').execute();
}
