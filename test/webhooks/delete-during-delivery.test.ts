/**
 * Deleting a webhook endpoint while one of its deliveries is under way (issue 41 §7): the delete
 * answers 204 every time, and the endpoint, its deliveries and their attempts are gone.
 *
 * The race that answered 503: the dispatcher, recording an attempt, locked the delivery and then
 * the endpoint (failing_since); the delete locks the endpoint and then, by the cascade, the
 * delivery. Met half-way they deadlocked (40P01) and PostgreSQL cancelled the delete. On
 * PostgreSQL the test makes them meet half-way every round, waiting on the database's own state,
 * not the clock: a transaction of the test's holds webhook_attempts (LOCK TABLE ... SHARE), so
 * each recording stops at its attempt's insert, having written the delivery; the deletes are
 * sent then, and once each waits on a lock the table is let go. PGlite runs one transaction at a
 * time: there the same rounds check the outcome without the interleaving.
 */
import type { FastifyInstance } from 'fastify';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectDatabase, type DatabaseHandle } from '../../src/db/connect.js';
import { KNOWN_SCOPES } from '../../src/oauth/helpers/scopes.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { buildTestApp, logCapture, TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { clientCredentialsToken, createOrgFixture, type OrgFixture } from '../helpers/oauth.js';
import { type Answer, WebhookReceiver } from '../helpers/webhook-receiver.js';

/** Endpoints deleted in all, a round at a time. */
const ENDPOINTS = 50;
/** Deliveries in flight at once: below the dispatcher's 8 per instance, so each round's are all claimed together. */
const ROUND = 5;

let t: Awaited<ReturnType<typeof createTestDatabase>>;
/** The app's own pool on PostgreSQL, big enough for a round's recordings and deletes all waiting at once. */
let appHandle: DatabaseHandle;
let receiver: WebhookReceiver;
let org: OrgFixture;
let paths = 0;

beforeAll(async () => {
  t = await createTestDatabase();
  appHandle = BACKEND === 'postgres' ? await connectDatabase(t.target, { poolMax: 4 * ROUND }) : t.handle;
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  org = await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') });
  receiver = await WebhookReceiver.start();
});
afterAll(async () => {
  await receiver?.stop();
  if (appHandle !== t?.handle) await appHandle?.close();
  await t?.close();
});

async function startApp(): Promise<{ app: FastifyInstance; token: string; logs: ReturnType<typeof logCapture> }> {
  const logs = logCapture();
  const app = await buildTestApp(appHandle.db, { listen: appHandle.listen, logStream: logs.stream, env: { WEBHOOK_ALLOW_PRIVATE: '1' } });
  return { app, token: await clientCredentialsToken(app, org), logs };
}

function api(app: FastifyInstance, token: string, method: 'GET' | 'POST' | 'DELETE', path: string, body?: object) {
  return app.inject({ method, url: `/api/v1/${org.organizationId}${path}`, headers: { authorization: `Bearer ${token}` }, ...(body ? { payload: body } : {}) });
}

/** A receiver that holds every request until `let()` is called, then answers `answer`. */
function slowReceiver(answer: Answer): { let(): void } {
  let open!: () => void;
  const gate = new Promise<void>((resolve) => (open = resolve));
  receiver.answer = () => gate.then(() => answer);
  return { let: open };
}

/** `count` endpoints, each pinged, with the ping's request arrived at the receiver and held there. */
async function endpointsInFlight(app: FastifyInstance, token: string, count: number): Promise<{ id: number; delivery: number; messageId: string }[]> {
  const made: { id: number; delivery: number; messageId: string; path: string }[] = [];
  for (let i = 0; i < count; i++) {
    const path = `/hook-${++paths}`;
    const created = await api(app, token, 'POST', '/webhooks', { url: receiver.url(path), events: ['member.added'] });
    expect(created.statusCode, created.body).toBe(201);
    const ping = await api(app, token, 'POST', `/webhooks/${created.json().id}/ping`);
    expect(ping.statusCode, ping.body).toBe(202);
    made.push({ id: created.json().id, delivery: ping.json().id, messageId: ping.json().message_id, path });
  }
  for (const endpoint of made) await receiver.waitFor((r) => r.path === endpoint.path);
  return made;
}

/** Backends of this test's database waiting for a lock (a row, a transaction or a table). */
async function lockWaiters(): Promise<number> {
  const { rows } = await sql<{ n: number }>`
    select count(*)::int as n from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'`.execute(t.handle.db);
  return rows[0]!.n;
}

async function waitForLockWaiters(count: number): Promise<void> {
  await expect.poll(lockWaiters, { timeout: 15_000, interval: 10 }).toBe(count);
}

/** Holds webhook_attempts until `release()`: an attempt's insert waits for it. */
async function holdAttempts(): Promise<{ release(): Promise<void> }> {
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  let held!: () => void;
  const holding = new Promise<void>((resolve) => (held = resolve));
  const done = t.handle.db.transaction().execute(async (trx) => {
    await sql`lock table webhook_attempts in share mode`.execute(trx);
    held();
    await released;
  });
  await Promise.race([holding, done]);
  return {
    release: async () => {
      release();
      await done;
    },
  };
}

/** What is left of these endpoints: their rows, their deliveries and those deliveries' attempts. */
async function leftOf(endpoints: { id: number; delivery: number }[]) {
  const db = t.handle.db;
  const ids = endpoints.map((e) => e.id);
  const deliveries = endpoints.map((e) => e.delivery);
  return {
    endpoints: await db.selectFrom('webhook_endpoints').select('id').where('id', 'in', ids).execute(),
    deliveries: await db.selectFrom('webhook_deliveries').select('id').where((eb) => eb.or([eb('endpoint_id', 'in', ids), eb('id', 'in', deliveries)])).execute(),
    attempts: await db.selectFrom('webhook_attempts').select('id').where('delivery_id', 'in', deliveries).execute(),
  };
}

/** The app's log lines at warn or above (pino levels 40+). */
function warnings(logs: ReturnType<typeof logCapture>): string[] {
  return logs.lines().filter((line) => (JSON.parse(line) as { level: number }).level >= 40);
}

describe(`deleting a webhook endpoint during a delivery on ${BACKEND}`, () => {
  it(`answers 204 to each of ${ENDPOINTS} deletes made while the endpoint's failed attempt is being recorded, and leaves nothing of it`, { timeout: 120_000 }, async () => {
    const { app, token, logs } = await startApp();
    try {
      for (let round = 0; round < ENDPOINTS / ROUND; round++) {
        const receiverAnswers = slowReceiver({ status: 500, body: 'slow, and failing' });
        const endpoints = await endpointsInFlight(app, token, ROUND);
        const attempts = BACKEND === 'postgres' ? await holdAttempts() : undefined;
        receiverAnswers.let();
        // Each recording has written its delivery and waits to insert its attempt.
        if (attempts) await waitForLockWaiters(ROUND);
        const deletes = endpoints.map((e) => api(app, token, 'DELETE', `/webhooks/${e.id}`));
        if (attempts) {
          // Each delete waits on a lock too: on the recording's delivery (before the fix, a
          // deadlock once the recording goes on to the endpoint), or on the endpoint itself.
          await waitForLockWaiters(2 * ROUND);
          await attempts.release();
        }
        const answered = await Promise.all(deletes);
        expect({ round, answers: answered.map((res) => [res.statusCode, res.body]) }).toEqual({ round, answers: endpoints.map(() => [204, '']) });
        expect(await leftOf(endpoints)).toEqual({ endpoints: [], deliveries: [], attempts: [] });
        // Not retried either: each ping reached the receiver once.
        for (const endpoint of endpoints) expect(receiver.withId(endpoint.messageId)).toHaveLength(1);
      }
      expect((await api(app, token, 'GET', '/webhooks')).json().data).toEqual([]);
    } finally {
      await app.close();
    }
    expect(warnings(logs)).toEqual([]);
  });

  it('ends a delivery whose endpoint is deleted while its request is in flight: nothing recorded or retried, nothing logged above info', async () => {
    const { app, token, logs } = await startApp();
    let endpoints: { id: number; delivery: number; messageId: string }[];
    try {
      const receiverAnswers = slowReceiver({ status: 204 });
      endpoints = await endpointsInFlight(app, token, ROUND);
      const answered = await Promise.all(endpoints.map((e) => api(app, token, 'DELETE', `/webhooks/${e.id}`)));
      expect(answered.map((res) => [res.statusCode, res.body])).toEqual(endpoints.map(() => [204, '']));
      receiverAnswers.let();
    } finally {
      // Closing waits for the deliveries in flight to end (src/app.ts: the dispatcher's stop).
      await app.close();
    }
    expect(await leftOf(endpoints)).toEqual({ endpoints: [], deliveries: [], attempts: [] });
    for (const endpoint of endpoints) expect(receiver.withId(endpoint.messageId)).toHaveLength(1);
    expect(warnings(logs)).toEqual([]);
  });
});
