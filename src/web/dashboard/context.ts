/**
 * What every dashboard request starts with: the signed-in user, their organizations, the current
 * one with their role in it, and the session's CSRF token. Actions go through `requireAction`,
 * which checks, in this order, the session, the CSRF token, that an organization is current and
 * that the user's role there allows the action. Ids in forms and URLs are then always looked up
 * together with `ctx.organization.id`, never on their own.
 */
import type { FastifyRequest } from 'fastify';
import { CSRF_FAILED, csrfToken, csrfTokenMatches, currentUser, type SessionUser } from '../../accounts/sessions.js';
import type { Config } from '../../config.js';
import type { DB } from '../../db/connect.js';
import { hasPermission, type Permission, PERMISSIONS } from '../../accounts/roles.js';
import { ForbiddenError, InvalidRequestError } from '../../errors.js';
import { type Params, parseCanonicalId, readParams } from '../../oauth/helpers/params.js';
import { listUserOrganizations } from '../../accounts/organizations.js';
import { type CurrentOrganization, resolveCurrentOrganization } from '../../accounts/current-organization.js';

/** Rows per page of the dashboard's lists (keyset pagination: every page costs what the first does). */
export const DASHBOARD_PAGE_SIZE = 100;

export { CSRF_FAILED };
const NOT_ALLOWED = 'Your role in this organization does not allow this.';

export interface DashboardContext {
  session: SessionUser;
  organizations: CurrentOrganization[];
  /** Undefined only when the user belongs to no organization at all. */
  organization: CurrentOrganization | undefined;
  csrfToken: string;
  /**
   * What the user's role in the current organization allows, by permission: `applications.write`
   * manages applications, `members.write` members, invitations and roles, `grants.write` revokes
   * anyone's connected apps, `audit.read` shows the audit log, and the .read ones show the lists.
   */
  can: Readonly<Record<Permission, boolean>>;
  /** What the action that led here did (notice.ts), shown once at the top of the page; '' for none. */
  notice: string;
}

export interface ActionContext extends DashboardContext {
  organization: CurrentOrganization;
}

function abilities(organization: CurrentOrganization | undefined): Record<Permission, boolean> {
  return Object.fromEntries(PERMISSIONS.map((p) => [p, hasPermission(organization?.access, p)])) as Record<Permission, boolean>;
}

/** The dashboard context for the request's session, or undefined when nobody is signed in. */
export async function loadContext(db: DB, config: Config, req: FastifyRequest): Promise<DashboardContext | undefined> {
  const session = await currentUser(db, config, req);
  if (!session) return undefined;
  const organizations = await listUserOrganizations(db, session.userId);
  const organization = await resolveCurrentOrganization(db, session.sessionId, organizations);
  return {
    session,
    organizations,
    organization,
    csrfToken: csrfToken(config, { session: session.sessionId }),
    can: abilities(organization),
    notice: '',
  };
}

/** Each dashboard request's context, set by the plugin's hook before any handler runs. */
const contexts = new WeakMap<FastifyRequest, DashboardContext>();

export function setDashboardContext(req: FastifyRequest, ctx: DashboardContext): void {
  contexts.set(req, ctx);
}

export function dashboardContext(req: FastifyRequest): DashboardContext {
  const ctx = contexts.get(req);
  if (!ctx) throw new Error('dashboard route without its context: is it registered inside dashboardPages?');
  return ctx;
}

/**
 * Guards a POST: the session's CSRF token, a current organization and (with `permission`) a
 * role there that holds it. Every refusal is a 403. The plugin's hook has already required a session.
 */
export function requireAction(config: Config, req: FastifyRequest, form: Params, options: { permission: Permission | null }): ActionContext {
  const ctx = dashboardContext(req);
  if (!csrfTokenMatches(config, { session: ctx.session.sessionId }, form.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
  const { organization } = ctx;
  if (!organization) throw new ForbiddenError('You are not a member of any organization.');
  if (options.permission && !ctx.can[options.permission]) throw new ForbiddenError(NOT_ALLOWED);
  return { ...ctx, organization };
}

/** Guards a page that shows what `permission` allows: a 403 without it (the navigation does not offer it). */
export function requireView(ctx: DashboardContext, permission: Permission): void {
  if (ctx.organization && !ctx.can[permission]) throw new ForbiddenError(NOT_ALLOWED);
}

/**
 * A dashboard form: each field at most once (readParams), except the scope checkboxes, which
 * arrive as a repeated `scopes` field.
 */
export function readForm(body: unknown): { params: Params; scopes: string[] } {
  if (body === undefined || body === null) return { params: readParams(body), scopes: [] };
  if (typeof body !== 'object') throw new InvalidRequestError('the form could not be read');
  const rest: Record<string, unknown> = {};
  const scopes: unknown[] = [];
  for (const [name, value] of Object.entries(body)) {
    if (name === 'scopes') scopes.push(...(Array.isArray(value) ? value : [value]));
    else rest[name] = value;
  }
  if (!scopes.every((s): s is string => typeof s === 'string')) throw new InvalidRequestError('the scopes field is malformed');
  return { params: readParams(rest), scopes };
}

/** A canonical positive integer id from a URL or form, or undefined. */
export function parseId(value: unknown): number | undefined {
  return typeof value === 'string' ? parseCanonicalId(value) : undefined;
}
