/**
 * The management API's webhook endpoints: where orgauth POSTs the organization's events, signed
 * (Standard Webhooks), and the log of what it sent. webhooks.read lists and reads endpoints and
 * deliveries; webhooks.write creates, changes, deletes, rotates secrets, pings and retries. The
 * rules are the domain's (src/webhooks/endpoints.ts), shared with the dashboard and the CLI: the
 * URL is checked against SSRF (src/webhooks/url.ts), and the secret leaves the server only in the
 * answer that made it (create, rotate-secret).
 */
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import type { Config } from '../config.js';
import type { DB } from '../db/connect.js';
import { WEBHOOK_EVENT_TYPES } from '../webhooks/catalogue.js';
import {
  createWebhookEndpoint,
  deleteWebhookEndpoint,
  getWebhookDelivery,
  getWebhookEndpoint,
  listWebhookDeliveries,
  listWebhookEndpoints,
  MAX_WEBHOOK_ENDPOINTS,
  pingWebhookEndpoint,
  retryWebhookDelivery,
  rotateWebhookSecret,
  updateWebhookEndpoint,
  type WebhookAttemptView,
  type WebhookDeliveryDetail,
  type WebhookDeliveryView,
  type WebhookEndpointView,
} from '../webhooks/endpoints.js';
import { actorOf, authOf, pathId } from './auth.js';
import { decodeCursor, decodeDescendingCursor, listPage, listQuery } from './pagination.js';
import { errorResponses, errorSchema, listOf, orgParams } from './schemas.js';

export const webhookEndpointSchema = z
  .object({
    id: z.number().int(),
    organization_id: z.number().int(),
    url: z.string(),
    description: z.string(),
    events: z.array(z.enum(WEBHOOK_EVENT_TYPES)).describe('the event types sent to it'),
    enabled: z.boolean().describe('a disabled endpoint is sent nothing, and its pending deliveries fail'),
    disabled_reason: z.string().nullable().describe('failing: orgauth disabled it after five days of failed deliveries; enabling it again clears this'),
    failing_since: z.iso.datetime().nullable().describe('since when every delivery attempt has failed; null while they succeed'),
    previous_secret_expires_at: z.iso.datetime().nullable().describe('after a rotation, until when the previous secret still signs beside the new one'),
    created_at: z.iso.datetime(),
    updated_at: z.iso.datetime(),
  })
  .meta({ id: 'WebhookEndpoint' });

/** An endpoint as it leaves the server: never its secret. */
export function webhookEndpointOut(e: WebhookEndpointView): z.infer<typeof webhookEndpointSchema> {
  return {
    ...e,
    failing_since: e.failing_since?.toISOString() ?? null,
    previous_secret_expires_at: e.previous_secret_expires_at?.toISOString() ?? null,
    created_at: e.created_at.toISOString(),
    updated_at: e.updated_at.toISOString(),
  };
}

const withSecretSchema = webhookEndpointSchema
  .extend({ secret: z.string().describe('whsec_…: the signing secret, shown in this response only (orgauth never returns it again)') })
  .meta({ id: 'WebhookEndpointWithSecret' });

export const webhookDeliverySchema = z
  .object({
    id: z.number().int(),
    endpoint_id: z.number().int(),
    event_id: z.number().int(),
    event_type: z.string().describe('a type of the catalogue, or webhook.ping'),
    message_id: z.string().describe('the webhook-id header, the same on every attempt: receivers deduplicate on it'),
    state: z.enum(['pending', 'succeeded', 'failed']),
    attempts: z.number().int(),
    last_status: z.number().int().nullable().describe('the HTTP status of the last attempt; null when it got no answer'),
    last_error: z.string().nullable(),
    next_attempt_at: z.iso.datetime().nullable().describe('pending only: when the next attempt is due'),
    created_at: z.iso.datetime(),
    finished_at: z.iso.datetime().nullable(),
  })
  .meta({ id: 'WebhookDelivery' });

const attemptSchema = z
  .object({
    attempt: z.number().int(),
    started_at: z.iso.datetime(),
    duration_ms: z.number().int(),
    status: z.number().int().nullable(),
    response_body: z.string().nullable().describe('the first 1 KB of the answer'),
    error: z.string().nullable().describe('why no answer counted: a refusal, a timeout, a connection error, a redirect'),
  })
  .meta({ id: 'WebhookAttempt' });

const deliveryDetailSchema = webhookDeliverySchema
  .extend({
    payload: z.record(z.string(), z.unknown()).describe('the JSON body sent (and signed): type, timestamp, data'),
    attempts_log: z.array(attemptSchema).describe('every attempt so far, oldest first'),
  })
  .meta({ id: 'WebhookDeliveryDetail' });

const date = (d: Date | null) => d?.toISOString() ?? null;

export function webhookDeliveryOut(d: WebhookDeliveryView): z.infer<typeof webhookDeliverySchema> {
  return { ...d, next_attempt_at: date(d.next_attempt_at), created_at: d.created_at.toISOString(), finished_at: date(d.finished_at) };
}

function attemptOut(a: WebhookAttemptView): z.infer<typeof attemptSchema> {
  return { ...a, started_at: a.started_at.toISOString() };
}

export function webhookDeliveryDetailOut(d: WebhookDeliveryDetail): z.infer<typeof deliveryDetailSchema> {
  return { ...webhookDeliveryOut(d), payload: d.payload, attempts_log: d.attempts_log.map(attemptOut) };
}

// Types only: the domain checks the values and names the field in `details`.
const eventsField = z.array(z.string()).max(100).describe(`the event types to send: ${WEBHOOK_EVENT_TYPES.join(', ')}`);
const urlField = z.string().max(4000).describe('https, on a public address (WEBHOOK_ALLOW_PRIVATE=1 also allows http and private addresses, for development)');
const endpointParams = orgParams.extend({ id: z.string() });
const deliveryParams = endpointParams.extend({ delivery_id: z.string() });
const conflict = { 409: errorSchema.describe('refused: the endpoint is disabled, or the delivery already succeeded') };

export const webhookRoutes: FastifyPluginAsyncZod<{ db: DB; config: Config }> = async (app, { db, config }) => {
  app.get(
    '/webhooks',
    {
      config: { scope: 'webhooks.read' },
      schema: {
        tags: ['webhooks'],
        summary: `List the webhook endpoints, in id order (at most ${MAX_WEBHOOK_ENDPOINTS})`,
        params: orgParams,
        querystring: z.object(listQuery),
        response: { 200: listOf(webhookEndpointSchema), ...errorResponses },
      },
    },
    async (req) =>
      listPage(req.query.limit, (limit) => listWebhookEndpoints(db, authOf(req).organizationId, { afterId: decodeCursor(req.query.cursor), limit }), (e) => e.id, webhookEndpointOut),
  );

  app.get(
    '/webhooks/:id',
    {
      config: { scope: 'webhooks.read' },
      schema: { tags: ['webhooks'], summary: 'Get a webhook endpoint', params: endpointParams, response: { 200: webhookEndpointSchema, ...errorResponses } },
    },
    async (req) => webhookEndpointOut(await getWebhookEndpoint(db, authOf(req).organizationId, pathId(req.params.id))),
  );

  app.post(
    '/webhooks',
    {
      config: { scope: 'webhooks.write' },
      schema: {
        tags: ['webhooks'],
        summary: 'Add a webhook endpoint; the response holds its signing secret, shown this once',
        description: `At most ${MAX_WEBHOOK_ENDPOINTS} per organization. The URL must be https on a public address, without credentials.`,
        params: orgParams,
        body: z.strictObject({
          url: urlField,
          events: eventsField,
          description: z.string().max(1000).optional().describe('up to 500 characters, for people'),
          enabled: z.boolean().optional().describe('default true'),
        }),
        response: { 201: withSecretSchema, ...errorResponses },
      },
    },
    async (req, reply) => {
      const auth = authOf(req);
      const { endpoint, secret } = await createWebhookEndpoint(db, config.secretKey, auth.organizationId, req.body, { actor: actorOf(auth), config });
      reply.code(201).header('location', `/api/v1/${auth.organizationId}/webhooks/${endpoint.id}`);
      return { ...webhookEndpointOut(endpoint), secret };
    },
  );

  app.patch(
    '/webhooks/:id',
    {
      config: { scope: 'webhooks.write' },
      schema: {
        tags: ['webhooks'],
        summary: 'Change a webhook endpoint: url, events, description, enabled; what is not given stays',
        description: 'Enabling an endpoint orgauth disabled (disabled_reason failing) clears the reason and the failing run.',
        params: endpointParams,
        body: z
          .strictObject({ url: urlField.optional(), events: eventsField.optional(), description: z.string().max(1000).optional(), enabled: z.boolean().optional() })
          .refine((v) => Object.keys(v).length > 0, 'send at least one field'),
        response: { 200: webhookEndpointSchema, ...errorResponses },
      },
    },
    async (req) => {
      const auth = authOf(req);
      return webhookEndpointOut(await updateWebhookEndpoint(db, auth.organizationId, pathId(req.params.id), req.body, { actor: actorOf(auth), config }));
    },
  );

  app.delete(
    '/webhooks/:id',
    {
      config: { scope: 'webhooks.write' },
      schema: {
        tags: ['webhooks'],
        summary: 'Delete a webhook endpoint: nothing more is sent to it, and its delivery log goes',
        params: endpointParams,
        response: { 204: z.null().describe('deleted'), ...errorResponses },
      },
    },
    async (req, reply) => {
      const auth = authOf(req);
      await deleteWebhookEndpoint(db, auth.organizationId, pathId(req.params.id), { actor: actorOf(auth) });
      return reply.code(204).send(null);
    },
  );

  app.post(
    '/webhooks/:id/rotate-secret',
    {
      config: { scope: 'webhooks.write' },
      schema: {
        tags: ['webhooks'],
        summary: 'Rotate the signing secret: the new one is in the response; the previous one keeps signing beside it for 24 hours',
        params: endpointParams,
        response: { 200: withSecretSchema, ...errorResponses },
      },
    },
    async (req) => {
      const auth = authOf(req);
      const { endpoint, secret } = await rotateWebhookSecret(db, config.secretKey, auth.organizationId, pathId(req.params.id), { actor: actorOf(auth) });
      return { ...webhookEndpointOut(endpoint), secret };
    },
  );

  app.post(
    '/webhooks/:id/ping',
    {
      config: { scope: 'webhooks.write' },
      schema: {
        tags: ['webhooks'],
        summary: 'Send the endpoint a webhook.ping event now (whatever it subscribes to); the delivery’s state tells how it went',
        params: endpointParams,
        response: { 202: webhookDeliverySchema, ...errorResponses, ...conflict },
      },
    },
    async (req, reply) => {
      const auth = authOf(req);
      const delivery = await pingWebhookEndpoint(db, auth.organizationId, pathId(req.params.id), { actor: actorOf(auth) });
      reply.code(202).header('location', `/api/v1/${auth.organizationId}/webhooks/${delivery.endpoint_id}/deliveries/${delivery.id}`);
      return webhookDeliveryOut(delivery);
    },
  );

  app.get(
    '/webhooks/:id/deliveries',
    {
      config: { scope: 'webhooks.read' },
      schema: {
        tags: ['webhooks'],
        summary: 'List an endpoint’s deliveries, newest first (kept 30 days)',
        params: endpointParams,
        querystring: z.object(listQuery),
        response: { 200: listOf(webhookDeliverySchema), ...errorResponses },
      },
    },
    async (req) => {
      const auth = authOf(req);
      const endpointId = pathId(req.params.id);
      return listPage(
        req.query.limit,
        (limit) => listWebhookDeliveries(db, auth.organizationId, endpointId, { beforeId: decodeDescendingCursor(req.query.cursor), limit }),
        (d) => d.id,
        webhookDeliveryOut,
      );
    },
  );

  app.get(
    '/webhooks/:id/deliveries/:delivery_id',
    {
      config: { scope: 'webhooks.read' },
      schema: {
        tags: ['webhooks'],
        summary: 'Get a delivery: its payload and every attempt (status, the first 1 KB of the answer, or the error)',
        params: deliveryParams,
        response: { 200: deliveryDetailSchema, ...errorResponses },
      },
    },
    async (req) => webhookDeliveryDetailOut(await getWebhookDelivery(db, authOf(req).organizationId, pathId(req.params.id), pathId(req.params.delivery_id))),
  );

  app.post(
    '/webhooks/:id/deliveries/:delivery_id/retry',
    {
      config: { scope: 'webhooks.write' },
      schema: {
        tags: ['webhooks'],
        summary: 'Send a failed or pending delivery again now, with the same webhook-id',
        params: deliveryParams,
        response: { 202: webhookDeliverySchema, ...errorResponses, ...conflict },
      },
    },
    async (req, reply) => {
      const auth = authOf(req);
      const delivery = await retryWebhookDelivery(db, auth.organizationId, pathId(req.params.id), pathId(req.params.delivery_id), { actor: actorOf(auth) });
      return reply.code(202).send(webhookDeliveryOut(delivery));
    },
  );
};
