/**
 * The bad-input battery for two-step sign-in (issue 24), on both databases (TEST_DATABASE_URL or
 * PGlite), with codes computed by otplib: (1) the second step's code, (2) the pending sign-in
 * cookie, (3) enrolment and changes on the Account page, (4) an organization's requirement (API,
 * dashboard, CLI), (5) acr_values. Every row asserts the exact status and that nothing moved that
 * should not: no session, no factor confirmed or used, and the rows of second_step_failures (a
 * code checked and refused counts toward the lock; a request refused before its CSRF token is
 * checked, or unreadable, does not).
 */
import { randomBytes } from 'node:crypto';
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { generate } from 'otplib';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { addMember, createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { runCommandLine } from '../../src/cli/index.js';
import { SECOND_STEP_MAX_FAILURES } from '../../src/accounts/second-factors.js';
import { ACR_TWO_FACTORS } from '../../src/oauth/helpers/acr.js';
import { type ApplicationWithSecret, createApplication } from '../../src/oauth/models/applications.js';
import { basic, form } from '../helpers/oauth.js';
import { createRelyingParty, oidcPerson, type OidcWorld, type Person, RP_REDIRECT, startOidcWorld } from '../helpers/oidc-world.js';
import { Browser } from './browser.js';

const PASSWORD = 'two-step-bad-input-1';
const STEP = '/login/second-step';
const FORM = { 'content-type': 'application/x-www-form-urlencoded' };

let world: OidcWorld;
let app: FastifyInstance;
let rp: ApplicationWithSecret;

beforeAll(async () => {
  world = await startOidcWorld();
  app = world.app;
  rp = await createRelyingParty(world, []);
}, 60_000);

afterAll(async () => {
  await world?.close();
});

// ---- Helpers: people, codes, counts ----

const db = () => world.t.handle.db;
const location = (res: LightMyRequestResponse) => String(res.headers.location);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const person = () => oidcPerson(world, PASSWORD);
const secretIn = (html: string) => /data-totp-secret>([^<]+)</.exec(html)?.[1];
const recoveryCodesIn = (html: string) => [...html.matchAll(/<li><code>([0-9a-z]{4}-[0-9a-z]{4}-[0-9a-z]{4})<\/code><\/li>/g)].map((m) => m[1]!);
/** Whether a response starts a session (a Set-Cookie of orgauth_session with a value). */
const startsSession = (res: LightMyRequestResponse) => (res.cookies as { name: string; value: string }[]).some((c) => c.name === 'orgauth_session' && c.value !== '');

/** The code for the step `offsetSteps` from now. */
const codeAt = (secret: string, offsetSteps = 0) => generate({ secret, epoch: Math.floor(Date.now() / 1000) + offsetSteps * 30 });
/** Waits out the last 3 s of a 30 s step, so a code computed now means the same step when checked. */
async function clearOfStepBoundary() {
  const into = (Date.now() / 1000) % 30;
  if (into > 27) await sleep((30 - into) * 1000 + 250);
}
/** A 6-digit code no step within ±2 of now has. */
async function wrongCode(secret: string): Promise<string> {
  const near = await Promise.all([-2, -1, 0, 1, 2].map((o) => codeAt(secret, o)));
  return ['000000', '111111', '222222', '333333', '444444', '555555'].find((c) => !near.includes(c))!;
}
const arabicIndic = (digits: string) => digits.replace(/[0-9]/g, (d) => String.fromCharCode(0x0660 + Number(d)));
const fullwidth = (digits: string) => digits.replace(/[0-9]/g, (d) => String.fromCharCode(0xff10 + Number(d)));

const count = async (table: 'sessions' | 'second_step_failures' | 'pending_sign_ins' | 'totp_factors' | 'recovery_codes', userId: number) =>
  Number((await db().selectFrom(table).select((e) => e.fn.countAll<string>().as('n')).where('user_id', '=', userId).executeTakeFirstOrThrow()).n);
const unusedCodes = async (userId: number) => (await db().selectFrom('recovery_codes').select('id').where('user_id', '=', userId).where('used_at', 'is', null).execute()).length;
const totpOf = (userId: number) => db().selectFrom('totp_factors').select(['confirmed_at', 'last_step']).where('user_id', '=', userId).executeTakeFirst();
const codeHashes = async (userId: number) => (await db().selectFrom('recovery_codes').select('code_hash').where('user_id', '=', userId).execute()).map((r) => r.code_hash).sort();
/** What a refused request must not move: the user's sessions, pending sign-ins, counted failures, factor step, unused recovery codes. */
const stateOf = async (userId: number) => ({
  sessions: await count('sessions', userId),
  pending: await count('pending_sign_ins', userId),
  failures: await count('second_step_failures', userId),
  lastStep: (await totpOf(userId))?.last_step ?? null,
  unusedCodes: await unusedCodes(userId),
});
const clearFailures = async (userId: number) => {
  await db().deleteFrom('second_step_failures').where('user_id', '=', userId).execute();
  await db().updateTable('users').set({ second_step_locked_until: null }).where('id', '=', userId).execute();
};
/** Moves the session's sign-in 11 minutes back: changes then need the password again. */
const sessionAgedOut = (userId: number) => db().updateTable('sessions').set({ created_at: new Date(Date.now() - 11 * 60_000) }).where('user_id', '=', userId).execute();

async function signIn(p: Person) {
  expect((await p.browser.login(p.email, PASSWORD)).statusCode).toBe(303);
}
async function signOut(p: Person) {
  await p.browser.post('/logout', { csrf_token: await p.browser.csrf('/dashboard/account') });
  expect(p.browser.cookies.has('orgauth_session')).toBe(false);
}

/** Adds an authenticator app from the signed-in session; the code used, the secret and the recovery codes. */
async function enrol(p: Person): Promise<{ secret: string; enrolCode: string; recoveryCodes: string[] }> {
  const csrf = await p.browser.csrf('/dashboard/account');
  const started = await p.browser.post('/dashboard/account/totp', { csrf_token: csrf });
  expect(started.statusCode, started.body).toBe(200);
  const secret = secretIn(started.body)!;
  await clearOfStepBoundary();
  const enrolCode = await codeAt(secret);
  const confirmed = await p.browser.post('/dashboard/account/totp/confirm', { csrf_token: csrf, code: enrolCode });
  expect(confirmed.statusCode, confirmed.body).toBe(200);
  const recoveryCodes = recoveryCodesIn(confirmed.body);
  expect(recoveryCodes).toHaveLength(10);
  return { secret, enrolCode, recoveryCodes };
}

type Enrolled = Person & Awaited<ReturnType<typeof enrol>>;
/** A member with an authenticator app, signed out again. */
async function enrolled(): Promise<Enrolled> {
  const p = await person();
  await signIn(p);
  const factor = await enrol(p);
  await signOut(p);
  return { ...p, ...factor };
}

/** The password step in `b` (to the second step, no session); the second-step page's CSRF token. */
async function pastPassword(email: string, b: Browser): Promise<string> {
  const res = await b.login(email, PASSWORD);
  expect(location(res)).toBe(STEP);
  expect(b.cookies.has('orgauth_session')).toBe(false);
  return b.csrf(STEP);
}

/** An authorization request of the relying party, as a path; `extra` adds parameters (an array repeats one). */
const authorizePath = (extra: Record<string, string | string[]> = {}) =>
  `/oauth/authorize?${form({ client_id: rp.client_id, redirect_uri: RP_REDIRECT, response_type: 'code', scope: 'openid', state: randomBytes(16).toString('base64url'), code_challenge: randomBytes(32).toString('base64url'), code_challenge_method: 'S256', ...extra })}`;

// ---- 1. The second step's code ----

/** The user past the password and their page's token; another user's recovery codes; the tokens of another browser's second-step page and of another user's session. */
interface StepCtx { u: Enrolled; csrf: string; others: string[]; otherBrowserCsrf: string; otherSessionCsrf: string }
/** A request, the status it must get, and whether it counts toward the lock. */
type Row = [name: string, status: number, counted: boolean, send: (c: StepCtx) => Promise<LightMyRequestResponse>];

const post = (c: StepCtx, code: string) => c.u.browser.post(STEP, { csrf_token: c.csrf, code });
const right = (c: StepCtx) => codeAt(c.u.secret, 1);
const json = (c: StepCtx, body: unknown, raw = false) => c.u.browser.postJson(STEP, body, {}, raw);
/** A recovery code of the user's with its first letter or digit replaced by `ch`. */
const misspelled = (c: StepCtx, ch: string) => c.u.recoveryCodes[0]!.replace(/^./, ch);

const CODE_ROWS: Row[] = [
  ['a wrong code', 400, true, async (c) => post(c, await wrongCode(c.u.secret))],
  ['a code two steps old', 400, true, async (c) => post(c, await codeAt(c.u.secret, -2))],
  ['a code two steps ahead', 400, true, async (c) => post(c, await codeAt(c.u.secret, 2))],
  ['5 digits of the right code', 400, true, async (c) => post(c, (await right(c)).slice(0, 5))],
  ['the right code and a 7th digit', 400, true, async (c) => post(c, `${await right(c)}0`)],
  ['the right code in Arabic-Indic digits', 400, true, async (c) => post(c, arabicIndic(await right(c)))],
  ['the right code in fullwidth digits', 400, true, async (c) => post(c, fullwidth(await right(c)))],
  ['٠١٢٣٤٥', 400, true, (c) => post(c, '٠١٢٣٤٥')],
  ['１２３４５６', 400, true, (c) => post(c, '１２３４５６')],
  ['the right code after a NUL (refused unread)', 400, false, async (c) => post(c, `\u0000${await right(c)}`)],
  ['the right code before a NUL (refused unread)', 400, false, async (c) => post(c, `${await right(c)}\u0000`)],
  ['the right code after a zero-width space', 400, true, async (c) => post(c, `\u200b${await right(c)}`)],
  ['the right code before a zero-width space', 400, true, async (c) => post(c, `${await right(c)}\u200b`)],
  ['65 characters', 400, true, (c) => post(c, '1'.repeat(65))],
  ['10,000 characters', 400, true, (c) => post(c, '1'.repeat(10_000))],
  ['an empty code', 400, true, (c) => post(c, '')],
  ['no code field', 400, true, (c) => c.u.browser.post(STEP, { csrf_token: c.csrf })],
  ['the code field twice (code=1&code=2)', 400, false, (c) => c.u.browser.post(STEP, { csrf_token: c.csrf, code: ['1', '2'] })],
  ['the right code twice', 400, false, async (c) => c.u.browser.post(STEP, { csrf_token: c.csrf, code: [await right(c), await right(c)] })],
  ['an array-shaped form field (code[]=)', 400, true, async (c) => c.u.browser.post(STEP, { csrf_token: c.csrf, 'code[]': await right(c) })],
  ['a JSON body with a wrong code', 400, true, async (c) => json(c, { csrf_token: c.csrf, code: await wrongCode(c.u.secret) })],
  ['a JSON array body (no csrf_token field)', 403, false, async (c) => json(c, [c.csrf, await right(c)])],
  ['a JSON array of the form', 400, false, async (c) => json(c, [{ csrf_token: c.csrf, code: await right(c) }])],
  ['a JSON code that is an array', 400, false, async (c) => json(c, { csrf_token: c.csrf, code: [await right(c)] })],
  ['a JSON code that is an object', 400, false, (c) => json(c, { csrf_token: c.csrf, code: { $ne: null } })],
  ['a JSON code that is a number', 400, false, async (c) => json(c, { csrf_token: c.csrf, code: Number(await right(c)) })],
  ['a JSON body that does not parse', 400, false, (c) => json(c, `{"csrf_token":"${c.csrf}","code":`, true)],
  ['the right code without a CSRF token', 403, false, async (c) => c.u.browser.post(STEP, { code: await right(c) })],
  ['the right code with another session’s CSRF token', 403, false, async (c) => c.u.browser.post(STEP, { csrf_token: c.otherSessionCsrf, code: await right(c) })],
  ['the right code with another browser’s pre-session token', 403, false, async (c) => c.u.browser.post(STEP, { csrf_token: c.otherBrowserCsrf, code: await right(c) })],
  ['a recovery code of another user', 400, true, (c) => post(c, c.others[0]!)],
  ...['i', 'l', 'o', 'u'].map((ch): Row => [`a recovery code with “${ch}” (outside its alphabet)`, 400, true, (c) => post(c, misspelled(c, ch))]),
];

describe('the second step’s code (POST /login/second-step after the password)', () => {
  const c = {} as StepCtx;
  let before: Awaited<ReturnType<typeof stateOf>>;

  beforeAll(async () => {
    c.u = await enrolled();
    const v = await enrolled();
    c.others = v.recoveryCodes;
    c.otherBrowserCsrf = await pastPassword(v.email, v.browser);
    const w = await person();
    await signIn(w);
    c.otherSessionCsrf = await w.browser.csrf('/dashboard/account');
    c.csrf = await pastPassword(c.u.email, c.u.browser);
  }, 60_000);

  beforeEach(async () => {
    await clearFailures(c.u.id);
    // A row that wrongly signed in must not take the rows after it down: past the password again, in a new browser.
    if (!c.u.browser.cookies.has('orgauth_signin')) {
      await db().deleteFrom('sessions').where('user_id', '=', c.u.id).execute();
      c.u = { ...c.u, browser: new Browser(app, '10.77.0.99') };
      c.csrf = await pastPassword(c.u.email, c.u.browser);
    }
    await clearOfStepBoundary();
    before = await stateOf(c.u.id);
  });

  it.each(CODE_ROWS)('%s: %i, nothing taken', async (_name, status, counted, send) => {
    const res = await send(c);
    expect(res.statusCode, res.body.slice(0, 300)).toBe(status);
    expect(startsSession(res)).toBe(false);
    expect(await stateOf(c.u.id)).toEqual({ ...before, failures: counted ? 1 : 0 });
  });

  it('while the step is locked, an over-long code is 429 like any other', async () => {
    await db().updateTable('users').set({ second_step_locked_until: new Date(Date.now() + 60_000) }).where('id', '=', c.u.id).execute();
    for (const code of ['000000', '1'.repeat(65)]) expect((await post(c, code)).statusCode, `${code.length} characters`).toBe(429);
  });

  it('after all of them the pending sign-in still takes the right code, once', async () => {
    const done = await post(c, await right(c));
    expect(done.statusCode, done.body).toBe(303);
    expect(await stateOf(c.u.id)).toMatchObject({ sessions: 1, pending: 0, unusedCodes: 10 });
  });

  it('the code that confirmed the enrolment signs in once (the app still shows it), then is a replay', async () => {
    const u = await enrolled();
    const csrf = await pastPassword(u.email, u.browser);
    const first = await u.browser.post(STEP, { csrf_token: csrf, code: u.enrolCode });
    // Within its 30 seconds (or the next step's, with drift) the enrolment's code is the first sign-in's.
    expect(first.statusCode, first.body).toBe(303);
    await signOut(u);
    const again = await u.browser.post(STEP, { csrf_token: await pastPassword(u.email, u.browser), code: u.enrolCode });
    expect(again.statusCode).toBe(400);
    expect(startsSession(again)).toBe(false);
  });

  it('a recovery code used once is refused the second time, and counts', async () => {
    const u = await enrolled();
    await pastPassword(u.email, u.browser);
    expect((await u.browser.post(STEP, { csrf_token: await u.browser.csrf(STEP), code: u.recoveryCodes[3]! })).statusCode).toBe(303);
    await signOut(u);
    const csrf = await pastPassword(u.email, u.browser);
    const again = await u.browser.post(STEP, { csrf_token: csrf, code: u.recoveryCodes[3]! });
    expect(again.statusCode).toBe(400);
    expect(startsSession(again)).toBe(false);
    expect(await stateOf(u.id)).toMatchObject({ sessions: 0, pending: 1, failures: 1, unusedCodes: 9 });
  });

  it(`30 concurrent wrong codes: ${SECOND_STEP_MAX_FAILURES - 1} refused (400), then locked (429)`, async () => {
    const u = await enrolled();
    const csrf = await pastPassword(u.email, u.browser);
    const wrong = await wrongCode(u.secret);
    const statuses = (await Promise.all(Array.from({ length: 30 }, () => u.browser.post(STEP, { csrf_token: csrf, code: wrong })))).map((r) => r.statusCode);
    // A 400 is a code checked and refused without locking: the 10th failure locks (429), the rest find it locked.
    expect(statuses.filter((s) => s === 400)).toHaveLength(SECOND_STEP_MAX_FAILURES - 1);
    expect(statuses.filter((s) => s !== 400 && s !== 429)).toEqual([]);
    expect(await db().selectFrom('account_events').select('id').where('user_id', '=', u.id).where('action', '=', 'second_factor.locked').execute()).toHaveLength(1);
  }, 60_000);

  it.each([
    ['recovery code', (u: Enrolled) => u.recoveryCodes[0]!, 9],
    ['valid authenticator code', (u: Enrolled) => codeAt(u.secret, 1), 10],
  ] as const)('20 concurrent posts of one %s from 20 browsers: exactly one signs in', async (kind, codeOf, unusedAfter) => {
    const u = await enrolled();
    const racers: [Browser, string][] = [];
    for (let i = 1; i <= 20; i++) {
      const b = new Browser(app, `10.77.${kind.length}.${i}`);
      racers.push([b, await pastPassword(u.email, b)]);
    }
    await clearOfStepBoundary();
    const code = await codeOf(u);
    const results = await Promise.all(racers.map(([b, csrf]) => b.post(STEP, { csrf_token: csrf, code })));
    const statuses = results.map((r) => r.statusCode);
    // The 19 losers present a used code, which counts: the 10th failure locks the step, so later losers get 429.
    expect(statuses.filter((s) => s === 303)).toHaveLength(1);
    expect(statuses.filter((s) => s !== 303 && s !== 400 && s !== 429)).toEqual([]);
    expect(results.filter(startsSession)).toHaveLength(1);
    expect(await stateOf(u.id)).toMatchObject({ sessions: 1, pending: 19, unusedCodes: unusedAfter });
  }, 60_000);
});

// ---- 2. The pending sign-in cookie ----

describe('the pending sign-in cookie', () => {
  let u: Enrolled;
  let lastStep: number | null;

  beforeAll(async () => {
    u = await enrolled();
    lastStep = (await totpOf(u.id))?.last_step ?? null;
  }, 60_000);
  beforeEach(async () => {
    await clearFailures(u.id);
    await db().deleteFrom('pending_sign_ins').where('user_id', '=', u.id).execute();
    await clearOfStepBoundary();
  });

  /** Nothing signed in, nothing counted, the factor's step not taken. */
  async function expectNothingTaken(res: LightMyRequestResponse) {
    expect(startsSession(res)).toBe(false);
    expect(await stateOf(u.id)).toMatchObject({ sessions: 0, failures: 0, lastStep, unusedCodes: 10 });
  }

  const forged: [string, (real: string, storedHash: string) => string][] = [
    ['a random value of the right shape', () => randomBytes(32).toString('base64url')],
    ['the real value with a character changed', (real) => `${real.slice(0, -1)}${real.endsWith('A') ? 'B' : 'A'}`],
    ['the real value and one more character', (real) => `${real}A`],
    ['the stored hash of the real value', (_real, storedHash) => storedHash],
  ];
  it.each(forged)('forged (%s): the page and the post send to /login', async (_name, forge) => {
    await pastPassword(u.email, u.browser);
    const real = u.browser.cookies.get('orgauth_signin')!;
    const hash = (await db().selectFrom('pending_sign_ins').select('id_hash').where('user_id', '=', u.id).executeTakeFirstOrThrow()).id_hash;
    const b = new Browser(app, '10.78.0.1');
    const csrf = await b.csrf('/login');
    b.cookies.set('orgauth_signin', forge(real, hash));
    const page = await b.get(STEP);
    expect([page.statusCode, location(page)]).toEqual([303, '/login']);
    const res = await b.post(STEP, { csrf_token: csrf, code: await codeAt(u.secret, 1) });
    expect([res.statusCode, location(res)]).toEqual([303, '/login']);
    await expectNothingTaken(res);
    expect(await count('pending_sign_ins', u.id)).toBe(1);
  });

  it('expired (expires_at in the past): the right code sends to /login', async () => {
    const csrf = await pastPassword(u.email, u.browser);
    await db().updateTable('pending_sign_ins').set({ expires_at: new Date(Date.now() - 1000) }).where('user_id', '=', u.id).execute();
    expect(location(await u.browser.get(STEP))).toBe('/login');
    const res = await u.browser.post(STEP, { csrf_token: csrf, code: await codeAt(u.secret, 1) });
    expect([res.statusCode, location(res)]).toEqual([303, '/login']);
    await expectNothingTaken(res);
  });

  it('one user’s pending cookie with another user’s CSRF token: 403, neither counts', async () => {
    await pastPassword(u.email, u.browser);
    const v = await enrolled();
    const vCsrf = await pastPassword(v.email, v.browser);
    const res = await u.browser.post(STEP, { csrf_token: vCsrf, code: await codeAt(u.secret, 1) });
    expect(res.statusCode).toBe(403);
    await expectNothingTaken(res);
    expect(await count('second_step_failures', v.id)).toBe(0);
    expect(await count('pending_sign_ins', u.id)).toBe(1);
  });

  it('sent as the session cookie it is no session: /dashboard and /oauth/authorize send to /login, the consent POST is 403', async () => {
    const csrf = await pastPassword(u.email, u.browser);
    const cookie = `orgauth_session=${u.browser.cookies.get('orgauth_signin')!}`;
    const get = (url: string) => app.inject({ method: 'GET', url, headers: { cookie } });
    for (const url of ['/dashboard', '/dashboard/account']) expect(location(await get(url))).toMatch(/^\/login/);
    const authorize = await get(authorizePath());
    expect([authorize.statusCode, location(authorize)]).toEqual([303, expect.stringMatching(/^\/login\?/)]);
    const approval = form({ client_id: rp.client_id, redirect_uri: RP_REDIRECT, csrf_token: csrf, organization_id: String(world.org.organizationId), decision: 'approve' });
    const consent = await app.inject({ method: 'POST', url: '/oauth/authorize', headers: { ...FORM, cookie }, payload: approval });
    expect(consent.statusCode).toBe(403);
    await expectNothingTaken(consent);
    expect(await db().selectFrom('authorization_codes').select('id').where('user_id', '=', u.id).execute()).toEqual([]);
  });

  it('cancelled (POST /login/second-step/cancel), its right code then sends to /login', async () => {
    const csrf = await pastPassword(u.email, u.browser);
    const pending = u.browser.cookies.get('orgauth_signin')!;
    // Without the CSRF token, cancelling is refused and the sign-in stays.
    expect((await u.browser.post(`${STEP}/cancel`, {})).statusCode).toBe(403);
    expect(await count('pending_sign_ins', u.id)).toBe(1);
    const cancelled = await u.browser.post(`${STEP}/cancel`, { csrf_token: csrf });
    expect([cancelled.statusCode, location(cancelled)]).toEqual([303, '/login']);
    expect(u.browser.cookies.has('orgauth_signin')).toBe(false);
    expect(await count('pending_sign_ins', u.id)).toBe(0);
    // The old cookie, kept by whoever copied it, is nothing now.
    u.browser.cookies.set('orgauth_signin', pending);
    const res = await u.browser.post(STEP, { csrf_token: csrf, code: await codeAt(u.secret, 1) });
    expect([res.statusCode, location(res)]).toEqual([303, '/login']);
    await expectNothingTaken(res);
  });
});

// ---- 3. Enrolment and changes on the Account page ----

describe('enrolment and changes on the Account page', () => {
  const TOTP = '/dashboard/account/totp';

  it('confirming without starting: 409, nothing made', async () => {
    const p = await person();
    await signIn(p);
    const res = await p.browser.post(`${TOTP}/confirm`, { csrf_token: await p.browser.csrf('/dashboard/account'), code: '123456' });
    expect(res.statusCode).toBe(409);
    expect(await count('totp_factors', p.id)).toBe(0);
    expect(await count('recovery_codes', p.id)).toBe(0);
  });

  describe('confirming a started enrolment with a bad code: 400, not confirmed', () => {
    let p: Person;
    let csrf: string;
    let secret: string;
    beforeAll(async () => {
      p = await person();
      await signIn(p);
      csrf = await p.browser.csrf('/dashboard/account');
      const first = await p.browser.post(TOTP, { csrf_token: csrf });
      const second = await p.browser.post(TOTP, { csrf_token: csrf });
      expect([first.statusCode, second.statusCode]).toEqual([200, 200]);
      secret = secretIn(first.body)!;
      // Started twice while pending: the same secret, one row.
      expect(secretIn(second.body)).toBe(secret);
      expect(await count('totp_factors', p.id)).toBe(1);
    }, 60_000);
    beforeEach(clearOfStepBoundary);

    const rows: [string, () => Promise<Record<string, string | string[]>>][] = [
      ['65 digits', async () => ({ code: '1'.repeat(65) })],
      ['letters', async () => ({ code: 'abcdef' })],
      ['the right code in Arabic-Indic digits', async () => ({ code: arabicIndic(await codeAt(secret)) })],
      ['5 digits of the right code', async () => ({ code: (await codeAt(secret)).slice(0, 5) })],
      ['an empty code', async () => ({ code: '' })],
      ['the right code twice', async () => ({ code: [await codeAt(secret), await codeAt(secret)] })],
    ];
    it.each(rows)('%s', async (_name, fields) => {
      const res = await p.browser.post(`${TOTP}/confirm`, { csrf_token: csrf, ...(await fields()) });
      expect(res.statusCode).toBe(400);
      expect((await totpOf(p.id))?.confirmed_at).toBeNull();
      expect(await count('recovery_codes', p.id)).toBe(0);
    });

    it('then the right code confirms, and starting again is 409 with nothing changed', async () => {
      expect((await p.browser.post(`${TOTP}/confirm`, { csrf_token: csrf, code: await codeAt(secret) })).statusCode).toBe(200);
      const hashes = await codeHashes(p.id);
      // Confirming raised the session to two factors under a new id: the page's token is the new session's.
      const again = await p.browser.post(TOTP, { csrf_token: await p.browser.csrf('/dashboard/account') });
      expect(again.statusCode).toBe(409);
      expect(secretIn(again.body)).toBeUndefined();
      expect((await totpOf(p.id))?.confirmed_at).not.toBeNull();
      expect(await codeHashes(p.id)).toEqual(hashes);
    });
  });

  describe('from a session signed in more than 10 minutes ago', () => {
    let fresh: Person;
    let u: Enrolled;
    beforeAll(async () => {
      fresh = await person();
      await signIn(fresh);
      await sessionAgedOut(fresh.id);
      u = await enrolled();
      await signIn(u);
      // The password step led to the second step; take it, then age the session.
      expect((await u.browser.post(STEP, { csrf_token: await u.browser.csrf(STEP), code: u.recoveryCodes[9]! })).statusCode).toBe(303);
      await sessionAgedOut(u.id);
    }, 60_000);

    const passwords: [string, Record<string, string>][] = [
      ['no current_password', {}],
      ['a wrong current_password', { current_password: 'not-the-password-1' }],
      ['an over-long current_password', { current_password: 'x'.repeat(5000) }],
    ];
    describe.each(passwords)('with %s: 400, nothing changed', (_name, password) => {
      it('starting an authenticator app creates no row', async () => {
        const res = await fresh.browser.post(TOTP, { csrf_token: await fresh.browser.csrf('/dashboard/account'), ...password });
        expect(res.statusCode).toBe(400);
        expect(await count('totp_factors', fresh.id)).toBe(0);
      });
      it.each(['/dashboard/account/totp/remove', '/dashboard/account/recovery-codes'])('POST %s', async (url) => {
        const hashes = await codeHashes(u.id);
        const res = await u.browser.post(url, { csrf_token: await u.browser.csrf('/dashboard/account'), ...password });
        expect(res.statusCode).toBe(400);
        expect(recoveryCodesIn(res.body)).toEqual([]);
        expect((await totpOf(u.id))?.confirmed_at).not.toBeNull();
        expect(await codeHashes(u.id)).toEqual(hashes);
      });
    });

    it('with the password, new recovery codes: exactly 10, the old ones stop working', async () => {
      const before = await codeHashes(u.id);
      const res = await u.browser.post('/dashboard/account/recovery-codes', { csrf_token: await u.browser.csrf('/dashboard/account'), current_password: PASSWORD });
      expect(res.statusCode, res.body).toBe(200);
      const fresh = recoveryCodesIn(res.body);
      expect(new Set(fresh).size).toBe(10);
      const after = await codeHashes(u.id);
      expect(after).toHaveLength(10);
      expect(after.filter((h) => before.includes(h))).toEqual([]);
      const b = new Browser(app, '10.78.1.1');
      const csrf = await pastPassword(u.email, b);
      expect((await b.post(STEP, { csrf_token: csrf, code: u.recoveryCodes[0]! })).statusCode).toBe(400);
      expect((await b.post(STEP, { csrf_token: csrf, code: fresh[0]! })).statusCode).toBe(303);
    });

    it('with the password, removing the last factor removes the recovery codes too; then new codes are 409', async () => {
      const csrf = await u.browser.csrf('/dashboard/account');
      const res = await u.browser.post('/dashboard/account/totp/remove', { csrf_token: csrf, current_password: PASSWORD });
      expect(res.statusCode, res.body).toBe(200);
      expect(await count('totp_factors', u.id)).toBe(0);
      expect(await count('recovery_codes', u.id)).toBe(0);
      expect((await u.browser.post('/dashboard/account/recovery-codes', { csrf_token: csrf, current_password: PASSWORD })).statusCode).toBe(409);
      expect(await count('recovery_codes', u.id)).toBe(0);
    });
  });

  it.each([TOTP, `${TOTP}/confirm`, `${TOTP}/remove`, '/dashboard/account/recovery-codes'])('POST %s without the CSRF token: 403, nothing changed', async (url) => {
    const u = await enrolled();
    await signIn(u);
    await u.browser.post(STEP, { csrf_token: await u.browser.csrf(STEP), code: u.recoveryCodes[9]! });
    const hashes = await codeHashes(u.id);
    const res = await u.browser.post(url, { code: await codeAt(u.secret, 1), current_password: PASSWORD });
    expect(res.statusCode).toBe(403);
    expect((await totpOf(u.id))?.confirmed_at).not.toBeNull();
    expect(await codeHashes(u.id)).toEqual(hashes);
  });
});

// ---- 4. An organization's two-step requirement ----

describe('an organization’s two-step requirement: refused changes change nothing', () => {
  let orgId: number;
  let owner: Person;
  let manager: ApplicationWithSecret;
  let dataOnly: ApplicationWithSecret;

  const requireMfaOf = async (id: number) => (await db().selectFrom('organizations').select('require_mfa').where('id', '=', id).executeTakeFirstOrThrow()).require_mfa;
  const updates = async (id: number) => (await db().selectFrom('audit_events').select('id').where('organization_id', '=', id).where('action', '=', 'organization.updated').execute()).length;
  async function expectUnchanged() {
    expect(await requireMfaOf(orgId)).toBe(false);
    expect(await requireMfaOf(world.org.organizationId)).toBe(false);
    expect(await updates(orgId)).toBe(0);
    expect(await updates(world.org.organizationId)).toBe(0);
  }

  async function tokenOf(application: ApplicationWithSecret): Promise<string> {
    const headers = { ...FORM, authorization: basic(application.client_id, application.client_secret) };
    const res = await app.inject({ method: 'POST', url: '/oauth/token', headers, payload: form({ grant_type: 'client_credentials', organization_id: String(orgId) }) });
    expect(res.statusCode, res.body).toBe(200);
    return res.json().access_token;
  }
  const patch = async (application: ApplicationWithSecret, body: string, path = String(orgId)) =>
    app.inject({ method: 'PATCH', url: `/api/v1/${path}`, headers: { authorization: `Bearer ${await tokenOf(application)}`, 'content-type': 'application/json' }, payload: body });

  /** A user of no organization yet (not the world's), with a browser. */
  async function outsider(n: number): Promise<Person> {
    const email = `strict-${n}-${process.pid}-${Date.now()}@example.com`;
    const user = await createUser(db(), { email, password: PASSWORD, name: `Strict ${n}` });
    return { id: user.id, email, name: `Strict ${n}`, browser: new Browser(app, `10.79.0.${n}`) };
  }

  beforeAll(async () => {
    owner = await outsider(1);
    orgId = (await createOrganization(db(), { name: `Strict ${Date.now()}`, ownerUserId: owner.id })).id;
    manager = await createApplication(db(), { organizationId: orgId, type: 'private', name: 'Manager', scopes: 'members.read members.write' });
    dataOnly = await createApplication(db(), { organizationId: orgId, type: 'private', name: 'Data', scopes: 'contacts.read' });
  }, 60_000);

  const badBodies: [string, string][] = [
    ['require_mfa as a string', '{"require_mfa":"yes"}'],
    ['require_mfa as null', '{"require_mfa":null}'],
    ['require_mfa as 1', '{"require_mfa":1}'],
    ['an unknown field', '{"require_mfa":true,"require_mfa_for":"everyone"}'],
  ];
  it.each(badBodies)('PATCH /api/v1/:org with %s: 400', async (_name, body) => {
    expect((await patch(manager, body)).statusCode).toBe(400);
    await expectUnchanged();
  });

  it('PATCH with a token without members.write: 403 insufficient_scope', async () => {
    const res = await patch(dataOnly, '{"require_mfa":true}');
    expect([res.statusCode, res.json().error]).toEqual([403, 'insufficient_scope']);
    expect(String(res.headers['www-authenticate'])).toContain('scope="members.write"');
    await expectUnchanged();
  });

  it('PATCH another organization’s path: 403', async () => {
    const res = await patch(manager, '{"require_mfa":true}', String(world.org.organizationId));
    expect([res.statusCode, res.json().error]).toEqual([403, 'organization_mismatch']);
    await expectUnchanged();
  });

  describe('the dashboard toggle (POST /dashboard/members/require-mfa)', () => {
    const toggle = (b: Browser, csrf: string | undefined, value: string | string[]) =>
      b.post('/dashboard/members/require-mfa', { ...(csrf === undefined ? {} : { csrf_token: csrf }), require_mfa: value });

    it.each([
      ['require_mfa=maybe', 400, 'maybe', true],
      ['require_mfa=YES', 400, 'YES', true],
      ['require_mfa twice', 400, ['no', 'yes'], true],
      ['no CSRF token', 403, 'yes', false],
      ['require_mfa=yes from a one-step session', 409, 'yes', true],
    ] as const)('%s: %i', async (_name, status, value, withCsrf) => {
      if (!owner.browser.cookies.has('orgauth_session')) await signIn(owner);
      const csrf = withCsrf ? await owner.browser.csrf('/dashboard/account') : undefined;
      expect((await toggle(owner.browser, csrf, value as string | string[])).statusCode).toBe(status);
      await expectUnchanged();
    });

    it('by a member whose role lacks members.write: 403', async () => {
      const m = await outsider(2);
      await addMember(db(), { organizationId: orgId, userId: m.id, role: 'member' });
      await signIn(m);
      expect((await toggle(m.browser, await m.browser.csrf('/dashboard/account'), 'yes')).statusCode).toBe(403);
      await expectUnchanged();
    });
  });

  describe('the CLI', () => {
    const run = (argv: string[]) => runCommandLine(argv, { db: db(), config: world.config, applied: [] });
    it.each([['Yes'], ['true'], [''], [' yes'], ['1'], [undefined]])('org update --require-mfa %j: non-zero exit', async (value) => {
      const outcome = await run(['org', 'update', '--org', String(orgId), '--require-mfa', ...(value === undefined ? [] : [value])]);
      expect(outcome.code, outcome.stderr).not.toBe(0);
      await expectUnchanged();
    });

    it.each([['nobody-here@example.com'], ['']])('user reset-mfa --email %j (no such user): non-zero exit, nothing recorded', async (email) => {
      const before = await db().selectFrom('account_events').select('id').where('action', '=', 'second_factor.reset_by_administrator').execute();
      const outcome = await run(['user', 'reset-mfa', '--email', email]);
      expect(outcome.code).not.toBe(0);
      expect(await db().selectFrom('account_events').select('id').where('action', '=', 'second_factor.reset_by_administrator').execute()).toEqual(before);
    });
  });
});

// ---- 5. acr_values ----

describe('acr_values on GET /oauth/authorize, from a one-step session', () => {
  let p: Person;
  beforeAll(async () => {
    p = await person();
    await signIn(p);
  }, 60_000);

  const stepUp = /^\/login\/second-step\?return_to=%2Foauth%2Fauthorize%3F/;
  const pad = (n: number) => Array.from({ length: Math.ceil(n / 12) }, (_, i) => `urn:x:${String(i).padStart(5, '0')}`).join(' ').slice(0, n);

  it.each([
    ['unknown values only', 'urn:example:gold urn:example:silver'],
    ['the password class only', 'urn:orgauth:acr:password'],
    ['the two-factor value in another case', ACR_TWO_FACTORS.toUpperCase()],
    ['3,000 characters of unknown values', pad(3000)],
  ])('%s: ignored, the consent page', async (_name, acr) => {
    const res = await p.browser.get(authorizePath({ acr_values: acr }));
    expect([res.statusCode, res.body]).toEqual([200, expect.stringContaining('name="decision"')]);
  });

  it.each([
    ['repeated', `${ACR_TWO_FACTORS} ${ACR_TWO_FACTORS}`],
    ['among other values', `urn:example:gold ${ACR_TWO_FACTORS} urn:orgauth:acr:password`],
    ['after 3,000 characters of unknown values', `${pad(3000)} ${ACR_TWO_FACTORS}`],
  ])('the two-factor value %s: the second step is asked for', async (_name, acr) => {
    const res = await p.browser.get(authorizePath({ acr_values: acr }));
    expect([res.statusCode, location(res)]).toEqual([303, expect.stringMatching(stepUp)]);
    // No factor yet: the step-up page says to set one up (not a 5xx), and no code went out.
    expect((await p.browser.get(location(res))).statusCode).toBe(403);
    expect(await db().selectFrom('authorization_codes').select('id').where('user_id', '=', p.id).execute()).toEqual([]);
  });

  it('acr_values sent twice: invalid_request on the redirect, with state', async () => {
    const path = authorizePath({ acr_values: [ACR_TWO_FACTORS, 'urn:example:gold'] });
    const res = await p.browser.get(path);
    expect(res.statusCode).toBe(303);
    const to = new URL(location(res));
    expect(`${to.origin}${to.pathname}`).toBe(RP_REDIRECT);
    expect(to.searchParams.get('error')).toBe('invalid_request');
    expect(to.searchParams.get('state')).toBe(new URLSearchParams(path.split('?')[1]).get('state'));
    expect(to.searchParams.has('code')).toBe(false);
  });
});
