/**
 * Organization roles (issue 15) in Debian's Chromium: what a role lets a member grant an
 * application at consent, and the dashboard's Roles page. The client's redirect URI is a real
 * HTTP server on a loopback port: the browser really lands there, and the test reads the code
 * from the request it received. With SCREENSHOTS=1, screenshots land in test-results/screenshots.
 */
import { createHash, randomBytes } from 'node:crypto';
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember, createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { type ApplicationWithSecret, createApplication } from '../../src/oauth/models/applications.js';
import { basic, form } from '../helpers/oauth.js';
import { CallbackServer, HAS_CHROMIUM, screenshot, startWorld, type BrowserWorld, enterPassword } from './harness.js';
import { finishJobs } from '../helpers/jobs.js';

const PASSWORD = 'a long roles password';
const OWNER = 'owner@roles.example.com';
const VIEWER = 'viewer@roles.example.com';
const MEMBER = 'member@roles.example.com';
const ORG = 'Roles Org';
/** Each test signs in (argon2) and loads several pages. */
const LONG_TEST_MS = 60_000;

function pkcePair(): { verifier: string; challenge: string } {
  const verifier = randomBytes(32).toString('base64url');
  return { verifier, challenge: createHash('sha256').update(verifier).digest('base64url') };
}

describe.runIf(HAS_CHROMIUM)('organization roles in a real browser', () => {
  let world: BrowserWorld;
  let client: CallbackServer;
  let orgId: number;
  let memberId: number;
  let app: ApplicationWithSecret;

  beforeAll(async () => {
    world = await startWorld();
    client = await CallbackServer.start();
    const db = world.db.handle.db;
    const owner = await createUser(db, { email: OWNER, password: PASSWORD, name: 'Olga Owner' });
    const viewer = await createUser(db, { email: VIEWER, password: PASSWORD, name: 'Vic Viewer' });
    const member = await createUser(db, { email: MEMBER, password: PASSWORD, name: 'Mona Member' });
    memberId = member.id;
    orgId = (await createOrganization(db, { name: ORG, ownerUserId: owner.id })).id;
    // The viewer's only organization.
    await addMember(db, { organizationId: orgId, userId: viewer.id, role: 'viewer' });
    await addMember(db, { organizationId: orgId, userId: member.id, role: 'member' });
    app = await createApplication(db, {
      organizationId: orgId,
      type: 'public',
      name: 'Roles Client',
      redirectUris: [client.callback],
      scopes: 'contacts.read contacts.write tasks.read tasks.write',
      requirePkce: true,
    });
  }, 60_000);
  afterAll(async () => {
    await world?.close();
    await client?.stop();
  });

  /** A page in a browser context of its own: its own cookies, so its own session. */
  async function freshPage(): Promise<Page> {
    const context = await world.browser.newContext({ viewport: { width: 1280, height: 800 } });
    return context.newPage();
  }

  async function signIn(page: Page, email: string): Promise<void> {
    await page.goto(`${world.baseUrl}/login`);
    await enterPassword(page, email, PASSWORD);
    await Promise.all([page.waitForURL(/\/dashboard$/), page.click('button[type="submit"]')]);
  }

  /** Opens the authorization request signed out, and signs in on the real login page it leads to. */
  async function authorizeSigningIn(page: Page, params: Record<string, string>, email: string, landing: (url: URL) => boolean): Promise<void> {
    await page.goto(`${world.baseUrl}/oauth/authorize?${new URLSearchParams({ client_id: app.client_id, redirect_uri: client.callback, response_type: 'code', ...params })}`);
    expect(new URL(page.url()).pathname).toBe('/login');
    await enterPassword(page, email, PASSWORD);
    await Promise.all([page.waitForURL(landing), page.click('button[type="submit"]')]);
  }

  const scopeNames = (page: Page, list: 'granted' | 'refused') =>
    page.locator(`div.organization[data-organization-id="${orgId}"] ul.scopes.${list} li code`).allTextContents();

  it('1. a viewer authorizes contacts.read contacts.write → consent grants contacts.read only → the token reads contacts and may not write them', async () => {
    const page = await freshPage();
    const { verifier, challenge } = pkcePair();
    const state = 'state-of-the-roles-browser-test-1';
    await authorizeSigningIn(
      page,
      { scope: 'contacts.read contacts.write', state, code_challenge: challenge, code_challenge_method: 'S256' },
      VIEWER,
      (url) => url.pathname === '/oauth/authorize',
    );
    await screenshot(page, 'roles-consent-viewer');
    expect(await page.locator('h1').textContent()).toBe('Authorize Roles Client');
    expect(await scopeNames(page, 'granted')).toEqual(['contacts.read']);
    expect(await scopeNames(page, 'refused')).toEqual(['contacts.write']);
    // Asked for, listed at the top, whatever the role.
    expect(await page.locator('ul.scopes.requested li code').allTextContents()).toEqual(['contacts.read', 'contacts.write']);
    const radio = page.locator(`input[type="radio"][name="organization_id"][value="${orgId}"]`);
    expect(await radio.isDisabled()).toBe(false);
    expect(await radio.isChecked()).toBe(true);
    expect(await page.locator(`div.organization[data-organization-id="${orgId}"] label`).textContent()).toContain(`${ORG} (viewer)`);

    await Promise.all([page.waitForURL((url) => url.origin === client.origin), page.click('button[name="decision"][value="approve"]')]);
    const callback = await client.waitFor('code');
    expect(callback.searchParams.get('state')).toBe(state);
    expect(callback.searchParams.get('iss')).toBe(world.baseUrl);
    expect(callback.searchParams.get('error')).toBeNull();

    const tokenRes = await fetch(`${world.baseUrl}/oauth/token`, {
      method: 'POST',
      headers: { authorization: basic(app.client_id, app.client_secret), 'content-type': 'application/x-www-form-urlencoded' },
      body: form({ grant_type: 'authorization_code', code: callback.searchParams.get('code')!, redirect_uri: client.callback, code_verifier: verifier }),
    });
    expect(tokenRes.status).toBe(200);
    const tokens = (await tokenRes.json()) as { access_token: string; scope: string; organization_id: number };
    expect(tokens.scope).toBe('contacts.read');
    expect(tokens.organization_id).toBe(orgId);

    const auth = { authorization: `Bearer ${tokens.access_token}`, accept: 'application/json' };
    const list = await fetch(`${world.baseUrl}/api/v1/${orgId}/contacts`, { headers: auth });
    expect(list.status).toBe(200);
    const create = await fetch(`${world.baseUrl}/api/v1/${orgId}/contacts`, {
      method: 'POST',
      headers: { ...auth, 'content-type': 'application/json' },
      body: JSON.stringify({ name: 'x' }),
    });
    expect(create.status).toBe(403);
    expect(create.headers.get('www-authenticate')).toContain('error="insufficient_scope"');
    // Nothing was written.
    const contacts = await world.db.handle.db.selectFrom('contacts').select('id').where('organization_id', '=', orgId).execute();
    expect(contacts).toEqual([]);
    await page.context().close();
  }, LONG_TEST_MS);

  it('2. a viewer whose role allows nothing the application asks for (tasks.write) is sent back with error=access_denied and the state', async () => {
    const page = await freshPage();
    const state = 'state-of-the-roles-browser-test-2';
    const before = client.received.length;
    await authorizeSigningIn(
      page,
      { scope: 'tasks.write', state, code_challenge: pkcePair().challenge, code_challenge_method: 'S256' },
      VIEWER,
      (url) => url.origin === client.origin,
    );
    await screenshot(page, 'roles-access-denied');
    const callback = new URL(page.url());
    expect(`${callback.origin}${callback.pathname}`).toBe(client.callback);
    expect(callback.searchParams.get('error')).toBe('access_denied');
    expect(callback.searchParams.get('state')).toBe(state);
    expect(callback.searchParams.get('iss')).toBe(world.baseUrl);
    expect(callback.searchParams.get('code')).toBeNull();
    // The client's server got that very redirect, and no code (its other requests: the favicon).
    const received = client.received.slice(before).filter((u) => u.pathname === '/callback');
    expect(received.map((u) => u.searchParams.get('error'))).toEqual(['access_denied']);
    expect(received.every((u) => !u.searchParams.has('code'))).toBe(true);
    await page.context().close();
  }, LONG_TEST_MS);

  it('3. an owner creates the custom role Sales, gives it to a member, then deletes it moving its members to viewer', async () => {
    const db = world.db.handle.db;
    const page = await freshPage();
    await signIn(page, OWNER);

    await page.goto(`${world.baseUrl}/dashboard/roles`);
    await screenshot(page, 'roles-page');
    expect(await page.locator('table.roles tr[data-role]').evaluateAll((rows) => rows.map((r) => r.getAttribute('data-role')))).toEqual([
      'owner',
      'admin',
      'member',
      'viewer',
    ]);
    expect(await page.locator('tr[data-role="viewer"] td[data-label="Permissions"]').textContent()).toBe('contacts.read tasks.read');
    const create = page.locator('form[action="/dashboard/roles"]');
    await create.locator('input[name="name"]').fill('Sales');
    await create.locator('input[name="description"]').fill('Works the contacts');
    await create.locator('input[name="scopes"][value="contacts.read"]').check();
    await create.locator('input[name="scopes"][value="contacts.write"]').check();
    await Promise.all([page.waitForLoadState('load'), create.locator('button', { hasText: 'Create role' }).click()]);
    await screenshot(page, 'roles-sales-created');
    expect(await page.locator('p.notice').textContent()).toBe('Role Sales created.');
    const sales = page.locator('table.roles tr[data-role="Sales"]');
    expect(await sales.count()).toBe(1);
    expect(await sales.locator('td[data-label="Permissions"]').textContent()).toBe('contacts.read contacts.write');
    expect(await sales.locator('td[data-label="Description"]').textContent()).toBe('Works the contacts');
    const role = await db.selectFrom('roles').select(['id', 'permissions']).where('organization_id', '=', orgId).where('name', '=', 'Sales').executeTakeFirstOrThrow();
    expect([...role.permissions].sort()).toEqual(['contacts.read', 'contacts.write']);

    await page.goto(`${world.baseUrl}/dashboard/members`);
    const memberRow = () => page.locator('tr', { hasText: MEMBER });
    expect(await memberRow().locator('select[name="role"]').inputValue()).toBe('member');
    expect(await memberRow().locator('select[name="role"] option').allTextContents()).toContain('Sales');
    await memberRow().locator('select[name="role"]').selectOption('Sales');
    await Promise.all([page.waitForURL(/\/dashboard\/members$/), memberRow().locator('button', { hasText: 'Change role' }).click()]);
    await page.waitForLoadState('load');
    await screenshot(page, 'roles-member-is-sales');
    expect(await memberRow().locator('select[name="role"]').inputValue()).toBe('Sales');
    expect((await memberRow().locator('select[name="role"] option:checked').textContent())?.trim()).toBe('Sales');
    const asSales = await db.selectFrom('memberships').select(['role', 'role_id']).where('organization_id', '=', orgId).where('user_id', '=', memberId).executeTakeFirstOrThrow();
    expect(asSales).toEqual({ role: 'custom', role_id: role.id });

    await page.goto(`${world.baseUrl}/dashboard/roles`);
    // Asked first: the confirmation page says who holds it and asks where they go.
    await Promise.all([page.waitForLoadState('load'), page.locator('form[action="/dashboard/roles/Sales/delete"] button', { hasText: 'Delete role' }).click()]);
    await screenshot(page, 'roles-sales-delete-confirmation');
    expect(await page.locator('h1').textContent()).toBe('Delete the role Sales?');
    expect((await page.locator('main').textContent())?.replace(/\s+/g, ' ')).toContain('1 member holds it.');
    const confirm = page.locator('form[action="/dashboard/roles/Sales/delete"]');
    await confirm.locator('select[name="move_to"]').selectOption('viewer');
    await Promise.all([page.waitForURL(/\/dashboard\/roles$/), confirm.locator('button', { hasText: 'Delete Sales' }).click()]);
    await screenshot(page, 'roles-sales-deleted');
    expect(await page.locator('p.notice').textContent()).toBe('Deleted the role Sales. Its 1 member moves to viewer; their connected apps keep only what viewer allows.');
    expect(await page.locator('table.roles tr[data-role="Sales"]').count()).toBe(0);
    // The members are moved by a job the deletion queued; the row goes when it is done.
    await finishJobs(db);
    expect(await db.selectFrom('roles').select('id').where('organization_id', '=', orgId).execute()).toEqual([]);

    await page.goto(`${world.baseUrl}/dashboard/members`);
    await screenshot(page, 'roles-member-moved-to-viewer');
    expect(await memberRow().locator('select[name="role"]').inputValue()).toBe('viewer');
    const moved = await db.selectFrom('memberships').select(['role', 'role_id']).where('organization_id', '=', orgId).where('user_id', '=', memberId).executeTakeFirstOrThrow();
    expect(moved).toEqual({ role: 'viewer', role_id: null });
    await page.context().close();
  }, LONG_TEST_MS);

  it('4. a viewer sees no Members, Roles, Applications or Audit log link, and those pages answer 403', async () => {
    const owner = await freshPage();
    await signIn(owner, OWNER);
    const navOf = async (page: Page) => (await page.locator('nav[aria-label="Dashboard"] a').allTextContents()).map((t) => t.trim());
    // The owner's nav, to compare with: every page.
    expect(await navOf(owner)).toEqual(['Overview', 'Applications', 'Connected apps', 'Members', 'Roles', 'Single sign-on', 'Directory sync', 'Webhooks', 'Audit log', 'Account']);
    await owner.context().close();

    const page = await freshPage();
    await signIn(page, VIEWER);
    await screenshot(page, 'roles-viewer-dashboard');
    expect(await page.locator('header .org').textContent()).toContain(`${ORG}`);
    expect(await page.locator('header .org').textContent()).toContain('(viewer)');
    expect(await navOf(page)).toEqual(['Overview', 'Connected apps', 'Account']);
    for (const path of ['/dashboard/members', '/dashboard/roles', '/dashboard/applications', '/dashboard/audit']) {
      const response = await page.goto(`${world.baseUrl}${path}`);
      expect(response?.status(), path).toBe(403);
    }
    await page.context().close();
  }, LONG_TEST_MS);
});
