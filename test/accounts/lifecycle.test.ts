/**
 * The account lifecycle through the real pages and a real SMTP server (smtp-server, started
 * here): password reset, email verification and change, invitations from the dashboard and the
 * API. Links are read out of the messages the server received, as a user would follow them.
 */
import type { FastifyInstance } from 'fastify';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { issueAccountToken } from '../../src/accounts/account-tokens.js';
import { resetPassword } from '../../src/accounts/password-reset.js';
import { hashPassword } from '../../src/accounts/passwords.js';
import { createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { KNOWN_SCOPES } from '../../src/oauth/helpers/scopes.js';
import { buildTestApp, TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { clientCredentialsToken, createOrgFixture, type OrgFixture } from '../helpers/oauth.js';
import { linkIn, type ReceivedMail, TestSmtpServer } from '../helpers/smtp.js';
import { Browser, csrfTokenIn, expectPageSecurityHeaders } from './browser.js';

const ISSUER = 'http://localhost:3000';
const PASSWORD = 'lifecycle-password-1';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let smtp: TestSmtpServer;
let app: FastifyInstance;
let n = 0;
const db = () => t.handle.db;
const address = (label: string) => `${label}-${++n}@example.com`;
/** A path and query from a link in a message. */
const pathOf = (link: string) => link.slice(ISSUER.length);

beforeAll(async () => {
  t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  smtp = await TestSmtpServer.start();
  app = await buildTestApp(t.handle.db, { env: { SMTP_URL: smtp.url, MAIL_FROM: 'Orgauth Tests <auth@example.com>' }, listen: t.handle.listen });
});
afterAll(async () => {
  await app?.close();
  await smtp?.stop();
  await t?.close();
});

/**
 * An account whose address is not confirmed yet (made by the operator with emailVerified false,
 * or before sign-up confirmed addresses: sign-up now makes accounts only from the mailed link),
 * signed in, owning an organization, with its first confirmation link sent from the Account page.
 */
async function unconfirmedAccount(browser: Browser, email: string, organizationName = `Org of ${email}`) {
  const created = await createUser(db(), { email, password: PASSWORD, name: 'New Person', emailVerified: false });
  await createOrganization(db(), { name: organizationName, ownerUserId: created.id });
  expect((await browser.login(email, PASSWORD)).statusCode).toBe(303);
  const account = await browser.get('/dashboard/account');
  expect((await browser.post('/dashboard/account/email/verify', { csrf_token: csrfTokenIn(account.body) })).statusCode).toBe(200);
  return (await db().selectFrom('users').select(['id', 'email_verified_at']).where('email', '=', email).executeTakeFirstOrThrow());
}

async function requestReset(browser: Browser, email: string) {
  const csrf_token = await browser.csrf('/forgot-password');
  return browser.post('/forgot-password', { csrf_token, email });
}

async function followReset(browser: Browser, mail: ReceivedMail, password: string) {
  const page = await browser.get(pathOf(linkIn(mail, `${ISSUER}/reset-password?token=`)));
  expect(page.statusCode).toBe(200);
  const token = /name="token" value="([^"]+)"/.exec(page.body)![1]!;
  return browser.post('/reset-password', { csrf_token: csrfTokenIn(page.body), token, password });
}

describe(`password reset by email on ${BACKEND}`, () => {
  it('resets a forgotten password end to end: the old password and every other session stop working, and each organization audits it', async () => {
    const email = address('forgetful');
    const user = await createUser(db(), { email, password: PASSWORD });
    const org = await db().insertInto('organizations').values({ name: 'Forgetful Org' }).returning('id').executeTakeFirstOrThrow();
    await db().insertInto('memberships').values({ organization_id: org.id, user_id: user.id, role: 'owner' }).execute();
    const laptop = new Browser(app, '10.0.0.1');
    const phone = new Browser(app, '10.0.0.2');
    expect((await laptop.login(email, PASSWORD)).statusCode).toBe(303);
    expect((await phone.login(email, PASSWORD)).statusCode).toBe(303);
    expect((await phone.get('/dashboard')).statusCode).toBe(200);

    const stranger = new Browser(app, '10.0.0.3');
    const asked = await requestReset(stranger, email);
    expect(asked.statusCode).toBe(200);
    expect(asked.body).toContain('If an account uses that address');
    const mail = await smtp.waitFor(email, /Reset your password/);
    expect(mail.from).toBe('auth@example.com');
    expect(mail.html).toContain('Choose a new password');

    const newPassword = 'brand-new-password-2';
    const done = await followReset(stranger, mail, newPassword);
    expect(done.statusCode).toBe(200);
    expect(done.body).toContain('Password changed');

    // Every session that was signed in is signed out.
    for (const browser of [laptop, phone]) {
      const res = await browser.get('/dashboard');
      expect(res.statusCode).toBe(303);
      expect(res.headers.location).toMatch(/^\/login/);
    }
    const old = await new Browser(app, '10.0.0.4').login(email, PASSWORD);
    expect(old.statusCode).toBe(400);
    expect(old.body).toContain('Incorrect email or password.');
    expect((await new Browser(app, '10.0.0.5').login(email, newPassword)).statusCode).toBe(303);

    // The link was used once: following it again does nothing.
    const again = await stranger.get(pathOf(linkIn(mail, `${ISSUER}/reset-password?token=`)));
    expect(again.statusCode).toBe(404);
    expectPageSecurityHeaders(again);
    const audit = await db().selectFrom('audit_events').select(['action', 'actor_user_id']).where('organization_id', '=', org.id).where('action', '=', 'user.password_reset').execute();
    expect(audit).toEqual([{ action: 'user.password_reset', actor_user_id: user.id }]);
  });

  it('answers /forgot-password the same for an existing and an unknown address, and mails only the existing one', async () => {
    const known = address('known');
    await createUser(db(), { email: known, password: PASSWORD });
    const unknown = address('unknown');
    const browser = new Browser(app, '10.0.1.1');
    const a = await requestReset(browser, known);
    const b = await requestReset(browser, unknown);
    const strip = (body: string) => body.replace(/name="csrf_token" value="[^"]+"/, '');
    expect(a.statusCode).toBe(b.statusCode);
    expect(strip(a.body)).toBe(strip(b.body));
    expect(Object.keys(a.headers).sort()).toEqual(Object.keys(b.headers).sort());
    await smtp.waitFor(known, /Reset your password/);
    await app.inject({ method: 'GET', url: '/health/ready' });
    expect(smtp.to(unknown)).toEqual([]);
  });

  it('keeps the link unused when the new password is refused, and expires it after 30 minutes', async () => {
    const email = address('picky');
    await createUser(db(), { email, password: PASSWORD });
    const browser = new Browser(app, '10.0.2.1');
    await requestReset(browser, email);
    const mail = await smtp.waitFor(email, /Reset your password/);
    const short = await followReset(browser, mail, 'short');
    expect(short.statusCode).toBe(400);
    expect(short.body).toContain('must be 10 to 1024 characters');
    // Still good after the refusal …
    expect((await browser.get(pathOf(linkIn(mail, `${ISSUER}/reset-password?token=`)))).statusCode).toBe(200);
    const row = await db().selectFrom('account_tokens').select(sql<number>`extract(epoch from expires_at - created_at)`.as('ttl')).where('email', '=', email).executeTakeFirstOrThrow();
    expect(Number(row.ttl)).toBe(1800);
    // … and dead once expired.
    await db().updateTable('account_tokens').set({ expires_at: new Date(Date.now() - 1000) }).where('email', '=', email).execute();
    expect((await browser.get(pathOf(linkIn(mail, `${ISSUER}/reset-password?token=`)))).statusCode).toBe(404);
  });

  it('resets once when the same link is submitted twice at the same moment', async () => {
    const email = address('double');
    const user = await createUser(db(), { email, password: PASSWORD });
    const token = await issueAccountToken(db(), { purpose: 'reset_password', userId: user.id, email, ttlSeconds: 1800 });
    const results = await Promise.all(['first-new-password', 'second-new-password'].map(async (p) => resetPassword(db(), token, await hashPassword(p))));
    expect(results.filter((r) => r === user.id)).toHaveLength(1);
    expect(results.filter((r) => r === undefined)).toHaveLength(1);
  });

  it('refuses addresses a mailer would read as a name, a list or a group', async () => {
    const browser = new Browser(app, '10.0.6.1');
    for (const email of ['Bob <me@evil.example>', 'victim@example.com,me@evil.example', 'group:me@evil.example;', '"quoted"@example.com']) {
      const csrf_token = await browser.csrf('/signup');
      const res = await browser.post('/signup', { csrf_token, email, password: PASSWORD, organization_name: 'Spam Inc' });
      expect(res.statusCode, email).toBe(400);
    }
  });

  it('throttles reset requests per address and per IP, whether or not the address has an account', async () => {
    const browser = new Browser(app, '10.0.3.1');
    const target = address('throttled');
    for (let i = 0; i < 5; i++) expect((await requestReset(browser, target)).statusCode).toBe(200);
    const refused = await requestReset(browser, target);
    expect(refused.statusCode).toBe(429);
    expect(refused.headers['retry-after']).toMatch(/^[0-9]+$/);
    const busy = new Browser(app, '10.0.3.2');
    for (let i = 0; i < 20; i++) expect((await requestReset(busy, address('spray'))).statusCode).toBe(200);
    expect((await requestReset(busy, address('spray'))).statusCode).toBe(429);
  });

  it('sends one account at most 3 reset links an hour, used or not, whichever instance is asked', async () => {
    const email = address('hourly');
    const user = await createUser(db(), { email, password: PASSWORD });
    // A second instance: its page throttles are its own, the database's count is shared.
    const second = await buildTestApp(db(), { env: { SMTP_URL: smtp.url } });
    try {
      for (const [i, target] of [app, second, app, second].entries()) {
        expect((await requestReset(new Browser(target, `10.0.5.${i}`), email)).statusCode).toBe(200);
        await expect.poll(async () => (await db().selectFrom('account_tokens').select('id').where('user_id', '=', user.id).execute()).length, { timeout: 15_000 }).toBe(Math.min(i + 1, 3));
        // Used links count too.
        await db().updateTable('account_tokens').set({ expires_at: new Date() }).where('user_id', '=', user.id).execute();
      }
      await expect.poll(() => smtp.to(email).length, { timeout: 15_000 }).toBe(3);
    } finally {
      await second.close();
    }
  });

  it('makes every earlier link stop working when the password changes', async () => {
    const email = address('changer');
    await createUser(db(), { email, password: PASSWORD });
    const browser = new Browser(app, '10.0.4.1');
    await requestReset(browser, email);
    const mail = await smtp.waitFor(email, /Reset your password/);
    const owner = new Browser(app, '10.0.4.2');
    await owner.login(email, PASSWORD);
    const csrf_token = await owner.csrf('/dashboard/account');
    const changed = await owner.post('/dashboard/account/password', { csrf_token, current_password: PASSWORD, new_password: 'changed-password-3' });
    expect(changed.statusCode).toBe(200);
    expect((await browser.get(pathOf(linkIn(mail, `${ISSUER}/reset-password?token=`)))).statusCode).toBe(404);
  });
});

describe(`email verification on ${BACKEND}`, () => {
  it('sends a link to an unconfirmed address; following it (a button, not the GET) verifies the address; resending is throttled', async () => {
    const email = address('signup');
    const browser = new Browser(app, '10.1.0.1');
    const user = await unconfirmedAccount(browser, email);
    expect(user.email_verified_at).toBeNull();
    const mail = await smtp.waitFor(email, /Confirm your email address/);
    const link = pathOf(linkIn(mail, `${ISSUER}/verify-email?token=`));
    // Opening the link (a mail scanner would) uses nothing, and without the account's session nothing can be confirmed.
    const stranger = new Browser(app, '10.1.0.2');
    const page = await stranger.get(link);
    expect(page.statusCode).toBe(200);
    expect(page.body).toContain('Sign in to confirm');
    expect(page.body).not.toContain('name="token"');
    const token0 = new URL(linkIn(mail, `${ISSUER}/verify-email?token=`)).searchParams.get('token')!;
    expect((await stranger.post('/verify-email', { csrf_token: await stranger.csrf('/forgot-password'), token: token0 })).statusCode).toBe(403);
    // Signed in to another account: the link is not that account's, and stays unused.
    const squatter = new Browser(app, '10.1.0.3');
    const otherEmail = address('other-account');
    await createUser(db(), { email: otherEmail, password: PASSWORD });
    await squatter.login(otherEmail, PASSWORD);
    expect((await squatter.get(link)).body).toContain('this link is for another account');
    const other = await squatter.post('/verify-email', { csrf_token: csrfTokenIn((await squatter.get('/dashboard/account')).body), token: token0 });
    expect(other.statusCode).toBe(404);
    expect((await db().selectFrom('users').select('email_verified_at').where('id', '=', user.id).executeTakeFirstOrThrow()).email_verified_at).toBeNull();

    // Resend: once a minute at most.
    const account = await browser.get('/dashboard/account');
    expect(account.body).toContain('You have not confirmed');
    const resent = await browser.post('/dashboard/account/email/verify', { csrf_token: csrfTokenIn(account.body) });
    expect(resent.statusCode).toBe(429);
    await db().updateTable('account_tokens').set({ created_at: new Date(Date.now() - 120_000) }).where('user_id', '=', user.id).execute();
    expect((await browser.post('/dashboard/account/email/verify', { csrf_token: csrfTokenIn(account.body) })).statusCode).toBe(200);
    await expect.poll(() => smtp.to(email).length, { timeout: 15_000 }).toBe(2);

    // Only the newest link works.
    const newest = smtp.to(email)[1]!;
    const oldPage = await browser.get(link);
    expect(oldPage.statusCode).toBe(404);
    const confirmPage = await browser.get(pathOf(linkIn(newest, `${ISSUER}/verify-email?token=`)));
    const token = /name="token" value="([^"]+)"/.exec(confirmPage.body)![1]!;
    const confirmed = await browser.post('/verify-email', { csrf_token: csrfTokenIn(confirmPage.body), token });
    expect(confirmed.statusCode).toBe(200);
    expect(confirmed.body).toContain('is confirmed');
    expect((await db().selectFrom('users').select('email_verified_at').where('id', '=', user.id).executeTakeFirstOrThrow()).email_verified_at).not.toBeNull();
    expect((await browser.post('/verify-email', { csrf_token: csrfTokenIn(confirmPage.body), token })).statusCode).toBe(404);
  });

  it('sends at most 5 verification links an hour, however far apart', async () => {
    const email = address('resender');
    const browser = new Browser(app, '10.1.3.1');
    const user = await unconfirmedAccount(browser, email);
    const page = await browser.get('/dashboard/account');
    for (let sent = 1; sent < 5; sent++) {
      await db().updateTable('account_tokens').set({ created_at: sql`created_at - interval '61 seconds'` }).where('user_id', '=', user.id).execute();
      expect((await browser.post('/dashboard/account/email/verify', { csrf_token: csrfTokenIn(page.body) })).statusCode).toBe(200);
    }
    await db().updateTable('account_tokens').set({ created_at: sql`created_at - interval '61 seconds'` }).where('user_id', '=', user.id).execute();
    const refused = await browser.post('/dashboard/account/email/verify', { csrf_token: csrfTokenIn(page.body) });
    expect(refused.statusCode).toBe(429);
    await expect.poll(() => smtp.to(email).length, { timeout: 15_000 }).toBe(5);
  });

  it('changes the email address only once the new address confirms it, and tells the old one', async () => {
    const email = address('mover');
    const user = await createUser(db(), { email, password: PASSWORD });
    const browser = new Browser(app, '10.1.1.1');
    await browser.login(email, PASSWORD);
    const account = await browser.get('/dashboard/account');
    const next = address('moved');
    const wrong = await browser.post('/dashboard/account/email', { csrf_token: csrfTokenIn(account.body), email: next, current_password: 'not-my-password' });
    expect(wrong.statusCode).toBe(400);
    const asked = await browser.post('/dashboard/account/email', { csrf_token: csrfTokenIn(account.body), email: next, current_password: PASSWORD });
    expect(asked.statusCode).toBe(200);
    expect(asked.body).toContain(`Waiting for you to confirm <strong>${next}</strong>`);
    // Not yet: the account keeps its address.
    expect((await db().selectFrom('users').select('email').where('id', '=', user.id).executeTakeFirstOrThrow()).email).toBe(email);
    const mail = await smtp.waitFor(next, /Confirm your new email address/);
    const page = await browser.get(pathOf(linkIn(mail, `${ISSUER}/verify-email?token=`)));
    const done = await browser.post('/verify-email', { csrf_token: csrfTokenIn(page.body), token: /name="token" value="([^"]+)"/.exec(page.body)![1]! });
    expect(done.statusCode).toBe(200);
    expect((await db().selectFrom('users').select('email').where('id', '=', user.id).executeTakeFirstOrThrow()).email).toBe(next);
    const notice = await smtp.waitFor(email, /Your email address was changed/);
    expect(notice.text).toContain(next);
    expect((await new Browser(app, '10.1.1.2').login(next, PASSWORD)).statusCode).toBe(303);
  });

  it('refuses to let others add an unverified user to an organization (dashboard and API)', async () => {
    const fixture = await createOrgFixture(db(), { scopes: KNOWN_SCOPES.join(' ') });
    const email = address('unverified');
    await createUser(db(), { email, password: PASSWORD, emailVerified: false });
    const token = await clientCredentialsToken(app, fixture);
    const res = await app.inject({ method: 'POST', url: `/api/v1/${fixture.organizationId}/members`, headers: { authorization: `Bearer ${token}` }, payload: { email, role: 'member' } });
    expect(res.statusCode).toBe(409);
    expect(res.json().error_description).toMatch(/not verified/);
    const owner = await db().selectFrom('users').select('email').where('id', '=', fixture.ownerId).executeTakeFirstOrThrow();
    const browser = new Browser(app, '10.1.2.1');
    await browser.login(owner.email, 'owner-password-1');
    const page = await browser.get('/dashboard/members');
    const added = await browser.post('/dashboard/members', { csrf_token: csrfTokenIn(page.body), email, role: 'member' });
    expect(added.statusCode).toBe(400);
    expect(added.body).toContain('has not confirmed their email address');
  });
});

describe(`invitations on ${BACKEND}`, () => {
  async function ownerBrowser(fixture: OrgFixture): Promise<Browser> {
    const owner = await db().selectFrom('users').select('email').where('id', '=', fixture.ownerId).executeTakeFirstOrThrow();
    const browser = new Browser(app, '10.2.0.1');
    expect((await browser.login(owner.email, 'owner-password-1')).statusCode).toBe(303);
    return browser;
  }

  async function invite(browser: Browser, email: string, role: string) {
    const page = await browser.get('/dashboard/members');
    return browser.post('/dashboard/invitations', { csrf_token: csrfTokenIn(page.body), email, role });
  }

  const invitationPath = (mail: ReceivedMail) => pathOf(linkIn(mail, `${ISSUER}/invitation?token=`));
  const tokenOf = (mail: ReceivedMail) => new URL(linkIn(mail, `${ISSUER}/invitation?token=`)).searchParams.get('token')!;

  it('lets an owner invite an address with no account; the invitee signs up from the link and is a member with that role; the invitation is then spent', async () => {
    const fixture = await createOrgFixture(db());
    const owner = await ownerBrowser(fixture);
    const email = address('invitee');
    const sent = await invite(owner, email, 'admin');
    expect(sent.statusCode).toBe(303);
    expect(sent.headers.location).toBe('/dashboard/members');
    const members = await owner.get('/dashboard/members');
    expect(members.body).toContain(`Invitation sent to ${email}`);
    expect(members.body).toMatch(new RegExp(`<td data-label="Email">${email}</td><td data-label="Role">admin</td>`));
    const mail = await smtp.waitFor(email, /You are invited to join/);
    expect(mail.text).toContain(fixture.organizationName);

    const invitee = new Browser(app, '10.2.0.2');
    const page = await invitee.get(invitationPath(mail));
    expect(page.statusCode).toBe(200);
    expectPageSecurityHeaders(page);
    expect(page.body).toContain(`value="${email}"`);
    const joined = await invitee.post('/invitation/signup', { csrf_token: csrfTokenIn(page.body), token: tokenOf(mail), name: 'Invited Person', password: PASSWORD });
    expect(joined.statusCode).toBe(303);
    expect(joined.headers.location).toBe('/dashboard');
    const user = await db().selectFrom('users').select(['id', 'email_verified_at']).where('email', '=', email).executeTakeFirstOrThrow();
    expect(user.email_verified_at).not.toBeNull();
    const membership = await db().selectFrom('memberships').select('role').where('organization_id', '=', fixture.organizationId).where('user_id', '=', user.id).executeTakeFirstOrThrow();
    expect(membership.role).toBe('admin');
    const dashboard = await invitee.get('/dashboard');
    // Their only organization, with the invited role, in the switcher's place.
    expect(dashboard.body).toContain(`Organization: <strong>${fixture.organizationName}</strong> (admin)`);
    const audit = await db().selectFrom('audit_events').select('action').where('organization_id', '=', fixture.organizationId).where('action', 'like', 'invitation.%').orderBy('id').execute();
    expect(audit.map((a) => a.action)).toEqual(['invitation.created', 'invitation.accepted']);

    // Reused: the link does nothing.
    expect((await new Browser(app, '10.2.0.3').get(invitationPath(mail))).statusCode).toBe(404);
    const reuse = await new Browser(app, '10.2.0.4').post('/invitation/signup', { csrf_token: 'x', token: tokenOf(mail), password: PASSWORD });
    expect(reuse.statusCode).toBe(403);
    expect((await owner.get('/dashboard/members')).body).not.toContain(`<td data-label="Email">${email}</td><td data-label="Role">admin</td>\n      <td data-label="Sent">`);
  });

  it('does nothing with an expired, revoked or replaced invitation', async () => {
    const fixture = await createOrgFixture(db());
    const owner = await ownerBrowser(fixture);
    const expired = address('expired');
    const revoked = address('revoked');
    const resent = address('resent');
    for (const email of [expired, revoked, resent]) await invite(owner, email, 'member');
    const mails = await Promise.all([expired, revoked, resent].map((e) => smtp.waitFor(e, /You are invited/)));
    await db().updateTable('invitations').set({ expires_at: new Date(Date.now() - 1000) }).where('email', '=', expired).execute();
    const ids = Object.fromEntries((await db().selectFrom('invitations').select(['id', 'email']).where('organization_id', '=', fixture.organizationId).execute()).map((r) => [r.email, r.id]));
    const page = await owner.get('/dashboard/members');
    expect(page.body).toContain('>expired<');
    // Revoking asks first; the confirmation page's form revokes it.
    const ask = await owner.post(`/dashboard/invitations/${ids[revoked]}/revoke`, { csrf_token: csrfTokenIn(page.body) });
    expect(ask.statusCode).toBe(200);
    expect(ask.body).toContain(`Revoke the invitation to ${revoked}?`);
    expect((await owner.post(`/dashboard/invitations/${ids[revoked]}/revoke`, { csrf_token: csrfTokenIn(page.body), confirm: 'revoke' })).statusCode).toBe(303);
    const again = await owner.post(`/dashboard/invitations/${ids[resent]}/resend`, { csrf_token: csrfTokenIn(page.body) });
    expect(again.statusCode).toBe(303);
    await expect.poll(() => smtp.to(resent).length, { timeout: 15_000 }).toBe(2);

    for (const mail of mails) {
      const visitor = new Browser(app, '10.2.1.9');
      const res = await visitor.get(invitationPath(mail));
      expect(res.statusCode).toBe(404);
      expect(res.body).toContain('Ask for a new invitation');
      const pre = await visitor.csrf('/forgot-password');
      expect((await visitor.post('/invitation/signup', { csrf_token: pre, token: tokenOf(mail), password: PASSWORD })).statusCode).toBe(404);
    }
    const members = await db().selectFrom('memberships').innerJoin('users', 'users.id', 'memberships.user_id').select('users.email').where('organization_id', '=', fixture.organizationId).execute();
    expect(members.map((m) => m.email)).not.toEqual(expect.arrayContaining([expired]));
    expect(await db().selectFrom('users').select('id').where('email', 'in', [expired, revoked, resent]).execute()).toEqual([]);
    // The re-sent link works.
    const fresh = smtp.to(resent)[1]!;
    expect((await new Browser(app, '10.2.1.8').get(invitationPath(fresh))).statusCode).toBe(200);
  });

  it('lets an existing user accept only when signed in as the invited, verified address', async () => {
    const fixture = await createOrgFixture(db());
    const owner = await ownerBrowser(fixture);
    const email = address('existing');
    const user = await createUser(db(), { email, password: PASSWORD, emailVerified: false });
    await invite(owner, email, 'member');
    const mail = await smtp.waitFor(email, /You are invited/);

    const signedOut = await new Browser(app, '10.2.2.1').get(invitationPath(mail));
    expect(signedOut.body).toContain('There is already an account for this address');

    const other = new Browser(app, '10.2.2.2');
    const otherEmail = address('other');
    await createUser(db(), { email: otherEmail, password: PASSWORD });
    await other.login(otherEmail, PASSWORD);
    const otherPage = await other.get(invitationPath(mail));
    expect(otherPage.body).toContain(`You are signed in as ${otherEmail}`);
    expect((await other.post('/invitation/accept', { csrf_token: csrfTokenIn(otherPage.body), token: tokenOf(mail) })).statusCode).toBe(403);

    const invitee = new Browser(app, '10.2.2.3');
    const login = await invitee.login(email, PASSWORD, invitationPath(mail));
    expect(login.headers.location).toBe(invitationPath(mail));
    const page = await invitee.get(invitationPath(mail));
    const unverified = await invitee.post('/invitation/accept', { csrf_token: csrfTokenIn(page.body), token: tokenOf(mail) });
    expect(unverified.statusCode).toBe(409);
    expect(unverified.body).toContain('Confirm your email address first');
    expect(await db().selectFrom('memberships').select('role').where('organization_id', '=', fixture.organizationId).where('user_id', '=', user.id).execute()).toEqual([]);

    await db().updateTable('users').set({ email_verified_at: new Date() }).where('id', '=', user.id).execute();
    const accepted = await invitee.post('/invitation/accept', { csrf_token: csrfTokenIn(page.body), token: tokenOf(mail) });
    expect(accepted.statusCode).toBe(303);
    expect((await db().selectFrom('memberships').select('role').where('organization_id', '=', fixture.organizationId).where('user_id', '=', user.id).executeTakeFirstOrThrow()).role).toBe('member');
  });

  it('lets only an owner replace an invitation to become an owner', async () => {
    const fixture = await createOrgFixture(db());
    const owner = await ownerBrowser(fixture);
    const email = address('future-owner');
    expect((await invite(owner, email, 'owner')).statusCode).toBe(303);
    const adminEmail = address('admin');
    const admin = await createUser(db(), { email: adminEmail, password: PASSWORD });
    await db().insertInto('memberships').values({ organization_id: fixture.organizationId, user_id: admin.id, role: 'admin' }).execute();
    const adminBrowser = new Browser(app, '10.2.5.1');
    await adminBrowser.login(adminEmail, PASSWORD);
    const refused = await invite(adminBrowser, email, 'member');
    expect(refused.statusCode).toBe(403);
    const pending = await db().selectFrom('invitations').select('role').where('email', '=', email).where('revoked_at', 'is', null).execute();
    expect(pending).toEqual([{ role: 'owner' }]);
  });

  it('refuses invitations from an owner whose own address is unverified', async () => {
    const browser = new Browser(app, '10.2.3.1');
    await unconfirmedAccount(browser, address('fresh-owner'));
    const refused = await invite(browser, address('spam-target'), 'member');
    expect(refused.statusCode).toBe(403);
    expect(refused.body).toContain('confirm your own email address');
  });

  it('invites, lists, re-sends and revokes through the management API (members.write), as an admin would', async () => {
    const fixture = await createOrgFixture(db(), { scopes: KNOWN_SCOPES.join(' ') });
    const token = await clientCredentialsToken(app, fixture);
    const call = (method: 'GET' | 'POST' | 'DELETE', path: string, payload?: object) =>
      app.inject({ method, url: `/api/v1/${fixture.organizationId}${path}`, headers: { authorization: `Bearer ${token}` }, ...(payload ? { payload } : {}) });
    const email = address('api-invitee');
    const created = await call('POST', '/invitations', { email, role: 'member' });
    expect(created.statusCode).toBe(201);
    const invitation = created.json();
    expect(invitation).toMatchObject({ email, role: 'member', status: 'pending', invited_by_client_id: fixture.privateApp.client_id });
    expect(created.headers.location).toBe(`/api/v1/${fixture.organizationId}/invitations/${invitation.id}`);
    const mail = await smtp.waitFor(email, /You are invited/);
    expect(mail.text).toContain(fixture.privateApp.name);
    expect((await call('POST', '/invitations', { email: address('boss'), role: 'owner' })).statusCode).toBe(403);
    expect((await call('GET', '/invitations')).json().data.map((i: { email: string }) => i.email)).toEqual([email]);
    const resent = await call('POST', `/invitations/${invitation.id}/resend`);
    expect(resent.statusCode).toBe(200);
    await expect.poll(() => smtp.to(email).length, { timeout: 15_000 }).toBe(2);
    expect((await new Browser(app, '10.2.4.1').get(invitationPath(mail))).statusCode).toBe(404);
    expect((await call('DELETE', `/invitations/${invitation.id}`)).statusCode).toBe(204);
    expect((await call('GET', '/invitations')).json().data).toEqual([]);
    expect((await call('DELETE', `/invitations/${invitation.id}`)).statusCode).toBe(404);
    expect((await new Browser(app, '10.2.4.2').get(invitationPath(smtp.to(email)[1]!))).statusCode).toBe(404);
    const actions = await db().selectFrom('audit_events').select(['action', 'actor_client_id']).where('organization_id', '=', fixture.organizationId).where('action', 'like', 'invitation.%').orderBy('id').execute();
    expect(actions).toEqual(['invitation.created', 'invitation.resent', 'invitation.revoked'].map((action) => ({ action, actor_client_id: fixture.privateApp.client_id })));
    // A read-only token lists but cannot invite.
    const reader = await clientCredentialsToken(app, fixture, 'members.read');
    const denied = await app.inject({ method: 'POST', url: `/api/v1/${fixture.organizationId}/invitations`, headers: { authorization: `Bearer ${reader}` }, payload: { email, role: 'member' } });
    expect(denied.statusCode).toBe(403);
  });
});
