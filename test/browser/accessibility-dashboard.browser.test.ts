/**
 * Accessible and usable everywhere (issue 29): every page of the dashboard in Debian's Chromium,
 * at 1280 px and at 375 px, has no axe-core violation of impact serious or critical and does not
 * scroll sideways at 375 px (accessibility.ts audits; the other pages are in
 * accessibility.browser.test.ts). The pages that answer a form (a secret shown once, a
 * confirmation, recovery codes) are audited as the form's answer shows them. Screenshots of each
 * page at each width (SCREENSHOTS=1) land in test-results/screenshots (git-ignored), named a11y-dashboard-*.
 *
 * One world for the file, the owner signed in once.
 */
import { generate } from 'otplib';
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateSecret } from '../../src/lib/crypto.js';
import { type AccessibilityWorld, audit, COLLEAGUE, expectNoProblems, LONG_REDIRECT, OWNER, PASSWORD, seedAccessibilityWorld, signIn, submit, WIDE } from './accessibility.js';
import { CallbackServer, HAS_CHROMIUM, startWorld, type BrowserWorld } from './harness.js';

const LONG_TEST_MS = 120_000;

describe.runIf(HAS_CHROMIUM)('every dashboard page, accessible at 1280 px and at 375 px', () => {
  let world: BrowserWorld;
  let rp: CallbackServer;
  let seeded: AccessibilityWorld;
  let owner: Page;

  const url = (path: string) => `${world.baseUrl}${path}`;

  beforeAll(async () => {
    rp = await CallbackServer.start();
    // Webhook endpoints on loopback: the callback server receives the pings.
    world = await startWorld({ WEBHOOK_ALLOW_PRIVATE: '1' });
    seeded = await seedAccessibilityWorld(world, rp.callback);
    owner = await (await world.browser.newContext({ viewport: WIDE })).newPage();
    await signIn(owner, world.baseUrl, OWNER);
  }, 60_000);
  afterAll(async () => {
    await world?.close();
    await rp?.stop();
  });

  async function visit(path: string, name: string): Promise<string[]> {
    await owner.goto(url(path));
    return audit(owner, `dashboard-${name}`);
  }
  const answer = (name: string) => audit(owner, `dashboard-${name}`);

  it(
    'the overview and the applications, with their confirmation pages',
    async () => {
      const problems: string[] = [];
      problems.push(...(await visit('/dashboard', 'overview')));
      problems.push(...(await visit('/dashboard/applications', 'applications')));
      // A new public application: its secret, shown once.
      const publicForm = owner.locator('form', { has: owner.locator('button', { hasText: /^Create application$/ }) });
      await publicForm.locator('input[name="name"]').fill('Customer Portal');
      await publicForm.locator('textarea[name="redirect_uris"]').fill(LONG_REDIRECT);
      await submit(owner, publicForm.locator('button', { hasText: /^Create application$/ }));
      expect(await owner.locator('#client-secret').count()).toBe(1);
      problems.push(...(await answer('application-created')));
      problems.push(...(await visit(`/dashboard/applications/${seeded.publicApp.client_id}`, 'application')));
      // Narrowing it would revoke the owner's grant: asked to confirm first.
      const edit = owner.locator(`form[action="/dashboard/applications/${seeded.publicApp.client_id}"]`);
      await edit.locator('input[name="scopes"][value="contacts.write"]').uncheck();
      await submit(owner, edit.locator('button[type="submit"]'));
      problems.push(...(await answer('application-confirm-scopes')));
      problems.push(...(await visit(`/dashboard/applications/${seeded.privateApp.client_id}`, 'application-private')));
      await submit(owner, owner.locator('button', { hasText: 'Generate Token' }));
      expect(await owner.locator('#access-token').count()).toBe(1);
      problems.push(...(await answer('application-token')));
      await submit(owner, owner.locator(`form[action="/dashboard/applications/${seeded.privateApp.client_id}/secret"] button`));
      problems.push(...(await answer('application-rotate')));

      expectNoProblems(problems);
    },
    LONG_TEST_MS,
  );

  it(
    'connected apps, members, roles and the audit log, with their confirmation pages',
    async () => {
      const problems: string[] = [];
      problems.push(...(await visit('/dashboard/connected-apps', 'connected-apps')));
      problems.push(...(await visit('/dashboard/members', 'members')));
      const invite = owner.locator('form[action="/dashboard/invitations"]');
      await invite.locator('input[name="email"]').fill('a.rather.long.address.of.a.new.colleague@a-long-company-domain.example.com');
      await submit(owner, invite.locator('button[type="submit"]'));
      problems.push(...(await answer('members-invited')));
      problems.push(...(await visit('/dashboard/roles', 'roles')));
      problems.push(...(await visit('/dashboard/audit', 'audit')));

      // What asks to be confirmed (or, where nothing does, what the change answers).
      await owner.goto(url('/dashboard/connected-apps'));
      await submit(owner, owner.locator('form[action^="/dashboard/connected-apps/"][action$="/revoke"] button').first());
      problems.push(...(await answer('grant-revoke')));
      await owner.goto(url('/dashboard/members'));
      await submit(owner, owner.locator('form[action^="/dashboard/invitations/"][action$="/revoke"] button').first());
      problems.push(...(await answer('invitation-revoke')));
      await owner.goto(url('/dashboard/members'));
      await submit(owner, owner.locator('tr', { hasText: COLLEAGUE }).locator('form[action$="/remove"] button'));
      problems.push(...(await answer('member-remove')));
      await owner.goto(url('/dashboard/roles'));
      await submit(owner, owner.locator('form[action$="/roles/support/delete"] button'));
      problems.push(...(await answer('role-delete')));

      expectNoProblems(problems);
    },
    LONG_TEST_MS,
  );

  it(
    'single sign-on and webhooks, with their confirmation pages',
    async () => {
      const problems: string[] = [];
      problems.push(...(await visit('/dashboard/sso', 'sso')));
      // A refused form: the page says what is wrong.
      const addDomain = owner.locator('form[action="/dashboard/sso/domains"]');
      await addDomain.locator('input[name="domain"]').fill('not a domain');
      await submit(owner, addDomain.locator('button[type="submit"]'));
      expect(await owner.locator('.error').count()).toBeGreaterThan(0);
      problems.push(...(await answer('sso-refused')));
      await submit(owner, owner.locator('button.danger', { hasText: 'Delete' }).first());
      problems.push(...(await answer('sso-delete')));

      // An endpoint (its secret, shown once), a ping, its delivery, and deleting it.
      await owner.goto(url('/dashboard/webhooks'));
      problems.push(...(await answer('webhooks-none')));
      const add = owner.locator('form[action="/dashboard/webhooks"]');
      await add.locator('input[name="url"]').fill(`${rp.origin}/webhooks/orgauth/receiver/with/a/long/path/${generateSecret(16)}`);
      await add.locator('input[name="description"]').fill('The receiver of the support desk');
      await add.locator('input[name="events"]').first().check();
      await submit(owner, add.locator('button[type="submit"]'));
      expect(await owner.locator('#webhook-secret-value').count()).toBe(1);
      problems.push(...(await answer('webhooks-secret')));
      await submit(owner, owner.locator('button', { hasText: 'Send a ping' }).first());
      problems.push(...(await answer('webhooks')));
      await submit(owner, owner.locator('table.deliveries a').first());
      problems.push(...(await answer('webhook-delivery')));
      await owner.goto(url('/dashboard/webhooks'));
      await submit(owner, owner.locator('button.danger', { hasText: 'Delete' }).first());
      problems.push(...(await answer('webhook-delete')));

      expectNoProblems(problems);
    },
    LONG_TEST_MS,
  );

  it(
    'directory sync: the list, a new directory and its token, a directory with what it pushed, and its confirmation',
    async () => {
      const problems: string[] = [];
      problems.push(...(await visit('/dashboard/directories', 'directories-none')));
      const create = owner.locator('form[action="/dashboard/directories"]');
      await create.locator('input[name="name"]').fill('Okta production, the one the whole company signs in with');
      await submit(owner, create.locator('button[type="submit"]'));
      expect(await owner.locator('#scim-token').count()).toBe(1);
      problems.push(...(await answer('directory-created')));

      // What a provider would have pushed: two people, a group holding one, and its requests.
      const d = world.db.handle.db;
      const { id } = await d.selectFrom('directories').select('id').where('organization_id', '=', seeded.homeId).executeTakeFirstOrThrow();
      const pushed = await d
        .insertInto('directory_users')
        .values([
          { directory_id: id, user_id: seeded.ownerId, user_name: OWNER, display_name: 'Olive Owner', resource: '{}', role: null, updated_at: new Date() },
          { directory_id: id, user_id: seeded.colleagueId, user_name: COLLEAGUE, display_name: 'Colin Colleague', active: false, resource: '{}', role: 'admin', updated_at: new Date() },
        ])
        .returning('id')
        .execute();
      const group = await d.insertInto('directory_groups').values({ directory_id: id, display_name: 'Engineering and Operations (all offices)', updated_at: new Date() }).returning('id').executeTakeFirstOrThrow();
      await d.insertInto('directory_group_members').values({ group_id: group.id, user_id: pushed[0]!.id }).execute();
      await d
        .insertInto('directory_requests')
        .values([
          { directory_id: id, method: 'GET', path: `/Users?filter=${encodeURIComponent(`userName eq "${OWNER}"`)}&startIndex=1&count=100`, status: 200, scim_type: null },
          { directory_id: id, method: 'POST', path: '/Users', status: 400, scim_type: 'invalidValue' },
        ])
        .execute();
      problems.push(...(await visit(`/dashboard/directories/${id}`, 'directory')));
      const map = owner.locator(`form[action="/dashboard/directories/${id}/mappings"]`);
      await map.locator('input[name="group"]').fill('Engineering and Operations (all offices)');
      await map.locator('select[name="role"]').selectOption('admin');
      await submit(owner, map.locator('button[type="submit"]'));
      problems.push(...(await answer('directory-mapped')));
      await submit(owner, owner.locator('button', { hasText: 'New token' }).first());
      expect(await owner.locator('#scim-token').count()).toBe(1);
      problems.push(...(await answer('directory-rotated')));
      problems.push(...(await visit('/dashboard/directories', 'directories')));
      await owner.goto(url(`/dashboard/directories/${id}`));
      await submit(owner, owner.locator('button.danger', { hasText: 'Delete' }).first());
      problems.push(...(await answer('directory-delete')));

      expectNoProblems(problems);
    },
    LONG_TEST_MS,
  );

  it(
    'the Account page: two-step sign-in set up, its recovery codes, and passkeys',
    async () => {
      const problems: string[] = [];
      problems.push(...(await visit('/dashboard/account', 'account')));
      const setUp = owner.locator('form[action="/dashboard/account/totp"]');
      if ((await setUp.locator('input[name="current_password"]').count()) > 0) await setUp.locator('input[name="current_password"]').fill(PASSWORD);
      await submit(owner, setUp.locator('button[type="submit"]'));
      const secret = (await owner.locator('[data-totp-secret]').textContent())!.trim();
      problems.push(...(await answer('two-step-enrolment')));
      await owner.fill('form[action="/dashboard/account/totp/confirm"] input[name="code"]', await generate({ secret }));
      await submit(owner, owner.getByRole('button', { name: 'Turn on two-step sign-in' }));
      expect(await owner.locator('ul.codes li').count()).toBe(10);
      problems.push(...(await answer('two-step-recovery-codes')));
      // A passkey (no ceremony: the page only lists it), and the security activity.
      await world.db.handle.db
        .insertInto('passkeys')
        .values({ user_id: seeded.ownerId, credential_id: generateSecret(16), public_key: new Uint8Array([1, 2, 3]), transports: ['internal'], backed_up: true, name: 'Work laptop with a long descriptive passkey name' })
        .execute();
      problems.push(...(await visit('/dashboard/account', 'account-two-step-on')));
      expect(await owner.locator('td[data-label="Name"]', { hasText: 'Work laptop' }).count()).toBe(1);

      expectNoProblems(problems);
    },
    LONG_TEST_MS,
  );
});
