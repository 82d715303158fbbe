import { type Kysely, sql } from 'kysely';

/*
 * Strong sign-in (issue 24): second factors, passkeys, organizations that require them.
 *
 * - totp_factors: one authenticator app per user. The secret is sealed (AES-256-GCM under a key
 *   derived from SECRET_KEY, as the outbox's bodies are); confirmed_at is null until the user
 *   typed one correct code, and only a confirmed factor counts. last_step is the newest RFC 6238
 *   time step accepted: a code of that step or an older one is refused, so a code is used once.
 *   started_session_hash: the session that started the enrolment, the only one that sees the
 *   key and may confirm it.
 * - recovery_codes: ten single-use codes per user (60 bits of random each, shown once), stored
 *   as HMAC-SHA256 under a key derived from SECRET_KEY, so a copy of the database alone cannot
 *   be searched for them; used_at is set by the statement that accepts one.
 * - passkeys: WebAuthn credentials. credential_id is the authenticator's id (base64url), unique
 *   over the instance; sign_count is the last counter seen (a regression is refused).
 * - sessions.webauthn_challenge: the challenge a signed-in browser was given (to register a
 *   passkey, or to step up with one), cleared by the statement that reads it (single use, bound
 *   to that session).
 * - pending_sign_ins: a browser between its password (or nothing, for a passkey) and its second
 *   step. Not a session: nothing that accepts a session reads this table. It also holds the
 *   WebAuthn challenge that browser was given (single use, bound to this row's cookie).
 * - second_step_failures: wrong second-step codes per user, counted in the database so every
 *   instance sees them; users.second_step_locked_until is set when too many land in the window.
 * - sessions.amr / authorization_codes.amr / grants.amr: how the user signed in (RFC 8176
 *   values): the ID token's amr and acr, and what an organization that requires two factors
 *   checks.
 * - organizations.require_mfa: members reach this organization only after two factors.
 * - account_events: a user's own security log (factors added and removed, recovery codes used,
 *   the second step locked), shown on the Account page. The organizations' audit log is per
 *   organization; these events belong to the person, whatever organizations they are in.
 */
const AMR = sql`text[] not null default '{}'::text[] check (cardinality(amr) <= 8)`;

export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .createTable('totp_factors')
    .addColumn('user_id', 'integer', (c) => c.primaryKey().references('users.id').onDelete('cascade'))
    .addColumn('secret_sealed', 'text', (c) => c.notNull().check(sql`length(secret_sealed) <= 512`))
    .addColumn('confirmed_at', 'timestamptz')
    .addColumn('last_step', 'bigint')
    .addColumn('started_session_hash', 'text')
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .execute();

  await db.schema
    .createTable('recovery_codes')
    .addColumn('id', 'serial', (c) => c.primaryKey())
    .addColumn('user_id', 'integer', (c) => c.notNull().references('users.id').onDelete('cascade'))
    .addColumn('code_hash', 'text', (c) => c.notNull())
    .addColumn('used_at', 'timestamptz')
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .execute();
  await db.schema.createIndex('recovery_codes_user_code').on('recovery_codes').columns(['user_id', 'code_hash']).unique().execute();

  await db.schema
    .createTable('passkeys')
    .addColumn('id', 'serial', (c) => c.primaryKey())
    .addColumn('user_id', 'integer', (c) => c.notNull().references('users.id').onDelete('cascade'))
    .addColumn('credential_id', 'text', (c) => c.notNull().unique().check(sql`length(credential_id) <= 1400`))
    .addColumn('public_key', 'bytea', (c) => c.notNull())
    .addColumn('sign_count', 'bigint', (c) => c.notNull().defaultTo(0))
    .addColumn('transports', sql`text[]`, (c) => c.notNull().defaultTo(sql`'{}'::text[]`))
    .addColumn('backed_up', 'boolean', (c) => c.notNull().defaultTo(false))
    .addColumn('name', 'text', (c) => c.notNull().check(sql`length(name) between 1 and 100`))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('last_used_at', 'timestamptz')
    .execute();
  await db.schema.createIndex('passkeys_user').on('passkeys').column('user_id').execute();

  await db.schema
    .createTable('pending_sign_ins')
    .addColumn('id_hash', 'text', (c) => c.primaryKey())
    .addColumn('user_id', 'integer', (c) => c.references('users.id').onDelete('cascade'))
    .addColumn('amr', AMR)
    .addColumn('return_to', 'text', (c) => c.notNull().check(sql`length(return_to) <= 8192`))
    .addColumn('challenge', 'text', (c) => c.check(sql`length(challenge) <= 128`))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('expires_at', 'timestamptz', (c) => c.notNull())
    .execute();
  await db.schema.createIndex('pending_sign_ins_expires').on('pending_sign_ins').column('expires_at').execute();

  await db.schema
    .createTable('second_step_failures')
    .addColumn('id', 'bigserial', (c) => c.primaryKey())
    .addColumn('user_id', 'integer', (c) => c.notNull().references('users.id').onDelete('cascade'))
    .addColumn('failed_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .execute();
  await db.schema.createIndex('second_step_failures_user').on('second_step_failures').columns(['user_id', 'failed_at']).execute();
  await db.schema.createIndex('second_step_failures_failed_at').on('second_step_failures').column('failed_at').execute();
  await db.schema.alterTable('users').addColumn('second_step_locked_until', 'timestamptz').execute();

  await db.schema
    .createTable('account_events')
    .addColumn('id', 'bigserial', (c) => c.primaryKey())
    .addColumn('user_id', 'integer', (c) => c.notNull().references('users.id').onDelete('cascade'))
    .addColumn('action', 'text', (c) => c.notNull())
    .addColumn('details', 'jsonb', (c) => c.notNull().defaultTo(sql`'{}'::jsonb`))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .execute();
  await db.schema.createIndex('account_events_user').on('account_events').columns(['user_id', 'id']).execute();

  for (const table of ['sessions', 'authorization_codes', 'grants']) {
    await sql`alter table ${sql.table(table)} add column amr ${AMR}`.execute(db);
  }
  // The WebAuthn challenge a signed-in browser was given to register a passkey (single use).
  await db.schema.alterTable('sessions').addColumn('webauthn_challenge', 'text', (c) => c.check(sql`length(webauthn_challenge) <= 128`)).execute();
  // Sessions that exist already were all made by a password.
  await sql`update sessions set amr = array['pwd']`.execute(db);
  await db.schema.alterTable('organizations').addColumn('require_mfa', 'boolean', (c) => c.notNull().defaultTo(false)).execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('organizations').dropColumn('require_mfa').execute();
  for (const table of ['grants', 'authorization_codes', 'sessions']) await db.schema.alterTable(table).dropColumn('amr').execute();
  await db.schema.alterTable('sessions').dropColumn('webauthn_challenge').execute();
  await db.schema.alterTable('users').dropColumn('second_step_locked_until').execute();
  for (const table of ['account_events', 'second_step_failures', 'pending_sign_ins', 'passkeys', 'recovery_codes', 'totp_factors']) await db.schema.dropTable(table).execute();
}
