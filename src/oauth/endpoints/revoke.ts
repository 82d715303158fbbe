/**
 * POST /oauth/revoke (RFC 7009), client-authenticated. A client revokes only its own tokens:
 * anything else is "unknown" to it, and answered 200 all the same. A resource's own tokens are
 * those it got by token exchange.
 */
import type { FastifyInstance } from 'fastify';
import { isApplicationToken } from '../models/access-tokens.js';
import { clientAndToken } from '../helpers/client-token.js';
import { type OAuthEndpointOptions, registerFormEndpoint } from '../helpers/form-endpoint.js';

export async function revocationEndpoint(app: FastifyInstance, options: OAuthEndpointOptions): Promise<void> {
  await registerFormEndpoint(app, '/oauth/revoke', async (req) => {
    const { application, found } = await clientAndToken(req, options);
    // RFC 7009 §2.1: revoking a token of a user's grant revokes the grant, so every token of it
    // stops working (MD-1). The tokens an application gets for itself share one grant (see
    // client-grants.ts): one of those is revoked alone. Unknown, invalid or another client's
    // tokens: 200 all the same.
    const actor = { actorClientId: application.client_id };
    // A token exchanged for another resource (RFC 8693) keeps the grant it descends from, which is
    // another client's (a resource exchanged it) or was made before the exchange (an actor acted):
    // revoking it revokes that token alone, never the grant.
    const exchanged = found?.kind === 'access_token' && (application.type === 'resource' || found.claims.act !== undefined);
    if (found?.kind === 'access_token' && (isApplicationToken(found.claims) || exchanged)) {
      await options.revocations.revokeToken(found.claims, 'revoked_by_client', actor);
    } else if (found) {
      const grantId = found.kind === 'access_token' ? found.claims.grant_id : found.token.grant_id;
      await options.revocations.revoke(grantId, 'revoked_by_client', actor);
    }
    return {};
  });
}
