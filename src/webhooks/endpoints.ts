/**
 * An organization's webhook endpoints, and what the API, the dashboard and the CLI show and do
 * with their deliveries. One set of rules for the three: the URL passes checkWebhookUrl (url.ts)
 * when it is set, the events are the catalogue's (catalogue.ts), the secret is sealed at rest
 * and leaves the server only in the answer that made it (create, rotate), and every change is
 * audited in its own transaction.
 *
 * Events for the catalogue's types are never written here: the audit trigger of migration 0017
 * turns each audited change into an event for the endpoints that subscribe to it. Only a ping is
 * made by hand, since it is no change of the organization. The dispatcher (dispatcher.ts) sends
 * what is pending; a NOTIFY on `orgauth_webhooks` wakes it, and its own polling finds the rest.
 */
import { sql } from 'kysely';
import { z } from 'zod';
import { type Actor, recordAuditEvent } from '../audit/events.js';
import type { Config } from '../config.js';
import { type DB, inTransaction } from '../db/connect.js';
import type { WebhookDeliveryState } from '../db/schema.js';
import { ConflictError, InvalidRequestError, NotFoundError } from '../errors.js';
import type { ResolveHostname } from '../lib/outbound.js';
import { isWellFormed, parseInput } from '../lib/validate.js';
import { isWebhookEventType, PING_EVENT_TYPE, WEBHOOK_CHANNEL, WEBHOOK_EVENT_TYPES, type WebhookEventType } from './catalogue.js';
import { newWebhookSecret, PREVIOUS_SECRET_SECONDS, sealWebhookSecret } from './secrets.js';
import { checkWebhookUrl, urlWithoutQuery } from './url.js';

/** Endpoints per organization: a few receivers, and one more while one replaces another. */
export const MAX_WEBHOOK_ENDPOINTS = 20;

/** An endpoint as it leaves the server: never its secret, current or previous. */
export interface WebhookEndpointView {
  id: number;
  organization_id: number;
  url: string;
  description: string;
  events: WebhookEventType[];
  enabled: boolean;
  /** Why it was disabled by orgauth ('failing': five days of failed deliveries); null when enabled or disabled by someone. */
  disabled_reason: string | null;
  /** Since when every attempt has failed; null while deliveries succeed. */
  failing_since: Date | null;
  /** Until when the secret before the last rotation still signs beside the current one; null when there is none. */
  previous_secret_expires_at: Date | null;
  created_at: Date;
  updated_at: Date;
}

export interface WebhookDeliveryView {
  id: number;
  endpoint_id: number;
  event_id: number;
  event_type: string;
  /** The `webhook-id` header: the same on every attempt, what a receiver deduplicates on. */
  message_id: string;
  state: WebhookDeliveryState;
  attempts: number;
  last_status: number | null;
  last_error: string | null;
  /** When the next attempt is due (pending deliveries). */
  next_attempt_at: Date | null;
  created_at: Date;
  finished_at: Date | null;
}

export interface WebhookAttemptView {
  attempt: number;
  started_at: Date;
  duration_ms: number;
  status: number | null;
  /** The first 1 KB of the receiver's answer. */
  response_body: string | null;
  error: string | null;
}

export interface WebhookDeliveryDetail extends WebhookDeliveryView {
  /** The JSON body that is sent (and signed). */
  payload: Record<string, unknown>;
  attempts_log: WebhookAttemptView[];
}

/** What a change needs besides its input: who acts (audit), the rules' configuration, and in tests a resolver. */
export interface WebhookChangeOptions {
  actor?: Actor | undefined;
  config: Pick<Config, 'webhooks' | 'dnsServers'>;
  lookup?: ResolveHostname | undefined;
}

const description = z
  .string()
  .trim()
  .max(500, 'must be at most 500 characters')
  .refine((d) => isWellFormed(d) && !/[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]/.test(d), 'must be text without control characters');

/** The catalogue's types, each at most once, in the catalogue's order (one spelling per set, so comparisons and the audit log stay simple). */
const events = z
  .array(z.string().max(100))
  .min(1, 'must list at least one event type')
  .max(WEBHOOK_EVENT_TYPES.length, `must list at most ${WEBHOOK_EVENT_TYPES.length} event types`)
  .superRefine((list, ctx) => {
    list.forEach((type, i) => {
      if (!isWebhookEventType(type)) ctx.addIssue({ code: 'custom', path: [i], message: `is not an event type (${WEBHOOK_EVENT_TYPES.join(', ')})` });
    });
  })
  .transform((list) => WEBHOOK_EVENT_TYPES.filter((t) => list.includes(t)));

// The URL is a string here; its rules need DNS, so checkWebhookUrl applies them after the shape.
const createSchema = z.strictObject({ url: z.string(), events, description: description.optional(), enabled: z.boolean().optional() });
const updateSchema = z.strictObject({ url: z.string().optional(), events: events.optional(), description: description.optional(), enabled: z.boolean().optional() });

export type WebhookEndpointInput = z.input<typeof createSchema>;
export type WebhookEndpointChanges = z.input<typeof updateSchema>;

const ENDPOINT_COLUMNS = [
  'id',
  'organization_id',
  'url',
  'description',
  'events',
  'enabled',
  'disabled_reason',
  'failing_since',
  'previous_secret_expires_at',
  'created_at',
  'updated_at',
] as const;

function endpointView(row: Omit<WebhookEndpointView, 'events' | 'previous_secret_expires_at'> & { events: string[]; previous_secret_expires_at: Date | null }): WebhookEndpointView {
  // A previous secret past its time signs nothing: not worth showing.
  const previous = row.previous_secret_expires_at !== null && row.previous_secret_expires_at.getTime() > Date.now() ? row.previous_secret_expires_at : null;
  return { ...row, events: row.events.filter(isWebhookEventType), previous_secret_expires_at: previous };
}

/** Ids are bigints; anything beyond what a row can have is simply not found. */
function validId(id: number): boolean {
  return Number.isSafeInteger(id) && id > 0;
}

/**
 * How a transaction holds the endpoint's row. The lock order of everything that writes an
 * endpoint's deliveries is: the endpoint's row first, then its deliveries (then their attempts).
 * A delete takes the row for 'update' before its cascade reaches the deliveries; the dispatcher
 * key-shares it before it records an attempt (dispatcher.ts), a ping and a retry before they
 * write a delivery. Whichever comes second waits for the first to commit, and nobody holds a
 * delivery while waiting for the endpoint, so a delete during a delivery queues instead of
 * deadlocking (40P01, which would answer 503).
 * - 'no key update': an edit. The outbox trigger (migration 0017) and the dispatcher key-share
 *   the rows they queue or record for, and an edit must not hold up either meanwhile.
 * - 'update': a delete, which conflicts with those key-share locks: it waits for a recording in
 *   progress, and a recording or a queued event that comes later waits for it, then finds the row
 *   gone.
 * - 'key share': a write of the endpoint's deliveries that leaves the row alone.
 */
type EndpointLock = 'no key update' | 'update' | 'key share';

async function endpointRow(db: DB, organizationId: number, id: number, lock?: EndpointLock) {
  const row = validId(id)
    ? await db
        .selectFrom('webhook_endpoints')
        .select(ENDPOINT_COLUMNS)
        .where('organization_id', '=', organizationId)
        .where('id', '=', id)
        .$if(lock === 'no key update', (qb) => qb.forNoKeyUpdate())
        .$if(lock === 'update', (qb) => qb.forUpdate())
        .$if(lock === 'key share', (qb) => qb.forKeyShare())
        .executeTakeFirst()
    : undefined;
  if (!row) throw new NotFoundError('no such webhook endpoint in this organization');
  return row;
}

/** The organization's endpoints in id order, a page at a time (keyset on (organization_id, id)). */
export async function listWebhookEndpoints(db: DB, organizationId: number, page: { afterId: number; limit: number }): Promise<WebhookEndpointView[]> {
  const rows = await db
    .selectFrom('webhook_endpoints')
    .select(ENDPOINT_COLUMNS)
    .where('organization_id', '=', organizationId)
    .where('id', '>', page.afterId)
    .orderBy('id')
    .limit(page.limit)
    .execute();
  return rows.map(endpointView);
}

/** An endpoint of the organization, or NotFoundError (another organization's is not found either). */
export async function getWebhookEndpoint(db: DB, organizationId: number, id: number): Promise<WebhookEndpointView> {
  return endpointView(await endpointRow(db, organizationId, id));
}

/** Creates an endpoint with a new secret; the secret is returned this once. */
export async function createWebhookEndpoint(
  db: DB,
  secretKey: string,
  organizationId: number,
  input: unknown,
  options: WebhookChangeOptions,
): Promise<{ endpoint: WebhookEndpointView; secret: string }> {
  const parsed = parseInput(createSchema, input);
  const url = (await checkWebhookUrl(parsed.url, options.config, { ...(options.lookup ? { lookup: options.lookup } : {}) })).href;
  const secret = newWebhookSecret();
  const endpoint = await inTransaction(db, async (trx) => {
    // The organization's row, locked: two creations at once cannot both pass the count.
    const organization = await trx.selectFrom('organizations').select('id').where('id', '=', organizationId).forNoKeyUpdate().executeTakeFirst();
    if (!organization) throw new NotFoundError('organization not found');
    const { count } = await trx.selectFrom('webhook_endpoints').select((eb) => eb.fn.countAll<number>().as('count')).where('organization_id', '=', organizationId).executeTakeFirstOrThrow();
    if (Number(count) >= MAX_WEBHOOK_ENDPOINTS) throw new InvalidRequestError(`an organization may have at most ${MAX_WEBHOOK_ENDPOINTS} webhook endpoints`);
    const enabled = parsed.enabled ?? true;
    const row = await trx
      .insertInto('webhook_endpoints')
      .values({ organization_id: organizationId, url, description: parsed.description ?? '', events: parsed.events, enabled, secret_sealed: sealWebhookSecret(secretKey, secret) })
      .returning(ENDPOINT_COLUMNS)
      .executeTakeFirstOrThrow();
    await recordAuditEvent(trx, {
      actor: options.actor,
      organizationId,
      action: 'webhook.created',
      details: { endpoint_id: row.id, url: urlWithoutQuery(url), events: parsed.events, enabled },
    });
    return endpointView(row);
  });
  return { endpoint, secret };
}

/**
 * Changes an endpoint; what is not given stays. Enabling it again clears why orgauth disabled it
 * and the failing run, so the five days start afresh. Deliveries still pending go to the new URL
 * at their next attempt (the dispatcher reads the endpoint each time).
 */
export async function updateWebhookEndpoint(db: DB, organizationId: number, id: number, input: unknown, options: WebhookChangeOptions): Promise<WebhookEndpointView> {
  const parsed = parseInput(updateSchema, input);
  const url = parsed.url === undefined ? undefined : (await checkWebhookUrl(parsed.url, options.config, { ...(options.lookup ? { lookup: options.lookup } : {}) })).href;
  return inTransaction(db, async (trx) => {
    const current = await endpointRow(trx, organizationId, id, 'no key update');
    const changes: { url?: string; events?: string[]; description?: string; enabled?: boolean; disabled_reason?: null; failing_since?: null } = {};
    const changed: string[] = [];
    if (url !== undefined && url !== current.url) {
      changes.url = url;
      changed.push('url');
    }
    if (parsed.events !== undefined && parsed.events.join() !== current.events.join()) {
      changes.events = parsed.events;
      changed.push('events');
    }
    if (parsed.description !== undefined && parsed.description !== current.description) {
      changes.description = parsed.description;
      changed.push('description');
    }
    if (parsed.enabled !== undefined && parsed.enabled !== current.enabled) {
      changes.enabled = parsed.enabled;
      changed.push('enabled');
      if (parsed.enabled) {
        changes.disabled_reason = null;
        changes.failing_since = null;
      }
    }
    if (changed.length === 0) return endpointView(current);
    const row = await trx
      .updateTable('webhook_endpoints')
      .set({ ...changes, updated_at: sql<Date>`now()` })
      .where('id', '=', current.id)
      .returning(ENDPOINT_COLUMNS)
      .executeTakeFirstOrThrow();
    await recordAuditEvent(trx, {
      actor: options.actor,
      organizationId,
      action: 'webhook.updated',
      details: {
        endpoint_id: current.id,
        changed,
        ...(changes.url !== undefined ? { url: urlWithoutQuery(changes.url) } : {}),
        ...(changes.events !== undefined ? { events: changes.events } : {}),
        ...(changes.enabled !== undefined ? { enabled: changes.enabled } : {}),
      },
    });
    return endpointView(row);
  });
}

/**
 * Deletes an endpoint; its deliveries and their attempts go with it (foreign keys cascade), so
 * nothing more is sent to it. A delivery in flight meanwhile simply ends: if the dispatcher is
 * recording its attempt, the delete waits for that (a few milliseconds) and takes the record
 * with it; otherwise the dispatcher finds the endpoint gone and writes nothing (EndpointLock).
 */
export async function deleteWebhookEndpoint(db: DB, organizationId: number, id: number, options: { actor?: Actor | undefined } = {}): Promise<void> {
  await inTransaction(db, async (trx) => {
    const current = await endpointRow(trx, organizationId, id, 'update');
    await trx.deleteFrom('webhook_endpoints').where('id', '=', current.id).execute();
    await recordAuditEvent(trx, { actor: options.actor, organizationId, action: 'webhook.deleted', details: { endpoint_id: current.id, url: urlWithoutQuery(current.url) } });
  });
}

/**
 * A new secret, returned this once. The one it replaces keeps signing beside it for
 * PREVIOUS_SECRET_SECONDS (both signatures in `webhook-signature`), so a receiver has a day to
 * switch without rejecting a delivery. A second rotation within that day drops the oldest.
 */
export async function rotateWebhookSecret(
  db: DB,
  secretKey: string,
  organizationId: number,
  id: number,
  options: { actor?: Actor | undefined } = {},
): Promise<{ endpoint: WebhookEndpointView; secret: string }> {
  const secret = newWebhookSecret();
  const endpoint = await inTransaction(db, async (trx) => {
    const current = await endpointRow(trx, organizationId, id, 'no key update');
    const row = await trx
      .updateTable('webhook_endpoints')
      .set({
        secret_sealed: sealWebhookSecret(secretKey, secret),
        previous_secret_sealed: sql<string>`secret_sealed`,
        previous_secret_expires_at: sql<Date>`now() + make_interval(secs => ${PREVIOUS_SECRET_SECONDS})`,
        updated_at: sql<Date>`now()`,
      })
      .where('id', '=', current.id)
      .returning(ENDPOINT_COLUMNS)
      .executeTakeFirstOrThrow();
    await recordAuditEvent(trx, { actor: options.actor, organizationId, action: 'webhook.secret_rotated', details: { endpoint_id: current.id } });
    return endpointView(row);
  });
  return { endpoint, secret };
}

function deliveriesQuery(db: DB) {
  return db
    .selectFrom('webhook_deliveries')
    .innerJoin('webhook_events', 'webhook_events.id', 'webhook_deliveries.event_id')
    .select([
      'webhook_deliveries.id',
      'webhook_deliveries.endpoint_id',
      'webhook_deliveries.event_id',
      'webhook_events.type as event_type',
      'webhook_events.message_id',
      'webhook_deliveries.state',
      'webhook_deliveries.attempts',
      'webhook_deliveries.last_status',
      'webhook_deliveries.last_error',
      'webhook_deliveries.next_attempt_at',
      'webhook_deliveries.created_at',
      'webhook_deliveries.finished_at',
    ]);
}

type DeliveryRow = Omit<WebhookDeliveryView, 'next_attempt_at'> & { next_attempt_at: Date };

function deliveryView(row: DeliveryRow): WebhookDeliveryView {
  return { ...row, next_attempt_at: row.state === 'pending' ? row.next_attempt_at : null };
}

/**
 * An endpoint's deliveries, newest first, a page at a time (keyset on (endpoint_id, id)):
 * `beforeId` is the id the page goes below, undefined for the first page. What is older than
 * the retention period (30 days) is gone.
 */
export async function listWebhookDeliveries(
  db: DB,
  organizationId: number,
  endpointId: number,
  page: { beforeId: number | undefined; limit: number },
): Promise<WebhookDeliveryView[]> {
  const endpoint = await endpointRow(db, organizationId, endpointId);
  const rows = await deliveriesQuery(db)
    .where('webhook_deliveries.endpoint_id', '=', endpoint.id)
    .$if(page.beforeId !== undefined, (qb) => qb.where('webhook_deliveries.id', '<', page.beforeId ?? 0))
    .orderBy('webhook_deliveries.id', 'desc')
    .limit(page.limit)
    .execute();
  return rows.map(deliveryView);
}

async function deliveryRow(db: DB, organizationId: number, endpointId: number, deliveryId: number, lock = false): Promise<DeliveryRow> {
  const endpoint = await endpointRow(db, organizationId, endpointId);
  const row = validId(deliveryId)
    ? await deliveriesQuery(db)
        .where('webhook_deliveries.endpoint_id', '=', endpoint.id)
        .where('webhook_deliveries.id', '=', deliveryId)
        .$if(lock, (qb) => qb.forUpdate(['webhook_deliveries']))
        .executeTakeFirst()
    : undefined;
  if (!row) throw new NotFoundError('no such delivery of this webhook endpoint');
  return row;
}

/** A delivery with the payload it sends and every attempt so far, oldest first. */
export async function getWebhookDelivery(db: DB, organizationId: number, endpointId: number, deliveryId: number): Promise<WebhookDeliveryDetail> {
  const row = await deliveryRow(db, organizationId, endpointId, deliveryId);
  const [event, attempts] = await Promise.all([
    db.selectFrom('webhook_events').select('payload').where('id', '=', row.event_id).executeTakeFirstOrThrow(),
    db
      .selectFrom('webhook_attempts')
      .select(['attempt', 'started_at', 'duration_ms', 'status', 'response_body', 'error'])
      .where('delivery_id', '=', row.id)
      .orderBy('attempt')
      .orderBy('id')
      .execute(),
  ]);
  return { ...deliveryView(row), payload: event.payload, attempts_log: attempts };
}

function refuseDisabled(endpoint: { enabled: boolean }, what: string): void {
  if (!endpoint.enabled) throw new ConflictError(`the webhook endpoint is disabled: enable it before you ${what}`);
}

/**
 * Sends a delivery again now: a failed one (after its last retry, or cut short) gets one more
 * attempt, and a pending one stops waiting for its retry. `attempts` is left as it is: it is the
 * dispatcher's lease token (see dispatcher.ts), and it keeps counting every attempt ever made.
 */
export async function retryWebhookDelivery(
  db: DB,
  organizationId: number,
  endpointId: number,
  deliveryId: number,
  options: { actor?: Actor | undefined } = {},
): Promise<WebhookDeliveryView> {
  return inTransaction(db, async (trx) => {
    const endpoint = await endpointRow(trx, organizationId, endpointId, 'key share');
    refuseDisabled(endpoint, 'retry its deliveries');
    const current = await deliveryRow(trx, organizationId, endpointId, deliveryId, true);
    if (current.state === 'succeeded') throw new ConflictError('the delivery succeeded: there is nothing to retry (send a ping to test the endpoint)');
    await trx
      .updateTable('webhook_deliveries')
      .set({ state: 'pending', next_attempt_at: sql<Date>`now()`, finished_at: null })
      .where('id', '=', current.id)
      .execute();
    await recordAuditEvent(trx, {
      actor: options.actor,
      organizationId,
      action: 'webhook.delivery_retried',
      details: { endpoint_id: endpoint.id, delivery_id: current.id, message_id: current.message_id, event_type: current.event_type },
    });
    await sql`select pg_notify(${WEBHOOK_CHANNEL}, '')`.execute(trx);
    return deliveryView(await deliveryRow(trx, organizationId, endpointId, deliveryId));
  });
}

/**
 * Sends the endpoint a `webhook.ping` event, whatever it subscribes to, to test the receiver and
 * its signature check. The event and its one delivery are written here (no other endpoint
 * receives it), the dispatcher woken, and the delivery returned: its state and attempts show
 * the outcome.
 */
export async function pingWebhookEndpoint(db: DB, organizationId: number, endpointId: number, options: { actor?: Actor | undefined } = {}): Promise<WebhookDeliveryView> {
  return inTransaction(db, async (trx) => {
    // Key-shared: a delete going on is waited for and then the endpoint is not found (404),
    // rather than the delivery's foreign key failing at its insert.
    const endpoint = await endpointRow(trx, organizationId, endpointId, 'key share');
    refuseDisabled(endpoint, 'ping it');
    const { now } = await sql<{ now: string }>`select to_char(now() at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') as now`.execute(trx).then((r) => r.rows[0]!);
    const payload = { type: PING_EVENT_TYPE, timestamp: now, data: { organization_id: organizationId, endpoint_id: endpoint.id } };
    const event = await trx
      .insertInto('webhook_events')
      .values({ organization_id: organizationId, type: PING_EVENT_TYPE, message_id: sql<string>`'msg_' || replace(gen_random_uuid()::text, '-', '')`, payload: JSON.stringify(payload) })
      .returning('id')
      .executeTakeFirstOrThrow();
    const delivery = await trx
      .insertInto('webhook_deliveries')
      .values({ event_id: event.id, endpoint_id: endpoint.id, organization_id: organizationId })
      .returning('id')
      .executeTakeFirstOrThrow();
    await recordAuditEvent(trx, { actor: options.actor, organizationId, action: 'webhook.pinged', details: { endpoint_id: endpoint.id, delivery_id: delivery.id } });
    await sql`select pg_notify(${WEBHOOK_CHANNEL}, '')`.execute(trx);
    return deliveryView(await deliveryRow(trx, organizationId, endpointId, delivery.id));
  });
}
