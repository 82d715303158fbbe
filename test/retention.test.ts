/** src/retention.ts: expired codes, refresh tokens, access-token revocations and sessions are deleted; nothing live is. */
import { type KyselyPlugin, sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it, onTestFinished, vi } from 'vitest';
import type { DB } from '../src/db/connect.js';
import { generateSecret, sha256Hex } from '../src/lib/crypto.js';
import { deleteExpired } from '../src/retention.js';
import { seenJtiDigest } from '../src/oauth/models/seen-jtis.js';
import { BACKEND, createTestDatabase } from './helpers/db.js';
import { buildTestApp } from './helpers/app.js';
import { createOrgFixture, type OrgFixture } from './helpers/oauth.js';

let database: Awaited<ReturnType<typeof createTestDatabase>>;
let db: DB;
let fixture: OrgFixture;
let applicationId: number;
let grantId: number;

/** `seconds` from now (negative: in the past), as the database's clock has it. */
const at = (seconds: number) => sql<Date>`now() + make_interval(secs => ${seconds})`;
const DAY = 24 * 3600;

async function addCode(expiresIn: number): Promise<string> {
  const code = generateSecret(32);
  await db
    .insertInto('authorization_codes')
    .values({
      code_hash: sha256Hex(code), organization_id: fixture.organizationId, application_id: applicationId, user_id: fixture.ownerId,
      redirect_uri: 'https://client.example.com/cb', scopes: ['contacts.read'], code_challenge: null, code_challenge_method: null, expires_at: at(expiresIn),
    })
    .execute();
  return sha256Hex(code);
}

async function addRefreshTokens(count: number, expiresIn: number): Promise<void> {
  await db
    .insertInto('refresh_tokens')
    .values(Array.from({ length: count }, () => ({ token_hash: sha256Hex(generateSecret(32)), organization_id: fixture.organizationId, grant_id: grantId, scopes: ['contacts.read'], expires_at: at(expiresIn) })))
    .execute();
}

async function addRevokedToken(jti: string, expiresIn: number): Promise<void> {
  await db.insertInto('revoked_access_tokens').values({ jti, organization_id: fixture.organizationId, grant_id: grantId, expires_at: at(expiresIn) }).execute();
}

async function addSession(expiresIn: number): Promise<string> {
  const idHash = sha256Hex(generateSecret(32));
  await db.insertInto('sessions').values({ id_hash: idHash, user_id: fixture.ownerId, expires_at: at(expiresIn) }).execute();
  return idHash;
}

const count = async (table: 'authorization_codes' | 'refresh_tokens' | 'revoked_access_tokens' | 'sessions') =>
  Number((await db.selectFrom(table).select((eb) => eb.fn.countAll().as('n')).executeTakeFirstOrThrow()).n);

beforeAll(async () => {
  database = await createTestDatabase();
  db = database.handle.db;
  fixture = await createOrgFixture(db);
  applicationId = (await db.selectFrom('applications').select('id').where('client_id', '=', fixture.publicApp.client_id).executeTakeFirstOrThrow()).id;
  grantId = (
    await db.insertInto('grants').values({ organization_id: fixture.organizationId, application_id: applicationId, user_id: fixture.ownerId, scopes: ['contacts.read'] }).returning('id').executeTakeFirstOrThrow()
  ).id;
});
afterAll(() => database.close());

const NOTHING = { authorization_codes: 0, refresh_tokens: 0, revoked_access_tokens: 0, sessions: 0, account_tokens: 0, invitations: 0, pending_sign_ups: 0, sign_up_attempts: 0, mail_outbox: 0, pending_sign_ins: 0, sso_sign_ins: 0, saml_assertion_ids: 0, second_step_failures: 0, unused_clients: 0, device_authorizations: 0, client_registrations: 0, jobs: 0, webhook_events: 0, seen_jtis: 0, pushed_authorization_requests: 0, activity_daily: 0, setup_links: 0, directory_requests: 0 };

describe(`deleting expired rows on ${BACKEND}`, () => {
  it('deletes what expired, keeps what is live, and keeps codes a week past expiry for replay detection', async () => {
    const recentCode = await addCode(-6 * DAY);
    const liveCode = await addCode(60);
    await addCode(-8 * DAY);
    await addRefreshTokens(3, -10);
    await addRefreshTokens(2, 3600);
    await addRevokedToken('revoked-long-ago', -2 * 3600);
    await addRevokedToken('revoked-within-leeway', -30);
    await addRevokedToken('revoked-live', 3600);
    await addSession(-10);
    const liveSession = await addSession(3600);
    // Links sent by email go an hour after they expired; invitations 30 days after; emails a week after they were sent.
    for (const expiresIn of [-3700, -10, 600]) {
      await db.insertInto('account_tokens').values({ token_hash: sha256Hex(generateSecret(32)), purpose: 'reset_password', user_id: fixture.ownerId, email: 'x@example.com', expires_at: at(expiresIn) }).execute();
    }
    for (const expiresIn of [-31 * DAY, -29 * DAY]) {
      await db.insertInto('invitations').values({ organization_id: fixture.organizationId, email: `i${expiresIn}@example.com`, role: 'member', token_hash: sha256Hex(generateSecret(32)), expires_at: at(expiresIn) }).execute();
    }
    // A sign-up waiting for its link goes once the link expired; an admitted sign-up's record an hour after it was made.
    for (const [email, expiresIn] of [['signup-gone@example.com', -10], ['signup-live@example.com', 600]] as const) {
      await db.insertInto('pending_sign_ups').values({ email, token_hash: sha256Hex(generateSecret(32)), password_hash: '$argon2id$x', name: '', organization_name: 'Org', return_to: '/dashboard', expires_at: at(expiresIn) }).execute();
    }
    for (const [email, createdAgo] of [['attempt-gone@example.com', -3610], ['attempt-live@example.com', -3500]] as const) {
      await db.insertInto('sign_up_attempts').values({ email, ip: '192.0.2.1', created_at: at(createdAgo) }).execute();
    }
    await db.insertInto('mail_outbox').values({ recipient: 'sent@example.com', subject: 'sent', sent_at: at(-8 * DAY), expires_at: at(-DAY) }).execute();
    await db.insertInto('mail_outbox').values({ recipient: 'waiting@example.com', subject: 'waiting', body_encrypted: 'x' }).execute();
    // A sign-in waiting for its second step goes once expired; a wrong code once out of its 15-minute window.
    for (const [id, expiresIn] of [['pending-gone', -10], ['pending-live', 300]] as const) {
      await db.insertInto('pending_sign_ins').values({ id_hash: id, user_id: fixture.ownerId, amr: ['pwd'], return_to: '/dashboard', expires_at: at(expiresIn) }).execute();
    }
    for (const failedAgo of [-16 * 60, -60]) await db.insertInto('second_step_failures').values({ user_id: fixture.ownerId, failed_at: at(failedAgo) }).execute();
    // An SSO sign-in goes once expired; a SAML assertion ID once it could no longer be accepted.
    const { id: connectionId } = await db
      .insertInto('sso_connections')
      .values({ organization_id: fixture.organizationId, protocol: 'saml', name: 'IdP', saml_idp_entity_id: 'https://idp.example', saml_idp_sso_url: 'https://idp.example/sso', saml_idp_certificates: ['pem'] })
      .returning('id')
      .executeTakeFirstOrThrow();
    for (const [handle, expiresIn] of [['sso-gone', -10], ['sso-live', 300]] as const) {
      await db.insertInto('sso_sign_ins').values({ handle_hash: handle, connection_id: connectionId, browser_hash: null, return_to: '/', expires_at: at(expiresIn) }).execute();
      await db.insertInto('saml_assertion_ids').values({ connection_id: connectionId, assertion_id: handle, expires_at: at(expiresIn) }).execute();
    }
    // Replay stores go five minutes after their entries could no longer be accepted (clocks differ); a pushed request once expired (its expiry is the database's clock).
    for (const [key, expiresIn] of [['dpop-gone', -310], ['dpop-live', -60]] as const) {
      await db.insertInto('seen_jtis').values({ key: seenJtiDigest(key), expires_at: at(expiresIn) }).execute();
    }
    for (const [uri, expiresIn] of [['par-gone', -1], ['par-live', 60]] as const) {
      await db.insertInto('pushed_authorization_requests').values({ request_uri_hash: uri, application_id: applicationId, params: '{}', dpop_jkt: null, expires_at: at(expiresIn) }).execute();
    }
    // Jobs go a month after they finished, never while unfinished; webhook events (with their deliveries) a month after they happened.
    for (const [kind, state, finishedAgo] of [['old', 'succeeded', -31 * DAY], ['recent', 'failed', -29 * DAY], ['waiting', 'queued', null]] as const) {
      await db.insertInto('jobs').values({ kind, state, payload: '{}', cursor: null, finished_at: finishedAgo === null ? null : at(finishedAgo), created_at: at(-40 * DAY) }).execute();
    }
    for (const [id, createdAgo] of [['msg_old', -31 * DAY], ['msg_recent', -29 * DAY]] as const) {
      await db.insertInto('webhook_events').values({ organization_id: fixture.organizationId, type: 'member.added', message_id: id, payload: '{}', created_at: at(createdAgo) }).execute();
    }
    // Setup links a month after they expired, revoked or not.
    for (const [name, expiredAgo] of [['link-gone', -31 * DAY], ['link-kept', -29 * DAY]] as const) {
      await db
        .insertInto('setup_links')
        .values({ organization_id: fixture.organizationId, features: ['sso'], token_hash: sha256Hex(name), created_at: at(expiredAgo - DAY), expires_at: at(expiredAgo), revoked_at: at(expiredAgo - 60) })
        .execute();
    }
    // A directory's request log: a week.
    const { id: directoryId } = await db
      .insertInto('directories')
      .values({ organization_id: fixture.organizationId, name: 'Okta', token_hash: sha256Hex('directory-token') })
      .returning('id')
      .executeTakeFirstOrThrow();
    for (const [path, createdAgo] of [['/Users?old', -8 * DAY], ['/Users?recent', -6 * DAY]] as const) {
      await db.insertInto('directory_requests').values({ directory_id: directoryId, method: 'GET', path, status: 200, scim_type: null, created_at: at(createdAgo) }).execute();
    }
    // The Overview's counters: kept 400 days.
    for (const [metric, daysAgo] of [['sign_ins', 401], ['consents', 399]] as const) {
      await sql`insert into activity_daily (organization_id, metric, day, count) values (${fixture.organizationId}, ${metric}, current_date - ${daysAgo}::int, 1)`.execute(db);
    }

    expect(await deleteExpired(db)).toEqual({
      authorization_codes: 1,
      refresh_tokens: 3,
      revoked_access_tokens: 1,
      sessions: 1,
      account_tokens: 1,
      invitations: 1,
      pending_sign_ups: 1,
      sign_up_attempts: 1,
      mail_outbox: 1,
      pending_sign_ins: 1,
      sso_sign_ins: 1,
      saml_assertion_ids: 1,
      second_step_failures: 1,
      unused_clients: 0,
      // Device authorizations: test/oauth/device.test.ts.
      device_authorizations: 0,
      // Registration records: test/oauth/registration.test.ts.
      client_registrations: 0,
      jobs: 1,
      webhook_events: 1,
      seen_jtis: 1,
      pushed_authorization_requests: 1,
      activity_daily: 1,
      setup_links: 1,
      directory_requests: 1,
    });
    expect((await db.selectFrom('directory_requests').select('path').execute()).map((r) => r.path)).toEqual(['/Users?recent']);
    expect((await db.selectFrom('setup_links').select('token_hash').execute()).map((r) => r.token_hash)).toEqual([sha256Hex('link-kept')]);
    expect((await db.selectFrom('activity_daily').select('metric').where('organization_id', '=', fixture.organizationId).execute()).map((r) => r.metric)).toEqual(['consents']);
    expect((await db.selectFrom('seen_jtis').select('key').execute()).map((r) => r.key)).toEqual([seenJtiDigest('dpop-live')]);
    expect((await db.selectFrom('pushed_authorization_requests').select('request_uri_hash').execute()).map((r) => r.request_uri_hash)).toEqual(['par-live']);
    expect((await db.selectFrom('jobs').select('kind').orderBy('id').execute()).map((j) => j.kind)).toEqual(['recent', 'waiting']);
    expect((await db.selectFrom('webhook_events').select('message_id').execute()).map((e) => e.message_id)).toEqual(['msg_recent']);
    expect((await db.selectFrom('sso_sign_ins').select('handle_hash').execute()).map((r) => r.handle_hash)).toEqual(['sso-live']);
    expect((await db.selectFrom('saml_assertion_ids').select('assertion_id').execute()).map((r) => r.assertion_id)).toEqual(['sso-live']);
    expect((await db.selectFrom('pending_sign_ins').select('id_hash').execute()).map((p) => p.id_hash)).toEqual(['pending-live']);
    expect((await db.selectFrom('mail_outbox').select('recipient').execute()).map((m) => m.recipient)).toEqual(['waiting@example.com']);
    expect((await db.selectFrom('pending_sign_ups').select('email').execute()).map((p) => p.email)).toEqual(['signup-live@example.com']);
    expect((await db.selectFrom('sign_up_attempts').select('email').execute()).map((p) => p.email)).toEqual(['attempt-live@example.com']);
    expect((await db.selectFrom('invitations').select('email').execute()).map((i) => i.email)).toEqual([`i${-29 * DAY}@example.com`]);

    const codes = await db.selectFrom('authorization_codes').select('code_hash').execute();
    expect(codes.map((c) => c.code_hash).sort()).toEqual([recentCode, liveCode].sort());
    const refresh = await db.selectFrom('refresh_tokens').select(sql<boolean>`expires_at > now()`.as('live')).execute();
    expect(refresh).toEqual([{ live: true }, { live: true }]);
    const revoked = await db.selectFrom('revoked_access_tokens').select('jti').orderBy('jti').execute();
    expect(revoked.map((r) => r.jti)).toEqual(['revoked-live', 'revoked-within-leeway']);
    const sessions = await db.selectFrom('sessions').select('id_hash').execute();
    expect(sessions.map((s) => s.id_hash)).toEqual([liveSession]);

    // Nothing left to do: a second pass deletes nothing.
    expect(await deleteExpired(db)).toEqual({ ...NOTHING });
  });

  it('goes through more rows than one batch in one pass', async () => {
    await addRefreshTokens(2500, -1);
    const before = await count('refresh_tokens');
    const deleted = await deleteExpired(db);
    expect(deleted.refresh_tokens).toBe(2500);
    expect(await count('refresh_tokens')).toBe(before - 2500);
  });

  it('runs in the server every CLEANUP_INTERVAL seconds', async () => {
    const [tokens, sessions] = [await count('refresh_tokens'), await count('sessions')];
    await addRefreshTokens(5, -1);
    await addSession(-1);
    // The server's intervals are fake: its second passes at once, then the sweep is waited for.
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'], shouldClearNativeTimers: true });
    onTestFinished(() => void vi.useRealTimers());
    const app = await buildTestApp(db, { env: { CLEANUP_INTERVAL: '1' } });
    try {
      vi.advanceTimersByTime(1000);
      const deadline = Date.now() + 10_000;
      while ((await count('refresh_tokens')) !== tokens || (await count('sessions')) !== sessions) {
        if (Date.now() > deadline) throw new Error('expired rows were not deleted within 10 s');
        await new Promise((r) => setTimeout(r, 100));
      }
    } finally {
      await app.close();
    }
  });

  it('does not run when CLEANUP_INTERVAL is 0', async () => {
    const tokens = await count('refresh_tokens');
    await addRefreshTokens(5, -1);
    // The server's intervals are fake: every one it set fires once (a sweeper's, whatever its
    // period). A sweep starts with a delete, sent as its timer fires (deleteExpired).
    const sent: string[] = [];
    const recording: KyselyPlugin = { transformQuery: (args) => (sent.push(JSON.stringify(args.node)), args.node), transformResult: async (args) => args.result };
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'], shouldClearNativeTimers: true });
    onTestFinished(() => void vi.useRealTimers());
    const app = await buildTestApp(db.withPlugin(recording), { env: { CLEANUP_INTERVAL: '0' } });
    try {
      await app.ready();
      sent.length = 0;
      vi.runOnlyPendingTimers();
      expect(sent.length).toBeGreaterThan(0);
      expect(sent.filter((s) => /DeleteQueryNode|delete from/i.test(s))).toEqual([]);
    } finally {
      await app.close();
    }
    expect(await count('refresh_tokens')).toBe(tokens + 5);
    expect(await deleteExpired(db)).toMatchObject({ refresh_tokens: 5 });
  });

  it('stops between batches when asked, and cleans the other tables when one fails', async () => {
    await addRefreshTokens(2500, -1);
    const stopped = await deleteExpired(db, { stopping: () => true });
    expect(stopped).toEqual({ ...NOTHING });

    await addSession(-1);
    const failing = db.withPlugin({
      // Every statement on refresh_tokens fails, as a timed-out one would.
      transformQuery: (args) => {
        const text = JSON.stringify(args.node);
        if (text.includes('refresh_tokens')) throw new Error('simulated failure');
        return args.node;
      },
      transformResult: async (args) => args.result,
    });
    const errors: string[] = [];
    const deleted = await deleteExpired(failing, { onError: (table) => errors.push(table) });
    expect(errors).toEqual(['refresh_tokens']);
    expect(deleted.sessions).toBe(1);
    expect((await deleteExpired(db)).refresh_tokens).toBe(2500);
  });
});
