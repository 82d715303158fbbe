import { type Kysely, sql } from 'kysely';

/*
 * Social sign-in (issue 45; src/social/): sign-in through Google, Microsoft, GitHub or any
 * OpenID provider, for the whole instance (the operator's), not an organization's.
 *
 * - social_connections: one per provider account the operator registered. provider: google,
 *   microsoft (tenant: common, organizations, consumers or one tenant id), github (base_url:
 *   github.com or a GitHub Enterprise Server), oidc (issuer, by discovery). issuer: where the
 *   OpenID ones are discovered (a test points any of them at a provider on loopback). The client
 *   secret is sealed under a key derived from SECRET_KEY. allowed_domains: when not empty, only
 *   addresses in them sign in. state: enabled or disabled (a disabled one signs nobody in, and
 *   its button is gone).
 * - social_identities: a user's identity at a connection, by the provider's subject (OIDC sub,
 *   GitHub's numeric user id), never by email. One per user per connection; a subject belongs to
 *   one user.
 * - sso_sign_ins carries social sign-ins in flight too (state, nonce, PKCE verifier; a link
 *   waiting for its account's proof): connection_id or social_connection_id, exactly one.
 * - sessions.social_connection_id: a session made through a social connection lasts while the
 *   connection is enabled; pending_sign_ins.social_connection_id carries it through a second step.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .createTable('social_connections')
    .addColumn('id', 'serial', (c) => c.primaryKey())
    .addColumn('provider', 'text', (c) => c.notNull().check(sql`provider in ('google', 'microsoft', 'github', 'oidc')`))
    .addColumn('name', 'text', (c) => c.notNull().check(sql`length(name) between 1 and 100`))
    .addColumn('state', 'text', (c) => c.notNull().defaultTo('enabled').check(sql`state in ('enabled', 'disabled')`))
    .addColumn('client_id', 'text', (c) => c.notNull().check(sql`length(client_id) between 1 and 512`))
    .addColumn('client_secret_sealed', 'text', (c) => c.notNull().check(sql`length(client_secret_sealed) <= 4096`))
    .addColumn('issuer', 'text', (c) => c.check(sql`length(issuer) <= 2048`))
    .addColumn('tenant', 'text', (c) => c.check(sql`length(tenant) <= 64`))
    .addColumn('base_url', 'text', (c) => c.check(sql`length(base_url) <= 2048`))
    .addColumn('allowed_domains', sql`text[]`, (c) => c.notNull().defaultTo(sql`'{}'::text[]`).check(sql`cardinality(allowed_domains) <= 100`))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('updated_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addCheckConstraint(
      'social_connections_provider_fields',
      sql`(provider in ('google', 'oidc') and issuer is not null)
       or (provider = 'microsoft' and issuer is not null and tenant is not null)
       or (provider = 'github' and base_url is not null)`,
    )
    .execute();

  await db.schema
    .createTable('social_identities')
    .addColumn('id', 'serial', (c) => c.primaryKey())
    .addColumn('connection_id', 'integer', (c) => c.notNull().references('social_connections.id').onDelete('cascade'))
    .addColumn('user_id', 'integer', (c) => c.notNull().references('users.id').onDelete('cascade'))
    .addColumn('subject', 'text', (c) => c.notNull().check(sql`length(subject) between 1 and 1024`))
    .addColumn('email', 'text', (c) => c.check(sql`length(email) <= 320`))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('last_used_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addUniqueConstraint('social_identities_subject', ['connection_id', 'subject'])
    .addUniqueConstraint('social_identities_user', ['connection_id', 'user_id'])
    .execute();
  await db.schema.createIndex('social_identities_user_id').on('social_identities').column('user_id').execute();

  await sql`alter table sso_sign_ins
    alter column connection_id drop not null,
    add column social_connection_id integer references social_connections(id) on delete cascade,
    add constraint sso_sign_ins_one_connection check ((connection_id is null) <> (social_connection_id is null))`.execute(db);
  await sql`alter table sessions add column social_connection_id integer references social_connections(id) on delete cascade`.execute(db);
  await sql`create index sessions_social_connection on sessions (social_connection_id) where social_connection_id is not null`.execute(db);
  await sql`alter table pending_sign_ins add column social_connection_id integer references social_connections(id) on delete cascade`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`alter table pending_sign_ins drop column social_connection_id`.execute(db);
  await sql`alter table sessions drop column social_connection_id`.execute(db);
  await sql`delete from sso_sign_ins where connection_id is null`.execute(db);
  await sql`alter table sso_sign_ins drop constraint sso_sign_ins_one_connection, drop column social_connection_id, alter column connection_id set not null`.execute(db);
  await db.schema.dropTable('social_identities').execute();
  await db.schema.dropTable('social_connections').execute();
}
