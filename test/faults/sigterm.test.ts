/**
 * R-4 (SECURITY.md), issue 7: SIGTERM under load. With 50 requests received (30 of them still
 * uploading their bodies: code redemptions, client_credentials tokens, contacts created through
 * the API; 20 API reads) and, on PostgreSQL, a redemption held up in the database by a row lock,
 * the server gets SIGTERM: it stops accepting connections at once, finishes every in-flight
 * request with a 2xx, exits with code 0 within 10 s, and closes its database connections
 * properly. On PostgreSQL "properly" is read off the server's own statistics: a session whose
 * client vanished without saying goodbye counts in pg_stat_database.sessions_abandoned (the
 * SIGKILL test checks that this counter does see an unclean exit); on the embedded database the
 * lock file beside it is removed only by a clean close.
 *
 * Runs on the run's back-end: a fresh database on TEST_DATABASE_URL's server, or PGlite on disk.
 */
import { existsSync } from 'node:fs';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { sha256Hex } from '../../src/lib/crypto.js';
import { BACKEND } from '../helpers/db.js';
import { basic, form } from '../helpers/oauth.js';
import { freePort, SERVER, start } from '../helpers/process.js';
import {
  clientCredentials,
  connectionRefused,
  databaseName,
  listContacts,
  type Outcome,
  request,
  sessionStats,
  slowUpload,
  useServerDatabase,
  waitFor,
  waitUntilServing,
} from './harness.js';

/** R-4's bound from SIGTERM to the exit. */
const EXIT_WITHIN_MS = 10_000;
const IN_FLIGHT = 50;
const REDIRECT = 'https://client.example.com/cb';

describe(`SIGTERM under load (R-4) on ${BACKEND}`, () => {
  const setup = useServerDatabase(100, REDIRECT, async (db, fixture) => {
    await db.insertInto('contacts').values({ organization_id: fixture.organizationId, name: 'Ada' }).execute();
  });

  it('finishes in-flight requests with 2xx, refuses new connections, exits 0 within 10 s and closes the database cleanly', async () => {
    const { database, fixture, codes } = setup;
    const name = databaseName(database);
    const before = BACKEND === 'postgres' ? await sessionStats(name) : undefined;

    const port = await freePort();
    const baseUrl = `http://127.0.0.1:${port}`;
    // LOG_LEVEL=info: Fastify logs "incoming request" once it has a request's head, past its
    // closing check. That is how this test knows the requests are in flight before the signal.
    const running = start(SERVER, [], { ...database.env, PORT: String(port), LOG_LEVEL: 'info', API_RATE_LIMIT: '0' });
    setup.server = running;
    await waitUntilServing(running, baseUrl);
    const received = () => (running.output.stdout.match(/"msg":"incoming request"/g) ?? []).length;
    const accessToken = ((await clientCredentials(baseUrl, fixture)).body as { access_token: string }).access_token;
    const publicAuth = { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(fixture.publicApp.client_id, fixture.publicApp.client_secret) };
    const privateAuth = { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(fixture.privateApp.client_id, fixture.privateApp.client_secret) };
    const redemption = (code: string) => form({ grant_type: 'authorization_code', code, redirect_uri: REDIRECT });
    const receivedBefore = received();

    // 50 requests in flight: 30 whose bodies are still arriving when the signal comes (code
    // redemptions, client_credentials tokens, contacts created through the API), and 20 API reads
    // sent at the same time, which the server answers as they come.
    const uploads = Array.from({ length: 30 }, (_, i) =>
      i % 3 === 0
        ? slowUpload(baseUrl, { path: '/oauth/token', label: 'code', headers: publicAuth, body: redemption(codes.pop()!) })
        : i % 3 === 1
          ? slowUpload(baseUrl, { path: '/oauth/token', label: 'client_credentials', headers: privateAuth, body: form({ grant_type: 'client_credentials', organization_id: String(fixture.organizationId) }) })
          : slowUpload(baseUrl, {
              path: `/api/v1/${fixture.organizationId}/contacts`,
              label: 'create contact',
              headers: { 'content-type': 'application/json', authorization: `Bearer ${accessToken}` },
              body: JSON.stringify({ name: `Contact ${i}`, notes: 'x'.repeat(200) }),
            }),
    );
    const reads = Array.from({ length: IN_FLIGHT - uploads.length }, () => listContacts(baseUrl, fixture, accessToken, 'api'));

    await waitFor(`the server to have received all ${IN_FLIGHT} requests`, async () => (received() - receivedBefore >= IN_FLIGHT ? true : undefined), 5000, 2);

    // On PostgreSQL, one more held up in the database: its code's row is locked by another
    // transaction, until the server has the signal (well under the server's statement deadline).
    let held: { outcome: Promise<Outcome>; release: () => Promise<void> } | undefined;
    if (database.target.kind === 'postgres') {
      const code = codes.pop()!;
      const locker = new pg.Client({ connectionString: database.target.url });
      const watcher = new pg.Client({ connectionString: database.target.url });
      for (const c of [locker, watcher]) {
        c.on('error', () => {});
        await c.connect();
      }
      await locker.query('begin');
      await locker.query('select id from authorization_codes where code_hash = $1 for update', [sha256Hex(code)]);
      const outcome = request(baseUrl, { method: 'POST', path: '/oauth/token', label: 'held by a lock', headers: publicAuth, body: redemption(code) });
      try {
        // (From another connection: inside its transaction the locker would see one snapshot of pg_stat_activity.)
        await waitFor(
          'the redemption to wait for the lock',
          async () => {
            const { rows } = await watcher.query("select 1 from pg_stat_activity where application_name = 'orgauth' and wait_event_type = 'Lock'");
            return rows.length > 0 ? true : undefined;
          },
          5000,
          5,
        );
      } finally {
        await watcher.end();
      }
      held = { outcome, release: () => locker.query('commit').then(() => locker.end()) };
    }
    const expected = IN_FLIGHT + (held ? 1 : 0);

    const signalled = Date.now();
    running.child.kill('SIGTERM');
    const exitedAt = running.exited.then((exit) => ({ ...exit, at: Date.now() }));

    if (held) {
      await running.waitForOutput(/SIGTERM received, shutting down/);
      await held.release();
    }
    // No new connections once it is shutting down (the uploads in flight keep it alive meanwhile).
    await waitFor('new connections to be refused', async () => ((await connectionRefused(baseUrl)) ? true : undefined), 2000, 20);
    expect(running.child.exitCode).toBeNull();
    // The uploads now complete, and must all still be answered.
    for (const upload of uploads) upload.sendRest();

    const outcomes = [...(await Promise.all([...uploads.map((u) => u.outcome), ...reads])), ...(held ? [await held.outcome] : [])];
    expect(outcomes).toHaveLength(expected);
    const failures = outcomes.filter((o) => o.error !== undefined || o.status === undefined || o.status < 200 || o.status >= 300);
    expect(failures.map((o) => ({ label: o.label, status: o.status, error: o.error, body: o.body }))).toEqual([]);
    // At least the 30 uploads (and the held redemption) were answered after the signal.
    expect(outcomes.filter((o) => o.endedAt > signalled).length).toBeGreaterThanOrEqual(uploads.length + (held ? 1 : 0));

    const exit = await exitedAt;
    expect({ code: exit.code, signal: exit.signal }, running.output.stderr).toEqual({ code: 0, signal: null });
    expect(exit.at - signalled).toBeLessThan(EXIT_WITHIN_MS);
    expect(running.output.stderr).toContain('SIGTERM received, shutting down');
    expect(running.output.stderr).not.toContain('shutdown timed out');

    if (database.target.kind === 'postgres') {
      // Every connection of the process is gone, and none of them was dropped without a goodbye
      // (pool.end() and the LISTEN client's end() send one; a process exit does not), in all its
      // life: from its start (src/app.ts starts the queues once the app is ready) to its exit. A
      // session is counted before it leaves pg_stat_activity (its statistics are flushed before
      // its entry there is cleared, PostgreSQL's pgstat_shutdown_hook), so none is counted later.
      const after = await waitFor('the server sessions to end', async () => {
        const stats = await sessionStats(name);
        return stats.orgauthSessions === 0 ? stats : undefined;
      }, 5000, 50);
      expect(after.abandoned).toBe(before!.abandoned);
    } else {
      // The embedded database was closed: its lock file is released only by a clean close.
      expect(existsSync(`${database.target.dataDir}.lock`)).toBe(false);
    }
  }, 60_000);
});
