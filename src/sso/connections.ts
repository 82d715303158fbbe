/**
 * An organization's own identity providers: OpenID Connect providers (orgauth is their relying
 * party, sso/oidc-upstream.ts) and SAML 2.0 IdPs (orgauth is their service provider,
 * sso/saml-sp.ts). Every query takes the organization; the client secret is sealed at rest and
 * never leaves the server; every change is audited.
 */
import { X509Certificate } from 'node:crypto';
import { sql } from 'kysely';
import { z } from 'zod';
import { type Actor, recordAuditEvent } from '../audit/events.js';
import type { Config } from '../config.js';
import { type DB, inTransaction } from '../db/connect.js';
import { isForeignKeyViolation } from '../db/errors.js';
import type { SsoConnection, SsoConnectionState, SsoProtocol } from '../db/schema.js';
import { ForbiddenError, InvalidRequestError, NotFoundError } from '../errors.js';
import { sealText } from '../lib/crypto.js';
import { enforceSsoRequired } from './domains.js';
import { parseUntrustedXml } from './xml.js';
import { isWellFormed, parseInput } from '../lib/validate.js';
import { lockRole, mayAssign, requireRole, type RoleRef, roleOf } from '../accounts/roles.js';

export const CONNECTION_STATES: readonly SsoConnectionState[] = ['draft', 'active', 'disabled'];
/** Connections per organization (one per identity provider; a few more while one replaces another). */
export const MAX_CONNECTIONS = 20;
export const MAX_SAML_CERTIFICATES = 5;
export const DEFAULT_OIDC_SCOPES = 'openid email profile';
/** The purpose the client secret is sealed under (lib/crypto.ts sealText). */
export const CLIENT_SECRET_PURPOSE = 'sso-client-secret';

/** What a connection needs to know of the instance: where it is, its key, whether plain http is allowed (development). */
export interface ConnectionSettings {
  issuer: string;
  secretKey: string;
  allowHttp: boolean;
}

/** The settings from the configuration (the API, the dashboard and the CLI alike). */
export function connectionSettings(config: Pick<Config, 'issuer' | 'secretKey' | 'outbound'>): ConnectionSettings {
  return { issuer: config.issuer, secretKey: config.secretKey, allowHttp: config.outbound.allowHttp };
}

/** The URLs orgauth has for a connection: what the organization's admin registers at their provider. */
export function connectionUrls(issuer: string, id: number) {
  const base = `${issuer}/sso/${id}`;
  return { redirect_uri: `${base}/oidc/callback`, entity_id: `${base}/saml/metadata`, acs_url: `${base}/saml/acs`, metadata_url: `${base}/saml/metadata` };
}

export interface CertificateView {
  subject: string;
  fingerprint_sha256: string;
  not_after: string;
}

/** A connection as the dashboard, the API and the CLI show it: never the client secret. */
export interface ConnectionView {
  id: number;
  organization_id: number;
  protocol: SsoProtocol;
  name: string;
  state: SsoConnectionState;
  jit: boolean;
  default_role: string;
  /** Whether it links an existing account by its verified email without the account's proof (set by an owner or the operator). */
  links_existing_accounts: boolean;
  created_at: Date;
  updated_at: Date;
  /** OIDC: the upstream issuer, the client orgauth is there, and the callback to register. */
  issuer?: string;
  client_id?: string;
  scopes?: string;
  redirect_uri?: string;
  /** SAML: the IdP, and orgauth's service provider for it. */
  idp_entity_id?: string;
  idp_sso_url?: string;
  idp_certificates?: CertificateView[];
  idp_initiated?: boolean;
  entity_id?: string;
  acs_url?: string;
  metadata_url?: string;
}

export type ConnectionRow = SsoConnection & { role_name: string | null; role_permissions: string[] | null };

export function connectionView(issuer: string, row: ConnectionRow): ConnectionView {
  const common = {
    id: row.id,
    organization_id: row.organization_id,
    protocol: row.protocol,
    name: row.name,
    state: row.state,
    jit: row.jit,
    default_role: defaultRoleOf(row).name,
    links_existing_accounts: row.links_existing_accounts,
    created_at: row.created_at,
    updated_at: row.updated_at,
  };
  const urls = connectionUrls(issuer, row.id);
  if (row.protocol === 'oidc') {
    return { ...common, issuer: row.oidc_issuer ?? '', client_id: row.oidc_client_id ?? '', scopes: row.oidc_scopes ?? DEFAULT_OIDC_SCOPES, redirect_uri: urls.redirect_uri };
  }
  return {
    ...common,
    idp_entity_id: row.saml_idp_entity_id ?? '',
    idp_sso_url: row.saml_idp_sso_url ?? '',
    idp_certificates: row.saml_idp_certificates.map(certificateView),
    idp_initiated: row.saml_idp_initiated,
    entity_id: urls.entity_id,
    acs_url: urls.acs_url,
    metadata_url: urls.metadata_url,
  };
}

/** The role a connection gives the members it provisions. */
export function defaultRoleOf(row: Pick<ConnectionRow, 'default_role' | 'default_role_id' | 'role_name' | 'role_permissions'>): RoleRef {
  return roleOf({ role: row.default_role, role_id: row.default_role_id, role_name: row.role_name, role_permissions: row.role_permissions });
}

function certificateView(pem: string): CertificateView {
  const cert = new X509Certificate(pem);
  return { subject: cert.subject.replace(/\n/g, ', '), fingerprint_sha256: cert.fingerprint256, not_after: new Date(cert.validTo).toISOString() };
}

/** A PEM certificate from PEM or bare base64 DER (as IdP metadata and admin consoles give it); an issue message when it is not one. */
export function normalizeCertificate(input: string): string | undefined {
  const body = input.replace(/-----(BEGIN|END) CERTIFICATE-----/g, '').replace(/\s+/g, '');
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(body) || body.length > 16_384) return undefined;
  const pem = `-----BEGIN CERTIFICATE-----\n${body.match(/.{1,64}/g)?.join('\n') ?? ''}\n-----END CERTIFICATE-----\n`;
  try {
    new X509Certificate(pem);
    return pem;
  } catch {
    return undefined;
  }
}

const SAML_MD = 'urn:oasis:names:tc:SAML:2.0:metadata';
const XMLDSIG = 'http://www.w3.org/2000/09/xmldsig#';
const REDIRECT_BINDING = 'urn:oasis:names:tc:SAML:2.0:bindings:HTTP-Redirect';

/**
 * Reads an IdP's metadata XML (what Okta, Entra ID and Google Workspace offer to download): its
 * entity ID, its HTTP-Redirect SSO URL and its signing certificates. Only read, never trusted
 * further than what an admin would type: the admin who pastes it is the one vouching for it.
 */
export function readIdpMetadata(xml: string): { idp_entity_id: string; idp_sso_url: string; idp_certificates: string[] } {
  const fail = (message: string) => new InvalidRequestError(`idp_metadata_xml: ${message}`, { details: [{ path: 'idp_metadata_xml', message }] });
  if (xml.length > 512 * 1024) throw fail('must be at most 512 KiB');
  const parsed = parseUntrustedXml(xml);
  if ('refused' in parsed) throw fail(parsed.refused === 'doctype' ? 'must not contain a DOCTYPE' : 'is not well-formed XML');
  const root = parsed.root;
  const descriptor = root.localName === 'EntityDescriptor' && root.namespaceURI === SAML_MD ? root : undefined;
  if (!descriptor) throw fail('must be one EntityDescriptor');
  const idp = descriptor.getElementsByTagNameNS(SAML_MD, 'IDPSSODescriptor').item(0);
  if (!idp) throw fail('has no IDPSSODescriptor');
  const entityId = descriptor.getAttribute('entityID') ?? '';
  let ssoUrl = '';
  const services = idp.getElementsByTagNameNS(SAML_MD, 'SingleSignOnService');
  for (let i = 0; i < services.length; i++) {
    const service = services.item(i);
    if (service?.getAttribute('Binding') === REDIRECT_BINDING) ssoUrl = service.getAttribute('Location') ?? '';
  }
  if (ssoUrl === '') throw fail('has no SingleSignOnService with the HTTP-Redirect binding');
  const certificates: string[] = [];
  const keys = idp.getElementsByTagNameNS(SAML_MD, 'KeyDescriptor');
  for (let i = 0; i < keys.length; i++) {
    const key = keys.item(i);
    const use = key?.getAttribute('use');
    if (!key || (use !== null && use !== '' && use !== 'signing')) continue;
    const cert = key.getElementsByTagNameNS(XMLDSIG, 'X509Certificate').item(0)?.textContent ?? '';
    const pem = normalizeCertificate(cert);
    if (pem !== undefined && !certificates.includes(pem)) certificates.push(pem);
  }
  if (certificates.length === 0) throw fail('has no signing certificate');
  return { idp_entity_id: entityId, idp_sso_url: ssoUrl, idp_certificates: certificates.slice(0, MAX_SAML_CERTIFICATES) };
}

export const text = (max: number) => z.string().trim().min(1, 'must not be empty').max(max, `must be at most ${max} characters`).refine(isWellFormed, 'must be valid text');

export function urlField(allowHttp: boolean) {
  return text(2048).refine((v) => {
    if (!URL.canParse(v)) return false;
    const url = new URL(v);
    return (url.protocol === 'https:' || (allowHttp && url.protocol === 'http:')) && url.username === '' && url.password === '' && url.hash === '';
  }, allowHttp ? 'must be an http(s) URL without credentials or fragment' : 'must be an https URL without credentials or fragment');
}

const scopesField = text(1024)
  .refine((v) => v.split(/\s+/).includes('openid'), 'must include openid')
  .refine((v) => /^[\x21\x23-\x5b\x5d-\x7e]+( [\x21\x23-\x5b\x5d-\x7e]+)*$/.test(v.replace(/\s+/g, ' ')), 'must be space-separated scope names (RFC 6749 §3.3)')
  .transform((v) => [...new Set(v.split(/\s+/))].join(' '));

const certificatesField = z
  .array(z.string().max(16_384))
  .min(1, 'must hold at least one certificate')
  .max(MAX_SAML_CERTIFICATES, `must hold at most ${MAX_SAML_CERTIFICATES} certificates`)
  .transform((list, ctx) => {
    const pems: string[] = [];
    list.forEach((c, i) => {
      const pem = normalizeCertificate(c);
      if (pem === undefined) ctx.addIssue({ code: 'custom', path: [i], message: 'is not an X.509 certificate (PEM or base64 DER)' });
      else if (!pems.includes(pem)) pems.push(pem);
    });
    return pems;
  });

function fieldsSchema(allowHttp: boolean) {
  return z.object({
    name: text(100),
    state: z.enum(['draft', 'active', 'disabled']),
    jit: z.boolean(),
    default_role: text(100),
    issuer: urlField(allowHttp),
    client_id: text(512),
    client_secret: z.string().min(1, 'must not be empty').max(1024, 'must be at most 1024 characters').refine(isWellFormed, 'must be valid text'),
    scopes: scopesField,
    idp_entity_id: text(1024),
    idp_sso_url: urlField(allowHttp),
    idp_certificates: certificatesField,
    idp_metadata_xml: z.string().max(512 * 1024),
    idp_initiated: z.boolean(),
    links_existing_accounts: z.boolean(),
  });
}

export type ConnectionInput = Partial<z.input<ReturnType<typeof fieldsSchema>>> & { protocol?: string };

function createSchema(allowHttp: boolean) {
  const fields = fieldsSchema(allowHttp);
  return z.discriminatedUnion('protocol', [
    fields
      .pick({ name: true, issuer: true, client_id: true, client_secret: true })
      .extend({ protocol: z.literal('oidc'), ...fields.pick({ state: true, jit: true, default_role: true, scopes: true, links_existing_accounts: true }).partial().shape })
      .strict(),
    fields
      .pick({ name: true })
      .extend({
        protocol: z.literal('saml'),
        ...fields.pick({ state: true, jit: true, default_role: true, idp_entity_id: true, idp_sso_url: true, idp_certificates: true, idp_metadata_xml: true, idp_initiated: true, links_existing_accounts: true }).partial().shape,
      })
      .strict(),
  ], { error: () => 'protocol: must be oidc or saml' });
}

const oidcUpdateSchema = (allowHttp: boolean) =>
  fieldsSchema(allowHttp).partial().pick({ name: true, state: true, jit: true, default_role: true, issuer: true, client_id: true, client_secret: true, scopes: true, links_existing_accounts: true }).strict();
const samlUpdateSchema = (allowHttp: boolean) =>
  fieldsSchema(allowHttp).partial().pick({ name: true, state: true, jit: true, default_role: true, idp_entity_id: true, idp_sso_url: true, idp_certificates: true, idp_metadata_xml: true, idp_initiated: true, links_existing_accounts: true }).strict();

/** The fields that say whom a connection trusts. */
const TRUST_FIELDS = new Set(['issuer', 'client_id', 'client_secret', 'idp_entity_id', 'idp_sso_url', 'idp_certificates']);

/** Who changes a connection: the audit actor and the role they act with (a default role they could not give is refused). */
export interface ConnectionActor {
  actor?: Actor | undefined;
  actingAs?: RoleRef | undefined;
}

/**
 * Whether `by` vouches for a connection's trust: the operator (no role) or an owner. Only then may
 * the connection link existing accounts by their verified email without the account's own proof:
 * otherwise an admin, or an application, could point a connection at an IdP of their own and sign
 * in as the owner.
 */
function vouches(by: ConnectionActor): boolean {
  return by.actingAs === undefined || by.actingAs.kind === 'owner';
}

function refuseUnvouched(by: ConnectionActor, asked: boolean | undefined): void {
  if (asked === true && !vouches(by)) {
    throw new ForbiddenError('only an owner may let a connection link existing accounts without their proof (links_existing_accounts)');
  }
}

/** The default role, checked: not owner (a connection never makes owners), one the actor may give. */
async function resolveDefaultRole(trx: DB, organizationId: number, name: string, by: ConnectionActor): Promise<RoleRef> {
  const role = await requireRole(trx, organizationId, name, 'default_role');
  if (role.kind === 'owner') throw new InvalidRequestError('default_role: a connection cannot make owners', { details: [{ path: 'default_role', message: 'a connection cannot make owners' }] });
  if (by.actingAs && !mayAssign(by.actingAs, role)) throw new ForbiddenError(`your role may not give the role ${role.name}: it holds permissions yours does not`);
  return lockRole(trx, organizationId, role, 'default_role');
}

function withRole(db: DB) {
  return db
    .selectFrom('sso_connections')
    .leftJoin('roles', 'roles.id', 'sso_connections.default_role_id')
    .selectAll('sso_connections')
    .select(['roles.name as role_name', 'roles.permissions as role_permissions']);
}

/** A connection of the organization, or a NotFoundError (another organization's is not found either). */
export async function getConnectionRow(db: DB, organizationId: number, id: number): Promise<ConnectionRow> {
  const row = Number.isSafeInteger(id) && id > 0 && id <= 2 ** 31 - 1 ? await withRole(db).where('sso_connections.organization_id', '=', organizationId).where('sso_connections.id', '=', id).executeTakeFirst() : undefined;
  if (!row) throw new NotFoundError('no such SSO connection in this organization');
  return row;
}

/** A connection by id alone: the sign-in pages, where the URL names the connection. */
export async function findConnectionRow(db: DB, id: number): Promise<ConnectionRow | undefined> {
  if (!Number.isSafeInteger(id) || id <= 0 || id > 2 ** 31 - 1) return undefined;
  return withRole(db).where('sso_connections.id', '=', id).executeTakeFirst();
}

export async function listConnections(db: DB, settings: Pick<ConnectionSettings, 'issuer'>, organizationId: number): Promise<ConnectionView[]> {
  const rows = await withRole(db).where('sso_connections.organization_id', '=', organizationId).orderBy('sso_connections.id').limit(MAX_CONNECTIONS).execute();
  return rows.map((r) => connectionView(settings.issuer, r));
}

export async function getConnection(db: DB, settings: Pick<ConnectionSettings, 'issuer'>, organizationId: number, id: number): Promise<ConnectionView> {
  return connectionView(settings.issuer, await getConnectionRow(db, organizationId, id));
}

interface SamlFields {
  idp_metadata_xml?: string | undefined;
  idp_entity_id?: string | undefined;
  idp_sso_url?: string | undefined;
  idp_certificates?: string[] | undefined;
  idp_initiated?: boolean | undefined;
}

/** SAML fields from the metadata XML when given; what is given beside it wins. */
function withMetadata<T extends SamlFields>(input: T, allowHttp: boolean): T {
  if (input.idp_metadata_xml === undefined) return input;
  const read = parseInput(fieldsSchema(allowHttp).pick({ idp_entity_id: true, idp_sso_url: true, idp_certificates: true }), readIdpMetadata(input.idp_metadata_xml));
  return {
    ...input,
    idp_entity_id: input.idp_entity_id ?? read.idp_entity_id,
    idp_sso_url: input.idp_sso_url ?? read.idp_sso_url,
    idp_certificates: input.idp_certificates ?? read.idp_certificates,
  };
}

export async function createConnection(db: DB, settings: ConnectionSettings, organizationId: number, input: unknown, by: ConnectionActor = {}): Promise<ConnectionView> {
  const parsed = parseInput(createSchema(settings.allowHttp), input);
  return inTransaction(db, async (trx) => {
    const organization = await trx.selectFrom('organizations').select('id').where('id', '=', organizationId).forNoKeyUpdate().executeTakeFirst();
    if (!organization) throw new NotFoundError('organization not found');
    const { count } = await trx.selectFrom('sso_connections').select((eb) => eb.fn.countAll<number>().as('count')).where('organization_id', '=', organizationId).executeTakeFirstOrThrow();
    if (Number(count) >= MAX_CONNECTIONS) throw new InvalidRequestError(`an organization may have at most ${MAX_CONNECTIONS} SSO connections`);
    const role = await resolveDefaultRole(trx, organizationId, parsed.default_role ?? 'member', by);
    refuseUnvouched(by, parsed.links_existing_accounts);
    const common = {
      organization_id: organizationId,
      protocol: parsed.protocol,
      name: parsed.name,
      state: parsed.state ?? 'active',
      jit: parsed.jit ?? true,
      default_role: role.kind,
      default_role_id: role.id,
      links_existing_accounts: parsed.links_existing_accounts ?? vouches(by),
    };
    let values;
    if (parsed.protocol === 'oidc') {
      values = {
        ...common,
        oidc_issuer: parsed.issuer,
        oidc_client_id: parsed.client_id,
        oidc_client_secret_sealed: sealText(settings.secretKey, CLIENT_SECRET_PURPOSE, parsed.client_secret),
        oidc_scopes: parsed.scopes ?? DEFAULT_OIDC_SCOPES,
      };
    } else {
      const saml = withMetadata(parsed, settings.allowHttp);
      const missing = (['idp_entity_id', 'idp_sso_url', 'idp_certificates'] as const).filter((f) => saml[f] === undefined);
      if (missing.length > 0) throw new InvalidRequestError(`${missing.join(', ')}: required for a SAML connection (or give idp_metadata_xml)`, { details: missing.map((path) => ({ path, message: 'required' })) });
      values = { ...common, saml_idp_entity_id: saml.idp_entity_id, saml_idp_sso_url: saml.idp_sso_url, saml_idp_certificates: saml.idp_certificates, saml_idp_initiated: saml.idp_initiated ?? false };
    }
    const { id } = await trx.insertInto('sso_connections').values(values).returning('id').executeTakeFirstOrThrow();
    await recordAuditEvent(trx, { actor: by.actor, organizationId, action: 'sso_connection.created', details: { connection_id: id, protocol: parsed.protocol, name: parsed.name, state: common.state } });
    return connectionView(settings.issuer, await getConnectionRow(trx, organizationId, id));
  });
}

/**
 * Changes a connection. Leaving `active` (to draft or disabled) ends every session signed in
 * through it, in the same transaction: disabling a connection is what an admin does when the
 * IdP is compromised or the contract ends.
 */
export async function updateConnection(db: DB, settings: ConnectionSettings, organizationId: number, id: number, input: unknown, by: ConnectionActor = {}): Promise<ConnectionView> {
  return inTransaction(db, async (trx) => {
    const current = await getConnectionRow(trx, organizationId, id);
    await trx.selectFrom('sso_connections').select('id').where('id', '=', current.id).forUpdate().execute();
    // The fields that apply follow the connection's protocol (zod drops keys that were not sent).
    const oidc = current.protocol === 'oidc' ? parseInput(oidcUpdateSchema(settings.allowHttp), input) : undefined;
    const samlInput = current.protocol === 'saml' ? parseInput(samlUpdateSchema(settings.allowHttp), input) : undefined;
    const parsed = oidc ?? samlInput ?? {};
    const changes: Record<string, unknown> = {};
    const changed: string[] = [];
    const set = (column: string, field: string, value: unknown) => {
      changes[column] = value;
      changed.push(field);
    };
    if (parsed.name !== undefined && parsed.name !== current.name) set('name', 'name', parsed.name);
    if (parsed.state !== undefined && parsed.state !== current.state) set('state', 'state', parsed.state);
    if (parsed.jit !== undefined && parsed.jit !== current.jit) set('jit', 'jit', parsed.jit);
    if (parsed.default_role !== undefined) {
      const role = await resolveDefaultRole(trx, organizationId, parsed.default_role, by);
      if (by.actingAs && !mayAssign(by.actingAs, defaultRoleOf(current))) throw new ForbiddenError('your role may not change a default role it could not give');
      if (role.kind !== current.default_role || role.id !== current.default_role_id) {
        changes.default_role = role.kind;
        changes.default_role_id = role.id;
        changed.push('default_role');
      }
    }
    if (oidc) {
      if (oidc.issuer !== undefined && oidc.issuer !== current.oidc_issuer) set('oidc_issuer', 'issuer', oidc.issuer);
      if (oidc.client_id !== undefined && oidc.client_id !== current.oidc_client_id) set('oidc_client_id', 'client_id', oidc.client_id);
      if (oidc.client_secret !== undefined) set('oidc_client_secret_sealed', 'client_secret', sealText(settings.secretKey, CLIENT_SECRET_PURPOSE, oidc.client_secret));
      if (oidc.scopes !== undefined && oidc.scopes !== current.oidc_scopes) set('oidc_scopes', 'scopes', oidc.scopes);
    }
    if (samlInput) {
      const saml = withMetadata<SamlFields>(samlInput, settings.allowHttp);
      if (saml.idp_entity_id !== undefined && saml.idp_entity_id !== current.saml_idp_entity_id) set('saml_idp_entity_id', 'idp_entity_id', saml.idp_entity_id);
      if (saml.idp_sso_url !== undefined && saml.idp_sso_url !== current.saml_idp_sso_url) set('saml_idp_sso_url', 'idp_sso_url', saml.idp_sso_url);
      if (saml.idp_certificates !== undefined && saml.idp_certificates.join() !== current.saml_idp_certificates.join()) set('saml_idp_certificates', 'idp_certificates', saml.idp_certificates);
      if (saml.idp_initiated !== undefined && saml.idp_initiated !== current.saml_idp_initiated) set('saml_idp_initiated', 'idp_initiated', saml.idp_initiated);
    }
    // Whoever changes what the connection trusts vouches for it anew: a non-owner's change stops it linking existing accounts.
    refuseUnvouched(by, parsed.links_existing_accounts);
    const trustChanged = changed.some((f) => TRUST_FIELDS.has(f));
    // Identity links are keyed on the IdP's subject, not on its keys: whoever re-points a
    // connection people sign in through could sign in as any of them, its owners included.
    if (trustChanged && !vouches(by)) {
      const linked = await trx.selectFrom('sso_identities').select('id').where('connection_id', '=', current.id).limit(1).executeTakeFirst();
      if (linked) throw new ForbiddenError('only an owner may change what a connection trusts (issuer, client, IdP, certificates) once people sign in through it');
    }
    const links = parsed.links_existing_accounts ?? (trustChanged && !vouches(by) ? false : current.links_existing_accounts);
    if (links !== current.links_existing_accounts) set('links_existing_accounts', 'links_existing_accounts', links);
    if (changed.length === 0) return connectionView(settings.issuer, current);
    await trx.updateTable('sso_connections').set({ ...changes, updated_at: sql<Date>`now()` }).where('id', '=', current.id).execute();
    let sessionsEnded = 0;
    if (changes.state !== undefined && changes.state !== 'active') {
      const ended = await trx.deleteFrom('sessions').where('sso_connection_id', '=', current.id).executeTakeFirst();
      sessionsEnded = Number(ended.numDeletedRows);
    }
    // Active again (or for the first time): the organization's SSO-required domains hold from now on.
    if (changes.state === 'active') sessionsEnded = (await enforceSsoRequired(trx, organizationId)) ?? 0;
    await recordAuditEvent(trx, {
      actor: by.actor,
      organizationId,
      action: 'sso_connection.updated',
      details: { connection_id: current.id, changed, ...(changes.state !== undefined ? { state: changes.state, sessions_ended: sessionsEnded } : {}) },
    });
    return connectionView(settings.issuer, await getConnectionRow(trx, organizationId, id));
  });
}

/** Deletes a connection, its identity links and the sessions signed in through it (foreign keys cascade). */
export async function deleteConnection(db: DB, organizationId: number, id: number, by: ConnectionActor = {}): Promise<void> {
  await inTransaction(db, async (trx) => {
    const current = await getConnectionRow(trx, organizationId, id);
    if (by.actingAs && !mayAssign(by.actingAs, defaultRoleOf(current))) throw new ForbiddenError('your role may not delete a connection that gives a role it could not give');
    try {
      await trx.deleteFrom('sso_connections').where('id', '=', current.id).execute();
    } catch (err) {
      if (isForeignKeyViolation(err)) throw new InvalidRequestError('the connection is still in use; try again');
      throw err;
    }
    await recordAuditEvent(trx, { actor: by.actor, organizationId, action: 'sso_connection.deleted', details: { connection_id: current.id, name: current.name, protocol: current.protocol } });
  });
}
