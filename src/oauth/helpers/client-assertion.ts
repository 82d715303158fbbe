/**
 * private_key_jwt client authentication: the client proves who it is with a JWT it signed with
 * a private key whose public half it registered, inline (`jwks`) or at a URL (`jwks_uri`)
 * (RFC 7521 §4.2, RFC 7523 §2.2 and §3, OpenID Connect Core §9). The token request carries
 * `client_assertion_type` = CLIENT_ASSERTION_TYPE and the JWT as `client_assertion`; the caller
 * has looked the application up by client_id and hands it here.
 *
 * The assertion (checked in this order: everything that needs no key first, so that a JWT that
 * could never be accepted never causes a fetch of the client's jwks_uri):
 * - a compact JWS (RFC 7515 §7.1) of at most 8 KiB, signed with an algorithm of
 *   CLIENT_ASSERTION_ALGS, the token_endpoint_auth_signing_alg_values_supported. Never `none`,
 *   never HS*: a MAC needs a secret shared with the client (client_secret_jwt, not offered), and
 *   an allow-list is what keeps a public key from being used as an HMAC secret (RFC 8725 §3.1,
 *   §2.1). `typ`, when present, is JWT or client-authentication+jwt (draft-ietf-oauth-rfc7523bis):
 *   a JWT typed as something else (at+jwt, dpop+jwt, logout+jwt) was made for another use (RFC
 *   8725 §3.11). Keys named in the header (jwk, jku, x5u, x5c) are never used (RFC 8725 §3.10).
 * - `iss` and `sub` both the client_id (RFC 7523 §3 points 1 and 2 with §2.2; OIDC Core §9).
 * - `aud` a string, or an array of strings, holding one of the audiences accepted: the issuer
 *   identifier (FAPI 2.0 and rfc7523bis want it) or an endpoint the caller names, the token
 *   endpoint (OIDC Core §9 says so) or the PAR endpoint (RFC 7523 §3 point 3). The issuer is
 *   always accepted. Values are compared as exact strings (RFC 7519 §4.1.3).
 * - `exp` required and after now, with no leeway (§3 point 4: rejecting an expired JWT, the AS
 *   "MAY" allow skew; a client whose clock is behind still signs a valid JWT, one ahead would
 *   have its JWT live longer than it meant). `iat` required (OIDC Core makes it optional; we need
 *   it to bound the lifetime) and at most 60 s in the future; `nbf`, when present, likewise
 *   (§3 points 5 and 6). `exp - iat` at most maxLifetimeSeconds, 300 by default: an assertion
 *   is made for one request, and the replay store keeps each jti until its exp (§3 point 4: the
 *   AS "MAY reject JWTs with an exp claim value that is unreasonably far in the future").
 * - `jti` required, a string of 1 to 256 characters (OIDC Core §9). The replay check is not done
 *   here: `verify` returns jti and exp, and the caller records the jti in the database, single
 *   use until exp across every instance (§3 point 7).
 * - the signature verifies with a registered key (§3 point 9). By `kid` when the header has one
 *   (RFC 7515 §4.1.4; OIDC Core §10.1 wants one when a set has several keys); without one, each
 *   key whose type fits the algorithm is tried, at most 5. A key whose `alg` is set is used only
 *   with that alg (RFC 7517 §4.4); one whose `use` is set only when it is "sig" (§4.2).
 *
 * The keys: public only (a set holding a private or symmetric key is refused whole: whoever
 * published it has lost it), EC P-256/P-384/P-521, RSA of at least 2048 bits (RFC 7518 §3.3)
 * with a sane public exponent (e = 1 would make every message its own signature), OKP Ed25519.
 * `publicJwksSchema` holds a registered set to that; a fetched set may hold other keys (keys
 * for encryption, of other types), which are ignored as RFC 7517 §5 asks. An application has
 * `jwks` or `jwks_uri`, never both (RFC 7591 §2).
 *
 * jwks_uri: a URL the client chose, so it is fetched only through the guarded outbound client
 * (AG-1, src/lib/outbound.ts): the instance's networks and CAs, plain http only where the
 * instance allows it (development: an http ISSUER and NODE_ENV not production), no redirect
 * followed (a 3xx is a failure), 5 seconds, 64 KiB. Only a 200 whose body is a JSON JWK Set is
 * used. The set is cached per client for 5 minutes (keyed by the URL, so a changed jwks_uri is
 * fetched at once); an assertion no cached key verifies (an unknown kid: the client rotated its
 * keys) fetches it again, at most once a minute per client, as openid-client's and jose's remote
 * JWK Sets do, so that a flood of made-up kids costs one fetch a minute. Concurrent
 * verifications share one fetch. A failed fetch is remembered for 10 seconds, so a dead
 * jwks_uri is not asked again by every request. Every failure is an InvalidClientError whose
 * `cause` says what went wrong, for the log; the client sees "client authentication failed".
 *
 * Memory: at most 10,000 clients' sets (least recently used dropped), each at most 20 keys,
 * their imported CryptoKeys with them; an inline set is remembered by a SHA-256 of its JSON.
 */
import { createHash, createPublicKey, KeyObject } from 'node:crypto';
import {
  calculateJwkThumbprint,
  type CryptoKey,
  decodeJwt,
  decodeProtectedHeader,
  errors as joseErrors,
  importJWK,
  type JWK,
  type JWTPayload,
} from 'jose';
import { z } from 'zod';
import type { Config } from '../../config.js';
import { createOutboundFetch, type OutboundFetch, OutboundRefusedError } from '../../lib/outbound.js';
import { isWellFormed } from '../../lib/validate.js';
import { InvalidClientError } from '../errors.js';
import { verifyJwsSignature } from './jws.js';

/** RFC 7523 §2.2: the client_assertion_type of a JWT client assertion. */
export const CLIENT_ASSERTION_TYPE = 'urn:ietf:params:oauth:client-assertion-type:jwt-bearer';
/** token_endpoint_auth_signing_alg_values_supported (RFC 8414 §2). */
export const CLIENT_ASSERTION_ALGS = ['ES256', 'ES384', 'PS256', 'PS384', 'RS256', 'RS384', 'EdDSA'] as const;
export type ClientAssertionAlg = (typeof CLIENT_ASSERTION_ALGS)[number];

/** Characters of a client_assertion: far more than any JWS of a few claims with an RSA-4096 signature. */
export const MAX_ASSERTION_LENGTH = 8 * 1024;
export const DEFAULT_MAX_LIFETIME_S = 300;
/** How far in the future iat and nbf may be (the client's clock ahead of ours). exp gets no leeway. */
export const CLOCK_SKEW_S = 60;
export const MAX_JTI_LENGTH = 256;
/** Keys a registered set may hold; also the most kept of a fetched set. */
export const MAX_REGISTERED_KEYS = 20;
/** A registered set's JSON, and a fetched set's body. */
export const MAX_JWKS_BYTES = 64 * 1024;
export const MAX_KID_LENGTH = 200;
export const MAX_JWKS_URI_LENGTH = 2000;
export const JWKS_FETCH_TIMEOUT_MS = 5000;
/** How long a fetched set is used without fetching it again. */
export const JWKS_FRESH_MS = 5 * 60_000;
/** The least time between two fetches of a client's set caused by an assertion no cached key verifies. */
export const JWKS_REFETCH_INTERVAL_MS = 60_000;
/** How long a failed fetch is remembered: meanwhile the failure is repeated without fetching. */
export const JWKS_FAILURE_RETRY_MS = 10_000;
export const MAX_CACHED_CLIENTS = 10_000;
/** Keys tried for an assertion without a kid; past it the client must name its key. */
const MAX_CANDIDATES = 5;
/** Keys a fetched set may hold at all (ignored ones included). */
const MAX_FETCHED_KEYS = 100;
const MIN_RSA_BITS = 2048;
/** OpenSSL's OPENSSL_RSA_MAX_MODULUS_BITS: a larger key cannot verify anything. */
const MAX_RSA_BITS = 16384;
/** Members of a private (or symmetric) JWK (RFC 7518 §6.2.2, §6.3.2, §6.4.1; RFC 8037 §2). */
const PRIVATE_MEMBERS = ['d', 'p', 'q', 'dp', 'dq', 'qi', 'oth', 'k'] as const;
const EC_CURVES = new Set(['P-256', 'P-384', 'P-521']);
const BASE64URL = /^[A-Za-z0-9_-]+$/;
/**
 * Three base64url parts; the signature may be empty here so that `alg: none` is refused by name.
 * An unencoded payload (RFC 7797 b64: false) never matches: JSON claims hold a "{".
 */
const COMPACT_JWS = /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/;
/** `typ` values (lower case, without "application/", RFC 7515 §4.1.9) a client assertion may carry. */
const ACCEPTED_TYPES = new Set(['jwt', 'client-authentication+jwt']);

const isAlg = (value: unknown): value is ClientAssertionAlg => (CLIENT_ASSERTION_ALGS as readonly unknown[]).includes(value);
const isObject = (value: unknown): value is Record<string, unknown> => typeof value === 'object' && value !== null && !Array.isArray(value);
/** A value from someone else's JSON, short enough for a log line. */
const show = (value: unknown): string => (value === undefined ? '(absent)' : (JSON.stringify(value) ?? String(value)).slice(0, 100));

/** A public key that passed every check: what is kept of it. */
interface CheckedKey {
  kty: 'EC' | 'RSA' | 'OKP';
  crv: string | undefined;
  kid: string | undefined;
  alg: ClientAssertionAlg | undefined;
  /** The public members only (kty, crv, x, y / n, e): what is imported and thumbprinted. */
  material: JWK;
  /** What a registered set stores: the material with kid, use and alg. */
  jwk: JWK;
}

type KeyCheck = { key: CheckedKey } | { problem: string; private: boolean };

/** Whether `key` may verify a JWS made with `alg`: its type and curve fit, and its own alg, if any, is that one. */
function fits(key: Pick<CheckedKey, 'kty' | 'crv' | 'alg'>, alg: ClientAssertionAlg): boolean {
  if (key.alg !== undefined && key.alg !== alg) return false;
  switch (alg) {
    case 'ES256':
      return key.kty === 'EC' && key.crv === 'P-256';
    case 'ES384':
      return key.kty === 'EC' && key.crv === 'P-384';
    case 'EdDSA':
      return key.kty === 'OKP' && key.crv === 'Ed25519';
    default:
      return key.kty === 'RSA';
  }
}

/** The checks of one JWK (from a registration or a fetched set). Problems read after "key 2 ". */
function checkKey(value: unknown): KeyCheck {
  if (!isObject(value)) return { problem: 'is not a JSON object', private: false };
  if (value.kty === 'oct') return { problem: 'is a symmetric key (kty oct); register a public key', private: true };
  if (PRIVATE_MEMBERS.some((member) => Object.hasOwn(value, member))) return { problem: 'is a private key; register only the public half', private: true };
  const { kty } = value;
  if (kty !== 'EC' && kty !== 'RSA' && kty !== 'OKP') {
    return { problem: kty === undefined ? 'has no kty' : `has kty ${show(kty)}; only EC, RSA and OKP keys are accepted`, private: false };
  }
  const kid = value.kid;
  if (kid !== undefined && (typeof kid !== 'string' || kid.length === 0 || kid.length > MAX_KID_LENGTH || !isWellFormed(kid))) {
    return { problem: `has a kid that is not a string of 1 to ${MAX_KID_LENGTH} characters`, private: false };
  }
  if (value.use !== undefined && value.use !== 'sig') return { problem: `has use ${show(value.use)}; a key for client authentication has use "sig" or none`, private: false };
  const ops = value.key_ops;
  if (ops !== undefined && (!Array.isArray(ops) || !ops.includes('verify'))) return { problem: 'has key_ops without "verify"', private: false };
  const alg = value.alg;
  if (alg !== undefined && !isAlg(alg)) return { problem: `has alg ${show(alg)}; use one of ${CLIENT_ASSERTION_ALGS.join(', ')} (or none)`, private: false };

  const crv = typeof value.crv === 'string' ? value.crv : undefined;
  const coordinate = (name: string): string | undefined => {
    const member = value[name];
    return typeof member === 'string' && member.length <= 4096 && BASE64URL.test(member) ? member : undefined;
  };
  let material: JWK;
  if (kty === 'EC') {
    if (crv === undefined || !EC_CURVES.has(crv)) return { problem: `is an EC key on curve ${show(value.crv)}; use P-256, P-384 or P-521`, private: false };
    const x = coordinate('x');
    const y = coordinate('y');
    if (x === undefined || y === undefined) return { problem: 'is an EC key without base64url x and y', private: false };
    material = { kty, crv, x, y };
  } else if (kty === 'OKP') {
    if (crv !== 'Ed25519') return { problem: `is an OKP key on curve ${show(value.crv)}; only Ed25519 (EdDSA) is accepted`, private: false };
    const x = coordinate('x');
    if (x === undefined) return { problem: 'is an OKP key without a base64url x', private: false };
    material = { kty, crv, x };
  } else {
    const n = coordinate('n');
    const e = coordinate('e');
    if (n === undefined || e === undefined) return { problem: 'is an RSA key without base64url n and e', private: false };
    material = { kty, n, e };
  }
  // node:crypto parses the material as OpenSSL will use it: a point off its curve, a coordinate
  // of the wrong length or a malformed modulus fails here rather than at the first assertion.
  let details: { modulusLength?: number | undefined; publicExponent?: bigint | undefined } | undefined;
  try {
    details = createPublicKey({ key: material, format: 'jwk' }).asymmetricKeyDetails;
  } catch {
    return { problem: `is not a valid ${kty}${crv === undefined ? '' : ` ${crv}`} public key`, private: false };
  }
  if (kty === 'RSA') {
    const bits = details?.modulusLength ?? 0;
    if (bits < MIN_RSA_BITS) return { problem: `is a ${bits}-bit RSA key; use at least ${MIN_RSA_BITS} bits`, private: false };
    if (bits > MAX_RSA_BITS) return { problem: `is a ${bits}-bit RSA key; at most ${MAX_RSA_BITS} bits are supported`, private: false };
    const exponent = details?.publicExponent ?? 0n;
    if (exponent < 3n || exponent % 2n === 0n) return { problem: `has an unsafe RSA public exponent (${exponent})`, private: false };
  }
  if (alg !== undefined && !fits({ kty, crv, alg: undefined }, alg)) {
    return { problem: `has alg ${alg}, which does not fit an ${kty}${crv === undefined ? '' : ` ${crv}`} key`, private: false };
  }
  const jwk: JWK = { ...material };
  if (kid !== undefined) jwk.kid = kid;
  if (value.use !== undefined) jwk.use = 'sig';
  if (alg !== undefined) jwk.alg = alg;
  return { key: { kty, crv, kid, alg, material, jwk } };
}

/**
 * A registered public JWK Set (RFC 7517 §5), as the management API and the CLI take `jwks`:
 * 1 to 20 keys, each public, of a type and size above, ≤ 64 KiB of JSON, no kid twice. The
 * output keeps of each key its public members, kid, use and alg (key_ops, x5c and the rest are
 * dropped: nothing here reads them). Messages name the key by position, from 1.
 */
export const publicJwksSchema: z.ZodType<{ keys: JWK[] }> = z
  .object(
    {
      keys: z
        .array(z.unknown(), 'must be an array of JWKs')
        .min(1, 'a JWK Set needs at least one key')
        .max(MAX_REGISTERED_KEYS, `at most ${MAX_REGISTERED_KEYS} keys can be registered`),
    },
    'a JWK Set is a JSON object with a "keys" array',
  )
  .transform((set, ctx) => {
    let size = Infinity;
    try {
      size = Buffer.byteLength(JSON.stringify(set));
    } catch {
      // Not JSON (a BigInt, a cycle): too large, as far as this schema is concerned.
    }
    if (size > MAX_JWKS_BYTES) {
      ctx.issues.push({ code: 'custom', message: `the JWK Set is larger than ${MAX_JWKS_BYTES / 1024} KiB`, input: set });
      return z.NEVER;
    }
    const keys: JWK[] = [];
    const kids = new Map<string, number>();
    set.keys.forEach((value, index) => {
      const result = checkKey(value);
      if ('problem' in result) {
        ctx.issues.push({ code: 'custom', message: `key ${index + 1} ${result.problem}`, path: ['keys', index], input: value });
        return;
      }
      const { kid } = result.key;
      const earlier = kid === undefined ? undefined : kids.get(kid);
      if (earlier !== undefined) {
        ctx.issues.push({ code: 'custom', message: `key ${index + 1} has the same kid as key ${earlier}`, path: ['keys', index, 'kid'], input: value });
        return;
      }
      if (kid !== undefined) kids.set(kid, index + 1);
      keys.push(result.key.jwk);
    });
    return keys.length === set.keys.length ? { keys } : z.NEVER;
  });

/**
 * Why `uri` cannot be a jwks_uri, or null when it can: absolute, https (http only with
 * `allowHttp`, i.e. config.outbound.allowHttp), no fragment, no user info, no spaces or control
 * characters, at most 2000 characters. The problem reads after the URI ("... must use https").
 */
export function jwksUriProblem(uri: string, options: { allowHttp: boolean }): string | null {
  if (uri.length > MAX_JWKS_URI_LENGTH) return `must be at most ${MAX_JWKS_URI_LENGTH} characters`;
  // The URL parser drops tabs and newlines and trims the ends: what is fetched must be what was registered.
  if (/[\s\x00-\x1f\x7f]/.test(uri)) return 'must not contain spaces or control characters';
  if (!isWellFormed(uri)) return 'must be well-formed Unicode';
  if (!URL.canParse(uri)) return 'must be an absolute URL';
  const url = new URL(uri);
  if (url.protocol !== 'https:' && !(url.protocol === 'http:' && options.allowHttp)) return options.allowHttp ? 'must use https or http' : 'must use https';
  if (uri.includes('#')) return 'must not contain a fragment';
  if (url.username !== '' || url.password !== '' || /^[a-z][a-z0-9+.-]*:\/\/[^/?]*@/i.test(uri)) return 'must not contain user info';
  return null;
}

/**
 * What is wrong with a client's keys as registered beside its token_endpoint_auth_method, or
 * null: private_key_jwt needs `jwks` or `jwks_uri` (one, never both: RFC 7591 §2), and keys are
 * registered for it only (this server reads them for nothing else). `path` names the field.
 */
export function clientKeysProblem(
  method: string,
  jwks: unknown,
  jwksUri: string | null,
  options: { allowHttp: boolean },
): { path: 'jwks' | 'jwks_uri' | 'token_endpoint_auth_method'; message: string } | null {
  if (jwks !== null && jwksUri !== null) return { path: 'jwks', message: 'register the keys inline (jwks) or at a URL (jwks_uri), not both' };
  if (jwksUri !== null) {
    const problem = jwksUriProblem(jwksUri, options);
    if (problem !== null) return { path: 'jwks_uri', message: problem };
  }
  if (method === 'private_key_jwt' && jwks === null && jwksUri === null) return { path: 'jwks', message: 'private_key_jwt needs the public keys: jwks or jwks_uri' };
  if (method !== 'private_key_jwt' && (jwks !== null || jwksUri !== null)) return { path: 'token_endpoint_auth_method', message: 'jwks and jwks_uri are for private_key_jwt' };
  return null;
}

/** The application as far as its keys go: the row found by client_id. */
export interface AssertionClient {
  client_id: string;
  jwks: { keys: JWK[] } | null;
  jwks_uri: string | null;
}

export interface VerifiedAssertion {
  /** For the replay store: single use until `exp`. */
  jti: string;
  /** The assertion's exp, in seconds since the epoch, rounded up to a whole second. */
  exp: number;
  /** The key's kid or thumbprint, for logs */
  keyId: string;
}

/** A key of a set as cached: its imports (one per alg: an RSA key without alg may serve RS256 and PS256) and its id. */
interface CachedKey extends CheckedKey {
  imported: Map<ClientAssertionAlg, CryptoKey>;
  keyId: string | undefined;
}

interface KeySet {
  keys: CachedKey[];
  /** Why keys of the set are not used, for the cause of a refusal. */
  ignored: string[];
}

interface CacheEntry {
  /** What the set was read from: `jwks_uri <uri>`, or `jwks <sha-256 of its JSON>`. */
  source: string;
  /** The inline set object this entry was last checked against (a quick test before hashing). */
  inline: object | undefined;
  set: KeySet | undefined;
  /** When `set` was fetched (now() ms). */
  fetchedAt: number;
  /** When the last fetch started, whatever came of it. */
  lastFetchAt: number;
  failure: { cause: Error; at: number } | undefined;
  inFlight: Promise<KeySet> | undefined;
}

type Attempt = { ok: true; key: CachedKey } | { ok: false; reason: string; refetch: boolean };

/** Reads a JWK Set (registered or fetched): usable keys kept, others noted; a private key anywhere refuses the set. */
function readKeySet(document: unknown, label: string): KeySet {
  if (!isObject(document) || !Array.isArray(document.keys)) throw new Error(`${label} is not a JWK Set (a JSON object with a "keys" array)`);
  if (document.keys.length > MAX_FETCHED_KEYS) throw new Error(`${label} has more than ${MAX_FETCHED_KEYS} keys`);
  const keys: CachedKey[] = [];
  const ignored: string[] = [];
  document.keys.forEach((value: unknown, index) => {
    const result = checkKey(value);
    if ('problem' in result) {
      if (result.private) throw new Error(`${label}: key ${index + 1} ${result.problem}`);
      ignored.push(`key ${index + 1} ${result.problem}`);
    } else if (keys.length >= MAX_REGISTERED_KEYS) ignored.push(`key ${index + 1} is past the first ${MAX_REGISTERED_KEYS} usable keys`);
    else keys.push({ ...result.key, imported: new Map(), keyId: undefined });
  });
  if (keys.length === 0) throw new Error(`${label} has no key usable for signatures${ignored.length > 0 ? ` (${ignored.join('; ').slice(0, 500)})` : ''}`);
  return { keys, ignored };
}

/** Why a fetch of a jwks_uri failed: for the cause. */
function describeFetchFailure(error: unknown): string {
  if (error instanceof OutboundRefusedError) {
    if (error.reason === 'response too large') return `the answer is larger than ${MAX_JWKS_BYTES / 1024} KiB`;
    return error.reason;
  }
  if (error instanceof DOMException && error.name === 'TimeoutError') return `no answer within ${JWKS_FETCH_TIMEOUT_MS / 1000} seconds`;
  const code = (error as NodeJS.ErrnoException | undefined)?.code ?? '';
  if (/CERT|SELF_SIGNED|UNABLE_TO_VERIFY|ERR_TLS|ALTNAME/.test(code)) return `its server's TLS certificate is not trusted (${code})`;
  return `its server could not be reached${code === '' ? '' : ` (${code})`}`;
}

export class ClientAssertionVerifier {
  private readonly fetch: OutboundFetch;
  private readonly now: () => number;
  private readonly maxLifetimeSeconds: number;
  private readonly issuer: string;
  private readonly allowHttp: boolean;
  /** client_id → its keys; in least-recently-used order. */
  private readonly cache = new Map<string, CacheEntry>();

  constructor(
    config: Pick<Config, 'issuer' | 'outbound'>,
    options: { now?: () => number; fetch?: OutboundFetch; maxLifetimeSeconds?: number } = {},
  ) {
    this.issuer = config.issuer;
    // http only where the instance allows it anywhere (development); see jwksUriProblem.
    this.allowHttp = config.outbound.allowHttp;
    // The instance's networks and trusted CAs, with this use's own limits.
    this.fetch =
      options.fetch ??
      createOutboundFetch({ ...config.outbound, allowHttp: config.outbound.allowHttp, timeoutMs: JWKS_FETCH_TIMEOUT_MS, maxBytes: MAX_JWKS_BYTES });
    this.now = options.now ?? Date.now;
    this.maxLifetimeSeconds = options.maxLifetimeSeconds ?? DEFAULT_MAX_LIFETIME_S;
  }

  /**
   * Verifies `assertion` for `client` (the application already looked up by client_id).
   * `endpoints`: the audiences accepted besides the issuer, the token endpoint URL (and the PAR
   * endpoint URL). `issuerOnly`: aud must be the issuer identifier as a single string, as FAPI 2.0
   * requires (§5.3.2.1: against audience injection, an assertion made for another server's
   * endpoint). Throws InvalidClientError, with a `cause` saying why, for every failure.
   */
  async verify(client: AssertionClient, assertion: string, endpoints: readonly string[], options: { issuerOnly?: boolean } = {}): Promise<VerifiedAssertion> {
    try {
      const { alg, kid, jti, exp } = this.inspect(client, assertion, options.issuerOnly ? [] : endpoints, options.issuerOnly ?? false);
      const { entry, uri } = this.entryFor(client);
      let set = uri === null ? entry.set! : await this.remoteSet(entry, uri);
      let attempt = await this.tryKeys(set, assertion, alg, kid);
      if (!attempt.ok && attempt.refetch && uri !== null) {
        // No cached key verifies: the client may have rotated its keys. Join a fetch under way,
        // or start one if none started in the last minute.
        const pending = entry.inFlight ?? (this.now() - entry.lastFetchAt >= JWKS_REFETCH_INTERVAL_MS ? this.fetchSet(entry, uri) : undefined);
        if (pending !== undefined) {
          const fresh = await pending;
          if (fresh !== set) {
            set = fresh;
            attempt = await this.tryKeys(set, assertion, alg, kid);
          }
        }
      }
      if (!attempt.ok) throw new Error(attempt.reason);
      attempt.key.keyId ??= attempt.key.kid ?? (await calculateJwkThumbprint(attempt.key.material, 'sha256'));
      return { jti, exp: Math.ceil(exp), keyId: attempt.key.keyId };
    } catch (error) {
      if (error instanceof InvalidClientError) throw error;
      throw new InvalidClientError({ cause: error });
    }
  }

  /** Drop the cached keys of a client (the app changed its jwks_uri or keys). */
  forget(clientId: string): void {
    this.cache.delete(clientId);
  }

  /** Every check that needs no key: the form, the header and the claims. Throws an Error naming the first failure. */
  private inspect(client: AssertionClient, assertion: string, endpoints: readonly string[], issuerOnly = false) {
    if (typeof assertion !== 'string' || assertion === '') throw new Error('the client_assertion is empty');
    if (assertion.length > MAX_ASSERTION_LENGTH) throw new Error(`the client_assertion is longer than ${MAX_ASSERTION_LENGTH} characters`);
    if (!COMPACT_JWS.test(assertion)) throw new Error('the client_assertion is not a compact JWS (three base64url parts)');
    let header: ReturnType<typeof decodeProtectedHeader>;
    let claims: JWTPayload;
    try {
      header = decodeProtectedHeader(assertion);
      claims = decodeJwt(assertion);
    } catch (error) {
      throw new Error('the client_assertion is not a JWT (its header or claims are not JSON objects)', { cause: error });
    }
    const { alg, kid, typ } = header;
    if (!isAlg(alg)) throw new Error(`its alg ${show(alg)} is not accepted; use one of ${CLIENT_ASSERTION_ALGS.join(', ')}`);
    if (kid !== undefined && (typeof kid !== 'string' || kid.length === 0 || kid.length > MAX_KID_LENGTH)) {
      throw new Error(`its kid is not a string of 1 to ${MAX_KID_LENGTH} characters`);
    }
    if (typ !== undefined && (typeof typ !== 'string' || !ACCEPTED_TYPES.has(typ.toLowerCase().replace(/^application\//, '')))) {
      throw new Error(`its typ ${show(typ)} names another kind of token; a client assertion has typ JWT, client-authentication+jwt or none`);
    }

    const clientId = client.client_id;
    if (claims.iss !== clientId) throw new Error(`its iss ${show(claims.iss)} is not the client_id`);
    if (claims.sub !== clientId) throw new Error(`its sub ${show(claims.sub)} is not the client_id`);
    const { aud } = claims;
    if (issuerOnly && aud !== this.issuer) throw new Error(`its aud ${show(aud)} is not the issuer identifier ${this.issuer} as a single string (FAPI 2.0)`);
    const audiences = typeof aud === 'string' ? [aud] : Array.isArray(aud) && aud.every((a) => typeof a === 'string') ? aud : undefined;
    if (audiences === undefined || audiences.length === 0) throw new Error(`its aud ${show(aud)} is not a string or a non-empty array of strings`);
    const accepted = new Set([this.issuer, ...endpoints]);
    if (!audiences.some((a) => accepted.has(a))) throw new Error(`its aud ${show(aud)} names none of ${[...accepted].join(', ')}`);

    const now = this.now() / 1000;
    const { exp, iat, nbf, jti } = claims;
    if (typeof exp !== 'number' || !Number.isFinite(exp)) throw new Error(`it has no exp (a number), ${show(exp)}`);
    if (typeof iat !== 'number' || !Number.isFinite(iat)) throw new Error(`it has no iat (a number), ${show(iat)}`);
    if (exp <= now) throw new Error(`it expired ${Math.floor(now - exp)} s ago (exp ${exp})`);
    if (iat > now + CLOCK_SKEW_S) throw new Error(`its iat is ${Math.ceil(iat - now)} s in the future`);
    if (nbf !== undefined) {
      if (typeof nbf !== 'number' || !Number.isFinite(nbf)) throw new Error(`its nbf is not a number, ${show(nbf)}`);
      if (nbf > now + CLOCK_SKEW_S) throw new Error(`it is not valid before ${Math.ceil(nbf - now)} s from now (nbf)`);
    }
    if (exp <= iat) throw new Error('its exp is not after its iat');
    if (exp - iat > this.maxLifetimeSeconds) throw new Error(`it is valid for ${Math.ceil(exp - iat)} s (exp - iat), more than ${this.maxLifetimeSeconds} s`);
    if (typeof jti !== 'string' || jti.length === 0 || jti.length > MAX_JTI_LENGTH) throw new Error(`it has no jti (a string of 1 to ${MAX_JTI_LENGTH} characters), ${show(jti)}`);
    return { alg, kid: kid as string | undefined, jti, exp };
  }

  /**
   * The client's cache entry, made or replaced when its keys' source changed; least recently used
   * last. For an inline set, the entry holds the set read; for a jwks_uri, whatever was fetched.
   */
  private entryFor(client: AssertionClient): { entry: CacheEntry; uri: string | null } {
    const { client_id: clientId, jwks, jwks_uri: uri } = client;
    if (jwks !== null && uri !== null) throw new Error('the application has both jwks and jwks_uri (RFC 7591 §2: one or the other)');
    if (jwks === null && uri === null) throw new Error('the application has no registered keys (neither jwks nor jwks_uri)');
    let entry = this.cache.get(clientId);
    if (jwks !== null) {
      if (entry === undefined || entry.inline !== jwks) {
        const source = `jwks ${createHash('sha256').update(JSON.stringify(jwks)).digest('base64url')}`;
        if (entry?.source !== source) entry = this.newEntry(source, readKeySet(jwks, 'the registered JWK Set'));
        entry.inline = jwks;
      }
    } else {
      const source = `jwks_uri ${uri}`;
      if (entry?.source !== source) entry = this.newEntry(source, undefined);
    }
    this.cache.delete(clientId);
    if (this.cache.size >= MAX_CACHED_CLIENTS) this.cache.delete(this.cache.keys().next().value!);
    this.cache.set(clientId, entry);
    return { entry, uri };
  }

  private newEntry(source: string, set: KeySet | undefined): CacheEntry {
    return { source, inline: undefined, set, fetchedAt: -Infinity, lastFetchAt: -Infinity, failure: undefined, inFlight: undefined };
  }

  /** The fetched set while fresh; otherwise a fetch (joined when one is under way, refused while a failure is remembered). */
  private async remoteSet(entry: CacheEntry, uri: string): Promise<KeySet> {
    if (entry.set !== undefined && this.now() - entry.fetchedAt < JWKS_FRESH_MS) return entry.set;
    if (entry.inFlight !== undefined) return entry.inFlight;
    const { failure } = entry;
    if (failure !== undefined && this.now() - failure.at < JWKS_FAILURE_RETRY_MS) {
      throw new Error(`${failure.cause.message} (${Math.floor((this.now() - failure.at) / 1000)} s ago; not fetched again yet)`, { cause: failure.cause });
    }
    return this.fetchSet(entry, uri);
  }

  /** Fetches the set into `entry`, shared by whoever asks meanwhile. Rejects with an Error saying why. */
  private fetchSet(entry: CacheEntry, uri: string): Promise<KeySet> {
    entry.lastFetchAt = this.now();
    const pending: Promise<KeySet> = this.download(uri)
      .then(
        (set) => {
          entry.set = set;
          entry.fetchedAt = this.now();
          entry.failure = undefined;
          return set;
        },
        (error: unknown) => {
          const cause = error instanceof Error ? error : new Error(String(error));
          entry.failure = { cause, at: this.now() };
          throw cause;
        },
      )
      .finally(() => {
        if (entry.inFlight === pending) entry.inFlight = undefined;
      });
    entry.inFlight = pending;
    return pending;
  }

  private async download(uri: string): Promise<KeySet> {
    const problem = jwksUriProblem(uri, { allowHttp: this.allowHttp });
    if (problem !== null) throw new Error(`the jwks_uri ${problem}`);
    let response: Response;
    let text: string;
    try {
      response = await this.fetch(uri, { headers: { accept: 'application/jwk-set+json, application/json' }, redirect: 'manual' });
      text = await response.text();
    } catch (error) {
      throw new Error(`the jwks_uri could not be fetched: ${describeFetchFailure(error)}`, { cause: error });
    }
    if (response.status >= 300 && response.status < 400) throw new Error(`the jwks_uri answered with a redirect (HTTP ${response.status}), which is not followed`);
    if (response.status !== 200) throw new Error(`the jwks_uri answered with HTTP status ${response.status}, not 200`);
    let document: unknown;
    try {
      document = JSON.parse(text);
    } catch {
      throw new Error('the jwks_uri did not answer with JSON');
    }
    return readKeySet(document, 'the JWK Set at the jwks_uri');
  }

  /**
   * Tries the keys of `set` that may have signed the assertion. `refetch`: whether a newer set
   * could verify it (no key matched, or none verified), as opposed to a refusal no set changes.
   */
  private async tryKeys(set: KeySet, assertion: string, alg: ClientAssertionAlg, kid: string | undefined): Promise<Attempt> {
    const named = kid === undefined ? set.keys : set.keys.filter((k) => k.kid === kid);
    const candidates = named.filter((k) => fits(k, alg));
    if (candidates.length === 0) {
      const ignored = set.ignored.length > 0 ? ` (not used: ${set.ignored.join('; ').slice(0, 300)})` : '';
      if (kid === undefined) return { ok: false, reason: `no registered key fits alg ${alg}${ignored}`, refetch: true };
      if (named.length > 0) return { ok: false, reason: `the registered key with kid ${show(kid)} does not fit alg ${alg}`, refetch: true };
      return { ok: false, reason: `no registered key has kid ${show(kid)}${ignored}`, refetch: true };
    }
    if (candidates.length > MAX_CANDIDATES) {
      return { ok: false, reason: `${candidates.length} registered keys fit alg ${alg}; the assertion must name its key with kid`, refetch: false };
    }
    for (const key of candidates) {
      let cryptoKey = key.imported.get(alg);
      if (cryptoKey === undefined) {
        const imported = await importJWK(key.material, alg);
        if (imported instanceof Uint8Array) throw new Error('a registered key imported as a secret');
        key.imported.set(alg, imported);
        cryptoKey = imported;
      }
      try {
        if (await signatureVerifies(assertion, cryptoKey, alg)) return { ok: true, key };
      } catch (error) {
        return { ok: false, reason: `the client_assertion could not be verified: ${error instanceof Error ? error.message : String(error)}`, refetch: false };
      }
    }
    const which = kid !== undefined ? `the registered key with kid ${show(kid)}` : candidates.length === 1 ? 'the registered key' : `any of the ${candidates.length} registered keys that fit`;
    return { ok: false, reason: `its signature does not verify with ${which}`, refetch: true };
  }
}

/**
 * Whether the compact JWS's signature verifies with `key` under `alg`. The header was checked by
 * `inspect`; a `crit` header names an extension we do not implement, so it is refused (RFC 7515
 * §4.1.11).
 */
function signatureVerifies(assertion: string, key: CryptoKey, alg: ClientAssertionAlg): Promise<boolean> {
  const [header = '', payload = '', signature = ''] = assertion.split('.');
  if ('crit' in decodeProtectedHeader(assertion)) throw new Error('its header has crit, naming extensions this server does not implement');
  return verifyJwsSignature(alg, Buffer.from(`${header}.${payload}`), Buffer.from(signature, 'base64url'), KeyObject.from(key));
}
