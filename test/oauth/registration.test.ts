/**
 * RFC 7591 dynamic client registration (POST /oauth/register) and RFC 7592 client configuration
 * (GET and DELETE /oauth/register/:client_id), their limits (per address, global), the
 * configuration that opens, guards or closes registration, and the retention sweep that deletes
 * registered clients that never obtained a token (AG-3). The bad-input battery is
 * registration-bad-input.test.ts.
 */
import type { FastifyInstance, InjectOptions, LightMyRequestResponse } from 'fastify';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it, onTestFinished, vi } from 'vitest';
import { ConfigError, parseConfig } from '../../src/config.js';
import type { DB } from '../../src/db/connect.js';
import { generateSecret, sha256Hex } from '../../src/lib/crypto.js';
import { markClientUsed, parseRegistration, registerClient } from '../../src/oauth/models/registrations.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { deleteExpired } from '../../src/retention.js';
import { buildTestApp, testConfig, TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND, createTestDatabase, TEST_DATABASE_URL } from '../helpers/db.js';
import { explain, nodesOf, recording } from '../helpers/plans.js';
import { basic, createOrgFixture, form, type OrgFixture, SAFE_DESCRIPTION } from '../helpers/oauth.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let db: DB;
let app: FastifyInstance;
let org: OrgFixture;
let other: OrgFixture;
const config = testConfig();
const DATA_SCOPES = 'contacts.read contacts.write tasks.read tasks.write';
const INITIAL_TOKEN = 'initial-access-token-0123456789abcdefghij';

beforeAll(async () => {
  t = await createTestDatabase();
  db = t.handle.db;
  await ensureSigningKey(db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  app = await buildTestApp(db);
  org = await createOrgFixture(db);
  other = await createOrgFixture(db);
});
afterAll(async () => {
  await app.close();
  await t.close();
});

/** Each test registers from addresses of its own, so that the per-address limit counts only its registrations. */
let lastAddress = 0;
const newAddress = () => `198.51.100.${++lastAddress}`;

function register(body: unknown, options: { ip?: string; headers?: Record<string, string>; on?: FastifyInstance } = {}): Promise<LightMyRequestResponse> {
  const request: InjectOptions = {
    method: 'POST',
    url: '/oauth/register',
    headers: { 'content-type': 'application/json', ...options.headers },
    payload: JSON.stringify(body),
    remoteAddress: options.ip ?? newAddress(),
  };
  return (options.on ?? app).inject(request);
}

const MCP_CLIENT = {
  client_name: 'Claude Desktop',
  redirect_uris: ['http://127.0.0.1:33418/callback'],
  grant_types: ['authorization_code', 'refresh_token'],
  response_types: ['code'],
  token_endpoint_auth_method: 'none',
};

function hasNull(value: unknown): boolean {
  if (value === null) return true;
  if (typeof value !== 'object') return false;
  return Object.values(value as object).some(hasNull);
}

function expectError(res: LightMyRequestResponse, status: number, error: string): void {
  expect({ status: res.statusCode, body: res.json() }).toEqual({ status, body: { error, error_description: expect.stringMatching(SAFE_DESCRIPTION) } });
  expect(res.headers['cache-control']).toBe('no-store');
}

const rowOf = (clientId: string) => db.selectFrom('applications').selectAll().where('client_id', '=', clientId).executeTakeFirst();

function token(body: Record<string, string>, headers: Record<string, string> = {}): Promise<LightMyRequestResponse> {
  return app.inject({ method: 'POST', url: '/oauth/token', headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers }, payload: form(body) });
}

const configure = (clientId: string, method: 'GET' | 'DELETE' | 'PUT', bearer?: string, on: FastifyInstance = app) =>
  on.inject({ method, url: `/oauth/register/${clientId}`, headers: bearer === undefined ? {} : { authorization: `Bearer ${bearer}` } });

describe(`POST /oauth/register (RFC 7591) on ${BACKEND}`, () => {
  it('registers a public client without a secret (token_endpoint_auth_method none): 201, no-store, the metadata and nothing unknown echoed', async () => {
    const before = Math.floor(Date.now() / 1000);
    const ip = newAddress();
    const res = await register({ ...MCP_CLIENT, logo_uri: 'https://client.example/logo.png', software_id: 'x', 'x-custom': { a: 1 } }, { ip });
    expect(res.statusCode, res.body).toBe(201);
    expect(res.headers['cache-control']).toBe('no-store');
    expect(res.headers['content-type']).toMatch(/^application\/json/);
    const body = res.json();
    expect(body).toEqual({
      client_id: expect.stringMatching(/^[0-9a-f]{32}$/),
      client_id_issued_at: expect.any(Number),
      registration_access_token: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/),
      registration_client_uri: `${config.issuer}/oauth/register/${body.client_id}`,
      client_name: 'Claude Desktop',
      redirect_uris: ['http://127.0.0.1:33418/callback'],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
      dpop_bound_access_tokens: false,
      require_pushed_authorization_requests: false,
      id_token_signed_response_alg: 'RS256',
      scope: DATA_SCOPES,
    });
    expect(body.client_id_issued_at).toBeGreaterThanOrEqual(before - 5);
    expect(body.client_id_issued_at).toBeLessThanOrEqual(Math.floor(Date.now() / 1000) + 5);
    expect(hasNull(body)).toBe(false);

    // AG-3: no organization, public, PKCE required, no secret, the token kept as its digest only.
    expect(await rowOf(body.client_id)).toMatchObject({
      registration: 'dynamic',
      organization_id: null,
      type: 'public',
      require_pkce: true,
      disabled: false,
      client_secret_hash: null,
      token_endpoint_auth_method: 'none',
      name: 'Claude Desktop',
      redirect_uris: ['http://127.0.0.1:33418/callback'],
      post_logout_redirect_uris: [],
      grant_types: ['authorization_code', 'refresh_token'],
      scopes: DATA_SCOPES.split(' '),
      registered_ip: ip,
      registration_token_hash: sha256Hex(body.registration_access_token),
      first_used_at: null,
    });

    // The client authenticates at the token endpoint by client_id alone: the refresh token is what is refused.
    expectError(await token({ grant_type: 'refresh_token', refresh_token: 'not-a-real-token', client_id: body.client_id }), 400, 'invalid_grant');
  });

  it('without token_endpoint_auth_method: client_secret_basic (RFC 7591 §2), the secret returned once and authenticating at /oauth/token', async () => {
    const res = await register({ redirect_uris: ['https://app.example.com/oauth/callback'] });
    expect(res.statusCode, res.body).toBe(201);
    const body = res.json();
    expect(body).toMatchObject({
      client_secret: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/),
      client_secret_expires_at: 0,
      token_endpoint_auth_method: 'client_secret_basic',
      // No client_name: the redirect URI's host names it.
      client_name: 'app.example.com',
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
    });
    expect(hasNull(body)).toBe(false);
    const row = await rowOf(body.client_id);
    expect(row).toMatchObject({ client_secret_hash: sha256Hex(body.client_secret), type: 'public', organization_id: null, require_pkce: true });

    const bogus = { grant_type: 'refresh_token', refresh_token: 'not-a-real-token' };
    expectError(await token(bogus, { authorization: basic(body.client_id, body.client_secret) }), 400, 'invalid_grant');
    expectError(await token(bogus, { authorization: basic(body.client_id, `${body.client_secret}x`) }), 401, 'invalid_client');
    // A client with a secret cannot drop it and pass as public.
    expectError(await token({ ...bogus, client_id: body.client_id }), 401, 'invalid_client');
  });

  it('keys sent with a secret method are ignored: not stored, not echoed (RFC 7591 §3.2.1)', async () => {
    const key = { kty: 'EC', crv: 'P-256', x: 'MKBCTNIcKUSDii11ySs3526iDZ8AiTo7Tu6KPAqv7D4', y: '4Etl6SRW2YiLUrN5vfvVHuhp7x8PxltmWWlbbM4IFyM', use: 'sig' };
    const res = await register({ redirect_uris: ['https://keys.example.com/cb'], jwks: { keys: [key] } });
    expect(res.statusCode, res.body).toBe(201);
    const body = res.json();
    expect(body).toMatchObject({ token_endpoint_auth_method: 'client_secret_basic', client_secret: expect.any(String) });
    expect(body).not.toHaveProperty('jwks');
    expect(await rowOf(body.client_id)).toMatchObject({ jwks: null, jwks_uri: null });
  });

  it('client_secret_post: the secret works in the form body', async () => {
    const res = await register({ redirect_uris: ['https://post.example.com/cb'], token_endpoint_auth_method: 'client_secret_post', client_name: '  Post client  ' });
    expect(res.statusCode, res.body).toBe(201);
    const body = res.json();
    expect(body).toMatchObject({ token_endpoint_auth_method: 'client_secret_post', client_secret_expires_at: 0, client_name: 'Post client' });
    const bogus = { grant_type: 'refresh_token', refresh_token: 'not-a-real-token' };
    expectError(await token({ ...bogus, client_id: body.client_id, client_secret: body.client_secret }), 400, 'invalid_grant');
    expectError(await token({ ...bogus, client_id: body.client_id, client_secret: 'wrong' }), 401, 'invalid_client');
  });

  it('accepts loopback redirect URIs on any port (RFC 8252) and https with a path and query, as written', async () => {
    const uris = ['http://127.0.0.1/cb', 'http://[::1]:8080/cb', 'http://localhost:51234/callback', 'https://app.example.com/cb?tenant=a'];
    const res = await register({ redirect_uris: uris, token_endpoint_auth_method: 'none' });
    expect(res.statusCode, res.body).toBe(201);
    expect(res.json()).toMatchObject({ redirect_uris: uris, client_name: '127.0.0.1' });
  });

  it('a device-only client: no redirect URIs, no response types', async () => {
    const res = await register({ grant_types: ['urn:ietf:params:oauth:grant-type:device_code', 'refresh_token'], token_endpoint_auth_method: 'none', client_name: 'CLI' });
    expect(res.statusCode, res.body).toBe(201);
    expect(res.json()).toMatchObject({ grant_types: ['refresh_token', 'urn:ietf:params:oauth:grant-type:device_code'], response_types: [], redirect_uris: [], client_name: 'CLI' });
    expect((await rowOf(res.json().client_id))?.redirect_uris).toEqual([]);
  });

  it('scope: narrows the data scopes; OpenID scopes, offline_access and a registered resource’s scopes are accepted and not recorded', async () => {
    await db.insertInto('resources').values({ uri: 'https://mcp.example.com/mcp', name: 'MCP', scopes: ['tools.call', 'contacts.read'] }).execute();
    const narrowed = await register({ ...MCP_CLIENT, scope: 'openid  contacts.read offline_access tools.call tasks.read' });
    expect(narrowed.statusCode, narrowed.body).toBe(201);
    expect(narrowed.json().scope).toBe('contacts.read tasks.read');
    expect((await rowOf(narrowed.json().client_id))?.scopes).toEqual(['contacts.read', 'tasks.read']);

    // Naming no data scope bounds nothing of orgauth's: the data scopes, as without scope.
    const resourceOnly = await register({ ...MCP_CLIENT, scope: 'tools.call' });
    expect(resourceOnly.statusCode, resourceOnly.body).toBe(201);
    expect(resourceOnly.json().scope).toBe(DATA_SCOPES);

    expectError(await register({ ...MCP_CLIENT, scope: 'contacts.read files.delete' }), 400, 'invalid_client_metadata');
    // AG-3: never a management scope.
    expectError(await register({ ...MCP_CLIENT, scope: 'contacts.read members.write' }), 400, 'invalid_client_metadata');
  });

  it('JSON null reads as absent', async () => {
    const res = await register({ ...MCP_CLIENT, client_name: null, scope: null, grant_types: null, response_types: null, logo_uri: null });
    expect(res.statusCode, res.body).toBe(201);
    expect(res.json()).toMatchObject({ client_name: '127.0.0.1', scope: DATA_SCOPES, grant_types: ['authorization_code', 'refresh_token'] });
  });

  it('a preflight from a browser is answered for any origin (CORS)', async () => {
    const res = await app.inject({ method: 'OPTIONS', url: '/oauth/register', headers: { origin: 'https://spa.example', 'access-control-request-method': 'POST', 'access-control-request-headers': 'content-type' } });
    expect(res.statusCode).toBe(204);
    expect(res.headers['access-control-allow-origin']).toBe('*');
  });

  it('other methods: 405 with Allow', async () => {
    for (const method of ['GET', 'PUT', 'DELETE'] as const) {
      const res = await app.inject({ method, url: '/oauth/register' });
      expect(res.statusCode).toBe(405);
      expect(res.headers.allow).toBe('POST');
    }
  });
});

describe(`RFC 7592 client configuration on ${BACKEND}`, () => {
  it('GET with the registration access token: the registration as it is, without the secret, no-store', async () => {
    const registered = (await register({ redirect_uris: ['https://read.example.com/cb'], client_name: 'Reader', scope: 'contacts.read' })).json();
    const res = await configure(registered.client_id, 'GET', registered.registration_access_token);
    expect(res.statusCode, res.body).toBe(200);
    expect(res.headers['cache-control']).toBe('no-store');
    const { client_secret: _secret, client_secret_expires_at: _expiry, ...withoutSecret } = registered;
    expect(res.json()).toEqual(withoutSecret);
    // Case-insensitive scheme (RFC 9110).
    const lower = await app.inject({ method: 'GET', url: `/oauth/register/${registered.client_id}`, headers: { authorization: `bearer ${registered.registration_access_token}` } });
    expect(lower.statusCode).toBe(200);
  });

  it('a missing, wrong or another client’s token, or an unknown client: 401 invalid_token with a Bearer challenge', async () => {
    const a = (await register(MCP_CLIENT)).json();
    const b = (await register(MCP_CLIENT)).json();
    const missing = await configure(a.client_id, 'GET');
    expectError(missing, 401, 'invalid_token');
    expect(missing.headers['www-authenticate']).toBe('Bearer realm="orgauth"');
    for (const res of [
      await configure(a.client_id, 'GET', `${a.registration_access_token}x`),
      await configure(a.client_id, 'GET', b.registration_access_token),
      await configure(a.client_id, 'DELETE', b.registration_access_token),
      await configure('0'.repeat(32), 'GET', a.registration_access_token),
      await configure('not-a-client-id', 'GET', a.registration_access_token),
      await app.inject({ method: 'GET', url: `/oauth/register/${a.client_id}`, headers: { authorization: `Basic ${a.registration_access_token}` } }),
      await app.inject({ method: 'GET', url: `/oauth/register/${a.client_id}`, headers: { authorization: 'Bearer' } }),
    ]) {
      expectError(res, 401, 'invalid_token');
      expect(res.headers['www-authenticate']).toBe('Bearer realm="orgauth", error="invalid_token"');
    }
    // A developer's application is not managed here, whatever is sent.
    expectError(await configure(org.publicApp.client_id, 'GET', a.registration_access_token), 401, 'invalid_token');
    expect(await rowOf(a.client_id)).toBeDefined();
  });

  it('PUT (update) is not offered: 405 with Allow GET, DELETE', async () => {
    const a = (await register(MCP_CLIENT)).json();
    const res = await configure(a.client_id, 'PUT', a.registration_access_token);
    expect(res.statusCode).toBe(405);
    expect(res.headers.allow).toBe('GET, DELETE');
  });

  it('DELETE: 204; its grants in every organization revoked and audited there, other applications’ grants untouched; then it is unknown', async () => {
    const registered = (await register({ ...MCP_CLIENT, token_endpoint_auth_method: 'none' })).json();
    const row = (await rowOf(registered.client_id))!;
    const grantIn = async (organizationId: number, applicationId: number, userId: number) => {
      const grant = await db.insertInto('grants').values({ organization_id: organizationId, application_id: applicationId, user_id: userId, scopes: ['contacts.read'] }).returning('id').executeTakeFirstOrThrow();
      await db.insertInto('refresh_tokens').values({ token_hash: sha256Hex(generateSecret(32)), organization_id: organizationId, grant_id: grant.id, scopes: ['contacts.read'], expires_at: sql`now() + interval '1 day'` }).execute();
      return grant.id;
    };
    const grants = [await grantIn(org.organizationId, row.id, org.ownerId), await grantIn(other.organizationId, row.id, other.ownerId)];
    const developerApp = (await rowOf(org.publicApp.client_id))!;
    const untouched = await grantIn(org.organizationId, developerApp.id, org.ownerId);

    const res = await configure(registered.client_id, 'DELETE', registered.registration_access_token);
    expect(res.statusCode, res.body).toBe(204);
    expect(res.body).toBe('');
    expect(await rowOf(registered.client_id)).toBeUndefined();
    // Revoked and published before the row (and with it the grants) went: audited in each organization.
    const audited = await db
      .selectFrom('audit_events')
      .select(['organization_id', 'actor_client_id', sql<string>`details->>'reason'`.as('reason'), sql<number>`(details->>'grant_id')::bigint`.as('grant_id')])
      .where('action', '=', 'grant.revoked')
      .where(sql<boolean>`(details->>'grant_id')::bigint = any(${grants}::bigint[])`)
      .orderBy('organization_id')
      .execute();
    expect(audited.map((a) => ({ ...a, grant_id: Number(a.grant_id), organization_id: Number(a.organization_id) }))).toEqual([
      { organization_id: org.organizationId, actor_client_id: registered.client_id, reason: 'revoked_by_client', grant_id: grants[0] },
      { organization_id: other.organizationId, actor_client_id: registered.client_id, reason: 'revoked_by_client', grant_id: grants[1] },
    ]);
    expect(await db.selectFrom('grants').select('revoked_at').where('id', '=', untouched).executeTakeFirstOrThrow()).toEqual({ revoked_at: null });

    expectError(await configure(registered.client_id, 'GET', registered.registration_access_token), 401, 'invalid_token');
    expectError(await configure(registered.client_id, 'DELETE', registered.registration_access_token), 401, 'invalid_token');
    // This instance's application cache forgot it at once.
    expectError(await token({ grant_type: 'refresh_token', refresh_token: 'x', client_id: registered.client_id }), 401, 'invalid_client');
  });
});

describe(`registration limits on ${BACKEND}`, () => {
  it('20 registrations per address per hour; the 21st is 429 with Retry-After; another address is not held back', async () => {
    const ip = newAddress();
    for (let i = 0; i < 20; i++) expect((await register(MCP_CLIENT, { ip })).statusCode).toBe(201);
    const refused = await register(MCP_CLIENT, { ip });
    expectError(refused, 429, 'too_many_requests');
    const retryAfter = Number(refused.headers['retry-after']);
    expect(retryAfter).toBeGreaterThan(3500);
    expect(retryAfter).toBeLessThanOrEqual(3600);
    expect((await register(MCP_CLIENT)).statusCode).toBe(201);
    // An hour later the address may register again.
    await db.updateTable('client_registrations').set({ created_at: sql`created_at - interval '61 minutes'` }).where('ip', '=', ip).execute();
    expect((await register(MCP_CLIENT, { ip })).statusCode).toBe(201);
  });

  it('deleting each registration (RFC 7592) does not give the address its allowance back; the records go an hour on', async () => {
    const ip = newAddress();
    for (let i = 0; i < 20; i++) {
      const registered = await register(MCP_CLIENT, { ip });
      expect(registered.statusCode).toBe(201);
      const { client_id, registration_access_token } = registered.json();
      expect((await configure(client_id, 'DELETE', registration_access_token)).statusCode).toBe(204);
    }
    expect(await db.selectFrom('applications').select('id').where('registered_ip', '=', ip).execute()).toEqual([]);
    expectError(await register(MCP_CLIENT, { ip }), 429, 'too_many_requests');

    // The retention sweep deletes a record once it is out of the hour the limit counts, not before.
    const records = () => db.selectFrom('client_registrations').select('id').where('ip', '=', ip).execute();
    await deleteExpired(db);
    expect(await records()).toHaveLength(20);
    await db.updateTable('client_registrations').set({ created_at: sql`created_at - interval '61 minutes'` }).where('ip', '=', ip).execute();
    expect((await deleteExpired(db)).client_registrations).toBeGreaterThanOrEqual(20);
    expect(await records()).toEqual([]);
    expect((await register(MCP_CLIENT, { ip })).statusCode).toBe(201);
  });

  it('with TRUST_PROXY, an X-Forwarded-For that is not an address counts as the connection’s address, and IPv6 registrations keep working', async () => {
    const proxied = await buildTestApp(db, { env: { TRUST_PROXY: 'true', CLIENT_REGISTRATION_RATE_LIMIT: '2' } });
    try {
      const proxy = newAddress();
      const forged = await register(MCP_CLIENT, { ip: proxy, headers: { 'x-forwarded-for': 'zz:zz' }, on: proxied });
      expect(forged.statusCode, forged.body).toBe(201);
      expect((await rowOf(forged.json().client_id))?.registered_ip).toBe(proxy);
      expect(await db.selectFrom('client_registrations').select('ip').where('ip', 'in', ['zz:zz', proxy]).execute()).toEqual([{ ip: proxy }]);
      // Counted as the proxy's: one more, then 429, whatever the header makes up.
      expect((await register(MCP_CLIENT, { ip: proxy, headers: { 'x-forwarded-for': 'not an address' }, on: proxied })).statusCode).toBe(201);
      expectError(await register(MCP_CLIENT, { ip: proxy, headers: { 'x-forwarded-for': 'zz:zz' }, on: proxied }), 429, 'too_many_requests');

      // An address the proxy forwarded is used, IPv6 included; and IPv6 registrations work without a proxy too.
      const forwarded = await register(MCP_CLIENT, { ip: proxy, headers: { 'x-forwarded-for': '2001:db8:26:1::1' }, on: proxied });
      expect(forwarded.statusCode, forwarded.body).toBe(201);
      expect((await rowOf(forwarded.json().client_id))?.registered_ip).toBe('2001:db8:26:1::1');
      const direct = await register(MCP_CLIENT, { ip: '2001:db8:26:2::1' });
      expect(direct.statusCode, direct.body).toBe(201);
      expect(await db.selectFrom('client_registrations').select('ip').where('ip', 'like', '2001:db8:26:%').orderBy('id').execute()).toEqual([
        { ip: '2001:db8:26:1::/64' },
        { ip: '2001:db8:26:2::/64' },
      ]);
    } finally {
      await proxied.close();
    }
  });

  it('parallel registrations from one address cannot pass the limit together', async () => {
    const ip = newAddress();
    const results = await Promise.all(Array.from({ length: 26 }, () => register(MCP_CLIENT, { ip })));
    const statuses = results.map((r) => r.statusCode).sort();
    expect(statuses).toEqual([...Array(20).fill(201), ...Array(6).fill(429)]);
  });

  it('an IPv6 address counts with its /64; an IPv4-mapped address as the IPv4 address', async () => {
    const limited = await buildTestApp(db, { env: { CLIENT_REGISTRATION_RATE_LIMIT: '2' } });
    try {
      expect((await register(MCP_CLIENT, { ip: '2001:db8:1:2::1', on: limited })).statusCode).toBe(201);
      expect((await register(MCP_CLIENT, { ip: '2001:db8:1:2:aaaa::2', on: limited })).statusCode).toBe(201);
      expectError(await register(MCP_CLIENT, { ip: '2001:db8:1:2:ffff:ffff:ffff:fffe', on: limited }), 429, 'too_many_requests');
      expect((await register(MCP_CLIENT, { ip: '2001:db8:1:3::1', on: limited })).statusCode).toBe(201);
      expect((await register(MCP_CLIENT, { ip: '::ffff:203.0.113.9', on: limited })).statusCode).toBe(201);
      expect((await register(MCP_CLIENT, { ip: '::ffff:203.0.113.9', on: limited })).statusCode).toBe(201);
      expectError(await register(MCP_CLIENT, { ip: '::ffff:203.0.113.9', on: limited }), 429, 'too_many_requests');
      expect((await register(MCP_CLIENT, { ip: '::ffff:203.0.113.10', on: limited })).statusCode).toBe(201);
    } finally {
      await limited.close();
    }
  });

  it('CLIENT_REGISTRATION_RATE_LIMIT=0 lifts the per-address limit', async () => {
    const unlimited = await buildTestApp(db, { env: { CLIENT_REGISTRATION_RATE_LIMIT: '0' } });
    try {
      const ip = newAddress();
      for (let i = 0; i < 22; i++) expect((await register(MCP_CLIENT, { ip, on: unlimited })).statusCode).toBe(201);
    } finally {
      await unlimited.close();
    }
  });

  it('a global cap on registered clients (CLIENT_REGISTRATION_MAX_CLIENTS): 429 at it, room again after a deletion', async () => {
    const { n } = await db.selectFrom('applications').select((eb) => eb.fn.countAll<number>().as('n')).where('registration', '=', 'dynamic').executeTakeFirstOrThrow();
    const capped = await buildTestApp(db, { env: { CLIENT_REGISTRATION_MAX_CLIENTS: String(Number(n) + 2) } });
    try {
      const first = (await register(MCP_CLIENT, { on: capped })).json();
      expect((await register(MCP_CLIENT, { on: capped })).statusCode).toBe(201);
      const refused = await register(MCP_CLIENT, { on: capped });
      expectError(refused, 429, 'too_many_requests');
      expect(Number(refused.headers['retry-after'])).toBeGreaterThan(0);
      expect((await configure(first.client_id, 'DELETE', first.registration_access_token, capped)).statusCode).toBe(204);
      expect((await register(MCP_CLIENT, { on: capped })).statusCode).toBe(201);
    } finally {
      await capped.close();
    }
  });
});

describe(`who may register (CLIENT_REGISTRATION) on ${BACKEND}`, () => {
  it('token: only with the initial access token as a Bearer token', async () => {
    const guarded = await buildTestApp(db, { env: { CLIENT_REGISTRATION: 'token', CLIENT_REGISTRATION_TOKEN: INITIAL_TOKEN } });
    try {
      const missing = await register(MCP_CLIENT, { on: guarded });
      expectError(missing, 401, 'invalid_token');
      expect(missing.headers['www-authenticate']).toBe('Bearer realm="orgauth"');
      for (const authorization of [`Bearer ${INITIAL_TOKEN}x`, `Bearer ${INITIAL_TOKEN.slice(0, -1)}`, `Basic ${INITIAL_TOKEN}`, 'Bearer']) {
        const wrong = await register(MCP_CLIENT, { on: guarded, headers: { authorization } });
        expectError(wrong, 401, 'invalid_token');
        expect(wrong.headers['www-authenticate']).toBe('Bearer realm="orgauth", error="invalid_token"');
      }
      const ok = await register(MCP_CLIENT, { on: guarded, headers: { authorization: `Bearer ${INITIAL_TOKEN}` } });
      expect(ok.statusCode, ok.body).toBe(201);
      // The client's own registration access token manages it as usual.
      expect((await configure(ok.json().client_id, 'GET', ok.json().registration_access_token, guarded)).statusCode).toBe(200);
    } finally {
      await guarded.close();
    }
  });

  it('off: 404, while clients registered before can still read and delete themselves', async () => {
    const registered = (await register(MCP_CLIENT)).json();
    const closed = await buildTestApp(db, { env: { CLIENT_REGISTRATION: 'off' } });
    try {
      const res = await register(MCP_CLIENT, { on: closed });
      expectError(res, 404, 'not_found');
      expect(res.json().error_description).toMatch(/turned off/);
      expect((await configure(registered.client_id, 'GET', registered.registration_access_token, closed)).statusCode).toBe(200);
      expect((await configure(registered.client_id, 'DELETE', registered.registration_access_token, closed)).statusCode).toBe(204);
    } finally {
      await closed.close();
    }
  });

  it('the configuration: defaults, and what is refused', () => {
    expect(testConfig().clientRegistration).toEqual({ mode: 'open', initialAccessToken: null, perAddressPerHour: 20, maxClients: 10_000, unusedClientTtl: 86_400 });
    expect(
      testConfig({
        CLIENT_REGISTRATION: 'token',
        CLIENT_REGISTRATION_TOKEN: INITIAL_TOKEN,
        CLIENT_REGISTRATION_RATE_LIMIT: '5',
        CLIENT_REGISTRATION_MAX_CLIENTS: '100',
        UNUSED_CLIENT_TTL: '3600',
      }).clientRegistration,
    ).toEqual({ mode: 'token', initialAccessToken: INITIAL_TOKEN, perAddressPerHour: 5, maxClients: 100, unusedClientTtl: 3600 });
    const problems = (env: Record<string, string>) => {
      try {
        parseConfig({ SECRET_KEY: TEST_SECRET_KEY, ...env });
      } catch (err) {
        if (err instanceof ConfigError) return err.problems;
        throw err;
      }
      return [];
    };
    expect(problems({ CLIENT_REGISTRATION: 'token' })).toEqual([expect.stringMatching(/^CLIENT_REGISTRATION_TOKEN: required with CLIENT_REGISTRATION=token/)]);
    expect(problems({ CLIENT_REGISTRATION_TOKEN: INITIAL_TOKEN })).toEqual(['CLIENT_REGISTRATION_TOKEN: only with CLIENT_REGISTRATION=token']);
    expect(problems({ CLIENT_REGISTRATION: 'token', CLIENT_REGISTRATION_TOKEN: 'short' })).toEqual([expect.stringMatching(/^CLIENT_REGISTRATION_TOKEN: must be at least 32/)]);
    expect(problems({ CLIENT_REGISTRATION: 'token', CLIENT_REGISTRATION_TOKEN: `${'x'.repeat(32)} y` })).toEqual([expect.stringMatching(/^CLIENT_REGISTRATION_TOKEN: must be printable ASCII/)]);
    expect(problems({ CLIENT_REGISTRATION: 'closed' })).toEqual(['CLIENT_REGISTRATION: must be one of open, token, off']);
    expect(problems({ CLIENT_REGISTRATION_RATE_LIMIT: '-1' })).toEqual([expect.stringMatching(/^CLIENT_REGISTRATION_RATE_LIMIT: /)]);
    expect(problems({ CLIENT_REGISTRATION_MAX_CLIENTS: '0' })).toEqual([expect.stringMatching(/^CLIENT_REGISTRATION_MAX_CLIENTS: /)]);
    expect(problems({ UNUSED_CLIENT_TTL: '59' })).toEqual([expect.stringMatching(/^UNUSED_CLIENT_TTL: /)]);
  });
});

describe(`reaping clients that never obtained a token on ${BACKEND}`, () => {
  async function registeredAgo(seconds: number): Promise<{ id: number; client_id: string }> {
    const { client_id } = (await register(MCP_CLIENT)).json();
    return db
      .updateTable('applications')
      .set({ created_at: sql`now() - make_interval(secs => ${seconds})` })
      .where('client_id', '=', client_id)
      .returning(['id', 'client_id'])
      .executeTakeFirstOrThrow();
  }
  const exists = async (clientId: string) => (await rowOf(clientId)) !== undefined;
  const DAY = 24 * 3600;

  it('deletes a day-old unused registration with its codes; keeps used ones, ones holding a grant, recent ones and developers’ applications', async () => {
    const unused = await registeredAgo(2 * DAY);
    await db
      .insertInto('authorization_codes')
      .values({ code_hash: sha256Hex(generateSecret(32)), organization_id: org.organizationId, application_id: unused.id, user_id: org.ownerId, redirect_uri: MCP_CLIENT.redirect_uris[0]!, scopes: ['contacts.read'], code_challenge: null, code_challenge_method: null, expires_at: sql`now() + interval '1 minute'` })
      .execute();
    const used = await registeredAgo(2 * DAY);
    const usedRow = (await rowOf(used.client_id))!;
    await markClientUsed(db, usedRow);
    expect((await rowOf(used.client_id))?.first_used_at).toBeInstanceOf(Date);
    const holdingGrant = await registeredAgo(2 * DAY);
    await db.insertInto('grants').values({ organization_id: org.organizationId, application_id: holdingGrant.id, user_id: org.ownerId, scopes: ['contacts.read'] }).execute();
    const recent = await registeredAgo(DAY - 600);
    await db.updateTable('applications').set({ created_at: sql`now() - interval '30 days'` }).where('client_id', '=', other.publicApp.client_id).execute();

    const deleted = await deleteExpired(db);
    expect(deleted.unused_clients).toBeGreaterThanOrEqual(1);
    expect(await exists(unused.client_id)).toBe(false);
    expect(await db.selectFrom('authorization_codes').select('id').where('application_id', '=', unused.id).execute()).toEqual([]);
    expect(await exists(used.client_id)).toBe(true);
    expect(await exists(holdingGrant.client_id)).toBe(true);
    expect(await exists(recent.client_id)).toBe(true);
    expect(await exists(other.publicApp.client_id)).toBe(true);
    // Nothing left to reap.
    expect((await deleteExpired(db)).unused_clients).toBe(0);
    // unusedClientTtl (UNUSED_CLIENT_TTL) shortens the wait.
    expect((await deleteExpired(db, { unusedClientTtl: DAY - 3600 })).unused_clients).toBe(1);
    expect(await exists(recent.client_id)).toBe(false);
  });

  it('markClientUsed: once, the first use staying the first; a developer’s application too (the Overview’s “never used”)', async () => {
    const fresh = (await rowOf((await register(MCP_CLIENT)).json().client_id))!;
    await markClientUsed(db, fresh);
    const first = (await rowOf(fresh.client_id))!.first_used_at;
    expect(first).toBeInstanceOf(Date);
    await db.updateTable('applications').set({ first_used_at: sql`now() - interval '1 hour'` }).where('id', '=', fresh.id).execute();
    const marked = (await rowOf(fresh.client_id))!;
    await markClientUsed(db, { ...fresh, first_used_at: null });
    // Set only while null: the first use stays the first.
    expect((await rowOf(fresh.client_id))!.first_used_at).toEqual(marked.first_used_at);
    const developer = (await rowOf(org.publicApp.client_id))!;
    expect(developer.first_used_at).toBeNull();
    await markClientUsed(db, developer);
    expect((await rowOf(org.publicApp.client_id))!.first_used_at).toBeInstanceOf(Date);
  });

  it('runs in the server with UNUSED_CLIENT_TTL', async () => {
    const old = await registeredAgo(600);
    // The server's intervals are fake: its second passes at once, then the sweep is waited for.
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'], shouldClearNativeTimers: true });
    onTestFinished(() => void vi.useRealTimers());
    const sweeping = await buildTestApp(db, { env: { CLEANUP_INTERVAL: '1', UNUSED_CLIENT_TTL: '300' } });
    try {
      vi.advanceTimersByTime(1000);
      const deadline = Date.now() + 10_000;
      while (await exists(old.client_id)) {
        if (Date.now() > deadline) throw new Error('the unused registration was not deleted within 10 s');
        await new Promise((r) => setTimeout(r, 100));
      }
    } finally {
      await sweeping.close();
    }
  });
});

/**
 * The limit and the reaper stay index lookups at volume, on PostgreSQL (PGlite plans a table of
 * this size no differently): 100,000 developers' applications, 20,000 registered clients (one in
 * twenty never used) spread over 100 hours and 5,000 addresses, 55,000 registration records from
 * those addresses (1,000 of them older than the hour), ANALYZEd, in a database of its own. Each statement is the one the source sends, recorded as it runs, then EXPLAINed with the
 * planner's own choices.
 */
describe.skipIf(!TEST_DATABASE_URL)('registration statements at volume on PostgreSQL', () => {
  let big: Awaited<ReturnType<typeof createTestDatabase>>;
  beforeAll(async () => {
    big = await createTestDatabase();
    const owner = await createOrgFixture(big.handle.db);
    await sql`insert into applications (organization_id, client_id, client_secret_hash, type, name, scopes, grant_types)
      select ${owner.organizationId}, md5('dev' || i), md5('s' || i) || md5('t' || i), 'private', 'App ' || i, '{contacts.read}', '{client_credentials}'
      from generate_series(1, 100000) i`.execute(big.handle.db);
    await sql`insert into applications (organization_id, client_id, client_secret_hash, token_endpoint_auth_method, type, name, redirect_uris, scopes,
        require_pkce, registration, registered_ip, first_used_at, created_at)
      select null, md5('dyn' || i), null, 'none', 'public', 'Client ' || i, '{https://client.example/cb}', '{contacts.read}',
        true, 'dynamic', '10.0.' || (i % 5000 / 250) || '.' || (i % 250), case when i % 20 = 0 then null else now() end, now() - (i % 100) * interval '1 hour'
      from generate_series(1, 20000) i`.execute(big.handle.db);
    // The hour's registration records, 54,000 from 5,000 addresses, and 1,000 older ones the sweep is yet to delete.
    await sql`insert into client_registrations (ip, created_at)
      select '10.0.' || (i % 5000 / 250) || '.' || (i % 250), case when i <= 54000 then now() - (i % 60) * interval '1 minute' else now() - (61 + i % 10) * interval '1 minute' end
      from generate_series(1, 55000) i`.execute(big.handle.db);
    await sql`analyze applications`.execute(big.handle.db);
    await sql`analyze client_registrations`.execute(big.handle.db);
  }, 120_000);
  afterAll(() => big.close());

  const indexesOf = (plan: Parameters<typeof nodesOf>[0]) => nodesOf(plan).map((n) => n['Index Name']).filter((n) => n !== undefined);
  const sequentialOn = (plan: Parameters<typeof nodesOf>[0], table: string) => nodesOf(plan).filter((n) => n['Node Type'] === 'Seq Scan' && n['Relation Name'] === table);

  it('the per-address limit reads the address’s registrations of the hour through (ip, created_at)', async () => {
    const { db: recorded, queries } = recording(big.handle.db);
    await registerClient(recorded, parseRegistration(MCP_CLIENT), { ip: '10.0.3.7', limits: { perAddressPerHour: 20, maxClients: 1_000_000 } });
    const perAddress = queries.find((q) => /from "client_registrations" where "ip" = \$/.test(q.sql));
    expect(perAddress, queries.map((q) => q.sql).join('\n')).toBeDefined();
    const plan = await explain(big.handle.db, perAddress!);
    expect(sequentialOn(plan, 'client_registrations'), JSON.stringify(plan)).toEqual([]);
    expect(indexesOf(plan)).toContain('client_registrations_ip_created_at_idx');
  });

  it('the reaper finds unused registrations through their partial index, the sweep registration records past the hour through created_at, then each deletes by key', async () => {
    const { db: recorded, queries } = recording(big.handle.db);
    const deleted = await deleteExpired(recorded);
    // The unused ones (every twentieth) registered 40, 60 and 80 hours ago; those of 0 and 20 hours stay.
    expect(deleted.unused_clients).toBe(600);
    const reaper = queries.find((q) => /delete from applications/.test(q.sql))!;
    const plan = await explain(big.handle.db, reaper);
    expect(sequentialOn(plan, 'applications'), JSON.stringify(plan)).toEqual([]);
    expect(indexesOf(plan)).toEqual(expect.arrayContaining(['applications_unused_registrations_idx', 'applications_pkey']));

    // The registration records of more than an hour ago.
    expect(deleted.client_registrations).toBe(1000);
    const records = queries.find((q) => /delete from "client_registrations"/.test(q.sql))!;
    const recordsPlan = await explain(big.handle.db, records);
    expect(sequentialOn(recordsPlan, 'client_registrations'), JSON.stringify(recordsPlan)).toEqual([]);
    expect(indexesOf(recordsPlan)).toEqual(expect.arrayContaining(['client_registrations_created_at_idx', 'client_registrations_pkey']));
  });
});
