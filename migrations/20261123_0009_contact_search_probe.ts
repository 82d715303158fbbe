import { type Kysely, sql } from 'kysely';

/*
 * Contact search's probe (src/api/contacts.ts, step 2) as a function, for its SET clauses: the
 * probe must run with only bitmap scans allowed (the planner would otherwise walk the
 * organization for a term that table-wide statistics call common, and find it absent here), and
 * a function's SET clauses give it exactly those settings for the call, in one round trip,
 * without a transaction around a SET LOCAL. A function with SET clauses is never inlined.
 *
 * Up to 1,000 ids of the organization's contacts after $2 that match the ILIKE pattern $3, in
 * table order. The body is positional so a test can PREPARE it and read its plan.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`create function contacts_search_probe(bigint, bigint, text) returns bigint[]
    language sql stable
    set enable_seqscan = off
    set enable_indexscan = off
    as ${sql.lit(`select array(select id from contacts
      where organization_id = $1 and id > $2 and (name ilike $3 or email ilike $3 or company ilike $3)
      limit 1000)`)}`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`drop function contacts_search_probe(bigint, bigint, text)`.execute(db);
}
