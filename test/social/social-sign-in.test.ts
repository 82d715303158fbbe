/**
 * Social sign-in (issue 45) through an OpenID provider: node-oidc-provider on loopback stands in
 * for Google (its defaults: email and email_verified at UserInfo only). Driven from the sign-in
 * page's "Continue with Google" form through the provider and back, with the rules that keep a
 * provider's word from becoming a key to someone's account:
 * - a new person signs up (an account, their own organization, the identity linked); a second
 *   sign-in reuses the identity; the session is one factor, `fed`;
 * - an address that belongs to an account is linked only after its password, in the same browser,
 *   and its owner is mailed;
 * - an unverified address makes and matches nothing; an SSO-required domain goes to its company's
 *   sign-in; a disabled connection, another browser's state, or a replayed callback sign nobody in.
 */
import { createHash, randomBytes } from 'node:crypto';
import { decodeJwt } from 'jose';
import { generate } from 'otplib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrganization } from '../../src/accounts/organizations.js';
import { createApplication } from '../../src/oauth/models/applications.js';
import { hashPassword } from '../../src/accounts/passwords.js';
import { createUser, setPassword } from '../../src/accounts/users.js';
import { createOutboundFetch } from '../../src/lib/outbound.js';
import { createSocialConnection, findSocialConnection, MICROSOFT_CONSUMERS_TENANT, socialSettings, updateSocialConnection } from '../../src/social/connections.js';
import { SocialProviders } from '../../src/social/providers.js';
import { linkSocialAfterProof } from '../../src/social/identities.js';
import { UpstreamOidc as UpstreamOidcClient } from '../../src/sso/oidc-upstream.js';
import { Browser, csrfTokenIn } from '../accounts/browser.js';
import { BACKEND } from '../helpers/db.js';
import { auditEvents, pageText, pathOf, type SsoWorld, ssoOrganization, startSsoWorld, unescapeHtml } from '../helpers/sso-world.js';
import { startUpstreamOidc, type UpstreamOidc } from '../helpers/upstream-oidc.js';
import { hiddenIn } from '../helpers/instances.js';
import { type GitHubServer, type GitHubUser, startGitHubServer } from '../helpers/github-server.js';

let world: SsoWorld;
let connectionId: number;
let n = 0;

const login = () => `social-${++n}-${process.pid}`;
let clients = 0;
/** A browser from an address of its own: sign-ups are limited per client address (DO-1), and each test signs up a few. */
const browserAt = (ip = `10.45.${Math.floor(++clients / 250)}.${(clients % 250) + 1}`) => new Browser(world.app, ip);

beforeAll(async () => {
  world = await startSsoWorld();
  const view = await createSocialConnection(world.db, socialSettings(world.config), { provider: 'google', issuer: world.upstream.issuer, client_id: 'orgauth-google', client_secret: 'google-secret-0123456789' });
  world.upstream.registerClient({ client_id: 'orgauth-google', client_secret: 'google-secret-0123456789', redirect_uris: [view.redirect_uri] });
  connectionId = view.id;
});

afterAll(async () => {
  await world?.close();
});

/** "Continue with Google" on the sign-in page: its form, posted. */
async function continueWithGoogle(browser: Browser, returnTo = '/dashboard') {
  const page = await browser.get(`/login?${new URLSearchParams({ return_to: returnTo }).toString()}`);
  expect(page.statusCode).toBe(200);
  const form = new RegExp(`<form method="post" action="/social/${connectionId}/start">[\\s\\S]*?Continue with Google</button>`).exec(page.body);
  expect(form, 'the sign-in page has a Continue with Google button').not.toBeNull();
  return browser.post(`/social/${connectionId}/start`, { csrf_token: csrfTokenIn(form![0]), return_to: returnTo });
}

/** The whole round trip for the provider's account `account`: returns orgauth's answer to the callback. */
async function signInWithGoogle(browser: Browser, account: string, returnTo = '/dashboard') {
  const leaving = await continueWithGoogle(browser, returnTo);
  expect(leaving.statusCode, leaving.body).toBe(303);
  const authorize = new URL(String(leaving.headers.location));
  expect(authorize.origin).toBe(world.upstream.issuer);
  expect(authorize.searchParams.get('code_challenge_method')).toBe('S256');
  expect(authorize.searchParams.get('nonce')).toBeTruthy();
  return browser.get(pathOf(world, await world.upstream.signIn(authorize, account)));
}

/** A new person signed up with Google, on the Account page: their provider account, address, browser and user. */
async function signedUpWithGoogle() {
  const account = login();
  const email = `${account}@gmail.example`;
  world.upstream.setAccount(account, { sub: `google-${account}`, email, email_verified: true });
  const browser = browserAt();
  expect((await signInWithGoogle(browser, account, '/dashboard/account')).statusCode).toBe(303);
  return { account, email, browser, user: (await userByEmail(email))! };
}

const sessionsOf = (userId: number) => world.db.selectFrom('sessions').select(['amr', 'social_connection_id']).where('user_id', '=', userId).execute();
const identitiesOf = (userId: number) => world.db.selectFrom('social_identities').select(['connection_id', 'subject', 'email']).where('user_id', '=', userId).execute();
const userByEmail = (email: string) => world.db.selectFrom('users').select(['id', 'email_verified_at', 'password_hash']).where('email', '=', email).executeTakeFirst();

describe(`social sign-in through an OpenID provider on ${BACKEND}`, () => {
  it('a new person signs up with "Continue with Google": an account, their own organization, the identity; a second sign-in reuses it; amr fed', async () => {
    const account = login();
    const email = `${account}@gmail.example`;
    world.upstream.setAccount(account, { sub: `google-${account}`, email, email_verified: true, name: 'Grace Hopper' });
    const browser = browserAt();
    const back = await signInWithGoogle(browser, account, '/dashboard');
    expect(back.statusCode, back.body).toBe(303);
    expect(back.headers.location).toBe('/dashboard');
    const user = await userByEmail(email);
    expect(user?.email_verified_at).not.toBeNull();
    expect(user?.password_hash).toBeNull();
    expect(await identitiesOf(user!.id)).toEqual([{ connection_id: connectionId, subject: `google-${account}`, email }]);
    const orgs = await world.db.selectFrom('memberships').innerJoin('organizations', 'organizations.id', 'memberships.organization_id').select(['organizations.name', 'memberships.role']).where('user_id', '=', user!.id).execute();
    expect(orgs).toEqual([{ name: 'Grace Hopper’s organization', role: 'owner' }]);
    expect(await sessionsOf(user!.id)).toEqual([{ amr: ['fed'], social_connection_id: connectionId }]);
    expect((await browser.get('/dashboard')).statusCode).toBe(200);

    // Again, from another browser: the same account, no second one.
    const again = await signInWithGoogle(browserAt(), account);
    expect(again.statusCode, again.body).toBe(303);
    expect((await world.db.selectFrom('users').select('id').where('email', '=', email).execute()).length).toBe(1);
    expect((await sessionsOf(user!.id)).length).toBe(2);
  });

  it('from an application’s authorization request: the sign-in page, Google, back to the consent page; the ID token says amr fed', async () => {
    const developer = await createUser(world.db, { email: `dev-${login()}@example.com`, password: 'developer password 1' });
    const devOrg = await createOrganization(world.db, { name: 'Developer', ownerUserId: developer.id });
    const app = await createApplication(world.db, { organizationId: devOrg.id, type: 'public', name: 'Third Party', redirectUris: ['https://app.example.com/cb'], scopes: 'contacts.read' });
    const verifier = randomBytes(32).toString('base64url');
    const authorize = `/oauth/authorize?${new URLSearchParams({
      response_type: 'code', client_id: app.client_id, redirect_uri: 'https://app.example.com/cb', scope: 'openid contacts.read', state: 'state-0123456789abcdef', nonce: 'nonce-0123456789abcdef',
      code_challenge: createHash('sha256').update(verifier).digest('base64url'), code_challenge_method: 'S256',
    }).toString()}`;
    const browser = browserAt();
    const toLogin = await browser.get(authorize);
    expect(toLogin.statusCode).toBe(303);
    const returnTo = new URL(String(toLogin.headers.location), world.issuer).searchParams.get('return_to')!;
    expect(returnTo.startsWith(authorize)).toBe(true);
    const account = login();
    world.upstream.setAccount(account, { sub: `google-${account}`, email: `${account}@gmail.example`, email_verified: true, name: 'Alan Kay' });
    const back = await signInWithGoogle(browser, account, returnTo);
    expect(back.statusCode, back.body).toBe(303);
    expect(back.headers.location).toBe(returnTo);
    const consent = await browser.get(returnTo);
    expect(consent.statusCode, consent.body).toBe(200);
    const user = (await userByEmail(`${account}@gmail.example`))!;
    const [own] = await world.db.selectFrom('memberships').select('organization_id').where('user_id', '=', user.id).execute();
    const approved = await browser.post('/oauth/authorize', { ...hiddenIn(consent.body), organization_id: String(own!.organization_id), decision: 'approve' });
    expect(approved.statusCode, approved.body).toBe(303);
    const code = new URL(String(approved.headers.location)).searchParams.get('code')!;
    const token = await world.app.inject({
      method: 'POST', url: '/oauth/token', headers: { 'content-type': 'application/x-www-form-urlencoded' },
      payload: new URLSearchParams({ grant_type: 'authorization_code', code, redirect_uri: 'https://app.example.com/cb', code_verifier: verifier, client_id: app.client_id, client_secret: app.client_secret }).toString(),
    });
    expect(token.statusCode, token.body).toBe(200);
    const idToken = decodeJwt(token.json<{ id_token: string }>().id_token);
    expect(idToken).toMatchObject({ sub: String(user.id), amr: ['fed'], nonce: 'nonce-0123456789abcdef' });
  });

  it('an existing account is never linked by email alone: "prove it’s you", its password, then the link, and the owner is mailed', async () => {
    const account = login();
    const email = `${account}@existing.example`;
    const owner = await createUser(world.db, { email, password: 'existing password 123', name: 'Ada' });
    world.upstream.setAccount(account, { sub: `google-${account}`, email, email_verified: true });
    const browser = browserAt();
    const back = await signInWithGoogle(browser, account, '/account');
    expect(back.statusCode, back.body).toBe(303);
    const linkPath = String(back.headers.location);
    expect(linkPath).toMatch(/^\/social\/link\?handle=/);
    expect(await sessionsOf(owner.id)).toEqual([]);
    expect(await identitiesOf(owner.id)).toEqual([]);

    const ask = await browser.get(linkPath);
    expect(ask.statusCode).toBe(200);
    expect(pageText(ask.body)).toContain(`An account with the address ${email} exists here already`);
    // POSTing without having proved it: refused.
    const premature = await browser.post('/social/link', { handle: new URL(linkPath, world.issuer).searchParams.get('handle')!, csrf_token: 'x' });
    expect(premature.statusCode).toBe(403);
    expect(await identitiesOf(owner.id)).toEqual([]);

    const signedIn = await browser.login(email, 'existing password 123', linkPath);
    expect(signedIn.statusCode, signedIn.body).toBe(303);
    const confirm = await browser.get(linkPath);
    expect(pageText(confirm.body)).toContain('Connect them');
    const linked = await browser.post('/social/link', { handle: new URL(linkPath, world.issuer).searchParams.get('handle')!, csrf_token: csrfTokenIn(confirm.body) });
    expect(linked.statusCode, linked.body).toBe(303);
    expect(linked.headers.location).toBe('/account');
    expect(await identitiesOf(owner.id)).toEqual([{ connection_id: connectionId, subject: `google-${account}`, email }]);
    const mail = await world.db.selectFrom('mail_outbox').select('subject').where('recipient', '=', email).execute();
    expect(mail.map((m) => m.subject)).toContain('Google sign-in connected to your account');

    // From now on Google signs the owner in directly.
    const direct = await signInWithGoogle(browserAt(), account);
    expect(direct.statusCode).toBe(303);
    expect(direct.headers.location).toBe('/dashboard');
    expect((await sessionsOf(owner.id)).some((s) => s.social_connection_id === connectionId)).toBe(true);
  });

  it('the Account page lists the connected account and removes it only while another way to sign in remains', async () => {
    const { account, email, browser, user } = await signedUpWithGoogle();
    const [identity] = await world.db.selectFrom('social_identities').select('id').where('user_id', '=', user.id).execute();
    const page = await browser.get('/dashboard/account');
    expect(page.statusCode).toBe(200);
    expect(pageText(page.body)).toContain(`Connected accounts`);
    expect(page.body).toContain(`action="/dashboard/account/social/${identity!.id}/remove"`);
    const remove = () => browser.post(`/dashboard/account/social/${identity!.id}/remove`, { csrf_token: csrfTokenIn(page.body) });
    // The only way this account signs in: kept.
    const refused = await remove();
    expect(refused.statusCode).toBe(409);
    expect(pageText(refused.body)).toContain('This is your only way to sign in');
    expect((await identitiesOf(user.id)).length).toBe(1);
    // With a password, it goes, and the owner is told; the other sessions made through it end, this one stays.
    await setPassword(world.db, user.id, await hashPassword('a password of my own 1'));
    const elsewhere = browserAt();
    expect((await signInWithGoogle(elsewhere, account)).statusCode).toBe(303);
    expect((await elsewhere.get('/dashboard')).statusCode).toBe(200);
    const removed = await remove();
    expect(removed.statusCode).toBe(200);
    expect(await identitiesOf(user.id)).toEqual([]);
    expect((await elsewhere.get('/dashboard')).statusCode).toBe(303);
    expect((await browser.get('/dashboard/account')).statusCode).toBe(200);
    const mail = await world.db.selectFrom('mail_outbox').select('subject').where('recipient', '=', email).execute();
    expect(mail.map((m) => m.subject)).toContain('Google sign-in removed from your account');
    // Another user's identity by its number: not found.
    expect((await browser.post('/dashboard/account/social/2147483647/remove', { csrf_token: csrfTokenIn(page.body) })).statusCode).toBe(404);
  });

  it('one factor: an account with an authenticator app takes its second step after Google, and only then has a session (fed and otp)', async () => {
    const { account, email, browser, user } = await signedUpWithGoogle();
    const page = await browser.get('/dashboard/account');
    const started = await browser.post('/dashboard/account/totp', { csrf_token: csrfTokenIn(page.body) });
    const secret = new URL(unescapeHtml(/data-totp-uri>([^<]+)</.exec(started.body)?.[1] ?? '')).searchParams.get('secret')!;
    expect((await browser.post('/dashboard/account/totp/confirm', { csrf_token: csrfTokenIn(started.body), code: await generate({ secret }) })).statusCode).toBe(200);
    await world.db.deleteFrom('sessions').where('user_id', '=', user.id).execute();

    const second = browserAt();
    const back = await signInWithGoogle(second, account);
    expect(back.statusCode).toBe(303);
    expect(back.headers.location).toBe('/login/second-step');
    expect(await sessionsOf(user.id)).toEqual([]);
    const step = await second.get('/login/second-step');
    const done = await second.post('/login/second-step', { csrf_token: csrfTokenIn(step.body), code: await generate({ secret, epoch: Math.floor(Date.now() / 1000) + 30 }) });
    expect(done.statusCode, done.body).toBe(303);
    const [session] = await sessionsOf(user.id);
    expect(session?.amr).toEqual(expect.arrayContaining(['fed', 'otp']));
    // The session after the second step is still the connection's: disabling it ends this one too.
    expect(session?.social_connection_id).toBe(connectionId);
  });

  it('a second account cannot take an identity another account holds: the subject decides, whatever the address says now', async () => {
    const account = login();
    world.upstream.setAccount(account, { sub: `google-${account}`, email: `${account}@gmail.example`, email_verified: true });
    expect((await signInWithGoogle(browserAt(), account)).statusCode).toBe(303);
    const holder = (await userByEmail(`${account}@gmail.example`))!;
    // The address at the provider changes to another account's here: the link still names the holder.
    const other = await createUser(world.db, { email: `${account}-other@gmail.example`, password: 'other password 123' });
    world.upstream.setAccount(account, { sub: `google-${account}`, email: `${account}-other@gmail.example`, email_verified: true });
    expect((await signInWithGoogle(browserAt(), account)).headers.location).toBe('/dashboard');
    expect((await sessionsOf(other.id)).length).toBe(0);
    expect((await sessionsOf(holder.id)).length).toBe(2);
    // Two proofs parked for one subject, and the other finishes second: refused, nothing linked to it.
    const taken = await linkSocialAfterProof(world.db, { issuer: world.issuer, mail: { queue: async () => {}, wake: () => {} } }, { connectionId, subject: `google-${account}`, email: `${account}-other@gmail.example`, emailVerified: true, name: undefined }, other.id);
    expect(taken).toEqual({ kind: 'refused', reason: 'identity_taken' });
    expect(await identitiesOf(other.id)).toEqual([]);
  });

  it('the state, nonce and issuer are the sign-in’s own: an unknown state, a response naming another issuer (RFC 9207), an ID token with another nonce sign nobody in', async () => {
    const account = login();
    world.upstream.setAccount(account, { sub: `google-${account}`, email: `${account}@gmail.example`, email_verified: true });
    const browser = browserAt();
    const out = await continueWithGoogle(browser);
    const back = new URL(await world.upstream.signIn(new URL(String(out.headers.location)), account));
    expect(back.searchParams.get('iss')).toBe(world.upstream.issuer);
    const forged = new URL(back);
    forged.searchParams.set('iss', 'https://evil.example');
    expect((await browser.get(pathOf(world, forged))).statusCode).toBe(400);
    // That used the sign-in up: the genuine callback finds nothing now.
    expect((await browser.get(pathOf(world, back))).statusCode).toBe(400);
    const unknown = new URL(back);
    unknown.searchParams.set('state', 'x'.repeat(43));
    expect((await browser.get(pathOf(world, unknown))).statusCode).toBe(400);
    // The authorization request's nonce changed on the way (the state and PKCE untouched): the ID
    // token carries that nonce, not the sign-in's, and is refused.
    const again = browserAt();
    const leaving = new URL(String((await continueWithGoogle(again)).headers.location));
    leaving.searchParams.set('nonce', 'nonce-chosen-by-someone-else');
    expect((await again.get(pathOf(world, await world.upstream.signIn(leaving, account)))).statusCode).toBe(400);
    expect(await userByEmail(`${account}@gmail.example`)).toBeUndefined();
  });

  it('sign-up’s limits hold for accounts made through a provider (DO-1): the eleventh new account from one address in an hour waits', async () => {
    const ip = '10.46.0.1';
    for (let i = 0; i < 10; i++) {
      const account = login();
      world.upstream.setAccount(account, { sub: `google-${account}`, email: `${account}@gmail.example`, email_verified: true });
      expect((await signInWithGoogle(browserAt(ip), account)).statusCode).toBe(303);
    }
    const account = login();
    world.upstream.setAccount(account, { sub: `google-${account}`, email: `${account}@gmail.example`, email_verified: true });
    const refused = await signInWithGoogle(browserAt(ip), account);
    expect(refused.statusCode).toBe(429);
    expect(await userByEmail(`${account}@gmail.example`)).toBeUndefined();
    // Signing in (not up) is not limited by it.
    const known = login();
    world.upstream.setAccount(known, { sub: `google-${known}`, email: `${known}@gmail.example`, email_verified: true });
    expect((await signInWithGoogle(browserAt(), known)).statusCode).toBe(303);
    expect((await signInWithGoogle(browserAt(ip), known)).statusCode).toBe(303);
  });

  it('where a connection points cannot change while people sign in through it (another provider’s subjects would be theirs)', async () => {
    const account = login();
    world.upstream.setAccount(account, { sub: `google-${account}`, email: `${account}@gmail.example`, email_verified: true });
    expect((await signInWithGoogle(browserAt(), account)).statusCode).toBe(303);
    await expect(updateSocialConnection(world.db, socialSettings(world.config), connectionId, { issuer: 'https://other-provider.example' })).rejects.toThrow(/cannot change under them/);
    // Its secret and name may change; an unused connection may point anywhere.
    expect(await updateSocialConnection(world.db, socialSettings(world.config), connectionId, { client_secret: 'google-secret-0123456789', name: 'Google' })).toMatchObject({ issuer: world.upstream.issuer });
    const unused = await createSocialConnection(world.db, socialSettings(world.config), { provider: 'oidc', issuer: 'https://one.example', client_id: 'c', client_secret: 's', state: 'disabled' });
    expect(await updateSocialConnection(world.db, socialSettings(world.config), unused.id, { issuer: 'https://two.example' })).toMatchObject({ issuer: 'https://two.example' });
    await world.db.deleteFrom('social_connections').where('id', '=', unused.id).execute();
  });

  it('an unverified address at the provider makes no account and matches none', async () => {
    const account = login();
    const email = `${account}@unverified.example`;
    const existing = await createUser(world.db, { email: `${account}-victim@unverified.example`, password: 'victim password 123' });
    world.upstream.setAccount(account, { sub: `google-${account}`, email, email_verified: false });
    const res = await signInWithGoogle(browserAt(), account);
    expect(res.statusCode).toBe(403);
    expect(pageText(res.body)).toContain('has not verified your email address');
    expect(await userByEmail(email)).toBeUndefined();
    // Claiming an existing account's address, unverified: the account is not touched.
    world.upstream.setAccount(`${account}-2`, { sub: `google-${account}-2`, email: `${account}-victim@unverified.example`, email_verified: false });
    expect((await signInWithGoogle(browserAt(), `${account}-2`)).statusCode).toBe(403);
    expect(await identitiesOf(existing.id)).toEqual([]);
  });

  it('an address of a domain whose organization requires SSO is sent to its company sign-in', async () => {
    const account = login();
    const domain = `sso-${n}-${process.pid}.example`;
    const org = await ssoOrganization(world, { domain, ssoRequired: true });
    world.upstream.setAccount(account, { sub: `google-${account}`, email: `${account}@${domain}`, email_verified: true });
    const res = await signInWithGoogle(browserAt(), account);
    expect(res.statusCode).toBe(303);
    expect(String(res.headers.location)).toMatch(/^\/login\?/);
    expect(new URL(String(res.headers.location), world.issuer).searchParams.get('login_hint')).toBe(`${account}@${domain}`);
    expect(await userByEmail(`${account}@${domain}`)).toBeUndefined();
    // The organization's audit log shows its rule at work.
    expect((await auditEvents(world, org.organizationId, 'social.sent_to_sso')).map((e) => e.details)).toEqual([{ social_connection_id: connectionId, email: `${account}@${domain}` }]);
  });

  it('a connection disabled mid-flow signs nobody in and ends the sessions it made; another browser’s callback and a replayed one sign nobody in; a disabled connection has no button', async () => {
    const account = login();
    world.upstream.setAccount(account, { sub: `google-${account}`, email: `${account}@gmail.example`, email_verified: true });
    // Another browser brings the callback: the sign-in is bound to the one that started it.
    const starter = browserAt();
    const leaving = await continueWithGoogle(starter);
    const callback = pathOf(world, await world.upstream.signIn(new URL(String(leaving.headers.location)), account));
    const thief = await browserAt().get(callback);
    expect(thief.statusCode).toBe(400);
    // The starter still finishes (the thief did not use it up), once only.
    expect((await starter.get(callback)).statusCode).toBe(303);
    expect((await starter.get(callback)).statusCode).toBe(400);

    const signedIn = browserAt();
    expect((await signInWithGoogle(signedIn, account)).statusCode).toBe(303);
    expect((await signedIn.get('/dashboard')).statusCode).toBe(200);
    const browser = browserAt();
    const out = await continueWithGoogle(browser);
    const back = pathOf(world, await world.upstream.signIn(new URL(String(out.headers.location)), account));
    await updateSocialConnection(world.db, socialSettings(world.config), connectionId, { state: 'disabled' });
    try {
      // The sessions it made end with it.
      expect((await signedIn.get('/dashboard')).statusCode).toBe(303);
      const refused = await browser.get(back);
      expect(refused.statusCode).toBe(403);
      expect(browser.cookies.size).toBeGreaterThan(0);
      expect((await browser.get('/dashboard')).statusCode).toBe(303);
      const page = await browser.get('/login');
      expect(page.body).not.toContain('Continue with Google');
      expect((await browser.post(`/social/${connectionId}/start`, { csrf_token: csrfTokenIn(page.body), return_to: '/dashboard' })).statusCode).toBe(404);
    } finally {
      await updateSocialConnection(world.db, socialSettings(world.config), connectionId, { state: 'enabled' });
    }
  });
});

describe(`social sign-in through Microsoft's multi-tenant endpoints (a provider on loopback like login.microsoftonline.com) on ${BACKEND}`, () => {
  const WORK_TENANT = '72f988bf-86f1-41af-91ab-2d7cd011db47';
  const OTHER_TENANT = '0b5e2f6a-1c2d-4e3f-8a9b-0c1d2e3f4a5b';
  let work: UpstreamOidc;
  let personal: UpstreamOidc;

  beforeAll(async () => {
    [work, personal] = await Promise.all([startUpstreamOidc({ tenant: WORK_TENANT }), startUpstreamOidc({ tenant: MICROSOFT_CONSUMERS_TENANT })]);
  });
  afterAll(async () => {
    await Promise.all([work?.close(), personal?.close()]);
  });

  /** A Microsoft connection at `upstream`'s origin for `tenant`, its client registered there. */
  async function microsoft(upstream: UpstreamOidc, tenant: string) {
    const clientId = `orgauth-ms-${++n}`;
    const view = await createSocialConnection(world.db, socialSettings(world.config), { provider: 'microsoft', issuer: upstream.origin, tenant, client_id: clientId, client_secret: 'microsoft-secret-0123456789', name: `Microsoft ${n}` });
    upstream.registerClient({ client_id: clientId, client_secret: 'microsoft-secret-0123456789', redirect_uris: [view.redirect_uri] });
    return view;
  }

  async function signInAt(upstream: UpstreamOidc, connection: { id: number }, account: string) {
    const browser = browserAt();
    const page = await browser.get('/login');
    const leaving = await browser.post(`/social/${connection.id}/start`, { csrf_token: csrfTokenIn(page.body), return_to: '/dashboard' });
    expect(leaving.statusCode, leaving.body).toBe(303);
    return browser.get(pathOf(world, await upstream.signIn(new URL(String(leaving.headers.location)), account)));
  }

  it('common: a work account whose domain owner verified the address (xms_edov) signs up; iss is checked against the template with its own tid', async () => {
    const connection = await microsoft(work, 'common');
    expect(connection.issuer).toBe(work.origin);
    const account = login();
    const email = `${account}@contoso.example`;
    work.setAccount(account, { sub: `ms-${account}`, tid: WORK_TENANT, xms_edov: true, email, name: 'Megan Bowen' });
    const res = await signInAt(work, connection, account);
    expect(res.statusCode, res.body).toBe(303);
    expect(res.headers.location).toBe('/dashboard');
    const user = await userByEmail(email);
    expect(await identitiesOf(user!.id)).toEqual([{ connection_id: connection.id, subject: `ms-${account}`, email }]);
  });

  it('common: an address nobody verified (no xms_edov) is not used; a tid that is not its issuer’s tenant is refused', async () => {
    const connection = await microsoft(work, 'common');
    const account = login();
    work.setAccount(account, { sub: `ms-${account}`, tid: WORK_TENANT, email: `${account}@unverified-tenant.example` });
    const unverified = await signInAt(work, connection, account);
    expect(unverified.statusCode).toBe(403);
    expect(pageText(unverified.body)).toContain('has not verified your email address');
    expect(await userByEmail(`${account}@unverified-tenant.example`)).toBeUndefined();

    // The ID token says another tenant than the issuer it came from.
    const forged = login();
    work.setAccount(forged, { sub: `ms-${forged}`, tid: OTHER_TENANT, xms_edov: true, email: `${forged}@contoso.example` });
    const refused = await signInAt(work, connection, forged);
    expect(refused.statusCode).toBe(400);
    expect(await userByEmail(`${forged}@contoso.example`)).toBeUndefined();
  });

  it('a multi-tenant provider that names itself in the response (RFC 9207): the tenant it names must be the ID token’s', async () => {
    const named = await startUpstreamOidc({ tenant: WORK_TENANT, issInResponse: true });
    try {
      const connection = await microsoft(named, 'common');
      const account = login();
      named.setAccount(account, { sub: `ms-${account}`, tid: WORK_TENANT, xms_edov: true, email: `${account}@contoso.example` });
      expect((await signInAt(named, connection, account)).statusCode).toBe(303);
      const forged = login();
      named.setAccount(forged, { sub: `ms-${forged}`, tid: OTHER_TENANT, xms_edov: true, email: `${forged}@contoso.example` });
      expect((await signInAt(named, connection, forged)).statusCode).toBe(400);
      expect(await userByEmail(`${forged}@contoso.example`)).toBeUndefined();
    } finally {
      await named.close();
    }
  });

  it('organizations refuses a personal account; common takes it, its address verified by Microsoft; one tenant id takes only its own', async () => {
    const account = login();
    const email = `${account}@outlook.example`;
    personal.setAccount(account, { sub: `msa-${account}`, tid: MICROSOFT_CONSUMERS_TENANT, email });
    expect((await signInAt(personal, await microsoft(personal, 'organizations'), account)).statusCode).toBe(400);
    expect(await userByEmail(email)).toBeUndefined();
    const common = await signInAt(personal, await microsoft(personal, 'common'), account);
    expect(common.statusCode, common.body).toBe(303);
    expect(await userByEmail(email)).toBeDefined();

    const member = login();
    work.setAccount(member, { sub: `ms-${member}`, tid: WORK_TENANT, xms_edov: true, email: `${member}@contoso.example` });
    expect((await signInAt(work, await microsoft(work, WORK_TENANT), member)).statusCode).toBe(303);
    // The same account at a connection for another tenant: its discovery is that tenant's, which this provider is not.
    const elsewhere = await signInAt(work, await microsoft(work, OTHER_TENANT), member).catch((err: Error) => err);
    expect(elsewhere instanceof Error ? 502 : elsewhere.statusCode).not.toBe(303);
  });
});

describe(`social sign-in through GitHub (a GitHub Enterprise-compatible server on loopback) on ${BACKEND}`, () => {
  let github: GitHubServer;
  let connection: { id: number; redirect_uri: string };

  beforeAll(async () => {
    github = await startGitHubServer();
    connection = await createSocialConnection(world.db, socialSettings(world.config), { provider: 'github', base_url: github.baseUrl, client_id: 'Iv1.orgauth', client_secret: 'github-secret-0123456789' });
    github.register({ clientId: 'Iv1.orgauth', clientSecret: 'github-secret-0123456789', callbackUrl: connection.redirect_uri });
  });
  afterAll(async () => {
    await github?.close();
  });

  /** Continue with GitHub as `user`: returns orgauth's answer to GitHub's redirect back. */
  async function signInAs(user: GitHubUser, browser = browserAt()) {
    github.signInAs(user);
    const page = await browser.get('/login');
    expect(pageText(page.body)).toContain('Continue with GitHub');
    const leaving = await browser.post(`/social/${connection.id}/start`, { csrf_token: csrfTokenIn(page.body), return_to: '/dashboard' });
    expect(leaving.statusCode, leaving.body).toBe(303);
    const authorize = await fetch(String(leaving.headers.location), { redirect: 'manual' });
    expect(authorize.status).toBe(302);
    return browser.get(pathOf(world, String(authorize.headers.get('location'))));
  }

  let ids = 1000;
  const githubUser = (emails: GitHubUser['emails']): GitHubUser => ({ id: ++ids, login: `octo${ids}`, name: `Octo ${ids}`, emails });

  it('signs up with the primary verified address (not a secondary one), the numeric id as the subject; a second sign-in reuses it', async () => {
    const stamp = login();
    const user = githubUser([
      { email: `${stamp}-secondary@users.example`, primary: false, verified: true },
      { email: `${stamp}@users.example`, primary: true, verified: true },
      { email: `${stamp}-unverified@users.example`, primary: false, verified: false },
    ]);
    const res = await signInAs(user);
    expect(res.statusCode, res.body).toBe(303);
    expect(res.headers.location).toBe('/dashboard');
    const created = (await userByEmail(`${stamp}@users.example`))!;
    expect(await identitiesOf(created.id)).toEqual([{ connection_id: connection.id, subject: String(user.id), email: `${stamp}@users.example` }]);
    expect(await userByEmail(`${stamp}-secondary@users.example`)).toBeUndefined();
    // What orgauth asked GitHub: the web flow with PKCE and the two REST calls, with the token.
    const asked = github.authorizeRequests.at(-1)!;
    expect(asked).toMatchObject({ client_id: 'Iv1.orgauth', redirect_uri: connection.redirect_uri, scope: 'read:user user:email', code_challenge_method: 'S256' });
    expect(github.requests.filter((r) => r.path.startsWith('/api/v3/')).slice(-2).map((r) => [r.path, r.authorization?.startsWith('Bearer gho_')])).toEqual([['/api/v3/user', true], ['/api/v3/user/emails', true]]);
    // The login changed at GitHub, the id did not: the same account.
    const again = await signInAs({ ...user, login: `renamed-${user.login}` });
    expect(again.statusCode).toBe(303);
    expect((await identitiesOf(created.id)).length).toBe(1);
  });

  it('refuses an account whose addresses are all unverified, and never matches an existing account by a secondary address', async () => {
    const stamp = login();
    const unverified = await signInAs(githubUser([{ email: `${stamp}@users.example`, primary: true, verified: false }, { email: `${stamp}-2@users.example`, primary: false, verified: false }]));
    expect(unverified.statusCode).toBe(403);
    expect(pageText(unverified.body)).toContain('has not verified your email address');
    expect(await userByEmail(`${stamp}@users.example`)).toBeUndefined();

    const victim = await createUser(world.db, { email: `${stamp}-victim@users.example`, password: 'victim password 123' });
    const res = await signInAs(githubUser([{ email: `${stamp}-attacker@users.example`, primary: true, verified: true }, { email: `${stamp}-victim@users.example`, primary: false, verified: true }]));
    expect(res.statusCode).toBe(303);
    expect(await identitiesOf(victim.id)).toEqual([]);
    expect((await userByEmail(`${stamp}-attacker@users.example`))).toBeDefined();
  });

  it('an address in an SSO-required domain is sent to its company sign-in; GitHub’s refusal, a huge answer and a replayed code sign nobody in', async () => {
    const stamp = login();
    const domain = `gh-sso-${n}-${process.pid}.example`;
    await ssoOrganization(world, { domain, ssoRequired: true });
    const routed = await signInAs(githubUser([{ email: `${stamp}@${domain}`, primary: true, verified: true }]));
    expect(routed.statusCode).toBe(303);
    expect(new URL(String(routed.headers.location), world.issuer).searchParams.get('login_hint')).toBe(`${stamp}@${domain}`);

    github.denyNext();
    const denied = await signInAs(githubUser([{ email: `${stamp}-denied@users.example`, primary: true, verified: true }]));
    expect(denied.statusCode).toBe(400);

    github.huge(300 * 1024);
    const huge = await signInAs(githubUser([{ email: `${stamp}-huge@users.example`, primary: true, verified: true }]));
    expect(huge.statusCode).toBe(400);
    expect(await userByEmail(`${stamp}-huge@users.example`)).toBeUndefined();

    // The same callback twice: the second finds its sign-in used.
    const browser = browserAt();
    github.signInAs(githubUser([{ email: `${stamp}-replay@users.example`, primary: true, verified: true }]));
    const page = await browser.get('/login');
    const leaving = await browser.post(`/social/${connection.id}/start`, { csrf_token: csrfTokenIn(page.body), return_to: '/dashboard' });
    const back = pathOf(world, String((await fetch(String(leaving.headers.location), { redirect: 'manual' })).headers.get('location')));
    expect((await browser.get(back)).statusCode).toBe(303);
    expect((await browser.get(back)).statusCode).toBe(400);
  });

  it('a slow provider runs into the outbound client’s deadline: a refusal, not a hung sign-in', async () => {
    const row = (await findSocialConnection(world.db, connection.id))!;
    const providers = new SocialProviders({
      issuer: world.issuer, secretKey: world.config.secretKey, allowHttp: true,
      fetch: createOutboundFetch({ allowHttp: true, allowedNetworks: ['127.0.0.0/8'], timeoutMs: 300, maxBytes: 1024 * 1024 }),
    });
    const checks = UpstreamOidcClient.newChecks();
    github.signInAs(githubUser([{ email: `${login()}@users.example`, primary: true, verified: true }]));
    const authorize = await fetch(await providers.authorizationUrl(row, checks), { redirect: 'manual' });
    github.slow(2000, 'user');
    await expect(providers.finish(row, new URL(String(authorize.headers.get('location'))), checks)).rejects.toThrow(/timed out/);
  });
});
