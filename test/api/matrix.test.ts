/**
 * Table-driven: every API route against every single-scope token (the scope matrix), and every
 * route with another organization's ids (isolation).
 */
import type { FastifyInstance } from 'fastify';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { KNOWN_SCOPES } from '../../src/oauth/scopes.js';
import { ensureSigningKey } from '../../src/oauth/keys.js';
import { buildTestApp, TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { clientCredentialsToken, createOrgFixture, type OrgFixture, revokeToken } from '../helpers/oauth.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
let second: FastifyInstance;
let a: OrgFixture;
let b: OrgFixture;
const tokens: Record<string, string> = {};
let full: string;
let bIds: { contact: number; task: number };

const token = (fixture: OrgFixture, scope?: string) => clientCredentialsToken(app, fixture, scope);

beforeAll(async () => {
  t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  app = await buildTestApp(t.handle.db, { listen: t.handle.listen });
  second = await buildTestApp(t.handle.db, { listen: t.handle.listen });
  a = await createOrgFixture(t.handle.db);
  b = await createOrgFixture(t.handle.db);
  for (const scope of KNOWN_SCOPES) tokens[scope] = await token(a, scope);
  full = await token(a);
  const contact = await t.handle.db.insertInto('contacts').values({ organization_id: b.organizationId, name: 'B contact' }).returning('id').executeTakeFirstOrThrow();
  const task = await t.handle.db.insertInto('tasks').values({ organization_id: b.organizationId, title: 'B task' }).returning('id').executeTakeFirstOrThrow();
  bIds = { contact: contact.id, task: task.id };
});
afterAll(async () => {
  await app.close();
  await second.close();
  await t.close();
});

type Method = 'GET' | 'POST' | 'PATCH' | 'DELETE';
const ROUTES: { method: Method; path: (ids: { contact: number; task: number }) => string; scope: string | null; body?: object }[] = [
  { method: 'GET', path: () => '', scope: null },
  { method: 'GET', path: () => '/contacts', scope: 'contacts.read' },
  { method: 'POST', path: () => '/contacts', scope: 'contacts.write', body: { name: 'New' } },
  { method: 'GET', path: (i) => `/contacts/${i.contact}`, scope: 'contacts.read' },
  { method: 'PATCH', path: (i) => `/contacts/${i.contact}`, scope: 'contacts.write', body: { name: 'Changed' } },
  { method: 'DELETE', path: (i) => `/contacts/${i.contact}`, scope: 'contacts.write' },
  { method: 'GET', path: () => '/tasks', scope: 'tasks.read' },
  { method: 'POST', path: () => '/tasks', scope: 'tasks.write', body: { title: 'New' } },
  { method: 'GET', path: (i) => `/tasks/${i.task}`, scope: 'tasks.read' },
  { method: 'PATCH', path: (i) => `/tasks/${i.task}`, scope: 'tasks.write', body: { title: 'Changed' } },
  { method: 'DELETE', path: (i) => `/tasks/${i.task}`, scope: 'tasks.write' },
];

async function ownIds(): Promise<{ contact: number; task: number }> {
  const contact = await t.handle.db.insertInto('contacts').values({ organization_id: a.organizationId, name: 'A contact' }).returning('id').executeTakeFirstOrThrow();
  const task = await t.handle.db.insertInto('tasks').values({ organization_id: a.organizationId, title: 'A task' }).returning('id').executeTakeFirstOrThrow();
  return { contact: contact.id, task: task.id };
}

const call = (target: FastifyInstance, route: (typeof ROUTES)[number], org: number, ids: { contact: number; task: number }, bearer: string) =>
  target.inject({ method: route.method, url: `/api/v1/${org}${route.path(ids)}`, headers: { authorization: `Bearer ${bearer}` }, ...(route.body ? { payload: route.body } : {}) });

describe(`the scope matrix on ${BACKEND} (BR-2)`, () => {
  it.each(ROUTES.map((r) => [`${r.method} ${r.path({ contact: 0, task: 0 }) || '/'}`, r] as const))('%s', async (_name, route) => {
    for (const scope of KNOWN_SCOPES) {
      const res = await call(app, route, a.organizationId, await ownIds(), tokens[scope]!);
      const allowed = route.scope === null || route.scope === scope;
      expect({ scope, status: res.statusCode }).toEqual({ scope, status: allowed ? (route.method === 'POST' ? 201 : route.method === 'DELETE' ? 204 : 200) : 403 });
      if (!allowed) expect(res.headers['www-authenticate']).toBe(`Bearer realm="orgauth", error="insufficient_scope", scope="${route.scope}"`);
    }
  });
});

describe(`organization isolation on ${BACKEND} (BR-3, BR-6)`, () => {
  it.each(ROUTES.map((r) => [`${r.method} ${r.path({ contact: 0, task: 0 }) || '/'}`, r] as const))('%s', async (_name, route) => {
    // B's path with A's token: 403 organization_mismatch, whatever the route.
    const mismatch = await call(app, route, b.organizationId, bIds, full);
    expect(mismatch.statusCode).toBe(403);
    expect(mismatch.json().error).toBe('organization_mismatch');
    // A's path with B's ids: 404 exactly like a missing id; B's rows untouched.
    if (route.path(bIds).match(/\/\d+$/)) {
      const foreign = await call(app, route, a.organizationId, bIds, full);
      const missing = await call(app, route, a.organizationId, { contact: 987_654_321, task: 987_654_321 }, full);
      expect(foreign.statusCode).toBe(404);
      expect(foreign.json()).toEqual(missing.json());
    }
  });

  it("leaves the other organization's rows as they were", async () => {
    const contact = await t.handle.db.selectFrom('contacts').select('name').where('id', '=', bIds.contact).executeTakeFirst();
    const task = await t.handle.db.selectFrom('tasks').select('title').where('id', '=', bIds.task).executeTakeFirst();
    expect({ contact, task }).toEqual({ contact: { name: 'B contact' }, task: { title: 'B task' } });
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
