/**
 * Token exchange (RFC 8693, issue 44): service A exchanges the user's token it received for a
 * token to service B, which allows A; the result keeps the user, the organization and the grant,
 * narrows the scopes, and ends when the grant does. With an actor token the result says who acts
 * (`act`), nested; a delegated token is exchanged only by its current actor. Deny by default, and
 * every refusal is one of RFC 8693's and RFC 8707's errors. Driven with raw requests and with
 * openid-client's genericGrantRequest.
 */
import { randomBytes } from 'node:crypto';
import { calculateJwkThumbprint, decodeJwt, exportJWK, type JWK } from 'jose';
import * as client from 'openid-client';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { addMember } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { connectDatabase } from '../../src/db/connect.js';
import { createApplication } from '../../src/oauth/models/applications.js';
import { revokeGrants } from '../../src/oauth/models/grants.js';
import { registerResource } from '../../src/oauth/models/resource-clients.js';
import { updateResource } from '../../src/oauth/models/resources.js';
import { userTokens as consentedTokens } from '../helpers/consent.js';
import { atTime } from '../helpers/clock.js';
import { buildTestApp } from '../helpers/app.js';
import { BACKEND } from '../helpers/db.js';
import { basic, form } from '../helpers/oauth.js';
import { type OidcWorld, startOidcWorld } from '../helpers/oidc-world.js';

const PASSWORD = 'token-exchange-password-1';
const REDIRECT = 'https://agent.example.com/callback';
const EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const ACCESS_TOKEN = 'urn:ietf:params:oauth:token-type:access_token';
const [A, B, C, D] = ['https://a.example.com', 'https://b.example.com', 'https://c.example.com', 'https://d.example.com'];
/** A resource whose tokens live 60 s: shorter than B's 300. */
const SHORT = 'https://short.example.com';

type Credentials = { client_id: string; client_secret: string };
let world: OidcWorld;
let agent: Credentials;
let other: Credentials;
const rs: Record<'a' | 'b' | 'c' | 'd' | 'short', Credentials> = {} as never;
/** A private integration of the organization, whose own tokens (client_credentials) are exchanged too. */
let integration: Credentials;
let n = 0;

async function member(): Promise<{ email: string }> {
  const email = `te-${++n}-${process.pid}-${Date.now()}@example.com`;
  const user = await createUser(world.t.handle.db, { email, password: PASSWORD, name: `Exchange User ${n}` });
  await addMember(world.t.handle.db, { organizationId: world.org.organizationId, userId: user.id, role: 'member' });
  return { email };
}

const tokensOf = (app: Credentials, user: { email: string }, scope: string, resource?: string) =>
  consentedTokens(world, { ...app, redirect_uri: REDIRECT }, { email: user.email, password: PASSWORD, organizationId: world.org.organizationId }, { scope, resource });

async function post(path: string, fields: Record<string, string | string[]>, who: Credentials) {
  const res = await fetch(`${world.issuer}${path}`, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(who.client_id, who.client_secret) }, body: form(fields) });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

const exchange = (who: Credentials, fields: Record<string, string | string[]>) => post('/oauth/token', { grant_type: EXCHANGE, subject_token_type: ACCESS_TOKEN, ...fields }, who);
const introspect = async (who: Credentials, token: string) => (await post('/oauth/introspect', { token }, who)).body;

beforeAll(async () => {
  world = await startOidcWorld();
  const db = world.t.handle.db;
  agent = await createApplication(db, { organizationId: world.org.organizationId, type: 'public', name: 'Agent', redirectUris: [REDIRECT], scopes: 'contacts.read tasks.read' });
  other = await createApplication(db, { organizationId: world.org.organizationId, type: 'public', name: 'Other', redirectUris: [REDIRECT], scopes: 'contacts.read' });
  rs.a = (await registerResource(db, world.config, { uri: A, name: 'A', scopes: 'orders.read orders.write contacts.read' })).credentials;
  rs.b = (await registerResource(db, world.config, { uri: B, name: 'B', scopes: 'orders.read contacts.read', accessTokenTtl: 300 })).credentials;
  rs.c = (await registerResource(db, world.config, { uri: C, name: 'C', scopes: 'orders.read' })).credentials;
  rs.d = (await registerResource(db, world.config, { uri: D, name: 'D', scopes: 'orders.read' })).credentials;
  rs.short = (await registerResource(db, world.config, { uri: SHORT, name: 'Short', scopes: 'orders.read', accessTokenTtl: 60 })).credentials;
  integration = await createApplication(db, { organizationId: world.org.organizationId, type: 'private', name: 'Integration', scopes: 'orders.read contacts.read' });
  // B takes tokens exchanged by A (by its URI), by the agent, by Short and by the integration; C by the agent; D by nobody.
  await updateResource(db, B, { allowExchangeFrom: [A, agent.client_id, SHORT, integration.client_id] });
  await updateResource(db, C, { allowExchangeFrom: [agent.client_id] });
});

afterAll(async () => {
  vi.unstubAllGlobals();
  await world?.close();
});

describe(`token exchange (RFC 8693) on ${BACKEND}`, () => {
  it('on behalf of: A exchanges the token it received for one to B: same user, organization and grant, narrowed scopes, aud B, no refresh token', async () => {
    const user = await member();
    const forA = await tokensOf(agent, user, 'orders.read orders.write', A);
    const res = await exchange(rs.a, { subject_token: forA.access_token, resource: B });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toEqual({
      access_token: expect.any(String),
      issued_token_type: ACCESS_TOKEN,
      token_type: 'Bearer',
      expires_in: 300,
      scope: 'orders.read',
      organization_id: world.org.organizationId,
      organization_name: world.org.organizationName,
    });
    const [subject, exchanged] = [decodeJwt(forA.access_token), decodeJwt(String(res.body.access_token))];
    expect(exchanged).toMatchObject({ aud: B, sub: subject.sub, organization_id: subject.organization_id, grant_id: subject.grant_id, client_id: rs.a.client_id, scope: 'orders.read' });
    expect(exchanged.act).toBeUndefined();
    expect(exchanged.exp! - exchanged.iat!).toBe(300);
    expect(await introspect(rs.b, String(res.body.access_token))).toMatchObject({ active: true, aud: B, sub: subject.sub, scope: 'orders.read' });

    // audience= names the target as well as resource= (a registered resource's URI); a scope within bounds narrows.
    const byAudience = await exchange(rs.a, { subject_token: forA.access_token, audience: `${B}/`, scope: 'orders.read' });
    expect(byAudience).toMatchObject({ status: 200, body: { scope: 'orders.read' } });

    // Revoking the user's grant ends the exchanged token at once, as it ends the original.
    await revokeGrants(world.t.handle.db, { grantId: subject.grant_id as number }, 'revoked_by_user');
    expect(await introspect(rs.b, String(res.body.access_token))).toEqual({ active: false });
    expect(await exchange(rs.a, { subject_token: forA.access_token, resource: B })).toMatchObject({ status: 400, body: { error: 'invalid_request' } });

    // Audited in the organization.
    const events = await world.t.handle.db.selectFrom('audit_events').select(['action', 'details']).where('organization_id', '=', world.org.organizationId).where('action', '=', 'token.exchanged').execute();
    expect(events.length).toBeGreaterThanOrEqual(2);
    expect(events[0]!.details).toMatchObject({ client_id: rs.a.client_id, subject_client_id: agent.client_id, resource: B, scope: 'orders.read' });
  });

  it('revoking the user’s grant through one instance: the exchanged token is inactive on another at once, and refused as a subject token there', async () => {
    // A second instance of the same issuer on the same database (on PostgreSQL with its own pool and LISTEN).
    const handle = world.t.target.kind === 'postgres' ? await connectDatabase(world.t.target) : undefined;
    const other = handle ?? world.t.handle;
    const second = await buildTestApp(other.db, { env: { ISSUER: world.issuer }, listen: other.listen });
    try {
      const forA = await tokensOf(agent, await member(), 'orders.read', A);
      const res = await exchange(rs.a, { subject_token: forA.access_token, resource: B });
      expect(res.status).toBe(200);
      const onSecond = async (token: string) =>
        (await second.inject({ method: 'POST', url: '/oauth/introspect', headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(rs.b.client_id, rs.b.client_secret) }, payload: form({ token }) })).json();
      expect(await onSecond(String(res.body.access_token))).toMatchObject({ active: true });
      // The client revokes its refresh token through the first instance: the grant ends (RFC 7009).
      expect((await post('/oauth/revoke', { token: forA.refresh_token }, { client_id: agent.client_id, client_secret: agent.client_secret })).status).toBe(200);
      expect(await onSecond(String(res.body.access_token))).toEqual({ active: false });
      const again = await second.inject({
        method: 'POST',
        url: '/oauth/token',
        headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(rs.a.client_id, rs.a.client_secret) },
        payload: form({ grant_type: EXCHANGE, subject_token_type: ACCESS_TOKEN, subject_token: forA.access_token, resource: B }),
      });
      expect(again.statusCode).toBe(400);
      expect(again.json()).toMatchObject({ error: 'invalid_request' });
    } finally {
      await second.close();
      await handle?.close();
    }
  });

  it('deny by default: a target that does not allow the caller is unauthorized_client; a token not for the caller nor issued to it is invalid_request', async () => {
    const forA = await tokensOf(agent, await member(), 'orders.read', A);
    expect(await exchange(rs.a, { subject_token: forA.access_token, resource: D })).toMatchObject({ status: 400, body: { error: 'unauthorized_client' } });
    expect(await exchange(rs.a, { subject_token: forA.access_token, resource: C })).toMatchObject({ status: 400, body: { error: 'unauthorized_client' } });
    // B is allowed to nobody's tokens but its own: A's token is not for B.
    expect(await exchange(rs.b, { subject_token: forA.access_token, resource: C })).toMatchObject({ status: 400, body: { error: 'invalid_request' } });
    // Another application of the organization, with its own secret: not its token.
    expect(await exchange({ client_id: other.client_id, client_secret: other.client_secret }, { subject_token: forA.access_token, resource: B })).toMatchObject({ status: 400, body: { error: 'invalid_request' } });
  });

  it('delegation: with an actor token the result carries act, nested on each exchange; a delegated token is exchanged only by its current actor', async () => {
    const user = await member();
    const forA = await tokensOf(agent, user, 'orders.read', A);
    const own = await tokensOf(agent, user, 'contacts.read');
    // The agent, the subject token's own client, exchanges it for C, acting (its own token as the actor token).
    const delegated = await exchange(agent, { subject_token: forA.access_token, resource: C, actor_token: own.access_token, actor_token_type: ACCESS_TOKEN });
    expect(delegated.status, JSON.stringify(delegated.body)).toBe(200);
    expect(decodeJwt(String(delegated.body.access_token)).act).toEqual({ sub: agent.client_id });
    expect(await introspect(rs.c, String(delegated.body.access_token))).toMatchObject({ active: true, act: { sub: agent.client_id } });

    // C, its audience, may not pass it on: only the current actor may.
    await updateResource(world.t.handle.db, B, { allowExchangeFrom: [C] });
    expect(await exchange(rs.c, { subject_token: String(delegated.body.access_token), resource: B })).toMatchObject({ status: 400, body: { error: 'invalid_request' } });
    // The actor may, and acting again nests the chain; without an actor token the chain is kept, never dropped.
    const again = await exchange(agent, { subject_token: String(delegated.body.access_token), resource: B, actor_token: own.access_token, actor_token_type: ACCESS_TOKEN });
    expect(again.status, JSON.stringify(again.body)).toBe(200);
    expect(decodeJwt(String(again.body.access_token)).act).toEqual({ sub: agent.client_id, act: { sub: agent.client_id } });
    const kept = await exchange(agent, { subject_token: String(delegated.body.access_token), resource: B });
    expect(decodeJwt(String(kept.body.access_token)).act).toEqual({ sub: agent.client_id });

    // An actor token of another client is refused.
    const others = await tokensOf(other, user, 'contacts.read');
    expect(await exchange(agent, { subject_token: forA.access_token, resource: C, actor_token: others.access_token, actor_token_type: ACCESS_TOKEN })).toMatchObject({ status: 400, body: { error: 'invalid_request' } });
  });

  it('never outlives its subject token; revoking an exchanged token revokes it alone; an application’s own token is exchanged too', async () => {
    const forShort = await tokensOf(agent, await member(), 'orders.read', SHORT);
    const subject = decodeJwt(forShort.access_token);
    const res = await exchange(rs.short, { subject_token: forShort.access_token, resource: B });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const exchanged = decodeJwt(String(res.body.access_token));
    expect(exchanged.exp).toBeLessThanOrEqual(subject.exp!);
    expect(res.body.expires_in).toBeLessThanOrEqual(60);

    // The resource revokes the token it got: that token ends, the user's grant (another client's) does not.
    expect((await post('/oauth/revoke', { token: String(res.body.access_token) }, rs.short)).status).toBe(200);
    expect(await introspect(rs.b, String(res.body.access_token))).toEqual({ active: false });
    expect((await introspect(rs.short, forShort.access_token)).active).toBe(true);

    // A private integration's own token (client_credentials, no user) for A, exchanged by the integration for B.
    const own = await post('/oauth/token', { grant_type: 'client_credentials', organization_id: String(world.org.organizationId), resource: A, scope: 'orders.read' }, integration);
    expect(own.status, JSON.stringify(own.body)).toBe(200);
    const fromApp = await exchange(integration, { subject_token: String(own.body.access_token), resource: B });
    expect(fromApp).toMatchObject({ status: 200, body: { scope: 'orders.read' } });
    expect(decodeJwt(String(fromApp.body.access_token)).sub).toBe(integration.client_id);
  });

  it('openid-client’s genericGrantRequest performs the exchange, with and without an actor', async () => {
    const user = await member();
    const forA = await tokensOf(agent, user, 'orders.read', A);
    const asA = await client.discovery(new URL(world.issuer), rs.a.client_id, rs.a.client_secret, undefined, { execute: [client.allowInsecureRequests] });
    const plain = await client.genericGrantRequest(asA, EXCHANGE, { subject_token: forA.access_token, subject_token_type: ACCESS_TOKEN, resource: B });
    expect(plain).toMatchObject({ issued_token_type: ACCESS_TOKEN, token_type: 'bearer', scope: 'orders.read' });
    expect(decodeJwt(plain.access_token).aud).toBe(B);
    const asAgent = await client.discovery(new URL(world.issuer), agent.client_id, agent.client_secret, undefined, { execute: [client.allowInsecureRequests] });
    const own = await tokensOf(agent, user, 'contacts.read');
    const acting = await client.genericGrantRequest(asAgent, EXCHANGE, { subject_token: forA.access_token, subject_token_type: ACCESS_TOKEN, resource: C, actor_token: own.access_token, actor_token_type: ACCESS_TOKEN });
    expect(decodeJwt(acting.access_token).act).toEqual({ sub: agent.client_id });
    const metadata = (await (await fetch(`${world.issuer}/.well-known/oauth-authorization-server`)).json()) as { grant_types_supported: string[] };
    expect(metadata.grant_types_supported).toContain(EXCHANGE);
  });

  it('DPoP-bound when the request carries a proof (openid-client’s DPoP handle): token_type DPoP, cnf.jkt the proof key’s, shown at introspection', async () => {
    const forA = await tokensOf(agent, await member(), 'orders.read', A);
    const asA = await client.discovery(new URL(world.issuer), rs.a.client_id, rs.a.client_secret, undefined, { execute: [client.allowInsecureRequests] });
    const keyPair = await client.randomDPoPKeyPair('ES256');
    const DPoP = client.getDPoPHandle(asA, keyPair);
    const bound = await client.genericGrantRequest(asA, EXCHANGE, { subject_token: forA.access_token, subject_token_type: ACCESS_TOKEN, resource: B }, { DPoP });
    expect(bound).toMatchObject({ issued_token_type: ACCESS_TOKEN, token_type: 'dpop', scope: 'orders.read' });
    const jkt = await calculateJwkThumbprint((await exportJWK(keyPair.publicKey)) as JWK);
    expect(decodeJwt(bound.access_token).cnf).toEqual({ jkt });
    expect(await introspect(rs.b, bound.access_token)).toMatchObject({ active: true, token_type: 'DPoP', cnf: { jkt }, aud: B });
    // Without a proof the same exchange is a bearer token, with no cnf.
    const plain = await exchange(rs.a, { subject_token: forA.access_token, resource: B });
    expect(plain).toMatchObject({ status: 200, body: { token_type: 'Bearer' } });
    expect(decodeJwt(String(plain.body.access_token)).cnf).toBeUndefined();
  });

  it('bad input answers RFC 8693’s and RFC 8707’s errors, never a 5xx', async () => {
    const user = await member();
    const forA = await tokensOf(agent, user, 'orders.read', A);
    const own = await tokensOf(agent, user, 'contacts.read');
    const cases: [Record<string, string | string[]>, number, string][] = [
      [{ subject_token: forA.access_token, subject_token_type: 'urn:ietf:params:oauth:token-type:refresh_token', resource: B }, 400, 'invalid_request'],
      [{ subject_token: forA.access_token, subject_token_type: 'urn:ietf:params:oauth:token-type:jwt', resource: B }, 400, 'invalid_request'],
      [{ subject_token: forA.refresh_token, resource: B }, 400, 'invalid_request'],
      [{ subject_token: 'not.a.token', resource: B }, 400, 'invalid_request'],
      [{ subject_token: randomBytes(9000).toString('base64url'), resource: B }, 400, 'invalid_request'],
      [{ resource: B }, 400, 'invalid_request'],
      [{ subject_token: forA.access_token }, 400, 'invalid_request'],
      [{ subject_token: forA.access_token, resource: 'https://unknown.example.com' }, 400, 'invalid_target'],
      [{ subject_token: forA.access_token, resource: 'not a uri' }, 400, 'invalid_target'],
      [{ subject_token: forA.access_token, resource: B, audience: C }, 400, 'invalid_target'],
      [{ subject_token: forA.access_token, audience: 'https://unknown.example.com' }, 400, 'invalid_target'],
      [{ subject_token: forA.access_token, resource: `${world.issuer}/api/v1` }, 400, 'invalid_target'],
      [{ subject_token: forA.access_token, resource: A }, 400, 'invalid_target'],
      [{ subject_token: forA.access_token, resource: B, scope: 'orders.write' }, 400, 'invalid_scope'],
      [{ subject_token: forA.access_token, resource: B, scope: 'contacts.read' }, 400, 'invalid_scope'],
      [{ subject_token: forA.access_token, resource: B, scope: 'members.write' }, 400, 'invalid_scope'],
      [{ subject_token: forA.access_token, resource: [B, B] }, 400, 'invalid_request'],
      [{ subject_token: [forA.access_token, forA.access_token], resource: B }, 400, 'invalid_request'],
      [{ subject_token: forA.access_token, resource: B, requested_token_type: 'urn:ietf:params:oauth:token-type:refresh_token' }, 400, 'invalid_request'],
      [{ subject_token: forA.access_token, resource: B, actor_token: own.access_token }, 400, 'invalid_request'],
      [{ subject_token: forA.access_token, resource: B, actor_token: 'garbage', actor_token_type: ACCESS_TOKEN }, 400, 'invalid_request'],
    ];
    for (const [fields, status, error] of cases) {
      const res = await post('/oauth/token', { grant_type: EXCHANGE, ...(fields.subject_token_type ? {} : { subject_token_type: ACCESS_TOKEN }), ...fields }, rs.a);
      expect({ fields: Object.keys(fields), status: res.status, error: res.body.error }).toEqual({ fields: Object.keys(fields), status, error });
    }
    // A wrong secret, and no authentication at all.
    expect(await exchange({ client_id: rs.a.client_id, client_secret: 'wrong' }, { subject_token: forA.access_token, resource: B })).toMatchObject({ status: 401, body: { error: 'invalid_client' } });
    // An expired subject token.
    const expired = await atTime(Date.now() + 3_700_000, () => exchange(rs.a, { subject_token: forA.access_token, resource: B }));
    expect(expired).toMatchObject({ status: 400, body: { error: 'invalid_request' } });
  });
});
