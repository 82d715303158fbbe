/**
 * Clients that register themselves: RFC 7591 dynamic client registration, and the RFC 7592
 * client configuration endpoint (read and delete with the registration access token). The HTTP
 * side is endpoints/register.ts; this module validates the metadata, enforces the limits and
 * keeps the rows.
 *
 * A registered client belongs to no organization (organization_id null), is public, requires
 * PKCE, and never holds management scopes (AG-3): its `scopes` are the data scopes, narrowed by
 * the `scope` it registered when that names some. Its registration access token, like its
 * secret, is stored only as a SHA-256 digest, and each is shown once.
 *
 * It may register what a developer's application sets (issue 28), by the same names: keys
 * instead of a secret (`token_endpoint_auth_method` private_key_jwt with `jwks`, RFC 7591 §2,
 * checked as models/applications.ts checks them: public keys only), `dpop_bound_access_tokens` (RFC 9449 §5.2),
 * `require_pushed_authorization_requests` (RFC 9126 §6) and `id_token_signed_response_alg`
 * (OpenID Connect Dynamic Client Registration §2; RS256 when absent). FAPI 2.0 is an operator's
 * decision for a developer's application, not something a client registers. Keys are inline only:
 * a `jwks_uri` would let anyone who can register make this server fetch a URL of their choosing
 * again and again (on every unknown kid, every 10 s while it fails), which a developer's
 * application, registered by someone accountable, may do. Keys sent with another method are
 * ignored (RFC 7591 §3.2.1 lets a server drop what it does not use): not stored, not echoed.
 *
 * Limits, in the database so that they hold across instances: CLIENT_REGISTRATION_RATE_LIMIT
 * registrations per address per hour (an IPv6 address counts with its /64, which one host
 * usually has whole: src/lib/client-address.ts), counted in client_registrations, where each
 * registration stays for the hour even if its client deletes itself (RFC 7592) meanwhile; and
 * CLIENT_REGISTRATION_MAX_CLIENTS registered clients at once. Both are checked and the rows
 * inserted under one transaction-scoped advisory lock, so parallel registrations cannot slip
 * past them together. Clients that never obtain a token are deleted
 * by the retention sweep (src/retention.ts, UNUSED_CLIENT_TTL).
 */
import { sql } from 'kysely';
import { z } from 'zod';
import type { ClientRegistrationConfig } from '../../config.js';
import { type DB, inTransaction } from '../../db/connect.js';
import { type Application, DEVICE_CODE_GRANT, SELF_REGISTRATIONS, type GrantType, ID_TOKEN_ALGS, type IdTokenAlg, type TokenEndpointAuthMethod } from '../../db/schema.js';
import { addressGroup } from '../../lib/client-address.js';
import { generateSecret, secretMatches, sha256Hex } from '../../lib/crypto.js';
import { isWellFormed } from '../../lib/validate.js';
import { InvalidClientMetadataError, InvalidRedirectUriError, TooManyAttemptsError } from '../errors.js';
import { clientKeysProblem, publicJwksSchema } from '../helpers/client-assertion.js';
import { MAX_REDIRECT_URIS, redirectUriProblem } from '../helpers/redirect-uris.js';
import { DATA_SCOPES, isIdentityScope, isManagementScope } from '../helpers/scopes.js';
import { CLIENT_ID_PATTERN, newClientId, newClientSecret, type ChangeOptions } from './applications.js';
import { revokeGrants } from './grants.js';

/** The largest registration request body read (Fastify answers 413 past it). */
export const REGISTRATION_BODY_LIMIT = 16 * 1024;
export const MAX_CLIENT_NAME_LENGTH = 200;
/** Entries of grant_types and response_types read; more is refused (there are three grant types and one response type). */
const MAX_LIST = 10;
const MAX_SCOPE_LENGTH = 1000;

export const REGISTRABLE_GRANT_TYPES = ['authorization_code', 'refresh_token', DEVICE_CODE_GRANT] as const satisfies readonly GrantType[];
export const REGISTRABLE_AUTH_METHODS = ['none', 'client_secret_basic', 'client_secret_post', 'private_key_jwt'] as const satisfies readonly TokenEndpointAuthMethod[];
/** RFC 7591 §2: without grant_types, a client gets authorization_code (and we add refresh_token). */
const DEFAULT_GRANT_TYPES: GrantType[] = ['authorization_code', 'refresh_token'];
/** RFC 7591 §2: without token_endpoint_auth_method, client_secret_basic. */
const DEFAULT_AUTH_METHOD: TokenEndpointAuthMethod = 'client_secret_basic';
/** The name of a client that gave none and has no redirect URI to name it after (a device-only client). */
const UNNAMED = 'Unnamed client';

/** Serializes registrations (the limits are counted, then the row inserted): one lock for the instance's database. */
const REGISTRATION_LOCK = sql`hashtext('orgauth.client_registration')`;

/** JSON null reads as absent: some client libraries send every metadata field, null when unset. */
const field = <T extends z.ZodType>(schema: T) => z.preprocess((v) => (v === null ? undefined : v), schema.optional());

const listOf = (noun: string, max: number) => z.array(z.string({ error: `each ${noun} must be a string` }), { error: `must be a list of ${noun}s` }).max(max, `at most ${max} ${noun}s`);

const metadataSchema = z.object({
  redirect_uris: field(
    listOf('redirect URI', MAX_REDIRECT_URIS).superRefine((uris, ctx) => {
      for (const uri of uris) {
        const problem = redirectUriProblem(uri);
        if (problem) ctx.addIssue({ code: 'custom', message: `${JSON.stringify(uri.slice(0, 100))} ${problem}` });
      }
    }),
  ),
  grant_types: field(
    listOf('grant type', MAX_LIST).superRefine((types, ctx) => {
      const refused = types.filter((t) => !(REGISTRABLE_GRANT_TYPES as readonly string[]).includes(t));
      if (refused.length > 0) {
        ctx.addIssue({ code: 'custom', message: `${refused.map((t) => JSON.stringify(t.slice(0, 60))).join(', ')} not supported; a registered client may use ${REGISTRABLE_GRANT_TYPES.join(', ')}` });
      }
    }),
  ),
  response_types: field(
    listOf('response type', MAX_LIST).superRefine((types, ctx) => {
      if (types.some((t) => t !== 'code')) ctx.addIssue({ code: 'custom', message: 'only the response type code is supported' });
    }),
  ),
  token_endpoint_auth_method: field(
    z.string({ error: 'must be a string' }).refine((m) => (REGISTRABLE_AUTH_METHODS as readonly string[]).includes(m), {
      message: `must be one of ${REGISTRABLE_AUTH_METHODS.join(', ')}`,
    }),
  ),
  client_name: field(
    z
      .string({ error: 'must be a string' })
      .trim()
      .max(MAX_CLIENT_NAME_LENGTH, `must be at most ${MAX_CLIENT_NAME_LENGTH} characters`)
      .refine((v) => isWellFormed(v) && !/[\x00-\x1f\x7f]/.test(v), 'must be text without control characters'),
  ),
  jwks: field(publicJwksSchema),
  jwks_uri: field(
    z.unknown().refine(() => false, 'a client that registers itself gives its keys inline (jwks); a developer’s application may have a jwks_uri'),
  ),
  dpop_bound_access_tokens: field(z.boolean({ error: 'must be true or false' })),
  require_pushed_authorization_requests: field(z.boolean({ error: 'must be true or false' })),
  id_token_signed_response_alg: field(z.enum(ID_TOKEN_ALGS, { error: `must be one of ${ID_TOKEN_ALGS.join(', ')}` })),
  scope: field(
    z
      .string({ error: 'must be a string of space-separated scopes' })
      .max(MAX_SCOPE_LENGTH, `must be at most ${MAX_SCOPE_LENGTH} characters`)
      .refine((v) => isWellFormed(v) && !/[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]/.test(v), 'must be space-separated scope names'),
  ),
});

/** A registration's metadata, validated and with the defaults applied. */
export interface RegistrationMetadata {
  redirectUris: string[];
  grantTypes: GrantType[];
  responseTypes: 'code'[];
  tokenEndpointAuthMethod: TokenEndpointAuthMethod;
  /** client_name, or the first redirect URI's host. */
  name: string;
  /** The words of `scope`, when sent (checked against the registered resources by registerClient). */
  scopeWords: string[] | undefined;
  /** private_key_jwt: the client's public keys (inline only); null otherwise. */
  jwks: { keys: object[] } | null;
  dpopBoundAccessTokens: boolean;
  requirePushedAuthorizationRequests: boolean;
  idTokenSignedResponseAlg: IdTokenAlg;
}

/** The default of OpenID Connect Dynamic Client Registration §2, and what a client that sets nothing expects. */
const DEFAULT_ID_TOKEN_ALG: IdTokenAlg = 'RS256';

/**
 * RFC 7591 §2 metadata from a request body (already parsed JSON): unknown fields ignored,
 * invalid ones refused with invalid_redirect_uri (the redirect URIs) or invalid_client_metadata
 * (anything else), defaults applied, and the fields checked against each other.
 */
export function parseRegistration(body: unknown): RegistrationMetadata {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new InvalidClientMetadataError('the body must be a JSON object of client metadata');
  const parsed = metadataSchema.safeParse(body);
  if (!parsed.success) {
    const issues = parsed.error.issues;
    const first = issues[0];
    const summary = issues
      .slice(0, 5)
      .map((i) => `${i.path.join('.') || 'body'}: ${i.message}`)
      .join('; ');
    throw first?.path[0] === 'redirect_uris' ? new InvalidRedirectUriError(summary) : new InvalidClientMetadataError(summary);
  }
  const m = parsed.data;
  const grantTypes = m.grant_types === undefined ? [...DEFAULT_GRANT_TYPES] : REGISTRABLE_GRANT_TYPES.filter((t) => m.grant_types!.includes(t));
  const redirected = grantTypes.includes('authorization_code');
  if (!redirected && !grantTypes.includes(DEVICE_CODE_GRANT)) {
    throw new InvalidClientMetadataError(`grant_types: must include authorization_code or ${DEVICE_CODE_GRANT} (refresh_token alone obtains nothing)`);
  }
  // RFC 7591 §2.1: the code response type goes with the authorization_code grant, and only with it.
  const responseTypes: 'code'[] = redirected ? ['code'] : [];
  if (m.response_types !== undefined && (m.response_types.length > 0) !== redirected) {
    throw new InvalidClientMetadataError(
      redirected ? 'response_types: the authorization_code grant needs the response type code' : 'response_types: code needs the authorization_code grant',
    );
  }
  const redirectUris = [...new Set(m.redirect_uris ?? [])];
  if (redirected && redirectUris.length === 0) throw new InvalidRedirectUriError('redirect_uris: at least one redirect URI is required for the authorization_code grant');
  if (!redirected && redirectUris.length > 0) throw new InvalidClientMetadataError('redirect_uris: only a client with the authorization_code grant has redirect URIs');
  const words = m.scope === undefined ? undefined : [...new Set(m.scope.split(/[ \t\r\n]+/).filter((w) => w !== ''))];
  const management = (words ?? []).filter(isManagementScope);
  if (management.length > 0) {
    throw new InvalidClientMetadataError(`scope: ${management.join(' ')} administers an organization; only its own private applications may hold it`);
  }
  const authMethod = (m.token_endpoint_auth_method as TokenEndpointAuthMethod | undefined) ?? DEFAULT_AUTH_METHOD;
  // Keys with another method are dropped (never used, never echoed).
  const jwks = authMethod === 'private_key_jwt' ? (m.jwks ?? null) : null;
  const keys = clientKeysProblem(authMethod, jwks, null, { allowHttp: false });
  if (keys !== null) throw new InvalidClientMetadataError(`${keys.path}: ${keys.message}`);
  const name = m.client_name !== undefined && m.client_name !== '' ? m.client_name : redirectUris[0] !== undefined ? new URL(redirectUris[0]).hostname : UNNAMED;
  return {
    redirectUris,
    grantTypes,
    responseTypes,
    tokenEndpointAuthMethod: authMethod,
    name,
    scopeWords: words,
    jwks,
    dpopBoundAccessTokens: m.dpop_bound_access_tokens ?? false,
    requirePushedAuthorizationRequests: m.require_pushed_authorization_requests ?? false,
    idTokenSignedResponseAlg: m.id_token_signed_response_alg ?? DEFAULT_ID_TOKEN_ALG,
  };
}

/**
 * The data scopes a client registered with `words` may hold: those it names, or all of them when
 * it names none (it registered only OpenID scopes, or a resource's). The OpenID scopes,
 * offline_access and the scopes a registered resource declares are every client's to ask for and
 * are not recorded; any other name is invalid_client_metadata.
 */
async function registeredScopes(db: DB, words: readonly string[] | undefined): Promise<string[]> {
  if (words === undefined) return [...DATA_SCOPES];
  const data = DATA_SCOPES.filter((s) => words.includes(s));
  const others = words.filter((w) => !(DATA_SCOPES as readonly string[]).includes(w) && !isIdentityScope(w) && w !== 'offline_access');
  if (others.length > 0) {
    const declared = await sql<{ s: string }>`select distinct s from resources, unnest(scopes) s where s = any(${others}::text[])`.execute(db);
    const known = new Set(declared.rows.map((r) => r.s));
    const unknown = others.filter((w) => !known.has(w));
    if (unknown.length > 0) throw new InvalidClientMetadataError(`scope: unknown scope ${unknown.slice(0, 5).map((w) => JSON.stringify(w.slice(0, 40))).join(', ')}`);
  }
  return data.length > 0 ? data : [...DATA_SCOPES];
}

/**
 * Seconds until the address group `group` (addressGroup) may register again, or 0 when it may
 * now: the limit-th most recent of its registrations of the last hour leaves the window then.
 * Read from client_registrations, which deleting a client leaves alone.
 */
async function waitForAddress(db: DB, group: string, limit: number): Promise<number> {
  const row = await db
    .selectFrom('client_registrations')
    .select(sql<number>`ceil(extract(epoch from created_at + interval '1 hour' - now()))::integer`.as('wait'))
    .where('ip', '=', group)
    .where('created_at', '>', sql<Date>`now() - interval '1 hour'`)
    .orderBy('created_at', 'desc')
    .offset(limit - 1)
    .limit(1)
    .executeTakeFirst();
  return row ? Math.max(1, Number(row.wait)) : 0;
}

export interface RegisteredClient {
  application: Application;
  /** Shown once: only its digest is kept. Absent for token_endpoint_auth_method none and private_key_jwt. */
  clientSecret: string | undefined;
  /** RFC 7592: shown once, only its digest is kept. */
  registrationAccessToken: string;
}

/**
 * Registers a client from `ip` (an IP address: clientAddress), within the limits (429 past
 * them): the row, its secret (when it authenticates with one) and its registration access
 * token. The registration is recorded in client_registrations in the same transaction.
 */
export async function registerClient(
  db: DB,
  metadata: RegistrationMetadata,
  request: { ip: string; limits: Pick<ClientRegistrationConfig, 'perAddressPerHour' | 'maxClients'> },
): Promise<RegisteredClient> {
  const scopes = await registeredScopes(db, metadata.scopeWords);
  const withSecret = metadata.tokenEndpointAuthMethod === 'client_secret_basic' || metadata.tokenEndpointAuthMethod === 'client_secret_post';
  const secret = withSecret ? newClientSecret() : undefined;
  const registrationAccessToken = generateSecret(32);
  const group = addressGroup(request.ip);
  const application = await inTransaction(db, async (trx) => {
    await sql`select pg_advisory_xact_lock(${REGISTRATION_LOCK})`.execute(trx);
    const { perAddressPerHour, maxClients } = request.limits;
    if (perAddressPerHour > 0) {
      const wait = await waitForAddress(trx, group, perAddressPerHour);
      if (wait > 0) throw new TooManyAttemptsError(wait, `at most ${perAddressPerHour} client registrations per address per hour; retry later`);
    }
    const live = await trx
      .selectFrom((eb) =>
        eb.selectFrom('applications').select('id').where('registered_ip', 'is not', null).where('registration', '=', 'dynamic').limit(maxClients).as('registered'),
      )
      .select((eb) => eb.fn.countAll<number>().as('n'))
      .executeTakeFirstOrThrow();
    // Room is made by the retention sweep (unused clients) and by clients deleting themselves (RFC 7592).
    if (Number(live.n) >= maxClients) throw new TooManyAttemptsError(3600, 'this server holds as many registered clients as it allows; retry later');
    // Recorded whatever the limit: one set later counts the hour before it too.
    await trx.insertInto('client_registrations').values({ ip: group }).execute();
    return trx
      .insertInto('applications')
      .values({
        organization_id: null,
        client_id: newClientId(),
        client_secret_hash: secret?.hash ?? null,
        type: 'public',
        name: metadata.name,
        redirect_uris: metadata.redirectUris,
        post_logout_redirect_uris: [],
        scopes,
        require_pkce: true,
        registration: 'dynamic',
        token_endpoint_auth_method: metadata.tokenEndpointAuthMethod,
        jwks: metadata.jwks === null ? null : JSON.stringify(metadata.jwks),
        dpop_bound_access_tokens: metadata.dpopBoundAccessTokens,
        require_pushed_authorization_requests: metadata.requirePushedAuthorizationRequests,
        id_token_signed_response_alg: metadata.idTokenSignedResponseAlg,
        grant_types: metadata.grantTypes,
        registration_token_hash: sha256Hex(registrationAccessToken),
        registered_ip: request.ip,
      })
      .returningAll()
      .executeTakeFirstOrThrow();
  });
  return { application, clientSecret: secret?.secret, registrationAccessToken };
}

/**
 * The dynamically registered client `clientId` when `registrationAccessToken` is its RFC 7592
 * registration access token (compared as digests in constant time); undefined otherwise.
 */
export async function findRegisteredClient(db: DB, clientId: string, registrationAccessToken: string): Promise<Application | undefined> {
  if (!CLIENT_ID_PATTERN.test(clientId)) return undefined;
  const application = await db.selectFrom('applications').selectAll().where('client_id', '=', clientId).where('registration', '=', 'dynamic').executeTakeFirst();
  if (!application || !secretMatches(registrationAccessToken, application.registration_token_hash)) return undefined;
  return application;
}

/**
 * Deletes a dynamically registered client (RFC 7592 §2.3): disabled first, so it gets no new
 * grant, then its grants revoked and published (in whichever organizations users granted it),
 * then the row, its codes and its grants go. Returns false when it was gone already.
 */
export async function deleteRegisteredClient(db: DB, application: Pick<Application, 'id' | 'client_id'>, options: ChangeOptions = {}): Promise<boolean> {
  // Any self-registered client (RFC 7592 reaches dynamic ones only; the operator's CLI either kind), never a developer's application.
  await db.updateTable('applications').set({ disabled: true }).where('id', '=', application.id).where('registration', 'in', SELF_REGISTRATIONS).execute();
  options.applications?.forget(application.client_id);
  await revokeGrants(db, { applicationId: application.id }, 'revoked_by_client', options.actor, options.revocations);
  const deleted = await db.deleteFrom('applications').where('id', '=', application.id).where('registration', 'in', SELF_REGISTRATIONS).returning('id').executeTakeFirst();
  options.applications?.forget(application.client_id);
  return deleted !== undefined;
}

/**
 * Records that an application obtained its first token: a self-registered client is then kept by
 * the retention sweep, and the Overview stops listing a developer's application as never used.
 * After tokens were issued (the token endpoint, Generate Token, `orgauth token create`); no query
 * for an application already marked.
 */
export function markClientUsed(db: DB, application: Pick<Application, 'id' | 'first_used_at'>): Promise<void> | undefined {
  // Once: the update publishes the change (migration 0002), every instance's cache then holds
  // first_used_at. Used already (every token request after the first): no promise to await.
  if (application.first_used_at !== null) return undefined;
  return db
    .updateTable('applications')
    .set({ first_used_at: sql`now()` })
    .where('id', '=', application.id)
    .where('first_used_at', 'is', null)
    .execute()
    .then(() => undefined);
}

/** RFC 7591 §3.2.1 / RFC 7592 §3: what the registration and configuration endpoints say about a client. No null values. */
export interface ClientInformation {
  client_id: string;
  client_id_issued_at: number;
  client_secret?: string;
  client_secret_expires_at?: number;
  registration_access_token: string;
  registration_client_uri: string;
  client_name: string;
  redirect_uris: string[];
  grant_types: string[];
  response_types: string[];
  token_endpoint_auth_method: string;
  jwks?: unknown;
  jwks_uri?: string;
  dpop_bound_access_tokens: boolean;
  require_pushed_authorization_requests: boolean;
  id_token_signed_response_alg: string;
  scope: string;
}

export function clientInformation(
  application: Application,
  issuer: string,
  credentials: { registrationAccessToken: string; clientSecret?: string | undefined },
): ClientInformation {
  return {
    client_id: application.client_id,
    client_id_issued_at: Math.floor(application.created_at.getTime() / 1000),
    // RFC 7591 §3.2.1: client_secret_expires_at is required with a secret; 0: it does not expire.
    ...(credentials.clientSecret !== undefined ? { client_secret: credentials.clientSecret, client_secret_expires_at: 0 } : {}),
    registration_access_token: credentials.registrationAccessToken,
    registration_client_uri: `${issuer}/oauth/register/${application.client_id}`,
    client_name: application.name,
    redirect_uris: application.redirect_uris,
    grant_types: application.grant_types,
    response_types: application.grant_types.includes('authorization_code') ? ['code'] : [],
    token_endpoint_auth_method: application.token_endpoint_auth_method,
    ...(application.jwks !== null ? { jwks: application.jwks } : {}),
    ...(application.jwks_uri !== null ? { jwks_uri: application.jwks_uri } : {}),
    dpop_bound_access_tokens: application.dpop_bound_access_tokens,
    require_pushed_authorization_requests: application.require_pushed_authorization_requests,
    id_token_signed_response_alg: application.id_token_signed_response_alg,
    scope: application.scopes.join(' '),
  };
}
