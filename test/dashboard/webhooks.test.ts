/**
 * The dashboard's Webhooks page (/dashboard/webhooks): owners and admins (webhooks.read and
 * webhooks.write) add endpoints through the form and see the secret once, edit their events,
 * disable and enable them, rotate the secret, ping them, retry a delivery and delete them;
 * members and viewers are refused the page and its forms; forms need the session's CSRF token;
 * another organization's endpoint is a 404. WEBHOOK_ALLOW_PRIVATE=1: the receivers are on
 * loopback (a port nobody listens on: nothing here waits for a delivery).
 */
import type { LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { createWebhookEndpoint } from '../../src/webhooks/endpoints.js';
import { openWebhookSecret } from '../../src/webhooks/secrets.js';
import { Browser, expectPageSecurityHeaders } from '../accounts/browser.js';
import { TEST_SECRET_KEY, testConfig } from '../helpers/app.js';
import { BACKEND } from '../helpers/db.js';
import { createWorld, newOrganization, PASSWORD, selectOrganization, submit, type World } from './fixture.js';

let w: World;
let viewer: Browser;
let viewerId: number;
const config = testConfig({ WEBHOOK_ALLOW_PRIVATE: '1' });
const RECEIVER = 'http://127.0.0.1:9/hooks/dashboard';

beforeAll(async () => {
  w = await createWorld({ env: { WEBHOOK_ALLOW_PRIVATE: '1' } });
  const user = await createUser(w.db, { email: `webhooks-viewer-${process.pid}@example.com`, password: PASSWORD, name: 'viewer' });
  viewerId = user.id;
  viewer = new Browser(w.app, '10.22.0.1');
  expect((await viewer.login(user.email, PASSWORD)).statusCode).toBe(303);
});
afterAll(async () => {
  await w?.close();
});

/** A new organization (the fixture's owner, admin and member) with the viewer as a viewer. */
async function newWebhookOrganization() {
  const org = await newOrganization(w);
  await addMember(w.db, { organizationId: org.id, userId: viewerId, role: 'viewer' });
  expect((await selectOrganization(viewer, org.id)).statusCode).toBe(303);
  return org;
}

const owner = () => w.browsers.owner;
const endpointsOf = (organizationId: number) => w.db.selectFrom('webhook_endpoints').selectAll().where('organization_id', '=', organizationId).orderBy('id').execute();
const alertIn = (html: string) => /<div class="error" role="alert"><ul>([\s\S]*?)<\/ul>/.exec(html)?.[1] ?? '';
const secretIn = (html: string) => /name="webhook_secret" value="([^"]+)"/.exec(html)?.[1];

/** Follows a 303 back to the page, in the same browser. */
async function follow(b: Browser, res: LightMyRequestResponse): Promise<LightMyRequestResponse> {
  expect(res.statusCode, res.body).toBe(303);
  const location = String(res.headers.location);
  expect(location.startsWith('/dashboard/webhooks')).toBe(true);
  return b.get(location.split('#')[0]!);
}

describe(`dashboard webhooks on ${BACKEND}`, () => {
  it('shows the page in the navigation of owners and admins, with the page security headers and no inline script', async () => {
    await newWebhookOrganization();
    for (const b of [owner(), w.browsers.admin]) {
      const page = await b.get('/dashboard/webhooks');
      expect(page.statusCode).toBe(200);
      expectPageSecurityHeaders(page);
      expect(page.body).toContain('<a href="/dashboard/webhooks" aria-current="page">Webhooks</a>');
      expect(page.body).toContain('<h2 id="add-endpoint">Add an endpoint</h2>');
      expect(page.body).not.toMatch(/<script(?![^>]*\bsrc=)/);
    }
    for (const b of [w.browsers.member, viewer]) expect((await b.get('/dashboard')).body).not.toContain('href="/dashboard/webhooks"');
  });

  it('adds an endpoint: the secret is shown in the answer once, sealed at rest, and the change audited with the member', async () => {
    const org = await newWebhookOrganization();
    const res = await submit(owner(), '/dashboard/webhooks', { url: RECEIVER, description: 'Billing', events: ['member.removed', 'member.added'] });
    expect(res.statusCode, alertIn(res.body)).toBe(201);
    expect(res.headers['cache-control']).toContain('no-store');
    const secret = secretIn(res.body);
    expect(secret).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/);
    const [row] = await endpointsOf(org.id);
    expect(row).toMatchObject({ url: RECEIVER, description: 'Billing', events: ['member.added', 'member.removed'], enabled: true });
    expect(openWebhookSecret(TEST_SECRET_KEY, row!.secret_sealed)).toBe(secret);
    // Never again.
    const page = await owner().get('/dashboard/webhooks');
    expect(page.body).toContain(RECEIVER);
    expect(page.body).not.toContain(secret!);
    expect(page.body).not.toContain('whsec_');
    const audit = await w.db.selectFrom('audit_events').select(['actor_user_id', 'details']).where('organization_id', '=', org.id).where('action', '=', 'webhook.created').executeTakeFirstOrThrow();
    expect(audit).toEqual({ actor_user_id: w.users.owner.id, details: { endpoint_id: row!.id, url: RECEIVER, events: ['member.added', 'member.removed'], enabled: true } });
  });

  it('shows a refusal on the page, with what was typed, at its status', async () => {
    const org = await newWebhookOrganization();
    const none = await submit(owner(), '/dashboard/webhooks', { url: RECEIVER, description: 'Typed' });
    expect(none.statusCode).toBe(400);
    expect(alertIn(none.body)).toContain('Events: must list at least one event type');
    expect(none.body).toContain(`value="${RECEIVER}"`);
    expect(none.body).toContain('value="Typed"');
    const bad = await submit(owner(), '/dashboard/webhooks', { url: 'ftp://hooks.example.com/x', events: 'member.added' });
    expect(bad.statusCode).toBe(400);
    expect(alertIn(bad.body)).toContain('URL: must be an http(s) URL');
    expect(bad.body).toContain('name="events" value="member.added" checked');
    const unknown = await submit(owner(), '/dashboard/webhooks', { url: RECEIVER, events: ['member.added', 'user.deleted'] });
    expect(unknown.statusCode).toBe(400);
    expect(alertIn(unknown.body)).toContain('Events: is not an event type');
    expect(await endpointsOf(org.id)).toEqual([]);
  });

  it('edits, disables and enables an endpoint; re-enabling clears a disable for failing', async () => {
    const org = await newWebhookOrganization();
    const { endpoint } = await createWebhookEndpoint(w.db, TEST_SECRET_KEY, org.id, { url: RECEIVER, events: ['member.added'] }, { config });
    const saved = await follow(owner(), await submit(owner(), `/dashboard/webhooks/${endpoint.id}`, { url: `${RECEIVER}/v2`, description: 'Edited', events: ['role.created', 'role.deleted'] }));
    expect(saved.body).toContain(`Endpoint ${RECEIVER}/v2 saved.`);
    expect((await endpointsOf(org.id))[0]).toMatchObject({ url: `${RECEIVER}/v2`, description: 'Edited', events: ['role.created', 'role.deleted'] });
    const refused = await submit(owner(), `/dashboard/webhooks/${endpoint.id}`, { url: `${RECEIVER}/v2`, description: 'Edited' });
    expect(refused.statusCode).toBe(400);
    expect(alertIn(refused.body)).toContain('Events:');
    const disabled = await follow(owner(), await submit(owner(), `/dashboard/webhooks/${endpoint.id}/state`, { enabled: 'no' }));
    expect(disabled.body).toContain('is disabled');
    expect((await endpointsOf(org.id))[0]!.enabled).toBe(false);
    await w.db.updateTable('webhook_endpoints').set({ disabled_reason: 'failing', failing_since: new Date(Date.now() - 6 * 86400_000) }).where('id', '=', endpoint.id).execute();
    expect((await owner().get('/dashboard/webhooks')).body).toContain('disabled by orgauth: its deliveries failed for five days');
    await follow(owner(), await submit(owner(), `/dashboard/webhooks/${endpoint.id}/state`, { enabled: 'yes' }));
    expect((await endpointsOf(org.id))[0]).toMatchObject({ enabled: true, disabled_reason: null, failing_since: null });
  });

  it('rotates the secret: the new one shown once, the previous one signing for a day', async () => {
    const org = await newWebhookOrganization();
    const { endpoint, secret } = await createWebhookEndpoint(w.db, TEST_SECRET_KEY, org.id, { url: RECEIVER, events: ['member.added'] }, { config });
    const res = await submit(w.browsers.admin, `/dashboard/webhooks/${endpoint.id}/rotate-secret`);
    expect(res.statusCode).toBe(200);
    const rotated = secretIn(res.body);
    expect(rotated).toMatch(/^whsec_/);
    expect(rotated).not.toBe(secret);
    expect(res.body).toContain('The previous secret keeps signing beside this one until');
    const [row] = await endpointsOf(org.id);
    expect(openWebhookSecret(TEST_SECRET_KEY, row!.secret_sealed)).toBe(rotated);
    expect(openWebhookSecret(TEST_SECRET_KEY, row!.previous_secret_sealed!)).toBe(secret);
  });

  it('pings an endpoint, lists the delivery, shows its payload and attempts, and retries a failed one', async () => {
    const org = await newWebhookOrganization();
    const { endpoint } = await createWebhookEndpoint(w.db, TEST_SECRET_KEY, org.id, { url: RECEIVER, events: ['member.added'] }, { config });
    const page = await follow(owner(), await submit(owner(), `/dashboard/webhooks/${endpoint.id}/ping`));
    expect(page.body).toContain(`A webhook.ping event is on its way to ${RECEIVER}`);
    const delivery = await w.db.selectFrom('webhook_deliveries').selectAll().where('endpoint_id', '=', endpoint.id).executeTakeFirstOrThrow();
    expect(page.body).toContain(`href="/dashboard/webhooks/${endpoint.id}/deliveries/${delivery.id}"><code>webhook.ping</code>`);
    // As the dispatcher leaves it after its last attempt (`attempts`, its lease, moved on: a running dispatcher's late write is a no-op).
    await w.db.updateTable('webhook_deliveries').set({ state: 'failed', attempts: 4, last_status: 500, finished_at: new Date() }).where('id', '=', delivery.id).execute();
    await w.db.insertInto('webhook_attempts').values({ delivery_id: delivery.id, attempt: 1, duration_ms: 42, status: 500, response_body: '<b>oops</b>', error: null }).execute();
    const detail = await owner().get(`/dashboard/webhooks/${endpoint.id}/deliveries/${delivery.id}`);
    expect(detail.statusCode).toBe(200);
    expectPageSecurityHeaders(detail);
    expect(detail.body).toContain('&quot;type&quot;: &quot;webhook.ping&quot;');
    expect(detail.body).toContain('HTTP 500');
    expect(detail.body).toContain('&lt;b&gt;oops&lt;/b&gt;');
    expect(detail.body).toContain('Retry now');
    const retried = await follow(owner(), await submit(owner(), `/dashboard/webhooks/${endpoint.id}/deliveries/${delivery.id}/retry`));
    expect(retried.body).toContain('is sent again now');
    // Pending again (a running dispatcher may already have made its next attempt, which fails on this closed port and waits to retry).
    expect(await w.db.selectFrom('webhook_deliveries').select(['state', 'finished_at']).where('id', '=', delivery.id).executeTakeFirstOrThrow()).toEqual({ state: 'pending', finished_at: null });
    // A disabled endpoint is pinged by nobody: the refusal on the page.
    await submit(owner(), `/dashboard/webhooks/${endpoint.id}/state`, { enabled: 'no' });
    const refused = await submit(owner(), `/dashboard/webhooks/${endpoint.id}/ping`);
    expect(refused.statusCode).toBe(409);
    expect(alertIn(refused.body)).toContain('disabled');
  });

  it('deletes an endpoint after confirming', async () => {
    const org = await newWebhookOrganization();
    const { endpoint } = await createWebhookEndpoint(w.db, TEST_SECRET_KEY, org.id, { url: RECEIVER, events: ['member.added'] }, { config });
    const confirm = await submit(owner(), `/dashboard/webhooks/${endpoint.id}/delete`);
    expect(confirm.statusCode).toBe(200);
    expect(confirm.body).toContain('name="confirm" value="delete"');
    expect(await endpointsOf(org.id)).toHaveLength(1);
    const page = await follow(owner(), await submit(owner(), `/dashboard/webhooks/${endpoint.id}/delete`, { confirm: 'delete' }));
    expect(page.body).toContain(`Deleted the endpoint ${RECEIVER}: nothing more is sent to it.`);
    expect(await endpointsOf(org.id)).toEqual([]);
  });
});

describe(`dashboard webhooks: who may on ${BACKEND}`, () => {
  it('refuses the page and its forms to members and viewers (403)', async () => {
    const org = await newWebhookOrganization();
    const { endpoint } = await createWebhookEndpoint(w.db, TEST_SECRET_KEY, org.id, { url: RECEIVER, events: ['member.added'] }, { config });
    const delivery = await w.db.insertInto('webhook_events').values({ organization_id: org.id, type: 'webhook.ping', message_id: `msg_${'a'.repeat(24)}${org.id.toString().padStart(8, '0')}`, payload: '{}' }).returning('id').executeTakeFirstOrThrow()
      .then((event) => w.db.insertInto('webhook_deliveries').values({ event_id: event.id, endpoint_id: endpoint.id, organization_id: org.id, state: 'failed' }).returning('id').executeTakeFirstOrThrow());
    for (const b of [w.browsers.member, viewer]) {
      const page = await b.get('/dashboard/webhooks');
      expect(page.statusCode).toBe(403);
      expectPageSecurityHeaders(page);
      expect((await b.get(`/dashboard/webhooks/${endpoint.id}/deliveries/${delivery.id}`)).statusCode).toBe(403);
      for (const [url, fields] of [
        ['/dashboard/webhooks', { url: RECEIVER, events: 'member.added' }],
        [`/dashboard/webhooks/${endpoint.id}`, { url: RECEIVER, events: 'role.created' }],
        [`/dashboard/webhooks/${endpoint.id}/state`, { enabled: 'no' }],
        [`/dashboard/webhooks/${endpoint.id}/rotate-secret`, {}],
        [`/dashboard/webhooks/${endpoint.id}/ping`, {}],
        [`/dashboard/webhooks/${endpoint.id}/deliveries/${delivery.id}/retry`, {}],
        [`/dashboard/webhooks/${endpoint.id}/delete`, { confirm: 'delete' }],
      ] as const) {
        expect((await submit(b, url, fields)).statusCode, url).toBe(403);
      }
    }
    expect(await endpointsOf(org.id)).toMatchObject([{ id: endpoint.id, events: ['member.added'], enabled: true }]);
    expect(await w.db.selectFrom('webhook_deliveries').select('id').where('endpoint_id', '=', endpoint.id).execute()).toHaveLength(1);
    const anonymous = await new Browser(w.app, '10.22.1.1').get('/dashboard/webhooks');
    expect(anonymous.statusCode).toBe(303);
    expect(anonymous.headers.location).toMatch(/^\/login/);
  });

  it('refuses a form without the session’s CSRF token (403)', async () => {
    const org = await newWebhookOrganization();
    const { endpoint } = await createWebhookEndpoint(w.db, TEST_SECRET_KEY, org.id, { url: RECEIVER, events: ['member.added'] }, { config });
    expect((await owner().post('/dashboard/webhooks', { url: RECEIVER, events: 'member.added' })).statusCode).toBe(403);
    const foreign = await w.browsers.admin.csrf('/dashboard');
    expect((await owner().post('/dashboard/webhooks', { url: RECEIVER, events: 'member.added', csrf_token: foreign })).statusCode).toBe(403);
    expect((await owner().post(`/dashboard/webhooks/${endpoint.id}/rotate-secret`, {})).statusCode).toBe(403);
    expect(await endpointsOf(org.id)).toHaveLength(1);
  });

  it('answers 404 for another organization’s endpoint or delivery', async () => {
    await newWebhookOrganization();
    const theirs = (await w.db.selectFrom('organizations').select('id').where('name', '=', 'Outsider Org').executeTakeFirstOrThrow()).id;
    const { endpoint } = await createWebhookEndpoint(w.db, TEST_SECRET_KEY, theirs, { url: RECEIVER, events: ['member.added'] }, { config });
    for (const [url, fields] of [
      [`/dashboard/webhooks/${endpoint.id}`, { url: `${RECEIVER}/mine`, events: 'member.added' }],
      [`/dashboard/webhooks/${endpoint.id}/state`, { enabled: 'no' }],
      [`/dashboard/webhooks/${endpoint.id}/rotate-secret`, {}],
      [`/dashboard/webhooks/${endpoint.id}/ping`, {}],
      [`/dashboard/webhooks/${endpoint.id}/delete`, { confirm: 'delete' }],
      ['/dashboard/webhooks/01/ping', {}],
      ['/dashboard/webhooks/99999999/ping', {}],
    ] as const) {
      expect((await submit(owner(), url, fields)).statusCode, url).toBe(404);
    }
    expect((await owner().get(`/dashboard/webhooks/${endpoint.id}/deliveries/1`)).statusCode).toBe(404);
    expect(await endpointsOf(theirs)).toMatchObject([{ id: endpoint.id, url: RECEIVER, enabled: true }]);
    // Nothing in a URL becomes a notice.
    const forged = await owner().get(`/dashboard/webhooks?done=disabled&endpoint=${endpoint.id}`);
    expect(forged.statusCode).toBe(200);
    expect(forged.body).not.toContain('role="status"');
  });
});
