/**
 * The bad-input battery for POST /oauth/register (RFC 7591), on both databases: bad redirect
 * URIs answer invalid_redirect_uri; bad grant types, response types, auth methods, names, scopes
 * and wrongly typed fields invalid_client_metadata; a body that is not JSON (or not JSON at all)
 * invalid_request; a body over 16 KiB 413 request_too_large. Never a 5xx, never a row. Then a
 * property: any JSON object, with the registration's fields set to any JSON value, answers 201 or
 * one of the two RFC 7591 errors (FUZZ_RUNS cases, FUZZ_SEED to replay).
 */
import fc from 'fast-check';
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { DB } from '../../src/db/connect.js';
import { buildTestApp } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { SAFE_DESCRIPTION } from '../helpers/oauth.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let db: DB;
let app: FastifyInstance;

const NUM_RUNS = Math.min(Number(process.env.FUZZ_RUNS ?? 200), 1000);
const SEED = process.env.FUZZ_SEED !== undefined ? Number(process.env.FUZZ_SEED) : (Date.now() ^ (Math.random() * 0x7fffffff)) | 0;

beforeAll(async () => {
  t = await createTestDatabase();
  db = t.handle.db;
  // The per-address limit would turn the battery's later rows into 429s; it has tests of its own.
  app = await buildTestApp(db, { env: { CLIENT_REGISTRATION_RATE_LIMIT: '0' } });
});
afterAll(async () => {
  await app.close();
  await t.close();
});

const GOOD_URI = 'https://client.example.com/cb';
const GOOD = { redirect_uris: [GOOD_URI], token_endpoint_auth_method: 'none', client_name: 'Battery' };
/** A public P-256 key (RFC 7517 appendix A.1), for private_key_jwt registrations. */
const EC_KEY = { kty: 'EC', crv: 'P-256', x: 'MKBCTNIcKUSDii11ySs3526iDZ8AiTo7Tu6KPAqv7D4', y: '4Etl6SRW2YiLUrN5vfvVHuhp7x8PxltmWWlbbM4IFyM', use: 'sig' };

/** contentType null: no Content-Type header. */
function post(payload: string | Buffer, contentType: string | null = 'application/json'): Promise<LightMyRequestResponse> {
  return app.inject({ method: 'POST', url: '/oauth/register', headers: contentType === null ? {} : { 'content-type': contentType }, payload });
}

const registrations = async () =>
  Number((await db.selectFrom('applications').select((eb) => eb.fn.countAll<number>().as('n')).where('registration', '=', 'dynamic').executeTakeFirstOrThrow()).n);

async function expectRefused(res: LightMyRequestResponse, status: number, error: string, before: number): Promise<void> {
  expect({ status: res.statusCode, body: res.json() }).toEqual({ status, body: { error, error_description: expect.stringMatching(SAFE_DESCRIPTION) } });
  expect(res.headers['cache-control']).toBe('no-store');
  expect(await registrations()).toBe(before);
}

function hasNull(value: unknown): boolean {
  return value === null || (typeof value === 'object' && Object.values(value as object).some(hasNull));
}

const withUris = (...uris: unknown[]) => ({ ...GOOD, redirect_uris: uris });
const LONG_PATH = `https://client.example.com/${'a'.repeat(2000)}`;

const BAD_REDIRECT_URIS: [string, unknown][] = [
  ['http on a host that is not loopback', withUris('http://client.example.com/cb')],
  ['http on a host that starts like a loopback one', withUris('http://127.0.0.1.nip.io/cb')],
  ['http on a subdomain of localhost-like name', withUris('http://localhost.evil.example/cb')],
  ['a fragment', withUris('https://client.example.com/cb#frag')],
  ['an empty fragment', withUris('https://client.example.com/cb#')],
  ['a wildcard host', withUris('https://*.example.com/cb')],
  ['a wildcard path', withUris('https://client.example.com/*')],
  ['javascript:', withUris('javascript:alert(1)')],
  ['JavaScript: in capitals', withUris('JAVASCRIPT:alert(1)//')],
  ['data:', withUris('data:text/html,<script>alert(1)</script>')],
  ['a custom scheme', withUris('com.example.app:/oauth2redirect')],
  ['a custom scheme with authority', withUris('myapp://callback')],
  ['file:', withUris('file:///etc/passwd')],
  ['ftp:', withUris('ftp://client.example.com/cb')],
  ['a relative reference', withUris('/oauth/callback')],
  ['no scheme', withUris('client.example.com/cb')],
  ['user info', withUris('https://user:pass@client.example.com/cb')],
  ['a user name', withUris('https://user@client.example.com/cb')],
  ['over 2000 characters', withUris(LONG_PATH)],
  ['21 of them', withUris(...Array.from({ length: 21 }, (_, i) => `https://client.example.com/cb${i}`))],
  ['an empty string', withUris('')],
  ['a NUL character', withUris(`${GOOD_URI}\u0000`)],
  ['a lone surrogate', withUris(`${GOOD_URI}\ud800`)],
  ['a space', withUris('https://client.example.com/a b')],
  ['a line break', withUris('https://client.example.com/cb\r\nSet-Cookie: x=1')],
  ['one good and one bad', withUris(GOOD_URI, 'http://evil.example/cb')],
  ['none for the authorization_code grant', withUris()],
  ['none at all (authorization_code is the default grant)', { token_endpoint_auth_method: 'none' }],
  ['a string instead of a list', { ...GOOD, redirect_uris: GOOD_URI }],
  ['a number in the list', withUris(42)],
  ['a nested list', withUris([GOOD_URI])],
  ['an object', { ...GOOD, redirect_uris: { 0: GOOD_URI } }],
  ['true', { ...GOOD, redirect_uris: true }],
];

const DEVICE = 'urn:ietf:params:oauth:grant-type:device_code';
const BAD_METADATA: [string, unknown][] = [
  ['grant type client_credentials', { ...GOOD, grant_types: ['client_credentials'] }],
  ['grant type implicit', { ...GOOD, grant_types: ['implicit'] }],
  ['grant type password', { ...GOOD, grant_types: ['password'] }],
  ['a good and a bad grant type', { ...GOOD, grant_types: ['authorization_code', 'client_credentials'] }],
  ['grant type jwt-bearer', { ...GOOD, grant_types: ['urn:ietf:params:oauth:grant-type:jwt-bearer'] }],
  ['grant type token-exchange', { ...GOOD, grant_types: ['urn:ietf:params:oauth:grant-type:token-exchange'] }],
  ['grant type in capitals', { ...GOOD, grant_types: ['AUTHORIZATION_CODE'] }],
  ['refresh_token alone', { ...GOOD, grant_types: ['refresh_token'] }],
  ['no grant type', { ...GOOD, grant_types: [] }],
  ['grant_types a string', { ...GOOD, grant_types: 'authorization_code' }],
  ['grant_types holding a number', { ...GOOD, grant_types: [1] }],
  ['11 grant types', { ...GOOD, grant_types: Array(11).fill('authorization_code') }],
  ['response type token', { ...GOOD, response_types: ['token'] }],
  ['response type code id_token', { ...GOOD, response_types: ['code id_token'] }],
  ['response types code and token', { ...GOOD, response_types: ['code', 'token'] }],
  ['no response type with authorization_code', { ...GOOD, response_types: [] }],
  ['response type code without authorization_code', { token_endpoint_auth_method: 'none', grant_types: [DEVICE], response_types: ['code'] }],
  ['redirect URIs without authorization_code', { ...GOOD, grant_types: [DEVICE] }],
  ['response_types a string', { ...GOOD, response_types: 'code' }],
  ['private_key_jwt without keys', { ...GOOD, token_endpoint_auth_method: 'private_key_jwt' }],
  ['private_key_jwt with jwks_uri instead of jwks (a self-registered client gives its keys inline)', { ...GOOD, token_endpoint_auth_method: 'private_key_jwt', jwks_uri: 'https://client.example.com/jwks' }],
  ['private_key_jwt with both jwks and jwks_uri', { ...GOOD, token_endpoint_auth_method: 'private_key_jwt', jwks: { keys: [EC_KEY] }, jwks_uri: 'https://client.example.com/jwks' }],
  ['jwks_uri with another method', { ...GOOD, token_endpoint_auth_method: 'client_secret_basic', jwks_uri: 'https://client.example.com/jwks' }],
  ['jwks holding a private key', { ...GOOD, token_endpoint_auth_method: 'private_key_jwt', jwks: { keys: [{ ...EC_KEY, d: '870MB6gfuTJ4HtUnUvYMyJpr5eUZNP4Bk43bVdj3eAE' }] } }],
  ['jwks holding a symmetric key', { ...GOOD, token_endpoint_auth_method: 'private_key_jwt', jwks: { keys: [{ kty: 'oct', k: 'c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0' }] } }],
  ['jwks with no keys', { ...GOOD, token_endpoint_auth_method: 'private_key_jwt', jwks: { keys: [] } }],
  ['jwks a list', { ...GOOD, token_endpoint_auth_method: 'private_key_jwt', jwks: [EC_KEY] }],
  ['jwks a string', { ...GOOD, token_endpoint_auth_method: 'private_key_jwt', jwks: JSON.stringify({ keys: [EC_KEY] }) }],
  ['jwks_uri a number', { ...GOOD, token_endpoint_auth_method: 'private_key_jwt', jwks: { keys: [EC_KEY] }, jwks_uri: 1 }],
  ['dpop_bound_access_tokens a string', { ...GOOD, dpop_bound_access_tokens: 'true' }],
  ['require_pushed_authorization_requests a number', { ...GOOD, require_pushed_authorization_requests: 1 }],
  ['id_token_signed_response_alg none', { ...GOOD, id_token_signed_response_alg: 'none' }],
  ['id_token_signed_response_alg HS256', { ...GOOD, id_token_signed_response_alg: 'HS256' }],
  ['id_token_signed_response_alg in lower case', { ...GOOD, id_token_signed_response_alg: 'rs256' }],
  ['auth method client_secret_jwt', { ...GOOD, token_endpoint_auth_method: 'client_secret_jwt' }],
  ['auth method tls_client_auth', { ...GOOD, token_endpoint_auth_method: 'tls_client_auth' }],
  ['auth method self_signed_tls_client_auth', { ...GOOD, token_endpoint_auth_method: 'self_signed_tls_client_auth' }],
  ['auth method in capitals', { ...GOOD, token_endpoint_auth_method: 'NONE' }],
  ['auth method empty', { ...GOOD, token_endpoint_auth_method: '' }],
  ['auth method a number', { ...GOOD, token_endpoint_auth_method: 0 }],
  ['auth method a list', { ...GOOD, token_endpoint_auth_method: ['none'] }],
  ['auth method true', { ...GOOD, token_endpoint_auth_method: true }],
  ['client_name of 201 characters', { ...GOOD, client_name: 'n'.repeat(201) }],
  ['client_name of 10000 characters', { ...GOOD, client_name: 'n'.repeat(10_000) }],
  ['client_name a number', { ...GOOD, client_name: 7 }],
  ['client_name an object', { ...GOOD, client_name: { en: 'x' } }],
  ['client_name a list', { ...GOOD, client_name: ['x'] }],
  ['client_name false', { ...GOOD, client_name: false }],
  ['client_name with NUL', { ...GOOD, client_name: 'a\u0000b' }],
  ['client_name with a line break', { ...GOOD, client_name: 'a\nb' }],
  ['client_name with a lone surrogate', { ...GOOD, client_name: 'a\udc00' }],
  ['a management scope', { ...GOOD, scope: 'members.write' }],
  ['a management scope beside data scopes', { ...GOOD, scope: 'contacts.read applications.read' }],
  ['every management scope', { ...GOOD, scope: 'applications.read applications.write members.read members.write grants.read grants.write audit.read sso.read sso.write webhooks.read webhooks.write' }],
  ['an unknown scope', { ...GOOD, scope: 'contacts.read admin' }],
  ['a scope named __proto__', { ...GOOD, scope: '__proto__' }],
  ['scope a list', { ...GOOD, scope: ['contacts.read'] }],
  ['scope a number', { ...GOOD, scope: 5 }],
  ['scope over 1000 characters', { ...GOOD, scope: 'contacts.read '.repeat(80) }],
  ['scope with NUL', { ...GOOD, scope: 'contacts.read\u0000' }],
];

const NOT_AN_OBJECT: [string, string][] = [
  ['a JSON array', JSON.stringify([GOOD])],
  ['a JSON string', JSON.stringify('client')],
  ['a JSON number', '42'],
  ['JSON null', 'null'],
  ['JSON true', 'true'],
  ['a number too large for a double', '1e400'],
];

const NOT_JSON: [string, string | Buffer, string | null][] = [
  ['text that is not JSON', 'client_name=x', 'application/json'],
  ['truncated JSON', '{"redirect_uris": ["https://client.example.com/cb"', 'application/json'],
  ['JSON with a trailing comma', '{"client_name": "x",}', 'application/json'],
  ['an empty body', '', 'application/json'],
  ['JSON sent as a form', JSON.stringify(GOOD), 'application/x-www-form-urlencoded'],
  ['JSON sent as text/plain', JSON.stringify(GOOD), 'text/plain'],
  ['JSON sent as application/jsonp', JSON.stringify(GOOD), 'application/jsonp'],
  ['JSON without a Content-Type', JSON.stringify(GOOD), null],
  ['a malformed Content-Type', JSON.stringify(GOOD), 'a/b/c'],
  ['an empty Content-Type', JSON.stringify(GOOD), ''],
  ['a UTF-16 body', Buffer.from(`\ufeff${JSON.stringify(GOOD)}`, 'utf16le'), 'application/json; charset=utf-16'],
];

describe(`POST /oauth/register bad input on ${BACKEND}`, () => {
  it.each(BAD_REDIRECT_URIS)('redirect_uris: %s → 400 invalid_redirect_uri', async (_what, body) => {
    const before = await registrations();
    await expectRefused(await post(JSON.stringify(body)), 400, 'invalid_redirect_uri', before);
  });

  it.each(BAD_METADATA)('%s → 400 invalid_client_metadata', async (_what, body) => {
    const before = await registrations();
    await expectRefused(await post(JSON.stringify(body)), 400, 'invalid_client_metadata', before);
  });

  it.each(NOT_AN_OBJECT)('a body that is %s → 400 invalid_client_metadata', async (_what, payload) => {
    const before = await registrations();
    await expectRefused(await post(payload), 400, 'invalid_client_metadata', before);
  });

  it.each(NOT_JSON)('%s → 400 invalid_request', async (_what, payload, contentType) => {
    const before = await registrations();
    await expectRefused(await post(payload, contentType), 400, 'invalid_request', before);
  });

  it('a body over 16 KiB → 413 request_too_large (an unknown field of padding counts too); over the server-wide 64 KiB the same', async () => {
    const before = await registrations();
    const padded = (bytes: number) => {
      const base = JSON.stringify({ ...GOOD, padding: '' });
      return JSON.stringify({ ...GOOD, padding: 'x'.repeat(bytes - base.length) });
    };
    expect(Buffer.byteLength(padded(16 * 1024))).toBe(16 * 1024);
    expect((await post(padded(16 * 1024))).statusCode).toBe(201);
    await expectRefused(await post(padded(16 * 1024 + 1)), 413, 'request_too_large', before + 1);
    await expectRefused(await post(padded(70 * 1024)), 413, 'request_too_large', before + 1);
  });

  it('deeply nested JSON → 400, not a stack overflow', async () => {
    const before = await registrations();
    const depth = 7000;
    const nested = `{"redirect_uris": ${'['.repeat(depth)}${']'.repeat(depth)}, "token_endpoint_auth_method": "none"}`;
    expect(nested.length).toBeLessThan(16 * 1024);
    await expectRefused(await post(nested), 400, 'invalid_redirect_uri', before);
    await expectRefused(await post(`${'['.repeat(depth)}${']'.repeat(depth)}`), 400, 'invalid_client_metadata', before);
  });

  it('a key repeated in the JSON: the last one counts', async () => {
    const before = await registrations();
    const raw = `{"redirect_uris": ["${GOOD_URI}"], "token_endpoint_auth_method": "none", "token_endpoint_auth_method": "private_key_jwt"}`;
    await expectRefused(await post(raw), 400, 'invalid_client_metadata', before);
  });

  it('prototype-polluting keys and fields the client may not set are ignored: 201, nothing polluted, nothing echoed', async () => {
    const raw = `{"__proto__": {"polluted": true, "organization_id": 1}, "constructor": {"prototype": {"polluted": true}},
      "redirect_uris": ["${GOOD_URI}"], "token_endpoint_auth_method": "none",
      "client_id": "${'a'.repeat(32)}", "client_secret": "chosen", "registration_access_token": "chosen",
      "organization_id": 1, "type": "private", "scopes": ["members.write"], "require_pkce": false, "client_id_issued_at": 1e308, "fapi2": true}`;
    const res = await post(raw);
    expect(res.statusCode, res.body).toBe(201);
    const body = res.json();
    expect(Object.keys(body).sort()).toEqual(
      [
        'client_id', 'client_id_issued_at', 'client_name', 'grant_types', 'redirect_uris', 'registration_access_token', 'registration_client_uri', 'response_types', 'scope', 'token_endpoint_auth_method',
        'dpop_bound_access_tokens', 'require_pushed_authorization_requests', 'id_token_signed_response_alg',
      ].sort(),
    );
    expect(body.client_id).not.toBe('a'.repeat(32));
    expect(body.registration_access_token).not.toBe('chosen');
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
    expect(Object.prototype).not.toHaveProperty('polluted');
    const row = await db.selectFrom('applications').selectAll().where('client_id', '=', body.client_id).executeTakeFirstOrThrow();
    expect(row).toMatchObject({ organization_id: null, type: 'public', require_pkce: true, fapi2: false, scopes: ['contacts.read', 'contacts.write', 'tasks.read', 'tasks.write'] });
  });

  it('invalid UTF-8 in the body is read as U+FFFD, not a 5xx', async () => {
    const json = Buffer.from(JSON.stringify({ ...GOOD, client_name: 'ab' }));
    const at = json.indexOf('ab');
    json[at] = 0xff;
    json[at + 1] = 0xfe;
    const res = await post(json);
    expect(res.statusCode, res.body).toBe(201);
    expect(res.json().client_name).toBe('\ufffd\ufffd');
  });

  it('property: any JSON object over the registration fields answers 201 or an RFC 7591 error, never anything else', async () => {
    console.log(`registration property: ${NUM_RUNS} runs, seed ${SEED} (replay with FUZZ_SEED=${SEED}) on ${BACKEND}`);
    const goodUri = fc.constantFrom(GOOD_URI, 'http://127.0.0.1:8080/cb', 'http://[::1]/cb', 'http://localhost/cb', 'https://a.example/cb?x=1');
    const anyUri = fc.oneof(goodUri, fc.webUrl({ withFragments: true, withQueryParameters: true }), fc.string(), fc.constantFrom('javascript:x', 'data:,x', 'app:/cb', 'https://*.a.example/cb'));
    // Each field: mostly something a client would send, sometimes something wrong, sometimes any JSON at all.
    const field = (plausible: fc.Arbitrary<unknown>, wrong: fc.Arbitrary<unknown>) =>
      fc.oneof({ weight: 6, arbitrary: plausible }, { weight: 1, arbitrary: wrong }, { weight: 1, arbitrary: fc.jsonValue({ maxDepth: 3 }) });
    const fields = fc.record(
      {
        redirect_uris: field(fc.array(goodUri, { minLength: 1, maxLength: 3 }), fc.array(anyUri, { maxLength: 22 })),
        grant_types: field(fc.constantFrom(['authorization_code'], ['authorization_code', 'refresh_token']), fc.subarray(['authorization_code', 'refresh_token', DEVICE, 'client_credentials', 'implicit'])),
        response_types: field(fc.constant(['code']), fc.constantFrom([], ['token'], 'code')),
        token_endpoint_auth_method: field(fc.constantFrom('none', 'client_secret_basic', 'client_secret_post'), fc.constantFrom('private_key_jwt', 'None', '')),
        client_name: field(fc.string({ maxLength: 40 }), fc.string({ unit: 'binary', minLength: 190, maxLength: 260 })),
        jwks: field(fc.constant({ keys: [EC_KEY] }), fc.constantFrom({ keys: [] }, { keys: [{ ...EC_KEY, d: 'x' }] }, [EC_KEY])),
        dpop_bound_access_tokens: field(fc.boolean(), fc.constantFrom('true', 1)),
        id_token_signed_response_alg: field(fc.constantFrom('RS256', 'ES256'), fc.constantFrom('none', 'HS256')),
        scope: field(fc.constantFrom('contacts.read', 'openid contacts.read tasks.write', 'offline_access'), fc.constantFrom('members.write', 'nope', 'contacts.read\u0000')),
        extra: fc.jsonValue({ maxDepth: 2 }),
      },
      { requiredKeys: [] },
    );
    const seen = new Map<string, number>();
    await fc.assert(
      fc.asyncProperty(fields, async (body) => {
        const res = await post(JSON.stringify(body));
        const outcome = res.statusCode === 201 ? '201' : String(res.json().error);
        seen.set(outcome, (seen.get(outcome) ?? 0) + 1);
        if (res.statusCode === 201) {
          const registered = res.json();
          expect(registered.client_id).toMatch(/^[0-9a-f]{32}$/);
          expect(hasNull(registered)).toBe(false);
          return;
        }
        expect(res.statusCode, res.body).toBe(400);
        expect(['invalid_redirect_uri', 'invalid_client_metadata']).toContain(res.json().error);
        expect(res.json().error_description).toMatch(SAFE_DESCRIPTION);
      }),
      { numRuns: NUM_RUNS, seed: SEED },
    );
    console.log('registration property outcomes:', Object.fromEntries(seen));
    // The property exercised both sides.
    if (NUM_RUNS >= 100) expect([...seen.keys()].sort()).toEqual(['201', 'invalid_client_metadata', 'invalid_redirect_uri']);
  });
});
