/**
 * CORS for browser-based clients: discovery, JWKS, token, revocation and userinfo answer any
 * origin without credentials (preflights included); the pages and the API answer none.
 */
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { buildTestApp, TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { basic, createOrgFixture, form, type OrgFixture } from '../helpers/oauth.js';

const ORIGIN = 'https://spa.example';
let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
let org: OrgFixture;

beforeAll(async () => {
  t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  app = await buildTestApp(t.handle.db);
  org = await createOrgFixture(t.handle.db);
});
afterAll(async () => {
  await app.close();
  await t.close();
});

const preflight = (url: string, headers = 'authorization, content-type') =>
  app.inject({ method: 'OPTIONS', url, headers: { origin: ORIGIN, 'access-control-request-method': 'POST', 'access-control-request-headers': headers } });

describe(`CORS for browser-based clients on ${BACKEND}`, () => {
  it.each(['/.well-known/openid-configuration', '/.well-known/oauth-authorization-server', '/.well-known/jwks.json', '/.well-known/oauth-protected-resource/api/v1'])('GET %s: any origin, no credentials', async (url) => {
    const res = await app.inject({ method: 'GET', url, headers: { origin: ORIGIN } });
    expect(res.statusCode).toBe(200);
    expect(res.headers['access-control-allow-origin']).toBe('*');
    expect(res.headers['access-control-allow-credentials']).toBeUndefined();
  });

  it.each(['/oauth/token', '/oauth/register', '/oauth/device_authorization', '/oauth/revoke', '/oauth/userinfo'])('a preflight for POST %s with Authorization: 204 with the methods and headers allowed', async (url) => {
    const res = await preflight(url);
    expect(res.statusCode).toBe(204);
    expect(res.headers['access-control-allow-origin']).toBe('*');
    expect(String(res.headers['access-control-allow-methods']).split(/, */)).toEqual(['GET', 'POST']);
    expect(String(res.headers['access-control-allow-headers']).toLowerCase().split(/, */)).toEqual(['authorization', 'content-type', 'dpop', 'mcp-protocol-version']);
    expect(res.headers['access-control-max-age']).toBe('600');
    expect(res.headers['access-control-allow-credentials']).toBeUndefined();
  });

  it('the token endpoint answers a cross-origin POST readably, its refusal and WWW-Authenticate included', async () => {
    const ok = await app.inject({
      method: 'POST',
      url: '/oauth/token',
      headers: { origin: ORIGIN, 'content-type': 'application/x-www-form-urlencoded', authorization: basic(org.privateApp.client_id, org.privateApp.client_secret) },
      payload: form({ grant_type: 'client_credentials', organization_id: String(org.organizationId) }),
    });
    expect(ok.statusCode, ok.body).toBe(200);
    expect(ok.headers['access-control-allow-origin']).toBe('*');
    const refused = await app.inject({
      method: 'POST',
      url: '/oauth/token',
      headers: { origin: ORIGIN, 'content-type': 'application/x-www-form-urlencoded', authorization: basic(org.privateApp.client_id, 'wrong') },
      payload: form({ grant_type: 'client_credentials', organization_id: String(org.organizationId) }),
    });
    expect(refused.statusCode).toBe(401);
    expect(refused.headers['access-control-allow-origin']).toBe('*');
    expect(String(refused.headers['access-control-expose-headers']).split(/, */)).toContain('WWW-Authenticate');
  });

  it('the pages (session cookie) and the API answer no origin, and their preflights are 404', async () => {
    for (const url of ['/login', '/dashboard', `/api/v1/${org.organizationId}/contacts`, '/oauth/authorize']) {
      const res = await app.inject({ method: 'GET', url, headers: { origin: ORIGIN } });
      expect(res.headers['access-control-allow-origin'], url).toBeUndefined();
      const pre = await preflight(url);
      expect(pre.statusCode, url).toBe(404);
      expect(pre.headers['access-control-allow-origin'], url).toBeUndefined();
    }
  });
});
