/**
 * Issue 13, "Behind PgBouncer": orgauth through Debian's PgBouncer (1.18, no protocol-level
 * prepared statements) in transaction pooling mode, with a pool of 3 server connections shared
 * by every client and handed out in turn (test/helpers/pgbouncer.ts), configured as the README
 * tells operators: DATABASE_URL through PgBouncer with DATABASE_POOLER=transaction,
 * DATABASE_LISTEN_URL straight to PostgreSQL, the role's statement_timeout set on the server
 * (here the test database's), no ignore_startup_parameters.
 *
 * Two instances, each built and opened as server.ts does (openDatabase, ensureSigningKey,
 * buildApp, listening on a port of this process), start at once on the empty database: both
 * migrate through PgBouncer. Then the OAuth flows spread over both, API calls with their tokens,
 * and a revocation on one refused by the other within one second, its NOTIFY heard on the
 * other's LISTEN connection (not only picked up by the 500 ms poll).
 *
 * The controls show that each of these would fail through the same PgBouncer without the
 * mode: the statement_timeout startup parameter is refused, a named statement is missing on the
 * next server connection, LISTEN through it hears nothing, and Kysely's own migration lock is
 * left behind on a pooled session. They run on a database of their own, with no instance on it
 * to take server connections out of turn.
 *
 * PostgreSQL only (TEST_DATABASE_URL); skipped with a notice without pgbouncer, an error in CI.
 */
import { createHash } from 'node:crypto';
import { readdirSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import type { FastifyInstance } from 'fastify';
import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrganization } from '../src/accounts/organizations.js';
import { createUser } from '../src/accounts/users.js';
import { buildApp } from '../src/app.js';
import type { DatabaseTarget } from '../src/config.js';
import { connectDatabase, type DatabaseHandle, inTransaction, prepared } from '../src/db/connect.js';
import { migrateToLatest, MIGRATIONS_URL } from '../src/db/migrate.js';
import { SERVER_STATEMENT_TIMEOUT_MS, statementTimeoutProblem } from '../src/db/pooler.js';
import { createLogger } from '../src/logger.js';
import { type ApplicationWithSecret, createApplication } from '../src/oauth/models/applications.js';
import { REVOCATION_CHANNEL } from '../src/oauth/models/grants.js';
import { ensureSigningKey } from '../src/oauth/models/signing-keys.js';
import { describeStartupError, openDatabase } from '../src/runtime.js';
import { logCapture, testConfig } from './helpers/app.js';
import { createEmptyDatabase, TEST_DATABASE_URL, type TestDatabase } from './helpers/db.js';
import { csrfIn, deadlinePoll, describeObserved, formPost, hiddenIn, type Observed, observe, UserAgent } from './helpers/instances.js';
import { basic } from './helpers/oauth.js';
import { findPgBouncer, type PgBouncer, startPgBouncer } from './helpers/pgbouncer.js';
import { freePort } from './helpers/process.js';

/** How soon the other instance must honour a revocation (SECURITY.md BR-5, R-6). */
const DEADLINE_MS = 1000;
const ISSUER = 'http://auth.orgauth.test';
const REDIRECT_URI = 'http://localhost:8080/callback';
const PASSWORD = 'pgbouncer-password-1';
/** Server connections PgBouncer keeps per database: fewer than the clients, so they are shared. */
const SERVER_POOL = 3;

const binary = findPgBouncer();
const skipReason = !TEST_DATABASE_URL
  ? 'they run in the PostgreSQL run of the suite (TEST_DATABASE_URL set)'
  : typeof binary === 'string'
    ? binary
    : undefined;
if (skipReason && TEST_DATABASE_URL && process.env.CI) throw new Error(`the PgBouncer tests cannot run in CI: ${skipReason}`);
if (skipReason) console.warn(`\n*** PgBouncer tests (issue 13) SKIPPED: ${skipReason}. ***\n`);

const { honouredWithin, timings } = deadlinePoll(DEADLINE_MS);

interface Instance {
  name: 'A' | 'B';
  url: string;
  app: FastifyInstance;
  handle: DatabaseHandle;
  /** What the instance logged (level warn and above). */
  logs: () => string[];
}

/** A direct connection to TEST_DATABASE_URL's server, for what an operator or a probe does beside orgauth. */
async function adminQuery<T extends pg.QueryResultRow>(text: string, values: unknown[] = []): Promise<T[]> {
  const client = new pg.Client({ connectionString: TEST_DATABASE_URL });
  await client.connect();
  try {
    return (await client.query<T>(text, values)).rows;
  } finally {
    await client.end();
  }
}

const claimsOf = (token: string) => JSON.parse(Buffer.from(token.split('.')[1] ?? '', 'base64url').toString('utf8')) as { jti: string; grant_id: number; exp: number };
const heardBy = (heard: string[]): Observed => ({ status: 0, headers: new Headers(), body: heard });

const databaseName = (db: TestDatabase) => decodeURIComponent(new URL(db.env.DATABASE_URL!).pathname.slice(1));

/** Advisory locks held on `database` by any session (a migration lock left behind shows here). */
const advisoryLocks = async (database: string) =>
  adminQuery<{ pid: number }>(
    `select l.pid from pg_locks l join pg_database d on d.oid = l.database where l.locktype = 'advisory' and d.datname = $1`,
    [database],
  );

/** Makes PgBouncer open all SERVER_POOL server connections of `url`'s pool: busy at once, then idle. */
async function openServerConnections(url: string): Promise<void> {
  const pool = new pg.Pool({ connectionString: url, max: SERVER_POOL });
  try {
    await Promise.all(Array.from({ length: SERVER_POOL }, () => pool.query('select pg_sleep(0.1)')));
  } finally {
    await pool.end();
  }
}

describe.skipIf(skipReason !== undefined)('orgauth behind PgBouncer in transaction pooling mode (issue 13)', () => {
  let bouncer: PgBouncer;
  let main: TestDatabase;
  let controls: TestDatabase;
  /** The database as the operator's README configuration reaches it: through PgBouncer, LISTEN directly. */
  let target: Extract<DatabaseTarget, { kind: 'postgres' }>;
  const env: Record<string, string> = {};

  beforeAll(async () => {
    if (typeof binary === 'string') throw new Error(binary);
    [main, controls] = await Promise.all([createEmptyDatabase(), createEmptyDatabase()]);
    // The operator's one server-side setting (README, "Behind PgBouncer"), on the test database
    // rather than on the shared server's role.
    await adminQuery(`alter database ${pg.escapeIdentifier(databaseName(main))} set statement_timeout = '${SERVER_STATEMENT_TIMEOUT_MS}ms'`);
    bouncer = await startPgBouncer(binary, {
      upstream: TEST_DATABASE_URL!,
      poolSize: SERVER_POOL,
      // A session-mode alias of the main database: what an operator may give DATABASE_LISTEN_URL.
      databases: { [`${databaseName(main)}_session`]: `dbname=${databaseName(main)} pool_mode=session` },
    });
    console.log(`pgbouncer.test.ts: PgBouncer ${binary.version} on 127.0.0.1:${bouncer.port}, pool_mode transaction, ${SERVER_POOL} server connections per database`);
    Object.assign(env, {
      DATABASE_URL: bouncer.url(databaseName(main)),
      DATABASE_POOLER: 'transaction',
      DATABASE_LISTEN_URL: main.env.DATABASE_URL!,
      DATABASE_POOL_MAX: '4',
    });
    target = { kind: 'postgres', url: env.DATABASE_URL!, listenUrl: env.DATABASE_LISTEN_URL!, pooler: 'transaction' };
  });

  afterAll(async () => {
    await bouncer?.stop();
    await Promise.all([main?.drop(), controls?.drop()]);
    console.log(
      `pgbouncer.test.ts timings (ms; deadline ${DEADLINE_MS}):\n${Object.entries(timings)
        .map(([what, ms]) => `  ${String(ms).padStart(5)}  ${what}`)
        .join('\n')}`,
    );
  });

  describe('two instances through PgBouncer', () => {
    let A: Instance;
    let B: Instance;
    let setup: DatabaseHandle;
    let organizationId: number;
    let publicApp: ApplicationWithSecret;
    let privateApp: ApplicationWithSecret;
    const owner = { email: `owner-${process.pid}@example.com` };
    /** The tokens of the authorization code flow, after its rotations. */
    let userTokens: { access_token: string; refresh_token: string };
    const browser = new UserAgent();

    /** Opens and serves an instance the way server.ts does, from the environment's configuration. */
    async function startInstance(name: 'A' | 'B'): Promise<Instance> {
      const config = testConfig({ ...env, ISSUER, LOG_LEVEL: 'warn' });
      expect(config.database).toEqual(target);
      const capture = logCapture();
      const logger = createLogger(config, capture.stream);
      const { handle } = await openDatabase(config, logger);
      await ensureSigningKey(handle.db, { alg: config.signingAlg, secretKey: config.secretKey });
      const app = await buildApp(config, { db: handle.db, logger, listen: handle.listen });
      await app.listen({ host: '127.0.0.1', port: 0 });
      const address = app.server.address();
      if (typeof address !== 'object' || address === null) throw new Error('no address');
      return { name, url: `http://127.0.0.1:${address.port}`, app, handle, logs: capture.lines };
    }

    /** An answer, and on a 5xx the error the instance logged for it (e.g. a statement PgBouncer lost). */
    const explain = (instance: Instance, o: Observed): string =>
      `${instance.name}: ${describeObserved(o)}${o.status >= 500 ? `; logged: ${instance.logs().map((l) => (JSON.parse(l) as { err?: { message?: string } }).err?.message).filter(Boolean).slice(-1)[0] ?? 'nothing'}` : ''}`;

    const apiGet = async (instance: Instance, token: string): Promise<Observed> =>
      observe(await fetch(`${instance.url}/api/v1/${organizationId}/contacts`, { headers: { authorization: `Bearer ${token}` } }));
    const tokenRequest = async (instance: Instance, app: ApplicationWithSecret, fields: Record<string, string>): Promise<Observed> =>
      observe(await formPost(`${instance.url}/oauth/token`, fields, { authorization: basic(app.client_id, app.client_secret) }));
    const clientCredentials = (instance: Instance) =>
      tokenRequest(instance, privateApp, { grant_type: 'client_credentials', organization_id: String(organizationId) });
    const introspect = async (instance: Instance, token: string): Promise<Observed> =>
      observe(await formPost(`${instance.url}/oauth/introspect`, { token }, { authorization: basic(privateApp.client_id, privateApp.client_secret) }));

    beforeAll(async () => {
      // At once, on the empty database: both run the migrator through PgBouncer.
      [A, B] = await Promise.all([startInstance('A'), startInstance('B')]);
      // The test's own queries go through PgBouncer too, so that every session of orgauth's
      // application_name on the database is one of PgBouncer's (checked below).
      setup = await connectDatabase(target, { poolMax: 2 });
      const user = await createUser(setup.db, { email: owner.email, password: PASSWORD, name: 'Owner' });
      organizationId = (await createOrganization(setup.db, { name: 'Pooled Org', ownerUserId: user.id })).id;
      publicApp = await createApplication(setup.db, {
        organizationId,
        type: 'public',
        name: 'Web app',
        redirectUris: [REDIRECT_URI],
        scopes: 'contacts.read contacts.write',
        requirePkce: true,
      });
      privateApp = await createApplication(setup.db, { organizationId, type: 'private', name: 'Integration' });
      const login = await browser.fetch(B, '/login');
      const signedIn = await browser.postForm(B, '/login', { email: owner.email, password: PASSWORD, csrf_token: csrfIn(await login.text()) });
      expect(signedIn.status).toBe(303);
    });

    afterAll(async () => {
      for (const instance of [A, B]) {
        await instance?.app.close();
        await instance?.handle.close();
      }
      await setup?.close();
    });

    it('both migrated the empty database at once through PgBouncer: each migration once, no lock left behind, no warning', async () => {
      const { rows } = await sql<{ name: string }>`select name from kysely_migration order by name`.execute(setup.db);
      const files = readdirSync(MIGRATIONS_URL).filter((f) => /\.(js|ts)$/.test(f) && !f.endsWith('.d.ts')).map((f) => f.replace(/\.(js|ts)$/, '')).sort();
      expect(rows.map((r) => r.name)).toEqual(files);
      // One active key per algorithm in use (ES256 for access tokens, RS256 for ID tokens).
      expect(await setup.db.selectFrom('signing_keys').select('alg').where('retired_at', 'is', null).orderBy('alg').execute()).toEqual([{ alg: 'ES256' }, { alg: 'RS256' }]);
      expect(await advisoryLocks(databaseName(main))).toEqual([]);
      // The server-side statement_timeout was found in place (runtime.ts warns otherwise).
      for (const instance of [A, B]) expect(instance.logs()).toEqual([]);
      // Every query went through PgBouncer: orgauth's sessions on the database are its few server
      // connections, and the LISTEN connections, which went straight to PostgreSQL.
      const sessions = await adminQuery<{ application_name: string; n: number }>(
        `select application_name, count(*)::int as n from pg_stat_activity where datname = $1 and application_name like 'orgauth%' group by 1 order by 1`,
        [databaseName(main)],
      );
      const pooled = sessions.find((s) => s.application_name === 'orgauth')?.n ?? 0;
      expect(pooled).toBeGreaterThan(0);
      expect(pooled).toBeLessThanOrEqual(SERVER_POOL);
      // One LISTEN connection per instance, for every channel (revocations, applications, jobs, webhooks), straight to PostgreSQL.
      expect(sessions.find((s) => s.application_name === 'orgauth-listen')?.n).toBe(2);
    });

    it('the server cancels a slow statement shortly before the client would give up (the role’s statement_timeout, not a startup parameter)', async () => {
      const { rows } = await sql<{ statement_timeout: string }>`show statement_timeout`.execute(A.handle.db);
      expect(rows[0]?.statement_timeout).toBe(`${SERVER_STATEMENT_TIMEOUT_MS}ms`);
      const began = performance.now();
      const err = await sql`select pg_sleep(1.4)`.execute(A.handle.db).then(
        () => undefined,
        (e: unknown) => e,
      );
      const elapsed = performance.now() - began;
      // 57014 query_canceled, from PostgreSQL: the client's own 1.5 s "Query read timeout" did not fire.
      expect(err).toMatchObject({ code: '57014', message: expect.stringMatching(/statement timeout/) });
      expect(elapsed).toBeGreaterThanOrEqual(SERVER_STATEMENT_TIMEOUT_MS - 50);
      expect(elapsed).toBeLessThan(1500);
      // The connection is fine afterwards.
      expect((await sql<{ n: number }>`select 1 as n`.execute(A.handle.db)).rows).toEqual([{ n: 1 }]);
    });

    it('authorization code with PKCE spread over both instances, refresh rotations alternating, API calls with the tokens', async () => {
      const verifier = `pkce-verifier-${process.pid}-0123456789abcdefghijklmnopqrstuvwxyz`;
      const state = `state-${Math.random().toString(36).slice(2)}-0123456789`;
      const query = new URLSearchParams({
        client_id: publicApp.client_id,
        redirect_uri: REDIRECT_URI,
        response_type: 'code',
        scope: 'contacts.read contacts.write',
        state,
        code_challenge: createHash('sha256').update(verifier).digest('base64url'),
        code_challenge_method: 'S256',
      });
      // Authorize on A (the session is B's sign-in, in the database), consent posted to B, code redeemed on A.
      const consentPage = await browser.fetch(A, `/oauth/authorize?${query}`);
      const html = await consentPage.text();
      expect(consentPage.status, html.slice(0, 300)).toBe(200);
      const back = await browser.postForm(B, '/oauth/authorize', { ...hiddenIn(html), csrf_token: csrfIn(html), organization_id: String(organizationId), decision: 'approve' });
      expect(back.status).toBe(303);
      const location = new URL(back.headers.get('location') ?? '');
      expect(location.searchParams.get('state')).toBe(state);
      const code = location.searchParams.get('code') ?? '';

      const exchange = { grant_type: 'authorization_code', code, redirect_uri: REDIRECT_URI };
      const wrongVerifier = await tokenRequest(A, publicApp, { ...exchange, code_verifier: `${verifier}x` });
      expect(wrongVerifier.status, describeObserved(wrongVerifier)).toBe(400);
      // A failed verifier revokes nothing and does not consume the code: the right one works.
      const issued = await tokenRequest(A, publicApp, { ...exchange, code_verifier: verifier });
      expect(issued.status, explain(A, issued)).toBe(200);
      expect(issued.body).toMatchObject({ token_type: 'Bearer', organization_id: organizationId, organization_name: 'Pooled Org' });

      // Rotations alternate between the instances: each is the statement prepared by name on a
      // direct connection, here sent unnamed to whichever server connection PgBouncer picks.
      let tokens: { access_token: string; refresh_token: string } = issued.body;
      for (let i = 0; i < 12; i++) {
        const instance = i % 2 === 0 ? B : A;
        const refreshed = await tokenRequest(instance, publicApp, { grant_type: 'refresh_token', refresh_token: tokens.refresh_token });
        expect(refreshed.status, `refresh ${i + 1} on ${explain(instance, refreshed)}`).toBe(200);
        expect(refreshed.body.refresh_token).not.toBe(tokens.refresh_token);
        tokens = refreshed.body;
      }

      const created = await observe(
        await fetch(`${A.url}/api/v1/${organizationId}/contacts`, {
          method: 'POST',
          headers: { authorization: `Bearer ${tokens.access_token}`, 'content-type': 'application/json' },
          body: JSON.stringify({ name: 'Ada Lovelace', email: 'ada@example.com' }),
        }),
      );
      expect(created.status, explain(A, created)).toBe(201);
      const listed = await apiGet(B, tokens.access_token);
      expect(listed.status, explain(B, listed)).toBe(200);
      expect(listed.body.data.map((c: { id: number }) => c.id)).toContain(created.body.id);
      userTokens = tokens;
    });

    it('client_credentials on both instances, concurrent requests sharing the server connections, introspection', async () => {
      const [fromA, fromB] = await Promise.all([clientCredentials(A), clientCredentials(B)]);
      expect(fromA.status, explain(A, fromA)).toBe(200);
      expect(fromB.status, explain(B, fromB)).toBe(200);
      // 40 requests at once over 8 pool clients and 3 server connections.
      const burst = await Promise.all(
        Array.from({ length: 40 }, (_, i) => {
          const instance = i % 2 === 0 ? A : B;
          return i % 4 < 2 ? apiGet(instance, i % 4 === 0 ? fromB.body.access_token : fromA.body.access_token) : clientCredentials(instance);
        }),
      );
      expect(burst.map((o) => o.status)).toEqual(burst.map(() => 200));
      const active = await introspect(B, fromA.body.access_token);
      expect(active.body).toMatchObject({ active: true, client_id: privateApp.client_id, organization_id: organizationId });
    });

    it('a token revoked through A is refused by B within one second; B’s LISTEN connection hears the NOTIFY A sent through PgBouncer', async () => {
      const heard: string[] = [];
      const unlisten = await B.handle.listen(REVOCATION_CHANNEL, (payload) => heard.push(payload));
      try {
        const issued = await clientCredentials(A);
        const token: string = issued.body.access_token;
        const { jti } = claimsOf(token);
        // Warm B: the token verified and cached there.
        for (let i = 0; i < 3; i++) expect((await apiGet(B, token)).status).toBe(200);

        const revoked = await observe(await formPost(`${A.url}/oauth/revoke`, { token }, { authorization: basic(privateApp.client_id, privateApp.client_secret) }));
        expect(revoked.status).toBe(200);
        const since = performance.now();
        await honouredWithin('token revoked on A refused by B’s API', since, () => apiGet(B, token), (o) => o.status === 401);
        await honouredWithin('token revoked on A inactive in B’s introspection', since, () => introspect(B, token), (o) => o.body.active === false);
        // The revocation reached B by NOTIFY (an application's own token is revoked alone: the
        // payload names its jti), not only by the poll every 500 ms that meets the deadline too.
        await honouredWithin('token revocation NOTIFY heard on B’s LISTEN connection', since, async () => heardBy(heard), () => heard.some((p) => p.startsWith(`jti ${jti} `)), 10);
      } finally {
        await unlisten();
      }
    });

    it('a refresh token revoked through B: A refuses it at once, and the grant’s access token within one second', async () => {
      const { access_token: accessToken, refresh_token: refreshToken } = userTokens;
      const { grant_id: grantId } = claimsOf(accessToken);
      const heard: string[] = [];
      const unlisten = await A.handle.listen(REVOCATION_CHANNEL, (payload) => heard.push(payload));
      try {
        for (let i = 0; i < 3; i++) expect((await apiGet(A, accessToken)).status).toBe(200);
        const revoked = await observe(await formPost(`${B.url}/oauth/revoke`, { token: refreshToken }, { authorization: basic(publicApp.client_id, publicApp.client_secret) }));
        expect(revoked.status).toBe(200);
        const since = performance.now();
        // Refresh tokens are looked up on every use: refused at the first attempt.
        const attempt = await tokenRequest(A, publicApp, { grant_type: 'refresh_token', refresh_token: refreshToken });
        expect(attempt.status, describeObserved(attempt)).toBe(400);
        expect(attempt.body.error).toBe('invalid_grant');
        await honouredWithin('grant revoked on B: its access token refused by A’s API', since, () => apiGet(A, accessToken), (o) => o.status === 401);
        await honouredWithin('grant revocation NOTIFY heard on A’s LISTEN connection', since, async () => heardBy(heard), () => heard.some((p) => p.split(',').includes(String(grantId))), 10);
      } finally {
        await unlisten();
      }
    });

    it('NOTIFY sent through PgBouncer reaches LISTEN on DATABASE_LISTEN_URL (directly, or a session-mode PgBouncer database), never LISTEN through transaction pooling', async () => {
      const channel = `orgauth_pgbouncer_${process.pid}`;
      const listeners = {
        direct: env.DATABASE_LISTEN_URL!,
        'PgBouncer session mode': bouncer.url(`${databaseName(main)}_session`),
        'PgBouncer transaction mode': bouncer.url(databaseName(main)),
      };
      const heard: Record<string, string[]> = {};
      const handles: DatabaseHandle[] = [];
      const stops: (() => Promise<void>)[] = [];
      try {
        for (const [name, listenUrl] of Object.entries(listeners)) {
          heard[name] = [];
          const handle = await connectDatabase({ ...target, listenUrl }, { poolMax: 1 });
          handles.push(handle);
          stops.push(await handle.listen(channel, (payload) => heard[name]!.push(payload)));
        }
        // As a revocation does: pg_notify inside a transaction, through PgBouncer, delivered at commit.
        for (let i = 0; i < 5; i++) await inTransaction(A.handle.db, (trx) => sql`select pg_notify(${channel}, ${`n${i}`})`.execute(trx));
        const since = performance.now();
        const all = ['n0', 'n1', 'n2', 'n3', 'n4'];
        for (const name of ['direct', 'PgBouncer session mode']) {
          await honouredWithin(`NOTIFY through PgBouncer heard on LISTEN (${name})`, since, async () => heardBy(heard[name]!), () => heard[name]!.length === all.length, 10);
          expect(heard[name]).toEqual(all);
        }
        await new Promise((r) => setTimeout(r, DEADLINE_MS));
        expect(heard['PgBouncer transaction mode']).toEqual([]);
      } finally {
        for (const stop of stops) await stop();
        for (const handle of handles) await handle.close();
      }
    });
  });

  it('an unreachable DATABASE_LISTEN_URL stops the start with a line naming it, not DATABASE_URL', async () => {
    const config = testConfig({ ...env, DATABASE_LISTEN_URL: `postgres://postgres@127.0.0.1:${await freePort()}/orgauth` });
    const { handle } = await openDatabase(config);
    try {
      const logger = createLogger(config);
      const err = await buildApp(config, { db: handle.db, logger, listen: handle.listen }).then(
        async (app) => {
          await app.close();
          return undefined;
        },
        (e: unknown) => e,
      );
      expect(describeStartupError(err)).toEqual([expect.stringMatching(/^DATABASE_LISTEN_URL: cannot open the LISTEN connection \(.*ECONNREFUSED/)]);
    } finally {
      await handle.close();
    }
  });

  describe('controls: the same PgBouncer without DATABASE_POOLER=transaction', () => {
    const plainTarget = (): DatabaseTarget => ({ kind: 'postgres', url: bouncer.url(databaseName(controls)) });

    it('refuses the statement_timeout startup parameter of a request connection', async () => {
      const handle = await connectDatabase(plainTarget(), { poolMax: 1, queryTimeoutMs: 1500 });
      try {
        await expect(sql`select 1`.execute(handle.db)).rejects.toThrow(/unsupported startup parameter: statement_timeout/);
      } finally {
        await handle.close();
      }
      // With the mode, nothing is sent that it refuses.
      const pooled = await connectDatabase({ ...plainTarget(), pooler: 'transaction' } as DatabaseTarget, { poolMax: 1, queryTimeoutMs: 1500 });
      try {
        expect((await sql<{ n: number }>`select 1 as n`.execute(pooled.db)).rows).toEqual([{ n: 1 }]);
        // And the start-up check names what the operator has to set on this (unset) database.
        expect(await statementTimeoutProblem(pooled.db)).toMatch(
          new RegExp(`statement_timeout is off.*alter role postgres in database ${databaseName(controls)} set statement_timeout = '${SERVER_STATEMENT_TIMEOUT_MS}ms'`),
        );
      } finally {
        await pooled.close();
      }
    });

    it('loses a named prepared statement on the next server connection; the same statement unnamed works', async () => {
      const run = async (handle: DatabaseHandle) => {
        for (let i = 0; i < 2 * SERVER_POOL; i++) {
          const { rows } = await sql<{ n: number }>`${prepared('pgbouncer_probe')}select ${i}::int as n`.execute(handle.db);
          expect(rows).toEqual([{ n: i }]);
        }
      };
      await openServerConnections(bouncer.url(databaseName(controls)));
      const named = await connectDatabase(plainTarget(), { poolMax: 1 });
      try {
        await expect(run(named)).rejects.toThrow(/prepared statement "pgbouncer_probe" (does not exist|already exists)/);
      } finally {
        await named.close();
      }
      const unnamed = await connectDatabase({ ...plainTarget(), pooler: 'transaction' } as DatabaseTarget, { poolMax: 1 });
      try {
        await run(unnamed);
      } finally {
        await unnamed.close();
      }
    });

    it('an instance started through it on a database without the role’s statement_timeout migrates it and warns, naming the statement to run', async () => {
      const config = testConfig({ DATABASE_URL: bouncer.url(databaseName(controls)), DATABASE_POOLER: 'transaction', DATABASE_LISTEN_URL: controls.env.DATABASE_URL!, LOG_LEVEL: 'warn' });
      const capture = logCapture();
      const { handle, applied } = await openDatabase(config, createLogger(config, capture.stream));
      await handle.close();
      expect(applied.length).toBeGreaterThan(0);
      expect(await advisoryLocks(databaseName(controls))).toEqual([]);
      expect(capture.lines().map((line) => (JSON.parse(line) as { level: number; msg: string })).map(({ level, msg }) => ({ level, msg }))).toEqual([
        { level: 40, msg: expect.stringMatching(/statement_timeout is off.*alter role postgres in database \S+ set statement_timeout = '1250ms'$/) },
      ]);
    });

    it('Kysely’s own migration lock stays behind on a pooled session; the transaction-scoped one does not', async () => {
      const name = databaseName(controls);
      // Nothing is left to apply, but both migrators lock anyway. Ours: inside its transaction.
      await openServerConnections(bouncer.url(name));
      const ours = await connectDatabase({ ...plainTarget(), pooler: 'transaction' } as DatabaseTarget, { poolMax: 1, forMigrations: true });
      try {
        expect(await migrateToLatest(ours.db)).toEqual([]);
      } finally {
        await ours.close();
      }
      expect(await advisoryLocks(name)).toEqual([]);

      // Kysely's: pg_advisory_lock, the transaction and pg_advisory_unlock each on the next server
      // connection. The unlock finds no lock of its session, and the first session keeps it, for
      // whoever uses it next (another migrator there would not wait; one elsewhere would, an hour).
      await openServerConnections(bouncer.url(name));
      const kysely = await connectDatabase(plainTarget(), { poolMax: 1 });
      try {
        expect(await migrateToLatest(kysely.db)).toEqual([]);
      } finally {
        await kysely.close();
      }
      const left = await advisoryLocks(name);
      expect(left.length).toBeGreaterThan(0);
      await adminQuery('select pg_terminate_backend(pid) from unnest($1::int[]) pid', [left.map((l) => l.pid)]);
    });
  });
});
