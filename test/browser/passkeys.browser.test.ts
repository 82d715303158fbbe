/**
 * Passkeys in Debian's Chromium with a virtual authenticator (the DevTools protocol's WebAuthn
 * domain: a CTAP2 platform authenticator that keeps discoverable credentials and verifies the
 * user). The pages' own scripts (/assets/webauthn.js and /assets/passkeys.js, under the CSP)
 * run the ceremonies: a user signs in with the password, adds a passkey on the Account page,
 * signs out, signs in with the passkey and no password; then an application's sign-in through
 * the passkey gets an ID token whose amr says how (RFC 8176: hwk, mfa).
 *
 * The issuer is http://localhost:<port>: a secure context, and a valid RP ID (an IP is not).
 */
import * as client from 'openid-client';
import type { CDPSession, Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { type ApplicationWithSecret, createApplication } from '../../src/oauth/models/applications.js';
import { authorizationRequest, CallbackServer, HAS_CHROMIUM, screenshot, startWorld, type BrowserWorld, enterPassword } from './harness.js';

const PASSWORD = 'a long passkey password';
const EMAIL = 'ada@passkeys.example.com';
const LONG_TEST_MS = 90_000;

describe.runIf(HAS_CHROMIUM)('passkeys in a real browser', () => {
  let world: BrowserWorld;
  let rp: CallbackServer;
  let app: ApplicationWithSecret;
  let userId: number;

  beforeAll(async () => {
    world = await startWorld({}, { hostname: 'localhost' });
    rp = await CallbackServer.start();
    const db = world.db.handle.db;
    userId = (await createUser(db, { email: EMAIL, password: PASSWORD, name: 'Ada Lovelace' })).id;
    const orgId = (await createOrganization(db, { name: 'Passkey Org', ownerUserId: userId })).id;
    app = await createApplication(db, { organizationId: orgId, type: 'public', name: 'Passkey RP', redirectUris: [rp.callback], scopes: 'contacts.read', requirePkce: true });
  }, 60_000);
  afterAll(async () => {
    await world?.close();
    await rp?.stop();
  });

  /**
   * A page with a virtual platform authenticator attached (it answers every ceremony, user
   * verified). Chromium's virtual authenticator also answers a conditional (autofill) request at
   * once, so a page that is to use the button says it has no autofill, as some browsers do.
   */
  async function pageWithAuthenticator(options: { autofill: boolean }): Promise<{ page: Page; cdp: CDPSession; authenticatorId: string; errors: string[] }> {
    const context = await world.browser.newContext();
    // (A string: this runs in the page, whose globals the test's TypeScript does not know.)
    if (!options.autofill) await context.addInitScript("Object.defineProperty(PublicKeyCredential, 'isConditionalMediationAvailable', { value: async () => false })");
    const page = await context.newPage();
    const errors: string[] = [];
    page.on('pageerror', (err) => errors.push(err.message));
    page.on('console', (msg) => {
      // The browser asks for /favicon.ico, which there is none of.
      if (msg.type() === 'error' && !msg.location().url.endsWith('/favicon.ico')) errors.push(`${msg.text()} (${msg.location().url})`);
    });
    const cdp = await context.newCDPSession(page);
    await cdp.send('WebAuthn.enable');
    const { authenticatorId } = await cdp.send('WebAuthn.addVirtualAuthenticator', {
      options: { protocol: 'ctap2', transport: 'internal', hasResidentKey: true, hasUserVerification: true, isUserVerified: true },
    });
    return { page, cdp, authenticatorId, errors };
  }

  async function sessionAmr(): Promise<string[]> {
    const rows = await world.db.handle.db.selectFrom('sessions').select('amr').where('user_id', '=', userId).orderBy('id', 'desc').limit(1).execute();
    return rows[0]?.amr ?? [];
  }

  const signOut = (page: Page) => Promise.all([page.waitForURL((u) => u.pathname === '/login'), page.locator('header form[action="/logout"] button').click()]);

  it(
    'adds a passkey on the Account page, signs in with it and no password (the button, then autofill), and an ID token says so',
    async () => {
      const { page, cdp, authenticatorId, errors } = await pageWithAuthenticator({ autofill: false });

      // Signed in with the password, add a passkey.
      await page.goto(`${world.baseUrl}/login`);
      await enterPassword(page, EMAIL, PASSWORD);
      await Promise.all([page.waitForURL((u) => u.pathname === '/dashboard'), page.click('button[type="submit"]')]);
      await page.goto(`${world.baseUrl}/dashboard/account`);
      await page.fill('input[name="passkey_name"]', 'Virtual laptop');
      await page.getByRole('button', { name: /passkey/i }).click();
      // A first factor: its recovery codes are shown once, then the page goes on.
      await expect.poll(() => page.locator('ul.codes li').count(), { timeout: 15_000 }).toBe(10);
      await page.getByRole('link', { name: 'I saved them: continue' }).click();
      await expect.poll(() => page.locator('td[data-label="Name"]', { hasText: 'Virtual laptop' }).count(), { timeout: 15_000 }).toBe(1);
      await screenshot(page, 'passkeys-account');
      const { credentials } = await cdp.send('WebAuthn.getCredentials', { authenticatorId });
      expect(credentials).toHaveLength(1);
      const credential = credentials[0]!;
      expect(credential.isResidentCredential).toBe(true);
      const stored = await world.db.handle.db.selectFrom('passkeys').select(['credential_id', 'name']).where('user_id', '=', userId).execute();
      expect(stored).toEqual([{ credential_id: Buffer.from(credential.credentialId, 'base64').toString('base64url'), name: 'Virtual laptop' }]);

      // Signed out, back with the passkey alone: the button, nothing typed.
      await signOut(page);
      await page.goto(`${world.baseUrl}/login`);
      await Promise.all([page.waitForURL((u) => u.pathname === '/dashboard', { timeout: 15_000 }), page.getByRole('button', { name: 'Sign in with a passkey' }).click()]);
      expect(await sessionAmr()).toEqual(['hwk', 'user', 'mfa']);
      const { signCount } = (await cdp.send('WebAuthn.getCredentials', { authenticatorId })).credentials[0]!;
      const counter = await world.db.handle.db.selectFrom('passkeys').select('sign_count').where('user_id', '=', userId).executeTakeFirstOrThrow();
      expect(counter.sign_count).toBe(signCount);
      await signOut(page);
      expect(errors).toEqual([]);

      // Another browser holding the same passkey, with autofill: an application sends it to the
      // login page, and the passkey offered in the email field signs it in, no click, no password.
      const other = await pageWithAuthenticator({ autofill: true });
      await other.cdp.send('WebAuthn.addCredential', { authenticatorId: other.authenticatorId, credential: (await cdp.send('WebAuthn.getCredentials', { authenticatorId })).credentials[0]! });
      const oidc = await client.discovery(new URL(world.baseUrl), app.client_id, app.client_secret, undefined, { execute: [client.allowInsecureRequests] });
      const { url, checks } = await authorizationRequest(oidc, rp, 'openid email contacts.read');
      await Promise.all([other.page.waitForURL((u) => u.pathname === '/oauth/authorize' || u.origin === rp.origin, { timeout: 15_000 }), other.page.goto(url.href)]);
      expect(await sessionAmr()).toEqual(['hwk', 'user', 'mfa']);
      await Promise.all([other.page.waitForURL((u) => u.origin === rp.origin), other.page.click('button[name="decision"][value="approve"]')]);
      const tokens = await client.authorizationCodeGrant(oidc, await rp.waitFor('code'), { ...checks, idTokenExpected: true });
      const claims = tokens.claims()!;
      expect(claims.sub).toBe(String(userId));
      expect(claims.amr).toEqual(expect.arrayContaining(['hwk', 'mfa']));
      expect(other.errors).toEqual([]);
    },
    LONG_TEST_MS,
  );
});
