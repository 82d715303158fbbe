import { type Kysely, sql } from 'kysely';

/*
 * Agents and MCP servers (issue 26): resources (RFC 8707), clients nobody registered by hand
 * (RFC 7591 dynamic registration, client ID metadata documents), and the device grant (RFC 8628).
 *
 * - resources: what a token may be for besides orgauth's own API, registered by the instance's
 *   operator (as signing keys are). uri is stored in canonical form (helpers/resources.ts), so
 *   uniqueness is on what clients mean, not how they spelled it. scopes: the names a token for it
 *   may carry, from orgauth's vocabulary or declared by the resource (those join the roles'
 *   permissions: owner, admin and member hold them). access_token_ttl: its tokens' lifetime.
 * - applications.registration: developer (created by a member, the CLI or the management API),
 *   dynamic (RFC 7591 /oauth/register) or metadata_document (client_id is the URL of its
 *   metadata document; the row caches what the document said). Only developer applications
 *   belong to an organization; the others belong to none (organization_id null), and are public.
 * - applications.token_endpoint_auth_method: none for public clients without a secret (PKCE
 *   then required); client_secret_hash is null exactly for those.
 * - applications.grant_types: what the token endpoint takes from a public application (RFC 7591
 *   §2); a private one uses client_credentials only, whatever the column says.
 * - applications.registration_token_hash: RFC 7592's registration access token (its SHA-256).
 *   registered_ip: where a dynamic registration came from. first_used_at: when it first
 *   obtained a token (never: reaped after a day). metadata_fetched_at: a metadata document's
 *   last successful fetch.
 * - client_registrations: one row per successful dynamic registration, when and from where (an
 *   IPv4 address, or an IPv6 address's /64: src/lib/client-address.ts addressGroup). The
 *   per-address limit counts these rather than applications, so a client that deletes its
 *   registrations (RFC 7592) does not get its allowance back. Deleted an hour on (retention).
 * - grants, authorization_codes, device_authorizations .resource_id: the resource the token is
 *   for (null: orgauth's API); deleting a resource ends its grants.
 * - device_authorizations: RFC 8628. device_code_hash: SHA-256 of the device code; user_code: the
 *   short code a person types, unique among pending ones. status: pending → approved or denied
 *   (by the user on /device), approved → consumed (by the token request that redeems it, which
 *   creates the grant), or expired by time. last_polled_at and interval: slow_down.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .createTable('resources')
    .addColumn('id', 'serial', (c) => c.primaryKey())
    .addColumn('uri', 'text', (c) => c.notNull().unique().check(sql`length(uri) between 1 and 2000`))
    .addColumn('name', 'text', (c) => c.notNull().check(sql`length(btrim(name)) between 1 and 200`))
    .addColumn('scopes', sql`text[]`, (c) => c.notNull().defaultTo(sql`'{}'::text[]`).check(sql`cardinality(scopes) <= 100`))
    .addColumn('access_token_ttl', 'integer', (c) => c.notNull().defaultTo(3600).check(sql`access_token_ttl between 60 and 86400`))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('updated_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .execute();

  await sql`alter table applications
    add column registration text not null default 'developer' check (registration in ('developer', 'dynamic', 'metadata_document')),
    add column token_endpoint_auth_method text not null default 'client_secret_basic'
      check (token_endpoint_auth_method in ('client_secret_basic', 'client_secret_post', 'none')),
    add column grant_types text[] not null default '{authorization_code,refresh_token}'::text[],
    add column registration_token_hash text check (registration_token_hash ~ '^[0-9a-f]{64}$'),
    add column registered_ip text,
    add column first_used_at timestamptz,
    add column metadata_fetched_at timestamptz,
    alter column organization_id drop not null,
    alter column client_secret_hash drop not null`.execute(db);
  await sql`update applications set grant_types = '{client_credentials}' where type = 'private'`.execute(db);
  await sql`alter table applications
    add constraint applications_owner_check check ((organization_id is null) = (registration <> 'developer')),
    add constraint applications_registered_public_check check (registration = 'developer' or type = 'public'),
    add constraint applications_secret_check check ((client_secret_hash is null) = (token_endpoint_auth_method = 'none')),
    add constraint applications_grant_types_check check (
      grant_types <@ '{authorization_code,refresh_token,client_credentials,urn:ietf:params:oauth:grant-type:device_code}'::text[]
      and cardinality(grant_types) >= 1),
    drop constraint applications_redirect_uris_check,
    add constraint applications_redirect_uris_check check (
      (type = 'public' and cardinality(redirect_uris) <= 20 and (cardinality(redirect_uris) >= 1 or not ('authorization_code' = any(grant_types))))
      or (type = 'private' and cardinality(redirect_uris) = 0))`.execute(db);
  // The global cap counts the dynamic registrations; the reaper finds the unused.
  await db.schema.createIndex('applications_registered_ip_idx').on('applications').columns(['registered_ip', 'created_at']).where(sql.ref('registered_ip'), 'is not', null).execute();
  await db.schema
    .createIndex('applications_unused_registrations_idx')
    .on('applications')
    .column('created_at')
    .where(sql<boolean>`registration <> 'developer' and first_used_at is null`)
    .execute();

  await db.schema
    .createTable('client_registrations')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('ip', 'text', (c) => c.notNull().check(sql`length(ip) between 1 and 100`))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .execute();
  // The per-address limit: an address's registrations of the last hour. Retention: the older ones.
  await db.schema.createIndex('client_registrations_ip_created_at_idx').on('client_registrations').columns(['ip', 'created_at']).execute();
  await db.schema.createIndex('client_registrations_created_at_idx').on('client_registrations').column('created_at').execute();

  for (const table of ['grants', 'authorization_codes']) {
    await sql`alter table ${sql.table(table)} add column resource_id integer references resources(id) on delete cascade`.execute(db);
    await sql`create index ${sql.raw(`${table}_resource_id_idx`)} on ${sql.table(table)} (resource_id) where resource_id is not null`.execute(db);
  }

  await db.schema
    .createTable('device_authorizations')
    .addColumn('id', 'bigint', (c) => c.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('device_code_hash', 'text', (c) => c.notNull().unique().check(sql`device_code_hash ~ '^[0-9a-f]{64}$'`))
    .addColumn('user_code', 'text', (c) => c.notNull().check(sql`user_code ~ '^[A-Z]{8}$'`))
    .addColumn('application_id', 'bigint', (c) => c.notNull().references('applications.id').onDelete('cascade'))
    .addColumn('resource_id', 'integer', (c) => c.references('resources.id').onDelete('cascade'))
    .addColumn('scopes', sql`text[]`, (c) => c.notNull())
    .addColumn('identity_scopes', sql`text[]`, (c) => c.notNull().defaultTo(sql`'{}'::text[]`))
    .addColumn('status', 'text', (c) => c.notNull().defaultTo('pending').check(sql`status in ('pending', 'approved', 'denied', 'consumed')`))
    // Set when the user decides: who, for which organization, what they granted, how they signed in.
    .addColumn('user_id', 'bigint', (c) => c.references('users.id').onDelete('cascade'))
    .addColumn('organization_id', 'bigint', (c) => c.references('organizations.id').onDelete('cascade'))
    .addColumn('granted_scopes', sql`text[]`)
    .addColumn('auth_time', 'timestamptz')
    .addColumn('amr', sql`text[]`, (c) => c.notNull().defaultTo(sql`'{}'::text[]`))
    .addColumn('grant_id', 'bigint', (c) => c.references('grants.id').onDelete('set null'))
    .addColumn('interval_s', 'integer', (c) => c.notNull().defaultTo(5))
    .addColumn('last_polled_at', 'timestamptz')
    .addColumn('expires_at', 'timestamptz', (c) => c.notNull())
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addCheckConstraint('device_authorizations_decided_check', sql`(status = 'pending') = (user_id is null)`)
    .execute();
  // A user code names one pending authorization; consumed, denied and expired ones keep theirs until purged.
  await sql`create unique index device_authorizations_user_code_key on device_authorizations (user_code) where status = 'pending'`.execute(db);
  await db.schema.createIndex('device_authorizations_expires_at_idx').on('device_authorizations').column('expires_at').execute();
  await db.schema.createIndex('device_authorizations_application_id_idx').on('device_authorizations').column('application_id').execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.dropTable('device_authorizations').execute();
  await db.schema.dropTable('client_registrations').execute();
  for (const table of ['grants', 'authorization_codes']) await sql`alter table ${sql.table(table)} drop column resource_id`.execute(db);
  await sql`delete from applications where registration <> 'developer'`.execute(db);
  await sql`alter table applications
    drop constraint applications_owner_check,
    drop constraint applications_registered_public_check,
    drop constraint applications_secret_check,
    drop constraint applications_grant_types_check,
    drop constraint applications_redirect_uris_check,
    add constraint applications_redirect_uris_check check (
      (type = 'public' and cardinality(redirect_uris) between 1 and 20) or (type = 'private' and cardinality(redirect_uris) = 0)),
    drop column registration, drop column token_endpoint_auth_method, drop column grant_types,
    drop column registration_token_hash, drop column registered_ip, drop column first_used_at, drop column metadata_fetched_at,
    alter column organization_id set not null,
    alter column client_secret_hash set not null`.execute(db);
  await db.schema.dropTable('resources').execute();
}
