/**
 * The dashboard's five scenarios in Debian's Chromium, as a user would go through them.
 * With SCREENSHOTS=1, screenshots of each page land in test-results/screenshots (git-ignored).
 */
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { basic, form } from '../helpers/oauth.js';
import { CallbackServer, HAS_CHROMIUM, screenshot, signUpThroughOutbox, startWorld, type BrowserWorld, enterPassword } from './harness.js';

const PASSWORD = 'a long dashboard password';

describe.runIf(HAS_CHROMIUM)('the dashboard in a real browser', () => {
  let world: BrowserWorld;
  let page: Page;
  let orgId: number;
  let privateApp: { clientId: string; secret: string };
  let publicApp: { clientId: string; secret: string };
  let userToken: string;
  /** The public application's callback: a real listener, so the browser's redirect ends in a page that loads. */
  let rp: CallbackServer;

  beforeAll(async () => {
    world = await startWorld();
    rp = await CallbackServer.start();
    page = await world.browser.newPage({ viewport: { width: 1280, height: 800 } });
  }, 60_000);
  afterAll(async () => {
    await rp?.stop();
    await world?.close();
  });

  const api = (token: string) =>
    fetch(`${world.baseUrl}/api/v1/${orgId}/contacts`, { headers: { authorization: `Bearer ${token}`, accept: 'application/json' } });
  const tokenRequest = (clientId: string, secret: string, fields: Record<string, string>) =>
    fetch(`${world.baseUrl}/oauth/token`, {
      method: 'POST',
      headers: { authorization: basic(clientId, secret), 'content-type': 'application/x-www-form-urlencoded' },
      body: form(fields),
    });

  it('1. sign up → create a private application → Generate Token → the API answers 200', async () => {
    await signUpThroughOutbox(page, world.baseUrl, { email: 'owner@dashboard.example.com', name: 'Dana Owner', password: PASSWORD, organizationName: 'Dashboard Org' });
    expect(new URL(page.url()).pathname).toBe('/dashboard');
    orgId = (await world.db.handle.db.selectFrom('organizations').select('id').where('name', '=', 'Dashboard Org').executeTakeFirstOrThrow()).id;

    await page.goto(`${world.baseUrl}/dashboard/applications`);
    await screenshot(page, 'applications');
    // The first run: the empty list says what applications are for and how to add one.
    expect(await page.locator('[data-empty="applications"]').textContent()).toContain('No applications yet.');
    const privateForm = page.locator('form', { has: page.locator('button', { hasText: 'Create private application' }) });
    await privateForm.locator('input[name="name"]').fill('Nightly Sync');
    await Promise.all([page.waitForLoadState('load'), privateForm.locator('button', { hasText: 'Create private application' }).click()]);
    privateApp = { clientId: (await page.locator('#client-id').textContent())!.trim(), secret: await page.locator('#client-secret').inputValue() };
    expect(privateApp.secret).toMatch(/^[A-Za-z0-9_-]{43}$/);
    await screenshot(page, 'application-created-secret-shown-once');
    // Shown once: the application page itself never shows it again.
    await page.goto(`${world.baseUrl}/dashboard/applications/${privateApp.clientId}`);
    expect(await page.locator('#client-secret').count()).toBe(0);
    expect(await page.content()).not.toContain(privateApp.secret);

    await Promise.all([page.waitForLoadState('load'), page.locator('button', { hasText: 'Generate Token' }).click()]);
    const token = (await page.locator('#access-token').inputValue()).trim();
    await screenshot(page, 'generate-token');
    expect((await api(token)).status).toBe(200);
  });

  it('2. create a public application → authorize it in the browser → exchange the code → the API answers 200', async () => {
    await page.goto(`${world.baseUrl}/dashboard/applications`);
    const publicForm = page.locator('form', { has: page.locator('button', { hasText: /^Create application$/ }) });
    await publicForm.locator('input[name="name"]').fill('Partner Web App');
    await publicForm.locator('textarea[name="redirect_uris"]').fill(rp.callback);
    await Promise.all([page.waitForLoadState('load'), publicForm.locator('button', { hasText: /^Create application$/ }).click()]);
    publicApp = { clientId: (await page.locator('#client-id').textContent())!.trim(), secret: await page.locator('#client-secret').inputValue() };

    const state = 'dashboard-browser-state-0123456';
    await page.goto(
      `${world.baseUrl}/oauth/authorize?${new URLSearchParams({ client_id: publicApp.clientId, redirect_uri: rp.callback, response_type: 'code', scope: 'contacts.read', state })}`,
    );
    await screenshot(page, 'consent-dashboard-app');
    // Until the browser has loaded the callback: a navigation still under way would cut the next test's short.
    await Promise.all([page.waitForURL((url) => url.href.startsWith(`${rp.callback}?`)), page.click('button[name="decision"][value="approve"]')]);
    const callback = new URL(page.url());
    expect(callback.searchParams.get('state')).toBe(state);
    const res = await tokenRequest(publicApp.clientId, publicApp.secret, { grant_type: 'authorization_code', code: callback.searchParams.get('code')!, redirect_uri: rp.callback });
    expect(res.status).toBe(200);
    const body = (await res.json()) as { access_token: string; organization_id: number };
    expect(body.organization_id).toBe(orgId);
    userToken = body.access_token;
    expect((await api(userToken)).status).toBe(200);
  });

  it('3. revoke it under Connected apps → the API answers 401', async () => {
    await page.goto(`${world.baseUrl}/dashboard/connected-apps`);
    await screenshot(page, 'connected-apps');
    const row = page.locator('tr', { hasText: 'Partner Web App' });
    // Asked first: the confirmation page names the application, and nothing is revoked yet.
    await Promise.all([page.waitForLoadState('load'), row.locator('button', { hasText: 'Revoke' }).click()]);
    await screenshot(page, 'connected-app-revoke-confirmation');
    expect(await page.locator('h1').textContent()).toBe('Revoke Partner Web App?');
    expect((await api(userToken)).status).toBe(200);
    await Promise.all([page.waitForURL(/\/dashboard\/connected-apps$/), page.locator('button', { hasText: 'Revoke Partner Web App' }).click()]);
    await screenshot(page, 'connected-app-revoked');
    expect(await page.locator('p.notice').textContent()).toBe('Revoked Partner Web App’s access, given by you: its tokens stopped working.');
    expect((await api(userToken)).status).toBe(401);
  });

  it('4. rotate a secret → the old one gets invalid_client', async () => {
    await page.goto(`${world.baseUrl}/dashboard/applications/${privateApp.clientId}`);
    await Promise.all([page.waitForLoadState('load'), page.locator('button', { hasText: 'Rotate secret' }).click()]);
    expect(await page.locator('h1').textContent()).toBe('Rotate the client secret of Nightly Sync?');
    await Promise.all([page.waitForLoadState('load'), page.locator('button', { hasText: 'Rotate the secret' }).click()]);
    const fresh = await page.locator('#client-secret').inputValue();
    expect(fresh).not.toBe(privateApp.secret);
    const fields = { grant_type: 'client_credentials', organization_id: String(orgId) };
    const old = await tokenRequest(privateApp.clientId, privateApp.secret, fields);
    expect(old.status).toBe(401);
    expect(((await old.json()) as { error: string }).error).toBe('invalid_client');
    expect((await tokenRequest(privateApp.clientId, fresh, fields)).status).toBe(200);
  });

  it('5. a member (not an admin) cannot create an application', async () => {
    const member = await createUser(world.db.handle.db, { email: 'member@dashboard.example.com', password: PASSWORD, name: 'Mo Member' });
    await addMember(world.db.handle.db, { organizationId: orgId, userId: member.id, role: 'member' });
    await page.goto(`${world.baseUrl}/dashboard/members`);
    await screenshot(page, 'members');
    // The same pages at phone width: nothing may need horizontal scrolling of the page itself.
    await page.setViewportSize({ width: 390, height: 844 });
    for (const [path, name] of [['/dashboard/applications', 'applications-phone'], [`/dashboard/applications/${privateApp.clientId}`, 'application-phone'], ['/dashboard/members', 'members-phone']]) {
      await page.goto(`${world.baseUrl}${path}`);
      await screenshot(page, name!);
      expect(await page.evaluate('document.documentElement.scrollWidth')).toBeLessThanOrEqual(390);
    }
    await page.setViewportSize({ width: 1280, height: 800 });

    const context = await world.browser.newContext();
    const memberPage = await context.newPage();
    await memberPage.goto(`${world.baseUrl}/login`);
    await enterPassword(memberPage, 'member@dashboard.example.com', PASSWORD);
    await Promise.all([memberPage.waitForURL(/\/dashboard/), memberPage.click('button[type="submit"]')]);
    await memberPage.goto(`${world.baseUrl}/dashboard/applications`);
    await screenshot(memberPage, 'applications-as-member');
    expect(await memberPage.locator('button', { hasText: /Create (private )?application/ }).count()).toBe(0);
    // Posting the form anyway, with a valid CSRF token of the member's session, is refused.
    await memberPage.goto(`${world.baseUrl}/dashboard/account`);
    const csrf = await memberPage.locator('input[name="csrf_token"]').first().inputValue({ timeout: 5000 });
    const forced = await memberPage.request.post(`${world.baseUrl}/dashboard/applications`, {
      form: { csrf_token: csrf, type: 'private', name: 'Sneaky', scope: 'contacts.read' },
      maxRedirects: 0,
    });
    expect(forced.status()).toBe(403);
    const apps = await world.db.handle.db.selectFrom('applications').select('name').where('organization_id', '=', orgId).execute();
    expect(apps.map((a) => a.name)).not.toContain('Sneaky');
    await context.close();
  });
});
