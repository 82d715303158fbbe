import { type Kysely, sql } from 'kysely';

/*
 * Lists that stay flat as an organization grows (issue 13).
 *
 * - Contact search (`?q=`, a case-insensitive substring of name, email or company) is served by
 *   one trigram GIN index. Its first column is organization_id (btree_gin), so a term that is
 *   common in other organizations costs this one nothing. fastupdate is off: with it on, new
 *   rows wait in a pending list that every search reads whole until a vacuum merges it, and the
 *   embedded database never runs autovacuum, so search would slow down with every insert.
 *   Inserting a contact then updates the index at once (a few more page writes).
 * - Tasks are listed by status and by contact in id order: an index per filter leads with
 *   (organization_id, filter) and ends with id, so a page is read in order with no sort. The
 *   contact index replaces (organization_id, contact_id), which also served the foreign key.
 *
 * pg_trgm and btree_gin are trusted extensions (PostgreSQL 13+): the database's owner may create
 * them; no superuser is needed. The embedded database loads both (src/db/connect.ts).
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`create extension if not exists pg_trgm`.execute(db);
  await sql`create extension if not exists btree_gin`.execute(db);
  await sql`create index contacts_search_idx on contacts using gin
    (organization_id, name gin_trgm_ops, email gin_trgm_ops, company gin_trgm_ops) with (fastupdate = off)`.execute(db);

  await db.schema.createIndex('tasks_organization_id_status_id_idx').on('tasks').columns(['organization_id', 'status', 'id']).execute();
  await db.schema.createIndex('tasks_organization_id_contact_id_id_idx').on('tasks').columns(['organization_id', 'contact_id', 'id']).execute();
  await db.schema.dropIndex('tasks_organization_id_contact_id_idx').execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.createIndex('tasks_organization_id_contact_id_idx').on('tasks').columns(['organization_id', 'contact_id']).execute();
  await db.schema.dropIndex('tasks_organization_id_contact_id_id_idx').execute();
  await db.schema.dropIndex('tasks_organization_id_status_id_idx').execute();
  await db.schema.dropIndex('contacts_search_idx').execute();
  // The extensions stay: other objects of the database may use them by now.
}
