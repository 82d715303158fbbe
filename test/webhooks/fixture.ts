/**
 * The delivery tests' world: organizations with an owner, endpoints inserted as rows (their
 * secrets sealed as the model seals them, so the tests do not depend on how endpoints are
 * created), events made the way the application makes them (an audited change, which the trigger
 * of migration 0017 turns into deliveries), and a dispatcher built as the app builds it.
 *
 * And the tests' clock, which is not the wall clock: they wait on the queue's own changes (a
 * NOTIFY of a trigger of the test's, see watchQueue) rather than poll, and make a retry's backoff
 * pass by bringing the delivery's next_attempt_at forward to now and waking the dispatcher
 * (retryNow), rather than sleep through it.
 */
import type { Writable } from 'node:stream';
import { sql } from 'kysely';
import { vi } from 'vitest';
import { createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { recordAuditEvent } from '../../src/audit/events.js';
import type { DB, Listen } from '../../src/db/connect.js';
import type { ResolveHostname } from '../../src/lib/outbound.js';
import { createLogger } from '../../src/logger.js';
import { Metrics } from '../../src/metrics.js';
import { WebhookDispatcher } from '../../src/webhooks/dispatcher.js';

/** How long a dispatcher's stop waits for requests in flight (src/webhooks/dispatcher.ts, not exported). */
const STOP_WAIT_MS = 2000;
import { newWebhookSecret, sealWebhookSecret } from '../../src/webhooks/secrets.js';
import { TEST_SECRET_KEY, testConfig } from '../helpers/app.js';

let count = 0;

export async function newOrganization(db: DB): Promise<{ id: number; ownerEmail: string }> {
  const ownerEmail = `webhook-owner-${process.pid}-${++count}@example.com`;
  const owner = await createUser(db, { email: ownerEmail, password: 'webhook-owner-password-1', name: 'Olivia Owner' });
  const organization = await createOrganization(db, { name: `Webhook Org ${count}`, ownerUserId: owner.id });
  return { id: organization.id, ownerEmail };
}

export interface TestEndpoint {
  id: number;
  secret: string;
}

/** An endpoint row as the model would write it, without its URL check (tests of delivery-time checks rely on that). */
export async function insertEndpoint(db: DB, organizationId: number, url: string, events: string[] = ['member.added']): Promise<TestEndpoint> {
  const secret = newWebhookSecret();
  const row = await db
    .insertInto('webhook_endpoints')
    .values({ organization_id: organizationId, url, events, secret_sealed: sealWebhookSecret(TEST_SECRET_KEY, secret) })
    .returning('id')
    .executeTakeFirstOrThrow();
  return { id: row.id, secret };
}

/** An audited change the endpoints may subscribe to; returns the event it became, if any endpoint wanted it. */
export async function emit(db: DB, organizationId: number, action = 'member.added', details: Record<string, unknown> = { user_id: 1, role: 'member' }) {
  await recordAuditEvent(db, { organizationId, action, details });
  return db.selectFrom('webhook_events').selectAll().where('organization_id', '=', organizationId).orderBy('id', 'desc').executeTakeFirst();
}

export function deliveryOf(db: DB, eventId: number, endpointId: number) {
  return db.selectFrom('webhook_deliveries').selectAll().where('event_id', '=', eventId).where('endpoint_id', '=', endpointId).executeTakeFirstOrThrow();
}

export function attemptsOf(db: DB, deliveryId: number) {
  return db.selectFrom('webhook_attempts').selectAll().where('delivery_id', '=', deliveryId).orderBy('attempt').execute();
}

export interface TestDispatcher {
  dispatcher: WebhookDispatcher;
  metrics: Metrics;
  stop(): Promise<void>;
}

/**
 * A started dispatcher over `db`, configured from `env` on top of the test defaults (give
 * WEBHOOK_ALLOW_PRIVATE=1 to reach a receiver on 127.0.0.1).
 */
export async function startDispatcher(
  db: DB,
  options: { env?: Record<string, string>; listen?: Listen; lookup?: ResolveHostname; logStream?: Writable } = {},
): Promise<TestDispatcher> {
  const config = testConfig(options.env);
  const metrics = new Metrics();
  const logger = createLogger({ logLevel: options.logStream ? 'info' : 'silent' }, options.logStream);
  const dispatcher = new WebhookDispatcher(db, {
    config,
    logger,
    metrics,
    listen: options.listen,
    outbound: options.lookup ? { lookup: options.lookup } : undefined,
  });
  await dispatcher.start();
  return { dispatcher, metrics, stop: () => dispatcher.stop() };
}

/** A metric's value for one outcome. */
export async function outcomeCount(metrics: Metrics, outcome: 'succeeded' | 'retry' | 'failed'): Promise<number> {
  return (await metrics.webhookDeliveries.get()).values.find((v) => v.labels.outcome === outcome)?.value ?? 0;
}

/** The timers as they were at load: a test that fakes the clock (vi.useFakeTimers) still gets real timeouts here. */
const realSetTimeout = globalThis.setTimeout;
const realClearTimeout = globalThis.clearTimeout;

/** The channel of watchQueue's trigger; the application never uses it. */
const WATCH_CHANNEL = 'orgauth_test_webhook_queue';

export interface QueueWatch {
  /**
   * Resolves with what `check` returns once it is neither undefined, null nor false: checked
   * now, then again after every change of a delivery, an attempt or an endpoint (and after the
   * listen connection comes back). Rejects after `timeout` ms, saying it waited for `what`.
   */
  until<T>(check: () => Promise<T | undefined | null | false>, what: string, timeout?: number): Promise<T>;
  close(): Promise<void>;
}

/**
 * Lets a test wait on the webhook queue itself: a trigger of the test's (added to this test
 * database only) NOTIFYs WATCH_CHANNEL whenever a row of webhook_deliveries, webhook_attempts or
 * webhook_endpoints is written, which is when the condition a test waits for can have changed.
 */
export async function watchQueue(db: DB, listen: Listen): Promise<QueueWatch> {
  await sql`create or replace function orgauth_test_queue_changed() returns trigger language plpgsql as $$
    begin
      -- One payload for every row and table: a transaction's changes make one notification.
      perform pg_notify(${sql.lit(WATCH_CHANNEL)}, '');
      return null;
    end $$`.execute(db);
  for (const table of ['webhook_deliveries', 'webhook_attempts', 'webhook_endpoints']) {
    await sql`drop trigger if exists orgauth_test_queue_changed on ${sql.table(table)}`.execute(db);
    await sql`create trigger orgauth_test_queue_changed after insert or update or delete on ${sql.table(table)}
      for each row execute function orgauth_test_queue_changed()`.execute(db);
  }
  const checks = new Set<() => void>();
  const changed = () => {
    for (const check of [...checks]) check();
  };
  const unlisten = await listen(WATCH_CHANNEL, changed, changed);
  return {
    async until<T>(check: () => Promise<T | undefined | null | false>, what: string, timeout = 20_000): Promise<T> {
      let recheck!: () => void;
      let timer: NodeJS.Timeout | undefined;
      try {
        return await new Promise<T>((resolve, reject) => {
          let running = false;
          let again = false;
          let done = false;
          recheck = () => {
            if (done) return;
            if (running) {
              again = true;
              return;
            }
            running = true;
            void (async () => {
              try {
                do {
                  again = false;
                  const value = await check();
                  if (value !== undefined && value !== null && value !== false) {
                    done = true;
                    resolve(value);
                  }
                } while (again && !done);
              } catch (err) {
                done = true;
                reject(err);
              } finally {
                running = false;
              }
            })();
          };
          checks.add(recheck);
          timer = realSetTimeout(() => {
            done = true;
            reject(new Error(`waited ${timeout} ms for ${what}`));
          }, timeout);
          recheck();
        });
      } finally {
        checks.delete(recheck);
        realClearTimeout(timer);
      }
    },
    close: () => unlisten(),
  };
}

type Delivery = Awaited<ReturnType<typeof deliveryOf>>;

/** Waits until delivery `id` has at least `count` attempts logged; returns them. */
export function attemptsLogged(watch: QueueWatch, db: DB, id: number, count: number) {
  return watch.until(async () => {
    const attempts = await attemptsOf(db, id);
    return attempts.length >= count && attempts;
  }, `${count} attempts of delivery ${id} to be logged`);
}

/** Waits until delivery `id` is in `state`; returns it. */
export function deliveryState(watch: QueueWatch, db: DB, id: number, state: Delivery['state']) {
  return watch.until(async () => {
    const delivery = await db.selectFrom('webhook_deliveries').selectAll().where('id', '=', id).executeTakeFirst();
    return delivery?.state === state && delivery;
  }, `delivery ${id} to be ${state}`);
}

/**
 * Waits until no attempt of delivery `id` is in flight (each claim of it has its attempt logged,
 * or it has ended), and returns it: the moment between two attempts, when only its backoff is left.
 */
export function betweenAttempts(watch: QueueWatch, db: DB, id: number): Promise<Delivery> {
  return watch.until(async () => {
    const delivery = await db.selectFrom('webhook_deliveries').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
    if (delivery.state !== 'pending' || delivery.attempts === 0) return delivery;
    const last = await db.selectFrom('webhook_attempts').select('id').where('delivery_id', '=', id).where('attempt', '=', delivery.attempts).executeTakeFirst();
    return last !== undefined && delivery;
  }, `the attempt of delivery ${id} in flight to be logged`);
}

/**
 * Lets up to `most` seconds of delivery `id`'s backoff pass at once: once its attempt in flight
 * is logged, brings its next_attempt_at forward by that much (never past now). Returns the
 * seconds that passed (0 when it was due already, or has ended) and the attempts it had then,
 * all logged. The dispatchers are not woken: see retryNow.
 *
 * A test that moves this process's clock too gives `advanceClock`, called with the time passing
 * before the row is touched: the embedded database reads that clock (PGlite's now() is the
 * process's Date.now()), so its next_attempt_at comes due by itself and is brought forward only
 * by what the database's clock did not move, which on PostgreSQL is all of it.
 */
export async function skipBackoff(
  watch: QueueWatch,
  db: DB,
  id: number,
  most = Number.POSITIVE_INFINITY,
  advanceClock?: (ms: number) => void,
): Promise<{ skipped: number; attempts: number }> {
  for (;;) {
    const delivery = await betweenAttempts(watch, db, id);
    if (delivery.state !== 'pending') return { skipped: 0, attempts: delivery.attempts };
    // Read as the delivery was between attempts: a claim since (it was due) holds a lease, not a backoff.
    const row = await db
      .selectFrom('webhook_deliveries')
      .select(sql<number>`greatest(0, extract(epoch from next_attempt_at - now()))::float8`.as('due_in'))
      .where('id', '=', id)
      .where('state', '=', 'pending')
      .where('attempts', '=', delivery.attempts)
      .executeTakeFirst();
    if (!row) continue;
    const dueIn = Number(row.due_in);
    const skipped = Math.min(dueIn, most);
    advanceClock?.(skipped * 1000);
    // Due `dueIn - skipped` from now, whichever clock moved. A row not due yet cannot have been claimed since.
    await sql`
      update webhook_deliveries
      set next_attempt_at = next_attempt_at - make_interval(secs => least(${skipped}::float8, greatest(0, extract(epoch from next_attempt_at - now()) - ${dueIn - skipped}::float8)))
      where id = ${id} and state = 'pending' and attempts = ${delivery.attempts}`.execute(db);
    return { skipped, attempts: delivery.attempts };
  }
}

/**
 * Makes delivery `id`'s next attempt now, as if its backoff had passed: waits until its attempt
 * in flight is logged, brings next_attempt_at forward to now and wakes `dispatchers` (as the
 * poll that finds a retry come due would). Returns the seconds of backoff skipped.
 */
export async function retryNow(watch: QueueWatch, db: DB, id: number, ...dispatchers: TestDispatcher[]): Promise<number> {
  const { skipped } = await skipBackoff(watch, db, id);
  for (const running of dispatchers) running.dispatcher.wake();
  return skipped;
}

/**
 * Lets all the time in the world pass for the queue: every delivery not in flight is made due,
 * an ended one too (a dispatcher must take none of those, however due). Before settleAndStop,
 * when a test says that nothing more is ever sent.
 */
export async function everythingDue(db: DB): Promise<void> {
  await sql`
    update webhook_deliveries d set next_attempt_at = now()
    where d.next_attempt_at > now()
      and not (d.state = 'pending' and d.attempts > 0
        and not exists (select 1 from webhook_attempts a where a.delivery_id = d.id and a.attempt = d.attempts))`.execute(db);
}

/**
 * One more look at the queue by each dispatcher, and every request that starts finished and
 * recorded: wakes them, then stops them (a stop waits for the claim under way and the requests
 * in flight). What a test does before it says nothing more was sent.
 */
export async function settleAndStop(...dispatchers: TestDispatcher[]): Promise<void> {
  for (const running of dispatchers) running.dispatcher.wake();
  await Promise.all(dispatchers.map((running) => running.stop()));
}

/**
 * Stops a dispatcher as a shutdown does, cutting short the requests in flight, without its wait
 * for them (STOP_WAIT_MS) on the real clock: setTimeout is faked for the stop (moving on by
 * itself no faster than the real clock), and once the stop's wait is scheduled the clock jumps
 * past it. Should another timer be scheduled first, the jump comes early and the stop waits out
 * what is left of its wait as usual: slower, not different.
 */
export async function stopCuttingShort(running: TestDispatcher): Promise<void> {
  vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'], shouldAdvanceTime: true });
  try {
    let stopped = false;
    const stopping = running.stop().finally(() => (stopped = true));
    while (!stopped && vi.getTimerCount() === 0) await new Promise((resolve) => realSetTimeout(resolve, 1));
    vi.advanceTimersByTime(STOP_WAIT_MS);
    await stopping;
  } finally {
    vi.useRealTimers();
  }
}
