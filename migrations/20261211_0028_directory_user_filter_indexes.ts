import { type Kysely, sql } from 'kysely';

/*
 * SCIM filters that stay flat as a directory grows (issue 43; src/directory/filter.ts and
 * listing.ts; `npm run bench`, the SCIM rows). Before these, the filters below read every user
 * of the directory, for the page and again for its totalResults: 150–450 ms a page at 100,000.
 *
 * - `userName sw "…"`: compared as lower(user_name) LIKE 'prefix%'. The unique index on
 *   (directory_id, lower(user_name)) served a LIKE prefix only where the database's collation
 *   is C; rebuilt with text_pattern_ops it serves one under any collation, and equality (the
 *   opclass's = is text's, so the same names are unique) as before. It includes user_name, so
 *   a count (totalResults) is read from the index alone: PostgreSQL scans an expression index
 *   index-only when the columns the expression reads are in it (4 ms for 25,000 matches,
 *   instead of 17-45 ms reading their rows).
 * - `active eq true|false`: (directory_id, active, seq) counts a directory's active users from
 *   the index and reads their pages in list order with no sort.
 * - `emails…` compared by value (`emails[type eq "work"].value co "…"`, `emails.value eq …`,
 *   `emails sw …`): the addresses live in the resource's JSON, which no btree reaches. A
 *   trigram GIN index (btree_gin for its directory_id, as contacts_search_idx) over
 *   directory_user_emails(resource), every address of the user lowercased, one a line, finds
 *   the users whose addresses contain the compared text; filter.ts adds that test beside the
 *   exact one (a text of 3 characters or more: trigram length), which then reads those users
 *   only. fastupdate is off for the reason migration 0007 gives (PGlite never vacuums).
 *
 * directory_user_emails is IMMUTABLE (lower and JSON reads only) and, having a FROM, never
 * inlined: the planner matches filter.ts's call of it to the index's expression.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await userNameIndex(db, 'text_pattern_ops include (user_name)');
  await db.schema.createIndex('directory_users_active_idx').on('directory_users').columns(['directory_id', 'active', 'seq']).execute();
  await sql`create function directory_user_emails(resource jsonb) returns text language sql immutable parallel safe as $$
    select coalesce(string_agg(lower(e ->> 'value'), E'\\n'), '')
    from jsonb_array_elements(case when jsonb_typeof(resource -> 'emails') = 'array' then resource -> 'emails' else '[]'::jsonb end) e
  $$`.execute(db);
  await sql`create index directory_users_emails_idx on directory_users using gin (directory_id, directory_user_emails(resource) gin_trgm_ops) with (fastupdate = off)`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.dropIndex('directory_users_emails_idx').execute();
  await sql`drop function directory_user_emails(jsonb)`.execute(db);
  await db.schema.dropIndex('directory_users_active_idx').execute();
  await userNameIndex(db, '');
}

/** The unique index on (directory_id, lower(user_name)) made again, under its name (in the migration's transaction: never a moment without it). */
async function userNameIndex(db: Kysely<any>, how: 'text_pattern_ops include (user_name)' | ''): Promise<void> {
  const [opclass, include] = how === '' ? ['', ''] : ['text_pattern_ops', 'include (user_name)'];
  await sql`drop index directory_users_user_name_key`.execute(db);
  await sql`create unique index directory_users_user_name_key on directory_users (directory_id, lower(user_name) ${sql.raw(opclass)}) ${sql.raw(include)}`.execute(db);
}
