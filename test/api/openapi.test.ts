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
    });
    expect(doc.components.securitySchemes.oauth2).toMatchObject({ type: 'oauth2' });
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
