/**
 * The bad-input battery for organization roles (issue 15): the management API's /roles, the
 * members and invitations APIs' `role`, and the dashboard's Roles and Members forms, fed hostile
 * input. Every refusal states its status and error, and the database is compared before and
 * after: role rows, memberships, invitations, grants, the audit log and the outbox stay as they
 * were.
 *
 * - Role names: empty, blank, 65 characters, 10 kB, control characters, NUL, a lone surrogate,
 *   markup, path separators, a leading dot, every built-in name in any letter case, 'custom', a
 *   duplicate in another letter case, and names that only look like others (accepted).
 * - Permissions: unknown, duplicated, not an array, not strings, 10,000 of them; the management
 *   scopes, which an application (acting as an admin) may give.
 * - Bodies: unknown fields (strict), wrong content types, malformed or oversized JSON.
 * - Paths: percent-encoded, overlong, another organization's role (404, the other organization
 *   untouched), the built-in roles (403 to change or delete).
 * - Deletion: a role in use without move_to (409), with move_to itself, unknown or owner.
 * - The 101st custom role (409), also when created concurrently.
 * - The dashboard: a custom role that manages members may give only what it holds; a viewer and
 *   a member may not use the Roles forms; CSRF; unknown role names in the Members forms; the
 *   last owner through every path.
 * - A role deleted while the API gives it: never a 5xx.
 *
 * Bugs this battery found, now fixed: a name PostgreSQL lowers to a built-in one (ADMİN: a 500 in
 * the dashboard); names JavaScript and PostgreSQL lower differently (ΔΙΑΧΕΙΡΙΣΤΗΣ, İnsan:
 * unreachable by their own name); a lone surrogate in a description (stored as U+FFFD); a NUL in
 * a role path (API 400 instead of 404, dashboard 500); members.write without members.read (the
 * change was made, the answer 403); a role deleted while being given (PostgreSQL: a 500 from the
 * foreign key).
 */
import type { FastifyInstance, InjectOptions, LightMyRequestResponse } from 'fastify';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember } from '../../src/accounts/organizations.js';
import { hashPassword } from '../../src/accounts/passwords.js';
import { createRole, findRole, MAX_CUSTOM_ROLES } from '../../src/accounts/roles.js';
import { insertUser } from '../../src/accounts/users.js';
import type { BuiltinRole } from '../../src/db/schema.js';
import { createGrant } from '../../src/oauth/models/grants.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { DATA_SCOPES, KNOWN_SCOPES, MANAGEMENT_SCOPES } from '../../src/oauth/helpers/scopes.js';
import { buildTestApp, TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { clientCredentialsToken, createOrgFixture, form, type OrgFixture } from '../helpers/oauth.js';
import { Browser, expectPageSecurityHeaders } from './browser.js';
import { finishJobs } from '../helpers/jobs.js';

const PASSWORD = 'roles-bad-input-password-1';
/** createOrgFixture's owners sign in with this. */
const OWNER_PASSWORD = 'owner-password-1';
const CSRF_FAILED = 'This form has expired or did not come from this site';
const NOT_ALLOWED = 'Your role in this organization does not allow this.';
const BUILTIN: BuiltinRole[] = ['owner', 'admin', 'member', 'viewer'];

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
/** Two organizations, each with a private application holding every scope, and its token. */
let orgA: OrgFixture;
let orgB: OrgFixture;
let bearerA: string;
let bearerB: string;
/** Org A's application with members.read only. */
let readOnlyA: string;
let passwordHash: string;

const db = () => t.handle.db;
let n = 0;
const address = (label: string) => `${label}-${++n}-${process.pid}@example.com`;
let ip = 0;
const browser = () => {
  const i = ++ip;
  return new Browser(app, `10.15.${Math.floor(i / 250)}.${(i % 250) + 1}`);
};

beforeAll(async () => {
  t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  // No retention sweeper (the snapshots compare whole tables), no API rate limit (hundreds of requests a minute).
  app = await buildTestApp(t.handle.db, { env: { CLEANUP_INTERVAL: '0', API_RATE_LIMIT: '0' } });
  orgA = await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') });
  orgB = await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') });
  bearerA = await clientCredentialsToken(app, orgA);
  bearerB = await clientCredentialsToken(app, orgB);
  readOnlyA = await clientCredentialsToken(app, orgA, 'members.read');
  passwordHash = await hashPassword(PASSWORD);
  // Org B's own role, which nothing of org A may see, change, delete or give.
  await createRole(t.handle.db, orgB.organizationId, { name: 'Secret', description: 'org B only', permissions: ['contacts.read'] });
});
afterAll(async () => {
  await app?.close();
  await t?.close();
});

// ---------------------------------------------------------------------------------------------
// Helpers

interface TestUser {
  id: number;
  email: string;
}

async function newUser(label: string): Promise<TestUser> {
  const email = address(label);
  const user = await insertUser(db(), { email, name: label, passwordHash, emailVerified: true });
  return { id: user.id, email };
}

/** A new user holding `role` (a built-in one, or the organization's own by name) in `organizationId`. */
async function memberWith(organizationId: number, role: string, label = role): Promise<TestUser> {
  const user = await newUser(label.replace(/[^a-z0-9]/gi, '') || 'user');
  const ref = await findRole(db(), organizationId, role);
  if (!ref) throw new Error(`no role ${role}`);
  await addMember(db(), { organizationId, userId: user.id, role: ref });
  return user;
}

const ownerOf = async (fixture: OrgFixture): Promise<TestUser> => ({
  id: fixture.ownerId,
  email: (await db().selectFrom('users').select('email').where('id', '=', fixture.ownerId).executeTakeFirstOrThrow()).email,
});

/** A browser signed in as `user`, with `organizationId` its current organization. */
async function signedIn(user: TestUser, organizationId: number, password = PASSWORD): Promise<Browser> {
  const b = browser();
  expect((await b.login(user.email, password)).statusCode).toBe(303);
  const selected = await b.post('/dashboard/organization', { csrf_token: await b.csrf('/dashboard'), organization_id: String(organizationId) });
  expect(selected.statusCode).toBe(303);
  return b;
}

/** Posts a dashboard form with the browser's own CSRF token. */
async function submit(b: Browser, url: string, fields: Record<string, string | string[]> = {}): Promise<LightMyRequestResponse> {
  const res = await b.post(url, { csrf_token: await b.csrf('/dashboard'), ...fields });
  // A role's deletion is finished by a job (moving its members): the tests look at the state after it.
  if (/^\/dashboard\/roles\/[^/]+\/delete$/.test(url)) await finishJobs(db());
  return res;
}

type Method = 'GET' | 'POST' | 'PATCH' | 'DELETE';

/** An API request; a string body is sent as is (as JSON unless `headers` say otherwise). */
async function api(method: Method, path: string, body?: unknown, options: { fixture?: OrgFixture; bearer?: string; headers?: Record<string, string> } = {}) {
  const fixture = options.fixture ?? orgA;
  const bearer = options.bearer ?? (fixture === orgB ? bearerB : bearerA);
  const res = await app.inject({
    method,
    url: `/api/v1/${fixture.organizationId}${path}`,
    headers: { authorization: `Bearer ${bearer}`, ...(typeof body === 'string' ? { 'content-type': 'application/json' } : {}), ...options.headers },
    ...(body !== undefined ? { payload: body as string } : {}),
  } as InjectOptions);
  // A role's deletion is finished by a job (moving its members): the tests look at the state after it.
  if (method === 'DELETE' && path.startsWith('/roles/') && res.statusCode === 204) await finishJobs(db());
  return res;
}

/** The API's error shape: the status, the error code, a safe description, no stack. */
function expectApiError(res: LightMyRequestResponse, status: number, error: string): { error: string; error_description: string; details?: { path: string; message: string }[] } {
  expect(res.statusCode, res.body.slice(0, 400)).toBe(status);
  const body = res.json();
  expect(body.error).toBe(error);
  expect(body.error_description).toEqual(expect.any(String));
  expectNoLeak(res);
  return body;
}

/** A 400 naming the offending field (or an element of it) in `details`. */
function expectFieldError(res: LightMyRequestResponse, field: string): void {
  const body = expectApiError(res, 400, 'invalid_request');
  const paths = body.details?.map((d) => d.path.split('.')[0]) ?? [];
  expect(paths, res.body.slice(0, 400)).toContain(field);
}

function expectNoLeak(res: LightMyRequestResponse): void {
  expect(res.body).not.toMatch(/\bat \S+ \(|\.ts:\d+|\.js:\d+|node_modules|\/work\/|TypeError|ReferenceError|SyntaxError|Internal Server Error|violates|constraint/);
}

/** A dashboard page (the form again, or the error page) of `status`, with the page headers and nothing leaked. */
function expectPage(res: LightMyRequestResponse, status: number, text?: string): void {
  expect(res.statusCode, res.body.slice(0, 600)).toBe(status);
  expect(res.headers['content-type']).toMatch(/^text\/html/);
  expectPageSecurityHeaders(res);
  expectNoLeak(res);
  if (text !== undefined) expect(res.body).toContain(text);
}

/** A form that worked: 303 to `location`, with the page headers. */
function expectRedirect(res: LightMyRequestResponse, location: string): void {
  expect(res.statusCode, res.body.slice(0, 600)).toBe(303);
  expect(res.headers.location).toBe(location);
  expectPageSecurityHeaders(res);
}

const count = async (table: 'audit_events' | 'mail_outbox') => Number((await db().selectFrom(table).select(sql<string>`count(*)`.as('n')).executeTakeFirstOrThrow()).n);

/** Everything a role change could touch. */
async function snapshot() {
  const d = db();
  // Nothing still moving underneath (a deletion's job).
  await finishJobs(d);
  return {
    roles: await d.selectFrom('roles').selectAll().orderBy('id').execute(),
    memberships: await d.selectFrom('memberships').select(['organization_id', 'user_id', 'role', 'role_id']).orderBy('organization_id').orderBy('user_id').execute(),
    invitations: await d.selectFrom('invitations').select(['id', 'organization_id', 'email', 'role', 'role_id', 'accepted_at', 'revoked_at']).orderBy('id').execute(),
    grants: await d.selectFrom('grants').select(['id', 'user_id', 'scopes', 'revoked_at', 'revoked_reason']).orderBy('id').execute(),
    auditEvents: await count('audit_events'),
    mailOutbox: await count('mail_outbox'),
  };
}

async function expectUnchanged(before: Awaited<ReturnType<typeof snapshot>>): Promise<void> {
  expect(await snapshot()).toEqual(before);
}

const roleRow = (organizationId: number, name: string) =>
  db().selectFrom('roles').selectAll().where('organization_id', '=', organizationId).where('name', '=', name).executeTakeFirst();
const membershipOf = (organizationId: number, userId: number) =>
  db().selectFrom('memberships').select(['role', 'role_id']).where('organization_id', '=', organizationId).where('user_id', '=', userId).executeTakeFirst();
const customRoleCount = async (organizationId: number) =>
  Number((await db().selectFrom('roles').select(sql<string>`count(*)`.as('n')).where('organization_id', '=', organizationId).executeTakeFirstOrThrow()).n);

let roleCounter = 0;
/** A fresh custom role of org A (or `organizationId`), made through the domain. */
async function makeRole(permissions: string[] = ['contacts.read'], organizationId = orgA.organizationId, prefix = 'Role'): Promise<string> {
  const name = `${prefix} ${++roleCounter}`;
  await createRole(db(), organizationId, { name, permissions });
  return name;
}

/** A live grant `userId` gave org A's public application. */
async function grantOf(userId: number, scopes: string[], fixture = orgA): Promise<number> {
  const application = await db().selectFrom('applications').select('id').where('client_id', '=', fixture.publicApp.client_id).executeTakeFirstOrThrow();
  return (await createGrant(db(), { organizationId: fixture.organizationId, applicationId: application.id, userId, scopes }))!.id;
}

// ---------------------------------------------------------------------------------------------
// The API: role names

describe(`POST /roles with hostile names on ${BACKEND}`, () => {
  const ROWS: [label: string, name: unknown][] = [
    ['empty', ''],
    ['only spaces', '     '],
    ['only a tab and a newline', '\t\n'],
    ['65 characters', 'a'.repeat(65)],
    ['10 kB', 'a'.repeat(10_000)],
    ['a control character (BEL)', 'a\u0007b'],
    ['an escape sequence', 'a\u001b[31mred'],
    ['a newline inside', 'line\nbreak'],
    ['a tab inside', 'tab\tname'],
    ['a NUL', 'a\u0000b'],
    ['a NUL at the end', 'abc\u0000'],
    ['a lone high surrogate', '\ud800'],
    ['a lone surrogate after a letter', 'a\ud800'],
    ['a lone low surrogate', 'x\udc00y'],
    ['markup', '<script>alert(1)</script>'],
    ['an HTML entity', 'a&amp;b'],
    ['quotes', 'a"b\'c'],
    ['a slash', 'a/b'],
    ['only a slash', '/'],
    ['a backslash', 'a\\b'],
    ['dot dot', '..'],
    ['dot dot slash', '../admin'],
    ['a single dot', '.'],
    ['a leading dot', '.hidden'],
    ['a leading dash', '-dash'],
    ['a leading underscore', '_under'],
    ['a leading space then a dot', ' .x'],
    ['a percent-encoded slash', 'a%2Fb'],
    ['a question mark', 'what?'],
    ['a hash', 'a#b'],
    ['an emoji', 'Team 🔥'],
    ['a zero-width space', 'ab\u200bc'],
    ['a right-to-left override', '\u202eadmin'],
    ['a no-break space inside', 'a\u00a0b'],
    ['a combining accent (decomposed é)', 'e\u0301quipe'],
    ['owner', 'owner'],
    ['OWNER', 'OWNER'],
    ['Owner', 'Owner'],
    ['admin', 'admin'],
    ['ADMIN', 'ADMIN'],
    ['aDmIn', 'aDmIn'],
    ['member', 'member'],
    ['Member', 'Member'],
    ['MEMBER', 'MEMBER'],
    ['viewer', 'viewer'],
    ['VIEWER', 'VIEWER'],
    ['vIeWeR', 'vIeWeR'],
    ['custom', 'custom'],
    ['Custom', 'Custom'],
    ['CUSTOM', 'CUSTOM'],
    ['admin with surrounding spaces', '  admin  '],
    ['Owner with a trailing tab', 'Owner\t'],
    ['a number', 42],
    ['null', null],
    ['true', true],
    ['an array', ['Ops']],
    ['an object', { name: 'Ops' }],
  ];

  it.each(ROWS)('%s: 400 naming the name field, nothing created', async (_label, name) => {
    const before = await snapshot();
    const res = await api('POST', '/roles', { name, permissions: ['contacts.read'] });
    expectFieldError(res, 'name');
    await expectUnchanged(before);
  });

  it('a missing name: 400, nothing created', async () => {
    const before = await snapshot();
    expectFieldError(await api('POST', '/roles', { permissions: ['contacts.read'] }), 'name');
    await expectUnchanged(before);
  });

  it('the refusal of a built-in name says so, in any letter case, and in compatibility forms (fullwidth letters)', async () => {
    for (const name of [...BUILTIN, 'custom', ...BUILTIN.map((r) => r.toUpperCase()), 'Custom', '\uff4f\uff57\uff4e\uff45\uff52']) {
      const body = expectApiError(await api('POST', '/roles', { name, permissions: [] }), 400, 'invalid_request');
      expect(body.details).toEqual([{ path: 'name', message: 'is the name of a built-in role' }]);
    }
  });

  it('names that only look like others are names of their own: 201, stored exactly (trimmed), readable by that name, never a built-in', async () => {
    const names = [
      'a'.repeat(64),
      '\u0410dmin', // Cyrillic А
      '\u043ewner', // Cyrillic о
      'owner.',
      'admin-2',
      'Admin_',
      'viewers',
      'Custom role',
      '1st line',
      '管理者',
      'Équipe',
      'Ωmega',
      'a..b',
    ];
    for (const name of names) {
      const res = await api('POST', '/roles', { name, description: 'look-alike', permissions: ['contacts.read'] });
      expect(res.statusCode, `${name}: ${res.body}`).toBe(201);
      expect(res.json()).toMatchObject({ name, builtin: false, permissions: ['contacts.read'] });
      expect(res.headers.location).toBe(`/api/v1/${orgA.organizationId}/roles/${encodeURIComponent(name)}`);
      const read = await api('GET', `/roles/${encodeURIComponent(name)}`);
      expect(read.statusCode, name).toBe(200);
      expect(read.json().name).toBe(name);
      expect(await roleRow(orgA.organizationId, name)).toMatchObject({ name, permissions: ['contacts.read'] });
    }
    // The built-in roles are untouched by their look-alikes.
    for (const name of BUILTIN) {
      const read = await api('GET', `/roles/${name}`);
      expect(read.json()).toMatchObject({ name, builtin: true });
    }
    // Leading and trailing spaces are trimmed, not kept.
    const spaced = await api('POST', '/roles', { name: '  Spaced out  ', permissions: [] });
    expect(spaced.statusCode, spaced.body).toBe(201);
    expect(spaced.json().name).toBe('Spaced out');
    expect(await roleRow(orgA.organizationId, '  Spaced out  ')).toBeUndefined();
  });

  it('a name that is a built-in one once PostgreSQL lowers it (ADMİN, with a dotted capital I): 400 naming the field, not a database error', async () => {
    // JavaScript lowers İ to "i̇" (two code points), PostgreSQL to "i": the zod check lets ADMİN
    // through, the table's check constraint refuses it.
    const before = await snapshot();
    for (const name of ['ADMİN', 'VİEWER', 'admİn']) {
      const res = await api('POST', '/roles', { name, permissions: [] });
      expectFieldError(res, 'name');
    }
    await expectUnchanged(before);
  });

  it('names whose letter case JavaScript and PostgreSQL fold differently (Greek final sigma, Turkish İ) can be read, changed, given and deleted by their own name', async () => {
    for (const name of ['ΔΙΑΧΕΙΡΙΣΤΗΣ', 'İnsan Kaynakları']) {
      const created = await api('POST', '/roles', { name, permissions: ['contacts.read'] });
      expect(created.statusCode, created.body).toBe(201);
      const path = `/roles/${encodeURIComponent(name)}`;
      expect((await api('GET', path)).statusCode, `GET ${name}`).toBe(200);
      const holder = await newUser('folded');
      await addMember(db(), { organizationId: orgA.organizationId, userId: holder.id, role: 'viewer' });
      expect((await api('PATCH', `/members/${holder.id}`, { role: name })).statusCode, `give ${name}`).toBe(200);
      expect((await api('PATCH', path, { description: 'changed' })).statusCode, `PATCH ${name}`).toBe(200);
      expect((await api('DELETE', `${path}?move_to=viewer`)).statusCode, `DELETE ${name}`).toBe(204);
    }
  });
});

describe(`duplicate role names on ${BACKEND}`, () => {
  it('another letter case, surrounding spaces, through POST or a rename: 409 conflict, nothing changed; a role may change its own letter case', async () => {
    const created = await api('POST', '/roles', { name: 'Support', permissions: ['contacts.read'] });
    expect(created.statusCode, created.body).toBe(201);
    const other = await makeRole();
    const before = await snapshot();
    for (const name of ['Support', 'support', 'SUPPORT', 'sUpPoRt', '  Support  ']) {
      expectApiError(await api('POST', '/roles', { name, permissions: [] }), 409, 'conflict');
      expectApiError(await api('PATCH', `/roles/${encodeURIComponent(other)}`, { name }), 409, 'conflict');
    }
    await expectUnchanged(before);
    // Its own name in another case is a rename of itself, not a duplicate.
    const renamed = await api('PATCH', '/roles/support', { name: 'SUPPORT' });
    expect(renamed.statusCode, renamed.body).toBe(200);
    expect(renamed.json().name).toBe('SUPPORT');
  });

  it("the same name in another organization is no duplicate: org A may have its own Secret, and org B's stays as it was", async () => {
    const secretB = await roleRow(orgB.organizationId, 'Secret');
    const res = await api('POST', '/roles', { name: 'secret', permissions: ['tasks.read'] });
    expect(res.statusCode, res.body).toBe(201);
    expect(await roleRow(orgB.organizationId, 'Secret')).toEqual(secretB);
    expect((await api('DELETE', '/roles/secret')).statusCode).toBe(204);
    expect(await roleRow(orgB.organizationId, 'Secret')).toEqual(secretB);
  });

  it('ten concurrent creations of one name in different letter cases: exactly one 201, the others 409', async () => {
    const names = ['Race', 'race', 'RACE', 'rAce', 'raCe', 'racE', 'RAce', 'rACE', 'RaCe', 'rAcE'];
    const results = await Promise.all(names.map((name) => api('POST', '/roles', { name, permissions: [] })));
    const statuses = results.map((r) => r.statusCode).sort();
    expect(statuses).toEqual([201, ...Array(9).fill(409)]);
    const rows = await db().selectFrom('roles').select('name').where('organization_id', '=', orgA.organizationId).where(sql<string>`lower(name)`, '=', 'race').execute();
    expect(rows).toHaveLength(1);
  });
});

// ---------------------------------------------------------------------------------------------
// The API: permissions and descriptions

describe(`POST and PATCH /roles with hostile permissions on ${BACKEND}`, () => {
  const ROWS: [label: string, permissions: () => unknown][] = [
    ['an unknown permission', () => ['contacts.read', 'nope']],
    ['a permission in upper case', () => ['CONTACTS.READ']],
    ['a permission with a trailing space', () => ['contacts.read ']],
    ['a permission with a NUL', () => ['contacts.read\u0000']],
    ['openid (not ours)', () => ['openid']],
    ['a role name as a permission', () => ['admin']],
    ['__proto__', () => ['__proto__']],
    ['constructor', () => ['constructor']],
    ['toString', () => ['toString']],
    ['a wildcard', () => ['*']],
    ['a prefix', () => ['contacts.']],
    ['a 101-character permission', () => ['p'.repeat(101)]],
    ['a 10 kB permission', () => ['p'.repeat(10_000)]],
    ['a string, not an array', () => 'contacts.read'],
    ['a space-separated string', () => 'contacts.read tasks.read'],
    ['null', () => null],
    ['an object', () => ({ 'contacts.read': true })],
    ['numbers', () => [1, 2]],
    ['null inside', () => [null]],
    ['a nested array', () => [['contacts.read']]],
    ['an object inside', () => [{ name: 'contacts.read' }]],
    ['booleans', () => [true]],
    ['10,000 unknown entries', () => Array(10_000).fill('a')],
    [`${2 * KNOWN_SCOPES.length + 1} known entries (more than twice the known list)`, () => Array(2 * KNOWN_SCOPES.length + 1).fill('contacts.read')],
  ];

  it.each(ROWS)('POST with %s: 400 naming the permissions field, nothing created', async (_label, permissions) => {
    const before = await snapshot();
    expectFieldError(await api('POST', '/roles', { name: `Perm ${++roleCounter}`, permissions: permissions() }), 'permissions');
    await expectUnchanged(before);
  });

  it.each(ROWS)('PATCH with %s: 400 naming the permissions field, nothing changed', async (_label, permissions) => {
    const name = await makeRole(['contacts.read', 'tasks.read']);
    const before = await snapshot();
    expectFieldError(await api('PATCH', `/roles/${encodeURIComponent(name)}`, { permissions: permissions() }), 'permissions');
    await expectUnchanged(before);
  });

  it('no permissions field on POST: 400, nothing created', async () => {
    const before = await snapshot();
    expectFieldError(await api('POST', '/roles', { name: 'No permissions' }), 'permissions');
    await expectUnchanged(before);
  });

  it('10,000 known entries (160 kB): 413, nothing created', async () => {
    const before = await snapshot();
    expectApiError(await api('POST', '/roles', { name: 'Huge', permissions: Array(10_000).fill('contacts.read') }), 413, 'request_too_large');
    await expectUnchanged(before);
  });

  it('the refusal of unknown permissions names them (cut to 40 characters each) and lists the known ones', async () => {
    const body = expectApiError(await api('POST', '/roles', { name: 'Unknown perms', permissions: ['nope', 'x'.repeat(90)] }), 400, 'invalid_request');
    const message = body.details!.find((d) => d.path === 'permissions')!.message;
    expect(message).toContain('"nope"');
    expect(message).toContain(`"${'x'.repeat(40)}"`);
    expect(message).not.toContain('x'.repeat(41));
    expect(message).toContain(KNOWN_SCOPES.join(' '));
  });

  it('duplicates are stored once, in the canonical order', async () => {
    const res = await api('POST', '/roles', { name: 'Duplicated', permissions: ['tasks.read', 'contacts.read', 'tasks.read', 'contacts.read', 'tasks.read'] });
    expect(res.statusCode, res.body).toBe(201);
    expect(res.json().permissions).toEqual(['contacts.read', 'tasks.read']);
    expect((await roleRow(orgA.organizationId, 'Duplicated'))?.permissions).toEqual(['contacts.read', 'tasks.read']);
  });

  it('an empty list is a role that may do nothing: 201', async () => {
    const res = await api('POST', '/roles', { name: 'Nothing', permissions: [] });
    expect(res.statusCode, res.body).toBe(201);
    expect(res.json().permissions).toEqual([]);
  });

  it('the management scopes, and every scope: an application acts as an admin, which holds them all, so 201', async () => {
    const management = await api('POST', '/roles', { name: 'Managers', permissions: [...MANAGEMENT_SCOPES] });
    expect(management.statusCode, management.body).toBe(201);
    expect(management.json().permissions).toEqual([...MANAGEMENT_SCOPES]);
    const all = await api('POST', '/roles', { name: 'Almost admin', permissions: [...KNOWN_SCOPES].reverse() });
    expect(all.statusCode, all.body).toBe(201);
    expect(all.json().permissions).toEqual([...KNOWN_SCOPES]);
    const widened = await api('PATCH', '/roles/Nothing', { permissions: [...MANAGEMENT_SCOPES, ...DATA_SCOPES] });
    expect(widened.statusCode, widened.body).toBe(200);
    expect(widened.json().permissions).toEqual([...KNOWN_SCOPES]);
  });
});

describe(`role descriptions on ${BACKEND}`, () => {
  it.each([
    ['501 characters', 'd'.repeat(501)],
    ['501 characters after trimming', `  ${'d'.repeat(501)}  `],
    ['a number', 42],
    ['null', null],
    ['an array', ['a description']],
  ])('%s: 400 naming the description field on POST and PATCH, nothing changed', async (_label, description) => {
    const name = await makeRole();
    const before = await snapshot();
    expectFieldError(await api('POST', '/roles', { name: `Described ${++roleCounter}`, description, permissions: [] }), 'description');
    expectFieldError(await api('PATCH', `/roles/${encodeURIComponent(name)}`, { description }), 'description');
    await expectUnchanged(before);
  });

  it('a NUL: 400 on POST and PATCH, nothing changed', async () => {
    const name = await makeRole();
    const before = await snapshot();
    expectApiError(await api('POST', '/roles', { name: `Described ${++roleCounter}`, description: 'a\u0000b', permissions: [] }), 400, 'invalid_request');
    expectApiError(await api('PATCH', `/roles/${encodeURIComponent(name)}`, { description: 'a\u0000b' }), 400, 'invalid_request');
    await expectUnchanged(before);
  });

  it('a lone surrogate: 400 naming the description field (as application names do), not silently stored as U+FFFD', async () => {
    const name = await makeRole();
    const before = await snapshot();
    expectFieldError(await api('POST', '/roles', { name: `Described ${++roleCounter}`, description: 'broken \ud800 text', permissions: [] }), 'description');
    expectFieldError(await api('PATCH', `/roles/${encodeURIComponent(name)}`, { description: 'broken \udc00' }), 'description');
    await expectUnchanged(before);
  });

  it('exactly 500 characters is accepted; markup is stored as is and shown escaped on the Roles page', async () => {
    const long = await api('POST', '/roles', { name: 'Long description', description: 'd'.repeat(500), permissions: [] });
    expect(long.statusCode, long.body).toBe(201);
    expect(long.json().description).toHaveLength(500);
    const markup = '<script>alert(1)</script><img src=x onerror=alert(2)>';
    const res = await api('POST', '/roles', { name: 'Markup', description: markup, permissions: [] });
    expect(res.statusCode, res.body).toBe(201);
    expect(res.json().description).toBe(markup);
    const owner = await signedIn(await ownerOf(orgA), orgA.organizationId, OWNER_PASSWORD);
    const page = await owner.get('/dashboard/roles');
    expectPage(page, 200);
    expect(page.body).not.toContain('<script>alert(1)');
    expect(page.body).not.toContain('<img src=x');
    expect(page.body).toContain('&lt;script&gt;alert(1)&lt;/script&gt;');
  });
});

// ---------------------------------------------------------------------------------------------
// The API: bodies and content types

describe(`/roles bodies of the wrong shape on ${BACKEND}`, () => {
  const POSTS: [label: string, status: number, error: string, body: () => unknown, headers?: Record<string, string>][] = [
    ['no body', 400, 'invalid_request', () => undefined],
    ['an empty object', 400, 'invalid_request', () => ({})],
    ['an unknown field', 400, 'invalid_request', () => ({ name: 'Extra', permissions: [], organization_id: orgB.organizationId })],
    ['builtin: true', 400, 'invalid_request', () => ({ name: 'Extra', permissions: [], builtin: true })],
    ['an id', 400, 'invalid_request', () => ({ name: 'Extra', permissions: [], id: 1 })],
    ['created_at', 400, 'invalid_request', () => ({ name: 'Extra', permissions: [], created_at: '2000-01-01T00:00:00Z' })],
    ['scopes instead of permissions', 400, 'invalid_request', () => ({ name: 'Extra', scopes: ['contacts.read'] })],
    ['__proto__ in the body', 400, 'invalid_request', () => '{"name":"Extra","permissions":[],"__proto__":{"builtin":true}}'],
    ['constructor.prototype in the body', 400, 'invalid_request', () => '{"name":"Extra","permissions":[],"constructor":{"prototype":{"x":1}}}'],
    ['a duplicated name key, the last a built-in name', 400, 'invalid_request', () => '{"name":"Extra","permissions":[],"name":"Admin"}'],
    ['a JSON array', 400, 'invalid_request', () => '[{"name":"Extra","permissions":[]}]'],
    ['a JSON string', 400, 'invalid_request', () => '"Extra"'],
    ['JSON null', 400, 'invalid_request', () => 'null'],
    ['malformed JSON', 400, 'invalid_request', () => '{"name":'],
    ['an empty JSON body', 400, 'invalid_request', () => ''],
    ['a form body', 415, 'unsupported_media_type', () => form({ name: 'Extra', permissions: 'contacts.read' }), { 'content-type': 'application/x-www-form-urlencoded' }],
    // Fastify reads text/plain as a string, which is no object: a 400, never a role.
    ['a text/plain body', 400, 'invalid_request', () => '{"name":"Extra","permissions":[]}', { 'content-type': 'text/plain' }],
    ['a multipart body', 415, 'unsupported_media_type', () => '--x\r\nContent-Disposition: form-data; name="name"\r\n\r\nExtra\r\n--x--', { 'content-type': 'multipart/form-data; boundary=x' }],
    ['application/xml', 415, 'unsupported_media_type', () => '<role name="Extra"/>', { 'content-type': 'application/xml' }],
    ['a 70 kB body', 413, 'request_too_large', () => ({ name: 'Extra', permissions: [], pad: 'x'.repeat(70_000) })],
  ];

  it.each(POSTS)('POST with %s → %i %s, nothing created', async (_label, status, error, body, headers) => {
    const before = await snapshot();
    expectApiError(await api('POST', '/roles', body(), headers ? { headers } : {}), status, error);
    await expectUnchanged(before);
    expect(await roleRow(orgA.organizationId, 'Extra')).toBeUndefined();
  });

  const PATCHES: [label: string, status: number, error: string, body: () => unknown, headers?: Record<string, string>][] = [
    ['an unknown field', 400, 'invalid_request', () => ({ description: 'x', organization_id: orgB.organizationId })],
    ['builtin: true', 400, 'invalid_request', () => ({ builtin: true })],
    ['members', 400, 'invalid_request', () => ({ members: [orgA.ownerId] })],
    ['a name that is null', 400, 'invalid_request', () => ({ name: null })],
    ['a name of a built-in role', 400, 'invalid_request', () => ({ name: 'Viewer' })],
    ['an empty name', 400, 'invalid_request', () => ({ name: '' })],
    ['a 65-character name', 400, 'invalid_request', () => ({ name: 'n'.repeat(65) })],
    ['a name with a slash', 400, 'invalid_request', () => ({ name: 'a/b' })],
    ['__proto__ in the body', 400, 'invalid_request', () => '{"description":"x","__proto__":{"permissions":["members.write"]}}'],
    ['a JSON array', 400, 'invalid_request', () => '[]'],
    ['malformed JSON', 400, 'invalid_request', () => '{'],
    ['a form body', 415, 'unsupported_media_type', () => 'description=x', { 'content-type': 'application/x-www-form-urlencoded' }],
    ['a text/plain body', 400, 'invalid_request', () => '{"description":"x"}', { 'content-type': 'text/plain' }],
    ['a 70 kB body', 413, 'request_too_large', () => ({ description: 'x'.repeat(70_000) })],
  ];

  it.each(PATCHES)('PATCH with %s → %i %s, nothing changed', async (_label, status, error, body, headers) => {
    const name = await makeRole(['contacts.read']);
    const before = await snapshot();
    expectApiError(await api('PATCH', `/roles/${encodeURIComponent(name)}`, body(), headers ? { headers } : {}), status, error);
    await expectUnchanged(before);
  });

  it('without members.write: 403 insufficient_scope for POST, PATCH and DELETE; GET works with members.read', async () => {
    const name = await makeRole();
    const before = await snapshot();
    const path = `/roles/${encodeURIComponent(name)}`;
    expectApiError(await api('POST', '/roles', { name: 'Extra', permissions: [] }, { bearer: readOnlyA }), 403, 'insufficient_scope');
    expectApiError(await api('PATCH', path, { description: 'x' }, { bearer: readOnlyA }), 403, 'insufficient_scope');
    expectApiError(await api('DELETE', path, undefined, { bearer: readOnlyA }), 403, 'insufficient_scope');
    // Even a malformed body learns nothing without the scope.
    expectApiError(await api('POST', '/roles', '{', { bearer: readOnlyA }), 403, 'insufficient_scope');
    expect((await api('GET', path, undefined, { bearer: readOnlyA })).statusCode).toBe(200);
    const dataOnly = await clientCredentialsToken(app, orgA, DATA_SCOPES.join(' '));
    expectApiError(await api('GET', '/roles', undefined, { bearer: dataOnly }), 403, 'insufficient_scope');
    await expectUnchanged(before);
  });
});

// ---------------------------------------------------------------------------------------------
// The API: role names in the path

describe(`role names in the path on ${BACKEND}`, () => {
  it("another organization's role by name: 404 for GET, PATCH and DELETE (in any letter case), org B untouched", async () => {
    const before = await snapshot();
    for (const name of ['Secret', 'secret', 'SECRET']) {
      expectApiError(await api('GET', `/roles/${name}`), 404, 'not_found');
      expectApiError(await api('PATCH', `/roles/${name}`, { description: 'taken over', permissions: [...KNOWN_SCOPES] }), 404, 'not_found');
      expectApiError(await api('DELETE', `/roles/${name}`), 404, 'not_found');
      expectApiError(await api('DELETE', `/roles/${name}?move_to=viewer`), 404, 'not_found');
    }
    await expectUnchanged(before);
    // And org A's token on org B's path is refused before anything is looked up.
    expectApiError(await api('GET', `/roles/Secret`, undefined, { fixture: orgB, bearer: bearerA }), 403, 'organization_mismatch');
    expectApiError(await api('DELETE', `/roles/Secret`, undefined, { fixture: orgB, bearer: bearerA }), 403, 'organization_mismatch');
    expectApiError(await api('PATCH', `/roles/Secret`, { description: 'x' }, { fixture: orgB, bearer: bearerA }), 403, 'organization_mismatch');
    await expectUnchanged(before);
  });

  it('a percent-encoded name is the name it encodes (a custom role, a built-in one); an encoded slash or dot-dot names nothing', async () => {
    const name = await makeRole(['contacts.read'], orgA.organizationId, 'Encoded');
    const encoded = [...Buffer.from(name)].map((b) => `%${b.toString(16).padStart(2, '0').toUpperCase()}`).join('');
    expect((await api('GET', `/roles/${encoded}`)).json().name).toBe(name);
    expect((await api('GET', '/roles/%6F%77%6E%65%72')).json()).toMatchObject({ name: 'owner', builtin: true });
    const before = await snapshot();
    expectApiError(await api('PATCH', '/roles/%6F%77%6E%65%72', { description: 'x' }), 403, 'forbidden');
    // (A bare %2E%2E is a dot segment the URL parser resolves before the router sees it.)
    for (const path of ['a%2Fb', '..%2Fadmin', '%2E%2E%2F', 'Encoded%201%2F..', '%20', 'a%3Fb', 'a%23b', '%2Fowner']) {
      expectApiError(await api('GET', `/roles/${path}`), 404, 'not_found');
      expectApiError(await api('PATCH', `/roles/${path}`, { description: 'x' }), 404, 'not_found');
      expectApiError(await api('DELETE', `/roles/${path}`), 404, 'not_found');
    }
    await expectUnchanged(before);
  });

  it('a name of 65 to 100 characters: 404; over 100: 414; undecodable: 400; nothing changed', async () => {
    const before = await snapshot();
    for (const length of [65, 100]) {
      const path = `/roles/${'r'.repeat(length)}`;
      expectApiError(await api('GET', path), 404, 'not_found');
      expectApiError(await api('PATCH', path, { description: 'x' }), 404, 'not_found');
      expectApiError(await api('DELETE', path), 404, 'not_found');
    }
    for (const path of [`/roles/${'r'.repeat(101)}`, `/roles/${'r'.repeat(10_000)}`, `/roles/${'%41'.repeat(200)}`]) {
      expectApiError(await api('GET', path), 414, 'invalid_request');
      expectApiError(await api('DELETE', path), 414, 'invalid_request');
    }
    for (const path of ['/roles/%ZZ', '/roles/%E0%A4%A', '/roles/%ED%A0%80', '/roles/%FF']) {
      expectApiError(await api('GET', path), 400, 'invalid_request');
      expectApiError(await api('PATCH', path, { description: 'x' }), 400, 'invalid_request');
    }
    await expectUnchanged(before);
  });

  it('a NUL in the name: 404 like any name that is not a role, nothing changed', async () => {
    const name = await makeRole();
    const before = await snapshot();
    for (const path of [`/roles/${encodeURIComponent(name)}%00`, '/roles/%00', '/roles/owner%00']) {
      expectApiError(await api('GET', path), 404, 'not_found');
      expectApiError(await api('PATCH', path, { description: 'x' }), 404, 'not_found');
      expectApiError(await api('DELETE', path), 404, 'not_found');
    }
    await expectUnchanged(before);
  });

  it('the built-in roles by their name: GET 200; PATCH and DELETE 403 forbidden, with or without a body or move_to', async () => {
    const before = await snapshot();
    for (const name of BUILTIN) {
      expect((await api('GET', `/roles/${name}`)).json()).toMatchObject({ name, builtin: true, created_at: null });
      expectApiError(await api('PATCH', `/roles/${name}`, { description: 'x' }), 403, 'forbidden');
      expectApiError(await api('PATCH', `/roles/${name}`, { permissions: [] }), 403, 'forbidden');
      expectApiError(await api('PATCH', `/roles/${name}`, { name: 'Renamed' }), 403, 'forbidden');
      expectApiError(await api('PATCH', `/roles/${name}`, {}), 403, 'forbidden');
      expectApiError(await api('DELETE', `/roles/${name}`), 403, 'forbidden');
      expectApiError(await api('DELETE', `/roles/${name}?move_to=viewer`), 403, 'forbidden');
    }
    // 'custom' is the rows' marker, not a role.
    expectApiError(await api('GET', '/roles/custom'), 404, 'not_found');
    expectApiError(await api('PATCH', '/roles/custom', { description: 'x' }), 404, 'not_found');
    expectApiError(await api('DELETE', '/roles/custom'), 404, 'not_found');
    await expectUnchanged(before);
  });
});

// ---------------------------------------------------------------------------------------------
// The API: deleting a role in use

describe(`DELETE /roles/:role with hostile move_to on ${BACKEND}`, () => {
  it('a role a member holds: 409 without move_to; 400 with itself (any case), unknown, empty, repeated or org B\u2019s; 403 with owner; then moved with viewer', async () => {
    const name = await makeRole(['contacts.read', 'contacts.write', 'tasks.read'], orgA.organizationId, 'Held');
    const holder = await memberWith(orgA.organizationId, name, 'holder');
    const grant = await grantOf(holder.id, ['contacts.read', 'contacts.write']);
    const path = `/roles/${encodeURIComponent(name)}`;
    const before = await snapshot();
    const conflict = expectApiError(await api('DELETE', path), 409, 'conflict');
    expect(conflict.error_description).toContain('1 member(s)');
    for (const moveTo of [name, name.toUpperCase(), name.toLowerCase()]) {
      expectFieldError(await api('DELETE', `${path}?move_to=${encodeURIComponent(moveTo)}`), 'move_to');
    }
    for (const moveTo of ['Nope', 'OWNER', 'Admin', 'Secret', 'custom', ' viewer', 'a'.repeat(65), 'a'.repeat(200)]) {
      expectFieldError(await api('DELETE', `${path}?move_to=${encodeURIComponent(moveTo)}`), 'move_to');
    }
    expectApiError(await api('DELETE', `${path}?move_to=viewer%00`), 400, 'invalid_request');
    expectApiError(await api('DELETE', `${path}?move_to=`), 400, 'invalid_request');
    expectApiError(await api('DELETE', `${path}?move_to=viewer&move_to=member`), 400, 'invalid_request');
    expectApiError(await api('DELETE', `${path}?move_to=${'a'.repeat(201)}`), 400, 'invalid_request');
    // An application acts as an admin, and an admin may not make anyone an owner.
    expectApiError(await api('DELETE', `${path}?move_to=owner`), 403, 'forbidden');
    await expectUnchanged(before);
    expect(await membershipOf(orgA.organizationId, holder.id)).toEqual({ role: 'custom', role_id: expect.any(Number) });

    // The positive control: moved to viewer, the grant narrowed to what viewer holds.
    expect((await api('DELETE', `${path}?move_to=viewer`)).statusCode).toBe(204);
    expect(await membershipOf(orgA.organizationId, holder.id)).toEqual({ role: 'viewer', role_id: null });
    expect(await roleRow(orgA.organizationId, name)).toBeUndefined();
    // The positive control also shows the grant was live until then: narrowed to what viewer holds.
    expect((await db().selectFrom('grants').select('revoked_reason').where('id', '=', grant).executeTakeFirstOrThrow()).revoked_reason).toBe('role_changed');
    expect((await db().selectFrom('grants').select('scopes').where('narrowed_from_grant_id', '=', grant).executeTakeFirstOrThrow()).scopes).toEqual(['contacts.read']);
  });

  it('a role only a pending invitation names: 409 without move_to, nothing changed', async () => {
    const name = await makeRole(['contacts.read'], orgA.organizationId, 'Invited');
    const invited = await api('POST', '/invitations', { email: address('invited'), role: name });
    expect(invited.statusCode, invited.body).toBe(201);
    expect(invited.json().role).toBe(name);
    const before = await snapshot();
    expectApiError(await api('DELETE', `/roles/${encodeURIComponent(name)}`), 409, 'conflict');
    await expectUnchanged(before);
  });

  it('a role nobody holds is deleted without move_to, but a bad move_to is still refused first', async () => {
    const name = await makeRole(['contacts.read'], orgA.organizationId, 'Unused');
    const path = `/roles/${encodeURIComponent(name)}`;
    const before = await snapshot();
    expectFieldError(await api('DELETE', `${path}?move_to=Nope`), 'move_to');
    expectApiError(await api('DELETE', `${path}?move_to=owner`), 403, 'forbidden');
    await expectUnchanged(before);
    expect((await api('DELETE', path)).statusCode).toBe(204);
    expectApiError(await api('DELETE', path), 404, 'not_found');
  });
});

// ---------------------------------------------------------------------------------------------
// The 101st custom role

describe(`the custom-role cap (${MAX_CUSTOM_ROLES}) on ${BACKEND}`, () => {
  let org: OrgFixture;
  let bearer: string;
  beforeAll(async () => {
    org = await createOrgFixture(db(), { scopes: KNOWN_SCOPES.join(' ') });
    bearer = await clientCredentialsToken(app, org);
    await db()
      .insertInto('roles')
      .values(Array.from({ length: MAX_CUSTOM_ROLES - 3 }, (_, i) => ({ organization_id: org.organizationId, name: `Cap ${i}`, permissions: ['contacts.read'], updated_at: new Date() })))
      .execute();
  });

  it(`five concurrent creations with ${MAX_CUSTOM_ROLES - 3} roles: exactly three 201, two 409; the ${MAX_CUSTOM_ROLES + 1}st is 409 through the API and the dashboard; a deleted one makes room`, async () => {
    const results = await Promise.all([0, 1, 2, 3, 4].map((i) => api('POST', '/roles', { name: `Concurrent ${i}`, permissions: [] }, { fixture: org, bearer })));
    expect(results.map((r) => r.statusCode).sort()).toEqual([201, 201, 201, 409, 409]);
    expect(await customRoleCount(org.organizationId)).toBe(MAX_CUSTOM_ROLES);

    const owner = await signedIn(await ownerOf(org), org.organizationId, OWNER_PASSWORD);
    const before = await snapshot();
    const refused = expectApiError(await api('POST', '/roles', { name: 'One too many', permissions: [] }, { fixture: org, bearer }), 409, 'conflict');
    expect(refused.error_description).toContain(String(MAX_CUSTOM_ROLES));
    expectPage(await submit(owner, '/dashboard/roles', { name: 'One too many', scopes: 'contacts.read' }), 409, `at most ${MAX_CUSTOM_ROLES} custom roles`);
    await expectUnchanged(before);
    // GET /roles shows them all: the built-in ones and the hundred.
    const list = await api('GET', '/roles', undefined, { fixture: org, bearer });
    expect(list.json().data).toHaveLength(BUILTIN.length + MAX_CUSTOM_ROLES);

    expect((await api('DELETE', '/roles/Cap%200', undefined, { fixture: org, bearer })).statusCode).toBe(204);
    expect((await api('POST', '/roles', { name: 'One too many', permissions: [] }, { fixture: org, bearer })).statusCode).toBe(201);
  });
});

// ---------------------------------------------------------------------------------------------
// The members and invitations APIs: role names

describe(`the members and invitations APIs with unknown role names on ${BACKEND}`, () => {
  const UNKNOWN: [label: string, role: unknown, detail: boolean][] = [
    ['an unknown name', 'superuser', true],
    ['a built-in name in upper case', 'ADMIN', true],
    ['Owner', 'Owner', true],
    ["org B's role", 'Secret', true],
    ['custom', 'custom', true],
    ['an empty name', '', true],
    ['65 characters', 'r'.repeat(65), true],
    ['201 characters', 'r'.repeat(201), true],
    ['10 kB', 'r'.repeat(10_000), true],
    ['null', null, true],
    ['a number', 1, true],
    ['an array', ['member'], true],
    ['an object', { name: 'member' }, true],
  ];

  it.each(UNKNOWN)('PATCH /members/:id with %s: 400 naming role, the role unchanged', async (_label, role) => {
    const target = await memberWith(orgA.organizationId, 'member', 'patched');
    const before = await snapshot();
    expectFieldError(await api('PATCH', `/members/${target.id}`, { role }), 'role');
    await expectUnchanged(before);
  });

  it.each(UNKNOWN)('POST /members with %s: 400 naming role, nobody added', async (_label, role) => {
    const user = await newUser('added');
    const before = await snapshot();
    expectFieldError(await api('POST', '/members', { email: user.email, role }), 'role');
    await expectUnchanged(before);
  });

  it.each(UNKNOWN)('POST /invitations with %s: 400 naming role, nobody invited, nothing sent', async (_label, role) => {
    const before = await snapshot();
    expectFieldError(await api('POST', '/invitations', { email: address('invitee'), role }), 'role');
    await expectUnchanged(before);
  });

  it('a NUL in the role name: 400, nothing changed', async () => {
    const target = await memberWith(orgA.organizationId, 'member', 'nul');
    const before = await snapshot();
    expectApiError(await api('PATCH', `/members/${target.id}`, { role: 'member\u0000' }), 400, 'invalid_request');
    expectApiError(await api('POST', '/invitations', { email: address('nul'), role: 'viewer\u0000' }), 400, 'invalid_request');
    await expectUnchanged(before);
  });

  it('owner through the API (an application acts as an admin): 403 for adding, inviting, promoting; the owner cannot be demoted or removed (403)', async () => {
    const target = await memberWith(orgA.organizationId, 'member', 'promoted');
    const user = await newUser('owner-add');
    const custom = await makeRole(['contacts.read']);
    const before = await snapshot();
    expectApiError(await api('PATCH', `/members/${target.id}`, { role: 'owner' }), 403, 'forbidden');
    expectApiError(await api('POST', '/members', { email: user.email, role: 'owner' }), 403, 'forbidden');
    expectApiError(await api('POST', '/invitations', { email: address('owner-invite'), role: 'owner' }), 403, 'forbidden');
    for (const role of ['admin', 'member', 'viewer', custom]) {
      expectApiError(await api('PATCH', `/members/${orgA.ownerId}`, { role }), 403, 'forbidden');
    }
    expectApiError(await api('DELETE', `/members/${orgA.ownerId}`), 403, 'forbidden');
    await expectUnchanged(before);
    expect(await membershipOf(orgA.organizationId, orgA.ownerId)).toEqual({ role: 'owner', role_id: null });
  });

  it("org A's custom role cannot be given in org B, nor org B's in org A, and org A's API cannot reach org B's member", async () => {
    const name = await makeRole(['contacts.read'], orgA.organizationId, 'OnlyA');
    const userA = await memberWith(orgA.organizationId, 'viewer', 'usera');
    const userB = await memberWith(orgB.organizationId, 'viewer', 'userb');
    const before = await snapshot();
    expectFieldError(await api('PATCH', `/members/${userB.id}`, { role: name }, { fixture: orgB }), 'role');
    expectFieldError(await api('PATCH', `/members/${userA.id}`, { role: 'Secret' }), 'role');
    expectFieldError(await api('POST', '/invitations', { email: address('cross'), role: 'Secret' }), 'role');
    // The role is looked up first (org A's names only), then the member (org A's only).
    expectFieldError(await api('PATCH', `/members/${userB.id}`, { role: 'Secret' }), 'role');
    expectApiError(await api('PATCH', `/members/${userB.id}`, { role: name }), 404, 'not_found');
    expectApiError(await api('DELETE', `/members/${userB.id}`), 404, 'not_found');
    await expectUnchanged(before);
    // The positive control: org B gives its own role (in any letter case).
    expect((await api('PATCH', `/members/${userB.id}`, { role: 'secret' }, { fixture: orgB })).statusCode).toBe(200);
    const secret = await roleRow(orgB.organizationId, 'Secret');
    expect(await membershipOf(orgB.organizationId, userB.id)).toEqual({ role: 'custom', role_id: secret!.id });
  });
});

// ---------------------------------------------------------------------------------------------
// The dashboard: who may use the Roles forms

describe(`the dashboard's Roles forms and who may use them on ${BACKEND}`, () => {
  let owner: Browser;
  let viewer: Browser;
  let member: Browser;
  /** A custom role that manages members and reads contacts, nothing else. */
  let recruiter: Browser;
  let recruiterUser: TestUser;
  /** Roles the recruiter may and may not touch. */
  let small: string;
  let wide: string;
  let plainMember: TestUser;
  let smallHolder: TestUser;
  beforeAll(async () => {
    await createRole(db(), orgA.organizationId, { name: 'Recruiter', permissions: ['members.read', 'members.write', 'contacts.read'] });
    small = await makeRole(['contacts.read'], orgA.organizationId, 'Small');
    wide = await makeRole(['contacts.read', 'tasks.write'], orgA.organizationId, 'Wide');
    owner = await signedIn(await ownerOf(orgA), orgA.organizationId, OWNER_PASSWORD);
    viewer = await signedIn(await memberWith(orgA.organizationId, 'viewer', 'dashviewer'), orgA.organizationId);
    member = await signedIn(await memberWith(orgA.organizationId, 'member', 'dashmember'), orgA.organizationId);
    recruiterUser = await memberWith(orgA.organizationId, 'Recruiter', 'recruiter');
    recruiter = await signedIn(recruiterUser, orgA.organizationId);
    plainMember = await memberWith(orgA.organizationId, 'member', 'plain');
    smallHolder = await memberWith(orgA.organizationId, small, 'smallholder');
    await grantOf(plainMember.id, ['contacts.read', 'tasks.read']);
    await grantOf(smallHolder.id, ['contacts.read']);
  });

  it('a viewer: the Roles page is 403, every Roles form is 403, nothing changed', async () => {
    expectPage(await viewer.get('/dashboard/roles'), 403, NOT_ALLOWED);
    const before = await snapshot();
    expectPage(await submit(viewer, '/dashboard/roles', { name: 'By viewer', scopes: [] }), 403, NOT_ALLOWED);
    expectPage(await submit(viewer, `/dashboard/roles/${encodeURIComponent(small)}`, { name: small, description: 'x', scopes: 'contacts.read' }), 403, NOT_ALLOWED);
    expectPage(await submit(viewer, `/dashboard/roles/${encodeURIComponent(small)}/delete`, { move_to: 'viewer' }), 403, NOT_ALLOWED);
    expectPage(await submit(viewer, `/dashboard/members/${plainMember.id}/role`, { role: 'viewer' }), 403, NOT_ALLOWED);
    await expectUnchanged(before);
  });

  it('a member: the Roles page shows no form; every Roles form is 403, nothing changed', async () => {
    const page = await member.get('/dashboard/roles');
    expectPage(page, 200);
    expect(page.body).not.toContain('action="/dashboard/roles"');
    expect(page.body).not.toContain('/delete"');
    const before = await snapshot();
    expectPage(await submit(member, '/dashboard/roles', { name: 'By member', scopes: [] }), 403, NOT_ALLOWED);
    expectPage(await submit(member, `/dashboard/roles/${encodeURIComponent(small)}`, { name: 'Renamed by member', scopes: [] }), 403, NOT_ALLOWED);
    expectPage(await submit(member, `/dashboard/roles/${encodeURIComponent(small)}/delete`, {}), 403, NOT_ALLOWED);
    expectPage(await submit(member, '/dashboard/roles/owner', { name: 'x' }), 403, NOT_ALLOWED);
    await expectUnchanged(before);
  });

  it('without a CSRF token, with a wrong one, another session\u2019s, or signed out: 403, nothing changed', async () => {
    const otherSession = await viewer.csrf('/dashboard');
    const before = await snapshot();
    for (const url of ['/dashboard/roles', `/dashboard/roles/${encodeURIComponent(small)}`, `/dashboard/roles/${encodeURIComponent(small)}/delete`]) {
      const fields = { name: 'Forged', description: 'x', scopes: [...KNOWN_SCOPES], move_to: 'viewer' };
      expectPage(await owner.post(url, fields), 403, CSRF_FAILED);
      expectPage(await owner.post(url, { ...fields, csrf_token: 'x'.repeat(43) }), 403, CSRF_FAILED);
      expectPage(await owner.post(url, { ...fields, csrf_token: '' }), 403, CSRF_FAILED);
      expectPage(await owner.post(url, { ...fields, csrf_token: otherSession }), 403, CSRF_FAILED);
      expectPage(await browser().post(url, { ...fields, csrf_token: otherSession }), 403, CSRF_FAILED);
      // A JSON body carries no form token.
      const json = await app.inject({
        method: 'POST',
        url,
        headers: { 'content-type': 'application/json', cookie: [...owner.cookies].map(([k, v]) => `${k}=${v}`).join('; ') },
        payload: JSON.stringify(fields),
        remoteAddress: '10.15.9.9',
      });
      expectPage(json, 403, CSRF_FAILED);
    }
    await expectUnchanged(before);
  });

  it('a custom role that manages members: creating a role with a permission it lacks is 403, the form shown again; within its own, 200', async () => {
    const before = await snapshot();
    for (const scopes of [['tasks.read'], ['contacts.read', 'contacts.write'], ['members.write', 'applications.write'], [...KNOWN_SCOPES]]) {
      const res = await submit(recruiter, '/dashboard/roles', { name: 'Escalated', description: 'mine', scopes });
      expectPage(res, 403, 'your role does not hold');
      expect(res.body).toContain('value="Escalated"');
    }
    await expectUnchanged(before);
    expect(await roleRow(orgA.organizationId, 'Escalated')).toBeUndefined();
    // Within what it holds: allowed (the guard is about the permissions, not the form).
    const ok = await submit(recruiter, '/dashboard/roles', { name: 'Recruited', scopes: ['members.read', 'contacts.read'] });
    expectRedirect(ok, '/dashboard/roles');
    expectPage(await recruiter.get('/dashboard/roles'), 200, 'Role Recruited created.');
    expect((await roleRow(orgA.organizationId, 'Recruited'))?.permissions).toEqual(['contacts.read', 'members.read']);
  });

  it('a custom role that manages members: editing a role that holds more than it, or giving a role more, or editing its own role upwards, is 403, nothing changed', async () => {
    const before = await snapshot();
    const widePath = `/dashboard/roles/${encodeURIComponent(wide)}`;
    expectPage(await submit(recruiter, widePath, { name: wide, description: 'narrowed by recruiter', scopes: 'contacts.read' }), 403, 'your role does not hold tasks.write');
    expectPage(await submit(recruiter, widePath, { name: 'Renamed wide', scopes: ['contacts.read', 'tasks.write'] }), 403);
    expectPage(await submit(recruiter, `/dashboard/roles/${encodeURIComponent(small)}`, { name: small, scopes: ['contacts.read', 'tasks.read'] }), 403, 'your role does not hold tasks.read');
    expectPage(await submit(recruiter, '/dashboard/roles/Recruiter', { name: 'Recruiter', scopes: ['members.read', 'members.write', 'contacts.read', 'audit.read'] }), 403, 'audit.read');
    expectPage(await submit(recruiter, '/dashboard/roles/recruiter', { name: 'Recruiter', scopes: [...KNOWN_SCOPES] }), 403);
    for (const builtin of BUILTIN) expectPage(await submit(recruiter, `/dashboard/roles/${builtin}`, { name: 'Mine now', scopes: [] }), 403, 'built-in role');
    await expectUnchanged(before);
  });

  it('a custom role that manages members: deleting a role that holds more, or moving members to a role that holds more (or owner), is 403, nothing changed', async () => {
    const victim = await makeRole(['contacts.read'], orgA.organizationId, 'Victim');
    const victimHolder = await memberWith(orgA.organizationId, victim, 'victimholder');
    const before = await snapshot();
    // Refused before the confirmation page is even shown, and when it is sent.
    expectPage(await submit(recruiter, `/dashboard/roles/${encodeURIComponent(wide)}/delete`, {}), 403, 'your role does not hold');
    expectPage(await submit(recruiter, `/dashboard/roles/${encodeURIComponent(wide)}/delete`, { confirm: 'delete', move_to: small }), 403, 'your role does not hold');
    for (const moveTo of ['member', 'admin', 'owner', 'viewer', wide]) {
      expectPage(await submit(recruiter, `/dashboard/roles/${encodeURIComponent(victim)}/delete`, { confirm: 'delete', move_to: moveTo }), 403, `may not give`);
    }
    expectPage(await submit(recruiter, `/dashboard/roles/${encodeURIComponent(victim)}/delete`, { confirm: 'delete', move_to: 'Nope' }), 400, 'no role named');
    expectPage(await submit(recruiter, `/dashboard/roles/${encodeURIComponent(victim)}/delete`, { confirm: 'delete', move_to: victim }), 400, 'choose another role');
    expectPage(await submit(recruiter, `/dashboard/roles/${encodeURIComponent(victim)}/delete`, { confirm: 'delete' }), 409, '1 member(s)');
    // The confirmation page offers only the roles it may give, never the one going.
    const ask = await submit(recruiter, `/dashboard/roles/${encodeURIComponent(victim)}/delete`, {});
    expectPage(ask, 200, `Delete the role ${victim}?`);
    const offered = [...ask.body.matchAll(/<option value="([^"]*)"/g)].map((m) => m[1]);
    expect(offered).toContain(small);
    for (const refused of [victim, wide, 'owner', 'admin', 'member', 'viewer']) expect(offered).not.toContain(refused);
    await expectUnchanged(before);
    // Moving them to a role within its own: allowed.
    const deleted = await submit(recruiter, `/dashboard/roles/${encodeURIComponent(victim)}/delete`, { confirm: 'delete', move_to: small });
    expectRedirect(deleted, '/dashboard/roles');
    expectPage(await recruiter.get('/dashboard/roles'), 200, `Deleted the role ${victim}.`);
    expect(await membershipOf(orgA.organizationId, victimHolder.id)).toEqual({ role: 'custom', role_id: (await roleRow(orgA.organizationId, small))!.id });
    expect(await roleRow(orgA.organizationId, victim)).toBeUndefined();
  });

  it('a custom role that manages members: giving, inviting or adding with a role that holds more, or changing or removing someone who holds more, is 403, nothing changed', async () => {
    const newcomer = await newUser('newcomer');
    const before = await snapshot();
    for (const role of ['member', 'viewer', 'admin', 'owner', wide]) {
      expectPage(await submit(recruiter, `/dashboard/members/${smallHolder.id}/role`, { role }), 403);
      expectPage(await submit(recruiter, '/dashboard/invitations', { email: address('recruited'), role }), 403);
      expectPage(await submit(recruiter, '/dashboard/members', { email: newcomer.email, role }), 403);
    }
    // Someone whose role holds more than the recruiter's: not to be changed or removed, even to a role it may give.
    expectPage(await submit(recruiter, `/dashboard/members/${plainMember.id}/role`, { role: small }), 403);
    expectPage(await submit(recruiter, `/dashboard/members/${plainMember.id}/remove`, {}), 403);
    expectPage(await submit(recruiter, `/dashboard/members/${orgA.ownerId}/role`, { role: small }), 403);
    expectPage(await submit(recruiter, `/dashboard/members/${orgA.ownerId}/remove`, {}), 403);
    await expectUnchanged(before);
    // Within its own: a holder of Small may be moved to another role within it (named in any letter case).
    const within = await makeRole(['members.read'], orgA.organizationId, 'Within');
    expectRedirect(await submit(recruiter, `/dashboard/members/${smallHolder.id}/role`, { role: within.toLowerCase() }), '/dashboard/members');
    expect(await membershipOf(orgA.organizationId, smallHolder.id)).toEqual({ role: 'custom', role_id: (await roleRow(orgA.organizationId, within))!.id });
  });

  it('the Members forms with unknown role names: 400 (add, invite, change), "Choose a role.", nothing changed', async () => {
    const newcomer = await newUser('newcomer-unknown');
    const before = await snapshot();
    for (const role of ['superuser', 'ADMIN', 'Owner', 'Secret', 'custom', 'r'.repeat(65), 'r'.repeat(5000), 'viewer\u200b']) {
      expectPage(await submit(owner, `/dashboard/members/${plainMember.id}/role`, { role }), 400, 'Choose a role.');
      expectPage(await submit(owner, '/dashboard/members', { email: newcomer.email, role }), 400, 'Choose a role.');
      expectPage(await submit(owner, '/dashboard/invitations', { email: address('unknown-role'), role }), 400, 'Choose a role.');
    }
    // No role at all, a repeated one, a NUL.
    expectPage(await submit(owner, `/dashboard/members/${plainMember.id}/role`, {}), 400, 'Choose a role.');
    expectPage(await submit(owner, `/dashboard/members/${plainMember.id}/role`, { role: ['viewer', 'owner'] }), 400);
    expectPage(await submit(owner, `/dashboard/members/${plainMember.id}/role`, { role: 'viewer\u0000' }), 400);
    expectPage(await submit(owner, '/dashboard/invitations', { email: address('unknown-role'), role: ['viewer', 'owner'] }), 400);
    await expectUnchanged(before);
  });

  it('the Roles forms with hostile input as the owner: 400 with the form again, nothing changed', async () => {
    const before = await snapshot();
    const rows: [Record<string, string | string[]>, number, string?][] = [
      [{ name: '', scopes: [] }, 400, 'must not be empty'],
      [{ scopes: [] }, 400, 'must not be empty'],
      [{ name: '   ', scopes: [] }, 400, 'must not be empty'],
      [{ name: 'n'.repeat(65), scopes: [] }, 400, 'at most 64'],
      [{ name: 'n'.repeat(10_000), scopes: [] }, 400, 'at most 64'],
      [{ name: 'Admin', scopes: [] }, 400, 'built-in role'],
      [{ name: 'CUSTOM', scopes: [] }, 400, 'built-in role'],
      [{ name: '<script>x</script>', scopes: [] }, 400, 'letters, digits'],
      [{ name: '../etc', scopes: [] }, 400, 'letters, digits'],
      [{ name: 'a/b', scopes: [] }, 400, 'letters, digits'],
      [{ name: 'ok', description: 'd'.repeat(501), scopes: [] }, 400, 'at most 500'],
      [{ name: 'ok', scopes: ['nope'] }, 400, 'unknown permission'],
      [{ name: 'ok', scopes: ['owner'] }, 400, 'unknown permission'],
      [{ name: 'ok', scopes: Array(2 * KNOWN_SCOPES.length + 1).fill('contacts.read') }, 400, 'too many permissions'],
      [{ name: small.toUpperCase(), scopes: [] }, 409, 'already exists'],
      [{ name: ['a', 'b'], scopes: [] }, 400],
      [{ name: 'ok\u0000', scopes: [] }, 400],
    ];
    for (const [fields, status, text] of rows) {
      const res = await submit(owner, '/dashboard/roles', fields);
      expectPage(res, status, text);
    }
    await expectUnchanged(before);
    const form10k = Array(10_000).fill('contacts.read');
    expectPage(await submit(owner, '/dashboard/roles', { name: 'Huge', scopes: form10k }), 413);
    await expectUnchanged(before);
  });

  it('a dashboard name that PostgreSQL lowers to a built-in one (ADMİN): 400 with the form again, not a 500', async () => {
    const before = await snapshot();
    expectPage(await submit(owner, '/dashboard/roles', { name: 'ADMİN', scopes: [] }), 400);
    expectPage(await submit(owner, `/dashboard/roles/${encodeURIComponent(small)}`, { name: 'VİEWER', scopes: ['contacts.read'] }), 400);
    await expectUnchanged(before);
  });

  it('a NUL in a dashboard role path: the 404 page like any name that is not a role, not a database error (500); nothing changed', async () => {
    const before = await snapshot();
    for (const name of [`${encodeURIComponent(small)}%00`, '%00']) {
      expectPage(await submit(owner, `/dashboard/roles/${name}`, { name: 'Taken', scopes: [] }), 404, 'no such role');
      expectPage(await submit(owner, `/dashboard/roles/${name}/delete`, { move_to: 'viewer' }), 404, 'no such role');
    }
    await expectUnchanged(before);
  });

  it('the dashboard paths: an unknown, another organization\u2019s or an overlong role is 404; a built-in one 403; nothing changed', async () => {
    const before = await snapshot();
    for (const name of ['Nope', 'Secret', 'secret', 'r'.repeat(65), 'a%2Fb', '..%2Fowner', '%20']) {
      expectPage(await submit(owner, `/dashboard/roles/${name}`, { name: 'Taken', scopes: [] }), 404, 'no such role');
      expectPage(await submit(owner, `/dashboard/roles/${name}/delete`, { move_to: 'viewer' }), 404, 'no such role');
    }
    for (const name of BUILTIN) {
      expectPage(await submit(owner, `/dashboard/roles/${name}`, { name: 'Taken', scopes: [] }), 403, 'built-in role');
      expectPage(await submit(owner, `/dashboard/roles/${name}/delete`, { move_to: 'viewer' }), 403, 'built-in role');
    }
    await expectUnchanged(before);
  });
});

describe(`a role that manages members but cannot see them on ${BACKEND}`, () => {
  it('a refused dashboard change changes nothing, and a change that is made is not answered with 403', async () => {
    await createRole(db(), orgA.organizationId, { name: 'Blind writer', permissions: ['members.write'] });
    await createRole(db(), orgA.organizationId, { name: 'Blind nothing', permissions: [] });
    const writer = await signedIn(await memberWith(orgA.organizationId, 'Blind writer', 'blindwriter'), orgA.organizationId);
    const res = await submit(writer, '/dashboard/roles', { name: 'Made blind', scopes: [] });
    const made = (await roleRow(orgA.organizationId, 'Made blind')) !== undefined;
    // Either the change is refused (and not made) or it is made (and the page it goes back to says so).
    expect({ status: res.statusCode, made }).toEqual(res.statusCode === 403 ? { status: 403, made: false } : { status: 303, made: true });
    const invited = address('blind');
    const inv = await submit(writer, '/dashboard/invitations', { email: invited, role: 'Blind nothing' });
    const sent = (await db().selectFrom('invitations').select('id').where('email', '=', invited).executeTakeFirst()) !== undefined;
    expect({ status: inv.statusCode, sent }).toEqual(inv.statusCode === 403 ? { status: 403, sent: false } : { status: 303, sent: true });
  });
});

// ---------------------------------------------------------------------------------------------
// The last owner

describe(`the last owner through every path on ${BACKEND}`, () => {
  it('API, admin and owner in the dashboard, a custom role with every permission: the only owner is never demoted or removed', async () => {
    const org = await createOrgFixture(db(), { scopes: KNOWN_SCOPES.join(' ') });
    const bearer = await clientCredentialsToken(app, org);
    const owner = await ownerOf(org);
    const everything = await makeRole([...KNOWN_SCOPES], org.organizationId, 'Everything');
    const adminUser = await memberWith(org.organizationId, 'admin', 'lastadmin');
    const everythingUser = await memberWith(org.organizationId, everything, 'everything');
    const ownerBrowser = await signedIn(owner, org.organizationId, OWNER_PASSWORD);
    const adminBrowser = await signedIn(adminUser, org.organizationId);
    const everythingBrowser = await signedIn(everythingUser, org.organizationId);
    const ownerGrant = await grantOf(owner.id, ['contacts.read', 'contacts.write', 'tasks.read'], org);
    const before = await snapshot();

    // The API acts as an admin: it may not touch an owner at all.
    for (const role of ['admin', 'member', 'viewer', everything, 'owner']) {
      expectApiError(await api('PATCH', `/members/${owner.id}`, { role }, { fixture: org, bearer }), 403, 'forbidden');
    }
    expectApiError(await api('DELETE', `/members/${owner.id}`, undefined, { fixture: org, bearer }), 403, 'forbidden');
    // Neither may an admin, nor a custom role holding every permission, in the dashboard.
    for (const b of [adminBrowser, everythingBrowser]) {
      for (const role of ['admin', 'member', 'viewer', everything]) expectPage(await submit(b, `/dashboard/members/${owner.id}/role`, { role }), 403, 'only an owner');
      expectPage(await submit(b, `/dashboard/members/${owner.id}/remove`, {}), 403, 'only an owner');
    }
    // The owner themselves: 409, the last owner.
    for (const role of ['admin', 'member', 'viewer', everything, everything.toUpperCase()]) {
      expectPage(await submit(ownerBrowser, `/dashboard/members/${owner.id}/role`, { role }), 409, 'last owner');
    }
    expectPage(await submit(ownerBrowser, `/dashboard/members/${owner.id}/remove`, {}), 409, 'last owner');
    // A role deletion never moves an owner: owners hold no custom role. Deleting the custom
    // role moves only its holder, and an admin may not move anyone to owner.
    expectPage(await submit(adminBrowser, `/dashboard/roles/${encodeURIComponent(everything)}/delete`, { confirm: 'delete', move_to: 'owner' }), 403, 'may not give owner');
    expectApiError(await api('DELETE', `/roles/${encodeURIComponent(everything)}?move_to=owner`, undefined, { fixture: org, bearer }), 403, 'forbidden');
    // Keeping the role the owner already has changes nothing either.
    expectRedirect(await submit(ownerBrowser, `/dashboard/members/${owner.id}/role`, { role: 'owner' }), '/dashboard/members');
    await expectUnchanged(before);
    expect(await membershipOf(org.organizationId, owner.id)).toEqual({ role: 'owner', role_id: null });
    expect((await db().selectFrom('grants').select('revoked_at').where('id', '=', ownerGrant).executeTakeFirstOrThrow()).revoked_at).toBeNull();

    // The positive control: with a second owner, the first may step down (so the 409 was the last-owner rule).
    expectRedirect(await submit(ownerBrowser, `/dashboard/members/${adminUser.id}/role`, { role: 'owner' }), '/dashboard/members');
    expectRedirect(await submit(ownerBrowser, `/dashboard/members/${owner.id}/role`, { role: 'admin' }), '/dashboard/members');
    expect(await membershipOf(org.organizationId, owner.id)).toEqual({ role: 'admin', role_id: null });
  });
});

// ---------------------------------------------------------------------------------------------
// A role deleted while it is being given

describe(`a role deleted while the API gives it on ${BACKEND}`, () => {
  it('PATCH /members, POST /members and POST /invitations racing DELETE /roles: each a 2xx or a 400, never a 5xx; nobody left with the deleted role', async () => {
    const statuses: string[] = [];
    for (let i = 0; i < 15; i++) {
      const name = await makeRole(['contacts.read'], orgA.organizationId, 'Racy');
      const target = await memberWith(orgA.organizationId, 'viewer', 'racy');
      const newcomer = await newUser('racynew');
      const [changed, added, invited, deleted] = await Promise.all([
        api('PATCH', `/members/${target.id}`, { role: name }),
        api('POST', '/members', { email: newcomer.email, role: name }),
        api('POST', '/invitations', { email: address('racy'), role: name }),
        api('DELETE', `/roles/${encodeURIComponent(name)}?move_to=viewer`),
      ]);
      statuses.push(`${changed.statusCode} ${added.statusCode} ${invited.statusCode} ${deleted.statusCode}`);
      expect(deleted.statusCode, deleted.body).toBe(204);
      expect([200, 400], changed.body).toContain(changed.statusCode);
      expect([201, 400], added.body).toContain(added.statusCode);
      expect([201, 400], invited.body).toContain(invited.statusCode);
      // Whoever got the role before the deletion was moved to viewer with the others.
      expect(await membershipOf(orgA.organizationId, target.id)).toEqual({ role: 'viewer', role_id: null });
    }
    expect(statuses.filter((s) => /\b5\d\d\b/.test(s))).toEqual([]);
  });
});
