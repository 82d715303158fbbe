/**
 * Organization roles decide what a user may grant (issue 15): the matrix of roles × requested
 * scopes × application scopes through the real consent page and token endpoint, and role changes
 * under live tokens on two instances (each with its own pool and LISTEN connection on PostgreSQL).
 */
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember, changeMemberRole, removeMember } from '../../src/accounts/organizations.js';
import { createRole, requireRole, type RoleRef } from '../../src/accounts/roles.js';
import { createUser } from '../../src/accounts/users.js';
import { acceptInvitation } from '../../src/accounts/invitations.js';
import { generateSecret, sha256Hex } from '../../src/lib/crypto.js';
import { createApplication, type ApplicationWithSecret } from '../../src/oauth/models/applications.js';
import { DATA_SCOPES, KNOWN_SCOPES } from '../../src/oauth/helpers/scopes.js';
import { Browser } from '../accounts/browser.js';
import { testConfig } from '../helpers/app.js';
import { BACKEND } from '../helpers/db.js';
import { deadlinePoll } from '../helpers/instances.js';
import { type InstancePair, startInstancePair } from '../helpers/instance-pair.js';
import { basic, clientCredentialsToken, createOrgFixture, form, type OrgFixture } from '../helpers/oauth.js';
import { finishJobs } from '../helpers/jobs.js';

const PASSWORD = 'roles-password-1';
const REDIRECT = 'https://roles-client.example.com/cb';
const STATE = 'state-roles-0123456789';

let pair: InstancePair;
let t: InstancePair['t'];
let app: FastifyInstance;
let second: FastifyInstance;
let org: OrgFixture;
let admin: string;
let n = 0;

beforeAll(async () => {
  pair = await startInstancePair();
  ({ t, app, second } = pair);
  org = await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') });
  admin = await clientCredentialsToken(app, org);
});
afterAll(() => pair.close());

async function publicApp(scopes: readonly string[]): Promise<ApplicationWithSecret> {
  return createApplication(t.handle.db, { organizationId: org.organizationId, type: 'public', name: `Roles app ${++n}`, redirectUris: [REDIRECT], scopes: scopes.join(' ') });
}

/** A signed-in user holding `role` in the organization. */
async function memberWith(role: RoleRef | 'owner' | 'admin' | 'member' | 'viewer'): Promise<{ id: number; email: string; browser: Browser }> {
  const email = `roles-${++n}-${Date.now()}@example.com`;
  const user = await createUser(t.handle.db, { email, password: PASSWORD });
  await addMember(t.handle.db, { organizationId: org.organizationId, userId: user.id, role });
  const browser = new Browser(app);
  expect((await browser.login(email, PASSWORD)).statusCode).toBe(303);
  return { id: user.id, email, browser };
}

function hiddenFields(html: string): Record<string, string> {
  const fields: Record<string, string> = {};
  const unescape = (s: string) => s.replace(/&quot;/g, '"').replace(/&#39;/g, "'").replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&amp;/g, '&');
  for (const m of html.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)">/g)) fields[m[1] ?? ''] = unescape(m[2] ?? '');
  return fields;
}

/** The scope names of one of the consent page's lists (granted or refused) for the organization. */
function listed(html: string, list: 'granted' | 'refused'): string[] {
  const block = html.split(`data-organization-id="${org.organizationId}"`)[1]?.split('</div>')[0] ?? '';
  const ul = block.split(`<ul class="scopes ${list}">`)[1]?.split('</ul>')[0] ?? '';
  return [...ul.matchAll(/<code>([^<]+)<\/code>/g)].map((m) => m[1]!);
}

type Outcome = { error: string } | { scope: string; access_token: string; refresh_token: string; page: { granted: string[]; refused: string[] } };

/** The whole flow: the consent page, Allow for the organization, the code at the token endpoint. */
async function authorize(browser: Browser, application: ApplicationWithSecret, scope: string): Promise<Outcome> {
  // prompt=consent: the page every time, though the user may have approved this application before.
  const query = new URLSearchParams({ response_type: 'code', client_id: application.client_id, redirect_uri: REDIRECT, scope, state: STATE, prompt: 'consent' });
  const page = await browser.get(`/oauth/authorize?${query}`);
  if (page.statusCode === 303) return { error: new URL(page.headers.location as string).searchParams.get('error') ?? 'none' };
  expect(page.statusCode, page.body).toBe(200);
  const shown = { granted: listed(page.body, 'granted'), refused: listed(page.body, 'refused') };
  const approved = await browser.post('/oauth/authorize', { ...hiddenFields(page.body), organization_id: String(org.organizationId), decision: 'approve' });
  expect(approved.statusCode, approved.body).toBe(303);
  const code = new URL(approved.headers.location as string).searchParams.get('code');
  expect(code).toBeTruthy();
  const token = await tokenRequest(application, { grant_type: 'authorization_code', code: code!, redirect_uri: REDIRECT });
  expect(token.statusCode, token.body).toBe(200);
  return { ...token.json(), page: shown };
}

/** A code approved on the consent page for the organization, not yet redeemed. */
async function approvedCode(browser: Browser, application: ApplicationWithSecret, scope: string): Promise<string> {
  const query = new URLSearchParams({ response_type: 'code', client_id: application.client_id, redirect_uri: REDIRECT, scope, state: STATE });
  const page = await browser.get(`/oauth/authorize?${query}`);
  const approved = await browser.post('/oauth/authorize', { ...hiddenFields(page.body), organization_id: String(org.organizationId), decision: 'approve' });
  const code = new URL(approved.headers.location as string).searchParams.get('code');
  expect(code).toBeTruthy();
  return code!;
}

function tokenRequest(application: ApplicationWithSecret, fields: Record<string, string>, target: FastifyInstance = app): Promise<LightMyRequestResponse> {
  return target.inject({
    method: 'POST',
    url: '/oauth/token',
    headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(application.client_id, application.client_secret) },
    payload: form(fields),
  });
}

async function api(target: FastifyInstance, token: string, method: 'GET' | 'POST' | 'PATCH' | 'DELETE', path: string, body?: object): Promise<LightMyRequestResponse> {
  const res = await target.inject({ method, url: `/api/v1/${org.organizationId}${path}`, headers: { authorization: `Bearer ${token}` }, ...(body ? { payload: body } : {}) });
  // A role's deletion is finished by a job (moving its members): the tests look at the state after it.
  if (method === 'DELETE' && path.startsWith('/roles/') && res.statusCode === 204) await finishJobs(t.handle.db);
  return res;
}

const writeContact = (target: FastifyInstance, token: string) => api(target, token, 'POST', '/contacts', { name: 'Role probe' });
const readContacts = (target: FastifyInstance, token: string) => api(target, token, 'GET', '/contacts');

function expectInsufficientScope(res: LightMyRequestResponse): void {
  expect(res.statusCode, res.body).toBe(403);
  expect(res.headers['www-authenticate']).toMatch(/error="insufficient_scope"/);
}

const canonical = (scopes: readonly string[]) => KNOWN_SCOPES.filter((s) => scopes.includes(s));

describe(`the consent matrix on ${BACKEND}: granted = requested ∩ application's scopes ∩ role's permissions`, () => {
  const ROLE_NAMES = ['owner', 'admin', 'member', 'viewer', 'Sales', 'Tasks only'] as const;
  const REQUESTS = ['contacts.read contacts.write', 'tasks.read', 'contacts.read tasks.write', DATA_SCOPES.join(' '), 'tasks.write'];
  const APPS = { all: [...DATA_SCOPES], contacts: ['contacts.read', 'contacts.write'] };
  const users = new Map<string, { browser: Browser; permissions: readonly string[] }>();
  const apps = new Map<string, ApplicationWithSecret>();

  beforeAll(async () => {
    await createRole(t.handle.db, org.organizationId, { name: 'Sales', permissions: ['contacts.read', 'contacts.write'] });
    await createRole(t.handle.db, org.organizationId, { name: 'Tasks only', permissions: ['tasks.read', 'tasks.write', 'audit.read'] });
    for (const name of ROLE_NAMES) {
      const role = await requireRole(t.handle.db, org.organizationId, name);
      users.set(name, { browser: (await memberWith(role)).browser, permissions: role.permissions });
    }
    for (const [name, scopes] of Object.entries(APPS)) apps.set(name, await publicApp(scopes));
  });

  const cases = ROLE_NAMES.flatMap((role) => REQUESTS.flatMap((requested) => Object.keys(APPS).map((appName) => [role, requested, appName] as const)));

  it.each(cases)('%s asking %j of the %s application', async (role, requested, appName) => {
    const user = users.get(role)!;
    const appScopes: readonly string[] = APPS[appName as keyof typeof APPS];
    const asked = requested.split(' ');
    const outcome = await authorize(user.browser, apps.get(appName)!, requested);
    if (!asked.every((s) => appScopes.includes(s))) {
      // Beyond what the application may ask for: the request is refused before any role counts.
      expect(outcome).toEqual({ error: 'invalid_scope' });
      return;
    }
    const granted = canonical(asked.filter((s) => user.permissions.includes(s)));
    if (granted.length === 0) {
      expect(outcome).toEqual({ error: 'access_denied' });
      return;
    }
    if ('error' in outcome) throw new Error(`expected a token, got ${outcome.error}`);
    expect(outcome.scope).toBe(granted.join(' '));
    expect(outcome.page.granted).toEqual(granted);
    expect(outcome.page.refused).toEqual(canonical(asked.filter((s) => !user.permissions.includes(s))));
    // The access token holds what was granted, and the API agrees.
    const payload = JSON.parse(Buffer.from(outcome.access_token.split('.')[1]!, 'base64url').toString());
    expect(payload.scope).toBe(granted.join(' '));
    if (granted.includes('contacts.read')) expect((await readContacts(app, outcome.access_token)).statusCode).toBe(200);
    else expectInsufficientScope(await readContacts(app, outcome.access_token));
    // Refreshing never widens it.
    const refreshed = await tokenRequest(apps.get(appName)!, { grant_type: 'refresh_token', refresh_token: outcome.refresh_token });
    expect(refreshed.statusCode).toBe(200);
    expect(refreshed.json().scope).toBe(granted.join(' '));
  });
});

describe(`issue 15's must-shows on ${BACKEND}`, () => {
  it('a viewer approving contacts.read contacts.write gets scope "contacts.read"; creating a contact is 403 insufficient_scope', async () => {
    const viewer = await memberWith('viewer');
    const outcome = await authorize(viewer.browser, await publicApp(DATA_SCOPES), 'contacts.read contacts.write');
    if ('error' in outcome) throw new Error(outcome.error);
    expect(outcome.scope).toBe('contacts.read');
    expect(outcome.page).toEqual({ granted: ['contacts.read'], refused: ['contacts.write'] });
    expect((await readContacts(app, outcome.access_token)).statusCode).toBe(200);
    expectInsufficientScope(await writeContact(app, outcome.access_token));
  });

  it('a custom role "Sales" (contacts only) cannot read tasks; given tasks.read, a new authorization includes it and the old grant stays as it was', async () => {
    const sales = await createRole(t.handle.db, org.organizationId, { name: 'Sales team', permissions: ['contacts.read', 'contacts.write'] });
    const member = await memberWith(sales);
    const application = await publicApp(DATA_SCOPES);
    const before = await authorize(member.browser, application, 'contacts.read tasks.read');
    if ('error' in before) throw new Error(before.error);
    expect(before.scope).toBe('contacts.read');
    expectInsufficientScope(await api(app, before.access_token, 'GET', '/tasks'));
    // Given tasks.read through the management API.
    const patched = await api(app, admin, 'PATCH', `/roles/${encodeURIComponent('Sales team')}`, { permissions: ['contacts.read', 'contacts.write', 'tasks.read'] });
    expect(patched.statusCode, patched.body).toBe(200);
    expect(patched.json().permissions).toEqual(['contacts.read', 'contacts.write', 'tasks.read']);
    const after = await authorize(member.browser, application, 'contacts.read tasks.read');
    if ('error' in after) throw new Error(after.error);
    expect(after.scope).toBe('contacts.read tasks.read');
    expect((await api(app, after.access_token, 'GET', '/tasks')).statusCode).toBe(200);
    // Widening a role widens no existing grant: the earlier refresh token keeps its scope.
    const refreshed = await tokenRequest(application, { grant_type: 'refresh_token', refresh_token: before.refresh_token });
    expect(refreshed.json().scope).toBe('contacts.read');
  });

  it('demoting a member to viewer: their write calls fail on a second instance within a second, and the next refresh returns only read scopes', async () => {
    const member = await memberWith('member');
    const application = await publicApp(DATA_SCOPES);
    const tokens = await authorize(member.browser, application, DATA_SCOPES.join(' '));
    if ('error' in tokens) throw new Error(tokens.error);
    expect(tokens.scope).toBe(DATA_SCOPES.join(' '));
    expect((await writeContact(second, tokens.access_token)).statusCode).toBe(201);
    // A private application's own token is not a user's: it is unaffected.
    const integration = await clientCredentialsToken(app, org, 'contacts.write');

    const { honouredWithin } = deadlinePoll(1000);
    const since = performance.now();
    const demoted = await api(app, admin, 'PATCH', `/members/${member.id}`, { role: 'viewer' });
    expect(demoted.statusCode, demoted.body).toBe(200);
    expect(demoted.json().role).toBe('viewer');
    await honouredWithin('write refused on the second instance', since, async () => {
      const res = await writeContact(second, tokens.access_token);
      return { status: res.statusCode, headers: new Headers(), body: res.body };
    }, (o) => o.status === 401);
    expect((await writeContact(app, tokens.access_token)).statusCode).toBe(401);

    const refreshed = await tokenRequest(application, { grant_type: 'refresh_token', refresh_token: tokens.refresh_token }, second);
    expect(refreshed.statusCode, refreshed.body).toBe(200);
    expect(refreshed.json().scope).toBe('contacts.read tasks.read');
    expect((await readContacts(second, refreshed.json().access_token)).statusCode).toBe(200);
    expectInsufficientScope(await writeContact(second, refreshed.json().access_token));
    expect((await writeContact(second, integration)).statusCode).toBe(201);

    // The grant was replaced by a narrower one, and the audit log says so.
    const grants = await t.handle.db.selectFrom('grants').selectAll().where('user_id', '=', member.id).orderBy('id').execute();
    expect(grants.map((g) => [g.scopes.join(' '), g.revoked_reason])).toEqual([
      [DATA_SCOPES.join(' '), 'role_changed'],
      ['contacts.read tasks.read', null],
    ]);
    expect(grants[1]!.narrowed_from_grant_id).toBe(grants[0]!.id);
    const events = await t.handle.db.selectFrom('audit_events').select(['action', 'details']).where('organization_id', '=', org.organizationId).orderBy('id', 'desc').limit(10).execute();
    expect(events.map((e) => e.action)).toEqual(expect.arrayContaining(['member.role_changed', 'grant.narrowed']));
    expect(events.find((e) => e.action === 'member.role_changed')!.details).toMatchObject({ user_id: member.id, from: 'member', to: 'viewer' });
  });

  it('a custom role losing a permission narrows its members’ tokens on both instances within a second', async () => {
    await createRole(t.handle.db, org.organizationId, { name: 'Field', permissions: ['contacts.read', 'contacts.write', 'tasks.read'] });
    const member = await memberWith(await requireRole(t.handle.db, org.organizationId, 'Field'));
    const application = await publicApp(DATA_SCOPES);
    const tokens = await authorize(member.browser, application, 'contacts.read contacts.write tasks.read');
    if ('error' in tokens) throw new Error(tokens.error);
    expect((await writeContact(second, tokens.access_token)).statusCode).toBe(201);
    const { honouredWithin } = deadlinePoll(1000);
    const since = performance.now();
    expect((await api(app, admin, 'PATCH', '/roles/field', { permissions: ['contacts.read', 'tasks.read'] })).statusCode).toBe(200);
    await honouredWithin('write refused on the second instance', since, async () => {
      const res = await writeContact(second, tokens.access_token);
      return { status: res.statusCode, headers: new Headers(), body: res.body };
    }, (o) => o.status === 401);
    const refreshed = await tokenRequest(application, { grant_type: 'refresh_token', refresh_token: tokens.refresh_token }, second);
    expect(refreshed.json().scope).toBe('contacts.read tasks.read');
    // Deleting the role moves its members, and narrows again.
    expect((await api(app, admin, 'DELETE', '/roles/Field')).statusCode).toBe(409);
    expect((await api(app, admin, 'DELETE', '/roles/Field?move_to=viewer')).statusCode).toBe(204);
    const moved = await api(app, admin, 'GET', `/members/${member.id}`);
    expect(moved.json().role).toBe('viewer');
  });

  it('a code issued before a demotion is refused after it (invalid_grant); one issued after carries the new role', async () => {
    const member = await memberWith('member');
    const application = await publicApp(DATA_SCOPES);
    const code = await approvedCode(member.browser, application, 'contacts.write');
    await changeMemberRole(t.handle.db, { organizationId: org.organizationId, userId: member.id, role: 'viewer' });
    const res = await tokenRequest(application, { grant_type: 'authorization_code', code, redirect_uri: REDIRECT });
    expect(res.statusCode).toBe(400);
    expect(res.json()).toMatchObject({ error: 'invalid_grant', error_description: expect.stringContaining('role') });
    expect(await authorize(member.browser, application, 'contacts.write')).toEqual({ error: 'access_denied' });
  });

  it('a code replayed after its grant was narrowed revokes the narrower successor too (RFC 6749 §4.1.2)', async () => {
    const member = await memberWith('member');
    const application = await publicApp(DATA_SCOPES);
    const code = await approvedCode(member.browser, application, 'contacts.read contacts.write');
    const first = await tokenRequest(application, { grant_type: 'authorization_code', code, redirect_uri: REDIRECT });
    expect(first.statusCode).toBe(200);
    await changeMemberRole(t.handle.db, { organizationId: org.organizationId, userId: member.id, role: 'viewer' });
    const refreshed = await tokenRequest(application, { grant_type: 'refresh_token', refresh_token: first.json().refresh_token });
    expect(refreshed.json().scope).toBe('contacts.read');
    expect((await readContacts(app, refreshed.json().access_token)).statusCode).toBe(200);
    // The code again: refused, and what it led to (now the successor grant) is revoked.
    expect((await tokenRequest(application, { grant_type: 'authorization_code', code, redirect_uri: REDIRECT })).json().error).toBe('invalid_grant');
    expect((await readContacts(app, refreshed.json().access_token)).statusCode).toBe(401);
    const again = await tokenRequest(application, { grant_type: 'refresh_token', refresh_token: refreshed.json().refresh_token });
    expect(again.json()).toMatchObject({ error: 'invalid_grant' });
  });

  it('the last owner cannot be demoted or removed: domain, management API and dashboard', async () => {
    const own = await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') });
    const token = await clientCredentialsToken(app, own);
    const call = (method: 'PATCH' | 'DELETE', body?: object) =>
      app.inject({ method, url: `/api/v1/${own.organizationId}/members/${own.ownerId}`, headers: { authorization: `Bearer ${token}` }, ...(body ? { payload: body } : {}) });
    const ownerId = own.ownerId;
    await expect(changeMemberRole(t.handle.db, { organizationId: own.organizationId, userId: ownerId, role: 'viewer' })).rejects.toThrow(/last owner/);
    await expect(removeMember(t.handle.db, { organizationId: own.organizationId, userId: ownerId })).rejects.toThrow(/last owner/);
    // An integration acts as an admin: it may not touch an owner at all.
    expect((await call('PATCH', { role: 'viewer' })).statusCode).toBe(403);
    expect((await call('DELETE')).statusCode).toBe(403);
    // The owner themselves, in the dashboard.
    const email = (await t.handle.db.selectFrom('users').select('email').where('id', '=', ownerId).executeTakeFirstOrThrow()).email;
    const browser = new Browser(app);
    await browser.login(email, 'owner-password-1');
    const csrf_token = await browser.csrf('/dashboard/members');
    expect((await browser.post(`/dashboard/members/${ownerId}/role`, { csrf_token, role: 'viewer' })).statusCode).toBe(409);
    expect((await browser.post(`/dashboard/members/${ownerId}/remove`, { csrf_token })).statusCode).toBe(409);
    const row = await t.handle.db.selectFrom('memberships').select('role').where('organization_id', '=', own.organizationId).where('user_id', '=', ownerId).executeTakeFirstOrThrow();
    expect(row.role).toBe('owner');
  });

  it('removing a member still revokes their grants', async () => {
    const member = await memberWith('viewer');
    const tokens = await authorize(member.browser, await publicApp(DATA_SCOPES), 'contacts.read');
    if ('error' in tokens) throw new Error(tokens.error);
    expect((await api(app, admin, 'DELETE', `/members/${member.id}`)).statusCode).toBe(204);
    expect((await readContacts(app, tokens.access_token)).statusCode).toBe(401);
  });
});

describe(`role changes at volume and under concurrency on ${BACKEND}`, () => {
  it('a role losing a permission refuses its members’ tokens holding it on both instances within a second, before any narrowing reaches their grants', async () => {
    const role = await createRole(t.handle.db, org.organizationId, { name: `Held to ${++n}`, permissions: ['contacts.read', 'contacts.write'] });
    const member = await memberWith(role);
    const application = await publicApp(DATA_SCOPES);
    const wide = await authorize(member.browser, application, 'contacts.read contacts.write');
    const narrow = await authorize(member.browser, application, 'contacts.read');
    if ('error' in wide || 'error' in narrow) throw new Error('not authorized');
    // The token names the member's custom role, so the API can hold it to the role as it is now.
    expect(JSON.parse(Buffer.from(wide.access_token.split('.')[1]!, 'base64url').toString())).toMatchObject({ role_id: role.id, scope: 'contacts.read contacts.write' });
    expect((await writeContact(second, wide.access_token)).statusCode).toBe(201);
    // The role's change, and nothing else: no job, no grant narrowed (what the first instants of a
    // million-member narrowing look like to the members it has not reached).
    await t.handle.db.updateTable('roles').set({ permissions: ['contacts.read'] }).where('id', '=', role.id!).execute();
    const since = performance.now();
    for (const instance of [app, second]) await expect.poll(async () => (await readContacts(instance, wide.access_token)).statusCode, { timeout: 1000, interval: 20 }).toBe(401);
    expect(performance.now() - since).toBeLessThan(1000);
    // A token within what the role still allows goes on working; the grants are untouched.
    for (const instance of [app, second]) expect((await readContacts(instance, narrow.access_token)).statusCode).toBe(200);
    const live = await t.handle.db.selectFrom('grants').select('scopes').where('user_id', '=', member.id).where('revoked_at', 'is', null).orderBy('id').execute();
    expect(live.map((g) => g.scopes)).toEqual([['contacts.read', 'contacts.write'], ['contacts.read']]);
    // The permission given back: the token is good again (the role, not a revocation, refused it).
    await t.handle.db.updateTable('roles').set({ permissions: ['contacts.read', 'contacts.write'] }).where('id', '=', role.id!).execute();
    await expect.poll(async () => (await readContacts(second, wide.access_token)).statusCode, { timeout: 1000, interval: 20 }).toBe(200);
  });

  it('a refresh whose grant no narrowing has reached yet (a role-wide narrowing still running, or interrupted) returns the narrower scope and ends the old access token', async () => {
    const role = await createRole(t.handle.db, org.organizationId, { name: `Unreached ${++n}`, permissions: ['contacts.read', 'contacts.write'] });
    const member = await memberWith(role);
    const application = await publicApp(DATA_SCOPES);
    const tokens = await authorize(member.browser, application, 'contacts.read contacts.write');
    if ('error' in tokens) throw new Error(tokens.error);
    // The role's change committed, its grants not narrowed: what a crash between the two leaves.
    await t.handle.db.updateTable('roles').set({ permissions: ['contacts.read'] }).where('id', '=', role.id!).execute();
    const refreshed = await tokenRequest(application, { grant_type: 'refresh_token', refresh_token: tokens.refresh_token }, second);
    expect(refreshed.statusCode, refreshed.body).toBe(200);
    expect(refreshed.json().scope).toBe('contacts.read');
    expectInsufficientScope(await writeContact(second, refreshed.json().access_token));
    // The refresh narrowed the grant itself: the old access token is refused on both instances.
    await expect.poll(async () => (await writeContact(app, tokens.access_token)).statusCode, { timeout: 1000, interval: 20 }).toBe(401);
    await expect.poll(async () => (await writeContact(second, tokens.access_token)).statusCode, { timeout: 1000, interval: 20 }).toBe(401);
    // And a role that allows none of it any more: the refresh token is refused.
    await t.handle.db.updateTable('roles').set({ permissions: ['tasks.read'] }).where('id', '=', role.id!).execute();
    const none = await tokenRequest(application, { grant_type: 'refresh_token', refresh_token: refreshed.json().refresh_token });
    expect(none.json()).toMatchObject({ error: 'invalid_grant' });
  });

  it('narrows and moves more members than one batch: a role losing a permission, then deleted with its members moved', async () => {
    const db = t.handle.db;
    const size = 1_234;
    const role = await createRole(db, org.organizationId, { name: `Crowd ${++n}`, permissions: ['contacts.read', 'contacts.write', 'tasks.read'] });
    const application = await publicApp(DATA_SCOPES);
    const appRow = await db.selectFrom('applications').select('id').where('client_id', '=', application.client_id).executeTakeFirstOrThrow();
    const users = await db
      .insertInto('users')
      .values(Array.from({ length: size }, (_, i) => ({ email: `crowd-${n}-${i}-${process.pid}@example.com`, password_hash: '$argon2id$crowd', email_verified_at: new Date() })))
      .returning('id')
      .execute();
    const ids = users.map((u) => u.id);
    await db.insertInto('memberships').values(ids.map((id) => ({ organization_id: org.organizationId, user_id: id, role: 'custom' as const, role_id: role.id }))).execute();
    await db.insertInto('grants').values(ids.map((id) => ({ organization_id: org.organizationId, application_id: appRow.id, user_id: id, scopes: ['contacts.read', 'contacts.write', 'tasks.read'] }))).execute();
    const live = () =>
      db.selectFrom('grants').select(['scopes', (eb) => eb.fn.countAll<string>().as('count')]).where('application_id', '=', appRow.id).where('revoked_at', 'is', null).groupBy('scopes').execute();

    const patched = await api(app, admin, 'PATCH', `/roles/${encodeURIComponent(role.name)}`, { permissions: ['contacts.read', 'tasks.read'] });
    expect(patched.statusCode, patched.body).toBe(200);
    // The narrowing is a job queued with the change; it runs in the app's own runner.
    await finishJobs(db);
    expect((await live()).map((g) => [g.scopes, Number(g.count)])).toEqual([[['contacts.read', 'tasks.read'], size]]);

    const tasksOnly = await createRole(db, org.organizationId, { name: `Tasks only ${++n}`, permissions: ['tasks.read'] });
    const deleted = await api(app, admin, 'DELETE', `/roles/${encodeURIComponent(role.name)}?move_to=${encodeURIComponent(tasksOnly.name)}`);
    expect(deleted.statusCode, deleted.body).toBe(204);
    expect((await live()).map((g) => [g.scopes, Number(g.count)])).toEqual([[['tasks.read'], size]]);
    const roles = await db.selectFrom('memberships').select(['role_id', (eb) => eb.fn.countAll<string>().as('count')]).where('user_id', '=', sql<number>`any(${ids}::bigint[])`).groupBy('role_id').execute();
    expect(roles.map((r) => [r.role_id, Number(r.count)])).toEqual([[tasksOnly.id, size]]);
    const event = await db.selectFrom('audit_events').select('details').where('organization_id', '=', org.organizationId).where('action', '=', 'role.deleted').orderBy('id', 'desc').limit(1).executeTakeFirstOrThrow();
    expect(event.details).toMatchObject({ role_id: role.id, members_moved_to: tasksOnly.name, members_moved: size });
  });

  it('two owners demoting each other at once: exactly one succeeds, and the organization keeps an owner', async () => {
    for (let i = 0; i < 5; i++) {
      const own = await createOrgFixture(t.handle.db);
      const second = await createUser(t.handle.db, { email: `co-owner-${++n}-${process.pid}@example.com`, password: PASSWORD });
      await addMember(t.handle.db, { organizationId: own.organizationId, userId: second.id, role: 'owner' });
      const results = await Promise.allSettled([
        changeMemberRole(t.handle.db, { organizationId: own.organizationId, userId: own.ownerId, role: 'admin' }),
        removeMember(t.handle.db, { organizationId: own.organizationId, userId: second.id }),
      ]);
      expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
      const refused = results.find((r) => r.status === 'rejected') as PromiseRejectedResult;
      expect(String(refused.reason)).toMatch(/last owner/);
      const owners = await t.handle.db.selectFrom('memberships').select('user_id').where('organization_id', '=', own.organizationId).where('role', '=', 'owner').execute();
      expect(owners).toHaveLength(1);
    }
  });

  it('a role deleted while a member redeems a code, an invitation to it is accepted and someone is given it: no 5xx, nobody left on it, no live grant beyond the new role', async () => {
    const db = t.handle.db;
    for (let i = 0; i < 5; i++) {
      const role = await createRole(db, org.organizationId, { name: `Busy ${++n}`, permissions: ['contacts.read', 'contacts.write'] });
      const member = await memberWith(role);
      const joining = await memberWith('viewer');
      const application = await publicApp(DATA_SCOPES);
      const code = await approvedCode(member.browser, application, 'contacts.read contacts.write');
      const invitee = await createUser(db, { email: `busy-invitee-${n}-${process.pid}@example.com`, password: PASSWORD });
      await db.updateTable('users').set({ email_verified_at: new Date() }).where('id', '=', invitee.id).execute();
      const link = generateSecret(32);
      await db.insertInto('invitations').values({ organization_id: org.organizationId, email: invitee.email, role: 'custom', role_id: role.id, token_hash: sha256Hex(link), expires_at: new Date(Date.now() + 3600_000) }).execute();

      const [deleted, redeemed, accepted, given] = await Promise.allSettled([
        api(app, admin, 'DELETE', `/roles/${encodeURIComponent(role.name)}?move_to=viewer`),
        tokenRequest(application, { grant_type: 'authorization_code', code, redirect_uri: REDIRECT }, second),
        acceptInvitation(db, link, invitee.id),
        api(second, admin, 'PATCH', `/members/${joining.id}`, { role: role.name }),
      ]);
      const status = (r: PromiseSettledResult<LightMyRequestResponse>) => (r.status === 'fulfilled' ? r.value.statusCode : 0);
      expect(status(deleted), deleted.status === 'fulfilled' ? deleted.value.body : String(deleted.reason)).toBe(204);
      expect([200, 400]).toContain(status(redeemed));
      expect([200, 400]).toContain(status(given));
      // Accepted before or after the move: either way the invitee is a member now.
      expect(accepted.status, accepted.status === 'rejected' ? String(accepted.reason) : '').toBe('fulfilled');
      expect(await db.selectFrom('roles').select('id').where('id', '=', role.id!).executeTakeFirst()).toBeUndefined();
      const roles = await db.selectFrom('memberships').select(['user_id', 'role', 'role_id']).where('organization_id', '=', org.organizationId).where('user_id', 'in', [member.id, joining.id, invitee.id]).orderBy('user_id').execute();
      expect(roles.map((r) => [r.role, r.role_id])).toEqual([['viewer', null], ['viewer', null], ['viewer', null]]);
      const beyond = await db.selectFrom('grants').select('scopes').where('user_id', '=', member.id).where('revoked_at', 'is', null).execute();
      for (const g of beyond) expect(g.scopes).toEqual(['contacts.read']);
    }
  });

  it('two roles deleted at once, each moving its members and invitations to the other: no error but the honest one, nobody left on a deleted role', async () => {
    for (let i = 0; i < 5; i++) {
      const a = await createRole(t.handle.db, org.organizationId, { name: `Swap A ${++n}`, permissions: ['contacts.read'] });
      const b = await createRole(t.handle.db, org.organizationId, { name: `Swap B ${n}`, permissions: ['contacts.read'] });
      const inA = await memberWith(a);
      const inB = await memberWith(b);
      // Pending invitations to both: moving them key-shares the other role (a deadlock once).
      for (const role of [a, b]) {
        await t.handle.db.insertInto('invitations').values({ organization_id: org.organizationId, email: `swap-${role.id}-${process.pid}@example.com`, role: 'custom', role_id: role.id, token_hash: sha256Hex(generateSecret(32)), expires_at: new Date(Date.now() + 3600_000) }).execute();
      }
      const [first, other] = await Promise.all([
        api(app, admin, 'DELETE', `/roles/${encodeURIComponent(a.name)}?move_to=${encodeURIComponent(b.name)}`),
        api(second, admin, 'DELETE', `/roles/${encodeURIComponent(b.name)}?move_to=${encodeURIComponent(a.name)}`),
      ]);
      const statuses = [first.statusCode, other.statusCode].sort();
      // One goes through; the other finds its target (or itself) gone: 400 or 404, never a 5xx.
      expect(statuses[0], `${first.body} ${other.body}`).toBe(204);
      expect([204, 400, 404]).toContain(statuses[1]);
      const left = await t.handle.db.selectFrom('roles').select('id').where('id', 'in', [a.id!, b.id!]).execute();
      const holders = await t.handle.db.selectFrom('memberships').select(['user_id', 'role_id']).where('organization_id', '=', org.organizationId).where('user_id', 'in', [inA.id, inB.id]).execute();
      for (const h of holders) expect(left.map((r) => r.id)).toContain(h.role_id);
      const invited = await t.handle.db.selectFrom('invitations').select('role_id').where('organization_id', '=', org.organizationId).where('email', 'in', [a, b].map((r) => `swap-${r.id}-${process.pid}@example.com`)).execute();
      expect(invited).toHaveLength(2);
      for (const inv of invited) expect(left.map((r) => r.id)).toContain(inv.role_id);
    }
  });
});

describe(`remembered consent and prompt on ${BACKEND}`, () => {
  const authorizeGet = (browser: Browser, application: ApplicationWithSecret, scope: string, extra: Record<string, string> = {}) =>
    browser.get(`/oauth/authorize?${new URLSearchParams({ response_type: 'code', client_id: application.client_id, redirect_uri: REDIRECT, scope, state: STATE, ...extra })}`);
  const redirected = (res: LightMyRequestResponse) => {
    expect(res.statusCode, res.body).toBe(303);
    const url = new URL(res.headers.location as string);
    expect(`${url.origin}${url.pathname}`).toBe(REDIRECT);
    expect(url.searchParams.get('state')).toBe(STATE);
    return url.searchParams;
  };

  it('a user who approved an application is not asked again for the same or fewer scopes; wider scopes, prompt=consent or a revoked grant bring the page back', async () => {
    const member = await memberWith('member');
    const application = await publicApp(DATA_SCOPES);
    const first = await authorize(member.browser, application, 'contacts.read contacts.write');
    if ('error' in first) throw new Error(first.error);
    // The same scopes, then fewer: a code at once, for the organization approved before.
    for (const scope of ['contacts.read contacts.write', 'contacts.read']) {
      const code = redirected(await authorizeGet(member.browser, application, scope)).get('code');
      expect(code).toBeTruthy();
      const res = await tokenRequest(application, { grant_type: 'authorization_code', code: code!, redirect_uri: REDIRECT });
      expect(res.json()).toMatchObject({ scope, organization_id: org.organizationId });
    }
    const audit = await t.handle.db.selectFrom('audit_events').select('details').where('organization_id', '=', org.organizationId).where('action', '=', 'authorization.approved').orderBy('id', 'desc').limit(1).executeTakeFirstOrThrow();
    expect(audit.details).toMatchObject({ client_id: application.client_id, scopes: 'contacts.read', remembered: true });
    // Wider than approved: asked.
    expect((await authorizeGet(member.browser, application, 'contacts.read tasks.read')).statusCode).toBe(200);
    // The application wants the page: asked.
    expect((await authorizeGet(member.browser, application, 'contacts.read', { prompt: 'consent' })).statusCode).toBe(200);
    // prompt=login and select_account ask for the sign-in again first (test/oauth/oidc.test.ts follows them through).
    for (const prompt of ['login', 'select_account', 'consent login']) expect((await authorizeGet(member.browser, application, 'contacts.read', { prompt })).headers.location).toMatch(/^\/login\?.*prompt=login/);
    // Revoked (Connected apps, an admin, a removal): forgotten.
    await t.handle.db.updateTable('grants').set({ revoked_at: new Date(), revoked_reason: 'revoked_by_user' }).where('user_id', '=', member.id).where('application_id', 'in', (eb) => eb.selectFrom('applications').select('id').where('client_id', '=', application.client_id)).execute();
    expect((await authorizeGet(member.browser, application, 'contacts.read')).statusCode).toBe(200);
  });

  it('prompt=none: a code without any page after a consent, consent_required before one, login_required signed out; never combined with another value', async () => {
    const member = await memberWith('member');
    const application = await publicApp(DATA_SCOPES);
    expect(redirected(await authorizeGet(member.browser, application, 'tasks.read', { prompt: 'none' })).get('error')).toBe('consent_required');
    const first = await authorize(member.browser, application, 'tasks.read');
    if ('error' in first) throw new Error(first.error);
    const params = redirected(await authorizeGet(member.browser, application, 'tasks.read', { prompt: 'none' }));
    expect(params.get('code')).toBeTruthy();
    expect(params.get('iss')).toBe(testConfig().issuer);
    const signedOut = new Browser(app);
    const refused = redirected(await authorizeGet(signedOut, application, 'tasks.read', { prompt: 'none' }));
    expect([refused.get('error'), refused.get('code')]).toEqual(['login_required', null]);
    expect(redirected(await authorizeGet(member.browser, application, 'tasks.read', { prompt: 'none consent' })).get('error')).toBe('invalid_request');
    expect(redirected(await authorizeGet(member.browser, application, 'tasks.read', { prompt: 'sometimes' })).get('error')).toBe('invalid_request');
    // Signed out with an invalid request: the request's own error, not login_required.
    expect(redirected(await authorizeGet(signedOut, application, 'no.such.scope', { prompt: 'none' })).get('error')).toBe('invalid_scope');
  });

  it('remembers only within the role as it is now, and asks again when approvals in several organizations leave the choice open', async () => {
    const member = await memberWith('member');
    const application = await publicApp(DATA_SCOPES);
    const first = await authorize(member.browser, application, 'contacts.read contacts.write');
    if ('error' in first) throw new Error(first.error);
    await changeMemberRole(t.handle.db, { organizationId: org.organizationId, userId: member.id, role: 'viewer' });
    // The narrowed grant covers what a viewer may grant of this request: a code for contacts.read only.
    const code = redirected(await authorizeGet(member.browser, application, 'contacts.read contacts.write')).get('code');
    expect((await tokenRequest(application, { grant_type: 'authorization_code', code: code!, redirect_uri: REDIRECT })).json().scope).toBe('contacts.read');
    // A second organization where the application was approved too: which one is meant is open.
    const other = await createOrgFixture(t.handle.db);
    await addMember(t.handle.db, { organizationId: other.organizationId, userId: member.id, role: 'member' });
    const otherApp = await t.handle.db.selectFrom('applications').select('id').where('client_id', '=', application.client_id).executeTakeFirstOrThrow();
    await t.handle.db.insertInto('grants').values({ organization_id: other.organizationId, application_id: otherApp.id, user_id: member.id, scopes: ['contacts.read'] }).execute();
    expect((await authorizeGet(member.browser, application, 'contacts.read')).statusCode).toBe(200);
    expect(redirected(await authorizeGet(member.browser, application, 'contacts.read', { prompt: 'none' })).get('error')).toBe('consent_required');
  });
});
