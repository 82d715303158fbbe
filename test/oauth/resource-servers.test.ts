/**
 * Resource servers (issue 44): a registered resource has credentials of its own and introspects
 * the tokens issued for it (RFC 7662), by audience as ZITADEL and Keycloak 26.7 rule; everything
 * else is `{"active": false}`, the same answer whatever the reason. With
 * `Accept: application/token-introspection+jwt` the answer is a JWT signed by the server (RFC 9701).
 * A resource's credentials get nothing else: no grant, no authorization request, no revocation of
 * tokens that are not its own.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { createLocalJWKSet, decodeJwt, exportJWK, generateKeyPair, jwtVerify, SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { addMember, removeMember } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { createApplication } from '../../src/oauth/models/applications.js';
import { revokeGrants } from '../../src/oauth/models/grants.js';
import { registerResource, rotateResourceSecret, setResourceKeys } from '../../src/oauth/models/resource-clients.js';
import { INTROSPECTION_JWT, wantsJwt } from '../../src/oauth/endpoints/introspect.js';
import { userTokens as consentedTokens } from '../helpers/consent.js';
import { sql } from 'kysely';
import { deleteExpired } from '../../src/retention.js';
import { atTime } from '../helpers/clock.js';
import { BACKEND } from '../helpers/db.js';
import { basic, form } from '../helpers/oauth.js';
import { type OidcWorld, startOidcWorld } from '../helpers/oidc-world.js';

const PASSWORD = 'resource-server-password-1';
const REDIRECT = 'https://agent.example.com/callback';
const SERVICE_A = 'https://a.example.com/api';
const SERVICE_B = 'https://b.example.com';

let world: OidcWorld;
let app: { client_id: string; client_secret: string };
let a: { client_id: string; client_secret: string };
let b: { client_id: string; client_secret: string };
/** Service C's credentials are rotated and replaced by keys. */
let c: { client_id: string; client_secret: string };
const SERVICE_C = 'https://c.example.com';
let n = 0;

/** A member of the world's organization, with a password, to sign in with. */
async function member(): Promise<{ id: number; email: string }> {
  const email = `rs-${++n}-${process.pid}-${Date.now()}@example.com`;
  const user = await createUser(world.t.handle.db, { email, password: PASSWORD, name: `Resource User ${n}` });
  await addMember(world.t.handle.db, { organizationId: world.org.organizationId, userId: user.id, role: 'member' });
  return { id: user.id, email };
}

/** The user's tokens by the real flow (consent for the world's organization), for `resource` when named. */
const userTokens = (user: { email: string }, scope: string, resource?: string) =>
  consentedTokens(world, { ...app, redirect_uri: REDIRECT }, { email: user.email, password: PASSWORD, organizationId: world.org.organizationId }, { scope, resource });

async function post(path: string, fields: Record<string, string>, authorization?: string, accept?: string) {
  const res = await fetch(`${world.issuer}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', ...(authorization ? { authorization } : {}), ...(accept ? { accept } : {}) },
    body: form(fields),
  });
  const text = await res.text();
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    // a JWT answer, or an empty revocation answer
  }
  return { status: res.status, type: res.headers.get('content-type'), cacheControl: res.headers.get('cache-control'), body: body as Record<string, unknown> };
}

/** Introspection by a resource with its secret (Basic). */
const introspect = (who: { client_id: string; client_secret: string }, token: string, accept?: string) => post('/oauth/introspect', { token }, basic(who.client_id, who.client_secret), accept);

beforeAll(async () => {
  world = await startOidcWorld();
  const db = world.t.handle.db;
  app = await createApplication(db, { organizationId: world.org.organizationId, type: 'public', name: 'Agent', redirectUris: [REDIRECT], scopes: 'contacts.read tasks.read' });
  a = (await registerResource(db, world.config, { uri: SERVICE_A, name: 'Service A', scopes: 'contacts.read orders.read' })).credentials;
  b = (await registerResource(db, world.config, { uri: SERVICE_B, name: 'Service B', scopes: 'contacts.read orders.read', accessTokenTtl: 600 })).credentials;
  c = (await registerResource(db, world.config, { uri: SERVICE_C, name: 'Service C', scopes: 'contacts.read' })).credentials;
});

afterAll(async () => {
  vi.unstubAllGlobals();
  await world?.close();
});

describe(`introspection by the resource a token is for (RFC 7662) on ${BACKEND}`, () => {
  it('a resource learns about a token issued for it, with client_secret_basic or client_secret_post: the organization, scopes, audience and subject', async () => {
    const user = await member();
    const tokens = await userTokens(user, 'contacts.read orders.read', SERVICE_A);
    const claims = decodeJwt(tokens.access_token);
    const expected = {
      active: true,
      token_type: 'Bearer',
      scope: 'contacts.read orders.read',
      client_id: app.client_id,
      sub: String(user.id),
      organization_id: world.org.organizationId,
      organization_name: world.org.organizationName,
      iat: claims.iat,
      exp: claims.exp,
      iss: world.issuer,
      aud: SERVICE_A,
      jti: claims.jti,
    };
    const byBasic = await introspect(a, tokens.access_token);
    expect(byBasic).toMatchObject({ status: 200, cacheControl: 'no-store' });
    expect(byBasic.body).toEqual(expected);
    const byPost = await post('/oauth/introspect', { token: tokens.access_token, client_id: a.client_id, client_secret: a.client_secret });
    expect(byPost.body).toEqual(expected);
    // The issuing client's own right stays.
    expect((await post('/oauth/introspect', { token: tokens.access_token }, basic(app.client_id, app.client_secret))).body).toEqual(expected);
  });

  it('answers {"active": false}, the same answer, for a token of another audience, orgauth’s API, another resource’s refresh token and garbage', async () => {
    const user = await member();
    const forB = await userTokens(user, 'contacts.read', SERVICE_B);
    const forApi = await userTokens(user, 'contacts.read tasks.read');
    // Each is a live token: its own audience (or its client) sees it active.
    expect((await introspect(b, forB.access_token)).body.active).toBe(true);
    expect((await post('/oauth/introspect', { token: forApi.access_token }, basic(app.client_id, app.client_secret))).body.active).toBe(true);
    const answers = [];
    for (const token of [forB.access_token, forApi.access_token, forB.refresh_token, forApi.refresh_token, 'not.a.token', randomBytes(32).toString('base64url')]) {
      answers.push(await introspect(a, token));
    }
    for (const answer of answers) expect(answer).toEqual({ status: 200, type: 'application/json; charset=utf-8', cacheControl: 'no-store', body: { active: false } });
  });

  it('a revoked token, a revoked grant and a removed member’s token are inactive to their resource at once', async () => {
    const [revokedToken, revokedGrant, removed] = [await member(), await member(), await member()];
    const t1 = await userTokens(revokedToken, 'contacts.read', SERVICE_A);
    const t2 = await userTokens(revokedGrant, 'contacts.read', SERVICE_A);
    const t3 = await userTokens(removed, 'contacts.read', SERVICE_A);
    for (const t of [t1, t2, t3]) expect((await introspect(a, t.access_token)).body.active).toBe(true);

    // RFC 7009 by the client the token was issued to.
    expect((await post('/oauth/revoke', { token: t1.access_token }, basic(app.client_id, app.client_secret))).status).toBe(200);
    const grantId = decodeJwt(t2.access_token).grant_id as number;
    await revokeGrants(world.t.handle.db, { grantId }, 'revoked_by_user');
    await removeMember(world.t.handle.db, { organizationId: world.org.organizationId, userId: removed.id });
    for (const t of [t1, t2, t3]) expect((await introspect(a, t.access_token)).body).toEqual({ active: false });
  });

  it('a token of an application disabled since is inactive at once', async () => {
    const db = world.t.handle.db;
    const other = await createApplication(db, { organizationId: world.org.organizationId, type: 'public', name: 'Soon disabled', redirectUris: [REDIRECT], scopes: 'contacts.read' });
    const tokens = await consentedTokens(world, { ...other, redirect_uri: REDIRECT }, { email: (await member()).email, password: PASSWORD, organizationId: world.org.organizationId }, { scope: 'contacts.read', resource: SERVICE_A });
    expect((await introspect(a, tokens.access_token)).body.active).toBe(true);
    // The row alone, without the job that revokes its grants (updateApplication queues one): the
    // application's state decides, as the API's does. Every instance's cache hears of it by NOTIFY.
    await db.updateTable('applications').set({ disabled: true }).where('client_id', '=', other.client_id).execute();
    await expect.poll(async () => (await introspect(a, tokens.access_token)).body, { timeout: 2000, interval: 20 }).toEqual({ active: false });
    expect(await db.selectFrom('grants').select('revoked_at').where('id', '=', decodeJwt(tokens.access_token).grant_id as number).executeTakeFirstOrThrow()).toEqual({ revoked_at: null });
  });

  it('an expired token is inactive', async () => {
    const tokens = await userTokens(await member(), 'contacts.read', SERVICE_B);
    expect((await introspect(b, tokens.access_token)).body.active).toBe(true);
    // Past its 600 s and the clock tolerance.
    expect((await atTime(Date.now() + 661_000, () => introspect(b, tokens.access_token))).body).toEqual({ active: false });
  });
});

describe(`a resource's credentials on ${BACKEND}`, () => {
  it('get nothing but introspection: no grant, no authorization request, no revocation of tokens that are not its own', async () => {
    const tokens = await userTokens(await member(), 'contacts.read', SERVICE_A);
    const grants: Record<string, string>[] = [
      { grant_type: 'client_credentials', organization_id: String(world.org.organizationId) },
      { grant_type: 'authorization_code', code: 'x'.repeat(43), redirect_uri: REDIRECT, code_verifier: 'y'.repeat(43) },
      { grant_type: 'refresh_token', refresh_token: tokens.refresh_token },
    ];
    for (const grant of grants) {
      const res = await post('/oauth/token', grant, basic(a.client_id, a.client_secret));
      expect(res.status, JSON.stringify(res.body)).toBe(400);
      expect(res.body.error).toBe('unauthorized_client');
    }
    const authorize = await fetch(`${world.issuer}/oauth/authorize?${new URLSearchParams({ client_id: a.client_id, redirect_uri: REDIRECT, response_type: 'code', scope: 'contacts.read', code_challenge: 'E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM', code_challenge_method: 'S256' })}`, { redirect: 'manual' });
    expect(authorize.status).toBe(400);
    // Revocation is the issuing client's (RFC 7009 §2.1): the resource's attempt changes nothing.
    expect((await post('/oauth/revoke', { token: tokens.access_token }, basic(a.client_id, a.client_secret))).status).toBe(200);
    expect((await introspect(a, tokens.access_token)).body.active).toBe(true);
    // A wrong secret is invalid_client.
    expect(await introspect({ client_id: a.client_id, client_secret: 'not the secret' }, tokens.access_token)).toMatchObject({ status: 401, body: { error: 'invalid_client' } });
  });

  it('are not a self-registered client: the reaper of unused clients leaves them, however old and unused', async () => {
    const db = world.t.handle.db;
    await db.updateTable('applications').set({ created_at: sql`now() - interval '30 days'` }).where('client_id', '=', b.client_id).execute();
    await deleteExpired(db, { unusedClientTtl: 60 });
    expect(await db.selectFrom('applications').select(['type', 'first_used_at']).where('client_id', '=', b.client_id).executeTakeFirst()).toEqual({ type: 'resource', first_used_at: null });
  });

  it('a rotated secret works at once and the old one no longer does; private_key_jwt with registered keys replaces the secret', async () => {
    const db = world.t.handle.db;
    const tokens = await userTokens(await member(), 'contacts.read', SERVICE_C);
    expect((await introspect(c, tokens.access_token)).body.active).toBe(true);

    const rotated = await rotateResourceSecret(db, SERVICE_C);
    expect(rotated.client_id).toBe(c.client_id);
    await expect.poll(async () => (await introspect(c, tokens.access_token)).status, { timeout: 2000, interval: 20 }).toBe(401);
    expect((await introspect(rotated, tokens.access_token)).body.active).toBe(true);

    // Keys instead of a secret (RFC 7523): an assertion signed with the registered key, once.
    const { publicKey, privateKey } = await generateKeyPair('ES256');
    await setResourceKeys(db, SERVICE_C, { jwks: { keys: [{ ...(await exportJWK(publicKey)), kid: 'c-1', alg: 'ES256', use: 'sig' }] } }, { allowHttp: true });
    const assertion = () =>
      new SignJWT({ jti: randomUUID() })
        .setProtectedHeader({ alg: 'ES256', kid: 'c-1' })
        .setIssuer(rotated.client_id)
        .setSubject(rotated.client_id)
        .setAudience(world.issuer)
        .setIssuedAt()
        .setExpirationTime('60s')
        .sign(privateKey);
    const byKey = (jwt: string) =>
      post('/oauth/introspect', { token: tokens.access_token, client_assertion_type: 'urn:ietf:params:oauth:client-assertion-type:jwt-bearer', client_assertion: jwt });
    await expect.poll(async () => (await byKey(await assertion())).body.active, { timeout: 2000, interval: 20 }).toBe(true);
    const once = await assertion();
    expect((await byKey(once)).body.active).toBe(true);
    expect((await byKey(once)).status).toBe(401);
    expect((await introspect(rotated, tokens.access_token)).status).toBe(401);
  });
});

describe(`JWT introspection answers (RFC 9701) on ${BACKEND}`, () => {
  it('with Accept: application/token-introspection+jwt, a JWT signed with the server’s key for the caller, holding the same answer', async () => {
    const tokens = await userTokens(await member(), 'orders.read', SERVICE_A);
    const json = await introspect(a, tokens.access_token);
    const jwks = createLocalJWKSet((await (await fetch(`${world.issuer}/.well-known/jwks.json`)).json()) as { keys: [] });
    for (const [token, expected] of [
      [tokens.access_token, json.body],
      ['not.a.token', { active: false }],
    ] as const) {
      const res = await introspect(a, token, INTROSPECTION_JWT);
      expect(res).toMatchObject({ status: 200, type: INTROSPECTION_JWT, cacheControl: 'no-store' });
      const { payload, protectedHeader } = await jwtVerify(String(res.body), jwks, { issuer: world.issuer, audience: a.client_id, typ: 'token-introspection+jwt' });
      expect(protectedHeader.alg).toBe(world.config.signingAlg);
      expect(payload.token_introspection).toEqual(expected);
      expect(payload.iat).toBeTypeOf('number');
    }
    const metadata = (await (await fetch(`${world.issuer}/.well-known/oauth-authorization-server`)).json()) as Record<string, unknown>;
    expect(metadata.introspection_signing_alg_values_supported).toEqual([world.config.signingAlg]);
  });

  it('reads the Accept header as RFC 9110 does: the type named with a q above zero, among others', () => {
    expect(wantsJwt(undefined)).toBe(false);
    expect(wantsJwt('application/json')).toBe(false);
    expect(wantsJwt('application/token-introspection+jwt')).toBe(true);
    expect(wantsJwt('application/json;q=0.5, Application/Token-Introspection+JWT')).toBe(true);
    expect(wantsJwt('application/token-introspection+jwt;q=0')).toBe(false);
    expect(wantsJwt('application/token-introspection+jwt; q=0.1')).toBe(true);
    // JSON preferred over it: JSON.
    expect(wantsJwt('application/json, application/token-introspection+jwt;q=0.5')).toBe(false);
    expect(wantsJwt('*/*;q=0.1, application/token-introspection+jwt')).toBe(true);
  });
});
