import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { verifyAccessToken } from '../../src/oauth/models/access-tokens.js';
import { KeyStore } from '../../src/oauth/models/key-store.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { buildTestApp, testConfig, TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { basic, createOrgFixture, form, type OrgFixture, SAFE_DESCRIPTION } from '../helpers/oauth.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
let org: OrgFixture;
let other: OrgFixture;
const config = testConfig();

beforeAll(async () => {
  t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  app = await buildTestApp(t.handle.db);
  org = await createOrgFixture(t.handle.db);
  other = await createOrgFixture(t.handle.db);
});
afterAll(async () => {
  await app.close();
  await t.close();
});

function token(body: string, headers: Record<string, string> = {}, url = '/oauth/token'): Promise<LightMyRequestResponse> {
  return app.inject({ method: 'POST', url, headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers }, payload: body });
}

const cc = (extra: Record<string, string | string[]> = {}) =>
  form({ grant_type: 'client_credentials', organization_id: String(org.organizationId), ...extra });

function expectError(res: LightMyRequestResponse, status: number, error: string): void {
  expect({ status: res.statusCode, body: res.json() }).toEqual({ status, body: { error, error_description: expect.stringMatching(SAFE_DESCRIPTION) } });
  // TK-2: errors are not cached either.
  expect(res.headers['cache-control']).toBe('no-store');
  expect(res.headers.pragma).toBe('no-cache');
}

describe(`POST /oauth/token client_credentials on ${BACKEND}`, () => {
  it('issues a token for the application\'s organization with Basic authentication (CC-1)', async () => {
    const res = await token(cc(), { authorization: basic(org.privateApp.client_id, org.privateApp.client_secret) });
    expect(res.statusCode).toBe(200);
    expect(res.headers['cache-control']).toBe('no-store');
    expect(res.headers.pragma).toBe('no-cache');
    const body = res.json();
    expect(body).toEqual({
      token_type: 'Bearer',
      expires_in: 31_536_000,
      access_token: expect.any(String),
      scope: 'contacts.read contacts.write tasks.read tasks.write',
      organization_id: org.organizationId,
      organization_name: org.organizationName,
    });
    expect(body).not.toHaveProperty('refresh_token');

    const claims = await verifyAccessToken(new KeyStore(t.handle.db, config), config, body.access_token);
    expect(claims).toEqual({
      iss: config.issuer,
      aud: `${config.issuer}/api/v1`,
      sub: org.privateApp.client_id,
      client_id: org.privateApp.client_id,
      scope: body.scope,
      organization_id: org.organizationId,
      grant_id: expect.any(Number),
      jti: expect.any(String),
      iat: expect.any(Number),
      exp: claims.iat + 31_536_000,
    });
    const grant = await t.handle.db.selectFrom('grants').selectAll().where('id', '=', claims.grant_id).executeTakeFirstOrThrow();
    expect(grant).toMatchObject({ organization_id: org.organizationId, user_id: null, revoked_at: null, scopes: body.scope.split(' ') });
  });

  it('accepts client_secret_post and narrows to the scopes asked for', async () => {
    const res = await token(cc({ client_id: org.privateApp.client_id, client_secret: org.privateApp.client_secret, scope: 'tasks.read contacts.read' }));
    expect(res.statusCode).toBe(200);
    expect(res.json().scope).toBe('contacts.read tasks.read');
  });

  it('form-url-decodes the Basic user and password (TK-5)', async () => {
    const pct = (s: string) => [...s].map((c) => `%${c.charCodeAt(0).toString(16).padStart(2, '0')}`).join('');
    const header = `Basic ${Buffer.from(`${pct(org.privateApp.client_id)}:${pct(org.privateApp.client_secret)}`).toString('base64')}`;
    expect((await token(cc(), { authorization: header })).statusCode).toBe(200);
    expect((await token(cc(), { authorization: header.replace('Basic', 'bAsIc') })).statusCode).toBe(200);
  });

  it('refuses a scope the application does not have, or an unknown or empty one (invalid_scope)', async () => {
    const narrow = await createOrgFixture(t.handle.db, { scopes: 'contacts.read' });
    const auth = { authorization: basic(narrow.privateApp.client_id, narrow.privateApp.client_secret) };
    const req = (scope: string) => token(form({ grant_type: 'client_credentials', organization_id: String(narrow.organizationId), scope }), auth);
    expectError(await req('contacts.read tasks.write'), 400, 'invalid_scope');
    expectError(await req('contacts.read admin'), 400, 'invalid_scope');
    expectError(await req('   '), 400, 'invalid_scope');
    expect((await req('contacts.read')).json().scope).toBe('contacts.read');
  });

  it.each([
    ['missing', {}],
    ['non-canonical', { organization_id: '01' }],
    ['not a number', { organization_id: 'one' }],
    ['negative', { organization_id: '-1' }],
    ['huge', { organization_id: '9223372036854775808' }],
  ])('refuses a %s organization_id (invalid_request)', async (_what, fields) => {
    const body = form({ grant_type: 'client_credentials', ...fields });
    expectError(await token(body, { authorization: basic(org.privateApp.client_id, org.privateApp.client_secret) }), 400, 'invalid_request');
  });

  it("refuses another organization's id (CC-1)", async () => {
    const res = await token(form({ grant_type: 'client_credentials', organization_id: String(other.organizationId) }), {
      authorization: basic(org.privateApp.client_id, org.privateApp.client_secret),
    });
    expectError(res, 400, 'invalid_request');
  });

  it('refuses public applications (unauthorized_client)', async () => {
    expectError(await token(cc(), { authorization: basic(org.publicApp.client_id, org.publicApp.client_secret) }), 400, 'unauthorized_client');
  });
});

describe('client authentication at the token endpoint', () => {
  it('answers a wrong secret through Basic with 401 and WWW-Authenticate: Basic (TK-4)', async () => {
    const res = await token(cc(), { authorization: basic(org.privateApp.client_id, 'wrong-secret') });
    expectError(res, 401, 'invalid_client');
    expect(res.headers['www-authenticate']).toBe('Basic realm="orgauth", charset="UTF-8"');
  });

  it('answers a wrong secret in the body with 401 and a challenge too (RFC 9110 §15.5.2)', async () => {
    const res = await token(cc({ client_id: org.privateApp.client_id, client_secret: 'wrong' }));
    expectError(res, 401, 'invalid_client');
    expect(res.headers['www-authenticate']).toBe('Basic realm="orgauth", charset="UTF-8"');
  });

  it('refuses a client_id that cannot be ours without looking it up or remembering it', async () => {
    expectError(await token(cc({ client_id: 'x'.repeat(60_000), client_secret: 'y' })), 401, 'invalid_client');
    expectError(await token(cc({ client_id: org.privateApp.client_id.toUpperCase(), client_secret: org.privateApp.client_secret })), 401, 'invalid_client');
  });

  it('answers an unknown client, a disabled one and no credentials with 401', async () => {
    expectError(await token(cc({ client_id: 'no-such-client', client_secret: 'x' })), 401, 'invalid_client');
    expectError(await token(cc()), 401, 'invalid_client');
    expectError(await token(cc(), { authorization: 'Basic !!!' }), 401, 'invalid_client');
    const disabled = await createOrgFixture(t.handle.db);
    await t.handle.db.updateTable('applications').set({ disabled: true }).where('client_id', '=', disabled.privateApp.client_id).execute();
    const res = await token(form({ grant_type: 'client_credentials', organization_id: String(disabled.organizationId) }), {
      authorization: basic(disabled.privateApp.client_id, disabled.privateApp.client_secret),
    });
    expectError(res, 401, 'invalid_client');
  });

  it('refuses both methods at once and credentials in the query (TK-5)', async () => {
    const both = await token(cc({ client_id: org.privateApp.client_id, client_secret: org.privateApp.client_secret }), {
      authorization: basic(org.privateApp.client_id, org.privateApp.client_secret),
    });
    expectError(both, 400, 'invalid_request');
    const query = await token(cc(), {}, `/oauth/token?client_id=${org.privateApp.client_id}&client_secret=${org.privateApp.client_secret}`);
    expectError(query, 400, 'invalid_request');
  });

  it('throttles repeated failures for one client, even with the right secret (TK-6)', async () => {
    const victim = await createOrgFixture(t.handle.db);
    const body = form({ grant_type: 'client_credentials', organization_id: String(victim.organizationId) });
    for (let i = 0; i < 10; i++) {
      expect((await token(body, { authorization: basic(victim.privateApp.client_id, `guess-${i}`) })).statusCode).toBe(401);
    }
    const blocked = await token(body, { authorization: basic(victim.privateApp.client_id, victim.privateApp.client_secret) });
    expectError(blocked, 429, 'too_many_requests');
    expect(Number(blocked.headers['retry-after'])).toBeGreaterThan(0);
    // Other clients are not affected, nor is the same client from another address: failures
    // cannot lock a client out, since its client_id is public.
    expect((await token(cc(), { authorization: basic(org.privateApp.client_id, org.privateApp.client_secret) })).statusCode).toBe(200);
    const elsewhere = await app.inject({
      method: 'POST',
      url: '/oauth/token',
      remoteAddress: '198.51.100.7',
      headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(victim.privateApp.client_id, victim.privateApp.client_secret) },
      payload: body,
    });
    expect(elsewhere.statusCode).toBe(200);
  });
});

describe('requests the token endpoint refuses (TK-1, TK-3)', () => {
  const auth = () => ({ authorization: basic(org.privateApp.client_id, org.privateApp.client_secret) });

  it('answers other methods with 405 and Allow: POST', async () => {
    for (const method of ['GET', 'PUT', 'DELETE', 'PATCH'] as const) {
      const res = await app.inject({ method, url: '/oauth/token' });
      expect(res.statusCode).toBe(405);
      expect(res.headers.allow).toBe('POST');
      expect(res.headers['cache-control']).toBe('no-store');
    }
  });

  it('refuses JSON, text and missing bodies with invalid_request', async () => {
    for (const [type, payload] of [
      ['application/json', JSON.stringify({ grant_type: 'client_credentials' })],
      ['text/plain', 'grant_type=client_credentials'],
      ['multipart/form-data; boundary=x', '--x--'],
    ] as const) {
      expectError(await token(payload, { ...auth(), 'content-type': type }), 400, 'invalid_request');
    }
    const none = await app.inject({ method: 'POST', url: '/oauth/token', headers: auth() });
    expectError(none, 400, 'invalid_request');
  });

  it('refuses a repeated parameter, a missing grant_type and an unknown one', async () => {
    expectError(await token(`${cc()}&scope=contacts.read&scope=tasks.read`, auth()), 400, 'invalid_request');
    expectError(await token(form({ grant_type: ['client_credentials', 'client_credentials'], organization_id: '1' }), auth()), 400, 'invalid_request');
    expectError(await token(form({ organization_id: '1' }), auth()), 400, 'invalid_request');
    expectError(await token(form({ grant_type: 'password', username: 'a', password: 'b' }), auth()), 400, 'unsupported_grant_type');
    expectError(await token(form({ grant_type: '__proto__' }), auth()), 400, 'unsupported_grant_type');
  });

  it('keeps quotes, backslashes and line breaks out of error descriptions', async () => {
    const res = await token(form({ grant_type: 'client_credentials', organization_id: String(org.organizationId), scope: 'a"b\\c\r\nd' }), auth());
    expectError(res, 400, 'invalid_scope');
  });

  it('ignores prototype-polluting parameter names', async () => {
    const res = await token(`${cc()}&__proto__=x&constructor[prototype][admin]=1`, auth());
    expect(res.statusCode).toBe(200);
  });
});

describe('metadata (MD-3) and JWKS', () => {
  it('publishes RFC 8414 metadata whose issuer is the configured one', async () => {
    const res = await app.inject('/.well-known/oauth-authorization-server');
    expect(res.statusCode).toBe(200);
    expect(res.json()).toMatchObject({
      issuer: config.issuer,
      authorization_endpoint: `${config.issuer}/oauth/authorize`,
      token_endpoint: `${config.issuer}/oauth/token`,
      revocation_endpoint: `${config.issuer}/oauth/revoke`,
      introspection_endpoint: `${config.issuer}/oauth/introspect`,
      registration_endpoint: `${config.issuer}/oauth/register`,
      device_authorization_endpoint: `${config.issuer}/oauth/device_authorization`,
      client_id_metadata_document_supported: true,
      grant_types_supported: ['authorization_code', 'refresh_token', 'client_credentials', 'urn:ietf:params:oauth:grant-type:device_code', 'urn:ietf:params:oauth:grant-type:token-exchange'],
      jwks_uri: `${config.issuer}/.well-known/jwks.json`,
      scopes_supported: [
        'openid', 'profile', 'email',
        'contacts.read', 'contacts.write', 'tasks.read', 'tasks.write',
        'applications.read', 'applications.write', 'members.read', 'members.write', 'grants.read', 'grants.write', 'audit.read', 'sso.read', 'sso.write',
        'webhooks.read', 'webhooks.write', 'directory.read', 'directory.write',
      ],
      response_types_supported: ['code'],
      token_endpoint_auth_methods_supported: ['client_secret_basic', 'client_secret_post', 'private_key_jwt', 'none'],
      token_endpoint_auth_signing_alg_values_supported: ['ES256', 'ES384', 'PS256', 'PS384', 'RS256', 'RS384', 'EdDSA'],
      pushed_authorization_request_endpoint: `${config.issuer}/oauth/par`,
      require_pushed_authorization_requests: false,
      dpop_signing_alg_values_supported: ['ES256', 'ES384', 'ES512', 'PS256', 'PS384', 'PS512', 'RS256', 'RS384', 'RS512', 'EdDSA'],
      id_token_signing_alg_values_supported: ['RS256', 'ES256'],
      tls_client_certificate_bound_access_tokens: false,
      code_challenge_methods_supported: ['S256'],
      authorization_response_iss_parameter_supported: true,
    });
    // No null values anywhere (RFC 8414 §2: a parameter with no value is omitted).
    expect(JSON.stringify(res.json())).not.toContain('null');
  });

  it('describes the API as a protected resource (RFC 9728), which its 401 points to', async () => {
    const res = await app.inject('/.well-known/oauth-protected-resource/api/v1');
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({
      resource: `${config.issuer}/api/v1`,
      authorization_servers: [config.issuer],
      scopes_supported: ['contacts.read', 'contacts.write', 'tasks.read', 'tasks.write'],
      bearer_methods_supported: ['header'],
      dpop_signing_alg_values_supported: ['ES256', 'ES384', 'ES512', 'PS256', 'PS384', 'PS512', 'RS256', 'RS384', 'RS512', 'EdDSA'],
      dpop_bound_access_tokens_required: false,
      resource_name: 'orgauth API',
      resource_documentation: `${config.issuer}/docs`,
    });
    const challenge = (await app.inject('/api/v1/1/contacts')).headers['www-authenticate'];
    expect(challenge).toContain(`resource_metadata="${config.issuer}/.well-known/oauth-protected-resource/api/v1"`);
  });

  it('leaves registration_endpoint out when registration is off', async () => {
    const off = await buildTestApp(t.handle.db, { env: { CLIENT_REGISTRATION: 'off' } });
    try {
      expect((await off.inject('/.well-known/oauth-authorization-server')).json()).not.toHaveProperty('registration_endpoint');
    } finally {
      await off.close();
    }
  });

  it('publishes the public signing keys, never a private part', async () => {
    const res = await app.inject('/.well-known/jwks.json');
    const { keys } = res.json() as { keys: Record<string, unknown>[] };
    // The access tokens' ES256 key and the ID tokens' RS256 key (OpenID Connect Discovery requires RS256).
    expect(keys).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ kty: 'EC', crv: 'P-256', alg: 'ES256', use: 'sig', kid: expect.any(String) }),
        expect.objectContaining({ kty: 'RSA', alg: 'RS256', use: 'sig', kid: expect.any(String) }),
      ]),
    );
    expect(keys).toHaveLength(2);
    for (const key of keys) for (const part of ['d', 'p', 'q', 'dp', 'dq', 'qi']) expect(key).not.toHaveProperty(part);
  });
});
