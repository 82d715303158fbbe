/**
 * Social sign-in in Debian's Chromium (issue 45): a third-party application (openid-client, a real
 * callback server) sends the browser to orgauth; "Continue with Google" on the sign-in page goes to
 * the provider (node-oidc-provider standing in for Google, its own sign-in form), back at orgauth
 * the person has an account and lands on the consent page, and the application's ID token says
 * amr fed. An existing account is connected only after its password; the Account page removes a
 * connected account. Each page on the way is audited with axe-core at two widths.
 *
 * orgauth runs on http://localhost:PORT and the provider on http://127.0.0.1:PORT: two sites, so
 * the return from the provider is a cross-site navigation, as with Google.
 */
import * as client from 'openid-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { type ApplicationWithSecret, createApplication } from '../../src/oauth/models/applications.js';
import { createSocialConnection } from '../../src/social/connections.js';
import { TEST_SECRET_KEY } from '../helpers/app.js';
import { startUpstreamOidc, type UpstreamOidc } from '../helpers/upstream-oidc.js';
import { audit, expectNoProblems } from './accessibility.js';
import { authorizationRequest, CallbackServer, HAS_CHROMIUM, screenshot, startWorld, type BrowserWorld } from './harness.js';

const LONG_TEST_MS = 90_000;

describe.runIf(HAS_CHROMIUM)('social sign-in through a Google-like OpenID provider in a real browser', () => {
  let world: BrowserWorld;
  let upstream: UpstreamOidc;
  let rp: CallbackServer;
  let app: ApplicationWithSecret;
  let oidc: client.Configuration;
  let connectionId: number;

  beforeAll(async () => {
    [upstream, rp] = await Promise.all([startUpstreamOidc(), CallbackServer.start()]);
    world = await startWorld({ OUTBOUND_ALLOW_NETWORKS: '127.0.0.0/8' }, { hostname: 'localhost' });
    const db = world.db.handle.db;
    const connection = await createSocialConnection(db, { issuer: world.baseUrl, secretKey: TEST_SECRET_KEY, allowHttp: true }, {
      provider: 'google',
      issuer: upstream.issuer,
      client_id: 'orgauth-google',
      client_secret: 'google-upstream-secret-0123456789',
    });
    connectionId = connection.id;
    expect(connection.redirect_uri).toBe(`${world.baseUrl}/social/${connectionId}/callback`);
    upstream.registerClient({ client_id: 'orgauth-google', client_secret: 'google-upstream-secret-0123456789', redirect_uris: [connection.redirect_uri] });
    const vendorOwner = await createUser(db, { email: 'owner@social-vendor.example', password: 'a vendor password 123' });
    const vendor = await createOrganization(db, { name: 'Vendor', ownerUserId: vendorOwner.id });
    app = await createApplication(db, { organizationId: vendor.id, type: 'public', name: 'Vendor App', redirectUris: [rp.callback], scopes: 'contacts.read', requirePkce: true });
    oidc = await client.discovery(new URL(world.baseUrl), app.client_id, app.client_secret, undefined, { execute: [client.allowInsecureRequests] });
  }, 60_000);
  afterAll(async () => {
    await world?.close();
    await Promise.all([upstream?.close(), rp?.stop()]);
  });

  it(
    '"Continue with Google" → the provider’s sign-in → back with an account of one’s own → consent → a code whose ID token says amr fed',
    async () => {
      upstream.setAccount('grace', { sub: 'google-grace', email: 'grace@gmail.example', email_verified: true, name: 'Grace Hopper' });
      const page = await (await world.browser.newContext()).newPage();
      const request = await authorizationRequest(oidc, rp, 'openid profile email contacts.read');
      await page.goto(request.url.href);
      expect(new URL(page.url()).pathname).toBe('/login');
      const button = page.locator('button:has-text("Continue with Google")');
      expect(await button.count()).toBe(1);
      expectNoProblems(await audit(page, 'login-with-social'));
      await Promise.all([page.waitForURL((u) => u.origin === upstream.issuer), button.click()]);

      await page.fill('input[name="login"]', 'grace');
      await Promise.all([page.waitForURL((u) => u.origin === world.baseUrl && u.pathname === '/oauth/authorize'), page.click('button[type="submit"]')]);
      await screenshot(page, 'social-consent');
      expect(await page.locator('h1').textContent()).toBe('Authorize Vendor App');
      expect(await page.locator('div.organization label').allTextContents()).toEqual([' Grace Hopper’s organization (owner)']);
      await Promise.all([page.waitForURL((u) => u.origin === rp.origin), page.click('button[name="decision"][value="approve"]')]);

      const tokens = await client.authorizationCodeGrant(oidc, await rp.waitFor('code'), { ...request.checks, idTokenExpected: true });
      const db = world.db.handle.db;
      const user = await db.selectFrom('users').select(['id', 'password_hash']).where('email', '=', 'grace@gmail.example').executeTakeFirstOrThrow();
      expect(user.password_hash).toBeNull();
      expect(tokens.claims()).toMatchObject({ sub: String(user.id), email: 'grace@gmail.example', email_verified: true, name: 'Grace Hopper', amr: ['fed'] });
      await page.context().close();
    },
    LONG_TEST_MS,
  );

  it(
    'an existing account: "prove it’s you" with its password, then connect; the Account page lists it and removes it',
    async () => {
      const db = world.db.handle.db;
      const ada = await createUser(db, { email: 'ada@gmail.example', password: 'ada local password 1', name: 'Ada' });
      upstream.setAccount('ada', { sub: 'google-ada', email: 'ada@gmail.example', email_verified: true });
      const page = await (await world.browser.newContext()).newPage();
      await page.goto(`${world.baseUrl}/login`);
      await Promise.all([page.waitForURL((u) => u.origin === upstream.issuer), page.click('button:has-text("Continue with Google")')]);
      await page.fill('input[name="login"]', 'ada');
      await Promise.all([page.waitForURL((u) => u.origin === world.baseUrl && u.pathname === '/social/link'), page.click('button[type="submit"]')]);
      expect(await page.locator('h1').textContent()).toBe('Connect your Google sign-in');
      expectNoProblems(await audit(page, 'social-link-proof'));
      expect(await db.selectFrom('social_identities').select('id').where('user_id', '=', ada.id).execute()).toEqual([]);

      await Promise.all([page.waitForURL((u) => u.pathname === '/login'), page.click('a.button')]);
      expect(await page.inputValue('input[name="email"]')).toBe('ada@gmail.example');
      await page.fill('input[name="password"]', 'ada local password 1');
      await Promise.all([page.waitForURL((u) => u.pathname === '/social/link'), page.click('form[action="/login"] button[type="submit"]')]);
      expectNoProblems(await audit(page, 'social-link-confirm'));
      await Promise.all([page.waitForURL((u) => u.pathname === '/dashboard'), page.click('form[action="/social/link"] button[type="submit"]')]);
      expect(await db.selectFrom('social_identities').select(['connection_id', 'subject']).where('user_id', '=', ada.id).execute()).toEqual([{ connection_id: connectionId, subject: 'google-ada' }]);

      await page.goto(`${world.baseUrl}/dashboard/account`);
      expect(await page.locator('h2:has-text("Connected accounts")').count()).toBe(1);
      expectNoProblems(await audit(page, 'account-connected'));
      await Promise.all([page.waitForLoadState('load'), page.click('button:has-text("Remove Google")')]);
      expect(await page.locator('p.notice').textContent()).toBe('That account can no longer sign you in.');
      expect(await db.selectFrom('social_identities').select('id').where('user_id', '=', ada.id).execute()).toEqual([]);
      await page.context().close();
    },
    LONG_TEST_MS,
  );
});
