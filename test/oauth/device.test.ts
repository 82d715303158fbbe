/**
 * The device authorization grant (RFC 8628), end to end: oauth4webapi plays the device (device
 * authorization request, polling the token endpoint) over real HTTP against the app listening on
 * a loopback port, and a signed-in person enters the code on /device, chooses the organization
 * and decides. On both databases (TEST_DATABASE_URL or PGlite).
 */
import { randomBytes } from 'node:crypto';
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { decodeJwt } from 'jose';
import { sql } from 'kysely';
import * as oauth from 'oauth4webapi';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember, changeMemberRole, createOrganization, removeMember } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { buildApp } from '../../src/app.js';
import { type Config, parseConfig } from '../../src/config.js';
import { DEVICE_CODE_GRANT } from '../../src/db/schema.js';
import { sha256Hex } from '../../src/lib/crypto.js';
import { createLogger } from '../../src/logger.js';
import { createApplication, type ApplicationWithSecret } from '../../src/oauth/models/applications.js';
import { MAX_PENDING_PER_CLIENT } from '../../src/oauth/models/device-authorizations.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { deleteExpired } from '../../src/retention.js';
import { Browser, csrfTokenIn, expectPageSecurityHeaders } from '../accounts/browser.js';
import { buildTestApp, logCapture, TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { basic, form, SAFE_DESCRIPTION } from '../helpers/oauth.js';
import { freePort } from '../helpers/process.js';

const PASSWORD = 'device-password-1';
const USER_CODE = /^[BCDFGHJKLMNPQRSTVWXZ]{4}-[BCDFGHJKLMNPQRSTVWXZ]{4}$/;
const MCP_URI = 'https://mcp.example.com/mcp';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
let config: Config;
let issuer: string;
let as: oauth.AuthorizationServer;
/** A client that registered itself (no developer vouches for it): public, no secret, the device grant. */
let agent: oauth.Client;
/** A developer's public client without a secret, registered for the device grant. */
let teamCli: oauth.Client;
/** A developer's public client for the authorization code grant only. */
let webApp: ApplicationWithSecret;
let privateApp: ApplicationWithSecret;
let alpha: number;
let beta: number;
let gamma: number;
let alice: { id: number; email: string };
let victor: { id: number; email: string };
let resourceId: number;

const http = { [oauth.allowInsecureRequests]: true } as const;
const db = () => t.handle.db;

async function publicClientWithoutSecret(organizationId: number, name: string): Promise<string> {
  const created = await createApplication(db(), { organizationId, type: 'public', name, redirectUris: ['https://cli.example.com/cb'] });
  await db()
    .updateTable('applications')
    .set({ token_endpoint_auth_method: 'none', client_secret_hash: null, grant_types: ['authorization_code', 'refresh_token', DEVICE_CODE_GRANT] })
    .where('client_id', '=', created.client_id)
    .execute();
  return created.client_id;
}

beforeAll(async () => {
  t = await createTestDatabase();
  const port = await freePort();
  issuer = `http://127.0.0.1:${port}`;
  config = parseConfig({ SECRET_KEY: TEST_SECRET_KEY, LOG_LEVEL: 'silent', PORT: String(port), ISSUER: issuer, DATA_DIR: '/nonexistent-orgauth-test' });
  await ensureSigningKey(db(), { alg: config.signingAlg, secretKey: config.secretKey });
  app = await buildApp(config, { db: db(), logger: createLogger(config), listen: t.handle.listen });
  await app.listen({ host: '127.0.0.1', port });

  const a = await createUser(db(), { email: 'alice@example.com', password: PASSWORD, name: 'Alice' });
  alice = { id: a.id, email: a.email };
  const other = await createUser(db(), { email: 'owner@example.com', password: PASSWORD });
  alpha = (await createOrganization(db(), { name: 'Alpha', ownerUserId: a.id })).id;
  beta = (await createOrganization(db(), { name: 'Beta', ownerUserId: other.id })).id;
  await addMember(db(), { organizationId: beta, userId: a.id, role: 'member' });
  // An organization that requires two-step sign-in, of which Alice is a member.
  gamma = (await createOrganization(db(), { name: 'Gamma', ownerUserId: other.id })).id;
  await addMember(db(), { organizationId: gamma, userId: a.id, role: 'member' });
  await db().updateTable('organizations').set({ require_mfa: true }).where('id', '=', gamma).execute();
  const v = await createUser(db(), { email: 'victor@example.com', password: PASSWORD, name: 'Victor' });
  victor = { id: v.id, email: v.email };
  await addMember(db(), { organizationId: alpha, userId: v.id, role: 'viewer' });
  await addMember(db(), { organizationId: beta, userId: v.id, role: 'member' });

  const agentId = randomBytes(16).toString('hex');
  await db()
    .insertInto('applications')
    .values({
      organization_id: null,
      client_id: agentId,
      client_secret_hash: null,
      type: 'public',
      name: 'Agent CLI',
      redirect_uris: [],
      scopes: ['contacts.read', 'contacts.write', 'tasks.read', 'tasks.write'],
      require_pkce: true,
      registration: 'dynamic',
      token_endpoint_auth_method: 'none',
      grant_types: [DEVICE_CODE_GRANT, 'refresh_token'],
    })
    .execute();
  agent = { client_id: agentId };
  teamCli = { client_id: await publicClientWithoutSecret(alpha, 'Team CLI') };
  webApp = await createApplication(db(), { organizationId: alpha, type: 'public', name: 'Web app', redirectUris: ['https://web.example.com/cb'] });
  privateApp = await createApplication(db(), { organizationId: alpha, type: 'private', name: 'Integration' });
  resourceId = (
    await db()
      .insertInto('resources')
      .values({ uri: MCP_URI, name: 'Example MCP', scopes: ['contacts.read', 'tools.call'], access_token_ttl: 900 })
      .returning('id')
      .executeTakeFirstOrThrow()
  ).id;

  // The device knows only the issuer: everything else comes from the metadata document.
  as = await oauth.processDiscoveryResponse(new URL(issuer), await oauth.discoveryRequest(new URL(issuer), { algorithm: 'oauth2', ...http }));
}, 60_000);

afterAll(async () => {
  await app?.close();
  await t?.close();
});

let ip = 0;
async function signedIn(email = alice.email): Promise<Browser> {
  const b = new Browser(app, `10.26.0.${++ip}`);
  expect((await b.login(email, PASSWORD)).statusCode).toBe(303);
  return b;
}

/** The device's first step: the device authorization request, as oauth4webapi sends and checks it. */
async function startDevice(client: oauth.Client = agent, parameters: Record<string, string> = { scope: 'contacts.read tasks.read' }) {
  const res = await oauth.deviceAuthorizationRequest(as, client, oauth.None(), parameters, http);
  return oauth.processDeviceAuthorizationResponse(as, client, res);
}

/** One poll of the token endpoint: the token response, or the error code the device gets. */
async function poll(deviceCode: string, client: oauth.Client = agent): Promise<oauth.TokenEndpointResponse | string> {
  const res = await oauth.deviceCodeGrantRequest(as, client, oauth.None(), deviceCode, http);
  try {
    return await oauth.processDeviceCodeResponse(as, client, res);
  } catch (err) {
    if (err instanceof oauth.ResponseBodyError) {
      expect(err.status).toBe(400);
      expect(err.error_description).toMatch(SAFE_DESCRIPTION);
      return err.error;
    }
    throw err;
  }
}

function tokens(result: oauth.TokenEndpointResponse | string): oauth.TokenEndpointResponse {
  if (typeof result === 'string') throw new Error(`expected tokens, got ${result}`);
  return result;
}

const row = (deviceCode: string) => db().selectFrom('device_authorizations').selectAll().where('device_code_hash', '=', sha256Hex(deviceCode)).executeTakeFirstOrThrow();

/** Lets the next poll come at the interval, as a patient device's would. */
const waitedInterval = (deviceCode: string) =>
  db().updateTable('device_authorizations').set({ last_polled_at: sql<Date>`now() - make_interval(secs => interval_s + 1)` }).where('device_code_hash', '=', sha256Hex(deviceCode)).execute();

/** Enters `typed` on /device, arriving from the page itself; returns the answer to the form. */
async function enterCode(b: Browser, typed: string): Promise<LightMyRequestResponse> {
  const csrf_token = await b.csrf('/device');
  return b.post('/device', { csrf_token, user_code: typed });
}

interface Choice {
  id: number;
  disabled: boolean;
}
/** The organization radio inputs of a consent page. */
function organizationChoices(html: string): Choice[] {
  return [...html.matchAll(/<input type="radio" name="organization_id" value="([0-9]+)" required( disabled)?/g)].map((m) => ({ id: Number(m[1]), disabled: m[2] !== undefined }));
}

async function decide(b: Browser, userCode: string, decision: 'approve' | 'deny', organizationId?: number): Promise<LightMyRequestResponse> {
  const consent = await enterCode(b, userCode);
  expect(consent.statusCode, consent.body).toBe(200);
  return b.post('/device', {
    csrf_token: csrfTokenIn(consent.body),
    user_code: userCode,
    decision,
    ...(organizationId === undefined ? {} : { organization_id: String(organizationId) }),
  });
}

const auditEvents = (organizationId: number, action: string) =>
  db().selectFrom('audit_events').select(['actor_user_id', 'actor_client_id', 'details']).where('organization_id', '=', organizationId).where('action', '=', action).orderBy('id').execute();

describe(`the device authorization grant end to end on ${BACKEND}`, () => {
  it('is advertised in the metadata', () => {
    expect(as.device_authorization_endpoint).toBe(`${issuer}/oauth/device_authorization`);
    expect(as.grant_types_supported).toContain(DEVICE_CODE_GRANT);
  });

  it('answers the device authorization request: a device code, a short unambiguous user code, where to enter it (RFC 8628 §3.2)', async () => {
    const raw = await fetch(`${issuer}/oauth/device_authorization`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: form({ client_id: agent.client_id, scope: 'contacts.read' }),
    });
    expect(raw.status).toBe(200);
    expect(raw.headers.get('cache-control')).toBe('no-store');
    const body = await raw.json();
    expect(body).toEqual({
      device_code: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/),
      user_code: expect.stringMatching(USER_CODE),
      verification_uri: `${issuer}/device`,
      verification_uri_complete: `${issuer}/device?user_code=${body.user_code}`,
      expires_in: 600,
      interval: 5,
    });
    // CD-4: only the device code's digest is kept; the user code without its dash.
    const stored = await row(body.device_code);
    expect(stored).toMatchObject({ user_code: body.user_code.replace('-', ''), status: 'pending', scopes: ['contacts.read'], resource_id: null, interval_s: 5 });
    expect(JSON.stringify(stored)).not.toContain(body.device_code);
  });

  it('issues tokens for the organization the user chose on /device, once, after authorization_pending and slow_down', async () => {
    const device = await startDevice(agent, { scope: 'openid contacts.read tasks.read' });
    expect(device.user_code).toMatch(USER_CODE);
    // RFC 8628 §3.5: nobody has decided yet; and polling faster than the interval slows the device down.
    expect(await poll(device.device_code)).toBe('authorization_pending');
    expect(await poll(device.device_code)).toBe('slow_down');
    expect((await row(device.device_code)).interval_s).toBe(10);

    // The person opens verification_uri_complete: sent to sign in first, and back with the code.
    const b = new Browser(app, '10.26.1.1');
    const complete = new URL(device.verification_uri_complete!);
    const first = await b.get(`${complete.pathname}${complete.search}`);
    expect(first.statusCode).toBe(303);
    const login = new URL(String(first.headers.location), issuer);
    expect(login.pathname).toBe('/login');
    expect(login.searchParams.get('return_to')).toBe(`/device?user_code=${device.user_code}`);
    expect((await b.login(alice.email, PASSWORD, login.searchParams.get('return_to')!)).headers.location).toBe(`/device?user_code=${device.user_code}`);
    const form = await b.get(`/device?user_code=${device.user_code}`);
    expect(form.statusCode).toBe(200);
    expectPageSecurityHeaders(form);
    expect(form.body).toContain(`name="user_code" value="${device.user_code}"`);

    // Typed in lower case, with spaces and without the dash: the same code.
    const typed = device.user_code.toLowerCase().replace('-', ' ');
    const consent = await b.post('/device', { csrf_token: csrfTokenIn(form.body), user_code: ` ${typed} ` });
    expect(consent.statusCode, consent.body).toBe(200);
    expectPageSecurityHeaders(consent);
    expect(consent.body).toContain('Agent CLI');
    expect(consent.body).toContain('Nobody has verified this application');
    expect(consent.body).toContain(device.user_code);
    expect(consent.body).toContain('<code>contacts.read</code>');
    // Alpha and Beta can be chosen; Gamma requires two-step sign-in, which this session lacks.
    expect(organizationChoices(consent.body)).toEqual(
      expect.arrayContaining([
        { id: alpha, disabled: false },
        { id: beta, disabled: false },
        { id: gamma, disabled: true },
      ]),
    );
    expect(consent.body).toContain('name="decision" value="approve"');
    expect(consent.body).toContain('name="decision" value="deny"');

    const approved = await b.post('/device', { csrf_token: csrfTokenIn(consent.body), user_code: device.user_code, organization_id: String(beta), decision: 'approve' });
    expect(approved.statusCode, approved.body).toBe(200);
    expect(approved.body).toContain('You can return to your device');
    expect(await row(device.device_code)).toMatchObject({ status: 'approved', user_id: alice.id, organization_id: beta, granted_scopes: ['contacts.read', 'tasks.read'], amr: ['pwd'] });
    expect((await row(device.device_code)).auth_time).toBeInstanceOf(Date);
    const audit = await auditEvents(beta, 'authorization.approved');
    expect(audit.at(-1)).toEqual({
      actor_user_id: alice.id,
      actor_client_id: agent.client_id,
      details: { client_id: agent.client_id, application_id: expect.any(Number), device: true, scopes: 'contacts.read tasks.read', identity_scopes: 'openid' },
    });

    // The device's next poll gets the tokens, for Beta, the organization chosen.
    const issued = tokens(await poll(device.device_code));
    expect(issued).toMatchObject({ token_type: 'bearer', scope: 'openid contacts.read tasks.read', organization_id: beta, organization_name: 'Beta' });
    expect(issued.refresh_token).toEqual(expect.any(String));
    const claims = decodeJwt(issued.access_token);
    expect(claims).toMatchObject({ sub: String(alice.id), client_id: agent.client_id, organization_id: beta, aud: `${issuer}/api/v1` });
    // oauth4webapi checked the ID token (iss, aud, exp, iat); it says who and how they signed in.
    expect(decodeJwt(issued.id_token!)).toMatchObject({ sub: String(alice.id), aud: agent.client_id, amr: ['pwd'], auth_time: expect.any(Number) });
    const contacts = await fetch(`${issuer}/api/v1/${beta}/contacts`, { headers: { authorization: `Bearer ${issued.access_token}`, accept: 'application/json' } });
    expect(contacts.status).toBe(200);
    const grant = await db().selectFrom('grants').selectAll().where('id', '=', (await row(device.device_code)).grant_id!).executeTakeFirstOrThrow();
    expect(grant).toMatchObject({ organization_id: beta, user_id: alice.id, scopes: ['contacts.read', 'tasks.read'], identity_scopes: ['openid'], amr: ['pwd'], resource_id: null, revoked_at: null });
    expect((await row(device.device_code)).status).toBe('consumed');

    // Once only: the code is used.
    expect(await poll(device.device_code)).toBe('invalid_grant');
    // The refresh token works as any other, for the same organization.
    const refreshed = await oauth.processRefreshTokenResponse(as, agent, await oauth.refreshTokenGrantRequest(as, agent, oauth.None(), issued.refresh_token!, http));
    expect(refreshed).toMatchObject({ organization_id: beta });
    expect(decodeJwt(refreshed.access_token)).toMatchObject({ organization_id: beta, aud: `${issuer}/api/v1` });
  });

  it('answers access_denied once the user denied, and audits the refusal', async () => {
    const device = await startDevice(teamCli);
    const b = await signedIn();
    const consent = await enterCode(b, device.user_code);
    // A developer's application: no warning that nobody verified it.
    expect(consent.body).toContain('Team CLI');
    expect(consent.body).not.toContain('Nobody has verified');
    const denied = await decide(b, device.user_code, 'deny', alpha);
    expect(denied.statusCode).toBe(200);
    expect(denied.body).toContain('You can return to your device');
    expect(await row(device.device_code)).toMatchObject({ status: 'denied', user_id: alice.id, grant_id: null });
    expect(await poll(device.device_code, teamCli)).toBe('access_denied');
    expect((await auditEvents(alpha, 'authorization.denied')).at(-1)).toMatchObject({ actor_user_id: alice.id, details: { client_id: teamCli.client_id, device: true } });
    // A decided code is no longer one to enter.
    expect((await enterCode(b, device.user_code)).statusCode).toBe(400);
  });

  it('answers expired_token once the device code expired, and the page no longer takes its user code', async () => {
    const device = await startDevice();
    await db().updateTable('device_authorizations').set({ expires_at: sql<Date>`now() - interval '1 second'` }).where('device_code_hash', '=', sha256Hex(device.device_code)).execute();
    expect(await poll(device.device_code)).toBe('expired_token');
    const b = await signedIn();
    const res = await enterCode(b, device.user_code);
    expect(res.statusCode).toBe(400);
    expect(res.body).toContain('not valid');

    // Approved, then expired before the device came back: no tokens either.
    const late = await startDevice();
    expect((await decide(b, late.user_code, 'approve', alpha)).statusCode).toBe(200);
    await db().updateTable('device_authorizations').set({ expires_at: sql<Date>`now() - interval '1 second'` }).where('device_code_hash', '=', sha256Hex(late.device_code)).execute();
    expect(await poll(late.device_code)).toBe('expired_token');
  });

  it('redeems an approved code exactly once under 20 parallel polls', async () => {
    const device = await startDevice();
    expect((await decide(await signedIn(), device.user_code, 'approve', alpha)).statusCode).toBe(200);
    const grantsOf = async () => (await db().selectFrom('grants').select('id').where('application_id', '=', (await row(device.device_code)).application_id).execute()).length;
    const before = await grantsOf();
    const results = await Promise.all(Array.from({ length: 20 }, () => poll(device.device_code)));
    expect(results.filter((r) => typeof r !== 'string')).toHaveLength(1);
    expect(results.filter((r) => r === 'invalid_grant')).toHaveLength(19);
    expect(await grantsOf()).toBe(before + 1);
    expect(await db().selectFrom('refresh_tokens').select('id').where('grant_id', '=', (await row(device.device_code)).grant_id!).execute()).toHaveLength(1);
  });

  it('binds the tokens of a device that sends a DPoP proof to its key (RFC 9449): refresh with the key only', async () => {
    const device = await startDevice();
    expect((await decide(await signedIn(), device.user_code, 'approve', alpha)).statusCode).toBe(200);
    const DPoP = oauth.DPoP(agent, await oauth.generateKeyPair('ES256'));
    const res = await oauth.deviceCodeGrantRequest(as, agent, oauth.None(), device.device_code, { DPoP, ...http });
    const issued = await oauth.processDeviceCodeResponse(as, agent, res);
    expect(issued.token_type).toBe('dpop');
    expect(JSON.parse(Buffer.from(issued.access_token.split('.')[1]!, 'base64url').toString())).toHaveProperty('cnf.jkt');
    // A public client's refresh token is bound to the key: none, or another, is invalid_grant.
    const unproved = await oauth.refreshTokenGrantRequest(as, agent, oauth.None(), issued.refresh_token!, http);
    expect(unproved.status).toBe(400);
    const other = await oauth.refreshTokenGrantRequest(as, agent, oauth.None(), issued.refresh_token!, { DPoP: oauth.DPoP(agent, await oauth.generateKeyPair('ES256')), ...http });
    expect(other.status).toBe(400);
    const refreshed = await oauth.processRefreshTokenResponse(as, agent, await oauth.refreshTokenGrantRequest(as, agent, oauth.None(), issued.refresh_token!, { DPoP, ...http }));
    expect(refreshed.token_type).toBe('dpop');
  });

  it('gives a token for a registered resource, whose aud is the resource URI (RFC 8707)', async () => {
    // Named in another spelling of the same URI.
    const device = await startDevice(agent, { scope: 'contacts.read tools.call', resource: 'https://MCP.example.com:443/mcp/' });
    expect(await row(device.device_code)).toMatchObject({ resource_id: resourceId, scopes: ['contacts.read', 'tools.call'] });
    const b = await signedIn();
    const consent = await enterCode(b, device.user_code);
    expect(consent.body).toContain('Example MCP');
    expect(consent.body).toContain(`<code>${MCP_URI}</code>`);
    expect(consent.body).toContain('<code>tools.call</code>');
    expect((await decide(b, device.user_code, 'approve', alpha)).statusCode).toBe(200);
    // A token request naming another resource than the device asked for: invalid_target.
    const other = await fetch(`${issuer}/oauth/token`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: form({ grant_type: DEVICE_CODE_GRANT, client_id: agent.client_id, device_code: device.device_code, resource: `${issuer}/api/v1` }),
    });
    expect(other.status).toBe(400);
    expect(await other.json()).toEqual({ error: 'invalid_target', error_description: expect.stringMatching(SAFE_DESCRIPTION) });
    await waitedInterval(device.device_code);
    const issued = tokens(await poll(device.device_code));
    expect(issued).toMatchObject({ scope: 'contacts.read tools.call', organization_id: alpha, expires_in: 900 });
    expect(decodeJwt(issued.access_token)).toMatchObject({ aud: MCP_URI, organization_id: alpha });
    const grant = await db().selectFrom('grants').select('resource_id').where('id', '=', (await row(device.device_code)).grant_id!).executeTakeFirstOrThrow();
    expect(grant.resource_id).toBe(resourceId);
    // Refresh keeps the audience.
    const refreshed = await oauth.processRefreshTokenResponse(as, agent, await oauth.refreshTokenGrantRequest(as, agent, oauth.None(), issued.refresh_token!, http));
    expect(decodeJwt(refreshed.access_token)).toMatchObject({ aud: MCP_URI });
  });
});

describe(`the organization choice on /device on ${BACKEND}`, () => {
  it('does not let a viewer choose an organization where their role allows none of the scopes (RO-1)', async () => {
    const device = await startDevice(agent, { scope: 'contacts.write' });
    const b = await signedIn(victor.email);
    const consent = await enterCode(b, device.user_code);
    expect(consent.statusCode).toBe(200);
    expect(organizationChoices(consent.body)).toEqual(
      expect.arrayContaining([
        { id: alpha, disabled: true },
        { id: beta, disabled: false },
      ]),
    );
    expect(consent.body).toContain('Your role here (viewer) allows none of this');
    // Posted anyway: refused on the server, and nothing recorded.
    const forced = await b.post('/device', { csrf_token: csrfTokenIn(consent.body), user_code: device.user_code, organization_id: String(alpha), decision: 'approve' });
    expect(forced.statusCode).toBe(403);
    expect(forced.body).toContain('viewer');
    expect((await row(device.device_code)).status).toBe('pending');
    expect(await poll(device.device_code)).toBe('authorization_pending');
  });

  it('narrows what a member grants to their role, and refuses an organization needing two-step sign-in without it', async () => {
    const device = await startDevice(agent, { scope: 'contacts.read contacts.write' });
    const b = await signedIn(victor.email);
    // Beta, where Victor is a member: both scopes. Alpha (viewer): contacts.read only.
    expect((await decide(b, device.user_code, 'approve', alpha)).statusCode).toBe(200);
    expect(await row(device.device_code)).toMatchObject({ status: 'approved', organization_id: alpha, granted_scopes: ['contacts.read'] });
    expect((await auditEvents(alpha, 'authorization.approved')).at(-1)?.details).toMatchObject({ scopes: 'contacts.read', requested_scopes: 'contacts.read contacts.write', device: true });

    const mfa = await startDevice();
    const res = await decide(await signedIn(), mfa.user_code, 'approve', gamma);
    expect(res.statusCode).toBe(403);
    expect(res.body).toContain('two-step');
    expect((await row(mfa.device_code)).status).toBe('pending');
  });

  it("refuses an organization the user does not belong to, and a form without the session's CSRF token", async () => {
    const device = await startDevice();
    const b = await signedIn(victor.email);
    const consent = await enterCode(b, device.user_code);
    const csrf_token = csrfTokenIn(consent.body);
    expect((await b.post('/device', { csrf_token, user_code: device.user_code, organization_id: String(gamma), decision: 'approve' })).statusCode).toBe(403);
    expect((await b.post('/device', { csrf_token, user_code: device.user_code, organization_id: '01', decision: 'approve' })).statusCode).toBe(400);
    expect((await b.post('/device', { csrf_token, user_code: device.user_code, decision: 'approve' })).statusCode).toBe(400);
    expect((await b.post('/device', { csrf_token, user_code: device.user_code, organization_id: String(beta), decision: 'maybe' })).statusCode).toBe(400);
    const noCsrf = await b.post('/device', { user_code: device.user_code, organization_id: String(beta), decision: 'approve' });
    expect(noCsrf.statusCode).toBe(403);
    expectPageSecurityHeaders(noCsrf);
    // Another session's token is no good either.
    const otherCsrf = await (await signedIn()).csrf('/device');
    expect((await b.post('/device', { csrf_token: otherCsrf, user_code: device.user_code, organization_id: String(beta), decision: 'approve' })).statusCode).toBe(403);
    expect((await row(device.device_code)).status).toBe('pending');
  });

  it('answers odd forms and queries with a page, never a 5xx (R-7)', async () => {
    const b = await signedIn(victor.email);
    const csrf_token = await b.csrf('/device');
    const odd: [string, Record<string, string | string[]>][] = [
      ['user_code twice', { csrf_token, user_code: ['BCDF-GHJK', 'BCDF-GHJK'] }],
      ['a huge user_code', { csrf_token, user_code: 'B'.repeat(50_000) }],
      ['a NUL in user_code', { csrf_token, user_code: 'BCDF\u0000GHJK' }],
      ['no user_code', { csrf_token }],
      ['decision twice', { csrf_token, user_code: 'BCDF-GHJK', decision: ['approve', 'deny'] }],
      ['csrf_token twice', { csrf_token: [csrf_token, csrf_token], user_code: 'BCDF-GHJK' }],
    ];
    for (const [what, fields] of odd) {
      const res = await b.post('/device', fields);
      expect(res.statusCode, what).toBeGreaterThanOrEqual(400);
      expect(res.statusCode, what).toBeLessThan(500);
      expect(res.headers['content-type'], what).toBe('text/html; charset=utf-8');
    }
    // Not a form at all.
    const cookie = [...b.cookies].map(([k, v]) => `${k}=${v}`).join('; ');
    const text = await app.inject({ method: 'POST', url: '/device', headers: { cookie, 'content-type': 'text/plain' }, payload: 'user_code=BCDF-GHJK' });
    expect(text.statusCode).toBeGreaterThanOrEqual(400);
    expect(text.statusCode).toBeLessThan(500);
    for (const query of ['user_code=%ZZ', 'user_code=a&user_code=b', `user_code=${'x'.repeat(5000)}`, 'user_code=%00', '__proto__=1']) {
      const res = await b.get(`/device?${query}`);
      expect(res.statusCode, query).toBeLessThan(500);
    }
  });

  it('asks to sign in first, and refuses a form posted without a session', async () => {
    const b = new Browser(app, '10.26.2.1');
    const res = await b.get('/device');
    expect(res.statusCode).toBe(303);
    expect(res.headers.location).toBe('/login?return_to=%2Fdevice');
    expectPageSecurityHeaders(res);
    expect((await b.post('/device', { user_code: 'BCDF-GHJK' })).statusCode).toBe(403);
  });
});

describe(`what changed between the approval and the poll, on ${BACKEND}`, () => {
  let delta: number;
  let wendy: { id: number; email: string };
  beforeAll(async () => {
    const w = await createUser(db(), { email: 'wendy@example.com', password: PASSWORD, name: 'Wendy' });
    wendy = { id: w.id, email: w.email };
    delta = (await createOrganization(db(), { name: 'Delta', ownerUserId: alice.id })).id;
    await addMember(db(), { organizationId: delta, userId: w.id, role: 'member' });
  });

  /** An authorization Wendy approved for Delta, not yet redeemed. */
  async function approvedByWendy(scope: string) {
    const device = await startDevice(agent, { scope });
    expect((await decide(await signedIn(wendy.email), device.user_code, 'approve', delta)).statusCode).toBe(200);
    return device;
  }
  const wendysGrants = async () => (await db().selectFrom('grants').select('id').where('user_id', '=', wendy.id).execute()).length;

  it('gives nothing when the role no longer allows what was approved (RO-1)', async () => {
    const device = await approvedByWendy('contacts.write');
    await changeMemberRole(db(), { organizationId: delta, userId: wendy.id, role: 'viewer' });
    expect(await poll(device.device_code)).toBe('invalid_grant');
    expect(await wendysGrants()).toBe(0);
    await changeMemberRole(db(), { organizationId: delta, userId: wendy.id, role: 'member' });
  });

  it('gives nothing when the organization came to require two-step sign-in', async () => {
    const device = await approvedByWendy('contacts.read');
    await db().updateTable('organizations').set({ require_mfa: true }).where('id', '=', delta).execute();
    try {
      expect(await poll(device.device_code)).toBe('invalid_grant');
    } finally {
      await db().updateTable('organizations').set({ require_mfa: false }).where('id', '=', delta).execute();
    }
    expect(await wendysGrants()).toBe(0);
  });

  it('gives nothing when the user left the organization', async () => {
    const device = await approvedByWendy('contacts.read');
    await removeMember(db(), { organizationId: delta, userId: wendy.id });
    expect(await poll(device.device_code)).toBe('invalid_grant');
    expect(await wendysGrants()).toBe(0);
    expect((await row(device.device_code)).status).toBe('approved');
  });
});

describe(`guessing user codes on ${BACKEND}`, () => {
  /** A member of Alpha who has entered no code yet: the other tests' wrong codes count for Alice and Victor. */
  let guessers = 0;
  const newGuesser = async () => {
    const created = await createUser(db(), { email: `guesser-${++guessers}@example.com`, password: PASSWORD });
    await addMember(db(), { organizationId: alpha, userId: created.id, role: 'member' });
    return created.email;
  };

  it('answers a wrong code with an error, and the 6th wrong code in a minute with 429 (RFC 8628 §5.1)', async () => {
    const device = await startDevice();
    const b = await signedIn(await newGuesser());
    const wrong = ['BCDF-GHJK', 'ZZZZ-ZZZZ', 'AAAA-AAAA', '1234-5678', 'not a code at all'];
    for (const code of wrong) {
      const res = await enterCode(b, code);
      expect(res.statusCode).toBe(400);
      expect(res.body).toContain('not valid');
      expect(res.body).toContain('name="user_code"');
      expectPageSecurityHeaders(res);
    }
    const sixth = await enterCode(b, 'QQQQ-QQQQ');
    expect(sixth.statusCode).toBe(429);
    expect(Number(sixth.headers['retry-after'])).toBeGreaterThan(0);
    expect(sixth.headers['content-type']).toBe('text/html; charset=utf-8');
    // Throttled, not merely wrong: even the right code waits.
    expect((await enterCode(b, device.user_code)).statusCode).toBe(429);
    // Another person's session, from elsewhere, is not held up.
    expect((await enterCode(await signedIn(await newGuesser()), device.user_code)).statusCode).toBe(200);
  });

  it('counts wrong codes per user across all their sessions, and per address with an IPv6 address’s /64', async () => {
    const browserAt = async (address: string, email: string) => {
      const b = new Browser(app, address);
      expect((await b.login(email, PASSWORD)).statusCode).toBe(303);
      return b;
    };
    const wrong = (b: Browser) => enterCode(b, 'ZZZZ-ZZZZ');

    // One account signed in again, from another address, after five wrong codes: still the account's limit.
    const guesser = await newGuesser();
    const first = await browserAt('10.27.0.1', guesser);
    for (let i = 0; i < 5; i++) expect((await wrong(first)).statusCode).toBe(400);
    const second = await browserAt('10.27.0.2', guesser);
    expect((await wrong(second)).statusCode).toBe(429);
    // Someone else at that address is not held up by it.
    expect((await wrong(await browserAt('10.27.0.2', await newGuesser()))).statusCode).toBe(400);

    // Twenty wrong codes from four addresses of one /64 (four users, each within their own limit): the /64 is done.
    for (let host = 1; host <= 4; host++) {
      const b = await browserAt(`2001:db8:27:1::${host}`, await newGuesser());
      for (let i = 0; i < 5; i++) expect((await wrong(b)).statusCode).toBe(400);
    }
    expect((await wrong(await browserAt('2001:db8:27:1:ffff::5', await newGuesser()))).statusCode).toBe(429);
    expect((await wrong(await browserAt('2001:db8:27:2::1', await newGuesser()))).statusCode).toBe(400);
  });
});

type BadInput = [string, () => Promise<LightMyRequestResponse>, number, string];

/** TK-2, TK-3: the status, an error body with a registered code and a safe description, never cached. */
async function refuses(_what: string, send: BadInput[1], status: number, error: string): Promise<void> {
  const res = await send();
  expect(res.statusCode, res.body).toBe(status);
  expect(res.json()).toEqual({ error, error_description: expect.stringMatching(SAFE_DESCRIPTION) });
  expect(res.headers['cache-control']).toBe('no-store');
}

describe(`bad input to /oauth/device_authorization on ${BACKEND} (R-7)`, () => {
  const post = (body: string, headers: Record<string, string> = {}, query = '') =>
    app.inject({ method: 'POST', url: `/oauth/device_authorization${query}`, headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers }, payload: body });

  const cases: BadInput[] = [
    ['no client_id', () => post(form({ scope: 'contacts.read' })), 401, 'invalid_client'],
    ['an unknown client_id', () => post(form({ client_id: 'f'.repeat(32) })), 401, 'invalid_client'],
    ['a client_id that is no client id', () => post(form({ client_id: '../../etc/passwd' })), 401, 'invalid_client'],
    ['client_id in the query', () => post(form({ scope: 'contacts.read' }), {}, `?client_id=${agent.client_id}`), 400, 'invalid_request'],
    ['a client registered without the device grant', () => post(form({ client_id: webApp.client_id, client_secret: webApp.client_secret })), 400, 'unauthorized_client'],
    ['a private application', () => post(form({ scope: 'contacts.read' }), { authorization: basic(privateApp.client_id, privateApp.client_secret) }), 400, 'unauthorized_client'],
    ['a wrong secret', () => post(form({ client_id: webApp.client_id, client_secret: 'nope' })), 401, 'invalid_client'],
    ['scope twice', () => post(form({ client_id: agent.client_id, scope: ['contacts.read', 'tasks.read'] })), 400, 'invalid_request'],
    ['an unknown scope', () => post(form({ client_id: agent.client_id, scope: 'contacts.read everything' })), 400, 'invalid_scope'],
    ['a management scope', () => post(form({ client_id: agent.client_id, scope: 'members.write' })), 400, 'invalid_scope'],
    ['profile without openid', () => post(form({ client_id: agent.client_id, scope: 'profile' })), 400, 'invalid_scope'],
    ['an unknown resource', () => post(form({ client_id: agent.client_id, resource: 'https://unknown.example.com/mcp' })), 400, 'invalid_target'],
    ['a resource with a fragment', () => post(form({ client_id: agent.client_id, resource: `${MCP_URI}#x` })), 400, 'invalid_target'],
    ['a relative resource', () => post(form({ client_id: agent.client_id, resource: '/mcp' })), 400, 'invalid_target'],
    ['a scope the resource does not list', () => post(form({ client_id: agent.client_id, resource: MCP_URI, scope: 'tasks.read' })), 400, 'invalid_scope'],
    ['a NUL in a parameter', () => post(`client_id=${agent.client_id}&scope=contacts.read%00`), 400, 'invalid_request'],
    ['a JSON body', () => post(JSON.stringify({ client_id: agent.client_id }), { 'content-type': 'application/json' }), 400, 'invalid_request'],
    ['no body', () => app.inject({ method: 'POST', url: '/oauth/device_authorization' }), 400, 'invalid_request'],
    ['an oversized scope', () => post(form({ client_id: agent.client_id, scope: 'nope '.repeat(10_000) })), 400, 'invalid_scope'],
    ['a GET', () => app.inject({ method: 'GET', url: '/oauth/device_authorization' }), 405, 'invalid_request'],
  ];
  it.each(cases)('refuses %s', refuses);

  it('ignores unknown and prototype-named parameters', async () => {
    const res = await post(`client_id=${agent.client_id}&__proto__=x&constructor=y&extra=1`);
    expect(res.statusCode).toBe(200);
    // Without scope: everything the client may have of orgauth's API.
    expect(await row(res.json().device_code)).toMatchObject({ scopes: ['contacts.read', 'contacts.write', 'tasks.read', 'tasks.write'] });
  });
});

describe(`bad input to the device_code grant on ${BACKEND} (R-7)`, () => {
  let device: Awaited<ReturnType<typeof startDevice>>;
  beforeAll(async () => {
    device = await startDevice();
  });
  const token = (fields: Record<string, string | string[]>, headers: Record<string, string> = {}) =>
    app.inject({ method: 'POST', url: '/oauth/token', headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers }, payload: form({ grant_type: DEVICE_CODE_GRANT, ...fields }) });

  const cases: BadInput[] = [
    ['no device_code', () => token({ client_id: agent.client_id }), 400, 'invalid_request'],
    ['an unknown device_code', () => token({ client_id: agent.client_id, device_code: 'x'.repeat(43) }), 400, 'invalid_grant'],
    ['a very long device_code', () => token({ client_id: agent.client_id, device_code: 'x'.repeat(5000) }), 400, 'invalid_grant'],
    ['another client’s device_code', () => token({ client_id: teamCli.client_id, device_code: device.device_code }), 400, 'invalid_grant'],
    ['device_code twice', () => token({ client_id: agent.client_id, device_code: [device.device_code, device.device_code] }), 400, 'invalid_request'],
    ['a NUL in the device_code', () => token({ client_id: agent.client_id, device_code: `${device.device_code}\u0000` }), 400, 'invalid_request'],
    ['a client registered without the device grant', () => token({ client_id: webApp.client_id, client_secret: webApp.client_secret, device_code: device.device_code }), 400, 'unauthorized_client'],
    ['a private application', () => token({ device_code: device.device_code }, { authorization: basic(privateApp.client_id, privateApp.client_secret) }), 400, 'unauthorized_client'],
    ['an unknown resource', () => token({ client_id: agent.client_id, device_code: device.device_code, resource: 'https://unknown.example.com/' }), 400, 'invalid_target'],
  ];
  it.each(cases)('refuses %s', refuses);

  it('leaves the code alone for its own client after all that', async () => {
    await waitedInterval(device.device_code);
    expect(await poll(device.device_code)).toBe('authorization_pending');
    expect(await row(device.device_code)).toMatchObject({ status: 'pending', interval_s: 5 });
  });
});

describe(`limits and logs on ${BACKEND}`, () => {
  it('refuses a client more pending device authorizations than MAX_PENDING_PER_CLIENT (429)', async () => {
    const { id } = await db().selectFrom('applications').select('id').where('client_id', '=', teamCli.client_id).executeTakeFirstOrThrow();
    // User codes starting AAAA: no vowel is ever drawn, so none can collide with a real one.
    await sql`
      insert into device_authorizations (device_code_hash, user_code, application_id, scopes, expires_at)
      select md5(i::text) || md5('x' || i::text), 'AAAA' || chr(65 + (i / 17576) % 26) || chr(65 + (i / 676) % 26) || chr(65 + (i / 26) % 26) || chr(65 + i % 26),
        ${id}, '{contacts.read}', now() + interval '10 minutes'
      from generate_series(1, ${MAX_PENDING_PER_CLIENT}) i`.execute(db());
    try {
      const res = await app.inject({
        method: 'POST',
        url: '/oauth/device_authorization',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        payload: form({ client_id: teamCli.client_id }),
      });
      expect(res.statusCode).toBe(429);
      expect(res.json()).toEqual({ error: 'too_many_requests', error_description: expect.stringMatching(SAFE_DESCRIPTION) });
      expect(Number(res.headers['retry-after'])).toBeGreaterThan(0);
      // Other clients are not held up.
      expect((await startDevice()).user_code).toMatch(USER_CODE);
    } finally {
      await db().deleteFrom('device_authorizations').where('user_code', 'like', 'AAAA%').execute();
    }
    expect((await startDevice(teamCli)).user_code).toMatch(USER_CODE);
  });

  it('never writes a device code or a user code to the log (R-8)', async () => {
    const capture = logCapture();
    const logged = await buildTestApp(db(), { logStream: capture.stream });
    try {
      const started = await logged.inject({
        method: 'POST',
        url: '/oauth/device_authorization',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        payload: form({ client_id: agent.client_id, scope: 'contacts.read' }),
      });
      const { device_code, user_code } = started.json();
      const b = new Browser(logged, '10.26.3.1');
      expect((await b.login(alice.email, PASSWORD)).statusCode).toBe(303);
      expect((await b.get(`/device?user_code=${user_code}`)).statusCode).toBe(200);
      const csrf_token = await b.csrf('/device');
      expect((await b.post('/device', { csrf_token, user_code: user_code.replace('-', '') })).statusCode).toBe(200);
      expect((await b.post('/device', { csrf_token, user_code: 'BCDF-BCDF' })).statusCode).toBe(400);
      const polled = await logged.inject({
        method: 'POST',
        url: '/oauth/token',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        payload: form({ grant_type: DEVICE_CODE_GRANT, client_id: agent.client_id, device_code }),
      });
      expect(polled.json().error).toBe('authorization_pending');
      const text = capture.lines().join('\n');
      expect(text).toContain('device authorization started');
      expect(text).toContain('/device?user_code=[redacted]');
      for (const secret of [device_code, user_code, user_code.replace('-', ''), 'BCDF-BCDF']) expect(text).not.toContain(secret);
    } finally {
      await logged.close();
    }
  });
});

describe(`retention of device authorizations on ${BACKEND}`, () => {
  it('deletes them an hour after they expired', async () => {
    const gone = await startDevice();
    const kept = await startDevice();
    const live = await startDevice();
    await db().updateTable('device_authorizations').set({ expires_at: sql<Date>`now() - interval '61 minutes'` }).where('device_code_hash', '=', sha256Hex(gone.device_code)).execute();
    await db().updateTable('device_authorizations').set({ expires_at: sql<Date>`now() - interval '59 minutes'` }).where('device_code_hash', '=', sha256Hex(kept.device_code)).execute();
    const deleted = await deleteExpired(db());
    expect(deleted.device_authorizations).toBeGreaterThanOrEqual(1);
    const left = await db().selectFrom('device_authorizations').select('device_code_hash').where('device_code_hash', 'in', [gone, kept, live].map((d) => sha256Hex(d.device_code))).execute();
    expect(left.map((r) => r.device_code_hash).sort()).toEqual([kept, live].map((d) => sha256Hex(d.device_code)).sort());
    // A poll after the purge: as unknown as any other code.
    expect(await poll(gone.device_code)).toBe('invalid_grant');
    expect(await poll(kept.device_code)).toBe('expired_token');
  });
});
