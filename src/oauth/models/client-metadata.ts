/**
 * Client ID Metadata Documents (draft-ietf-oauth-client-id-metadata-document): a `client_id`
 * that is an https URL names a JSON document, served by the client, that says what a developer
 * would otherwise have registered: its name and redirect URIs. Nobody registered such a client,
 * so it gets what self-registered clients get (ARCHITECTURE, issue 26): public, no organization,
 * PKCE required, the data scopes at most, no secret.
 *
 * The document is fetched through the guarded outbound client (AG-1, src/lib/outbound.ts) under
 * a policy of its own: https only, also in development (the draft's §3 wants https, and plain
 * http would let anyone on the path write the client's redirect URIs); no redirects followed
 * (§4: a 3xx is an error); 5 seconds; at most 5 KB (§6.6); the address resolved once, refused
 * when special-use unless CLIENT_METADATA_ALLOW_NETWORKS allows it (not OUTBOUND_ALLOW_NETWORKS,
 * which opens the company network to upstreams an administrator configured: these URLs come
 * from anyone), and the connection made to it.
 *
 * Anyone can make this server fetch a URL by sending it as a client_id, so:
 * - what the error page says does not tell them what answered. A failure to fetch the document,
 *   a status other than 200, a redirect, another media type, a body that is not a JSON object
 *   or whose client_id is not the URL: one message for all ("could not be used"), the reason in
 *   the log. Only a document that names itself (its client_id is the URL) is described: what
 *   is wrong with its content is the client's own business.
 * - fetches of documents not in the cache are limited per address: FETCHES_PER_MINUTE a minute
 *   per address (an IPv6 address with its /64), 429 past it; in memory, per instance.
 * - the documents that have not obtained a token yet (each an applications row) are at most
 *   CLIENT_METADATA_MAX_CLIENTS: past it a document not stored yet is not fetched (503) until
 *   the retention sweep deletes unused ones (UNUSED_CLIENT_TTL). Checked before each fetch, so
 *   concurrent fetches can pass it by a few.
 *
 * A document that passes every check becomes (or updates) an `applications` row with
 * registration 'metadata_document', since grants, codes and tokens reference applications by
 * id; the token endpoint then finds the client as any other (client authentication `none`).
 *
 * Caching (§4.2): how long a fetched document is used without fetching it again comes from the
 * response's Cache-Control / Expires (RFC 9111; this cache serves every user, so it reads them as
 * a shared cache does), within [1 minute, 24 h], 5 minutes when the response says nothing. At
 * least a minute even when the response forbids caching (no-store, no-cache, max-age=0):
 * otherwise each request for such a document, from anyone, would fetch it. Failures are never
 * cached. The entries are few (1000, least recently used dropped) and hold only the expiry:
 * the row itself is read from the database on every use, so a client disabled by an operator is
 * disabled at once, on every instance.
 */
import type { FastifyBaseLogger } from 'fastify';
import { sql } from 'kysely';
import type { Config } from '../../config.js';
import type { DB } from '../../db/connect.js';
import type { Application, GrantType } from '../../db/schema.js';
import { AppError, ServiceUnavailableError } from '../../errors.js';
import { addressGroup } from '../../lib/client-address.js';
import { createOutboundFetch, type OutboundFetch, OutboundRefusedError } from '../../lib/outbound.js';
import { FailureThrottle } from '../../lib/throttle.js';
import { isWellFormed } from '../../lib/validate.js';
import { TooManyAttemptsError } from '../errors.js';
import { MAX_REDIRECT_URIS, redirectUriProblem } from '../helpers/redirect-uris.js';
import { DATA_SCOPES } from '../helpers/scopes.js';
import { MAX_CLIENT_ID_URL_LENGTH } from './applications.js';

/** §6.6: "The recommended maximum response size for client metadata documents is 5 kilobytes." */
export const MAX_DOCUMENT_BYTES = 5 * 1024;
export const FETCH_TIMEOUT_MS = 5000;
/** How long a document is used when its response says nothing about caching. */
export const DEFAULT_FRESHNESS_S = 300;
/** The longest a document is used without fetching it again, whatever its response says. */
export const MAX_FRESHNESS_S = 24 * 3600;
/** The shortest: a document whose response forbids caching is still used this long once fetched. */
export const MIN_FRESHNESS_S = 60;
/** Fetches of documents not in the cache one address (an IPv6 address's /64) may cause in a minute. */
export const FETCHES_PER_MINUTE = 30;
const MAX_CACHE_ENTRIES = 1000;
/** Distinct documents being fetched at once; past it, 503 rather than more sockets and timers. */
const MAX_IN_FLIGHT = 100;
const MAX_NAME_LENGTH = 200;
const DEFAULT_GRANT_TYPES: GrantType[] = ['authorization_code', 'refresh_token'];
const ALLOWED_GRANT_TYPES = new Set<string>(DEFAULT_GRANT_TYPES);

/** What the error page says of a document that could not be fetched, or is not a document naming itself. */
export const UNUSABLE_DOCUMENT = "The application's client metadata document could not be used.";

/**
 * 400: a metadata document URL that cannot be used, or a document that fails a check. The
 * authorization endpoint shows it as an error page and never redirects: without a valid
 * document no redirect URI is known to be the client's (RFC 6749 §4.1.2.1, AZ-2). `reason` says
 * what was wrong, for the log; the description (the page) says it too only when `shown`: for a
 * problem with the URL itself, or with the content of a document whose client_id is its URL.
 * Anything else would tell whoever sent the URL what answered at it.
 */
export class ClientMetadataError extends AppError {
  constructor(
    readonly reason: string,
    options?: ErrorOptions & { shown?: boolean },
  ) {
    super(400, 'invalid_request', options?.shown === true ? `The application's client metadata document cannot be used: ${reason}.` : UNUSABLE_DOCUMENT, options);
  }
}

/** A problem shown on the page: with the URL, or with a document that names itself. */
const shownProblem = (reason: string) => new ClientMetadataError(reason, { shown: true });

/**
 * Why `clientId` cannot be a metadata document URL, or null (§3): https, a path, no dot segments,
 * no fragment, no user info. It must also be written as the URL parser writes it (lower-case
 * host, no default port, dot segments resolved, ...): the document's `client_id` is compared to
 * it as a plain string, so one document has exactly one spelling, and one row.
 */
export function clientIdUrlProblem(clientId: string): string | null {
  if (clientId.length > MAX_CLIENT_ID_URL_LENGTH) return `the URL is longer than ${MAX_CLIENT_ID_URL_LENGTH} characters`;
  if (!URL.canParse(clientId)) return 'the client_id is not a URL';
  const url = new URL(clientId);
  if (url.protocol !== 'https:') return 'the URL must use https';
  if (url.username !== '' || url.password !== '') return 'the URL must not contain a user name or password';
  if (clientId.includes('#')) return 'the URL must not contain a fragment';
  if (url.pathname === '/') return 'the URL must have a path (https://host/path)';
  if (url.href !== clientId) return `the URL must be written in its normal form (${url.href.slice(0, 200)})`;
  return null;
}

/**
 * Seconds a response may be used without fetching it again (RFC 9111 §4.2.1, as a shared cache),
 * bounded by [0, MAX_FRESHNESS_S]. no-store, no-cache and private: 0 (this cache revalidates
 * nothing and serves every user). s-maxage, then max-age, then Expires minus Date; with none,
 * DEFAULT_FRESHNESS_S. A malformed value counts as stale (§5.3: an invalid Expires is in the past).
 */
export function freshnessSeconds(headers: Headers, nowMs: number = Date.now()): number {
  const directives = new Map<string, string | undefined>();
  for (const part of (headers.get('cache-control') ?? '').split(',')) {
    const [rawName = '', ...rest] = part.split('=');
    const name = rawName.trim().toLowerCase();
    if (name === '' || directives.has(name)) continue;
    directives.set(name, rest.length === 0 ? undefined : rest.join('=').trim().replace(/^"(.*)"$/, '$1'));
  }
  if (directives.has('no-store') || directives.has('no-cache') || directives.has('private')) return 0;
  const deltaSeconds = (value: string | undefined) => (value !== undefined && /^[0-9]{1,10}$/.test(value) ? Number(value) : 0);
  let lifetime: number;
  if (directives.has('s-maxage')) lifetime = deltaSeconds(directives.get('s-maxage'));
  else if (directives.has('max-age')) lifetime = deltaSeconds(directives.get('max-age'));
  else if (headers.has('expires')) {
    const expires = Date.parse(headers.get('expires') ?? '');
    const date = Date.parse(headers.get('date') ?? '');
    lifetime = Number.isNaN(expires) ? 0 : Math.floor((expires - (Number.isNaN(date) ? nowMs : date)) / 1000);
  } else lifetime = DEFAULT_FRESHNESS_S;
  const age = deltaSeconds(headers.get('age') ?? undefined);
  return Math.min(MAX_FRESHNESS_S, Math.max(0, lifetime - age));
}

/** What a valid document registers: the row's columns it decides. */
interface ClientMetadata {
  name: string;
  redirectUris: string[];
  grantTypes: GrantType[];
  scopes: string[];
}

const JSON_MEDIA_TYPE = /^application\/(?:[a-z0-9!#$&^_.+-]+\+)?json\s*(?:;.*)?$/i;
/** Control characters, and the bidirectional overrides and isolates that make a name read as another. */
const UNSAFE_NAME_CHARACTERS = /[\u0000-\u001f\u007f-\u009f\u200e\u200f\u202a-\u202e\u2066-\u2069]/;

function has(document: Record<string, unknown>, name: string): boolean {
  return Object.hasOwn(document, name) && document[name] !== undefined;
}

/**
 * The checks of §4.1 and ours on the parsed document; throws ClientMetadataError naming the
 * first failure. Until the document is known to name itself (its client_id is the URL), the
 * failure is not shown: it would say what some server answered.
 */
export function validateDocument(clientId: string, document: unknown): ClientMetadata {
  if (typeof document !== 'object' || document === null || Array.isArray(document)) throw new ClientMetadataError('it is not a JSON object');
  const doc = document as Record<string, unknown>;
  if (doc.client_id !== clientId || !Object.hasOwn(doc, 'client_id')) throw new ClientMetadataError('its client_id is not exactly the URL it was fetched from');
  // From here on the document is the client's own: what is wrong with it is shown.

  // No secret can be agreed on with a document anyone can read (§4.1); nor is private_key_jwt supported.
  if (has(doc, 'client_secret') || has(doc, 'client_secret_expires_at')) throw shownProblem('it contains a client secret');
  if (has(doc, 'token_endpoint_auth_method') && doc.token_endpoint_auth_method !== 'none') {
    throw shownProblem('its token_endpoint_auth_method must be none (or absent)');
  }

  const uris = doc.redirect_uris;
  if (!Array.isArray(uris) || uris.length === 0) throw shownProblem('it has no redirect_uris');
  if (uris.length > MAX_REDIRECT_URIS) throw shownProblem(`it has more than ${MAX_REDIRECT_URIS} redirect_uris`);
  for (const uri of uris) {
    if (typeof uri !== 'string') throw shownProblem('its redirect_uris are not all strings');
    const problem = redirectUriProblem(uri);
    if (problem !== null) throw shownProblem(`the redirect URI ${JSON.stringify(uri.slice(0, 100))} ${problem}`);
  }
  const redirectUris = [...new Set(uris as string[])];

  let grantTypes = DEFAULT_GRANT_TYPES;
  if (has(doc, 'grant_types')) {
    const listed = doc.grant_types;
    if (!Array.isArray(listed) || listed.some((g) => typeof g !== 'string' || !ALLOWED_GRANT_TYPES.has(g))) {
      throw shownProblem('its grant_types may hold only authorization_code and refresh_token');
    }
    // The document is used by the authorization endpoint only, so it must allow what that endpoint gives.
    if (!listed.includes('authorization_code')) throw shownProblem('its grant_types must include authorization_code');
    grantTypes = DEFAULT_GRANT_TYPES.filter((g) => listed.includes(g));
  }
  if (has(doc, 'response_types')) {
    const listed = doc.response_types;
    if (!Array.isArray(listed) || !listed.includes('code')) throw shownProblem('its response_types must include code');
  }

  let scopes: string[] = [...DATA_SCOPES];
  if (has(doc, 'scope')) {
    if (typeof doc.scope !== 'string') throw shownProblem('its scope is not a string');
    const words = doc.scope.split(' ');
    const named = DATA_SCOPES.filter((s) => words.includes(s));
    // A document naming only other scopes (openid, a resource's own) keeps the data scopes: the
    // row needs at least one, and each request's scope and the user's consent bound what is granted.
    if (named.length > 0) scopes = named;
  }

  let name: string;
  if (has(doc, 'client_name')) {
    const sent = doc.client_name;
    if (typeof sent !== 'string') throw shownProblem('its client_name is not a string');
    name = sent.trim();
    if (name === '') throw shownProblem('its client_name is empty');
    if (name.length > MAX_NAME_LENGTH) throw shownProblem(`its client_name is longer than ${MAX_NAME_LENGTH} characters`);
    if (!isWellFormed(name) || UNSAFE_NAME_CHARACTERS.test(name)) throw shownProblem('its client_name contains control or direction-changing characters');
  } else {
    name = new URL(redirectUris[0] ?? clientId).host;
  }
  // logo_uri, client_uri, policy_uri, tos_uri, jwks and the rest are ignored: nothing here shows
  // a remote image or link, and no key-based client authentication is offered.
  return { name, redirectUris, grantTypes, scopes };
}

/** Why a fetch failed: for the log only (the page says UNUSABLE_DOCUMENT). */
function describeFetchFailure(error: unknown): string {
  if (error instanceof OutboundRefusedError) {
    if (error.reason === 'response too large') return `it is larger than ${MAX_DOCUMENT_BYTES / 1024} KB`;
    if (/special-use/.test(error.reason)) return 'its host is at an address this server may not fetch from';
    return 'it could not be fetched';
  }
  if (error instanceof DOMException && error.name === 'TimeoutError') return `it did not arrive within ${FETCH_TIMEOUT_MS / 1000} seconds`;
  const code = (error as NodeJS.ErrnoException | undefined)?.code ?? '';
  if (/CERT|SELF_SIGNED|UNABLE_TO_VERIFY|ERR_TLS|ALTNAME/.test(code)) return "its server's TLS certificate is not trusted";
  return 'its server could not be reached';
}

export class ClientMetadataDocuments {
  private readonly fetch: OutboundFetch;
  private readonly maxClients: number;
  /** Milliseconds on a monotonic clock (performance.now(); tests pass their own). */
  private readonly now: () => number;
  /** client_id → when its document must be fetched again (`now()` milliseconds); in least-recently-used order. */
  private readonly fresh = new Map<string, number>();
  private readonly inFlight = new Map<string, Promise<Application>>();
  /** Fetches caused per address group in the current minute. */
  private readonly fetchesPerAddress: FailureThrottle;

  constructor(
    private readonly db: DB,
    config: Pick<Config, 'outbound' | 'clientMetadata'>,
    private readonly logger: FastifyBaseLogger,
    options: { now?: () => number } = {},
  ) {
    // The instance's trusted CAs, with this use's own networks and limits.
    this.fetch = createOutboundFetch({
      ...config.outbound,
      allowedNetworks: config.clientMetadata.allowedNetworks,
      allowHttp: false,
      timeoutMs: FETCH_TIMEOUT_MS,
      maxBytes: MAX_DOCUMENT_BYTES,
    });
    this.maxClients = config.clientMetadata.maxClients;
    this.now = options.now ?? (() => performance.now());
    this.fetchesPerAddress = new FailureThrottle(FETCHES_PER_MINUTE, 60_000, this.now);
  }

  /**
   * The application a metadata document URL names: from the database while its document is
   * fresh, otherwise fetched, checked and written to the database first. Concurrent calls for
   * one URL share one fetch. `ip`: the address of the request (clientAddress), whose fetches
   * are limited (429). Throws ClientMetadataError when the URL or its document cannot be used.
   * The caller still checks `disabled` and the redirect URI against `redirect_uris`.
   */
  async resolve(clientId: string, request: { ip: string }): Promise<Application> {
    const problem = clientIdUrlProblem(clientId);
    if (problem !== null) throw shownProblem(problem);
    const freshUntil = this.fresh.get(clientId);
    if (freshUntil !== undefined && this.now() < freshUntil) {
      this.fresh.delete(clientId);
      this.fresh.set(clientId, freshUntil);
      const row = await this.db
        .selectFrom('applications')
        .selectAll()
        .where('client_id', '=', clientId)
        .where('registration', '=', 'metadata_document')
        .executeTakeFirst();
      // Gone (deleted by an operator, reaped): fetched and written again below.
      if (row) return row;
    }
    this.fresh.delete(clientId);
    const address = addressGroup(request.ip);
    const wait = this.fetchesPerAddress.retryAfter(address);
    if (wait > 0) {
      this.logger.info({ client_id: clientId }, 'client metadata document not fetched: too many fetches from one address');
      throw new TooManyAttemptsError(wait, `Too many applications were looked up from your network. Wait ${wait} seconds, then try again.`);
    }
    this.fetchesPerAddress.recordFailure(address);
    let pending = this.inFlight.get(clientId);
    if (!pending) {
      if (this.inFlight.size >= MAX_IN_FLIGHT) throw new ServiceUnavailableError('too many client metadata documents are being fetched; retry shortly');
      pending = this.fetchAndStore(clientId).finally(() => this.inFlight.delete(clientId));
      this.inFlight.set(clientId, pending);
    }
    return pending;
  }

  /** 503 when `clientId` has no row yet and CLIENT_METADATA_MAX_CLIENTS unused ones exist (by the partial index of unused clients). */
  private async refuseNewClientWhenFull(clientId: string): Promise<void> {
    const known = await this.db.selectFrom('applications').select('id').where('client_id', '=', clientId).executeTakeFirst();
    if (known) return;
    const { n } = await this.db
      .selectFrom((eb) =>
        eb
          .selectFrom('applications')
          .select('id')
          .where('registration', '=', 'metadata_document')
          .where('first_used_at', 'is', null)
          .limit(this.maxClients)
          .as('unused'),
      )
      .select((eb) => eb.fn.countAll<string>().as('n'))
      .executeTakeFirstOrThrow();
    if (Number(n) < this.maxClients) return;
    this.logger.warn({ client_id: clientId, max_clients: this.maxClients }, 'client metadata document not fetched: CLIENT_METADATA_MAX_CLIENTS unused clients exist');
    // Room is made by the retention sweep (clients that never obtained a token, UNUSED_CLIENT_TTL).
    throw new AppError(503, 'temporarily_unavailable', 'This server holds as many new applications as it allows. Try again later.', { headers: { 'retry-after': '3600' } });
  }

  private async fetchAndStore(clientId: string): Promise<Application> {
    await this.refuseNewClientWhenFull(clientId);
    let response: Response;
    let text: string;
    try {
      response = await this.fetch(clientId, { headers: { accept: 'application/json' }, redirect: 'manual' });
      text = await response.text();
    } catch (error) {
      const reason = describeFetchFailure(error);
      this.logger.info({ client_id: clientId, err: error }, `client metadata document refused: ${reason}`);
      throw new ClientMetadataError(reason, { cause: error });
    }
    const metadata = this.check(clientId, response, text);
    const freshness = Math.max(MIN_FRESHNESS_S, freshnessSeconds(response.headers));
    const application = await this.store(clientId, metadata);
    if (this.fresh.size >= MAX_CACHE_ENTRIES) this.fresh.delete(this.fresh.keys().next().value!);
    this.fresh.set(clientId, this.now() + freshness * 1000);
    return application;
  }

  private check(clientId: string, response: Response, text: string): ClientMetadata {
    try {
      // §4: 200 only, and no redirect followed (the outbound client never follows one).
      if (response.status >= 300 && response.status < 400) throw new ClientMetadataError('its URL answered with a redirect, which is not followed');
      if (response.status !== 200) throw new ClientMetadataError(`its URL answered with HTTP status ${response.status}, not 200`);
      if (!JSON_MEDIA_TYPE.test(response.headers.get('content-type') ?? '')) throw new ClientMetadataError('it is not served as application/json');
      let document: unknown;
      try {
        document = JSON.parse(text);
      } catch {
        throw new ClientMetadataError('it is not valid JSON');
      }
      return validateDocument(clientId, document);
    } catch (error) {
      if (error instanceof ClientMetadataError) this.logger.info({ client_id: clientId }, `client metadata document refused: ${error.reason}`);
      throw error;
    }
  }

  /**
   * Inserts the client's row, or brings it up to date with the document: one statement, so two
   * instances fetching at once both succeed. A row of another kind with this client_id (none of
   * ours looks like a URL) is never overwritten. `disabled` is left as it is: a disabled client
   * stays disabled whatever its document says. updated_at moves only when something changed.
   */
  private async store(clientId: string, metadata: ClientMetadata): Promise<Application> {
    const row = await this.db
      .insertInto('applications')
      .values({
        client_id: clientId,
        organization_id: null,
        client_secret_hash: null,
        type: 'public',
        name: metadata.name,
        redirect_uris: metadata.redirectUris,
        post_logout_redirect_uris: [],
        scopes: metadata.scopes,
        require_pkce: true,
        registration: 'metadata_document',
        token_endpoint_auth_method: 'none',
        grant_types: metadata.grantTypes,
        metadata_fetched_at: sql<Date>`now()`,
      })
      .onConflict((oc) =>
        oc
          .column('client_id')
          .doUpdateSet({
            name: sql<string>`excluded.name`,
            redirect_uris: sql<string[]>`excluded.redirect_uris`,
            scopes: sql<string[]>`excluded.scopes`,
            grant_types: sql<GrantType[]>`excluded.grant_types`,
            metadata_fetched_at: sql<Date>`now()`,
            updated_at: sql<Date>`case
              when (applications.name, applications.redirect_uris, applications.scopes, applications.grant_types)
                is distinct from (excluded.name, excluded.redirect_uris, excluded.scopes, excluded.grant_types)
              then now() else applications.updated_at end`,
          })
          .where('applications.registration', '=', 'metadata_document'),
      )
      .returningAll()
      .executeTakeFirst();
    if (!row) {
      this.logger.warn({ client_id: clientId }, 'a client metadata document URL names an application registered otherwise');
      throw shownProblem('its URL is already the client_id of an application registered otherwise');
    }
    return row;
  }
}
