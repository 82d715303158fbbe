import { type Kysely, sql } from 'kysely';

/*
 * The whole data model. Frozen once merged: later changes go in new dated files.
 *
 * Conventions: ids are bigint identities; every org-owned table has organization_id NOT NULL,
 * a foreign key and an index led by organization_id; secrets (client secrets, codes, refresh
 * tokens, session ids) are stored only as hex SHA-256 digests.
 */

const HEX_SHA256 = (column: string) => sql.raw(`${column} ~ '^[0-9a-f]{64}$'`);

export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .createTable('users')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('email', 'text', (c) => c.notNull().check(sql`length(email) between 3 and 254 and position('@' in email) > 1`))
    .addColumn('password_hash', 'text', (c) => c.notNull().check(sql`password_hash like '$argon2id$%'`))
    .addColumn('name', 'text', (c) => c.notNull().defaultTo('').check(sql`length(name) <= 200`))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('updated_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .execute();
  // Emails are unique case-insensitively; lookups use lower(email) so they hit this index.
  await db.schema.createIndex('users_email_lower_key').on('users').unique().expression(sql`lower(email)`).execute();

  await db.schema
    .createTable('organizations')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('name', 'text', (c) => c.notNull().check(sql`length(btrim(name)) between 1 and 200`))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('updated_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .execute();

  await db.schema
    .createTable('memberships')
    .addColumn('organization_id', 'bigint', (c) => c.notNull().references('organizations.id').onDelete('cascade'))
    .addColumn('user_id', 'bigint', (c) => c.notNull().references('users.id').onDelete('cascade'))
    .addColumn('role', 'text', (c) => c.notNull().check(sql`role in ('owner', 'admin', 'member')`))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addPrimaryKeyConstraint('memberships_pkey', ['organization_id', 'user_id'])
    .execute();
  // "Which organizations does this user belong to?" (consent page, dashboard switcher).
  await db.schema.createIndex('memberships_user_id_idx').on('memberships').column('user_id').execute();

  await db.schema
    .createTable('applications')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('organization_id', 'bigint', (c) => c.notNull().references('organizations.id').onDelete('cascade'))
    .addColumn('client_id', 'text', (c) => c.notNull().unique())
    .addColumn('client_secret_hash', 'text', (c) => c.notNull().check(HEX_SHA256('client_secret_hash')))
    .addColumn('type', 'text', (c) => c.notNull().check(sql`type in ('public', 'private')`))
    .addColumn('name', 'text', (c) => c.notNull().check(sql`length(btrim(name)) between 1 and 200`))
    .addColumn('redirect_uris', sql`text[]`, (c) => c.notNull().defaultTo(sql`'{}'::text[]`))
    .addColumn('scopes', sql`text[]`, (c) => c.notNull())
    .addColumn('require_pkce', 'boolean', (c) => c.notNull().defaultTo(false))
    .addColumn('disabled', 'boolean', (c) => c.notNull().defaultTo(false))
    .addColumn('secret_rotated_at', 'timestamptz')
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('updated_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    // Public applications redirect users back and need at least one URI; private ones never redirect.
    .addCheckConstraint(
      'applications_redirect_uris_check',
      sql`(type = 'public' and cardinality(redirect_uris) between 1 and 20) or (type = 'private' and cardinality(redirect_uris) = 0)`,
    )
    .addCheckConstraint('applications_scopes_check', sql`cardinality(scopes) >= 1`)
    .execute();
  await db.schema.createIndex('applications_organization_id_idx').on('applications').columns(['organization_id', 'id']).execute();

  await db.schema
    .createTable('grants')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('organization_id', 'bigint', (c) => c.notNull().references('organizations.id').onDelete('cascade'))
    .addColumn('application_id', 'bigint', (c) => c.notNull().references('applications.id').onDelete('cascade'))
    // null: the application acting for itself (client_credentials, "Generate Token").
    .addColumn('user_id', 'bigint', (c) => c.references('users.id').onDelete('cascade'))
    .addColumn('scopes', sql`text[]`, (c) => c.notNull())
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('last_used_at', 'timestamptz')
    .addColumn('revoked_at', 'timestamptz')
    .addColumn('revoked_reason', 'text')
    .addCheckConstraint('grants_revoked_check', sql`(revoked_at is null) = (revoked_reason is null)`)
    .execute();
  // Also the target of refresh_tokens' (organization_id, grant_id) foreign key.
  await db.schema.createIndex('grants_organization_id_id_key').on('grants').unique().columns(['organization_id', 'id']).execute();
  await db.schema.createIndex('grants_application_id_idx').on('grants').column('application_id').execute();
  await db.schema.createIndex('grants_user_id_idx').on('grants').columns(['user_id', 'organization_id']).execute();
  // Instances load the revoked set at start; keep that scan small.
  await db.schema.createIndex('grants_revoked_at_idx').on('grants').column('revoked_at').where(sql.ref('revoked_at'), 'is not', null).execute();

  await db.schema
    .createTable('authorization_codes')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('code_hash', 'text', (c) => c.notNull().unique().check(HEX_SHA256('code_hash')))
    .addColumn('organization_id', 'bigint', (c) => c.notNull().references('organizations.id').onDelete('cascade'))
    .addColumn('application_id', 'bigint', (c) => c.notNull().references('applications.id').onDelete('cascade'))
    .addColumn('user_id', 'bigint', (c) => c.notNull().references('users.id').onDelete('cascade'))
    .addColumn('redirect_uri', 'text', (c) => c.notNull())
    .addColumn('scopes', sql`text[]`, (c) => c.notNull())
    .addColumn('code_challenge', 'text')
    .addColumn('code_challenge_method', 'text', (c) => c.check(sql`code_challenge_method = 'S256'`))
    .addColumn('expires_at', 'timestamptz', (c) => c.notNull())
    .addColumn('consumed_at', 'timestamptz')
    // The grant created when the code was redeemed, so a replay can revoke it (RFC 6749 §4.1.2).
    .addColumn('grant_id', 'bigint', (c) => c.references('grants.id').onDelete('set null'))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addCheckConstraint('authorization_codes_pkce_check', sql`(code_challenge is null) = (code_challenge_method is null)`)
    .execute();
  await db.schema.createIndex('authorization_codes_organization_id_idx').on('authorization_codes').columns(['organization_id', 'id']).execute();
  await db.schema.createIndex('authorization_codes_expires_at_idx').on('authorization_codes').column('expires_at').execute();

  await db.schema
    .createTable('refresh_tokens')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('token_hash', 'text', (c) => c.notNull().unique().check(HEX_SHA256('token_hash')))
    .addColumn('organization_id', 'bigint', (c) => c.notNull().references('organizations.id').onDelete('cascade'))
    .addColumn('grant_id', 'bigint', (c) => c.notNull())
    .addColumn('parent_id', 'bigint', (c) => c.references('refresh_tokens.id').onDelete('set null'))
    .addColumn('scopes', sql`text[]`, (c) => c.notNull())
    .addColumn('expires_at', 'timestamptz', (c) => c.notNull())
    .addColumn('rotated_at', 'timestamptz')
    .addColumn('revoked_at', 'timestamptz')
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    // A refresh token belongs to a grant of its own organization.
    .addForeignKeyConstraint('refresh_tokens_grant_fkey', ['organization_id', 'grant_id'], 'grants', ['organization_id', 'id'], (fk) =>
      fk.onDelete('cascade'),
    )
    .execute();
  await db.schema.createIndex('refresh_tokens_organization_id_grant_id_idx').on('refresh_tokens').columns(['organization_id', 'grant_id']).execute();
  await db.schema.createIndex('refresh_tokens_grant_id_idx').on('refresh_tokens').column('grant_id').execute();
  await db.schema.createIndex('refresh_tokens_parent_id_idx').on('refresh_tokens').column('parent_id').execute();
  await db.schema.createIndex('refresh_tokens_expires_at_idx').on('refresh_tokens').column('expires_at').execute();

  await db.schema
    .createTable('signing_keys')
    .addColumn('kid', 'text', (c) => c.primaryKey())
    .addColumn('alg', 'text', (c) => c.notNull().check(sql`alg in ('ES256', 'RS256', 'EdDSA')`))
    .addColumn('public_jwk', 'jsonb', (c) => c.notNull())
    // The private JWK as a compact JWE (dir + A256GCM) under a key derived from SECRET_KEY.
    .addColumn('private_jwk_encrypted', 'text', (c) => c.notNull())
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    // null: the active signing key; set: retired, kept for verification until its tokens expire.
    .addColumn('retired_at', 'timestamptz')
    .execute();
  // At most one active key, even when two instances rotate at once.
  await db.schema
    .createIndex('signing_keys_one_active_key')
    .on('signing_keys')
    .unique()
    .expression(sql`(retired_at is null)`)
    .where(sql.ref('retired_at'), 'is', null)
    .execute();

  await db.schema
    .createTable('sessions')
    .addColumn('id_hash', 'text', (c) => c.primaryKey().check(HEX_SHA256('id_hash')))
    .addColumn('user_id', 'bigint', (c) => c.notNull().references('users.id').onDelete('cascade'))
    // The dashboard's current organization; cleared when the organization goes away.
    .addColumn('current_organization_id', 'bigint', (c) => c.references('organizations.id').onDelete('set null'))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('last_seen_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('expires_at', 'timestamptz', (c) => c.notNull())
    .execute();
  await db.schema.createIndex('sessions_user_id_idx').on('sessions').column('user_id').execute();
  await db.schema.createIndex('sessions_expires_at_idx').on('sessions').column('expires_at').execute();

  await db.schema
    .createTable('audit_events')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('organization_id', 'bigint', (c) => c.notNull().references('organizations.id').onDelete('cascade'))
    // Who did it: a user, an application (client_id), or neither (the system / the CLI).
    .addColumn('actor_user_id', 'bigint', (c) => c.references('users.id').onDelete('set null'))
    .addColumn('actor_client_id', 'text')
    .addColumn('action', 'text', (c) => c.notNull())
    .addColumn('details', 'jsonb', (c) => c.notNull().defaultTo(sql`'{}'::jsonb`))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .execute();
  // Newest first per organization.
  await db.schema.createIndex('audit_events_organization_id_idx').on('audit_events').columns(['organization_id', 'id desc']).execute();

  await db.schema
    .createTable('contacts')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('organization_id', 'bigint', (c) => c.notNull().references('organizations.id').onDelete('cascade'))
    .addColumn('name', 'text', (c) => c.notNull().check(sql`length(btrim(name)) between 1 and 200`))
    .addColumn('email', 'text', (c) => c.check(sql`length(email) <= 254`))
    .addColumn('phone', 'text', (c) => c.check(sql`length(phone) <= 50`))
    .addColumn('company', 'text', (c) => c.check(sql`length(company) <= 200`))
    .addColumn('notes', 'text', (c) => c.check(sql`length(notes) <= 10000`))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('updated_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .execute();
  // Keyset pagination within an organization, and the target of tasks' same-organization foreign key.
  await db.schema.createIndex('contacts_organization_id_id_key').on('contacts').unique().columns(['organization_id', 'id']).execute();

  await db.schema
    .createTable('tasks')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('organization_id', 'bigint', (c) => c.notNull().references('organizations.id').onDelete('cascade'))
    .addColumn('title', 'text', (c) => c.notNull().check(sql`length(btrim(title)) between 1 and 200`))
    .addColumn('description', 'text', (c) => c.check(sql`length(description) <= 10000`))
    .addColumn('status', 'text', (c) => c.notNull().defaultTo('open').check(sql`status in ('open', 'done')`))
    .addColumn('due_on', 'date')
    .addColumn('contact_id', 'bigint')
    .addColumn('completed_at', 'timestamptz')
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('updated_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addCheckConstraint('tasks_completed_check', sql`(status = 'done') = (completed_at is not null)`)
    .execute();
  // A task's contact must belong to the task's organization: enforced by the schema, not by care.
  // Deleting the contact clears only contact_id (PostgreSQL 15+ column list).
  await sql`alter table tasks add constraint tasks_contact_fkey foreign key (organization_id, contact_id)
    references contacts (organization_id, id) on delete set null (contact_id)`.execute(db);
  await db.schema.createIndex('tasks_organization_id_id_idx').on('tasks').columns(['organization_id', 'id']).execute();
  await db.schema.createIndex('tasks_organization_id_contact_id_idx').on('tasks').columns(['organization_id', 'contact_id']).execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  for (const table of [
    'tasks',
    'contacts',
    'audit_events',
    'sessions',
    'signing_keys',
    'refresh_tokens',
    'authorization_codes',
    'grants',
    'applications',
    'memberships',
    'organizations',
    'users',
  ]) {
    await db.schema.dropTable(table).execute();
  }
}
