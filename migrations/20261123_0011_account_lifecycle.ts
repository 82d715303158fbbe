import { type Kysely, sql } from 'kysely';

/*
 * The account lifecycle (issue 14): verified email addresses, links sent by email (verification,
 * password reset), invitations, and the mail outbox they are sent from.
 *
 * - users.email_verified_at: when the user proved they read mail at their address. Accounts
 *   that exist before this migration are taken as verified: until now every account was trusted
 *   to be added to organizations, and taking that away from them on upgrade would break their
 *   organizations' routines without making anything safer.
 * - account_tokens: the links sent to a user (verify an address, reset the password). Only the
 *   SHA-256 of each 256-bit token is kept; a token is used once (used_at), expires, and all of a
 *   user's tokens end when the password changes. Used rows stay until retention deletes them:
 *   they count toward the hourly limits on links sent. `email` is the address a verification link
 *   confirms: the sign-up address, or the new address of an email change.
 * - invitations: an address invited into an organization with a role. Pending invitations are
 *   listed per organization in id order, from a partial index that holds only those not yet
 *   accepted or revoked; at most one is pending per organization and address.
 * - mail_outbox: every message is written here first, in the transaction of the change that
 *   causes it, and sent afterwards by any instance (src/mail/outbox.ts): a mail server that is
 *   down delays a message but never loses it or fails a request. Bodies are encrypted (they
 *   carry links) and cleared once sent; sent and failed messages go after a week (expires_at).
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('users').addColumn('email_verified_at', 'timestamptz').execute();
  await sql`update users set email_verified_at = created_at`.execute(db);

  await db.schema
    .createTable('account_tokens')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('token_hash', 'text', (c) => c.notNull().unique())
    .addColumn('purpose', 'text', (c) => c.notNull().check(sql`purpose in ('verify_email', 'reset_password')`))
    .addColumn('user_id', 'bigint', (c) => c.notNull().references('users.id').onDelete('cascade'))
    .addColumn('email', 'text', (c) => c.notNull().check(sql`length(email) <= 254`))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('expires_at', 'timestamptz', (c) => c.notNull())
    .addColumn('used_at', 'timestamptz')
    .execute();
  await db.schema.createIndex('account_tokens_user_id_purpose_idx').on('account_tokens').columns(['user_id', 'purpose', 'created_at']).execute();
  await db.schema.createIndex('account_tokens_expires_at_idx').on('account_tokens').column('expires_at').execute();

  await db.schema
    .createTable('invitations')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('organization_id', 'bigint', (c) => c.notNull().references('organizations.id').onDelete('cascade'))
    .addColumn('email', 'text', (c) => c.notNull().check(sql`length(email) <= 254`))
    .addColumn('role', 'text', (c) => c.notNull().check(sql`role in ('owner', 'admin', 'member')`))
    .addColumn('token_hash', 'text', (c) => c.notNull().unique())
    .addColumn('invited_by_user_id', 'bigint', (c) => c.references('users.id').onDelete('set null'))
    .addColumn('invited_by_client_id', 'text')
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('sent_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('expires_at', 'timestamptz', (c) => c.notNull())
    .addColumn('accepted_at', 'timestamptz')
    .addColumn('accepted_by_user_id', 'bigint', (c) => c.references('users.id').onDelete('set null'))
    .addColumn('revoked_at', 'timestamptz')
    .execute();
  await sql`create index invitations_pending_organization_id_id_idx on invitations (organization_id, id)
    where accepted_at is null and revoked_at is null`.execute(db);
  await db.schema.createIndex('invitations_expires_at_idx').on('invitations').column('expires_at').execute();
  // The hourly cap on invitations an organization sends counts through this.
  await db.schema.createIndex('invitations_organization_id_sent_at_idx').on('invitations').columns(['organization_id', 'sent_at']).execute();
  await sql`create unique index invitations_pending_organization_id_email_key on invitations (organization_id, lower(email))
    where accepted_at is null and revoked_at is null`.execute(db);

  await db.schema
    .createTable('mail_outbox')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('recipient', 'text', (c) => c.notNull().check(sql`length(recipient) <= 254`))
    .addColumn('subject', 'text', (c) => c.notNull())
    .addColumn('body_encrypted', 'text')
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('attempts', 'integer', (c) => c.notNull().defaultTo(0))
    .addColumn('next_attempt_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('last_error', 'text')
    .addColumn('sent_at', 'timestamptz')
    .addColumn('failed_at', 'timestamptz')
    .addColumn('expires_at', 'timestamptz')
    .execute();
  await sql`create index mail_outbox_due_idx on mail_outbox (next_attempt_at) where sent_at is null and failed_at is null`.execute(db);
  await db.schema.createIndex('mail_outbox_expires_at_idx').on('mail_outbox').column('expires_at').execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.dropTable('mail_outbox').execute();
  await db.schema.dropTable('invitations').execute();
  await db.schema.dropTable('account_tokens').execute();
  await db.schema.alterTable('users').dropColumn('email_verified_at').execute();
}
