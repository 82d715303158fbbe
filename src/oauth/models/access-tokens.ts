/**
 * Access tokens: JWTs per RFC 9068, signed with the active key. The API (and introspection)
 * verify them here: algorithm allow-list, `typ: at+jwt`, iss, aud, exp/iat with 60 s leeway,
 * keys by kid from our own store only.
 */
import { randomUUID } from 'node:crypto';
import { errors as joseErrors, jwtVerify } from 'jose';
import { z } from 'zod';
import { type Config, SIGNING_ALGS } from '../../config.js';
import { AppError } from '../../errors.js';
import { type KeyStore, type SigningKeyMaterial, signJws } from './key-store.js';
import type { FindApplication } from './application-cache.js';
import type { Application } from '../../db/schema.js';
import { isIdentityScope, isKnownScope } from '../helpers/scopes.js';
import { requiresDpop } from '../helpers/fapi.js';
import { apiResourceUri, LEGACY_API_PATH, type TokenResource } from './resources.js';

export const ACCESS_TOKEN_TYPE = 'at+jwt';
export const CLOCK_TOLERANCE_S = 60;

/** The audiences orgauth's API accepts: its resource URI, and the one tokens carried before resources (RFC 8707) existed. */
export const apiAudiences = (config: Pick<Config, 'issuer'>): string[] => [apiResourceUri(config), `${config.issuer}${LEGACY_API_PATH}`];

export interface AccessTokenInput {
  /** The user id, or the client_id when the application acts for itself. */
  subject: string;
  clientId: string;
  scopes: readonly string[];
  organizationId: number;
  grantId: number;
  /** What the token is for: its `aud` and lifetime. */
  resource: Pick<TokenResource, 'uri' | 'accessTokenTtl'>;
  /** The member's custom role: the API holds the token to that role's permissions as they are now (RoleScopes). */
  roleId?: number | null | undefined;
  /** RFC 9449 §6: the thumbprint of the DPoP key the token is bound to (its `cnf.jkt`). */
  dpopJkt?: string | null | undefined;
  /** RFC 8693 §4.1: who acts for the subject (token exchange with an actor), the current actor outermost. */
  act?: ActClaim | undefined;
  /** Seconds since the epoch the token may not outlive (token exchange: its subject token's exp). */
  notAfter?: number | undefined;
}

/** RFC 8693 §4.1 `act`: the acting party (a client id), and the one it acted for before, nested. */
export interface ActClaim {
  sub: string;
  act?: ActClaim;
}

/** How deep an `act` chain may nest: each exchange with an actor adds one. */
export const MAX_ACT_DEPTH = 5;

const actorSchema: z.ZodType<ActClaim> = z.lazy(() => z.object({ sub: z.string().min(1).max(2000), act: actorSchema.optional() }).strict());

/** The depth of an `act` chain (0: none). */
export function actDepth(act: ActClaim | undefined): number {
  let depth = 0;
  for (let a = act; a !== undefined; a = a.act) depth++;
  return depth;
}

const claimsSchema = z.object({
  iss: z.string(),
  aud: z.union([z.string(), z.array(z.string())]),
  sub: z.string().min(1),
  client_id: z.string().min(1),
  scope: z.string(),
  organization_id: z.number().int().positive(),
  grant_id: z.number().int().positive(),
  /** The user's custom role in the organization when the token was issued (absent: a built-in role, or the application itself). */
  role_id: z.number().int().positive().optional(),
  /** RFC 9449 §6.1 (RFC 7800): bound to a DPoP key; the API then wants a proof by it with every use. */
  cnf: z.object({ jkt: z.string().min(1) }).optional(),
  act: actorSchema.optional(),
  jti: z.string().min(1),
  iat: z.number().int(),
  exp: z.number().int(),
});

export type AccessTokenClaims = z.infer<typeof claimsSchema>;

/** A token a private application got for itself (client_credentials): its subject is its client. */
export function isApplicationToken(claims: Pick<AccessTokenClaims, 'sub' | 'client_id'>): boolean {
  return claims.sub === claims.client_id;
}

/** Any reason an access token is not acceptable; RFC 6750 §3.1 `invalid_token`. */
export class InvalidTokenError extends AppError {
  constructor(reason: string, options?: ErrorOptions & { organizationId?: number | undefined }) {
    super(401, 'invalid_token', 'the access token is invalid or expired', options);
    this.reason = reason;
    this.organizationId = options?.organizationId;
  }
  readonly reason: string;
  /** The organization of a token this server signed (expired, revoked...), when the refusal knows it. */
  organizationId: number | undefined;
}

/**
 * Signs with `signingKey` (from KeyStore.signingKey(), fetched before any transaction: on the
 * embedded database a query outside the open transaction would wait for it forever).
 */
export async function signAccessToken(
  signingKey: SigningKeyMaterial,
  config: Pick<Config, 'issuer'>,
  input: AccessTokenInput,
): Promise<{ token: string; claims: AccessTokenClaims }> {
  const iat = Math.floor(Date.now() / 1000);
  const claims: AccessTokenClaims = {
    iss: config.issuer,
    aud: input.resource.uri,
    sub: input.subject,
    client_id: input.clientId,
    scope: input.scopes.join(' '),
    organization_id: input.organizationId,
    grant_id: input.grantId,
    ...(input.roleId != null ? { role_id: input.roleId } : {}),
    ...(input.dpopJkt ? { cnf: { jkt: input.dpopJkt } } : {}),
    ...(input.act ? { act: input.act } : {}),
    jti: randomUUID(),
    iat,
    exp: Math.min(iat + input.resource.accessTokenTtl, input.notAfter ?? Number.POSITIVE_INFINITY),
  };
  const token = await signJws(signingKey, signingKey.header, claims);
  return { token, claims };
}

/**
 * Verifies signature, header and claims; throws InvalidTokenError with the reason otherwise.
 * `audience`: orgauth's API by default (the API refuses a token for any other resource); 'any'
 * for the revocation and introspection endpoints, which answer for every token this server
 * signed, whatever resource it is for.
 */
export async function verifyAccessToken(keys: KeyStore, config: Pick<Config, 'issuer'>, token: string, audience: string[] | 'any' = apiAudiences(config)): Promise<AccessTokenClaims> {
  let payload: unknown;
  try {
    ({ payload } = await jwtVerify(
      token,
      async (header) => {
        if (typeof header.kid !== 'string') throw new InvalidTokenError('no kid');
        const found = await keys.verificationKey(header.kid);
        if (!found) throw new InvalidTokenError('unknown kid');
        // RFC 8725 §3.1: the key decides the algorithm, never the token.
        if (header.alg !== found.alg) throw new InvalidTokenError(`alg ${header.alg} does not match the key's ${found.alg}`);
        return found.key;
      },
      {
        algorithms: [...SIGNING_ALGS],
        typ: ACCESS_TOKEN_TYPE,
        issuer: config.issuer,
        // A token for another resource is refused here (RFC 8707, AG-2).
        ...(audience === 'any' ? {} : { audience }),
        requiredClaims: ['iat', 'exp', 'jti', 'sub'],
        clockTolerance: CLOCK_TOLERANCE_S,
      },
    ));
  } catch (err) {
    if (err instanceof InvalidTokenError) throw err;
    // A signed token that expired (or fails another claim check) still names its organization.
    const signed = err instanceof joseErrors.JWTClaimValidationFailed || err instanceof joseErrors.JWTExpired ? (err.payload as { organization_id?: unknown }).organization_id : undefined;
    if (err instanceof joseErrors.JOSEError) throw new InvalidTokenError(err.code, { cause: err, organizationId: typeof signed === 'number' ? signed : undefined });
    throw err;
  }
  const claims = claimsSchema.safeParse(payload);
  if (!claims.success) throw new InvalidTokenError('claims of the wrong shape');
  // jose checks exp against the leeway; a token issued in the future is not acceptable either.
  if (claims.data.iat > Math.floor(Date.now() / 1000) + CLOCK_TOLERANCE_S) throw new InvalidTokenError('issued in the future');
  return claims.data;
}

/** A token whose signature and claims checked out: its claims and its scopes, parsed once. */
interface CheckedToken {
  claims: AccessTokenClaims;
  scopes: ReadonlySet<string>;
}

/** A token the API accepts, with its application as this instance knows it now. */
export interface VerifiedToken extends CheckedToken {
  application: Application;
}

/**
 * What the API accepts: a verified token, not revoked, nor its grant, nor issued before its user
 * was removed from the organization, of an existing and enabled
 * application that still has the token's scopes. Tokens are used for many
 * calls, so verified claims are kept (bounded, keyed by the whole token, dropped at exp): a
 * repeat costs a Map lookup instead of a signature check. Revocation is checked every time.
 */
/** What the verifier asks of the revoked set (revocation-list.ts's RevocationList). */
export interface RevokedTokens {
  /** Revoked itself, with its grant, or by its user's removal from the organization (after iat). */
  isTokenRevoked(token: Pick<AccessTokenClaims, 'jti' | 'grant_id' | 'organization_id' | 'sub' | 'client_id' | 'iat'>): boolean;
}

export class AccessTokenVerifier {
  private readonly verified = new Map<string, CheckedToken>();

  constructor(
    private readonly ctx: {
      keys: KeyStore;
      revocations: RevokedTokens;
      applications: { find: FindApplication };
      config: Pick<Config, 'issuer'>;
      /** Custom roles as they are now (src/accounts/role-scopes.ts); without it, tokens are not held to their role. */
      roles?: { find(roleId: number, notBefore?: number): Promise<{ organizationId: number; permissions: ReadonlySet<string> } | null> } | undefined;
    },
    private readonly maxEntries = 10_000,
  ) {}

  async verify(token: string): Promise<VerifiedToken> {
    let verified = this.verified.get(token);
    if (verified === undefined || verified.claims.exp <= Math.floor(Date.now() / 1000) - CLOCK_TOLERANCE_S) {
      this.verified.delete(token);
      const claims = await verifyAccessToken(this.ctx.keys, this.ctx.config, token);
      verified = { claims, scopes: new Set(claims.scope.split(' ')) };
      // Simple bound: a full cache starts over (a flood of distinct tokens cannot grow it).
      if (this.verified.size >= this.maxEntries) this.verified.clear();
      this.verified.set(token, verified);
    }
    const { claims, scopes } = verified;
    // Refused for what it says (revoked, its application gone, scopes narrowed): the refusal names its organization (the Overview's refused tokens).
    try {
      if (this.ctx.revocations.isTokenRevoked(claims)) throw new InvalidTokenError('token revoked');
      // Its application must still exist, enabled: a disabled or deleted application's grants are
      // revoked too, but an instance that missed those revocations (LISTEN down while the rows were
      // deleted) still learns it here within the cache's 500 ms.
      const application = await this.ctx.applications.find(claims.client_id);
      if (!application || application.disabled) throw new InvalidTokenError('application disabled or deleted');
      // An application that now requires DPoP-bound tokens (or FAPI 2.0): its bearer tokens from
      // before are refused on every instance within the cache's 500 ms; its clients refresh, with a proof.
      if (claims.cnf === undefined && requiresDpop(application)) throw new InvalidTokenError('bearer token of an application that requires DPoP');
      // Nor may it carry a scope its application no longer has: narrowing an application's scopes
      // revokes the grants that hold a removed one, and this refuses their tokens on every
      // instance at once, while those revocations are still being written.
      // The OpenID scopes are not registered by applications (any public one may ask for them).
      for (const scope of scopes) if (!application.scopes.includes(scope) && !isIdentityScope(scope)) throw new InvalidTokenError('scope beyond the application’s');
      // Nor one its user's custom role no longer allows: a role losing a permission refuses its
      // members' tokens with it at once, while the job narrowing their grants is on its way.
      if (claims.role_id !== undefined && this.ctx.roles) {
        const roles = this.ctx.roles;
        const roleId = claims.role_id;
        const beyond = (role: { organizationId: number; permissions: ReadonlySet<string> } | null) =>
          role !== null && role.organizationId === claims.organization_id && [...scopes].some((s) => isKnownScope(s) && !role.permissions.has(s));
        // Refused only by a reading of the role made after the token was issued (iat is whole
        // seconds: after the end of that second), so a role widened just before it is seen widened.
        if (beyond(await roles.find(roleId)) && beyond(await roles.find(roleId, (claims.iat + 1) * 1000))) throw new InvalidTokenError('scope beyond the member’s role');
      }
      return { ...verified, application };
    } catch (err) {
      if (err instanceof InvalidTokenError) err.organizationId ??= claims.organization_id;
      throw err;
    }
  }
}
