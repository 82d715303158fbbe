/**
 * A battery of malformed requests across the OAuth endpoints, the login page and the API (R-7):
 * each row states the status (and error code) it must get; none may answer 5xx.
 */
import type { FastifyInstance, InjectOptions } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureSigningKey } from '../src/oauth/models/signing-keys.js';
import { DATA_SCOPES, KNOWN_SCOPES } from '../src/oauth/helpers/scopes.js';
import { buildTestApp, TEST_SECRET_KEY } from './helpers/app.js';
import { BACKEND, createTestDatabase } from './helpers/db.js';
import { basic, clientCredentialsToken, createOrgFixture, form, type OrgFixture } from './helpers/oauth.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
let org: OrgFixture;
let bearer: string;
/** The management API: an organization whose integration holds every scope, its token, a data-only token, and its owner's email. */
let mgmt: OrgFixture;
let admin: string;
let dataOnly: string;
let ownerEmail: string;

beforeAll(async () => {
  t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  app = await buildTestApp(t.handle.db);
  org = await createOrgFixture(t.handle.db);
  const res = await app.inject({
    method: 'POST',
    url: '/oauth/token',
    headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(org.privateApp.client_id, org.privateApp.client_secret) },
    payload: form({ grant_type: 'client_credentials', organization_id: String(org.organizationId) }),
  });
  bearer = res.json().access_token;
  mgmt = await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') });
  admin = await clientCredentialsToken(app, mgmt);
  dataOnly = await clientCredentialsToken(app, mgmt, DATA_SCOPES.join(' '));
  ownerEmail = (await t.handle.db.selectFrom('users').select('email').where('id', '=', mgmt.ownerId).executeTakeFirstOrThrow()).email;
});
afterAll(async () => {
  await app.close();
  await t.close();
});

type Row = [name: string, request: () => InjectOptions, status: number, error?: string];
const FORM = { 'content-type': 'application/x-www-form-urlencoded' };
const tokenPost = (payload: string | Buffer, headers: Record<string, string> = {}): InjectOptions => ({
  method: 'POST', url: '/oauth/token', headers: { ...FORM, authorization: basic(org.privateApp.client_id, org.privateApp.client_secret), ...headers }, payload,
});
const clientPost = (url: string, payload: string | Buffer): InjectOptions => ({
  method: 'POST', url, headers: { ...FORM, authorization: basic(org.privateApp.client_id, org.privateApp.client_secret) }, payload,
});
const authorize = (query: string): InjectOptions => ({ method: 'GET', url: `/oauth/authorize?${query}` });
const apiCall = (method: 'GET' | 'POST' | 'PATCH', path: string, payload?: unknown, headers: Record<string, string> = {}): InjectOptions => ({
  method, url: `/api/v1/${org.organizationId}${path}`, headers: { authorization: `Bearer ${bearer}`, ...headers }, ...(payload !== undefined ? { payload: payload as string } : {}),
});
const JSON_BODY = { 'content-type': 'application/json' };
/** A management API request with the integration's token (every scope); a string payload is sent as JSON text as is. */
const manage = (method: 'GET' | 'POST' | 'PATCH' | 'DELETE', path: string, payload?: unknown, headers: Record<string, string> = {}): InjectOptions => ({
  method,
  url: `/api/v1/${mgmt.organizationId}${path}`,
  headers: { authorization: `Bearer ${admin}`, ...(typeof payload === 'string' ? JSON_BODY : {}), ...headers },
  ...(payload !== undefined ? { payload: payload as string } : {}),
});
const cursor = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url');
const cc = () => `grant_type=client_credentials&organization_id=${org.organizationId}`;
const jwt = (header: object, payload: unknown) =>
  `${Buffer.from(JSON.stringify(header)).toString('base64url')}.${Buffer.from(JSON.stringify(payload)).toString('base64url')}.c2ln`;

const ROWS: Row[] = [
  // /oauth/token
  ['token: duplicated grant_type', () => tokenPost('grant_type=client_credentials&grant_type=client_credentials'), 400, 'invalid_request'],
  ['token: array-shaped parameter', () => tokenPost(`${cc()}&scope[]=contacts.read`), 200],
  ['token: __proto__ parameter', () => tokenPost(`${cc()}&__proto__[admin]=1`), 200],
  ['token: constructor[prototype]', () => tokenPost(`${cc()}&constructor[prototype][admin]=1`), 200],
  ['token: NUL in a value', () => tokenPost(`${cc()}&scope=contacts.read%00`), 400, 'invalid_request'],
  ['token: invalid UTF-8', () => tokenPost(Buffer.concat([Buffer.from(`${cc()}&scope=`), Buffer.from([0xc3, 0x28])])), 400, 'invalid_scope'],
  ['token: broken percent-encoding', () => tokenPost(`${cc()}&scope=%E0%A4%A`), 400, 'invalid_scope'],
  ['token: oversized body', () => tokenPost(`${cc()}&pad=${'x'.repeat(70_000)}`), 413],
  ['token: JSON body', () => tokenPost('{"grant_type":"client_credentials"}', { 'content-type': 'application/json' }), 400, 'invalid_request'],
  ['token: empty body', () => tokenPost(''), 400, 'invalid_request'],
  ['token: organization_id 01', () => tokenPost('grant_type=client_credentials&organization_id=01'), 400, 'invalid_request'],
  ['token: organization_id 1e3', () => tokenPost('grant_type=client_credentials&organization_id=1e3'), 400, 'invalid_request'],
  ['token: organization_id 2^63', () => tokenPost('grant_type=client_credentials&organization_id=9223372036854775808'), 400, 'invalid_request'],
  ['token: organization_id with a space', () => tokenPost('grant_type=client_credentials&organization_id=%201'), 400, 'invalid_request'],
  ['token: huge Basic header', () => tokenPost(cc(), { authorization: `Basic ${'A'.repeat(20_000)}` }), 401, 'invalid_client'],
  ['token: Basic without colon', () => tokenPost(cc(), { authorization: `Basic ${Buffer.from('nocolon').toString('base64')}` }), 401, 'invalid_client'],
  ['token: Basic with bad percent-encoding', () => tokenPost(cc(), { authorization: `Basic ${Buffer.from(`${org.privateApp.client_id}:%zz`).toString('base64')}` }), 400, 'invalid_request'],
  ['token: unknown grant_type with NUL', () => tokenPost('grant_type=pass%00word'), 400, 'invalid_request'],
  ['token: a code that is huge', () => tokenPost(`grant_type=authorization_code&code=${'c'.repeat(5000)}&redirect_uri=https://x.example/cb`), 400, 'unauthorized_client'],
  ['token: refresh_token array', () => tokenPost('grant_type=refresh_token&refresh_token=a&refresh_token=b'), 400, 'invalid_request'],
  // Found by test/fuzz.test.ts: a Content-Type Fastify cannot parse was its 415, an OPTIONS a 404.
  ['token: empty Content-Type', () => tokenPost(cc(), { 'content-type': '' }), 400, 'invalid_request'],
  ['token: malformed Content-Type', () => tokenPost(cc(), { 'content-type': ';' }), 400, 'invalid_request'],
  ['token: OPTIONS', () => ({ method: 'OPTIONS', url: '/oauth/token' }), 405, 'invalid_request'],
  ['revoke: DELETE with a malformed Content-Type', () => ({ method: 'DELETE', url: '/oauth/revoke', headers: { 'content-type': 'a/b/c' }, payload: 'token=x' }), 405, 'invalid_request'],
  // /oauth/revoke and /oauth/introspect
  ['revoke: no token', () => clientPost('/oauth/revoke', ''), 400, 'invalid_request'],
  ['revoke: duplicated token', () => clientPost('/oauth/revoke', 'token=a&token=b'), 400, 'invalid_request'],
  ['revoke: JWT with alg none', () => clientPost('/oauth/revoke', `token=${jwt({ alg: 'none', typ: 'at+jwt' }, {})}`), 200],
  ['introspect: array payload JWT', () => clientPost('/oauth/introspect', `token=${jwt({ alg: 'ES256', kid: 'x' }, [1, 2])}`), 200],
  ['introspect: 10 kB token', () => clientPost('/oauth/introspect', `token=${'t'.repeat(10_000)}`), 200],
  ['introspect: NUL token', () => clientPost('/oauth/introspect', 'token=%00'), 400, 'invalid_request'],
  // /oauth/authorize (no session: client errors are a page, the rest go to login first)
  ['authorize: no parameters', () => authorize(''), 400],
  ['authorize: duplicated client_id', () => authorize(`client_id=${org.publicApp.client_id}&client_id=${org.publicApp.client_id}`), 400],
  ['authorize: client_id array', () => authorize(`client_id[]=${org.publicApp.client_id}`), 400],
  ['authorize: NUL client_id', () => authorize('client_id=%00'), 400],
  ['authorize: redirect_uri case changed', () => authorize(`client_id=${org.publicApp.client_id}&redirect_uri=HTTPS://client.example.com/cb`), 400],
  ['authorize: redirect_uri trailing slash', () => authorize(`client_id=${org.publicApp.client_id}&redirect_uri=https://client.example.com/cb/`), 400],
  ['authorize: redirect_uri extra query', () => authorize(`client_id=${org.publicApp.client_id}&redirect_uri=https://client.example.com/cb?x=1`), 400],
  ['authorize: redirect_uri fragment', () => authorize(`client_id=${org.publicApp.client_id}&redirect_uri=https://client.example.com/cb%23x`), 400],
  ['authorize: redirect_uri userinfo', () => authorize(`client_id=${org.publicApp.client_id}&redirect_uri=https://evil@client.example.com/cb`), 400],
  ['authorize: redirect_uri encoded dots', () => authorize(`client_id=${org.publicApp.client_id}&redirect_uri=https://client.example.com/%2e%2e/cb`), 400],
  ['authorize: redirect_uri other scheme', () => authorize(`client_id=${org.publicApp.client_id}&redirect_uri=javascript:alert(1)`), 400],
  ['authorize: huge client_id', () => authorize(`client_id=${'a'.repeat(3000)}`), 400],
  ['authorize: valid client, no session', () => authorize(`client_id=${org.publicApp.client_id}&redirect_uri=https://client.example.com/cb&response_type=code`), 303],
  // /login
  ['login: no CSRF token', () => ({ method: 'POST', url: '/login', headers: FORM, payload: 'email=a@b.c&password=x' }), 403],
  ['login: array email', () => ({ method: 'POST', url: '/login', headers: FORM, payload: 'email=a@b.c&email=d@e.f&password=x' }), 400],
  ['login: JSON body (no CSRF token in it)', () => ({ method: 'POST', url: '/login', headers: { 'content-type': 'application/json' }, payload: '{"email":"a"}' }), 403],
  ['login: oversized', () => ({ method: 'POST', url: '/login', headers: FORM, payload: `email=${'x'.repeat(70_000)}` }), 413],
  ['login: return_to open redirect', () => ({ method: 'GET', url: '/login?return_to=//evil.example.com' }), 200],
  // /api/v1
  ['api: organization 01', () => ({ method: 'GET', url: '/api/v1/01/contacts', headers: { authorization: `Bearer ${bearer}` } }), 404, 'not_found'],
  ['api: organization 1.0', () => ({ method: 'GET', url: '/api/v1/1.0/contacts', headers: { authorization: `Bearer ${bearer}` } }), 404, 'not_found'],
  ['api: organization -1', () => ({ method: 'GET', url: '/api/v1/-1/contacts', headers: { authorization: `Bearer ${bearer}` } }), 404, 'not_found'],
  ['api: organization 2^63', () => ({ method: 'GET', url: '/api/v1/9223372036854775808/contacts', headers: { authorization: `Bearer ${bearer}` } }), 404, 'not_found'],
  ['api: alg none token', () => apiCall('GET', '/contacts', undefined, { authorization: `Bearer ${jwt({ alg: 'none', typ: 'at+jwt' }, { organization_id: org.organizationId })}` }), 401, 'invalid_token'],
  ['api: unknown kid', () => apiCall('GET', '/contacts', undefined, { authorization: `Bearer ${jwt({ alg: 'ES256', typ: 'at+jwt', kid: 'nope' }, {})}` }), 401, 'invalid_token'],
  ['api: HS256 token', () => apiCall('GET', '/contacts', undefined, { authorization: `Bearer ${jwt({ alg: 'HS256', typ: 'at+jwt' }, {})}` }), 401, 'invalid_token'],
  ['api: wrong typ', () => apiCall('GET', '/contacts', undefined, { authorization: `Bearer ${jwt({ alg: 'ES256', typ: 'JWT' }, {})}` }), 401, 'invalid_token'],
  ['api: huge bearer', () => apiCall('GET', '/contacts', undefined, { authorization: `Bearer ${'a'.repeat(16_000)}` }), 401, 'invalid_token'],
  ['api: token in the query', () => ({ method: 'GET', url: `/api/v1/${org.organizationId}/contacts?access_token=${bearer}` }), 401, 'invalid_request'],
  ['api: limit=abc', () => apiCall('GET', '/contacts?limit=abc'), 400, 'invalid_request'],
  ['api: limit array', () => apiCall('GET', '/contacts?limit=1&limit=2'), 400, 'invalid_request'],
  ['api: cursor garbage', () => apiCall('GET', '/contacts?cursor=%FF%FE'), 400, 'invalid_request'],
  ['api: q with NUL', () => apiCall('GET', '/contacts?q=a%00b'), 400, 'invalid_request'],
  ['api: malformed JSON', () => apiCall('POST', '/contacts', '{"name":', { 'content-type': 'application/json' }), 400, 'invalid_request'],
  ['api: JSON array body', () => apiCall('POST', '/contacts', '[1,2]', { 'content-type': 'application/json' }), 400, 'invalid_request'],
  ['api: __proto__ in JSON', () => apiCall('POST', '/contacts', '{"name":"x","__proto__":{"a":1}}', { 'content-type': 'application/json' }), 400, 'invalid_request'],
  ['api: form body', () => apiCall('POST', '/contacts', 'name=x', FORM), 415, 'unsupported_media_type'],
  ['api: number as name', () => apiCall('POST', '/contacts', { name: 42 }), 400, 'invalid_request'],
  ['api: contact id 01', () => apiCall('GET', '/contacts/01'), 404, 'not_found'],
  ['api: contact id 2^63', () => apiCall('GET', '/contacts/9223372036854775808'), 404, 'not_found'],
  ['api: task contact_id 2^60', () => apiCall('POST', '/tasks', { title: 't', contact_id: 2 ** 60 }), 400, 'invalid_request'],
  ['api: due_on not a date', () => apiCall('POST', '/tasks', { title: 't', due_on: '2026-02-30' }), 400, 'invalid_request'],
  ['api: status unknown', () => apiCall('PATCH', '/tasks/1', { status: 'maybe' }), 400, 'invalid_request'],
  // Found by test/fuzz.test.ts: paths the router cannot read got Fastify's own error body.
  ['api: undecodable path segment', () => ({ method: 'GET', url: '/api/v1/%ZZ/contacts', headers: { authorization: `Bearer ${bearer}` } }), 400, 'invalid_request'],
  ['api: path segment over 100 characters', () => apiCall('GET', `/contacts/${'1'.repeat(150)}`), 414, 'invalid_request'],
  ['login: undecodable path', () => ({ method: 'GET', url: '/login/%E0%A4%A' }), 400, 'invalid_request'],
  ['api: invalid UTF-8 JSON', () => apiCall('POST', '/contacts', Buffer.concat([Buffer.from('{"name":"'), Buffer.from([0xff, 0xfe]), Buffer.from('"}')]), { 'content-type': 'application/json' }), 201],
  // The management API (applications, members, connected apps, audit log)
  ['manage: duplicated role key (the last counts, and owner is for people)', () => manage('POST', '/members', `{"email":"${ownerEmail}","role":"member","role":"owner"}`), 403, 'forbidden'],
  ['manage: array-shaped email', () => manage('POST', '/members', { email: [ownerEmail], role: 'member' }), 400, 'invalid_request'],
  ['manage: array-shaped role', () => manage('PATCH', `/members/${mgmt.ownerId}`, { role: ['admin'] }), 400, 'invalid_request'],
  ['manage: __proto__ in an application', () => manage('POST', '/applications', '{"type":"private","name":"x","__proto__":{"scopes":["applications.write"]}}'), 400, 'invalid_request'],
  ['manage: constructor.prototype in a member', () => manage('POST', '/members', '{"email":"a@example.com","role":"member","constructor":{"prototype":{"role":"owner"}}}'), 400, 'invalid_request'],
  ['manage: NUL in an application name', () => manage('POST', '/applications', { type: 'private', name: 'a\u0000b' }), 400, 'invalid_request'],
  ['manage: NUL in an email', () => manage('POST', '/members', { email: 'a\u0000@example.com', role: 'member' }), 400, 'invalid_request'],
  ['manage: unknown key in a change', () => manage('PATCH', `/applications/${mgmt.publicApp.client_id}`, { client_secret: 'x' }), 400, 'invalid_request'],
  ['manage: client_id in upper case', () => manage('GET', `/applications/${mgmt.publicApp.client_id.toUpperCase()}`), 404, 'not_found'],
  ['manage: client_id of 31 hex characters', () => manage('DELETE', `/applications/${mgmt.publicApp.client_id.slice(1)}`), 404, 'not_found'],
  ['manage: client_id with a NUL', () => manage('POST', `/applications/${mgmt.publicApp.client_id}%00/secret`), 404, 'not_found'],
  ['manage: user_id 01', () => manage('GET', '/members/01'), 404, 'not_found'],
  ['manage: user_id 2^63', () => manage('DELETE', '/members/9223372036854775808'), 404, 'not_found'],
  ['manage: grant id 1.0', () => manage('DELETE', '/grants/1.0'), 404, 'not_found'],
  ['manage: limit=0', () => manage('GET', '/applications?limit=0'), 400, 'invalid_request'],
  ['manage: limit=101', () => manage('GET', '/audit-events?limit=101'), 400, 'invalid_request'],
  ['manage: a cursor that is not ours', () => manage('GET', `/grants?cursor=${cursor({ after: -1 })}`), 400, 'invalid_request'],
  ['manage: a cursor past 2^53', () => manage('GET', `/members?cursor=${cursor({ after: 2 ** 60 })}`), 400, 'invalid_request'],
  ['manage: 70 kB body', () => manage('PATCH', `/applications/${mgmt.publicApp.client_id}`, { name: 'n'.repeat(70_000) }), 413, 'request_too_large'],
  ['manage: a data-only token', () => manage('POST', '/members', { email: ownerEmail, role: 'member' }, { authorization: `Bearer ${dataOnly}` }), 403, 'insufficient_scope'],
];

describe(`a battery of ${ROWS.length} malformed requests on ${BACKEND} (R-7)`, () => {
  it('has at least 60 rows', () => expect(ROWS.length).toBeGreaterThanOrEqual(60));

  it.each(ROWS)('%s → %i', async (_name, request, status, error) => {
    const res = await app.inject(request());
    expect(res.statusCode, res.body.slice(0, 300)).toBe(status);
    if (error !== undefined) expect(res.json().error).toBe(error);
  });
});
