/**
 * The pages a setup link opens (accounts/setup-links.ts): `/setup/<token>` and, under it, one page
 * per feature the link holds — `domains` (add, see the TXT record, verify, remove), `sso` (create
 * and edit OpenID Connect and SAML connections, see the URLs the IdP needs, activate them) and
 * `directory` (create a SCIM directory and see its base URL and token once, list them, rotate a
 * token). Nothing else of the organization, and no membership: the dashboard and the API stay
 * closed to whoever holds the link.
 *
 * Every request looks the link up again (not expired, not revoked, its creator still an owner);
 * a dead or unknown link is a 404 page, a feature the link lacks a 403. Signed out, a GET goes to
 * sign in (or sign up, from there) and comes back; a POST is a 403. What the organization requires
 * of a session (SS-4, two-step sign-in) it requires of the link's holder too. Forms carry the
 * session's CSRF token as the dashboard's do; changes answer 303 back with a notice, except
 * those whose answer holds a directory's token (shown once: 201/200, never a redirect). The
 * domain and connection forms are the dashboard's own (views/dashboard/sso-*.eta, the form
 * readers of dashboard/sso.ts), without what a link does not give: roles, SSO required, deletion
 * of connections; so are the directory's token box, list and form (views/dashboard/directory-*.eta,
 * directories-table.eta, the shapes of dashboard/directories.ts), without roles or deletion. Every change is audited with the user and the link (Actor.setupLinkId). The
 * token in the path is masked in the logs (logger.ts), and pages send no Referer (render.ts).
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { sessionShortfall } from '../accounts/organization-access.js';
import { CSRF_FAILED, csrfToken, csrfTokenMatches, currentUser, type SessionUser } from '../accounts/sessions.js';
import {
  findLiveSetupLink,
  type LiveSetupLink,
  SETUP_FEATURE_NAMES,
  SETUP_LINK_ROLE,
  SETUP_PATH,
  type SetupFeature,
  ssoRequiredFor,
  touchSetupLink,
} from '../accounts/setup-links.js';
import type { Actor } from '../audit/events.js';
import type { Config } from '../config.js';
import type { DB } from '../db/connect.js';
import { createDirectory, type DirectoryView, listDirectories, rotateDirectoryToken } from '../directory/directories.js';
import { ForbiddenError, NotFoundError } from '../errors.js';
import { type Params } from '../oauth/helpers/params.js';
import { connectionSettings, createConnection, getConnection, listConnections, MAX_SAML_CERTIFICATES, updateConnection } from '../sso/connections.js';
import { addDomain, deleteDomain, getDomain, listDomains, txtLookup, verifyDomain } from '../sso/domains.js';
import { parseId, readForm } from './dashboard/context.js';
import { directoriesForPage, tokenForPage } from './dashboard/directories.js';
import { redirectWithNotice, takeNotice } from './dashboard/notice.js';
import {
  connectionsForPage,
  createdNotice,
  creationFromForm,
  domainsForPage,
  type EditForm,
  editFromForm,
  emptyForms,
  type OidcForm,
  type SamlForm,
  showingRefusals,
  STATE_NOTICES,
  stateFromForm,
} from './dashboard/sso.js';
import { renderPage, setUpPages } from './render.js';
import { answerShortfall } from './shortfall.js';
import { loginPath } from './sign-in.js';

const BAD_LINK = 'This setup link does not work: it has expired or was revoked. Ask whoever sent it to you for a new one.';
/** As on the dashboard's Single sign-on page: a pasted IdP metadata document may be up to 512 KiB, URL-encoded up to three times that. */
const METADATA_FORM_LIMIT = 3 * 512 * 1024;

/** What every request through a live link has: the link, the signed-in person, and where its pages are. */
interface SetupContext {
  link: LiveSetupLink;
  session: SessionUser;
  /** `/setup/<token>`: the link's pages and forms are under it. */
  base: string;
  csrfToken: string;
  notice: string;
  /** Who acts, for the audit log: the person, through the link. */
  actor: Actor;
}

type TokenParams = { token: string };

export async function setupPages(app: FastifyInstance, deps: { db: DB; config: Config }): Promise<void> {
  const { db, config } = deps;
  await setUpPages(app, config);
  const settings = connectionSettings(config);
  const lookup = txtLookup(config.dnsServers);
  const by = (ctx: SetupContext) => ({ actor: ctx.actor, actingAs: SETUP_LINK_ROLE });
  const contexts = new WeakMap<FastifyRequest, SetupContext>();

  // Every route: the link (live), the person (signed in, as the organization requires), the CSRF token of a form.
  app.addHook('preHandler', async (req, reply) => {
    const { token } = req.params as Partial<TokenParams>;
    const link = typeof token === 'string' ? await findLiveSetupLink(db, token) : undefined;
    if (!token || !link) throw new NotFoundError(BAD_LINK);
    const base = `${SETUP_PATH}/${token}`;
    const reading = req.method === 'GET' || req.method === 'HEAD';
    const session = await currentUser(db, config, req);
    if (!session) {
      // Signed out: sign in (or sign up, from the sign-in page), then back to the link's start.
      if (reading) return reply.redirect(loginPath(base), 303);
      throw new ForbiddenError(CSRF_FAILED);
    }
    const shortfall = sessionShortfall({ id: link.organizationId, requireMfa: link.requireMfa, ssoRequired: await ssoRequiredFor(db, link.organizationId, session.email) }, session);
    if (shortfall) return answerShortfall(db, req, reply, shortfall, link.organizationName, session);
    if (!reading) {
      const { params } = readForm(req.body);
      if (!csrfTokenMatches(config, { session: session.sessionId }, params.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
    }
    await touchSetupLink(db, link, session.userId);
    contexts.set(req, {
      link,
      session,
      base,
      csrfToken: csrfToken(config, { session: session.sessionId }),
      notice: reading ? takeNotice(req, reply, config, session.sessionId) : '',
      actor: { actorUserId: session.userId, setupLinkId: link.id },
    });
    return undefined;
  });

  /** The request's context, for a route of `feature`: a 403 when the link does not hold it. */
  function setupContext(req: FastifyRequest, feature: SetupFeature | null): SetupContext {
    const ctx = contexts.get(req);
    if (!ctx) throw new Error('setup route without its context');
    if (feature !== null && !ctx.link.features.includes(feature)) throw new ForbiddenError(`This setup link does not include ${SETUP_FEATURE_NAMES[feature]}.`);
    return ctx;
  }

  /** A page of `feature` (views/setup/<feature>.eta unless `view` says), in the link's layout. */
  function page(reply: FastifyReply, ctx: SetupContext, status: number, feature: SetupFeature, title: string, data: Record<string, unknown>, view = `setup/${feature}`) {
    return renderPage(reply, status, view, {
      title,
      // `ctx` as the dashboard's partials read it (the form's CSRF token, the notice).
      ctx: { csrfToken: ctx.csrfToken, notice: ctx.notice },
      setup: {
        organizationName: ctx.link.organizationName,
        email: ctx.session.email,
        expiresAt: ctx.link.expiresAt,
        features: ctx.link.features.map((f) => ({ value: f, name: SETUP_FEATURE_NAMES[f], href: `${ctx.base}/${f}` })),
        active: feature,
      },
      errors: [],
      ...data,
    });
  }

  const done = (reply: FastifyReply, ctx: SetupContext, location: string, notice: string) => redirectWithNotice(reply, config, ctx.session.sessionId, `${ctx.base}${location}`, notice);

  // The link's start: its first feature's page.
  app.get<{ Params: TokenParams }>(`${SETUP_PATH}/:token`, async (req, reply) => {
    const ctx = setupContext(req, null);
    return reply.redirect(`${ctx.base}/${ctx.link.features[0] ?? 'domains'}`, 303);
  });

  // Domains.

  async function domainsPage(reply: FastifyReply, ctx: SetupContext, status: number, view: { errors?: string[]; domain?: string } = {}) {
    const domains = await listDomains(db, ctx.link.organizationId);
    const data = { base: ctx.base, manage: true, ssoRequired: false, domains: domainsForPage(domains, ctx.base), domainForm: view.domain ?? '', errors: view.errors ?? [] };
    return page(reply, ctx, status, 'domains', 'Verify your domains', data);
  }

  app.get<{ Params: TokenParams }>(`${SETUP_PATH}/:token/domains`, async (req, reply) => domainsPage(reply, setupContext(req, 'domains'), 200));

  app.post<{ Params: TokenParams }>(`${SETUP_PATH}/:token/domains`, async (req, reply) => {
    const ctx = setupContext(req, 'domains');
    const domain = readForm(req.body).params.domain ?? '';
    return showingRefusals(
      async () => {
        const added = await addDomain(db, ctx.link.organizationId, { domain }, ctx.actor);
        return done(reply, ctx, `/domains#domain-${added.id}`, `${added.domain} was added. Publish its TXT record (below), then verify it.`);
      },
      (status, errors) => domainsPage(reply, ctx, status, { errors, domain }),
    );
  });

  app.post<{ Params: TokenParams & { domain: string } }>(`${SETUP_PATH}/:token/domains/:domain/verify`, async (req, reply) => {
    const ctx = setupContext(req, 'domains');
    return showingRefusals(
      async () => {
        const verified = await verifyDomain(db, lookup, ctx.link.organizationId, req.params.domain, ctx.actor);
        return done(reply, ctx, `/domains#domain-${verified.id}`, `${verified.domain} is verified.`);
      },
      (status, errors) => domainsPage(reply, ctx, status, { errors }),
    );
  });

  app.post<{ Params: TokenParams & { domain: string } }>(`${SETUP_PATH}/:token/domains/:domain/delete`, async (req, reply) => {
    const ctx = setupContext(req, 'domains');
    const confirmed = readForm(req.body).params.confirm === 'delete';
    return showingRefusals(
      async () => {
        const current = await getDomain(db, ctx.link.organizationId, req.params.domain);
        if (!confirmed) {
          // The dashboard's confirmation page, in the link's layout.
          const path = `${ctx.base}/domains/${encodeURIComponent(current.domain)}`;
          const data = { layout: '../setup/layout', domain: current, path, cancel: `${ctx.base}/domains#domain-${current.id}` };
          return page(reply, ctx, 200, 'domains', `Remove ${current.domain}`, data, 'dashboard/sso-domain-delete');
        }
        await deleteDomain(db, ctx.link.organizationId, req.params.domain, ctx.actor);
        return done(reply, ctx, '/domains', `Removed the domain ${current.domain}.`);
      },
      (status, errors) => domainsPage(reply, ctx, status, { errors }),
    );
  });

  // Single sign-on: the organization's connections, through the dashboard's forms without roles or deletion.

  interface SsoView {
    errors?: string[];
    oidc?: OidcForm;
    saml?: SamlForm;
    edit?: { id: number; form: EditForm };
    createdId?: number | undefined;
  }

  async function ssoPage(reply: FastifyReply, ctx: SetupContext, status: number, view: SsoView = {}) {
    const connections = await listConnections(db, settings, ctx.link.organizationId);
    const base = `${ctx.base}/sso`;
    const empty = emptyForms();
    const data = {
      base,
      manage: true,
      owner: false,
      chooseRole: false,
      deletable: false,
      roles: [],
      connections: connectionsForPage(connections, { base, roles: [], edit: view.edit }),
      created: view.createdId === undefined ? undefined : connections.find((c) => c.id === view.createdId),
      oidcForm: view.oidc ?? empty.oidcForm,
      samlForm: view.saml ?? empty.samlForm,
      maxCertificates: MAX_SAML_CERTIFICATES,
      editing: view.edit?.id,
      errors: view.errors ?? [],
    };
    return page(reply, ctx, status, 'sso', 'Connect your identity provider', data);
  }

  app.get<{ Params: TokenParams; Querystring: { created?: unknown } }>(`${SETUP_PATH}/:token/sso`, async (req, reply) =>
    ssoPage(reply, setupContext(req, 'sso'), 200, { createdId: parseId(req.query.created) }),
  );

  app.post<{ Params: TokenParams }>(`${SETUP_PATH}/:token/sso/connections`, { bodyLimit: METADATA_FORM_LIMIT }, async (req, reply) => {
    const ctx = setupContext(req, 'sso');
    const { form, input } = creationFromForm(readForm(req.body).params, { chooseRole: false });
    return showingRefusals(
      async () => {
        const created = await createConnection(db, settings, ctx.link.organizationId, input, by(ctx));
        return done(reply, ctx, `/sso?created=${created.id}#connection-${created.id}`, createdNotice(created.name));
      },
      (status, errors) => ssoPage(reply, ctx, status, { ...form, errors }),
    );
  });

  /** The connection named in the URL, of the link's organization only (another's is a 404), and the form. */
  async function linkedConnection(req: FastifyRequest<{ Params: TokenParams & { id: string } }>): Promise<{ ctx: SetupContext; params: Params; connection: Awaited<ReturnType<typeof getConnection>> }> {
    const ctx = setupContext(req, 'sso');
    const id = parseId(req.params.id);
    if (id === undefined) throw new NotFoundError('There is no such SSO connection in this organization.');
    return { ctx, params: readForm(req.body).params, connection: await getConnection(db, settings, ctx.link.organizationId, id) };
  }

  app.post<{ Params: TokenParams & { id: string } }>(`${SETUP_PATH}/:token/sso/connections/:id`, { bodyLimit: METADATA_FORM_LIMIT }, async (req, reply) => {
    const { ctx, params, connection: c } = await linkedConnection(req);
    const { form, input } = editFromForm(params, c, { owner: false, chooseRole: false });
    return showingRefusals(
      async () => {
        const saved = await updateConnection(db, settings, ctx.link.organizationId, c.id, input, by(ctx));
        return done(reply, ctx, `/sso#connection-${c.id}`, `Connection ${saved.name} saved.`);
      },
      (status, errors) => ssoPage(reply, ctx, status, { edit: { id: c.id, form }, errors }),
    );
  });

  app.post<{ Params: TokenParams & { id: string } }>(`${SETUP_PATH}/:token/sso/connections/:id/state`, async (req, reply) => {
    const { ctx, params, connection: c } = await linkedConnection(req);
    const state = stateFromForm(params);
    return showingRefusals(
      async () => {
        await updateConnection(db, settings, ctx.link.organizationId, c.id, { state }, by(ctx));
        return done(reply, ctx, `/sso#connection-${c.id}`, STATE_NOTICES[state](c.name));
      },
      (status, errors) => ssoPage(reply, ctx, status, { errors }),
    );
  });

  // Directories: made with the organization's default role and no group mappings (roles are the organization's to give).

  async function directoryPage(reply: FastifyReply, ctx: SetupContext, status: number, view: { errors?: string[]; name?: string; token?: { made: { directory: DirectoryView; token: string }; rotated: boolean } } = {}) {
    const directories = await listDirectories(db, ctx.link.organizationId);
    const base = `${ctx.base}/directory/directories`;
    // The dashboard's partials, without roles or each directory's page: a token button in the list instead.
    const data = {
      detailed: false,
      rotate: true,
      directories: directoriesForPage(directories, { issuer: config.issuer, base }),
      token: view.token && tokenForPage(view.token.made, view.token.rotated, config.issuer),
      roles: [],
      createAction: base,
      createForm: { name: view.name ?? '', defaultRole: '' },
      errors: view.errors ?? [],
    };
    return page(reply, ctx, status, 'directory', 'Connect your directory (SCIM)', data);
  }

  app.get<{ Params: TokenParams }>(`${SETUP_PATH}/:token/directory`, async (req, reply) => directoryPage(reply, setupContext(req, 'directory'), 200));

  app.post<{ Params: TokenParams }>(`${SETUP_PATH}/:token/directory/directories`, async (req, reply) => {
    const ctx = setupContext(req, 'directory');
    const name = readForm(req.body).params.name ?? '';
    return showingRefusals(
      async () => {
        const made = await createDirectory(db, ctx.link.organizationId, { name }, ctx.actor);
        // The token exists in plaintext only in this answer (no-store, never a redirect).
        return directoryPage(reply, ctx, 201, { token: { made, rotated: false } });
      },
      (status, errors) => directoryPage(reply, ctx, status, { errors, name }),
    );
  });

  app.post<{ Params: TokenParams & { id: string } }>(`${SETUP_PATH}/:token/directory/directories/:id/rotate-token`, async (req, reply) => {
    const ctx = setupContext(req, 'directory');
    const id = parseId(req.params.id);
    return showingRefusals(
      async () => {
        if (id === undefined) throw new NotFoundError('directory not found');
        const rotated = await rotateDirectoryToken(db, ctx.link.organizationId, id, ctx.actor);
        return directoryPage(reply, ctx, 200, { token: { made: rotated, rotated: true } });
      },
      (status, errors) => directoryPage(reply, ctx, status, { errors }),
    );
  });
}
