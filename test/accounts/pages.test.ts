import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrganization } from '../../src/accounts/organizations.js';
import { LOGIN_MAX_FAILURES_PER_EMAIL, LOGIN_MAX_FAILURES_PER_IP } from '../../src/web/sign-in.js';
import { createUser } from '../../src/accounts/users.js';
import { sha256Hex } from '../../src/lib/crypto.js';
import { buildTestApp } from '../helpers/app.js';
import { signUpThroughMail } from '../helpers/sign-up.js';
import { TestSmtpServer } from '../helpers/smtp.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { Browser, csrfTokenIn, expectPageSecurityHeaders } from './browser.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let smtp: TestSmtpServer;
let app: FastifyInstance;
let ip = 0;
/** A fresh client address per browser, so the per-IP throttle of one test does not touch another. */
const browser = () => new Browser(app, `10.0.0.${++ip}`);

const PASSWORD = 'correct horse battery';
let alice: { id: number; email: string };
let aliceOrgId: number;

beforeAll(async () => {
  t = await createTestDatabase();
  // Sign-up mails a link: the tests follow it from this server's mailbox.
  smtp = await TestSmtpServer.start();
  app = await buildTestApp(t.handle.db, { env: { SMTP_URL: smtp.url } });
  const user = await createUser(t.handle.db, { email: 'alice@example.com', password: PASSWORD, name: 'Alice <b>A</b>' });
  alice = { id: user.id, email: user.email };
  aliceOrgId = (await createOrganization(t.handle.db, { name: 'Acme & Co', ownerUserId: user.id })).id;
});
afterAll(async () => {
  await app.close();
  await smtp.stop();
  await t.close();
});

const sessionRows = (userId: number) => t.handle.db.selectFrom('sessions').selectAll().where('user_id', '=', userId).execute();
const errorText = (res: LightMyRequestResponse) => /<p class="error" role="alert">([^<]*)<\/p>/.exec(res.body)?.[1];

describe(`sign-up on ${BACKEND}`, () => {
  it('creates the user and an organization they own once the mailed link is followed, and signs them in with a safe session cookie', async () => {
    const b = browser();
    const res = await signUpThroughMail(b, smtp, {
      email: 'bob@example.com',
      password: 'a-long-password',
      name: 'Bob',
      organization_name: 'Bob Builders',
    });
    expect(res.statusCode).toBe(303);
    expect(res.headers.location).toBe('/dashboard');
    const setCookie = [res.headers['set-cookie']].flat().find((c) => String(c).startsWith('orgauth_session='));
    expect(setCookie).toMatch(/; HttpOnly/i);
    expect(setCookie).toMatch(/; SameSite=Lax/i);
    expect(setCookie).toMatch(/; Path=\//);
    expect(setCookie).not.toMatch(/; Secure/i); // the test issuer is http://localhost

    const user = await t.handle.db.selectFrom('users').selectAll().where('email', '=', 'bob@example.com').executeTakeFirstOrThrow();
    expect(user.password_hash).toMatch(/^\$argon2id\$/);
    const memberships = await t.handle.db
      .selectFrom('memberships')
      .innerJoin('organizations', 'organizations.id', 'memberships.organization_id')
      .select(['organizations.name', 'memberships.role'])
      .where('user_id', '=', user.id)
      .execute();
    expect(memberships).toEqual([{ name: 'Bob Builders', role: 'owner' }]);

    // CD-4: the database holds only the digest of the cookie's 256-bit value.
    const cookie = b.cookies.get('orgauth_session') ?? '';
    expect(cookie).toMatch(/^[A-Za-z0-9_-]{43}$/);
    const [row] = await sessionRows(user.id);
    expect(row?.id_hash).toBe(sha256Hex(cookie));
    const hours = ((row?.expires_at.getTime() ?? 0) - Date.now()) / 3_600_000;
    expect(hours).toBeGreaterThan(11.9);
    expect(hours).toBeLessThanOrEqual(12);

    const dashboard = await b.get('/dashboard');
    expect(dashboard.statusCode).toBe(200);
    expect(dashboard.body).toContain('Bob Builders');
  });

  it('marks cookies Secure (with the __Host- prefix) when the issuer is https', async () => {
    const secureApp = await buildTestApp(t.handle.db, { env: { ISSUER: 'https://auth.example.com', SMTP_URL: smtp.url } });
    try {
      const b = new Browser(secureApp, '10.1.0.1');
      const res = await signUpThroughMail(b, smtp, { email: 'sec@example.com', password: 'a-long-password', organization_name: 'Sec' });
      expect(res.statusCode).toBe(303);
      const setCookie = [res.headers['set-cookie']].flat().find((c) => String(c).startsWith('__Host-orgauth_session='));
      expect(setCookie).toMatch(/; Secure/i);
      expect(setCookie).toMatch(/; HttpOnly/i);
      expect(setCookie).toMatch(/; SameSite=Lax/i);
    } finally {
      await secureApp.close();
    }
  });

  it('refuses a password shorter than 10 characters and creates nothing', async () => {
    const b = browser();
    const csrf_token = await b.csrf('/signup');
    const res = await b.post('/signup', { csrf_token, email: 'short@example.com', password: '123456789', organization_name: 'Short' });
    expect(res.statusCode).toBe(400);
    expect(res.body).toContain('at least 10 characters');
    expect(res.headers['set-cookie']?.toString() ?? '').not.toContain('orgauth_session=');
    expect(await t.handle.db.selectFrom('users').select('id').where('email', '=', 'short@example.com').execute()).toEqual([]);
  });

  it('answers a taken email as any other (AC-2), without creating a second account or organization', async () => {
    const b = browser();
    const csrf_token = await b.csrf('/signup');
    const before = await t.handle.db.selectFrom('organizations').select('id').execute();
    const res = await b.post('/signup', { csrf_token, email: 'ALICE@example.com', password: 'a-long-password', organization_name: 'Dup' });
    expect(res.statusCode).toBe(200);
    expect(res.body).toContain('Check your inbox');
    expect(res.body).not.toContain('already exists');
    expect(await t.handle.db.selectFrom('organizations').select('id').execute()).toHaveLength(before.length);
    expect(await t.handle.db.selectFrom('users').select('id').where(sql<string>`lower(email)`, '=', 'alice@example.com').execute()).toHaveLength(1);
  });

  it('requires the CSRF token bound to the pre-session cookie (login CSRF)', async () => {
    const b = browser();
    await b.csrf('/signup');
    const fields = { email: 'csrf@example.com', password: 'a-long-password', organization_name: 'X' };
    expect((await b.post('/signup', fields)).statusCode).toBe(403);
    const other = await browser().csrf('/signup'); // valid, but for another browser's cookie
    expect((await b.post('/signup', { ...fields, csrf_token: other })).statusCode).toBe(403);
    expect(await t.handle.db.selectFrom('users').select('id').where('email', '=', 'csrf@example.com').execute()).toEqual([]);
  });
});

describe(`sign-in on ${BACKEND}`, () => {
  it('signs in with the right password and lands on the dashboard', async () => {
    const b = browser();
    const res = await b.login('Alice@Example.com', PASSWORD);
    expect(res.statusCode).toBe(303);
    expect(res.headers.location).toBe('/dashboard');
    const dashboard = await b.get('/dashboard');
    expect(dashboard.statusCode).toBe(200);
    expectPageSecurityHeaders(dashboard);
    // The name is escaped, and each organization is listed with its id and the user's role.
    expect(dashboard.body).toContain('Signed in as <strong>Alice &lt;b&gt;A&lt;/b&gt;</strong>');
    expect(dashboard.body).toContain(`<tr><td data-label="Organization">Acme &amp; Co</td><td data-label="ID">${aliceOrgId}</td><td data-label="Your role">owner</td></tr>`);
    expect(dashboard.body).toMatch(/<form method="post" action="\/logout">\s*<input type="hidden" name="csrf_token" value="[^"]+">/);
  });

  it('gives the same answer for an unknown email and a wrong password', async () => {
    const wrong = await browser().login(alice.email, 'not the password');
    const unknown = await browser().login('nobody@example.com', 'not the password');
    expect(wrong.statusCode).toBe(400);
    expect(unknown.statusCode).toBe(400);
    expect(errorText(wrong)).toBe('Incorrect email or password.');
    expect(errorText(unknown)).toBe(errorText(wrong));
    expect(wrong.headers['set-cookie']?.toString() ?? '').not.toContain('orgauth_session=');
  });

  it('requires a CSRF token on the login form', async () => {
    const b = browser();
    await b.csrf('/login');
    expect((await b.post('/login', { email: alice.email, password: PASSWORD })).statusCode).toBe(403);
    const forged = await b.post('/login', { email: alice.email, password: PASSWORD, csrf_token: 'A'.repeat(43) });
    expect(forged.statusCode).toBe(403);
    expectPageSecurityHeaders(forged);
    expect(forged.headers['content-type']).toMatch(/^text\/html/);
    // No pre-session cookie at all: the token of another browser does not help.
    const token = await browser().csrf('/login');
    const fresh = new Browser(app, '10.9.9.9');
    expect((await fresh.post('/login', { email: alice.email, password: PASSWORD, csrf_token: token })).statusCode).toBe(403);
    expect(b.cookies.has('orgauth_session')).toBe(false);
  });

  it(`throttles an email after ${LOGIN_MAX_FAILURES_PER_EMAIL} failures with 429 and Retry-After, even for the right password`, async () => {
    await createUser(t.handle.db, { email: 'target@example.com', password: PASSWORD });
    for (let i = 0; i < LOGIN_MAX_FAILURES_PER_EMAIL; i++) {
      expect((await browser().login('target@example.com', `wrong-${i}`)).statusCode).toBe(400);
    }
    const res = await browser().login('TARGET@example.com', PASSWORD);
    expect(res.statusCode).toBe(429);
    expect(Number(res.headers['retry-after'])).toBeGreaterThan(0);
    expect(Number(res.headers['retry-after'])).toBeLessThanOrEqual(15 * 60);
    expectPageSecurityHeaders(res);
    // Another account is not affected.
    expect((await browser().login(alice.email, PASSWORD)).statusCode).toBe(303);
  });

  it(`throttles an address after ${LOGIN_MAX_FAILURES_PER_IP} failures across emails`, async () => {
    const b = browser();
    for (let i = 0; i < LOGIN_MAX_FAILURES_PER_IP; i++) {
      expect((await b.login(`spray${i}@example.com`, 'wrong-password')).statusCode).toBe(400);
    }
    const res = await b.login(alice.email, PASSWORD);
    expect(res.statusCode).toBe(429);
    expect(Number(res.headers['retry-after'])).toBeGreaterThan(0);
    // Another address still signs in.
    expect((await browser().login(alice.email, PASSWORD)).statusCode).toBe(303);
  });

  it.each([
    ['//evil.com'],
    ['/\\evil.com'],
    ['https://evil.com'],
    ['javascript:alert(1)'],
    ['/\t/evil.com'],
    ['evil.com'],
  ])('ignores the open-redirect attempt return_to=%j and goes to /dashboard (AZ-9)', async (returnTo) => {
    const res = await browser().login(alice.email, PASSWORD, returnTo);
    expect(res.statusCode).toBe(303);
    expect(res.headers.location).toBe('/dashboard');
  });

  it('goes back to a same-origin return_to path, also from the login page link', async () => {
    const b = browser();
    const page = await b.get('/login?return_to=%2Foauth%2Fauthorize%3Fclient_id%3Dx%26state%3Dy');
    expect(page.body).toContain('name="return_to" value="/oauth/authorize?client_id=x&amp;state=y"');
    const res = await b.post('/login', { email: alice.email, password: PASSWORD, csrf_token: csrfTokenIn(page.body), return_to: '/oauth/authorize?client_id=x&state=y' });
    expect(res.statusCode).toBe(303);
    expect(res.headers.location).toBe('/oauth/authorize?client_id=x&state=y');
  });

  it('percent-encodes a non-ASCII return_to for the Location header, (was a 500)', async () => {
    const b = browser();
    const res = await b.login(alice.email, PASSWORD, '/dashbo\u0924rd?q=é');
    expect(res.statusCode).toBe(303);
    expect(res.headers.location).toBe('/dashbo%E0%A4%A4rd?q=%C3%A9');
    // Signed in, the login page sends the browser straight on.
    const again = await b.get('/login?return_to=%2Fdashbo%E0%A4%Aard');
    expect(again.statusCode).toBe(303);
    expect(again.headers.location).toBe('/dashbo%E0%A4%AArd');
  });

  it('starts a new session on sign-in and ends the one the browser had (no session fixation)', async () => {
    const b = browser();
    await b.login(alice.email, PASSWORD);
    const first = b.cookies.get('orgauth_session') ?? '';
    // Signing in again from the same browser (a login form opened before, say): a new id.
    const c = browser();
    const csrf_token = await c.csrf('/login');
    b.cookies.set('orgauth_csrf', c.cookies.get('orgauth_csrf') ?? '');
    const res = await b.post('/login', { email: alice.email, password: PASSWORD, csrf_token });
    expect(res.statusCode).toBe(303);
    const second = b.cookies.get('orgauth_session') ?? '';
    expect(second).not.toBe(first);
    const hashes = (await sessionRows(alice.id)).map((r) => r.id_hash);
    expect(hashes).toContain(sha256Hex(second));
    expect(hashes).not.toContain(sha256Hex(first));
  });
});

describe(`sessions, sign-out and the dashboard on ${BACKEND}`, () => {
  it('sends a signed-out visitor of the dashboard to the login page', async () => {
    const res = await browser().get('/dashboard');
    expect(res.statusCode).toBe(303);
    expect(res.headers.location).toBe('/login?return_to=%2Fdashboard');
  });

  it('ignores an expired session', async () => {
    const b = browser();
    await b.login(alice.email, PASSWORD);
    const hash = sha256Hex(b.cookies.get('orgauth_session') ?? '');
    await t.handle.db.updateTable('sessions').set({ expires_at: new Date(Date.now() - 1000) }).where('id_hash', '=', hash).execute();
    expect((await b.get('/dashboard')).statusCode).toBe(303);
  });

  it('signs out: deletes the session row and clears the cookie', async () => {
    const b = browser();
    await b.login(alice.email, PASSWORD);
    const cookie = b.cookies.get('orgauth_session') ?? '';
    const hash = sha256Hex(cookie);
    const csrf_token = csrfTokenIn((await b.get('/dashboard')).body);
    const res = await b.post('/logout', { csrf_token });
    expect(res.statusCode).toBe(303);
    expect(res.headers.location).toBe('/login');
    expect(String(res.headers['set-cookie'])).toMatch(/orgauth_session=;/);
    expect(await t.handle.db.selectFrom('sessions').select('id_hash').where('id_hash', '=', hash).execute()).toEqual([]);
    // The old cookie, replayed, is worthless.
    const replay = await app.inject({ method: 'GET', url: '/dashboard', headers: { cookie: `orgauth_session=${cookie}` } });
    expect(replay.statusCode).toBe(303);
  });

  it('refuses sign-out without the session CSRF token and keeps the session', async () => {
    const b = browser();
    await b.login(alice.email, PASSWORD);
    const hash = sha256Hex(b.cookies.get('orgauth_session') ?? '');
    const missing = await b.post('/logout', {});
    expect(missing.statusCode).toBe(403);
    expectPageSecurityHeaders(missing);
    // A token for another session does not do either.
    const other = browser();
    await other.login(alice.email, PASSWORD);
    const foreign = csrfTokenIn((await other.get('/dashboard')).body);
    expect((await b.post('/logout', { csrf_token: foreign })).statusCode).toBe(403);
    expect(await t.handle.db.selectFrom('sessions').select('id_hash').where('id_hash', '=', hash).execute()).toHaveLength(1);
    expect((await b.get('/dashboard')).statusCode).toBe(200);
  });

  it('sends the security headers on every page and serves the stylesheet from this origin (AZ-7)', async () => {
    const b = browser();
    for (const url of ['/login', '/signup']) {
      const res = await b.get(url);
      expect(res.statusCode).toBe(200);
      expect(res.headers['content-type']).toBe('text/html; charset=utf-8');
      expectPageSecurityHeaders(res);
      expect(res.body).toContain('<link rel="stylesheet" href="/assets/style.css">');
      expect(res.body).not.toMatch(/https?:\/\//);
      // Scripts only from this origin's /assets/ (the passkey ceremonies), never inline.
      for (const tag of res.body.match(/<script[^>]*>/g) ?? []) expect(tag).toMatch(/^<script src="\/assets\/[a-z]+\.js" defer>$/);
    }
    const css = await b.get('/assets/style.css');
    expect(css.statusCode).toBe(200);
    expect(css.headers['content-type']).toBe('text/css; charset=utf-8');
    expect(css.body).toContain('body {');
  });
});
