/**
 * SSO required holds for passkeys too (issue 25), on both databases: a person whose address is
 * at a domain an organization verified, with an active connection and SSO required, signs in
 * through the organization's identity provider only. A passkey they registered before (with the
 * software authenticator, through the Account page, as test/accounts/passkeys.test.ts does) is
 * refused on the login page's passwordless sign-in: a 403 in the JSON error shape the page script
 * shows, telling them to use the company sign-in, and no session. The same passkey signs in once
 * SSO is no longer required, or while the organization has no active connection (the mark cannot
 * lock anyone out then), and a person of another domain is not concerned at all.
 */
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { sha256Hex } from '../../src/lib/crypto.js';
import { createConnection, updateConnection } from '../../src/sso/connections.js';
import { addDomain, updateDomain, verifyDomain } from '../../src/sso/domains.js';
import { Browser, csrfTokenIn } from '../accounts/browser.js';
import { buildTestApp, testConfig } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { SoftAuthenticator } from '../helpers/soft-authenticator.js';

const ISSUER = 'http://localhost:3000';
const PASSWORD = 'a passkey test password';
const DOMAIN = 'corp.example';
const REFUSED = 'Your organization signs you in through its identity provider. Enter your email address and choose Continue.';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
let organizationId: number;
let connectionId: number;
const db = () => t.handle.db;
const settings = () => {
  const config = testConfig({ ISSUER });
  return { issuer: config.issuer, secretKey: config.secretKey, allowHttp: config.outbound.allowHttp };
};

let n = 0;
const newBrowser = () => new Browser(app, `10.28.${Math.floor(++n / 250)}.${(n % 250) + 1}`);

interface Person {
  id: number;
  email: string;
  passkey: SoftAuthenticator;
}

/** A user with a password, who signed in with it and added a passkey on the Account page. */
async function personWithPasskey(email: string): Promise<Person> {
  const user = await createUser(db(), { email, password: PASSWORD, name: email.split('@')[0]! });
  const browser = newBrowser();
  const login = await browser.login(email, PASSWORD);
  expect(login.statusCode, login.body).toBe(303);
  const token = csrfTokenIn((await browser.get('/dashboard/account')).body);
  const options = await browser.postJson('/dashboard/account/passkeys/options', {}, { 'x-csrf-token': token });
  expect(options.statusCode, options.body).toBe(200);
  const passkey = new SoftAuthenticator(ISSUER);
  const added = await browser.postJson('/dashboard/account/passkeys', { response: passkey.register(options.json()), name: 'Laptop' }, { 'x-csrf-token': token });
  expect(added.statusCode, added.body).toBe(200);
  return { id: user.id, email, passkey };
}

/** The login page's "Sign in with a passkey" in a fresh browser: no password, nobody named until the passkey answers. */
async function passwordless(person: Person): Promise<{ browser: Browser; res: LightMyRequestResponse }> {
  const browser = newBrowser();
  const token = await browser.csrf('/login');
  const options = await browser.postJson('/login/passkey/sign-in/options', {}, { 'x-csrf-token': token });
  expect(options.statusCode, options.body).toBe(200);
  const res = await browser.postJson('/login/passkey/sign-in', { response: person.passkey.assert(options.json()) }, { 'x-csrf-token': token });
  return { browser, res };
}

const sessionsOf = async (userId: number) => (await db().selectFrom('sessions').select('amr').where('user_id', '=', userId).orderBy('id').execute()).map((s) => s.amr);

function expectSignedIn(browser: Browser, res: LightMyRequestResponse) {
  expect(res.statusCode, res.body).toBe(200);
  expect(res.json()).toEqual({ redirect: '/dashboard' });
  expect(browser.cookies.has('orgauth_session')).toBe(true);
}

async function expectSessionAmr(browser: Browser, amr: string[]) {
  const row = await db().selectFrom('sessions').select('amr').where('id_hash', '=', sha256Hex(browser.cookies.get('orgauth_session')!)).executeTakeFirstOrThrow();
  expect(row.amr).toEqual(amr);
}

async function setSsoRequired(value: boolean) {
  expect((await updateDomain(db(), organizationId, DOMAIN, { sso_required: value })).sso_required).toBe(value);
}

let alice: Person;
let bob: Person;

beforeAll(async () => {
  t = await createTestDatabase();
  app = await buildTestApp(db(), { env: { ISSUER } });
  const owner = await createUser(db(), { email: `owner-${process.pid}@owners.example`, password: 'owner-password-1' });
  organizationId = (await createOrganization(db(), { name: 'Corp Inc', ownerUserId: owner.id })).id;
  const claim = await addDomain(db(), organizationId, { domain: DOMAIN });
  // The TXT lookup answers with the claim's token, as the domain's DNS would once it is published.
  expect((await verifyDomain(db(), async (name) => (name === claim.verification.name ? [claim.verification.value] : []), organizationId, DOMAIN)).state).toBe('verified');
  // An active connection (never contacted here: nobody goes through it).
  connectionId = (
    await createConnection(db(), settings(), organizationId, { protocol: 'oidc', name: 'Corp IdP', issuer: 'https://idp.corp.example', client_id: 'orgauth', client_secret: 'upstream-secret-0123456789' })
  ).id;
  // Both add their passkey before SSO is required (a password sign-in is refused after).
  alice = await personWithPasskey(`alice@${DOMAIN}`);
  bob = await personWithPasskey('bob@elsewhere.example');
}, 60_000);
afterAll(async () => {
  await app?.close();
  await t?.close();
});

describe(`SSO required and passkeys on ${BACKEND}`, () => {
  it('refuses a passwordless passkey sign-in of an address at the domain: 403 JSON saying to use the company sign-in, no session', async () => {
    await setSsoRequired(true);
    try {
      const before = await sessionsOf(alice.id);
      const pendingBefore = await db().selectFrom('pending_sign_ins').select('id_hash').where('user_id', '=', alice.id).execute();
      const { browser, res } = await passwordless(alice);
      expect(res.statusCode, res.body).toBe(403);
      expect(res.headers['content-type']).toMatch(/^application\/json/);
      expect(res.json()).toEqual({ error: 'forbidden', error_description: REFUSED });
      expect(res.cookies.find((c) => c.name === 'orgauth_session' && c.value !== '')).toBeUndefined();
      expect(browser.cookies.has('orgauth_session')).toBe(false);
      expect(await sessionsOf(alice.id)).toEqual(before);
      // Nor did the refusal name her in a sign-in waiting for a step.
      expect(await db().selectFrom('pending_sign_ins').select('id_hash').where('user_id', '=', alice.id).execute()).toEqual(pendingBefore);
      // Signed out as before.
      const dashboard = await browser.get('/dashboard');
      expect(dashboard.statusCode).toBe(303);
      expect(String(dashboard.headers.location)).toMatch(/^\/login\b/);
      // The password is refused too, so the passkey is no way around the rule.
      const password = await browser.login(alice.email, PASSWORD);
      expect(password.statusCode).toBe(403);
      expect(await sessionsOf(alice.id)).toEqual(before);
    } finally {
      await setSsoRequired(false);
    }
  });

  it('signs the same passkey in once SSO is no longer required', async () => {
    await setSsoRequired(false);
    const { browser, res } = await passwordless(alice);
    expectSignedIn(browser, res);
    await expectSessionAmr(browser, ['hwk', 'user', 'mfa']);
    expect((await browser.get('/dashboard')).statusCode).toBe(200);
  });

  it('does not concern an address at another domain', async () => {
    await setSsoRequired(true);
    try {
      const { browser, res } = await passwordless(bob);
      expectSignedIn(browser, res);
      await expectSessionAmr(browser, ['hwk', 'user', 'mfa']);
    } finally {
      await setSsoRequired(false);
    }
  });

  it('has no effect while the organization has no active connection', async () => {
    await setSsoRequired(true);
    await updateConnection(db(), settings(), organizationId, connectionId, { state: 'disabled' });
    try {
      const { browser, res } = await passwordless(alice);
      expectSignedIn(browser, res);
    } finally {
      await updateConnection(db(), settings(), organizationId, connectionId, { state: 'active' });
    }
    // Active again: refused again.
    try {
      const { res } = await passwordless(alice);
      expect(res.statusCode, res.body).toBe(403);
      expect(res.json().error_description).toBe(REFUSED);
    } finally {
      await setSsoRequired(false);
    }
  });
});
