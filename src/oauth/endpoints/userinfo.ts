/**
 * GET/POST /oauth/userinfo (OpenID Connect Core §5.3): the claims about the user that the access
 * token's OpenID scopes allow, the same as its ID token's (userClaims), read from the database as
 * they are now. The token comes in the Authorization header (RFC 6750 §2.1), as the API takes it;
 * problems are RFC 6750 §3 challenges: 401 invalid_token, 403 insufficient_scope without openid.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Config } from '../../config.js';
import type { DB } from '../../db/connect.js';
import { AppError } from '../../errors.js';
import { checkSenderConstraint, dpopChallenge, InsufficientScopeError, presentedToken, REALM } from '../../api/auth.js';
import type { DpopProofs } from '../models/dpop-proofs.js';
import { AccessTokenVerifier, InvalidTokenError, isApplicationToken } from '../models/access-tokens.js';
import type { ApplicationCache } from '../models/application-cache.js';
import type { KeyStore } from '../models/key-store.js';
import type { RevocationList } from '../models/revocation-list.js';
import { userClaims } from '../models/id-tokens.js';

const invalidToken = (description: string) =>
  new AppError(401, 'invalid_token', description, { headers: { 'www-authenticate': `${REALM}, error="invalid_token"` } });

export async function userinfoEndpoint(
  app: FastifyInstance,
  ctx: { db: DB; keys: KeyStore; revocations: RevocationList; applications: ApplicationCache; config: Config; dpop: DpopProofs },
): Promise<void> {
  const verifier = new AccessTokenVerifier(ctx);

  async function userinfo(req: FastifyRequest, reply: FastifyReply) {
    const presented = presentedToken(req.headers.authorization);
    if (presented === undefined) {
      throw new AppError(401, 'invalid_request', 'an access token is required (Authorization: Bearer <token>, or DPoP <token> with a DPoP proof)', {
        headers: { 'www-authenticate': `${REALM}, ${dpopChallenge()}` },
      });
    }
    let verified;
    try {
      verified = await verifier.verify(presented.token);
    } catch (err) {
      if (!(err instanceof InvalidTokenError)) throw err;
      req.log.info({ reason: err.reason }, 'access token refused');
      throw invalidToken('the access token is invalid, expired or revoked');
    }
    const { claims, scopes } = verified;
    // RFC 9449 §7: a DPoP-bound token comes with a proof by its key (userinfo is a protected resource too).
    await checkSenderConstraint(ctx.dpop, ctx.config, req, presented, claims, dpopChallenge, reply);
    // An application's own token (client_credentials) is about no user, and never holds openid.
    if (!scopes.has('openid') || isApplicationToken(claims)) throw new InsufficientScopeError('openid');
    const row = await ctx.db
      .selectFrom('users')
      .select(['users.id', 'users.email', 'users.name', 'users.email_verified_at'])
      .select((eb) => eb.selectFrom('organizations').select('name').where('id', '=', claims.organization_id).as('organization_name'))
      .where('users.id', '=', Number(claims.sub))
      .executeTakeFirst();
    // Deleted since: its grants went with it, and an instance that has not heard yet learns it here.
    if (!row || row.organization_name === null) throw invalidToken('the access token is invalid, expired or revoked');
    return userClaims(
      { userId: row.id, email: row.email, emailVerified: row.email_verified_at !== null, name: row.name },
      { id: claims.organization_id, name: row.organization_name },
      [...scopes],
    );
  }

  for (const method of ['GET', 'POST'] as const) {
    app.route({
      method,
      url: '/oauth/userinfo',
      handler: async (req, reply) => {
        reply.header('cache-control', 'no-store').header('pragma', 'no-cache');
        return userinfo(req, reply);
      },
    });
  }
}
