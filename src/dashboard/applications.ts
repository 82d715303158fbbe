/**
 * Applications in the dashboard: list, create, edit, rotate the secret, generate a token,
 * disable and delete. Every application is looked up by (organization, client_id), so a
 * client_id of another organization is a 404 whatever the form says.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { recordAuditEvent } from '../audit/events.js';
import type { Config } from '../config.js';
import { type DB, inTransaction } from '../db/connect.js';
import type { Application, ApplicationUpdate } from '../db/schema.js';
import { NotFoundError } from '../errors.js';
import type { ApplicationCache } from '../oauth/application-cache.js';
import { CLIENT_ID_PATTERN, createApplication, rotateClientSecret } from '../oauth/applications.js';
import type { ClientGrants } from '../oauth/client-grants.js';
import type { Metrics } from '../metrics.js';
import { InvalidScopeError } from '../oauth/errors.js';
import type { KeyStore } from '../oauth/key-store.js';
import { redirectUriProblem } from '../oauth/redirect-uris.js';
import type { RevocationList } from '../oauth/revocations.js';
import { grantableScopes, isKnownScope, KNOWN_SCOPES, SCOPE_DESCRIPTIONS, type Scope } from '../oauth/scopes.js';
import { issueClientToken, type TokenResponse } from '../oauth/token-response.js';
import { renderPage } from '../pages/render.js';
import { type ActionContext, dashboardContext, type DashboardContext, readForm, requireAction } from './context.js';

export interface DashboardDeps {
  db: DB;
  config: Config;
  keys: KeyStore;
  revocations: RevocationList;
  /** Told of every change made here, so client authentication on this instance sees it at once. */
  applications: ApplicationCache;
  clientGrants: ClientGrants;
  metrics: Metrics;
}

const MAX_REDIRECT_URIS = 20;
const SCOPE_CHOICES = KNOWN_SCOPES.map((name) => ({ name, description: SCOPE_DESCRIPTIONS[name] }));

/** An application of the organization, or a 404 (also for another organization's). */
export async function getOrganizationApplication(db: DB, organizationId: number, clientId: string | undefined): Promise<Application> {
  const application =
    clientId === undefined || !CLIENT_ID_PATTERN.test(clientId)
      ? undefined
      : await db.selectFrom('applications').selectAll().where('organization_id', '=', organizationId).where('client_id', '=', clientId).executeTakeFirst();
  if (!application) throw new NotFoundError('There is no such application in this organization.');
  return application;
}

/** Live grants of an application, optionally only those holding a scope outside `keep`. */
async function liveGrantIds(db: DB, application: Application, keep?: readonly string[]): Promise<number[]> {
  const grants = await db
    .selectFrom('grants')
    .select(['id', 'scopes'])
    .where('organization_id', '=', application.organization_id)
    .where('application_id', '=', application.id)
    .where('revoked_at', 'is', null)
    .orderBy('id')
    .execute();
  return grants.filter((g) => keep === undefined || g.scopes.some((s) => !keep.includes(s))).map((g) => g.id);
}

/** Changes an application of its organization and records why, in one transaction. */
async function updateApplication(
  db: DB,
  application: Application,
  changes: Pick<ApplicationUpdate, 'name' | 'redirect_uris' | 'scopes' | 'disabled'>,
  audit: { action: string; actorUserId: number; details: Record<string, unknown> },
): Promise<void> {
  await inTransaction(db, async (trx) => {
    await trx
      .updateTable('applications')
      .set({ ...changes, updated_at: new Date() })
      .where('organization_id', '=', application.organization_id)
      .where('id', '=', application.id)
      .execute();
    await recordAuditEvent(trx, {
      organizationId: application.organization_id,
      action: audit.action,
      actorUserId: audit.actorUserId,
      details: { client_id: application.client_id, ...audit.details },
    });
  });
}

/** Redirect URIs from a textarea, one per line; problems are phrased for the form. */
function parseRedirectUris(text: string): { uris: string[]; errors: string[] } {
  const uris = [...new Set(text.split(/\r?\n/).map((l) => l.trim()).filter((l) => l !== ''))];
  const errors: string[] = [];
  if (uris.length === 0) errors.push('Enter at least one redirect URI.');
  if (uris.length > MAX_REDIRECT_URIS) errors.push(`Enter at most ${MAX_REDIRECT_URIS} redirect URIs.`);
  for (const uri of uris) {
    const problem = redirectUriProblem(uri);
    if (problem) errors.push(`Redirect URI ${uri.slice(0, 100)} ${problem}.`);
  }
  return { uris, errors };
}

function parseChosenScopes(chosen: readonly string[]): { scopes: Scope[]; errors: string[] } {
  const errors: string[] = [];
  if (chosen.some((s) => !isKnownScope(s))) errors.push('Choose only the scopes listed.');
  const scopes = KNOWN_SCOPES.filter((s) => chosen.includes(s));
  if (scopes.length === 0) errors.push('Choose at least one scope.');
  return { scopes, errors };
}

function parseName(value: string | undefined): { name: string; errors: string[] } {
  const name = (value ?? '').trim();
  if (name === '') return { name, errors: ['Enter a name.'] };
  if (name.length > 200) return { name, errors: ['The name must be at most 200 characters long.'] };
  return { name, errors: [] };
}

export async function applicationRoutes(app: FastifyInstance, deps: DashboardDeps): Promise<void> {
  const { db, config, keys, revocations, applications, clientGrants, metrics } = deps;

  // Every action on an application has committed by the time its response is sent: drop the
  // cached copy here and now (other instances hear of it by NOTIFY from the database trigger).
  app.addHook('onSend', async (req) => {
    const clientId = (req.params as { clientId?: unknown } | undefined)?.clientId;
    if (req.method === 'POST' && typeof clientId === 'string') applications.forget(clientId);
  });

  async function listApplications(organizationId: number) {
    return db
      .selectFrom('applications')
      .select(['client_id', 'name', 'type', 'scopes', 'disabled', 'created_at'])
      .where('organization_id', '=', organizationId)
      .orderBy('name')
      .orderBy('id')
      .execute();
  }

  type CreateForm = { type: 'public' | 'private'; name: string; redirectUris: string; scopes: string[]; requirePkce: boolean };
  const emptyForm = (type: 'public' | 'private'): CreateForm => ({ type, name: '', redirectUris: '', scopes: [...KNOWN_SCOPES], requirePkce: false });

  async function renderList(reply: FastifyReply, ctx: DashboardContext, status = 200, view: { form?: CreateForm; errors?: string[] } = {}) {
    const organizationId = ctx.organization?.id;
    return renderPage(reply, status, 'dashboard/applications', {
      title: 'Applications',
      ctx,
      active: 'applications',
      applications: organizationId === undefined ? [] : await listApplications(organizationId),
      scopeChoices: SCOPE_CHOICES,
      publicForm: view.form?.type === 'public' ? view.form : emptyForm('public'),
      privateForm: view.form?.type === 'private' ? view.form : emptyForm('private'),
      errorsFor: view.form?.type ?? '',
      errors: view.errors ?? [],
    });
  }

  interface ApplicationView {
    secret?: string;
    token?: TokenResponse;
    errors?: string[];
    edit?: { name: string; redirectUris: string; scopes: string[] };
    message?: string;
  }

  function renderApplication(reply: FastifyReply, ctx: DashboardContext, application: Application, status = 200, view: ApplicationView = {}) {
    return renderPage(reply, status, 'dashboard/application', {
      title: application.name,
      ctx,
      active: 'applications',
      application,
      scopeChoices: SCOPE_CHOICES,
      edit: view.edit ?? { name: application.name, redirectUris: application.redirect_uris.join('\n'), scopes: application.scopes },
      secret: view.secret ?? '',
      token: view.token,
      tokenJson: view.token ? JSON.stringify(view.token, null, 2) : '',
      errors: view.errors ?? [],
      message: view.message ?? '',
    });
  }

  app.get('/dashboard/applications', async (req, reply) => {
    const ctx = dashboardContext(req);
    return renderList(reply, ctx);
  });

  app.post('/dashboard/applications', async (req, reply) => {
    const { params, scopes: chosen } = readForm(req.body);
    const ctx = requireAction(config, req, params, { manage: true });
    const type = params.type === 'private' ? 'private' : 'public';
    const form: CreateForm = {
      type,
      name: params.name ?? '',
      redirectUris: params.redirect_uris ?? '',
      scopes: chosen,
      requirePkce: params.require_pkce === 'on',
    };
    const name = parseName(form.name);
    const scopes = parseChosenScopes(chosen);
    const redirects = type === 'public' ? parseRedirectUris(form.redirectUris) : { uris: [], errors: [] };
    const errors = [...name.errors, ...redirects.errors, ...scopes.errors];
    if (errors.length > 0) return renderList(reply, ctx, 400, { form, errors });

    const created = await createApplication(db, {
      organizationId: ctx.organization.id,
      type,
      name: name.name,
      redirectUris: redirects.uris,
      scopes: scopes.scopes,
      requirePkce: type === 'public' && form.requirePkce,
      actorUserId: ctx.session.userId,
    });
    const application = await getOrganizationApplication(db, ctx.organization.id, created.client_id);
    // Rule 7: the secret exists in plaintext only in this response (no-store, never a redirect).
    return renderApplication(reply, ctx, application, 201, { secret: created.client_secret, message: 'Application created.' });
  });

  app.get<{ Params: { clientId: string } }>('/dashboard/applications/:clientId', async (req, reply) => {
    const ctx = dashboardContext(req);
    if (!ctx.organization) throw new NotFoundError('There is no such application in this organization.');
    const application = await getOrganizationApplication(db, ctx.organization.id, req.params.clientId);
    return renderApplication(reply, ctx, application);
  });

  /** The application named in the URL, for an owner or admin of its organization. */
  async function managedApplication(req: FastifyRequest<{ Params: { clientId: string } }>) {
    const { params, scopes } = readForm(req.body);
    const ctx = requireAction(config, req, params, { manage: true });
    const application = await getOrganizationApplication(db, ctx.organization.id, req.params.clientId);
    return { ctx, application, params, scopes };
  }

  app.post<{ Params: { clientId: string } }>('/dashboard/applications/:clientId/secret', async (req, reply) => {
    const { ctx, application } = await managedApplication(req);
    const rotated = await rotateClientSecret(db, application.client_id, { actorUserId: ctx.session.userId });
    const updated = await getOrganizationApplication(db, ctx.organization.id, application.client_id);
    return renderApplication(reply, ctx, updated, 200, { secret: rotated.client_secret, message: 'The secret was replaced; the old one no longer works.' });
  });

  app.post<{ Params: { clientId: string } }>('/dashboard/applications/:clientId', async (req, reply) => {
    const { ctx, application, params, scopes: chosen } = await managedApplication(req);
    const edit = { name: params.name ?? '', redirectUris: params.redirect_uris ?? '', scopes: chosen };
    const name = parseName(edit.name);
    const scopes = parseChosenScopes(chosen);
    const redirects = application.type === 'public' ? parseRedirectUris(edit.redirectUris) : { uris: [], errors: [] };
    const errors = [...name.errors, ...redirects.errors, ...scopes.errors];
    if (errors.length > 0) return renderApplication(reply, ctx, application, 400, { edit, errors });

    // Narrowing the scopes: grants holding a scope outside the new set are revoked, once the
    // user has seen how many and confirmed.
    const kept: readonly string[] = scopes.scopes;
    const affected = await liveGrantIds(db, application, kept);
    if (affected.length > 0 && params.confirm !== 'revoke') {
      return renderPage(reply, 200, 'dashboard/confirm-scopes', {
        title: `Narrow the scopes of ${application.name}`,
        ctx,
        active: 'applications',
        application,
        edit,
        removed: application.scopes.filter((s) => !kept.includes(s)),
        affected: affected.length,
      });
    }
    await updateApplication(db, application, { name: name.name, redirect_uris: redirects.uris, scopes: scopes.scopes }, {
      action: 'application.updated',
      actorUserId: ctx.session.userId,
      details: { name: name.name, redirect_uris: redirects.uris, scopes: scopes.scopes },
    });
    // After the commit: from here no new grant can get the removed scopes, so one pass suffices.
    for (const grantId of await liveGrantIds(db, application, scopes.scopes)) {
      await revocations.revoke(grantId, 'scopes_narrowed', { actorUserId: ctx.session.userId });
    }
    return reply.redirect(`/dashboard/applications/${application.client_id}`, 303);
  });

  app.post<{ Params: { clientId: string } }>('/dashboard/applications/:clientId/token', async (req, reply) => {
    const { ctx, application, scopes: chosen } = await managedApplication(req);
    if (application.type !== 'private') throw new NotFoundError('Tokens are generated here only for private applications.');
    if (application.disabled) return renderApplication(reply, ctx, application, 400, { errors: ['The application is disabled.'] });
    let scopes: Scope[];
    try {
      scopes = grantableScopes(chosen.join(' '), application.scopes);
    } catch (err) {
      if (!(err instanceof InvalidScopeError)) throw err;
      return renderApplication(reply, ctx, application, 400, { errors: ['Choose at least one of the application’s scopes.'] });
    }
    const token = await issueClientToken({ db, keys, config, clientGrants }, application, scopes);
    metrics.tokensIssued.inc({ grant_type: 'dashboard' });
    await recordAuditEvent(db, {
      organizationId: ctx.organization.id,
      action: 'application.token_generated',
      actorUserId: ctx.session.userId,
      details: { client_id: application.client_id, scopes },
    });
    return renderApplication(reply, ctx, application, 200, { token, message: 'Token generated.' });
  });

  /** Revokes every live grant of the application; repeated until none is left (a grant created meanwhile). */
  async function revokeAllGrants(ctx: ActionContext, application: Application): Promise<void> {
    for (let ids = await liveGrantIds(db, application); ids.length > 0; ids = await liveGrantIds(db, application)) {
      for (const id of ids) await revocations.revoke(id, 'application_disabled', { actorUserId: ctx.session.userId });
    }
  }

  app.post<{ Params: { clientId: string } }>('/dashboard/applications/:clientId/disable', async (req, reply) => {
    const { ctx, application } = await managedApplication(req);
    await updateApplication(db, application, { disabled: true }, { action: 'application.disabled', actorUserId: ctx.session.userId, details: {} });
    // Disabled first: client authentication and /authorize refuse it, so no new grant appears.
    await revokeAllGrants(ctx, application);
    return reply.redirect(`/dashboard/applications/${application.client_id}`, 303);
  });

  app.post<{ Params: { clientId: string } }>('/dashboard/applications/:clientId/delete', async (req, reply) => {
    const { ctx, application } = await managedApplication(req);
    await db.updateTable('applications').set({ disabled: true }).where('organization_id', '=', ctx.organization.id).where('id', '=', application.id).execute();
    // Revoked (and published) before the rows go, so every instance refuses the tokens.
    await revokeAllGrants(ctx, application);
    await inTransaction(db, async (trx) => {
      await trx.deleteFrom('applications').where('organization_id', '=', ctx.organization.id).where('id', '=', application.id).execute();
      await recordAuditEvent(trx, {
        organizationId: ctx.organization.id,
        action: 'application.deleted',
        actorUserId: ctx.session.userId,
        details: { client_id: application.client_id, name: application.name },
      });
    });
    return reply.redirect('/dashboard/applications', 303);
  });
}
