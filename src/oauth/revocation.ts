/**
 * POST /oauth/revoke (RFC 7009) and POST /oauth/introspect (RFC 7662), both client-authenticated.
 * A client sees and revokes only its own tokens: anything else is "unknown" to it.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { Application } from '../db/schema.js';
import { type AccessTokenClaims, InvalidTokenError, isApplicationToken, verifyAccessToken } from './access-tokens.js';
import { requireParam } from './params.js';
import { findRefreshToken } from './refresh-tokens.js';
import { authenticatedForm, type OAuthEndpointOptions, registerFormEndpoint } from './token.js';

type Found =
  | { kind: 'access_token'; claims: AccessTokenClaims }
  | { kind: 'refresh_token'; token: NonNullable<Awaited<ReturnType<typeof findRefreshToken>>> };

/** The token, if it is one of ours and was issued to `client`. Signature-checked, expiry not yet. */
async function findClientToken(options: OAuthEndpointOptions, client: Application, token: string): Promise<Found | undefined> {
  if (token.length > 4096) return undefined;
  if (token.split('.').length === 3) {
    try {
      const claims = await verifyAccessToken(options.keys, options.config, token);
      return claims.client_id === client.client_id ? { kind: 'access_token', claims } : undefined;
    } catch (err) {
      if (err instanceof InvalidTokenError) return undefined;
      throw err;
    }
  }
  const refresh = await findRefreshToken(options.db, token);
  return refresh && refresh.application_id === client.id ? { kind: 'refresh_token', token: refresh } : undefined;
}

/** Both endpoints: authenticate the client, then find the `token` parameter among its tokens. */
async function clientAndToken(req: FastifyRequest, options: OAuthEndpointOptions): Promise<{ application: Application; found: Found | undefined }> {
  const { body, client } = await authenticatedForm(req, options);
  return { application: client.application, found: await findClientToken(options, client.application, requireParam(body, 'token')) };
}

export async function revocationEndpoint(app: FastifyInstance, options: OAuthEndpointOptions): Promise<void> {
  await registerFormEndpoint(app, '/oauth/revoke', async (req) => {
    const { application, found } = await clientAndToken(req, options);
    // RFC 7009 §2.1: revoking a token of a user's grant revokes the grant, so every token of it
    // stops working (MD-1). The tokens an application gets for itself share one grant (see
    // client-grants.ts): one of those is revoked alone. Unknown, invalid or another client's
    // tokens: 200 all the same.
    const actor = { actorClientId: application.client_id };
    if (found?.kind === 'access_token' && isApplicationToken(found.claims)) {
      await options.revocations.revokeToken(found.claims, 'revoked_by_client', actor);
    } else if (found) {
      const grantId = found.kind === 'access_token' ? found.claims.grant_id : found.token.grant_id;
      await options.revocations.revoke(grantId, 'revoked_by_client', actor);
    }
    return {};
  });
}

export async function introspectionEndpoint(app: FastifyInstance, options: OAuthEndpointOptions): Promise<void> {
  await registerFormEndpoint(app, '/oauth/introspect', async (req) => {
    const { application, found } = await clientAndToken(req, options);
    if (!found) return { active: false };
    if (found.kind === 'refresh_token') {
      const t = found.token;
      if (t.revoked_at !== null || t.grant_revoked_at !== null || t.rotated_at !== null || t.expired) return { active: false };
      return {
        active: true,
        token_type: 'refresh_token',
        scope: t.scopes.join(' '),
        client_id: application.client_id,
        sub: String(t.user_id),
        organization_id: t.organization_id,
        iat: Math.floor(t.created_at.getTime() / 1000),
        exp: Math.floor(t.expires_at.getTime() / 1000),
        iss: options.config.issuer,
      };
    }
    const c = found.claims;
    // Asked of the database, not the in-memory list: introspection is authoritative, and answers
    // 503 (never active) when the database is away (MD-1, MD-2).
    const grant = await options.db
      .selectFrom('grants')
      .select(['revoked_at', (eb) => eb.exists(eb.selectFrom('revoked_access_tokens').select('jti').where('jti', '=', c.jti)).as('token_revoked')])
      .where('id', '=', c.grant_id)
      .where('organization_id', '=', c.organization_id)
      .executeTakeFirst();
    if (!grant || grant.revoked_at !== null || grant.token_revoked || c.exp <= Math.floor(Date.now() / 1000)) return { active: false };
    return {
      active: true,
      token_type: 'Bearer',
      scope: c.scope,
      client_id: c.client_id,
      sub: c.sub,
      organization_id: c.organization_id,
      iat: c.iat,
      exp: c.exp,
      iss: c.iss,
      aud: c.aud,
      jti: c.jti,
    };
  });
}
