import { randomBytes } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { buildTestApp, TEST_SECRET_KEY } from '../helpers/app.js';
import { createTestDatabase } from '../helpers/db.js';
import { redisAnswers } from '../helpers/redis.js';
import { clientCredentialsToken as token, createOrgFixture, type OrgFixture } from '../helpers/oauth.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let org: OrgFixture;
let other: OrgFixture;
const apps: FastifyInstance[] = [];

const REDIS = await redisAnswers();

beforeAll(async () => {
  t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  org = await createOrgFixture(t.handle.db);
  other = await createOrgFixture(t.handle.db);
});
afterAll(async () => {
  for (const app of apps) await app.close();
  await t.close();
});

async function appWith(env: Record<string, string>): Promise<FastifyInstance> {
  const app = await buildTestApp(t.handle.db, { env });
  apps.push(app);
  return app;
}

const get = (app: FastifyInstance, fixture: OrgFixture, bearer: string) =>
  app.inject({ url: `/api/v1/${fixture.organizationId}/contacts`, headers: { authorization: `Bearer ${bearer}` } });

describe('API rate limits per application and organization', () => {
  it('answer 429 with Retry-After and RateLimit headers past API_RATE_LIMIT a minute', async () => {
    const app = await appWith({ API_RATE_LIMIT: '3' });
    const bearer = await token(app, org);
    const first = await get(app, org, bearer);
    expect(first.statusCode).toBe(200);
    expect(first.headers['ratelimit-limit']).toBe('3');
    expect(first.headers['ratelimit-remaining']).toBe('2');
    await get(app, org, bearer);
    await get(app, org, bearer);
    const limited = await get(app, org, bearer);
    expect(limited.statusCode).toBe(429);
    expect(limited.json()).toEqual({ error: 'too_many_requests', error_description: expect.stringMatching(/rate limit of 3 requests per minute/) });
    expect(Number(limited.headers['retry-after'])).toBeGreaterThan(0);
    // Another application in another organization has its own budget.
    expect((await get(app, other, await token(app, other))).statusCode).toBe(200);
  });

  it('are off with API_RATE_LIMIT=0', async () => {
    const app = await appWith({ API_RATE_LIMIT: '0' });
    const bearer = await token(app, org);
    for (let i = 0; i < 5; i++) expect((await get(app, org, bearer)).statusCode).toBe(200);
    expect((await get(app, org, bearer)).headers['ratelimit-limit']).toBeUndefined();
  });

  it.runIf(REDIS)('are shared by instances through Redis (REDIS_URL)', async () => {
    // A database number of its own per run keeps parallel runs apart.
    const db = 1 + (randomBytes(1)[0]! % 15);
    const env = { API_RATE_LIMIT: '4', REDIS_URL: `redis://127.0.0.1:6379/${db}` };
    const one = await appWith(env);
    const two = await appWith(env);
    const fresh = await createOrgFixture(t.handle.db);
    const bearer = await token(one, fresh);
    const statuses = [];
    for (const app of [one, two, one, two, one, two]) statuses.push((await get(app, fresh, bearer)).statusCode);
    expect(statuses).toEqual([200, 200, 200, 200, 429, 429]);
  });

  it.runIf(REDIS)('count from the first request even when building the app held the event loop past the Redis connect timeout', async () => {
    const db = 1 + (randomBytes(1)[0]! % 15);
    const app = await appWith({ API_RATE_LIMIT: '2', REDIS_URL: `redis://127.0.0.1:6379/${db}` });
    // As a busy host's start does (building the app, the API reference): over the 500 ms connect
    // timeout, in one synchronous stretch, before the app is ready.
    const until = Date.now() + 800;
    while (Date.now() < until);
    await app.ready();
    const fresh = await createOrgFixture(t.handle.db);
    const bearer = await token(app, fresh);
    const statuses = [];
    for (let i = 0; i < 3; i++) statuses.push((await get(app, fresh, bearer)).statusCode);
    expect(statuses).toEqual([200, 200, 429]);
  });
});
