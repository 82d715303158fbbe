/**
 * OpenID Connect in Debian's Chromium (issue 16): openid-client, configured from
 * /.well-known/openid-configuration, sends a real browser through the login and consent pages;
 * the browser lands on the relying party's callback (a real HTTP server on a loopback port), the
 * relying party redeems the code and validates the ID token, reads userinfo, refreshes, and the
 * browser is signed out through the end-session endpoint and lands on the registered
 * post-logout URI. Then prompt=none for a signed-out browser is login_required, and max_age=0
 * brings the login page back for a signed-in one.
 */
import * as client from 'openid-client';
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { type ApplicationWithSecret, createApplication } from '../../src/oauth/models/applications.js';
import { authorizationRequest as openIdRequest, CallbackServer, HAS_CHROMIUM, screenshot, startWorld, type BrowserWorld, enterPassword } from './harness.js';

const PASSWORD = 'a long openid password';
const EMAIL = 'grace@oidc.example.com';
const ORG = 'OIDC Org';
const LONG_TEST_MS = 90_000;

describe.runIf(HAS_CHROMIUM)('OpenID Connect in a real browser', () => {
  let world: BrowserWorld;
  let rp: CallbackServer;
  let app: ApplicationWithSecret;
  let oidc: client.Configuration;
  let orgId: number;
  let userId: number;

  beforeAll(async () => {
    world = await startWorld();
    rp = await CallbackServer.start();
    const db = world.db.handle.db;
    const user = await createUser(db, { email: EMAIL, password: PASSWORD, name: 'Grace Hopper' });
    userId = user.id;
    orgId = (await createOrganization(db, { name: ORG, ownerUserId: user.id })).id;
    app = await createApplication(db, {
      organizationId: orgId,
      type: 'public',
      name: 'OIDC Relying Party',
      redirectUris: [rp.callback],
      postLogoutRedirectUris: [`${rp.origin}/signed-out`],
      scopes: 'contacts.read',
      requirePkce: true,
    });
    oidc = await client.discovery(new URL(world.baseUrl), app.client_id, app.client_secret, undefined, { execute: [client.allowInsecureRequests] });
  }, 60_000);
  afterAll(async () => {
    await world?.close();
    await rp?.stop();
  });

  const authorizationRequest = (extra: Record<string, string> = {}) => openIdRequest(oidc, rp, 'openid profile email contacts.read', extra);

  async function signInHere(page: Page): Promise<void> {
    expect(new URL(page.url()).pathname).toBe('/login');
    await enterPassword(page, undefined, PASSWORD);
    await Promise.all([page.waitForURL((u) => u.pathname !== '/login'), page.click('button[type="submit"]')]);
  }

  it(
    'signs in, validates the ID token, reads userinfo, refreshes, and signs out through the end-session endpoint',
    async () => {
      const page = await (await world.browser.newContext()).newPage();
      const first = await authorizationRequest({ login_hint: EMAIL });
      await page.goto(first.url.href);
      // login_hint filled the email in; only the password is typed.
      expect(await page.inputValue('input[name="email"]')).toBe(EMAIL);
      await signInHere(page);
      await screenshot(page, 'oidc-consent');
      expect(await page.locator('ul.scopes.requested li code').allTextContents()).toEqual(['openid', 'profile', 'email', 'contacts.read']);
      await Promise.all([page.waitForURL((u) => u.origin === rp.origin), page.click('button[name="decision"][value="approve"]')]);
      const tokens = await client.authorizationCodeGrant(oidc, await rp.waitFor('code'), { ...first.checks, idTokenExpected: true });
      const claims = tokens.claims()!;
      expect(claims).toMatchObject({ sub: String(userId), email: EMAIL, email_verified: true, name: 'Grace Hopper', organization_id: orgId, organization_name: ORG, nonce: first.checks.expectedNonce });
      expect(await client.fetchUserInfo(oidc, tokens.access_token, claims.sub)).toMatchObject({ sub: String(userId), email: EMAIL, organization_id: orgId, organization_name: ORG });
      const refreshed = await client.refreshTokenGrant(oidc, tokens.refresh_token!);
      expect(refreshed.claims()).toMatchObject({ sub: claims.sub, auth_time: claims.auth_time });

      // A second authorization: remembered consent, no page at all; max_age=0 shows the login page again.
      const again = await authorizationRequest({ max_age: '0' });
      await page.goto(again.url.href);
      expect(await page.inputValue('input[name="email"]')).toBe(EMAIL);
      await signInHere(page);
      await page.waitForURL((u) => u.origin === rp.origin);
      const second = await client.authorizationCodeGrant(oidc, await rp.waitFor('code'), { ...again.checks, maxAge: 0, idTokenExpected: true });
      expect(second.claims()!.auth_time).toBeGreaterThanOrEqual(claims.auth_time!);

      // Signing out: the hint names the signed-in user, so no question; back to the registered URI with state.
      const state = client.randomState();
      await page.goto(client.buildEndSessionUrl(oidc, { id_token_hint: second.id_token!, post_logout_redirect_uri: `${rp.origin}/signed-out`, state }).href);
      await page.waitForURL((u) => u.origin === rp.origin && u.pathname === '/signed-out');
      expect(new URL(page.url()).searchParams.get('state')).toBe(state);
      // Signed out: prompt=none is login_required, delivered to the callback.
      const silent = await authorizationRequest({ prompt: 'none' });
      await page.goto(silent.url.href);
      await page.waitForURL((u) => u.origin === rp.origin && u.searchParams.has('error'));
      await expect(client.authorizationCodeGrant(oidc, new URL(page.url()), silent.checks)).rejects.toMatchObject({ error: 'login_required' });
      await page.goto(`${world.baseUrl}/dashboard`);
      expect(new URL(page.url()).pathname).toBe('/login');
    },
    LONG_TEST_MS,
  );
});
