/**
 * The must-show of issue 27: a receiver down for a whole minute loses nothing. An event made at
 * the start of the outage is retried on the WEBHOOK_RETRY_DELAYS schedule (5, 10, 20, 30, 60 s
 * here), each attempt logged, and arrives once the receiver is back, under the webhook-id every
 * attempt carried. The outage has two halves: nothing listening (connections refused), then a
 * receiver that takes each request and crashes (the connection drops unanswered), which lets the
 * test see the webhook-id of attempts that failed.
 *
 * The minute is simulated, not waited out: at each backoff, this process's clock (Date, which
 * times and signs the attempts, and by which the receiver verifies them) is moved forward by what
 * the backoff had left, and the delivery's next_attempt_at, which the database's clock compares,
 * is brought forward by as much (on PGlite, whose now() reads this process's clock, moving the
 * clock does it). Time moves only by what the dispatcher itself scheduled, so the gaps between
 * the attempts logged are the schedule's (plus the real time the test takes).
 */
import { sql } from 'kysely';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { WebhookReceiver } from '../helpers/webhook-receiver.js';
import {
  attemptsOf,
  deliveryOf,
  emit,
  insertEndpoint,
  newOrganization,
  outcomeCount,
  type QueueWatch,
  skipBackoff,
  startDispatcher,
  type TestDispatcher,
  watchQueue,
} from './fixture.js';

const OUTAGE_S = 60;

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let receiver: WebhookReceiver;
let watch: QueueWatch;

beforeAll(async () => {
  t = await createTestDatabase();
  watch = await watchQueue(t.handle.db, t.handle.listen);
  receiver = await WebhookReceiver.start();
});
afterEach(() => {
  vi.unstubAllGlobals();
});
afterAll(async () => {
  await receiver?.stop();
  await watch?.close();
  await t?.close();
});

/**
 * This process's clock, `offset` ms ahead of the real one from now on (the real one goes on
 * underneath): Date.now() and new Date() read it; dates made from a value are left alone.
 */
function aheadClock(): { advance(ms: number): void } {
  const RealDate = Date;
  let offset = 0;
  const now = () => RealDate.now() + offset;
  const ShiftedDate = new Proxy(RealDate, {
    construct: (target, args: unknown[], newTarget) => (args.length === 0 ? new RealDate(now()) : Reflect.construct(target, args, newTarget)),
    apply: () => new RealDate(now()).toString(),
    get: (target, property, receiver) => (property === 'now' ? now : Reflect.get(target, property, receiver)),
  });
  vi.stubGlobal('Date', ShiftedDate);
  return { advance: (ms) => (offset += ms) };
}

/**
 * Lets `seconds` of simulated time pass for delivery `id`: each attempt that falls due meanwhile
 * is made (the dispatcher woken) and logged before the time goes on. The real time the test
 * takes passes too, on top.
 */
async function pass(id: number, running: TestDispatcher, clock: { advance(ms: number): void }, seconds: number): Promise<void> {
  const db = t.handle.db;
  let left = seconds;
  for (;;) {
    // Waits for the attempt in flight, then brings the next one forward by what its backoff had left, up to `left`.
    const { skipped, attempts } = await skipBackoff(watch, db, id, left, clock.advance);
    left -= skipped;
    const delivery = await db
      .selectFrom('webhook_deliveries')
      .select(['state', 'attempts', sql<boolean>`next_attempt_at <= now()`.as('due')])
      .where('id', '=', id)
      .executeTakeFirstOrThrow();
    // Ended, or the rest of the time passes before the next attempt is due (or claimed: it was due).
    if (delivery.state !== 'pending' || (!delivery.due && delivery.attempts === attempts)) return;
    running.dispatcher.wake();
    await watch.until(async () => (await attemptsOf(db, id)).length > attempts, `attempt ${attempts + 1} of delivery ${id}`);
  }
}

describe(`a receiver outage on ${BACKEND}`, () => {
  it('delivers an event made while the receiver is down for a minute once it is back, under the same webhook-id', async () => {
    const clock = aheadClock();
    const db = t.handle.db;
    const org = await newOrganization(db);
    const endpoint = await insertEndpoint(db, org.id, receiver.url('/outage'));
    receiver.secrets = [endpoint.secret];
    const running = await startDispatcher(db, { env: { WEBHOOK_ALLOW_PRIVATE: '1', WEBHOOK_RETRY_DELAYS: '5,10,20,30,60' }, listen: t.handle.listen });
    try {
      await receiver.stop();
      const event = (await emit(db, org.id))!;
      const delivery = await deliveryOf(db, event.id, endpoint.id);

      // First half: nothing listens.
      await pass(delivery.id, running, clock, OUTAGE_S / 2);
      const refused = await attemptsOf(db, delivery.id);
      expect(refused.length).toBeGreaterThanOrEqual(2);
      for (const attempt of refused) expect(attempt).toMatchObject({ status: null, error: expect.stringMatching(/ECONNREFUSED/) });
      // Second half: requests arrive and the receiver crashes on each.
      receiver.answer = () => 'reset';
      await receiver.listen();
      await pass(delivery.id, running, clock, OUTAGE_S / 2);
      const crashed = receiver.withId(event.message_id);
      expect(crashed.length).toBeGreaterThanOrEqual(1);
      expect(await deliveryOf(db, event.id, endpoint.id)).toMatchObject({ state: 'pending', last_status: null });

      // Back: the next retry comes due (at most the schedule's longest delay later) and succeeds.
      const back = Date.now();
      receiver.answer = () => ({ status: 200, body: 'ok' });
      await pass(delivery.id, running, clock, 70);
      expect((await deliveryOf(db, event.id, endpoint.id)).state).toBe('succeeded');
      const requests = receiver.withId(event.message_id);
      const delivered = requests.filter((r) => r.at >= back);
      expect(delivered).toHaveLength(1);
      expect(delivered[0]!.verifiedWith).toEqual([endpoint.secret]);
      // Every request the receiver saw, crashed or answered, carried the event's one webhook-id
      // (the filter above), and each was signed afresh at its own attempt.
      expect(requests.length).toBe(crashed.length + 1);
      expect(new Set(requests.map((r) => r.timestamp)).size).toBe(requests.length);
      expect(requests.every((r) => r.verifiedWith.length === 1)).toBe(true);
      const attempts = await attemptsOf(db, delivery.id);
      expect(attempts.map((a) => a.attempt)).toEqual(attempts.map((_, i) => i + 1));
      expect(attempts.length).toBe(refused.length + requests.length);
      expect(attempts.slice(0, -1).every((a) => a.error !== null && a.status === null)).toBe(true);
      expect(attempts.at(-1)).toMatchObject({ status: 200, response_body: 'ok', error: null });
      expect(await deliveryOf(db, event.id, endpoint.id)).toMatchObject({ attempts: attempts.length, last_status: 200, last_error: null });
      // An outcome is counted once its transaction has committed, a moment after the row shows
      // it (a fresh clone's run read the count in between): the dispatcher is stopped, which
      // waits for what it holds to be recorded, before the counts are read.
      await running.stop();
      expect(await outcomeCount(running.metrics, 'retry')).toBe(attempts.length - 1);
      expect(await outcomeCount(running.metrics, 'succeeded')).toBe(1);
      // The gaps follow the schedule: 5 s, then 10 s, 20 s, 30 s (each plus up to a poll).
      const gaps = attempts.slice(1).map((a, i) => (a.started_at.getTime() - attempts[i]!.started_at.getTime()) / 1000);
      const schedule = [5, 10, 20, 30, 60];
      gaps.forEach((gap, i) => expect(gap).toBeGreaterThanOrEqual(schedule[i]!));
    } finally {
      await running.stop();
    }
  });
});
