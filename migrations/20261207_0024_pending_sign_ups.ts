import { type Kysely, sql } from 'kysely';

/*
 * Sign-up by confirmed address (issue 41 §4, §6; SECURITY.md AC-2, DO-1).
 *
 * - pending_sign_ups: a sign-up waiting for its address to be confirmed. No user exists until
 *   the mailed link is followed (src/accounts/sign-ups.ts), so nobody can hold an account on an
 *   address they do not read (pre-account takeover). One row per address (lower(email)): a new
 *   sign-up for it replaces the row, and its link. The link's token is kept as its SHA-256 only;
 *   the password as its argon2id hash. Retention deletes rows once expired.
 * - sign_up_attempts: one row per sign-up the throttles let through, by address (lowercased) and
 *   client address group, for the hourly limits every instance shares. Each such sign-up sends
 *   exactly one mail to its address, so the per-address count is also the bound on sign-up mails
 *   per recipient. Retention deletes rows an hour after they were made.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .createTable('pending_sign_ups')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('email', 'text', (c) => c.notNull().check(sql`length(email) between 3 and 254`))
    .addColumn('token_hash', 'text', (c) => c.notNull().unique().check(sql`token_hash ~ '^[0-9a-f]{64}$'`))
    .addColumn('password_hash', 'text', (c) => c.notNull())
    .addColumn('name', 'text', (c) => c.notNull().check(sql`length(name) <= 200`))
    .addColumn('organization_name', 'text', (c) => c.notNull().check(sql`length(organization_name) <= 200`))
    .addColumn('return_to', 'text', (c) => c.notNull().check(sql`length(return_to) <= 8192`))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('expires_at', 'timestamptz', (c) => c.notNull())
    .execute();
  await sql`create unique index pending_sign_ups_email_lower_key on pending_sign_ups (lower(email))`.execute(db);
  await db.schema.createIndex('pending_sign_ups_expires_at_idx').on('pending_sign_ups').column('expires_at').execute();

  await db.schema
    .createTable('sign_up_attempts')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('email', 'text', (c) => c.notNull().check(sql`length(email) between 3 and 254`))
    .addColumn('ip', 'text', (c) => c.notNull().check(sql`length(ip) between 1 and 100`))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .execute();
  await db.schema.createIndex('sign_up_attempts_email_created_at_idx').on('sign_up_attempts').columns(['email', 'created_at']).execute();
  await db.schema.createIndex('sign_up_attempts_ip_created_at_idx').on('sign_up_attempts').columns(['ip', 'created_at']).execute();
  await db.schema.createIndex('sign_up_attempts_created_at_idx').on('sign_up_attempts').column('created_at').execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.dropTable('sign_up_attempts').execute();
  await db.schema.dropTable('pending_sign_ups').execute();
}
