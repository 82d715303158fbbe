/**
 * `orgauth webhook ...`: an organization's webhook endpoints (src/webhooks/endpoints.ts) and
 * their delivery log. The rules are the API's: the URL is checked against SSRF (https, public
 * addresses, unless WEBHOOK_ALLOW_PRIVATE=1), and the signing secret is printed only by `create`
 * and `rotate-secret`. The operator acts (no actor in the audit log), as with every command.
 * With --json each prints what the API answers for the same operation.
 */
import { getOrganization } from '../accounts/organizations.js';
import { decodeCursor, decodeDescendingCursor } from '../api/pagination.js';
import { webhookDeliveryDetailOut, webhookDeliveryOut, webhookEndpointOut } from '../api/webhooks.js';
import type { DB } from '../db/connect.js';
import { parseCanonicalId } from '../oauth/helpers/params.js';
import {
  createWebhookEndpoint,
  deleteWebhookEndpoint,
  getWebhookDelivery,
  getWebhookEndpoint,
  listWebhookDeliveries,
  listWebhookEndpoints,
  pingWebhookEndpoint,
  retryWebhookDelivery,
  rotateWebhookSecret,
  updateWebhookEndpoint,
  type WebhookDeliveryDetail,
  type WebhookEndpointView,
} from '../webhooks/endpoints.js';
import { listed, optionalString, orgId, PAGE_OPTIONS, PAGE_USAGE, required, type Command, UsageError, type Values, yesNo } from './shared.js';

async function organizationOf(db: DB, values: Values): Promise<number> {
  return (await getOrganization(db, orgId(values))).id;
}

function idOption(values: Values, name: 'id' | 'delivery'): number {
  const id = parseCanonicalId(required(values, name));
  if (id === undefined) throw new UsageError(`--${name} must be a positive integer`);
  return id;
}

/** --events "member.added member.removed" (spaces or commas between types); the domain checks each type. */
function eventsOf(values: Values): string[] | undefined {
  const text = optionalString(values, 'events');
  return text === undefined ? undefined : text.split(/[\s,]+/).filter((e) => e !== '');
}

function input(values: Values) {
  const url = optionalString(values, 'url');
  const events = eventsOf(values);
  const description = optionalString(values, 'description');
  const enabled = yesNo(values, 'enabled');
  return {
    ...(url !== undefined ? { url } : {}),
    ...(events !== undefined ? { events } : {}),
    ...(description !== undefined ? { description } : {}),
    ...(enabled !== undefined ? { enabled } : {}),
  };
}

function stateOf(e: WebhookEndpointView): string {
  if (e.enabled) return e.failing_since ? `enabled, failing since ${e.failing_since.toISOString()}` : 'enabled';
  return e.disabled_reason ? `disabled (${e.disabled_reason})` : 'disabled';
}

function describe(e: WebhookEndpointView): string {
  return [
    `id:          ${e.id}`,
    `url:         ${e.url}`,
    `events:      ${e.events.join(' ')}`,
    `state:       ${stateOf(e)}`,
    ...(e.description ? [`description: ${e.description}`] : []),
    ...(e.previous_secret_expires_at ? [`previous secret signs until ${e.previous_secret_expires_at.toISOString()}`] : []),
  ].join('\n');
}

function withSecret(e: WebhookEndpointView, secret: string, what: string): { json: object; text: string } {
  return {
    json: { ...webhookEndpointOut(e), secret },
    text: [what, `id:          ${e.id}`, `secret:      ${secret}`, '(the secret is shown only now: keep it with the receiver, which verifies signatures with it)'].join('\n'),
  };
}

function describeDelivery(d: WebhookDeliveryDetail): string {
  const lines = [
    `id:          ${d.id}`,
    `event:       ${d.event_type} (${d.message_id})`,
    `state:       ${d.state}${d.next_attempt_at ? `, next attempt at ${d.next_attempt_at.toISOString()}` : ''}`,
    `attempts:    ${d.attempts}`,
    `payload:     ${JSON.stringify(d.payload)}`,
  ];
  for (const a of d.attempts_log) {
    const outcome = a.status !== null ? `HTTP ${a.status}` : (a.error ?? 'no answer');
    lines.push(`attempt ${a.attempt}: ${a.started_at.toISOString()} ${outcome} in ${a.duration_ms} ms${a.status !== null && a.error ? ` (${a.error})` : ''}`);
    if (a.response_body) lines.push(`  answer: ${a.response_body.replace(/\s+/g, ' ').slice(0, 200)}`);
  }
  return lines.join('\n');
}

const ORG_ID = { org: { type: 'string' }, id: { type: 'string' } } as const;
const FIELDS = { url: { type: 'string' }, events: { type: 'string' }, description: { type: 'string' }, enabled: { type: 'string' } } as const;

export const webhookCommands: Record<string, Command> = {
  'webhook create': {
    usage: 'orgauth webhook create --org ID --url URL --events "member.added member.removed ..." [--description D] [--enabled yes|no]',
    summary: 'add a webhook endpoint to an organization; prints its id and signing secret (whsec_…, shown this once)',
    options: { org: { type: 'string' }, ...FIELDS },
    run: async ({ db, config }, v) => {
      required(v, 'url');
      required(v, 'events');
      const organizationId = await organizationOf(db, v);
      const { endpoint, secret } = await createWebhookEndpoint(db, config.secretKey, organizationId, input(v), { config });
      return withSecret(endpoint, secret, `created webhook endpoint ${endpoint.id} in organization ${organizationId} (${stateOf(endpoint)})`);
    },
  },

  'webhook list': {
    usage: `orgauth webhook list --org ID ${PAGE_USAGE}`,
    summary: "list an organization's webhook endpoints (never their secrets)",
    options: { org: { type: 'string' }, ...PAGE_OPTIONS },
    run: async ({ db }, v) => {
      const organizationId = await organizationOf(db, v);
      return listed(
        v,
        (limit) => listWebhookEndpoints(db, organizationId, { afterId: decodeCursor(optionalString(v, 'cursor')), limit }),
        (e) => e.id,
        webhookEndpointOut,
        [
          ['ID', (e) => String(e.id)],
          ['STATE', (e) => (e.enabled ? (e.failing_since ? 'failing' : 'enabled') : e.disabled_reason ? `disabled (${e.disabled_reason})` : 'disabled')],
          ['URL', (e) => e.url],
          ['EVENTS', (e) => e.events.join(' ')],
        ],
      );
    },
  },

  'webhook show': {
    usage: 'orgauth webhook show --org ID --id E',
    summary: 'show a webhook endpoint (never its secret)',
    options: { ...ORG_ID },
    run: async ({ db }, v) => {
      const e = await getWebhookEndpoint(db, await organizationOf(db, v), idOption(v, 'id'));
      return { json: webhookEndpointOut(e), text: describe(e) };
    },
  },

  'webhook update': {
    usage: 'orgauth webhook update --org ID --id E [--url URL] [--events "..."] [--description D] [--enabled yes|no]',
    summary: 'change a webhook endpoint; what is not given stays. --enabled yes after orgauth disabled it (failing) starts afresh',
    options: { ...ORG_ID, ...FIELDS },
    run: async ({ db, config }, v) => {
      const changes = input(v);
      if (Object.keys(changes).length === 0) throw new UsageError('give at least one of --url, --events, --description, --enabled');
      const e = await updateWebhookEndpoint(db, await organizationOf(db, v), idOption(v, 'id'), changes, { config });
      return { json: webhookEndpointOut(e), text: `updated webhook endpoint ${e.id}\n${describe(e)}` };
    },
  },

  'webhook delete': {
    usage: 'orgauth webhook delete --org ID --id E',
    summary: 'delete a webhook endpoint: nothing more is sent to it, and its delivery log goes',
    options: { ...ORG_ID },
    run: async ({ db }, v) => {
      const organizationId = await organizationOf(db, v);
      const id = idOption(v, 'id');
      await deleteWebhookEndpoint(db, organizationId, id);
      return { json: { id, organization_id: organizationId, deleted: true }, text: `deleted webhook endpoint ${id}` };
    },
  },

  'webhook rotate-secret': {
    usage: 'orgauth webhook rotate-secret --org ID --id E',
    summary: 'give a webhook endpoint a new signing secret (printed this once); the previous one keeps signing beside it for 24 hours',
    options: { ...ORG_ID },
    run: async ({ db, config }, v) => {
      const { endpoint, secret } = await rotateWebhookSecret(db, config.secretKey, await organizationOf(db, v), idOption(v, 'id'));
      return withSecret(endpoint, secret, `rotated the secret of webhook endpoint ${endpoint.id}; the previous one signs too until ${endpoint.previous_secret_expires_at?.toISOString() ?? ''}`);
    },
  },

  'webhook ping': {
    usage: 'orgauth webhook ping --org ID --id E',
    summary: 'send a webhook.ping event to an endpoint now; `webhook delivery` shows how it went',
    options: { ...ORG_ID },
    run: async ({ db }, v) => {
      const d = await pingWebhookEndpoint(db, await organizationOf(db, v), idOption(v, 'id'));
      return { json: webhookDeliveryOut(d), text: `queued ping delivery ${d.id} (${d.message_id}) to webhook endpoint ${d.endpoint_id}` };
    },
  },

  'webhook deliveries': {
    usage: `orgauth webhook deliveries --org ID --id E ${PAGE_USAGE}`,
    summary: "list a webhook endpoint's deliveries, newest first (kept 30 days)",
    options: { ...ORG_ID, ...PAGE_OPTIONS },
    run: async ({ db }, v) => {
      const organizationId = await organizationOf(db, v);
      const id = idOption(v, 'id');
      return listed(
        v,
        (limit) => listWebhookDeliveries(db, organizationId, id, { beforeId: decodeDescendingCursor(optionalString(v, 'cursor')), limit }),
        (d) => d.id,
        webhookDeliveryOut,
        [
          ['ID', (d) => String(d.id)],
          ['EVENT', (d) => d.event_type],
          ['STATE', (d) => d.state],
          ['ATTEMPTS', (d) => String(d.attempts)],
          ['STATUS', (d) => (d.last_status === null ? '-' : String(d.last_status))],
          ['CREATED', (d) => d.created_at],
        ],
      );
    },
  },

  'webhook delivery': {
    usage: 'orgauth webhook delivery --org ID --id E --delivery D',
    summary: 'show a delivery: its payload and every attempt (status, the start of the answer, or the error)',
    options: { ...ORG_ID, delivery: { type: 'string' } },
    run: async ({ db }, v) => {
      const d = await getWebhookDelivery(db, await organizationOf(db, v), idOption(v, 'id'), idOption(v, 'delivery'));
      return { json: webhookDeliveryDetailOut(d), text: describeDelivery(d) };
    },
  },

  'webhook retry': {
    usage: 'orgauth webhook retry --org ID --id E --delivery D',
    summary: 'send a failed or pending delivery again now, with the same webhook-id',
    options: { ...ORG_ID, delivery: { type: 'string' } },
    run: async ({ db }, v) => {
      const d = await retryWebhookDelivery(db, await organizationOf(db, v), idOption(v, 'id'), idOption(v, 'delivery'));
      return { json: webhookDeliveryOut(d), text: `delivery ${d.id} (${d.message_id}) is pending again` };
    },
  },
};
