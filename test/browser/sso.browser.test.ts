/**
 * Single sign-on in Debian's Chromium (issue 25): a third-party application (openid-client, a
 * real callback server) sends the browser to orgauth; orgauth's email-first login page, given a
 * company address, sends it on to the company's OpenID provider (node-oidc-provider, its own
 * sign-in form); back at orgauth the user is signed in (provisioned just in time), the consent
 * page offers the company's organization, and the application gets a code whose ID token says
 * the user signed in through a federation (amr fed). And an existing account the provider does
 * not vouch for is connected only once its owner signed in to it with its password.
 *
 * orgauth runs on http://localhost:PORT and the provider on http://127.0.0.1:PORT: two sites, so
 * the return from the provider is a cross-site navigation, as with a real IdP, and the cookies
 * that bind the sign-in to the browser must survive it (SameSite=Lax).
 */
import * as client from 'openid-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { type ApplicationWithSecret, createApplication } from '../../src/oauth/models/applications.js';
import { createConnection } from '../../src/sso/connections.js';
import { addDomain, txtLookup, verifyDomain } from '../../src/sso/domains.js';
import { TEST_SECRET_KEY } from '../helpers/app.js';
import { startDnsServer, type TestDnsServer } from '../helpers/dns-server.js';
import { startUpstreamOidc, type UpstreamOidc } from '../helpers/upstream-oidc.js';
import { authorizationRequest, CallbackServer, enterPassword, HAS_CHROMIUM, screenshot, startWorld, type BrowserWorld } from './harness.js';

const EMAIL = 'alice@corp.example';
const ORG = 'Acme Corp';
const LONG_TEST_MS = 90_000;

describe.runIf(HAS_CHROMIUM)('single sign-on through a company OpenID provider in a real browser', () => {
  let world: BrowserWorld;
  let upstream: UpstreamOidc;
  let dns: TestDnsServer;
  let rp: CallbackServer;
  let app: ApplicationWithSecret;
  let oidc: client.Configuration;
  let orgId: number;
  let connectionId: number;

  beforeAll(async () => {
    [upstream, dns, rp] = await Promise.all([startUpstreamOidc(), startDnsServer(), CallbackServer.start()]);
    world = await startWorld({ DNS_SERVERS: dns.address, OUTBOUND_ALLOW_NETWORKS: '127.0.0.0/8' }, { hostname: 'localhost' });
    const db = world.db.handle.db;

    // The company: its domain proved through DNS, its provider connected (JIT, role member).
    const admin = await createUser(db, { email: 'admin@acme-admins.example', password: 'an admin password 123' });
    orgId = (await createOrganization(db, { name: ORG, ownerUserId: admin.id })).id;
    const domain = await addDomain(db, orgId, { domain: 'corp.example' });
    dns.setTxt(domain.verification.name, [domain.verification.value]);
    expect((await verifyDomain(db, txtLookup([dns.address]), orgId, 'corp.example')).state).toBe('verified');
    const connection = await createConnection(db, { issuer: world.baseUrl, secretKey: TEST_SECRET_KEY, allowHttp: true }, orgId, {
      protocol: 'oidc',
      name: 'Acme Login',
      issuer: upstream.issuer,
      client_id: 'orgauth-acme',
      client_secret: 'acme-upstream-secret-0123456789',
    });
    connectionId = connection.id;
    expect(connection.redirect_uri).toBe(`${world.baseUrl}/sso/${connectionId}/oidc/callback`);
    upstream.registerClient({ client_id: 'orgauth-acme', client_secret: 'acme-upstream-secret-0123456789', redirect_uris: [connection.redirect_uri!] });
    upstream.setAccount('alice', { sub: 'alice-at-acme', email: EMAIL, email_verified: true, name: 'Alice Acme' });

    // A vendor's application, which Acme's people use.
    const vendorOwner = await createUser(db, { email: 'owner@vendor.example', password: 'a vendor password 123' });
    const vendor = await createOrganization(db, { name: 'Vendor', ownerUserId: vendorOwner.id });
    app = await createApplication(db, { organizationId: vendor.id, type: 'public', name: 'Vendor App', redirectUris: [rp.callback], scopes: 'contacts.read', requirePkce: true });
    oidc = await client.discovery(new URL(world.baseUrl), app.client_id, app.client_secret, undefined, { execute: [client.allowInsecureRequests] });
  }, 60_000);
  afterAll(async () => {
    await world?.close();
    await Promise.all([upstream?.close(), dns?.close(), rp?.stop()]);
  });

  it(
    'email first, on to the company provider, back signed in, consent for the company organization, a code for the application',
    async () => {
      const page = await (await world.browser.newContext()).newPage();
      const request = await authorizationRequest(oidc, rp, 'openid profile email contacts.read');
      await page.goto(request.url.href);

      // orgauth's login page asks for the email only.
      expect(new URL(page.url()).pathname).toBe('/login');
      expect(await page.locator('input[name="password"]').count()).toBe(0);
      await page.fill('input[name="email"]', EMAIL);
      await screenshot(page, 'sso-email-step');
      await Promise.all([page.waitForURL((u) => u.origin === upstream.issuer), page.click('button[type="submit"]')]);

      // The company's provider, its own sign-in form.
      expect(await page.locator('h1').textContent()).toBe('Upstream identity provider');
      await page.fill('input[name="login"]', 'alice');
      await Promise.all([page.waitForURL((u) => u.origin === world.baseUrl && u.pathname === '/oauth/authorize'), page.click('button[type="submit"]')]);

      // Back at orgauth, signed in: the consent page offers Acme, where alice was just made a member.
      await screenshot(page, 'sso-consent');
      expect(await page.locator('h1').textContent()).toBe('Authorize Vendor App');
      expect(await page.locator('div.organization label').allTextContents()).toEqual([` ${ORG} (member)`]);
      expect(await page.isChecked(`input[name="organization_id"][value="${orgId}"]`)).toBe(true);
      expect(await page.locator('ul.scopes.requested li code').allTextContents()).toEqual(['openid', 'profile', 'email', 'contacts.read']);
      await Promise.all([page.waitForURL((u) => u.origin === rp.origin), page.click('button[name="decision"][value="approve"]')]);

      const tokens = await client.authorizationCodeGrant(oidc, await rp.waitFor('code'), { ...request.checks, idTokenExpected: true });
      const db = world.db.handle.db;
      const user = await db.selectFrom('users').select(['id', 'password_hash']).where('email', '=', EMAIL).executeTakeFirstOrThrow();
      expect(user.password_hash).toBeNull();
      expect(tokens).toMatchObject({ organization_id: orgId, organization_name: ORG });
      expect(tokens.claims()).toMatchObject({ sub: String(user.id), email: EMAIL, email_verified: true, name: 'Alice Acme', amr: ['fed', 'pwd', 'mfa'], organization_id: orgId, organization_name: ORG });
      expect(await db.selectFrom('sso_identities').select(['connection_id', 'issuer', 'subject']).where('user_id', '=', user.id).execute()).toEqual([
        { connection_id: connectionId, issuer: upstream.issuer, subject: 'alice-at-acme' },
      ]);
      await page.context().close();
    },
    LONG_TEST_MS,
  );

  it(
    'an existing account the provider does not vouch for: its owner signs in with the password once, then connects it',
    async () => {
      const db = world.db.handle.db;
      const bob = await createUser(db, { email: 'bob@corp.example', password: 'bob local password 1' });
      upstream.setAccount('bob', { sub: 'bob-at-acme', email: 'bob@corp.example', email_verified: false });
      const page = await (await world.browser.newContext()).newPage();
      await page.goto(`${world.baseUrl}/login`);
      await page.fill('input[name="email"]', 'bob@corp.example');
      await Promise.all([page.waitForURL((u) => u.origin === upstream.issuer), page.click('button[type="submit"]')]);
      await page.fill('input[name="login"]', 'bob');
      await Promise.all([page.waitForURL((u) => u.origin === world.baseUrl && u.pathname === '/sso/link'), page.click('button[type="submit"]')]);
      await screenshot(page, 'sso-link-proof');
      expect(await page.locator('h1').textContent()).toBe('Connect your company sign-in');
      expect(await db.selectFrom('sso_identities').select('id').where('user_id', '=', bob.id).execute()).toEqual([]);

      // The proof: bob's password, on the password step the link leads to.
      await Promise.all([page.waitForURL((u) => u.pathname === '/login'), page.click('a.button')]);
      expect(await page.inputValue('input[name="email"]')).toBe('bob@corp.example');
      await page.fill('input[name="password"]', 'bob local password 1');
      await Promise.all([page.waitForURL((u) => u.pathname === '/sso/link'), page.click('button[type="submit"]')]);
      await Promise.all([page.waitForURL((u) => u.pathname === '/dashboard'), page.click('button[type="submit"]')]);

      expect(await db.selectFrom('sso_identities').select(['connection_id', 'subject']).where('user_id', '=', bob.id).execute()).toEqual([{ connection_id: connectionId, subject: 'bob-at-acme' }]);
      expect(await db.selectFrom('memberships').select('role').where('organization_id', '=', orgId).where('user_id', '=', bob.id).execute()).toEqual([{ role: 'member' }]);
      expect(await db.selectFrom('sessions').select(['amr', 'sso_connection_id']).where('user_id', '=', bob.id).execute()).toEqual([{ amr: ['fed', 'pwd', 'mfa'], sso_connection_id: connectionId }]);
      await page.context().close();
    },
    LONG_TEST_MS,
  );

  it(
    'the owner manages it on the dashboard: the connection with its redirect URI, a new domain with the TXT record to publish, verified',
    async () => {
      const page = await (await world.browser.newContext()).newPage();
      await page.goto(`${world.baseUrl}/login?method=password`);
      await enterPassword(page, 'admin@acme-admins.example', 'an admin password 123');
      await Promise.all([page.waitForURL((u) => u.pathname === '/dashboard'), page.click('button[type="submit"]')]);
      await page.click('nav[aria-label="Dashboard"] a:has-text("Single sign-on")');
      expect(new URL(page.url()).pathname).toBe('/dashboard/sso');
      expect(await page.locator('body').textContent()).toContain(`${world.baseUrl}/sso/${connectionId}/oidc/callback`);

      await page.fill('input[name="domain"]', 'acme-subsidiary.example');
      await Promise.all([page.waitForLoadState('load'), page.click('form[action$="/domains"] button[type="submit"]')]);
      const body = (await page.locator('body').textContent()) ?? '';
      expect(body).toContain('_orgauth-challenge.acme-subsidiary.example');
      const token = /orgauth-domain-verification=[A-Za-z0-9_-]+/.exec(body)?.[0];
      expect(token).toBeDefined();
      await screenshot(page, 'sso-dashboard');

      dns.setTxt('_orgauth-challenge.acme-subsidiary.example', [token!]);
      await Promise.all([page.waitForLoadState('load'), page.click('form[action$="/domains/acme-subsidiary.example/verify"] button')]);
      const db = world.db.handle.db;
      expect(await db.selectFrom('sso_domains').select('state').where('domain', '=', 'acme-subsidiary.example').execute()).toEqual([{ state: 'verified' }]);
      await page.context().close();
    },
    LONG_TEST_MS,
  );
});
