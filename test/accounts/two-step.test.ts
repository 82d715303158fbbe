/**
 * Two-step sign-in (issue 24): an authenticator app enrolled from the Account page, the second
 * step after the password, recovery codes, the lock after wrong codes, organizations that
 * require two factors, and what OpenID Connect says of it (amr, acr, acr_values), driven by
 * openid-client over real HTTP with codes computed by otplib. On both databases.
 */
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { decodeJwt } from 'jose';
import { generate } from 'otplib';
import * as client from 'openid-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { SECOND_STEP_MAX_FAILURES } from '../../src/accounts/second-factors.js';
import { ACR_PASSWORD, ACR_TWO_FACTORS } from '../../src/oauth/helpers/acr.js';
import type { ApplicationWithSecret } from '../../src/oauth/models/applications.js';
import { createOrganization } from '../../src/accounts/organizations.js';
import { Browser, csrfTokenIn } from './browser.js';
import { authorizationRequest, createRelyingParty, discover, hiddenFields, oidcPerson, type OidcWorld, type Person, RP_REDIRECT, startOidcWorld } from '../helpers/oidc-world.js';
import { clientCredentialsToken, form } from '../helpers/oauth.js';
import { TEST_SECRET_KEY } from '../helpers/app.js';
import { openText } from '../../src/lib/crypto.js';

const PASSWORD = 'two-step-password-1';

let world: OidcWorld;
let app: FastifyInstance;
let issuer: string;
let rp: ApplicationWithSecret;
let oidc: client.Configuration;

beforeAll(async () => {
  world = await startOidcWorld();
  ({ app, issuer } = world);
  rp = await createRelyingParty(world, []);
  oidc = await discover(world, rp);
}, 60_000);

afterAll(async () => {
  await world?.close();
});

const db = () => world.t.handle.db;
const person = () => oidcPerson(world, PASSWORD);
const pathOf = (url: URL | string) => {
  const u = new URL(url, issuer);
  return `${u.pathname}${u.search}`;
};
const location = (res: LightMyRequestResponse) => res.headers.location as string;
const unescapeHtml = (s: string) => s.replace(/&amp;/g, '&').replace(/&#39;/g, "'").replace(/&quot;/g, '"');

/** A code for the step `offsetSteps` from now (one step of drift either way is accepted). */
const codeAt = (secret: string, offsetSteps = 0) => generate({ secret, epoch: Math.floor(Date.now() / 1000) + offsetSteps * 30 });

/** Enrols an authenticator app from the Account page; returns its secret and the recovery codes shown. */
async function enrolTotp(p: Person): Promise<{ secret: string; uri: string; recoveryCodes: string[] }> {
  const account = await p.browser.get('/dashboard/account');
  expect(account.statusCode, account.body).toBe(200);
  const started = await p.browser.post('/dashboard/account/totp', { csrf_token: csrfTokenIn(account.body) });
  expect(started.statusCode, started.body).toBe(200);
  const uri = unescapeHtml(/data-totp-uri>([^<]+)</.exec(started.body)?.[1] ?? '');
  expect(uri).toMatch(/^otpauth:\/\/totp\//);
  expect(started.body).toContain('<svg');
  const secret = new URL(uri).searchParams.get('secret')!;
  expect(/data-totp-secret>([^<]+)</.exec(started.body)?.[1]).toBe(secret);
  // Enrolment completes only with a correct code.
  const wrong = await p.browser.post('/dashboard/account/totp/confirm', { csrf_token: csrfTokenIn(started.body), code: (await codeAt(secret)) === '000000' ? '111111' : '000000' });
  expect(wrong.statusCode).toBe(400);
  expect((await db().selectFrom('totp_factors').select('confirmed_at').where('user_id', '=', p.id).executeTakeFirstOrThrow()).confirmed_at).toBeNull();
  const confirmed = await p.browser.post('/dashboard/account/totp/confirm', { csrf_token: csrfTokenIn(started.body), code: await codeAt(secret) });
  expect(confirmed.statusCode, confirmed.body).toBe(200);
  const recoveryCodes = [...confirmed.body.matchAll(/<li><code>([0-9a-z]{4}-[0-9a-z]{4}-[0-9a-z]{4})<\/code><\/li>/g)].map((m) => m[1]!);
  expect(recoveryCodes).toHaveLength(10);
  return { secret, uri, recoveryCodes };
}

async function signOut(p: Person) {
  const account = await p.browser.get('/dashboard/account');
  await p.browser.post('/logout', { csrf_token: csrfTokenIn(account.body) });
  expect(p.browser.cookies.has('orgauth_session')).toBe(false);
}

/** The password step: with a second factor it leads to the second step, never to a session. */
async function passwordStep(p: Person, returnTo = '/dashboard'): Promise<LightMyRequestResponse> {
  const res = await p.browser.login(p.email, PASSWORD, returnTo);
  expect(res.statusCode, res.body).toBe(303);
  return res;
}

async function secondStep(p: Person, code: string): Promise<LightMyRequestResponse> {
  const page = await p.browser.get('/login/second-step');
  expect(page.statusCode, page.body).toBe(200);
  return p.browser.post('/login/second-step', { csrf_token: csrfTokenIn(page.body), code });
}

const request = (scope: string, extra: Record<string, string> = {}) => authorizationRequest(oidc, scope, extra);

/** Approves the consent page for `organizationId` and returns the redirect to the application. */
async function approve(p: Person, consent: LightMyRequestResponse, organizationId: number): Promise<URL> {
  expect(consent.statusCode, consent.body).toBe(200);
  const res = await p.browser.post('/oauth/authorize', { ...hiddenFields(consent.body), organization_id: String(organizationId), decision: 'approve' });
  expect(res.statusCode, res.body).toBe(303);
  return new URL(location(res));
}

describe('an authenticator app (must-show 1)', () => {
  it('is enrolled from the Account page, then signing in takes the password and a code; a code is used once; the ID token says otp and mfa', async () => {
    const ada = await person();
    await ada.browser.login(ada.email, PASSWORD);
    const { secret, uri } = await enrolTotp(ada);
    expect(uri).toContain(encodeURIComponent(ada.email));
    // The secret is sealed at rest: the database holds no base32 secret.
    const stored = await db().selectFrom('totp_factors').select('secret_sealed').where('user_id', '=', ada.id).executeTakeFirstOrThrow();
    expect(stored.secret_sealed).not.toContain(secret);
    expect(stored.secret_sealed.startsWith('v1.')).toBe(true);
    await signOut(ada);

    // An OpenID request signs in: the password, then the second step, then consent.
    const { url, checks } = await request('openid email contacts.read');
    const toLogin = await ada.browser.get(pathOf(url));
    expect(location(toLogin)).toMatch(/^\/login\?/);
    const loginPage = await ada.browser.get(location(toLogin));
    const afterPassword = await ada.browser.post('/login', { ...hiddenFields(loginPage.body), email: ada.email, password: PASSWORD });
    expect(location(afterPassword)).toBe('/login/second-step');
    // MF-2: no session yet; the dashboard, the consent page and /oauth/authorize all send to sign-in.
    expect(ada.browser.cookies.has('orgauth_session')).toBe(false);
    expect(location(await ada.browser.get('/dashboard'))).toMatch(/^\/login/);
    expect(location(await ada.browser.get(pathOf(url)))).toMatch(/^\/login/);
    // The code the app shows now: the one that confirmed the enrolment, if still in its 30 seconds.
    const code = await codeAt(secret);
    const done = await secondStep(ada, code);
    expect(done.statusCode, done.body).toBe(303);
    expect(ada.browser.cookies.has('orgauth_session')).toBe(true);
    const consent = await ada.browser.get(location(done));
    const callback = await approve(ada, consent, world.org.organizationId);
    const tokens = await client.authorizationCodeGrant(oidc, callback, checks);
    const claims = tokens.claims()!;
    expect(claims.amr).toEqual(['pwd', 'otp', 'mfa']);
    expect(claims.acr).toBe(ACR_TWO_FACTORS);

    // The same code again, within its window, is refused.
    await signOut(ada);
    await passwordStep(ada);
    const replay = await secondStep(ada, code);
    expect(replay.statusCode).toBe(400);
    expect(replay.body).toContain('not right, or it was used already');
    expect(ada.browser.cookies.has('orgauth_session')).toBe(false);
    // An older step's code is refused too; a later one signs in.
    expect((await secondStep(ada, await codeAt(secret, -1))).statusCode).toBe(400);
    const next = await secondStep(ada, await codeAt(secret, 1));
    expect(next.statusCode, next.body).toBe(303);
    expect(location(next)).toBe('/dashboard');
  });

  it('a one-step ID token says pwd and the password class', async () => {
    const bob = await person();
    const { url, checks } = await request('openid');
    const toLogin = await bob.browser.get(pathOf(url));
    const loginPage = await bob.browser.get(location(toLogin));
    const signedIn = await bob.browser.post('/login', { ...hiddenFields(loginPage.body), email: bob.email, password: PASSWORD });
    const callback = await approve(bob, await bob.browser.get(location(signedIn)), world.org.organizationId);
    const claims = (await client.authorizationCodeGrant(oidc, callback, checks)).claims()!;
    expect(claims.amr).toEqual(['pwd']);
    expect(claims.acr).toBe(ACR_PASSWORD);
    const doc = (await app.inject({ method: 'GET', url: '/.well-known/openid-configuration' })).json();
    expect(doc.acr_values_supported).toEqual([ACR_PASSWORD, ACR_TWO_FACTORS]);
    expect(doc.claims_supported).toEqual(expect.arrayContaining(['amr', 'acr']));
  });
});

describe('recovery codes', () => {
  it('each signs in once, is recorded and mailed; of concurrent uses of one exactly one wins', async () => {
    const cy = await person();
    await cy.browser.login(cy.email, PASSWORD);
    const { recoveryCodes } = await enrolTotp(cy);
    await signOut(cy);
    await passwordStep(cy);
    // Typed with other case and spaces, it still counts.
    const used = await secondStep(cy, ` ${recoveryCodes[0]!.toUpperCase().replace(/-/g, ' ')} `);
    expect(used.statusCode, used.body).toBe(303);
    const events = await db().selectFrom('account_events').select('action').where('user_id', '=', cy.id).orderBy('id').execute();
    expect(events.map((e) => e.action)).toEqual(['second_factor.totp_added', 'second_factor.recovery_code_used']);
    const mail = await db().selectFrom('mail_outbox').select('subject').where('recipient', '=', cy.email).execute();
    expect(mail.map((m) => m.subject)).toEqual(expect.arrayContaining(['A recovery code was used to sign in to your account']));
    await signOut(cy);

    // Used: refused.
    await passwordStep(cy);
    expect((await secondStep(cy, recoveryCodes[0]!)).statusCode).toBe(400);

    // Two browsers past the password race with one code: exactly one gets a session.
    const other = new Browser(app, '10.99.0.2');
    await other.login(cy.email, PASSWORD);
    const pages = await Promise.all([cy.browser.get('/login/second-step'), other.get('/login/second-step')]);
    const results = await Promise.all([
      cy.browser.post('/login/second-step', { csrf_token: csrfTokenIn(pages[0].body), code: recoveryCodes[1]! }),
      other.post('/login/second-step', { csrf_token: csrfTokenIn(pages[1].body), code: recoveryCodes[1]! }),
    ]);
    expect(results.map((r) => r.statusCode).sort()).toEqual([303, 400]);
    const left = await db().selectFrom('recovery_codes').select('id').where('user_id', '=', cy.id).where('used_at', 'is', null).execute();
    expect(left).toHaveLength(8);
  });

  it('are another user’s: refused', async () => {
    const dee = await person();
    const eve = await person();
    await dee.browser.login(dee.email, PASSWORD);
    const { recoveryCodes } = await enrolTotp(dee);
    await eve.browser.login(eve.email, PASSWORD);
    await enrolTotp(eve);
    await signOut(eve);
    await passwordStep(eve);
    expect((await secondStep(eve, recoveryCodes[0]!)).statusCode).toBe(400);
  });
});

describe('the second step', () => {
  it(`locks after ${SECOND_STEP_MAX_FAILURES} wrong codes, across browsers, audited and mailed once`, async () => {
    const fay = await person();
    await fay.browser.login(fay.email, PASSWORD);
    const { secret } = await enrolTotp(fay);
    // The wrong code tried while confirming the enrolment counted toward the same lock.
    const counted = await db().selectFrom('second_step_failures').select('id').where('user_id', '=', fay.id).execute();
    expect(counted).toHaveLength(1);
    await db().deleteFrom('second_step_failures').where('user_id', '=', fay.id).execute();
    await signOut(fay);
    const right = await codeAt(secret);
    const wrongCode = right === '123456' ? '654321' : '123456';
    const browsers = [fay.browser, new Browser(app, '10.99.1.1'), new Browser(app, '10.99.1.2')];
    for (const b of browsers) await b.login(fay.email, PASSWORD);
    const statuses: number[] = [];
    for (let i = 0; i < SECOND_STEP_MAX_FAILURES; i++) {
      const b = browsers[i % browsers.length]!;
      const page = await b.get('/login/second-step');
      statuses.push((await b.post('/login/second-step', { csrf_token: csrfTokenIn(page.body), code: wrongCode })).statusCode);
    }
    expect(statuses).toEqual([...Array(SECOND_STEP_MAX_FAILURES - 1).fill(400), 429]);
    // Locked: even the right code is refused now.
    const page = await fay.browser.get('/login/second-step');
    const locked = await fay.browser.post('/login/second-step', { csrf_token: csrfTokenIn(page.body), code: right });
    expect(locked.statusCode).toBe(429);
    expect(Number(locked.headers['retry-after'])).toBeGreaterThan(0);
    const events = await db().selectFrom('account_events').select('action').where('user_id', '=', fay.id).where('action', '=', 'second_factor.locked').execute();
    expect(events).toHaveLength(1);
    // When the lock is over, the right code works.
    await db().updateTable('users').set({ second_step_locked_until: new Date(Date.now() - 1000) }).where('id', '=', fay.id).execute();
    const open = await fay.browser.post('/login/second-step', { csrf_token: csrfTokenIn(page.body), code: right });
    expect(open.statusCode, open.body).toBe(303);
  });

  it('is not bypassed by a password reset (MF-5), and a pending sign-in is not a session (MF-2)', async () => {
    const gus = await person();
    await gus.browser.login(gus.email, PASSWORD);
    await enrolTotp(gus);
    await signOut(gus);
    await passwordStep(gus);
    const pendingCookie = gus.browser.cookies.get('orgauth_signin');
    expect(pendingCookie).toMatch(/^[A-Za-z0-9_-]{43}$/);
    // The pending cookie presented as a session cookie is no session.
    const forged = await app.inject({ method: 'GET', url: '/dashboard', headers: { cookie: `orgauth_session=${pendingCookie}` } });
    expect(location(forged)).toMatch(/^\/login/);
    const consent = await app.inject({ method: 'POST', url: '/oauth/authorize', headers: { cookie: `orgauth_signin=${pendingCookie}`, 'content-type': 'application/x-www-form-urlencoded' }, payload: form({ client_id: rp.client_id, redirect_uri: RP_REDIRECT }) });
    expect(consent.statusCode).toBe(403);

    // A reset link changes the password and signs nobody in; the new password still needs the second step.
    const forgot = new Browser(app, '10.99.2.1');
    const page = await forgot.get('/forgot-password');
    await forgot.post('/forgot-password', { csrf_token: csrfTokenIn(page.body), email: gus.email });
    let link: string | undefined;
    for (let i = 0; i < 100 && link === undefined; i++) {
      const message = await db().selectFrom('mail_outbox').select('body_encrypted').where('recipient', '=', gus.email).where('subject', '=', 'Reset your password').executeTakeFirst();
      if (message?.body_encrypted) link = /\/reset-password\?token=[A-Za-z0-9_-]+/.exec(JSON.parse(openText(TEST_SECRET_KEY, 'mail-outbox', message.body_encrypted)).text)?.[0];
      else await new Promise((r) => setTimeout(r, 50));
    }
    const resetPage = await forgot.get(link!);
    const reset = await forgot.post('/reset-password', { ...hiddenFields(resetPage.body), password: 'a-new-password-99' });
    expect(reset.statusCode, reset.body).toBe(200);
    expect(forgot.cookies.has('orgauth_session')).toBe(false);
    const withNew = await forgot.login(gus.email, 'a-new-password-99');
    expect(location(withNew)).toBe('/login/second-step');
    expect(forgot.cookies.has('orgauth_session')).toBe(false);
    const factors = await db().selectFrom('totp_factors').select('confirmed_at').where('user_id', '=', gus.id).executeTakeFirstOrThrow();
    expect(factors.confirmed_at).not.toBeNull();
  });

  it('raises a one-step session when an application asks for two factors with acr_values (step-up), and prompt=none answers interaction_required', async () => {
    const hal = await person();
    // Signed in with the password before having a factor (a one-step session), then enrols on another device.
    await hal.browser.login(hal.email, PASSWORD);
    const elsewhere = new Browser(app, '10.99.3.1');
    await elsewhere.login(hal.email, PASSWORD);
    const { secret } = await enrolTotp({ ...hal, browser: elsewhere });

    const none = await request('openid', { acr_values: ACR_TWO_FACTORS, prompt: 'none' });
    const refused = new URL(location(await hal.browser.get(pathOf(none.url))));
    expect(refused.searchParams.get('error')).toBe('interaction_required');
    expect(refused.searchParams.get('state')).toBe(none.state);

    const { url, checks } = await request('openid', { acr_values: ACR_TWO_FACTORS });
    const stepUp = await hal.browser.get(pathOf(url));
    expect(location(stepUp)).toMatch(/^\/login\/second-step\?return_to=/);
    const page = await hal.browser.get(location(stepUp));
    const before = hal.browser.cookies.get('orgauth_session');
    const done = await hal.browser.post('/login/second-step', { csrf_token: csrfTokenIn(page.body), code: await codeAt(secret), return_to: hiddenFields(page.body).return_to! });
    expect(done.statusCode, done.body).toBe(303);
    // A new session id for the higher assurance.
    expect(hal.browser.cookies.get('orgauth_session')).not.toBe(before);
    const callback = await approve(hal, await hal.browser.get(location(done)), world.org.organizationId);
    const claims = (await client.authorizationCodeGrant(oidc, callback, checks)).claims()!;
    expect(claims.acr).toBe(ACR_TWO_FACTORS);
    expect(claims.amr).toEqual(['pwd', 'otp', 'mfa']);
  });

  it('asks a user without a second factor to set one up when an application wants two', async () => {
    const ida = await person();
    await ida.browser.login(ida.email, PASSWORD);
    const { url } = await request('openid', { acr_values: ACR_TWO_FACTORS });
    const stepUp = await ida.browser.get(pathOf(url));
    const page = await ida.browser.get(location(stepUp));
    expect(page.statusCode).toBe(403);
    expect(page.body).toContain('/dashboard/account?return_to=');
  });
});

describe('changing how an account signs in', () => {
  it('needs a two-factor session once the account has a factor: a password-only session is sent to the second step, and changes nothing', async () => {
    const max = await person();
    // A session from before the factor: a password alone.
    await max.browser.login(max.email, PASSWORD);
    const other = new Browser(app, '10.99.4.1');
    await other.login(max.email, PASSWORD);
    const { secret, recoveryCodes } = await enrolTotp({ ...max, browser: other });
    const account = await max.browser.get('/dashboard/account');
    expect(account.body).toContain('confirm it is you with your second factor');
    const csrf_token = csrfTokenIn(account.body);
    for (const path of ['/dashboard/account/totp/remove', '/dashboard/account/recovery-codes']) {
      const res = await max.browser.post(path, { csrf_token, current_password: PASSWORD });
      expect(res.statusCode).toBe(303);
      expect(location(res)).toBe(`/login/second-step?return_to=${encodeURIComponent('/dashboard/account')}`);
    }
    const passkeyOptions = await app.inject({ method: 'POST', url: '/dashboard/account/passkeys/options', headers: { cookie: `orgauth_session=${max.browser.cookies.get('orgauth_session')}`, 'content-type': 'application/json', 'x-csrf-token': csrf_token }, payload: { current_password: PASSWORD } });
    expect(passkeyOptions.statusCode).toBe(403);
    expect((await db().selectFrom('totp_factors').select('confirmed_at').where('user_id', '=', max.id).executeTakeFirstOrThrow()).confirmed_at).not.toBeNull();
    const left = await db().selectFrom('recovery_codes').select('id').where('user_id', '=', max.id).where('used_at', 'is', null).execute();
    expect(left).toHaveLength(recoveryCodes.length);
    // With the second step taken, the same session may (a new one, with two factors).
    const page = await max.browser.get(`/login/second-step?return_to=${encodeURIComponent('/dashboard/account')}`);
    const raised = await max.browser.post('/login/second-step', { csrf_token: csrfTokenIn(page.body), code: await codeAt(secret), return_to: '/dashboard/account' });
    expect(location(raised)).toBe('/dashboard/account');
    const removed = await max.browser.post('/dashboard/account/totp/remove', { csrf_token: csrfTokenIn((await max.browser.get('/dashboard/account')).body) });
    expect(removed.statusCode, removed.body).toBe(200);
    expect(await db().selectFrom('totp_factors').select('user_id').where('user_id', '=', max.id).execute()).toEqual([]);
  });

  it('binds an enrolment to the session that started it, and confirming it gives that browser a new session', async () => {
    const ned = await person();
    await ned.browser.login(ned.email, PASSWORD);
    const other = new Browser(app, '10.99.5.1');
    await other.login(ned.email, PASSWORD);
    const started = await ned.browser.post('/dashboard/account/totp', { csrf_token: csrfTokenIn((await ned.browser.get('/dashboard/account')).body) });
    const secret = new URL(unescapeHtml(/data-totp-uri>([^<]+)</.exec(started.body)![1]!)).searchParams.get('secret')!;
    // Another session of the same user sees no key and cannot confirm it.
    const elsewhere = await other.get('/dashboard/account');
    expect(elsewhere.body).not.toContain(secret);
    const refused = await other.post('/dashboard/account/totp/confirm', { csrf_token: csrfTokenIn(elsewhere.body), code: await codeAt(secret) });
    expect(refused.statusCode).toBe(409);
    const before = ned.browser.cookies.get('orgauth_session');
    const confirmed = await ned.browser.post('/dashboard/account/totp/confirm', { csrf_token: csrfTokenIn(started.body), code: await codeAt(secret) });
    expect(confirmed.statusCode).toBe(200);
    expect(ned.browser.cookies.get('orgauth_session')).not.toBe(before);
    // The old cookie (a copy someone took) is no session any more.
    const copied = await app.inject({ method: 'GET', url: '/dashboard', headers: { cookie: `orgauth_session=${before}` } });
    expect(location(copied)).toMatch(/^\/login/);
  });

  it('a password change ends the sign-ins waiting at the second step', async () => {
    const ora = await person();
    await ora.browser.login(ora.email, PASSWORD);
    await enrolTotp(ora);
    const waiting = new Browser(app, '10.99.6.1');
    await waiting.login(ora.email, PASSWORD);
    expect((await waiting.get('/login/second-step')).statusCode).toBe(200);
    const account = await ora.browser.get('/dashboard/account');
    const changed = await ora.browser.post('/dashboard/account/password', { csrf_token: csrfTokenIn(account.body), current_password: PASSWORD, new_password: 'another-password-2' });
    expect(changed.statusCode).toBe(200);
    expect(location(await waiting.get('/login/second-step'))).toBe('/login');
  });
});

describe('an organization that requires two-step sign-in (must-show 3)', () => {
  it('a member without a second factor gets no code for it through the consent page, and gets one after enrolling', async () => {
    const owner = await createUser(db(), { email: `mfa-owner-${Date.now()}@example.com`, password: PASSWORD, name: 'Owner' });
    const strict = await createOrganization(db(), { name: `Strict ${Date.now()}`, ownerUserId: owner.id });
    await db().updateTable('organizations').set({ require_mfa: true }).where('id', '=', strict.id).execute();
    const jo = await person();
    await addMember(db(), { organizationId: strict.id, userId: jo.id, role: 'member' });
    await jo.browser.login(jo.email, PASSWORD);

    const { url, checks } = await request('openid contacts.read');
    const consent = await jo.browser.get(pathOf(url));
    expect(consent.statusCode).toBe(200);
    // Shown with the reason and a link to set it up, but not choosable.
    expect(consent.body).toContain('requires two-step sign-in');
    expect(consent.body).toMatch(new RegExp(`value="${strict.id}" required disabled`));
    const refused = await jo.browser.post('/oauth/authorize', { ...hiddenFields(consent.body), organization_id: String(strict.id), decision: 'approve' });
    expect(refused.statusCode).toBe(403);
    // Its dashboard sends to the Account page first.
    await jo.browser.post('/dashboard/organization', { csrf_token: csrfTokenIn((await jo.browser.get('/dashboard/account')).body), organization_id: String(strict.id) });
    const toAccount = await jo.browser.get('/dashboard/members');
    expect(location(toAccount)).toBe(`/dashboard/account?return_to=${encodeURIComponent('/dashboard/members')}`);

    await enrolTotp(jo);
    const again = await jo.browser.get(pathOf(url));
    const callback = await approve(jo, again, strict.id);
    const tokens = await client.authorizationCodeGrant(oidc, callback, checks);
    expect(tokens.organization_id).toBe(strict.id);
    expect(tokens.claims()!.amr).toContain('mfa');
    // The new session of the enrolment kept the organization chosen before it.
    const members = await jo.browser.get('/dashboard/members');
    expect(members.statusCode).toBe(200);
    expect(members.body).toContain(`Two-step sign-in is <strong>required</strong> in ${strict.name}`);
  });

  it('a code or a grant from a one-step sign-in is refused once the requirement is on; members list who has a second factor', async () => {
    const kit = await person();
    await kit.browser.login(kit.email, PASSWORD);
    const { url, checks } = await request('openid contacts.read');
    const callback = await approve(kit, await kit.browser.get(pathOf(url)), world.org.organizationId);
    const tokens = await client.authorizationCodeGrant(oidc, callback, checks);
    // A code issued before the switch, redeemed after it.
    const second = await request('openid contacts.read');
    const pendingCallback = new URL(location(await kit.browser.get(pathOf(second.url))));
    await db().updateTable('organizations').set({ require_mfa: true }).where('id', '=', world.org.organizationId).execute();
    try {
      await expect(client.authorizationCodeGrant(oidc, pendingCallback, second.checks)).rejects.toMatchObject({ error: 'invalid_grant', error_description: expect.stringContaining('two-step') });
      await expect(client.refreshTokenGrant(oidc, tokens.refresh_token!)).rejects.toMatchObject({ error: 'invalid_grant', error_description: expect.stringContaining('two-step') });
      // A private application's own token: no person signs in, nothing changes.
      const own = await clientCredentialsToken(app, world.org, 'contacts.read');
      const contacts = await app.inject({ method: 'GET', url: `/api/v1/${world.org.organizationId}/contacts`, headers: { authorization: `Bearer ${own}` } });
      expect(contacts.statusCode).toBe(200);
    } finally {
      await db().updateTable('organizations').set({ require_mfa: false }).where('id', '=', world.org.organizationId).execute();
    }
    // Switched off again, the grant refreshes.
    expect((await client.refreshTokenGrant(oidc, tokens.refresh_token!)).access_token).toBeDefined();
  });
});

describe('the CLI and the management API', () => {
  it('orgauth user reset-mfa removes every factor, records and mails it', async () => {
    const { runCommandLine } = await import('../../src/cli/index.js');
    const lee = await person();
    await lee.browser.login(lee.email, PASSWORD);
    await enrolTotp(lee);
    const outcome = await runCommandLine(['user', 'reset-mfa', '--email', lee.email, '--json'], { db: db(), config: world.config, applied: [] });
    expect(outcome.code).toBe(0);
    expect(JSON.parse(outcome.stdout)).toEqual({ user_id: lee.id, email: lee.email, totp: true, recovery_codes: 10, passkeys: 0 });
    expect(await db().selectFrom('totp_factors').select('user_id').where('user_id', '=', lee.id).execute()).toEqual([]);
    const events = await db().selectFrom('account_events').select('action').where('user_id', '=', lee.id).orderBy('id', 'desc').limit(1).execute();
    expect(events[0]?.action).toBe('second_factor.reset_by_administrator');
    // A reset may follow a takeover: every session of the user ended with it.
    expect(await db().selectFrom('sessions').select('id').where('user_id', '=', lee.id).execute()).toEqual([]);
    expect(location(await lee.browser.get('/dashboard'))).toMatch(/^\/login/);
    // Signing in is one step again.
    expect(location(await lee.browser.login(lee.email, PASSWORD))).toBe('/dashboard');
  });

  it('orgauth org update --require-mfa yes|no', async () => {
    const { runCommandLine } = await import('../../src/cli/index.js');
    const on = await runCommandLine(['org', 'update', '--org', String(world.org.organizationId), '--require-mfa', 'yes', '--json'], { db: db(), config: world.config, applied: [] });
    expect(on.code, on.stderr).toBe(0);
    expect(JSON.parse(on.stdout)).toMatchObject({ id: world.org.organizationId, require_mfa: true });
    const bad = await runCommandLine(['org', 'update', '--org', String(world.org.organizationId), '--require-mfa', 'maybe'], { db: db(), config: world.config, applied: [] });
    expect(bad.code).not.toBe(0);
    const off = await runCommandLine(['org', 'update', '--org', String(world.org.organizationId), '--require-mfa', 'no', '--json'], { db: db(), config: world.config, applied: [] });
    expect(JSON.parse(off.stdout)).toMatchObject({ require_mfa: false });
    const audit = await db().selectFrom('audit_events').select('details').where('organization_id', '=', world.org.organizationId).where('action', '=', 'organization.updated').execute();
    expect(audit.map((a) => a.details)).toEqual([{ require_mfa: true }, { require_mfa: false }]);
  });
});
