import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { DPOP_SIGNING_ALGS } from '../../src/oauth/models/dpop-proofs.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember, removeMember } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { createAuthorizationCode } from '../../src/oauth/models/authorization-codes.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { buildTestApp, RESOURCE_METADATA, TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { basic, clientCredentialsToken, createOrgFixture, form, type OrgFixture, revokeToken } from '../helpers/oauth.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
let a: OrgFixture;
let b: OrgFixture;
let tokenA: string;
let tokenB: string;

const clientToken = (fixture: OrgFixture, scope?: string) => clientCredentialsToken(app, fixture, scope);

beforeAll(async () => {
  t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  app = await buildTestApp(t.handle.db, { listen: t.handle.listen });
  a = await createOrgFixture(t.handle.db);
  b = await createOrgFixture(t.handle.db);
  tokenA = await clientToken(a);
  tokenB = await clientToken(b);
});
afterAll(async () => {
  await app.close();
  await t.close();
});

function api(method: 'GET' | 'POST' | 'PATCH' | 'DELETE', url: string, options: { token?: string | null; body?: unknown; headers?: Record<string, string> } = {}) {
  const token = options.token === undefined ? tokenA : options.token;
  return app.inject({
    method,
    url,
    headers: { ...(token ? { authorization: `Bearer ${token}` } : {}), ...options.headers },
    ...(options.body !== undefined ? { payload: options.body as Record<string, unknown> } : {}),
  });
}

const A = () => `/api/v1/${a.organizationId}`;
const B = () => `/api/v1/${b.organizationId}`;

function expectError(res: LightMyRequestResponse, status: number, error: string): void {
  expect({ status: res.statusCode, body: res.json() }).toMatchObject({ status, body: { error, error_description: expect.any(String) } });
}

describe(`the API hook on ${BACKEND}`, () => {
  it('serves the organization to any valid token for it', async () => {
    const res = await api('GET', A());
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ id: a.organizationId, name: a.organizationName, require_mfa: false, created_at: expect.any(String) });
    expect(res.headers['cache-control']).toBe('no-store');
  });

  it.each(['01', '-1', '1.0', '1e3', '%201', '+1', '9223372036854775808', '0', 'abc'])('answers 404 for the organization spelled %s', async (spelling) => {
    expectError(await api('GET', `/api/v1/${spelling}/contacts`), 404, 'not_found');
  });

  it('answers 401 with a Bearer challenge without a token, and ignores one in the query (BR-1, BR-4)', async () => {
    const none = await api('GET', `${A()}/contacts`, { token: null });
    expectError(none, 401, 'invalid_request');
    // Both schemes offered (RFC 9449 §7.1): Bearer with the resource metadata, DPoP with its algorithms.
    expect(none.headers['www-authenticate']).toBe(`Bearer realm="orgauth", ${RESOURCE_METADATA}, DPoP algs="${DPOP_SIGNING_ALGS.join(' ')}"`);
    const query = await api('GET', `${A()}/contacts?access_token=${tokenA}`, { token: null });
    expect(query.statusCode).toBe(401);
    const basicAuth = await api('GET', `${A()}/contacts`, { token: null, headers: { authorization: 'Basic YTpi' } });
    expect(basicAuth.statusCode).toBe(401);
  });

  it('accepts the Bearer scheme in any case (BR-4)', async () => {
    expect((await api('GET', A(), { token: null, headers: { authorization: `bEaReR ${tokenA}` } })).statusCode).toBe(200);
  });

  it('answers 401 invalid_token for a bad, tampered or revoked token (BR-1, BR-5)', async () => {
    const bad = await api('GET', A(), { token: 'not-a-jwt' });
    expectError(bad, 401, 'invalid_token');
    expect(bad.headers['www-authenticate']).toBe(`Bearer realm="orgauth", ${RESOURCE_METADATA}, error="invalid_token"`);
    const [h, p, s] = tokenA.split('.');
    expect((await api('GET', A(), { token: `${h}.${p}.${s!.slice(0, -4)}AAAA` })).statusCode).toBe(401);

    const doomed = await clientToken(a);
    expect((await api('GET', A(), { token: doomed })).statusCode).toBe(200);
    expect(await revokeToken(app, a, doomed)).toBe(200);
    expectError(await api('GET', A(), { token: doomed }), 401, 'invalid_token');
  });

  it("answers 403 organization_mismatch for another organization's path (BR-3)", async () => {
    expectError(await api('GET', `${B()}/contacts`), 403, 'organization_mismatch');
    expectError(await api('GET', B()), 403, 'organization_mismatch');
  });

  it('answers 403 insufficient_scope with the scope it needs (BR-2)', async () => {
    const readOnly = await clientToken(a, 'contacts.read');
    expect((await api('GET', `${A()}/contacts`, { token: readOnly })).statusCode).toBe(200);
    const res = await api('POST', `${A()}/contacts`, { token: readOnly, body: { name: 'X' } });
    expectError(res, 403, 'insufficient_scope');
    expect(res.headers['www-authenticate']).toBe(`Bearer realm="orgauth", ${RESOURCE_METADATA}, error="insufficient_scope", scope="contacts.write"`);
    expectError(await api('GET', `${A()}/tasks`, { token: readOnly }), 403, 'insufficient_scope');
  });

  it('answers 406 when JSON is not acceptable, 415 for non-JSON bodies, 413 for large ones', async () => {
    expectError(await api('GET', `${A()}/contacts`, { headers: { accept: 'text/html' } }), 406, 'not_acceptable');
    expect((await api('GET', `${A()}/contacts`, { headers: { accept: 'text/html, application/json;q=0.5' } })).statusCode).toBe(200);
    expect((await api('GET', `${A()}/contacts`, { headers: { accept: '*/*' } })).statusCode).toBe(200);
    expectError(await api('GET', `${A()}/contacts`, { headers: { accept: 'application/json;q=0' } }), 406, 'not_acceptable');
    const formBody = await api('POST', `${A()}/contacts`, { body: 'name=X', headers: { 'content-type': 'application/x-www-form-urlencoded' } });
    expectError(formBody, 415, 'unsupported_media_type');
    const big = await api('POST', `${A()}/contacts`, { body: JSON.stringify({ name: 'x', notes: 'n'.repeat(70_000) }), headers: { 'content-type': 'application/json' } });
    expectError(big, 413, 'request_too_large');
  });

  it("refuses a user's token once the user is removed from the organization", async () => {
    const user = await createUser(t.handle.db, { email: `member-${Date.now()}@example.com`, password: 'member-password-1' });
    await addMember(t.handle.db, { organizationId: a.organizationId, userId: user.id, role: 'member' });
    const applicationId = (await t.handle.db.selectFrom('applications').select('id').where('client_id', '=', a.publicApp.client_id).executeTakeFirstOrThrow()).id;
    const code = await createAuthorizationCode(t.handle.db, {
      organizationId: a.organizationId, applicationId, userId: user.id, redirectUri: 'https://client.example.com/cb', scopes: ['contacts.read'], codeChallenge: null, ttlSeconds: 60,
    });
    const tokens = (
      await app.inject({
        method: 'POST',
        url: '/oauth/token',
        headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(a.publicApp.client_id, a.publicApp.client_secret) },
        payload: form({ grant_type: 'authorization_code', code, redirect_uri: 'https://client.example.com/cb' }),
      })
    ).json();
    expect((await api('GET', `${A()}/contacts`, { token: tokens.access_token })).statusCode).toBe(200);
    await removeMember(t.handle.db, { organizationId: a.organizationId, userId: user.id });
    await expect.poll(async () => (await api('GET', `${A()}/contacts`, { token: tokens.access_token })).statusCode, { timeout: 1000, interval: 20 }).toBe(401);
    await expect(removeMember(t.handle.db, { organizationId: a.organizationId, userId: a.ownerId })).rejects.toThrow(/last owner/);
  });
});

describe(`contacts on ${BACKEND}`, () => {
  it('are created (201 + Location), read, changed and deleted', async () => {
    const created = await api('POST', `${A()}/contacts`, { body: { name: 'Ada Lovelace', email: 'ada@example.com', company: 'Engines' } });
    expect(created.statusCode).toBe(201);
    const contact = created.json();
    expect(contact).toEqual({
      id: expect.any(Number), name: 'Ada Lovelace', email: 'ada@example.com', phone: null, company: 'Engines', notes: null,
      created_at: expect.any(String), updated_at: expect.any(String),
    });
    expect(created.headers.location).toBe(`${A()}/contacts/${contact.id}`);
    expect((await api('GET', `${A()}/contacts/${contact.id}`)).json()).toEqual(contact);
    const patched = await api('PATCH', `${A()}/contacts/${contact.id}`, { body: { phone: '+44 20 7946 0000', email: null } });
    expect(patched.json()).toMatchObject({ phone: '+44 20 7946 0000', email: null, name: 'Ada Lovelace' });
    const deleted = await api('DELETE', `${A()}/contacts/${contact.id}`);
    expect(deleted.statusCode).toBe(204);
    expectError(await api('GET', `${A()}/contacts/${contact.id}`), 404, 'not_found');
    const events = await t.handle.db.selectFrom('audit_events').select(['action', 'actor_client_id']).where('organization_id', '=', a.organizationId).where('action', '=', 'contact.deleted').execute();
    expect(events).toEqual([{ action: 'contact.deleted', actor_client_id: a.privateApp.client_id }]);
  });

  it("cannot be read or changed through another organization, even with the right ids (BR-6)", async () => {
    const bContact = (await api('POST', `${B()}/contacts`, { token: tokenB, body: { name: 'Bea' } })).json();
    const missing = await api('GET', `${A()}/contacts/99999999`);
    const foreign = await api('GET', `${A()}/contacts/${bContact.id}`);
    expect(foreign.statusCode).toBe(404);
    expect(foreign.json()).toEqual(missing.json());
    expectError(await api('PATCH', `${A()}/contacts/${bContact.id}`, { body: { name: 'Stolen' } }), 404, 'not_found');
    expectError(await api('DELETE', `${A()}/contacts/${bContact.id}`), 404, 'not_found');
    expect((await api('GET', `${B()}/contacts/${bContact.id}`, { token: tokenB })).json().name).toBe('Bea');
    const listA = (await api('GET', `${A()}/contacts?limit=100`)).json();
    expect(listA.data.map((c: { id: number }) => c.id)).not.toContain(bContact.id);
  });

  it('validate bodies with details, and refuse unknown fields', async () => {
    const res = await api('POST', `${A()}/contacts`, { body: { name: '', email: 'not-an-email', admin: true } });
    expect(res.statusCode).toBe(400);
    const body = res.json();
    expect(body.error).toBe('invalid_request');
    expect(body.details.map((d: { path: string }) => d.path).sort()).toEqual(['body', 'email', 'name']);
    expectError(await api('PATCH', `${A()}/contacts/1`, { body: {} }), 400, 'invalid_request');
    expectError(await api('POST', `${A()}/contacts`, { body: '{"name": "x", "__proto__": {"admin": true}}', headers: { 'content-type': 'application/json' } }), 400, 'invalid_request');
    expectError(await api('GET', `${A()}/contacts/01`), 404, 'not_found');
  });

  it('refuse NUL characters and dates PostgreSQL cannot store with 400, never 500', async () => {
    expectError(await api('POST', `${A()}/contacts`, { body: { name: 'a\u0000b' } }), 400, 'invalid_request');
    expectError(await api('GET', `${A()}/contacts?q=%00`), 400, 'invalid_request');
    expectError(await api('POST', `${A()}/tasks`, { body: { title: 't', due_on: '0000-01-01' } }), 400, 'invalid_request');
    expectError(await api('POST', `${A()}/tasks`, { body: { title: 't', description: '\u0000' } }), 400, 'invalid_request');
  });

  it('check the scope before the body: a token without it learns nothing about validation (BR-2)', async () => {
    const readOnly = await clientToken(a, 'contacts.read');
    expectError(await api('POST', `${A()}/contacts`, { token: readOnly, body: { bogus: true } }), 403, 'insufficient_scope');
  });

  it('search name, email and company case-insensitively, treating % and _ literally', async () => {
    for (const c of [{ name: 'Zed Search' }, { name: 'Other', email: 'ZED@example.com' }, { name: 'Third', company: 'zedcorp' }, { name: '100% real' }]) {
      await api('POST', `${A()}/contacts`, { body: c });
    }
    const found = (await api('GET', `${A()}/contacts?q=zEd&limit=100`)).json();
    expect(found.data.map((c: { name: string }) => c.name).sort()).toEqual(['Other', 'Third', 'Zed Search']);
    expect((await api('GET', `${A()}/contacts?q=${encodeURIComponent('100%')}&limit=100`)).json().data.map((c: { name: string }) => c.name)).toEqual(['100% real']);
    expect((await api('GET', `${A()}/contacts?q=${encodeURIComponent('0% r')}&limit=100`)).json().data.map((c: { name: string }) => c.name)).toEqual(['100% real']);
    expect((await api('GET', `${A()}/contacts?q=${encodeURIComponent('0_ r')}&limit=100`)).json().data).toEqual([]);
  });

  it('paginate with an opaque cursor: every page walked while rows are inserted, no duplicates, nothing skipped', async () => {
    const org = await createOrgFixture(t.handle.db);
    const token = await clientToken(org);
    const base = `/api/v1/${org.organizationId}/contacts`;
    await t.handle.db
      .insertInto('contacts')
      .values(Array.from({ length: 1000 }, (_, i) => ({ organization_id: org.organizationId, name: `Contact ${i}` })))
      .execute();
    const existing = new Set((await t.handle.db.selectFrom('contacts').select('id').where('organization_id', '=', org.organizationId).execute()).map((r) => r.id));
    const seen: number[] = [];
    let cursor: string | null = null;
    let pages = 0;
    do {
      const res: LightMyRequestResponse = await api('GET', `${base}?limit=37${cursor ? `&cursor=${cursor}` : ''}`, { token });
      expect(res.statusCode).toBe(200);
      const body = res.json() as { data: { id: number }[]; next_cursor: string | null };
      seen.push(...body.data.map((c) => c.id));
      cursor = body.next_cursor;
      // Meanwhile, others keep adding contacts.
      await api('POST', base, { token, body: { name: `Added during page ${pages}` } });
      pages++;
    } while (cursor && pages < 100);
    expect(new Set(seen).size).toBe(seen.length);
    for (const id of existing) expect(seen).toContain(id);
    expectError(await api('GET', `${base}?cursor=garbage`, { token }), 400, 'invalid_request');
    expectError(await api('GET', `${base}?limit=0`, { token }), 400, 'invalid_request');
    expectError(await api('GET', `${base}?limit=101`, { token }), 400, 'invalid_request');
    expectError(await api('GET', `${base}?limit=1&limit=2`, { token }), 400, 'invalid_request');
  });
});

describe(`tasks on ${BACKEND}`, () => {
  it('are created, filtered, completed and reopened', async () => {
    const contact = (await api('POST', `${A()}/contacts`, { body: { name: 'Task owner' } })).json();
    const created = await api('POST', `${A()}/tasks`, { body: { title: 'Call back', due_on: '2026-12-01', contact_id: contact.id } });
    expect(created.statusCode).toBe(201);
    const task = created.json();
    expect(task).toMatchObject({ title: 'Call back', status: 'open', due_on: '2026-12-01', contact_id: contact.id, completed_at: null });
    const done = (await api('PATCH', `${A()}/tasks/${task.id}`, { body: { status: 'done' } })).json();
    expect(done.completed_at).toEqual(expect.any(String));
    expect((await api('GET', `${A()}/tasks?status=done&limit=100`)).json().data.map((x: { id: number }) => x.id)).toContain(task.id);
    expect((await api('GET', `${A()}/tasks?contact_id=${contact.id}`)).json().data).toHaveLength(1);
    const reopened = (await api('PATCH', `${A()}/tasks/${task.id}`, { body: { status: 'open' } })).json();
    expect(reopened).toMatchObject({ status: 'open', completed_at: null });
    expect((await api('DELETE', `${A()}/tasks/${task.id}`)).statusCode).toBe(204);
  });

  it("refuse a contact of another organization", async () => {
    const bContact = (await api('POST', `${B()}/contacts`, { token: tokenB, body: { name: 'Not yours' } })).json();
    const res = await api('POST', `${A()}/tasks`, { body: { title: 'Sneaky', contact_id: bContact.id } });
    expect(res.statusCode).toBe(400);
    expect(res.json()).toEqual({
      error: 'invalid_request',
      error_description: 'contact_id does not name a contact of this organization',
      details: [{ path: 'contact_id', message: 'no such contact in this organization' }],
    });
    const own = (await api('POST', `${A()}/tasks`, { body: { title: 'Mine' } })).json();
    expect((await api('PATCH', `${A()}/tasks/${own.id}`, { body: { contact_id: bContact.id } })).statusCode).toBe(400);
  });
});
