/**
 * Applications in the dashboard: list, create, edit, rotate the secret, generate a token,
 * disable and delete. Every application is looked up by (organization, client_id), so a
 * client_id of another organization is a 404 whatever the form says. Rotating the secret,
 * disabling and deleting first answer a page saying what will stop working, whose form sends the
 * same POST again with `confirm`; a change redirects to a page that says what it did (notice.ts).
 */
import { markClientUsed } from '../../oauth/models/registrations.js';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { recordAuditEvent } from '../../audit/events.js';
import type { Config } from '../../config.js';
import type { DB } from '../../db/connect.js';
import type { MailOutbox } from '../../mail/outbox.js';
import type { Application, ApplicationType, DeveloperApplication } from '../../db/schema.js';
import { ConflictError, ForbiddenError, InvalidRequestError, NotFoundError } from '../../errors.js';
import type { ApplicationCache } from '../../oauth/models/application-cache.js';
import {
  type ChangeOptions,
  countGrantsBeyond,
  createApplication,
  deleteApplication,
  getApplication,
  listApplications,
  rotateClientSecret,
  updateApplication,
  type DeveloperAuthMethod,
} from '../../oauth/models/applications.js';
import type { ClientGrants } from '../../oauth/models/client-grants.js';
import { countLiveGrants, GRANT_COUNT_CAP } from '../../oauth/models/grants.js';
import type { Metrics } from '../../metrics.js';
import { InvalidScopeError } from '../../oauth/errors.js';
import type { KeyStore } from '../../oauth/models/key-store.js';
import { MAX_REDIRECT_URIS, redirectUriProblem } from '../../oauth/helpers/redirect-uris.js';
import type { RevocationList } from '../../oauth/models/revocation-list.js';
import { DATA_SCOPES, grantableScopes, mayHold, SCOPE_DESCRIPTIONS, type Scope, scopesForType } from '../../oauth/helpers/scopes.js';
import { issueClientToken, type TokenResponse } from '../../oauth/grants/token-response.js';
import { renderPage } from '../render.js';
import { requiresDpop } from '../../oauth/helpers/fapi.js';
import type { IdTokenAlg } from '../../db/schema.js';
import { type ActionContext, DASHBOARD_PAGE_SIZE, dashboardContext, type DashboardContext, parseId, readForm, requireAction, requireView } from './context.js';
import { count, redirectWithNotice } from './notice.js';

export interface DashboardDeps {
  db: DB;
  config: Config;
  keys: KeyStore;
  revocations: RevocationList;
  /** Told of every change made here, so client authentication on this instance sees it at once. */
  applications: ApplicationCache;
  clientGrants: ClientGrants;
  metrics: Metrics;
  /** Invitations and verification links are queued here (src/mail/outbox.ts). */
  mail: MailOutbox;
}

/** The scopes offered for an application of each type: management scopes for private ones only (AD-1). */
const SCOPE_CHOICES = {
  public: scopesForType('public').map((name) => ({ name, description: SCOPE_DESCRIPTIONS[name] })),
  private: scopesForType('private').map((name) => ({ name, description: SCOPE_DESCRIPTIONS[name] })),
};

/** The two lists of URIs a public application registers, as the forms name them; only the first may not be empty. */
const URI_LISTS = {
  redirect: { label: 'Redirect URI', many: 'redirect URIs', missing: 'Enter at least one redirect URI.' },
  postLogout: { label: 'Post-logout redirect URI', many: 'post-logout redirect URIs', missing: undefined },
} as const;

/** URIs from a textarea, one per line, de-duplicated; problems are phrased for the form. */
function parseUriLines(text: string, list: (typeof URI_LISTS)[keyof typeof URI_LISTS]): { uris: string[]; errors: string[] } {
  const uris = [...new Set(text.split(/\r?\n/).map((l) => l.trim()).filter((l) => l !== ''))];
  const errors: string[] = [];
  if (uris.length === 0 && list.missing) errors.push(list.missing);
  if (uris.length > MAX_REDIRECT_URIS) errors.push(`Enter at most ${MAX_REDIRECT_URIS} ${list.many}.`);
  for (const uri of uris) {
    const problem = redirectUriProblem(uri);
    if (problem) errors.push(`${list.label} ${uri.slice(0, 100)} ${problem}.`);
  }
  return { uris, errors };
}

/** A public application's redirect and post-logout redirect URIs from the form; a private one has neither (its forms show none). */
function parseApplicationUris(
  type: ApplicationType,
  text: { redirectUris: string; postLogoutRedirectUris: string },
): { redirectUris: string[]; postLogoutRedirectUris: string[]; errors: string[] } {
  if (type !== 'public') return { redirectUris: [], postLogoutRedirectUris: [], errors: [] };
  const redirects = parseUriLines(text.redirectUris, URI_LISTS.redirect);
  const postLogout = parseUriLines(text.postLogoutRedirectUris, URI_LISTS.postLogout);
  return { redirectUris: redirects.uris, postLogoutRedirectUris: postLogout.uris, errors: [...redirects.errors, ...postLogout.errors] };
}

/**
 * What an application would get beyond the acting user's role: a user may give an application
 * only scopes they hold (the rule the management API applies to a token), whatever its type: a
 * private application acts on its own with them, and a public one would be another member's
 * to change later only if their role holds its scopes too.
 */
function beyondRole(ctx: DashboardContext, scopes: readonly string[]): string[] {
  return scopes.filter((s) => (ctx.can as Readonly<Record<string, boolean>>)[s] !== true);
}

function delegationError(beyond: readonly string[]): string {
  return `Your role does not hold ${beyond.join(' ')}, so you cannot give it to an application.`;
}

function parseChosenScopes(chosen: readonly string[], type: ApplicationType): { scopes: Scope[]; errors: string[] } {
  const errors: string[] = [];
  if (chosen.some((s) => !mayHold(type, s))) errors.push('Choose only the scopes listed.');
  const scopes = scopesForType(type).filter((s) => chosen.includes(s));
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

  /** This instance's caches, told of each change here once it commits (other instances hear by NOTIFY). */
  const changeOptions = (ctx: ActionContext): ChangeOptions => ({ actor: { actorUserId: ctx.session.userId }, revocations, applications });

  type CreateForm = { type: 'public' | 'private'; name: string; redirectUris: string; postLogoutRedirectUris: string; scopes: string[]; requirePkce: boolean };
  const emptyForm = (type: 'public' | 'private'): CreateForm => ({
    type,
    name: '',
    redirectUris: '',
    postLogoutRedirectUris: '',
    scopes: [...DATA_SCOPES],
    requirePkce: false,
  });

  async function renderList(
    reply: FastifyReply,
    ctx: DashboardContext,
    status = 200,
    view: { form?: CreateForm; errors?: string[]; after?: number | undefined } = {},
  ) {
    const organizationId = ctx.organization?.id;
    const rows = organizationId === undefined ? [] : await listApplications(db, organizationId, { afterId: view.after ?? 0, limit: DASHBOARD_PAGE_SIZE + 1 });
    return renderPage(reply, status, 'dashboard/applications', {
      title: 'Applications',
      ctx,
      active: 'applications',
      applications: rows.slice(0, DASHBOARD_PAGE_SIZE),
      first: view.after === undefined ? '' : '/dashboard/applications',
      next: rows.length > DASHBOARD_PAGE_SIZE ? `/dashboard/applications?after=${rows[DASHBOARD_PAGE_SIZE - 1]!.id}` : '',
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
    edit?: { name: string; redirectUris: string; postLogoutRedirectUris: string; scopes: string[] };
    /** The security form as sent, shown again with its errors. */
    security?: SecurityForm;
    message?: string;
  }

  function renderApplication(reply: FastifyReply, ctx: DashboardContext, application: DeveloperApplication, status = 200, view: ApplicationView = {}) {
    return renderPage(reply, status, 'dashboard/application', {
      title: application.name,
      ctx,
      active: 'applications',
      application,
      // Scopes of the application the viewer's role lacks: then it is not theirs to change.
      outOfReach: beyondRole(ctx, application.scopes),
      scopeChoices: SCOPE_CHOICES[application.type],
      edit: view.edit ?? {
        name: application.name,
        redirectUris: application.redirect_uris.join('\n'),
        postLogoutRedirectUris: application.post_logout_redirect_uris.join('\n'),
        scopes: application.scopes,
      },
      security: view.security ?? securityFormOf(application),
      secret: view.secret ?? '',
      token: view.token,
      tokenJson: view.token ? JSON.stringify(view.token, null, 2) : '',
      errors: view.errors ?? [],
      message: view.message ?? '',
    });
  }

  app.get<{ Querystring: { after?: unknown } }>('/dashboard/applications', async (req, reply) => {
    const ctx = dashboardContext(req);
    requireView(ctx, 'applications.read');
    return renderList(reply, ctx, 200, { after: parseId(req.query.after) });
  });

  app.post('/dashboard/applications', async (req, reply) => {
    const { params, scopes: chosen } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'applications.write' });
    const type = params.type === 'private' ? 'private' : 'public';
    const form: CreateForm = {
      type,
      name: params.name ?? '',
      redirectUris: params.redirect_uris ?? '',
      postLogoutRedirectUris: params.post_logout_redirect_uris ?? '',
      scopes: chosen,
      requirePkce: params.require_pkce === 'on',
    };
    const name = parseName(form.name);
    const scopes = parseChosenScopes(chosen, type);
    const uris = parseApplicationUris(type, form);
    const errors = [...name.errors, ...uris.errors, ...scopes.errors];
    if (errors.length > 0) return renderList(reply, ctx, 400, { form, errors });
    const beyond = beyondRole(ctx, scopes.scopes);
    if (beyond.length > 0) return renderList(reply, ctx, 403, { form, errors: [delegationError(beyond)] });

    const created = await createApplication(db, {
      organizationId: ctx.organization.id,
      type,
      name: name.name,
      redirectUris: uris.redirectUris,
      postLogoutRedirectUris: uris.postLogoutRedirectUris,
      scopes: scopes.scopes,
      requirePkce: type === 'public' && form.requirePkce,
      actor: { actorUserId: ctx.session.userId },
    });
    const application = await getApplication(db, ctx.organization.id, created.client_id);
    // Rule 7: the secret exists in plaintext only in this response (no-store, never a redirect).
    return renderApplication(reply, ctx, application, 201, { secret: created.client_secret, message: 'Application created.' });
  });

  app.get<{ Params: { clientId: string } }>('/dashboard/applications/:clientId', async (req, reply) => {
    const ctx = dashboardContext(req);
    if (!ctx.organization) throw new NotFoundError('There is no such application in this organization.');
    requireView(ctx, 'applications.read');
    const application = await getApplication(db, ctx.organization.id, req.params.clientId);
    return renderApplication(reply, ctx, application);
  });

  /**
   * The application named in the URL, for someone whose role there manages applications and
   * holds every scope the application has: rotating the secret of (or generating a token for,
   * or re-pointing the redirect URIs of) a wider application would hand its holder more than
   * their role, and disabling or deleting one is for those who could have given it its scopes.
   */
  async function managedApplication(req: FastifyRequest<{ Params: { clientId: string } }>) {
    const { params, scopes } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'applications.write' });
    const application = await getApplication(db, ctx.organization.id, req.params.clientId);
    const beyond = beyondRole(ctx, application.scopes);
    if (beyond.length > 0) throw new ForbiddenError(`${application.name} holds ${beyond.join(' ')}, which your role does not, so you cannot change it.`);
    return { ctx, application, params, scopes };
  }

  /** A page asking to confirm `action` on the application (application-confirm.eta), with what will stop working. */
  async function confirmPage(reply: FastifyReply, ctx: ActionContext, application: Application, action: 'rotate' | 'disable' | 'delete') {
    // It tells about the application: for those who may see its page.
    requireView(ctx, 'applications.read');
    // Rotating the secret leaves the grants alone: nothing to count.
    const grants = action === 'rotate' ? 0 : await countLiveGrants(db, { applicationId: application.id }, { cap: GRANT_COUNT_CAP });
    return renderPage(reply, 200, 'dashboard/application-confirm', {
      title: `${{ rotate: 'Rotate the secret of', disable: 'Disable', delete: 'Delete' }[action]} ${application.name}`,
      ctx,
      active: 'applications',
      application,
      action,
      grants,
      grantsText: count(grants, 'grant', 'grants', GRANT_COUNT_CAP),
      path: `/dashboard/applications/${application.client_id}`,
    });
  }

  app.post<{ Params: { clientId: string } }>('/dashboard/applications/:clientId/secret', async (req, reply) => {
    const { ctx, application, params } = await managedApplication(req);
    // The profile needs keys: refused before asking, as rotateClientSecret refuses it.
    if (application.fapi2) throw new ConflictError('a FAPI 2.0 application authenticates with private_key_jwt and has no secret; turn the profile off first');
    if (params.confirm !== 'rotate') return confirmPage(reply, ctx, application, 'rotate');
    const rotated = await rotateClientSecret(db, application, changeOptions(ctx));
    const updated = await getApplication(db, ctx.organization.id, application.client_id);
    return renderApplication(reply, ctx, updated, 200, { secret: rotated.client_secret, message: 'The secret was replaced; the old one no longer works.' });
  });

  app.post<{ Params: { clientId: string } }>('/dashboard/applications/:clientId', async (req, reply) => {
    const { ctx, application, params, scopes: chosen } = await managedApplication(req);
    const edit = { name: params.name ?? '', redirectUris: params.redirect_uris ?? '', postLogoutRedirectUris: params.post_logout_redirect_uris ?? '', scopes: chosen };
    const name = parseName(edit.name);
    const scopes = parseChosenScopes(chosen, application.type);
    const uris = parseApplicationUris(application.type, edit);
    const errors = [...name.errors, ...uris.errors, ...scopes.errors];
    if (errors.length > 0) return renderApplication(reply, ctx, application, 400, { edit, errors });
    const added = beyondRole(ctx, scopes.scopes.filter((s) => !application.scopes.includes(s)));
    if (added.length > 0) return renderApplication(reply, ctx, application, 403, { edit, errors: [delegationError(added)] });

    // Narrowing the scopes: grants holding a scope outside the new set are revoked, once the
    // user has seen how many and confirmed.
    const affected = await countGrantsBeyond(db, application, scopes.scopes);
    if (affected > 0 && params.confirm !== 'revoke') {
      return renderPage(reply, 200, 'dashboard/confirm-scopes', {
        title: `Narrow the scopes of ${application.name}`,
        ctx,
        active: 'applications',
        application,
        edit,
        removed: application.scopes.filter((s) => !scopes.scopes.some((kept) => kept === s)),
        affected,
      });
    }
    await updateApplication(
      db,
      application,
      { name: name.name, redirectUris: uris.redirectUris, postLogoutRedirectUris: uris.postLogoutRedirectUris, scopes: scopes.scopes },
      changeOptions(ctx),
    );
    const revoked = affected > 0 ? ` The ${count(affected, 'grant')} holding a scope it no longer has ${affected === 1 ? 'is' : 'are'} being revoked: ${affected === 1 ? 'its' : 'their'} tokens stopped working.` : '';
    return redirectWithNotice(reply, config, ctx.session.sessionId, `/dashboard/applications/${application.client_id}`, `Saved ${name.name}.${revoked}`);
  });

  /**
   * The security settings (issue 28): how the application authenticates (a secret or its keys
   * for private_key_jwt, inline or at a URL), DPoP-bound tokens, pushed authorization requests,
   * its ID tokens' algorithm, the FAPI 2.0 profile. The domain checks them (the API's rules).
   */
  app.post<{ Params: { clientId: string } }>('/dashboard/applications/:clientId/security', async (req, reply) => {
    const { ctx, application, params } = await managedApplication(req);
    const form: SecurityForm = {
      method: params.token_endpoint_auth_method ?? application.token_endpoint_auth_method,
      jwks: params.jwks ?? '',
      jwksUri: params.jwks_uri ?? '',
      dpop: params.dpop_bound_access_tokens === 'on',
      par: params.require_pushed_authorization_requests === 'on',
      idTokenAlg: params.id_token_signed_response_alg ?? application.id_token_signed_response_alg,
      fapi2: params.fapi2 === 'on',
    };
    let jwks: unknown;
    if (form.method === 'private_key_jwt' && form.jwks.trim() !== '') {
      try {
        jwks = JSON.parse(form.jwks);
      } catch {
        return renderApplication(reply, ctx, application, 400, { security: form, errors: ['The public keys must be a JWK Set in JSON: {"keys": [...]}'] });
      }
    }
    const usesKeys = form.method === 'private_key_jwt';
    try {
      await updateApplication(
        db,
        application,
        {
          ...(form.method !== application.token_endpoint_auth_method ? { tokenEndpointAuthMethod: form.method as DeveloperAuthMethod } : {}),
          // Keys: the ones given (inline or a URL); none given, those it has stay.
          ...(usesKeys && jwks !== undefined ? { jwks } : {}),
          ...(usesKeys && form.jwksUri.trim() !== '' ? { jwksUri: form.jwksUri.trim() } : {}),
          dpopBoundAccessTokens: form.dpop,
          ...(application.type === 'public' ? { requirePushedAuthorizationRequests: form.par, idTokenSignedResponseAlg: form.idTokenAlg as IdTokenAlg } : {}),
          fapi2: form.fapi2,
        },
        { ...changeOptions(ctx), allowHttp: config.outbound.allowHttp },
      );
    } catch (err) {
      if (!(err instanceof InvalidRequestError)) throw err;
      return renderApplication(reply, ctx, application, 400, { security: form, errors: err.details?.map((d) => d.message) ?? [err.description] });
    }
    return redirectWithNotice(reply, config, ctx.session.sessionId, `/dashboard/applications/${application.client_id}`, `Saved the security settings of ${application.name}.`);
  });

  app.post<{ Params: { clientId: string } }>('/dashboard/applications/:clientId/token', async (req, reply) => {
    const { ctx, application, scopes: chosen } = await managedApplication(req);
    if (application.type !== 'private') throw new NotFoundError('Tokens are generated here only for private applications.');
    if (application.disabled) return renderApplication(reply, ctx, application, 400, { errors: ['The application is disabled.'] });
    // Its tokens must be bound to a key only the application holds: none can be made here.
    if (requiresDpop(application)) {
      return renderApplication(reply, ctx, application, 400, { errors: ['This application’s tokens are DPoP-bound to its own key: it gets them itself, with client credentials and a DPoP proof.'] });
    }
    let scopes: Scope[];
    try {
      scopes = grantableScopes(chosen.join(' '), application.scopes);
    } catch (err) {
      if (!(err instanceof InvalidScopeError)) throw err;
      return renderApplication(reply, ctx, application, 400, { errors: ['Choose at least one of the application’s scopes.'] });
    }
    const beyond = beyondRole(ctx, scopes);
    if (beyond.length > 0) return renderApplication(reply, ctx, application, 403, { errors: [delegationError(beyond)] });
    const token = await issueClientToken({ db, keys, config, clientGrants }, application, scopes);
    metrics.tokensIssued.inc({ grant_type: 'dashboard' });
    req.server.activity.count(ctx.organization.id, 'tokens_dashboard');
    await markClientUsed(db, application);
    await recordAuditEvent(db, {
      organizationId: ctx.organization.id,
      action: 'application.token_generated',
      actor: { actorUserId: ctx.session.userId },
      details: { client_id: application.client_id, scopes },
    });
    return renderApplication(reply, ctx, application, 200, { token, message: 'Token generated.' });
  });

  app.post<{ Params: { clientId: string } }>('/dashboard/applications/:clientId/disable', async (req, reply) => {
    const { ctx, application, params } = await managedApplication(req);
    const page = `/dashboard/applications/${application.client_id}`;
    if (application.disabled) return redirectWithNotice(reply, config, ctx.session.sessionId, page, `${application.name} is already disabled.`);
    if (params.confirm !== 'disable') return confirmPage(reply, ctx, application, 'disable');
    const grants = await countLiveGrants(db, { applicationId: application.id }, { cap: GRANT_COUNT_CAP });
    await updateApplication(db, application, { disabled: true }, changeOptions(ctx));
    return redirectWithNotice(reply, config, ctx.session.sessionId, page, `Disabled ${application.name}: its tokens stopped working, and its ${count(grants, 'grant', 'grants', GRANT_COUNT_CAP)} ${grants === 1 ? 'is' : 'are'} being revoked.`);
  });

  app.post<{ Params: { clientId: string } }>('/dashboard/applications/:clientId/delete', async (req, reply) => {
    const { ctx, application, params } = await managedApplication(req);
    if (params.confirm !== 'delete') return confirmPage(reply, ctx, application, 'delete');
    const grants = await countLiveGrants(db, { applicationId: application.id }, { cap: GRANT_COUNT_CAP });
    await deleteApplication(db, application, changeOptions(ctx));
    return redirectWithNotice(
      reply,
      config,
      ctx.session.sessionId,
      '/dashboard/applications',
      `Deleted ${application.name}: its client ID and secret are refused and its tokens stopped working; its ${count(grants, 'grant', 'grants', GRANT_COUNT_CAP)} ${grants === 1 ? 'is' : 'are'} being revoked.`,
    );
  });
}

/** The security form's fields, as shown and as sent. */
interface SecurityForm {
  method: string;
  jwks: string;
  jwksUri: string;
  dpop: boolean;
  par: boolean;
  idTokenAlg: string;
  fapi2: boolean;
}

function securityFormOf(application: Application): SecurityForm {
  return {
    method: application.token_endpoint_auth_method,
    jwks: application.jwks ? JSON.stringify(application.jwks, null, 2) : '',
    jwksUri: application.jwks_uri ?? '',
    dpop: application.dpop_bound_access_tokens,
    par: application.require_pushed_authorization_requests,
    idTokenAlg: application.id_token_signed_response_alg,
    fapi2: application.fapi2,
  };
}
