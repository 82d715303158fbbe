/**
 * Table-driven: every API route, the management API's included, against every single-scope
 * token (the scope matrix), and every route with another organization's path and ids
 * (isolation: 403 for B's path, 404 for B's ids under A's path, exactly like missing ids).
 */
import type { FastifyInstance } from 'fastify';
import { sql } from 'kysely';
import { sha256Hex } from '../../src/lib/crypto.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember } from '../../src/accounts/organizations.js';
import { createRole } from '../../src/accounts/roles.js';
import { createApplication } from '../../src/oauth/models/applications.js';
import { createGrant } from '../../src/oauth/models/grants.js';
import { KNOWN_SCOPES } from '../../src/oauth/helpers/scopes.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { buildTestApp, RESOURCE_METADATA, TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { clientCredentialsToken, createOrgFixture, type OrgFixture, revokeToken } from '../helpers/oauth.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
let second: FastifyInstance;
let a: OrgFixture;
let b: OrgFixture;
const tokens: Record<string, string> = {};
let full: string;
let bIds: Ids;

/** The ids a route's path or body may name: fresh rows of one organization for every call. */
interface Ids {
  contact: number;
  task: number;
  clientId: string;
  userId: number;
  email: string;
  grant: number;
  invitation: number;
  /** A custom role's name. */
  role: string;
  /** Roles without permissions, which any members.write token may give (an application gives only what its token holds). */
  give: string;
  giveOther: string;
}

const token = (fixture: OrgFixture, scope?: string) => clientCredentialsToken(app, fixture, scope);

beforeAll(async () => {
  t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  app = await buildTestApp(t.handle.db, { listen: t.handle.listen });
  second = await buildTestApp(t.handle.db, { listen: t.handle.listen });
  // Private applications that may hold every scope, the management ones included.
  a = await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') });
  b = await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') });
  for (const scope of KNOWN_SCOPES) tokens[scope] = await token(a, scope);
  full = await token(a);
  bIds = await freshIds(b);
  bBefore = await stateOfB();
});

/** Everything of B's that a route could change, to compare after the isolation tests. */
async function stateOfB() {
  const db = t.handle.db;
  const org = b.organizationId;
  return {
    contact: await db.selectFrom('contacts').selectAll().where('id', '=', bIds.contact).executeTakeFirst(),
    task: await db.selectFrom('tasks').selectAll().where('id', '=', bIds.task).executeTakeFirst(),
    applications: await db.selectFrom('applications').selectAll().where('organization_id', '=', org).orderBy('id').execute(),
    members: await db.selectFrom('memberships').selectAll().where('organization_id', '=', org).orderBy('user_id').execute(),
    grants: await db.selectFrom('grants').selectAll().where('organization_id', '=', org).orderBy('id').execute(),
    audit: await db.selectFrom('audit_events').selectAll().where('organization_id', '=', org).orderBy('id').execute(),
    invitations: await db.selectFrom('invitations').selectAll().where('organization_id', '=', org).orderBy('id').execute(),
    roles: await db.selectFrom('roles').selectAll().where('organization_id', '=', org).orderBy('id').execute(),
  };
}
let bBefore: Awaited<ReturnType<typeof stateOfB>>;
afterAll(async () => {
  await app.close();
  await second.close();
  await t.close();
});

let n = 0;

/** A contact, a task, an application, a member (with an unused twin to add) and a user's grant of `org`, made directly in the database. */
async function freshIds(org: OrgFixture): Promise<Ids> {
  const db = t.handle.db;
  const i = ++n;
  const contact = await db.insertInto('contacts').values({ organization_id: org.organizationId, name: `Contact ${i}` }).returning('id').executeTakeFirstOrThrow();
  const task = await db.insertInto('tasks').values({ organization_id: org.organizationId, title: `Task ${i}` }).returning('id').executeTakeFirstOrThrow();
  const application = await createApplication(db, { organizationId: org.organizationId, type: 'public', name: `App ${i}`, redirectUris: ['https://m.example.com/cb'] });
  // What the application routes act on: within an applications.write token's scopes (an
  // application changes only applications whose scopes its token holds).
  const target = await createApplication(db, { organizationId: org.organizationId, type: 'private', name: `Target ${i}`, scopes: ['applications.write'] });
  const user = (tag: string) =>
    db
      .insertInto('users')
      .values({ email: `${tag}${i}-${process.pid}@example.com`, password_hash: '$argon2id$matrix', email_verified_at: new Date() })
      .returning(['id', 'email'])
      .executeTakeFirstOrThrow();
  const member = await user('member');
  const outsider = await user('outsider');
  const shared = async (name: string) =>
    (await db.selectFrom('roles').select(['id', 'name']).where('organization_id', '=', org.organizationId).where('name', '=', name).executeTakeFirst()) ??
    (await createRole(db, org.organizationId, { name, permissions: [] }));
  const give = await shared('Shared none');
  const giveOther = await shared('Shared other');
  await addMember(db, { organizationId: org.organizationId, userId: member.id, role: { kind: 'custom', id: give.id, name: give.name, permissions: [] } });
  const appRow = await db.selectFrom('applications').select('id').where('client_id', '=', application.client_id).executeTakeFirstOrThrow();
  const grant = await createGrant(db, { organizationId: org.organizationId, applicationId: appRow.id, userId: member.id, scopes: ['contacts.read'] });
  const invitation = await db
    .insertInto('invitations')
    .values({ organization_id: org.organizationId, email: `invited${i}-${process.pid}@example.com`, role: 'custom', role_id: give.id, token_hash: sha256Hex(`invitation ${i} ${process.pid}`), expires_at: new Date(Date.now() + 3600_000),
      // Sent long enough ago not to count toward the organization's hourly cap on invitations.
      sent_at: new Date(Date.now() - 2 * 3600_000) })
    .returning('id')
    .executeTakeFirstOrThrow();
  // Earlier tests' roles go first: an organization holds at most 100.
  await db.deleteFrom('roles').where('organization_id', '=', org.organizationId).where('name', 'like', 'M%').execute();
  const role = await createRole(db, org.organizationId, { name: `Matrix ${i}`, permissions: [] });
  return { contact: contact.id, task: task.id, clientId: target.client_id, userId: member.id, email: outsider.email, grant: grant!.id, invitation: invitation.id, role: role.name, give: give.name, giveOther: giveOther.name };
}

type Method = 'GET' | 'POST' | 'PATCH' | 'DELETE';
interface Route {
  method: Method;
  path: (ids: Ids) => string;
  scope: string | null;
  /** Whether the path names a row (then another organization's row must be a 404). */
  names?: true;
  body?: (ids: Ids) => object;
  ok?: number;
}
let made = 0;
const ROUTES: Route[] = [
  { method: 'GET', path: () => '', scope: null },
  { method: 'GET', path: () => '/contacts', scope: 'contacts.read' },
  { method: 'POST', path: () => '/contacts', scope: 'contacts.write', body: () => ({ name: 'New' }) },
  { method: 'GET', path: (i) => `/contacts/${i.contact}`, scope: 'contacts.read', names: true },
  { method: 'PATCH', path: (i) => `/contacts/${i.contact}`, scope: 'contacts.write', names: true, body: () => ({ name: 'Changed' }) },
  { method: 'DELETE', path: (i) => `/contacts/${i.contact}`, scope: 'contacts.write', names: true },
  { method: 'GET', path: () => '/tasks', scope: 'tasks.read' },
  { method: 'POST', path: () => '/tasks', scope: 'tasks.write', body: () => ({ title: 'New' }) },
  { method: 'GET', path: (i) => `/tasks/${i.task}`, scope: 'tasks.read', names: true },
  { method: 'PATCH', path: (i) => `/tasks/${i.task}`, scope: 'tasks.write', names: true, body: () => ({ title: 'Changed' }) },
  { method: 'DELETE', path: (i) => `/tasks/${i.task}`, scope: 'tasks.write', names: true },
  // The management API.
  { method: 'GET', path: () => '/applications', scope: 'applications.read' },
  { method: 'POST', path: () => '/applications', scope: 'applications.write', body: () => ({ type: 'private', name: 'Made by the API', scopes: ['applications.write'] }) },
  { method: 'GET', path: (i) => `/applications/${i.clientId}`, scope: 'applications.read', names: true },
  { method: 'PATCH', path: (i) => `/applications/${i.clientId}`, scope: 'applications.write', names: true, body: () => ({ name: 'Renamed' }) },
  { method: 'DELETE', path: (i) => `/applications/${i.clientId}`, scope: 'applications.write', names: true },
  { method: 'POST', path: (i) => `/applications/${i.clientId}/secret`, scope: 'applications.write', names: true, ok: 200 },
  { method: 'GET', path: () => '/members', scope: 'members.read' },
  { method: 'POST', path: () => '/members', scope: 'members.write', body: (i) => ({ email: i.email, role: i.give }) },
  { method: 'GET', path: (i) => `/members/${i.userId}`, scope: 'members.read', names: true },
  { method: 'PATCH', path: (i) => `/members/${i.userId}`, scope: 'members.write', names: true, body: (i) => ({ role: i.giveOther }) },
  { method: 'DELETE', path: (i) => `/members/${i.userId}`, scope: 'members.write', names: true },
  { method: 'GET', path: () => '/invitations', scope: 'members.read' },
  { method: 'POST', path: () => '/invitations', scope: 'members.write', body: (i) => ({ email: i.email, role: i.give }) },
  { method: 'GET', path: (i) => `/invitations/${i.invitation}`, scope: 'members.read', names: true },
  { method: 'POST', path: (i) => `/invitations/${i.invitation}/resend`, scope: 'members.write', names: true, ok: 200 },
  { method: 'DELETE', path: (i) => `/invitations/${i.invitation}`, scope: 'members.write', names: true },
  { method: 'GET', path: () => '/roles', scope: 'members.read' },
  { method: 'POST', path: () => '/roles', scope: 'members.write', body: () => ({ name: `Made ${++made}`, permissions: [] }) },
  { method: 'GET', path: (i) => `/roles/${encodeURIComponent(i.role)}`, scope: 'members.read', names: true },
  { method: 'PATCH', path: (i) => `/roles/${encodeURIComponent(i.role)}`, scope: 'members.write', names: true, body: () => ({ description: 'Changed' }) },
  { method: 'DELETE', path: (i) => `/roles/${encodeURIComponent(i.role)}`, scope: 'members.write', names: true },
  { method: 'GET', path: () => '/grants', scope: 'grants.read' },
  { method: 'GET', path: (i) => `/grants/${i.grant}`, scope: 'grants.read', names: true },
  { method: 'DELETE', path: (i) => `/grants/${i.grant}`, scope: 'grants.write', names: true },
  { method: 'GET', path: () => '/audit-events', scope: 'audit.read' },
];

const MISSING: Ids = {
  contact: 987_654_321,
  task: 987_654_321,
  clientId: 'f'.repeat(32),
  userId: 987_654_321,
  email: 'nobody@example.com',
  grant: 987_654_321,
  invitation: 987_654_321,
  role: 'No such role',
  // The roles to give exist in every organization: only the missing member or invitation differs.
  give: 'Shared none',
  giveOther: 'Shared other',
};

const call = (target: FastifyInstance, route: Route, org: number, ids: Ids, bearer: string) =>
  target.inject({
    method: route.method,
    url: `/api/v1/${org}${route.path(ids)}`,
    headers: { authorization: `Bearer ${bearer}` },
    ...(route.body ? { payload: route.body(ids) } : {}),
  });

const success = (route: Route) => route.ok ?? (route.method === 'POST' ? 201 : route.method === 'DELETE' ? 204 : 200);
const label = (route: Route) => `${route.method} ${route.path({ contact: 0, task: 0, clientId: ':client_id', userId: 0, email: '', grant: 0, invitation: 0, role: ':role', give: '', giveOther: '' }) || '/'}`;

describe(`the scope matrix on ${BACKEND} (BR-2)`, () => {
  it.each(ROUTES.map((r) => [label(r), r] as const))('%s', async (_name, route) => {
    for (const scope of KNOWN_SCOPES) {
      const res = await call(app, route, a.organizationId, await freshIds(a), tokens[scope]!);
      const allowed = route.scope === null || route.scope === scope;
      expect({ scope, status: res.statusCode, body: allowed ? undefined : res.json() }).toEqual({
        scope,
        status: allowed ? success(route) : 403,
        body: allowed ? undefined : { error: 'insufficient_scope', error_description: expect.any(String) },
      });
      if (!allowed) expect(res.headers['www-authenticate']).toBe(`Bearer realm="orgauth", ${RESOURCE_METADATA}, error="insufficient_scope", scope="${route.scope}"`);
    }
  });
});

describe(`organization isolation on ${BACKEND} (BR-3, BR-6)`, () => {
  it.each(ROUTES.map((r) => [label(r), r] as const))('%s', async (_name, route) => {
    // B's path with A's token: 403 organization_mismatch, whatever the route.
    const mismatch = await call(app, route, b.organizationId, bIds, full);
    expect(mismatch.statusCode).toBe(403);
    expect(mismatch.json().error).toBe('organization_mismatch');
    // A's path with B's ids: 404 exactly like a missing id; B's rows untouched.
    if (route.names) {
      const foreign = await call(app, route, a.organizationId, bIds, full);
      const missing = await call(app, route, a.organizationId, MISSING, full);
      expect(foreign.statusCode).toBe(404);
      expect(foreign.json()).toEqual(missing.json());
    }
  });

  it("leaves the other organization's rows as they were", async () => {
    expect(await stateOfB()).toEqual(bBefore);
  });
});

describe(`revocation across instances on ${BACKEND} (BR-5)`, () => {
  it('a token revoked on one instance is refused by the other within a second', async () => {
    const doomed = await token(a);
    const route = ROUTES[0]!;
    expect((await call(second, route, a.organizationId, bIds, doomed)).statusCode).toBe(200);
    expect(await revokeToken(app, a, doomed)).toBe(200);
    expect((await call(app, route, a.organizationId, bIds, doomed)).statusCode).toBe(401);
    await expect.poll(async () => (await call(second, route, a.organizationId, bIds, doomed)).statusCode, { timeout: 1000, interval: 20 }).toBe(401);
  });
});

describe(`keyset pagination on ${BACKEND}`, () => {
  it('reads a page straight off the (organization_id, id) index, wherever the page is', async () => {
    const plan = await sql<Record<string, unknown>>`explain (format json)
      select * from contacts where organization_id = ${a.organizationId} and id > ${500_000} order by id limit 51`.execute(t.handle.db);
    const text = JSON.stringify(plan.rows);
    // Force the index path the way a large table would choose it, then check its shape.
    expect(text).toMatch(/"Node Type":"Limit"/);
    const forced = await t.handle.db.transaction().execute(async (trx) => {
      await sql`set local enable_seqscan = off`.execute(trx);
      await sql`set local enable_bitmapscan = off`.execute(trx);
      return sql<Record<string, unknown>>`explain (format json)
        select * from contacts where organization_id = ${a.organizationId} and id > ${500_000} order by id limit 51`.execute(trx);
    });
    const forcedText = JSON.stringify(forced.rows);
    expect(forcedText).toContain('"Index Name":"contacts_organization_id_id_key"');
    expect(forcedText).not.toContain('"Node Type":"Sort"');
  });
});
