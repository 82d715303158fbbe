/**
 * Verifying orgauth access tokens in a resource server of your own, with nothing but jose.
 *
 * orgauth's access tokens are JWTs (RFC 9068) signed with the keys it publishes at its
 * `jwks_uri`. A token is for this server when its `aud` is exactly this server's resource URI:
 * orgauth puts there the URI the client named in `resource` (RFC 8707), so a token for orgauth's
 * own API, or for another MCP server, is refused here, as this server's tokens are refused there.
 * Every token carries the organization the user chose at consent (`organization_id`): this server
 * answers for that organization only.
 */
import { createRemoteJWKSet, errors as joseErrors, jwtVerify } from 'jose';

/** RFC 9068 §2.1: the `typ` of a JWT access token. */
const ACCESS_TOKEN_TYPE = 'at+jwt';
/**
 * The algorithms orgauth signs with (its SIGNING_ALG setting), all asymmetric. Fixed here rather
 * than read from the metadata, which names only the current key's: after the operator changes
 * SIGNING_ALG, tokens signed with the old key stay valid until they expire. Each key in the JWKS
 * names its own `alg`, and jose uses a key for that algorithm only; `none` and HMAC never pass.
 */
const ORGAUTH_ALGORITHMS = ['ES256', 'RS256', 'EdDSA'];
/** Seconds of clock difference tolerated between orgauth and this server (exp, iat). */
const CLOCK_TOLERANCE_S = 60;
const DISCOVERY_TIMEOUT_MS = 5000;

/** The canonical form orgauth compares resource URIs in: scheme and host lower-cased, default port and a lone trailing `/` dropped. */
export function canonicalResourceUri(value: string): string {
  const url = new URL(value);
  if (value.includes('#') || url.search !== '' || url.username !== '' || url.password !== '') {
    throw new Error(`${value} cannot be a resource URI: no fragment, query or user info (RFC 8707 §2)`);
  }
  const path = url.pathname.endsWith('/') ? url.pathname.slice(0, -1) : url.pathname;
  return `${url.protocol}//${url.host}${path}`;
}

/** What this server learns from a valid token. */
export interface OrgauthToken {
  token: string;
  /** The organization the user chose at consent; the only one this token may see. */
  organizationId: number;
  /** The user id, or the client_id when an application acts for itself. */
  subject: string;
  clientId: string;
  scopes: string[];
  /** Seconds since the epoch. */
  expiresAt: number;
  /** The token's audience: this server's resource URI. */
  resource: string;
}

/** The token was not acceptable; RFC 6750 §3.1 `invalid_token`. `reason` is for the log, not for the client. */
export class InvalidTokenError extends Error {
  constructor(readonly reason: string) {
    super(`invalid token: ${reason}`);
  }
}

interface AuthorizationServerMetadata {
  issuer: string;
  jwks_uri: string;
}

/**
 * RFC 8414 §3: orgauth's metadata, whose `issuer` must be the issuer asked for (§3.3), so a
 * document served elsewhere cannot name other keys.
 */
export async function discoverOrgauth(issuer: string): Promise<AuthorizationServerMetadata> {
  const base = new URL(issuer);
  const path = base.pathname === '/' ? '' : base.pathname.replace(/\/$/, '');
  const url = new URL(`/.well-known/oauth-authorization-server${path}`, base);
  const res = await fetch(url, { headers: { accept: 'application/json' }, redirect: 'error', signal: AbortSignal.timeout(DISCOVERY_TIMEOUT_MS) });
  if (!res.ok) throw new Error(`${url}: HTTP ${res.status}`);
  const metadata: unknown = await res.json();
  if (typeof metadata !== 'object' || metadata === null) throw new Error(`${url}: not a JSON object`);
  const { issuer: advertised, jwks_uri: jwksUri } = metadata as Record<string, unknown>;
  if (advertised !== issuer) throw new Error(`${url} names the issuer ${String(advertised)}, not ${issuer}`);
  if (typeof jwksUri !== 'string' || !URL.canParse(jwksUri)) throw new Error(`${url} has no jwks_uri`);
  return { issuer, jwks_uri: jwksUri };
}

/** Checks orgauth access tokens for one resource (this server). */
export class OrgauthTokenVerifier {
  private readonly keys: ReturnType<typeof createRemoteJWKSet>;

  private constructor(
    private readonly issuer: string,
    private readonly resource: string,
    jwksUri: string,
  ) {
    // Keys are fetched when first needed, kept, and fetched again for an unknown kid (a rotation).
    this.keys = createRemoteJWKSet(new URL(jwksUri));
  }

  /** Discovers orgauth at `issuer` (its metadata and keys) for tokens whose audience is `resource`. */
  static async create(issuer: string, resource: string): Promise<OrgauthTokenVerifier> {
    const metadata = await discoverOrgauth(issuer);
    return new OrgauthTokenVerifier(metadata.issuer, canonicalResourceUri(resource), metadata.jwks_uri);
  }

  async verify(token: string): Promise<OrgauthToken> {
    let payload;
    try {
      ({ payload } = await jwtVerify(token, this.keys, {
        algorithms: ORGAUTH_ALGORITHMS,
        typ: ACCESS_TOKEN_TYPE,
        issuer: this.issuer,
        // RFC 8707, RFC 9068 §4: a token for any other resource is not for us.
        audience: this.resource,
        requiredClaims: ['exp', 'iat', 'sub', 'client_id', 'scope', 'organization_id'],
        clockTolerance: CLOCK_TOLERANCE_S,
      }));
    } catch (err) {
      if (err instanceof joseErrors.JOSEError) throw new InvalidTokenError(err.code);
      throw err;
    }
    const { organization_id: organizationId, client_id: clientId, scope, sub, exp } = payload;
    if (typeof organizationId !== 'number' || !Number.isSafeInteger(organizationId) || organizationId <= 0) throw new InvalidTokenError('organization_id is not an organization id');
    if (typeof clientId !== 'string' || typeof scope !== 'string' || typeof sub !== 'string' || typeof exp !== 'number') throw new InvalidTokenError('claims of the wrong type');
    return {
      token,
      organizationId,
      subject: sub,
      clientId,
      scopes: scope.split(' ').filter((s) => s !== ''),
      expiresAt: exp,
      resource: this.resource,
    };
  }
}
