import { type Kysely, sql } from 'kysely';

/*
 * The replay store keeps each key as the first 128 bits of its SHA-256, a uuid, where it kept the
 * key's text (about 85 characters): a narrower index, cheaper to insert into on every DPoP proof
 * and client assertion (src/oauth/models/seen-jtis.ts). The rows there are converted in place,
 * as the application now computes them, so a proof seen just before the upgrade is still refused
 * just after it.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`alter table seen_jtis drop constraint if exists seen_jtis_key_check`.execute(db);
  await sql`alter table seen_jtis alter column key type uuid using encode(substring(sha256(convert_to(key, 'UTF8')) from 1 for 16), 'hex')::uuid`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  // The keys' text cannot be recovered from their digests: their digests stay, as text.
  await sql`alter table seen_jtis alter column key type text using key::text`.execute(db);
  await sql`alter table seen_jtis add constraint seen_jtis_key_check check (length(key) <= 400)`.execute(db);
}
