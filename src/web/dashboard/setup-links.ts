/**
 * Setup links on the dashboard (/dashboard/setup-links): an owner makes a link that lets a
 * customer's IT admin set up domains, SSO connections and directories without becoming a member
 * (accounts/setup-links.ts), sees the live ones (what they open, until when, who made them, when
 * last used) and revokes them. Owners only: a link hands an admin's power over single sign-on to
 * whoever holds it, outside the membership and role model, as only an owner may decide. The URL
 * is in the answer that made the link and nowhere else (a 201 page, no-store, never a redirect).
 */
import type { FastifyInstance, FastifyReply } from 'fastify';
import {
  createSetupLink,
  DEFAULT_SETUP_LINK_TTL_S,
  listSetupLinks,
  revokeSetupLink,
  SETUP_FEATURE_NAMES,
  SETUP_FEATURES,
  setupLinkUrl,
} from '../../accounts/setup-links.js';
import { ForbiddenError, InvalidRequestError, NotFoundError } from '../../errors.js';
import { renderPage } from '../render.js';
import type { DashboardDeps } from './applications.js';
import { dashboardContext, type DashboardContext, parseId, readForm, requireAction } from './context.js';
import { redirectWithNotice } from './notice.js';
import { showingRefusals } from './sso.js';

export const SETUP_LINKS_PATH = '/dashboard/setup-links';
const OWNERS_ONLY = 'Only owners can make, see and revoke setup links.';
/** The lifetimes the form offers, in days (the CLI takes any from an hour to 30 days). */
const LIFETIME_DAYS = [1, 7, 14, 30];

function requireOwner(ctx: DashboardContext): void {
  if (ctx.organization?.access.kind !== 'owner') throw new ForbiddenError(OWNERS_ONLY);
}

export async function setupLinkRoutes(app: FastifyInstance, deps: DashboardDeps): Promise<void> {
  const { db, config } = deps;

  async function render(reply: FastifyReply, ctx: DashboardContext, status: number, view: { created?: { url: string; features: string[]; expires_at: Date }; errors?: string[]; chosen?: string[]; days?: number } = {}) {
    requireOwner(ctx);
    const links = ctx.organization ? await listSetupLinks(db, ctx.organization.id) : [];
    return renderPage(reply, status, 'dashboard/setup-links', {
      title: 'Setup links',
      ctx,
      active: 'sso',
      links: links.map((l) => ({ ...l, featureNames: l.features.map((f) => SETUP_FEATURE_NAMES[f]) })),
      features: SETUP_FEATURES.map((f) => ({ value: f, name: SETUP_FEATURE_NAMES[f], checked: view.chosen?.includes(f) ?? true })),
      lifetimes: LIFETIME_DAYS,
      days: view.days ?? DEFAULT_SETUP_LINK_TTL_S / 86_400,
      created: view.created,
      errors: view.errors ?? [],
    });
  }

  app.get(SETUP_LINKS_PATH, async (req, reply) => render(reply, dashboardContext(req), 200));

  app.post(SETUP_LINKS_PATH, async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: null });
    requireOwner(ctx);
    const chosen = SETUP_FEATURES.filter((f) => params[`feature_${f}`] !== undefined);
    const days = Number(params.expires_days ?? DEFAULT_SETUP_LINK_TTL_S / 86_400);
    return showingRefusals(
      async () => {
        if (!LIFETIME_DAYS.includes(days)) throw new InvalidRequestError('Choose how long the link works.');
        const { link, token } = await createSetupLink(db, ctx.organization.id, { features: chosen, expires_in: days * 86_400 }, { userId: ctx.session.userId });
        return render(reply, ctx, 201, { created: { url: setupLinkUrl(config.issuer, token), features: link.features.map((f) => SETUP_FEATURE_NAMES[f]), expires_at: link.expires_at } });
      },
      (status, errors) => render(reply, ctx, status, { errors, chosen, days }),
    );
  });

  app.post<{ Params: { id: string } }>(`${SETUP_LINKS_PATH}/:id/revoke`, async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: null });
    requireOwner(ctx);
    const id = parseId(req.params.id);
    return showingRefusals(
      async () => {
        if (id === undefined) throw new NotFoundError('no such live setup link in this organization');
        await revokeSetupLink(db, ctx.organization.id, id, { actorUserId: ctx.session.userId });
        return redirectWithNotice(reply, config, ctx.session.sessionId, SETUP_LINKS_PATH, `Setup link ${id} is revoked: it no longer opens anything.`);
      },
      (status, errors) => render(reply, ctx, status, { errors }),
    );
  });
}
