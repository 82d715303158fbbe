/**
 * R-5 (SECURITY.md), issue 7: the server process is killed (SIGKILL: no handler, no cleanup)
 * while it redeems authorization codes, again and again, until at least 200 redemptions were
 * cut off (their client saw the connection die instead of an answer). Then, in the database,
 * every code is either unconsumed with no grant and no token, or consumed with exactly its grant
 * and refresh token: consuming a code and issuing its tokens happen in one transaction. Every
 * code whose client did get its tokens is consumed with the grant those tokens name.
 *
 * Runs on the run's back-end: a fresh database on TEST_DATABASE_URL's server, or PGlite on disk.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { connectDatabase } from '../../src/db/connect.js';
import { sha256Hex } from '../../src/lib/crypto.js';
import { BACKEND } from '../helpers/db.js';
import { freePort, type Running, SERVER, start } from '../helpers/process.js';
import {
  databaseName,
  jwtClaims,
  killIfRunning,
  type Outcome,
  redeemCode,
  sessionStats,
  useServerDatabase,
  waitFor,
  waitUntilServing,
} from './harness.js';

const INTERRUPTED_TARGET = 200;
/**
 * Redemptions in flight at once in a round; the kill lands while most of them are. More on the
 * embedded database, which takes seconds to reopen after a crash (and runs one query at a time).
 */
const BATCH = BACKEND === 'pglite' ? 100 : 60;
/**
 * Servers started ahead, while a round runs: a start is most of a round's time. On PostgreSQL,
 * which any number of processes share, two besides the one in use; the embedded database is
 * opened by one process at a time.
 */
const AHEAD = BACKEND === 'postgres' ? 2 : 0;
const REDIRECT = 'https://client.example.com/cb';
/** A request that got no answer because the process died under it (not a refused connection). */
const CUT_OFF = new Set(['ECONNRESET', 'socket hang up', 'EPIPE', 'UND_ERR_SOCKET']);

describe(`SIGKILL while redeeming codes (R-5) on ${BACKEND}`, () => {
  let publicAppId: number;
  const setup = useServerDatabase(1500, REDIRECT, async (db, fixture) => {
    publicAppId = (await db.selectFrom('applications').select('id').where('client_id', '=', fixture.publicApp.client_id).executeTakeFirstOrThrow()).id;
  });

  /** Every server started, for the afterAll to stop (useServerDatabase's stops one). */
  const started: Running[] = [];
  afterAll(() => Promise.all(started.map((server) => killIfRunning(server))));

  async function startServer(): Promise<{ server: Running; baseUrl: string }> {
    const port = await freePort();
    const baseUrl = `http://127.0.0.1:${port}`;
    const running = start(SERVER, [], { ...setup.database.env, PORT: String(port), LOG_LEVEL: 'warn', API_RATE_LIMIT: '0' });
    started.push(running);
    // Started beside others (AHEAD): a bound for a hung start only.
    await waitUntilServing(running, baseUrl, 90_000);
    return { server: running, baseUrl };
  }

  /** The servers starting ahead (AHEAD), in the order they were started. */
  const ahead: Promise<{ server: Running; baseUrl: string }>[] = [];

  /** A serving server of its own: one started ahead, or a new one; `more`: start others ahead for the rounds to come. */
  function nextServer(more: boolean): Promise<{ server: Running; baseUrl: string }> {
    while (ahead.length < (more ? AHEAD + 1 : 1)) {
      const starting = startServer();
      // Its failure is the round's that takes it.
      starting.catch(() => {});
      ahead.push(starting);
    }
    return ahead.shift()!;
  }

  const redeem = (baseUrl: string, code: string): Promise<Outcome> => redeemCode(baseUrl, setup.fixture, code, REDIRECT, { label: code, timeoutMs: 20_000 });

  it(`leaves every code unconsumed without tokens, or consumed with its tokens, over ${INTERRUPTED_TARGET} cut-off redemptions`, async () => {
    const { database, fixture, codes } = setup;
    const name = databaseName(database);
    const before = database.target.kind === 'postgres' ? await sessionStats(name) : undefined;
    const unused = [...codes];
    const answered = new Map<string, { access_token: string; refresh_token: string }>();
    const cutOff: string[] = [];
    let rounds = 0;
    while (cutOff.length < INTERRUPTED_TARGET) {
      if (++rounds > 25) throw new Error(`only ${cutOff.length} redemptions were cut off in ${rounds - 1} rounds`);
      const { server: running, baseUrl } = await nextServer(true);
      const batch = unused.splice(0, BATCH);
      if (batch.length < BATCH) throw new Error('out of pre-issued codes');
      // Kill once a random number of redemptions (1 to 15) have been answered: the server is then
      // in full swing, with redemptions at every stage (reading the body, in the database, writing the answer).
      const killAfter = 1 + Math.floor(Math.random() * 15);
      let done = 0;
      const outcomes = await Promise.all(
        batch.map((code) =>
          redeem(baseUrl, code).then((o) => {
            if (o.status !== undefined && ++done === killAfter) running.child.kill('SIGKILL');
            return o;
          }),
        ),
      );
      expect(await running.exited).toEqual({ code: null, signal: 'SIGKILL' });
      for (const o of outcomes) {
        if (o.error !== undefined) {
          expect(CUT_OFF.has(o.error), `${o.error} is not a connection cut by the kill`).toBe(true);
          cutOff.push(o.label);
        } else {
          expect(o.status, JSON.stringify(o.body)).toBe(200);
          answered.set(o.label, o.body as { access_token: string; refresh_token: string });
        }
      }
    }

    // After a restart the server serves again on what the crashes left: a fresh code works...
    const { server: last, baseUrl } = await nextServer(false);
    const fresh = await redeem(baseUrl, unused.shift()!);
    expect(fresh.status).toBe(200);
    answered.set(fresh.label, fresh.body as { access_token: string; refresh_token: string });
    last.child.kill('SIGTERM');
    expect((await last.exited).code).toBe(0);

    const handle = await connectDatabase(database.target);
    try {
      const db = handle.db;
      const rows = await db.selectFrom('authorization_codes').select(['code_hash', 'consumed_at', 'grant_id']).where('application_id', '=', publicAppId).execute();
      const byHash = new Map(rows.map((r) => [r.code_hash, r]));
      const grants = await db.selectFrom('grants').select(['id', 'user_id', 'organization_id', 'revoked_at']).where('application_id', '=', publicAppId).execute();
      const refreshTokens = await db
        .selectFrom('refresh_tokens as r')
        .innerJoin('grants as g', 'g.id', 'r.grant_id')
        .select(['r.grant_id', 'r.token_hash', 'r.parent_id'])
        .where('g.application_id', '=', publicAppId)
        .execute();
      const tokensOf = new Map<number, string[]>();
      for (const t of refreshTokens) tokensOf.set(t.grant_id, [...(tokensOf.get(t.grant_id) ?? []), t.token_hash]);

      // Every code: consumed ⇔ it names a grant, and that grant has exactly its one refresh token.
      const broken: unknown[] = [];
      for (const r of rows) {
        const consumed = r.consumed_at !== null;
        const grant = r.grant_id === null ? undefined : grants.find((g) => g.id === r.grant_id);
        const tokens = r.grant_id === null ? [] : (tokensOf.get(r.grant_id) ?? []);
        const whole = consumed ? grant !== undefined && grant.user_id === fixture.ownerId && tokens.length === 1 : r.grant_id === null;
        if (!whole) broken.push({ code_hash: r.code_hash, consumed, grant_id: r.grant_id, grant: grant ?? null, refresh_tokens: tokens.length });
      }
      expect(broken).toEqual([]);
      // No grant or refresh token without the code it came from: one consumed code per grant.
      const consumed = rows.filter((r) => r.consumed_at !== null);
      expect(new Set(consumed.map((r) => r.grant_id)).size).toBe(consumed.length);
      expect(grants.map((g) => g.id).sort((a, b) => a - b)).toEqual(consumed.map((r) => r.grant_id!).sort((a, b) => a - b));
      expect(refreshTokens).toHaveLength(consumed.length);
      expect(grants.filter((g) => g.revoked_at !== null)).toEqual([]);

      // Every answered redemption is consumed, under the grant its tokens name.
      for (const [code, tokens] of answered) {
        const row = byHash.get(sha256Hex(code));
        expect(row?.consumed_at, 'an answered code is consumed').not.toBeNull();
        expect(jwtClaims(tokens.access_token).grant_id).toBe(row!.grant_id);
        expect(tokensOf.get(row!.grant_id!)).toEqual([sha256Hex(tokens.refresh_token)]);
      }
      // The cut-off ones went either way; both outcomes are whole (checked above).
      const cutConsumed = cutOff.filter((code) => byHash.get(sha256Hex(code))?.consumed_at !== null).length;
      console.log(
        `R-5 on ${BACKEND}: ${rounds} kills, ${cutOff.length} redemptions cut off (${cutConsumed} committed before the kill, ${cutOff.length - cutConsumed} not), ${answered.size} answered`,
      );
      expect(cutOff.length).toBeGreaterThanOrEqual(INTERRUPTED_TARGET);
    } finally {
      await handle.close();
    }
    if (before) {
      // PostgreSQL saw the killed processes' sessions end without a goodbye: the counter the
      // SIGTERM test relies on to tell a clean close from a process that just vanished.
      await waitFor('abandoned sessions to be counted', async () => ((await sessionStats(name)).abandoned > before.abandoned ? true : undefined), 5000, 50);
    }
  }, 120_000);
});
