/**
 * Resources (RFC 8707): what an access token may be for. orgauth's own API is one, built in (its
 * audience `${issuer}/api/v1`, described at /.well-known/oauth-protected-resource/api/v1); the
 * instance's operator registers others (an MCP server, another API) with `orgauth resource`.
 *
 * A resource lists the scopes its tokens may carry: names of orgauth's vocabulary (contacts.read,
 * ...) or names it declares (tools.call, files.read). Declared names join the roles' permissions:
 * the built-in owner, admin and member roles hold every declared name, viewer none (a viewer reads
 * contacts and tasks, nothing else). An application's registered scopes bound orgauth's own
 * vocabulary; a declared name is bounded by its resource, the user's consent and role instead.
 *
 * ResourceRegistry keeps the (few, bounded) resources in memory for the token path, read again
 * after RELOAD_MS, so a change made by the CLI beside a running server takes effect within it.
 */
import { sql } from 'kysely';
import { z } from 'zod';
import type { Config } from '../../config.js';
import { type DB, inTransaction } from '../../db/connect.js';
import { isCheckViolation, isUniqueViolation } from '../../db/errors.js';
import type { Application, TokenEndpointAuthMethod } from '../../db/schema.js';
import { ConflictError, InvalidRequestError, NotFoundError } from '../../errors.js';
import { isWellFormed, parseInput } from '../../lib/validate.js';
import { InvalidScopeError, InvalidTargetError } from '../errors.js';
import { parseResourceUri } from '../helpers/resources.js';
import { grantableScopes, isIdentityScope, isKnownScope, isManagementScope, KNOWN_SCOPES } from '../helpers/scopes.js';

/** Where orgauth's API lives under the issuer, and so its resource identifier. */
export const API_RESOURCE_PATH = '/api/v1';
/** The audience API tokens carried before resources existed: still accepted by the API, never issued. */
export const LEGACY_API_PATH = '/api';
/** How many resources an instance may register: the registry holds them all in memory. */
export const MAX_RESOURCES = 1000;
export const MAX_RESOURCE_SCOPES = 100;
export const DEFAULT_RESOURCE_TOKEN_TTL = 3600;
/** How many resources and clients one resource may allow to exchange tokens for it (migration 0029). */
export const MAX_EXCHANGE_SOURCES = 100;
const RELOAD_MS = 1000;
/** A URI not held is looked for again, at most this often: a resource just registered works at once, and a flood of unknown URIs costs one read per interval. */
const MISS_RELOAD_MS = 100;

/** A resource a token can be for: orgauth's API (id null) or a registered one. */
export interface TokenResource {
  id: number | null;
  /** Canonical; the token's `aud`. */
  uri: string;
  name: string;
  scopes: readonly string[];
  /** Seconds. */
  accessTokenTtl: number;
  /** Who may exchange a token for one to this resource (RFC 8693): resource URIs and client ids. Nobody for orgauth's API. */
  exchangeFrom: readonly string[];
}

export const apiResourceUri = (config: Pick<Config, 'issuer'>): string => `${config.issuer}${API_RESOURCE_PATH}`;

export function apiResource(config: Pick<Config, 'issuer' | 'accessTokenTtl'>): TokenResource {
  return { id: null, uri: apiResourceUri(config), name: 'orgauth API', scopes: KNOWN_SCOPES, accessTokenTtl: config.accessTokenTtl, exchangeFrom: [] };
}

/** Whether a scope is one a resource declared (not a name of orgauth's vocabulary). */
export function isDeclaredScope(scope: string): boolean {
  return !isKnownScope(scope) && !isIdentityScope(scope);
}

/** RFC 6749 §3.3 scope-token, kept to names that read well on a consent page and in a shell. */
const SCOPE_NAME = /^[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}$/;

const scopeListSchema = z
  .array(z.string())
  .max(MAX_RESOURCE_SCOPES, `at most ${MAX_RESOURCE_SCOPES} scopes`)
  .superRefine((scopes, ctx) => {
    for (const scope of scopes) {
      if (!SCOPE_NAME.test(scope)) ctx.addIssue({ code: 'custom', message: `${JSON.stringify(scope.slice(0, 40))} is not a scope name (letters, digits and . _ : / -, at most 100)` });
      else if (isManagementScope(scope)) ctx.addIssue({ code: 'custom', message: `${scope} administers orgauth itself and cannot be a resource's scope` });
      else if (isIdentityScope(scope) || scope === 'offline_access') ctx.addIssue({ code: 'custom', message: `${scope} is an OpenID Connect scope; every client may ask for it anyway` });
    }
  })
  .transform((scopes) => [...new Set(scopes)]);

const resourceSchema = z.object({
  uri: z.string().transform((value, ctx) => {
    const parsed = parseResourceUri(value);
    if ('problem' in parsed) {
      ctx.addIssue({ code: 'custom', message: parsed.problem });
      return z.NEVER;
    }
    return parsed.uri;
  }),
  name: z
    .string()
    .trim()
    .min(1, 'must not be empty')
    .max(200, 'must be at most 200 characters')
    .refine((v) => isWellFormed(v) && !/[\x00-\x1f\x7f]/.test(v), 'must be text without control characters'),
  scopes: scopeListSchema,
  access_token_ttl: z.number().int().min(60, 'must be at least 60 seconds').max(86_400, 'must be at most 86400 seconds (a day)'),
});

export interface ResourceRow {
  id: number;
  uri: string;
  name: string;
  scopes: string[];
  access_token_ttl: number;
  /** Who may exchange a token for one to this resource (RFC 8693): resource URIs and client ids. */
  exchange_from: string[];
  created_at: Date;
  updated_at: Date;
  /** The resource's own client (introspection, token exchange); null until it has credentials. */
  client_id: string | null;
  token_endpoint_auth_method: TokenEndpointAuthMethod | null;
}

/** A resource's credentials, as they are shown once: the secret only when it authenticates with one. */
export interface ResourceCredentials {
  client_id: string;
  client_secret?: string;
}

export interface ResourceInput {
  uri: string;
  name: string;
  /** Space-separated or a list. */
  scopes: string | readonly string[];
  accessTokenTtl?: number | undefined;
}

const words = (input: string | readonly string[]): string[] => (typeof input === 'string' ? [input] : [...input]).flatMap((s) => s.split(/[ \t\n\r]+/)).filter((s) => s !== '');

function refuseOwnApi(config: Pick<Config, 'issuer'>, uri: string): void {
  const issuer = parseResourceUri(config.issuer);
  if ('uri' in issuer && (uri === issuer.uri || uri.startsWith(`${issuer.uri}/`))) {
    throw new InvalidRequestError(`uri: ${uri} is orgauth itself; its API is the built-in resource ${apiResourceUri(config)}`, {
      details: [{ path: 'uri', message: 'is orgauth itself' }],
    });
  }
}

/** Resources with their client's id and authentication method (null: no credentials yet). */
function resourceRows(db: DB) {
  return db
    .selectFrom('resources')
    .leftJoin('applications', 'applications.resource_id', 'resources.id')
    .selectAll('resources')
    .select(['applications.client_id', 'applications.token_endpoint_auth_method']);
}

export async function createResource(db: DB, config: Pick<Config, 'issuer'>, input: ResourceInput): Promise<ResourceRow> {
  const valid = parseInput(resourceSchema, { uri: input.uri, name: input.name, scopes: words(input.scopes), access_token_ttl: input.accessTokenTtl ?? DEFAULT_RESOURCE_TOKEN_TTL });
  refuseOwnApi(config, valid.uri);
  const count = await db.selectFrom('resources').select((eb) => eb.fn.countAll<number>().as('n')).executeTakeFirstOrThrow();
  if (Number(count.n) >= MAX_RESOURCES) throw new ConflictError(`an instance holds at most ${MAX_RESOURCES} resources`);
  try {
    const row = await db.insertInto('resources').values(valid).returningAll().executeTakeFirstOrThrow();
    return { ...row, client_id: null, token_endpoint_auth_method: null };
  } catch (err) {
    if (isUniqueViolation(err)) throw new ConflictError(`a resource with uri ${valid.uri} exists`);
    if (isCheckViolation(err)) throw new InvalidRequestError('the resource is not valid');
    throw err;
  }
}

export async function listResources(db: DB): Promise<ResourceRow[]> {
  return resourceRows(db).orderBy('resources.id').limit(MAX_RESOURCES).execute();
}

/** A resource by its URI (any spelling of it) or its id. */
export async function getResource(db: DB, uriOrId: string): Promise<ResourceRow> {
  let query = resourceRows(db);
  if (/^[1-9][0-9]{0,8}$/.test(uriOrId)) query = query.where('resources.id', '=', Number(uriOrId));
  else {
    const parsed = parseResourceUri(uriOrId);
    if ('problem' in parsed) throw new NotFoundError(`no resource ${uriOrId.slice(0, 200)}`);
    query = query.where('resources.uri', '=', parsed.uri);
  }
  const row = await query.executeTakeFirst();
  if (!row) throw new NotFoundError(`no resource ${uriOrId.slice(0, 200)}`);
  return row;
}

export interface ResourceChanges extends Partial<Omit<ResourceInput, 'uri'>> {
  /** Who may now exchange tokens for this resource: resource URIs (any spelling) or client ids. */
  allowExchangeFrom?: readonly string[] | undefined;
  /** Who no longer may. */
  denyExchangeFrom?: readonly string[] | undefined;
}

/**
 * Who may exchange for a resource, as stored: a registered resource's URI in canonical form, or
 * the client id of a client of ours. Anything else is refused: a typo would otherwise allow
 * nobody, silently. Not the resource itself, nor its own client.
 */
async function exchangeSource(db: DB, self: ResourceRow, value: string): Promise<string> {
  const problem = (message: string): never => {
    throw new InvalidRequestError(`exchange_from: ${message}`, { details: [{ path: 'exchange_from', message }] });
  };
  const parsed = parseResourceUri(value);
  const resource = 'uri' in parsed ? await db.selectFrom('resources').select(['id', 'uri']).where('uri', '=', parsed.uri).executeTakeFirst() : undefined;
  if (resource) return resource.id === self.id ? problem('a resource does not exchange tokens for itself') : resource.uri;
  const client = value.length <= 2000 ? await db.selectFrom('applications').select('resource_id').where('client_id', '=', value).executeTakeFirst() : undefined;
  if (!client) return problem(`${value.slice(0, 200)} is neither a registered resource nor a client id`);
  return client.resource_id === self.id ? problem('a resource does not exchange tokens for itself') : value;
}

/**
 * Changes a resource's name, scopes, token lifetime or who may exchange tokens for it (its URI is
 * its identity: a new URI is a new resource). Tokens already issued keep what they hold until
 * they expire; a refresh gets at most the scopes the resource still lists.
 */
export async function updateResource(db: DB, uriOrId: string, changes: ResourceChanges): Promise<ResourceRow> {
  // Read, changed and written under the row's lock: two changes of who may exchange (or one and a
  // deletion elsewhere) cannot undo each other.
  return inTransaction(db, async (trx) => {
    const { id } = await getResource(trx, uriOrId);
    await trx.selectFrom('resources').select('id').where('id', '=', id).forUpdate().execute();
    return changeResource(trx, await getResource(trx, String(id)), changes);
  });
}

async function changeResource(db: DB, current: ResourceRow, changes: ResourceChanges): Promise<ResourceRow> {
  const valid = parseInput(resourceSchema, {
    uri: current.uri,
    name: changes.name ?? current.name,
    scopes: changes.scopes === undefined ? current.scopes : words(changes.scopes),
    access_token_ttl: changes.accessTokenTtl ?? current.access_token_ttl,
  });
  const allow = await Promise.all((changes.allowExchangeFrom ?? []).map((v) => exchangeSource(db, current, v)));
  // Denied as given or as stored: a URI in another spelling, or one no longer registered.
  const deny = new Set(changes.denyExchangeFrom ?? []);
  for (const value of deny) {
    const parsed = parseResourceUri(value);
    if ('uri' in parsed) deny.add(parsed.uri);
  }
  const exchangeFrom = [...new Set([...current.exchange_from, ...allow])].filter((v) => !deny.has(v));
  if (exchangeFrom.length > MAX_EXCHANGE_SOURCES) throw new ConflictError(`a resource allows exchanges from at most ${MAX_EXCHANGE_SOURCES} resources and clients`);
  await db
    .updateTable('resources')
    .set({ name: valid.name, scopes: valid.scopes, access_token_ttl: valid.access_token_ttl, exchange_from: exchangeFrom, updated_at: sql`now()` })
    .where('id', '=', current.id)
    .execute();
  return getResource(db, String(current.id));
}

/**
 * Deletes a resource: its grants (and their refresh tokens) and its credentials go with it, so
 * nothing is refreshed for it again, and so does every other resource's permission to exchange
 * for it: a resource registered again at the URI starts with none.
 */
export async function deleteResource(db: DB, uriOrId: string): Promise<ResourceRow> {
  const current = await getResource(db, uriOrId);
  const names = [current.uri, ...(current.client_id !== null ? [current.client_id] : [])];
  await inTransaction(db, async (trx) => {
    await trx.deleteFrom('resources').where('id', '=', current.id).execute();
    // Locks the rows it changes; an update running beside it writes after, from what this left.
    await trx
      .updateTable('resources')
      .set({ exchange_from: sql<string[]>`array(select e from unnest(exchange_from) e where e <> all(${sql.val(names)}::text[]))`, updated_at: sql`now()` })
      .where(sql<boolean>`exchange_from && ${sql.val(names)}::text[]`)
      .execute();
  });
  return current;
}

/** Every name the registered resources declare (not orgauth's own): what a private application may also list. */
export async function declaredScopeNames(db: DB): Promise<Set<string>> {
  const rows = await db.selectFrom('resources').select(sql<string>`unnest(scopes)`.as('scope')).execute();
  return new Set(rows.map((r) => r.scope).filter(isDeclaredScope));
}

function toTokenResource(row: ResourceRow): TokenResource {
  return { id: row.id, uri: row.uri, name: row.name, scopes: row.scopes, accessTokenTtl: row.access_token_ttl, exchangeFrom: row.exchange_from };
}

/** The resources as the token path needs them: by canonical URI and by id, read again after RELOAD_MS. */
export class ResourceRegistry {
  private loaded: { at: number; byUri: Map<string, TokenResource>; byId: Map<number, TokenResource> } | undefined;
  private loading: Promise<NonNullable<ResourceRegistry['loaded']>> | undefined;

  constructor(
    private readonly db: DB,
    private readonly config: Pick<Config, 'issuer' | 'accessTokenTtl'>,
  ) {}

  get api(): TokenResource {
    return apiResource(this.config);
  }

  private async current(): Promise<NonNullable<ResourceRegistry['loaded']>> {
    if (this.loaded && Date.now() - this.loaded.at < RELOAD_MS) return this.loaded;
    this.loading ??= listResources(this.db)
      .then((rows) => {
        const resources = rows.map(toTokenResource);
        this.loaded = { at: Date.now(), byUri: new Map(resources.map((r) => [r.uri, r])), byId: new Map(resources.map((r) => [r.id!, r])) };
        return this.loaded;
      })
      .finally(() => {
        this.loading = undefined;
      });
    return this.loading;
  }

  /** Drops what is held, so the next read sees a change this process just made. */
  forget(): void {
    this.loaded = undefined;
  }

  /**
   * The resource a request names (`resource`, RFC 8707), or orgauth's API when it names none.
   * Unknown, or not a URI a resource can have: invalid_target.
   */
  async resolve(requested: string | undefined): Promise<TokenResource> {
    if (requested === undefined) return this.api;
    const parsed = parseResourceUri(requested);
    if ('problem' in parsed) throw new InvalidTargetError(`resource ${parsed.problem}`);
    if (parsed.uri === this.api.uri) return this.api;
    const held = await this.current();
    const found = held.byUri.get(parsed.uri) ?? (Date.now() - held.at >= MISS_RELOAD_MS ? (await this.reload()).byUri.get(parsed.uri) : undefined);
    if (!found) throw new InvalidTargetError('the resource is not registered at this authorization server');
    return found;
  }

  /** The resource a grant or code is for (null: the API); undefined when it was deleted since. */
  async byId(id: number | null): Promise<TokenResource | undefined> {
    if (id === null) return this.api;
    const held = await this.current();
    return held.byId.get(id) ?? (Date.now() - held.at >= MISS_RELOAD_MS ? (await this.reload()).byId.get(id) : undefined);
  }

  private async reload() {
    this.loaded = undefined;
    return this.current();
  }
}

/**
 * The scopes a request for `resource` gets from `application` (RFC 6749 §3.3): for orgauth's API,
 * as always (grantableScopes); for another resource, the ones asked for, each listed by the
 * resource and registered for the application (a public application's declared scopes excepted:
 * its user decides) — or, when none are asked for, every such scope. invalid_scope otherwise.
 */
export function resourceScopes(requested: string | undefined, resource: TokenResource, application: Pick<Application, 'scopes' | 'type'>): string[] {
  if (resource.id === null) return grantableScopes(requested, application.scopes);
  // A declared scope: a user decides at consent for a public application (within their role); a
  // private application acting for itself gets only those it is registered with.
  const mayHave = (s: string) => resource.scopes.includes(s) && ((isDeclaredScope(s) && application.type === 'public') || application.scopes.includes(s));
  if (requested === undefined) {
    const all = resource.scopes.filter(mayHave);
    if (all.length === 0) throw new InvalidScopeError(`this application may have none of the scopes of ${resource.uri}`);
    return all;
  }
  const asked = requested.split(' ').filter((w) => w !== '');
  const refused = asked.filter((s) => !mayHave(s));
  if (asked.length === 0 || refused.length > 0) {
    throw new InvalidScopeError(asked.length === 0 ? 'scope is empty' : `scope ${refused.map((s) => s.slice(0, 40)).join(' ')} is not a scope of ${resource.uri} this application may have`);
  }
  return resource.scopes.filter((s) => asked.includes(s));
}
