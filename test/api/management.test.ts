/**
 * The management API (issue 12): an organization's private application administers it through
 * /api/v1/:organization_id — applications, members, connected apps, the audit log — with the
 * dashboard's rules, and the effects seen on a second instance within a second.
 */
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember } from '../../src/accounts/organizations.js';
import { createRole } from '../../src/accounts/roles.js';
import { createUser } from '../../src/accounts/users.js';
import { createApplication } from '../../src/oauth/models/applications.js';
import { createAuthorizationCode } from '../../src/oauth/models/authorization-codes.js';
import { createGrant } from '../../src/oauth/models/grants.js';
import { KNOWN_SCOPES, MANAGEMENT_SCOPES } from '../../src/oauth/helpers/scopes.js';
import { Browser } from '../accounts/browser.js';
import { signAccessToken } from '../../src/oauth/models/access-tokens.js';
import { apiResource } from '../../src/oauth/models/resources.js';
import { KeyStore } from '../../src/oauth/models/key-store.js';
import { testConfig } from '../helpers/app.js';
import { finishJobs } from '../helpers/jobs.js';
import { BACKEND } from '../helpers/db.js';
import { type InstancePair, startInstancePair } from '../helpers/instance-pair.js';
import { basic, clientCredentialsToken, createOrgFixture, form, type OrgFixture } from '../helpers/oauth.js';

const REDIRECT = 'https://made-by-api.example.com/cb';
const PASSWORD = 'management-password-1';

let pair: InstancePair;
let t: InstancePair['t'];
let app: FastifyInstance;
let second: FastifyInstance;
let org: OrgFixture;
let admin: string;

beforeAll(async () => {
  pair = await startInstancePair();
  ({ t, app, second } = pair);
  org = await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') });
  admin = await clientCredentialsToken(app, org);
});
afterAll(() => pair.close());

const base = (fixture: OrgFixture = org) => `/api/v1/${fixture.organizationId}`;

function api(method: 'GET' | 'POST' | 'PATCH' | 'DELETE', path: string, options: { token?: string; body?: object; target?: FastifyInstance } = {}) {
  return (options.target ?? app).inject({
    method,
    url: `${base()}${path}`,
    headers: { authorization: `Bearer ${options.token ?? admin}` },
    ...(options.body ? { payload: options.body } : {}),
  });
}

function expectError(res: LightMyRequestResponse, status: number, error: string): Record<string, unknown> {
  expect({ status: res.statusCode, body: res.json() }).toMatchObject({ status, body: { error, error_description: expect.any(String) } });
  return res.json();
}

function tokenRequest(clientId: string, secret: string, fields: Record<string, string>) {
  return app.inject({
    method: 'POST',
    url: '/oauth/token',
    headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(clientId, secret) },
    payload: form(fields),
  });
}

/** A user's tokens for a public application, through a code redeemed at the token endpoint. */
async function userTokens(clientId: string, secret: string, userId: number, scopes: string[]): Promise<{ access_token: string; refresh_token: string }> {
  const application = await t.handle.db.selectFrom('applications').select(['id', 'redirect_uris']).where('client_id', '=', clientId).executeTakeFirstOrThrow();
  const code = await createAuthorizationCode(t.handle.db, {
    organizationId: org.organizationId, applicationId: application.id, userId, redirectUri: application.redirect_uris[0]!, scopes, codeChallenge: null, ttlSeconds: 60,
  });
  const res = await tokenRequest(clientId, secret, { grant_type: 'authorization_code', code, redirect_uri: application.redirect_uris[0]! });
  expect(res.statusCode, res.body).toBe(200);
  return res.json();
}

const contactsWith = (token: string, target: FastifyInstance) =>
  target.inject({ method: 'GET', url: `${base()}/contacts`, headers: { authorization: `Bearer ${token}` } }).then((r) => r.statusCode);

async function auditActions(): Promise<{ action: string; client_id: string | null; details: Record<string, unknown> }[]> {
  const res = await api('GET', '/audit-events?limit=100', { token: await clientCredentialsToken(app, org, 'audit.read') });
  expect(res.statusCode).toBe(200);
  return res.json().data.map((e: { action: string; actor: { client_id: string | null }; details: Record<string, unknown> }) => ({
    action: e.action,
    client_id: e.actor.client_id,
    details: e.details,
  }));
}

/** A new application's high-assurance settings (issue 28): a secret, no keys, bearer tokens, no PAR, RS256 ID tokens. */
const DEFAULT_ASSURANCE = {
  token_endpoint_auth_method: 'client_secret_basic', jwks: null, jwks_uri: null, dpop_bound_access_tokens: false,
  require_pushed_authorization_requests: false, id_token_signed_response_alg: 'RS256', fapi2: false,
};

describe(`the management API on ${BACKEND}: an integration administers applications`, () => {
  it('creates a public application, rotates its secret, disables it (401 on both instances within a second), and the audit log shows it all', async () => {
    // Create: 201, Location, the secret in this response only.
    const created = await api('POST', '/applications', { body: { type: 'public', name: 'Made by API', redirect_uris: [REDIRECT], scopes: ['contacts.read'] } });
    expect(created.statusCode, created.body).toBe(201);
    const made = created.json();
    expect(made).toEqual({
      client_id: expect.stringMatching(/^[0-9a-f]{32}$/), client_secret: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/), type: 'public', name: 'Made by API',
      redirect_uris: [REDIRECT], post_logout_redirect_uris: [], scopes: ['contacts.read'], require_pkce: false, disabled: false,
      created_at: expect.any(String), updated_at: expect.any(String), secret_rotated_at: null,
      ...DEFAULT_ASSURANCE,
    });
    expect(created.headers.location).toBe(`${base()}/applications/${made.client_id}`);
    const shown = await api('GET', `/applications/${made.client_id}`);
    expect(shown.json()).toEqual({ ...made, client_secret: undefined });
    expect(shown.body).not.toContain(made.client_secret);

    // Rotate: the new secret works, the old one is invalid_client at once.
    const rotated = await api('POST', `/applications/${made.client_id}/secret`);
    expect(rotated.statusCode).toBe(200);
    const { client_secret: newSecret } = rotated.json();
    expect(rotated.json()).toEqual({ client_id: made.client_id, client_secret: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/) });
    const old = await tokenRequest(made.client_id, made.client_secret, { grant_type: 'refresh_token', refresh_token: 'x'.repeat(43) });
    expectError(old, 401, 'invalid_client');
    const tokens = await userTokens(made.client_id, newSecret, org.ownerId, ['contacts.read']);

    // Both instances accept its token; disabling makes both refuse it within a second.
    expect(await contactsWith(tokens.access_token, app)).toBe(200);
    expect(await contactsWith(tokens.access_token, second)).toBe(200);
    const disabled = await api('PATCH', `/applications/${made.client_id}`, { body: { disabled: true } });
    expect(disabled.statusCode).toBe(200);
    expect(disabled.json()).toMatchObject({ client_id: made.client_id, disabled: true });
    const since = performance.now();
    expect(await contactsWith(tokens.access_token, app)).toBe(401);
    await expect.poll(() => contactsWith(tokens.access_token, second), { timeout: 1000, interval: 20 }).toBe(401);
    expect(performance.now() - since).toBeLessThan(1000);
    expectError(await tokenRequest(made.client_id, newSecret, { grant_type: 'refresh_token', refresh_token: tokens.refresh_token }), 401, 'invalid_client');

    // The grants' revocations are a job queued with the change (the 401s above did not wait for it).
    await finishJobs(t.handle.db);
    const events = (await auditActions()).filter((e) => e.details.client_id === made.client_id || e.action === 'grant.revoked');
    const actor = org.privateApp.client_id;
    expect(events).toEqual(
      expect.arrayContaining([
        { action: 'application.created', client_id: actor, details: expect.objectContaining({ client_id: made.client_id, type: 'public' }) },
        { action: 'application.secret_rotated', client_id: actor, details: { client_id: made.client_id } },
        { action: 'application.disabled', client_id: actor, details: { client_id: made.client_id } },
        { action: 'grant.revoked', client_id: actor, details: expect.objectContaining({ reason: 'application_disabled' }) },
      ]),
    );
    // Newest first.
    const actions = events.map((e) => e.action);
    expect(actions.indexOf('application.disabled')).toBeLessThan(actions.indexOf('application.secret_rotated'));
    expect(actions.indexOf('application.secret_rotated')).toBeLessThan(actions.indexOf('application.created'));
  });

  it('narrowing scopes revokes only the grants holding a removed scope, on both instances', async () => {
    const made = (await api('POST', '/applications', { body: { type: 'public', name: 'Narrowed', redirect_uris: [REDIRECT], scopes: ['contacts.read', 'tasks.read'] } })).json();
    const wide = await userTokens(made.client_id, made.client_secret, org.ownerId, ['contacts.read', 'tasks.read']);
    const narrow = await userTokens(made.client_id, made.client_secret, org.ownerId, ['contacts.read']);
    expect(await contactsWith(wide.access_token, second)).toBe(200);
    const res = await api('PATCH', `/applications/${made.client_id}`, { body: { scopes: ['contacts.read'], name: 'Narrowed more' } });
    expect(res.json()).toMatchObject({ scopes: ['contacts.read'], name: 'Narrowed more' });
    expect(await contactsWith(wide.access_token, app)).toBe(401);
    await expect.poll(() => contactsWith(wide.access_token, second), { timeout: 1000, interval: 20 }).toBe(401);
    expect(await contactsWith(narrow.access_token, app)).toBe(200);
    expect(await contactsWith(narrow.access_token, second)).toBe(200);
    await finishJobs(t.handle.db);
    const revoked = await t.handle.db.selectFrom('grants').select('revoked_reason').where('revoked_at', 'is not', null).orderBy('id', 'desc').executeTakeFirstOrThrow();
    expect(revoked.revoked_reason).toBe('scopes_narrowed');
  });

  it('deletes an application: its tokens stop, it is gone (404)', async () => {
    const made = (await api('POST', '/applications', { body: { type: 'public', name: 'Doomed', redirect_uris: [REDIRECT] } })).json();
    const tokens = await userTokens(made.client_id, made.client_secret, org.ownerId, ['contacts.read']);
    expect((await api('DELETE', `/applications/${made.client_id}`)).statusCode).toBe(204);
    expect(await contactsWith(tokens.access_token, app)).toBe(401);
    await expect.poll(() => contactsWith(tokens.access_token, second), { timeout: 1000, interval: 20 }).toBe(401);
    expectError(await api('GET', `/applications/${made.client_id}`), 404, 'not_found');
    expectError(await api('DELETE', `/applications/${made.client_id}`), 404, 'not_found');
    expect((await auditActions()).find((e) => e.action === 'application.deleted')).toEqual({
      action: 'application.deleted', client_id: org.privateApp.client_id, details: { client_id: made.client_id, name: 'Doomed' },
    });
  });

  it('deletes once when asked twice at once: one 204, one 404, one audit event', async () => {
    const made = (await api('POST', '/applications', { body: { type: 'private', name: 'Twice', scopes: ['contacts.read'] } })).json();
    const statuses = (await Promise.all([api('DELETE', `/applications/${made.client_id}`), api('DELETE', `/applications/${made.client_id}`)])).map((r) => r.statusCode);
    expect(statuses.sort()).toEqual([204, 404]);
    const events = await t.handle.db.selectFrom('audit_events').select('details').where('action', '=', 'application.deleted').execute();
    expect(events.filter((e) => (e.details as { client_id?: string }).client_id === made.client_id)).toHaveLength(1);
  });

  it('lists applications a page at a time, never with a secret', async () => {
    const seen: string[] = [];
    let cursor: string | null = null;
    do {
      const res: LightMyRequestResponse = await api('GET', `/applications?limit=2${cursor ? `&cursor=${cursor}` : ''}`);
      expect(res.statusCode).toBe(200);
      expect(res.body).not.toMatch(/"client_secret"/);
      const body = res.json() as { data: { client_id: string }[]; next_cursor: string | null };
      expect(body.data.length).toBeLessThanOrEqual(2);
      seen.push(...body.data.map((a) => a.client_id));
      cursor = body.next_cursor;
    } while (cursor);
    // Deleted ones are tombstones: not listed.
    const all = await t.handle.db.selectFrom('applications').select('client_id').where('organization_id', '=', org.organizationId).where('deleted_at', 'is', null).orderBy('id').execute();
    expect(seen).toEqual(all.map((a) => a.client_id));
  });

  it('an integration cannot lock itself out: not delete or disable itself, nor drop applications.write (409); it may rename itself and rotate its own secret', async () => {
    const self = `/applications/${org.privateApp.client_id}`;
    expect(expectError(await api('DELETE', self), 409, 'conflict').error_description).toMatch(/cannot delete itself/);
    expect(expectError(await api('PATCH', self, { body: { disabled: true } }), 409, 'conflict').error_description).toMatch(/cannot disable itself/);
    expect(expectError(await api('PATCH', self, { body: { scopes: ['contacts.read', 'applications.read'] } }), 409, 'conflict').error_description).toMatch(
      /cannot remove applications.write from itself/,
    );
    const row = await t.handle.db.selectFrom('applications').select(['disabled', 'scopes']).where('client_id', '=', org.privateApp.client_id).executeTakeFirstOrThrow();
    expect(row).toEqual({ disabled: false, scopes: [...KNOWN_SCOPES] });
    expect((await api('PATCH', self, { body: { name: 'Integration, renamed' } })).json()).toMatchObject({ name: 'Integration, renamed', disabled: false });
    const rotated = await api('POST', `${self}/secret`);
    expect(rotated.statusCode).toBe(200);
    org.privateApp.client_secret = rotated.json().client_secret;
    // Its current token still works, and the new secret gets new ones.
    expect((await api('GET', '/applications?limit=1')).statusCode).toBe(200);
    admin = await clientCredentialsToken(app, org);
  });

  it('answers validation errors with 400 invalid_request and details naming the field', async () => {
    const cases: [object, string][] = [
      [{ type: 'public', name: 'X', redirect_uris: ['http://evil.example.com/cb'] }, 'redirect_uris.0'],
      [{ type: 'public', name: 'X' }, 'redirect_uris'],
      [{ type: 'private', name: 'X', redirect_uris: [REDIRECT] }, 'redirect_uris'],
      [{ type: 'private', name: '   ' }, 'name'],
      [{ type: 'private', name: 'X', scopes: ['admin'] }, 'scopes'],
      [{ type: 'private', name: 'X', scopes: [] }, 'scopes'],
      [{ type: 'private', name: 'X', require_pkce: true }, 'require_pkce'],
      [{ type: 'sideways', name: 'X' }, 'type'],
      [{ type: 'private', name: 'X', extra: 1 }, ''],
      // A lone surrogate would be stored as U+FFFD: a redirect URI other than the one sent.
      [{ type: 'public', name: 'X', redirect_uris: ['https://a.example/cb\ud800'] }, 'redirect_uris.0'],
      [{ type: 'private', name: 'X\udc00' }, 'name'],
      [{ type: 'private', name: 'X\u0000' }, 'name'],
    ];
    for (const [body, path] of cases) {
      const error = expectError(await api('POST', '/applications', { body }), 400, 'invalid_request');
      expect({ body, details: error.details }).toEqual({ body, details: expect.arrayContaining([expect.objectContaining({ path: expect.stringContaining(path) })]) });
    }
    const before = await t.handle.db.selectFrom('applications').select('id').where('organization_id', '=', org.organizationId).execute();
    expectError(await api('PATCH', `/applications/${org.publicApp.client_id}`, { body: {} }), 400, 'invalid_request');
    expectError(await api('PATCH', `/applications/${org.publicApp.client_id}`, { body: { redirect_uris: [] } }), 400, 'invalid_request');
    expectError(await api('PATCH', `/applications/${org.publicApp.client_id}`, { body: { name: '\ud800x' } }), 400, 'invalid_request');
    expectError(await api('PATCH', `/applications/${org.publicApp.client_id}`, { body: { redirect_uris: ['https://a.example/\ud800'] } }), 400, 'invalid_request');
    expect(await t.handle.db.selectFrom('applications').select('id').where('organization_id', '=', org.organizationId).execute()).toEqual(before);
  });

  it('registers post-logout redirect URIs on create and PATCH, shows them, and refuses bad ones with the 400 redirect_uris get', async () => {
    const LOGOUT = 'https://made-by-api.example.com/signed-out';
    const LOOPBACK = 'http://localhost:8080/bye';
    const created = await api('POST', '/applications', { body: { type: 'public', name: 'Signs out', redirect_uris: [REDIRECT], post_logout_redirect_uris: [LOGOUT, LOOPBACK] } });
    expect(created.statusCode, created.body).toBe(201);
    const made = created.json();
    expect(made.post_logout_redirect_uris).toEqual([LOGOUT, LOOPBACK]);
    const path = `/applications/${made.client_id}`;
    expect((await api('GET', path)).json().post_logout_redirect_uris).toEqual([LOGOUT, LOOPBACK]);
    expect((await api('GET', path, { target: second })).json().post_logout_redirect_uris).toEqual([LOGOUT, LOOPBACK]);

    // PATCH replaces the list; a PATCH without it keeps it; an empty list clears it.
    expect((await api('PATCH', path, { body: { post_logout_redirect_uris: [LOOPBACK] } })).json()).toMatchObject({ redirect_uris: [REDIRECT], post_logout_redirect_uris: [LOOPBACK] });
    expect((await api('PATCH', path, { body: { name: 'Signs out, renamed' } })).json().post_logout_redirect_uris).toEqual([LOOPBACK]);
    const listed = (await api('GET', '/applications?limit=100')).json().data.find((a: { client_id: string }) => a.client_id === made.client_id);
    expect(listed.post_logout_redirect_uris).toEqual([LOOPBACK]);
    expect((await api('PATCH', path, { body: { post_logout_redirect_uris: [] } })).json().post_logout_redirect_uris).toEqual([]);
    expect((await auditActions()).filter((e) => e.action === 'application.updated' && e.details.client_id === made.client_id).map((e) => e.details)).toEqual([
      { client_id: made.client_id, post_logout_redirect_uris: [] },
      { client_id: made.client_id, name: 'Signs out, renamed' },
      { client_id: made.client_id, post_logout_redirect_uris: [LOOPBACK] },
    ]);

    // Each bad value: the same 400 and message as in redirect_uris, the path naming this field.
    const bad = [
      'https://a.example/bye#frag', 'http://evil.example.com/bye', '/bye', 'https://a.example/bye\u0000', 'https://a.example/b\u007fye', 'https://a.example/bye\ud800',
    ];
    const before = await t.handle.db.selectFrom('applications').select(['id', 'post_logout_redirect_uris']).where('organization_id', '=', org.organizationId).orderBy('id').execute();
    for (const uri of bad) {
      const asRedirect = expectError(await api('POST', '/applications', { body: { type: 'public', name: 'X', redirect_uris: [uri] } }), 400, 'invalid_request');
      const message = (asRedirect.details as { path: string; message: string }[])[0]!.message;
      expect(asRedirect.details).toEqual([{ path: 'redirect_uris.0', message }]);
      const onCreate = expectError(await api('POST', '/applications', { body: { type: 'public', name: 'X', redirect_uris: [REDIRECT], post_logout_redirect_uris: [uri] } }), 400, 'invalid_request');
      expect({ uri, details: onCreate.details }).toEqual({ uri, details: [{ path: 'post_logout_redirect_uris.0', message }] });
      const onPatch = expectError(await api('PATCH', path, { body: { post_logout_redirect_uris: [LOGOUT, uri] } }), 400, 'invalid_request');
      expect({ uri, details: onPatch.details }).toEqual({ uri, details: [{ path: 'post_logout_redirect_uris.1', message }] });
    }
    const many = Array.from({ length: 21 }, (_, i) => `https://made-by-api.example.com/bye/${i}`);
    expect(expectError(await api('POST', '/applications', { body: { type: 'public', name: 'X', redirect_uris: many } }), 400, 'invalid_request').details).toEqual([
      { path: 'redirect_uris', message: 'at most 20 redirect URIs' },
    ]);
    for (const [method, url, body] of [
      ['POST', '/applications', { type: 'public', name: 'X', redirect_uris: [REDIRECT], post_logout_redirect_uris: many }],
      ['PATCH', path, { post_logout_redirect_uris: many }],
    ] as const) {
      expect(expectError(await api(method, url, { body }), 400, 'invalid_request').details).toEqual([
        { path: 'post_logout_redirect_uris', message: 'at most 20 post-logout redirect URIs' },
      ]);
    }
    // A private application has none, as it has no redirect URIs.
    const privateRefusal = [{ path: 'post_logout_redirect_uris', message: 'a private application has no post-logout redirect URIs (it uses client_credentials)' }];
    expect(expectError(await api('POST', '/applications', { body: { type: 'private', name: 'X', post_logout_redirect_uris: [LOGOUT] } }), 400, 'invalid_request').details).toEqual(privateRefusal);
    const backend = (await api('POST', '/applications', { body: { type: 'private', name: 'No logout', scopes: ['contacts.read'], post_logout_redirect_uris: [] } })).json();
    expect(backend.post_logout_redirect_uris).toEqual([]);
    expect(expectError(await api('PATCH', `/applications/${backend.client_id}`, { body: { post_logout_redirect_uris: [LOGOUT] } }), 400, 'invalid_request').details).toEqual(privateRefusal);
    const after = await t.handle.db.selectFrom('applications').select(['id', 'post_logout_redirect_uris']).where('organization_id', '=', org.organizationId).orderBy('id').execute();
    expect(after).toEqual([...before, { id: expect.any(Number), post_logout_redirect_uris: [] }]);

    // The OpenAPI document describes the field in the application and in both bodies.
    const doc = (await app.inject('/openapi.json')).json();
    expect(Object.keys(doc.components.schemas.Application.properties)).toContain('post_logout_redirect_uris');
    const bodyOf = (method: 'post' | 'patch', route: string) => doc.paths[`/api/v1/{organization_id}${route}`][method].requestBody.content['application/json'].schema.properties;
    expect(bodyOf('post', '/applications').post_logout_redirect_uris).toMatchObject({ type: 'array', description: expect.stringContaining('RP-initiated logout') });
    expect(bodyOf('patch', '/applications/{client_id}').post_logout_redirect_uris).toMatchObject({ type: 'array' });
  });
});

describe(`the management API on ${BACKEND}: an application never hands out more than its token holds`, () => {
  it('cannot widen itself, create a wider application, or change, rotate, disable or delete a wider one (403)', async () => {
    // An integration registered for application management only.
    const narrow = await createOrgFixture(t.handle.db, { scopes: 'applications.read applications.write' });
    const token = await clientCredentialsToken(app, narrow);
    const as = (method: 'POST' | 'PATCH' | 'DELETE', path: string, body?: object) =>
      app.inject({ method, url: `${base(narrow)}${path}`, headers: { authorization: `Bearer ${token}` }, ...(body ? { payload: body } : {}) });

    const self = `/applications/${narrow.privateApp.client_id}`;
    expect(expectError(await as('PATCH', self, { scopes: ['applications.read', 'applications.write', 'members.write'] }), 403, 'forbidden').error_description).toMatch(/lacks members.write/);
    expectError(await as('POST', '/applications', { type: 'private', name: 'Wider', scopes: ['applications.write', 'members.write'] }), 403, 'forbidden');
    // With no scopes given a new application gets the data scopes, which this token lacks too.
    expectError(await as('POST', '/applications', { type: 'private', name: 'Default' }), 403, 'forbidden');
    // The fixture's other applications hold data scopes: out of reach.
    const wider = `/applications/${narrow.publicApp.client_id}`;
    expectError(await as('POST', `${wider}/secret`), 403, 'forbidden');
    expectError(await as('PATCH', wider, { name: 'Taken over' }), 403, 'forbidden');
    expectError(await as('PATCH', wider, { disabled: true }), 403, 'forbidden');
    expectError(await as('DELETE', wider), 403, 'forbidden');
    const untouched = await t.handle.db.selectFrom('applications').select(['name', 'disabled', 'secret_rotated_at', 'scopes']).where('organization_id', '=', narrow.organizationId).orderBy('id').execute();
    expect(untouched).toEqual([
      { name: expect.any(String), disabled: false, secret_rotated_at: null, scopes: ['applications.read', 'applications.write'] },
      { name: expect.any(String), disabled: false, secret_rotated_at: null, scopes: ['contacts.read', 'contacts.write', 'tasks.read', 'tasks.write'] },
    ]);
    // Within its token's scopes, it manages applications as usual.
    const within = await as('POST', '/applications', { type: 'private', name: 'Reader', scopes: ['applications.read'] });
    expect(within.statusCode).toBe(201);
    const reader = within.json();
    expect((await as('POST', `/applications/${reader.client_id}/secret`)).statusCode).toBe(200);
    expect((await as('PATCH', `/applications/${reader.client_id}`, { disabled: true })).statusCode).toBe(200);
    expect((await as('DELETE', `/applications/${reader.client_id}`)).statusCode).toBe(204);
    // A narrower token of a wider application is bounded by the token, not the application.
    const readOnly = await clientCredentialsToken(app, org, 'applications.read applications.write');
    expectError(await api('POST', `/applications/${org.publicApp.client_id}/secret`, { token: readOnly }), 403, 'forbidden');
  });
});

describe(`the management API on ${BACKEND}: tokens the token endpoint never issues`, () => {
  async function signed(input: { subject: string; clientId: string; scopes: string[]; organizationId: number; grantId: number }) {
    const config = testConfig();
    return (await signAccessToken(await new KeyStore(t.handle.db, config).signingKey(), config, { ...input, resource: apiResource(config) })).token;
  }

  it('a user token with a management scope is refused (403): management is never delegated by a user', async () => {
    const token = await signed({ subject: String(org.ownerId), clientId: org.publicApp.client_id, scopes: ['contacts.read'], organizationId: org.organizationId, grantId: 987_654_321 });
    expect((await api('GET', '/contacts', { token })).statusCode).toBe(200);
    // Even were a public application given a management scope (the database refuses it), its user token would get nothing.
    const forged = await signed({ subject: String(org.ownerId), clientId: org.privateApp.client_id, scopes: ['applications.read'], organizationId: org.organizationId, grantId: 987_654_321 });
    expectError(await api('GET', '/applications', { token: forged }), 403, 'insufficient_scope');
  });

  it("another organization's private application is refused, even with a token naming this organization (403)", async () => {
    const elsewhere = await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') });
    const forged = await signed({ subject: elsewhere.privateApp.client_id, clientId: elsewhere.privateApp.client_id, scopes: ['applications.read'], organizationId: org.organizationId, grantId: 987_654_321 });
    expectError(await api('GET', '/applications', { token: forged }), 403, 'insufficient_scope');
    const own = await signed({ subject: org.privateApp.client_id, clientId: org.privateApp.client_id, scopes: ['applications.read'], organizationId: org.organizationId, grantId: 987_654_321 });
    expect((await api('GET', '/applications', { token: own })).statusCode).toBe(200);
  });
});

describe(`the management API on ${BACKEND}: no management scope for a public application (AD-1)`, () => {
  it('cannot be created with one, nor given one later', async () => {
    for (const scope of MANAGEMENT_SCOPES) {
      const error = expectError(
        await api('POST', '/applications', { body: { type: 'public', name: 'Greedy', redirect_uris: [REDIRECT], scopes: ['contacts.read', scope] } }),
        400,
        'invalid_request',
      );
      expect(error.details).toEqual([{ path: 'scopes', message: `${scope} may be held only by private applications` }]);
    }
    expectError(await api('PATCH', `/applications/${org.publicApp.client_id}`, { body: { scopes: ['contacts.read', 'members.read'] } }), 400, 'invalid_request');
  });

  it('gets invalid_scope at /oauth/authorize for every management scope, redirected with state and iss', async () => {
    const user = await createUser(t.handle.db, { email: `consenter-${process.pid}@example.com`, password: PASSWORD });
    await addMember(t.handle.db, { organizationId: org.organizationId, userId: user.id, role: 'owner' });
    const browser = new Browser(app, '10.30.0.1');
    expect((await browser.login(user.email, PASSWORD)).statusCode).toBe(303);
    for (const scope of MANAGEMENT_SCOPES) {
      const query = new URLSearchParams({
        client_id: org.publicApp.client_id, redirect_uri: 'https://client.example.com/cb', response_type: 'code', scope: `contacts.read ${scope}`, state: 'state-0123456789abcdef',
      });
      const res = await browser.get(`/oauth/authorize?${query.toString()}`);
      expect(res.statusCode).toBe(303);
      const location = new URL(String(res.headers.location));
      expect(Object.fromEntries(location.searchParams)).toEqual({
        error: 'invalid_scope', error_description: expect.any(String), state: 'state-0123456789abcdef', iss: expect.any(String),
      });
    }
  });

  it('cannot hold one even through the token endpoint: client_credentials is for private applications', async () => {
    const res = await tokenRequest(org.publicApp.client_id, org.publicApp.client_secret, { grant_type: 'client_credentials', organization_id: String(org.organizationId), scope: 'applications.read' });
    expectError(res, 400, 'unauthorized_client');
  });
});

describe(`the management API on ${BACKEND}: members`, () => {
  let n = 0;
  const newUser = () => createUser(t.handle.db, { email: `mgmt${++n}-${process.pid}@example.com`, password: PASSWORD, name: `User ${n}` });

  it('adds an existing user (201), refuses a duplicate (409) and an unknown email (400 with details)', async () => {
    const user = await newUser();
    const res = await api('POST', '/members', { body: { email: user.email.toUpperCase(), role: 'member' } });
    expect(res.statusCode).toBe(201);
    expect(res.json()).toEqual({ user_id: user.id, email: user.email, name: user.name, role: 'member', two_step: false, created_at: expect.any(String) });
    expect(res.headers.location).toBe(`${base()}/members/${user.id}`);
    expectError(await api('POST', '/members', { body: { email: user.email, role: 'admin' } }), 409, 'conflict');
    const unknown = expectError(await api('POST', '/members', { body: { email: 'nobody-here@example.com', role: 'member' } }), 400, 'invalid_request');
    expect(unknown.details).toEqual([{ path: 'email', message: 'no user has this email address' }]);
    expectError(await api('POST', '/members', { body: { email: user.email, role: 'king' } }), 400, 'invalid_request');
  });

  it('with every scope it acts as an admin: manages members and admins, but never makes, changes or removes an owner (403)', async () => {
    const user = await newUser();
    expectError(await api('POST', '/members', { body: { email: user.email, role: 'owner' } }), 403, 'forbidden');
    expect((await api('POST', '/members', { body: { email: user.email, role: 'admin' } })).statusCode).toBe(201);
    expect((await api('PATCH', `/members/${user.id}`, { body: { role: 'member' } })).json()).toMatchObject({ user_id: user.id, role: 'member' });
    expectError(await api('PATCH', `/members/${user.id}`, { body: { role: 'owner' } }), 403, 'forbidden');
    expectError(await api('PATCH', `/members/${org.ownerId}`, { body: { role: 'member' } }), 403, 'forbidden');
    expectError(await api('DELETE', `/members/${org.ownerId}`), 403, 'forbidden');
    const owner = await t.handle.db.selectFrom('memberships').select('role').where('organization_id', '=', org.organizationId).where('user_id', '=', org.ownerId).executeTakeFirstOrThrow();
    expect(owner.role).toBe('owner');
  });

  it('gives, changes, invites to and edits only roles whose every permission its token holds: a member who manages applications and members cannot promote themselves through an integration (403)', async () => {
    const db = t.handle.db;
    const fixture = await createOrgFixture(db, { scopes: KNOWN_SCOPES.join(' ') });
    const managers = await createRole(db, fixture.organizationId, { name: 'App managers', permissions: ['applications.write', 'members.write'] });
    const sales = await createRole(db, fixture.organizationId, { name: 'Sales', permissions: ['contacts.read', 'contacts.write'] });
    const climber = await newUser();
    const bystander = await newUser();
    await addMember(db, { organizationId: fixture.organizationId, userId: climber.id, role: managers });
    await addMember(db, { organizationId: fixture.organizationId, userId: bystander.id, role: 'member' });
    // What the dashboard lets this member make: a private application with at most their role's permissions.
    const integration = await createApplication(db, { organizationId: fixture.organizationId, type: 'private', name: 'Self-service', scopes: [...managers.permissions] });
    const token = await clientCredentialsToken(app, { ...fixture, privateApp: integration });
    const as = (method: 'POST' | 'PATCH' | 'DELETE', path: string, body?: object) =>
      app.inject({ method, url: `${base(fixture)}${path}`, headers: { authorization: `Bearer ${token}` }, ...(body ? { payload: body } : {}) });

    for (const role of ['admin', 'member', 'Sales']) {
      expect(expectError(await as('PATCH', `/members/${climber.id}`, { role }), 403, 'forbidden').error_description).toMatch(/may not give/);
      expectError(await as('POST', '/invitations', { email: `climb-${role}-${process.pid}@example.com`, role }), 403, 'forbidden');
    }
    // Taking a role away is giving it up: a member (data scopes) is out of this token's reach.
    expectError(await as('PATCH', `/members/${bystander.id}`, { role: 'App managers' }), 403, 'forbidden');
    expectError(await as('DELETE', `/members/${bystander.id}`), 403, 'forbidden');
    // Nor can it mint or widen a role with what it lacks, or touch one that holds it.
    expect(expectError(await as('POST', '/roles', { name: 'Everything', permissions: ['contacts.write'] }), 403, 'forbidden').error_description).toMatch(/contacts.write/);
    expectError(await as('PATCH', '/roles/App%20managers', { permissions: ['applications.write', 'members.write', 'tasks.write'] }), 403, 'forbidden');
    expectError(await as('PATCH', '/roles/Sales', { description: 'Ours now' }), 403, 'forbidden');
    expectError(await as('DELETE', '/roles/Sales?move_to=App%20managers'), 403, 'forbidden');
    const roles = await db.selectFrom('memberships').select(['user_id', 'role', 'role_id']).where('organization_id', '=', fixture.organizationId).where('user_id', 'in', [climber.id, bystander.id]).orderBy('user_id').execute();
    expect(roles).toEqual([
      { user_id: climber.id, role: 'custom', role_id: managers.id },
      { user_id: bystander.id, role: 'member', role_id: null },
    ]);
    expect((await db.selectFrom('roles').select(['name', 'permissions']).where('organization_id', '=', fixture.organizationId).orderBy('id').execute())).toEqual([
      { name: 'App managers', permissions: managers.permissions },
      { name: 'Sales', permissions: sales.permissions },
    ]);
    // Within its scopes it manages as usual: gives its own role, makes a narrower one.
    const newcomer = await newUser();
    expect((await as('POST', '/members', { email: newcomer.email, role: 'App managers' })).statusCode).toBe(201);
    expect((await as('POST', '/roles', { name: 'Readers of apps', permissions: ['applications.read'] })).statusCode).toBe(201);
    expect((await as('PATCH', `/members/${newcomer.id}`, { role: 'Readers of apps' })).statusCode).toBe(200);
  });

  it('removes a member: every grant they gave here is revoked, on both instances', async () => {
    const user = await newUser();
    expect((await api('POST', '/members', { body: { email: user.email, role: 'member' } })).statusCode).toBe(201);
    const tokens = await userTokens(org.publicApp.client_id, org.publicApp.client_secret, user.id, ['contacts.read']);
    expect(await contactsWith(tokens.access_token, second)).toBe(200);
    expect((await api('DELETE', `/members/${user.id}`)).statusCode).toBe(204);
    expect(await contactsWith(tokens.access_token, app)).toBe(401);
    await expect.poll(() => contactsWith(tokens.access_token, second), { timeout: 1000, interval: 20 }).toBe(401);
    expectError(await api('GET', `/members/${user.id}`), 404, 'not_found');
    expectError(await api('DELETE', `/members/${user.id}`), 404, 'not_found');
    // The grants are revoked by a job (the tokens were refused before it ran).
    await finishJobs(t.handle.db);
    const actions = await auditActions();
    expect(actions).toContainEqual({ action: 'member.removed', client_id: org.privateApp.client_id, details: { user_id: user.id, role: 'member' } });
    expect(actions).toContainEqual(expect.objectContaining({ action: 'grant.revoked', client_id: org.privateApp.client_id, details: expect.objectContaining({ reason: 'member_removed', user_id: user.id }) }));
  });

  it('lists members in user id order, a page at a time', async () => {
    const seen: number[] = [];
    let cursor: string | null = null;
    do {
      const body: { data: { user_id: number }[]; next_cursor: string | null } = (await api('GET', `/members?limit=2${cursor ? `&cursor=${cursor}` : ''}`)).json();
      seen.push(...body.data.map((m) => m.user_id));
      cursor = body.next_cursor;
    } while (cursor);
    const all = await t.handle.db.selectFrom('memberships').select('user_id').where('organization_id', '=', org.organizationId).orderBy('user_id').execute();
    expect(seen).toEqual(all.map((m) => m.user_id));
  });
});

describe(`the management API on ${BACKEND}: the last owner (RO-3)`, () => {
  it('stays protected whatever an owner-less integration asks', async () => {
    const solo = await createOrgFixture(t.handle.db, { scopes: 'members.read members.write' });
    const token = await clientCredentialsToken(app, solo);
    const call = (method: 'PATCH' | 'DELETE', body?: object) =>
      app.inject({ method, url: `${base(solo)}/members/${solo.ownerId}`, headers: { authorization: `Bearer ${token}` }, ...(body ? { payload: body } : {}) });
    expect((await call('PATCH', { role: 'admin' })).statusCode).toBe(403);
    expect((await call('DELETE')).statusCode).toBe(403);
    const members = await t.handle.db.selectFrom('memberships').select(['user_id', 'role']).where('organization_id', '=', solo.organizationId).execute();
    expect(members).toEqual([{ user_id: solo.ownerId, role: 'owner' }]);
  });
});

describe(`the management API on ${BACKEND}: connected apps`, () => {
  it('lists live grants newest first, with who authorized them, and revokes one (204, then 404)', async () => {
    const user = await createUser(t.handle.db, { email: `granter-${process.pid}@example.com`, password: PASSWORD });
    await addMember(t.handle.db, { organizationId: org.organizationId, userId: user.id, role: 'member' });
    const tokens = await userTokens(org.publicApp.client_id, org.publicApp.client_secret, user.id, ['contacts.read']);
    const list = await api('GET', '/grants?limit=100');
    expect(list.statusCode).toBe(200);
    const grants = list.json().data as { id: number; user: { id: number; email: string } | null; application: { client_id: string } }[];
    expect(grants.map((g) => g.id)).toEqual([...grants.map((g) => g.id)].sort((x, y) => y - x));
    const theirs = grants.find((g) => g.user?.id === user.id)!;
    expect(theirs).toEqual({
      id: expect.any(Number), application: { client_id: org.publicApp.client_id, name: expect.any(String), type: 'public' }, user: { id: user.id, email: user.email },
      scopes: ['contacts.read'], created_at: expect.any(String), last_used_at: expect.any(String),
    });
    // The integration's own grant: the application acting for itself.
    expect(grants).toContainEqual(expect.objectContaining({ user: null, application: expect.objectContaining({ client_id: org.privateApp.client_id, type: 'private' }) }));
    expect((await api('GET', `/grants/${theirs.id}`)).json()).toEqual(theirs);

    expect(await contactsWith(tokens.access_token, second)).toBe(200);
    expect((await api('DELETE', `/grants/${theirs.id}`)).statusCode).toBe(204);
    expect(await contactsWith(tokens.access_token, app)).toBe(401);
    await expect.poll(() => contactsWith(tokens.access_token, second), { timeout: 1000, interval: 20 }).toBe(401);
    expectError(await api('DELETE', `/grants/${theirs.id}`), 404, 'not_found');
    expectError(await api('GET', `/grants/${theirs.id}`), 404, 'not_found');
    expect(await auditActions()).toContainEqual({
      action: 'grant.revoked', client_id: org.privateApp.client_id, details: expect.objectContaining({ grant_id: theirs.id, reason: 'revoked_by_admin' }),
    });
  });

  it('pages newest first without gaps or repeats while grants are added', async () => {
    const application = await t.handle.db.selectFrom('applications').select('id').where('client_id', '=', org.publicApp.client_id).executeTakeFirstOrThrow();
    for (let i = 0; i < 5; i++) await createGrant(t.handle.db, { organizationId: org.organizationId, applicationId: application.id, userId: org.ownerId, scopes: ['tasks.read'] });
    const live = await t.handle.db.selectFrom('grants').select('id').where('organization_id', '=', org.organizationId).where('revoked_at', 'is', null).orderBy('id', 'desc').execute();
    const seen: number[] = [];
    let cursor: string | null = null;
    do {
      const body: { data: { id: number }[]; next_cursor: string | null } = (await api('GET', `/grants?limit=2${cursor ? `&cursor=${cursor}` : ''}`)).json();
      seen.push(...body.data.map((g) => g.id));
      cursor = body.next_cursor;
      // One added meanwhile: newer than the first page, so it is not among the pages that follow.
      if (seen.length === 2) await createGrant(t.handle.db, { organizationId: org.organizationId, applicationId: application.id, userId: org.ownerId, scopes: ['tasks.read'] });
    } while (cursor);
    expect(seen).toEqual(live.map((g) => g.id));
  });
});

describe(`the management API on ${BACKEND}: the audit log`, () => {
  it('reads newest first, a page at a time, the whole log exactly once', async () => {
    const token = await clientCredentialsToken(app, org, 'audit.read');
    const seen: number[] = [];
    let cursor: string | null = null;
    do {
      const res: LightMyRequestResponse = await api('GET', `/audit-events?limit=7${cursor ? `&cursor=${cursor}` : ''}`, { token });
      const body = res.json() as { data: { id: number; action: string; created_at: string; actor: object; details: object }[]; next_cursor: string | null };
      for (const e of body.data) expect(e).toEqual({ id: expect.any(Number), action: expect.any(String), actor: expect.any(Object), details: expect.any(Object), created_at: expect.any(String) });
      seen.push(...body.data.map((e) => e.id));
      cursor = body.next_cursor;
    } while (cursor);
    const all = await t.handle.db.selectFrom('audit_events').select('id').where('organization_id', '=', org.organizationId).orderBy('id', 'desc').execute();
    expect(seen).toEqual(all.map((e) => e.id));
    expectError(await api('GET', '/audit-events?cursor=bogus', { token }), 400, 'invalid_request');
  });
});
