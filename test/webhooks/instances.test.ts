/**
 * Two instances sharing one PostgreSQL database and so one webhook queue, each with its own pool
 * and LISTEN connection as another process would have: every event reaches every endpoint once
 * per attempt, never twice because both instances woke to the same NOTIFY. The receivers count
 * requests by webhook-id and endpoint; with a first attempt that fails, each pair is seen exactly
 * twice, matching the two attempts logged.
 *
 * The test waits on the queue's own changes (watchQueue), not the clock: retries come due a second
 * after their failed attempt while the other first attempts are made, and once those are all
 * logged, the backoffs still running are skipped.
 *
 * PostgreSQL only: on the embedded database there is one connection and one process.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { recordAuditEvent } from '../../src/audit/events.js';
import { connectDatabase, type DatabaseHandle } from '../../src/db/connect.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { WebhookReceiver } from '../helpers/webhook-receiver.js';
import { everythingDue, insertEndpoint, newOrganization, outcomeCount, type QueueWatch, settleAndStop, startDispatcher, type TestDispatcher, watchQueue } from './fixture.js';

const EVENTS = 60;

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let receiver: WebhookReceiver;
let watch: QueueWatch;

describe.skipIf(BACKEND !== 'postgres')('webhook delivery by two instances on postgres', () => {
  beforeAll(async () => {
    t = await createTestDatabase();
    watch = await watchQueue(t.handle.db, t.handle.listen);
    receiver = await WebhookReceiver.start();
  });
  afterAll(async () => {
    await receiver?.stop();
    await watch?.close();
    await t?.close();
  });

  it(`delivers ${EVENTS} events to two endpoints once per attempt, the first attempt of each failing`, { timeout: 60_000 }, async () => {
    const db = t.handle.db;
    const org = await newOrganization(db);
    const endpoints = [await insertEndpoint(db, org.id, receiver.url('/first')), await insertEndpoint(db, org.id, receiver.url('/second'))];
    receiver.secrets = endpoints.map((e) => e.secret);
    // The first request of each (webhook-id, endpoint) fails; the second succeeds.
    const seen = new Map<string, number>();
    const key = (id: string, path: string) => `${id} ${path}`;
    receiver.answer = (r) => {
      const count = (seen.get(key(r.id, r.path)) ?? 0) + 1;
      seen.set(key(r.id, r.path), count);
      return count === 1 ? { status: 500 } : { status: 204 };
    };

    const handles: DatabaseHandle[] = [await connectDatabase(t.target), await connectDatabase(t.target)];
    const instances: TestDispatcher[] = [];
    try {
      for (const handle of handles) {
        instances.push(await startDispatcher(handle.db, { env: { WEBHOOK_ALLOW_PRIVATE: '1', WEBHOOK_RETRY_DELAYS: '1' }, listen: handle.listen }));
      }
      for (let i = 0; i < EVENTS; i++) await recordAuditEvent(db, { organizationId: org.id, action: 'member.added', details: { user_id: i + 1000, role: 'member' } });
      const events = await db.selectFrom('webhook_events').select(['id', 'message_id']).where('organization_id', '=', org.id).execute();
      expect(events).toHaveLength(EVENTS);

      // Every first attempt made and logged (each failed; retries a second after, meanwhile)...
      await watch.until(async () => {
        const { rows } = await sql<{ n: number }>`
          select count(*)::int as n from webhook_attempts a join webhook_deliveries d on d.id = a.delivery_id
          where d.organization_id = ${org.id} and a.attempt = 1`.execute(db);
        return rows[0]!.n >= EVENTS * endpoints.length;
      }, 'every first attempt to be logged', 40_000);
      // ... then the backoffs still running pass at once (of deliveries between attempts: one whose
      // retry is in flight holds a lease), and both instances hear of it, as their polls would.
      await sql`
        update webhook_deliveries d set next_attempt_at = now()
        where d.organization_id = ${org.id} and d.state = 'pending' and d.next_attempt_at > now()
          and exists (select 1 from webhook_attempts a where a.delivery_id = d.id and a.attempt = d.attempts)`.execute(db);
      for (const instance of instances) instance.dispatcher.wake();
      await watch.until(
        async () =>
          (await db.selectFrom('webhook_deliveries').select('id').where('organization_id', '=', org.id).where('state', '=', 'succeeded').execute()).length ===
          EVENTS * endpoints.length,
        'every delivery to succeed',
        40_000,
      );
      // However long both instances look at the queue, nothing is sent again.
      await everythingDue(db);
      await settleAndStop(...instances);
      for (const { message_id } of events) {
        for (const path of ['/first', '/second']) {
          const requests = receiver.received.filter((r) => r.id === message_id && r.path === path);
          expect(requests, `${message_id} ${path}`).toHaveLength(2);
          expect(requests.every((r) => r.verifiedWith.length === 1)).toBe(true);
        }
      }
      expect(receiver.received).toHaveLength(EVENTS * endpoints.length * 2);
      const deliveries = await db.selectFrom('webhook_deliveries').select(['id', 'attempts', 'last_status']).where('organization_id', '=', org.id).execute();
      expect(deliveries.every((d) => d.attempts === 2 && d.last_status === 204)).toBe(true);
      const attempts = await db
        .selectFrom('webhook_attempts')
        .select(['delivery_id', 'attempt', 'status'])
        .where('delivery_id', 'in', deliveries.map((d) => d.id))
        .orderBy('delivery_id')
        .orderBy('attempt')
        .execute();
      expect(attempts).toHaveLength(deliveries.length * 2);
      for (const d of deliveries) {
        expect(attempts.filter((a) => a.delivery_id === d.id).map((a) => [a.attempt, a.status])).toEqual([
          [1, 500],
          [2, 204],
        ]);
      }
      // Both instances took part, and between them counted each outcome once.
      const succeeded = await Promise.all(instances.map((i) => outcomeCount(i.metrics, 'succeeded')));
      const retried = await Promise.all(instances.map((i) => outcomeCount(i.metrics, 'retry')));
      expect(succeeded[0]! + succeeded[1]!).toBe(EVENTS * endpoints.length);
      expect(retried[0]! + retried[1]!).toBe(EVENTS * endpoints.length);
      expect(succeeded[0]! + retried[0]!).toBeGreaterThan(0);
      expect(succeeded[1]! + retried[1]!).toBeGreaterThan(0);
    } finally {
      await Promise.all(instances.map((i) => i.stop()));
      await Promise.all(handles.map((h) => h.close()));
    }
  });
});
