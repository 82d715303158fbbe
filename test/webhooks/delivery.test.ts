/**
 * Webhook delivery against a real receiver (WH-1): every request verified with the Standard
 * Webhooks reference library; a change made in the dashboard arrives signed; a receiver that is
 * down gets the event once it is back, under the same webhook-id; both secrets sign for a day
 * after a rotation; redirects are not followed; the delivery log keeps 1 KB of each answer; a
 * hanging receiver costs one attempt of 10 s; one a stop cut short is handed back; the retries
 * end; five days of failures disable the endpoint and tell the organization's owners.
 *
 * Nothing here waits on the wall clock: the tests wait for the queue's own changes (watchQueue),
 * a retry's backoff is skipped (retryNow), and the 10 s of the hanging receiver and a stop's
 * wait for requests in flight pass on a fake clock.
 */
import { sql } from 'kysely';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it, vi } from 'vitest';
import { createUser } from '../../src/accounts/users.js';
import { openText } from '../../src/lib/crypto.js';
import { KEPT_BODY_BYTES, WEBHOOK_TIMEOUT_MS } from '../../src/webhooks/dispatcher.js';
import { newWebhookSecret, sealWebhookSecret } from '../../src/webhooks/secrets.js';
import { WEBHOOK_USER_AGENT } from '../../src/webhooks/signing.js';
import { Browser } from '../accounts/browser.js';
import { buildTestApp, logCapture, TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { WebhookReceiver } from '../helpers/webhook-receiver.js';
import { selectOrganization, submit } from '../dashboard/fixture.js';
import {
  attemptsLogged,
  attemptsOf,
  deliveryOf,
  deliveryState,
  emit,
  everythingDue,
  insertEndpoint,
  newOrganization,
  outcomeCount,
  type QueueWatch,
  retryNow,
  settleAndStop,
  startDispatcher,
  stopCuttingShort,
  type TestDispatcher,
  watchQueue,
} from './fixture.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let receiver: WebhookReceiver;
let running: TestDispatcher | undefined;
let watch: QueueWatch;
const db = () => t.handle.db;
let paths = 0;
const path = () => `/hook-${++paths}`;

/** A dispatcher for this test that reaches 127.0.0.1, with `delays` as WEBHOOK_RETRY_DELAYS. */
async function dispatch(delays = '1,1,1,1,1,1,1,1', env: Record<string, string> = {}, logStream?: ReturnType<typeof logCapture>['stream']) {
  running = await startDispatcher(db(), { env: { WEBHOOK_ALLOW_PRIVATE: '1', WEBHOOK_RETRY_DELAYS: delays, ...env }, listen: t.handle.listen, ...(logStream ? { logStream } : {}) });
  return running;
}

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
beforeEach(() => {
  receiver.answer = () => ({ status: 204 });
  receiver.secrets = [];
});
afterEach(async () => {
  vi.useRealTimers();
  await running?.stop();
  running = undefined;
  // Nothing of this test is left for the next one's dispatcher.
  await db().updateTable('webhook_deliveries').set({ state: 'failed' }).where('state', '=', 'pending').execute();
});

describe(`webhook delivery on ${BACKEND}`, () => {
  it('delivers a member added in the dashboard as a signed member.added that the reference library verifies', async () => {
    // Once the app runs a dispatcher of its own, either may deliver: both have this configuration.
    const app = await buildTestApp(db(), { env: { WEBHOOK_ALLOW_PRIVATE: '1', WEBHOOK_RETRY_DELAYS: '1,1,1,1,1,1,1,1' } });
    try {
      const org = await newOrganization(db());
      const owner = await db().selectFrom('users').select('id').where('email', '=', org.ownerEmail).executeTakeFirstOrThrow();
      const newcomer = await createUser(db(), { email: `newcomer-${process.pid}@example.com`, password: 'newcomer-password-1' });
      const url = receiver.url(path());
      const endpoint = await insertEndpoint(db(), org.id, url, ['member.added', 'member.removed']);
      receiver.secrets = [endpoint.secret];
      await dispatch();

      const browser = new Browser(app, '10.30.0.1');
      expect((await browser.login(org.ownerEmail, 'webhook-owner-password-1')).statusCode).toBe(303);
      await selectOrganization(browser, org.id);
      expect((await submit(browser, '/dashboard/members', { email: newcomer.email, role: 'member' })).statusCode).toBe(303);

      const request = await receiver.waitFor((r) => r.path === new URL(url).pathname);
      expect(request.verifiedWith).toEqual([endpoint.secret]);
      expect(request.method).toBe('POST');
      expect(request.headers['content-type']).toBe('application/json');
      expect(request.headers['user-agent']).toBe(WEBHOOK_USER_AGENT);
      expect(request.id).toMatch(/^msg_[0-9a-f]{32}$/);
      expect(Math.abs(Number(request.timestamp) - Date.now() / 1000)).toBeLessThan(30);
      expect(request.signature).toMatch(/^v1,[A-Za-z0-9+/]+=*$/);
      const payload = JSON.parse(request.body) as { type: string; timestamp: string; data: Record<string, unknown> };
      expect(payload).toMatchObject({
        type: 'member.added',
        data: { user_id: newcomer.id, role: 'member', organization_id: org.id, actor: { user_id: owner.id, client_id: null } },
      });
      expect(new Date(payload.timestamp).getTime()).toBeGreaterThan(Date.now() - 60_000);
      // The id is the event's, and the body is the stored payload as signed.
      const event = await db().selectFrom('webhook_events').selectAll().where('message_id', '=', request.id).executeTakeFirstOrThrow();
      expect(event.type).toBe('member.added');
      expect(JSON.parse(request.body)).toEqual(event.payload);
      const delivery = await deliveryState(watch, db(), (await deliveryOf(db(), event.id, endpoint.id)).id, 'succeeded');
      expect(delivery).toMatchObject({ attempts: 1, last_status: 204, last_error: null, finished_at: expect.any(Date) });
      expect(await attemptsOf(db(), delivery.id)).toMatchObject([{ attempt: 1, status: 204, error: null }]);
    } finally {
      await app.close();
    }
  });

  it('logs each failed attempt while the receiver is down and delivers under the same webhook-id once it is back', async () => {
    const org = await newOrganization(db());
    const endpoint = await insertEndpoint(db(), org.id, receiver.url(path()));
    receiver.secrets = [endpoint.secret];
    const capture = logCapture();
    const running = await dispatch('60,60,60,60,60,60,60,60,60,60', {}, capture.stream);
    await receiver.stop();
    try {
      const event = (await emit(db(), org.id))!;
      const delivery = await deliveryOf(db(), event.id, endpoint.id);
      await attemptsLogged(watch, db(), delivery.id, 1);
      // Its minute of backoff passes.
      await retryNow(watch, db(), delivery.id, running);
      await attemptsLogged(watch, db(), delivery.id, 2);
      const failed = await attemptsOf(db(), delivery.id);
      expect(failed.length).toBeGreaterThanOrEqual(2);
      for (const attempt of failed) expect(attempt).toMatchObject({ status: null, response_body: null, error: expect.stringMatching(/ECONNREFUSED/) });
      const failing = await db().selectFrom('webhook_endpoints').select(['failing_since', 'enabled']).where('id', '=', endpoint.id).executeTakeFirstOrThrow();
      expect(failing).toMatchObject({ failing_since: expect.any(Date), enabled: true });
      expect(capture.lines().some((l) => l.includes('webhook delivery failed; will retry'))).toBe(true);
    } finally {
      await receiver.listen();
    }
    const event = (await db().selectFrom('webhook_events').select(['id', 'message_id']).where('organization_id', '=', org.id).executeTakeFirstOrThrow());
    const delivery = await deliveryOf(db(), event.id, endpoint.id);
    await retryNow(watch, db(), delivery.id, running);
    const request = await receiver.waitFor((r) => r.id === event.message_id);
    expect(request.verifiedWith).toEqual([endpoint.secret]);
    await deliveryState(watch, db(), delivery.id, 'succeeded');
    const attempts = await attemptsOf(db(), delivery.id);
    expect(attempts.length).toBeGreaterThanOrEqual(3);
    expect(attempts.map((a) => a.attempt)).toEqual(attempts.map((_, i) => i + 1));
    expect(attempts.at(-1)).toMatchObject({ status: 204, error: null });
    // Delivered once (however long the dispatcher looks); the success ends the endpoint's run of failures.
    await everythingDue(db());
    await settleAndStop(running);
    expect(receiver.withId(event.message_id)).toHaveLength(1);
    expect((await db().selectFrom('webhook_endpoints').select('failing_since').where('id', '=', endpoint.id).executeTakeFirstOrThrow()).failing_since).toBeNull();
  });

  it('signs with both secrets for a day after a rotation, so a receiver with either verifies, and with the new one alone afterwards', async () => {
    const org = await newOrganization(db());
    const endpoint = await insertEndpoint(db(), org.id, receiver.url(path()));
    const rotated = newWebhookSecret();
    await db()
      .updateTable('webhook_endpoints')
      .set({
        secret_sealed: sealWebhookSecret(TEST_SECRET_KEY, rotated),
        previous_secret_sealed: sealWebhookSecret(TEST_SECRET_KEY, endpoint.secret),
        previous_secret_expires_at: sql<Date>`now() + interval '24 hours'`,
      })
      .where('id', '=', endpoint.id)
      .execute();
    receiver.secrets = [endpoint.secret, rotated];
    await dispatch();
    const during = (await emit(db(), org.id))!;
    const first = await receiver.waitFor((r) => r.id === during.message_id);
    expect(first.signature.split(' ')).toHaveLength(2);
    expect(first.verifiedWith.sort()).toEqual([endpoint.secret, rotated].sort());

    await db().updateTable('webhook_endpoints').set({ previous_secret_expires_at: sql<Date>`now() - interval '1 second'` }).where('id', '=', endpoint.id).execute();
    const after = (await emit(db(), org.id))!;
    const second = await receiver.waitFor((r) => r.id === after.message_id);
    expect(second.signature.split(' ')).toHaveLength(1);
    expect(second.verifiedWith).toEqual([rotated]);
  });

  it('does not follow a redirect: the 3xx is a failed attempt and the target is never asked', async () => {
    const org = await newOrganization(db());
    const hook = path();
    const target = path();
    const endpoint = await insertEndpoint(db(), org.id, receiver.url(hook));
    receiver.answer = (r) => (r.path === hook ? { status: 307, headers: { location: receiver.url(target) } } : { status: 204 });
    const running = await dispatch('3600');
    const event = (await emit(db(), org.id))!;
    const delivery = await deliveryOf(db(), event.id, endpoint.id);
    await attemptsLogged(watch, db(), delivery.id, 1);
    // Nothing left in flight that could still reach the target.
    await settleAndStop(running);
    expect(await attemptsOf(db(), delivery.id)).toHaveLength(1);
    expect((await attemptsOf(db(), delivery.id))[0]).toMatchObject({ status: 307, error: expect.stringMatching(/^redirect \(307 to http:\/\/127\.0\.0\.1:\d+\/hook-\d+\) not followed$/) });
    expect(await deliveryOf(db(), event.id, endpoint.id)).toMatchObject({ state: 'pending', last_status: 307, attempts: 1 });
    expect(receiver.received.filter((r) => r.path === target)).toHaveLength(0);
    await expect.poll(() => outcomeCount(running!.metrics, 'retry')).toBe(1);
  });

  it('keeps the first 1 KB of an answer, and the answer of a refusal', async () => {
    const org = await newOrganization(db());
    const ok = path();
    const refusing = path();
    const long = `${'é'.repeat(400)}${'x'.repeat(5000)}`;
    receiver.answer = (r) => (r.path === ok ? { status: 200, body: long } : { status: 500, body: 'receiver says no\u0000' });
    const endpoints = [await insertEndpoint(db(), org.id, receiver.url(ok)), await insertEndpoint(db(), org.id, receiver.url(refusing))];
    await dispatch('3600');
    const event = (await emit(db(), org.id))!;
    const [kept = undefined, refused = undefined] = await Promise.all(
      endpoints.map(async (e) => {
        const delivery = await deliveryOf(db(), event.id, e.id);
        await attemptsLogged(watch, db(), delivery.id, 1);
        expect(await attemptsOf(db(), delivery.id)).toHaveLength(1);
        return (await attemptsOf(db(), delivery.id))[0]!;
      }),
    );
    expect(kept).toMatchObject({ status: 200, error: null });
    if (!kept) return;
    // 400 two-byte characters and 224 one-byte ones make 1024 bytes.
    expect(Buffer.byteLength(kept.response_body!, 'utf8')).toBe(KEPT_BODY_BYTES);
    expect(kept.response_body).toBe(long.slice(0, 624));
    expect(refused).toMatchObject({ status: 500, response_body: 'receiver says no\uFFFD', error: 'answered 500' });
    expect((await deliveryOf(db(), event.id, endpoints[1]!.id))).toMatchObject({ state: 'pending', last_status: 500, last_error: 'answered 500' });
  });

  it(`gives a receiver that never answers ${WEBHOOK_TIMEOUT_MS / 1000} s, then records the attempt as timed out`, { timeout: 30_000 }, async () => {
    const org = await newOrganization(db());
    const endpoint = await insertEndpoint(db(), org.id, receiver.url(path()));
    receiver.answer = () => 'hang';
    await dispatch('3600');
    // The 10 s pass on a fake clock: the request's deadline (a setTimeout) and its duration (Date)
    // are this process's, and move on by themselves (as slowly as the real clock at most) until
    // the test jumps them forward.
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'Date'], shouldAdvanceTime: true });
    const event = (await emit(db(), org.id))!;
    const delivery = await deliveryOf(db(), event.id, endpoint.id);
    await receiver.waitFor((r) => r.id === event.message_id);
    // The request is under way (its deadline set before it was sent), and its answer will never come.
    vi.advanceTimersByTime(WEBHOOK_TIMEOUT_MS);
    await attemptsLogged(watch, db(), delivery.id, 1);
    vi.useRealTimers();
    expect(await attemptsOf(db(), delivery.id)).toHaveLength(1);
    const [attempt] = await attemptsOf(db(), delivery.id);
    expect(attempt).toMatchObject({ status: null, error: expect.stringMatching(/timed out after 10000 ms/) });
    expect(attempt!.duration_ms).toBeGreaterThanOrEqual(WEBHOOK_TIMEOUT_MS - 100);
    expect(attempt!.duration_ms).toBeLessThan(WEBHOOK_TIMEOUT_MS + 2000);
    expect(await deliveryOf(db(), event.id, endpoint.id)).toMatchObject({ state: 'pending', attempts: 1 });
  });

  it('hands a delivery cut short by a stop back to the queue, due at once and its claim not counted', async () => {
    const org = await newOrganization(db());
    const endpoint = await insertEndpoint(db(), org.id, receiver.url(path()));
    receiver.answer = () => 'hang';
    const first = await dispatch('3600');
    const event = (await emit(db(), org.id))!;
    await receiver.waitFor((r) => r.id === event.message_id);
    expect(await deliveryOf(db(), event.id, endpoint.id)).toMatchObject({ state: 'pending', attempts: 1 });
    // The lease would keep it for a minute; the stop gives it back instead.
    await stopCuttingShort(first);
    running = undefined;
    const handedBack = await deliveryOf(db(), event.id, endpoint.id);
    expect(handedBack).toMatchObject({ state: 'pending', attempts: 0 });
    expect(handedBack.next_attempt_at.getTime()).toBeLessThanOrEqual(Date.now() + 1000);
    expect(await attemptsOf(db(), handedBack.id)).toEqual([]);
    // Another dispatcher sends it at once, under the same webhook-id.
    receiver.answer = () => ({ status: 204 });
    await dispatch('3600');
    await deliveryState(watch, db(), handedBack.id, 'succeeded');
    expect(receiver.withId(event.message_id).length).toBe(2);
    expect(await deliveryOf(db(), event.id, endpoint.id)).toMatchObject({ attempts: 1 });
  });

  it('fails the delivery after the last retry of WEBHOOK_RETRY_DELAYS', async () => {
    const org = await newOrganization(db());
    const endpoint = await insertEndpoint(db(), org.id, receiver.url(path()));
    receiver.answer = () => ({ status: 503 });
    const running = await dispatch('30,60');
    const event = (await emit(db(), org.id))!;
    const { id } = await deliveryOf(db(), event.id, endpoint.id);
    // Both backoffs pass, each as it comes.
    for (const attempt of [1, 2]) {
      await attemptsLogged(watch, db(), id, attempt);
      await retryNow(watch, db(), id, running);
    }
    await deliveryState(watch, db(), id, 'failed');
    const delivery = await deliveryOf(db(), event.id, endpoint.id);
    expect(delivery).toMatchObject({ attempts: 3, last_status: 503, last_error: 'answered 503', finished_at: expect.any(Date) });
    expect((await attemptsOf(db(), delivery.id)).map((a) => a.status)).toEqual([503, 503, 503]);
    expect(receiver.withId(event.message_id)).toHaveLength(3);
    await expect.poll(() => outcomeCount(running.metrics, 'failed')).toBe(1);
    expect(await outcomeCount(running.metrics, 'retry')).toBe(2);
    // Failed is final: nothing more is sent, however long the dispatcher looks.
    await everythingDue(db());
    await settleAndStop(running);
    expect(receiver.withId(event.message_id)).toHaveLength(3);
  });

  it('disables an endpoint failing for five days, stops its deliveries and emails the owners', async () => {
    const org = await newOrganization(db());
    const endpoint = await insertEndpoint(db(), org.id, `${receiver.url(path())}?token=receiver-secret`);
    receiver.answer = () => ({ status: 500 });
    // An older event waiting for its retry, and a run of failures that began five days ago.
    const waiting = (await emit(db(), org.id))!;
    await db().updateTable('webhook_deliveries').set({ next_attempt_at: sql<Date>`now() + interval '1 hour'` }).where('event_id', '=', waiting.id).execute();
    await db().updateTable('webhook_endpoints').set({ failing_since: sql<Date>`now() - interval '5 days 1 minute'` }).where('id', '=', endpoint.id).execute();
    const capture = logCapture();
    await dispatch('60', {}, capture.stream);
    const event = (await emit(db(), org.id))!;
    await watch.until(async () => !(await db().selectFrom('webhook_endpoints').select('enabled').where('id', '=', endpoint.id).executeTakeFirstOrThrow()).enabled, 'the endpoint to be disabled');
    expect(await db().selectFrom('webhook_endpoints').select(['disabled_reason', 'failing_since']).where('id', '=', endpoint.id).executeTakeFirstOrThrow()).toMatchObject({
      disabled_reason: 'failing',
      failing_since: expect.any(Date),
    });
    expect(await deliveryOf(db(), event.id, endpoint.id)).toMatchObject({ state: 'failed', attempts: 1, last_status: 500, last_error: 'answered 500' });
    expect(await deliveryOf(db(), waiting.id, endpoint.id)).toMatchObject({ state: 'failed', last_error: 'endpoint disabled' });
    await expect.poll(() => outcomeCount(running!.metrics, 'failed')).toBe(2);
    expect(capture.lines().some((l) => l.includes('webhook endpoint disabled') && JSON.parse(l).level === 40)).toBe(true);
    // The receiver's token in the query stays out of the log.
    expect(capture.lines().some((l) => l.includes('receiver-secret'))).toBe(false);

    const mail = await db().selectFrom('mail_outbox').selectAll().where('recipient', '=', org.ownerEmail).executeTakeFirstOrThrow();
    expect(mail.subject).toMatch(/^A webhook endpoint of Webhook Org \d+ was disabled$/);
    const body = JSON.parse(openText(TEST_SECRET_KEY, 'mail-outbox', mail.body_encrypted!)) as { text: string; html: string };
    expect(body.text).toContain(new URL(receiver.url()).origin);
    expect(body.text).toContain('/dashboard/webhooks');
    expect(body.text).not.toContain('receiver-secret');

    // A delivery for the disabled endpoint (a ping, a retry) stops without a request.
    const before = receiver.received.length;
    const stray = await db()
      .insertInto('webhook_deliveries')
      .values({ event_id: event.id, endpoint_id: endpoint.id, organization_id: org.id })
      .returning('id')
      .executeTakeFirstOrThrow();
    running!.dispatcher.wake();
    await deliveryState(watch, db(), stray.id, 'failed');
    expect(await db().selectFrom('webhook_deliveries').select(['state', 'last_error', 'attempts']).where('id', '=', stray.id).executeTakeFirstOrThrow()).toEqual({
      state: 'failed',
      last_error: 'endpoint disabled',
      attempts: 0,
    });
    expect(await attemptsOf(db(), stray.id)).toHaveLength(0);
    expect(receiver.received.length).toBe(before);
    // And no new event reaches it: the trigger queues only for enabled endpoints.
    const events = async () => (await db().selectFrom('webhook_events').select('id').where('organization_id', '=', org.id).execute()).length;
    const known = await events();
    await emit(db(), org.id);
    expect(await events()).toBe(known);
  });
});
