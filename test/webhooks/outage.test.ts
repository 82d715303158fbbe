/**
 * The must-show of issue 27: a receiver down for a whole minute loses nothing. An event made at
 * the start of the outage is retried on the WEBHOOK_RETRY_DELAYS schedule (5, 10, 20, 30, 60 s
 * here), each attempt logged, and arrives once the receiver is back, under the webhook-id every
 * attempt carried. The outage has two halves: nothing listening (connections refused), then a
 * receiver that takes each request and crashes (the connection drops unanswered), which lets the
 * test see the webhook-id of attempts that failed.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { WebhookReceiver } from '../helpers/webhook-receiver.js';
import { attemptsOf, deliveryOf, emit, insertEndpoint, newOrganization, outcomeCount, seconds, startDispatcher } from './fixture.js';

const OUTAGE_MS = 60_000;

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let receiver: WebhookReceiver;

beforeAll(async () => {
  t = await createTestDatabase();
  receiver = await WebhookReceiver.start();
});
afterAll(async () => {
  await receiver?.stop();
  await t?.close();
});

describe(`a receiver outage on ${BACKEND}`, () => {
  it('delivers an event made while the receiver is down for a minute once it is back, under the same webhook-id', { timeout: 150_000 }, async () => {
    const db = t.handle.db;
    const org = await newOrganization(db);
    const endpoint = await insertEndpoint(db, org.id, receiver.url('/outage'));
    receiver.secrets = [endpoint.secret];
    const running = await startDispatcher(db, { env: { WEBHOOK_ALLOW_PRIVATE: '1', WEBHOOK_RETRY_DELAYS: '5,10,20,30,60' }, listen: t.handle.listen });
    try {
      await receiver.stop();
      const outageStart = Date.now();
      const event = (await emit(db, org.id))!;
      const delivery = await deliveryOf(db, event.id, endpoint.id);

      // First half: nothing listens.
      await seconds(OUTAGE_MS / 2);
      const refused = await attemptsOf(db, delivery.id);
      expect(refused.length).toBeGreaterThanOrEqual(2);
      for (const attempt of refused) expect(attempt).toMatchObject({ status: null, error: expect.stringMatching(/ECONNREFUSED/) });
      // Second half: requests arrive and the receiver crashes on each.
      receiver.answer = () => 'reset';
      await receiver.listen();
      await seconds(OUTAGE_MS - (Date.now() - outageStart));
      const crashed = receiver.withId(event.message_id);
      expect(crashed.length).toBeGreaterThanOrEqual(1);
      expect(await deliveryOf(db, event.id, endpoint.id)).toMatchObject({ state: 'pending', last_status: null });

      // Back.
      const back = Date.now();
      receiver.answer = () => ({ status: 200, body: 'ok' });
      await expect.poll(async () => (await deliveryOf(db, event.id, endpoint.id)).state, { timeout: 70_000, interval: 500 }).toBe('succeeded');
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
