import { createHash } from 'node:crypto';
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember, createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { sha256Hex } from '../../src/lib/crypto.js';
import { type ApplicationWithSecret, createApplication } from '../../src/oauth/models/applications.js';
import { Browser, csrfTokenIn, expectPageSecurityHeaders } from '../accounts/browser.js';
import { buildTestApp, testConfig } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { createOrgFixture, type OrgFixture, SAFE_DESCRIPTION } from '../helpers/oauth.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
let fixture: OrgFixture;
let pkceApp: ApplicationWithSecret;
let queryApp: ApplicationWithSecret;
let narrowApp: ApplicationWithSecret;
let evilNameApp: ApplicationWithSecret;
let disabledApp: ApplicationWithSecret;
let user: { id: number; email: string };
let ownOrgId: number;
let memberOrgId: number;
let strangerOrgId: number;
const ISSUER = testConfig().issuer;
const PASSWORD = 'user-password-123';
const REDIRECT = 'https://client.example.com/cb';
const STATE = 'state-0123456789abcdef';
const VERIFIER = 'v'.repeat(20) + '-._~' + 'abcdefghijklmnopqrstuvwxyz';
const CHALLENGE = createHash('sha256').update(VERIFIER).digest('base64url');

beforeAll(async () => {
  t = await createTestDatabase();
  const db = t.handle.db;
  app = await buildTestApp(db);
  fixture = await createOrgFixture(db);
  const appsOrg = fixture.organizationId;
  pkceApp = await createApplication(db, { organizationId: appsOrg, type: 'public', name: 'PKCE app', redirectUris: [REDIRECT], requirePkce: true });
  queryApp = await createApplication(db, { organizationId: appsOrg, type: 'public', name: 'Query app', redirectUris: ['https://client.example.com/cb?tenant=a%20b&x=1'] });
  narrowApp = await createApplication(db, { organizationId: appsOrg, type: 'public', name: 'Narrow', redirectUris: [REDIRECT], scopes: 'contacts.read' });
  evilNameApp = await createApplication(db, { organizationId: appsOrg, type: 'public', name: '<script>alert(1)</script>', redirectUris: [REDIRECT] });
  disabledApp = await createApplication(db, { organizationId: appsOrg, type: 'public', name: 'Disabled', redirectUris: [REDIRECT] });
  await db.updateTable('applications').set({ disabled: true }).where('client_id', '=', disabledApp.client_id).execute();

  const u = await createUser(db, { email: 'user@example.com', password: PASSWORD, name: 'User' });
  user = { id: u.id, email: u.email };
  ownOrgId = (await createOrganization(db, { name: 'Own Org', ownerUserId: u.id })).id;
  const other = await createUser(db, { email: 'other@example.com', password: PASSWORD });
  memberOrgId = (await createOrganization(db, { name: 'Member Org', ownerUserId: other.id })).id;
  await addMember(db, { organizationId: memberOrgId, userId: u.id, role: 'member' });
  strangerOrgId = (await createOrganization(db, { name: 'Stranger Org', ownerUserId: other.id })).id;
});
afterAll(async () => {
  await app.close();
  await t.close();
});

let ip = 0;
async function signedIn(email = user.email): Promise<Browser> {
  const b = new Browser(app, `10.2.0.${++ip}`);
  expect((await b.login(email, PASSWORD)).statusCode).toBe(303);
  return b;
}

type Query = Record<string, string | string[] | undefined>;
function authorizeUrl(query: Query): string {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) for (const value of v === undefined ? [] : [v].flat()) params.append(k, value);
  return `/oauth/authorize?${params.toString()}`;
}
const base = (overrides: Query = {}): Query => ({
  client_id: fixture.publicApp.client_id,
  redirect_uri: REDIRECT,
  response_type: 'code',
  scope: 'contacts.read tasks.read',
  state: STATE,
  ...overrides,
});

/** The form fields of a consent page: its hidden inputs (including csrf_token). */
function hiddenFields(html: string): Record<string, string> {
  const fields: Record<string, string> = {};
  const unescape = (s: string) => s.replace(/&quot;/g, '"').replace(/&#39;/g, "'").replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&amp;/g, '&');
  for (const m of html.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)">/g)) fields[m[1] ?? ''] = unescape(m[2] ?? '');
  return fields;
}

/** AZ-2: an HTML page with status 400 and no redirect. */
function expectErrorPage(res: LightMyRequestResponse, status = 400): void {
  expect(res.statusCode).toBe(status);
  expect(res.headers.location).toBeUndefined();
  expect(res.headers['content-type']).toBe('text/html; charset=utf-8');
  expectPageSecurityHeaders(res);
}

/** AZ-3: a 303 to the registered URI with error, error_description, the state as sent, and iss. */
function expectRedirectError(res: LightMyRequestResponse, error: string, state: string | undefined, redirectUri = REDIRECT): void {
  expect(res.statusCode).toBe(303);
  const location = String(res.headers.location);
  expect(location.startsWith(`${redirectUri}${redirectUri.includes('?') ? '&' : '?'}`)).toBe(true);
  const params = Object.fromEntries(new URL(location).searchParams);
  const { tenant: _t, x: _x, ...rest } = params;
  expect(rest).toEqual({
    error,
    error_description: expect.stringMatching(SAFE_DESCRIPTION),
    ...(state === undefined ? {} : { state }),
    iss: ISSUER,
  });
}

const codeRows = () => t.handle.db.selectFrom('authorization_codes').selectAll().execute();

async function consent(b: Browser, query: Query): Promise<Record<string, string>> {
  const page = await b.get(authorizeUrl(query));
  expect(page.statusCode).toBe(200);
  return hiddenFields(page.body);
}

function auditEvents(organizationId: number, action: string) {
  return t.handle.db
    .selectFrom('audit_events')
    .select(['actor_user_id', 'actor_client_id', 'details'])
    .where('organization_id', '=', organizationId)
    .where('action', '=', action)
    .orderBy('id')
    .execute();
}

describe(`GET /oauth/authorize: client and redirect_uri on ${BACKEND}`, () => {
  it.each([
    ['upper-case host', 'https://CLIENT.example.com/cb'],
    ['trailing slash', 'https://client.example.com/cb/'],
    ['extra query', 'https://client.example.com/cb?x=1'],
    ['longer path (prefix match)', 'https://client.example.com/cb/evil'],
    ['upper-case path', 'https://client.example.com/CB'],
    ['http instead of https', 'http://client.example.com/cb'],
    ['fragment', 'https://client.example.com/cb#x'],
  ])('shows an error page for a redirect_uri that differs by %s (AZ-1, AZ-2)', async (_what, redirectUri) => {
    const b = await signedIn();
    const res = await b.get(authorizeUrl(base({ redirect_uri: redirectUri })));
    expectErrorPage(res);
    expect(res.body).toContain('not registered');
  });

  it('also shows the error page to a signed-out user instead of redirecting anywhere (AZ-2)', async () => {
    const res = await app.inject({ method: 'GET', url: authorizeUrl(base({ redirect_uri: 'https://evil.example.com/cb' })) });
    expectErrorPage(res);
  });

  it.each([
    ['an unknown client', () => base({ client_id: 'no-such-client' })],
    ['a disabled client', () => base({ client_id: disabledApp.client_id })],
    ['no client_id', () => base({ client_id: undefined })],
    ['client_id sent twice', () => base({ client_id: [fixture.publicApp.client_id, fixture.publicApp.client_id] })],
    ['no redirect_uri', () => base({ redirect_uri: undefined })],
    ['redirect_uri sent twice', () => base({ redirect_uri: [REDIRECT, REDIRECT] })],
    ['a private application (it has no redirect URIs)', () => base({ client_id: fixture.privateApp.client_id })],
  ])('shows an error page, never a redirect, for %s (AZ-2)', async (_what, query) => {
    const b = await signedIn();
    expectErrorPage(await b.get(authorizeUrl(query())));
  });
});

/**
 * The login page's return_to in `location`: the authorization request `url` as sent, plus the
 * signed_in_after mark of when it was sent there, signed (nothing else added or changed).
 */
function loginReturnTo(location: unknown, url?: string, marked = true): string {
  const login = new URL(String(location), 'http://orgauth.test');
  expect(login.pathname).toBe('/login');
  const returnTo = login.searchParams.get('return_to') ?? '';
  const back = new URL(returnTo, 'http://orgauth.test');
  // Only a valid request is marked (an invalid one is refused once the user has signed in).
  if (marked) expect(back.searchParams.get('signed_in_after')).toMatch(/^\d+\.[A-Za-z0-9_-]{32}$/);
  else expect(back.searchParams.has('signed_in_after')).toBe(false);
  back.searchParams.delete('signed_in_after');
  const sent = new URL(url ?? returnTo, 'http://orgauth.test');
  if (url !== undefined) expect([...back.searchParams]).toEqual([...sent.searchParams]);
  expect(back.pathname).toBe('/oauth/authorize');
  return returnTo;
}

describe(`GET /oauth/authorize: sign-in first on ${BACKEND}`, () => {
  it('sends a signed-out user to the login page and, after sign-in, back to the same request (AZ-6)', async () => {
    const url = authorizeUrl(base({ code_challenge: CHALLENGE, code_challenge_method: 'S256' }));
    const b = new Browser(app, '10.3.0.1');
    const first = await b.get(url);
    expect(first.statusCode).toBe(303);
    const returnTo = loginReturnTo(first.headers.location);
    const loginPage = await b.get(String(first.headers.location));
    expect(loginPage.statusCode).toBe(200);
    const login = await b.post('/login', { email: user.email, password: PASSWORD, csrf_token: csrfTokenIn(loginPage.body), return_to: returnTo });
    expect(login.statusCode).toBe(303);
    expect(login.headers.location).toBe(returnTo);
    const page = await b.get(returnTo);
    expect(page.statusCode).toBe(200);
    expect(page.body).toContain('Authorize Web');
  });

  it('does not tell the client about request errors before the user has signed in (AZ-6)', async () => {
    const url = authorizeUrl(base({ response_type: 'token', state: 'short' }));
    const res = await app.inject({ method: 'GET', url });
    expect(res.statusCode).toBe(303);
    loginReturnTo(res.headers.location, url, false);
  });
});

describe(`GET /oauth/authorize: errors for the client on ${BACKEND}`, () => {
  it.each([
    ['unsupported_response_type', 'response_type=token', () => base({ response_type: 'token' }), STATE],
    ['invalid_request', 'no response_type', () => base({ response_type: undefined }), STATE],
    ['invalid_scope', 'no scope', () => base({ scope: undefined }), STATE],
    ['invalid_scope', 'an empty scope', () => base({ scope: '' }), STATE],
    ['invalid_scope', 'a blank scope', () => base({ scope: '   ' }), STATE],
    ['invalid_scope', 'an unknown scope', () => base({ scope: 'contacts.read admin' }), STATE],
    ['invalid_request', 'no state', () => base({ state: undefined }), undefined],
    ['invalid_request', 'a 15-character state (AZ-4)', () => base({ state: 'fifteen-chars-x' }), 'fifteen-chars-x'],
    ['invalid_request', 'a scope sent twice (AZ-5)', () => base({ scope: ['contacts.read', 'tasks.read'] }), STATE],
    ['invalid_request', 'a state sent twice (AZ-5)', () => base({ state: [STATE, `${STATE}-2`] }), STATE],
    ['invalid_request', 'plain PKCE (PK-1)', () => base({ code_challenge: CHALLENGE, code_challenge_method: 'plain' }), STATE],
    ['invalid_request', 'a challenge without a method (PK-1: plain by default)', () => base({ code_challenge: CHALLENGE }), STATE],
    ['invalid_request', 'an unknown PKCE method', () => base({ code_challenge: CHALLENGE, code_challenge_method: 's256' }), STATE],
    ['invalid_request', 'a 42-character challenge', () => base({ code_challenge: 'a'.repeat(42), code_challenge_method: 'S256' }), STATE],
    ['invalid_request', 'a 129-character challenge', () => base({ code_challenge: 'a'.repeat(129), code_challenge_method: 'S256' }), STATE],
    ['invalid_request', 'a challenge with a bad character', () => base({ code_challenge: `${'a'.repeat(42)}+`, code_challenge_method: 'S256' }), STATE],
    ['invalid_request', 'a method without a challenge', () => base({ code_challenge_method: 'S256' }), STATE],
  ])('redirects %s for %s (AZ-3)', async (error, _what, query, state) => {
    const b = await signedIn();
    expectRedirectError(await b.get(authorizeUrl(query())), error, state);
  });

  it("refuses a scope outside the application's scopes (invalid_scope)", async () => {
    const b = await signedIn();
    expectRedirectError(await b.get(authorizeUrl(base({ client_id: narrowApp.client_id, scope: 'contacts.read tasks.read' }))), 'invalid_scope', STATE);
    expect((await b.get(authorizeUrl(base({ client_id: narrowApp.client_id, scope: 'contacts.read' })))).statusCode).toBe(200);
  });

  it('requires a code_challenge when the application requires PKCE (PK-2)', async () => {
    const b = await signedIn();
    expectRedirectError(await b.get(authorizeUrl(base({ client_id: pkceApp.client_id }))), 'invalid_request', STATE);
    expect((await b.get(authorizeUrl(base({ client_id: pkceApp.client_id, code_challenge: CHALLENGE, code_challenge_method: 'S256' })))).statusCode).toBe(200);
  });

  it("appends to the registered URI's own query, leaving it byte for byte as registered", async () => {
    const b = await signedIn();
    const res = await b.get(authorizeUrl(base({ client_id: queryApp.client_id, redirect_uri: 'https://client.example.com/cb?tenant=a%20b&x=1', response_type: 'token' })));
    expectRedirectError(res, 'unsupported_response_type', STATE, 'https://client.example.com/cb?tenant=a%20b&x=1');
  });

  it('echoes a 512-character state byte for byte, also in an error (AZ-4)', async () => {
    const unreserved = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~';
    const special = ' +&=%?#/"\'<>é😀';
    let state = '';
    while (state.length < 512) state += unreserved + special;
    state = state.slice(0, 511) + 'Z';
    expect(state.length).toBe(512);
    const b = await signedIn();
    expectRedirectError(await b.get(authorizeUrl(base({ state, scope: 'nope' }))), 'invalid_scope', state);
    const fields = await consent(b, base({ state }));
    expect(fields.state).toBe(state);
    const res = await b.post('/oauth/authorize', { ...fields, organization_id: String(ownOrgId), decision: 'approve' });
    expect(res.statusCode).toBe(303);
    expect(new URL(String(res.headers.location)).searchParams.get('state')).toBe(state);
  });

  it('ignores unknown parameters and treats empty ones as absent (AZ-5)', async () => {
    const b = await signedIn();
    const res = await b.get(authorizeUrl(base({ ui_locales: 'x', display: 'page', code_challenge: '', code_challenge_method: '' })));
    expect(res.statusCode).toBe(200);
    expect(hiddenFields(res.body)).not.toHaveProperty('code_challenge');
  });
});

describe(`the consent page on ${BACKEND}`, () => {
  it('shows the application, each scope with its description, and the organizations, with the security headers (AZ-7)', async () => {
    const b = await signedIn();
    const res = await b.get(authorizeUrl(base({ scope: 'tasks.read contacts.read' })));
    expect(res.statusCode).toBe(200);
    expectPageSecurityHeaders(res);
    expect(res.body).toContain('<h1>Authorize Web');
    expect(res.body).toContain('<code>contacts.read</code> — Read contacts');
    expect(res.body).toContain('<code>tasks.read</code> — Read tasks');
    expect(res.body).not.toContain('tasks.write');
    expect(res.body).toContain(`name="organization_id" value="${ownOrgId}" required>`);
    expect(res.body).toContain(`name="organization_id" value="${memberOrgId}" required>`);
    expect(res.body).not.toContain(`value="${strangerOrgId}"`);
    expect(res.body).toContain('name="decision" value="approve"');
    expect(res.body).toContain('name="decision" value="deny"');
    expect(hiddenFields(res.body)).toEqual({
      csrf_token: expect.any(String),
      client_id: fixture.publicApp.client_id,
      redirect_uri: REDIRECT,
      response_type: 'code',
      scope: 'tasks.read contacts.read',
      state: STATE,
    });
  });

  it('pre-selects the organization when the user has exactly one', async () => {
    const single = await createUser(t.handle.db, { email: 'single@example.com', password: PASSWORD });
    const orgId = (await createOrganization(t.handle.db, { name: 'Solo', ownerUserId: single.id })).id;
    const b = await signedIn('single@example.com');
    const res = await b.get(authorizeUrl(base()));
    expect(res.body).toContain(`name="organization_id" value="${orgId}" required checked>`);
  });

  it('escapes the application name (no script injection)', async () => {
    const b = await signedIn();
    const res = await b.get(authorizeUrl(base({ client_id: evilNameApp.client_id })));
    expect(res.statusCode).toBe(200);
    expect(res.body).not.toContain('<script>');
    expect(res.body).toContain('&lt;script&gt;alert(1)&lt;/script&gt;');
  });

  it('tells a user without organizations so, and issues nothing', async () => {
    await createUser(t.handle.db, { email: 'orphan@example.com', password: PASSWORD });
    const b = await signedIn('orphan@example.com');
    const before = (await codeRows()).length;
    const res = await b.get(authorizeUrl(base()));
    expectErrorPage(res, 403);
    expect(res.body).toContain('not a member of any organization');
    expect(res.body).not.toContain('name="decision"');
    expect(await codeRows()).toHaveLength(before);
  });
});

describe(`POST /oauth/authorize (consent) on ${BACKEND}`, () => {
  it('approves: a code bound to the chosen organization, client, redirect_uri, user, scopes and challenge (AZ-8, AZ-9)', async () => {
    const b = await signedIn();
    const fields = await consent(b, base({ client_id: pkceApp.client_id, code_challenge: CHALLENGE, code_challenge_method: 'S256' }));
    const res = await b.post('/oauth/authorize', { ...fields, organization_id: String(memberOrgId), decision: 'approve' });
    expect(res.statusCode).toBe(303);
    expectPageSecurityHeaders(res);
    const location = new URL(String(res.headers.location));
    expect(`${location.origin}${location.pathname}`).toBe(REDIRECT);
    const params = Object.fromEntries(location.searchParams);
    expect(params).toEqual({ code: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/), state: STATE, iss: ISSUER });
    const row = await t.handle.db.selectFrom('authorization_codes').selectAll().where('code_hash', '=', sha256Hex(params.code ?? '')).executeTakeFirstOrThrow();
    const application = await t.handle.db.selectFrom('applications').select('id').where('client_id', '=', pkceApp.client_id).executeTakeFirstOrThrow();
    expect(row).toMatchObject({
      organization_id: memberOrgId,
      application_id: application.id,
      user_id: user.id,
      redirect_uri: REDIRECT,
      scopes: ['contacts.read', 'tasks.read'],
      code_challenge: CHALLENGE,
      code_challenge_method: 'S256',
      consumed_at: null,
    });
    const ttl = (row.expires_at.getTime() - Date.now()) / 1000;
    expect(ttl).toBeGreaterThan(50);
    expect(ttl).toBeLessThanOrEqual(60);
    // The decision is in the organization's audit log.
    const events = await auditEvents(memberOrgId, 'authorization.approved');
    expect(events.at(-1)).toMatchObject({ actor_user_id: user.id, actor_client_id: pkceApp.client_id, details: { client_id: pkceApp.client_id, scopes: 'contacts.read tasks.read' } });
  });

  it('denies: access_denied with the state and iss, and no code', async () => {
    const b = await signedIn();
    const before = (await codeRows()).length;
    const fields = await consent(b, base());
    const denied = (await auditEvents(memberOrgId, 'authorization.denied')).length;
    const res = await b.post('/oauth/authorize', { ...fields, organization_id: String(memberOrgId), decision: 'deny' });
    expectRedirectError(res, 'access_denied', STATE);
    expect(await codeRows()).toHaveLength(before);
    expect(await auditEvents(memberOrgId, 'authorization.denied')).toHaveLength(denied + 1);
  });

  it("refuses an organization the user is not a member of (AZ-8)", async () => {
    const b = await signedIn();
    const before = (await codeRows()).length;
    const fields = await consent(b, base());
    for (const organization_id of [String(strangerOrgId), String(fixture.organizationId), '999999', `0${ownOrgId}`]) {
      const res = await b.post('/oauth/authorize', { ...fields, organization_id, decision: 'approve' });
      expect(res.headers.location).toBeUndefined();
      expect([400, 403]).toContain(res.statusCode);
    }
    expectErrorPage(await b.post('/oauth/authorize', { ...fields, organization_id: String(strangerOrgId), decision: 'approve' }), 403);
    expect(await codeRows()).toHaveLength(before);
  });

  it('refuses a missing or wrong CSRF token with 403 and no redirect (AZ-8)', async () => {
    const b = await signedIn();
    const before = (await codeRows()).length;
    const { csrf_token, ...fields } = await consent(b, base());
    const approve = { ...fields, organization_id: String(ownOrgId), decision: 'approve' };
    expectErrorPage(await b.post('/oauth/authorize', approve), 403);
    expectErrorPage(await b.post('/oauth/authorize', { ...approve, csrf_token: `${csrf_token}x` }), 403);
    // Another session's token is no good either.
    const other = await signedIn();
    const foreign = (await consent(other, base())).csrf_token ?? '';
    expectErrorPage(await b.post('/oauth/authorize', { ...approve, csrf_token: foreign }), 403);
    // And without a session at all.
    const anonymous = await app.inject({
      method: 'POST',
      url: '/oauth/authorize',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      payload: new URLSearchParams({ ...approve, csrf_token: csrf_token ?? '' }).toString(),
    });
    expectErrorPage(anonymous, 403);
    expect(await codeRows()).toHaveLength(before);
  });

  it('checks everything again on the POST', async () => {
    const b = await signedIn();
    const fields = await consent(b, base());
    const post = (changes: Record<string, string>) => b.post('/oauth/authorize', { ...fields, organization_id: String(ownOrgId), decision: 'approve', ...changes });
    expectErrorPage(await post({ redirect_uri: 'https://evil.example.com/cb' }));
    expectErrorPage(await post({ client_id: disabledApp.client_id }));
    expectRedirectError(await post({ scope: 'contacts.read admin' }), 'invalid_scope', STATE);
    expectRedirectError(await post({ state: 'short' }), 'invalid_request', 'short');
    expectRedirectError(await post({ client_id: pkceApp.client_id }), 'invalid_request', STATE);
    expectRedirectError(await post({ code_challenge: CHALLENGE, code_challenge_method: 'plain' }), 'invalid_request', STATE);
    expectRedirectError(await b.post('/oauth/authorize', { ...fields, organization_id: String(ownOrgId), decision: 'approve', scope: ['contacts.read', 'tasks.read'] }), 'invalid_request', STATE);
    expectErrorPage(await post({ decision: 'maybe' }));
  });
});

describe(`malformed input on ${BACKEND}`, () => {
  it('answers malformed authorization requests with a 4xx page or a client redirect, never a 5xx (R-7)', async () => {
    const b = await signedIn();
    const id = fixture.publicApp.client_id;
    const urls = [
      '/oauth/authorize?client_id=%00',
      `/oauth/authorize?client_id=${id}%00`,
      '/oauth/authorize?client_id=%FF%FE',
      `/oauth/authorize?client_id=${id}&redirect_uri=${encodeURIComponent(REDIRECT)}%00`,
      `/oauth/authorize?client_id=${id}&redirect_uri=${encodeURIComponent(REDIRECT)}&response_type=code&scope=contacts.read&state=${'s'.repeat(20)}%00`,
      `/oauth/authorize?client_id[]=${id}`,
      `/oauth/authorize?__proto__[x]=1&constructor=1&client_id=${id}`,
      `/oauth/authorize?client_id=${'x'.repeat(5000)}`,
      '/oauth/authorize',
    ];
    for (const url of urls) {
      const res = await b.get(url);
      expect(res.statusCode, url).toBeGreaterThanOrEqual(300);
      expect(res.statusCode, url).toBeLessThan(500);
    }
    const bodies = ['client_id=%00', 'email=%00&password=x', 'organization_id=1e3', `client_id=${id}&redirect_uri=%FF`];
    for (const payload of bodies) {
      for (const url of ['/oauth/authorize', '/login', '/signup', '/logout']) {
        const res = await b.post(url, Object.fromEntries(new URLSearchParams(payload)));
        expect(res.statusCode, `${url} ${payload}`).toBeLessThan(500);
      }
    }
    for (const [type, payload] of [['application/json', '{"email":{"a":1}}'], ['text/plain', 'x'], ['application/json', '{']] as const) {
      const res = await app.inject({ method: 'POST', url: '/login', headers: { 'content-type': type }, payload });
      expect(res.statusCode, `${type} ${payload}`).toBeGreaterThanOrEqual(400);
      expect(res.statusCode, `${type} ${payload}`).toBeLessThan(500);
    }
  });
});
