/**
 * The management API's directories (issue 43): an organization's private application creates
 * SCIM directories with directory.write and reads them with directory.read; the token is shown
 * once (create, rotate-token), kept as its hash, and a rotation or a deletion stops the old one
 * at once; a directory never gives owner; another organization's directories are not found;
 * every change is audited.
 */
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { authenticateDirectory, MAX_DIRECTORIES } from '../../src/directory/directories.js';
import { sha256Hex } from '../../src/lib/crypto.js';
import { KNOWN_SCOPES } from '../../src/oauth/helpers/scopes.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { buildTestApp, TEST_SECRET_KEY, testConfig } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { clientCredentialsToken, createOrgFixture, type OrgFixture } from '../helpers/oauth.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
let a: OrgFixture;
let b: OrgFixture;
const tokens = new Map<OrgFixture, string>();

beforeAll(async () => {
  t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  app = await buildTestApp(t.handle.db);
  a = await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') });
  b = await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') });
  for (const fixture of [a, b]) tokens.set(fixture, await clientCredentialsToken(app, fixture));
});
afterAll(async () => {
  await app?.close();
  await t?.close();
});

function api(method: 'GET' | 'POST' | 'PATCH' | 'DELETE', path: string, options: { org?: OrgFixture; token?: string; body?: object } = {}) {
  const org = options.org ?? a;
  return app.inject({
    method,
    url: `/api/v1/${org.organizationId}${path}`,
    headers: { authorization: `Bearer ${options.token ?? tokens.get(org)}` },
    ...(options.body ? { payload: options.body } : {}),
  });
}

function expectError(res: LightMyRequestResponse, status: number, error: string) {
  expect({ status: res.statusCode, error: res.json().error }, res.body).toEqual({ status, error });
  return res.json() as { error: string; error_description: string };
}

const SHAPE = {
  id: expect.any(Number),
  name: expect.any(String),
  base_url: expect.stringMatching(/^http.*\/scim\/v2\/\d+$/),
  state: expect.stringMatching(/^(active|disabled)$/),
  default_role: expect.any(String),
  group_roles: expect.any(Array),
  token_created_at: expect.stringMatching(/Z$/),
  created_at: expect.stringMatching(/Z$/),
  updated_at: expect.stringMatching(/Z$/),
};

describe(`directories through the management API on ${BACKEND}`, () => {
  it('creates a directory whose token is shown once and kept as its hash, then lists, reads and changes it; every change audited', async () => {
    const created = await api('POST', '/directories', { body: { name: 'Okta', default_role: 'viewer', group_roles: [{ group: 'Engineering', role: 'member' }, { group: 'IT Admins', role: 'admin' }] } });
    expect(created.statusCode, created.body).toBe(201);
    const body = created.json();
    expect(body).toEqual({ ...SHAPE, name: 'Okta', state: 'active', default_role: 'viewer', group_roles: [{ group: 'Engineering', role: 'member' }, { group: 'IT Admins', role: 'admin' }], token: expect.stringMatching(/^scim_[A-Za-z0-9_-]{43}$/) });
    expect(created.headers.location).toBe(`/api/v1/${a.organizationId}/directories/${body.id}`);
    expect(body.base_url).toBe(`${testConfig().issuer}/scim/v2/${body.id}`);
    const row = await t.handle.db.selectFrom('directories').selectAll().where('id', '=', body.id).executeTakeFirstOrThrow();
    expect(row.token_hash).toBe(sha256Hex(body.token));
    expect(JSON.stringify(row)).not.toContain(body.token);

    const { token, ...shown } = body;
    expect((await api('GET', `/directories/${body.id}`)).json()).toEqual(shown);
    const list = (await api('GET', '/directories')).json();
    expect(list).toEqual({ data: [shown] });
    expect(JSON.stringify(list)).not.toContain(token);

    const changed = await api('PATCH', `/directories/${body.id}`, { body: { name: 'Okta (prod)', default_role: 'member', group_roles: [{ group: 'it admins', role: 'admin' }] } });
    expect(changed.json()).toEqual({ ...shown, name: 'Okta (prod)', default_role: 'member', group_roles: [{ group: 'it admins', role: 'admin' }], updated_at: expect.any(String) });
    // Fields not given are kept.
    expect((await api('PATCH', `/directories/${body.id}`, { body: { state: 'disabled' } })).json()).toMatchObject({ name: 'Okta (prod)', state: 'disabled', group_roles: [{ group: 'it admins', role: 'admin' }] });

    const audited = await t.handle.db.selectFrom('audit_events').select(['action', 'details']).where('organization_id', '=', a.organizationId).where('action', 'like', 'directory.%').orderBy('id').execute();
    expect(audited.map((e) => e.action)).toEqual(['directory.created', 'directory.updated', 'directory.updated']);
    expect(JSON.stringify(audited)).not.toContain(token);
    await api('DELETE', `/directories/${body.id}`);
  });

  it('rotates the token: the old one opens nothing from that moment, the new one opens only its own directory; a disabled or deleted directory opens for no token', async () => {
    const first = (await api('POST', '/directories', { body: { name: 'Entra ID' } })).json();
    const other = (await api('POST', '/directories', { body: { name: 'Other' } })).json();
    expect(first.default_role).toBe('member');
    expect(await authenticateDirectory(t.handle.db, first.id, first.token)).toMatchObject({ id: first.id, organization_id: a.organizationId });
    // A token opens its own directory only.
    expect(await authenticateDirectory(t.handle.db, other.id, first.token)).toBeUndefined();

    const rotated = await api('POST', `/directories/${first.id}/rotate-token`);
    expect(rotated.statusCode).toBe(200);
    const fresh = rotated.json().token;
    expect(fresh).toMatch(/^scim_/);
    expect(fresh).not.toBe(first.token);
    expect(await authenticateDirectory(t.handle.db, first.id, first.token)).toBeUndefined();
    expect(await authenticateDirectory(t.handle.db, first.id, fresh)).toMatchObject({ id: first.id });

    await api('PATCH', `/directories/${first.id}`, { body: { state: 'disabled' } });
    expect(await authenticateDirectory(t.handle.db, first.id, fresh)).toBeUndefined();
    await api('PATCH', `/directories/${first.id}`, { body: { state: 'active' } });
    expect(await authenticateDirectory(t.handle.db, first.id, fresh)).toMatchObject({ id: first.id });

    expect((await api('DELETE', `/directories/${first.id}`)).statusCode).toBe(204);
    expect(await authenticateDirectory(t.handle.db, first.id, fresh)).toBeUndefined();
    expectError(await api('GET', `/directories/${first.id}`), 404, 'not_found');
    const events = await t.handle.db.selectFrom('audit_events').select(['action', 'details']).where('organization_id', '=', a.organizationId).where('action', 'like', 'directory.%').orderBy('id').execute();
    const ofFirst = events.filter((e) => (typeof e.details === 'string' ? JSON.parse(e.details) : e.details).directory_id === first.id).map((e) => e.action);
    expect(ofFirst).toEqual(['directory.created', 'directory.token_rotated', 'directory.updated', 'directory.updated', 'directory.deleted']);
    await api('DELETE', `/directories/${other.id}`);
  });

  it('never gives owner, refuses bad input with a 400 naming the field, and maps a group once', async () => {
    const owner = expectError(await api('POST', '/directories', { body: { name: 'X', default_role: 'owner' } }), 400, 'invalid_request');
    expect(owner.error_description).toMatch(/default_role/);
    expectError(await api('POST', '/directories', { body: { name: 'X', group_roles: [{ group: 'Admins', role: 'owner' }] } }), 400, 'invalid_request');
    expectError(await api('POST', '/directories', { body: { name: '' } }), 400, 'invalid_request');
    expectError(await api('POST', '/directories', { body: { name: 'x'.repeat(201) } }), 400, 'invalid_request');
    expectError(await api('POST', '/directories', { body: { name: 'X', token: 'scim_chosen' } }), 400, 'invalid_request');
    const twice = expectError(await api('POST', '/directories', { body: { name: 'X', group_roles: [{ group: 'Sales', role: 'member' }, { group: 'SALES', role: 'admin' }] } }), 400, 'invalid_request');
    expect(twice.error_description).toMatch(/once/);
    expect((await api('GET', '/directories')).json()).toEqual({ data: [] });
  });

  it("keeps organizations apart: another organization's directory is not found, for reading, changing, rotating or deleting", async () => {
    const theirs = (await api('POST', '/directories', { org: b, body: { name: 'Theirs' } })).json();
    expectError(await api('GET', `/directories/${theirs.id}`), 404, 'not_found');
    expectError(await api('PATCH', `/directories/${theirs.id}`, { body: { state: 'disabled' } }), 404, 'not_found');
    expectError(await api('POST', `/directories/${theirs.id}/rotate-token`), 404, 'not_found');
    expectError(await api('DELETE', `/directories/${theirs.id}`), 404, 'not_found');
    expect((await api('GET', '/directories')).json()).toEqual({ data: [] });
    expect(await authenticateDirectory(t.handle.db, theirs.id, theirs.token)).toMatchObject({ id: theirs.id, organization_id: b.organizationId, state: 'active' });
    await api('DELETE', `/directories/${theirs.id}`, { org: b });
  });

  it(`needs directory.read to read and directory.write to change; at most ${MAX_DIRECTORIES} per organization`, async () => {
    const reader = await createOrgFixture(t.handle.db, { scopes: 'directory.read' });
    const readToken = await clientCredentialsToken(app, reader);
    expect((await api('GET', '/directories', { org: reader, token: readToken })).statusCode).toBe(200);
    expectError(await api('POST', '/directories', { org: reader, token: readToken, body: { name: 'X' } }), 403, 'insufficient_scope');
    const none = await createOrgFixture(t.handle.db, { scopes: 'contacts.read' });
    expectError(await api('GET', '/directories', { org: none, token: await clientCredentialsToken(app, none) }), 403, 'insufficient_scope');

    for (let i = 0; i < MAX_DIRECTORIES; i++) expect((await api('POST', '/directories', { body: { name: `D${i}` } })).statusCode).toBe(201);
    expectError(await api('POST', '/directories', { body: { name: 'one too many' } }), 409, 'conflict');
    expect((await api('GET', '/directories')).json().data).toHaveLength(MAX_DIRECTORIES);
  });
});
