/**
 * Webhook URLs are a server-side request forgery vector (AG-1): an organization admin chooses
 * where orgauth POSTs from inside its network. With WEBHOOK_ALLOW_PRIVATE off, every URL of the
 * battery below (private, loopback, link-local and other special-use addresses in every spelling,
 * names that resolve to them, plain http, credentials) is refused twice: when an endpoint is
 * created through the API (400, details on `url`), and at delivery, for a row written straight
 * into the table past that check, where the attempt is logged as refused and nothing listening
 * on 127.0.0.1 or ::1 (a connection trap on the URLs' port) is ever connected to. Names resolve
 * through a DNS server of the test's own (DNS_SERVERS), so the real resolver path is exercised,
 * including a name that turns private after the endpoint was created (rebinding). A receiver that
 * answers with a redirect to 127.0.0.1 is not followed.
 */
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { KNOWN_SCOPES } from '../../src/oauth/helpers/scopes.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { checkWebhookUrl } from '../../src/webhooks/url.js';
import { buildTestApp, TEST_SECRET_KEY, testConfig } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { startDnsServer, type TestDnsServer } from '../helpers/dns-server.js';
import { clientCredentialsToken, createOrgFixture, type OrgFixture } from '../helpers/oauth.js';
import { connectionTrap, WebhookReceiver } from '../helpers/webhook-receiver.js';
import { attemptsLogged, attemptsOf, deliveryOf, emit, insertEndpoint, type QueueWatch, settleAndStop, startDispatcher, watchQueue } from './fixture.js';

/** A public address (TEST-NET addresses are special-use, so a real one): never connected to, only resolved to. */
const PUBLIC = '93.184.215.14';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let dns: TestDnsServer;
let trap: Awaited<ReturnType<typeof connectionTrap>>;
/** Waits on the queue's own changes rather than polling it. */
let watch: QueueWatch;

/** The battery, `{port}` standing for the trap's port. */
const REFUSED: readonly (readonly [string, string])[] = [
  ['10.0.0.0/8', 'https://10.1.2.3:{port}/hook'],
  ['172.16.0.0/12', 'https://172.31.255.254:{port}/hook'],
  ['192.168.0.0/16', 'https://192.168.1.1:{port}/hook'],
  ['127.0.0.0/8', 'https://127.0.0.1:{port}/hook'],
  ['127.0.0.0/8 beyond .1', 'https://127.45.6.7:{port}/hook'],
  ['0.0.0.0', 'https://0.0.0.0:{port}/hook'],
  ['cloud metadata', 'https://169.254.169.254/latest/meta-data/iam/security-credentials/'],
  ['100.64.0.0/10', 'https://100.64.0.1:{port}/hook'],
  ['localhost', 'https://localhost:{port}/hook'],
  ['LOCALHOST. (case, root dot)', 'https://LOCALHOST.:{port}/hook'],
  ['a localhost subdomain', 'https://api.localhost:{port}/hook'],
  ['IPv6 loopback', 'https://[::1]:{port}/hook'],
  ['IPv4-mapped, dotted', 'https://[::ffff:127.0.0.1]:{port}/hook'],
  ['IPv4-mapped, hex', 'https://[::ffff:7f00:1]:{port}/hook'],
  ['IPv6 link-local', 'https://[fe80::1]:{port}/hook'],
  ['IPv6 unique local', 'https://[fc00::1]:{port}/hook'],
  ['decimal IPv4', 'https://2130706433:{port}/hook'],
  ['octal IPv4', 'https://0177.0.0.1:{port}/hook'],
  ['hex IPv4', 'https://0x7f000001:{port}/hook'],
  ['short IPv4', 'https://127.1:{port}/hook'],
  ['a name resolving to 127.0.0.1', 'https://loopback.webhooks.test:{port}/hook'],
  ['a name resolving to 10.0.0.5', 'https://intranet.webhooks.test:{port}/hook'],
  ['a name resolving to 169.254.169.254', 'https://metadata.webhooks.test/hook'],
  ['a name resolving to ::1', 'https://six.webhooks.test:{port}/hook'],
  ['a name resolving to a public and a private address', 'https://mixed.webhooks.test:{port}/hook'],
  ['a name that does not resolve', 'https://nowhere.webhooks.test:{port}/hook'],
  ['plain http', 'http://public.webhooks.test:{port}/hook'],
  ['credentials', 'https://user:password@public.webhooks.test:{port}/hook'],
];

const urlOf = (template: string) => template.replace('{port}', String(trap.port));

beforeAll(async () => {
  [t, dns, trap] = await Promise.all([createTestDatabase(), startDnsServer(), connectionTrap()]);
  dns.setAddresses('loopback.webhooks.test', ['127.0.0.1']);
  dns.setAddresses('intranet.webhooks.test', ['10.0.0.5']);
  dns.setAddresses('metadata.webhooks.test', ['169.254.169.254']);
  dns.setAddresses('six.webhooks.test', ['::1']);
  dns.setAddresses('mixed.webhooks.test', [PUBLIC, '127.0.0.1']);
  dns.setAddresses('public.webhooks.test', [PUBLIC]);
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  watch = await watchQueue(t.handle.db, t.handle.listen);
});
afterAll(async () => {
  await watch?.close();
  await trap?.close();
  await dns?.close();
  await t?.close();
});

/** The production rules: no WEBHOOK_ALLOW_PRIVATE; names resolve through the test's DNS server; one attempt per test. */
const STRICT = () => ({ DNS_SERVERS: dns.address, WEBHOOK_RETRY_DELAYS: '3600' });

describe(`webhook URLs at creation on ${BACKEND}`, () => {
  let strict: FastifyInstance;
  let org: OrgFixture;
  let token: string;

  // An app with the production rules. Once the app runs a dispatcher of its own, it has the
  // configuration of the test's, so either may make an attempt below: the outcome is the same.
  beforeAll(async () => {
    strict = await buildTestApp(t.handle.db, { env: STRICT() });
    org = await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') });
    token = await clientCredentialsToken(strict, org);
  });
  afterAll(async () => {
    await strict?.close();
  });

  function create(url: string) {
    return strict.inject({
      method: 'POST',
      url: `/api/v1/${org.organizationId}/webhooks`,
      headers: { authorization: `Bearer ${token}` },
      payload: { url, events: ['member.added'] },
    });
  }

  it.each(REFUSED)('refuses %s when an endpoint is created (400 on url)', async (_label, template) => {
    const res = await create(urlOf(template));
    expect(res.statusCode, res.body).toBe(400);
    const body = res.json() as { error: string; details?: { path: string; message: string }[] };
    expect(body.error).toBe('invalid_request');
    expect(body.details?.[0]?.path).toBe('url');
  });

  it('accepts an https URL whose name resolves to public addresses only (the check is not a blanket refusal)', async () => {
    const config = testConfig({ DNS_SERVERS: dns.address });
    await expect(checkWebhookUrl(`https://public.webhooks.test:${trap.port}/hook`, config)).resolves.toBeInstanceOf(URL);
    await expect(checkWebhookUrl(`https://[2606:4700::1111]/hook`, config)).resolves.toBeInstanceOf(URL);
  });

  it('refuses at delivery a name that resolved to a public address at creation and to 127.0.0.1 now (rebinding)', async () => {
    const db = t.handle.db;
    dns.setAddresses('rebind.webhooks.test', [PUBLIC]);
    const res = await create(`https://rebind.webhooks.test:${trap.port}/hook`);
    expect(res.statusCode, res.body).toBe(201);
    const endpointId = (res.json() as { id: number }).id;
    dns.setAddresses('rebind.webhooks.test', ['127.0.0.1']);
    const running = await startDispatcher(db, { env: STRICT(), listen: t.handle.listen });
    try {
      const event = (await emit(db, org.organizationId))!;
      const delivery = await deliveryOf(db, event.id, endpointId);
      await attemptsLogged(watch, db, delivery.id, 1);
      expect(await attemptsOf(db, delivery.id)).toHaveLength(1);
      expect((await attemptsOf(db, delivery.id))[0]).toMatchObject({ status: null, error: expect.stringMatching(/rebind\.webhooks\.test resolves to a private or special-use address \(127\.0\.0\.1\)/) });
      expect(trap.connections()).toBe(0);
    } finally {
      await running.stop();
      await db.deleteFrom('webhook_endpoints').where('id', '=', endpointId).execute();
    }
  });

});

describe(`webhook URLs at delivery on ${BACKEND}`, () => {
  it('refuses every URL of the battery again at delivery, without connecting, when the row bypassed creation', async () => {
    const db = t.handle.db;
    // An organization of its own: its events go to these endpoints only.
    const org = await createOrgFixture(db);
    const endpoints = [];
    for (const [label, template] of REFUSED) endpoints.push({ label, ...(await insertEndpoint(db, org.organizationId, urlOf(template))) });
    const running = await startDispatcher(db, { env: STRICT(), listen: t.handle.listen });
    try {
      const event = (await emit(db, org.organizationId))!;
      for (const endpoint of endpoints) {
        const delivery = await deliveryOf(db, event.id, endpoint.id);
        await attemptsLogged(watch, db, delivery.id, 1);
        expect(await attemptsOf(db, delivery.id), endpoint.label).toHaveLength(1);
        const [attempt] = await attemptsOf(db, delivery.id);
        expect(attempt, endpoint.label).toMatchObject({ status: null, response_body: null, error: expect.stringMatching(/^url: /) });
        // Refused before any connection: no timeout was waited out.
        expect(attempt!.duration_ms, endpoint.label).toBeLessThan(5000);
        expect(await deliveryOf(db, event.id, endpoint.id), endpoint.label).toMatchObject({ state: 'pending', last_status: null });
      }
      expect(trap.connections()).toBe(0);
    } finally {
      await running.stop();
    }
  });

  it('does not follow a redirect from an allowed receiver to 127.0.0.1', async () => {
    const db = t.handle.db;
    const org = await createOrgFixture(db);
    const receiver = await WebhookReceiver.start();
    // The receiver is only reachable with WEBHOOK_ALLOW_PRIVATE (it is on loopback too), under a name.
    dns.setAddresses('receiver.webhooks.test', ['127.0.0.1']);
    receiver.answer = () => ({ status: 302, headers: { location: `http://127.0.0.1:${trap.port}/internal` } });
    const endpoint = await insertEndpoint(db, org.organizationId, `http://receiver.webhooks.test:${receiver.port}/hook`);
    const running = await startDispatcher(db, { env: { WEBHOOK_ALLOW_PRIVATE: '1', DNS_SERVERS: dns.address, WEBHOOK_RETRY_DELAYS: '3600' }, listen: t.handle.listen });
    try {
      const event = (await emit(db, org.organizationId))!;
      const delivery = await deliveryOf(db, event.id, endpoint.id);
      await attemptsLogged(watch, db, delivery.id, 1);
      // Nothing left in flight that could still connect to the trap.
      await settleAndStop(running);
      expect(await attemptsOf(db, delivery.id)).toHaveLength(1);
      expect((await attemptsOf(db, delivery.id))[0]).toMatchObject({ status: 302, error: `redirect (302 to http://127.0.0.1:${trap.port}/internal) not followed` });
      expect(receiver.received).toHaveLength(1);
      expect(trap.connections()).toBe(0);
    } finally {
      await running.stop();
      await receiver.stop();
    }
  });
});
