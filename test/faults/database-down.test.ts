/**
 * R-3 (SECURITY.md), issue 7: the database goes away under load. The built server runs as a
 * real process on a disposable PostgreSQL cluster that this test starts, takes away three ways
 * (stopped, crashed, hung) and brings back; the machine's shared server is never touched.
 *
 * While it is away: every request that needs it fails within 2 s with 503
 * {"error": "temporarily_unavailable"}, none hangs and none is a 500; /readyz is 503;
 * /oauth/revoke and /oauth/introspect are 503, never 200 or active; the process stays up (pg
 * reports dropped connections as 'error' events, which crash a process that does not listen for
 * them). When it returns: service resumes without a restart, the LISTEN connection for
 * revocations is back, and a revocation made through another connection is honoured.
 */
import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectDatabase } from '../../src/db/connect.js';
import { isDatabaseUnavailable } from '../../src/db/errors.js';
import { migrateToLatest } from '../../src/db/migrate.js';
import { sha256Hex } from '../../src/lib/crypto.js';
import { REVOCATION_CHANNEL, revokeGrant } from '../../src/oauth/models/grants.js';
import { TEST_SECRET_KEY } from '../helpers/app.js';
import { TEST_DATABASE_URL } from '../helpers/db.js';
import { createOrgFixture, type OrgFixture } from '../helpers/oauth.js';
import { findPgBinaries, type PgCluster, startPgCluster } from '../helpers/pg-cluster.js';
import { freePort, type Running, SERVER, start } from '../helpers/process.js';
import {
  clientCredentials,
  insertCodes,
  jwtClaims,
  killIfRunning,
  listContacts,
  type Outcome,
  redeemCode,
  request,
  requireBuiltServer,
  sleep,
  tokenEndpoint,
  waitFor,
  waitUntilServing,
} from './harness.js';

/** R-3's bound for a request that needs the database while it is away. */
const FAIL_WITHIN_MS = 2000;
const LOAD_WORKERS = 4;
const REDIRECT = 'https://client.example.com/cb';
/** More codes than the load can use: each redemption attempt takes a new one. */
const CODES = 4000;

const binaries = findPgBinaries();
const skipReason = !TEST_DATABASE_URL
  ? 'they run in the PostgreSQL run of the suite (TEST_DATABASE_URL set); the embedded database cannot go away on its own'
  : typeof binaries === 'string'
    ? binaries
    : undefined;
if (skipReason && TEST_DATABASE_URL && process.env.CI) throw new Error(`the disposable-cluster fault tests cannot run in CI: ${skipReason}`);
if (skipReason) console.warn(`\n*** Database-down fault tests (R-3) SKIPPED: ${skipReason}. ***\n`);

describe.skipIf(skipReason !== undefined)('the database goes away under load (R-3), on a disposable PostgreSQL cluster', () => {
  let cluster: PgCluster;
  let server: Running;
  let baseUrl: string;
  let fixture: OrgFixture;
  const codes: string[] = [];
  /** Every request the load made, in order of completion. */
  const outcomes: Outcome[] = [];
  /**
   * Every request the load made, in order: the clock just before it was made and just after
   * (its Outcome's startedAt is between), whether it needs the database, and its answer to come.
   */
  const made: { before: number; after: number; needsDatabase: boolean; outcome: Promise<Outcome> }[] = [];
  /** What waits for the load (whenLoad), told of each request it makes and each answer. */
  const loadWatchers = new Set<() => void>();
  let loading = true;
  let load: Promise<void> = Promise.resolve();
  let accessToken: string;

  /** An authorization_code redemption: a transaction (consume the code, create the grant and the refresh token). */
  const redeem = (label = 'code', code = codes.pop()): Promise<Outcome> => {
    if (code === undefined) throw new Error('out of pre-issued codes');
    return redeemCode(baseUrl, fixture, code, REDIRECT, { label });
  };
  /** Requests that cannot be answered without the database: an API read and a code redemption. */
  const needsDatabase = (i: number): Promise<Outcome> => (i % 2 ? redeem() : listContacts(baseUrl, fixture, accessToken));

  /** Resolves with `probe()`'s first value other than undefined, tried now and whenever the load makes a request or gets an answer. */
  function whenLoad<T>(what: string, probe: () => T | undefined, timeoutMs = 30_000): Promise<T> {
    return new Promise((resolve, reject) => {
      const check = () => {
        const value = probe();
        if (value === undefined) return;
        settle();
        resolve(value);
      };
      const timer = setTimeout(() => {
        settle();
        reject(new Error(`the load did not come to ${what} within ${timeoutMs} ms`));
      }, timeoutMs);
      const settle = () => {
        clearTimeout(timer);
        loadWatchers.delete(check);
      };
      loadWatchers.add(check);
      check();
    });
  }
  const loadMoved = () => {
    for (const watcher of [...loadWatchers]) watcher();
  };

  beforeAll(async () => {
    requireBuiltServer();
    cluster = await startPgCluster();
    const setup = await connectDatabase({ kind: 'postgres', url: cluster.url() });
    try {
      await migrateToLatest(setup.db);
      fixture = await createOrgFixture(setup.db);
      await setup.db.insertInto('contacts').values({ organization_id: fixture.organizationId, name: 'Ada' }).execute();
      codes.push(...(await insertCodes(setup.db, fixture, CODES, REDIRECT)));
    } finally {
      await setup.close();
    }
    const port = await freePort();
    baseUrl = `http://127.0.0.1:${port}`;
    server = start(SERVER, [], { DATABASE_URL: cluster.url(), SECRET_KEY: TEST_SECRET_KEY, PORT: String(port), LOG_LEVEL: 'warn', API_RATE_LIMIT: '0' });
    await waitUntilServing(server, baseUrl);
    const issued = await clientCredentials(baseUrl, fixture);
    expect(issued.status).toBe(200);
    accessToken = (issued.body as { access_token: string }).access_token;

    // Fill the pool (10 connections) so that most of them sit idle when the database goes: pg
    // reports those as 'error' events on the pool.
    const burst = await Promise.all(Array.from({ length: 12 }, (_, i) => needsDatabase(i)));
    expect(burst.map((o) => o.status)).toEqual(burst.map(() => 200));

    // The load, until the end: mostly requests that need the database, and client_credentials
    // tokens (which the server may answer from its caches for a moment).
    load = Promise.all(
      Array.from({ length: LOAD_WORKERS }, async (_, worker) => {
        for (let i = 0; loading; i++) {
          const before = Date.now();
          const needs = (worker + i) % 3 !== 2;
          const outcome = needs ? needsDatabase(worker + i) : clientCredentials(baseUrl, fixture, 'client_credentials');
          made.push({ before, after: Date.now(), needsDatabase: needs, outcome });
          loadMoved();
          outcomes.push(await outcome);
          loadMoved();
          await sleep(20);
        }
      }),
    ).then(() => {});
  }, 60_000);

  afterAll(async () => {
    loading = false;
    await load;
    // SIGKILL: a graceful stop is not under test here, and would wait for a database left hung by a failed test.
    await killIfRunning(server);
    await cluster?.destroy();
  });

  const expectUp = () => {
    // The same process, still running: nothing it met while the database was away killed it.
    expect({ exitCode: server.child.exitCode, signal: server.child.signalCode }, server.output.stderr.slice(-3000)).toEqual({ exitCode: null, signal: null });
    expect(server.output.stderr).not.toMatch(/uncaught|unhandled/i);
    // No 500 either: the error handler logs those as "unhandled error".
    expect(server.output.stdout).not.toContain('unhandled error');
  };
  const unavailable = { status: 503, body: { error: 'temporarily_unavailable', error_description: expect.any(String) } };
  const shape = (o: Outcome) => ({ label: o.label, status: o.status, body: o.body });

  const outages = [
    { name: 'stopped (pg_ctl stop -m fast)', down: () => cluster.stop({ mode: 'fast' }), up: () => cluster.start() },
    { name: 'crashed (pg_ctl stop -m immediate)', down: () => cluster.stop({ mode: 'immediate' }), up: () => cluster.start() },
    {
      // Connections stay open and nothing answers, as behind a network partition: only the
      // server's own deadlines (connection and query timeouts) can end these requests.
      name: 'hung (SIGSTOP: connections open, no answers)',
      down: async () => cluster.freeze(),
      up: async () => cluster.thaw(),
    },
  ];

  for (const outage of outages) {
    it(`answers 503 within 2 s while the database is ${outage.name}, then recovers by itself`, async () => {
      const pid = server.child.pid;
      // The load runs against the database before it goes: an answer to each worker since this test began.
      const began = Date.now();
      await whenLoad('an answer to each worker', () => (outcomes.filter((o) => o.startedAt >= began).length >= LOAD_WORKERS ? true : undefined));
      const downBegan = Date.now();
      await outage.down();
      const down = Date.now();

      // Away. Probe the endpoints, and let the load run against it for longer than the 2 s bound.
      const [readyz, healthz, revoke, introspect, code, api, cc] = await Promise.all([
        request(baseUrl, { path: '/readyz' }),
        request(baseUrl, { path: '/healthz' }),
        tokenEndpoint(baseUrl, fixture, '/oauth/revoke', accessToken),
        tokenEndpoint(baseUrl, fixture, '/oauth/introspect', accessToken),
        redeem(),
        listContacts(baseUrl, fixture, accessToken),
        clientCredentials(baseUrl, fixture, 'client_credentials'),
      ]);
      // The outage lasts until two of the load's requests that need the database were made while
      // it was away, and FAIL_WITHIN_MS more: each had the whole bound to be answered before it
      // returns (a fixed length had, on a busy CI machine, only one such request once).
      const second = await whenLoad('two requests that need the database made while it is away', () => made.filter((m) => m.needsDatabase && m.before >= down)[1]);
      while (Date.now() < second.after + FAIL_WITHIN_MS) await sleep(second.after + FAIL_WITHIN_MS - Date.now());
      const stateWhileAway = { exitCode: server.child.exitCode, signal: server.child.signalCode };
      const upBegan = Date.now();
      await outage.up();
      const up = Date.now();
      expect(stateWhileAway, server.output.stderr.slice(-3000)).toEqual({ exitCode: null, signal: null });

      for (const [name, o] of Object.entries({ readyz, revoke, introspect, code, api })) {
        expect({ name, ...shape(o!) }, `${name} while the database is away`).toEqual({ name, label: o!.label, ...unavailable });
        expect(o!.headers?.['retry-after'], name).toBe('1');
        expect(o!.ms, name).toBeLessThan(FAIL_WITHIN_MS);
      }
      // Never active, never "revoked" (a 200 would tell the client the token is dead when it is not).
      expect(JSON.stringify(introspect!.body)).not.toContain('active');
      expect(healthz!.status).toBe(200);
      // client_credentials may be answered from the application and grant caches; if not, it is a 503 too.
      expect(cc!.status === 200 ? 200 : shape(cc!)).toEqual(cc!.status === 200 ? 200 : { label: cc!.label, ...unavailable });
      expect(cc!.ms).toBeLessThan(FAIL_WITHIN_MS);

      // Service resumes in the same process, without a restart.
      const recovered = await waitFor('a code redemption to succeed after the database returned', async () => ((await redeem()).status === 200 ? Date.now() : undefined), 15_000);
      expect(server.child.pid).toBe(pid);
      expect((await request(baseUrl, { path: '/readyz' })).status).toBe(200);
      const after = await Promise.all(Array.from({ length: 10 }, (_, i) => (i % 3 === 2 ? clientCredentials(baseUrl, fixture) : needsDatabase(i))));
      expect(after.map((o) => [o.label, o.status])).toEqual(after.map((o) => [o.label, 200]));
      // Every request the load made before then has its answer.
      await Promise.all(made.filter((m) => m.before < recovered).map((m) => m.outcome));

      // The load's view. Every request ended (no socket error, no hang) and none was a 500. Each
      // one made while the database was away (early enough to be answered before it came back)
      // got its answer within 2 s: 503 temporarily_unavailable when it needs the database. And
      // every failure around the outage was that 503, within 2 s.
      const around = outcomes.filter((o) => o.startedAt >= downBegan - FAIL_WITHIN_MS && o.startedAt < recovered);
      const away = around.filter((o) => o.startedAt >= down && o.startedAt <= upBegan - FAIL_WITHIN_MS);
      expect(around.filter((o) => o.error !== undefined)).toEqual([]);
      expect(away.filter((o) => o.label !== 'client_credentials').length).toBeGreaterThanOrEqual(2);
      for (const o of away) {
        expect(o.ms, `${o.label} made while the database was away`).toBeLessThan(FAIL_WITHIN_MS);
        if (o.label !== 'client_credentials') expect(shape(o)).toEqual({ label: o.label, ...unavailable });
      }
      for (const o of around) {
        if (o.status === 200) continue;
        expect(shape(o)).toEqual({ label: o.label, ...unavailable });
        expect(o.ms, `${o.label} started ${o.startedAt - downBegan} ms after the outage began`).toBeLessThan(FAIL_WITHIN_MS);
      }
      expect(outcomes.filter((o) => o.startedAt < up && o.error === 'TIMEOUT')).toEqual([]);

      // LISTEN for revocations is back on the instance's LISTEN connection (one for every channel)...
      const admin = new pg.Client({ connectionString: cluster.url() });
      await admin.connect();
      try {
        await waitFor(
          'the LISTEN connection to come back',
          async () => {
            const { rows } = await admin.query<{ query: string }>("select query from pg_stat_activity where application_name = 'orgauth-listen'");
            return rows.some((r) => r.query.split('; ').includes(`LISTEN "${REVOCATION_CHANNEL}"`)) ? true : undefined;
          },
          5000,
        );
      } finally {
        await admin.end();
      }
      // ...and a revocation made through another connection is honoured within a second (BR-5).
      const fresh = await redeem();
      expect(fresh.status).toBe(200);
      const token = (fresh.body as { access_token: string }).access_token;
      expect((await listContacts(baseUrl, fixture, token)).status).toBe(200);
      const elsewhere = await connectDatabase({ kind: 'postgres', url: cluster.url() });
      try {
        expect(await revokeGrant(elsewhere.db, Number(jwtClaims(token).grant_id), 'revoked_by_user')).toBe(true);
      } finally {
        await elsewhere.close();
      }
      await waitFor('the revoked token to be refused', async () => ((await listContacts(baseUrl, fixture, token)).status === 401 ? true : undefined), 1000, 20);
      expectUp();
    });
  }

  it('answers 503 within 2 s when the database holds a request up (a row lock), and commits nothing behind its back', async () => {
    const code = codes.pop()!;
    const admin = new pg.Client({ connectionString: cluster.url() });
    await admin.connect();
    const state = async () =>
      (await admin.query<{ consumed: boolean; grant_id: number | null }>('select consumed_at is not null as consumed, grant_id::int as grant_id from authorization_codes where code_hash = $1', [sha256Hex(code)])).rows[0];
    try {
      const adminPid = (await admin.query<{ pid: number }>('select pg_backend_pid() as pid')).rows[0]!.pid;
      await admin.query('begin');
      await admin.query('select id from authorization_codes where code_hash = $1 for update', [sha256Hex(code)]);
      const held = await redeem('held', code);
      expect(shape(held)).toEqual({ label: 'held', ...unavailable });
      expect(held.ms).toBeLessThan(FAIL_WITHIN_MS);
      // A statement still waiting for the lock (its client long gone) would consume the code once
      // the lock goes: the database itself ends it (statement_timeout), so none is left waiting.
      // (pg_locks, not pg_stat_activity: a transaction sees one snapshot of the latter.)
      await waitFor(
        'no statement left waiting for the lock',
        async () => ((await admin.query('select 1 from pg_locks where not granted and $1 = any(pg_blocking_pids(pid))', [adminPid])).rows.length === 0 ? true : undefined),
        5000,
        10,
      );
      await admin.query('commit');
      expect(await state()).toEqual({ consumed: false, grant_id: null });
      const redeemed = await redeem('again', code);
      expect(redeemed.status).toBe(200);
      expect(await state()).toEqual({ consumed: true, grant_id: jwtClaims((redeemed.body as { access_token: string }).access_token).grant_id });
    } finally {
      await admin.end();
    }
    expectUp();
  });

  it('fails a transaction on a hung database after one query timeout, not one per statement', async () => {
    loading = false;
    await load;
    // pg fails a timed-out query but keeps its connection waiting for the answer: without
    // discarding that connection, the transaction's ROLLBACK would queue behind it for a
    // second timeout (and so would the next request given that connection).
    const timeoutMs = 1000;
    const handle = await connectDatabase({ kind: 'postgres', url: cluster.url() }, { poolMax: 1, queryTimeoutMs: timeoutMs });
    try {
      await sql`select 1`.execute(handle.db);
      let failed: { err: unknown; ms: number };
      let t0 = 0;
      try {
        failed = await handle.db
          .transaction()
          .execute(async (trx) => {
            // The database hangs in the middle of the transaction (BEGIN went through).
            cluster.freeze();
            t0 = Date.now();
            return sql`select 1`.execute(trx);
          })
          .then(
            () => ({ err: undefined, ms: Date.now() - t0 }),
            (err: unknown) => ({ err, ms: Date.now() - t0 }),
          );
      } finally {
        cluster.thaw();
      }
      expect(isDatabaseUnavailable(failed.err), String(failed.err)).toBe(true);
      expect(failed.ms).toBeGreaterThanOrEqual(timeoutMs - 50);
      expect(failed.ms).toBeLessThan(timeoutMs * 1.8);
      // The handle works again once the database answers.
      await waitFor('the database to answer again', async () => ((await sql<{ one: number }>`select 1 as one`.execute(handle.db)).rows[0]?.one === 1 ? true : undefined), 5000);
    } finally {
      await handle.close();
    }
  });
});
