import { type Kysely, sql } from 'kysely';

/*
 * Single sign-on per organization (issue 25): the organization's own identity providers, the
 * email domains it proved it owns, and the upstream identities of its people.
 *
 * - sso_connections: an organization's OpenID provider or SAML IdP. state: draft (set up, not
 *   used), active (routes and signs in), disabled (signs nobody in). jit: whether a first sign-in
 *   of someone unknown makes the user and the membership (with default_role / default_role_id,
 *   as invitations hold a role). OIDC: issuer (discovery), client id, the client secret sealed
 *   under a key derived from SECRET_KEY, scopes. SAML: the IdP's entity ID, SSO URL and signing
 *   certificates (several: a response signed by any of them is accepted, so the IdP can rotate),
 *   and whether IdP-initiated responses are accepted (off by default).
 * - sso_domains: a domain an organization claims. Verified by a DNS TXT record holding
 *   verification_token; only a verified domain routes, provisions or links. A verified domain
 *   belongs to one organization (the partial unique index); pending claims of the same domain by
 *   several organizations may coexist, so nobody can squat a domain by claiming it first.
 *   sso_required: people of that domain sign in through the organization's connection only.
 * - sso_identities: a user's identity at one connection, unique on (connection, issuer, subject
 *   format, subject): OIDC iss + sub, SAML IdP entity ID + NameID format + NameID. Users are found
 *   by this link, never by email alone. One link per user per connection.
 * - sso_sign_ins: a sign-in in flight at an identity provider. handle_hash is the SHA-256 of the
 *   OIDC state, or of the handle a SAML response is finished under; saml_request_id the
 *   AuthnRequest's ID (InResponseTo), consumed by the statement that accepts the response, so
 *   once only across instances. browser_hash binds it to the browser that started it. result:
 *   the verified upstream identity between the protocol step and the account step.
 * - saml_assertion_ids: the replay store. An assertion ID is kept until its NotOnOrAfter (plus
 *   the clock skew), so the same assertion is never accepted twice, on any instance.
 * - sessions.sso_connection_id: the connection a session was signed in through; ended with it.
 * - users.password_hash is null for someone who has only ever signed in through their company;
 *   users_email_domain indexes the addresses' domain part (SSO required ends a domain's password
 *   sessions at once).
 * - sso_connections.links_existing_accounts: whether the connection may link an existing account
 *   by its verified email without the account's own proof. Only a connection whose trust
 *   (issuer, client, IdP, certificates) an owner or the operator set last may; one an admin or an
 *   application set makes new members but takes over no existing account (an admin must not
 *   become an owner by pointing a connection at an IdP of their own).
 * - removed_members: who an organization removed. Automation (just-in-time provisioning) never
 *   adds them back; an admin or an invitation does, and clears the row.
 * - applications_management_scopes_check also keeps the new management scopes (sso.read,
 *   sso.write) off public applications.
 */
const MANAGEMENT_SCOPES_BEFORE = sql`array['applications.read', 'applications.write', 'members.read', 'members.write', 'grants.read', 'grants.write', 'audit.read']::text[]`;
const MANAGEMENT_SCOPES = sql`array['applications.read', 'applications.write', 'members.read', 'members.write', 'grants.read', 'grants.write', 'audit.read', 'sso.read', 'sso.write']::text[]`;

async function checkManagementScopes(db: Kysely<any>, scopes: typeof MANAGEMENT_SCOPES): Promise<void> {
  await sql`alter table applications drop constraint applications_management_scopes_check`.execute(db);
  await sql`alter table applications add constraint applications_management_scopes_check check (type = 'private' or not (scopes && ${scopes}))`.execute(db);
}

export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .createTable('sso_connections')
    .addColumn('id', 'serial', (c) => c.primaryKey())
    .addColumn('organization_id', 'integer', (c) => c.notNull().references('organizations.id').onDelete('cascade'))
    .addColumn('protocol', 'text', (c) => c.notNull().check(sql`protocol in ('oidc', 'saml')`))
    .addColumn('name', 'text', (c) => c.notNull().check(sql`length(name) between 1 and 100`))
    .addColumn('state', 'text', (c) => c.notNull().defaultTo('active').check(sql`state in ('draft', 'active', 'disabled')`))
    .addColumn('jit', 'boolean', (c) => c.notNull().defaultTo(true))
    .addColumn('default_role', 'text', (c) => c.notNull().defaultTo('member'))
    .addColumn('default_role_id', 'integer', (c) => c.references('roles.id').onDelete('restrict'))
    .addColumn('oidc_issuer', 'text', (c) => c.check(sql`length(oidc_issuer) <= 2048`))
    .addColumn('oidc_client_id', 'text', (c) => c.check(sql`length(oidc_client_id) <= 512`))
    .addColumn('oidc_client_secret_sealed', 'text', (c) => c.check(sql`length(oidc_client_secret_sealed) <= 4096`))
    .addColumn('oidc_scopes', 'text', (c) => c.check(sql`length(oidc_scopes) <= 1024`))
    .addColumn('saml_idp_entity_id', 'text', (c) => c.check(sql`length(saml_idp_entity_id) <= 1024`))
    .addColumn('saml_idp_sso_url', 'text', (c) => c.check(sql`length(saml_idp_sso_url) <= 2048`))
    .addColumn('saml_idp_certificates', sql`text[]`, (c) => c.notNull().defaultTo(sql`'{}'::text[]`).check(sql`cardinality(saml_idp_certificates) <= 5`))
    .addColumn('saml_idp_initiated', 'boolean', (c) => c.notNull().defaultTo(false))
    .addColumn('links_existing_accounts', 'boolean', (c) => c.notNull().defaultTo(false))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('updated_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addCheckConstraint(
      'sso_connections_protocol_fields',
      sql`(protocol = 'oidc' and oidc_issuer is not null and oidc_client_id is not null and oidc_scopes is not null)
       or (protocol = 'saml' and saml_idp_entity_id is not null and saml_idp_sso_url is not null and cardinality(saml_idp_certificates) >= 1)`,
    )
    .execute();
  await db.schema.createIndex('sso_connections_organization').on('sso_connections').columns(['organization_id', 'id']).execute();

  await db.schema
    .createTable('sso_domains')
    .addColumn('id', 'serial', (c) => c.primaryKey())
    .addColumn('organization_id', 'integer', (c) => c.notNull().references('organizations.id').onDelete('cascade'))
    .addColumn('domain', 'text', (c) => c.notNull().check(sql`length(domain) between 3 and 253 and domain = lower(domain)`))
    .addColumn('state', 'text', (c) => c.notNull().defaultTo('pending').check(sql`state in ('pending', 'verified')`))
    .addColumn('verification_token', 'text', (c) => c.notNull())
    .addColumn('sso_required', 'boolean', (c) => c.notNull().defaultTo(false))
    .addColumn('verified_at', 'timestamptz')
    .addColumn('checked_at', 'timestamptz')
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addUniqueConstraint('sso_domains_organization_domain', ['organization_id', 'domain'])
    .execute();
  await db.schema.createIndex('sso_domains_verified_domain').on('sso_domains').column('domain').unique().where(sql.ref('state'), '=', 'verified').execute();

  await db.schema
    .createTable('sso_identities')
    .addColumn('id', 'serial', (c) => c.primaryKey())
    .addColumn('connection_id', 'integer', (c) => c.notNull().references('sso_connections.id').onDelete('cascade'))
    .addColumn('user_id', 'integer', (c) => c.notNull().references('users.id').onDelete('cascade'))
    .addColumn('issuer', 'text', (c) => c.notNull().check(sql`length(issuer) <= 2048`))
    .addColumn('subject_format', 'text', (c) => c.notNull().check(sql`length(subject_format) <= 256`))
    .addColumn('subject', 'text', (c) => c.notNull().check(sql`length(subject) <= 1024`))
    .addColumn('email', 'text', (c) => c.check(sql`length(email) <= 320`))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('last_used_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addUniqueConstraint('sso_identities_subject', ['connection_id', 'issuer', 'subject_format', 'subject'])
    .addUniqueConstraint('sso_identities_user', ['connection_id', 'user_id'])
    .execute();
  await db.schema.createIndex('sso_identities_user_id').on('sso_identities').column('user_id').execute();

  await db.schema
    .createTable('sso_sign_ins')
    .addColumn('id', 'bigserial', (c) => c.primaryKey())
    .addColumn('handle_hash', 'text', (c) => c.notNull().unique())
    .addColumn('connection_id', 'integer', (c) => c.notNull().references('sso_connections.id').onDelete('cascade'))
    .addColumn('browser_hash', 'text')
    .addColumn('return_to', 'text', (c) => c.notNull().check(sql`length(return_to) <= 8192`))
    .addColumn('oidc_nonce', 'text')
    .addColumn('oidc_code_verifier_sealed', 'text')
    .addColumn('saml_request_id', 'text', (c) => c.unique().check(sql`length(saml_request_id) <= 128`))
    .addColumn('result', 'jsonb')
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('expires_at', 'timestamptz', (c) => c.notNull())
    .addColumn('consumed_at', 'timestamptz')
    .execute();
  await db.schema.createIndex('sso_sign_ins_expires').on('sso_sign_ins').column('expires_at').execute();

  await db.schema
    .createTable('saml_assertion_ids')
    .addColumn('id', 'bigserial', (c) => c.primaryKey())
    .addColumn('connection_id', 'integer', (c) => c.notNull().references('sso_connections.id').onDelete('cascade'))
    .addColumn('assertion_id', 'text', (c) => c.notNull().check(sql`length(assertion_id) <= 256`))
    .addColumn('expires_at', 'timestamptz', (c) => c.notNull())
    .addUniqueConstraint('saml_assertion_ids_assertion', ['connection_id', 'assertion_id'])
    .execute();
  await db.schema.createIndex('saml_assertion_ids_expires').on('saml_assertion_ids').column('expires_at').execute();

  await db.schema
    .createTable('removed_members')
    .addColumn('organization_id', 'integer', (c) => c.notNull().references('organizations.id').onDelete('cascade'))
    .addColumn('user_id', 'integer', (c) => c.notNull().references('users.id').onDelete('cascade'))
    .addColumn('removed_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addPrimaryKeyConstraint('removed_members_pkey', ['organization_id', 'user_id'])
    .execute();

  await db.schema.alterTable('sessions').addColumn('sso_connection_id', 'integer', (c) => c.references('sso_connections.id').onDelete('cascade')).execute();
  await db.schema.createIndex('sessions_sso_connection').on('sessions').column('sso_connection_id').where(sql.ref('sso_connection_id'), 'is not', null).execute();
  await db.schema.alterTable('users').alterColumn('password_hash', (c) => c.dropNotNull()).execute();
  // The people of a domain (SSO required ends their password sessions at once).
  await sql`create index users_email_domain on users ((split_part(lower(email), '@', 2)))`.execute(db);
  await checkManagementScopes(db, MANAGEMENT_SCOPES);
}

export async function down(db: Kysely<any>): Promise<void> {
  await checkManagementScopes(db, MANAGEMENT_SCOPES_BEFORE);
  await sql`drop index users_email_domain`.execute(db);
  await sql`delete from users where password_hash is null`.execute(db);
  await db.schema.alterTable('users').alterColumn('password_hash', (c) => c.setNotNull()).execute();
  await db.schema.alterTable('sessions').dropColumn('sso_connection_id').execute();
  for (const table of ['removed_members', 'saml_assertion_ids', 'sso_sign_ins', 'sso_identities', 'sso_domains', 'sso_connections']) await db.schema.dropTable(table).execute();
}
