/**
 * Sign-up by confirmed address (SECURITY.md AC-2, DO-1): the same answer for a new and a taken
 * address, an account only once the mailed link is followed, and limits per address and per
 * client that refuse before any password is hashed. Mail goes to a real SMTP server started here.
 */
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { verifyPassword } from '../../src/accounts/passwords.js';
import { SIGN_UPS_PER_ADDRESS, SIGN_UPS_PER_IP, SIGN_UP_TTL_S } from '../../src/accounts/sign-ups.js';
import { createUser } from '../../src/accounts/users.js';
import { sha256Hex } from '../../src/lib/crypto.js';
import { buildTestApp } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { confirmSignUp, nextMail, postSignUp, SIGN_UP_SUBJECT, SIGN_UP_TAKEN_SUBJECT, signUpPath } from '../helpers/sign-up.js';
import { linkIn, TestSmtpServer } from '../helpers/smtp.js';
import { Browser, expectPageSecurityHeaders } from './browser.js';

const ISSUER = 'http://localhost:3000';
const PASSWORD = 'sign-up-password-1';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let smtp: TestSmtpServer;
let app: FastifyInstance;
let n = 0;
let ip = 0;
const db = () => t.handle.db;
const address = (label: string) => `${label}-${++n}@example.com`;
/** A fresh client address per browser: the per-client limit of one test does not touch another. */
const browser = (target = app) => new Browser(target, `10.7.${Math.floor(++ip / 250)}.${ip % 250}`);
const users = (email: string) => db().selectFrom('users').select('id').where('email', '=', email).execute();
const pending = (email: string) => db().selectFrom('pending_sign_ups').selectAll().where('email', '=', email).execute();

beforeAll(async () => {
  t = await createTestDatabase();
  smtp = await TestSmtpServer.start();
  app = await buildTestApp(t.handle.db, { env: { SMTP_URL: smtp.url }, listen: t.handle.listen });
});
afterAll(async () => {
  await app?.close();
  await smtp?.stop();
  await t?.close();
});

const fields = (email: string, extra: Record<string, string> = {}) => ({ email, password: PASSWORD, name: 'New Person', organization_name: 'New Org', ...extra });
/** The body without its CSRF token, the one part that differs from one browser to the next. */
const withoutCsrf = (res: LightMyRequestResponse) => res.body.replace(/name="csrf_token" value="[^"]+"/g, '');
/** The headers but the date and the request's id, which differ for any two answers. */
const headersOf = (res: LightMyRequestResponse) => Object.fromEntries(Object.entries(res.headers).filter(([name]) => name !== 'date' && name !== 'x-request-id'));
/** A form field's value in a page. */
const fieldIn = (body: string, name: string) => new RegExp(`name="${name}" value="([^"]+)"`).exec(body)![1]!;

describe(`sign-up on ${BACKEND}`, () => {
  it('answers a new and a taken address alike (status, headers, body but the CSRF token), and mails each its own message', async () => {
    const taken = address('taken');
    await createUser(db(), { email: taken, password: 'the-owners-password', name: 'Owner' });
    const fresh = address('fresh');
    const a = await postSignUp(browser(), fields(taken.toUpperCase()));
    const b = await postSignUp(browser(), fields(fresh));
    expect(a.statusCode).toBe(200);
    expect(b.statusCode).toBe(200);
    expect(headersOf(a)).toEqual(headersOf(b));
    expect(withoutCsrf(a)).toBe(withoutCsrf(b));
    expect(b.body).toContain('Check your inbox');
    expect(b.body).not.toContain(fresh);
    expectPageSecurityHeaders(b);

    // The owner of the taken address hears of it, with where to sign in and to reset the password; nothing else changes.
    const notice = await nextMail(smtp, taken, SIGN_UP_TAKEN_SUBJECT, 0);
    expect(notice.to).toEqual([taken]);
    expect(notice.links).toEqual([`${ISSUER}/login?login_hint=${encodeURIComponent(taken)}`, `${ISSUER}/forgot-password`, ISSUER]);
    expect(notice.text).toContain('you already have one. Nothing was changed.');
    expect(await pending(taken.toUpperCase())).toEqual([]);
    // The new address gets the link that finishes the sign-up, and nothing else.
    const mail = await nextMail(smtp, fresh, SIGN_UP_SUBJECT, 0);
    expect(linkIn(mail, `${ISSUER}/signup/confirm?token=`)).toMatch(/^http:\/\/localhost:3000\/signup\/confirm\?token=[A-Za-z0-9_-]{43}$/);
    expect(mail.text).toContain(`The link works once and for ${SIGN_UP_TTL_S / 60} minutes.`);
    expect(smtp.to(fresh).map((m) => m.subject)).toEqual([SIGN_UP_SUBJECT]);
    expect(smtp.to(taken).map((m) => m.subject)).toEqual([SIGN_UP_TAKEN_SUBJECT]);
  });

  it('makes no user until the link is followed with the password; then the user (address confirmed) and their organization, signed in at return_to', async () => {
    const email = address('pending');
    const b = browser();
    const asked = await postSignUp(b, { ...fields(email, { organization_name: 'Pending Org' }), return_to: '/dashboard/account' });
    expect(asked.statusCode).toBe(200);
    expect(b.cookies.has('orgauth_session')).toBe(false);
    expect(await users(email)).toEqual([]);
    const mail = await nextMail(smtp, email, SIGN_UP_SUBJECT, 0);
    const path = signUpPath(mail);
    // AC-1: the row keeps the token's SHA-256, and the password's argon2id hash.
    const [row] = await pending(email);
    expect(row).toMatchObject({ email, name: 'New Person', organization_name: 'Pending Org', return_to: '/dashboard/account', token_hash: sha256Hex(new URLSearchParams(path.split('?')[1]).get('token')!) });
    expect(row!.password_hash).toMatch(/^\$argon2id\$/);
    expect((row!.expires_at.getTime() - row!.created_at.getTime()) / 1000).toBe(SIGN_UP_TTL_S);

    // Opening the link (a mail scanner would) makes nothing; a wrong password makes nothing.
    const other = browser();
    const wrong = await confirmSignUp(other, path, 'not-the-sign-up-password');
    expect(wrong.statusCode).toBe(400);
    expect(wrong.body).toContain('That is not the password chosen at sign-up.');
    expect(await users(email)).toEqual([]);

    // The link and the password, from any browser: the account, signed in, where sign-up was headed.
    const done = await confirmSignUp(other, path, PASSWORD);
    expect(done.statusCode).toBe(303);
    expect(done.headers.location).toBe('/dashboard/account');
    const user = await db().selectFrom('users').selectAll().where('email', '=', email).executeTakeFirstOrThrow();
    expect(user.email_verified_at).not.toBeNull();
    expect(user.name).toBe('New Person');
    expect(await verifyPassword(user.password_hash, PASSWORD)).toBe(true);
    const memberships = await db()
      .selectFrom('memberships')
      .innerJoin('organizations', 'organizations.id', 'memberships.organization_id')
      .select(['organizations.name', 'memberships.role'])
      .where('user_id', '=', user.id)
      .execute();
    expect(memberships).toEqual([{ name: 'Pending Org', role: 'owner' }]);
    const dashboard = await other.get('/dashboard');
    expect(dashboard.statusCode).toBe(200);
    expect(dashboard.body).toContain('Pending Org');
    expect(await pending(email)).toEqual([]);
  });

  it('lets a link work once, not once expired, and not once a newer sign-up for the address replaced it', async () => {
    const email = address('once');
    const b = browser();
    await postSignUp(b, fields(email));
    const first = signUpPath(await nextMail(smtp, email, SIGN_UP_SUBJECT, 0));
    // A second sign-up for the pending address replaces it: the first link stops working.
    await postSignUp(browser(), fields(email, { organization_name: 'Second Org' }));
    const second = signUpPath(await nextMail(smtp, email, SIGN_UP_SUBJECT, 1));
    expect(await pending(email)).toHaveLength(1);
    const replaced = await b.get(first);
    expect(replaced.statusCode).toBe(404);
    expect(replaced.body).toContain('This link to finish creating an account is not valid');
    expectPageSecurityHeaders(replaced);

    // Used once …
    const page = await b.get(second);
    expect(page.statusCode).toBe(200);
    const token = fieldIn(page.body, 'token');
    expect((await b.post('/signup/confirm', { csrf_token: fieldIn(page.body, 'csrf_token'), token, password: PASSWORD })).statusCode).toBe(303);
    // … then never again, neither its page nor its form.
    const again = browser();
    expect((await again.get(second)).statusCode).toBe(404);
    const csrf_token = fieldIn((await again.get('/forgot-password')).body, 'csrf_token');
    expect((await again.post('/signup/confirm', { csrf_token, token, password: PASSWORD })).statusCode).toBe(404);
    expect(await users(email)).toHaveLength(1);
    expect((await db().selectFrom('organizations').select('id').where('name', '=', 'Second Org').execute())).toHaveLength(1);

    // Expired: nothing.
    const late = address('late');
    await postSignUp(browser(), fields(late));
    const path = signUpPath(await nextMail(smtp, late, SIGN_UP_SUBJECT, 0));
    await db().updateTable('pending_sign_ups').set({ expires_at: new Date(Date.now() - 1000) }).where('email', '=', late).execute();
    expect((await b.get(path)).statusCode).toBe(404);
    const fresh = browser();
    const csrf = fieldIn((await fresh.get('/forgot-password')).body, 'csrf_token');
    expect((await fresh.post('/signup/confirm', { csrf_token: csrf, token: new URLSearchParams(path.split('?')[1]).get('token')!, password: PASSWORD })).statusCode).toBe(404);
    expect(await users(late)).toEqual([]);
  });

  it(`bounds the sign-ups, and so the mails, of one address to ${SIGN_UPS_PER_ADDRESS} an hour, whatever the client or instance; the next is a 429 before any hashing`, async () => {
    const second = await buildTestApp(db(), { env: { SMTP_URL: smtp.url } });
    try {
      const email = address('bounded');
      const taken = address('bounded-taken');
      await createUser(db(), { email: taken, password: 'the-owners-password' });
      for (const target of [email, taken]) {
        for (let i = 0; i < SIGN_UPS_PER_ADDRESS; i++) {
          const res = await postSignUp(browser(i % 2 === 0 ? app : second), fields(target, { organization_name: `Org ${i}` }));
          expect(res.statusCode).toBe(200);
        }
        // A valid sign-up, from a client and an instance of its own: refused before its password is hashed.
        const refused = await postSignUp(browser(second), fields(target, { password: 'a-different-valid-password', organization_name: 'Refused Org' }));
        expect(refused.statusCode).toBe(429);
        expect(Number(refused.headers['retry-after'])).toBeGreaterThan(3500);
        expect(Number(refused.headers['retry-after'])).toBeLessThanOrEqual(3600);
        expect(refused.body).toContain('Too many sign-ups from here or for this address.');
      }
      // The pending sign-up is the last admitted one's, untouched by the refused one.
      const [row] = await pending(email);
      expect(row!.organization_name).toBe(`Org ${SIGN_UPS_PER_ADDRESS - 1}`);
      expect(await verifyPassword(row!.password_hash, PASSWORD)).toBe(true);
      expect(await pending(taken)).toEqual([]);
      expect(await users(email)).toEqual([]);
      await nextMail(smtp, email, SIGN_UP_SUBJECT, SIGN_UPS_PER_ADDRESS - 1);
      await nextMail(smtp, taken, SIGN_UP_TAKEN_SUBJECT, SIGN_UPS_PER_ADDRESS - 1);
      // Nothing more is on its way: the outbox holds exactly the admitted sign-ups' mails.
      const queued = await db().selectFrom('mail_outbox').select('recipient').where('recipient', 'in', [email, taken]).execute();
      expect(queued).toHaveLength(2 * SIGN_UPS_PER_ADDRESS);
      expect(smtp.to(email)).toHaveLength(SIGN_UPS_PER_ADDRESS);
      expect(smtp.to(taken)).toHaveLength(SIGN_UPS_PER_ADDRESS);
    } finally {
      await second.close();
    }
  });

  it(`bounds the sign-ups of one client to ${SIGN_UPS_PER_IP} an hour (an IPv6 client with its /64); the next is a 429 before any hashing`, async () => {
    const client = (suffix: string) => new Browser(app, `2001:db8:7:1::${suffix}`);
    for (let i = 0; i < SIGN_UPS_PER_IP; i++) expect((await postSignUp(client(String(i + 1)), fields(address('spray')))).statusCode).toBe(200);
    const email = address('spray-refused');
    const refused = await postSignUp(client('ffff'), fields(email));
    expect(refused.statusCode).toBe(429);
    expect(refused.headers['retry-after']).toMatch(/^[0-9]+$/);
    expect(await pending(email)).toEqual([]);
    expect(await db().selectFrom('sign_up_attempts').select('id').where('email', '=', email).execute()).toEqual([]);
    // Another client is not held back.
    expect((await postSignUp(new Browser(app, '2001:db8:7:2::1'), fields(email))).statusCode).toBe(200);
  });

  it('answers a link token that is repeated, malformed, over-long or NUL-bearing with a 4xx page, and a password over the limit as a wrong one (R-7)', async () => {
    const email = address('mangled');
    await postSignUp(browser(), fields(email));
    const token = new URLSearchParams(signUpPath(await nextMail(smtp, email, SIGN_UP_SUBJECT, 0)).split('?')[1]).get('token')!;
    const b = browser();
    for (const query of [`token=${token}&token=${token}`, `token=${token}x`, `token=${token.slice(0, 42)}%00`, `token=${'A'.repeat(5000)}`, 'token[]=x', '']) {
      const res = await b.get(`/signup/confirm?${query}`);
      expect(res.statusCode, query).toBe(404);
      expectPageSecurityHeaders(res);
    }
    const page = await b.get(`/signup/confirm?token=${token}`);
    const csrf_token = fieldIn(page.body, 'csrf_token');
    // A form field sent twice or with a NUL is refused before it is read, as on every form (readParams).
    expect((await b.post('/signup/confirm', { csrf_token, token: [token, token], password: PASSWORD })).statusCode).toBe(400);
    expect((await b.post('/signup/confirm', { csrf_token, token: `${token}\u0000`, password: PASSWORD })).statusCode).toBe(400);
    const long = await b.post('/signup/confirm', { csrf_token, token, password: 'p'.repeat(1025) });
    expect(long.statusCode).toBe(400);
    expect(long.body).toContain('That is not the password chosen at sign-up.');
    expect(await users(email)).toEqual([]);
    // The link still works for its owner.
    expect((await b.post('/signup/confirm', { csrf_token, token, password: PASSWORD })).statusCode).toBe(303);
  });

  it('refuses a form with mistakes without counting it or hashing, and creates nothing', async () => {
    const email = address('mistaken');
    const res = await postSignUp(browser(), fields(email, { password: 'short' }));
    expect(res.statusCode).toBe(400);
    expect(res.body).toContain('at least 10 characters');
    expect(await db().selectFrom('sign_up_attempts').select('id').where('email', '=', email).execute()).toEqual([]);
    expect(await pending(email)).toEqual([]);
  });
});
