/**
 * The application lifecycle as the dashboard, the management API and the CLI share it
 * (src/oauth/models/applications.ts, src/oauth/models/grants.ts): changes made from a stale read do not
 * undo a concurrent one, what a change takes away is revoked from the resulting state (so a
 * retry finishes an interrupted revocation), no grant is created beyond what an application
 * has now, and revocations that overlap finish each other's work.
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember, removeMember } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { createMigrator } from '../../src/db/migrate.js';
import { connectDatabase } from '../../src/db/connect.js';
import { InvalidRequestError } from '../../src/errors.js';
import { ApplicationCache } from '../../src/oauth/models/application-cache.js';
import { createApplication, findApplicationByClientId, updateApplication } from '../../src/oauth/models/applications.js';
import type { DeveloperApplication } from '../../src/db/schema.js';
import { createAuthorizationCode } from '../../src/oauth/models/authorization-codes.js';
import { createGrant, revokeGrants } from '../../src/oauth/models/grants.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { buildTestApp, TEST_SECRET_KEY } from '../helpers/app.js';
import { finishJobs } from '../helpers/jobs.js';
import { BACKEND, createEmptyDatabase, createTestDatabase, TEST_DATABASE_URL } from '../helpers/db.js';
import { basic, createOrgFixture, form, type OrgFixture } from '../helpers/oauth.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let org: OrgFixture;
const REDIRECT = 'https://client.example.com/cb';

beforeAll(async () => {
  t = await createTestDatabase();
  org = await createOrgFixture(t.handle.db);
});
afterAll(() => t.close());

const db = () => t.handle.db;
const row = async (clientId: string) => (await findApplicationByClientId(db(), clientId)) as DeveloperApplication;
const live = async (applicationClientId: string) =>
  db()
    .selectFrom('grants')
    .innerJoin('applications', 'applications.id', 'grants.application_id')
    .select(['grants.id', 'grants.scopes'])
    .where('applications.client_id', '=', applicationClientId)
    .where('grants.revoked_at', 'is', null)
    .orderBy('grants.id')
    .execute();

async function publicApp(name: string, scopes = 'contacts.read tasks.read') {
  const created = await createApplication(db(), { organizationId: org.organizationId, type: 'public', name, redirectUris: [REDIRECT], scopes });
  return row(created.client_id);
}

describe(`changing an application on ${BACKEND}`, () => {
  it('from a stale read does not undo a change made meanwhile (the row is locked and re-read)', async () => {
    const stale = await publicApp('Stale');
    await updateApplication(db(), await row(stale.client_id), { disabled: true });
    await updateApplication(db(), stale, { name: 'Renamed from a stale read' });
    expect(await row(stale.client_id)).toMatchObject({ name: 'Renamed from a stale read', disabled: true, scopes: ['contacts.read', 'tasks.read'] });
    await updateApplication(db(), await row(stale.client_id), { scopes: 'contacts.read' });
    await updateApplication(db(), stale, { redirectUris: ['https://other.example.com/cb'] });
    expect((await row(stale.client_id)).scopes).toEqual(['contacts.read']);
    const actions = await db().selectFrom('audit_events').select(['action', 'details']).where('organization_id', '=', org.organizationId).orderBy('id').execute();
    const mine = actions.filter((a) => (a.details as { client_id?: string }).client_id === stale.client_id).map((a) => a.action);
    expect(mine).toEqual(['application.created', 'application.disabled', 'application.updated', 'application.updated', 'application.updated']);
  });

  it('queues the revocation with the change, and the job revokes from the state the application is in at each step', async () => {
    const app = await publicApp('Narrowed');
    const grant = await createGrant(db(), { organizationId: org.organizationId, applicationId: app.id, userId: org.ownerId, scopes: ['contacts.read', 'tasks.read'] });
    expect(grant).toBeDefined();
    await updateApplication(db(), app, { scopes: 'contacts.read' });
    // The change committed with its job; the grant goes when the job runs.
    const queued = await db().selectFrom('jobs').select(['kind', 'state', 'organization_id']).orderBy('id', 'desc').executeTakeFirstOrThrow();
    expect(queued).toEqual({ kind: 'application.revoke_grants', state: 'queued', organization_id: org.organizationId });
    await finishJobs(db());
    expect(await live(app.client_id)).toEqual([]);
    // Disabled, then enabled again before the job ran: the job finds it enabled and revokes nothing.
    const kept = await db().insertInto('grants').values({ organization_id: org.organizationId, application_id: app.id, user_id: org.ownerId, scopes: ['contacts.read'] }).returning('id').executeTakeFirstOrThrow();
    await updateApplication(db(), await row(app.client_id), { disabled: true });
    await updateApplication(db(), await row(app.client_id), { disabled: false });
    await finishJobs(db());
    expect((await live(app.client_id)).map((g) => g.id)).toEqual([kept.id]);
    await updateApplication(db(), await row(app.client_id), { disabled: true });
    await finishJobs(db());
    expect(await live(app.client_id)).toEqual([]);
  });

  it('creates no grant beyond what the application has now, whatever a stale copy says', async () => {
    const app = await publicApp('Stale copy');
    await updateApplication(db(), await row(app.client_id), { scopes: 'contacts.read' });
    // An instance whose cache still has the old scopes (or an enabled application) asks anyway.
    expect(await createGrant(db(), { organizationId: org.organizationId, applicationId: app.id, userId: org.ownerId, scopes: ['contacts.read', 'tasks.read'] })).toBeUndefined();
    expect(await createGrant(db(), { organizationId: org.organizationId, applicationId: app.id, userId: org.ownerId, scopes: ['contacts.read'] })).toBeDefined();
  });

  it('redeems no code whose scopes the application has lost since consent, even with a stale application in hand', async () => {
    await ensureSigningKey(db(), { alg: 'ES256', secretKey: TEST_SECRET_KEY });
    const server = await buildTestApp(db(), { env: { API_RATE_LIMIT: '0' } });
    try {
      const created = await createApplication(db(), { organizationId: org.organizationId, type: 'public', name: 'Code', redirectUris: [REDIRECT], scopes: 'contacts.read tasks.read' });
      const app = await row(created.client_id);
      const code = await createAuthorizationCode(db(), {
        organizationId: org.organizationId, applicationId: app.id, userId: org.ownerId, redirectUri: REDIRECT, scopes: ['contacts.read', 'tasks.read'], codeChallenge: null, ttlSeconds: 60,
      });
      // Warm the server's application cache, then narrow behind its back (no NOTIFY listener here).
      const warm = await server.inject({ method: 'POST', url: '/oauth/revoke', headers: { authorization: basic(created.client_id, created.client_secret), 'content-type': 'application/x-www-form-urlencoded' }, payload: form({ token: 'x' }) });
      expect(warm.statusCode).toBe(200);
      await db().updateTable('applications').set({ scopes: ['contacts.read'] }).where('id', '=', app.id).execute();
      const res = await server.inject({
        method: 'POST',
        url: '/oauth/token',
        headers: { authorization: basic(created.client_id, created.client_secret), 'content-type': 'application/x-www-form-urlencoded' },
        payload: form({ grant_type: 'authorization_code', code, redirect_uri: REDIRECT }),
      });
      expect({ status: res.statusCode, error: res.json().error }).toEqual({ status: 400, error: 'invalid_grant' });
      expect(await live(created.client_id)).toEqual([]);
    } finally {
      await server.close();
    }
  });
});

describe(`post-logout redirect URIs on ${BACKEND}`, () => {
  const LOGOUT = 'https://client.example.com/signed-out';
  const LOOPBACK_LOGOUT = 'http://127.0.0.1:9000/bye?from=orgauth';
  /** What createApplication or updateApplication refused with: the 400's details. */
  const refusal = async (work: Promise<unknown>) => {
    const err: unknown = await work.then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(InvalidRequestError);
    return (err as InvalidRequestError).details;
  };

  it('round-trip through create, update, findApplicationByClientId and the application cache, audited like redirect URIs', async () => {
    const created = await createApplication(db(), {
      organizationId: org.organizationId, type: 'public', name: 'Signs out', redirectUris: [REDIRECT], postLogoutRedirectUris: [LOGOUT, LOOPBACK_LOGOUT],
    });
    expect(created.post_logout_redirect_uris).toEqual([LOGOUT, LOOPBACK_LOGOUT]);
    expect((await row(created.client_id)).post_logout_redirect_uris).toEqual([LOGOUT, LOOPBACK_LOGOUT]);
    const cache = new ApplicationCache(db());
    expect((await cache.find(created.client_id))?.post_logout_redirect_uris).toEqual([LOGOUT, LOOPBACK_LOGOUT]);

    // Changing something else keeps them; sending them replaces the list; an empty list clears it.
    expect((await updateApplication(db(), await row(created.client_id), { name: 'Still signs out' })).post_logout_redirect_uris).toEqual([LOGOUT, LOOPBACK_LOGOUT]);
    const changed = await updateApplication(db(), await row(created.client_id), { postLogoutRedirectUris: [LOOPBACK_LOGOUT] }, { applications: cache });
    expect(changed.post_logout_redirect_uris).toEqual([LOOPBACK_LOGOUT]);
    expect((await cache.find(created.client_id))?.post_logout_redirect_uris).toEqual([LOOPBACK_LOGOUT]);
    expect((await updateApplication(db(), changed, { postLogoutRedirectUris: [] })).post_logout_redirect_uris).toEqual([]);
    // The same list again is no change, and not audited.
    await updateApplication(db(), await row(created.client_id), { postLogoutRedirectUris: [] });

    const events = await db().selectFrom('audit_events').select(['action', 'details']).where('organization_id', '=', org.organizationId).orderBy('id').execute();
    const mine = events.filter((e) => (e.details as { client_id?: string }).client_id === created.client_id && e.action === 'application.updated').map((e) => e.details);
    expect(mine).toEqual([
      { client_id: created.client_id, name: 'Still signs out' },
      { client_id: created.client_id, post_logout_redirect_uris: [LOOPBACK_LOGOUT] },
      { client_id: created.client_id, post_logout_redirect_uris: [] },
    ]);
    // A public application needs none: they default to an empty list.
    expect((await publicApp('No logout URIs')).post_logout_redirect_uris).toEqual([]);
  });

  it.each([
    ['a fragment', 'https://client.example.com/bye#top'],
    ['http on a host other than loopback', 'http://client.example.com/bye'],
    ['a relative URI', '/bye'],
    ['a control character', 'https://client.example.com/bye\u0007'],
    ['a space', 'https://client.example.com/b ye'],
    ['user info', 'https://user@client.example.com/bye'],
    ['a lone surrogate', 'https://client.example.com/bye\ud800'],
  ])('refuses %s with the 400 a redirect URI gets, naming post_logout_redirect_uris.N', async (_what, bad) => {
    const asRedirect = await refusal(createApplication(db(), { organizationId: org.organizationId, type: 'public', name: 'Bad', redirectUris: [REDIRECT, bad] }));
    expect(asRedirect).toEqual([{ path: 'redirect_uris.1', message: expect.any(String) }]);
    const message = asRedirect![0]!.message;
    const expected = [{ path: 'post_logout_redirect_uris.1', message }];
    expect(
      await refusal(createApplication(db(), { organizationId: org.organizationId, type: 'public', name: 'Bad', redirectUris: [REDIRECT], postLogoutRedirectUris: [LOGOUT, bad] })),
    ).toEqual(expected);
    const app = await publicApp('Bad change');
    expect(await refusal(updateApplication(db(), app, { postLogoutRedirectUris: [LOGOUT, bad] }))).toEqual(expected);
    expect((await row(app.client_id)).post_logout_redirect_uris).toEqual([]);
  });

  it('refuses more than 20, as it refuses more than 20 redirect URIs', async () => {
    const many = Array.from({ length: 21 }, (_, i) => `https://client.example.com/bye/${i}`);
    expect(await refusal(createApplication(db(), { organizationId: org.organizationId, type: 'public', name: 'Many', redirectUris: many }))).toEqual([
      { path: 'redirect_uris', message: 'at most 20 redirect URIs' },
    ]);
    expect(
      await refusal(createApplication(db(), { organizationId: org.organizationId, type: 'public', name: 'Many', redirectUris: [REDIRECT], postLogoutRedirectUris: many })),
    ).toEqual([{ path: 'post_logout_redirect_uris', message: 'at most 20 post-logout redirect URIs' }]);
    const app = await publicApp('Twenty');
    expect((await updateApplication(db(), app, { postLogoutRedirectUris: many.slice(0, 20) })).post_logout_redirect_uris).toHaveLength(20);
    expect(await refusal(updateApplication(db(), await row(app.client_id), { postLogoutRedirectUris: many }))).toEqual([
      { path: 'post_logout_redirect_uris', message: 'at most 20 post-logout redirect URIs' },
    ]);
  });

  it('refuses any on a private application, as it refuses redirect URIs there', async () => {
    const base = { organizationId: org.organizationId, type: 'private', name: 'Backend' } as const;
    expect(await refusal(createApplication(db(), { ...base, redirectUris: [REDIRECT] }))).toEqual([
      { path: 'redirect_uris', message: 'a private application has no redirect URIs (it uses client_credentials)' },
    ]);
    expect(await refusal(createApplication(db(), { ...base, postLogoutRedirectUris: [LOGOUT] }))).toEqual([
      { path: 'post_logout_redirect_uris', message: 'a private application has no post-logout redirect URIs (it uses client_credentials)' },
    ]);
    const created = await createApplication(db(), { ...base, postLogoutRedirectUris: [] });
    expect(created.post_logout_redirect_uris).toEqual([]);
    expect(await refusal(updateApplication(db(), await row(created.client_id), { postLogoutRedirectUris: [LOGOUT] }))).toEqual([
      { path: 'post_logout_redirect_uris', message: 'a private application has no post-logout redirect URIs (it uses client_credentials)' },
    ]);
    expect((await updateApplication(db(), await row(created.client_id), { postLogoutRedirectUris: [] })).post_logout_redirect_uris).toEqual([]);
  });
});

describe(`migration 0006 on ${BACKEND}`, () => {
  it('clears require_pkce on private applications, which could not be edited or disabled otherwise, and refuses it afterwards', async () => {
    const database = await createEmptyDatabase();
    const handle = await connectDatabase(database.target);
    try {
      const migrator = createMigrator(handle.db);
      const to5 = await migrator.migrateTo('20261122_0005_refresh_token_expiry_index');
      expect(to5.error).toBeUndefined();
      const orgRow = await handle.db.insertInto('organizations').values({ name: 'Legacy' }).returning('id').executeTakeFirstOrThrow();
      await handle.db
        .insertInto('applications')
        .values({ organization_id: orgRow.id, client_id: 'b'.repeat(32), client_secret_hash: '0'.repeat(64), type: 'private', name: 'Legacy', scopes: ['contacts.read'], require_pkce: true })
        .execute();
      expect((await migrator.migrateToLatest()).error).toBeUndefined();
      const legacy = (await findApplicationByClientId(handle.db, 'b'.repeat(32))) as DeveloperApplication;
      expect(legacy.require_pkce).toBe(false);
      expect((await updateApplication(handle.db, legacy, { disabled: true })).disabled).toBe(true);
      await expect(handle.db.updateTable('applications').set({ require_pkce: true }).where('id', '=', legacy.id).execute()).rejects.toMatchObject({ code: '23514' });
    } finally {
      await handle.close();
      await database.drop();
    }
  });
});

describe.skipIf(!TEST_DATABASE_URL)('overlapping revocations on PostgreSQL', () => {
  it('a revocation that waits for another one goes on to the grants that one left (a removed member keeps none)', async () => {
    const user = await createUser(db(), { email: `overlap-${process.pid}@example.com`, password: 'overlap-password-1' });
    await addMember(db(), { organizationId: org.organizationId, userId: user.id, role: 'member' });
    const x = await publicApp('Overlap X');
    const y = await publicApp('Overlap Y');
    const grants = (app: { id: number }, n: number) =>
      db()
        .insertInto('grants')
        .values(Array.from({ length: n }, () => ({ organization_id: org.organizationId, application_id: app.id, user_id: user.id, scopes: ['contacts.read'] })))
        .execute();
    await grants(x, 300);
    await grants(y, 5);
    // Another transaction revokes all of X's grants and holds its locks.
    const other = new pg.Client({ connectionString: t.env.DATABASE_URL });
    await other.connect();
    try {
      await other.query('begin');
      await other.query(`update grants set revoked_at = now(), revoked_reason = 'application_disabled' where application_id = $1 and revoked_at is null`, [x.id]);
      const removal = removeMember(db(), { organizationId: org.organizationId, userId: user.id });
      const bulk = revokeGrants(db(), { organizationId: org.organizationId, userId: user.id }, 'revoked_by_admin');
      // Committed once both have come to it: each finished or seen waiting for a lock (pg_locks).
      let removed = false;
      void removal.then(() => (removed = true), () => {});
      const waiting = async () =>
        Number((await other.query<{ n: string }>(`select count(distinct l.pid) as n from pg_locks l join pg_stat_activity a using (pid) where not l.granted and a.datname = current_database()`)).rows[0]!.n);
      await expect.poll(async () => (await waiting()) >= (removed ? 1 : 2), { timeout: 10_000, interval: 10 }).toBe(true);
      await other.query('commit');
      await Promise.all([removal, bulk]);
    } finally {
      await other.end();
    }
    const left = await db().selectFrom('grants').select('id').where('user_id', '=', user.id).where('revoked_at', 'is', null).execute();
    expect(left).toEqual([]);
  });
});
