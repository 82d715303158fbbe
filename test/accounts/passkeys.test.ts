/**
 * Passkeys through the real routes, with a software authenticator (test/helpers/soft-authenticator.ts):
 * adding and removing them on the Account page, signing in with one and no password, a passkey
 * as the second step after the password and as a signed-in session's step-up, and the
 * refusals: every bent response is a 4xx, never a session and never a 5xx.
 */
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createSession } from '../../src/accounts/sessions.js';
import { createUser } from '../../src/accounts/users.js';
import { createOrganization } from '../../src/accounts/organizations.js';
import { BODY_LIMIT } from '../../src/app.js';
import { sha256Hex } from '../../src/lib/crypto.js';
import { buildTestApp } from '../helpers/app.js';
import { createTestDatabase } from '../helpers/db.js';
import { type Bend, SoftAuthenticator } from '../helpers/soft-authenticator.js';
import { Browser, csrfTokenIn, expectPageSecurityHeaders } from './browser.js';

const ISSUER = 'http://localhost:3000';
const PASSWORD = 'a passkey test password';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
let n = 0;
const db = () => t.handle.db;

beforeAll(async () => {
  t = await createTestDatabase();
  app = await buildTestApp(t.handle.db, { env: { ISSUER } });
});
afterAll(async () => {
  await app?.close();
  await t?.close();
});

interface Person {
  id: number;
  email: string;
  browser: Browser;
}

async function person(): Promise<Person> {
  const i = ++n;
  const email = `passkey-${i}@example.com`;
  const user = await createUser(db(), { email, password: PASSWORD, name: `Passkey Person ${i}` });
  return { id: user.id, email, browser: new Browser(app, `10.77.0.${i}`) };
}

async function signedIn(): Promise<Person> {
  const p = await person();
  expect((await p.browser.login(p.email, PASSWORD)).headers.location).toBe('/dashboard');
  return p;
}

/** The session's CSRF token, as the Account page's script finds it (data-csrf). */
async function accountToken(browser: Browser): Promise<string> {
  return csrfTokenIn((await browser.get('/dashboard/account')).body);
}

async function addPasskey(browser: Browser, authenticator: SoftAuthenticator, name: string, extra: Record<string, string> = {}, bend: Bend = {}) {
  const token = await accountToken(browser);
  const options = await browser.postJson('/dashboard/account/passkeys/options', extra, { 'x-csrf-token': token });
  expect(options.statusCode, options.body).toBe(200);
  return browser.postJson('/dashboard/account/passkeys', { response: authenticator.register(options.json(), bend), name, ...extra }, { 'x-csrf-token': token });
}

/** A passkey registered for `p`, through the Account page. */
async function withPasskey(p: Person, backedUp = false): Promise<SoftAuthenticator> {
  const authenticator = new SoftAuthenticator(ISSUER, backedUp);
  expect((await addPasskey(p.browser, authenticator, 'Laptop')).json()).toMatchObject({ redirect: '/dashboard/account' });
  return authenticator;
}

/** The login page's "Sign in with a passkey": a fresh browser, no password. */
async function passwordless(authenticator: SoftAuthenticator, bend: Bend = {}, browser = new Browser(app, `10.78.0.${++n}`)) {
  const token = await browser.csrf('/login');
  const options = await browser.postJson('/login/passkey/sign-in/options', {}, { 'x-csrf-token': token });
  expect(options.statusCode, options.body).toBe(200);
  const response = authenticator.assert(options.json(), bend);
  const res = await browser.postJson('/login/passkey/sign-in', { response }, { 'x-csrf-token': token });
  return { browser, res, token, options: options.json(), response };
}

async function sessionAmr(browser: Browser): Promise<string[]> {
  const id = browser.cookies.get('orgauth_session');
  expect(id).toBeDefined();
  return (await db().selectFrom('sessions').select('amr').where('id_hash', '=', sha256Hex(id!)).executeTakeFirstOrThrow()).amr;
}

const events = async (userId: number) => (await db().selectFrom('account_events').select('action').where('user_id', '=', userId).orderBy('id').execute()).map((e) => e.action);

function expectRefused(res: LightMyRequestResponse, status = 400): void {
  expect(res.statusCode, res.body).toBe(status);
  expect(res.headers['content-type']).toMatch(/^application\/json/);
  expect(res.json().error_description).toEqual(expect.any(String));
}

describe('adding and removing passkeys', () => {
  it('adds two named passkeys with options that ask for a discoverable, user-verifying credential', async () => {
    const p = await signedIn();
    const before = p.browser.cookies.get('orgauth_session');
    const token = await accountToken(p.browser);
    const first = await p.browser.postJson('/dashboard/account/passkeys/options', {}, { 'x-csrf-token': token });
    const options = first.json();
    expect(options).toMatchObject({
      rp: { id: 'localhost', name: 'orgauth' },
      user: { name: p.email },
      attestation: 'none',
      authenticatorSelection: { residentKey: 'required', userVerification: 'required' },
      excludeCredentials: [],
    });
    const laptop = new SoftAuthenticator(ISSUER);
    const added = await p.browser.postJson('/dashboard/account/passkeys', { response: laptop.register(options), name: '  Work laptop  ' }, { 'x-csrf-token': token });
    expect(added.statusCode, added.body).toBe(200);
    // A first factor comes with its recovery codes, once.
    expect(added.json()).toEqual({ redirect: '/dashboard/account', recovery_codes: expect.any(Array) });
    const codes: string[] = added.json().recovery_codes;
    expect(new Set(codes).size).toBe(10);
    for (const code of codes) expect(code).toMatch(/^[0-9a-z]{4}-[0-9a-z]{4}-[0-9a-z]{4}$/);
    expect(await db().selectFrom('recovery_codes').select('id').where('user_id', '=', p.id).where('used_at', 'is', null).execute()).toHaveLength(10);
    // Adding raised the browser to two factors in a new session: the page's token is the new session's.
    expect(p.browser.cookies.get('orgauth_session')).not.toBe(before);
    const token2 = await accountToken(p.browser);

    // The second: the first is excluded, the user handle is the same.
    const second = (await p.browser.postJson('/dashboard/account/passkeys/options', {}, { 'x-csrf-token': token2 })).json();
    expect(second.excludeCredentials).toEqual([{ id: laptop.id, type: 'public-key', transports: ['internal'] }]);
    expect(second.user.id).toBe(options.user.id);
    expect(second.challenge).not.toBe(options.challenge);
    const phone = new SoftAuthenticator(ISSUER, true);
    const secondAdded = await p.browser.postJson('/dashboard/account/passkeys', { response: phone.register(second), name: '' }, { 'x-csrf-token': token2 });
    // The user keeps the codes they have: none are shown again.
    expect(secondAdded.json()).toEqual({ redirect: '/dashboard/account' });

    const rows = await db().selectFrom('passkeys').select(['name', 'credential_id', 'backed_up', 'sign_count', 'transports']).where('user_id', '=', p.id).orderBy('id').execute();
    expect(rows).toEqual([
      { name: 'Work laptop', credential_id: laptop.id, backed_up: false, sign_count: 0, transports: ['internal'] },
      { name: 'Passkey', credential_id: phone.id, backed_up: true, sign_count: 0, transports: ['internal'] },
    ]);
    const page = await p.browser.get('/dashboard/account');
    expectPageSecurityHeaders(page);
    expect(page.body).toContain('Remove Work laptop');
    expect(page.body).toContain('Passkey <span class="note">(synced)</span>');
    expect(page.body).toContain('Add a passkey');
    expect(await events(p.id)).toEqual(['passkey.added', 'passkey.added']);
    const mail = await db().selectFrom('mail_outbox').select('subject').where('recipient', '=', p.email).execute();
    expect(mail.filter((m) => m.subject === 'A passkey was added to your account')).toHaveLength(2);
    // Adding proved a second factor, as a new authenticator app's first code does.
    expect(await sessionAmr(p.browser)).toEqual(['pwd', 'hwk', 'mfa', 'swk']);
  });

  it('refuses the same credential twice, a used challenge, and a response made for another origin, RP ID or without UV', async () => {
    const p = await signedIn();
    const authenticator = await withPasskey(p);
    expectRefused(await addPasskey(p.browser, authenticator, 'Again'), 409);
    for (const bend of [{ origin: 'http://evil.example' }, { rpId: 'evil.example' }, { uv: false }, { challenge: 'bm90LXRoZS1jaGFsbGVuZ2U' }, { type: 'webauthn.get' }] satisfies Bend[]) {
      expectRefused(await addPasskey(p.browser, new SoftAuthenticator(ISSUER), 'Bent', {}, bend));
    }
    // The challenge is used once: the same response again finds none.
    const token = await accountToken(p.browser);
    const options = (await p.browser.postJson('/dashboard/account/passkeys/options', {}, { 'x-csrf-token': token })).json();
    const response = new SoftAuthenticator(ISSUER).register(options);
    expect((await p.browser.postJson('/dashboard/account/passkeys', { response, name: 'Once' }, { 'x-csrf-token': token })).statusCode).toBe(200);
    expectRefused(await p.browser.postJson('/dashboard/account/passkeys', { response, name: 'Twice' }, { 'x-csrf-token': await accountToken(p.browser) }));
    expect(await db().selectFrom('passkeys').select('name').where('user_id', '=', p.id).orderBy('id').execute()).toEqual([{ name: 'Laptop' }, { name: 'Once' }]);
  });

  it('removes a passkey, and with the last second factor the recovery codes', async () => {
    const p = await signedIn();
    await withPasskey(p);
    const token = await accountToken(p.browser);
    const codes = await p.browser.post('/dashboard/account/recovery-codes', { csrf_token: token });
    expect(codes.statusCode).toBe(200);
    expect(await db().selectFrom('recovery_codes').select('id').where('user_id', '=', p.id).execute()).toHaveLength(10);
    const [row] = await db().selectFrom('passkeys').select('id').where('user_id', '=', p.id).execute();
    const removed = await p.browser.post(`/dashboard/account/passkeys/${row!.id}/remove`, { csrf_token: token });
    expect(removed.statusCode).toBe(200);
    expect(removed.body).toContain('The passkey &quot;Laptop&quot; was removed.');
    expect(await db().selectFrom('passkeys').select('id').where('user_id', '=', p.id).execute()).toEqual([]);
    expect(await db().selectFrom('recovery_codes').select('id').where('user_id', '=', p.id).execute()).toEqual([]);
    expect((await events(p.id)).slice(-1)).toEqual(['passkey.removed']);
    expect(await db().selectFrom('mail_outbox').select('subject').where('recipient', '=', p.email).where('subject', '=', 'A passkey was removed from your account').execute()).toHaveLength(1);
  });

  it("refuses another user's passkey (404), a missing CSRF token (403), and without the password once the session is older than 10 minutes", async () => {
    const owner = await signedIn();
    await withPasskey(owner);
    const [theirs] = await db().selectFrom('passkeys').select('id').where('user_id', '=', owner.id).execute();
    const other = await signedIn();
    await withPasskey(other);
    const [mine] = await db().selectFrom('passkeys').select('id').where('user_id', '=', other.id).execute();
    const token = await accountToken(other.browser);
    expect((await other.browser.post(`/dashboard/account/passkeys/${theirs!.id}/remove`, { csrf_token: token })).statusCode).toBe(404);
    expect((await other.browser.post('/dashboard/account/passkeys/not-a-number/remove', { csrf_token: token })).statusCode).toBe(404);
    expect((await other.browser.post(`/dashboard/account/passkeys/${mine!.id}/remove`, {})).statusCode).toBe(403);
    expectRefused(await other.browser.postJson('/dashboard/account/passkeys/options', {}), 403);
    expectRefused(await other.browser.postJson('/dashboard/account/passkeys/options', {}, { 'x-csrf-token': `${token}x` }), 403);
    // Signed out: 403 too, as JSON.
    expectRefused(await new Browser(app).postJson('/dashboard/account/passkeys/options', {}, { 'x-csrf-token': token }), 403);

    // Sudo mode over: the password again, for removing and for adding.
    await db().updateTable('sessions').set({ created_at: sql<Date>`now() - interval '11 minutes'` }).where('user_id', '=', other.id).execute();
    const page = await other.browser.get('/dashboard/account');
    expect(page.body).toMatch(/id="add-passkey"[^]*name="current_password"/);
    expect((await other.browser.post(`/dashboard/account/passkeys/${mine!.id}/remove`, { csrf_token: token })).statusCode).toBe(400);
    expect((await other.browser.post(`/dashboard/account/passkeys/${mine!.id}/remove`, { csrf_token: token, current_password: 'wrong password' })).statusCode).toBe(400);
    expect(await db().selectFrom('passkeys').select('id').where('id', '=', mine!.id).execute()).toHaveLength(1);
    expectRefused(await other.browser.postJson('/dashboard/account/passkeys/options', {}, { 'x-csrf-token': token }));
    expect((await addPasskey(other.browser, new SoftAuthenticator(ISSUER), 'With password', { current_password: PASSWORD })).statusCode).toBe(200);
    // Adding replaced the session (a new id): the new one signed in just now.
    expect((await other.browser.post(`/dashboard/account/passkeys/${mine!.id}/remove`, { csrf_token: await accountToken(other.browser) })).statusCode).toBe(200);
    expect(await db().selectFrom('passkeys').select('name').where('user_id', '=', other.id).execute()).toEqual([{ name: 'With password' }]);
    expect(await db().selectFrom('passkeys').select('id').where('id', '=', theirs!.id).execute()).toHaveLength(1);
  });
});

describe('signing in with a passkey and no password', () => {
  it('signs in with a device-bound passkey (hwk) and a synced one (swk), two factors each', async () => {
    const p = await signedIn();
    const laptop = await withPasskey(p);
    const phone = await withPasskey(p, true);

    const login = await new Browser(app).get('/login');
    expectPageSecurityHeaders(login);
    expect(login.body).toContain('autocomplete="username webauthn"');
    expect(login.body).toContain('Sign in with a passkey');
    expect(login.body).toContain('<script src="/assets/passkeys.js" defer></script>');

    const { browser, res, options } = await passwordless(laptop);
    expect(options).toMatchObject({ rpId: 'localhost', userVerification: 'required' });
    expect(options.allowCredentials ?? []).toEqual([]);
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json()).toEqual({ redirect: '/dashboard' });
    expect((await browser.get('/dashboard')).statusCode).toBe(200);
    expect(await sessionAmr(browser)).toEqual(['hwk', 'user', 'mfa']);
    // The pending sign-in is over.
    expect(browser.cookies.has('orgauth_signin')).toBe(false);
    const row = await db().selectFrom('passkeys').select(['sign_count', 'last_used_at']).where('credential_id', '=', laptop.id).executeTakeFirstOrThrow();
    expect(row.sign_count).toBe(laptop.counter);
    expect(row.last_used_at).toBeInstanceOf(Date);

    const synced = await passwordless(phone);
    expect(synced.res.statusCode).toBe(200);
    expect(await sessionAmr(synced.browser)).toEqual(['swk', 'user', 'mfa']);
  });

  it('goes back to return_to', async () => {
    const p = await signedIn();
    const authenticator = await withPasskey(p);
    const browser = new Browser(app);
    const token = await browser.csrf('/login');
    const options = await browser.postJson('/login/passkey/sign-in/options', { return_to: '/dashboard/account' }, { 'x-csrf-token': token });
    const res = await browser.postJson('/login/passkey/sign-in', { response: authenticator.assert(options.json()) }, { 'x-csrf-token': token });
    expect(res.json()).toEqual({ redirect: '/dashboard/account' });
  });

  it('uses a challenge once: a replayed response, and two racing ones, sign in once', async () => {
    const p = await signedIn();
    const authenticator = await withPasskey(p);
    const { res, response: used } = await passwordless(authenticator);
    expect(res.statusCode).toBe(200);
    // The same response again, in a new sign-in (whose challenge is another).
    const replayer = new Browser(app);
    const token = await replayer.csrf('/login');
    await replayer.postJson('/login/passkey/sign-in/options', {}, { 'x-csrf-token': token });
    expectRefused(await replayer.postJson('/login/passkey/sign-in', { response: used }, { 'x-csrf-token': token }));
    expect(replayer.cookies.has('orgauth_session')).toBe(false);

    const racer = new Browser(app);
    const racerToken = await racer.csrf('/login');
    const options = (await racer.postJson('/login/passkey/sign-in/options', {}, { 'x-csrf-token': racerToken })).json();
    const response = authenticator.assert(options);
    const both = await Promise.all([1, 2].map(() => racer.postJson('/login/passkey/sign-in', { response }, { 'x-csrf-token': racerToken })));
    expect(both.map((r) => r.statusCode).sort()).toEqual([200, 400]);
  });

  it('refuses bent responses, unknown passkeys and a counter going backwards', async () => {
    const p = await signedIn();
    const authenticator = await withPasskey(p);
    const sessionsBefore = (await db().selectFrom('sessions').select('id').where('user_id', '=', p.id).execute()).length;
    const refusals: [string, Bend][] = [
      ['another challenge', { challenge: 'YW5vdGhlci1jaGFsbGVuZ2UtYWx0b2dldGhlcg' }],
      ['another origin', { origin: 'http://evil.example' }],
      ['another RP ID', { rpId: 'evil.example' }],
      ['no user verification', { uv: false }],
      ['a registration', { type: 'webauthn.create' }],
    ];
    for (const [what, bend] of refusals) {
      const { res, browser } = await passwordless(authenticator, bend);
      expectRefused(res);
      expect(browser.cookies.has('orgauth_session'), what).toBe(false);
    }

    // Tampered after signing: clientDataJSON, then the signature.
    for (const tamper of ['clientDataJSON', 'signature'] as const) {
      const browser = new Browser(app);
      const token = await browser.csrf('/login');
      const response = authenticator.assert((await browser.postJson('/login/passkey/sign-in/options', {}, { 'x-csrf-token': token })).json());
      const bytes = Buffer.from(response.response[tamper], 'base64url');
      if (tamper === 'clientDataJSON') bytes.write(' ', bytes.length - 1);
      else bytes[bytes.length - 1]! ^= 1;
      response.response[tamper] = bytes.toString('base64url');
      expectRefused(await browser.postJson('/login/passkey/sign-in', { response }, { 'x-csrf-token': token }));
    }

    // Unknown to this server, and without the user handle a discoverable credential returns.
    expectRefused((await passwordless(new SoftAuthenticator(ISSUER))).res);
    const handleless = Object.assign(Object.create(Object.getPrototypeOf(authenticator)), authenticator, { userHandle: undefined }) as SoftAuthenticator;
    expectRefused((await passwordless(handleless)).res);

    // Counter: a good sign-in at 10, then 10 again, then 3: refused and recorded, signed in with neither.
    expect((await passwordless(authenticator, { counter: 10 })).res.statusCode).toBe(200);
    for (const counter of [10, 3]) {
      const { res, browser } = await passwordless(authenticator, { counter });
      expectRefused(res);
      expect(browser.cookies.has('orgauth_session')).toBe(false);
    }
    const regressions = await db().selectFrom('account_events').select('details').where('user_id', '=', p.id).where('action', '=', 'passkey.counter_regression').orderBy('id').execute();
    expect(regressions.map((r) => r.details)).toMatchObject([{ stored: 10, received: 10 }, { stored: 10, received: 3 }]);
    expect((await db().selectFrom('sessions').select('id').where('user_id', '=', p.id).execute()).length).toBe(sessionsBefore + 1);
  });

  it('refuses malformed bodies with a 4xx JSON error, and a missing or wrong CSRF token with a 403', async () => {
    const browser = new Browser(app);
    const token = await browser.csrf('/login');
    const h = { 'x-csrf-token': token };
    expectRefused(await browser.postJson('/login/passkey/sign-in/options', {}), 403);
    expectRefused(await browser.postJson('/login/passkey/sign-in/options', {}, { 'x-csrf-token': 'forged' }), 403);
    expectRefused(await new Browser(app).postJson('/login/passkey/sign-in/options', {}, h), 403);
    expectRefused(await browser.postJson('/login/passkey/sign-in', {}), 403);
    const options = (await browser.postJson('/login/passkey/sign-in/options', {}, h)).json();
    const good = new SoftAuthenticator(ISSUER).assert(options);
    const bodies: unknown[] = [
      null,
      [],
      'a string',
      {},
      { response: null },
      { response: { ...good, id: '!!not base64url!!' } },
      { response: { ...good, rawId: 'x'.repeat(5000) } },
      { response: { ...good, type: 'password' } },
      { response: { ...good, response: { ...good.response, signature: 12 } } },
      { response: { ...good, response: { ...good.response, clientDataJSON: 'bm90IGpzb24' } } },
      { response: { ...good, response: { ...good.response, authenticatorData: 'AA' } } },
      { response: good, return_to: 'x'.repeat(9000) },
    ];
    for (const body of bodies) expectRefused(await browser.postJson('/login/passkey/sign-in', body, h));
    for (const raw of ['{not json', '', '{"response":']) expectRefused(await browser.postJson('/login/passkey/sign-in', raw, h, true));
    expectRefused(await browser.postJson('/login/passkey/sign-in', 'x'.repeat(BODY_LIMIT + 1), h, true), 413);
    expectRefused(await browser.postJson('/login/passkey/sign-in', JSON.stringify({ response: good, pad: 'x'.repeat(BODY_LIMIT) }), h, true), 413);
    expectRefused(await browser.postJson('/login/passkey/sign-in', 'plain', { ...h, 'content-type': 'text/plain' }, true));
    expectRefused(await browser.postJson('/login/passkey/sign-in', '<x/>', { ...h, 'content-type': 'application/xml' }, true), 415);
    for (const [url, body] of [
      ['/login/passkey/sign-in/options', '{"return_to": 5}'],
      ['/dashboard/account/passkeys/options', '{'],
      ['/login/passkey/options', '{'],
    ]) {
      const res = await browser.postJson(url!, body, h, true);
      expect(res.statusCode, `${url} ${res.body}`).toBeGreaterThanOrEqual(400);
      expect(res.statusCode).toBeLessThan(500);
    }
  });
});

describe('a passkey as the second step', () => {
  it('finishes a password sign-in of a user whose second factor is a passkey', async () => {
    const p = await signedIn();
    const authenticator = await withPasskey(p);
    const browser = new Browser(app);
    const res = await browser.login(p.email, PASSWORD, '/dashboard/account');
    expect(res.headers.location).toBe('/login/second-step');
    expect(browser.cookies.has('orgauth_session')).toBe(false);
    const page = await browser.get('/login/second-step');
    expect(page.body).toContain('Use a passkey');
    const token = /data-csrf="([^"]+)"/.exec(page.body)![1]!;

    const options = await browser.postJson('/login/passkey/options', {}, { 'x-csrf-token': token });
    expect(options.json().allowCredentials).toEqual([{ id: authenticator.id, type: 'public-key', transports: ['internal'] }]);
    const response = authenticator.assert(options.json());
    const done = await browser.postJson('/login/passkey', { response }, { 'x-csrf-token': token });
    expect(done.statusCode, done.body).toBe(200);
    expect(done.json()).toEqual({ redirect: '/dashboard/account' });
    expect(await sessionAmr(browser)).toEqual(['pwd', 'hwk', 'mfa']);
    expect((await browser.get('/dashboard/account')).statusCode).toBe(200);
    // The pending sign-in is gone (its token with it); as the new session's step-up, the same answer has no challenge.
    expectRefused(await browser.postJson('/login/passkey', { response }, { 'x-csrf-token': token }), 403);
    expectRefused(await browser.postJson('/login/passkey', { response }, { 'x-csrf-token': await accountToken(browser) }));
  });

  it("refuses another user's passkey, a passwordless pending sign-in, and a missing CSRF token", async () => {
    const p = await signedIn();
    await withPasskey(p);
    const stranger = await signedIn();
    const theirs = await withPasskey(stranger);
    const browser = new Browser(app);
    await browser.login(p.email, PASSWORD);
    const token = /data-csrf="([^"]+)"/.exec((await browser.get('/login/second-step')).body)![1]!;
    expectRefused(await browser.postJson('/login/passkey/options', {}), 403);
    const options = (await browser.postJson('/login/passkey/options', {}, { 'x-csrf-token': token })).json();
    const res = await browser.postJson('/login/passkey', { response: theirs.assert(options) }, { 'x-csrf-token': token });
    expectRefused(res);
    expect(browser.cookies.has('orgauth_session')).toBe(false);
    // The second step's pending sign-in is not a passwordless one: that endpoint refuses it.
    const preToken = await browser.csrf('/login');
    expectRefused(await browser.postJson('/login/passkey/sign-in', { response: theirs.assert(options) }, { 'x-csrf-token': preToken }));
    // Nobody signing in at all.
    expectRefused(await new Browser(app).postJson('/login/passkey/options', {}, { 'x-csrf-token': token }));
  });

  it('raises a signed-in session that has only a password (a step-up), to a new session', async () => {
    const p = await signedIn();
    const authenticator = await withPasskey(p);
    const browser = new Browser(app);
    const old = await createSession(db(), p.id, { amr: ['pwd'] });
    browser.cookies.set('orgauth_session', old);
    const page = await browser.get('/login/second-step?return_to=%2Fdashboard%2Faccount');
    expect(page.statusCode).toBe(200);
    const token = /data-csrf="([^"]+)"/.exec(page.body)![1]!;
    const options = (await browser.postJson('/login/passkey/options', { return_to: '/dashboard/account' }, { 'x-csrf-token': token })).json();
    // The challenge waits in the session.
    expect((await db().selectFrom('sessions').select('webauthn_challenge').where('id_hash', '=', sha256Hex(old)).executeTakeFirstOrThrow()).webauthn_challenge).toBe(options.challenge);
    const res = await browser.postJson('/login/passkey', { response: authenticator.assert(options), return_to: '/dashboard/account' }, { 'x-csrf-token': token });
    expect(res.json()).toEqual({ redirect: '/dashboard/account' });
    expect(browser.cookies.get('orgauth_session')).not.toBe(old);
    expect(await sessionAmr(browser)).toEqual(['pwd', 'hwk', 'mfa']);
    expect(await db().selectFrom('sessions').select('id').where('id_hash', '=', sha256Hex(old)).execute()).toEqual([]);
  });
});

describe('the page scripts', () => {
  it('serves webauthn.js and passkeys.js from this origin, and the CSP allows only them', async () => {
    const page = await new Browser(app).get('/login');
    const csp = String(page.headers['content-security-policy']);
    expect(csp).toContain("script-src 'self'");
    expect(csp).not.toMatch(/unsafe-inline|unsafe-eval|https?:/);
    expect(page.body).not.toMatch(/<script(?![^>]*\bsrc=)/);
    for (const [url, marker] of [
      ['/assets/webauthn.js', 'SimpleWebAuthnBrowser'],
      ['/assets/passkeys.js', 'data-passkey-action'],
    ] as const) {
      const res = await app.inject({ method: 'GET', url });
      expect(res.statusCode).toBe(200);
      expect(res.headers['content-type']).toBe('text/javascript; charset=utf-8');
      expect(res.headers['x-content-type-options']).toBe('nosniff');
      expect(res.body).toContain(marker);
    }
  });
});

describe('a session raised by a new passkey (SS-4)', () => {
  it('a passkey added by a session signed in through SSO: the raised session keeps its connection', async () => {
    const p = await person();
    const organization = await createOrganization(db(), { name: `Passkey SSO Corp ${n}`, ownerUserId: p.id });
    const connection = await db()
      .insertInto('sso_connections')
      .values({ organization_id: organization.id, protocol: 'oidc', name: 'Corp IdP', state: 'active', oidc_issuer: 'https://idp.example', oidc_client_id: 'orgauth', oidc_scopes: 'openid email profile' })
      .returning('id')
      .executeTakeFirstOrThrow();
    // Signed in through the connection, as src/web/sso-pages.ts makes such a session.
    const sessionId = await createSession(db(), p.id, { amr: ['fed'], ssoConnectionId: connection.id });
    p.browser.cookies.set('orgauth_session', sessionId);
    const added = await addPasskey(p.browser, new SoftAuthenticator(ISSUER), 'Laptop');
    expect(added.statusCode, added.body).toBe(200);
    const sessions = await db().selectFrom('sessions').select(['id_hash', 'sso_connection_id', 'amr']).where('user_id', '=', p.id).execute();
    expect(sessions).toEqual([{ id_hash: sha256Hex(p.browser.cookies.get('orgauth_session')!), sso_connection_id: connection.id, amr: ['fed', 'hwk', 'mfa'] }]);
    expect(sessions[0]!.id_hash).not.toBe(sha256Hex(sessionId));
  });
});
