/**
 * The delivery tests' world: organizations with an owner, endpoints inserted as rows (their
 * secrets sealed as the model seals them, so the tests do not depend on how endpoints are
 * created), events made the way the application makes them (an audited change, which the trigger
 * of migration 0017 turns into deliveries), and a dispatcher built as the app builds it.
 */
import type { Writable } from 'node:stream';
import { createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { recordAuditEvent } from '../../src/audit/events.js';
import type { DB, Listen } from '../../src/db/connect.js';
import type { ResolveHostname } from '../../src/lib/outbound.js';
import { createLogger } from '../../src/logger.js';
import { Metrics } from '../../src/metrics.js';
import { WebhookDispatcher } from '../../src/webhooks/dispatcher.js';
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

export const seconds = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
