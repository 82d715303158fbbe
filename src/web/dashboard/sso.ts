/**
 * The Single sign-on page (/dashboard/sso): the organization's own identity providers (OpenID
 * Connect and SAML connections, src/sso/connections.ts) and the email domains it claims
 * (src/sso/domains.ts). sso.read shows it all; sso.write adds the forms. Connection ids and
 * domains from URLs are always looked up within the current organization (another
 * organization's is a 404), and every change is audited with the acting member and their role.
 *
 * Changes answer 303 back to the page, which then says what they did (notice.ts), at the
 * connection they are about (`#connection-`; `?created=` shows a new connection's URLs to register
 * at the provider); a change the domain layer refuses is shown on the page, with what was typed,
 * at the status of the refusal. Deleting a connection or a domain first answers a page saying what
 * will stop working, whose form sends the same POST again with `confirm`.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { listRoles, mayAssign } from '../../accounts/roles.js';
import type { Config } from '../../config.js';
import { type AppError, ConflictError, ForbiddenError, InvalidRequestError, NotFoundError } from '../../errors.js';
import type { Params } from '../../oauth/helpers/params.js';
import {
  type ConnectionActor,
  connectionSettings,
  type ConnectionView,
  createConnection,
  DEFAULT_OIDC_SCOPES,
  deleteConnection,
  getConnection,
  listConnections,
  MAX_SAML_CERTIFICATES,
  updateConnection,
} from '../../sso/connections.js';
import { addDomain, deleteDomain, type DomainView, getDomain, listDomains, txtLookup, updateDomain, verifyDomain } from '../../sso/domains.js';
import { renderPage } from '../render.js';
import type { DashboardDeps } from './applications.js';
import { type ActionContext, dashboardContext, type DashboardContext, parseId, readForm, requireAction, requireView } from './context.js';
import { redirectWithNotice } from './notice.js';

export const SSO_PATH = '/dashboard/sso';
/** A pasted IdP metadata document may be up to 512 KiB (readIdpMetadata); URL-encoded, up to three times that. */
const METADATA_FORM_LIMIT = 3 * 512 * 1024;
/** Certificates expiring within this many days are flagged on the page. */
const EXPIRY_WARNING_DAYS = 30;

/** The form fields' labels, for the domain layer's problems (reported under the API's field names). */
const FIELD_LABELS: Record<string, string> = {
  name: 'Name',
  state: 'State',
  jit: 'Just-in-time provisioning',
  default_role: 'Default role',
  issuer: 'Issuer URL',
  client_id: 'Client ID',
  client_secret: 'Client secret',
  scopes: 'Scopes',
  idp_entity_id: 'IdP entity ID',
  idp_sso_url: 'SSO URL',
  idp_certificates: 'Certificates',
  idp_metadata_xml: 'Metadata XML',
  idp_initiated: 'IdP-initiated sign-in',
  protocol: 'Protocol',
  domain: 'Domain',
  group_roles: 'Group mappings',
};

function fieldLabel(path: string): string {
  const [field = '', index] = path.split('.');
  const label = FIELD_LABELS[field] ?? field;
  return index !== undefined && /^[0-9]+$/.test(index) ? `${label} (number ${Number(index) + 1})` : label;
}

/** What to show for a refusal: each of an InvalidRequestError's details under its field's label, else its description. */
export function errorMessages(err: AppError): string[] {
  const details = err.details ?? [];
  if (details.length === 0) return [err.description];
  const [only] = details;
  // One problem whose description says more than its detail (a consumer domain, a metadata problem): the description, labelled.
  if (details.length === 1 && only && only.path !== '' && err.description.startsWith(`${only.path}: `)) {
    return [`${fieldLabel(only.path)}: ${err.description.slice(only.path.length + 2)}`];
  }
  return details.map((d) => (d.path === '' ? d.message : `${fieldLabel(d.path)}: ${d.message}`));
}

/** One or more PEM blocks (or one bare base64 certificate) from a textarea; undefined when it is empty. */
export function certificatesFromText(text: string | undefined): string[] | undefined {
  if (text === undefined || text.trim() === '') return undefined;
  const blocks = text.match(/-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g);
  // More than the maximum is passed on as it is, for the domain layer to refuse with its message.
  return blocks ?? [text.trim()];
}

const checked = (params: Params, name: string) => params[name] !== undefined;

/** The forms' fields, as typed (shown again when a change is refused). */
export interface OidcForm {
  name: string;
  issuer: string;
  clientId: string;
  scopes: string;
  jit: boolean;
  defaultRole: string;
}

export interface SamlForm {
  name: string;
  metadataXml: string;
  entityId: string;
  ssoUrl: string;
  certificates: string;
  jit: boolean;
  defaultRole: string;
  state: 'draft' | 'active';
}

export interface EditForm {
  name: string;
  jit: boolean;
  defaultRole: string;
  issuer: string;
  clientId: string;
  scopes: string;
  entityId: string;
  ssoUrl: string;
  certificates: string;
  metadataXml: string;
  idpInitiated: boolean;
  linksExisting: boolean;
}

const emptyOidc = (): OidcForm => ({ name: '', issuer: '', clientId: '', scopes: DEFAULT_OIDC_SCOPES, jit: true, defaultRole: 'member' });
const emptySaml = (): SamlForm => ({ name: '', metadataXml: '', entityId: '', ssoUrl: '', certificates: '', jit: true, defaultRole: 'member', state: 'active' });

function editFormOf(c: ConnectionView): EditForm {
  return {
    name: c.name,
    jit: c.jit,
    defaultRole: c.default_role,
    issuer: c.issuer ?? '',
    clientId: c.client_id ?? '',
    scopes: c.scopes ?? '',
    entityId: c.idp_entity_id ?? '',
    ssoUrl: c.idp_sso_url ?? '',
    certificates: '',
    metadataXml: '',
    idpInitiated: c.idp_initiated ?? false,
    linksExisting: c.links_existing_accounts,
  };
}

/** What a change of a connection's state says, once it is done. */
export const STATE_NOTICES: Record<'active' | 'draft' | 'disabled', (name: string) => string> = {
  active: (name) => `Connection ${name} is active: people can sign in through it.`,
  draft: (name) => `Connection ${name} is a draft now: nobody can sign in through it, and everyone who had signed in through it was signed out.`,
  disabled: (name) => `Connection ${name} is disabled: everyone who had signed in through it was signed out.`,
};

/** What a new connection's page says, above the URLs to register. */
export const createdNotice = (name: string) => `Connection ${name} created. Register the URLs below at your identity provider.`;

/** The state a form asks for, or an InvalidRequestError. */
export function stateFromForm(params: Params): 'active' | 'draft' | 'disabled' {
  const state = params.state;
  if (state !== 'active' && state !== 'draft' && state !== 'disabled') throw new InvalidRequestError('Choose active, draft or disabled.');
  return state;
}

/**
 * Runs a change; a refusal the person can act on (a bad field, a conflict, a role that may not do
 * it, another organization's thing) goes to `show`, with its status and what to say.
 */
export async function showingRefusals<T>(change: () => Promise<T>, show: (status: number, errors: string[]) => Promise<T>): Promise<T> {
  try {
    return await change();
  } catch (err) {
    if (err instanceof InvalidRequestError || err instanceof ConflictError || err instanceof ForbiddenError || err instanceof NotFoundError) {
      return show(err.statusCode, errorMessages(err));
    }
    throw err;
  }
}

/**
 * The creation forms' fields as typed (`form`, shown again when refused) and what createConnection
 * is given. `chooseRole: false` (a setup link's page): the default role is not the form's to set,
 * whatever it sends, and stays the domain's default.
 */
export function creationFromForm(params: Params, options: { chooseRole: boolean }): { form: { oidc: OidcForm } | { saml: SamlForm }; input: Record<string, unknown> } {
  const role = options.chooseRole && params.default_role !== undefined ? { default_role: params.default_role } : {};
  if (params.protocol === 'oidc') {
    const oidc: OidcForm = {
      name: params.name ?? '',
      issuer: params.issuer ?? '',
      clientId: params.client_id ?? '',
      scopes: params.oidc_scopes ?? '',
      jit: checked(params, 'jit'),
      defaultRole: params.default_role ?? '',
    };
    const input = {
      protocol: 'oidc',
      name: oidc.name,
      issuer: oidc.issuer,
      client_id: oidc.clientId,
      client_secret: params.client_secret ?? '',
      ...(params.oidc_scopes === undefined ? {} : { scopes: params.oidc_scopes }),
      jit: oidc.jit,
      ...role,
    };
    return { form: { oidc }, input };
  }
  if (params.protocol === 'saml') {
    const saml: SamlForm = {
      name: params.name ?? '',
      metadataXml: params.idp_metadata_xml ?? '',
      entityId: params.idp_entity_id ?? '',
      ssoUrl: params.idp_sso_url ?? '',
      certificates: params.idp_certificates ?? '',
      jit: checked(params, 'jit'),
      defaultRole: params.default_role ?? '',
      state: params.state === 'draft' ? 'draft' : 'active',
    };
    const certificates = certificatesFromText(params.idp_certificates);
    const input = {
      protocol: 'saml',
      name: saml.name,
      ...(params.idp_metadata_xml === undefined ? {} : { idp_metadata_xml: params.idp_metadata_xml }),
      ...(params.idp_entity_id === undefined ? {} : { idp_entity_id: params.idp_entity_id }),
      ...(params.idp_sso_url === undefined ? {} : { idp_sso_url: params.idp_sso_url }),
      ...(certificates === undefined ? {} : { idp_certificates: certificates }),
      jit: saml.jit,
      ...role,
      state: params.state ?? 'active',
    };
    return { form: { saml }, input };
  }
  throw new InvalidRequestError('Choose OpenID Connect or SAML.');
}

/**
 * An edit form's fields as typed and what updateConnection is given for connection `c`. Only an
 * owner's form says whether it links existing accounts; `chooseRole: false` leaves the default role alone.
 */
export function editFromForm(params: Params, c: ConnectionView, options: { owner: boolean; chooseRole: boolean }): { form: EditForm; input: Record<string, unknown> } {
  const form: EditForm = {
    name: params.name ?? '',
    jit: checked(params, 'jit'),
    defaultRole: (options.chooseRole ? params.default_role : undefined) ?? c.default_role,
    issuer: params.issuer ?? '',
    clientId: params.client_id ?? '',
    scopes: params.oidc_scopes ?? '',
    entityId: params.idp_entity_id ?? '',
    ssoUrl: params.idp_sso_url ?? '',
    certificates: params.idp_certificates ?? '',
    metadataXml: params.idp_metadata_xml ?? '',
    idpInitiated: checked(params, 'idp_initiated'),
    linksExisting: checked(params, 'links_existing_accounts'),
  };
  const input: Record<string, unknown> = { name: form.name, jit: form.jit };
  // Only an owner vouches for a connection (the checkbox is theirs alone).
  if (options.owner) input.links_existing_accounts = form.linksExisting;
  // The default role only when changed: changing it is for those who could give both the old and the new one.
  if (form.defaultRole !== c.default_role) input.default_role = form.defaultRole;
  if (c.protocol === 'oidc') {
    Object.assign(input, { issuer: form.issuer, client_id: form.clientId, scopes: form.scopes });
    // Blank keeps the current secret (it is never shown).
    if (params.client_secret !== undefined) input.client_secret = params.client_secret;
  } else {
    input.idp_initiated = form.idpInitiated;
    const certificates = certificatesFromText(params.idp_certificates);
    if (certificates !== undefined) input.idp_certificates = certificates;
    if (params.idp_metadata_xml !== undefined) {
      // Pasted metadata gives the entity ID, SSO URL and certificates; what was changed beside it wins.
      input.idp_metadata_xml = params.idp_metadata_xml;
      if (params.idp_entity_id !== undefined && params.idp_entity_id !== c.idp_entity_id) input.idp_entity_id = params.idp_entity_id;
      if (params.idp_sso_url !== undefined && params.idp_sso_url !== c.idp_sso_url) input.idp_sso_url = params.idp_sso_url;
    } else {
      Object.assign(input, { idp_entity_id: form.entityId, idp_sso_url: form.ssoUrl });
    }
  }
  return { form, input };
}

/**
 * The connections partial's list (sso-connections.eta): each connection with its certificates'
 * expiry flags, its edit form (as typed when `edit` is it), the roles its form offers, and its
 * path under `base`.
 */
export function connectionsForPage(connections: ConnectionView[], options: { base: string; roles: string[]; edit?: { id: number; form: EditForm } | undefined }) {
  const now = Date.now();
  return connections.map((c) => ({
    ...c,
    certificates: (c.idp_certificates ?? []).map((cert) => {
      const expires = Date.parse(cert.not_after);
      return { ...cert, expired: expires <= now, expiresSoon: expires > now && expires - now < EXPIRY_WARNING_DAYS * 86_400_000 };
    }),
    form: options.edit?.id === c.id ? options.edit.form : editFormOf(c),
    // A default role the user's role could not give is theirs to see, not to change (the domain refuses it).
    roleChoices: options.roles.includes(c.default_role) ? options.roles : [c.default_role, ...options.roles],
    path: `${options.base}/connections/${c.id}`,
  }));
}

/** The domains partial's list (sso-domains.eta): each domain with its path under `base` and its anchor. */
export function domainsForPage(domains: DomainView[], base: string) {
  return domains.map((d) => ({ ...d, path: `${base}/domains/${encodeURIComponent(d.domain)}`, anchor: `domain-${d.id}` }));
}

/** The empty creation forms (new OpenID Connect and SAML connections). */
export function emptyForms(): { oidcForm: OidcForm; samlForm: SamlForm } {
  return { oidcForm: emptyOidc(), samlForm: emptySaml() };
}

interface PageView {
  errors?: string[];
  oidc?: OidcForm;
  saml?: SamlForm;
  domain?: string;
  edit?: { id: number; form: EditForm };
  /** A connection just created: its URLs to register at the provider, prominently. */
  createdId?: number | undefined;
}

export async function ssoRoutes(app: FastifyInstance, deps: DashboardDeps): Promise<void> {
  const { db, config } = deps;
  const settings = connectionSettings(config);
  const lookup = txtLookup(config.dnsServers);

  async function render(reply: FastifyReply, ctx: DashboardContext, status = 200, view: PageView = {}) {
    requireView(ctx, 'sso.read');
    const organization = ctx.organization;
    const connections = organization ? await listConnections(db, settings, organization.id) : [];
    const domains = organization ? await listDomains(db, organization.id) : [];
    const manage = ctx.can['sso.write'];
    const access = organization?.access;
    // The roles a connection may give its members: never owner, and only those the user's own role could give.
    const roles = organization && manage && access ? (await listRoles(db, organization.id)).filter((r) => r.kind !== 'owner' && mayAssign(access, r)).map((r) => r.name) : [];
    return renderPage(reply, status, 'dashboard/sso', {
      title: 'Single sign-on',
      ctx,
      active: 'sso',
      manage,
      owner: access?.kind === 'owner',
      // The partials' settings: the forms post here, offer roles, delete and require SSO.
      base: SSO_PATH,
      chooseRole: true,
      deletable: true,
      ssoRequired: true,
      connections: connectionsForPage(connections, { base: SSO_PATH, roles, edit: view.edit }),
      // Just created: its URLs, prominently, to register at the provider (only this organization's).
      created: view.createdId === undefined ? undefined : connections.find((c) => c.id === view.createdId),
      domains: domainsForPage(domains, SSO_PATH),
      roles,
      oidcForm: view.oidc ?? emptyOidc(),
      samlForm: view.saml ?? emptySaml(),
      domainForm: view.domain ?? '',
      maxCertificates: MAX_SAML_CERTIFICATES,
      errors: view.errors ?? [],
      editing: view.edit?.id,
    });
  }

  const by = (ctx: ActionContext): ConnectionActor => ({ actor: { actorUserId: ctx.session.userId }, actingAs: ctx.organization.access });
  const actor = (ctx: ActionContext) => ({ actorUserId: ctx.session.userId });

  /** Where a change sends the browser: the page, at the part it is about, saying `notice`. */
  function done(reply: FastifyReply, ctx: ActionContext, notice: string, about: { connection?: number; created?: boolean; domain?: number } = {}) {
    const query = about.created && about.connection !== undefined ? `?created=${about.connection}` : '';
    const anchor = about.connection !== undefined ? `#connection-${about.connection}` : about.domain !== undefined ? `#domain-${about.domain}` : '';
    return redirectWithNotice(reply, config, ctx.session.sessionId, `${SSO_PATH}${query}${anchor}`, notice);
  }

  /** Runs a change; a refusal the user can act on is shown on the page (with `view`: what they typed), at its status. */
  function attempt(reply: FastifyReply, ctx: ActionContext, view: PageView, change: () => Promise<FastifyReply>) {
    return showingRefusals(change, (status, errors) => render(reply, ctx, status, { ...view, errors }));
  }

  app.get<{ Querystring: { created?: unknown } }>(SSO_PATH, async (req, reply) => render(reply, dashboardContext(req), 200, { createdId: parseId(req.query.created) }));

  // Connections.

  app.post(`${SSO_PATH}/connections`, { bodyLimit: METADATA_FORM_LIMIT }, async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'sso.write' });
    const { form, input } = creationFromForm(params, { chooseRole: true });
    return attempt(reply, ctx, form, async () => {
      const created = await createConnection(db, settings, ctx.organization.id, input, by(ctx));
      return done(reply, ctx, createdNotice(created.name), { connection: created.id, created: true });
    });
  });

  /** The connection named in the URL, for someone who manages SSO; another organization's is a 404. */
  async function managedConnection(req: FastifyRequest<{ Params: { id: string } }>) {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'sso.write' });
    const id = parseId(req.params.id);
    if (id === undefined) throw new NotFoundError('There is no such SSO connection in this organization.');
    const connection = await getConnection(db, settings, ctx.organization.id, id);
    return { ctx, params, connection };
  }

  app.post<{ Params: { id: string } }>(`${SSO_PATH}/connections/:id`, { bodyLimit: METADATA_FORM_LIMIT }, async (req, reply) => {
    const { ctx, params, connection: c } = await managedConnection(req);
    const { form, input } = editFromForm(params, c, { owner: ctx.organization.access.kind === 'owner', chooseRole: true });
    return attempt(reply, ctx, { edit: { id: c.id, form } }, async () => {
      const saved = await updateConnection(db, settings, ctx.organization.id, c.id, input, by(ctx));
      return done(reply, ctx, `Connection ${saved.name} saved.`, { connection: c.id });
    });
  });

  app.post<{ Params: { id: string } }>(`${SSO_PATH}/connections/:id/state`, async (req, reply) => {
    const { ctx, params, connection: c } = await managedConnection(req);
    const state = stateFromForm(params);
    return attempt(reply, ctx, {}, async () => {
      // Leaving active ends every session signed in through the connection (the domain does it in the same transaction).
      await updateConnection(db, settings, ctx.organization.id, c.id, { state }, by(ctx));
      return done(reply, ctx, STATE_NOTICES[state](c.name), { connection: c.id });
    });
  });

  app.post<{ Params: { id: string } }>(`${SSO_PATH}/connections/:id/delete`, async (req, reply) => {
    const { ctx, params, connection: c } = await managedConnection(req);
    if (params.confirm !== 'delete') {
      requireView(ctx, 'sso.read');
      return renderPage(reply, 200, 'dashboard/sso-delete', { title: `Delete ${c.name}`, ctx, active: 'sso', connection: c, path: `${SSO_PATH}/connections/${c.id}` });
    }
    return attempt(reply, ctx, {}, async () => {
      await deleteConnection(db, ctx.organization.id, c.id, by(ctx));
      return done(reply, ctx, `Deleted the connection ${c.name}: nobody can sign in through it any more, and everyone who had signed in through it was signed out.`);
    });
  });

  // Domains, named in URLs by their name.

  app.post(`${SSO_PATH}/domains`, async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'sso.write' });
    const domain = params.domain ?? '';
    return attempt(reply, ctx, { domain }, async () => {
      const added = await addDomain(db, ctx.organization.id, { domain }, actor(ctx));
      return done(reply, ctx, `${added.domain} was added. Publish its TXT record (below), then verify it.`, { domain: added.id });
    });
  });

  function managedDomain(req: FastifyRequest<{ Params: { domain: string } }>) {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'sso.write' });
    return { ctx, params, domain: req.params.domain };
  }

  app.post<{ Params: { domain: string } }>(`${SSO_PATH}/domains/:domain/verify`, async (req, reply) => {
    const { ctx, domain } = managedDomain(req);
    // A failed lookup (no record, the wrong token, DNS trouble) is a DomainVerificationFailedError: shown on the page.
    return attempt(reply, ctx, {}, async () => {
      const verified = await verifyDomain(db, lookup, ctx.organization.id, domain, actor(ctx));
      return done(reply, ctx, `${verified.domain} is verified.`, { domain: verified.id });
    });
  });

  app.post<{ Params: { domain: string } }>(`${SSO_PATH}/domains/:domain/sso-required`, async (req, reply) => {
    const { ctx, params, domain } = managedDomain(req);
    if (params.sso_required !== 'yes' && params.sso_required !== 'no') throw new InvalidRequestError('Choose on or off.');
    const ssoRequired = params.sso_required === 'yes';
    return attempt(reply, ctx, {}, async () => {
      // Only a verified domain routes anyone to the identity provider: requiring SSO before would mean nothing yet.
      const current = await getDomain(db, ctx.organization.id, domain);
      if (ssoRequired && current.state !== 'verified') throw new InvalidRequestError(`Verify ${current.domain} before requiring single sign-on for it.`);
      const updated = await updateDomain(db, ctx.organization.id, domain, { sso_required: ssoRequired }, actor(ctx));
      const notice = ssoRequired ? `Single sign-on is now required for addresses at ${updated.domain}.` : `Single sign-on is no longer required for addresses at ${updated.domain}.`;
      return done(reply, ctx, notice, { domain: updated.id });
    });
  });

  app.post<{ Params: { domain: string } }>(`${SSO_PATH}/domains/:domain/delete`, async (req, reply) => {
    const { ctx, params, domain } = managedDomain(req);
    // The page tells about the domain: for those who may see the page.
    if (params.confirm !== 'delete') requireView(ctx, 'sso.read');
    return attempt(reply, ctx, {}, async () => {
      const current = await getDomain(db, ctx.organization.id, domain);
      if (params.confirm !== 'delete') {
        return renderPage(reply, 200, 'dashboard/sso-domain-delete', {
          title: `Remove ${current.domain}`,
          ctx,
          active: 'sso',
          domain: current,
          path: `${SSO_PATH}/domains/${encodeURIComponent(current.domain)}`,
          cancel: `${SSO_PATH}#domain-${current.id}`,
        });
      }
      await deleteDomain(db, ctx.organization.id, domain, actor(ctx));
      const routed = current.state === 'verified' ? ': addresses there are no longer sent to your identity provider' : '';
      return done(reply, ctx, `Removed the domain ${current.domain}${routed}.`);
    });
  });
}
