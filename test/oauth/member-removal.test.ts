/**
 * Issue 27: removing a member is a job whose effect is immediate. The request answers at once;
 * every instance refuses the member's access tokens within a second (the revoked set holds the
 * removal), their refresh tokens stop, introspection calls both inactive; a job revokes their
 * grants, however many, each once with its audit entry. Someone added back before the job ran
 * keeps what they were granted since; what they had before the removal stays ended.
 *
 * Neither instance runs jobs here (JOB_WORKERS=0): the test finishes them when it chooses, so
 * what it sees in between is what a member with a million grants sees while the job walks them.
 */
import type { FastifyInstance } from 'fastify';
import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it, onTestFinished, vi } from 'vitest';
import { addMember, removeMember, wasRemoved } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { createAuthorizationCode } from '../../src/oauth/models/authorization-codes.js';
import { REMOVAL_MARGIN_S } from '../../src/oauth/models/grants.js';
import { KNOWN_SCOPES } from '../../src/oauth/helpers/scopes.js';
import { BACKEND } from '../helpers/db.js';
import { type InstancePair, startInstancePair } from '../helpers/instance-pair.js';
import { finishJobs } from '../helpers/jobs.js';
import { basic, clientCredentialsToken, createOrgFixture, form, type OrgFixture } from '../helpers/oauth.js';

const MANY = 1_000;

describe(`removing a member on ${BACKEND}`, () => {
  let pair: InstancePair;
  let app: FastifyInstance;
  let second: FastifyInstance;
  let org: OrgFixture;
  let publicAppId: number;
  let n = 0;
  const db = () => pair.t.handle.db;

  beforeAll(async () => {
    pair = await startInstancePair({ env: { JOB_WORKERS: '0' } });
    ({ app, second } = pair);
    org = await createOrgFixture(db(), { scopes: KNOWN_SCOPES.join(' ') });
    publicAppId = (await db().selectFrom('applications').select('id').where('client_id', '=', org.publicApp.client_id).executeTakeFirstOrThrow()).id;
  });
  afterAll(() => pair.close());

  async function newMember(): Promise<number> {
    const user = await createUser(db(), { email: `removal-${++n}-${Date.now()}@example.com`, password: 'removal-password-1' });
    await addMember(db(), { organizationId: org.organizationId, userId: user.id, role: 'member' });
    return user.id;
  }

  /** The member's tokens from the public application, through a code at the token endpoint. */
  async function tokensOf(userId: number): Promise<{ access_token: string; refresh_token: string }> {
    const code = await createAuthorizationCode(db(), {
      organizationId: org.organizationId, applicationId: publicAppId, userId, redirectUri: 'https://client.example.com/cb', scopes: ['contacts.read'], codeChallenge: null, ttlSeconds: 60,
    });
    const res = await tokenEndpoint({ grant_type: 'authorization_code', code, redirect_uri: 'https://client.example.com/cb' });
    expect(res.statusCode, res.body).toBe(200);
    return res.json();
  }

  const tokenEndpoint = (fields: Record<string, string>, target: FastifyInstance = app) =>
    target.inject({
      method: 'POST',
      url: '/oauth/token',
      headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(org.publicApp.client_id, org.publicApp.client_secret) },
      payload: form(fields),
    });
  const introspect = async (token: string, target: FastifyInstance = app) =>
    (
      await target.inject({
        method: 'POST',
        url: '/oauth/introspect',
        headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(org.publicApp.client_id, org.publicApp.client_secret) },
        payload: form({ token }),
      })
    ).json() as { active: boolean };
  const contacts = async (target: FastifyInstance, token: string) =>
    (await target.inject({ method: 'GET', url: `/api/v1/${org.organizationId}/contacts`, headers: { authorization: `Bearer ${token}` } })).statusCode;
  const liveGrants = async (userId: number) =>
    (await db().selectFrom('grants').select('id').where('user_id', '=', userId).where('organization_id', '=', org.organizationId).where('revoked_at', 'is', null).orderBy('id').execute()).map((g) => g.id);

  it(`a member holding ${MANY.toLocaleString('en')} grants: the DELETE answers at once, their tokens are refused on both instances within a second while every grant is still live, then the job revokes each once`, async () => {
    const userId = await newMember();
    const tokens = await tokensOf(userId);
    await sql`insert into grants (organization_id, application_id, user_id, scopes)
      select ${org.organizationId}, ${publicAppId}, ${userId}, '{contacts.read}' from generate_series(1, ${MANY - 1})`.execute(db());
    for (const instance of [app, second]) expect(await contacts(instance, tokens.access_token)).toBe(200);

    // All of the application's scopes: it acts as an admin, and an admin removes only roles within theirs.
    const admin = await clientCredentialsToken(app, org);
    const removed = await app.inject({ method: 'DELETE', url: `/api/v1/${org.organizationId}/members/${userId}`, headers: { authorization: `Bearer ${admin}` } });
    expect(removed.statusCode, removed.body).toBe(204);
    // Nothing revoked yet: the job is queued, not run.
    expect(await liveGrants(userId)).toHaveLength(MANY);
    const job = await db().selectFrom('jobs').select(['id', 'state', 'payload']).where('kind', '=', 'member.revoke_grants').orderBy('id', 'desc').executeTakeFirstOrThrow();
    expect(job).toMatchObject({ state: 'queued', payload: { user_id: userId } });

    // Refused everywhere within a second, by the removal itself.
    for (const instance of [app, second]) await expect.poll(() => contacts(instance, tokens.access_token), { timeout: 1000, interval: 20 }).toBe(401);
    expect(await introspect(tokens.access_token, second)).toEqual({ active: false });
    expect(await introspect(tokens.refresh_token, second)).toEqual({ active: false });
    expect((await tokenEndpoint({ grant_type: 'refresh_token', refresh_token: tokens.refresh_token }, second)).json()).toMatchObject({ error: 'invalid_grant' });
    expect(await liveGrants(userId)).toHaveLength(MANY);

    await finishJobs(db());
    expect(await liveGrants(userId)).toEqual([]);
    const done = await db().selectFrom('jobs').select(['state', 'progress_done', 'progress_total']).where('id', '=', job.id).executeTakeFirstOrThrow();
    expect(done).toEqual({ state: 'succeeded', progress_done: MANY, progress_total: MANY });
    const { rows } = await sql<{ n: string; grants: string }>`
      select count(*) as n, count(distinct details->>'grant_id') as grants from audit_events
      where organization_id = ${org.organizationId} and action = 'grant.revoked' and (details->>'user_id')::bigint = ${userId} and details->>'reason' = 'member_removed'`.execute(db());
    expect(rows.map((r) => [Number(r.n), Number(r.grants)])).toEqual([[MANY, MANY]]);
  });

  it.skipIf(BACKEND !== 'postgres')('a grant made by a redemption the removal waited for is ended with the rest', async () => {
    const userId = await newMember();
    // What a code redemption does: share-lock the membership, make the grant, commit a moment later.
    const redemption = new pg.Client({ connectionString: pair.t.env.DATABASE_URL });
    await redemption.connect();
    let grantId: number;
    try {
      await redemption.query('begin');
      await redemption.query('select 1 from memberships where organization_id = $1 and user_id = $2 for share', [org.organizationId, userId]);
      // Made after the removal's transaction began (a redemption that took the lock between the
      // removal's BEGIN and its lock): created_at later than the removal's start.
      grantId = Number(
        (
          await redemption.query<{ id: string }>(
            `insert into grants (organization_id, application_id, user_id, scopes, created_at) values ($1, $2, $3, '{contacts.read}', clock_timestamp() + interval '100 milliseconds') returning id`,
            [org.organizationId, publicAppId, userId],
          )
        ).rows[0]!.id,
      );
      const removal = removeMember(db(), { organizationId: org.organizationId, userId });
      // The removal waits for the lock (seen waiting in pg_locks); the grant commits first, once
      // the clock has passed its created_at (the removal's clock is read after the commit).
      const ready = `select exists (select 1 from pg_locks l join pg_stat_activity a using (pid) where not l.granted and a.datname = current_database())
        and clock_timestamp() > (select created_at from grants where id = $1) as ready`;
      await expect.poll(async () => (await redemption.query<{ ready: boolean }>(ready, [grantId])).rows[0]!.ready, { timeout: 10_000, interval: 10 }).toBe(true);
      await redemption.query('commit');
      await removal;
    } finally {
      await redemption.end();
    }
    expect(await liveGrants(userId)).toEqual([grantId]);
    await finishJobs(db());
    expect(await liveGrants(userId)).toEqual([]);
    const revoked = await db().selectFrom('grants').select('revoked_reason').where('id', '=', grantId).executeTakeFirstOrThrow();
    expect(revoked.revoked_reason).toBe('member_removed');
  });

  it('added back before the job ran: what they had before stays ended, what they were granted since works, and the job revokes only the grants from before', async () => {
    const userId = await newMember();
    const before = await tokensOf(userId);
    const [oldGrant] = await liveGrants(userId);
    await removeMember(db(), { organizationId: org.organizationId, userId });
    expect(await wasRemoved(db(), org.organizationId, userId)).toBe(true);
    // Tokens issued in the second of the removal and REMOVAL_MARGIN_S more are refused with it (iat is whole seconds): the next ones come after.
    // The instances' clock (Date, in this process; the embedded database's too) is moved on by that much rather than waited for.
    vi.useFakeTimers({ toFake: ['Date'], shouldAdvanceTime: true });
    onTestFinished(() => void vi.useRealTimers());
    vi.setSystemTime(Date.now() + (REMOVAL_MARGIN_S + 1) * 1000 + 100);
    await addMember(db(), { organizationId: org.organizationId, userId, role: 'member' });
    expect(await wasRemoved(db(), org.organizationId, userId)).toBe(false);
    const after = await tokensOf(userId);

    for (const instance of [app, second]) {
      await expect.poll(() => contacts(instance, before.access_token), { timeout: 1000, interval: 20 }).toBe(401);
      expect(await contacts(instance, after.access_token)).toBe(200);
    }
    // The grant from before is still live (no job has run), yet ended: no refresh, inactive.
    expect(await liveGrants(userId)).toHaveLength(2);
    expect((await tokenEndpoint({ grant_type: 'refresh_token', refresh_token: before.refresh_token })).json()).toMatchObject({ error: 'invalid_grant' });
    expect(await introspect(before.access_token)).toEqual({ active: false });
    expect(await introspect(before.refresh_token)).toEqual({ active: false });
    expect(await introspect(after.access_token)).toMatchObject({ active: true, sub: String(userId) });
    const refreshed = await tokenEndpoint({ grant_type: 'refresh_token', refresh_token: after.refresh_token }, second);
    expect(refreshed.statusCode, refreshed.body).toBe(200);

    await finishJobs(db());
    const grants = await db().selectFrom('grants').select(['id', 'revoked_reason']).where('user_id', '=', userId).orderBy('id').execute();
    expect(grants).toEqual([
      { id: oldGrant, revoked_reason: 'member_removed' },
      { id: expect.any(Number), revoked_reason: null },
    ]);
    for (const instance of [app, second]) expect(await contacts(instance, refreshed.json().access_token)).toBe(200);
  });
});
