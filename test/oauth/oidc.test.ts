/**
 * OpenID Connect (issue 16), driven by independent, strict clients: openid-client in OIDC mode,
 * configured only from /.well-known/openid-configuration, and oauth4webapi's ID token
 * validation, over real HTTP against the app listening on a port, with the user's browser going
 * through the real login and consent pages. On both databases (TEST_DATABASE_URL or PGlite).
 */
import { createHash } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { createRemoteJWKSet, decodeJwt, decodeProtectedHeader, jwtVerify } from 'jose';
import * as oauth from 'oauth4webapi';
import * as client from 'openid-client';
import { DPOP_SIGNING_ALGS } from '../../src/oauth/models/dpop-proofs.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { changeMemberRole } from '../../src/accounts/organizations.js';
import type { Config } from '../../src/config.js';
import type { ApplicationWithSecret } from '../../src/oauth/models/applications.js';
import { basic, clientCredentialsToken, form, type OrgFixture } from '../helpers/oauth.js';
import { authorizationRequest, createRelyingParty, discover, hiddenFields, oidcPerson, type OidcWorld, type Person, RP_REDIRECT, startOidcWorld } from '../helpers/oidc-world.js';

const PASSWORD = 'oidc-password-12';
const REDIRECT = RP_REDIRECT;
const POST_LOGOUT = 'https://rp.example.com/signed-out';

let world: OidcWorld;
let t: OidcWorld['t'];
let app: FastifyInstance;
let config: Config;
let issuer: string;
let org: OrgFixture;
let rp: ApplicationWithSecret;
let oidc: client.Configuration;

beforeAll(async () => {
  world = await startOidcWorld();
  ({ t, app, config, issuer, org } = world);
  rp = await createRelyingParty(world, [POST_LOGOUT]);
  // Discovery through the OpenID document only.
  oidc = await discover(world, rp);
}, 60_000);

afterAll(async () => {
  await world?.close();
});

/** A member of the organization with a name, not yet signed in. */
const person = (role: 'member' | 'viewer' = 'member') => oidcPerson(world, PASSWORD, role);

const pathOf = (url: URL | string) => {
  const u = new URL(url, issuer);
  return `${u.pathname}${u.search}`;
};

/** Signs in on the login page the authorization request was sent to, and follows back to /oauth/authorize. */
async function signInAt(p: Person, loginLocation: string) {
  const loginPage = await p.browser.get(loginLocation);
  expect(loginPage.statusCode, loginPage.body).toBe(200);
  const fields = hiddenFields(loginPage.body);
  const signedIn = await p.browser.post('/login', { email: p.email, password: PASSWORD, csrf_token: fields.csrf_token!, return_to: fields.return_to! });
  expect(signedIn.statusCode, signedIn.body).toBe(303);
  return p.browser.get(signedIn.headers.location as string);
}

/**
 * The browser's part of an authorization: the request, signing in when sent to, the consent page
 * when shown (Allow, for the organization). Returns the redirect back to the application.
 */
async function browse(p: Person, url: URL, options: { expectLogin?: boolean; expectConsent?: boolean } = {}): Promise<{ callback: URL; sawLogin: boolean; sawConsent: boolean; loginPage?: string }> {
  let res = await p.browser.get(pathOf(url));
  let sawLogin = false;
  let sawConsent = false;
  let loginPage: string | undefined;
  if (res.statusCode === 303 && (res.headers.location as string).startsWith('/login')) {
    sawLogin = true;
    loginPage = (await p.browser.get(res.headers.location as string)).body;
    res = await signInAt(p, res.headers.location as string);
  }
  if (res.statusCode === 200) {
    sawConsent = true;
    expect(res.body).toContain('Authorize Relying Party');
    res = await p.browser.post('/oauth/authorize', { ...hiddenFields(res.body), organization_id: String(org.organizationId), decision: 'approve' });
  }
  expect(res.statusCode, res.body).toBe(303);
  if (options.expectLogin !== undefined) expect(sawLogin).toBe(options.expectLogin);
  if (options.expectConsent !== undefined) expect(sawConsent).toBe(options.expectConsent);
  return { callback: new URL(res.headers.location as string), sawLogin, sawConsent, ...(loginPage !== undefined ? { loginPage } : {}) };
}

/** An authorization request as openid-client builds it, with its checks. */
const request = (scope: string, extra: Record<string, string> = {}) => authorizationRequest(oidc, scope, extra);

const atHash = (accessToken: string) => createHash('sha256').update(accessToken, 'ascii').digest().subarray(0, 16).toString('base64url');
const jwks = () => createRemoteJWKSet(new URL(`${issuer}/.well-known/jwks.json`));

describe('discovery', () => {
  it('serves one document at /.well-known/openid-configuration and at the RFC 8414 address', async () => {
    const openid = await app.inject({ method: 'GET', url: '/.well-known/openid-configuration' });
    const rfc8414 = await app.inject({ method: 'GET', url: '/.well-known/oauth-authorization-server' });
    expect(openid.statusCode).toBe(200);
    expect(openid.json()).toEqual(rfc8414.json());
    const doc = openid.json();
    expect(doc).toMatchObject({
      issuer,
      authorization_endpoint: `${issuer}/oauth/authorize`,
      token_endpoint: `${issuer}/oauth/token`,
      userinfo_endpoint: `${issuer}/oauth/userinfo`,
      end_session_endpoint: `${issuer}/oauth/logout`,
      jwks_uri: `${issuer}/.well-known/jwks.json`,
      subject_types_supported: ['public'],
      id_token_signing_alg_values_supported: ['RS256', 'ES256'],
      response_types_supported: ['code'],
      request_uri_parameter_supported: false,
    });
    expect(doc.scopes_supported).toEqual(expect.arrayContaining(['openid', 'profile', 'email', 'contacts.read']));
    expect(doc.claims_supported).toEqual(
      expect.arrayContaining(['sub', 'iss', 'aud', 'exp', 'iat', 'auth_time', 'nonce', 'at_hash', 'sid', 'organization_id', 'organization_name', 'email', 'email_verified', 'name']),
    );
    // What openid-client took from it.
    expect(oidc.serverMetadata().userinfo_endpoint).toBe(`${issuer}/oauth/userinfo`);
  });
});

describe('openid-client signs a user in (must-show 1)', () => {
  it('ID token with every claim, userinfo, refresh, and logout through the end-session endpoint', async () => {
    const ada = await person();
    const { url, checks, nonce } = await request('openid profile email contacts.read');
    const { callback, sawLogin, sawConsent } = await browse(ada, url);
    expect([sawLogin, sawConsent]).toEqual([true, true]);
    const session = await t.handle.db.selectFrom('sessions').select(['created_at']).where('user_id', '=', ada.id).executeTakeFirstOrThrow();

    const tokens = await client.authorizationCodeGrant(oidc, callback, { ...checks, idTokenExpected: true });
    expect(tokens.scope).toBe('openid profile email contacts.read');
    expect(tokens).toMatchObject({ organization_id: org.organizationId, organization_name: org.organizationName });
    const claims = tokens.claims()!;
    const now = Math.floor(Date.now() / 1000);
    expect(claims).toEqual({
      iss: issuer,
      sub: String(ada.id),
      aud: rp.client_id,
      azp: rp.client_id,
      exp: claims.iat + Math.min(3600, config.accessTokenTtl),
      iat: expect.any(Number),
      auth_time: Math.floor(session.created_at.getTime() / 1000),
      nonce,
      at_hash: atHash(tokens.access_token),
      sid: expect.stringMatching(/^[0-9a-f]{32}$/),
      amr: ['pwd'],
      acr: 'urn:orgauth:acr:password',
      organization_id: org.organizationId,
      organization_name: org.organizationName,
      email: ada.email,
      email_verified: true,
      name: ada.name,
    });
    expect(Math.abs(claims.iat - now)).toBeLessThan(60);
    // Signed with our published key, as an ID token (typ JWT), never as an access token.
    const verified = await jwtVerify(tokens.id_token!, jwks(), { issuer, audience: rp.client_id, typ: 'JWT', algorithms: ['RS256'] });
    expect(verified.payload.sub).toBe(String(ada.id));
    const apiWithIdToken = await app.inject({ method: 'GET', url: `/api/v1/${org.organizationId}/contacts`, headers: { authorization: `Bearer ${tokens.id_token}` } });
    expect(apiWithIdToken.statusCode).toBe(401);
    // The access token still works on the API, openid and all.
    expect((await app.inject({ method: 'GET', url: `/api/v1/${org.organizationId}/contacts`, headers: { authorization: `Bearer ${tokens.access_token}` } })).statusCode).toBe(200);

    const info = await client.fetchUserInfo(oidc, tokens.access_token, claims.sub);
    expect(info).toEqual({ sub: String(ada.id), email: ada.email, email_verified: true, name: ada.name, organization_id: org.organizationId, organization_name: org.organizationName });

    const refreshed = await client.refreshTokenGrant(oidc, tokens.refresh_token!);
    const again = refreshed.claims()!;
    expect(again).toMatchObject({ iss: issuer, sub: claims.sub, aud: rp.client_id, auth_time: claims.auth_time, sid: claims.sid, organization_id: org.organizationId, email: ada.email });
    expect(again.nonce).toBeUndefined();
    expect(again.at_hash).toBe(atHash(refreshed.access_token));
    expect(refreshed.scope).toBe('openid profile email contacts.read');

    // RP-initiated logout: back to the registered URI with state, and the session is gone.
    const logoutState = client.randomState();
    const logout = client.buildEndSessionUrl(oidc, { id_token_hint: refreshed.id_token!, post_logout_redirect_uri: POST_LOGOUT, state: logoutState });
    expect(logout.href.startsWith(`${issuer}/oauth/logout?`)).toBe(true);
    const out = await ada.browser.get(pathOf(logout));
    expect(out.statusCode, out.body).toBe(303);
    expect(out.headers.location).toBe(`${POST_LOGOUT}?state=${logoutState}`);
    expect(await t.handle.db.selectFrom('sessions').select('id').where('user_id', '=', ada.id).execute()).toEqual([]);
    const dashboard = await ada.browser.get('/dashboard');
    expect(dashboard.statusCode).toBe(303);
    expect(dashboard.headers.location).toMatch(/^\/login/);
    // Signed out, prompt=none is login_required.
    const silent = await request('openid', { prompt: 'none' });
    const res = await ada.browser.get(pathOf(silent.url));
    await expect(client.authorizationCodeGrant(oidc, new URL(res.headers.location as string), silent.checks)).rejects.toMatchObject({ error: 'login_required' });
  });

  it('oauth4webapi validates the ID token of the same flow (iss, aud, azp, exp, iat, nonce, auth_time with max_age)', async () => {
    const ada = await person();
    const as = await oauth.processDiscoveryResponse(new URL(issuer), await oauth.discoveryRequest(new URL(issuer), { [oauth.allowInsecureRequests]: true }));
    const rpClient: oauth.Client = { client_id: rp.client_id };
    const verifier = oauth.generateRandomCodeVerifier();
    const nonce = oauth.generateRandomNonce();
    const state = oauth.generateRandomState();
    const url = new URL(as.authorization_endpoint!);
    for (const [k, v] of Object.entries({
      client_id: rp.client_id, redirect_uri: REDIRECT, response_type: 'code', scope: 'openid email', state, nonce, max_age: '3600',
      code_challenge: await oauth.calculatePKCECodeChallenge(verifier), code_challenge_method: 'S256',
    })) url.searchParams.set(k, v);
    const { callback } = await browse(ada, url);
    const params = oauth.validateAuthResponse(as, rpClient, callback, state);
    const response = await oauth.authorizationCodeGrantRequest(as, rpClient, oauth.ClientSecretBasic(rp.client_secret), params, REDIRECT, verifier, { [oauth.allowInsecureRequests]: true });
    const result = await oauth.processAuthorizationCodeResponse(as, rpClient, response, { expectedNonce: nonce, maxAge: 3600, requireIdToken: true });
    const claims = oauth.getValidatedIdTokenClaims(result)!;
    expect(claims).toMatchObject({ sub: String(ada.id), email: ada.email, email_verified: true, organization_id: org.organizationId });
    // profile was not asked for: no name.
    expect(claims.name).toBeUndefined();
    expect(decodeProtectedHeader(result.id_token!)).toMatchObject({ typ: 'JWT', alg: 'RS256' });
  });
});

describe('when there is no ID token', () => {
  it('a nonce mismatch is refused by the client; the token response carries the nonce sent', async () => {
    const ada = await person();
    const { url, checks, nonce } = await request('openid');
    const { callback } = await browse(ada, url);
    const refused = await client.authorizationCodeGrant(oidc, callback, { ...checks, expectedNonce: `${nonce}-other`, idTokenExpected: true }).catch((err: unknown) => err);
    expect(refused).toMatchObject({ code: 'OAUTH_JWT_CLAIM_COMPARISON_FAILED', cause: { cause: { claim: 'nonce', expected: `${nonce}-other`, claims: { nonce } } } });
  });

  it('without openid in the scope, no id_token; client_credentials never has one and cannot ask for openid', async () => {
    const ada = await person();
    const { url, checks } = await request('contacts.read');
    const { callback } = await browse(ada, url);
    // OAuth mode (no openid asked, no nonce expected): openid-client then refuses any id_token it would find.
    const { expectedNonce: _unused, ...oauthChecks } = checks;
    const tokens = await client.authorizationCodeGrant(oidc, callback, oauthChecks);
    expect(tokens.id_token).toBeUndefined();
    expect(tokens.scope).toBe('contacts.read');
    const refreshed = await client.refreshTokenGrant(oidc, tokens.refresh_token!);
    expect(refreshed.id_token).toBeUndefined();
    // userinfo needs openid: 403 with the RFC 6750 challenge.
    const info = await app.inject({ method: 'GET', url: '/oauth/userinfo', headers: { authorization: `Bearer ${tokens.access_token}` } });
    expect(info.statusCode).toBe(403);
    expect(info.headers['www-authenticate']).toBe('Bearer realm="orgauth", error="insufficient_scope", scope="openid"');

    const own = await app.inject({ method: 'POST', url: '/oauth/token', headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(org.privateApp.client_id, org.privateApp.client_secret) }, payload: form({ grant_type: 'client_credentials', organization_id: String(org.organizationId) }) });
    expect(own.statusCode, own.body).toBe(200);
    expect(own.json().id_token).toBeUndefined();
    const asked = await app.inject({ method: 'POST', url: '/oauth/token', headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(org.privateApp.client_id, org.privateApp.client_secret) }, payload: form({ grant_type: 'client_credentials', organization_id: String(org.organizationId), scope: 'openid contacts.read' }) });
    expect(asked.statusCode).toBe(400);
    expect(asked.json().error).toBe('invalid_scope');
  });

  it('profile or email without openid is invalid_scope', async () => {
    const ada = await person();
    await ada.browser.login(ada.email, PASSWORD);
    const { url } = await request('email contacts.read');
    const res = await ada.browser.get(pathOf(url));
    expect(res.statusCode).toBe(303);
    expect(new URL(res.headers.location as string).searchParams.get('error')).toBe('invalid_scope');
  });
});

describe('prompt (must-show 2)', () => {
  it('prompt=none: a code without any page for a signed-in user who consented; login_required signed out; consent_required otherwise', async () => {
    const ada = await person();
    // Signed out: login_required, on the redirect_uri, with state and iss (openid-client checks both).
    const signedOut = await request('openid contacts.read', { prompt: 'none' });
    const first = await ada.browser.get(pathOf(signedOut.url));
    expect(first.statusCode).toBe(303);
    expect((first.headers.location as string).startsWith(REDIRECT)).toBe(true);
    await expect(client.authorizationCodeGrant(oidc, new URL(first.headers.location as string), signedOut.checks)).rejects.toMatchObject({ error: 'login_required' });

    // Signed in, never consented: consent_required.
    await ada.browser.login(ada.email, PASSWORD);
    const unconsented = await request('openid contacts.read', { prompt: 'none' });
    const second = await ada.browser.get(pathOf(unconsented.url));
    await expect(client.authorizationCodeGrant(oidc, new URL(second.headers.location as string), unconsented.checks)).rejects.toMatchObject({ error: 'consent_required' });

    // Consents once, then prompt=none: the code at once, no page, a valid ID token.
    const consented = await request('openid contacts.read');
    await client.authorizationCodeGrant(oidc, (await browse(ada, consented.url, { expectLogin: false, expectConsent: true })).callback, consented.checks);
    const silent = await request('openid contacts.read', { prompt: 'none' });
    const third = await ada.browser.get(pathOf(silent.url));
    expect(third.statusCode).toBe(303);
    const tokens = await client.authorizationCodeGrant(oidc, new URL(third.headers.location as string), { ...silent.checks, idTokenExpected: true });
    expect(tokens.claims()).toMatchObject({ sub: String(ada.id), nonce: silent.nonce, organization_id: org.organizationId });
    // A wider request than consented to is consent_required, not a silent widening.
    const wider = await request('openid email contacts.read', { prompt: 'none' });
    const fourth = await ada.browser.get(pathOf(wider.url));
    expect(new URL(fourth.headers.location as string).searchParams.get('error')).toBe('consent_required');
  });

  it('max_age=0 and prompt=login make a signed-in user sign in again; auth_time is the new sign-in', async () => {
    const ada = await person();
    const first = await request('openid contacts.read');
    await client.authorizationCodeGrant(oidc, (await browse(ada, first.url, { expectLogin: true })).callback, first.checks);
    // The sign-in moved an hour back (rather than waiting): max_age=60 is exceeded.
    const backdate = async () => {
      const hourAgo = new Date(Date.now() - 3600_000);
      await t.handle.db.updateTable('sessions').set({ created_at: hourAgo }).where('user_id', '=', ada.id).execute();
      return Math.floor(hourAgo.getTime() / 1000);
    };
    let oldSignIn = await backdate();

    for (const extra of [{ max_age: '0' }, { max_age: '60' }, { prompt: 'login' }, { prompt: 'select_account' }] as Record<string, string>[]) {
      const again = await request('openid contacts.read', extra);
      const { callback, sawLogin, sawConsent, loginPage } = await browse(ada, again.url);
      // Signed in already, yet the login page asked for the password (e-mail pre-filled); the consent is remembered.
      expect(sawLogin, JSON.stringify(extra)).toBe(true);
      expect(loginPage).toContain(`value="${ada.email}"`);
      // select_account: the organization is chosen again too.
      expect(sawConsent).toBe(extra.prompt === 'select_account');
      const tokens = await client.authorizationCodeGrant(oidc, callback, { ...again.checks, ...(extra.max_age !== undefined ? { maxAge: Number(extra.max_age) } : {}), idTokenExpected: true });
      const session = await t.handle.db.selectFrom('sessions').select('created_at').where('user_id', '=', ada.id).executeTakeFirstOrThrow();
      expect(tokens.claims()!.auth_time).toBe(Math.floor(session.created_at.getTime() / 1000));
      expect(tokens.claims()!.auth_time).toBeGreaterThan(oldSignIn + 60);
      oldSignIn = await backdate();
    }
    // prompt=none with a too-old sign-in: login_required, no page.
    const silent = await request('openid contacts.read', { prompt: 'none', max_age: '60' });
    const res = await ada.browser.get(pathOf(silent.url));
    expect(new URL(res.headers.location as string).searchParams.get('error')).toBe('login_required');
  });

  it('signed out, prompt=login or max_age still ask the login page for a fresh sign-in (which it carries on to a company identity provider)', async () => {
    const ada = await person();
    for (const [extra, fresh] of [[{ prompt: 'login' }, true], [{ max_age: '0' }, true], [{}, false]] as [Record<string, string>, boolean][]) {
      const res = await ada.browser.get(pathOf((await request('openid', extra)).url));
      expect(res.statusCode).toBe(303);
      const login = new URL(res.headers.location as string, issuer);
      expect(login.pathname).toBe('/login');
      expect(login.searchParams.get('prompt'), JSON.stringify(extra)).toBe(fresh ? 'login' : null);
      const page = await ada.browser.get(pathOf(login));
      expect(page.body.includes('<input type="hidden" name="prompt" value="login">'), JSON.stringify(extra)).toBe(fresh);
    }
  });

  it('login_hint pre-fills the email; id_token_hint naming someone else asks to sign in (login_required with prompt=none)', async () => {
    const ada = await person();
    const grace = await person();
    const res = await ada.browser.get(pathOf((await request('openid', { login_hint: 'someone@example.org' })).url));
    const loginPage = await ada.browser.get(res.headers.location as string);
    expect(loginPage.body).toContain('value="someone@example.org"');

    // Grace's ID token as the hint while Ada is signed in.
    const graceFlow = await request('openid');
    const graceTokens = await client.authorizationCodeGrant(oidc, (await browse(grace, graceFlow.url)).callback, graceFlow.checks);
    await ada.browser.login(ada.email, PASSWORD);
    const hinted = await request('openid', { id_token_hint: graceTokens.id_token!, prompt: 'none' });
    const silent = await ada.browser.get(pathOf(hinted.url));
    expect(new URL(silent.headers.location as string).searchParams.get('error')).toBe('login_required');
    const shown = await ada.browser.get(pathOf((await request('openid', { id_token_hint: graceTokens.id_token! })).url));
    expect(shown.headers.location).toMatch(/^\/login\?.*prompt=login/);
    // Grace signs in on that page: her request goes on.
    const asGrace = await request('openid', { id_token_hint: graceTokens.id_token! });
    const { callback, sawLogin } = await browse({ ...grace, browser: ada.browser }, asGrace.url);
    expect(sawLogin).toBe(true);
    const tokens = await client.authorizationCodeGrant(oidc, callback, asGrace.checks);
    expect(tokens.claims()!.sub).toBe(String(grace.id));
    // A hint that is not our ID token (an access token, a forged one) is invalid_request.
    for (const bad of [graceTokens.access_token, `${graceTokens.id_token!.slice(0, -4)}AAAA`, 'not.a.jwt']) {
      const r = await ada.browser.get(pathOf((await request('openid', { id_token_hint: bad })).url));
      expect(new URL(r.headers.location as string).searchParams.get('error')).toBe('invalid_request');
    }
  });
});

describe('userinfo', () => {
  it('GET and POST with the bearer token; 401 challenges without one or with a bad one', async () => {
    const ada = await person();
    const { url, checks } = await request('openid email');
    const tokens = await client.authorizationCodeGrant(oidc, (await browse(ada, url)).callback, checks);
    for (const method of ['GET', 'POST'] as const) {
      const res = await app.inject({ method, url: '/oauth/userinfo', headers: { authorization: `Bearer ${tokens.access_token}` } });
      expect(res.statusCode).toBe(200);
      expect(res.headers['cache-control']).toBe('no-store');
      expect(res.json()).toEqual({ sub: String(ada.id), email: ada.email, email_verified: true, organization_id: org.organizationId, organization_name: org.organizationName });
    }
    const none = await app.inject({ method: 'GET', url: '/oauth/userinfo' });
    expect(none.statusCode).toBe(401);
    // Both schemes offered (RFC 9449 §7.1).
    expect(none.headers['www-authenticate']).toBe(`Bearer realm="orgauth", DPoP algs="${DPOP_SIGNING_ALGS.join(' ')}"`);
    const bad = await app.inject({ method: 'GET', url: '/oauth/userinfo', headers: { authorization: `Bearer ${tokens.id_token}` } });
    expect(bad.statusCode).toBe(401);
    expect(bad.headers['www-authenticate']).toBe('Bearer realm="orgauth", error="invalid_token"');
    const own = await clientCredentialsToken(app, org);
    const application = await app.inject({ method: 'GET', url: '/oauth/userinfo', headers: { authorization: `Bearer ${own}` } });
    expect(application.statusCode).toBe(403);
    // Revoked: 401.
    await client.tokenRevocation(oidc, tokens.refresh_token!);
    await expect.poll(async () => (await app.inject({ method: 'GET', url: '/oauth/userinfo', headers: { authorization: `Bearer ${tokens.access_token}` } })).statusCode).toBe(401);
  });
});

describe('identity scopes and roles', () => {
  it('a viewer may sign in with openid alone; a role change keeps the OpenID scopes of a narrowed grant', async () => {
    const viewer = await person('viewer');
    const { url, checks } = await request('openid profile');
    const { callback } = await browse(viewer, url);
    const signInOnly = await client.authorizationCodeGrant(oidc, callback, { ...checks, idTokenExpected: true });
    expect(signInOnly.scope).toBe('openid profile');
    expect(signInOnly.claims()).toMatchObject({ sub: String(viewer.id), name: viewer.name, organization_id: org.organizationId });

    const member = await person('member');
    const flow = await request('openid email contacts.read contacts.write');
    const page = await member.browser.get(pathOf(flow.url));
    expect(page.statusCode).toBe(303);
    const consent = await signInAt(member, page.headers.location as string);
    // The consent page says what the application will learn.
    expect(consent.body).toContain('<code>openid</code>');
    expect(consent.body).toContain('<code>email</code>');
    const approved = await member.browser.post('/oauth/authorize', { ...hiddenFields(consent.body), organization_id: String(org.organizationId), decision: 'approve' });
    const tokens = await client.authorizationCodeGrant(oidc, new URL(approved.headers.location as string), flow.checks);
    expect(tokens.scope).toBe('openid email contacts.read contacts.write');
    // Demoted to viewer: the grant is narrowed to contacts.read, and keeps openid and email.
    await changeMemberRole(t.handle.db, { organizationId: org.organizationId, userId: member.id, role: 'viewer' });
    const refreshed = await client.refreshTokenGrant(oidc, tokens.refresh_token!);
    expect(refreshed.scope).toBe('openid email contacts.read');
    expect(refreshed.claims()).toMatchObject({ sub: String(member.id), auth_time: tokens.claims()!.auth_time, email: member.email });
    // A refresh may narrow the access token's scope, OpenID scopes included; the new refresh
    // token keeps the grant's (RFC 6749 §6), and nothing beyond the grant is given.
    const narrower = await client.refreshTokenGrant(oidc, refreshed.refresh_token!, { scope: 'contacts.read' });
    expect(narrower.scope).toBe('contacts.read');
    expect(narrower.id_token).toBeUndefined();
    const back = await client.refreshTokenGrant(oidc, narrower.refresh_token!, { scope: 'openid email' });
    expect(back.scope).toBe('openid email');
    expect(back.claims()).toMatchObject({ sub: String(member.id), email: member.email });
    await expect(client.refreshTokenGrant(oidc, back.refresh_token!, { scope: 'openid profile' })).rejects.toMatchObject({ error: 'invalid_scope' });

    // Demoted to a role that allows none of the data granted: the grant lives on for signing in.
    const writer = await person('member');
    const writeFlow = await request('openid contacts.write');
    const writeTokens = await client.authorizationCodeGrant(oidc, (await browse(writer, writeFlow.url)).callback, writeFlow.checks);
    expect(writeTokens.scope).toBe('openid contacts.write');
    await changeMemberRole(t.handle.db, { organizationId: org.organizationId, userId: writer.id, role: 'viewer' });
    const signInOnly2 = await client.refreshTokenGrant(oidc, writeTokens.refresh_token!);
    expect(signInOnly2.scope).toBe('openid');
    expect(signInOnly2.claims()).toMatchObject({ sub: String(writer.id), auth_time: writeTokens.claims()!.auth_time });
    expect((await app.inject({ method: 'POST', url: `/api/v1/${org.organizationId}/contacts`, headers: { authorization: `Bearer ${signInOnly2.access_token}` }, payload: { name: 'x' } })).statusCode).toBe(403);
  });
});

describe('RP-initiated logout', () => {
  async function signedInWithIdToken() {
    const ada = await person();
    const { url, checks } = await request('openid');
    const tokens = await client.authorizationCodeGrant(oidc, (await browse(ada, url)).callback, checks);
    return { ada, idToken: tokens.id_token! };
  }

  it('without a hint naming the signed-in user, asks first; the form signs out and goes back', async () => {
    const { ada } = await signedInWithIdToken();
    const asked = await ada.browser.get(`/oauth/logout?client_id=${rp.client_id}&post_logout_redirect_uri=${encodeURIComponent(POST_LOGOUT)}&state=s-1`);
    expect(asked.statusCode).toBe(200);
    expect(asked.body).toContain('Sign out of orgauth?');
    expect(await t.handle.db.selectFrom('sessions').select('id').where('user_id', '=', ada.id).execute()).toHaveLength(1);
    const fields = hiddenFields(asked.body);
    // The confirmation needs its CSRF token.
    const forged = await ada.browser.post('/oauth/logout', { ...fields, confirm: 'forged' });
    expect(forged.statusCode).toBe(200);
    expect(await t.handle.db.selectFrom('sessions').select('id').where('user_id', '=', ada.id).execute()).toHaveLength(1);
    const out = await ada.browser.post('/oauth/logout', fields);
    expect(out.statusCode).toBe(303);
    expect(out.headers.location).toBe(`${POST_LOGOUT}?state=s-1`);
    expect(await t.handle.db.selectFrom('sessions').select('id').where('user_id', '=', ada.id).execute()).toEqual([]);
    // Signed out already: straight back.
    const again = await ada.browser.get(`/oauth/logout?client_id=${rp.client_id}&post_logout_redirect_uri=${encodeURIComponent(POST_LOGOUT)}`);
    expect(again.statusCode).toBe(303);
    expect(again.headers.location).toBe(POST_LOGOUT);
  });

  it('a POST from another site (the SameSite=Lax cookie not sent) goes on as a GET and clears no cookie; so does POST /logout', async () => {
    const { ada, idToken } = await signedInWithIdToken();
    const fields = { id_token_hint: idToken, post_logout_redirect_uri: POST_LOGOUT, state: 's-2' };
    const crossSite = await app.inject({ method: 'POST', url: '/oauth/logout', headers: { 'content-type': 'application/x-www-form-urlencoded' }, payload: form(fields) });
    expect(crossSite.statusCode).toBe(303);
    expect(crossSite.headers['set-cookie']).toBeUndefined();
    const location = new URL(crossSite.headers.location as string, issuer);
    expect(location.pathname).toBe('/oauth/logout');
    expect(Object.fromEntries(location.searchParams)).toEqual(fields);
    expect(await t.handle.db.selectFrom('sessions').select('id').where('user_id', '=', ada.id).execute()).toHaveLength(1);
    // The navigation it leads to carries the cookie: this session's ID token signs out.
    const followed = await ada.browser.get(pathOf(location));
    expect(followed.headers.location).toBe(`${POST_LOGOUT}?state=s-2`);
    expect(await t.handle.db.selectFrom('sessions').select('id').where('user_id', '=', ada.id).execute()).toEqual([]);
    const dashboardLogout = await app.inject({ method: 'POST', url: '/logout', headers: { 'content-type': 'application/x-www-form-urlencoded' }, payload: form({}) });
    expect(dashboardLogout.statusCode).toBe(303);
    expect(dashboardLogout.headers['set-cookie']).toBeUndefined();
  });

  it('someone else’s ID token asks first; no post_logout_redirect_uri shows a signed-out page', async () => {
    const { idToken } = await signedInWithIdToken();
    const { ada: other } = await signedInWithIdToken();
    const asked = await other.browser.get(`/oauth/logout?id_token_hint=${idToken}`);
    expect(asked.statusCode).toBe(200);
    expect(asked.body).toContain('Sign out of orgauth?');
    const out = await other.browser.post('/oauth/logout', hiddenFields(asked.body));
    expect(out.statusCode).toBe(200);
    expect(out.body).toContain('You are signed out');
  });

  it('never redirects to an unregistered URI, nor for a hint of another issuer or application', async () => {
    const { ada, idToken } = await signedInWithIdToken();
    const cases = [
      `/oauth/logout?id_token_hint=${idToken}&post_logout_redirect_uri=${encodeURIComponent('https://evil.example.com/')}`,
      `/oauth/logout?id_token_hint=${idToken}&post_logout_redirect_uri=${encodeURIComponent(`${POST_LOGOUT}/`)}`,
      `/oauth/logout?post_logout_redirect_uri=${encodeURIComponent(POST_LOGOUT)}`,
      `/oauth/logout?id_token_hint=${idToken}&client_id=${org.privateApp.client_id}&post_logout_redirect_uri=${encodeURIComponent(POST_LOGOUT)}`,
      `/oauth/logout?id_token_hint=${idToken.slice(0, -4)}AAAA&post_logout_redirect_uri=${encodeURIComponent(POST_LOGOUT)}`,
      `/oauth/logout?client_id=${org.privateApp.client_id}&post_logout_redirect_uri=${encodeURIComponent(POST_LOGOUT)}`,
    ];
    for (const path of cases) {
      const res = await ada.browser.get(path);
      expect(res.statusCode, path).toBe(400);
      expect(res.headers.location).toBeUndefined();
    }
    // Nothing ended.
    expect(await t.handle.db.selectFrom('sessions').select('id').where('user_id', '=', ada.id).execute()).toHaveLength(1);
    expect(decodeJwt(idToken).sub).toBe(String(ada.id));
  });
});
