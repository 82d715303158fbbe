/**
 * The dashboard's first run (issue 29): every list says, while it is empty, what it is for and
 * how its first item gets there (dashboard/empty.eta), and stops saying so once it has one; every
 * destructive action answers a confirmation page first that names what it acts on and what will
 * stop working, guarded as the action is (CSRF, permission, organization), whose form posts to
 * the action; and every change ends on a page that says what it did (notice.ts: a sealed,
 * session-bound, one-time cookie; nothing in a URL becomes a notice).
 */
import type { LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember, changeMemberRole, createOrganization } from '../../src/accounts/organizations.js';
import { createRole } from '../../src/accounts/roles.js';
import { createUser } from '../../src/accounts/users.js';
import { recordAccountEvent, recordAuditEvent } from '../../src/audit/events.js';
import { createApplication } from '../../src/oauth/models/applications.js';
import { createConnection } from '../../src/sso/connections.js';
import { addDomain } from '../../src/sso/domains.js';
import { createWebhookEndpoint } from '../../src/webhooks/endpoints.js';
import { Browser, csrfTokenIn, expectPageSecurityHeaders } from '../accounts/browser.js';
import { TEST_SECRET_KEY, testConfig } from '../helpers/app.js';
import { BACKEND } from '../helpers/db.js';
import { finishJobs } from '../helpers/jobs.js';
import {
  accessTokenIn,
  clientCredentials,
  createWorld,
  grantRow,
  listContacts,
  newOrganization,
  PASSWORD,
  secretIn,
  selectOrganization,
  submit,
  userGrant,
  type World,
} from './fixture.js';

let w: World;
const config = testConfig({ WEBHOOK_ALLOW_PRIVATE: '1' });
const ssoSettings = { issuer: config.issuer, secretKey: TEST_SECRET_KEY, allowHttp: true };
const RECEIVER = 'http://127.0.0.1:9/hooks/first-run';

beforeAll(async () => {
  w = await createWorld({ env: { WEBHOOK_ALLOW_PRIVATE: '1' } });
});
afterAll(async () => {
  await w?.close();
});

let emptyCount = 0;

/** An organization with nothing in it yet (no application), the world's owner, admin and member in it and current. */
async function emptyOrganization(): Promise<{ id: number; name: string }> {
  const org = await createOrganization(w.db, { name: `First run ${++emptyCount}`, ownerUserId: w.users.owner.id });
  await addMember(w.db, { organizationId: org.id, userId: w.users.admin.id, role: 'admin' });
  await addMember(w.db, { organizationId: org.id, userId: w.users.member.id, role: 'member' });
  for (const role of ['owner', 'admin', 'member'] as const) expect((await selectOrganization(w.browsers[role], org.id)).statusCode).toBe(303);
  return org;
}

/** The empty state named `name` on the page (its inner HTML), or undefined. */
function emptyState(html: string, name: string): string | undefined {
  return new RegExp(`<div class="empty-state" data-empty="${name}">([\\s\\S]*?)</div>`).exec(html)?.[1];
}

/** The notice at the top of the page, or undefined. */
function noticeIn(html: string): string | undefined {
  return /<p class="notice" role="status">([^<]*)<\/p>/.exec(html)?.[1];
}

/** GETs where a 303 points, in the same browser. */
async function follow(b: Browser, res: LightMyRequestResponse): Promise<LightMyRequestResponse> {
  expect(res.statusCode, res.body.slice(0, 400)).toBe(303);
  return b.get(String(res.headers.location).split('#')[0]!);
}

/** GETs `url` and expects a page that shows `name`'s empty state (returned). */
async function expectEmpty(b: Browser, url: string, name: string): Promise<string> {
  const page = await b.get(url);
  expect(page.statusCode, url).toBe(200);
  const state = emptyState(page.body, name);
  expect(state, `${name} on ${url}`).toBeDefined();
  return state!;
}

async function expectNotEmpty(b: Browser, url: string, name: string): Promise<void> {
  const page = await b.get(url);
  expect(page.statusCode, url).toBe(200);
  expect(emptyState(page.body, name), `${name} on ${url}`).toBeUndefined();
}

/** The confirmation page's form: the one with a `confirm` field; its action and its fields. */
function confirmationForm(html: string): { action: string; fields: Record<string, string>; selects: Record<string, string[]> } {
  const form = [...html.matchAll(/<form method="post" action="([^"]+)"[^>]*>([\s\S]*?)<\/form>/g)].find((m) => m[2]!.includes('name="confirm"'));
  expect(form, 'a form with a confirm field').toBeDefined();
  const fields = Object.fromEntries([...form![2]!.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)">/g)].map((m) => [m[1]!, m[2]!]));
  const selects = Object.fromEntries(
    [...form![2]!.matchAll(/<select name="([^"]+)"[^>]*>([\s\S]*?)<\/select>/g)].map((m) => [m[1]!, [...m[2]!.matchAll(/<option value="([^"]*)"/g)].map((o) => o[1]!)]),
  );
  return { action: form![1]!.replaceAll('&amp;', '&'), fields, selects };
}

/** Sends the confirmation page's own form (its CSRF token and `confirm`), with `extra` fields. */
async function confirm(b: Browser, page: LightMyRequestResponse, extra: Record<string, string> = {}): Promise<LightMyRequestResponse> {
  const { action, fields } = confirmationForm(page.body);
  return b.post(action, { ...fields, ...extra });
}

describe(`dashboard empty states on ${BACKEND}`, () => {
  it('applications: what they are for, and how to add the first to those who may; gone once there is one', async () => {
    const org = await emptyOrganization();
    const owner = await expectEmpty(w.browsers.owner, '/dashboard/applications', 'applications');
    expect(owner).toContain('<strong>No applications yet.</strong>');
    expect(owner).toContain('a public one (a web or mobile app) signs people in and acts for them');
    expect(owner).toContain('Create the first one with a form below');
    const member = await expectEmpty(w.browsers.member, '/dashboard/applications', 'applications');
    expect(member).toContain('Someone whose role manages applications can create one.');
    expect(member).not.toContain('Create the first one');
    await createApplication(w.db, { organizationId: org.id, type: 'private', name: 'First', scopes: 'contacts.read' });
    await expectNotEmpty(w.browsers.owner, '/dashboard/applications', 'applications');
    await expectNotEmpty(w.browsers.member, '/dashboard/applications', 'applications');
  });

  it('connected apps: for those who see every grant, and for those who see only their own', async () => {
    const org = await newOrganization(w);
    const viewer = await createUser(w.db, { email: `first-run-viewer-${process.pid}@example.com`, password: PASSWORD, name: 'Viewer' });
    await addMember(w.db, { organizationId: org.id, userId: viewer.id, role: 'viewer' });
    const b = new Browser(w.app, '10.29.0.2');
    expect((await b.login(viewer.email, PASSWORD)).statusCode).toBe(303);
    expect((await selectOrganization(b, org.id)).statusCode).toBe(303);
    const admin = await expectEmpty(w.browsers.admin, '/dashboard/connected-apps', 'connected-apps');
    expect(admin).toContain('<strong>No connected apps yet.</strong>');
    expect(admin).toContain('when a member approves it');
    expect(admin).toContain('<a href="/dashboard/applications">Applications</a>');
    // A viewer (no grants.read) sees only the apps they connected themselves, and no link to Applications.
    const own = await expectEmpty(b, '/dashboard/connected-apps', 'connected-apps');
    expect(own).toContain('<strong>You have no connected apps here yet.</strong>');
    expect(own).not.toContain('/dashboard/applications');
    // Someone else's grant: the admin's list has it, the viewer's is still empty.
    await userGrant(w, org, w.users.owner.id, ['contacts.read']);
    await expectNotEmpty(w.browsers.admin, '/dashboard/connected-apps', 'connected-apps');
    await expectEmpty(b, '/dashboard/connected-apps', 'connected-apps');
    await userGrant(w, org, viewer.id, ['contacts.read']);
    await expectNotEmpty(b, '/dashboard/connected-apps', 'connected-apps');
  });

  it('pending invitations: how to invite; gone once one is sent', async () => {
    await newOrganization(w);
    const state = await expectEmpty(w.browsers.owner, '/dashboard/members', 'invitations');
    expect(state).toContain('<strong>No pending invitations.</strong>');
    expect(state).toContain('Invite someone with the form above');
    const email = `invitee-${process.pid}-${Date.now()}@example.com`;
    const page = await follow(w.browsers.owner, await submit(w.browsers.owner, '/dashboard/invitations', { email, role: 'member' }));
    expect(noticeIn(page.body)).toBe(`Invitation sent to ${email}.`);
    expect(emptyState(page.body, 'invitations')).toBeUndefined();
    expect(page.body).toContain(email);
  });

  it('roles: the built-in ones are there; until the organization has its own, how to make one', async () => {
    const org = await newOrganization(w);
    const state = await expectEmpty(w.browsers.owner, '/dashboard/roles', 'roles');
    expect(state).toContain('<strong>No roles of your own yet.</strong>');
    expect(state).toContain('Create one with the New role form below');
    await createRole(w.db, org.id, { name: 'Readers', permissions: ['contacts.read'] });
    await expectNotEmpty(w.browsers.owner, '/dashboard/roles', 'roles');
  });

  it('audit log: what it records; gone with the first event', async () => {
    const org = await emptyOrganization();
    // Creating an organization is its first event: only an organization without any shows the state.
    await w.db.deleteFrom('audit_events').where('organization_id', '=', org.id).execute();
    const state = await expectEmpty(w.browsers.owner, '/dashboard/audit', 'audit');
    expect(state).toContain('<strong>No events yet.</strong>');
    expect(state).toContain('with who made it');
    await recordAuditEvent(w.db, { organizationId: org.id, action: 'organization.updated', actor: { actorUserId: w.users.owner.id }, details: {} });
    await expectNotEmpty(w.browsers.owner, '/dashboard/audit', 'audit');
  });

  it('webhooks, an endpoint’s deliveries and a delivery’s attempts', async () => {
    const org = await newOrganization(w);
    const state = await expectEmpty(w.browsers.owner, '/dashboard/webhooks', 'webhooks');
    expect(state).toContain('<strong>No webhook endpoints yet.</strong>');
    expect(state).toContain('Add the first one with the form below');
    const { endpoint } = await createWebhookEndpoint(w.db, TEST_SECRET_KEY, org.id, { url: RECEIVER, events: ['member.added'] }, { config });
    await expectNotEmpty(w.browsers.owner, '/dashboard/webhooks', 'webhooks');
    const deliveries = await expectEmpty(w.browsers.owner, '/dashboard/webhooks', 'deliveries');
    expect(deliveries).toContain('Send a ping (above) to see the first delivery now.');
    // A delivery not due yet (no dispatcher picks it up during the test): listed, with no attempt.
    const event = await w.db
      .insertInto('webhook_events')
      .values({ organization_id: org.id, type: 'member.added', message_id: `msg_first_run_${endpoint.id}`, payload: JSON.stringify({ type: 'member.added' }) })
      .returning('id')
      .executeTakeFirstOrThrow();
    const delivery = await w.db
      .insertInto('webhook_deliveries')
      .values({ event_id: event.id, endpoint_id: endpoint.id, organization_id: org.id, next_attempt_at: new Date(Date.now() + 86_400_000) })
      .returning('id')
      .executeTakeFirstOrThrow();
    await expectNotEmpty(w.browsers.owner, '/dashboard/webhooks', 'deliveries');
    const detail = `/dashboard/webhooks/${endpoint.id}/deliveries/${delivery.id}`;
    expect(await expectEmpty(w.browsers.owner, detail, 'attempts')).toContain('<strong>No attempt yet.</strong>');
    await w.db.insertInto('webhook_attempts').values({ delivery_id: delivery.id, attempt: 1, duration_ms: 12, status: 500, response_body: 'no', error: null }).execute();
    await expectNotEmpty(w.browsers.owner, detail, 'attempts');
  });

  it('single sign-on: connections and domains', async () => {
    const org = await newOrganization(w);
    const connections = await expectEmpty(w.browsers.owner, '/dashboard/sso', 'sso-connections');
    expect(connections).toContain('<strong>No identity provider connected yet.</strong>');
    expect(connections).toContain('Add the first one with a form below');
    const domains = await expectEmpty(w.browsers.owner, '/dashboard/sso', 'sso-domains');
    expect(domains).toContain('publish the DNS TXT record it shows, then verify it');
    await createConnection(w.db, ssoSettings, org.id, { protocol: 'oidc', name: 'Okta', issuer: 'https://okta.example', client_id: 'c', client_secret: 's' });
    await expectNotEmpty(w.browsers.owner, '/dashboard/sso', 'sso-connections');
    await expectEmpty(w.browsers.owner, '/dashboard/sso', 'sso-domains');
    await addDomain(w.db, org.id, { domain: `first-run-${org.id}.example` });
    await expectNotEmpty(w.browsers.owner, '/dashboard/sso', 'sso-domains');
  });

  it('the Account page: passkeys and two-step sign-in’s security activity', async () => {
    const user = await createUser(w.db, { email: `first-run-account-${process.pid}@example.com`, password: PASSWORD, name: 'Fresh' });
    const b = new Browser(w.app, '10.29.0.1');
    expect((await b.login(user.email, PASSWORD)).statusCode).toBe(303);
    const passkeys = await expectEmpty(b, '/dashboard/account', 'passkeys');
    expect(passkeys).toContain('<strong>No passkeys yet.</strong>');
    expect(passkeys).toContain('Add one below');
    const activity = await expectEmpty(b, '/dashboard/account', 'security-activity');
    expect(activity).toContain('Changes to how you sign in are listed here');
    await w.db.insertInto('passkeys').values({ user_id: user.id, credential_id: `first-run-${user.id}`, public_key: new Uint8Array([1, 2, 3]), name: 'Laptop' }).execute();
    await recordAccountEvent(w.db, { userId: user.id, action: 'passkey.added' });
    await expectNotEmpty(b, '/dashboard/account', 'passkeys');
    await expectNotEmpty(b, '/dashboard/account', 'security-activity');
  });
});

describe(`dashboard confirmation pages on ${BACKEND}`, () => {
  it('removing a member names them and their connected apps, changes nothing, and its form removes them', async () => {
    const org = await newOrganization(w);
    const grant = await userGrant(w, org, w.users.member.id, ['contacts.read']);
    const members = await w.browsers.admin.get('/dashboard/members');
    expect(members.body).toContain(`action="/dashboard/members/${w.users.member.id}/remove"`);
    const ask = await submit(w.browsers.admin, `/dashboard/members/${w.users.member.id}/remove`);
    expect(ask.statusCode).toBe(200);
    expectPageSecurityHeaders(ask);
    expect(ask.body).toContain(`<h1>Remove ${w.users.member.email} from ${org.name}?</h1>`);
    expect(ask.body).toContain(`Their <strong>1 connected app</strong> there is disconnected: every token it holds for them in ${org.name} stops working.`);
    expect(ask.body).toContain('single sign-on does not add them back');
    expect(ask.body).toContain(`>Remove ${w.users.member.email}</button>`);
    expect(ask.body).toContain('<a class="button secondary" href="/dashboard/members">Cancel</a>');
    const form = confirmationForm(ask.body);
    expect(form.action).toBe(`/dashboard/members/${w.users.member.id}/remove`);
    expect(form.fields).toEqual({ csrf_token: csrfTokenIn(members.body), confirm: 'remove' });
    // Asking changed nothing.
    expect((await w.db.selectFrom('memberships').select('role').where('organization_id', '=', org.id).where('user_id', '=', w.users.member.id).executeTakeFirst())?.role).toBe('member');
    expect((await grantRow(w, grant)).revoked_at).toBeNull();

    const done = await confirm(w.browsers.admin, ask);
    expect(done.headers.location).toBe('/dashboard/members');
    const page = await follow(w.browsers.admin, done);
    expect(noticeIn(page.body)).toBe(`Removed ${w.users.member.email} from ${org.name}. Their 1 connected app lost access: every token they had there stopped working.`);
    expect(await w.db.selectFrom('memberships').select('role').where('organization_id', '=', org.id).where('user_id', '=', w.users.member.id).executeTakeFirst()).toBeUndefined();
    await finishJobs(w.db);
    expect(await grantRow(w, grant)).toMatchObject({ revoked_reason: 'member_removed' });
    // Said once: the same page again has no notice.
    expect(noticeIn((await w.browsers.admin.get('/dashboard/members')).body)).toBeUndefined();
  });

  it('leaving: someone removing themselves is asked to leave, and lands on the overview told so', async () => {
    const org = await newOrganization(w);
    const ask = await submit(w.browsers.admin, `/dashboard/members/${w.users.admin.id}/remove`);
    expect(ask.statusCode).toBe(200);
    expect(ask.body).toContain(`<h1>Leave ${org.name}?</h1>`);
    expect(ask.body).toContain('You have no connected apps there.');
    expect(ask.body).toContain(`>Leave ${org.name}</button>`);
    const done = await confirm(w.browsers.admin, ask);
    expect(done.headers.location).toBe('/dashboard');
    expect(noticeIn((await follow(w.browsers.admin, done)).body)).toBe(`You left ${org.name}.`);
  });

  it('revoking an invitation names the address and the role, and its form revokes it', async () => {
    const org = await newOrganization(w);
    const email = `revoked-${process.pid}-${org.id}@example.com`;
    expect((await submit(w.browsers.owner, '/dashboard/invitations', { email, role: 'admin' })).statusCode).toBe(303);
    const invitation = await w.db.selectFrom('invitations').select('id').where('organization_id', '=', org.id).where('email', '=', email).executeTakeFirstOrThrow();
    const members = await w.browsers.owner.get('/dashboard/members');
    expect(members.body).toContain(`action="/dashboard/invitations/${invitation.id}/revoke"`);
    const ask = await submit(w.browsers.owner, `/dashboard/invitations/${invitation.id}/revoke`);
    expect(ask.statusCode).toBe(200);
    expect(ask.body).toContain(`<h1>Revoke the invitation to ${email}?</h1>`);
    expect(ask.body).toContain(`it can no longer be used to join ${org.name} as admin.`);
    expect(confirmationForm(ask.body).action).toBe(`/dashboard/invitations/${invitation.id}/revoke`);
    const revokedAt = () => w.db.selectFrom('invitations').select('revoked_at').where('id', '=', invitation.id).executeTakeFirstOrThrow();
    expect((await revokedAt()).revoked_at).toBeNull();
    const page = await follow(w.browsers.owner, await confirm(w.browsers.owner, ask));
    expect(noticeIn(page.body)).toBe(`Revoked the invitation to ${email}: its link no longer works.`);
    expect((await revokedAt()).revoked_at).not.toBeNull();
    expect(emptyState(page.body, 'invitations')).toBeDefined();
  });

  it('revoking a connected app names the application, who gave it and what, and its form stops its tokens', async () => {
    const org = await newOrganization(w);
    const theirs = await userGrant(w, org, w.users.member.id, ['contacts.read']);
    const ask = await submit(w.browsers.admin, `/dashboard/connected-apps/${theirs}/revoke`);
    expect(ask.statusCode).toBe(200);
    expect(ask.body).toContain('<h1>Revoke Web?</h1>');
    expect(ask.body).toContain(`${w.users.member.email} let Web act for them in ${org.name} with <code>contacts.read</code>.`);
    expect(ask.body).toContain('Revoking it stops its access and refresh tokens at once');
    expect(confirmationForm(ask.body).action).toBe(`/dashboard/connected-apps/${theirs}/revoke`);
    expect((await grantRow(w, theirs)).revoked_at).toBeNull();
    const page = await follow(w.browsers.admin, await confirm(w.browsers.admin, ask));
    expect(noticeIn(page.body)).toBe(`Revoked Web’s access, given by ${w.users.member.email}: its tokens stopped working.`);
    expect(await grantRow(w, theirs)).toMatchObject({ revoked_reason: 'revoked_by_user' });

    // One's own, and an application's own grant (its tokens die; it can get new ones).
    const mine = await userGrant(w, org, w.users.member.id, ['contacts.read']);
    const own = await submit(w.browsers.member, `/dashboard/connected-apps/${mine}/revoke`);
    expect(own.body).toContain(`You let Web act for you in ${org.name}`);
    expect(noticeIn((await follow(w.browsers.member, await confirm(w.browsers.member, own))).body)).toBe('Revoked Web’s access, given by you: its tokens stopped working.');
    const token = accessTokenIn((await submit(w.browsers.owner, `/dashboard/applications/${org.privateApp.client_id}/token`, { scopes: ['contacts.read'] })).body) ?? '';
    const clientGrant = await w.db.selectFrom('grants').select('id').where('organization_id', '=', org.id).where('user_id', 'is', null).where('revoked_at', 'is', null).executeTakeFirstOrThrow();
    const itself = await submit(w.browsers.owner, `/dashboard/connected-apps/${clientGrant.id}/revoke`);
    expect(itself.body).toContain('Backend got this grant for itself (client credentials)');
    expect((await listContacts(w.app, org.id, token)).statusCode).toBe(200);
    const page2 = await follow(w.browsers.owner, await confirm(w.browsers.owner, itself));
    expect(noticeIn(page2.body)).toBe('Revoked the grant Backend had for itself: its tokens stopped working.');
    expect((await listContacts(w.app, org.id, token)).statusCode).toBe(401);
  });

  it('deleting an application says its tokens stop and how many grants end; its form deletes it', async () => {
    const org = await newOrganization(w);
    const token = accessTokenIn((await submit(w.browsers.admin, `/dashboard/applications/${org.privateApp.client_id}/token`, { scopes: ['contacts.read'] })).body) ?? '';
    const path = `/dashboard/applications/${org.privateApp.client_id}`;
    const ask = await submit(w.browsers.admin, `${path}/delete`);
    expect(ask.statusCode).toBe(200);
    expect(ask.body).toContain('<h1>Delete Backend?</h1>');
    expect(ask.body).toContain('orgauth refuses its client ID and secret, and every token it holds.');
    expect(ask.body).toContain('Its <strong>1 grant</strong> is revoked');
    expect(ask.body).toContain('This cannot be undone.');
    expect(confirmationForm(ask.body)).toMatchObject({ action: `${path}/delete`, fields: { confirm: 'delete' } });
    expect((await listContacts(w.app, org.id, token)).statusCode).toBe(200);
    const done = await confirm(w.browsers.admin, ask);
    expect(done.headers.location).toBe('/dashboard/applications');
    const page = await follow(w.browsers.admin, done);
    expect(noticeIn(page.body)).toBe('Deleted Backend: its client ID and secret are refused and its tokens stopped working; its 1 grant is being revoked.');
    expect((await listContacts(w.app, org.id, token)).statusCode).toBe(401);
  });

  it('disabling an application and rotating its secret ask first too, and their forms do it', async () => {
    const org = await newOrganization(w);
    const path = `/dashboard/applications/${org.privateApp.client_id}`;
    const page = await w.browsers.owner.get(path);
    expect(page.body).toContain('>Rotate secret…</button>');
    expect(page.body).toContain('>Disable application…</button>');
    expect(page.body).toContain('>Delete application…</button>');

    const rotate = await submit(w.browsers.owner, `${path}/secret`);
    expect(rotate.body).toContain('<h1>Rotate the client secret of Backend?</h1>');
    expect(rotate.body).toContain('The current secret stops working at once');
    expect(secretIn(rotate.body)).toBeUndefined();
    expect(confirmationForm(rotate.body)).toMatchObject({ action: `${path}/secret`, fields: { confirm: 'rotate' } });
    expect((await clientCredentials(w.app, org.id, org.privateApp.client_id, org.privateApp.client_secret)).statusCode).toBe(200);
    const rotated = await confirm(w.browsers.owner, rotate);
    expect(rotated.statusCode).toBe(200);
    expect(rotated.body).toContain('The secret was replaced; the old one no longer works.');
    expect((await clientCredentials(w.app, org.id, org.privateApp.client_id, secretIn(rotated.body) ?? '')).statusCode).toBe(200);

    const disable = await submit(w.browsers.owner, `${path}/disable`);
    expect(disable.body).toContain('<h1>Disable Backend?</h1>');
    expect(disable.body).toContain('Its <strong>1 grant</strong> is revoked');
    expect(confirmationForm(disable.body)).toMatchObject({ action: `${path}/disable`, fields: { confirm: 'disable' } });
    expect((await w.db.selectFrom('applications').select('disabled').where('client_id', '=', org.privateApp.client_id).executeTakeFirstOrThrow()).disabled).toBe(false);
    const done = await confirm(w.browsers.owner, disable);
    expect(done.headers.location).toBe(path);
    expect(noticeIn((await follow(w.browsers.owner, done)).body)).toBe('Disabled Backend: its tokens stopped working, and its 1 grant is being revoked.');
    expect((await w.db.selectFrom('applications').select('disabled').where('client_id', '=', org.privateApp.client_id).executeTakeFirstOrThrow()).disabled).toBe(true);
  });

  it('deleting a role says who holds it and where they go; its form moves them and deletes it', async () => {
    const org = await newOrganization(w);
    const sales = await createRole(w.db, org.id, { name: 'Sales', permissions: ['contacts.read', 'contacts.write'] });
    await changeMemberRole(w.db, { organizationId: org.id, userId: w.users.member.id, role: sales });
    const roles = await w.browsers.admin.get('/dashboard/roles');
    expect(roles.body).toContain('<form method="post" action="/dashboard/roles/Sales/delete" class="inline">');
    expect(roles.body).toContain('>Delete role…</button>');
    const ask = await submit(w.browsers.admin, '/dashboard/roles/Sales/delete');
    expect(ask.statusCode).toBe(200);
    expect(ask.body).toContain('<h1>Delete the role Sales?</h1>');
    expect(ask.body).toContain('<strong>1 member</strong> holds it. They move to the role you choose below, and their connected apps lose at once whatever that role does not allow.');
    const form = confirmationForm(ask.body);
    expect(form).toMatchObject({ action: '/dashboard/roles/Sales/delete', fields: { confirm: 'delete' } });
    // The roles an admin may give, not the one going, nor owner.
    expect(form.selects.move_to).toEqual(['', 'admin', 'member', 'viewer']);
    expect(await w.db.selectFrom('roles').select('deleting').where('id', '=', sales.id!).executeTakeFirstOrThrow()).toEqual({ deleting: false });
    const done = await confirm(w.browsers.admin, ask, { move_to: 'viewer' });
    expect(done.headers.location).toBe('/dashboard/roles');
    expect(noticeIn((await follow(w.browsers.admin, done)).body)).toBe('Deleted the role Sales. Its 1 member moves to viewer; their connected apps keep only what viewer allows.');
    await finishJobs(w.db);
    expect((await w.db.selectFrom('memberships').select('role').where('organization_id', '=', org.id).where('user_id', '=', w.users.member.id).executeTakeFirstOrThrow()).role).toBe('viewer');

    // A role nobody holds: nothing to move.
    await createRole(w.db, org.id, { name: 'Unused', permissions: ['tasks.read'] });
    const unused = await submit(w.browsers.admin, '/dashboard/roles/Unused/delete');
    expect(unused.body).toContain('Nobody holds it and no invitation names it: nobody else is affected.');
    expect(confirmationForm(unused.body).selects).toEqual({});
    expect(noticeIn((await follow(w.browsers.admin, await confirm(w.browsers.admin, unused))).body)).toBe('Deleted the role Unused.');
  });

  it('removing an SSO domain says what changes for the people there; its form removes it', async () => {
    const org = await newOrganization(w);
    const verified = `verified-${org.id}.example`;
    const pending = `pending-${org.id}.example`;
    await addDomain(w.db, org.id, { domain: verified });
    await addDomain(w.db, org.id, { domain: pending });
    await w.db.updateTable('sso_domains').set({ state: 'verified', verified_at: new Date(), sso_required: true }).where('domain', '=', verified).execute();
    const ask = await submit(w.browsers.owner, `/dashboard/sso/domains/${verified}/delete`);
    expect(ask.statusCode).toBe(200);
    expect(ask.body).toContain(`<h1>Remove the domain ${verified}?</h1>`);
    expect(ask.body).toContain(`People with addresses at ${verified} are no longer sent to your identity provider when they sign in, and single sign-on is no longer required of them`);
    expect(ask.body).toContain('Its verification is lost');
    expect(confirmationForm(ask.body)).toMatchObject({ action: `/dashboard/sso/domains/${verified}/delete`, fields: { confirm: 'delete' } });
    const notPending = await submit(w.browsers.owner, `/dashboard/sso/domains/${pending}/delete`);
    expect(notPending.body).toContain(`${pending} is not verified yet, so nothing changes for anyone`);
    const page = await follow(w.browsers.owner, await confirm(w.browsers.owner, ask));
    expect(noticeIn(page.body)).toBe(`Removed the domain ${verified}: addresses there are no longer sent to your identity provider.`);
    expect(await w.db.selectFrom('sso_domains').select('id').where('domain', '=', verified).executeTakeFirst()).toBeUndefined();
  });
});

describe(`dashboard confirmation pages are guarded as their actions on ${BACKEND}`, () => {
  it('a member without the permission gets 403 and learns nothing of what the page would name', async () => {
    const org = await newOrganization(w);
    const invitee = `guarded-${process.pid}-${org.id}@example.com`;
    expect((await submit(w.browsers.owner, '/dashboard/invitations', { email: invitee, role: 'member' })).statusCode).toBe(303);
    const invitation = await w.db.selectFrom('invitations').select('id').where('email', '=', invitee).executeTakeFirstOrThrow();
    await createRole(w.db, org.id, { name: 'Guarded', permissions: ['contacts.read'] });
    const ownersGrant = await userGrant(w, org, w.users.owner.id, ['contacts.read']);
    await addDomain(w.db, org.id, { domain: `guarded-${org.id}.example` });
    const asks: [string, string][] = [
      [`/dashboard/members/${w.users.admin.id}/remove`, w.users.admin.email],
      [`/dashboard/invitations/${invitation.id}/revoke`, invitee],
      ['/dashboard/roles/Guarded/delete', 'holds it'],
      [`/dashboard/applications/${org.privateApp.client_id}/delete`, 'Delete Backend'],
      [`/dashboard/applications/${org.privateApp.client_id}/disable`, 'Disable Backend'],
      [`/dashboard/applications/${org.privateApp.client_id}/secret`, 'Rotate the client secret'],
      [`/dashboard/connected-apps/${ownersGrant}/revoke`, w.users.owner.email],
      [`/dashboard/sso/domains/guarded-${org.id}.example/delete`, 'Remove the domain'],
    ];
    for (const [url, secret] of asks) {
      const res = await submit(w.browsers.member, url);
      expect(res.statusCode, url).toBe(403);
      expectPageSecurityHeaders(res);
      expect(res.body, url).not.toContain(secret);
      expect(res.body, url).not.toContain('name="confirm"');
      // Nor without the session's CSRF token, whoever asks.
      const bare = await w.browsers.owner.post(url, {});
      expect(bare.statusCode, url).toBe(403);
      expect(bare.body, url).not.toContain('name="confirm"');
    }
    // Nothing was done.
    expect((await grantRow(w, ownersGrant)).revoked_at).toBeNull();
    expect((await w.db.selectFrom('memberships').select('role').where('organization_id', '=', org.id).where('user_id', '=', w.users.admin.id).executeTakeFirstOrThrow()).role).toBe('admin');
  });

  it('outside the organization: 404, naming nothing', async () => {
    const org = await newOrganization(w);
    const grant = await userGrant(w, org, w.users.member.id, ['contacts.read']);
    for (const [url, secret] of [
      [`/dashboard/members/${w.users.member.id}/remove`, w.users.member.email],
      [`/dashboard/connected-apps/${grant}/revoke`, w.users.member.email],
      [`/dashboard/applications/${org.privateApp.client_id}/delete`, 'Backend'],
    ] as const) {
      const res = await submit(w.browsers.outsider, url);
      expect(res.statusCode, url).toBe(404);
      expect(res.body, url).not.toContain(secret);
      expect(res.body, url).not.toContain('name="confirm"');
    }
  });

  it('what the action would refuse is refused before asking: the last owner, an owner by an admin, a role beyond the asker’s', async () => {
    const org = await newOrganization(w);
    const last = await submit(w.browsers.owner, `/dashboard/members/${w.users.owner.id}/remove`);
    expect(last.statusCode).toBe(409);
    expect(last.body).toContain('the last owner of an organization cannot be removed');
    expect(last.body).not.toContain('name="confirm"');
    const byAdmin = await submit(w.browsers.admin, `/dashboard/members/${w.users.owner.id}/remove`);
    expect(byAdmin.statusCode).toBe(403);
    expect(byAdmin.body).toContain('only an owner may make an owner, or change or remove one');
    expect(byAdmin.body).not.toContain('name="confirm"');
    // A recruiter manages members but holds little: a wider role is not theirs to delete, nor to be asked about.
    const recruiter = await createRole(w.db, org.id, { name: 'Recruiter', permissions: ['members.read', 'members.write', 'contacts.read'] });
    await createRole(w.db, org.id, { name: 'Wide', permissions: ['contacts.read', 'tasks.write'] });
    await changeMemberRole(w.db, { organizationId: org.id, userId: w.users.member.id, role: recruiter });
    const wide = await submit(w.browsers.member, '/dashboard/roles/Wide/delete');
    expect(wide.statusCode).toBe(403);
    expect(wide.body).toContain('your role does not hold tasks.write');
    expect(wide.body).not.toContain('name="confirm"');
  });
});

describe(`dashboard notices on ${BACKEND}`, () => {
  it('each change says what it did on the page it redirects to, once', async () => {
    const org = await newOrganization(w);
    const other = await newOrganization(w, { select: false });
    const owner = w.browsers.owner;
    const newcomer = await createUser(w.db, { email: `notice-${process.pid}-${org.id}@example.com`, password: PASSWORD, name: 'Newcomer' });
    const app = `/dashboard/applications/${org.publicApp.client_id}`;
    const changes: [string, Record<string, string | string[]>, string][] = [
      ['/dashboard/organization', { organization_id: String(other.id) }, `You are now working in ${other.name}.`],
      ['/dashboard/organization', { organization_id: String(org.id) }, `You are now working in ${org.name}.`],
      ['/dashboard/members', { email: newcomer.email, role: 'viewer' }, `Added ${newcomer.email} to ${org.name} as viewer.`],
      [`/dashboard/members/${newcomer.id}/role`, { role: 'member' }, `${newcomer.email} now has the role member in ${org.name}.`],
      ['/dashboard/members/require-mfa', { require_mfa: 'no' }, 'Two-step sign-in is no longer required.'],
      ['/dashboard/roles', { name: 'Support', scopes: ['contacts.read'] }, 'Role Support created.'],
      ['/dashboard/roles/Support', { name: 'Support', description: 'Helps', scopes: ['contacts.read'] }, 'Role Support saved.'],
      [app, { name: 'Web 2', redirect_uris: 'https://client.example.com/cb', scopes: ['contacts.read', 'contacts.write', 'tasks.read'] }, 'Saved Web 2.'],
      [`${app}/security`, { token_endpoint_auth_method: 'client_secret_basic', id_token_signed_response_alg: 'RS256' }, 'Saved the security settings of Web 2.'],
      ['/dashboard/sso/domains', { domain: `notice-${org.id}.example` }, `notice-${org.id}.example was added. Publish its TXT record (below), then verify it.`],
    ];
    for (const [url, fields, notice] of changes) {
      const res = await submit(owner, url, fields);
      const page = await follow(owner, res);
      expect(noticeIn(page.body), url).toBe(notice);
      // Once: the same page again says nothing.
      expect(noticeIn((await owner.get(String(res.headers.location).split('#')[0]!)).body), url).toBeUndefined();
    }
  });

  it('nothing in a URL becomes a notice, and a notice is neither movable to another session nor forgeable', async () => {
    await newOrganization(w);
    // Switching to it said so; that notice is shown (and gone) first.
    expect(noticeIn((await w.browsers.owner.get('/dashboard')).body)).toMatch(/^You are now working in /);
    const page = await w.browsers.owner.get('/dashboard/members?notice=Removed+everyone&done=removed&message=hi');
    expect(page.statusCode).toBe(200);
    expect(noticeIn(page.body)).toBeUndefined();
    expect(page.body).not.toContain('Removed everyone');

    const res = await submit(w.browsers.owner, '/dashboard/members/require-mfa', { require_mfa: 'no' });
    expect(res.statusCode).toBe(303);
    const name = [...w.browsers.owner.cookies.keys()].find((k) => k.endsWith('orgauth_notice'));
    expect(name).toBeDefined();
    const sealed = w.browsers.owner.cookies.get(name!)!;
    expect(sealed).not.toContain('Two-step');
    // The admin's browser with the owner's notice cookie: another session's, so nothing (and it is cleared).
    w.browsers.admin.cookies.set(name!, sealed);
    expect(noticeIn((await w.browsers.admin.get('/dashboard/members')).body)).toBeUndefined();
    expect(w.browsers.admin.cookies.has(name!)).toBe(false);
    // Tampered with: nothing.
    const flipped = sealed.at(-2) === 'A' ? 'B' : 'A';
    w.browsers.owner.cookies.set(name!, `${sealed.slice(0, -2)}${flipped}${sealed.slice(-1)}`);
    expect(noticeIn((await w.browsers.owner.get('/dashboard/members')).body)).toBeUndefined();
    expect(w.browsers.owner.cookies.has(name!)).toBe(false);
  });
});
