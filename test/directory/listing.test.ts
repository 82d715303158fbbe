/**
 * SCIM lists (src/directory/listing.ts): pages walked by startIndex are the pages OFFSET gives,
 * and totalResults is counted on a walk's first page and carried to the pages after it, until
 * a SCIM write through this process or TOTAL_TTL_MS ends it (the next page then counts again).
 * Through the service, a POST ends it before its answer is sent.
 */
import type { FastifyInstance } from 'fastify';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createDirectory } from '../../src/directory/directories.js';
import { directoryChanged, pageOf, TOTAL_TTL_MS } from '../../src/directory/listing.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { buildTestApp, TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { createOrgFixture } from '../helpers/oauth.js';

const DOMAIN = 'listing.example';
let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
let organizationId: number;
let seeded = 0;
const db = () => t.handle.db;

/** A directory with `n` users (every third inactive), made in SQL. */
async function directoryWith(n: number): Promise<{ id: number; token: string }> {
  const { directory, token } = await createDirectory(db(), organizationId, { name: `Listing ${seeded}` });
  await addUsers(directory.id, n);
  return { id: directory.id, token };
}

async function addUsers(directoryId: number, n: number): Promise<void> {
  await sql`with u as (
      insert into users (email, name, password_hash) select 'l' || g || ${`@${DOMAIN}`}, 'L ' || g, null from generate_series(${seeded + 1}::int, ${seeded + n}::int) g returning id, email)
    insert into directory_users (directory_id, user_id, user_name, active, resource, role)
    select ${directoryId}, id, email, id % 3 <> 0, '{}'::jsonb, 'member' from u order by id`.execute(db());
  seeded += n;
}

beforeAll(async () => {
  t = await createTestDatabase();
  await ensureSigningKey(db(), { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  app = await buildTestApp(db(), { env: { JOB_WORKERS: '0' } });
  organizationId = (await createOrgFixture(db())).organizationId;
  await db().insertInto('sso_domains').values({ organization_id: organizationId, domain: DOMAIN, state: 'verified', verification_token: 'listing', verified_at: new Date() }).execute();
});
afterAll(async () => {
  await app?.close();
  await t?.close();
});

describe(`SCIM lists on ${BACKEND}`, () => {
  it('walks by startIndex to the pages OFFSET gives, with the same total on each', async () => {
    const d = await directoryWith(25);
    for (const filter of [undefined, 'active eq true']) {
      const all = await db()
        .selectFrom('directory_users')
        .select('id')
        .where('directory_id', '=', d.id)
        .$if(filter !== undefined, (q) => q.where('active', '=', true))
        .orderBy('seq')
        .execute();
      const walked: string[] = [];
      for (let startIndex = 1; startIndex <= all.length; startIndex += 4) {
        const page = await pageOf(db(), 'directory_users', d.id, { startIndex, count: 4, filter });
        expect(page.total).toBe(all.length);
        walked.push(...page.ids);
      }
      expect(walked).toEqual(all.map((r) => r.id));
      // A page nobody walked to is read by OFFSET.
      expect((await pageOf(db(), 'directory_users', d.id, { startIndex: 3, count: 2, filter })).ids).toEqual(all.slice(2, 4).map((r) => r.id));
    }
  });

  it('carries the first page’s total until the directory changes or TOTAL_TTL_MS passes', async () => {
    const d = await directoryWith(10);
    const page = (startIndex: number) => pageOf(db(), 'directory_users', d.id, { startIndex, count: 5, filter: undefined });
    expect((await page(1)).total).toBe(10);
    // Rows added behind the service's back (no write through it): the walk keeps its total...
    await addUsers(d.id, 2);
    expect((await page(6)).total).toBe(10);
    // ...until a write through the service says the directory changed, or the total grows old.
    directoryChanged(d.id);
    expect((await page(6)).total).toBe(12);
    await addUsers(d.id, 1);
    expect((await page(1)).total).toBe(13); // a first page always counts
    await addUsers(d.id, 1);
    const now = performance.now();
    const later = vi.spyOn(performance, 'now').mockReturnValue(now + TOTAL_TTL_MS + 1);
    try {
      expect((await page(6)).total).toBe(14);
      // That page carries its new total to whoever asks for it again.
      await addUsers(d.id, 1);
      expect((await page(6)).total).toBe(14);
    } finally {
      later.mockRestore();
    }
  });

  it('a POST through the service ends the carried total before its answer', async () => {
    const d = await directoryWith(4);
    const list = async (startIndex: number) => {
      const res = await app.inject({ method: 'GET', url: `/scim/v2/${d.id}/Users?startIndex=${startIndex}&count=2`, headers: { authorization: `Bearer ${d.token}` } });
      expect(res.statusCode, res.body).toBe(200);
      return res.json().totalResults as number;
    };
    expect(await list(1)).toBe(4);
    expect(await list(3)).toBe(4);
    const created = await app.inject({
      method: 'POST',
      url: `/scim/v2/${d.id}/Users`,
      headers: { authorization: `Bearer ${d.token}`, 'content-type': 'application/scim+json' },
      payload: JSON.stringify({ schemas: ['urn:ietf:params:scim:schemas:core:2.0:User'], userName: `new@${DOMAIN}`, active: true }),
    });
    expect(created.statusCode, created.body).toBe(201);
    expect(await list(3)).toBe(5);
  });
});
