/**
 * Single sign-on through an organization's own OpenID provider (issue 25), end to end on both
 * databases: node-oidc-provider as the organization's IdP (test/helpers/upstream-oidc.ts), a
 * real DNS server holding the domains' TXT records, orgauth listening on a loopback port, and a
 * cookie-keeping Browser going through the email-first login page, the upstream's sign-in and
 * orgauth's callback. Downstream, openid-client is a third-party application whose user signs in
 * through their company.
 *
 * What must hold: a verified domain routes its addresses to the organization's provider; every
 * protocol check (state, browser binding, PKCE, nonce, RFC 9207 iss, expiry, the provider's
 * error) fails closed with an error page and no session; nobody takes over a local account by
 * asserting its email; pending domains, JIT off, removed members and disabled connections sign
 * nobody in; the provider being unreachable, or on a network the guarded client refuses, is a
 * 502 page.
 */
import { once } from 'node:events';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { LightMyRequestResponse } from 'fastify';
import * as client from 'openid-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { removeMember } from '../../src/accounts/organizations.js';
import { hashPassword } from '../../src/accounts/passwords.js';
import { createUser, setPassword } from '../../src/accounts/users.js';
import { sha256Hex } from '../../src/lib/crypto.js';
import { createApplication } from '../../src/oauth/models/applications.js';
import { createConnection, updateConnection } from '../../src/sso/connections.js';
import { REFUSAL_MESSAGES } from '../../src/sso/identities.js';
import { buildApp } from '../../src/app.js';
import { parseConfig } from '../../src/config.js';
import { createLogger } from '../../src/logger.js';
import { Browser, csrfTokenIn } from '../accounts/browser.js';
import { BACKEND } from '../helpers/db.js';
import { createOrgFixture } from '../helpers/oauth.js';
import { authorizationRequest, hiddenFields, RP_REDIRECT } from '../helpers/oidc-world.js';
import { freePort } from '../helpers/process.js';
import {
  auditEvents,
  pageText,
  pathOf,
  postEmail,
  signInThroughSso,
  type SsoOrganization,
  ssoOrganization,
  type SsoWorld,
  startAt,
  startSsoWorld,
  unescapeHtml,
  upstreamCallback,
} from '../helpers/sso-world.js';

const PASSWORD = 'a local password 123';

let world: SsoWorld;
/** Corp Inc: corp.example verified, one active connection, JIT with the role member. */
let corp: SsoOrganization;
let n = 0;

beforeAll(async () => {
  world = await startSsoWorld();
  corp = await ssoOrganization(world, { domain: 'corp.example', name: 'Corp Inc' });
}, 60_000);
afterAll(async () => {
  await world?.close();
});

const db = () => world.db;
/** A browser of its own address (the sign-in throttle counts per address). */
const newBrowser = () => new Browser(world.app, `10.25.${Math.floor(++n / 250)}.${(n % 250) + 1}`);

/** An upstream account `login` with the address login@domain (email_verified unless said otherwise). */
function upstreamAccount(login: string, domain: string, claims: { email_verified?: boolean; email?: string } = {}) {
  const email = claims.email ?? `${login}@${domain}`;
  world.upstream.setAccount(login, { sub: `${login}-sub`, email, email_verified: claims.email_verified ?? true, name: `${login[0]!.toUpperCase()}${login.slice(1)} Upstream` });
  return email;
}

const userByEmail = (email: string) => db().selectFrom('users').selectAll().where('email', '=', email).executeTakeFirst();
const identitiesOf = (userId: number) => db().selectFrom('sso_identities').selectAll().where('user_id', '=', userId).orderBy('id').execute();
const identitiesWithSubject = (subject: string) => db().selectFrom('sso_identities').selectAll().where('subject', '=', subject).execute();
const sessionsOf = (userId: number) => db().selectFrom('sessions').select(['amr', 'sso_connection_id', 'current_organization_id']).where('user_id', '=', userId).orderBy('id').execute();
const membership = (organizationId: number, userId: number) =>
  db().selectFrom('memberships').select(['role']).where('organization_id', '=', organizationId).where('user_id', '=', userId).executeTakeFirst();

/** The text of a page's <main>. */
const mainText = (res: LightMyRequestResponse) => pageText(/<main>([\s\S]*)<\/main>/.exec(res.body)?.[1] ?? res.body);

/** The message page of a failed SSO sign-in, as a whole. */
function expectFailurePage(res: LightMyRequestResponse, status: number, message: string, title = 'Company sign-in failed') {
  expect(res.statusCode, res.body).toBe(status);
  expect(res.headers['content-type']).toBe('text/html; charset=utf-8');
  expect(res.body).toContain(`<title>${title} · orgauth</title>`);
  expect(mainText(res)).toBe(`${title} ${message} Sign in again`);
  expect(res.body).toContain('<a href="/login">Sign in again</a>');
}

function expectNoSession(res: LightMyRequestResponse, browser: Browser) {
  expect(res.cookies.find((c) => c.name === 'orgauth_session' && c.value !== '')).toBeUndefined();
  expect(browser.cookies.has('orgauth_session')).toBe(false);
}

/** The state of the sign-in orgauth's redirect to the upstream started. */
const stateOf = (leaving: LightMyRequestResponse) => new URL(leaving.headers.location as string).searchParams.get('state')!;

/** `path` with its query parameter `name` set to `value`. */
function withParam(path: string, name: string, value: string): string {
  const url = new URL(path, world.issuer);
  url.searchParams.set(name, value);
  return `${url.pathname}${url.search}`;
}

const COULD_NOT_COMPLETE = 'Your company sign-in could not be completed. Start again, or ask your administrator.';
// Unknown, used, expired or another browser's: one answer (a page must not tell them apart).
const EXPIRED_OR_USED = 'This sign-in has expired, was finished already, or was started in another browser. Start again here.';
const OTHER_BROWSER = EXPIRED_OR_USED;

describe(`single sign-on through an organization's OpenID provider on ${BACKEND}`, () => {
  it('routes a verified domain to the provider, provisions the user just in time, and signs in again through the same link', async () => {
    const email = upstreamAccount('alice', 'corp.example');
    expect(email).toBe('alice@corp.example');
    const browser = newBrowser();

    // The email step: straight to the provider, with PKCE (S256), state, nonce and the address as login_hint.
    const leaving = await postEmail(browser, email);
    expect(leaving.statusCode, leaving.body).toBe(303);
    const authorize = new URL(leaving.headers.location as string);
    expect(`${authorize.origin}${authorize.pathname}`).toBe(`${world.upstream.issuer}/auth`);
    expect(Object.fromEntries(authorize.searchParams)).toEqual({
      client_id: expect.stringMatching(/^orgauth-/),
      redirect_uri: `${world.issuer}/sso/${corp.connectionId}/oidc/callback`,
      scope: 'openid email profile',
      response_type: 'code',
      code_challenge: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/),
      code_challenge_method: 'S256',
      state: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/),
      nonce: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/),
      login_hint: email,
    });
    // Nothing of the account exists before the provider vouched for it.
    expect(await userByEmail(email)).toBeUndefined();

    const callback = await upstreamCallback(world, leaving, 'alice');
    expect(callback).toMatch(new RegExp(`^/sso/${corp.connectionId}/oidc/callback\\?code=[^&]+&state=${authorize.searchParams.get('state')}&iss=`));
    const back = await browser.get(callback);
    expect(back.statusCode, back.body).toBe(303);
    expect(back.headers.location).toBe('/dashboard');
    expect(browser.cookies.has('orgauth_session')).toBe(true);

    const user = (await userByEmail(email))!;
    expect(user).toMatchObject({ email, name: 'Alice Upstream', password_hash: null });
    expect(user.email_verified_at).toBeInstanceOf(Date);
    expect(await membership(corp.organizationId, user.id)).toEqual({ role: 'member' });
    const [link, ...more] = await identitiesOf(user.id);
    expect(more).toEqual([]);
    expect(link).toMatchObject({ connection_id: corp.connectionId, issuer: world.upstream.issuer, subject_format: '', subject: 'alice-sub', email });
    expect(await sessionsOf(user.id)).toEqual([{ amr: ['fed', 'pwd', 'mfa'], sso_connection_id: corp.connectionId, current_organization_id: corp.organizationId }]);
    expect((await browser.get('/dashboard')).statusCode).toBe(200);
    expect((await auditEvents(world, corp.organizationId, 'sso.user_provisioned')).map((e) => e.details)).toContainEqual({ connection_id: corp.connectionId, user_id: user.id, role: 'member' });

    // Again, from another browser, with one factor upstream: the same link, the same user.
    const laptop = newBrowser();
    const again = await signInThroughSso(world, laptop, email, 'alice', { amr: ['pwd'] });
    expect(again.statusCode, again.body).toBe(303);
    expect(again.headers.location).toBe('/dashboard');
    const [relinked, ...none] = await identitiesOf(user.id);
    expect(none).toEqual([]);
    expect(relinked!.id).toBe(link!.id);
    expect(relinked!.last_used_at.getTime()).toBeGreaterThan(link!.last_used_at.getTime());
    expect(await db().selectFrom('users').select('id').where('email', '=', email).execute()).toEqual([{ id: user.id }]);
    expect((await sessionsOf(user.id)).map((s) => s.amr)).toEqual([['fed', 'pwd', 'mfa'], ['fed', 'pwd']]);
    expect((await laptop.get('/dashboard')).statusCode).toBe(200);
  });

  it('asks the provider to authenticate again when the application asked for a fresh sign-in (prompt=login): prompt=login, max_age=0', async () => {
    const email = upstreamAccount('fresh', 'corp.example');
    const browser = newBrowser();
    const page = await browser.get('/login?prompt=login&return_to=%2Fdashboard');
    expect(page.body).toContain('<input type="hidden" name="prompt" value="login">');
    const csrf_token = await browser.csrf('/login?prompt=login');
    const leaving = await browser.post('/login', { csrf_token, email, return_to: '/dashboard', prompt: 'login' });
    expect(leaving.statusCode, leaving.body).toBe(303);
    const authorize = new URL(leaving.headers.location as string);
    expect([authorize.searchParams.get('prompt'), authorize.searchParams.get('max_age')]).toEqual(['login', '0']);
    // Without it, the provider may answer from its own session.
    const plain = new URL((await postEmail(newBrowser(), email)).headers.location as string);
    expect([plain.searchParams.get('prompt'), plain.searchParams.get('max_age')]).toEqual([null, null]);
  });

  it('signs a third-party application user in through their company: the consent page offers the SSO organization, the ID token says fed', async () => {
    const email = upstreamAccount('dave', 'corp.example');
    const vendor = await createOrgFixture(db());
    const rp = await createApplication(db(), { organizationId: vendor.organizationId, type: 'public', name: 'Vendor App', redirectUris: [RP_REDIRECT], scopes: 'contacts.read' });
    const oidc = await client.discovery(new URL(world.issuer), rp.client_id, rp.client_secret, undefined, { execute: [client.allowInsecureRequests] });
    const { url, checks } = await authorizationRequest(oidc, 'openid email profile contacts.read');
    const browser = newBrowser();

    const toLogin = await browser.get(pathOf(world, url));
    expect(toLogin.statusCode).toBe(303);
    const loginPage = await browser.get(toLogin.headers.location as string);
    expect(loginPage.statusCode).toBe(200);
    // Email first: no password field yet.
    expect(loginPage.body).toContain('<input type="email" name="email"');
    expect(loginPage.body).not.toContain('name="password"');
    expect(loginPage.body).toContain('<button type="submit">Continue</button>');
    const fields = hiddenFields(loginPage.body);
    const leaving = await browser.post('/login', { csrf_token: fields.csrf_token!, return_to: fields.return_to!, email });
    const back = await browser.get(await upstreamCallback(world, leaving, 'dave'));
    expect(back.statusCode, back.body).toBe(303);
    expect(back.headers.location).toMatch(/^\/oauth\/authorize\?/);

    const consent = await browser.get(back.headers.location as string);
    expect(consent.statusCode, consent.body).toBe(200);
    expect(consent.body).toContain('<h1>Authorize Vendor App</h1>');
    expect(consent.body).toContain('signed in as Dave Upstream (dave@corp.example)');
    // The one organization dave belongs to, the company's, offered and chosen already.
    const organizations = [...consent.body.matchAll(/<div class="organization" data-organization-id="(\d+)">/g)].map((m) => Number(m[1]));
    expect(organizations).toEqual([corp.organizationId]);
    expect(consent.body).toContain(`<input type="radio" name="organization_id" value="${corp.organizationId}" required checked> Corp Inc (member)`);

    const approved = await browser.post('/oauth/authorize', { ...hiddenFields(consent.body), organization_id: String(corp.organizationId), decision: 'approve' });
    expect(approved.statusCode, approved.body).toBe(303);
    const tokens = await client.authorizationCodeGrant(oidc, new URL(approved.headers.location as string), { ...checks, idTokenExpected: true });
    const user = (await userByEmail(email))!;
    expect(tokens).toMatchObject({ organization_id: corp.organizationId, organization_name: 'Corp Inc', scope: 'openid profile email contacts.read' });
    expect(tokens.claims()).toMatchObject({
      iss: world.issuer,
      sub: String(user.id),
      aud: rp.client_id,
      email,
      email_verified: true,
      name: 'Dave Upstream',
      amr: ['fed', 'pwd', 'mfa'],
      organization_id: corp.organizationId,
      organization_name: 'Corp Inc',
      nonce: checks.expectedNonce,
    });
  });
});

describe(`upstream protocol failures fail closed on ${BACKEND}`, () => {
  it('a tampered state: the error page, no session, no user', async () => {
    const email = upstreamAccount('erin', 'corp.example');
    const browser = newBrowser();
    const callback = await upstreamCallback(world, await postEmail(browser, email), 'erin');
    const res = await browser.get(withParam(callback, 'state', 'x'.repeat(43)));
    expectFailurePage(res, 400, EXPIRED_OR_USED);
    expectNoSession(res, browser);
    expect(await userByEmail(email)).toBeUndefined();
    // Without any state at all, too.
    const stateless = new URL(callback, world.issuer);
    stateless.searchParams.delete('state');
    expectFailurePage(await browser.get(`${stateless.pathname}${stateless.search}`), 400, 'This sign-in link is not valid. Start again.');
    expect(await userByEmail(email)).toBeUndefined();
  });

  it('a callback replayed is refused the second time, also in the browser that used it', async () => {
    const email = upstreamAccount('fern', 'corp.example');
    const browser = newBrowser();
    const callback = await upstreamCallback(world, await postEmail(browser, email), 'fern');
    expect((await browser.get(callback)).statusCode).toBe(303);
    const user = (await userByEmail(email))!;
    expect(await sessionsOf(user.id)).toHaveLength(1);

    const replayed = await browser.get(callback);
    expectFailurePage(replayed, 400, EXPIRED_OR_USED);
    const elsewhere = newBrowser();
    await elsewhere.get('/login');
    const stolen = await elsewhere.get(callback);
    expectFailurePage(stolen, 400, EXPIRED_OR_USED);
    expectNoSession(stolen, elsewhere);
    expect(await sessionsOf(user.id)).toHaveLength(1);
  });

  it('a callback opened in another browser (another cookie jar) is refused, and does not spend the sign-in', async () => {
    const email = upstreamAccount('gwen', 'corp.example');
    const started = newBrowser();
    const callback = await upstreamCallback(world, await postEmail(started, email), 'gwen');

    const other = newBrowser();
    await other.get('/login'); // a pre-session of its own
    const res = await other.get(callback);
    expectFailurePage(res, 400, OTHER_BROWSER);
    expectNoSession(res, other);
    // Another browser holding a copy of the callback neither finishes the sign-in nor uses it up.
    const finished = await started.get(callback);
    expect(finished.statusCode).toBe(303);
    expect((await userByEmail(email))?.email).toBe(email);

    // A browser sending no cookie at all: the same refusal.
    const email2 = upstreamAccount('gwen2', 'corp.example');
    const again = await upstreamCallback(world, await postEmail(newBrowser(), email2), 'gwen2');
    const bare = new Browser(world.app, '10.25.255.1');
    const cookieless = await bare.get(again);
    expectFailurePage(cookieless, 400, OTHER_BROWSER);
    expectNoSession(cookieless, bare);
    expect(await userByEmail(email2)).toBeUndefined();
  });

  it('the provider answering access_denied (the user cancelled): the error page, audited', async () => {
    const email = upstreamAccount('hana', 'corp.example');
    const browser = newBrowser();
    const leaving = await postEmail(browser, email);
    const callback = pathOf(world, await world.upstream.denySignIn(leaving.headers.location as string));
    expect(new URL(callback, world.issuer).searchParams.get('error')).toBe('access_denied');
    const before = (await auditEvents(world, corp.organizationId, 'sso.sign_in_failed')).length;
    const res = await browser.get(callback);
    expectFailurePage(res, 400, COULD_NOT_COMPLETE);
    expectNoSession(res, browser);
    expect(await userByEmail(email)).toBeUndefined();
    const failures = await auditEvents(world, corp.organizationId, 'sso.sign_in_failed');
    expect(failures).toHaveLength(before + 1);
    expect(failures.at(-1)!.details).toEqual({ connection_id: corp.connectionId, reason: 'token exchange failed: AuthorizationResponseError: authorization response from the server is an error (access_denied: End-User aborted interaction)' });
  });

  it("the code of one sign-in delivered with the state of another (PKCE), and a nonce that is not this sign-in's: refused, audited", async () => {
    const email = upstreamAccount('iris', 'corp.example');
    const browser = newBrowser();
    const first = await postEmail(browser, email);
    const second = await postEmail(browser, email);
    const firstCallback = await upstreamCallback(world, first, 'iris');
    // The first sign-in's code under the second's state: that state's verifier and nonce do not fit the code.
    const swapped = withParam(firstCallback, 'state', stateOf(second));
    const before = (await auditEvents(world, corp.organizationId, 'sso.sign_in_failed')).length;
    const res = await browser.get(swapped);
    expectFailurePage(res, 400, COULD_NOT_COMPLETE);
    expectNoSession(res, browser);

    // A sign-in whose remembered nonce is not the one sent (tampered at rest): the ID token's nonce does not match.
    const third = await postEmail(browser, email);
    const tampered = await db().updateTable('sso_sign_ins').set({ oidc_nonce: 'not-the-nonce-that-was-sent' }).where('handle_hash', '=', sha256Hex(stateOf(third))).executeTakeFirst();
    expect(Number(tampered.numUpdatedRows)).toBe(1);
    const nonceRes = await browser.get(await upstreamCallback(world, third, 'iris'));
    expectFailurePage(nonceRes, 400, COULD_NOT_COMPLETE);
    expectNoSession(nonceRes, browser);

    expect(await userByEmail(email)).toBeUndefined();
    const reasons = (await auditEvents(world, corp.organizationId, 'sso.sign_in_failed')).slice(before).map((e) => (e.details as { reason: string }).reason);
    expect(reasons).toEqual([
      'token exchange failed: ResponseBodyError: server responded with an error in the response body (invalid_grant: grant request is invalid)',
      'token exchange failed: ClientError: unexpected JWT claim value encountered <- OperationProcessingError: unexpected ID Token "nonce" claim value',
    ]);
  });

  it('an iss in the callback that is not the provider (RFC 9207 mix-up): refused, audited', async () => {
    const email = upstreamAccount('jade', 'corp.example');
    const browser = newBrowser();
    const callback = await upstreamCallback(world, await postEmail(browser, email), 'jade');
    expect(new URL(callback, world.issuer).searchParams.get('iss')).toBe(world.upstream.issuer);
    const before = (await auditEvents(world, corp.organizationId, 'sso.sign_in_failed')).length;
    const res = await browser.get(withParam(callback, 'iss', 'https://attacker.example'));
    expectFailurePage(res, 400, COULD_NOT_COMPLETE);
    expectNoSession(res, browser);
    expect(await userByEmail(email)).toBeUndefined();
    const failures = (await auditEvents(world, corp.organizationId, 'sso.sign_in_failed')).slice(before);
    expect(failures.map((e) => e.details)).toEqual([{ connection_id: corp.connectionId, reason: 'token exchange failed: ClientError: invalid response encountered <- OperationProcessingError: unexpected "iss" (issuer) response parameter value' }]);
  });

  it('a sign-in that expired while the browser was at the provider: refused', async () => {
    const email = upstreamAccount('kira', 'corp.example');
    const browser = newBrowser();
    const leaving = await postEmail(browser, email);
    const callback = await upstreamCallback(world, leaving, 'kira');
    await db().updateTable('sso_sign_ins').set({ expires_at: new Date(Date.now() - 1000) }).where('handle_hash', '=', sha256Hex(stateOf(leaving))).execute();
    const res = await browser.get(callback);
    expectFailurePage(res, 400, EXPIRED_OR_USED);
    expectNoSession(res, browser);
    expect(await userByEmail(email)).toBeUndefined();
  });
});

describe(`no account taken over by an asserted email on ${BACKEND}`, () => {
  /** Beta: beta.example claimed but not proved; an active connection all the same. */
  let beta: SsoOrganization;
  beforeAll(async () => {
    beta = await ssoOrganization(world, { domain: 'beta.example', verify: false, name: 'Beta Ltd' });
  });

  /** Follows /sso/link's sign-in link with the password, and confirms. */
  async function proveAndConfirm(browser: Browser, linkPath: string, email: string) {
    const ask = await browser.get(linkPath);
    expect(ask.statusCode, ask.body).toBe(200);
    const href = unescapeHtml(/<a class="button" href="([^"]+)">/.exec(ask.body)![1]!);
    const login = await browser.get(href);
    expect(login.statusCode).toBe(200);
    expect(login.body).toContain('name="password"');
    expect(login.body).toContain(`value="${email}"`);
    const fields = hiddenFields(login.body);
    expect(fields.return_to).toBe(linkPath);
    const signedIn = await browser.post('/login', { csrf_token: fields.csrf_token!, return_to: fields.return_to!, email, password: PASSWORD });
    expect(signedIn.statusCode, signedIn.body).toBe(303);
    expect(signedIn.headers.location).toBe(linkPath);
    const confirm = await browser.get(linkPath);
    expect(confirm.statusCode, confirm.body).toBe(200);
    return confirm;
  }

  it('(a) a domain the organization did not verify: the provider’s word is not enough; the owner proves the account, then the link is made', async () => {
    const bob = await createUser(db(), { email: 'bob@beta.example', password: PASSWORD, name: 'Bob Local' });
    upstreamAccount('bob', 'beta.example');
    const browser = newBrowser();
    // A pending domain routes nobody: the email step goes on to the password.
    const step = await postEmail(browser, 'bob@beta.example');
    expect(step.statusCode).toBe(200);
    expect(step.body).toContain('name="password"');

    const res = await browser.get(await upstreamCallback(world, await startAt(browser, beta.connectionId), 'bob'));
    expect(res.statusCode, res.body).toBe(303);
    const linkPath = res.headers.location as string;
    expect(linkPath).toMatch(/^\/sso\/link\?handle=[A-Za-z0-9_-]{43}$/);
    expectNoSession(res, browser);
    expect(await identitiesOf(bob.id)).toEqual([]);
    expect(await sessionsOf(bob.id)).toEqual([]);
    expect(await membership(beta.organizationId, bob.id)).toBeUndefined();
    expect((await auditEvents(world, beta.organizationId, 'sso.link_needs_proof')).map((e) => e.details)).toEqual([
      { connection_id: beta.connectionId, user_id: bob.id, reason: 'domain_not_verified' },
    ]);

    const ask = await browser.get(linkPath);
    expect(ask.statusCode).toBe(200);
    expect(mainText(ask)).toBe(
      'Connect your company sign-in An account with the address bob@beta.example exists here already. Before your company sign-in (Corp IdP) can be connected to it, show that it is yours: sign in to it once with its password or a passkey. Sign in to bob@beta.example',
    );
    const confirm = await proveAndConfirm(browser, linkPath, 'bob@beta.example');
    expect(mainText(confirm)).toBe(
      'Connect your company sign-in Your company’s identity provider (Corp IdP) signed you in as bob@beta.example, the address of this account. Connect them, so that you can sign in through your company from now on? Connect and continue Not now',
    );
    // Signed in with the password, not linked yet.
    expect(await identitiesOf(bob.id)).toEqual([]);
    expect((await sessionsOf(bob.id)).map((s) => s.amr)).toEqual([['pwd']]);

    const linked = await browser.post('/sso/link', { csrf_token: csrfTokenIn(confirm.body), handle: hiddenFields(confirm.body).handle! });
    expect(linked.statusCode, linked.body).toBe(303);
    expect(linked.headers.location).toBe('/dashboard');
    expect(await identitiesOf(bob.id)).toMatchObject([{ connection_id: beta.connectionId, issuer: world.upstream.issuer, subject: 'bob-sub', email: 'bob@beta.example' }]);
    expect(await membership(beta.organizationId, bob.id)).toEqual({ role: 'member' });
    expect(await sessionsOf(bob.id)).toEqual([{ amr: ['fed', 'pwd', 'mfa'], sso_connection_id: beta.connectionId, current_organization_id: beta.organizationId }]);
    expect((await auditEvents(world, beta.organizationId, 'sso.identity_linked')).map((e) => e.details)).toEqual([
      { connection_id: beta.connectionId, user_id: bob.id, how: 'proof', added_as: 'member' },
    ]);

    // From now on the link signs bob in, with no proof asked.
    const later = newBrowser();
    const again = await later.get(await upstreamCallback(world, await startAt(later, beta.connectionId), 'bob'));
    expect(again.statusCode).toBe(303);
    expect(again.headers.location).toBe('/dashboard');
  });

  it('(b) a verified domain, but the provider does not say the address is verified: proof needed too', async () => {
    const cleo = await createUser(db(), { email: 'cleo@corp.example', password: PASSWORD });
    upstreamAccount('cleo', 'corp.example', { email_verified: false });
    const browser = newBrowser();
    const res = await signInThroughSso(world, browser, 'cleo@corp.example', 'cleo');
    expect(res.statusCode, res.body).toBe(303);
    expect(res.headers.location).toMatch(/^\/sso\/link\?handle=/);
    expectNoSession(res, browser);
    expect(await identitiesOf(cleo.id)).toEqual([]);
    expect(await membership(corp.organizationId, cleo.id)).toBeUndefined();
    expect((await auditEvents(world, corp.organizationId, 'sso.link_needs_proof')).map((e) => e.details)).toContainEqual({
      connection_id: corp.connectionId,
      user_id: cleo.id,
      reason: 'email_not_verified_by_provider',
    });
  });

  it('(c) a verified domain and an address the provider verified: linked at once, and made a member', async () => {
    const dora = await createUser(db(), { email: 'dora@corp.example', password: PASSWORD });
    upstreamAccount('dora', 'corp.example');
    const browser = newBrowser();
    const res = await signInThroughSso(world, browser, 'dora@corp.example', 'dora');
    expect(res.statusCode, res.body).toBe(303);
    expect(res.headers.location).toBe('/dashboard');
    expect(await identitiesOf(dora.id)).toMatchObject([{ connection_id: corp.connectionId, subject: 'dora-sub' }]);
    expect(await membership(corp.organizationId, dora.id)).toEqual({ role: 'member' });
    expect((await sessionsOf(dora.id)).map((s) => s.sso_connection_id)).toEqual([corp.connectionId]);
    expect((await auditEvents(world, corp.organizationId, 'sso.identity_linked')).map((e) => e.details)).toContainEqual({
      connection_id: corp.connectionId,
      user_id: dora.id,
      how: 'verified_domain',
      added_as: 'member',
    });
  });

  it('(d) another browser can finish neither a link waiting for proof nor a direct link', async () => {
    // Waiting for proof (as in (a)): another browser that knows the handle, even signed in as the account, gets nowhere.
    const ezra = await createUser(db(), { email: 'ezra@beta.example', password: PASSWORD });
    upstreamAccount('ezra', 'beta.example');
    const victim = newBrowser();
    const parked = await victim.get(await upstreamCallback(world, await startAt(victim, beta.connectionId), 'ezra'));
    const linkPath = parked.headers.location as string;
    expect(linkPath).toMatch(/^\/sso\/link\?handle=/);

    const other = newBrowser();
    expectFailurePage(await other.get(linkPath), 400, EXPIRED_OR_USED);
    expect((await other.login('ezra@beta.example', PASSWORD)).statusCode).toBe(303);
    expectFailurePage(await other.get(linkPath), 400, EXPIRED_OR_USED);
    const dashboard = await other.get('/dashboard/account');
    const csrf_token = csrfTokenIn(dashboard.body);
    expectFailurePage(await other.post('/sso/link', { csrf_token, handle: new URL(linkPath, world.issuer).searchParams.get('handle')! }), 400, EXPIRED_OR_USED);
    expect(await identitiesOf(ezra.id)).toEqual([]);
    expect(await membership(beta.organizationId, ezra.id)).toBeUndefined();

    // A direct link (as in (c)): the callback in another browser is refused, nothing linked.
    const fay = await createUser(db(), { email: 'fay@corp.example', password: PASSWORD });
    upstreamAccount('fay', 'corp.example');
    const starter = newBrowser();
    const callback = await upstreamCallback(world, await postEmail(starter, 'fay@corp.example'), 'fay');
    const thief = newBrowser();
    await thief.get('/login');
    const res = await thief.get(callback);
    expectFailurePage(res, 400, OTHER_BROWSER);
    expectNoSession(res, thief);
    expect(await identitiesOf(fay.id)).toEqual([]);
    expect(await sessionsOf(fay.id)).toEqual([]);
  });
});

describe(`who is refused on ${BACKEND}`, () => {
  it('a pending domain routes nobody, and provisions nobody through the connection', async () => {
    const pending = await ssoOrganization(world, { domain: 'pending.example', verify: false });
    const email = upstreamAccount('ivy', 'pending.example');
    const browser = newBrowser();
    const step = await postEmail(browser, email);
    expect(step.statusCode).toBe(200);
    expect(step.body).toContain('<input type="password" name="password"');
    expect(step.body).toContain(`value="${email}"`);
    expect(step.headers.location).toBeUndefined();

    const res = await browser.get(await upstreamCallback(world, await startAt(browser, pending.connectionId), 'ivy'));
    expectFailurePage(res, 403, REFUSAL_MESSAGES.email_outside_verified_domains, 'Company sign-in refused');
    expectNoSession(res, browser);
    expect(await userByEmail(email)).toBeUndefined();
    expect((await auditEvents(world, pending.organizationId, 'sso.sign_in_refused')).map((e) => e.details)).toEqual([
      { connection_id: pending.connectionId, reason: 'email_outside_verified_domains', subject: 'ivy-sub', email },
    ]);
  });

  it('JIT off: someone unknown is refused and not created', async () => {
    const nojit = await ssoOrganization(world, { domain: 'nojit.example', jit: false });
    const email = upstreamAccount('jack', 'nojit.example');
    const browser = newBrowser();
    const res = await signInThroughSso(world, browser, email, 'jack');
    expectFailurePage(res, 403, REFUSAL_MESSAGES.jit_off, 'Company sign-in refused');
    expectNoSession(res, browser);
    expect(await userByEmail(email)).toBeUndefined();
    expect((await auditEvents(world, nojit.organizationId, 'sso.sign_in_refused')).map((e) => (e.details as { reason: string }).reason)).toEqual(['jit_off']);
  });

  it('a removed member is refused, and JIT does not add them back', async () => {
    const email = upstreamAccount('kim', 'corp.example');
    expect((await signInThroughSso(world, newBrowser(), email, 'kim')).statusCode).toBe(303);
    const kim = (await userByEmail(email))!;
    await removeMember(db(), { organizationId: corp.organizationId, userId: kim.id });

    const browser = newBrowser();
    const res = await signInThroughSso(world, browser, email, 'kim');
    expectFailurePage(res, 403, REFUSAL_MESSAGES.not_a_member, 'Company sign-in refused');
    expectNoSession(res, browser);
    expect(await membership(corp.organizationId, kim.id)).toBeUndefined();
    expect(await identitiesOf(kim.id)).toHaveLength(1);
  });

  it('disabling a connection ends its sessions at once, and it starts no sign-in', async () => {
    const off = await ssoOrganization(world, { domain: 'disabled.example' });
    const email = upstreamAccount('liz', 'disabled.example');
    const browser = newBrowser();
    expect((await signInThroughSso(world, browser, email, 'liz')).statusCode).toBe(303);
    expect((await browser.get('/dashboard')).statusCode).toBe(200);
    const liz = (await userByEmail(email))!;
    // A password session of the same user is not the connection's.
    await setPassword(db(), liz.id, await hashPassword(PASSWORD));
    const withPassword = newBrowser();
    expect((await withPassword.login(email, PASSWORD)).statusCode).toBe(303);

    await updateConnection(db(), world.settings, off.organizationId, off.connectionId, { state: 'disabled' });
    const dashboard = await browser.get('/dashboard');
    expect(dashboard.statusCode).toBe(303);
    expect(dashboard.headers.location).toMatch(/^\/login\?/);
    expect((await sessionsOf(liz.id)).map((s) => s.sso_connection_id)).toEqual([null]);
    expect((await withPassword.get('/dashboard')).statusCode).toBe(200);

    const page = await browser.get('/login');
    const start = await browser.post(`/sso/${off.connectionId}/start`, { csrf_token: csrfTokenIn(page.body), return_to: '/dashboard' });
    expectFailurePage(start, 404, 'This company sign-in is not available. Ask your administrator.');
    // Without an active connection the domain routes to the password again.
    const step = await postEmail(newBrowser(), email);
    expect(step.statusCode).toBe(200);
    expect(step.body).toContain('name="password"');
  });
});

describe(`choosing among connections, and providers that cannot be reached, on ${BACKEND}`, () => {
  it('two active connections: the email step shows a chooser with a form for each', async () => {
    const two = await ssoOrganization(world, { domain: 'two.example', connections: 2 });
    const email = upstreamAccount('mia', 'two.example');
    const browser = newBrowser();
    const res = await postEmail(browser, email);
    expect(res.statusCode, res.body).toBe(200);
    expect(res.body).toContain('<title>Choose how to sign in · orgauth</title>');
    const forms = [...res.body.matchAll(/<form method="post" action="([^"]+)">([\s\S]*?)<\/form>/g)];
    expect(forms.map((f) => f[1])).toEqual(two.connectionIds.map((id) => `/sso/${id}/start`));
    expect(forms.map((f) => pageText(f[2]!))).toEqual(['Continue with Corp IdP', 'Continue with Corp IdP 2']);
    expect(mainText(res)).toBe('Choose how to sign in mia@two.example signs in through the organization’s identity provider. Choose one: Continue with Corp IdP Continue with Corp IdP 2 Use another email address');

    // The second one leaves for the provider as that connection's client, and signs mia in through it.
    const fields = hiddenFields(forms[1]![2]!);
    expect(fields).toMatchObject({ return_to: '/dashboard', login_hint: email });
    const leaving = await browser.post(`/sso/${two.connectionIds[1]}/start`, fields);
    expect(new URL(leaving.headers.location as string).searchParams.get('client_id')).toBe(two.clientIds[1]);
    const back = await browser.get(await upstreamCallback(world, leaving, 'mia'));
    expect(back.statusCode).toBe(303);
    const mia = (await userByEmail(email))!;
    expect(await identitiesOf(mia.id)).toMatchObject([{ connection_id: two.connectionIds[1] }]);
  });

  it('a provider that does not answer: the 502 page, audited', async () => {
    const closed = await freePort();
    const down = await ssoOrganization(world, { domain: 'down.example', connections: 0 });
    const connection = await createConnection(db(), world.settings, down.organizationId, {
      protocol: 'oidc',
      name: 'Down IdP',
      issuer: `http://127.0.0.1:${closed}`,
      client_id: 'orgauth',
      client_secret: 'never-used-secret',
    });
    const browser = newBrowser();
    const res = await postEmail(browser, 'nia@down.example');
    expectFailurePage(res, 502, 'Your company’s identity provider could not be reached. Try again in a minute, or ask your administrator.');
    expect(await db().selectFrom('sso_sign_ins').select('id').where('connection_id', '=', connection.id).execute()).toEqual([]);
    expect((await auditEvents(world, down.organizationId, 'sso.provider_unreachable')).map((e) => e.details)).toEqual([
      { connection_id: connection.id, reason: `discovery failed: ClientError: something went wrong <- Error: connect ECONNREFUSED 127.0.0.1:${closed}` },
    ]);
  });

  it('without OUTBOUND_ALLOW_NETWORKS the guarded client refuses a loopback provider: 502, and no request reaches it', async () => {
    // The provider: anything listening on loopback that counts what reaches it.
    let requests = 0;
    const provider = createServer((_req, res) => {
      requests++;
      res.writeHead(404).end();
    });
    provider.listen(0, '127.0.0.1');
    await once(provider, 'listening');
    const guarded = await ssoOrganization(world, { domain: 'guarded.example', connections: 0 });
    const connection = await createConnection(db(), world.settings, guarded.organizationId, {
      protocol: 'oidc',
      name: 'Loopback IdP',
      issuer: `http://127.0.0.1:${(provider.address() as AddressInfo).port}`,
      client_id: 'orgauth',
      client_secret: 'never-used-secret',
    });
    // The app without the allowance, its log kept (warnings up) to read what the audit leaves out.
    const logged: string[] = [];
    const strictEnv = Object.fromEntries(Object.entries({ ...world.env, LOG_LEVEL: 'warn' }).filter(([k]) => k !== 'OUTBOUND_ALLOW_NETWORKS'));
    const strictConfig = parseConfig(strictEnv);
    const strict = await buildApp(strictConfig, { db: db(), logger: createLogger(strictConfig, { write: (line: string) => void logged.push(line) }), listen: world.t.handle.listen });
    try {
      const res = await postEmail(new Browser(strict, '10.25.254.1'), 'omar@guarded.example');
      expectFailurePage(res, 502, 'Your company’s identity provider could not be reached. Try again in a minute, or ask your administrator.');
      expect(requests).toBe(0);
      // The organization's audit log says the address was refused, not what the outbound policy
      // saw (which internal address the name resolved to is not for the organization's admins).
      const reasons = (await auditEvents(world, guarded.organizationId, 'sso.provider_unreachable')).map((e) => e.details);
      expect(reasons).toEqual([
        { connection_id: connection.id, reason: 'discovery failed: ClientError: something went wrong <- OutboundRefusedError: the provider’s address is not one orgauth may reach (private or special-use, plain http, or too slow or large)' },
      ]);
      expect(JSON.stringify(reasons)).not.toContain('special-use address');
      expect(JSON.stringify(reasons)).not.toMatch(/127\.0\.0\.1/);
      // The operator's log still says what the outbound policy saw.
      const warning = logged.map((line) => JSON.parse(line) as { msg: string; connection_id?: number; err?: string }).find((l) => l.msg === 'upstream OpenID provider unusable');
      expect(warning).toMatchObject({ connection_id: connection.id, err: expect.stringContaining('outbound request refused: 127.0.0.1 is a special-use address') });
      // The app that may reach loopback does ask it (and, answered 404, shows the same page).
      expectFailurePage(await postEmail(newBrowser(), 'omar@guarded.example'), 502, 'Your company’s identity provider could not be reached. Try again in a minute, or ask your administrator.');
      expect(requests).toBe(1);
    } finally {
      await strict.close();
      provider.closeAllConnections();
      await new Promise((resolve) => provider.close(resolve));
    }
  });
});
