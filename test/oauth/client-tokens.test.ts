/**
 * The tokens a private application gets for itself: one shared grant, no database work per
 * token once the application and its grant are cached, one token revocable by itself, and
 * application changes (secret rotation, disabling) honoured at once though applications are cached.
 */
import type { FastifyInstance } from 'fastify';
import type { KyselyPlugin } from 'kysely';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { DB } from '../../src/db/connect.js';
import { rotateClientSecret } from '../../src/oauth/models/applications.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { buildTestApp, TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { basic, clientCredentialsToken, createOrgFixture, form, type OrgFixture, revokeToken } from '../helpers/oauth.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
/** Two instances on one database; the first one's writes to the database are counted. */
let app: FastifyInstance;
let second: FastifyInstance;
let writes = 0;
const WRITES = new Set(['InsertQueryNode', 'UpdateQueryNode', 'DeleteQueryNode']);

beforeAll(async () => {
  t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  const counting: KyselyPlugin = {
    transformQuery: (args) => {
      if (WRITES.has(args.node.kind)) writes++;
      return args.node;
    },
    transformResult: async (args) => args.result,
  };
  app = await buildTestApp(t.handle.db.withPlugin(counting) as DB, { listen: t.handle.listen });
  second = await buildTestApp(t.handle.db, { listen: t.handle.listen });
});
afterAll(async () => {
  await app.close();
  await second.close();
  await t.close();
});

const api = (instance: FastifyInstance, fixture: OrgFixture, token: string) =>
  instance.inject({ method: 'GET', url: `/api/v1/${fixture.organizationId}/contacts`, headers: { authorization: `Bearer ${token}` } });

const claimsOf = (token: string) => JSON.parse(Buffer.from(token.split('.')[1]!, 'base64url').toString()) as { grant_id: number; jti: string };

function ccRequest(instance: FastifyInstance, fixture: OrgFixture, secret = fixture.privateApp.client_secret) {
  return instance.inject({
    method: 'POST',
    url: '/oauth/token',
    headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(fixture.privateApp.client_id, secret) },
    payload: form({ grant_type: 'client_credentials', organization_id: String(fixture.organizationId) }),
  });
}

/** Polls `check` until it holds or `ms` pass; returns whether it held in time. */
async function within(ms: number, check: () => Promise<boolean>): Promise<boolean> {
  const deadline = Date.now() + ms;
  do {
    if (await check()) return true;
    await new Promise((r) => setTimeout(r, 20));
  } while (Date.now() < deadline);
  return check();
}

describe(`client_credentials tokens on ${BACKEND}`, () => {
  it('share one grant, and issuing one writes nothing to the database', async () => {
    const org = await createOrgFixture(t.handle.db);
    const first = claimsOf(await clientCredentialsToken(app, org));
    const again = claimsOf(await clientCredentialsToken(app, org, 'contacts.read'));
    expect(again.grant_id).toBe(first.grant_id);
    expect(again.jti).not.toBe(first.jti);
    const before = writes;
    for (let i = 0; i < 50; i++) expect(claimsOf(await clientCredentialsToken(app, org)).grant_id).toBe(first.grant_id);
    // Only the grant's last_used_at, when its cached copy is read again (about once a second).
    expect(writes - before).toBeLessThanOrEqual(5);
    const grants = await t.handle.db.selectFrom('grants').select(['id', 'last_used_at']).where('application_id', '=', (eb) =>
      eb.selectFrom('applications').select('id').where('client_id', '=', org.privateApp.client_id),
    ).execute();
    expect(grants).toEqual([{ id: first.grant_id, last_used_at: expect.any(Date) }]);
  });

  it('are revoked one at a time through /oauth/revoke, on every instance, while the other tokens keep working', async () => {
    const org = await createOrgFixture(t.handle.db);
    const doomed = await clientCredentialsToken(app, org);
    const kept = await clientCredentialsToken(app, org);
    expect((await api(second, org, doomed)).statusCode).toBe(200);
    expect(await revokeToken(app, org, doomed)).toBe(200);
    expect((await api(app, org, doomed)).statusCode).toBe(401);
    expect(await within(1000, async () => (await api(second, org, doomed)).statusCode === 401)).toBe(true);
    expect((await api(app, org, kept)).statusCode).toBe(200);
    expect((await api(second, org, kept)).statusCode).toBe(200);
    const introspect = (token: string) =>
      second.inject({
        method: 'POST',
        url: '/oauth/introspect',
        headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(org.privateApp.client_id, org.privateApp.client_secret) },
        payload: form({ token }),
      });
    expect((await introspect(doomed)).json()).toEqual({ active: false });
    expect((await introspect(kept)).json()).toMatchObject({ active: true });
    // The revocation is stored until the token expires, and recorded.
    const row = await t.handle.db.selectFrom('revoked_access_tokens').selectAll().where('jti', '=', claimsOf(doomed).jti).executeTakeFirstOrThrow();
    expect(row.grant_id).toBe(claimsOf(doomed).grant_id);
    const events = await t.handle.db.selectFrom('audit_events').select('action').where('organization_id', '=', org.organizationId).where('action', '=', 'access_token.revoked').execute();
    expect(events).toHaveLength(1);
    // A new instance loads it at start.
    const third = await buildTestApp(t.handle.db);
    try {
      expect((await api(third, org, doomed)).statusCode).toBe(401);
      expect((await api(third, org, kept)).statusCode).toBe(200);
    } finally {
      await third.close();
    }
  });

  it('get a new grant once theirs is revoked, on every instance', async () => {
    const org = await createOrgFixture(t.handle.db);
    const old = await clientCredentialsToken(app, org);
    await clientCredentialsToken(second, org);
    const { grant_id } = claimsOf(old);
    await sql`update grants set revoked_at = now(), revoked_reason = 'revoked_by_user' where id = ${grant_id}`.execute(t.handle.db);
    await sql`select pg_notify('orgauth_revocations', ${String(grant_id)})`.execute(t.handle.db);
    for (const instance of [app, second]) {
      expect(await within(1000, async () => (await api(instance, org, old)).statusCode === 401)).toBe(true);
      const fresh = await clientCredentialsToken(instance, org);
      expect(claimsOf(fresh).grant_id).not.toBe(grant_id);
      expect((await api(instance, org, fresh)).statusCode).toBe(200);
    }
  });
});

describe(`cached applications on ${BACKEND}`, () => {
  it('refuse a rotated secret at once on every instance, whoever rotated it', async () => {
    const org = await createOrgFixture(t.handle.db);
    for (const instance of [app, second]) expect((await ccRequest(instance, org)).statusCode).toBe(200);
    // As `orgauth app rotate-secret` does it: straight to the database, no instance told.
    const rotated = await rotateClientSecret(t.handle.db, org.privateApp);
    for (const instance of [app, second]) {
      expect(await within(1000, async () => (await ccRequest(instance, org)).statusCode === 401)).toBe(true);
      expect((await ccRequest(instance, org, rotated.client_secret)).statusCode).toBe(200);
    }
  });

  it('refuse a disabled application within a second on every instance', async () => {
    const org = await createOrgFixture(t.handle.db);
    for (const instance of [app, second]) expect((await ccRequest(instance, org)).statusCode).toBe(200);
    await t.handle.db.updateTable('applications').set({ disabled: true }).where('client_id', '=', org.privateApp.client_id).execute();
    for (const instance of [app, second]) {
      expect(await within(1000, async () => (await ccRequest(instance, org)).statusCode === 401)).toBe(true);
    }
  });

  it('refuse the tokens of a deleted application within a second, even on an instance that hears no NOTIFY', async () => {
    const org = await createOrgFixture(t.handle.db);
    // No LISTEN: it learns of revocations only by polling, and deleting the application deletes
    // its grants, revoked or not, so there is nothing left for the poll to find.
    const deaf = await buildTestApp(t.handle.db);
    try {
      const token = await clientCredentialsToken(deaf, org);
      expect((await api(deaf, org, token)).statusCode).toBe(200);
      await t.handle.db.deleteFrom('applications').where('client_id', '=', org.privateApp.client_id).execute();
      expect(await within(1000, async () => (await api(deaf, org, token)).statusCode === 401)).toBe(true);
    } finally {
      await deaf.close();
    }
  });
});
