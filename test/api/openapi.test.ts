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
      'GET /api/v1/{organization_id}/activity': ['audit.read'],
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
      'GET /api/v1/{organization_id}/directories': ['directory.read'],
      'POST /api/v1/{organization_id}/directories': ['directory.write'],
      'GET /api/v1/{organization_id}/directories/{id}': ['directory.read'],
      'PATCH /api/v1/{organization_id}/directories/{id}': ['directory.write'],
      'DELETE /api/v1/{organization_id}/directories/{id}': ['directory.write'],
      'POST /api/v1/{organization_id}/directories/{id}/rotate-token': ['directory.write'],
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
      'webhooks.read', 'webhooks.write', 'directory.read', 'directory.write',
    ]);
  });
});

describe('GET /docs', () => {
  it('is our own API reference: every operation of the document with its scope, the page headers, nothing from other origins', async () => {
    const res = await app.inject('/docs');
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toBe('text/html; charset=utf-8');
    const csp = String(res.headers['content-security-policy']);
    expect(csp).toContain("default-src 'self'");
    expect(csp).toContain("frame-ancestors 'none'");
    expect(csp).toContain("script-src 'self'");
    expect(res.headers['x-frame-options']).toBe('DENY');
    expect(res.headers['cache-control']).toBe('no-store');
    // No Swagger UI, no script at all, and every link or resource on this origin.
    expect(res.body).not.toMatch(/swagger-ui/i);
    expect(res.body).not.toMatch(/<script/i);
    expect(res.body).not.toMatch(/(src|href|action)="(https?:)?\/\//);
    expect(res.body).toContain('<link rel="stylesheet" href="/assets/style.css">');
    expect(res.body).toContain('<a href="/openapi.json">');
    expect(res.body).toContain('<main class="wide">');

    const doc = (await app.inject('/openapi.json')).json() as { paths: Record<string, Record<string, Operation & { summary: string }>> };
    const operations = Object.entries(doc.paths).flatMap(([path, ops]) => Object.entries(ops).map(([method, op]) => ({ method: method.toUpperCase(), path, op })));
    expect(operations.length).toBeGreaterThan(50);
    // The page split into its operations (one <article> each, in the document's order).
    const articles = res.body.split('<article class="operation"').slice(1);
    expect(articles).toHaveLength(operations.length);
    const escape = (s: string) => s.replaceAll('&', '&amp;').replaceAll("'", '&#39;').replaceAll('"', '&quot;');
    for (const { method, path, op } of operations) {
      const article = articles.find((a) => a.includes(`>${method}</span> <code class="path">${escape(path)}</code>`));
      expect(article, `${method} ${path}`).toBeDefined();
      expect(article).toContain(`>${escape(op.summary)}</h3>`);
      const scopes = op.security![0]!.oauth2;
      if (scopes.length > 0) for (const scope of scopes) expect(article).toContain(`<code>${scope}</code>`);
      else expect(article).toContain('Scope: none');
      for (const status of Object.keys(op.responses)) expect(article).toContain(`<td data-label="Status">${status}</td>`);
      expect(article).toContain('Authorization: Bearer $TOKEN');
      // Every table header says what it heads.
      expect(article).not.toMatch(/<th(?=[\s>])(?! scope="col")/);
    }
    // A request body's fields, and a path with its parameters as shell variables in the example.
    const create = articles.find((a) => a.includes('>POST</span> <code class="path">/api/v1/{organization_id}/contacts</code>'))!;
    expect(create).toContain('<td data-label="Field"><code>name</code></td><td data-label="Type">string, 1 to 200 characters</td><td data-label="Required">yes</td>');
    expect(create).toContain('-d &#39;{&quot;name&quot;:&quot;string&quot;}&#39;');
    expect(articles.find((a) => a.includes('>DELETE</span> <code class="path">/api/v1/{organization_id}/contacts/{id}</code>'))).toContain('curl -s -X DELETE &quot;http://localhost:3000/api/v1/$ORGANIZATION_ID/contacts/$ID&quot;');
  });

  it('sends /docs/ to /docs, and leaves /openapi.json without the page headers', async () => {
    const res = await app.inject('/docs/');
    expect(res.statusCode).toBe(301);
    expect(res.headers.location).toBe('/docs');
    const json = await app.inject('/openapi.json');
    expect(json.headers['content-type']).toMatch(/^application\/json/);
    expect(json.headers['content-security-policy']).toBeUndefined();
    expect(json.headers['cache-control']).toBeUndefined();
  });
});
