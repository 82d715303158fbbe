/**
 * The bad-input battery for the account-lifecycle links and forms (issue 14).
 *
 * - Links: /reset-password, /verify-email and /invitation with a token that is missing, empty,
 *   repeated, oversized, not base64url, tampered with, expired, used, of another purpose, or
 *   replaced: each is the HTML error page (404, the page security headers, no stack trace),
 *   by GET and by POST, and changes nothing in the database.
 * - Forms: /forgot-password, /reset-password, /verify-email, /invitation/signup and
 *   /invitation/accept without a CSRF token, with another browser's, with oversized, repeated,
 *   JSON-shaped and unknown fields: 403 for CSRF, 400 for fields, never 500; a refused password
 *   does not use up the link.
 * - /verify-email needs the link and a session of the account it was sent for: signed out, the
 *   page offers to sign in and the POST is a 403 (a pre-session CSRF token is not enough);
 *   signed in to another account, the page has no form and the POST is the error page; either
 *   way the link stays unused. So its bad-token cases post as the link's user, signed in.
 * - Invitations: the wrong person, an unverified address, twice, another organization's
 *   dashboard or API; the API's invitation bodies; the dashboard's invitation and account forms.
 * - /forgot-password answers an existing and an unknown address the same.
 *
 * Link tokens come from a real SMTP server (invitations, through the API as an application would
 * send them) or straight from issueAccountToken (reset and verification links, many of them).
 */
import type { FastifyInstance, InjectOptions, LightMyRequestResponse } from 'fastify';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { issueAccountToken, RESET_PASSWORD_TTL_S, VERIFY_EMAIL_TTL_S } from '../../src/accounts/account-tokens.js';
import { addMember } from '../../src/accounts/organizations.js';
import { hashPassword, PASSWORD_MAX_LENGTH } from '../../src/accounts/passwords.js';
import { createUser, insertUser } from '../../src/accounts/users.js';
import type { AccountTokenPurpose } from '../../src/db/schema.js';
import { sha256Hex } from '../../src/lib/crypto.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { KNOWN_SCOPES } from '../../src/oauth/helpers/scopes.js';
import { buildTestApp, logCapture, TEST_SECRET_KEY, testConfig } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { clientCredentialsToken, createOrgFixture, form, type OrgFixture } from '../helpers/oauth.js';
import { linkIn, type ReceivedMail, TestSmtpServer } from '../helpers/smtp.js';
import { Browser, csrfTokenIn, expectPageSecurityHeaders } from './browser.js';

const PASSWORD = 'bad-input-password-1';
const NEW_PASSWORD = 'a-good-new-password-2';
/** createOrgFixture's owners sign in with this. */
const OWNER_PASSWORD = 'owner-password-1';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let smtp: TestSmtpServer;
let app: FastifyInstance;
let issuer: string;
/** Two organizations, each with a private application holding every scope, and its token. */
let orgA: OrgFixture;
let orgB: OrgFixture;
let bearerA: string;
let bearerB: string;
/** A token of org A's application with members.read only. */
let readOnlyA: string;
let ownerA: { id: number; email: string };
let ownerB: { id: number; email: string };
/** PASSWORD's argon2 hash, made once: the users of these tests need not each cost a hash. */
let passwordHash: string;

const db = () => t.handle.db;
let n = 0;
const address = (label: string) => `${label}-${++n}-${process.pid}@example.com`;
let ip = 0;
/** A fresh client address per browser: the bad-link throttle (per IP) of one test touches no other. */
const browser = () => {
  const i = ++ip;
  return new Browser(app, `10.14.${Math.floor(i / 250)}.${(i % 250) + 1}`);
};

beforeAll(async () => {
  t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  smtp = await TestSmtpServer.start();
  // No retention sweeper: it would delete the rows these tests expire on purpose.
  const env = { SMTP_URL: smtp.url, CLEANUP_INTERVAL: '0' };
  issuer = testConfig(env).issuer;
  app = await buildTestApp(t.handle.db, { env });
  orgA = await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') });
  orgB = await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') });
  passwordHash = await hashPassword(PASSWORD);
  bearerA = await clientCredentialsToken(app, orgA);
  bearerB = await clientCredentialsToken(app, orgB);
  readOnlyA = await clientCredentialsToken(app, orgA, 'members.read');
  const emailOf = async (id: number) => (await db().selectFrom('users').select('email').where('id', '=', id).executeTakeFirstOrThrow()).email;
  ownerA = { id: orgA.ownerId, email: await emailOf(orgA.ownerId) };
  ownerB = { id: orgB.ownerId, email: await emailOf(orgB.ownerId) };
});
afterAll(async () => {
  await app?.close();
  await smtp?.stop();
  await t?.close();
});

// ---------------------------------------------------------------------------------------------
// Helpers

interface TestUser {
  id: number;
  email: string;
}

async function newUser(label: string, options: { verified?: boolean } = {}): Promise<TestUser> {
  const email = address(label);
  const user = await insertUser(db(), { email, name: label, passwordHash, emailVerified: options.verified ?? true });
  return { id: user.id, email };
}

/** The user each link made by `issue` was sent to (an invitation's link has none yet). */
const tokenUsers = new Map<string, TestUser>();

async function issue(purpose: AccountTokenPurpose, user: TestUser): Promise<string> {
  const token = await issueAccountToken(db(), { purpose, userId: user.id, email: user.email, ttlSeconds: purpose === 'reset_password' ? RESET_PASSWORD_TTL_S : VERIFY_EMAIL_TTL_S });
  tokenUsers.set(token, user);
  return token;
}

/** The `count`-th message to `to`, once it has arrived. */
async function nthMail(to: string, count: number): Promise<ReceivedMail> {
  await expect.poll(() => smtp.to(to).length, { timeout: 15_000 }).toBeGreaterThanOrEqual(count);
  return smtp.to(to)[count - 1]!;
}

const tokenOf = (link: string) => new URL(link).searchParams.get('token')!;

function api(method: 'GET' | 'POST' | 'DELETE', fixture: OrgFixture, bearer: string, path: string, body?: unknown, headers: Record<string, string> = {}) {
  return app.inject({
    method,
    url: `/api/v1/${fixture.organizationId}${path}`,
    headers: { authorization: `Bearer ${bearer}`, ...(typeof body === 'string' ? { 'content-type': 'application/json' } : {}), ...headers },
    ...(body !== undefined ? { payload: body as string } : {}),
  } as InjectOptions);
}

interface Invited {
  id: number;
  email: string;
  token: string;
}

/** Invites `email` into `fixture` through the API and reads the link out of the message it sent. */
async function invite(options: { fixture?: OrgFixture; bearer?: string; email?: string; role?: string } = {}): Promise<Invited> {
  const fixture = options.fixture ?? orgA;
  const email = options.email ?? address('invitee');
  const before = smtp.to(email).length;
  const res = await api('POST', fixture, options.bearer ?? (fixture === orgA ? bearerA : bearerB), '/invitations', { email, role: options.role ?? 'member' });
  expect(res.statusCode, res.body).toBe(201);
  const mail = await nthMail(email, before + 1);
  return { id: res.json().id, email, token: tokenOf(linkIn(mail, `${issuer}/invitation?token=`)) };
}

/** Everything the lifecycle pages could change: users, links, invitations, memberships, sessions, the audit log, the outbox. */
async function snapshot() {
  const d = db();
  return {
    users: await d.selectFrom('users').select(['id', 'email', 'name', 'password_hash', 'email_verified_at', 'updated_at']).orderBy('id').execute(),
    accountTokens: await d.selectFrom('account_tokens').selectAll().orderBy('id').execute(),
    invitations: await d.selectFrom('invitations').selectAll().orderBy('id').execute(),
    memberships: await d.selectFrom('memberships').select(['organization_id', 'user_id', 'role']).orderBy('organization_id').orderBy('user_id').execute(),
    sessions: await d.selectFrom('sessions').select(['id_hash', 'user_id']).orderBy('id_hash').execute(),
    auditEvents: Number((await d.selectFrom('audit_events').select(sql<string>`count(*)`.as('n')).executeTakeFirstOrThrow()).n),
    mailOutbox: Number((await d.selectFrom('mail_outbox').select(sql<string>`count(*)`.as('n')).executeTakeFirstOrThrow()).n),
  };
}

async function expectUnchanged(before: Awaited<ReturnType<typeof snapshot>>): Promise<void> {
  expect(await snapshot()).toEqual(before);
}

/** No stack trace, file path or exception name in what a client sees. */
function expectNoLeak(res: LightMyRequestResponse): void {
  expect(res.body).not.toMatch(/\bat \S+ \(|\.ts:\d+|\.js:\d+|node_modules|\/work\/|TypeError|ReferenceError|SyntaxError|Internal Server Error/);
}

/** An HTML error page of `status` with the page security headers. */
function expectErrorPage(res: LightMyRequestResponse, status: number): void {
  expect(res.statusCode, res.body.slice(0, 500)).toBe(status);
  expect(res.headers['content-type']).toMatch(/^text\/html/);
  expectPageSecurityHeaders(res);
  expectNoLeak(res);
}

/** The page for a link that does not work. */
function expectBadLink(res: LightMyRequestResponse): void {
  expectErrorPage(res, 404);
  expect(res.body).toContain('This link does not work');
}

const CSRF_FAILED = 'This form has expired or did not come from this site';
function expectCsrfRefused(res: LightMyRequestResponse): void {
  expectErrorPage(res, 403);
  expect(res.body).toContain(CSRF_FAILED);
}

function expectFormRefused(res: LightMyRequestResponse): void {
  expectErrorPage(res, 400);
}

const cookieHeader = (b: Browser) => [...b.cookies].map(([k, v]) => `${k}=${v}`).join('; ');

/** POSTs a raw body with the browser's cookies (a JSON body, a text/plain one …). */
function postRaw(b: Browser, url: string, contentType: string, payload: string, remoteAddress = '10.15.0.1') {
  return app.inject({ method: 'POST', url, headers: { 'content-type': contentType, ...(b.cookies.size > 0 ? { cookie: cookieHeader(b) } : {}) }, payload, remoteAddress });
}

/** The pre-session CSRF token of a browser (any page before sign-in carries the same one). */
const preCsrf = (b: Browser) => b.csrf('/forgot-password');

const passwordHashOf = async (userId: number) => (await db().selectFrom('users').select('password_hash').where('id', '=', userId).executeTakeFirstOrThrow()).password_hash;
const membershipOf = (organizationId: number, userId: number) =>
  db().selectFrom('memberships').select('role').where('organization_id', '=', organizationId).where('user_id', '=', userId).executeTakeFirst();
const invitationRow = (id: number) => db().selectFrom('invitations').select(['accepted_at', 'revoked_at', 'token_hash']).where('id', '=', id).executeTakeFirstOrThrow();

/** Signs a fresh browser in. */
async function signedIn(user: TestUser, password = PASSWORD): Promise<Browser> {
  const b = browser();
  expect((await b.login(user.email, password)).statusCode).toBe(303);
  return b;
}

// ---------------------------------------------------------------------------------------------
// Links

interface LinkKind {
  name: string;
  path: string;
  /** Whether the form needs a session (the link's user's) and its CSRF token, not the pre-session one. */
  session: boolean;
  /** A live token of this kind (a fresh user or invitation for each). */
  fresh(): Promise<string>;
  /** The form the page posts, with `token` and the CSRF token `formCsrf` gives. */
  post(b: Browser, token: string | string[], csrf: string, extra?: Record<string, string | string[]>): Promise<LightMyRequestResponse>;
  /** Uses the token up, as the user would, from a browser of `browserFor(token, kind)`; asserts it worked. */
  use(b: Browser, token: string): Promise<void>;
  /** Makes the token expire. */
  expire(token: string): Promise<void>;
}

const expireAccountToken = async (token: string) => {
  const res = await db().updateTable('account_tokens').set({ expires_at: sql<Date>`now() - interval '1 minute'` }).where('token_hash', '=', sha256Hex(token)).executeTakeFirst();
  expect(Number(res.numUpdatedRows)).toBe(1);
};

/**
 * A browser whose posts to the forms of `kinds` get as far as the token check: when one of them
 * needs a session, signed in as the user `token` was sent to (a new user when it has none, as
 * an invitation's); otherwise a fresh one, signed out.
 */
async function browserFor(token: string, ...kinds: LinkKind[]): Promise<Browser> {
  if (!kinds.some((k) => k.session)) return browser();
  return signedIn(tokenUsers.get(token) ?? (await newUser('link-visitor')));
}

/** The CSRF token `kind`'s form takes from `b`: its session's, or its pre-session one. */
const formCsrf = (kind: LinkKind, b: Browser) => (kind.session ? b.csrf('/dashboard') : preCsrf(b));

const RESET: LinkKind = {
  name: 'reset-password',
  path: '/reset-password',
  session: false,
  fresh: async () => issue('reset_password', await newUser('reset')),
  post: (b, token, csrf, extra = {}) => b.post('/reset-password', { csrf_token: csrf, token, password: NEW_PASSWORD, ...extra }),
  use: async (b, token) => {
    const res = await RESET.post(b, token, await preCsrf(b));
    expect(res.statusCode, res.body.slice(0, 300)).toBe(200);
    expect(res.body).toContain('Password changed');
  },
  expire: expireAccountToken,
};

const VERIFY: LinkKind = {
  name: 'verify-email',
  path: '/verify-email',
  session: true,
  fresh: async () => issue('verify_email', await newUser('verify', { verified: false })),
  post: (b, token, csrf, extra = {}) => b.post('/verify-email', { csrf_token: csrf, token, ...extra }),
  use: async (b, token) => {
    const res = await VERIFY.post(b, token, await formCsrf(VERIFY, b));
    expect(res.statusCode, res.body.slice(0, 300)).toBe(200);
    expect(res.body).toContain('is confirmed');
  },
  expire: expireAccountToken,
};

const INVITATION: LinkKind = {
  name: 'invitation',
  path: '/invitation',
  session: false,
  fresh: async () => (await invite()).token,
  post: (b, token, csrf, extra = {}) => b.post('/invitation/signup', { csrf_token: csrf, token, password: NEW_PASSWORD, name: 'Invitee', ...extra }),
  use: async (b, token) => {
    const res = await INVITATION.post(b, token, await preCsrf(b));
    expect(res.statusCode, res.body.slice(0, 300)).toBe(303);
    expect(res.headers.location).toBe('/dashboard');
  },
  expire: async (token) => {
    const res = await db().updateTable('invitations').set({ expires_at: sql<Date>`now() - interval '1 minute'` }).where('token_hash', '=', sha256Hex(token)).executeTakeFirst();
    expect(Number(res.numUpdatedRows)).toBe(1);
  },
};

const KINDS = [RESET, VERIFY, INVITATION];
const linkTo = (kind: LinkKind, rawQuery: string) => `${kind.path}${rawQuery}`;

/** Flips one character of a token to another base64url character. */
function tamper(token: string, at = 20): string {
  const c = token[at]!;
  return `${token.slice(0, at)}${c === 'A' ? 'B' : 'A'}${token.slice(at + 1)}`;
}

/**
 * Malformed tokens, each with the query string that carries it (raw, as a browser would send it)
 * and the form value posted. `good` is a live token of the kind, which must still work afterwards.
 */
const MALFORMED: [name: string, query: (good: string) => string, posted: (good: string) => string | undefined][] = [
  ['no token parameter', () => '', () => undefined],
  ['an empty token', () => '?token=', () => ''],
  ['a 10 kB token', () => `?token=${'A'.repeat(10_240)}`, () => 'A'.repeat(10_240)],
  ['a 10 kB token that starts with the live one', (g) => `?token=${g}${'A'.repeat(10_240)}`, (g) => `${g}${'A'.repeat(10_240)}`],
  ['one character short', (g) => `?token=${g.slice(0, -1)}`, (g) => g.slice(0, -1)],
  ['one character long', (g) => `?token=${g}A`, (g) => `${g}A`],
  ['base64 "+" and "/" instead of base64url', (g) => `?token=${encodeURIComponent(`${g.slice(0, 41)}+/`)}`, (g) => `${g.slice(0, 41)}+/`],
  ['base64 padding', (g) => `?token=${encodeURIComponent(`${g}=`)}`, (g) => `${g}=`],
  ['a leading space', (g) => `?token=%20${g}`, (g) => ` ${g}`],
  ['a trailing newline', (g) => `?token=${g}%0A`, (g) => `${g}\n`],
  ['markup', () => `?token=${encodeURIComponent('<script>alert(1)</script>')}`, () => '<script>alert(1)</script>'],
  ['SQL', () => `?token=${encodeURIComponent("' OR '1'='1")}`, () => "' OR '1'='1"],
  ['43 non-ASCII letters', () => `?token=${encodeURIComponent('ä'.repeat(43))}`, () => 'ä'.repeat(43)],
  ['broken percent-encoding', () => '?token=%E0%A4%A', () => '%E0%A4%A'],
  ['a lone percent sign', () => '?token=%', () => '%'],
  ['the live token with an encoded percent-NUL after it', (g) => `?token=${g}%2500`, (g) => `${g}%00`],
  ['the live token with a semicolon after it', (g) => `?token=${g};x`, (g) => `${g};x`],
  ['the live token in upper case', (g) => `?token=${g.toUpperCase()}`, (g) => g.toUpperCase()],
  ['the live token with one character changed', (g) => `?token=${tamper(g)}`, (g) => tamper(g)],
  ['the live token with its last character changed', (g) => `?token=${tamper(g, 42)}`, (g) => tamper(g, 42)],
];

describe.each(KINDS)(`the $name link with a malformed token on ${BACKEND}`, (kind) => {
  it.each(MALFORMED)('%s: the error page by GET and by POST, nothing changed, the live link still works', async (_name, query, posted) => {
    const good = await kind.fresh();
    // For verify-email: the live link's user, signed in, so the POST reaches the token check.
    const b = await browserFor(good, kind);
    const csrf = await formCsrf(kind, b);
    const before = await snapshot();
    const page = await b.get(linkTo(kind, query(good)));
    expectBadLink(page);
    expect(page.body).not.toContain(good);
    const value = posted(good);
    const res = await kind.post(b, value ?? [], csrf);
    expectBadLink(res);
    await expectUnchanged(before);
    // The live link was not touched by its near misses.
    const live = await b.get(linkTo(kind, `?token=${good}`));
    expect(live.statusCode, live.body.slice(0, 300)).toBe(200);
    expectPageSecurityHeaders(live);
  });

  it('a repeated token parameter (twice the live token) is the error page, and the link still works', async () => {
    const good = await kind.fresh();
    const b = await browserFor(good, kind);
    const csrf = await formCsrf(kind, b);
    const before = await snapshot();
    expectBadLink(await b.get(linkTo(kind, `?token=${good}&token=${good}`)));
    expectBadLink(await b.get(linkTo(kind, `?token=${good}&token=${tamper(good)}`)));
    expectBadLink(await b.get(linkTo(kind, `?token[]=${good}`)));
    // In the form a repeated field is malformed (400) before anything is looked up.
    expectFormRefused(await kind.post(b, [good, good], csrf));
    await expectUnchanged(before);
    expect((await b.get(linkTo(kind, `?token=${good}`))).statusCode).toBe(200);
  });

  it('a NUL in the token: the error page by GET, a malformed form by POST', async () => {
    const good = await kind.fresh();
    const b = await browserFor(good, kind);
    const csrf = await formCsrf(kind, b);
    const before = await snapshot();
    expectBadLink(await b.get(linkTo(kind, `?token=${good}%00`)));
    expectFormRefused(await kind.post(b, `${good}\u0000`, csrf));
    await expectUnchanged(before);
    expect((await b.get(linkTo(kind, `?token=${good}`))).statusCode).toBe(200);
  });

  it('HEAD on a bad link is a 404 without a body', async () => {
    const good = await kind.fresh();
    const res = await app.inject({ method: 'HEAD', url: linkTo(kind, `?token=${tamper(good)}`), remoteAddress: '10.17.0.1' });
    expect(res.statusCode).toBe(404);
    expect(res.body).toBe('');
  });

  it('after 30 bad links from one address, every link page there is a 429 page (even a live link, which stays unused); other addresses are not affected', async () => {
    const good = await kind.fresh();
    const b = await browserFor(good, kind);
    const csrf = await formCsrf(kind, b);
    for (let i = 0; i < 30; i++) expectBadLink(await b.get(linkTo(kind, `?token=${tamper(good, i)}`)));
    const before = await snapshot();
    const page = await b.get(linkTo(kind, `?token=${good}`));
    expectErrorPage(page, 429);
    expect(page.headers['retry-after']).toMatch(/^[1-9][0-9]*$/);
    expectErrorPage(await kind.post(b, good, csrf), 429);
    await expectUnchanged(before);
    const elsewhere = await browserFor(good, kind);
    expect((await elsewhere.get(linkTo(kind, `?token=${good}`))).statusCode).toBe(200);
    await kind.use(elsewhere, good);
  });

  it('an expired token is the error page by GET and by POST, and stays unused', async () => {
    const good = await kind.fresh();
    await kind.expire(good);
    const b = await browserFor(good, kind);
    const csrf = await formCsrf(kind, b);
    const before = await snapshot();
    expectBadLink(await b.get(linkTo(kind, `?token=${good}`)));
    expectBadLink(await kind.post(b, good, csrf));
    await expectUnchanged(before);
  });

  it('a token used once is the error page by GET and by POST the second time', async () => {
    const good = await kind.fresh();
    const b = await browserFor(good, kind);
    await kind.use(b, good);
    const again = await browserFor(good, kind);
    const csrf = await formCsrf(kind, again);
    const before = await snapshot();
    expectBadLink(await again.get(linkTo(kind, `?token=${good}`)));
    expectBadLink(await kind.post(again, good, csrf));
    await expectUnchanged(before);
  });
});

describe(`a link token used for another purpose on ${BACKEND}`, () => {
  // Each live token is refused by the pages of the other kinds, and still works on its own.
  // With verify-email on either side, the browser is signed in (as the token's user, if it has one).
  const pairs = KINDS.flatMap((own) => KINDS.filter((other) => other !== own).map((other) => [own.name, other.name, own, other] as const));
  it.each(pairs)('a live %s token on the %s page is the error page, and is not used up', async (_own, _other, own, other) => {
    const token = await own.fresh();
    const b = await browserFor(token, own, other);
    const csrf = await formCsrf(other, b);
    const before = await snapshot();
    expectBadLink(await b.get(linkTo(other, `?token=${token}`)));
    expectBadLink(await other.post(b, token, csrf));
    await expectUnchanged(before);
    expect((await b.get(linkTo(own, `?token=${token}`))).statusCode).toBe(200);
    await own.use(b, token);
  });

  it('a reset token is refused by /invitation/accept too (and a signed-in user joins nothing)', async () => {
    const user = await newUser('accept-reset');
    const token = await issue('reset_password', user);
    const b = await signedIn(user);
    const csrf_token = await b.csrf('/dashboard');
    const before = await snapshot();
    expectBadLink(await b.post('/invitation/accept', { csrf_token, token }));
    await expectUnchanged(before);
  });
});

describe(`replaced invitation links on ${BACKEND}`, () => {
  it('a re-sent invitation: the old link is the error page, the new one works', async () => {
    const invited = await invite();
    const resent = await api('POST', orgA, bearerA, `/invitations/${invited.id}/resend`);
    expect(resent.statusCode, resent.body).toBe(200);
    const newToken = tokenOf(linkIn(await nthMail(invited.email, 2), `${issuer}/invitation?token=`));
    expect(newToken).not.toBe(invited.token);
    const b = browser();
    const csrf = await preCsrf(b);
    const before = await snapshot();
    expectBadLink(await b.get(`/invitation?token=${invited.token}`));
    expectBadLink(await INVITATION.post(b, invited.token, csrf));
    await expectUnchanged(before);
    expect((await b.get(`/invitation?token=${newToken}`)).statusCode).toBe(200);
  });

  it('a revoked invitation: its link is the error page, for sign-up and for a signed-in invitee', async () => {
    const user = await newUser('revoked');
    const invited = await invite({ email: user.email });
    const revoked = await api('DELETE', orgA, bearerA, `/invitations/${invited.id}`);
    expect(revoked.statusCode).toBe(204);
    const b = await signedIn(user);
    const csrf_token = await b.csrf('/dashboard');
    const anonymous = browser();
    const before = await snapshot();
    expectBadLink(await b.get(`/invitation?token=${invited.token}`));
    expectBadLink(await b.post('/invitation/accept', { csrf_token, token: invited.token }));
    expectBadLink(await INVITATION.post(anonymous, invited.token, await preCsrf(anonymous)));
    await expectUnchanged(before);
    expect(await membershipOf(orgA.organizationId, user.id)).toBeUndefined();
  });

  it('an invitation replaced by inviting the same address again: the first link is the error page', async () => {
    const first = await invite({ role: 'admin' });
    const second = await invite({ email: first.email, role: 'member' });
    expect(second.id).not.toBe(first.id);
    const b = browser();
    const before = await snapshot();
    expectBadLink(await b.get(`/invitation?token=${first.token}`));
    expectBadLink(await INVITATION.post(b, first.token, await preCsrf(b)));
    await expectUnchanged(before);
    const page = await b.get(`/invitation?token=${second.token}`);
    expect(page.statusCode).toBe(200);
    expect(page.body).toContain('<strong>member</strong>');
  });
});

// ---------------------------------------------------------------------------------------------
// Forms before sign-in

describe(`POST /forgot-password with bad input on ${BACKEND}`, () => {
  it('without a CSRF token: 403, nothing sent', async () => {
    const user = await newUser('forgot-nocsrf');
    const b = browser();
    await preCsrf(b);
    const before = await snapshot();
    expectCsrfRefused(await b.post('/forgot-password', { email: user.email }));
    expectCsrfRefused(await new Browser(app, '10.16.0.1').post('/forgot-password', { email: user.email, csrf_token: 'x'.repeat(43) }));
    await expectUnchanged(before);
  });

  it("with another browser's CSRF token, or a signed-in session's: 403", async () => {
    const user = await newUser('forgot-othercsrf');
    const mine = browser();
    await preCsrf(mine);
    const theirs = await preCsrf(browser());
    const session = await (await signedIn(await newUser('forgot-session'))).csrf('/dashboard');
    const before = await snapshot();
    expectCsrfRefused(await mine.post('/forgot-password', { csrf_token: theirs, email: user.email }));
    expectCsrfRefused(await mine.post('/forgot-password', { csrf_token: session, email: user.email }));
    await expectUnchanged(before);
  });

  it.each([
    ['an email of 300 characters', `${'a'.repeat(288)}@example.com`],
    ['an email of 255 characters', `${'a'.repeat(243)}@example.com`],
    ['no @', 'not-an-address'],
    ['two @', 'a@b@example.com'],
    ['a space inside', 'a b@example.com'],
    ['only spaces', '   '],
  ])('%s: 400, the form again with the error, nothing sent', async (_name, email) => {
    const b = browser();
    const csrf_token = await preCsrf(b);
    const before = await snapshot();
    const res = await b.post('/forgot-password', { csrf_token, email });
    expect(res.statusCode).toBe(400);
    expectPageSecurityHeaders(res);
    expectNoLeak(res);
    expect(res.body).toContain('Enter a valid email address.');
    expect(res.body).toContain('action="/forgot-password"');
    expect(res.body).not.toContain('If an account uses that address');
    await expectUnchanged(before);
  });

  it('an email of 300 characters of markup is shown back escaped', async () => {
    const b = browser();
    const csrf_token = await preCsrf(b);
    const email = `"><script>alert(1)</script>${'a'.repeat(280)}`;
    const res = await b.post('/forgot-password', { csrf_token, email });
    expect(res.statusCode).toBe(400);
    expect(res.body).not.toContain('<script>alert(1)</script>');
    expect(res.body).toContain('&lt;script&gt;');
  });

  it('a repeated email field (email=a&email=b): 400, nothing sent', async () => {
    const user = await newUser('forgot-array');
    const b = browser();
    const csrf_token = await preCsrf(b);
    const before = await snapshot();
    expectFormRefused(await b.post('/forgot-password', { csrf_token, email: [user.email, address('other')] }));
    expectFormRefused(await b.post('/forgot-password', { csrf_token: [csrf_token, csrf_token], email: user.email }));
    await expectUnchanged(before);
  });

  it('a JSON body: 403 without the CSRF token (an array has none), 400 when a field is not a string or the JSON is broken', async () => {
    const user = await newUser('forgot-json');
    const b = browser();
    const csrf_token = await preCsrf(b);
    const before = await snapshot();
    expectCsrfRefused(await postRaw(b, '/forgot-password', 'application/json', JSON.stringify({ email: user.email })));
    expectFormRefused(await postRaw(b, '/forgot-password', 'application/json', JSON.stringify({ csrf_token, email: [user.email] })));
    expectFormRefused(await postRaw(b, '/forgot-password', 'application/json', JSON.stringify({ csrf_token, email: { $ne: '' } })));
    // An array reads as fields "0" and "1": no csrf_token among them.
    expectCsrfRefused(await postRaw(b, '/forgot-password', 'application/json', JSON.stringify([csrf_token, user.email])));
    expectFormRefused(await postRaw(b, '/forgot-password', 'application/json', '{"csrf_token":'));
    await expectUnchanged(before);
  });

  it('a text/plain body (what a cross-site form can send without a preflight): 400; multipart: 415; nothing sent', async () => {
    const user = await newUser('forgot-plain');
    const b = browser();
    const csrf_token = await preCsrf(b);
    const before = await snapshot();
    expectFormRefused(await postRaw(b, '/forgot-password', 'text/plain', `csrf_token=${csrf_token}&email=${user.email}`));
    expectErrorPage(await postRaw(b, '/forgot-password', 'multipart/form-data; boundary=x', `--x\r\nContent-Disposition: form-data; name="email"\r\n\r\n${user.email}\r\n--x--\r\n`), 415);
    await expectUnchanged(before);
  });

  it('unknown fields are ignored: the same answer as without them', async () => {
    const b = browser();
    const csrf_token = await preCsrf(b);
    const email = address('nobody');
    const before = await snapshot();
    const res = await app.inject({
      method: 'POST',
      url: '/forgot-password',
      headers: { 'content-type': 'application/x-www-form-urlencoded', cookie: cookieHeader(b) },
      payload: `${form({ csrf_token, email, user_id: String(ownerA.id), role: 'owner', redirect: 'https://evil.example/' })}&__proto__[admin]=1&constructor[prototype][x]=1`,
      remoteAddress: '10.16.0.2',
    });
    expect(res.statusCode, res.body.slice(0, 300)).toBe(200);
    expect(res.body).toContain('If an account uses that address');
    await expectUnchanged(before);
  });
});

describe(`/forgot-password answers every address the same on ${BACKEND}`, () => {
  it('existing, unknown, existing in other letter case, unverified: same status, body (but the CSRF token), headers', async () => {
    const known = await newUser('same-known');
    const unverified = await newUser('same-unverified', { verified: false });
    const addresses = [known.email, address('same-unknown'), known.email.toUpperCase(), unverified.email, `  ${address('same-unknown-padded')}  `];
    const answers: LightMyRequestResponse[] = [];
    for (const email of addresses) {
      const b = browser();
      const csrf_token = await preCsrf(b);
      answers.push(await b.post('/forgot-password', { csrf_token, email }));
    }
    const strip = (body: string) => body.replace(/name="csrf_token" value="[^"]+"/, 'name="csrf_token" value=""');
    const VOLATILE = new Set(['date', 'x-request-id']);
    const headers = (res: LightMyRequestResponse) => Object.fromEntries(Object.entries(res.headers).filter(([name]) => !VOLATILE.has(name)));
    const [first, ...rest] = answers;
    expect(first!.statusCode).toBe(200);
    expect(first!.body).toContain('If an account uses that address');
    expectPageSecurityHeaders(first!);
    for (const res of rest) {
      expect(res.statusCode).toBe(first!.statusCode);
      expect(strip(res.body)).toBe(strip(first!.body));
      expect(Object.keys(res.headers).sort()).toEqual(Object.keys(first!.headers).sort());
      expect(headers(res)).toEqual(headers(first!));
    }
    // The work happened afterwards: two links to the known account (both spellings), one to the unverified one.
    await nthMail(known.email, 2);
    await nthMail(unverified.email, 1);
  });

  it('a refused address is answered the same whether or not it resembles an account', async () => {
    const known = await newUser('same-bad');
    const answers: LightMyRequestResponse[] = [];
    for (const email of [`${known.email}@x`, `${address('none')}@x`]) {
      const b = browser();
      answers.push(await b.post('/forgot-password', { csrf_token: await preCsrf(b), email }));
    }
    expect(answers.map((r) => r.statusCode)).toEqual([400, 400]);
  });
});

describe(`POST /reset-password with bad input on ${BACKEND}`, () => {
  async function setUp(label: string) {
    const user = await newUser(label);
    const token = await issue('reset_password', user);
    const b = browser();
    const page = await b.get(`/reset-password?token=${token}`);
    expect(page.statusCode).toBe(200);
    return { user, token, b, csrf: csrfTokenIn(page.body) };
  }
  /** The link still works: the page opens, and the reset goes through. */
  async function stillWorks(token: string, userId: number) {
    const hash = await passwordHashOf(userId);
    await RESET.use(browser(), token);
    expect(await passwordHashOf(userId)).not.toBe(hash);
  }

  it('without a CSRF token, or with a wrong one: 403, the link unused', async () => {
    const { user, token, b } = await setUp('reset-nocsrf');
    const before = await snapshot();
    expectCsrfRefused(await b.post('/reset-password', { token, password: NEW_PASSWORD }));
    expectCsrfRefused(await b.post('/reset-password', { token, password: NEW_PASSWORD, csrf_token: '' }));
    expectCsrfRefused(await b.post('/reset-password', { token, password: NEW_PASSWORD, csrf_token: 'A'.repeat(43) }));
    expectCsrfRefused(await new Browser(app, '10.16.1.1').post('/reset-password', { token, password: NEW_PASSWORD }));
    await expectUnchanged(before);
    await stillWorks(token, user.id);
  });

  it("with another browser's CSRF token, or a signed-in session's: 403, the link unused", async () => {
    const { user, token, b } = await setUp('reset-othercsrf');
    const theirs = await preCsrf(browser());
    const session = await (await signedIn(user)).csrf('/dashboard');
    const before = await snapshot();
    expectCsrfRefused(await b.post('/reset-password', { csrf_token: theirs, token, password: NEW_PASSWORD }));
    expectCsrfRefused(await b.post('/reset-password', { csrf_token: session, token, password: NEW_PASSWORD }));
    await expectUnchanged(before);
    await stillWorks(token, user.id);
  });

  it.each([
    ['empty', ''],
    ['9 characters', '123456789'],
    ['1025 characters', 'p'.repeat(PASSWORD_MAX_LENGTH + 1)],
    ['2000 characters', 'p'.repeat(2000)],
  ])('a password of %s: 400, the form again with the same link, which still works', async (_name, password) => {
    const { user, token, b, csrf } = await setUp('reset-length');
    const before = await snapshot();
    const res = await b.post('/reset-password', { csrf_token: csrf, token, password });
    expect(res.statusCode).toBe(400);
    expectPageSecurityHeaders(res);
    expectNoLeak(res);
    expect(res.body).toContain('The password must be 10 to 1024 characters long.');
    expect(res.body).toContain(`name="token" value="${token}"`);
    expect(res.body).toContain('action="/reset-password"');
    await expectUnchanged(before);
    // The same page works again: the form it re-rendered carries a good CSRF token.
    const retry = await b.post('/reset-password', { csrf_token: csrfTokenIn(res.body), token, password: NEW_PASSWORD });
    expect(retry.statusCode, retry.body.slice(0, 300)).toBe(200);
    expect(await passwordHashOf(user.id)).not.toBe(before.users.find((u) => u.id === user.id)!.password_hash);
  });

  it(`a password of exactly ${PASSWORD_MAX_LENGTH} characters is accepted`, async () => {
    const { user, token, b, csrf } = await setUp('reset-max');
    const res = await b.post('/reset-password', { csrf_token: csrf, token, password: 'q'.repeat(PASSWORD_MAX_LENGTH) });
    expect(res.statusCode).toBe(200);
    expect((await new Browser(app, '10.16.1.2').login(user.email, 'q'.repeat(PASSWORD_MAX_LENGTH))).statusCode).toBe(303);
  });

  it('a repeated password or token field: 400, the link unused', async () => {
    const { user, token, b, csrf } = await setUp('reset-array');
    const before = await snapshot();
    expectFormRefused(await b.post('/reset-password', { csrf_token: csrf, token, password: [NEW_PASSWORD, 'another-password-9'] }));
    expectFormRefused(await b.post('/reset-password', { csrf_token: csrf, token: [token, token], password: NEW_PASSWORD }));
    await expectUnchanged(before);
    await stillWorks(token, user.id);
  });

  it('a JSON body: 403 without the CSRF token, 400 with a field that is not a string; the link unused', async () => {
    const { user, token, b, csrf } = await setUp('reset-json');
    const before = await snapshot();
    expectCsrfRefused(await postRaw(b, '/reset-password', 'application/json', JSON.stringify({ token, password: NEW_PASSWORD })));
    expectFormRefused(await postRaw(b, '/reset-password', 'application/json', JSON.stringify({ csrf_token: csrf, token, password: 12345678901 })));
    expectFormRefused(await postRaw(b, '/reset-password', 'application/json', JSON.stringify({ csrf_token: csrf, token: [token], password: NEW_PASSWORD })));
    expectFormRefused(await postRaw(b, '/reset-password', 'text/plain', `csrf_token=${csrf}&token=${token}&password=${NEW_PASSWORD}`));
    // JSON scalars: null reads as no fields (so no CSRF token), a string or a number is not a form.
    expectCsrfRefused(await postRaw(b, '/reset-password', 'application/json', 'null'));
    expectFormRefused(await postRaw(b, '/reset-password', 'application/json', JSON.stringify(`csrf_token=${csrf}&token=${token}`)));
    expectFormRefused(await postRaw(b, '/reset-password', 'application/json', '1'));
    await expectUnchanged(before);
    await stillWorks(token, user.id);
  });

  it("unknown fields cannot point the reset at another account: only the link's user changes", async () => {
    const { user, token, b, csrf } = await setUp('reset-unknown');
    const other = await newUser('reset-bystander');
    const otherHash = await passwordHashOf(other.id);
    const res = await b.post('/reset-password', { csrf_token: csrf, token, password: NEW_PASSWORD, email: other.email, username: other.email, user_id: String(other.id) });
    expect(res.statusCode).toBe(200);
    expect(await passwordHashOf(other.id)).toBe(otherHash);
    expect((await new Browser(app, '10.16.1.3').login(user.email, NEW_PASSWORD)).statusCode).toBe(303);
  });
});

describe(`/verify-email with bad input, signed out or as another account on ${BACKEND}`, () => {
  /** An unverified user, a live link to their address, and a browser signed in as them with the link's page open. */
  async function setUp(label: string) {
    const user = await newUser(label, { verified: false });
    const token = await issue('verify_email', user);
    const b = await signedIn(user);
    const page = await b.get(`/verify-email?token=${token}`);
    expect(page.statusCode).toBe(200);
    expect(page.body).toContain('action="/verify-email"');
    return { user, token, b, csrf: csrfTokenIn(page.body) };
  }
  const verifiedAt = async (userId: number) => (await db().selectFrom('users').select('email_verified_at').where('id', '=', userId).executeTakeFirstOrThrow()).email_verified_at;
  const usedAt = async (token: string) => (await db().selectFrom('account_tokens').select('used_at').where('token_hash', '=', sha256Hex(token)).executeTakeFirstOrThrow()).used_at;

  it('opening the link changes nothing (a mail scanner may fetch it)', async () => {
    const user = await newUser('verify-open', { verified: false });
    const token = await issue('verify_email', user);
    const before = await snapshot();
    for (let i = 0; i < 3; i++) expect((await browser().get(`/verify-email?token=${token}`)).statusCode).toBe(200);
    await expectUnchanged(before);
  });

  it("the page: signed out, a way to sign in and no form; as another account, no form; as the link's user, the form with the session's CSRF token", async () => {
    const user = await newUser('verify-page', { verified: false });
    const token = await issue('verify_email', user);
    const link = `/verify-email?token=${token}`;
    const anonymous = browser();
    const strangerUser = await newUser('verify-page-stranger');
    const stranger = await signedIn(strangerUser);
    const owner = await signedIn(user);
    const sessionCsrf = await owner.csrf('/dashboard');
    const pre = await preCsrf(owner);
    expect(pre).not.toBe(sessionCsrf);
    const before = await snapshot();

    const signedOut = await anonymous.get(link);
    expect(signedOut.statusCode).toBe(200);
    expectPageSecurityHeaders(signedOut);
    expect(signedOut.body).toContain('Sign in to confirm');
    expect(signedOut.body).toContain(`href="/login?return_to=${encodeURIComponent(link)}"`);
    expect(signedOut.body).not.toContain('action="/verify-email"');
    expect(signedOut.body).not.toContain('name="csrf_token"');

    const other = await stranger.get(link);
    expect(other.statusCode).toBe(200);
    expectPageSecurityHeaders(other);
    expect(other.body).toContain('this link is for another account');
    expect(other.body).toContain(`You are signed in as ${strangerUser.email}`);
    expect(other.body).not.toContain('action="/verify-email"');
    expect(other.body).not.toContain('name="csrf_token"');

    const mine = await owner.get(link);
    expect(mine.statusCode).toBe(200);
    expectPageSecurityHeaders(mine);
    expect(mine.body).toContain('action="/verify-email"');
    expect(mine.body).toContain(`name="token" value="${token}"`);
    expect(csrfTokenIn(mine.body)).toBe(sessionCsrf);
    expect(mine.body).not.toContain('Sign in to confirm');

    await expectUnchanged(before);
    // "Sign in to confirm" comes back to the link.
    const back = await anonymous.login(user.email, PASSWORD, link);
    expect(back.statusCode).toBe(303);
    expect(back.headers.location).toBe(link);
    expect(csrfTokenIn((await anonymous.get(link)).body)).toBe(await anonymous.csrf('/dashboard'));
    expect(await usedAt(token)).toBeNull();
  });

  it("signed out: 403 whatever the CSRF token (none, a pre-session one, the link's user's session token), the link unused", async () => {
    const { user, token, b, csrf } = await setUp('verify-signed-out');
    const anonymous = browser();
    const pre = await preCsrf(anonymous);
    const before = await snapshot();
    expectCsrfRefused(await anonymous.post('/verify-email', { token }));
    expectCsrfRefused(await anonymous.post('/verify-email', { token, csrf_token: pre }));
    expectCsrfRefused(await anonymous.post('/verify-email', { token, csrf_token: csrf }));
    await expectUnchanged(before);
    expect(await usedAt(token)).toBeNull();
    expect(await verifiedAt(user.id)).toBeNull();
    // The link's user, signed in, still can.
    expect((await b.post('/verify-email', { csrf_token: csrf, token })).statusCode).toBe(200);
    expect(await verifiedAt(user.id)).not.toBeNull();
  });

  it("signed in to another account: the error page (404), whatever the unknown fields say; the link unused, its user can still confirm", async () => {
    const { user, token, b, csrf } = await setUp('verify-owner');
    // Unverified too: a link that confirmed the wrong account would show here.
    const strangerUser = await newUser('verify-stranger', { verified: false });
    const stranger = await signedIn(strangerUser);
    const strangerCsrf = await stranger.csrf('/dashboard');
    const before = await snapshot();
    expectBadLink(await stranger.post('/verify-email', { csrf_token: strangerCsrf, token }));
    expectBadLink(await stranger.post('/verify-email', { csrf_token: strangerCsrf, token, user_id: String(user.id), email: user.email }));
    await expectUnchanged(before);
    expect(await usedAt(token)).toBeNull();
    expect(await verifiedAt(user.id)).toBeNull();
    expect(await verifiedAt(strangerUser.id)).toBeNull();
    const res = await b.post('/verify-email', { csrf_token: csrf, token });
    expect(res.statusCode, res.body.slice(0, 300)).toBe(200);
    expect(await usedAt(token)).not.toBeNull();
    expect(await verifiedAt(user.id)).not.toBeNull();
    expect(await verifiedAt(strangerUser.id)).toBeNull();
  });

  it("signed in as the link's user: 200, the address confirmed, the link used; the second time the error page", async () => {
    const { user, token, b, csrf } = await setUp('verify-own');
    const res = await b.post('/verify-email', { csrf_token: csrf, token });
    expect(res.statusCode, res.body.slice(0, 300)).toBe(200);
    expectPageSecurityHeaders(res);
    expect(res.body).toContain(`${user.email} is confirmed`);
    expect(await usedAt(token)).not.toBeNull();
    expect(await verifiedAt(user.id)).not.toBeNull();
    const before = await snapshot();
    expectBadLink(await b.post('/verify-email', { csrf_token: csrf, token }));
    expectBadLink(await b.get(`/verify-email?token=${token}`));
    await expectUnchanged(before);
  });

  it("signed in, without a CSRF token, with a pre-session one, another browser's or another session's: 403, the link unused", async () => {
    const { user, token, b } = await setUp('verify-csrf');
    const theirs = await preCsrf(browser());
    // This browser's own pre-session token: what the form carried before sign-in was required.
    const own = await preCsrf(b);
    const session = await (await signedIn(user)).csrf('/dashboard');
    const before = await snapshot();
    expectCsrfRefused(await b.post('/verify-email', { token }));
    expectCsrfRefused(await b.post('/verify-email', { token, csrf_token: '' }));
    expectCsrfRefused(await b.post('/verify-email', { token, csrf_token: own }));
    expectCsrfRefused(await b.post('/verify-email', { token, csrf_token: theirs }));
    expectCsrfRefused(await b.post('/verify-email', { token, csrf_token: session }));
    expectCsrfRefused(await new Browser(app, '10.16.2.1').post('/verify-email', { token, csrf_token: theirs }));
    await expectUnchanged(before);
    expect(await verifiedAt(user.id)).toBeNull();
    await VERIFY.use(b, token);
    expect(await verifiedAt(user.id)).not.toBeNull();
  });

  it('a repeated token, a JSON body, a text/plain body: 400 or 403, the link unused', async () => {
    const { user, token, b, csrf } = await setUp('verify-shapes');
    const before = await snapshot();
    expectFormRefused(await b.post('/verify-email', { csrf_token: csrf, token: [token, token] }));
    expectCsrfRefused(await postRaw(b, '/verify-email', 'application/json', JSON.stringify({ token })));
    expectFormRefused(await postRaw(b, '/verify-email', 'application/json', JSON.stringify({ csrf_token: csrf, token: { token } })));
    expectFormRefused(await postRaw(b, '/verify-email', 'text/plain', `csrf_token=${csrf}&token=${token}`));
    await expectUnchanged(before);
    expect(await verifiedAt(user.id)).toBeNull();
    await VERIFY.use(b, token);
  });

  it('a link to change the address to one another account has taken since: 409, nothing changed, the link unused', async () => {
    const user = await newUser('verify-change');
    const wanted = address('wanted');
    const token = await issueAccountToken(db(), { purpose: 'verify_email', userId: user.id, email: wanted, ttlSeconds: VERIFY_EMAIL_TTL_S });
    const b = await signedIn(user);
    const page = await b.get(`/verify-email?token=${token}`);
    expect(page.statusCode).toBe(200);
    expect(page.body).toContain(`Confirm <strong>${wanted}</strong> as the new email address`);
    await newUser('taker').then(async (taker) => db().updateTable('users').set({ email: wanted.toUpperCase() }).where('id', '=', taker.id).execute());
    const before = await snapshot();
    const res = await b.post('/verify-email', { csrf_token: csrfTokenIn(page.body), token });
    expectErrorPage(res, 409);
    expect(res.body).toContain('Another account has started using this email address');
    await expectUnchanged(before);
    expect((await db().selectFrom('users').select('email').where('id', '=', user.id).executeTakeFirstOrThrow()).email).toBe(user.email);
  });

  it('an unknown email field does not choose the address: the one the link was sent to is confirmed', async () => {
    const { user, token, b, csrf } = await setUp('verify-unknown');
    const res = await b.post('/verify-email', { csrf_token: csrf, token, email: 'attacker@evil.example', user_id: String(ownerA.id) });
    expect(res.statusCode).toBe(200);
    const row = await db().selectFrom('users').select(['email', 'email_verified_at']).where('id', '=', user.id).executeTakeFirstOrThrow();
    expect(row.email).toBe(user.email);
    expect(row.email_verified_at).not.toBeNull();
    expect((await db().selectFrom('users').select('email').where('id', '=', ownerA.id).executeTakeFirstOrThrow()).email).toBe(ownerA.email);
  });
});

describe(`POST /invitation/signup with bad input on ${BACKEND}`, () => {
  async function setUp() {
    const invited = await invite();
    const b = browser();
    const page = await b.get(`/invitation?token=${invited.token}`);
    expect(page.statusCode).toBe(200);
    expect(page.body).toContain('action="/invitation/signup"');
    return { invited, b, csrf: csrfTokenIn(page.body) };
  }
  const userWith = (email: string) => db().selectFrom('users').select(['id', 'email', 'name', 'email_verified_at']).where(sql<string>`lower(email)`, '=', email.toLowerCase()).executeTakeFirst();
  /** The invitation still works: signing up from it joins. */
  async function stillWorks(invited: Invited) {
    await INVITATION.use(browser(), invited.token);
    const user = await userWith(invited.email);
    expect(await membershipOf(orgA.organizationId, user!.id)).toEqual({ role: 'member' });
  }

  it("without a CSRF token, with another browser's or a session's: 403, no account, the invitation open", async () => {
    const { invited, b } = await setUp();
    const theirs = await preCsrf(browser());
    const session = await (await signedIn(await newUser('signup-session'))).csrf('/dashboard');
    const before = await snapshot();
    const fields = { token: invited.token, password: NEW_PASSWORD, name: 'Mallory' };
    expectCsrfRefused(await b.post('/invitation/signup', fields));
    expectCsrfRefused(await b.post('/invitation/signup', { ...fields, csrf_token: theirs }));
    expectCsrfRefused(await b.post('/invitation/signup', { ...fields, csrf_token: session }));
    expectCsrfRefused(await new Browser(app, '10.16.3.1').post('/invitation/signup', { ...fields, csrf_token: theirs }));
    await expectUnchanged(before);
    expect(await userWith(invited.email)).toBeUndefined();
    await stillWorks(invited);
  });

  it.each([
    ['a password of 9 characters', { password: '123456789' }, 'The password must be 10 to 1024 characters long.'],
    ['a password of 2000 characters', { password: 'p'.repeat(2000) }, 'The password must be 10 to 1024 characters long.'],
    ['no password', { password: '' }, 'The password must be 10 to 1024 characters long.'],
    ['a name of 500 characters', { name: 'n'.repeat(500) }, 'The name must be at most 200 characters long.'],
    ['both', { name: 'n'.repeat(500), password: 'p'.repeat(2000) }, 'The name must be at most 200 characters long.'],
  ])('%s: 400, the invitation page again with the error, no account, the invitation open', async (_name, fields, error) => {
    const { invited, b, csrf } = await setUp();
    const before = await snapshot();
    const res = await b.post('/invitation/signup', { csrf_token: csrf, token: invited.token, password: NEW_PASSWORD, name: 'Invitee', ...fields });
    expect(res.statusCode).toBe(400);
    expectPageSecurityHeaders(res);
    expectNoLeak(res);
    expect(res.body).toContain(error);
    expect(res.body).toContain('action="/invitation/signup"');
    expect(res.body).toContain(`name="token" value="${invited.token}"`);
    await expectUnchanged(before);
    await stillWorks(invited);
  });

  it('a name of 500 characters of markup is shown back escaped', async () => {
    const { invited, b, csrf } = await setUp();
    const res = await b.post('/invitation/signup', { csrf_token: csrf, token: invited.token, password: NEW_PASSWORD, name: `<img src=x onerror=alert(1)>${'n'.repeat(480)}` });
    expect(res.statusCode).toBe(400);
    expect(res.body).not.toContain('<img src=x');
    expect(res.body).toContain('&lt;img src=x');
  });

  it('repeated fields, a JSON body, a text/plain body: 400 or 403, no account, the invitation open', async () => {
    const { invited, b, csrf } = await setUp();
    const before = await snapshot();
    const fields = { csrf_token: csrf, token: invited.token, password: NEW_PASSWORD, name: 'Invitee' };
    expectFormRefused(await b.post('/invitation/signup', { ...fields, email: [invited.email, address('second')] }));
    expectFormRefused(await b.post('/invitation/signup', { ...fields, password: [NEW_PASSWORD, NEW_PASSWORD] }));
    expectFormRefused(await b.post('/invitation/signup', { ...fields, name: ['a', 'b'] }));
    expectFormRefused(await b.post('/invitation/signup', { ...fields, token: [invited.token, invited.token] }));
    expectCsrfRefused(await postRaw(b, '/invitation/signup', 'application/json', JSON.stringify({ token: invited.token, password: NEW_PASSWORD })));
    expectFormRefused(await postRaw(b, '/invitation/signup', 'application/json', JSON.stringify({ ...fields, name: { first: 'x' } })));
    expectFormRefused(await postRaw(b, '/invitation/signup', 'text/plain', form(fields)));
    await expectUnchanged(before);
    await stillWorks(invited);
  });

  it('unknown fields choose nothing: the account has the invited address, verified, and the invited role in the inviting organization only', async () => {
    const { invited, b, csrf } = await setUp();
    const res = await b.post('/invitation/signup', {
      csrf_token: csrf,
      token: invited.token,
      password: NEW_PASSWORD,
      name: 'Invitee',
      email: `${'x'.repeat(300)}@evil.example`,
      role: 'owner',
      organization_id: String(orgB.organizationId),
      email_verified_at: '',
    });
    expect(res.statusCode, res.body.slice(0, 300)).toBe(303);
    const user = (await userWith(invited.email))!;
    expect(user.email).toBe(invited.email);
    expect(user.email_verified_at).not.toBeNull();
    const memberships = await db().selectFrom('memberships').select(['organization_id', 'role']).where('user_id', '=', user.id).execute();
    expect(memberships).toEqual([{ organization_id: orgA.organizationId, role: 'member' }]);
    expect(await db().selectFrom('users').select('id').where('email', 'like', '%@evil.example').execute()).toEqual([]);
  });

  it('for an address that already has an account: 409, the page again, no second account, the invitation open', async () => {
    const existing = await newUser('signup-exists');
    const invited = await invite({ email: existing.email.toUpperCase() });
    const b = browser();
    const before = await snapshot();
    const res = await b.post('/invitation/signup', { csrf_token: await preCsrf(b), token: invited.token, password: NEW_PASSWORD, name: 'Twin' });
    expect(res.statusCode).toBe(409);
    expectPageSecurityHeaders(res);
    expect(res.body).toContain('An account with this email address already exists.');
    await expectUnchanged(before);
  });
});

describe(`oversized bodies on the lifecycle forms on ${BACKEND}`, () => {
  it.each(['/forgot-password', '/reset-password', '/verify-email', '/invitation/signup', '/invitation/accept'])('a 70 kB form to %s: 413, an HTML page, nothing changed', async (url) => {
    const b = browser();
    const csrf_token = await preCsrf(b);
    const before = await snapshot();
    const res = await b.post(url, { csrf_token, email: address('big'), token: 'A'.repeat(43), password: 'p'.repeat(70_000) });
    expectErrorPage(res, 413);
    await expectUnchanged(before);
  });
});

describe(`link tokens in the logs on ${BACKEND}`, () => {
  it('a token is never logged, however the link is mangled (repeated, percent-encoded name, inside return_to)', async () => {
    const capture = logCapture();
    const logged = await buildTestApp(t.handle.db, { env: { SMTP_URL: smtp.url, CLEANUP_INTERVAL: '0' }, logStream: capture.stream });
    try {
      const token = await RESET.fresh();
      const urls = [
        `/reset-password?token=${token}`,
        `/reset-password?token=${token}&token=${token}`,
        `/reset-password?a=1&%74oken=${token}`,
        `/reset-password?token=${tamper(token)}`,
        `/login?return_to=${encodeURIComponent(`/invitation?token=${token}`)}`,
        `/login?return_to=/invitation?token=${token}`,
      ];
      for (const url of urls) {
        const res = await logged.inject({ method: 'GET', url, remoteAddress: '10.18.0.1' });
        expect(res.statusCode, url).toBeLessThan(500);
      }
      const b = new Browser(logged, '10.18.0.2');
      const csrf_token = await b.csrf('/forgot-password');
      // Refused forms log their reason, never their fields.
      await b.post('/reset-password', { csrf_token, token: [token, token], password: NEW_PASSWORD });
      await b.post('/reset-password', { csrf_token, token, password: 'short' });
      await b.post('/reset-password', { token, password: NEW_PASSWORD });
      const lines = capture.lines();
      expect(lines.length).toBeGreaterThan(urls.length);
      for (const line of lines) {
        expect(line).not.toContain(token);
        expect(line).not.toContain(tamper(token));
        expect(line).not.toContain(NEW_PASSWORD);
      }
    } finally {
      await logged.close();
    }
  });
});

// ---------------------------------------------------------------------------------------------
// Accepting invitations

describe(`POST /invitation/accept with bad input on ${BACKEND}`, () => {
  async function setUp(label: string) {
    const user = await newUser(label);
    const invited = await invite({ email: user.email });
    const b = await signedIn(user);
    const page = await b.get(`/invitation?token=${invited.token}`);
    expect(page.statusCode).toBe(200);
    expect(page.body).toContain('action="/invitation/accept"');
    return { user, invited, b, csrf: csrfTokenIn(page.body) };
  }
  async function stillWorks(b: Browser, csrf: string, user: TestUser, invited: Invited) {
    const res = await b.post('/invitation/accept', { csrf_token: csrf, token: invited.token });
    expect(res.statusCode, res.body.slice(0, 300)).toBe(303);
    expect(await membershipOf(orgA.organizationId, user.id)).toEqual({ role: 'member' });
  }

  it('signed out: 403, whatever the CSRF token', async () => {
    const { user, invited, b, csrf } = await setUp('accept-signedout');
    const anonymous = browser();
    const pre = await preCsrf(anonymous);
    const before = await snapshot();
    expectCsrfRefused(await anonymous.post('/invitation/accept', { token: invited.token }));
    expectCsrfRefused(await anonymous.post('/invitation/accept', { token: invited.token, csrf_token: pre }));
    expectCsrfRefused(await anonymous.post('/invitation/accept', { token: invited.token, csrf_token: csrf }));
    await expectUnchanged(before);
    await stillWorks(b, csrf, user, invited);
  });

  it("signed in, without a CSRF token, with another session's, with a pre-session one: 403, not a member", async () => {
    const { user, invited, b, csrf } = await setUp('accept-csrf');
    const otherSession = await (await signedIn(user)).csrf('/dashboard');
    const before = await snapshot();
    expectCsrfRefused(await b.post('/invitation/accept', { token: invited.token }));
    expectCsrfRefused(await b.post('/invitation/accept', { token: invited.token, csrf_token: '' }));
    expectCsrfRefused(await b.post('/invitation/accept', { token: invited.token, csrf_token: otherSession }));
    expectCsrfRefused(await b.post('/invitation/accept', { token: invited.token, csrf_token: await preCsrf(browser()) }));
    await expectUnchanged(before);
    expect(await membershipOf(orgA.organizationId, user.id)).toBeUndefined();
    await stillWorks(b, csrf, user, invited);
  });

  it('a repeated token, a JSON body without the CSRF token, a text/plain body: 400 or 403, not a member', async () => {
    const { user, invited, b, csrf } = await setUp('accept-shapes');
    const before = await snapshot();
    expectFormRefused(await b.post('/invitation/accept', { csrf_token: csrf, token: [invited.token, invited.token] }));
    expectCsrfRefused(await postRaw(b, '/invitation/accept', 'application/json', JSON.stringify({ token: invited.token })));
    expectFormRefused(await postRaw(b, '/invitation/accept', 'application/json', JSON.stringify({ csrf_token: csrf, token: [invited.token] })));
    expectFormRefused(await postRaw(b, '/invitation/accept', 'text/plain', form({ csrf_token: csrf, token: invited.token })));
    await expectUnchanged(before);
    await stillWorks(b, csrf, user, invited);
  });

  it('unknown fields choose nothing: the invited role, in the inviting organization', async () => {
    const { user, invited, b, csrf } = await setUp('accept-unknown');
    const res = await b.post('/invitation/accept', { csrf_token: csrf, token: invited.token, role: 'owner', organization_id: String(orgB.organizationId), user_id: String(ownerB.id) });
    expect(res.statusCode).toBe(303);
    expect(await membershipOf(orgA.organizationId, user.id)).toEqual({ role: 'member' });
    expect(await membershipOf(orgB.organizationId, user.id)).toBeUndefined();
  });
});

describe(`invitations accepted by the wrong person on ${BACKEND}`, () => {
  it('another signed-in user (a different address) with a valid link: 403, not a member, the invitation still open for the invitee', async () => {
    const invitee = await newUser('rightful');
    const stranger = await newUser('stranger');
    const invited = await invite({ email: invitee.email, role: 'admin' });
    const b = await signedIn(stranger);
    const page = await b.get(`/invitation?token=${invited.token}`);
    expect(page.statusCode).toBe(200);
    // The page offers no accept button to the wrong account.
    expect(page.body).not.toContain('action="/invitation/accept"');
    expect(page.body).toContain(`You are signed in as ${stranger.email}`);
    const csrf_token = await b.csrf('/dashboard');
    const before = await snapshot();
    const res = await b.post('/invitation/accept', { csrf_token, token: invited.token });
    expectErrorPage(res, 403);
    expect(res.body).toContain(`This invitation is for ${invitee.email}`);
    await expectUnchanged(before);
    expect(await membershipOf(orgA.organizationId, stranger.id)).toBeUndefined();
    // The invitee can still accept.
    const rightful = await signedIn(invitee);
    const ok = await rightful.post('/invitation/accept', { csrf_token: await rightful.csrf('/dashboard'), token: invited.token });
    expect(ok.statusCode).toBe(303);
    expect(await membershipOf(orgA.organizationId, invitee.id)).toEqual({ role: 'admin' });
  });

  it('a user whose address only resembles the invited one (a prefix, another domain) is refused too', async () => {
    const invitedEmail = address('lookalike');
    const lookalikes = [await createUser(db(), { email: `x${invitedEmail}`, password: PASSWORD }), await createUser(db(), { email: `${invitedEmail}.evil`, password: PASSWORD })];
    const invited = await invite({ email: invitedEmail });
    for (const user of lookalikes) {
      const b = await signedIn({ id: user.id, email: user.email });
      const before = await snapshot();
      expectErrorPage(await b.post('/invitation/accept', { csrf_token: await b.csrf('/dashboard'), token: invited.token }), 403);
      await expectUnchanged(before);
    }
  });

  it('an unverified user with the invited address: 409, the page again with the reason, not a member; after confirming, it works', async () => {
    const unverified = await newUser('unverified', { verified: false });
    const invited = await invite({ email: unverified.email });
    const b = await signedIn(unverified);
    const page = await b.get(`/invitation?token=${invited.token}`);
    expect(page.statusCode).toBe(200);
    const csrf = csrfTokenIn(page.body);
    const before = await snapshot();
    const res = await b.post('/invitation/accept', { csrf_token: csrf, token: invited.token });
    expect(res.statusCode).toBe(409);
    expectPageSecurityHeaders(res);
    expectNoLeak(res);
    expect(res.body).toContain('Confirm your email address first');
    await expectUnchanged(before);
    expect(await membershipOf(orgA.organizationId, unverified.id)).toBeUndefined();
    expect((await invitationRow(invited.id)).accepted_at).toBeNull();
    // Confirming the address (a link sent to it, followed signed in) lets the same link through.
    await VERIFY.use(b, await issue('verify_email', unverified));
    expect((await b.post('/invitation/accept', { csrf_token: csrf, token: invited.token })).statusCode).toBe(303);
    expect(await membershipOf(orgA.organizationId, unverified.id)).toEqual({ role: 'member' });
  });

  it('accepting twice: the second time is the error page, and changes nothing', async () => {
    const user = await newUser('twice');
    const invited = await invite({ email: user.email });
    const b = await signedIn(user);
    const csrf_token = await b.csrf('/dashboard');
    expect((await b.post('/invitation/accept', { csrf_token, token: invited.token })).statusCode).toBe(303);
    const before = await snapshot();
    expectBadLink(await b.post('/invitation/accept', { csrf_token, token: invited.token }));
    expectBadLink(await b.get(`/invitation?token=${invited.token}`));
    await expectUnchanged(before);
    const accepted = await db()
      .selectFrom('audit_events')
      .select('action')
      .where('organization_id', '=', orgA.organizationId)
      .where('action', 'in', ['invitation.accepted', 'member.added'])
      .where(sql<string>`details->>'invitation_id'`, '=', String(invited.id))
      .execute();
    expect(accepted.map((e) => e.action).sort()).toEqual(['invitation.accepted', 'member.added']);
  });

  it('signing up from a link already used for signing up: the error page, no second account', async () => {
    const invited = await invite();
    await INVITATION.use(browser(), invited.token);
    const b = browser();
    const before = await snapshot();
    expectBadLink(await b.post('/invitation/signup', { csrf_token: await preCsrf(b), token: invited.token, password: NEW_PASSWORD, name: 'Second' }));
    await expectUnchanged(before);
  });
});

// ---------------------------------------------------------------------------------------------
// Managing invitations across organizations

describe(`an invitation of one organization through another's dashboard or API on ${BACKEND}`, () => {
  it("org B's dashboard cannot resend or revoke org A's invitation (404), whoever asks", async () => {
    const invited = await invite();
    // Org B's owner, and someone who is owner of A but has B selected.
    const bOwner = await signedIn(ownerB, OWNER_PASSWORD);
    const both = await signedIn(ownerA, OWNER_PASSWORD);
    await addMember(db(), { organizationId: orgB.organizationId, userId: ownerA.id, role: 'admin' });
    const selected = await both.post('/dashboard/organization', { csrf_token: await both.csrf('/dashboard'), organization_id: String(orgB.organizationId) });
    expect(selected.statusCode).toBe(303);
    const before = await snapshot();
    for (const b of [bOwner, both]) {
      const csrf_token = await b.csrf('/dashboard');
      for (const action of ['resend', 'revoke']) {
        const res = await b.post(`/dashboard/invitations/${invited.id}/${action}`, { csrf_token });
        expectErrorPage(res, 404);
      }
    }
    await expectUnchanged(before);
    expect((await browser().get(`/invitation?token=${invited.token}`)).statusCode).toBe(200);
  });

  it("org B's API cannot read, resend or revoke org A's invitation (404), and org B's token cannot use org A's path (403)", async () => {
    const invited = await invite();
    const before = await snapshot();
    for (const [method, path] of [['GET', `/invitations/${invited.id}`], ['POST', `/invitations/${invited.id}/resend`], ['DELETE', `/invitations/${invited.id}`]] as const) {
      const res = await api(method, orgB, bearerB, path);
      expect(res.statusCode, res.body).toBe(404);
      expect(res.json().error).toBe('not_found');
    }
    const listed = await api('GET', orgB, bearerB, '/invitations');
    expect(listed.json().data.map((i: { id: number }) => i.id)).not.toContain(invited.id);
    for (const [method, path] of [['POST', `/invitations/${invited.id}/resend`], ['DELETE', `/invitations/${invited.id}`]] as const) {
      const res = await api(method, orgA, bearerB, path);
      expect(res.statusCode, res.body).toBe(403);
      expect(res.json().error).toBe('organization_mismatch');
    }
    await expectUnchanged(before);
    expect((await browser().get(`/invitation?token=${invited.token}`)).statusCode).toBe(200);
  });

  it('malformed invitation ids are 404 in the API and the dashboard', async () => {
    const owner = await signedIn(ownerA, OWNER_PASSWORD);
    await owner.post('/dashboard/organization', { csrf_token: await owner.csrf('/dashboard'), organization_id: String(orgA.organizationId) });
    const csrf_token = await owner.csrf('/dashboard');
    const before = await snapshot();
    for (const id of ['0', '01', '-1', '1.0', '1e3', 'abc', '9223372036854775808', '99999999']) {
      const res = await api('POST', orgA, bearerA, `/invitations/${encodeURIComponent(id)}/resend`);
      expect(res.statusCode, `${id}: ${res.body}`).toBe(404);
      expect((await api('DELETE', orgA, bearerA, `/invitations/${encodeURIComponent(id)}`)).statusCode).toBe(404);
      expectErrorPage(await owner.post(`/dashboard/invitations/${encodeURIComponent(id)}/revoke`, { csrf_token }), 404);
      expectErrorPage(await owner.post(`/dashboard/invitations/${encodeURIComponent(id)}/resend`, { csrf_token }), 404);
    }
    await expectUnchanged(before);
  });

  it("an owner's invitation to become an owner cannot be re-sent or revoked by an application or an admin (403)", async () => {
    const owner = await signedIn(ownerA, OWNER_PASSWORD);
    await owner.post('/dashboard/organization', { csrf_token: await owner.csrf('/dashboard'), organization_id: String(orgA.organizationId) });
    const email = address('future-owner');
    const sent = await owner.post('/dashboard/invitations', { csrf_token: await owner.csrf('/dashboard'), email, role: 'owner' });
    expect(sent.statusCode, sent.body.slice(0, 300)).toBe(303);
    const { id } = await db().selectFrom('invitations').select('id').where('email', '=', email).executeTakeFirstOrThrow();
    const adminUser = await newUser('org-admin');
    await addMember(db(), { organizationId: orgA.organizationId, userId: adminUser.id, role: 'admin' });
    const admin = await signedIn(adminUser);
    await admin.post('/dashboard/organization', { csrf_token: await admin.csrf('/dashboard'), organization_id: String(orgA.organizationId) });
    const before = await snapshot();
    const resend = await api('POST', orgA, bearerA, `/invitations/${id}/resend`);
    expect(resend.statusCode).toBe(403);
    expect(resend.json().error).toBe('forbidden');
    const revoke = await api('DELETE', orgA, bearerA, `/invitations/${id}`);
    expect(revoke.statusCode).toBe(403);
    const csrf_token = await admin.csrf('/dashboard');
    expectErrorPage(await admin.post(`/dashboard/invitations/${id}/resend`, { csrf_token }), 403);
    expectErrorPage(await admin.post(`/dashboard/invitations/${id}/revoke`, { csrf_token }), 403);
    // Nor can an admin invite an owner in the first place.
    const invited = await admin.post('/dashboard/invitations', { csrf_token, email: address('another-owner'), role: 'owner' });
    expect(invited.statusCode).toBe(403);
    expect(invited.body).toContain('only an owner may invite an owner');
    await expectUnchanged(before);
  });

  it('an accepted or revoked invitation cannot be re-sent (404): its link stays dead', async () => {
    const accepted = await invite();
    await INVITATION.use(browser(), accepted.token);
    const revoked = await invite();
    expect((await api('DELETE', orgA, bearerA, `/invitations/${revoked.id}`)).statusCode).toBe(204);
    const before = await snapshot();
    for (const invited of [accepted, revoked]) {
      expect((await api('POST', orgA, bearerA, `/invitations/${invited.id}/resend`)).statusCode).toBe(404);
      expect((await api('DELETE', orgA, bearerA, `/invitations/${invited.id}`)).statusCode).toBe(404);
    }
    await expectUnchanged(before);
  });
});

describe(`the API's POST /invitations with bad bodies on ${BACKEND}`, () => {
  const long = `${'a'.repeat(288)}@example.com`;
  const ROWS: [name: string, status: number, error: string, body: () => unknown, headers?: Record<string, string>][] = [
    ['no body', 400, 'invalid_request', () => undefined],
    ['an empty object', 400, 'invalid_request', () => ({})],
    ['no email', 400, 'invalid_request', () => ({ role: 'member' })],
    ['no role', 400, 'invalid_request', () => ({ email: address('api') })],
    ['an email that is not an address', 400, 'invalid_request', () => ({ email: 'not-an-address', role: 'member' })],
    ['an empty email', 400, 'invalid_request', () => ({ email: '', role: 'member' })],
    ['an email with two @', 400, 'invalid_request', () => ({ email: 'a@b@example.com', role: 'member' })],
    ['an email with a newline', 400, 'invalid_request', () => ({ email: 'a@example.com\nBcc: victim@example.com', role: 'member' })],
    ['an email of 300 characters', 400, 'invalid_request', () => ({ email: long, role: 'member' })],
    ['an email of 255 characters', 400, 'invalid_request', () => ({ email: `${'a'.repeat(243)}@example.com`, role: 'member' })],
    ['an email with a NUL', 400, 'invalid_request', () => ({ email: `a\u0000${address('nul')}`, role: 'member' })],
    ['an email with a lone surrogate', 400, 'invalid_request', () => ({ email: `\ud800${address('surrogate')}`, role: 'member' })],
    ['an email that is a number', 400, 'invalid_request', () => ({ email: 42, role: 'member' })],
    ['an email that is an array', 400, 'invalid_request', () => ({ email: [address('api')], role: 'member' })],
    ['role superuser', 400, 'invalid_request', () => ({ email: address('api'), role: 'superuser' })],
    ['role in upper case', 400, 'invalid_request', () => ({ email: address('api'), role: 'ADMIN' })],
    ['role null', 400, 'invalid_request', () => ({ email: address('api'), role: null })],
    ['role owner (an application cannot invite an owner)', 403, 'forbidden', () => ({ email: address('api'), role: 'owner' })],
    ['a duplicated role key, the last one owner', 403, 'forbidden', () => `{"email":"${address('api')}","role":"member","role":"owner"}`],
    ['an extra field', 400, 'invalid_request', () => ({ email: address('api'), role: 'member', organization_id: orgB.organizationId })],
    ['an extra expires_at', 400, 'invalid_request', () => ({ email: address('api'), role: 'member', expires_at: '2099-01-01T00:00:00Z' })],
    ['__proto__ in the body', 400, 'invalid_request', () => `{"email":"${address('api')}","role":"member","__proto__":{"role":"owner"}}`],
    ['a JSON array', 400, 'invalid_request', () => '[{"email":"a@example.com","role":"member"}]'],
    ['malformed JSON', 400, 'invalid_request', () => '{"email":'],
    ['a form body', 415, 'unsupported_media_type', () => form({ email: address('api'), role: 'member' }), { 'content-type': 'application/x-www-form-urlencoded' }],
    ['a 70 kB body', 413, 'request_too_large', () => ({ email: address('api'), role: 'member', pad: 'x'.repeat(70_000) })],
  ];

  it.each(ROWS)('%s → %i %s, nothing invited or sent', async (_name, status, error, body, headers) => {
    const before = await snapshot();
    const res = await api('POST', orgA, bearerA, '/invitations', body(), headers);
    expect(res.statusCode, res.body.slice(0, 300)).toBe(status);
    expect(res.json().error).toBe(error);
    expect(res.json().error_description).toEqual(expect.any(String));
    expect(res.body).not.toMatch(/\bat \S+ \(|node_modules|\.ts:\d+/);
    await expectUnchanged(before);
  });

  it('a token without members.write: 403 insufficient_scope, nothing invited', async () => {
    const before = await snapshot();
    const res = await api('POST', orgA, readOnlyA, '/invitations', { email: address('api'), role: 'member' });
    expect(res.statusCode).toBe(403);
    expect(res.json().error).toBe('insufficient_scope');
    await expectUnchanged(before);
  });

  it("an address that already belongs to a member (in any letter case): 409, nothing invited", async () => {
    const before = await snapshot();
    const res = await api('POST', orgA, bearerA, '/invitations', { email: ` ${ownerA.email.toUpperCase()} `, role: 'member' });
    expect(res.statusCode, res.body).toBe(409);
    expect(res.json().error).toBe('conflict');
    await expectUnchanged(before);
  });

  it('an email of exactly 254 characters is accepted', async () => {
    const email = `${'a'.repeat(242)}@example.com`;
    expect(email.length).toBe(254);
    const res = await api('POST', orgA, bearerA, '/invitations', { email, role: 'member' });
    expect(res.statusCode, res.body).toBe(201);
    expect(res.json().email).toBe(email);
  });
});

// ---------------------------------------------------------------------------------------------
// The dashboard's invitation and account forms

describe(`the dashboard's invitation form with bad input on ${BACKEND}`, () => {
  let owner: Browser;
  let member: Browser;
  beforeAll(async () => {
    owner = await signedIn(ownerA, OWNER_PASSWORD);
    await owner.post('/dashboard/organization', { csrf_token: await owner.csrf('/dashboard'), organization_id: String(orgA.organizationId) });
    const plain = await newUser('plain-member');
    await addMember(db(), { organizationId: orgA.organizationId, userId: plain.id, role: 'member' });
    member = await signedIn(plain);
    await member.post('/dashboard/organization', { csrf_token: await member.csrf('/dashboard'), organization_id: String(orgA.organizationId) });
  });

  it('without a CSRF token, or with another session\'s: 403, nothing invited', async () => {
    const other = await (await signedIn(ownerB, OWNER_PASSWORD)).csrf('/dashboard');
    const before = await snapshot();
    expectCsrfRefused(await owner.post('/dashboard/invitations', { email: address('dash'), role: 'member' }));
    expectCsrfRefused(await owner.post('/dashboard/invitations', { email: address('dash'), role: 'member', csrf_token: other }));
    expectCsrfRefused(await browser().post('/dashboard/invitations', { email: address('dash'), role: 'member', csrf_token: other }));
    await expectUnchanged(before);
  });

  it('a member (not an owner or admin): 403, nothing invited', async () => {
    const before = await snapshot();
    expectErrorPage(await member.post('/dashboard/invitations', { csrf_token: await member.csrf('/dashboard'), email: address('dash'), role: 'member' }), 403);
    await expectUnchanged(before);
  });

  it.each([
    ['an email of 300 characters', { email: `${'a'.repeat(288)}@example.com`, role: 'member' }, 'Enter a valid email address.'],
    ['an email that is not an address', { email: 'nobody', role: 'member' }, 'Enter a valid email address.'],
    ['no role', { email: 'x@example.com' }, 'Choose a role.'],
    ['role superuser', { email: 'x@example.com', role: 'superuser' }, 'Choose a role.'],
  ])('%s: 400, the members page again with the error, nothing invited', async (_name, fields, error) => {
    const csrf_token = await owner.csrf('/dashboard');
    const before = await snapshot();
    const res = await owner.post('/dashboard/invitations', { csrf_token, ...fields });
    expect(res.statusCode).toBe(400);
    expectPageSecurityHeaders(res);
    expectNoLeak(res);
    expect(res.body).toContain(error);
    await expectUnchanged(before);
  });

  it('repeated fields, a JSON body without the CSRF token: 400 or 403, nothing invited', async () => {
    const csrf_token = await owner.csrf('/dashboard');
    const before = await snapshot();
    expectFormRefused(await owner.post('/dashboard/invitations', { csrf_token, email: [address('a'), address('b')], role: 'member' }));
    expectFormRefused(await owner.post('/dashboard/invitations', { csrf_token, email: address('a'), role: ['member', 'owner'] }));
    expectCsrfRefused(await postRaw(owner, '/dashboard/invitations', 'application/json', JSON.stringify({ email: address('a'), role: 'member' })));
    await expectUnchanged(before);
  });
});

describe(`the account page's email forms with bad input on ${BACKEND}`, () => {
  it('a new address of 300 characters, not an address, repeated, or taken; a 2000-character current password; no CSRF token: refused, no link sent', async () => {
    const user = await newUser('account-email');
    const other = await newUser('account-taken');
    const b = await signedIn(user);
    const csrf_token = await b.csrf('/dashboard/account');
    const before = await snapshot();
    const refusals: [Record<string, string | string[]>, number, string?][] = [
      [{ csrf_token, email: `${'a'.repeat(288)}@example.com`, current_password: PASSWORD }, 400, 'Enter a valid email address.'],
      [{ csrf_token, email: 'nobody', current_password: PASSWORD }, 400, 'Enter a valid email address.'],
      [{ csrf_token, email: user.email, current_password: PASSWORD }, 400, 'That is already your email address.'],
      [{ csrf_token, email: address('new'), current_password: 'p'.repeat(2000) }, 400, 'The current password is not correct.'],
      [{ csrf_token, email: address('new'), current_password: 'wrong-password-0' }, 400, 'The current password is not correct.'],
      [{ csrf_token, email: other.email.toUpperCase(), current_password: PASSWORD }, 409, 'Another account uses this email address.'],
      [{ csrf_token, email: [address('a'), address('b')], current_password: PASSWORD }, 400],
      [{ email: address('new'), current_password: PASSWORD }, 403, CSRF_FAILED],
    ];
    for (const [fields, status, text] of refusals) {
      const res = await b.post('/dashboard/account/email', fields);
      expectErrorPageOrForm(res, status);
      if (text !== undefined) expect(res.body).toContain(text);
    }
    await expectUnchanged(before);
  });

  it('asking for a new link without a CSRF token: 403; for a confirmed address: 409; no link sent', async () => {
    const user = await newUser('account-resend');
    const b = await signedIn(user);
    const csrf_token = await b.csrf('/dashboard/account');
    const before = await snapshot();
    expectCsrfRefused(await b.post('/dashboard/account/email/verify', {}));
    expectCsrfRefused(await b.post('/dashboard/account/email/verify', { csrf_token: await preCsrf(browser()) }));
    const res = await b.post('/dashboard/account/email/verify', { csrf_token });
    expectErrorPageOrForm(res, 409);
    expect(res.body).toContain('Your email address is already confirmed.');
    await expectUnchanged(before);
  });
});

/** A page (the form again, or the error page) of `status`, with the page headers and nothing leaked. */
function expectErrorPageOrForm(res: LightMyRequestResponse, status: number): void {
  expect(res.statusCode, res.body.slice(0, 300)).toBe(status);
  expect(res.headers['content-type']).toMatch(/^text\/html/);
  expectPageSecurityHeaders(res);
  expectNoLeak(res);
}
