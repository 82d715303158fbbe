/**
 * The management API's webhook endpoints (issue 27): an organization's private application adds
 * receivers (/webhooks) with webhooks.write and reads them and their delivery log with
 * webhooks.read; the secret is shown once (create, rotate-secret) and sealed at rest; URLs pass
 * the SSRF rules (src/webhooks/url.ts) unless WEBHOOK_ALLOW_PRIVATE=1; a ping and an audited
 * change each make a delivery; a failed delivery can be retried; every change is audited.
 *
 * Two instances over one database: `open` runs with WEBHOOK_ALLOW_PRIVATE=1 (loopback receivers,
 * as in development), `strict` with the production rules. Nothing here waits for a delivery: the
 * dispatcher's own tests do (test/webhooks/).
 */
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BUILTIN_ROLES } from '../../src/accounts/roles.js';
import { KNOWN_SCOPES } from '../../src/oauth/helpers/scopes.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { MAX_WEBHOOK_ENDPOINTS } from '../../src/webhooks/endpoints.js';
import { openWebhookSecret } from '../../src/webhooks/secrets.js';
import { buildTestApp, TEST_SECRET_KEY, testConfig } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { clientCredentialsToken, createOrgFixture, type OrgFixture } from '../helpers/oauth.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let open: FastifyInstance;
let strict: FastifyInstance;
let issuer: string;
let a: OrgFixture;
let b: OrgFixture;
let c: OrgFixture;
const full = new Map<OrgFixture, string>();

beforeAll(async () => {
  t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  issuer = testConfig().issuer;
  open = await buildTestApp(t.handle.db, { listen: t.handle.listen, env: { WEBHOOK_ALLOW_PRIVATE: '1' } });
  strict = await buildTestApp(t.handle.db, { listen: t.handle.listen });
  [a, b, c] = [await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') }), await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') }), await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') })];
  for (const fixture of [a, b, c]) full.set(fixture, await clientCredentialsToken(open, fixture));
});
afterAll(async () => {
  await open?.close();
  await strict?.close();
  await t?.close();
});

type Method = 'GET' | 'POST' | 'PATCH' | 'DELETE';

function api(method: Method, path: string, options: { org?: OrgFixture; token?: string; body?: object; app?: FastifyInstance } = {}) {
  const org = options.org ?? a;
  return (options.app ?? open).inject({
    method,
    url: `/api/v1/${org.organizationId}${path}`,
    headers: { authorization: `Bearer ${options.token ?? full.get(org)}` },
    ...(options.body ? { payload: options.body } : {}),
  });
}

function expectError(res: LightMyRequestResponse, status: number, error: string): { error: string; error_description: string; details?: { path: string; message: string }[] } {
  expect({ status: res.statusCode, body: res.json() }).toMatchObject({ status, body: { error, error_description: expect.any(String) } });
  return res.json();
}

async function auditEvents(org: OrgFixture = a): Promise<{ action: string; actor: { user_id: number | null; client_id: string | null }; details: Record<string, unknown> }[]> {
  const res = await api('GET', '/audit-events?limit=100', { org, token: await clientCredentialsToken(open, org, 'audit.read') });
  expect(res.statusCode).toBe(200);
  return res.json().data;
}

/** A loopback receiver nobody listens on: the dispatcher (when it runs) only fails against it. */
const RECEIVER = 'http://127.0.0.1:9/hooks/orgauth';
const SECRET = /^whsec_[A-Za-z0-9+/]{43}=$/;

async function create(body: object = {}, org: OrgFixture = a): Promise<Record<string, unknown> & { id: number; secret: string }> {
  const res = await api('POST', '/webhooks', { org, body: { url: RECEIVER, events: ['member.added'], ...body } });
  expect(res.statusCode, res.body).toBe(201);
  return res.json();
}

describe(`webhook endpoints in the management API on ${BACKEND}`, () => {
  it('creates an endpoint: 201 with its id and its secret (whsec_, shown this once), sealed at rest, audited', async () => {
    const res = await api('POST', '/webhooks', { body: { url: RECEIVER, events: ['member.added', 'member.removed'], description: 'CRM sync' } });
    expect(res.statusCode, res.body).toBe(201);
    const made = res.json();
    expect(made).toEqual({
      id: expect.any(Number), organization_id: a.organizationId, url: RECEIVER, description: 'CRM sync', events: ['member.added', 'member.removed'],
      enabled: true, disabled_reason: null, failing_since: null, previous_secret_expires_at: null,
      created_at: expect.any(String), updated_at: expect.any(String),
      secret: expect.stringMatching(SECRET),
    });
    expect(res.headers.location).toBe(`/api/v1/${a.organizationId}/webhooks/${made.id}`);
    const { secret, ...endpoint } = made;
    const shown = await api('GET', `/webhooks/${made.id}`);
    expect(shown.statusCode).toBe(200);
    expect(shown.json()).toEqual(endpoint);
    const listed = await api('GET', '/webhooks');
    expect(listed.json().data).toContainEqual(endpoint);
    for (const body of [shown.body, listed.body]) {
      expect(body).not.toContain(secret);
      expect(body).not.toMatch(/whsec_|secret"|sealed/);
    }
    const row = await t.handle.db.selectFrom('webhook_endpoints').select(['secret_sealed', 'previous_secret_sealed']).where('id', '=', made.id).executeTakeFirstOrThrow();
    expect(row.secret_sealed).not.toContain(secret.slice(6));
    expect(openWebhookSecret(TEST_SECRET_KEY, row.secret_sealed)).toBe(secret);
    expect(row.previous_secret_sealed).toBeNull();
    expect((await auditEvents()).find((e) => e.action === 'webhook.created' && e.details.endpoint_id === made.id)).toEqual({
      id: expect.any(Number), action: 'webhook.created', created_at: expect.any(String),
      actor: { user_id: null, email: null, client_id: a.privateApp.client_id },
      details: { endpoint_id: made.id, url: 'http://127.0.0.1:9/hooks/orgauth', events: ['member.added', 'member.removed'], enabled: true },
    });
  });

  it('keeps each event type once, in the catalogue’s order; a new endpoint may start disabled', async () => {
    const made = await create({ events: ['role.deleted', 'member.added', 'role.deleted'], enabled: false });
    expect(made).toMatchObject({ events: ['member.added', 'role.deleted'], enabled: false, disabled_reason: null });
  });

  it('keeps a query string out of the audit log: receivers put tokens there', async () => {
    const made = await create({ url: `${RECEIVER}?token=receiver-own-token-123` });
    expect(made.url).toBe(`${RECEIVER}?token=receiver-own-token-123`);
    const event = (await auditEvents()).find((e) => e.action === 'webhook.created' && e.details.endpoint_id === made.id);
    expect(event?.details.url).toBe(RECEIVER);
    expect(JSON.stringify(await auditEvents())).not.toContain('receiver-own-token-123');
  });

  it('refuses what the rules refuse: 400 with details naming the field', async () => {
    const refused = async (body: object, path: string, app: FastifyInstance = open) => {
      const error = expectError(await api('POST', '/webhooks', { app, body: { url: RECEIVER, events: ['member.added'], ...body } }), 400, 'invalid_request');
      expect(error.details?.map((d) => d.path.split('.')[0])).toContain(path);
      return error;
    };
    await refused({ events: [] }, 'events');
    await refused({ events: ['member.added', 'user.password_changed'] }, 'events');
    await refused({ events: ['webhook.ping'] }, 'events');
    await refused({ events: ['*'] }, 'events');
    await refused({ url: 'not a url' }, 'url');
    await refused({ url: 'ftp://hooks.example.com/x' }, 'url');
    await refused({ url: 'http://user:pass@127.0.0.1:9/x' }, 'url');
    await refused({ url: `${RECEIVER}#frag` }, 'url');
    await refused({ url: `https://hooks.example.com/${'x'.repeat(2000)}` }, 'url');
    await refused({ description: 'x'.repeat(501) }, 'description');
    await refused({ description: 'bell\u0007' }, 'description');
    // The shape: unknown fields, missing fields, wrong types.
    expectError(await api('POST', '/webhooks', { body: { url: RECEIVER } }), 400, 'invalid_request');
    expectError(await api('POST', '/webhooks', { body: { events: ['member.added'] } }), 400, 'invalid_request');
    expectError(await api('POST', '/webhooks', { body: { url: RECEIVER, events: 'member.added' } }), 400, 'invalid_request');
    expectError(await api('POST', '/webhooks', { body: { url: RECEIVER, events: ['member.added'], secret: 'whsec_mine' } }), 400, 'invalid_request');
  });

  it('without WEBHOOK_ALLOW_PRIVATE: https to a public address only, whatever the spelling of a private one', async () => {
    const refused = async (url: string) => {
      const res = await api('POST', '/webhooks', { app: strict, body: { url, events: ['member.added'] } });
      expect({ url, status: res.statusCode, details: res.json().details }).toEqual({ url, status: 400, details: [{ path: 'url', message: expect.any(String) }] });
    };
    for (const url of [
      'http://hooks.example.com/x',
      RECEIVER.replace('http:', 'https:'),
      'https://localhost/x',
      'https://LOCALHOST./x',
      'https://api.localhost/x',
      'https://10.1.2.3/x',
      'https://172.16.0.1/x',
      'https://192.168.1.1/x',
      'https://169.254.169.254/latest/meta-data/',
      'https://100.64.0.1/x',
      'https://0.0.0.0/x',
      'https://2130706433/x',
      'https://0177.0.0.1/x',
      'https://0x7f000001/x',
      'https://127.1/x',
      'https://[::1]/x',
      'https://[::ffff:127.0.0.1]/x',
      'https://[::ffff:7f00:1]/x',
      'https://[fe80::1]/x',
      'https://[fc00::1]/x',
      'https://user@93.184.215.14/x',
    ]) await refused(url);
    // A public literal needs no DNS: accepted.
    const ok = await api('POST', '/webhooks', { app: strict, org: b, body: { url: 'https://93.184.215.14/hooks', events: ['member.added'] } });
    expect(ok.statusCode, ok.body).toBe(201);
    expect(ok.json().url).toBe('https://93.184.215.14/hooks');
    // Changing the URL is checked the same way.
    const patched = await api('PATCH', `/webhooks/${ok.json().id}`, { app: strict, org: b, body: { url: 'https://127.0.0.1/x' } });
    expect(expectError(patched, 400, 'invalid_request').details).toEqual([{ path: 'url', message: expect.any(String) }]);
    expect((await api('DELETE', `/webhooks/${ok.json().id}`, { org: b })).statusCode).toBe(204);
  });

  it(`allows at most ${MAX_WEBHOOK_ENDPOINTS} endpoints per organization`, async () => {
    const org = await createOrgFixture(t.handle.db, { scopes: 'webhooks.read webhooks.write' });
    const token = await clientCredentialsToken(open, org);
    for (let i = 0; i < MAX_WEBHOOK_ENDPOINTS; i++) {
      expect((await api('POST', '/webhooks', { org, token, body: { url: `${RECEIVER}/${i}`, events: ['member.added'] } })).statusCode).toBe(201);
    }
    const over = expectError(await api('POST', '/webhooks', { org, token, body: { url: RECEIVER, events: ['member.added'] } }), 400, 'invalid_request');
    expect(over.error_description).toContain(String(MAX_WEBHOOK_ENDPOINTS));
    // Pages follow the id: two by two, all of them, none twice.
    const seen: number[] = [];
    let cursor: string | null = '';
    while (cursor !== null) {
      const page: { data: { id: number }[]; next_cursor: string | null } = (await api('GET', `/webhooks?limit=7${cursor ? `&cursor=${cursor}` : ''}`, { org, token })).json();
      seen.push(...page.data.map((e) => e.id));
      cursor = page.next_cursor;
    }
    expect(seen).toHaveLength(MAX_WEBHOOK_ENDPOINTS);
    expect([...seen].sort((x, y) => x - y)).toEqual(seen);
  });

  it('changes an endpoint: only what is given; re-enabling clears why orgauth disabled it; audited with what changed', async () => {
    const made = await create({ events: ['member.added'] });
    const res = await api('PATCH', `/webhooks/${made.id}`, { body: { events: ['member.removed', 'member.added'], description: 'Second' } });
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json()).toMatchObject({ id: made.id, url: RECEIVER, events: ['member.added', 'member.removed'], description: 'Second', enabled: true });
    expect(res.body).not.toMatch(/whsec_|"secret"/);
    // What the dispatcher does after five days of failures.
    await t.handle.db.updateTable('webhook_endpoints').set({ enabled: false, disabled_reason: 'failing', failing_since: new Date(Date.now() - 6 * 86400_000) }).where('id', '=', made.id).execute();
    expect((await api('GET', `/webhooks/${made.id}`)).json()).toMatchObject({ enabled: false, disabled_reason: 'failing', failing_since: expect.any(String) });
    const enabled = await api('PATCH', `/webhooks/${made.id}`, { body: { enabled: true, url: `${RECEIVER}/v2` } });
    expect(enabled.json()).toMatchObject({ enabled: true, disabled_reason: null, failing_since: null, url: `${RECEIVER}/v2` });
    // Nothing changed: nothing audited.
    expect((await api('PATCH', `/webhooks/${made.id}`, { body: { description: 'Second' } })).statusCode).toBe(200);
    expectError(await api('PATCH', `/webhooks/${made.id}`, { body: {} }), 400, 'invalid_request');
    expectError(await api('PATCH', `/webhooks/${made.id}`, { body: { events: ['nope'] } }), 400, 'invalid_request');
    expect((await auditEvents()).filter((e) => e.action === 'webhook.updated' && e.details.endpoint_id === made.id).map((e) => e.details)).toEqual([
      { endpoint_id: made.id, changed: ['url', 'enabled'], url: `${RECEIVER}/v2`, enabled: true },
      { endpoint_id: made.id, changed: ['events', 'description'], events: ['member.added', 'member.removed'] },
    ]);
  });

  it('rotates the secret: the new one in the answer, the previous one kept signing for 24 hours', async () => {
    const made = await create();
    const res = await api('POST', `/webhooks/${made.id}/rotate-secret`);
    expect(res.statusCode, res.body).toBe(200);
    const rotated = res.json();
    expect(rotated).toMatchObject({ id: made.id, secret: expect.stringMatching(SECRET), previous_secret_expires_at: expect.any(String) });
    expect(rotated.secret).not.toBe(made.secret);
    const until = Date.parse(rotated.previous_secret_expires_at) - Date.now();
    expect(until).toBeGreaterThan(23.9 * 3600_000);
    expect(until).toBeLessThan(24.1 * 3600_000);
    const row = await t.handle.db.selectFrom('webhook_endpoints').select(['secret_sealed', 'previous_secret_sealed']).where('id', '=', made.id).executeTakeFirstOrThrow();
    expect(openWebhookSecret(TEST_SECRET_KEY, row.secret_sealed)).toBe(rotated.secret);
    expect(openWebhookSecret(TEST_SECRET_KEY, row.previous_secret_sealed!)).toBe(made.secret);
    const shown = await api('GET', `/webhooks/${made.id}`);
    expect(shown.json().previous_secret_expires_at).toBe(rotated.previous_secret_expires_at);
    expect(shown.body).not.toContain(rotated.secret);
    expect((await auditEvents()).find((e) => e.action === 'webhook.secret_rotated' && e.details.endpoint_id === made.id)?.details).toEqual({ endpoint_id: made.id });
  });

  it('pings an endpoint: 202 and a webhook.ping delivery for it alone, whatever it subscribes to', async () => {
    const made = await create({ events: ['role.created'] });
    const other = await create({ events: ['role.created'] });
    const res = await api('POST', `/webhooks/${made.id}/ping`);
    expect(res.statusCode, res.body).toBe(202);
    const delivery = res.json();
    expect(delivery).toEqual({
      id: expect.any(Number), endpoint_id: made.id, event_id: expect.any(Number), event_type: 'webhook.ping', message_id: expect.stringMatching(/^msg_[0-9a-f]{32}$/),
      state: 'pending', attempts: 0, last_status: null, last_error: null, next_attempt_at: expect.any(String), created_at: expect.any(String), finished_at: null,
    });
    expect(res.headers.location).toBe(`/api/v1/${a.organizationId}/webhooks/${made.id}/deliveries/${delivery.id}`);
    const detail = (await api('GET', `/webhooks/${made.id}/deliveries/${delivery.id}`)).json();
    expect(detail).toMatchObject({ id: delivery.id, message_id: delivery.message_id, attempts_log: expect.any(Array) });
    expect(detail.payload).toEqual({ type: 'webhook.ping', timestamp: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/), data: { organization_id: a.organizationId, endpoint_id: made.id } });
    expect((await api('GET', `/webhooks/${made.id}/deliveries`)).json().data.map((d: { id: number }) => d.id)).toEqual([delivery.id]);
    expect((await api('GET', `/webhooks/${other.id}/deliveries`)).json()).toEqual({ data: [], next_cursor: null });
    // A disabled endpoint is sent nothing, a ping included.
    await api('PATCH', `/webhooks/${made.id}`, { body: { enabled: false } });
    expectError(await api('POST', `/webhooks/${made.id}/ping`), 409, 'conflict');
  });

  it('turns an audited change into a delivery for each enabled endpoint subscribed to its type', async () => {
    const org = c;
    const wants = await create({ events: ['role.created'] }, org);
    const disabled = await create({ events: ['role.created'], enabled: false }, org);
    const elsewhere = await create({ events: ['member.added'] }, org);
    const role = await api('POST', '/roles', { org, body: { name: 'Webhook watchers', permissions: [] } });
    expect(role.statusCode, role.body).toBe(201);
    const deliveries = (await api('GET', `/webhooks/${wants.id}/deliveries`, { org })).json().data;
    expect(deliveries).toHaveLength(1);
    expect(deliveries[0]).toMatchObject({ endpoint_id: wants.id, event_type: 'role.created' });
    const detail = (await api('GET', `/webhooks/${wants.id}/deliveries/${deliveries[0].id}`, { org })).json();
    expect(detail.payload).toMatchObject({ type: 'role.created', data: { organization_id: org.organizationId, actor: { user_id: null, client_id: org.privateApp.client_id }, name: 'Webhook watchers' } });
    // The resource's version (its updated_at after the change), for receivers to order by: ordering is not guaranteed.
    expect(detail.payload.data.version).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);
    expect(new Date(detail.payload.data.version).getTime()).toBe(new Date(role.json().updated_at).getTime());
    expect(detail.payload.timestamp).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);
    for (const endpoint of [disabled, elsewhere]) expect((await api('GET', `/webhooks/${endpoint.id}/deliveries`, { org })).json().data).toEqual([]);
  });

  it('retries a failed delivery with the same webhook-id; refuses a succeeded one (409); pages newest first', async () => {
    const made = await create();
    const first = (await api('POST', `/webhooks/${made.id}/ping`)).json();
    const second = (await api('POST', `/webhooks/${made.id}/ping`)).json();
    const third = (await api('POST', `/webhooks/${made.id}/ping`)).json();
    const page1 = (await api('GET', `/webhooks/${made.id}/deliveries?limit=2`)).json();
    expect(page1.data.map((d: { id: number }) => d.id)).toEqual([third.id, second.id]);
    const page2 = (await api('GET', `/webhooks/${made.id}/deliveries?limit=2&cursor=${page1.next_cursor}`)).json();
    expect(page2).toEqual({ data: [expect.objectContaining({ id: first.id })], next_cursor: null });

    // As the dispatcher leaves a delivery after its last retry, with its log. `attempts` is the
    // dispatcher's lease: changing it makes a running dispatcher's late write about its own attempt a no-op.
    await t.handle.db.updateTable('webhook_deliveries').set({ state: 'failed', attempts: 3, last_status: 503, last_error: 'HTTP 503', finished_at: new Date() }).where('id', '=', first.id).execute();
    await t.handle.db.insertInto('webhook_attempts').values([
      { delivery_id: first.id, attempt: 1, duration_ms: 12, status: 503, response_body: 'busy', error: null },
      { delivery_id: first.id, attempt: 2, duration_ms: 10_000, status: null, response_body: null, error: 'timed out after 10000 ms' },
    ]).execute();
    const failed = (await api('GET', `/webhooks/${made.id}/deliveries/${first.id}`)).json();
    expect(failed).toMatchObject({ state: 'failed', attempts: 3, last_status: 503, next_attempt_at: null, finished_at: expect.any(String) });
    // Contained rather than equal: a running dispatcher may have logged an attempt of its own first.
    expect(failed.attempts_log).toEqual(expect.arrayContaining([
      { attempt: 1, started_at: expect.any(String), duration_ms: 12, status: 503, response_body: 'busy', error: null },
      { attempt: 2, started_at: expect.any(String), duration_ms: 10_000, status: null, response_body: null, error: 'timed out after 10000 ms' },
    ]));
    const retried = await api('POST', `/webhooks/${made.id}/deliveries/${first.id}/retry`);
    expect(retried.statusCode, retried.body).toBe(202);
    expect(retried.json()).toMatchObject({ id: first.id, message_id: first.message_id, state: 'pending', attempts: 3, next_attempt_at: expect.any(String), finished_at: null });
    expect((await auditEvents()).find((e) => e.action === 'webhook.delivery_retried' && e.details.delivery_id === first.id)?.details).toEqual({
      endpoint_id: made.id, delivery_id: first.id, message_id: first.message_id, event_type: 'webhook.ping',
    });

    await t.handle.db.updateTable('webhook_deliveries').set({ state: 'succeeded', attempts: 7, last_status: 200, finished_at: new Date() }).where('id', '=', second.id).execute();
    expectError(await api('POST', `/webhooks/${made.id}/deliveries/${second.id}/retry`), 409, 'conflict');
    // A delivery is found only under its own endpoint.
    const other = await create();
    expectError(await api('GET', `/webhooks/${other.id}/deliveries/${first.id}`), 404, 'not_found');
    expectError(await api('POST', `/webhooks/${other.id}/deliveries/${first.id}/retry`), 404, 'not_found');
    expectError(await api('GET', `/webhooks/${made.id}/deliveries/abc`), 404, 'not_found');
    expectError(await api('GET', `/webhooks/${made.id}/deliveries?cursor=nope`), 400, 'invalid_request');
  });

  it('deletes an endpoint: 204, then 404; its deliveries go with it', async () => {
    const made = await create();
    const ping = (await api('POST', `/webhooks/${made.id}/ping`)).json();
    expect((await api('DELETE', `/webhooks/${made.id}`)).statusCode).toBe(204);
    expectError(await api('GET', `/webhooks/${made.id}`), 404, 'not_found');
    expectError(await api('DELETE', `/webhooks/${made.id}`), 404, 'not_found');
    expect(await t.handle.db.selectFrom('webhook_deliveries').select('id').where('id', '=', ping.id).execute()).toEqual([]);
    expect((await auditEvents()).find((e) => e.action === 'webhook.deleted' && e.details.endpoint_id === made.id)?.details).toEqual({ endpoint_id: made.id, url: RECEIVER });
  });

  it("finds another organization's endpoint nowhere: 404, exactly like a missing one, and leaves it as it was", async () => {
    const theirs = await create({}, b);
    const before = await t.handle.db.selectFrom('webhook_endpoints').selectAll().where('id', '=', theirs.id).executeTakeFirstOrThrow();
    const missing = 987_654_321;
    for (const [method, suffix, body] of [
      ['GET', '', undefined],
      ['PATCH', '', { description: 'mine now' }],
      ['DELETE', '', undefined],
      ['POST', '/rotate-secret', undefined],
      ['POST', '/ping', undefined],
      ['GET', '/deliveries', undefined],
    ] as const) {
      const foreign = await api(method, `/webhooks/${theirs.id}${suffix}`, body ? { body } : {});
      const unknown = await api(method, `/webhooks/${missing}${suffix}`, body ? { body } : {});
      expect({ method, suffix, status: foreign.statusCode, body: foreign.json() }).toEqual({ method, suffix, status: 404, body: unknown.json() });
    }
    expect(await t.handle.db.selectFrom('webhook_endpoints').selectAll().where('id', '=', theirs.id).executeTakeFirstOrThrow()).toEqual(before);
    // B's path with A's token: the organization check comes first.
    expect((await api('GET', '/webhooks', { org: b, token: full.get(a)! })).json().error).toBe('organization_mismatch');
  });
});

describe(`the webhook routes' scopes on ${BACKEND} (BR-2)`, () => {
  const ROUTES: { method: Method; path: string; scope: string; body?: object }[] = [
    { method: 'GET', path: '/webhooks', scope: 'webhooks.read' },
    { method: 'POST', path: '/webhooks', scope: 'webhooks.write', body: { url: RECEIVER, events: ['member.added'] } },
    { method: 'GET', path: '/webhooks/1', scope: 'webhooks.read' },
    { method: 'PATCH', path: '/webhooks/1', scope: 'webhooks.write', body: { description: 'x' } },
    { method: 'DELETE', path: '/webhooks/1', scope: 'webhooks.write' },
    { method: 'POST', path: '/webhooks/1/rotate-secret', scope: 'webhooks.write' },
    { method: 'POST', path: '/webhooks/1/ping', scope: 'webhooks.write' },
    { method: 'GET', path: '/webhooks/1/deliveries', scope: 'webhooks.read' },
    { method: 'GET', path: '/webhooks/1/deliveries/1', scope: 'webhooks.read' },
    { method: 'POST', path: '/webhooks/1/deliveries/1/retry', scope: 'webhooks.write' },
  ];

  it('refuses every token without the route’s scope (403 insufficient_scope); webhooks.write does not imply webhooks.read', async () => {
    const tokens = new Map<string, string>();
    for (const scope of KNOWN_SCOPES) tokens.set(scope, await clientCredentialsToken(open, c, scope));
    for (const route of ROUTES) {
      for (const scope of KNOWN_SCOPES.filter((s) => s !== route.scope)) {
        const res = await api(route.method, route.path, { org: c, token: tokens.get(scope)!, ...(route.body ? { body: route.body } : {}) });
        expect({ route: `${route.method} ${route.path}`, scope, status: res.statusCode, error: res.json().error }).toEqual({ route: `${route.method} ${route.path}`, scope, status: 403, error: 'insufficient_scope' });
        expect(res.headers['www-authenticate']).toBe(`Bearer realm="orgauth", resource_metadata="${issuer}/.well-known/oauth-protected-resource/api/v1", error="insufficient_scope", scope="${route.scope}"`);
      }
    }
    const count = await t.handle.db.selectFrom('webhook_endpoints').select(sql<number>`count(*)::int`.as('n')).where('organization_id', '=', c.organizationId).executeTakeFirstOrThrow();
    // Only what the earlier tests made for this organization: the refused calls made nothing.
    expect(count.n).toBe(3);
  });

  it('lets the token with the scope through', async () => {
    const read = await clientCredentialsToken(open, c, 'webhooks.read');
    const write = await clientCredentialsToken(open, c, 'webhooks.write');
    const made = await api('POST', '/webhooks', { org: c, token: write, body: { url: RECEIVER, events: ['grant.revoked'] } });
    expect(made.statusCode).toBe(201);
    expect((await api('GET', `/webhooks/${made.json().id}`, { org: c, token: read })).json().events).toEqual(['grant.revoked']);
    expect((await api('DELETE', `/webhooks/${made.json().id}`, { org: c, token: write })).statusCode).toBe(204);
  });

  it('gives the permissions to owners and admins, not to members or viewers; a role that writes also reads, and reads the audit log its events come from', async () => {
    for (const role of ['owner', 'admin'] as const) expect(BUILTIN_ROLES[role].permissions).toEqual(expect.arrayContaining(['webhooks.read', 'webhooks.write']));
    for (const role of ['member', 'viewer'] as const) expect(BUILTIN_ROLES[role].permissions.filter((p) => p.startsWith('webhooks.'))).toEqual([]);
    const res = await api('POST', '/roles', { body: { name: 'Webhook admin', permissions: ['webhooks.write'] } });
    expect(res.statusCode, res.body).toBe(201);
    expect(res.json().permissions).toEqual(['audit.read', 'webhooks.read', 'webhooks.write']);
  });

  it('keeps the management scopes off public applications, in the database too', async () => {
    await expect(t.handle.db.updateTable('applications').set({ scopes: ['contacts.read', 'webhooks.read'] }).where('client_id', '=', a.publicApp.client_id).execute()).rejects.toMatchObject({ code: '23514' });
  });
});

describe(`the webhook routes in the OpenAPI document on ${BACKEND}`, () => {
  it('documents them with their scopes, and the secret only in the answers that make one', async () => {
    const doc = (await open.inject('/openapi.json')).json() as { paths: Record<string, Record<string, { security: { oauth2: string[] }[]; responses: Record<string, { content?: Record<string, { schema: { $ref?: string } }> }> }>>; components: { schemas: Record<string, { properties: Record<string, unknown> }> } };
    const post = doc.paths['/api/v1/{organization_id}/webhooks']!.post!;
    expect(post.security).toEqual([{ oauth2: ['webhooks.write'] }]);
    expect(JSON.stringify(post.responses['201'])).toContain('WebhookEndpointWithSecret');
    expect(Object.keys(doc.components.schemas.WebhookEndpoint!.properties)).not.toContain('secret');
    expect(Object.keys(doc.components.schemas.WebhookEndpointWithSecret!.properties)).toContain('secret');
    expect(doc.paths['/api/v1/{organization_id}/webhooks/{id}/deliveries/{delivery_id}/retry']!.post!.security).toEqual([{ oauth2: ['webhooks.write'] }]);
  });
});
