/**
 * The token a client presents at the revocation and introspection endpoints, found among that
 * client's own tokens only (and, for introspection by a resource, the access tokens for it):
 * anything else (another client's, unknown, malformed) is "unknown".
 */
import type { FastifyRequest } from 'fastify';
import type { Application } from '../../db/schema.js';
import { type AccessTokenClaims, InvalidTokenError, verifyAccessToken } from '../models/access-tokens.js';
import { findRefreshToken } from '../models/refresh-tokens.js';
import type { ClientAuthMethod } from './client-auth.js';
import { authenticatedForm, type OAuthEndpointOptions } from './form-endpoint.js';
import { requireParam } from './params.js';

export type Found =
  | { kind: 'access_token'; claims: AccessTokenClaims }
  | { kind: 'refresh_token'; token: NonNullable<Awaited<ReturnType<typeof findRefreshToken>>> };

/**
 * The token, if it is one of ours and was issued to `client`, or (`audience`) an access token for
 * that resource. Signature-checked, expiry not yet.
 */
export async function findClientToken(options: OAuthEndpointOptions, client: Application, token: string, scope: { audience?: string | undefined } = {}): Promise<Found | undefined> {
  if (token.length > 4096) return undefined;
  if (token.split('.').length === 3) {
    try {
      const claims = await verifyAccessToken(options.keys, options.config, token, 'any');
      const forAudience = scope.audience !== undefined && (claims.aud === scope.audience || (Array.isArray(claims.aud) && claims.aud.includes(scope.audience)));
      return claims.client_id === client.client_id || forAudience ? { kind: 'access_token', claims } : undefined;
    } catch (err) {
      if (err instanceof InvalidTokenError) return undefined;
      throw err;
    }
  }
  const refresh = await findRefreshToken(options.db, token);
  return refresh && refresh.application_id === client.id ? { kind: 'refresh_token', token: refresh } : undefined;
}

/** Both endpoints: authenticate the client, then find the `token` parameter among its tokens. */
export async function clientAndToken(
  req: FastifyRequest,
  options: OAuthEndpointOptions,
): Promise<{ application: Application; method: ClientAuthMethod; found: Found | undefined }> {
  const { body, client } = await authenticatedForm(req, options);
  return { application: client.application, method: client.method, found: await findClientToken(options, client.application, requireParam(body, 'token')) };
}

