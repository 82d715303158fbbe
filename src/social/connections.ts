/**
 * Social connections (issue 45): sign-in through Google, Microsoft, GitHub or any OpenID
 * provider, set up by the operator for the whole instance (the CLI: `orgauth social ...`). Each
 * holds the client orgauth is at the provider; the secret is sealed at rest and never shown again.
 *
 * Where each provider is: Google and any OpenID provider by discovery at `issuer`; Microsoft at
 * `issuer`/`tenant`/v2.0 (common, organizations, consumers or one tenant id); GitHub's web flow at
 * `base_url` (github.com, or a GitHub Enterprise Server) and its REST API beside it. `--issuer` and
 * `--base-url` point any of them elsewhere (a provider on loopback in the tests).
 */
import { z } from 'zod';
import type { Config } from '../config.js';
import { type DB, inTransaction } from '../db/connect.js';
import type { SocialConnectionsTable, SocialConnectionState, SocialProvider } from '../db/schema.js';
import type { Selectable, Updateable } from 'kysely';
import { ConflictError, InvalidRequestError, NotFoundError } from '../errors.js';
import { sealText } from '../lib/crypto.js';
import { parseInput } from '../lib/validate.js';
import { normalizeDomain } from '../sso/domains.js';
import { text, urlField } from '../sso/connections.js';

export type SocialConnectionRow = Selectable<SocialConnectionsTable>;

export const SOCIAL_PROVIDERS: readonly SocialProvider[] = ['google', 'microsoft', 'github', 'oidc'];
/** Connections per instance: one per provider account, a few more while one replaces another. */
export const MAX_SOCIAL_CONNECTIONS = 20;
/** The purpose the client secret is sealed under (lib/crypto.ts sealText). */
export const SOCIAL_SECRET_PURPOSE = 'social-client-secret';
/** Microsoft's tenants that are not one organization's: any account, work or school accounts, personal accounts. */
export const MICROSOFT_MULTI_TENANTS: ReadonlySet<string> = new Set(['common', 'organizations', 'consumers']);
/** The tenant of Microsoft's personal accounts (their `tid`). */
export const MICROSOFT_CONSUMERS_TENANT = '9188040d-6c67-4c5b-b112-36a304b66dad';

const DEFAULTS: Record<SocialProvider, { name: string; issuer?: string; baseUrl?: string }> = {
  google: { name: 'Google', issuer: 'https://accounts.google.com' },
  microsoft: { name: 'Microsoft', issuer: 'https://login.microsoftonline.com' },
  github: { name: 'GitHub', baseUrl: 'https://github.com' },
  oidc: { name: 'OpenID' },
};

export interface SocialSettings {
  issuer: string;
  secretKey: string;
  allowHttp: boolean;
}

export function socialSettings(config: Pick<Config, 'issuer' | 'secretKey' | 'outbound'>): SocialSettings {
  return { issuer: config.issuer, secretKey: config.secretKey, allowHttp: config.outbound.allowHttp };
}

/** The callback orgauth has for connection `id`: what the operator registers at the provider. */
export function socialRedirectUri(issuer: string, id: number): string {
  return `${issuer}/social/${id}/callback`;
}

/** A connection as the CLI shows it: never the client secret. */
export interface SocialConnectionView {
  id: number;
  provider: SocialProvider;
  name: string;
  state: SocialConnectionState;
  client_id: string;
  issuer?: string;
  tenant?: string;
  base_url?: string;
  allowed_domains: string[];
  redirect_uri: string;
  created_at: Date;
  updated_at: Date;
}

export function socialConnectionView(issuer: string, row: SocialConnectionRow): SocialConnectionView {
  return {
    id: row.id,
    provider: row.provider,
    name: row.name,
    state: row.state,
    client_id: row.client_id,
    ...(row.issuer !== null ? { issuer: row.issuer } : {}),
    ...(row.tenant !== null ? { tenant: row.tenant } : {}),
    ...(row.base_url !== null ? { base_url: row.base_url } : {}),
    allowed_domains: row.allowed_domains,
    redirect_uri: socialRedirectUri(issuer, row.id),
    created_at: row.created_at,
    updated_at: row.updated_at,
  };
}

/** A base URL that paths are appended to (Microsoft's tenant, GitHub's), without its trailing slash. */
const withoutSlash = (v: string) => v.replace(/\/+$/, '');

/** An issuer or base URL: no query either (OpenID Discovery §2; a path is appended to a base). */
const baseField = (allowHttp: boolean) => urlField(allowHttp).refine((v) => new URL(v).search === '', 'must have no query');

const tenantField = z
  .string()
  .trim()
  .toLowerCase()
  .refine((v) => MICROSOFT_MULTI_TENANTS.has(v) || /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/.test(v), 'must be common, organizations, consumers or a tenant id (a GUID)');

const domainsField = z
  .array(z.string().max(253))
  .max(100, 'must hold at most 100 domains')
  .transform((list, ctx) => {
    const out: string[] = [];
    for (const d of list) {
      try {
        const domain = normalizeDomain(d);
        if (!out.includes(domain)) out.push(domain);
      } catch {
        ctx.addIssue({ code: 'custom', message: `${d.slice(0, 60)} is not a domain name` });
      }
    }
    return out;
  });

function fieldsSchema(allowHttp: boolean) {
  return z.object({
    provider: z.enum(['google', 'microsoft', 'github', 'oidc']),
    name: text(100),
    state: z.enum(['enabled', 'disabled']),
    client_id: text(512),
    client_secret: z.string().min(1, 'must not be empty').max(1024, 'must be at most 1024 characters'),
    // As given: an OpenID issuer is compared as a string (a trailing slash is part of it).
    issuer: baseField(allowHttp),
    tenant: tenantField,
    base_url: baseField(allowHttp).transform(withoutSlash),
    allowed_domains: domainsField,
  });
}

export interface SocialConnectionInput {
  provider?: unknown;
  name?: unknown;
  state?: unknown;
  client_id?: unknown;
  client_secret?: unknown;
  issuer?: unknown;
  tenant?: unknown;
  base_url?: unknown;
  allowed_domains?: unknown;
}

/** The fields a provider has, and the ones it has not (refused, so a typo is not silently ignored). */
function checkProviderFields(provider: SocialProvider, input: { issuer?: string | undefined; tenant?: string | undefined; base_url?: string | undefined }, ctx: z.RefinementCtx) {
  const refuse = (field: string, why: string) => ctx.addIssue({ code: 'custom', path: [field], message: why });
  if (provider === 'github' && input.issuer !== undefined) refuse('issuer', 'GitHub has no issuer: give its base URL');
  if (provider !== 'github' && input.base_url !== undefined) refuse('base_url', 'only GitHub has a base URL: give the issuer');
  if (provider !== 'microsoft' && input.tenant !== undefined) refuse('tenant', 'only Microsoft has a tenant');
}

function createSchema(allowHttp: boolean) {
  return fieldsSchema(allowHttp)
    .partial({ name: true, state: true, issuer: true, tenant: true, base_url: true, allowed_domains: true })
    .strict()
    .superRefine((v, ctx) => {
      checkProviderFields(v.provider, v, ctx);
      if (v.provider === 'oidc' && v.issuer === undefined) ctx.addIssue({ code: 'custom', path: ['issuer'], message: 'an OpenID provider needs its issuer' });
    });
}

function updateSchema(allowHttp: boolean) {
  return fieldsSchema(allowHttp).omit({ provider: true }).partial().strict();
}

export async function findSocialConnection(db: DB, id: number): Promise<SocialConnectionRow | undefined> {
  if (!Number.isSafeInteger(id) || id < 1 || id > 2 ** 31 - 1) return undefined;
  return db.selectFrom('social_connections').selectAll().where('id', '=', id).executeTakeFirst();
}

async function getRow(db: DB, id: number): Promise<SocialConnectionRow> {
  const row = await findSocialConnection(db, id);
  if (!row) throw new NotFoundError('no such social connection');
  return row;
}

export async function createSocialConnection(db: DB, settings: SocialSettings, input: SocialConnectionInput): Promise<SocialConnectionView> {
  const parsed = parseInput(createSchema(settings.allowHttp), input);
  const defaults = DEFAULTS[parsed.provider];
  const count = await db.selectFrom('social_connections').select((eb) => eb.fn.countAll<string>().as('n')).executeTakeFirstOrThrow();
  if (Number(count.n) >= MAX_SOCIAL_CONNECTIONS) throw new InvalidRequestError(`an instance has at most ${MAX_SOCIAL_CONNECTIONS} social connections`);
  const row = await db
    .insertInto('social_connections')
    .values({
      provider: parsed.provider,
      name: parsed.name ?? (parsed.provider === 'oidc' ? new URL(parsed.issuer!).hostname.slice(0, 100) : defaults.name),
      state: parsed.state ?? 'enabled',
      client_id: parsed.client_id,
      client_secret_sealed: sealText(settings.secretKey, SOCIAL_SECRET_PURPOSE, parsed.client_secret),
      issuer: parsed.provider === 'github' ? null : parsed.provider === 'microsoft' ? withoutSlash(parsed.issuer ?? defaults.issuer ?? '') : (parsed.issuer ?? defaults.issuer ?? null),
      tenant: parsed.provider === 'microsoft' ? (parsed.tenant ?? 'common') : null,
      base_url: parsed.provider === 'github' ? (parsed.base_url ?? defaults.baseUrl ?? null) : null,
      allowed_domains: parsed.allowed_domains ?? [],
    })
    .returningAll()
    .executeTakeFirstOrThrow();
  return socialConnectionView(settings.issuer, row);
}

export async function listSocialConnections(db: DB, settings: Pick<SocialSettings, 'issuer'>): Promise<SocialConnectionView[]> {
  const rows = await db.selectFrom('social_connections').selectAll().orderBy('id').limit(MAX_SOCIAL_CONNECTIONS * 2).execute();
  return rows.map((r) => socialConnectionView(settings.issuer, r));
}

export async function getSocialConnection(db: DB, settings: Pick<SocialSettings, 'issuer'>, id: number): Promise<SocialConnectionView> {
  return socialConnectionView(settings.issuer, await getRow(db, id));
}

/** The enabled connections, for the sign-in and sign-up pages' buttons. */
export async function enabledSocialConnections(db: DB): Promise<{ id: number; provider: SocialProvider; name: string }[]> {
  return db.selectFrom('social_connections').select(['id', 'provider', 'name']).where('state', '=', 'enabled').orderBy('id').limit(MAX_SOCIAL_CONNECTIONS).execute();
}

export async function updateSocialConnection(db: DB, settings: SocialSettings, id: number, input: SocialConnectionInput): Promise<SocialConnectionView> {
  const current = await getRow(db, id);
  const parsed = parseInput(
    updateSchema(settings.allowHttp).superRefine((v, ctx) => checkProviderFields(current.provider, v, ctx)),
    input,
  );
  const set: Updateable<SocialConnectionsTable> = {};
  if (parsed.name !== undefined) set.name = parsed.name;
  if (parsed.state !== undefined) set.state = parsed.state;
  if (parsed.client_id !== undefined) set.client_id = parsed.client_id;
  if (parsed.client_secret !== undefined) set.client_secret_sealed = sealText(settings.secretKey, SOCIAL_SECRET_PURPOSE, parsed.client_secret);
  if (parsed.issuer !== undefined) set.issuer = current.provider === 'microsoft' ? withoutSlash(parsed.issuer) : parsed.issuer;
  if (parsed.tenant !== undefined) set.tenant = parsed.tenant;
  if (parsed.base_url !== undefined) set.base_url = parsed.base_url;
  if (parsed.allowed_domains !== undefined) set.allowed_domains = parsed.allowed_domains;
  if (Object.keys(set).length === 0) return socialConnectionView(settings.issuer, current);
  const row = await inTransaction(db, async (trx) => {
    // Identities are subjects of the provider the connection points at: pointed elsewhere, the
    // same subject would be someone else's there (GitHub's ids are counters on every server), and
    // Microsoft's subjects are per application. So while people sign in through it, it keeps
    // where it points; a new connection (or deleting this one) is the way to change that.
    const moves = (['issuer', 'tenant', 'base_url'] as const).some((f) => set[f] !== undefined && set[f] !== current[f]) || (current.provider === 'microsoft' && set.client_id !== undefined && set.client_id !== current.client_id);
    if (moves) {
      const linked = await trx.selectFrom('social_identities').select('id').where('connection_id', '=', id).limit(1).executeTakeFirst();
      if (linked) throw new ConflictError('people sign in through this connection: where it points (issuer, tenant, base URL, and a Microsoft application) cannot change under them; create a new connection instead');
    }
    const updated = await trx.updateTable('social_connections').set({ ...set, updated_at: new Date() }).where('id', '=', id).returningAll().executeTakeFirstOrThrow();
    // Disabled, it signs nobody in, and the sessions it made end (as an SSO connection's do).
    if (parsed.state === 'disabled' && current.state !== 'disabled') await trx.deleteFrom('sessions').where('social_connection_id', '=', id).execute();
    return updated;
  });
  return socialConnectionView(settings.issuer, row);
}

/** Deletes the connection: its identities, its sign-ins in flight and the sessions made through it go with it (foreign keys). */
export async function deleteSocialConnection(db: DB, id: number): Promise<void> {
  const deleted = await db.deleteFrom('social_connections').where('id', '=', id).returning('id').executeTakeFirst();
  if (!deleted) throw new NotFoundError('no such social connection');
}
