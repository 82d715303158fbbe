import { type Kysely, sql } from 'kysely';

/*
 * The account page lists a user's browser sessions (issue 14): when each began and was last
 * used, from which browser and address, with "sign out" for each. A session's key is the
 * SHA-256 of its secret id, which a page should not carry; `id` is a plain number for the
 * forms, meaningful only together with the signed-in user it belongs to. The user agent and IP
 * are what the request that signed in sent, kept short.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`alter table sessions add column id bigint generated always as identity`.execute(db);
  await db.schema.createIndex('sessions_id_key').on('sessions').unique().column('id').execute();
  await db.schema.alterTable('sessions').addColumn('user_agent', 'text', (c) => c.check(sql`length(user_agent) <= 512`)).execute();
  await db.schema.alterTable('sessions').addColumn('ip', 'text', (c) => c.check(sql`length(ip) <= 64`)).execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('sessions').dropColumn('ip').execute();
  await db.schema.alterTable('sessions').dropColumn('user_agent').execute();
  await db.schema.dropIndex('sessions_id_key').execute();
  await db.schema.alterTable('sessions').dropColumn('id').execute();
}
