/**
 * Two-step sign-in in Debian's Chromium: a user sets up an authenticator app from the Account
 * page (the otpauth:// URI read off the page, codes computed by otplib), signs out, and signs in
 * again with the password and a code; an organization that requires two factors is shown on the
 * consent page with the way to reach it.
 */
import { generate } from 'otplib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember, createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { type ApplicationWithSecret, createApplication } from '../../src/oauth/models/applications.js';
import { CallbackServer, HAS_CHROMIUM, screenshot, startWorld, type BrowserWorld, enterPassword } from './harness.js';

const PASSWORD = 'a long two-step password';
const EMAIL = 'grace@two-step.example.com';

describe.runIf(HAS_CHROMIUM)('two-step sign-in in a real browser', () => {
  let world: BrowserWorld;
  let rp: CallbackServer;
  let app: ApplicationWithSecret;
  let strictId: number;

  beforeAll(async () => {
    world = await startWorld();
    rp = await CallbackServer.start();
    const db = world.db.handle.db;
    const user = await createUser(db, { email: EMAIL, password: PASSWORD, name: 'Grace Hopper' });
    const home = await createOrganization(db, { name: 'Home Org', ownerUserId: user.id });
    const owner = await createUser(db, { email: 'owner@strict.example.com', password: PASSWORD, name: 'Owner' });
    strictId = (await createOrganization(db, { name: 'Strict Org', ownerUserId: owner.id })).id;
    await db.updateTable('organizations').set({ require_mfa: true }).where('id', '=', strictId).execute();
    await addMember(db, { organizationId: strictId, userId: user.id, role: 'member' });
    app = await createApplication(db, { organizationId: home.id, type: 'public', name: 'Two-step RP', redirectUris: [rp.callback], scopes: 'contacts.read' });
  }, 60_000);
  afterAll(async () => {
    await world?.close();
    await rp?.stop();
  });

  it('sets up an authenticator app on the Account page and signs in with the password and a code', async () => {
    const page = await (await world.browser.newContext()).newPage();
    const errors: string[] = [];
    page.on('pageerror', (err) => errors.push(err.message));

    await page.goto(`${world.baseUrl}/login`);
    await enterPassword(page, EMAIL, PASSWORD);
    await Promise.all([page.waitForURL((u) => u.pathname === '/dashboard'), page.click('button[type="submit"]')]);

    // A one-step session is shown the organization that requires two factors, not let in.
    const authorize = new URL(`${world.baseUrl}/oauth/authorize`);
    for (const [k, v] of Object.entries({ client_id: app.client_id, redirect_uri: rp.callback, response_type: 'code', scope: 'contacts.read', state: 'state-of-the-two-step-test', code_challenge: 'E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM', code_challenge_method: 'S256' })) {
      authorize.searchParams.set(k, v);
    }
    await page.goto(authorize.href);
    const strict = page.locator(`input[name="organization_id"][value="${strictId}"]`);
    await expect.poll(() => strict.isDisabled()).toBe(true);
    expect(await page.getByText('Strict Org requires two-step sign-in').count()).toBe(1);
    await screenshot(page, 'two-step-consent-requires-two-factors');

    await page.goto(`${world.baseUrl}/dashboard/account`);
    await Promise.all([page.waitForURL((u) => u.pathname === '/dashboard/account'), page.getByRole('button', { name: 'Set up an authenticator app' }).click()]);
    const uri = (await page.locator('[data-totp-uri]').textContent())!.trim();
    expect(uri).toMatch(/^otpauth:\/\/totp\//);
    expect(await page.locator('.qr svg').count()).toBe(1);
    await screenshot(page, 'two-step-enrolment');
    const secret = new URL(uri).searchParams.get('secret')!;
    await page.fill('input[name="code"]', await generate({ secret }));
    await Promise.all([page.waitForURL((u) => u.pathname === '/dashboard/account/totp/confirm'), page.getByRole('button', { name: 'Turn on two-step sign-in' }).click()]);
    expect(await page.locator('ul.codes li').count()).toBe(10);
    await screenshot(page, 'two-step-recovery-codes');

    await Promise.all([page.waitForURL((u) => u.pathname === '/login'), page.locator('header form[action="/logout"] button').click()]);
    await enterPassword(page, EMAIL, PASSWORD);
    await Promise.all([page.waitForURL((u) => u.pathname === '/login/second-step'), page.click('button[type="submit"]')]);
    await screenshot(page, 'two-step-second-step');
    await page.fill('input[name="code"]', await generate({ secret, epoch: Math.floor(Date.now() / 1000) + 30 }));
    await Promise.all([page.waitForURL((u) => u.pathname === '/dashboard'), page.getByRole('button', { name: 'Continue' }).click()]);
    const session = await world.db.handle.db.selectFrom('sessions').select('amr').orderBy('id', 'desc').limit(1).executeTakeFirstOrThrow();
    expect(session.amr).toEqual(['pwd', 'otp', 'mfa']);
    expect(errors).toEqual([]);
  }, 90_000);
});
