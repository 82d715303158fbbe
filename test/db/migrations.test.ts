import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectDatabase, type DatabaseHandle } from '../../src/db/connect.js';
import { isForeignKeyViolation, isUniqueViolation } from '../../src/db/errors.js';
import { createMigrator, migrateDownAll, migrateToLatest } from '../../src/db/migrate.js';
import { SeenJtis } from '../../src/oauth/models/seen-jtis.js';
import { BACKEND, createEmptyDatabase, type TestDatabase } from '../helpers/db.js';

/** The data model as schema.ts declares it; a column added to one must be added to the other. */
const EXPECTED_COLUMNS: Record<string, string[]> = {
  users: ['id', 'email', 'password_hash', 'name', 'created_at', 'updated_at', 'email_verified_at', 'second_step_locked_until'],
  organizations: ['id', 'name', 'created_at', 'updated_at', 'require_mfa', 'checklist_dismissed_at'],
  memberships: ['organization_id', 'user_id', 'role', 'created_at', 'role_id'],
  roles: ['id', 'organization_id', 'name', 'description', 'permissions', 'created_at', 'updated_at', 'deleting'],
  applications: [
    'id', 'organization_id', 'client_id', 'client_secret_hash', 'type', 'name', 'redirect_uris', 'scopes',
    'require_pkce', 'disabled', 'secret_rotated_at', 'created_at', 'updated_at', 'post_logout_redirect_uris',
    'registration', 'token_endpoint_auth_method', 'grant_types', 'registration_token_hash', 'registered_ip', 'first_used_at', 'metadata_fetched_at', 'deleted_at',
    'jwks', 'jwks_uri', 'dpop_bound_access_tokens', 'require_pushed_authorization_requests', 'id_token_signed_response_alg', 'fapi2', 'resource_id',
  ],
  grants: ['id', 'organization_id', 'application_id', 'user_id', 'scopes', 'created_at', 'last_used_at', 'revoked_at', 'revoked_reason', 'narrowed_from_grant_id',
    'identity_scopes', 'auth_time', 'sid', 'amr', 'resource_id', 'dpop_jkt', 'sso_connection_id'],
  authorization_codes: [
    'id', 'code_hash', 'organization_id', 'application_id', 'user_id', 'redirect_uri', 'scopes', 'code_challenge',
    'code_challenge_method', 'expires_at', 'consumed_at', 'grant_id', 'created_at', 'identity_scopes', 'auth_time', 'sid', 'nonce', 'amr', 'resource_id', 'dpop_jkt',
    'sso_connection_id',
  ],
  refresh_tokens: ['id', 'token_hash', 'organization_id', 'grant_id', 'parent_id', 'scopes', 'expires_at', 'rotated_at', 'revoked_at', 'created_at'],
  revoked_access_tokens: ['jti', 'organization_id', 'grant_id', 'expires_at', 'revoked_at'],
  signing_keys: ['kid', 'alg', 'public_jwk', 'private_jwk_encrypted', 'created_at', 'retired_at'],
  sessions: ['id_hash', 'user_id', 'current_organization_id', 'created_at', 'last_seen_at', 'expires_at', 'id', 'user_agent', 'ip', 'amr', 'webauthn_challenge', 'sso_connection_id', 'social_connection_id'],
  audit_events: ['id', 'organization_id', 'actor_user_id', 'actor_client_id', 'action', 'details', 'created_at'],
  contacts: ['id', 'organization_id', 'name', 'email', 'phone', 'company', 'notes', 'created_at', 'updated_at'],
  tasks: ['id', 'organization_id', 'title', 'description', 'status', 'due_on', 'contact_id', 'completed_at', 'created_at', 'updated_at'],
  account_tokens: ['id', 'token_hash', 'purpose', 'user_id', 'email', 'created_at', 'expires_at', 'used_at'],
  pending_sign_ups: ['id', 'email', 'token_hash', 'password_hash', 'name', 'organization_name', 'return_to', 'created_at', 'expires_at'],
  sign_up_attempts: ['id', 'email', 'ip', 'created_at'],
  invitations: [
    'id', 'organization_id', 'email', 'role', 'token_hash', 'invited_by_user_id', 'invited_by_client_id', 'created_at', 'sent_at',
    'expires_at', 'accepted_at', 'accepted_by_user_id', 'revoked_at', 'role_id',
  ],
  jobs: [
    'id', 'kind', 'organization_id', 'payload', 'cursor', 'state', 'progress_done', 'progress_total', 'attempts', 'failures', 'due_at', 'instance',
    'last_error', 'created_at', 'started_at', 'updated_at', 'finished_at',
  ],
  webhook_endpoints: [
    'id', 'organization_id', 'url', 'description', 'events', 'enabled', 'disabled_reason', 'secret_sealed', 'previous_secret_sealed',
    'previous_secret_expires_at', 'failing_since', 'created_at', 'updated_at',
  ],
  webhook_events: ['id', 'organization_id', 'type', 'message_id', 'payload', 'created_at'],
  webhook_deliveries: ['id', 'event_id', 'endpoint_id', 'organization_id', 'state', 'attempts', 'next_attempt_at', 'last_status', 'last_error', 'created_at', 'finished_at'],
  webhook_attempts: ['id', 'delivery_id', 'attempt', 'started_at', 'duration_ms', 'status', 'response_body', 'error'],
  mail_outbox: [
    'id', 'recipient', 'subject', 'body_encrypted', 'created_at', 'attempts', 'next_attempt_at', 'last_error', 'sent_at', 'failed_at', 'expires_at',
  ],
  totp_factors: ['user_id', 'secret_sealed', 'confirmed_at', 'last_step', 'started_session_hash', 'created_at'],
  recovery_codes: ['id', 'user_id', 'code_hash', 'used_at', 'created_at'],
  passkeys: ['id', 'user_id', 'credential_id', 'public_key', 'sign_count', 'transports', 'backed_up', 'name', 'created_at', 'last_used_at'],
  pending_sign_ins: ['id_hash', 'user_id', 'amr', 'return_to', 'challenge', 'created_at', 'expires_at', 'social_connection_id'],
  second_step_failures: ['id', 'user_id', 'failed_at'],
  account_events: ['id', 'user_id', 'action', 'details', 'created_at'],
  sso_connections: [
    'id', 'organization_id', 'protocol', 'name', 'state', 'jit', 'default_role', 'default_role_id', 'oidc_issuer', 'oidc_client_id', 'oidc_client_secret_sealed', 'oidc_scopes',
    'saml_idp_entity_id', 'saml_idp_sso_url', 'saml_idp_certificates', 'saml_idp_initiated', 'links_existing_accounts', 'created_at', 'updated_at',
  ],
  sso_domains: ['id', 'organization_id', 'domain', 'state', 'verification_token', 'sso_required', 'verified_at', 'checked_at', 'created_at'],
  sso_identities: ['id', 'connection_id', 'user_id', 'issuer', 'subject_format', 'subject', 'email', 'created_at', 'last_used_at'],
  sso_sign_ins: ['id', 'handle_hash', 'connection_id', 'browser_hash', 'return_to', 'oidc_nonce', 'oidc_code_verifier_sealed', 'saml_request_id', 'result', 'created_at', 'expires_at', 'consumed_at', 'social_connection_id'],
  social_connections: ['id', 'provider', 'name', 'state', 'client_id', 'client_secret_sealed', 'issuer', 'tenant', 'base_url', 'allowed_domains', 'created_at', 'updated_at'],
  social_identities: ['id', 'connection_id', 'user_id', 'subject', 'email', 'created_at', 'last_used_at'],
  saml_assertion_ids: ['id', 'connection_id', 'assertion_id', 'expires_at'],
  removed_members: ['organization_id', 'user_id', 'removed_at', 'restored_at'],
  resources: ['id', 'uri', 'name', 'scopes', 'access_token_ttl', 'created_at', 'updated_at', 'exchange_from'],
  client_registrations: ['id', 'ip', 'created_at'],
  pushed_authorization_requests: ['id', 'request_uri_hash', 'application_id', 'params', 'dpop_jkt', 'expires_at', 'first_used_at', 'consumed_at', 'created_at'],
  seen_jtis: ['key', 'expires_at'],
  activity_daily: ['organization_id', 'metric', 'day', 'count'],
  directories: ['id', 'organization_id', 'name', 'state', 'default_role', 'token_hash', 'token_created_at', 'created_at', 'updated_at'],
  directory_group_roles: ['directory_id', 'group_ref', 'role'],
  directory_users: ['id', 'seq', 'directory_id', 'user_id', 'user_name', 'external_id', 'display_name', 'active', 'resource', 'role', 'version', 'created_at', 'updated_at'],
  directory_groups: ['id', 'seq', 'directory_id', 'display_name', 'external_id', 'version', 'created_at', 'updated_at'],
  directory_group_members: ['group_id', 'user_id'],
  directory_requests: ['id', 'directory_id', 'method', 'path', 'status', 'scim_type', 'created_at'],
  setup_links: ['id', 'organization_id', 'features', 'token_hash', 'created_by_user_id', 'created_at', 'expires_at', 'revoked_at', 'last_used_at'],
  device_authorizations: [
    'id', 'device_code_hash', 'user_code', 'application_id', 'resource_id', 'scopes', 'identity_scopes', 'status', 'user_id', 'organization_id',
    'granted_scopes', 'auth_time', 'amr', 'grant_id', 'interval_s', 'last_polled_at', 'expires_at', 'created_at', 'sso_connection_id',
  ],
};

// applications is not here: a client that registered itself (RFC 7591, a metadata document) belongs to no organization.
const ORG_OWNED = ['memberships', 'roles', 'grants', 'authorization_codes', 'refresh_tokens', 'revoked_access_tokens', 'audit_events', 'contacts', 'tasks', 'invitations', 'sso_connections', 'sso_domains', 'removed_members', 'webhook_endpoints', 'activity_daily', 'directories', 'setup_links'];
const HASH = 'a'.repeat(64);

let database: TestDatabase;
let handle: DatabaseHandle;

beforeAll(async () => {
  database = await createEmptyDatabase();
  handle = await connectDatabase(database.target);
});
afterAll(async () => {
  await handle.close();
  await database.drop();
});

async function tables(): Promise<Record<string, string[]>> {
  const { rows } = await sql<{ table_name: string; column_name: string }>`
    select table_name, column_name from information_schema.columns
    where table_schema = 'public' and table_name not like 'kysely_%'
    order by table_name, ordinal_position`.execute(handle.db);
  const result: Record<string, string[]> = {};
  for (const row of rows) (result[row.table_name] ??= []).push(row.column_name);
  return result;
}

const MIGRATIONS = [
  '20261122_0001_initial',
  '20261122_0002_application_change_notify',
  '20261122_0003_revoked_access_tokens',
  '20261122_0004_token_tables_write_path',
  '20261122_0005_refresh_token_expiry_index',
  '20261123_0006_management_api',
  '20261123_0007_search_and_list_indexes',
  '20261123_0008_revoked_set',
  '20261123_0009_contact_search_probe',
  '20261123_0010_session_details',
  '20261123_0011_account_lifecycle',
  '20261123_0012_organization_roles',
  '20261125_0013_openid_connect',
  '20261126_0014_strong_sign_in',
  '20261126_0015_single_sign_on',
  '20261126_0016_agents_and_resources',
  '20261127_0017_jobs_and_webhooks',
  '20261127_0018_member_removal_job',
  '20261128_0019_high_assurance',
  '20261129_0020_activity',
  '20261130_0021_seen_jtis_digest',
  '20261205_0022_sso_connection_on_grants',
  '20261206_0023_pushed_requests_by_client',
  '20261207_0024_pending_sign_ups',
  '20261208_0025_directories',
  '20261209_0026_directory_resources',
  '20261210_0027_setup_links',
  '20261211_0028_directory_user_filter_indexes',
  '20261212_0029_resource_servers',
  '20261213_0030_social_sign_in',
];

describe(`migrations on ${BACKEND}`, () => {
  it('go up, down and up again, leaving exactly the declared tables and columns', async () => {
    expect(await migrateToLatest(handle.db)).toEqual(MIGRATIONS);
    expect(await tables()).toEqual(EXPECTED_COLUMNS);
    expect(await migrateToLatest(handle.db)).toEqual([]);

    expect(await migrateDownAll(handle.db)).toEqual([...MIGRATIONS].reverse());
    expect(await tables()).toEqual({});

    expect(await migrateToLatest(handle.db)).toEqual(MIGRATIONS);
    expect(await tables()).toEqual(EXPECTED_COLUMNS);
  });

  it('0019 down: an application on keys gets a secret nobody knows and is disabled; the key from before stays the one active key', async () => {
    await migrateToLatest(handle.db);
    const { id: org } = await handle.db.insertInto('organizations').values({ name: 'Keys' }).returning('id').executeTakeFirstOrThrow();
    await handle.db
      .insertInto('applications')
      .values({
        organization_id: org, client_id: 'k'.repeat(32), client_secret_hash: null, type: 'private', name: 'On keys', scopes: ['contacts.read'],
        grant_types: ['client_credentials'], token_endpoint_auth_method: 'private_key_jwt', jwks: JSON.stringify({ keys: [{ kty: 'OKP', crv: 'Ed25519', x: 'x' }] }),
      })
      .execute();
    const key = (kid: string, alg: 'ES256' | 'RS256') => ({ kid, alg, public_jwk: '{}', private_jwk_encrypted: 'x' });
    await handle.db.insertInto('signing_keys').values(key('before', 'ES256')).execute();
    await sql`select pg_sleep(0.01)`.execute(handle.db);
    await handle.db.insertInto('signing_keys').values(key('id-tokens', 'RS256')).execute();
    const { error } = await createMigrator(handle.db).migrateTo('20261127_0018_member_removal_job');
    expect(error).toBeUndefined();
    const { rows } = await sql<{ disabled: boolean; token_endpoint_auth_method: string; client_secret_hash: string | null }>`
      select disabled, token_endpoint_auth_method, client_secret_hash from applications where organization_id = ${org}`.execute(handle.db);
    expect(rows).toEqual([{ disabled: true, token_endpoint_auth_method: 'client_secret_basic', client_secret_hash: expect.stringMatching(/^[0-9a-f]{64}$/) }]);
    const { rows: active } = await sql<{ kid: string }>`select kid from signing_keys where retired_at is null`.execute(handle.db);
    expect(active).toEqual([{ kid: 'before' }]);
    expect(await migrateToLatest(handle.db)).toEqual(MIGRATIONS.slice(MIGRATIONS.indexOf('20261128_0019_high_assurance')));
    await sql`delete from applications where organization_id = ${org}`.execute(handle.db);
    await sql`delete from organizations where id = ${org}`.execute(handle.db);
    await sql`delete from signing_keys`.execute(handle.db);
  });

  it('0021: the replay store keeps the keys seen before the upgrade, as the digests the application now computes', async () => {
    const { error } = await createMigrator(handle.db).migrateTo('20261129_0020_activity');
    expect(error).toBeUndefined();
    const key = 'dpop:NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs:seen-before-the-upgrade';
    await sql`insert into seen_jtis (key, expires_at) values (${key}, now() + interval '1 minute')`.execute(handle.db);
    expect(await migrateToLatest(handle.db)).toEqual(MIGRATIONS.slice(MIGRATIONS.indexOf('20261130_0021_seen_jtis_digest')));
    expect(await new SeenJtis(handle.db).firstUse(key, Math.floor(Date.now() / 1000) + 60)).toBe(false);
    expect(await new SeenJtis(handle.db).firstUse(`${key}-not`, Math.floor(Date.now() / 1000) + 60)).toBe(true);
    await sql`delete from seen_jtis`.execute(handle.db);
  });

  it('give every org-owned table a NOT NULL organization_id, a foreign key to organizations (or through a composite key to an org-owned table that has one) and an index led by it', async () => {
    const { rows: columns } = await sql<{ table_name: string; is_nullable: string }>`
      select table_name, is_nullable from information_schema.columns
      where table_schema = 'public' and column_name = 'organization_id'`.execute(handle.db);
    const { rows: fks } = await sql<{ table_name: string }>`
      select distinct tc.table_name from information_schema.table_constraints tc
      join information_schema.key_column_usage kcu on kcu.constraint_name = tc.constraint_name
      join information_schema.constraint_column_usage ccu on ccu.constraint_name = tc.constraint_name
      where tc.constraint_type = 'FOREIGN KEY' and kcu.column_name = 'organization_id'
        and (ccu.table_name = 'organizations' or ccu.table_name = any(${ORG_OWNED}))`.execute(handle.db);
    const { rows: indexes } = await sql<{ tablename: string; indexdef: string }>`
      select tablename, indexdef from pg_indexes where schemaname = 'public'`.execute(handle.db);
    for (const table of ORG_OWNED) {
      expect(columns.find((c) => c.table_name === table)?.is_nullable, table).toBe('NO');
      expect(fks.map((f) => f.table_name), table).toContain(table);
      expect(
        indexes.some((i) => i.tablename === table && /\(organization_id[,)]/.test(i.indexdef)),
        `${table} has an index led by organization_id`,
      ).toBe(true);
    }
  });
});

describe(`the migrated schema on ${BACKEND}`, () => {
  const db = () => handle.db;

  async function newOrg(name = 'Org'): Promise<number> {
    return (await db().insertInto('organizations').values({ name }).returning('id').executeTakeFirstOrThrow()).id;
  }

  it('reads bigint ids as numbers and dates as plain strings', async () => {
    const orgId = await newOrg();
    const task = await db()
      .insertInto('tasks')
      .values({ organization_id: orgId, title: 'Call back', due_on: '2026-12-31' })
      .returning(['id', 'organization_id', 'due_on', 'created_at', 'status'])
      .executeTakeFirstOrThrow();
    expect(typeof task.id).toBe('number');
    expect(task.organization_id).toBe(orgId);
    expect(task.due_on).toBe('2026-12-31');
    expect(task.created_at).toBeInstanceOf(Date);
    expect(task.status).toBe('open');
    const { count } = await db().selectFrom('tasks').select((eb) => eb.fn.countAll<number>().as('count')).executeTakeFirstOrThrow();
    expect(count).toBe(1);
  });

  it('keeps emails unique regardless of letter case', async () => {
    await db().insertInto('users').values({ email: 'Case@Example.com', password_hash: '$argon2id$x' }).execute();
    const err = await db().insertInto('users').values({ email: 'case@example.COM', password_hash: '$argon2id$x' }).execute().catch((e: unknown) => e);
    expect(isUniqueViolation(err, 'users_email_lower_key')).toBe(true);
  });

  it('refuses a task whose contact belongs to another organization', async () => {
    const a = await newOrg('A');
    const b = await newOrg('B');
    const contact = await db().insertInto('contacts').values({ organization_id: b, name: 'Bea' }).returning('id').executeTakeFirstOrThrow();
    const err = await db()
      .insertInto('tasks')
      .values({ organization_id: a, title: 'Steal', contact_id: contact.id })
      .execute()
      .catch((e: unknown) => e);
    expect(isForeignKeyViolation(err)).toBe(true);
    // In its own organization the same contact is fine, and deleting it clears only contact_id.
    const task = await db().insertInto('tasks').values({ organization_id: b, title: 'Own', contact_id: contact.id }).returning('id').executeTakeFirstOrThrow();
    await db().deleteFrom('contacts').where('id', '=', contact.id).execute();
    const after = await db().selectFrom('tasks').select(['organization_id', 'contact_id']).where('id', '=', task.id).executeTakeFirstOrThrow();
    expect(after).toEqual({ organization_id: b, contact_id: null });
  });

  it("refuses a refresh token that names another organization's grant", async () => {
    const a = await newOrg('A');
    const b = await newOrg('B');
    const app = await db()
      .insertInto('applications')
      .values({ organization_id: a, client_id: `rt-${a}`, client_secret_hash: HASH, type: 'private', name: 'X', scopes: ['contacts.read'] })
      .returning('id')
      .executeTakeFirstOrThrow();
    const grant = await db().insertInto('grants').values({ organization_id: a, application_id: app.id, scopes: ['contacts.read'] }).returning('id').executeTakeFirstOrThrow();
    const token = (organization_id: number, n: string) => ({
      token_hash: n.repeat(64), organization_id, grant_id: grant.id, scopes: ['contacts.read'], expires_at: new Date(Date.now() + 60_000),
    });
    const err = await db().insertInto('refresh_tokens').values(token(b, 'b')).execute().catch((e: unknown) => e);
    expect(isForeignKeyViolation(err)).toBe(true);
    await db().insertInto('refresh_tokens').values(token(a, 'c')).execute();
  });

  it('allows one active signing key per algorithm at a time', async () => {
    const key = (kid: string, alg: 'ES256' | 'RS256' = 'ES256') => ({ kid, alg, public_jwk: '{}', private_jwk_encrypted: 'x' });
    await db().insertInto('signing_keys').values(key('k1')).execute();
    // Another algorithm's key is active beside it.
    await db().insertInto('signing_keys').values(key('r1', 'RS256')).execute();
    const err = await db().insertInto('signing_keys').values(key('k2')).execute().catch((e: unknown) => e);
    expect(isUniqueViolation(err, 'signing_keys_one_active_key_per_alg')).toBe(true);
    await db().updateTable('signing_keys').set({ retired_at: new Date() }).where('kid', '=', 'k1').execute();
    await db().insertInto('signing_keys').values(key('k2')).execute();
  });

  it('stores secrets only in the shape of a SHA-256 digest', async () => {
    const orgId = await newOrg();
    const err = await db()
      .insertInto('applications')
      .values({
        organization_id: orgId, client_id: 'c1', client_secret_hash: 'plaintext-secret', type: 'private', name: 'X', scopes: ['contacts.read'],
      })
      .execute()
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ code: '23514' });
  });

  it('requires redirect URIs for public applications and none for private ones', async () => {
    const orgId = await newOrg();
    const app = (client_id: string, type: 'public' | 'private', redirect_uris: string[]) => ({
      organization_id: orgId, client_id, client_secret_hash: HASH, type, name: 'X', scopes: ['contacts.read'], redirect_uris,
    });
    await expect(db().insertInto('applications').values(app('p0', 'public', [])).execute()).rejects.toMatchObject({ code: '23514' });
    await expect(db().insertInto('applications').values(app('q1', 'private', ['https://a.example/cb'])).execute()).rejects.toMatchObject({ code: '23514' });
    await db().insertInto('applications').values(app('p1', 'public', ['https://a.example/cb'])).execute();
    const row = await db().selectFrom('applications').select(['redirect_uris', 'scopes', 'require_pkce', 'disabled']).where('client_id', '=', 'p1').executeTakeFirstOrThrow();
    expect(row).toEqual({ redirect_uris: ['https://a.example/cb'], scopes: ['contacts.read'], require_pkce: false, disabled: false });
  });

  it('keeps management scopes off public applications (AD-1), whoever writes the row', async () => {
    const orgId = await newOrg();
    const app = (client_id: string, type: 'public' | 'private', scopes: string[]) => ({
      organization_id: orgId, client_id, client_secret_hash: HASH, type, name: 'X', scopes, redirect_uris: type === 'public' ? ['https://a.example/cb'] : [],
    });
    for (const scope of ['applications.read', 'applications.write', 'members.read', 'members.write', 'grants.read', 'grants.write', 'audit.read', 'sso.read', 'sso.write', 'webhooks.read', 'webhooks.write', 'directory.read', 'directory.write']) {
      await expect(db().insertInto('applications').values(app(`pub-${scope}`, 'public', ['contacts.read', scope])).execute()).rejects.toMatchObject({ code: '23514' });
      await db().insertInto('applications').values(app(`priv-${scope}`, 'private', ['contacts.read', scope])).execute();
    }
    await db().insertInto('applications').values(app('pub-data', 'public', ['contacts.read', 'tasks.write'])).execute();
    await expect(
      db().updateTable('applications').set({ scopes: ['contacts.read', 'members.write'] }).where('client_id', '=', 'pub-data').execute(),
    ).rejects.toMatchObject({ code: '23514' });
  });

  it('cascades an organization deletion to everything it owns', async () => {
    const orgId = await newOrg('Doomed');
    await db().insertInto('contacts').values({ organization_id: orgId, name: 'C' }).execute();
    await db().insertInto('audit_events').values({ organization_id: orgId, action: 'x', details: '{}' }).execute();
    await db().deleteFrom('organizations').where('id', '=', orgId).execute();
    const left = await db().selectFrom('contacts').select('id').where('organization_id', '=', orgId).execute();
    expect(left).toEqual([]);
  });
});
