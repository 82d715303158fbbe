/**
 * Prometheus metrics: what the app counts (in process), and that the server serves them on
 * METRICS_PORT only (as a process).
 */
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAuthorizationCode } from '../src/oauth/models/authorization-codes.js';
import { ensureSigningKey } from '../src/oauth/models/signing-keys.js';
import { Metrics } from '../src/metrics.js';
import { buildApp } from '../src/app.js';
import { createLogger } from '../src/logger.js';
import { testConfig, TEST_SECRET_KEY } from './helpers/app.js';
import { BACKEND, createTestDatabase, TEST_DATABASE_URL } from './helpers/db.js';
import { basic, clientCredentialsToken, createOrgFixture, form, type OrgFixture, revokeToken } from './helpers/oauth.js';
import { freePort, SERVER, start } from './helpers/process.js';

/** The value of one sample of the exposition text, e.g. value(text, 'x_total{a="b"}'). */
function value(text: string, sample: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${sample} `));
  return line === undefined ? undefined : Number(line.slice(sample.length + 1));
}

describe(`metrics counted by the app on ${BACKEND}`, () => {
  let t: Awaited<ReturnType<typeof createTestDatabase>>;
  let app: FastifyInstance;
  let org: OrgFixture;
  const metrics = new Metrics();
  beforeAll(async () => {
    t = await createTestDatabase();
    await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
    const config = testConfig();
    app = await buildApp(config, { db: t.handle.db, logger: createLogger(config), metrics });
    org = await createOrgFixture(t.handle.db);
  });
  afterAll(async () => {
    await app.close();
    await t.close();
  });

  const post = (fields: Record<string, string>) =>
    app.inject({
      method: 'POST',
      url: '/oauth/token',
      headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(org.publicApp.client_id, org.publicApp.client_secret) },
      payload: form(fields),
    });

  it('counts requests by route pattern and status, tokens by grant type, revocations by reason, refresh token reuse', async () => {
    const token = await clientCredentialsToken(app, org);
    await clientCredentialsToken(app, org);
    expect((await app.inject({ url: `/api/v1/${org.organizationId}/contacts`, headers: { authorization: `Bearer ${token}` } })).statusCode).toBe(200);
    expect((await app.inject({ url: `/api/v1/${org.organizationId}/contacts`, headers: { authorization: 'Bearer nope' } })).statusCode).toBe(401);
    expect(await revokeToken(app, org, token)).toBe(200);

    const application = await t.handle.db.selectFrom('applications').select('id').where('client_id', '=', org.publicApp.client_id).executeTakeFirstOrThrow();
    const code = await createAuthorizationCode(t.handle.db, {
      organizationId: org.organizationId,
      applicationId: application.id,
      userId: org.ownerId,
      redirectUri: 'https://client.example.com/cb',
      scopes: ['contacts.read'],
      codeChallenge: null,
      ttlSeconds: 60,
    });
    const first = (await post({ grant_type: 'authorization_code', code, redirect_uri: 'https://client.example.com/cb' })).json();
    expect((await post({ grant_type: 'refresh_token', refresh_token: first.refresh_token })).statusCode).toBe(200);
    // Presented again at once: refused, within the grace period; after it: the grant is revoked.
    expect((await post({ grant_type: 'refresh_token', refresh_token: first.refresh_token })).statusCode).toBe(400);
    await t.handle.db.updateTable('refresh_tokens').set({ rotated_at: new Date(Date.now() - 60_000) }).where('rotated_at', 'is not', null).execute();
    expect((await post({ grant_type: 'refresh_token', refresh_token: first.refresh_token })).statusCode).toBe(400);

    const text = await metrics.registry.metrics();
    expect(value(text, 'orgauth_tokens_issued_total{grant_type="client_credentials"}')).toBe(2);
    expect(value(text, 'orgauth_tokens_issued_total{grant_type="authorization_code"}')).toBe(1);
    expect(value(text, 'orgauth_tokens_issued_total{grant_type="refresh_token"}')).toBe(1);
    expect(value(text, 'orgauth_revocations_total{kind="access_token",reason="revoked_by_client"}')).toBe(1);
    expect(value(text, 'orgauth_revocations_total{kind="grant",reason="refresh_token_reuse"}')).toBe(1);
    expect(value(text, 'orgauth_refresh_token_reuse_total{outcome="refused"}')).toBe(1);
    expect(value(text, 'orgauth_refresh_token_reuse_total{outcome="grant_revoked"}')).toBe(1);
    // The route's pattern, never the path with its ids.
    expect(value(text, 'orgauth_http_request_duration_seconds_count{method="GET",route="/api/v1/:organization_id/contacts",status="200"}')).toBe(1);
    expect(value(text, 'orgauth_http_request_duration_seconds_count{method="GET",route="/api/v1/:organization_id/contacts",status="401"}')).toBe(1);
    expect(value(text, 'orgauth_http_request_duration_seconds_count{method="POST",route="/oauth/token",status="200"}')).toBe(4);
    expect(value(text, 'orgauth_http_request_duration_seconds_count{method="POST",route="/oauth/token",status="400"}')).toBe(2);
    expect(text).not.toContain(`/api/v1/${org.organizationId}/`);
    expect(text).toContain('orgauth_http_request_duration_seconds_bucket{le="0.005",method="GET",route="/api/v1/:organization_id/contacts",status="200"}');
  });
});

describe('the metrics port', () => {
  it('serves Prometheus text on METRICS_PORT only, with the pool gauges on PostgreSQL', async () => {
    // A migrated copy, closed here for the server to open (the embedded database opens in one process).
    const database = await createTestDatabase({ onDisk: true });
    await database.handle.close();
    const [port, metricsPort] = [await freePort(), await freePort()];
    const server = start(SERVER, [], { ...database.env, PORT: String(port), METRICS_PORT: String(metricsPort), LOG_LEVEL: 'info' });
    try {
      await server.waitForOutput(/orgauth is ready/);
      expect((await fetch(`http://127.0.0.1:${port}/healthz`)).status).toBe(200);
      // Never on the public port.
      expect((await fetch(`http://127.0.0.1:${port}/metrics`)).status).toBe(404);
      const res = await fetch(`http://127.0.0.1:${metricsPort}/metrics`);
      expect(res.status).toBe(200);
      expect(res.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
      const text = await res.text();
      expect(value(text, 'orgauth_http_request_duration_seconds_count{method="GET",route="/healthz",status="200"}')).toBe(1);
      expect(text).toContain('# TYPE orgauth_process_cpu_seconds_total counter');
      if (TEST_DATABASE_URL) {
        for (const gauge of ['orgauth_db_pool_connections_in_use', 'orgauth_db_pool_connections_idle', 'orgauth_db_pool_requests_waiting']) {
          expect(value(text, gauge)).toBeGreaterThanOrEqual(0);
        }
      }
      expect((await fetch(`http://127.0.0.1:${metricsPort}/`)).status).toBe(404);
    } finally {
      server.child.kill('SIGTERM');
      await server.exited;
      await database.close();
    }
  });
});
