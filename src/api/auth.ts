/**
 * The one gate in front of everything under /api/v1/:organization_id: a canonical organization
 * id in the path, a live bearer token (RFC 6750) for that organization, JSON accepted, and the
 * route's scope. Routes inside the plugin cannot forget any of it.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Config } from '../config.js';
import { AppError, NotFoundError } from '../errors.js';
import { type AccessTokenClaims, AccessTokenVerifier, InvalidTokenError, type VerifiedToken } from '../oauth/models/access-tokens.js';
import type { KeyStore } from '../oauth/models/key-store.js';
import type { RevocationList } from '../oauth/models/revocation-list.js';
import type { ApplicationCache } from '../oauth/models/application-cache.js';
import { isManagementScope } from '../oauth/helpers/scopes.js';
import { applicationRole, type RoleRef } from '../accounts/roles.js';
import { API_RESOURCE_PATH } from '../oauth/models/resources.js';
import type { RoleScopes } from '../accounts/role-scopes.js';
import { dpopHeader, DpopProofError, type DpopProofs, DPOP_SIGNING_ALGS } from '../oauth/models/dpop-proofs.js';

export interface ApiAuth {
  organizationId: number;
  claims: AccessTokenClaims;
  scopes: ReadonlySet<string>;
  /** The user the token acts for, or null when the application acts for itself. */
  userId: number | null;
}

declare module 'fastify' {
  interface FastifyRequest {
    auth: ApiAuth | null;
    /** A token this server signed was refused for this request: its organization (the Overview's refused tokens). */
    refusedFor: number | null;
  }
  interface FastifyContextConfig {
    /** The scope a route needs (RFC 6750 §3.1 insufficient_scope otherwise); null: any valid token. */
    scope?: string | null;
  }
}

export const REALM = 'Bearer realm="orgauth"';
/** A canonical positive bigint: one spelling per organization (no 01, +1, 1.0, 1e3, " 1"). */
const CANONICAL_ID = /^[1-9][0-9]{0,18}$/;
const MAX_BIGINT = 9_223_372_036_854_775_807n;

/** Parses a path id; undefined for anything that is not the canonical spelling of a bigint we can hold. */
export function parsePathId(value: unknown): number | undefined {
  if (typeof value !== 'string' || !CANONICAL_ID.test(value) || BigInt(value) > MAX_BIGINT) return undefined;
  const n = Number(value);
  // Ids beyond 2^53 are valid bigints no row of ours can have.
  return Number.isSafeInteger(n) ? n : undefined;
}

/** A resource id from the path; a non-canonical spelling is as missing as an unknown id (404). */
export function pathId(value: string): number {
  const id = parsePathId(value);
  if (id === undefined) throw new NotFoundError('not found');
  return id;
}

/** Whether an Accept header admits application/json (absent means anything). */
export function acceptsJson(accept: string | undefined): boolean {
  if (accept === undefined || accept.trim() === '') return true;
  return accept.split(',').some((range) => {
    const [type = '', ...params] = range.split(';').map((p) => p.trim().toLowerCase());
    const q = params.find((p) => p.startsWith('q='));
    if (q !== undefined && !(Number(q.slice(2)) > 0)) return false;
    return type === 'application/json' || type === 'application/*' || type === '*/*';
  });
}

/** RFC 6750 §2.1: `Bearer <token>`, the scheme case-insensitive; anything else counts as no token. */
export function bearerToken(authorization: string | undefined): string | undefined {
  const match = authorization === undefined ? null : /^Bearer +([A-Za-z0-9\-._~+/]+=*) *$/i.exec(authorization);
  return match?.[1];
}

/** The access token and how it was sent: `Bearer` (RFC 6750) or `DPoP` (RFC 9449 §7.1). */
export function presentedToken(authorization: string | undefined): { scheme: 'Bearer' | 'DPoP'; token: string } | undefined {
  const match = authorization === undefined ? null : /^(Bearer|DPoP) +([A-Za-z0-9\-._~+/]+=*) *$/i.exec(authorization);
  if (!match) return undefined;
  return { scheme: match[1]!.toLowerCase() === 'dpop' ? 'DPoP' : 'Bearer', token: match[2]! };
}

/**
 * The DPoP side of a resource request (RFC 9449 §7): a token bound to a key (cnf.jkt) is
 * accepted only as `DPoP` with a proof by that key, for this method and URL, carrying the
 * token's hash; an unbound token only as `Bearer`. Errors are 401 with a `DPoP` challenge that
 * lists the algorithms (and a fresh DPoP-Nonce when a nonce was missing).
 */
export async function checkSenderConstraint(
  dpop: DpopProofs,
  config: Pick<Config, 'issuer'>,
  req: FastifyRequest,
  presented: { scheme: 'Bearer' | 'DPoP'; token: string },
  claims: Pick<AccessTokenClaims, 'cnf'>,
  challenge: (fields: { error: string; description?: string }) => string,
  reply: FastifyReply,
): Promise<void> {
  const refuse = (error: string, description: string, headers: Record<string, string> = {}) =>
    new AppError(401, error, description, { headers: { 'www-authenticate': challenge({ error, description }), ...headers } });
  const bound = claims.cnf?.jkt;
  if (bound === undefined) {
    if (presented.scheme === 'DPoP') throw refuse('invalid_token', 'the access token is not DPoP-bound: send it as Bearer');
    return;
  }
  if (presented.scheme !== 'DPoP') throw refuse('invalid_token', 'the access token is DPoP-bound: send it as DPoP with a proof');
  let jkt: string;
  try {
    const proof = dpopHeader(req.headers);
    if (proof === undefined) throw new DpopProofError('invalid_dpop_proof', 'a DPoP proof is required with a DPoP-bound token');
    ({ jkt } = await dpop.check(proof, { method: req.method, url: `${config.issuer}${req.url}`, accessToken: presented.token }));
  } catch (err) {
    if (!(err instanceof DpopProofError)) throw err;
    throw refuse(err.error, err.message, err.error === 'use_dpop_nonce' ? { 'dpop-nonce': dpop.nonce() } : {});
  }
  if (jkt !== bound) throw refuse('invalid_dpop_proof', 'the DPoP proof is signed by another key than the one the token is bound to');
  // RFC 9449 §9: a fresh nonce with the answer, so the client's next proof has one without a 401 first.
  if (dpop.requireNonce) reply.header('dpop-nonce', dpop.nonce());
}

/** A `DPoP` challenge (RFC 9449 §7.1) with the algorithms accepted, and the error when there is one. */
export function dpopChallenge(fields: { error?: string; description?: string } = {}): string {
  return [
    `DPoP algs="${DPOP_SIGNING_ALGS.join(' ')}"`,
    ...(fields.error ? [`error="${fields.error}"`] : []),
    ...(fields.description ? [`error_description="${fields.description.replace(/["\\]/g, '')}"`] : []),
  ].join(', ');
}

/** RFC 9728 §5.1: where a client finds what this API is and which server issues its tokens. */
export const apiResourceMetadataUrl = (config: Pick<Config, 'issuer'>): string => `${config.issuer}/.well-known/oauth-protected-resource${API_RESOURCE_PATH}`;

/** The API's challenge (RFC 6750 §3, RFC 9728 §5.1), with `error` and `scope` when there are. */
function apiChallenge(config: Pick<Config, 'issuer'> | undefined, fields: { error?: string; scope?: string } = {}): string {
  return [
    REALM,
    ...(config ? [`resource_metadata="${apiResourceMetadataUrl(config)}"`] : []),
    ...(fields.error ? [`error="${fields.error}"`] : []),
    ...(fields.scope ? [`scope="${fields.scope}"`] : []),
  ].join(', ');
}

export class InsufficientScopeError extends AppError {
  /** With `config`, the challenge also names the API's resource metadata, so a client can step up (RFC 9728 §5). */
  constructor(scope: string, config?: Pick<Config, 'issuer'>) {
    super(403, 'insufficient_scope', `this request needs the ${scope} scope`, {
      headers: { 'www-authenticate': apiChallenge(config, { error: 'insufficient_scope', scope }) },
    });
  }
}

export function authenticateApiRequest(ctx: {
  keys: KeyStore;
  revocations: RevocationList;
  applications: ApplicationCache;
  config: Config;
  roles?: RoleScopes | undefined;
  dpop: DpopProofs;
}) {
  const verifier = new AccessTokenVerifier(ctx);
  return async (req: FastifyRequest, reply: FastifyReply): Promise<void> => {
    const params = req.params as { organization_id?: unknown };
    const organizationId = parsePathId(params.organization_id);
    if (organizationId === undefined) throw new NotFoundError('no such organization');
    if (!acceptsJson(req.headers.accept)) throw new AppError(406, 'not_acceptable', 'this API answers application/json only');

    // RFC 6750 §2: the header only; a token in the query string is ignored.
    const presented = presentedToken(req.headers.authorization);
    if (presented === undefined) {
      throw new AppError(401, 'invalid_request', 'an access token is required (Authorization: Bearer <token>, or DPoP <token> with a DPoP proof)', {
        headers: { 'www-authenticate': `${apiChallenge(ctx.config)}, ${dpopChallenge()}` },
      });
    }
    let verified: VerifiedToken;
    try {
      verified = await verifier.verify(presented.token);
    } catch (err) {
      if (!(err instanceof InvalidTokenError)) throw err;
      req.refusedFor = err.organizationId ?? null;
      req.log.info({ reason: err.reason }, 'access token refused');
      const challenge = presented.scheme === 'DPoP' ? dpopChallenge({ error: 'invalid_token' }) : apiChallenge(ctx.config, { error: 'invalid_token' });
      throw new AppError(401, 'invalid_token', 'the access token is invalid, expired or revoked', { headers: { 'www-authenticate': challenge } });
    }
    const { claims, scopes, application } = verified;
    // Whatever refuses it from here on refuses a token of this organization.
    req.refusedFor = claims.organization_id;
    try {
      await checkSenderConstraint(ctx.dpop, ctx.config, req, presented, claims, dpopChallenge, reply);
    } catch (err) {
      // Asking for a fresh nonce is the protocol at work (RFC 9449 §9), not a refusal.
      if (err instanceof AppError && err.code === 'use_dpop_nonce') req.refusedFor = null;
      throw err;
    }
    // The contract: the organization in the token is the organization in the path (BR-3).
    if (claims.organization_id !== organizationId) {
      throw new AppError(403, 'organization_mismatch', 'the access token was issued for another organization');
    }
    const userId = claims.sub === claims.client_id ? null : Number(claims.sub);
    // BR-2, before the body is even validated: a token without the scope learns nothing else.
    const needed = req.routeOptions.config.scope;
    if (needed && !scopes.has(needed)) throw new InsufficientScopeError(needed, ctx.config);
    // AD-1: management scopes are the organization acting on itself, through a private
    // application of its own; never a user's delegation, nor another organization's application
    // (the token endpoint issues neither; this holds whatever signed the token).
    if (needed && isManagementScope(needed) && (userId !== null || application.type !== 'private' || application.organization_id !== organizationId)) {
      throw new InsufficientScopeError(needed, ctx.config);
    }
    req.auth = { organizationId, claims, scopes, userId };
  };
}

/** Who acts in the audit log: the token's application, and its user when it acts for one. */
export function actorOf(auth: ApiAuth): { actorUserId: number | null; actorClientId: string } {
  return { actorUserId: auth.userId, actorClientId: auth.claims.client_id };
}

/** The role the token's application manages its organization with: its scopes, never an owner's. */
export function actingRoleOf(auth: ApiAuth): RoleRef {
  return applicationRole(auth.scopes);
}

/** The authenticated request's auth; routes inside the API plugin always have it. */
export function authOf(req: FastifyRequest): ApiAuth {
  if (!req.auth) throw new Error('API route reached without authentication');
  return req.auth;
}
