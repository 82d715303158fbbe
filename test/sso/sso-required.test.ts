/**
 * SSO required (issue 25) on both databases: an organization that verified a domain, has an
 * active connection and requires SSO for that domain keeps its people from signing in with a
 * password here (even the right one), and a password reset for such an address sends a pointer to
 * the company sign-in, never a link that could set a password. The rule holds only while the
 * organization has an active connection: without one, nobody is locked out.
 */
import type { LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createUser } from '../../src/accounts/users.js';
import { openText } from '../../src/lib/crypto.js';
import { updateConnection } from '../../src/sso/connections.js';
import { txtLookup, updateDomain, verifyDomain } from '../../src/sso/domains.js';
import { Browser, csrfTokenIn } from '../accounts/browser.js';
import { TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND } from '../helpers/db.js';
import { auditEvents, pageText, postEmail, signInThroughSso, type SsoOrganization, ssoOrganization, type SsoWorld, startSsoWorld, upstreamCallback } from '../helpers/sso-world.js';

const PASSWORD = 'a local password 123';
const REFUSED = 'Your organization signs you in through its identity provider. Choose Continue to sign in with your company account.';

let world: SsoWorld;
let n = 0;
const db = () => world.db;
const newBrowser = () => new Browser(world.app, `10.26.${Math.floor(++n / 250)}.${(n % 250) + 1}`);

beforeAll(async () => {
  world = await startSsoWorld();
}, 60_000);
afterAll(async () => {
  await world?.close();
});

async function passwordSignIn(browser: Browser, email: string, password = PASSWORD): Promise<LightMyRequestResponse> {
  // The password step as the login page shows it (?method=password), then the form it posts.
  const csrf_token = await browser.csrf(`/login?method=password&login_hint=${encodeURIComponent(email)}`);
  return browser.post('/login', { csrf_token, email, password, return_to: '/dashboard' });
}

const sessionsOf = async (email: string) =>
  db().selectFrom('sessions').innerJoin('users', 'users.id', 'sessions.user_id').select(['sessions.amr']).where('users.email', '=', email).execute();

/** The login page refusing the password: the email step again, the address kept, the reason said. */
function expectRefusedPage(res: LightMyRequestResponse, email: string) {
  expect(res.statusCode, res.body).toBe(403);
  expect(res.headers['content-type']).toBe('text/html; charset=utf-8');
  expect(res.body).toContain(`<p class="error" role="alert">${REFUSED}</p>`);
  expect(res.body).toContain(`<input type="email" name="email" value="${email}"`);
  expect(res.body).not.toContain('name="password"');
  expect(res.body).toContain('<button type="submit">Continue</button>');
  expect(res.cookies.find((c) => c.name === 'orgauth_session' && c.value !== '')).toBeUndefined();
}

/** The messages queued for `to`, opened, once `count` are there (the reset request works after its answer). */
async function mailTo(to: string, count: number) {
  await expect.poll(async () => (await db().selectFrom('mail_outbox').select('id').where('recipient', '=', to).execute()).length, { timeout: 10_000 }).toBe(count);
  const rows = await db().selectFrom('mail_outbox').select(['subject', 'body_encrypted']).where('recipient', '=', to).orderBy('id').execute();
  return rows.map((r) => ({ subject: r.subject, ...(JSON.parse(openText(TEST_SECRET_KEY, 'mail-outbox', r.body_encrypted!)) as { text: string; html: string }) }));
}

async function forgotPassword(email: string) {
  const browser = newBrowser();
  const page = await browser.get('/forgot-password');
  const res = await browser.post('/forgot-password', { csrf_token: csrfTokenIn(page.body), email });
  expect(res.statusCode).toBe(200);
  expect(pageText(res.body)).toContain('If an account uses that address, we have sent it a link to choose a new password.');
}

describe(`SSO required on ${BACKEND}`, () => {
  let required: SsoOrganization;
  beforeAll(async () => {
    required = await ssoOrganization(world, { domain: 'required.example', name: 'Required Corp', ssoRequired: true });
  });

  it('refuses the right password of an existing account (403, no session), and lets it in again once SSO is no longer required', async () => {
    const email = 'alice@required.example';
    await createUser(db(), { email, password: PASSWORD, name: 'Alice Local' });
    const browser = newBrowser();
    const refused = await passwordSignIn(browser, email);
    expectRefusedPage(refused, email);
    expect(browser.cookies.has('orgauth_session')).toBe(false);
    expect((await browser.get('/dashboard')).statusCode).toBe(303);
    // A wrong password is refused the same way: the rule comes before the password, which tells nothing.
    expectRefusedPage(await passwordSignIn(browser, email, 'not the password at all'), email);
    expect(await sessionsOf(email)).toEqual([]);

    // Continue (the email alone) leaves for the company's provider.
    const leaving = await postEmail(browser, email);
    expect(leaving.statusCode).toBe(303);
    expect(new URL(leaving.headers.location as string).origin).toBe(world.upstream.issuer);

    await updateDomain(db(), required.organizationId, 'required.example', { sso_required: false });
    try {
      const signedIn = await passwordSignIn(browser, email);
      expect(signedIn.statusCode, signedIn.body).toBe(303);
      expect(signedIn.headers.location).toBe('/dashboard');
      expect((await browser.get('/dashboard')).statusCode).toBe(200);
      expect(await sessionsOf(email)).toEqual([{ amr: ['pwd'] }]);
    } finally {
      await updateDomain(db(), required.organizationId, 'required.example', { sso_required: true });
    }
  });

  it('answers a password reset with a pointer to the company sign-in, no reset link', async () => {
    const email = 'bea@required.example';
    await createUser(db(), { email, password: PASSWORD, name: 'Bea Local' });
    await forgotPassword(email);
    const [message, ...more] = await mailTo(email, 1);
    expect(more).toEqual([]);
    expect(message!.subject).toBe('Sign in with your company account');
    const link = `${world.issuer}/login?login_hint=bea%40required.example`;
    // The whole text, its lines (the templates' blank lines between paragraphs aside).
    expect(message!.text.split('\n').filter((line) => line !== '')).toEqual([
      'Hello Bea Local,',
      'Someone asked to reset the password of the account bea@required.example. Required Corp signs its people in through its own identity provider, so this account does not use a password here and nothing was reset.',
      `Sign in with your company account: ${link}`,
      "If you cannot sign in there, ask your company's IT administrator. If you did not ask for this, ignore this message.",
      '-- ',
      world.issuer,
    ]);
    expect(message!.html).toContain(`href="${link}"`);
    expect(`${message!.text}${message!.html}`).not.toContain('reset-password');
    // Nothing that could reset the password was issued for use.
    const tokens = await db()
      .selectFrom('account_tokens')
      .innerJoin('users', 'users.id', 'account_tokens.user_id')
      .select(['account_tokens.expires_at'])
      .where('users.email', '=', email)
      .execute();
    expect(tokens.every((t) => t.expires_at.getTime() <= Date.now() + 1000)).toBe(true);

    // The link signs in through the company: the page it opens has the address, and Continue leaves for the provider.
    const browser = newBrowser();
    const page = await browser.get(link.slice(world.issuer.length));
    expect(page.statusCode).toBe(200);
    expect(page.body).toContain(`value="${email}"`);
    world.upstream.setAccount('bea', { sub: 'bea-sub', email, email_verified: true, name: 'Bea Upstream' });
    const back = await browser.get(await upstreamCallback(world, await postEmail(browser, email), 'bea'));
    expect(back.statusCode, back.body).toBe(303);
    expect(back.headers.location).toBe('/dashboard');
  });

  it('only while the organization has an active connection: with it disabled, the password and the reset link work again', async () => {
    const off = await ssoOrganization(world, { domain: 'offline.example', name: 'Offline Corp', ssoRequired: true });
    const email = 'cyd@offline.example';
    await createUser(db(), { email, password: PASSWORD, name: 'Cyd Local' });
    expectRefusedPage(await passwordSignIn(newBrowser(), email), email);

    await updateConnection(db(), world.settings, off.organizationId, off.connectionId, { state: 'disabled' });
    const browser = newBrowser();
    const signedIn = await passwordSignIn(browser, email);
    expect(signedIn.statusCode, signedIn.body).toBe(303);
    expect((await browser.get('/dashboard')).statusCode).toBe(200);
    // The email step goes on to the password now.
    const step = await postEmail(newBrowser(), email);
    expect(step.statusCode).toBe(200);
    expect(step.body).toContain('name="password"');

    await forgotPassword(email);
    const [message] = await mailTo(email, 1);
    expect(message!.subject).toBe('Reset your password');
    expect(message!.text).toMatch(new RegExp(`${world.issuer.replace(/\./g, '\\.')}/reset-password\\?token=[A-Za-z0-9_-]{20,}`));
  });

  it('turned on, ends at once the password sessions of the domain’s people; sessions through the organization’s IdP stay', async () => {
    const now = await ssoOrganization(world, { domain: 'at-once.example', name: 'At Once Corp' });
    const email = 'dee@at-once.example';
    await createUser(db(), { email, password: PASSWORD, name: 'Dee Local' });
    const local = newBrowser();
    expect((await passwordSignIn(local, email)).statusCode).toBe(303);
    const outsider = 'eve@elsewhere.example';
    await createUser(db(), { email: outsider, password: PASSWORD, name: 'Eve Elsewhere' });
    const elsewhere = newBrowser();
    expect((await passwordSignIn(elsewhere, outsider)).statusCode).toBe(303);
    world.upstream.setAccount('fay', { sub: 'fay-sub', email: 'fay@at-once.example', email_verified: true, name: 'Fay Upstream' });
    const federated = newBrowser();
    expect((await signInThroughSso(world, federated, 'fay@at-once.example', 'fay')).statusCode).toBe(303);

    await updateDomain(db(), now.organizationId, 'AT-ONCE.example', { sso_required: true });
    expect((await local.get('/dashboard')).statusCode).toBe(303);
    expect(await sessionsOf(email)).toEqual([]);
    expect((await federated.get('/dashboard')).statusCode).toBe(200);
    expect((await elsewhere.get('/dashboard')).statusCode).toBe(200);
    const [event] = (await auditEvents(world, now.organizationId, 'domain.updated')).map((e) => e.details);
    expect(event).toEqual({ domain: 'at-once.example', sso_required: true, sessions_ended: 1 });
  });

  it('also at once when a connection becomes active again, or when a domain that already required SSO is verified', async () => {
    const later = await ssoOrganization(world, { domain: 'later.example', name: 'Later Corp', ssoRequired: true });
    await updateConnection(db(), world.settings, later.organizationId, later.connectionId, { state: 'disabled' });
    const email = 'gus@later.example';
    await createUser(db(), { email, password: PASSWORD, name: 'Gus Local' });
    const local = newBrowser();
    expect((await passwordSignIn(local, email)).statusCode).toBe(303);
    await updateConnection(db(), world.settings, later.organizationId, later.connectionId, { state: 'active' });
    expect((await local.get('/dashboard')).statusCode).toBe(303);
    expect(await sessionsOf(email)).toEqual([]);

    // A domain marked SSO required while pending: verifying it ends the password sessions there.
    const pending = await ssoOrganization(world, { domain: 'pending-req.example', name: 'Pending Req Corp', verify: false });
    await updateDomain(db(), pending.organizationId, 'pending-req.example', { sso_required: true });
    const hal = 'hal@pending-req.example';
    await createUser(db(), { email: hal, password: PASSWORD, name: 'Hal Local' });
    const halBrowser = newBrowser();
    expect((await passwordSignIn(halBrowser, hal)).statusCode).toBe(303);
    const claimed = (await db().selectFrom('sso_domains').select(['verification_token']).where('domain', '=', 'pending-req.example').executeTakeFirstOrThrow()).verification_token;
    world.dns.setTxt('_orgauth-challenge.pending-req.example', [claimed]);
    const verified = await verifyDomain(db(), txtLookup(world.config.dnsServers), pending.organizationId, 'pending-req.example');
    expect(verified.state).toBe('verified');
    expect((await halBrowser.get('/dashboard')).statusCode).toBe(303);
    expect((await auditEvents(world, pending.organizationId, 'domain.verified')).map((e) => e.details)).toEqual([{ domain: 'pending-req.example', sessions_ended: 1 }]);
  });
});
