/**
 * SS-4 on both databases (issue 41 §1, §2): an organization that requires single sign-on of a
 * person is reached only by a sign-in made through one of ITS active connections, checked when
 * the sign-in is used — the dashboard, consent, code redemption and refresh — not only when the
 * setting changes. The two escapes an outside review reproduced (another organization's
 * connection; moving the account's address out of the domain) and the sessions that forgot
 * their connection when a second step raised them.
 */
import { generate } from 'otplib';
import * as client from 'openid-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { openText } from '../../src/lib/crypto.js';
import { createApplication } from '../../src/oauth/models/applications.js';
import { updateConnection } from '../../src/sso/connections.js';
import { updateDomain } from '../../src/sso/domains.js';
import { Browser, csrfTokenIn } from '../accounts/browser.js';
import { TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND } from '../helpers/db.js';
import { createOrgFixture } from '../helpers/oauth.js';
import { authorizationRequest, hiddenFields, RP_REDIRECT } from '../helpers/oidc-world.js';
import { pageText, pathOf, type SsoOrganization, ssoOrganization, type SsoWorld, startSsoWorld, upstreamCallback } from '../helpers/sso-world.js';

const PASSWORD = 'a local password 123';
const HELD_BY = 'Held Corp requires you to sign in through its identity provider.';

let world: SsoWorld;
let held: SsoOrganization;
let other: SsoOrganization;
let n = 0;
const db = () => world.db;
const newBrowser = () => new Browser(world.app, `10.41.${Math.floor(++n / 250)}.${(n % 250) + 1}`);

/** A person of held.example with a password, a member of Held Corp and of Other IdP Corp, linked to a subject at each one's connection. */
async function heldPerson(name: string) {
  const email = `${name}@held.example`;
  const user = await createUser(db(), { email, password: PASSWORD, name, emailVerified: true });
  for (const org of [held, other]) {
    await addMember(db(), { organizationId: org.organizationId, userId: user.id, role: 'member' });
    const subject = `${name}-at-${org.organizationId}`;
    await db().insertInto('sso_identities').values({ connection_id: org.connectionId, user_id: user.id, issuer: world.upstream.issuer, subject_format: '', subject, email }).execute();
    world.upstream.setAccount(subject, { sub: subject, email, email_verified: true, name });
  }
  return { id: user.id, email, loginAt: (org: SsoOrganization) => `${name}-at-${org.organizationId}` };
}

/** Signs `browser` in through `org`'s connection as its upstream account `login`; returns where it was sent. */
async function signInThrough(browser: Browser, org: SsoOrganization, login: string, returnTo = '/dashboard', amr?: string[]): Promise<string> {
  // The chooser's form, as the login page shows it also to a signed-in browser asked to sign in again.
  const page = await browser.get('/login?prompt=login');
  const leaving = await browser.post(`/sso/${org.connectionId}/start`, { csrf_token: csrfTokenIn(page.body), return_to: returnTo });
  const back = await browser.get(await upstreamCallback(world, leaving, login, amr ? { amr } : {}));
  expect(back.statusCode, back.body).toBe(303);
  return back.headers.location as string;
}

const setCurrentOrganization = (userId: number, organizationId: number) => db().updateTable('sessions').set({ current_organization_id: organizationId }).where('user_id', '=', userId).execute();
const sessionRows = (userId: number) => db().selectFrom('sessions').select(['sso_connection_id', 'amr']).where('user_id', '=', userId).execute();

/** A third-party public application, discovered by openid-client as its developer would. */
async function vendorApp() {
  const vendor = await createOrgFixture(db());
  const rp = await createApplication(db(), { organizationId: vendor.organizationId, type: 'public', name: `Vendor ${++n}`, redirectUris: [RP_REDIRECT], scopes: 'contacts.read' });
  return client.discovery(new URL(world.issuer), rp.client_id, rp.client_secret, undefined, { execute: [client.allowInsecureRequests] });
}

/** The consent page for `oidc` in `browser` (signed in), and the request's checks. */
async function consentPage(browser: Browser, oidc: client.Configuration) {
  // prompt=consent: the page each time, not a consent remembered from before.
  const { url, checks } = await authorizationRequest(oidc, 'openid email contacts.read', { prompt: 'consent' });
  const page = await browser.get(pathOf(world, url));
  expect(page.statusCode, `${page.headers.location}`).toBe(200);
  return { page, checks };
}

/** The block of the consent page for one organization. */
const organizationBlock = (html: string, organizationId: number) => new RegExp(`<div class="organization" data-organization-id="${organizationId}">([\\s\\S]*?)</div>`).exec(html)?.[1] ?? '';

beforeAll(async () => {
  world = await startSsoWorld();
  held = await ssoOrganization(world, { domain: 'held.example', name: 'Held Corp', ssoRequired: true });
  other = await ssoOrganization(world, { domain: 'other-idp.example', name: 'Other IdP Corp' });
}, 60_000);
afterAll(async () => {
  await world?.close();
});

describe(`SS-4: a sign-in through another organization's connection on ${BACKEND}`, () => {
  it('reaches that organization, but not the dashboard of the one that requires its SSO: sent to sign in through it', async () => {
    const alice = await heldPerson('alice');
    const browser = newBrowser();
    await signInThrough(browser, other, alice.loginAt(other));
    expect((await browser.get('/dashboard')).statusCode).toBe(200);

    await setCurrentOrganization(alice.id, held.organizationId);
    const refused = await browser.get('/dashboard/applications');
    expect(refused.statusCode).toBe(303);
    expect(refused.headers.location).toBe(`/login?${new URLSearchParams({ return_to: '/dashboard/applications', prompt: 'login', login_hint: alice.email }).toString()}`);
    // A form posted to it is refused too.
    const account = await browser.get('/dashboard/account');
    const posted = await browser.post('/dashboard/applications', { csrf_token: csrfTokenIn(account.body), name: 'Sneaky', type: 'private' });
    expect(posted.statusCode).toBe(403);
    expect(pageText(posted.body)).toContain(HELD_BY);

    // Through Held Corp's own connection, it is reached.
    await signInThrough(browser, held, alice.loginAt(held));
    await setCurrentOrganization(alice.id, held.organizationId);
    expect((await browser.get('/dashboard/applications')).statusCode).toBe(200);
  });

  it('consent lists the organization as unavailable with the reason and a way through; choosing it anyway is a 403 and no code', async () => {
    const bob = await heldPerson('bob');
    const oidc = await vendorApp();
    const browser = newBrowser();
    await signInThrough(browser, other, bob.loginAt(other));
    const { page } = await consentPage(browser, oidc);
    const heldBlock = organizationBlock(page.body, held.organizationId);
    expect(heldBlock).toContain(`value="${held.organizationId}" required disabled>`);
    expect(pageText(heldBlock)).toContain('Held Corp requires you to sign in through its identity provider; this organization cannot be chosen until you sign in through it.');
    expect(heldBlock).toContain(`href="/login?return_to=`);
    expect(organizationBlock(page.body, other.organizationId)).not.toContain('disabled');

    const chosen = await browser.post('/oauth/authorize', { ...hiddenFields(page.body), organization_id: String(held.organizationId), decision: 'approve' });
    expect(chosen.statusCode).toBe(403);
    expect(pageText(chosen.body)).toContain(HELD_BY);
    expect(await db().selectFrom('authorization_codes').select('id').where('user_id', '=', bob.id).execute()).toEqual([]);

    // Signed in through Held Corp's connection, it can be chosen.
    await signInThrough(browser, held, bob.loginAt(held));
    const again = await consentPage(browser, oidc);
    expect(organizationBlock(again.page.body, held.organizationId)).not.toContain('disabled');
  });

  it('code redemption and refresh check the rule as it is now: a code or grant of a sign-in through another connection is invalid_grant once SSO is required', async () => {
    const cleo = await heldPerson('cleo');
    const oidc = await vendorApp();
    await updateDomain(db(), held.organizationId, 'held.example', { sso_required: false });
    let codeUrl: URL;
    let codeChecks: Awaited<ReturnType<typeof consentPage>>['checks'];
    let refreshToken: string;
    try {
      // A code and a grant while Held Corp does not require SSO, through the other connection.
      const browser = newBrowser();
      await signInThrough(browser, other, cleo.loginAt(other));
      const first = await consentPage(browser, oidc);
      const approved = await browser.post('/oauth/authorize', { ...hiddenFields(first.page.body), organization_id: String(held.organizationId), decision: 'approve' });
      expect(approved.statusCode, approved.body).toBe(303);
      const tokens = await client.authorizationCodeGrant(oidc, new URL(approved.headers.location as string), { ...first.checks, idTokenExpected: true });
      refreshToken = tokens.refresh_token!;
      const second = await consentPage(browser, oidc);
      const approvedAgain = await browser.post('/oauth/authorize', { ...hiddenFields(second.page.body), organization_id: String(held.organizationId), decision: 'approve' });
      codeUrl = new URL(approvedAgain.headers.location as string);
      codeChecks = second.checks;
    } finally {
      await updateDomain(db(), held.organizationId, 'held.example', { sso_required: true });
    }
    await expect(client.authorizationCodeGrant(oidc, codeUrl, { ...codeChecks, idTokenExpected: true })).rejects.toMatchObject({ error: 'invalid_grant' });
    await expect(client.refreshTokenGrant(oidc, refreshToken)).rejects.toMatchObject({ error: 'invalid_grant' });

    // Through Held Corp's connection: a code, a grant and its refresh.
    const browser = newBrowser();
    await signInThrough(browser, held, cleo.loginAt(held));
    const { page, checks } = await consentPage(browser, oidc);
    const approved = await browser.post('/oauth/authorize', { ...hiddenFields(page.body), organization_id: String(held.organizationId), decision: 'approve' });
    const tokens = await client.authorizationCodeGrant(oidc, new URL(approved.headers.location as string), { ...checks, idTokenExpected: true });
    expect(tokens).toMatchObject({ organization_id: held.organizationId });
    const refreshed = await client.refreshTokenGrant(oidc, tokens.refresh_token!);
    expect(refreshed.access_token).toEqual(expect.any(String));
  });
});

/** The messages queued for `to`, opened. */
async function mailTo(to: string) {
  const rows = await db().selectFrom('mail_outbox').select(['subject', 'body_encrypted']).where('recipient', '=', to).orderBy('id').execute();
  return rows.map((r) => ({ subject: r.subject, ...(JSON.parse(openText(TEST_SECRET_KEY, 'mail-outbox', r.body_encrypted!)) as { text: string }) }));
}

describe(`SS-4: the account's address on ${BACKEND}`, () => {
  it('cannot move out of the domain while a member of the organization that requires its SSO; another address there is fine', async () => {
    const dana = await heldPerson('dana');
    const browser = newBrowser();
    await signInThrough(browser, held, dana.loginAt(held));
    const change = async (email: string) => {
      const account = await browser.get('/dashboard/account');
      return browser.post('/dashboard/account/email', { csrf_token: csrfTokenIn(account.body), email, current_password: PASSWORD });
    };
    const out = await change('dana@elsewhere.example');
    expect(out.statusCode).toBe(409);
    expect(pageText(out.body)).toContain('Held Corp signs in your address through its identity provider, so it cannot be changed to one outside its domain while you are a member. Ask an administrator of Held Corp.');
    expect(await mailTo('dana@elsewhere.example')).toEqual([]);
    const within = await change('dana.new@held.example');
    expect(within.statusCode, within.body).toBe(200);
  });

  it('a change asked for before SSO was required is refused when its link is followed: the address stays', async () => {
    const eli = await heldPerson('eli');
    await updateDomain(db(), held.organizationId, 'held.example', { sso_required: false });
    try {
      const browser = newBrowser();
      await signInThrough(browser, held, eli.loginAt(held));
      const account = await browser.get('/dashboard/account');
      const asked = await browser.post('/dashboard/account/email', { csrf_token: csrfTokenIn(account.body), email: 'eli@elsewhere.example', current_password: PASSWORD });
      expect(asked.statusCode, asked.body).toBe(200);
    } finally {
      await updateDomain(db(), held.organizationId, 'held.example', { sso_required: true });
    }
    const [mail] = await mailTo('eli@elsewhere.example');
    const link = new URL(/https?:\/\/\S+\/verify-email\?token=[A-Za-z0-9_-]+/.exec(mail!.text)![0]);
    const browser = newBrowser();
    await signInThrough(browser, held, eli.loginAt(held));
    const page = await browser.get(`${link.pathname}${link.search}`);
    const followed = await browser.post('/verify-email', { csrf_token: csrfTokenIn(page.body), token: link.searchParams.get('token')! });
    expect(followed.statusCode).toBe(409);
    expect(pageText(followed.body)).toContain('Held Corp signs in your address through its identity provider');
    expect((await db().selectFrom('users').select('email').where('id', '=', eli.id).executeTakeFirstOrThrow()).email).toBe(eli.email);
  });
});

describe(`a session raised by a further factor keeps its SSO connection on ${BACKEND}`, () => {
  const codeAt = (secret: string) => generate({ secret, epoch: Math.floor(Date.now() / 1000) });

  it('adding an authenticator app, then a second step with it: the new sessions keep the connection, and disabling it ends them', async () => {
    const raise = await ssoOrganization(world, { domain: 'raise.example', name: 'Raise Corp', ssoRequired: true });
    const email = 'fern@raise.example';
    const user = await createUser(db(), { email, password: PASSWORD, name: 'Fern', emailVerified: true });
    await addMember(db(), { organizationId: raise.organizationId, userId: user.id, role: 'member' });
    await db().insertInto('sso_identities').values({ connection_id: raise.connectionId, user_id: user.id, issuer: world.upstream.issuer, subject_format: '', subject: 'fern-sub', email }).execute();
    world.upstream.setAccount('fern', { sub: 'fern-sub', email, email_verified: true, name: 'Fern' });
    const browser = newBrowser();
    await signInThrough(browser, raise, 'fern');
    expect(await sessionRows(user.id)).toEqual([{ sso_connection_id: raise.connectionId, amr: expect.arrayContaining(['fed']) }]);

    // Path 1: the Account page's new authenticator app raises the session (dashboard/two-step.ts).
    const account = await browser.get('/dashboard/account');
    const started = await browser.post('/dashboard/account/totp', { csrf_token: csrfTokenIn(account.body) });
    expect(started.statusCode, started.body).toBe(200);
    const secret = new URL(/data-totp-uri>([^<]+)</.exec(started.body)![1]!.replace(/&amp;/g, '&')).searchParams.get('secret')!;
    const confirmed = await browser.post('/dashboard/account/totp/confirm', { csrf_token: csrfTokenIn(started.body), code: await codeAt(secret) });
    expect(confirmed.statusCode, confirmed.body).toBe(200);
    const afterApp = await sessionRows(user.id);
    expect(afterApp).toEqual([{ sso_connection_id: raise.connectionId, amr: expect.arrayContaining(['fed', 'otp', 'mfa']) }]);

    // Path 2: a second step taken by a signed-in session (web/second-step.ts), with the app's next
    // code, after a sign-in at a provider that reports one factor (amr pwd).
    await signInThrough(browser, raise, 'fern', '/dashboard', ['pwd']);
    expect(await sessionRows(user.id)).toEqual([{ sso_connection_id: raise.connectionId, amr: ['fed', 'pwd'] }]);
    const stepPage = await browser.get('/login/second-step?return_to=%2Fdashboard');
    expect(stepPage.statusCode, `${stepPage.headers.location}`).toBe(200);
    const stepped = await browser.post('/login/second-step', { ...hiddenFields(stepPage.body), csrf_token: csrfTokenIn(stepPage.body), code: await generate({ secret, epoch: Math.floor(Date.now() / 1000) + 30 }) });
    expect(stepped.statusCode, stepped.body).toBe(303);
    expect(await sessionRows(user.id)).toEqual([{ sso_connection_id: raise.connectionId, amr: expect.arrayContaining(['fed', 'otp', 'mfa']) }]);
    expect((await browser.get('/dashboard')).statusCode).toBe(200);

    // The documented answer to a compromised IdP still ends the raised session at once.
    await updateConnection(db(), world.settings, raise.organizationId, raise.connectionId, { state: 'disabled' });
    expect(await sessionRows(user.id)).toEqual([]);
    expect((await browser.get('/dashboard')).statusCode).toBe(303);
  });
});
