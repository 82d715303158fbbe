import { type Kysely, sql } from 'kysely';

/*
 * /oauth/par counts a client's usable pushed requests before keeping another (at most
 * MAX_PENDING_PER_CLIENT, src/oauth/models/pushed-requests.ts): by this index it reads that
 * client's rows alone, not every client's live ones. Deleting a client (the retention of unused
 * self-registered clients) finds its pushed requests by it too, for the cascade.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`create index pushed_authorization_requests_application_idx on pushed_authorization_requests (application_id, expires_at)`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`drop index pushed_authorization_requests_application_idx`.execute(db);
}
