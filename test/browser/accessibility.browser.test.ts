/**
 * Accessible and usable everywhere (issue 29), in Debian's Chromium: every page outside the
 * dashboard (sign-in, sign-up, password and email links, the second step, single sign-on,
 * consent, devices, invitations, sign-out, errors, the API reference at /docs), at 1280 px and at
 * 375 px, has no axe-core violation of impact serious or critical and does not scroll sideways at
 * 375 px (accessibility.ts audits; the dashboard's pages are in accessibility-dashboard.browser.test.ts).
 * With SCREENSHOTS=1, screenshots of each page at each width land in test-results/screenshots (git-ignored), named a11y-*.
 *
 * And the consent flow works with the keyboard alone: Tab to the organization choice, the arrow
 * keys to choose one, Tab to Allow, Enter; the focused controls show where the focus is.
 *
 * One world for the file; each test visits a group of pages and collects every problem before failing.
 */
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember, createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { DEVICE_CODE_GRANT } from '../../src/db/schema.js';
import { generateSecret, sealText } from '../../src/lib/crypto.js';
import { type ApplicationWithSecret, createApplication } from '../../src/oauth/models/applications.js';
import { browserHash, parkForProof, recordSamlResponse } from '../../src/sso/sign-ins.js';
import { TEST_SECRET_KEY } from '../helpers/app.js';
import { DEFAULT_IDP_ENTITY_ID } from '../helpers/saml-idp.js';
import { type AccessibilityWorld, audit, expectNoProblems, outboxLinks, OWNER, PASSWORD, seedAccessibilityWorld, signIn, SSO_DOMAIN, submit, WIDE } from './accessibility.js';
import { CallbackServer, enterPassword, HAS_CHROMIUM, startWorld, type BrowserWorld } from './harness.js';

const TWO_STEP = 'tess.two-step@a11y.example.com';
const LINKER = 'lin.linker@links.example.com';
const FORGETFUL = 'fran.forgetful@a11y.example.com';
const LONG_TEST_MS = 120_000;

describe.runIf(HAS_CHROMIUM)('every page outside the dashboard, accessible at 1280 px and at 375 px', () => {
  let world: BrowserWorld;
  let rp: CallbackServer;
  let seeded: AccessibilityWorld;
  let deviceApp: ApplicationWithSecret;
  let linkerId: number;
  /** The owner's browser, signed in once: consent, device, invitation and sign-out pages. */
  let owner: Page;

  const db = () => world.db.handle.db;
  const url = (path: string) => `${world.baseUrl}${path}`;

  beforeAll(async () => {
    rp = await CallbackServer.start();
    world = await startWorld();
    seeded = await seedAccessibilityWorld(world, rp.callback);
    const d = db();
    const [twoStep, linker] = await Promise.all([
      createUser(d, { email: TWO_STEP, password: PASSWORD, name: 'Tess Two-Step' }),
      createUser(d, { email: LINKER, password: PASSWORD, name: 'Lin Linker' }),
      createUser(d, { email: FORGETFUL, password: PASSWORD, name: 'Fran Forgetful' }),
    ]);
    linkerId = linker.id;
    await createOrganization(d, { name: 'Tess Org', ownerUserId: twoStep.id });
    await addMember(d, { organizationId: seeded.homeId, userId: twoStep.id, role: 'member' });
    // Second factors without a ceremony: a confirmed authenticator app and a passkey (the second step only offers them).
    await d.insertInto('totp_factors').values({ user_id: twoStep.id, secret_sealed: sealText(TEST_SECRET_KEY, 'totp-secret', 'JBSWY3DPEHPK3PXP'), confirmed_at: new Date(), last_step: null, started_session_hash: null }).execute();
    await d.insertInto('passkeys').values({ user_id: twoStep.id, credential_id: generateSecret(16), public_key: new Uint8Array([1, 2, 3]), transports: ['internal'], backed_up: true, name: 'Security key' }).execute();
    // A command-line client of the device grant (public, no secret).
    deviceApp = await createApplication(d, { organizationId: seeded.homeId, type: 'public', name: 'Acme CLI', redirectUris: ['https://cli.example.com/cb'], scopes: 'contacts.read' });
    await d
      .updateTable('applications')
      .set({ token_endpoint_auth_method: 'none', client_secret_hash: null, grant_types: ['authorization_code', 'refresh_token', DEVICE_CODE_GRANT] })
      .where('client_id', '=', deviceApp.client_id)
      .execute();

    owner = await freshPage();
    await signIn(owner, world.baseUrl, OWNER);
  }, 60_000);
  afterAll(async () => {
    await world?.close();
    await rp?.stop();
  });

  /** A browser of its own (its own cookies): nobody signed in. */
  async function freshPage(): Promise<Page> {
    return (await world.browser.newContext({ viewport: WIDE })).newPage();
  }

  /** Goes to `path` and audits the page it shows. */
  async function visit(page: Page, path: string, name: string): Promise<string[]> {
    await page.goto(url(path));
    return audit(page, name);
  }

  function authorizeUrl(state: string, extra: Record<string, string> = {}): string {
    return `/oauth/authorize?${new URLSearchParams({
      client_id: seeded.publicApp.client_id,
      redirect_uri: rp.callback,
      response_type: 'code',
      scope: 'openid profile contacts.read contacts.write tasks.read',
      state,
      code_challenge: 'E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM',
      code_challenge_method: 'S256',
      ...extra,
    })}`;
  }

  it(
    'the sign-in, sign-up, password, email-link and second-step pages',
    async () => {
      const problems: string[] = [];
      const page = await freshPage();
      problems.push(...(await visit(page, '/login', 'login')));
      problems.push(...(await visit(page, `/login?${new URLSearchParams({ method: 'password', login_hint: FORGETFUL })}`, 'login-password')));
      await page.fill('input[name="password"]', 'not the password at all');
      await submit(page, page.locator('button[type="submit"]'));
      expect(await page.locator('p.error[role="alert"]').count()).toBe(1);
      problems.push(...(await audit(page, 'login-refused')));
      problems.push(...(await visit(page, '/signup', 'signup')));
      await page.fill('input[name="email"]', FORGETFUL);
      // Longer than any password may be (the field has no maxlength): the server's refusal, listed.
      await page.fill('input[name="password"]', 'p'.repeat(1025));
      await page.fill('input[name="organization_name"]', 'Another Org');
      await submit(page, page.locator('button[type="submit"]'));
      expect(await page.locator('.error[role="alert"] li').count()).toBe(1);
      problems.push(...(await audit(page, 'signup-refused')));
      // A taken address is answered as any other: check the inbox.
      await page.fill('input[name="password"]', PASSWORD);
      await submit(page, page.locator('button[type="submit"]'));
      expect(await page.locator('h1').textContent()).toBe('Check your inbox');
      problems.push(...(await audit(page, 'signup-sent')));
      problems.push(...(await visit(page, '/forgot-password', 'forgot-password')));
      await page.fill('input[name="email"]', FORGETFUL);
      await submit(page, page.locator('button[type="submit"]'));
      problems.push(...(await audit(page, 'forgot-password-sent')));

      // The links the emails carry, read off the developer outbox (a page too).
      const [resetLink] = await outboxLinks(page, world.baseUrl, '/reset-password?token=');
      problems.push(...(await audit(page, 'dev-outbox')));
      await page.goto(resetLink!);
      expect(await page.locator('h1').textContent()).toBe('Choose a new password');
      problems.push(...(await audit(page, 'reset-password')));
      problems.push(...(await visit(page, `/reset-password?token=${'x'.repeat(43)}`, 'link-does-not-work')));

      // Signing up: the mailed link's form (the password again), then the dashboard.
      const newcomer = await freshPage();
      await newcomer.goto(url('/signup'));
      await newcomer.fill('input[name="name"]', 'Nico Newcomer');
      await newcomer.fill('input[name="email"]', 'nico.newcomer@a11y.example.com');
      await newcomer.fill('input[name="password"]', PASSWORD);
      await newcomer.fill('input[name="organization_name"]', 'Newcomer Org');
      await submit(newcomer, newcomer.locator('button[type="submit"]'));
      const [signUpLink] = await outboxLinks(page, world.baseUrl, '/signup/confirm?token=');
      await newcomer.goto(signUpLink!);
      expect(await newcomer.locator('h1').textContent()).toBe('Finish creating your account');
      problems.push(...(await audit(newcomer, 'signup-confirm')));
      await newcomer.fill('input[name="password"]', PASSWORD);
      await Promise.all([newcomer.waitForURL((u) => u.pathname === '/dashboard'), newcomer.click('form[action="/signup/confirm"] button')]);

      // Confirming an address (the account's new one): the link signed out, then in the account's own browser.
      await newcomer.goto(url('/dashboard/account'));
      const change = newcomer.locator('form[action="/dashboard/account/email"]');
      await change.locator('input[name="email"]').fill('nico.moved@a11y.example.com');
      await change.locator('input[name="current_password"]').fill(PASSWORD);
      await submit(newcomer, change.locator('button'));
      const [verifyLink] = await outboxLinks(page, world.baseUrl, '/verify-email?token=');
      await page.goto(verifyLink!);
      problems.push(...(await audit(page, 'verify-email-signed-out')));
      await newcomer.goto(verifyLink!);
      expect(await newcomer.locator('form[action="/verify-email"]').count()).toBe(1);
      problems.push(...(await audit(newcomer, 'verify-email')));
      await submit(newcomer, newcomer.locator('form[action="/verify-email"] button'));
      problems.push(...(await audit(newcomer, 'verify-email-confirmed')));

      // The second step: an authenticator app or a passkey.
      const twoStep = await freshPage();
      await signIn(twoStep, world.baseUrl, TWO_STEP, '/login/second-step');
      expect(await twoStep.locator('[data-passkey-action="authenticate"]').count()).toBe(1);
      problems.push(...(await audit(twoStep, 'second-step')));
      await twoStep.fill('input[name="code"]', '000000');
      await submit(twoStep, twoStep.getByRole('button', { name: 'Continue' }));
      problems.push(...(await audit(twoStep, 'second-step-refused')));

      expectNoProblems(problems);
    },
    LONG_TEST_MS,
  );

  it(
    'the single sign-on pages',
    async () => {
      const problems: string[] = [];
      const page = await freshPage();
      // An address of the verified domain, which has more than one connection: which one?
      await page.goto(url('/login'));
      await page.fill('input[name="email"]', `alice@${SSO_DOMAIN}`);
      await submit(page, page.locator('button[type="submit"]'));
      expect(await page.locator('h1').textContent()).toBe('Choose how to sign in');
      problems.push(...(await audit(page, 'sso-choose')));

      // An IdP-initiated sign-in: this browser is asked first.
      const handle = await recordSamlResponse(db(), {
        accepted: {
          identity: { connectionId: seeded.samlConnectionId, issuer: DEFAULT_IDP_ENTITY_ID, subjectFormat: 'urn:oasis:names:tc:SAML:1.1:nameid-format:emailAddress', subject: `alice@${SSO_DOMAIN}`, email: `alice@${SSO_DOMAIN}`, emailVerified: true, name: 'Alice', amr: [] },
          assertionId: `_${generateSecret(16)}`,
          inResponseTo: null,
          keepUntil: new Date(Date.now() + 600_000),
        },
        idpInitiatedAllowed: true,
        relayStateReturnTo: '/dashboard',
      });
      problems.push(...(await visit(page, `/sso/finish?${new URLSearchParams({ handle })}`, 'sso-continue')));
      problems.push(...(await visit(page, '/sso/finish?handle=expired-or-unknown', 'sso-failed')));

      // An existing account to connect to the company sign-in: signed out (sign in to prove it is
      // yours), then the confirmation. The link waits bound to this browser's link cookie.
      const linker = await freshPage();
      const binding = generateSecret(32);
      await linker.context().addCookies([{ name: 'orgauth_sso_link', value: binding, url: world.baseUrl }]);
      const linkHandle = await parkForProof(db(), {
        identity: { connectionId: seeded.samlConnectionId, issuer: DEFAULT_IDP_ENTITY_ID, subjectFormat: '', subject: LINKER, email: LINKER, emailVerified: true, name: 'Lin', amr: [] },
        userId: linkerId,
        browser: browserHash(binding),
        returnTo: '/dashboard',
      });
      problems.push(...(await visit(linker, `/sso/link?${new URLSearchParams({ handle: linkHandle })}`, 'sso-link-sign-in')));
      await submit(linker, linker.locator('a.button'));
      await enterPassword(linker, undefined, PASSWORD);
      await Promise.all([linker.waitForURL((u) => u.pathname === '/sso/link'), linker.click('button[type="submit"]')]);
      expect(await linker.locator('form[action="/sso/link"]').count()).toBe(1);
      problems.push(...(await audit(linker, 'sso-link-confirm')));

      expectNoProblems(problems);
    },
    LONG_TEST_MS,
  );

  it(
    'the consent, device, invitation, sign-out and error pages',
    async () => {
      const problems: string[] = [];
      // Consent with the organization choice: one granting only part, one requiring two-step sign-in.
      problems.push(...(await visit(owner, authorizeUrl('accessibility-state-0123456789'), 'consent')));
      expect(await owner.locator('input[name="organization_id"]').count()).toBe(3);
      expect(await owner.locator(`input[name="organization_id"][value="${seeded.strictId}"]`).isDisabled()).toBe(true);
      problems.push(...(await visit(owner, '/oauth/authorize?client_id=no-such-client&response_type=code', 'authorize-error')));
      // A client that registered itself: the page warns first.
      const registered = await fetch(url('/oauth/register'), {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ client_name: 'Self-Registered Tool', redirect_uris: [rp.callback], token_endpoint_auth_method: 'none', scope: 'contacts.read' }),
      });
      expect(registered.status).toBe(201);
      const { client_id: unverifiedId } = (await registered.json()) as { client_id: string };
      problems.push(...(await visit(owner, authorizeUrl('unverified-client-state-0123456789', { client_id: unverifiedId, scope: 'contacts.read' }), 'consent-unverified-client')));
      expect(await owner.locator('.warning.unverified').count()).toBe(1);

      // The device pages: the code (a wrong one first), then the device's consent, then the answer.
      const res = await fetch(url('/oauth/device_authorization'), {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ client_id: deviceApp.client_id, scope: 'contacts.read' }),
      });
      expect(res.status).toBe(200);
      const { user_code: userCode } = (await res.json()) as { user_code: string };
      problems.push(...(await visit(owner, '/device', 'device')));
      await owner.fill('input[name="user_code"]', 'WRONG-CODE');
      await submit(owner, owner.locator('button[type="submit"]'));
      problems.push(...(await audit(owner, 'device-refused')));
      await owner.fill('input[name="user_code"]', userCode);
      await submit(owner, owner.locator('button[type="submit"]'));
      expect(await owner.locator('button[value="approve"]').count()).toBe(1);
      problems.push(...(await audit(owner, 'device-consent')));
      await submit(owner, owner.locator('button[value="deny"]'));
      problems.push(...(await audit(owner, 'device-done')));

      // Invitations: to an address with no account (sign up from the link), and to the linker's
      // (accept, signed in as them; and the page another signed-in person sees).
      await owner.goto(url('/dashboard/members'));
      for (const email of ['invitee@a11y.example.com', LINKER]) {
        const invite = owner.locator('form[action="/dashboard/invitations"]');
        await invite.locator('input[name="email"]').fill(email);
        await submit(owner, invite.locator('button[type="submit"]'));
      }
      const stranger = await freshPage();
      const [linkerInvitation, inviteeInvitation] = await outboxLinks(stranger, world.baseUrl, '/invitation?token=');
      await stranger.goto(inviteeInvitation!);
      expect(await stranger.locator('form[action="/invitation/signup"]').count()).toBe(1);
      problems.push(...(await audit(stranger, 'invitation-sign-up')));
      const linker = await freshPage();
      await signIn(linker, world.baseUrl, LINKER);
      // Before joining, the linker is in no organization: the dashboard says so.
      problems.push(...(await audit(linker, 'dashboard-no-organization')));
      await linker.goto(linkerInvitation!);
      expect(await linker.locator('form[action="/invitation/accept"]').count()).toBe(1);
      problems.push(...(await audit(linker, 'invitation-accept')));
      await owner.goto(linkerInvitation!);
      problems.push(...(await audit(owner, 'invitation-signed-in-as-another')));

      // Signing out at an application's request, and a page that is not there.
      problems.push(...(await visit(owner, '/oauth/logout', 'logout')));
      problems.push(...(await visit(owner, '/dashboard/applications/no-such-application', 'not-found')));

      expectNoProblems(problems);
    },
    LONG_TEST_MS,
  );

  it('the API reference', async () => {
    const page = await freshPage();
    const problems = await visit(page, '/docs/', 'api-reference');
    expect(new URL(page.url()).pathname).toBe('/docs');
    expect(await page.locator('h1').textContent()).toBe('API reference');
    expect(await page.locator('article.operation').count()).toBeGreaterThan(50);
    expectNoProblems(problems);
    await page.context().close();
  }, LONG_TEST_MS);

  it('approves the consent page with the keyboard alone, the focus visible on each control', async () => {
    const page = await owner.context().newPage();
    await page.goto(url(authorizeUrl('keyboard-only-state-0123456789')));
    const focused = () =>
      page.evaluate(() => {
        const el = document.activeElement as HTMLInputElement | HTMLButtonElement | null;
        if (!el || el === document.body) return undefined;
        const style = getComputedStyle(el);
        return { tag: el.tagName, name: el.getAttribute('name'), value: el.getAttribute('value'), checked: 'checked' in el ? el.checked : false, outline: style.outlineStyle, boxShadow: style.boxShadow };
      });
    /** A focus indicator: an outline or a box shadow while focused. */
    const expectVisiblyFocused = (f: Awaited<ReturnType<typeof focused>>) => expect(f !== undefined && (f.outline !== 'none' || f.boxShadow !== 'none'), JSON.stringify(f)).toBe(true);

    // Tab to the organization choice.
    for (let i = 0; i < 20 && (await focused())?.name !== 'organization_id'; i++) await page.keyboard.press('Tab');
    let current = await focused();
    expect(current?.name).toBe('organization_id');
    expectVisiblyFocused(current);
    // The arrow keys move the choice (past the organization that cannot be chosen): Partner Org.
    for (let i = 0; i < 6 && !(current?.value === String(seeded.partnerId) && current.checked); i++) {
      await page.keyboard.press('ArrowDown');
      current = await focused();
    }
    if (current?.value === String(seeded.partnerId) && !current.checked) await page.keyboard.press('Space');
    current = await focused();
    expect(current).toMatchObject({ name: 'organization_id', value: String(seeded.partnerId), checked: true });
    expectVisiblyFocused(current);
    // On to Allow (and back with Shift+Tab if gone past it), then Enter.
    for (let i = 0; i < 10 && (await focused())?.value !== 'approve'; i++) await page.keyboard.press('Tab');
    if ((await focused())?.value !== 'approve') await page.keyboard.press('Shift+Tab');
    current = await focused();
    expect(current).toMatchObject({ tag: 'BUTTON', value: 'approve' });
    expectVisiblyFocused(current);
    await Promise.all([page.waitForURL((u) => u.origin === rp.origin), page.keyboard.press('Enter')]);

    const callback = await rp.waitFor('code');
    expect(callback.searchParams.get('state')).toBe('keyboard-only-state-0123456789');
    expect(callback.searchParams.get('code')).toMatch(/\S+/);
    // The code is for the organization chosen with the keyboard.
    const code = await db().selectFrom('authorization_codes').select('organization_id').orderBy('id', 'desc').limit(1).executeTakeFirstOrThrow();
    expect(code.organization_id).toBe(seeded.partnerId);
    await page.close();
  });
});
