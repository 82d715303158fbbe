/**
 * The account lifecycle in Debian's Chromium, with the email in between read from a real SMTP
 * server: a forgotten password reset from its emailed link, and an invitation to an address
 * with no account, signed up from its link. With SCREENSHOTS=1, screenshots land in test-results/screenshots.
 */
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { linkIn, TestSmtpServer } from '../helpers/smtp.js';
import { HAS_CHROMIUM, screenshot, startWorld, type BrowserWorld, enterPassword } from './harness.js';

const OLD_PASSWORD = 'the password before the reset';
const NEW_PASSWORD = 'the password after the reset';
const OWNER_PASSWORD = 'a long owner password';
const INVITEE_PASSWORD = 'a long invitee password';
const FORGETFUL = 'forgetful@lifecycle.example.com';
const OWNER = 'owner@lifecycle.example.com';
const INVITEE = 'new-colleague@lifecycle.example.com';
const ORG = 'Lifecycle Org';
/** Each of the first two tests hashes or checks a password (argon2) five or six times, and loads a dozen pages. */
const LONG_TEST_MS = 60_000;

describe.runIf(HAS_CHROMIUM)('the account lifecycle in a real browser', () => {
  let smtp: TestSmtpServer;
  let world: BrowserWorld;

  beforeAll(async () => {
    smtp = await TestSmtpServer.start();
    world = await startWorld({ SMTP_URL: smtp.url });
  }, 60_000);
  afterAll(async () => {
    await world?.close();
    await smtp?.stop();
  });

  /** A page in a browser context of its own: its own cookies, so its own session (closed with the browser). */
  async function freshPage(): Promise<Page> {
    const context = await world.browser.newContext({ viewport: { width: 1280, height: 800 } });
    return context.newPage();
  }

  async function submitLogin(page: Page, email: string, password: string): Promise<void> {
    await page.goto(`${world.baseUrl}/login`);
    await enterPassword(page, email, password);
    await Promise.all([page.waitForLoadState('load'), page.click('button[type="submit"]')]);
  }

  /** The dashboard header's current organization: the switcher's selection with two or more, the plain label with one. */
  async function currentOrganization(page: Page): Promise<string> {
    const switcher = page.locator('select[name="organization_id"]');
    if ((await switcher.count()) > 0) return ((await switcher.locator('option:checked').textContent()) ?? '').trim();
    return ((await page.locator('header .org span').textContent()) ?? '').replace(/\s+/g, ' ').trim();
  }

  it('1. forgot password → the emailed link → a new password → it signs in, and the old one no longer does', async () => {
    await createUser(world.db.handle.db, { email: FORGETFUL, password: OLD_PASSWORD, name: 'Fran Getful' });
    // A browser already signed in with the old password, which the reset must sign out.
    const elsewhere = await freshPage();
    await submitLogin(elsewhere, FORGETFUL, OLD_PASSWORD);
    expect(new URL(elsewhere.url()).pathname).toBe('/dashboard');

    const page = await freshPage();
    // What an address without an account gets, to compare with: the answer must not tell them apart.
    await page.goto(`${world.baseUrl}/forgot-password`);
    await page.fill('input[name="email"]', 'nobody@lifecycle.example.com');
    await Promise.all([page.waitForLoadState('load'), page.click('button[type="submit"]')]);
    const unknownNotice = await page.locator('p.notice').textContent();
    expect(unknownNotice).toContain('If an account uses that address');

    await page.goto(`${world.baseUrl}/login`);
    await Promise.all([page.waitForURL(/\/forgot-password$/), page.click('a:has-text("Forgot your password?")')]);
    await screenshot(page, 'forgot-password');
    await page.fill('input[name="email"]', FORGETFUL);
    await Promise.all([page.waitForLoadState('load'), page.click('button[type="submit"]')]);
    await screenshot(page, 'forgot-password-sent');
    expect(await page.locator('p.notice').textContent()).toBe(unknownNotice);

    const mail = await smtp.waitFor(FORGETFUL, /Reset your password/);
    const link = linkIn(mail, `${world.baseUrl}/reset-password`);
    await page.goto(link);
    await screenshot(page, 'reset-password');
    expect(await page.locator('h1').textContent()).toBe('Choose a new password');
    expect(await page.locator('body').textContent()).toContain(FORGETFUL);
    await page.fill('input[name="password"]', NEW_PASSWORD);
    await Promise.all([page.waitForLoadState('load'), page.click('button[type="submit"]')]);
    await screenshot(page, 'password-changed');
    expect(await page.locator('h1').textContent()).toBe('Password changed');
    // The link works once.
    await page.goto(link);
    expect(await page.locator('h1').textContent()).toBe('This link does not work');

    await submitLogin(page, FORGETFUL, NEW_PASSWORD);
    expect(new URL(page.url()).pathname).toBe('/dashboard');

    const withOld = await freshPage();
    await submitLogin(withOld, FORGETFUL, OLD_PASSWORD);
    await screenshot(withOld, 'login-old-password-refused');
    expect(new URL(withOld.url()).pathname).toBe('/login');
    expect(await withOld.locator('p.error[role="alert"]').textContent()).toBe('Incorrect email or password.');

    await elsewhere.goto(`${world.baseUrl}/dashboard`);
    expect(new URL(elsewhere.url()).pathname).toBe('/login');
  }, LONG_TEST_MS);

  let ownerPage: Page;
  let inviteePage: Page;

  it('2. an owner invites a new address as admin → it signs up from the emailed link → the dashboard opens on the organization, as admin', async () => {
    const owner = await createUser(world.db.handle.db, { email: OWNER, password: OWNER_PASSWORD, name: 'Olive Owner' });
    await createOrganization(world.db.handle.db, { name: ORG, ownerUserId: owner.id });
    ownerPage = await freshPage();
    await submitLogin(ownerPage, OWNER, OWNER_PASSWORD);
    await ownerPage.goto(`${world.baseUrl}/dashboard/members`);

    // The page has two forms with an email field: inviting, and adding an existing user.
    const invite = ownerPage.locator('form[action="/dashboard/invitations"]');
    await invite.locator('input[name="email"]').fill(INVITEE);
    await invite.locator('select[name="role"]').selectOption('admin');
    await Promise.all([ownerPage.waitForLoadState('load'), invite.locator('button', { hasText: 'Send invitation' }).click()]);
    await screenshot(ownerPage, 'invitation-sent');
    expect(await ownerPage.locator('p.notice').textContent()).toBe(`Invitation sent to ${INVITEE}.`);
    const pending = ownerPage.locator('table.invitations tr', { hasText: INVITEE });
    expect(await pending.count()).toBe(1);
    expect(await pending.locator('td[data-label="Role"]').textContent()).toBe('admin');

    const mail = await smtp.waitFor(INVITEE, /You are invited to join/);
    expect(mail.subject).toBe(`You are invited to join ${ORG}`);
    const link = linkIn(mail, `${world.baseUrl}/invitation?token=`);

    inviteePage = await freshPage();
    await inviteePage.goto(link);
    await screenshot(inviteePage, 'invitation-signup');
    expect(await inviteePage.locator('h1').textContent()).toBe(`Join ${ORG}`);
    const signup = inviteePage.locator('form[action="/invitation/signup"]');
    const email = signup.locator('input[name="email"]');
    expect(await email.inputValue()).toBe(INVITEE);
    // The address is the invitation's, not the visitor's to choose.
    expect(await email.getAttribute('readonly')).not.toBeNull();
    await signup.locator('input[name="name"]').fill('Nico Newcomer');
    await signup.locator('input[name="password"]').fill(INVITEE_PASSWORD);
    await Promise.all([inviteePage.waitForURL(/\/dashboard$/), signup.locator('button', { hasText: 'Create account and join' }).click()]);
    await screenshot(inviteePage, 'invitation-joined');
    expect(await currentOrganization(inviteePage)).toContain(`${ORG} (admin)`);

    await inviteePage.goto(`${world.baseUrl}/dashboard/members`);
    await screenshot(inviteePage, 'members-as-invitee');
    // An admin may change an admin's role, so the role is shown as the row's select.
    const self = inviteePage.locator('tr', { hasText: INVITEE });
    expect(await self.locator('select[name="role"]').inputValue()).toBe('admin');

    await ownerPage.goto(`${world.baseUrl}/dashboard/members`);
    await screenshot(ownerPage, 'members-after-invitation-accepted');
    expect(await ownerPage.locator('table.invitations').count()).toBe(0);
    const pendingSection = ownerPage.locator('section', { has: ownerPage.locator('h2', { hasText: 'Pending invitations' }) });
    expect((await pendingSection.textContent())?.replace(/\s+/g, ' ')).toContain('No pending invitations.');
    expect(await ownerPage.locator('tr', { hasText: INVITEE }).locator('select[name="role"]').inputValue()).toBe('admin');

    // Signing up from the link confirmed the address: the link came to it.
    const user = await world.db.handle.db.selectFrom('users').select('email_verified_at').where('email', '=', INVITEE).executeTakeFirstOrThrow();
    expect(user.email_verified_at).not.toBeNull();
  }, LONG_TEST_MS);

  it('3. invited again, to a second organization, the signed-in account accepts → the switcher selects that organization', async () => {
    const owner = await world.db.handle.db.selectFrom('users').select('id').where('email', '=', OWNER).executeTakeFirstOrThrow();
    await createOrganization(world.db.handle.db, { name: 'Second Org', ownerUserId: owner.id });
    await ownerPage.goto(`${world.baseUrl}/dashboard/members`);
    await ownerPage.locator('select[name="organization_id"]').selectOption({ label: 'Second Org (owner)' });
    await Promise.all([ownerPage.waitForURL(/\/dashboard$/), ownerPage.locator('button', { hasText: 'Switch' }).click()]);
    await ownerPage.goto(`${world.baseUrl}/dashboard/members`);
    const invite = ownerPage.locator('form[action="/dashboard/invitations"]');
    await invite.locator('input[name="email"]').fill(INVITEE);
    await Promise.all([ownerPage.waitForLoadState('load'), invite.locator('button', { hasText: 'Send invitation' }).click()]);
    expect(await ownerPage.locator('p.notice').textContent()).toBe(`Invitation sent to ${INVITEE}.`);

    const mail = await smtp.waitFor(INVITEE, /You are invited to join Second Org/);
    // The invitee's session is still on the first organization: accepting must move it.
    await inviteePage.goto(linkIn(mail, `${world.baseUrl}/invitation?token=`));
    await screenshot(inviteePage, 'invitation-accept-signed-in');
    expect(await inviteePage.locator('h1').textContent()).toBe('Join Second Org');
    await Promise.all([inviteePage.waitForURL(/\/dashboard$/), inviteePage.locator('button', { hasText: 'Accept and join' }).click()]);
    await screenshot(inviteePage, 'invitation-accepted');
    expect(await currentOrganization(inviteePage)).toBe('Second Org (member)');
    const options = await inviteePage.locator('select[name="organization_id"] option').allTextContents();
    expect(options.map((o) => o.trim()).sort()).toEqual([`${ORG} (admin)`, 'Second Org (member)']);
  });
});
