/**
 * POST /oauth/introspect (RFC 7662), client-authenticated. A client sees only its own tokens:
 * anything else is inactive to it.
 */
import type { FastifyInstance } from 'fastify';
import { sql } from 'kysely';
import { InvalidClientError } from '../errors.js';
import { REMOVAL_MARGIN_S } from '../models/grants.js';
import { clientAndToken } from '../helpers/client-token.js';
import { requiresDpop } from '../helpers/fapi.js';
import { type OAuthEndpointOptions, registerFormEndpoint } from '../helpers/form-endpoint.js';

export async function introspectionEndpoint(app: FastifyInstance, options: OAuthEndpointOptions): Promise<void> {
  await registerFormEndpoint(app, '/oauth/introspect', async (req) => {
    const { application, method, found } = await clientAndToken(req, options);
    // RFC 7662 §2.1: introspection is for authenticated callers (resource servers, confidential
    // clients); a public client's client_id alone is no authentication (metadata: not offered).
    if (method === 'none') throw new InvalidClientError({ cause: new Error('introspection needs client authentication') });
    if (!found) return { active: false };
    if (found.kind === 'refresh_token') {
      const t = found.token;
      if (t.revoked_at !== null || t.grant_revoked_at !== null || t.ended_by_removal || t.rotated_at !== null || t.expired) return { active: false };
      return {
        active: true,
        token_type: 'refresh_token',
        scope: [...t.identity_scopes, ...t.scopes].join(' '),
        client_id: application.client_id,
        sub: String(t.user_id),
        organization_id: t.organization_id,
        iat: Math.floor(t.created_at.getTime() / 1000),
        exp: Math.floor(t.expires_at.getTime() / 1000),
        iss: options.config.issuer,
        // RFC 9449 §6.2: the key its grant's tokens are bound to.
        ...(t.dpop_jkt !== null ? { cnf: { jkt: t.dpop_jkt } } : {}),
      };
    }
    const c = found.claims;
    // A bearer token of an application that now requires DPoP: the API refuses it (access-tokens.ts), so it is not active.
    if (c.cnf === undefined && requiresDpop(application)) return { active: false };
    // Asked of the database, not the in-memory list: introspection is authoritative, and answers
    // 503 (never active) when the database is away (MD-1, MD-2).
    const grant = await options.db
      .selectFrom('grants')
      .select([
        'revoked_at',
        (eb) => eb.exists(eb.selectFrom('revoked_access_tokens').select('jti').where('jti', '=', c.jti)).as('token_revoked'),
        // Issued up to its user's removal from the organization (iat in whole seconds, and
        // REMOVAL_MARGIN_S more, as the API compares it), whose grants a job may still be revoking.
        (eb) =>
          eb
            .exists(
              eb
                .selectFrom('removed_members as rm')
                .select('rm.user_id')
                .whereRef('rm.organization_id', '=', 'grants.organization_id')
                .whereRef('rm.user_id', '=', 'grants.user_id')
                .where(sql<boolean>`rm.removed_at >= to_timestamp(${c.iat - REMOVAL_MARGIN_S})`),
            )
            .as('ended_by_removal'),
      ])
      .where('id', '=', c.grant_id)
      .where('organization_id', '=', c.organization_id)
      .executeTakeFirst();
    if (!grant || grant.revoked_at !== null || grant.token_revoked || grant.ended_by_removal || c.exp <= Math.floor(Date.now() / 1000)) return { active: false };
    return {
      active: true,
      // RFC 9449 §6.2: a DPoP-bound token says so, and names its key.
      token_type: c.cnf ? 'DPoP' : 'Bearer',
      scope: c.scope,
      client_id: c.client_id,
      sub: c.sub,
      organization_id: c.organization_id,
      iat: c.iat,
      exp: c.exp,
      iss: c.iss,
      aud: c.aud,
      jti: c.jti,
      ...(c.cnf ? { cnf: c.cnf } : {}),
    };
  });
}
