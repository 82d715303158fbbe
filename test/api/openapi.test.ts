import { Validator } from '@seriousme/openapi-schema-validator';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildTestApp } from '../helpers/app.js';
import { createTestDatabase } from '../helpers/db.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
beforeAll(async () => {
  t = await createTestDatabase();
  app = await buildTestApp(t.handle.db);
});
afterAll(async () => {
  await app.close();
  await t.close();
});

type Operation = { security?: { oauth2: string[] }[]; responses: Record<string, unknown> };

describe('GET /openapi.json', () => {
  it('is a valid OpenAPI 3.1 document', async () => {
    const res = await app.inject('/openapi.json');
    expect(res.statusCode).toBe(200);
    const doc = res.json();
    expect(doc.openapi).toBe('3.1.0');
    const result = await new Validator().validate(doc);
    expect(result.errors ?? []).toEqual([]);
    expect(result.valid).toBe(true);
  });

  it('lists every API route with the scope it needs, and nothing else', async () => {
    const doc = (await app.inject('/openapi.json')).json() as { paths: Record<string, Record<string, Operation>>; components: { securitySchemes: Record<string, unknown> } };
    const scopes = Object.fromEntries(
      Object.entries(doc.paths).flatMap(([path, ops]) => Object.entries(ops).map(([method, op]) => [`${method.toUpperCase()} ${path}`, op.security?.[0]?.oauth2])),
    );
    expect(scopes).toEqual({
      'GET /api/v1/{organization_id}/': [],
      'PATCH /api/v1/{organization_id}/': ['members.write'],
      'GET /api/v1/{organization_id}/contacts': ['contacts.read'],
      'POST /api/v1/{organization_id}/contacts': ['contacts.write'],
      'GET /api/v1/{organization_id}/contacts/{id}': ['contacts.read'],
      'PATCH /api/v1/{organization_id}/contacts/{id}': ['contacts.write'],
      'DELETE /api/v1/{organization_id}/contacts/{id}': ['contacts.write'],
      'GET /api/v1/{organization_id}/tasks': ['tasks.read'],
      'POST /api/v1/{organization_id}/tasks': ['tasks.write'],
      'GET /api/v1/{organization_id}/tasks/{id}': ['tasks.read'],
      'PATCH /api/v1/{organization_id}/tasks/{id}': ['tasks.write'],
      'DELETE /api/v1/{organization_id}/tasks/{id}': ['tasks.write'],
      'GET /api/v1/{organization_id}/applications': ['applications.read'],
      'POST /api/v1/{organization_id}/applications': ['applications.write'],
      'GET /api/v1/{organization_id}/applications/{client_id}': ['applications.read'],
      'PATCH /api/v1/{organization_id}/applications/{client_id}': ['applications.write'],
      'DELETE /api/v1/{organization_id}/applications/{client_id}': ['applications.write'],
      'POST /api/v1/{organization_id}/applications/{client_id}/secret': ['applications.write'],
      'GET /api/v1/{organization_id}/members': ['members.read'],
      'POST /api/v1/{organization_id}/members': ['members.write'],
      'GET /api/v1/{organization_id}/members/{user_id}': ['members.read'],
      'PATCH /api/v1/{organization_id}/members/{user_id}': ['members.write'],
      'DELETE /api/v1/{organization_id}/members/{user_id}': ['members.write'],
      'GET /api/v1/{organization_id}/roles': ['members.read'],
      'POST /api/v1/{organization_id}/roles': ['members.write'],
      'GET /api/v1/{organization_id}/roles/{role}': ['members.read'],
      'PATCH /api/v1/{organization_id}/roles/{role}': ['members.write'],
      'DELETE /api/v1/{organization_id}/roles/{role}': ['members.write'],
      'GET /api/v1/{organization_id}/invitations': ['members.read'],
      'POST /api/v1/{organization_id}/invitations': ['members.write'],
      'GET /api/v1/{organization_id}/invitations/{id}': ['members.read'],
      'POST /api/v1/{organization_id}/invitations/{id}/resend': ['members.write'],
      'DELETE /api/v1/{organization_id}/invitations/{id}': ['members.write'],
      'GET /api/v1/{organization_id}/grants': ['grants.read'],
      'GET /api/v1/{organization_id}/grants/{id}': ['grants.read'],
      'DELETE /api/v1/{organization_id}/grants/{id}': ['grants.write'],
      'GET /api/v1/{organization_id}/audit-events': ['audit.read'],
      'GET /api/v1/{organization_id}/sso-connections': ['sso.read'],
      'POST /api/v1/{organization_id}/sso-connections': ['sso.write'],
      'GET /api/v1/{organization_id}/sso-connections/{id}': ['sso.read'],
      'PATCH /api/v1/{organization_id}/sso-connections/{id}': ['sso.write'],
      'DELETE /api/v1/{organization_id}/sso-connections/{id}': ['sso.write'],
      'GET /api/v1/{organization_id}/domains': ['sso.read'],
      'POST /api/v1/{organization_id}/domains': ['sso.write'],
      'GET /api/v1/{organization_id}/domains/{domain}': ['sso.read'],
      'POST /api/v1/{organization_id}/domains/{domain}/verify': ['sso.write'],
      'PATCH /api/v1/{organization_id}/domains/{domain}': ['sso.write'],
      'DELETE /api/v1/{organization_id}/domains/{domain}': ['sso.write'],
      'GET /api/v1/{organization_id}/webhooks': ['webhooks.read'],
      'POST /api/v1/{organization_id}/webhooks': ['webhooks.write'],
      'GET /api/v1/{organization_id}/webhooks/{id}': ['webhooks.read'],
      'PATCH /api/v1/{organization_id}/webhooks/{id}': ['webhooks.write'],
      'DELETE /api/v1/{organization_id}/webhooks/{id}': ['webhooks.write'],
      'POST /api/v1/{organization_id}/webhooks/{id}/rotate-secret': ['webhooks.write'],
      'POST /api/v1/{organization_id}/webhooks/{id}/ping': ['webhooks.write'],
      'GET /api/v1/{organization_id}/webhooks/{id}/deliveries': ['webhooks.read'],
      'GET /api/v1/{organization_id}/webhooks/{id}/deliveries/{delivery_id}': ['webhooks.read'],
      'POST /api/v1/{organization_id}/webhooks/{id}/deliveries/{delivery_id}/retry': ['webhooks.write'],
    });
    expect(doc.components.securitySchemes.oauth2).toMatchObject({ type: 'oauth2' });
  });

  it('offers public applications (authorization code) the data scopes only, and client credentials every scope (AD-1)', async () => {
    const doc = (await app.inject('/openapi.json')).json() as {
      components: { securitySchemes: { oauth2: { flows: Record<string, { scopes: Record<string, string> }> } } };
    };
    const { flows } = doc.components.securitySchemes.oauth2;
    expect(Object.keys(flows.authorizationCode!.scopes)).toEqual(['contacts.read', 'contacts.write', 'tasks.read', 'tasks.write']);
    expect(Object.keys(flows.clientCredentials!.scopes)).toEqual([
      'contacts.read', 'contacts.write', 'tasks.read', 'tasks.write',
      'applications.read', 'applications.write', 'members.read', 'members.write', 'grants.read', 'grants.write', 'audit.read', 'sso.read', 'sso.write',
      'webhooks.read', 'webhooks.write',
    ]);
  });
});

describe('GET /docs', () => {
  it('serves a browsable page that loads nothing from other origins', async () => {
    let res = await app.inject('/docs');
    if (res.statusCode === 302) res = await app.inject(String(res.headers.location));
    expect(res.statusCode).toBe(200);
    expect(res.body).toContain('swagger-ui');
    expect(res.body).not.toMatch(/(src|href)="(https?:)?\/\//);
    expect(String(res.headers['content-security-policy'])).toContain("frame-ancestors 'none'");
  });
});
