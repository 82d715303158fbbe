/**
 * The Webhooks page (/dashboard/webhooks): the organization's endpoints (src/webhooks/endpoints.ts),
 * their state, and their recent deliveries. webhooks.read shows it all; webhooks.write adds the
 * forms: add, edit, enable or disable, rotate the secret, ping, retry a delivery, delete. Ids
 * from URLs are always looked up within the current organization (another organization's is a
 * 404), and every change is audited with the acting member.
 *
 * A new or rotated secret is shown in the answer to the POST itself (no-store, never a redirect),
 * as the client secrets of applications are: it exists in plaintext nowhere else. Other changes
 * answer 303 back to the page, at the endpoint, which then says what they did (notice.ts); a
 * change the rules refuse is shown on the page, with what was typed, at the status of the refusal.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { type AppError, ConflictError, InvalidRequestError, NotFoundError } from '../../errors.js';
import type { Params } from '../../oauth/helpers/params.js';
import { WEBHOOK_EVENT_TYPES } from '../../webhooks/catalogue.js';
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
  type WebhookEndpointView,
} from '../../webhooks/endpoints.js';
import { renderPage } from '../render.js';
import type { DashboardDeps } from './applications.js';
import { type ActionContext, dashboardContext, type DashboardContext, parseId, readForm, requireAction, requireView } from './context.js';
import { redirectWithNotice } from './notice.js';

export const WEBHOOKS_PATH = '/dashboard/webhooks';
/** Deliveries shown per endpoint on the page, newest first; the API and the CLI page through all of them. */
const RECENT_DELIVERIES = 10;

const FIELD_LABELS: Record<string, string> = { url: 'URL', events: 'Events', description: 'Description', enabled: 'Enabled' };

/** Each problem under its field's label. */
function errorMessages(err: AppError): string[] {
  const details = err.details ?? [];
  if (details.length === 0) return [err.description];
  return details.map((d) => {
    const field = d.path.split('.')[0] ?? '';
    return field === '' ? d.message : `${FIELD_LABELS[field] ?? field}: ${d.message}`;
  });
}

/**
 * The form: the event checkboxes arrive as a repeated `events` field; every other field at most
 * once (readForm refuses a repeated one).
 */
function readWebhookForm(body: unknown): { params: Params; events: string[] } {
  if (body === null || typeof body !== 'object') return { params: readForm(body).params, events: [] };
  const { events, ...rest } = body as Record<string, unknown>;
  const list = events === undefined ? [] : Array.isArray(events) ? events : [events];
  if (!list.every((e): e is string => typeof e === 'string')) throw new InvalidRequestError('the events field is malformed');
  return { params: readForm(rest).params, events: list };
}

/** The fields as typed, shown again when a change is refused. */
interface EndpointForm {
  url: string;
  description: string;
  events: string[];
}

const emptyForm = (): EndpointForm => ({ url: '', description: '', events: [] });
const formOf = (e: WebhookEndpointView): EndpointForm => ({ url: e.url, description: e.description, events: e.events });

interface PageView {
  errors?: string[];
  form?: EndpointForm;
  edit?: { id: number; form: EndpointForm };
  /** A secret just made (create, rotate): shown this once. */
  secret?: { endpoint: WebhookEndpointView; value: string; rotated: boolean };
}

export async function webhookRoutes(app: FastifyInstance, deps: DashboardDeps): Promise<void> {
  const { db, config } = deps;

  async function render(reply: FastifyReply, ctx: DashboardContext, status = 200, view: PageView = {}) {
    requireView(ctx, 'webhooks.read');
    const organization = ctx.organization;
    const endpoints = organization ? await listWebhookEndpoints(db, organization.id, { afterId: 0, limit: MAX_WEBHOOK_ENDPOINTS }) : [];
    const withDeliveries = await Promise.all(
      endpoints.map(async (e) => ({
        ...e,
        state: e.enabled ? (e.failing_since ? 'failing' : 'enabled') : 'disabled',
        deliveries: organization ? await listWebhookDeliveries(db, organization.id, e.id, { beforeId: undefined, limit: RECENT_DELIVERIES }) : [],
        form: view.edit?.id === e.id ? view.edit.form : formOf(e),
        path: `${WEBHOOKS_PATH}/${e.id}`,
      })),
    );
    return renderPage(reply, status, 'dashboard/webhooks', {
      title: 'Webhooks',
      ctx,
      active: 'webhooks',
      manage: ctx.can['webhooks.write'],
      endpoints: withDeliveries,
      eventTypes: WEBHOOK_EVENT_TYPES,
      form: view.form ?? emptyForm(),
      full: endpoints.length >= MAX_WEBHOOK_ENDPOINTS,
      maxEndpoints: MAX_WEBHOOK_ENDPOINTS,
      allowPrivate: config.webhooks.allowPrivate,
      secret: view.secret,
      errors: view.errors ?? [],
      editing: view.edit?.id,
    });
  }

  const actor = (ctx: ActionContext) => ({ actor: { actorUserId: ctx.session.userId } });

  /** Back to the page, at the endpoint the change was about, saying `notice`. */
  function done(reply: FastifyReply, ctx: ActionContext, notice: string, endpoint?: number) {
    return redirectWithNotice(reply, config, ctx.session.sessionId, `${WEBHOOKS_PATH}${endpoint === undefined ? '' : `#endpoint-${endpoint}`}`, notice);
  }

  /** Runs a change; a refusal the user can act on is shown on the page (with `view`: what they typed), at its status. */
  async function attempt(reply: FastifyReply, ctx: ActionContext, view: PageView, change: () => Promise<FastifyReply>) {
    try {
      return await change();
    } catch (err) {
      if (err instanceof InvalidRequestError || err instanceof ConflictError || err instanceof NotFoundError) {
        return render(reply, ctx, err.statusCode, { ...view, errors: errorMessages(err) });
      }
      throw err;
    }
  }

  app.get(WEBHOOKS_PATH, async (req, reply) => render(reply, dashboardContext(req)));

  app.post(WEBHOOKS_PATH, async (req, reply) => {
    const { params, events } = readWebhookForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'webhooks.write' });
    const form: EndpointForm = { url: params.url ?? '', description: params.description ?? '', events };
    return attempt(reply, ctx, { form }, async () => {
      const { endpoint, secret } = await createWebhookEndpoint(db, config.secretKey, ctx.organization.id, form, { ...actor(ctx), config });
      return render(reply, ctx, 201, { secret: { endpoint, value: secret, rotated: false } });
    });
  });

  /** The endpoint named in the URL, for someone who manages webhooks; another organization's is a 404. */
  async function managedEndpoint(req: FastifyRequest<{ Params: { id: string } }>) {
    const { params, events } = readWebhookForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'webhooks.write' });
    const id = parseId(req.params.id);
    if (id === undefined) throw new NotFoundError('There is no such webhook endpoint in this organization.');
    const endpoint = await getWebhookEndpoint(db, ctx.organization.id, id);
    return { ctx, params, events, endpoint };
  }

  app.post<{ Params: { id: string } }>(`${WEBHOOKS_PATH}/:id`, async (req, reply) => {
    const { ctx, params, events, endpoint } = await managedEndpoint(req);
    const form: EndpointForm = { url: params.url ?? '', description: params.description ?? '', events };
    return attempt(reply, ctx, { edit: { id: endpoint.id, form } }, async () => {
      const saved = await updateWebhookEndpoint(db, ctx.organization.id, endpoint.id, form, { ...actor(ctx), config });
      return done(reply, ctx, `Endpoint ${saved.url} saved.`, endpoint.id);
    });
  });

  app.post<{ Params: { id: string } }>(`${WEBHOOKS_PATH}/:id/state`, async (req, reply) => {
    const { ctx, params, endpoint } = await managedEndpoint(req);
    if (params.enabled !== 'yes' && params.enabled !== 'no') throw new InvalidRequestError('Choose enabled or disabled.');
    const enabled = params.enabled === 'yes';
    return attempt(reply, ctx, {}, async () => {
      await updateWebhookEndpoint(db, ctx.organization.id, endpoint.id, { enabled }, { ...actor(ctx), config });
      const notice = enabled
        ? `Endpoint ${endpoint.url} is enabled: events are sent to it again.`
        : `Endpoint ${endpoint.url} is disabled: nothing is sent to it, and its pending deliveries fail.`;
      return done(reply, ctx, notice, endpoint.id);
    });
  });

  app.post<{ Params: { id: string } }>(`${WEBHOOKS_PATH}/:id/rotate-secret`, async (req, reply) => {
    const { ctx, endpoint } = await managedEndpoint(req);
    const rotated = await rotateWebhookSecret(db, config.secretKey, ctx.organization.id, endpoint.id, actor(ctx));
    return render(reply, ctx, 200, { secret: { endpoint: rotated.endpoint, value: rotated.secret, rotated: true } });
  });

  app.post<{ Params: { id: string } }>(`${WEBHOOKS_PATH}/:id/ping`, async (req, reply) => {
    const { ctx, endpoint } = await managedEndpoint(req);
    return attempt(reply, ctx, {}, async () => {
      await pingWebhookEndpoint(db, ctx.organization.id, endpoint.id, actor(ctx));
      return done(reply, ctx, `A webhook.ping event is on its way to ${endpoint.url}; its delivery is listed below.`, endpoint.id);
    });
  });

  app.post<{ Params: { id: string; deliveryId: string } }>(`${WEBHOOKS_PATH}/:id/deliveries/:deliveryId/retry`, async (req, reply) => {
    const { ctx, endpoint } = await managedEndpoint(req);
    const deliveryId = parseId(req.params.deliveryId);
    if (deliveryId === undefined) throw new NotFoundError('There is no such delivery of this endpoint.');
    return attempt(reply, ctx, {}, async () => {
      await retryWebhookDelivery(db, ctx.organization.id, endpoint.id, deliveryId, actor(ctx));
      return done(reply, ctx, `The delivery to ${endpoint.url} is sent again now.`, endpoint.id);
    });
  });

  app.post<{ Params: { id: string } }>(`${WEBHOOKS_PATH}/:id/delete`, async (req, reply) => {
    const { ctx, params, endpoint } = await managedEndpoint(req);
    if (params.confirm !== 'delete') {
      requireView(ctx, 'webhooks.read');
      return renderPage(reply, 200, 'dashboard/webhook-delete', { title: 'Delete the webhook endpoint', ctx, active: 'webhooks', endpoint, path: `${WEBHOOKS_PATH}/${endpoint.id}` });
    }
    await deleteWebhookEndpoint(db, ctx.organization.id, endpoint.id, actor(ctx));
    return done(reply, ctx, `Deleted the endpoint ${endpoint.url}: nothing more is sent to it.`);
  });

  // One delivery: its payload and every attempt, for whoever may see the page.
  app.get<{ Params: { id: string; deliveryId: string } }>(`${WEBHOOKS_PATH}/:id/deliveries/:deliveryId`, async (req, reply) => {
    const ctx = dashboardContext(req);
    requireView(ctx, 'webhooks.read');
    const id = parseId(req.params.id);
    const deliveryId = parseId(req.params.deliveryId);
    if (!ctx.organization || id === undefined || deliveryId === undefined) throw new NotFoundError('There is no such delivery of this endpoint.');
    const endpoint = await getWebhookEndpoint(db, ctx.organization.id, id);
    const delivery = await getWebhookDelivery(db, ctx.organization.id, id, deliveryId);
    return renderPage(reply, 200, 'dashboard/webhook-delivery', {
      title: `Delivery ${delivery.id}`,
      ctx,
      active: 'webhooks',
      manage: ctx.can['webhooks.write'],
      endpoint,
      delivery,
      payload: JSON.stringify(delivery.payload, null, 2),
      path: `${WEBHOOKS_PATH}/${endpoint.id}`,
    });
  });
}
