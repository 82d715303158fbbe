/**
 * POST /oauth/token (RFC 6749 §3.2): everything the grants share — form bodies only, no-store,
 * duplicate parameters refused, client authentication (helpers/form-endpoint.ts), the DPoP
 * proof (RFC 9449 §5) — then the grant's handler, by grant_type.
 */
import type { FastifyInstance } from 'fastify';
import { UnauthorizedClientError, UnsupportedGrantTypeError } from '../errors.js';
import { markClientUsed } from '../models/registrations.js';
import { authorizationCode } from '../grants/authorization-code.js';
import { clientCredentials } from '../grants/client-credentials.js';
import { deviceCode } from '../grants/device-code.js';
import { refreshToken } from '../grants/refresh-token.js';
import { tokenExchange } from '../grants/token-exchange.js';
import type { GrantHandler } from '../grants/types.js';
import { authenticatedForm, type OAuthEndpointOptions, registerFormEndpoint } from '../helpers/form-endpoint.js';
import { requireParam } from '../helpers/params.js';
import { requiresDpop } from '../helpers/fapi.js';
import { endpointDpopJkt } from '../models/dpop-proofs.js';
import { AppError } from '../../errors.js';
import { tokenMetric } from '../../activity.js';

const GRANTS: ReadonlyMap<string, GrantHandler> = new Map([authorizationCode, refreshToken, clientCredentials, deviceCode, tokenExchange].map((g) => [g.grantType, g]));

export async function tokenEndpoint(app: FastifyInstance, options: OAuthEndpointOptions): Promise<void> {
  const { db, keys, revocations, config, clientGrants, metrics, resources } = options;
  await registerFormEndpoint(app, '/oauth/token', async (req, reply) => {
    // The proof first: a missing nonce is answered before anything else is looked at (RFC 9449 §8).
    const dpopJkt = await endpointDpopJkt(options.dpop, config, req, '/oauth/token');
    const { body, client } = await authenticatedForm(req, options);
    const grant = GRANTS.get(requireParam(body, 'grant_type'));
    if (!grant) throw new UnsupportedGrantTypeError();
    // RFC 7591 §2: a public client uses the grant types it registered (a private one: client_credentials, checked by the grant);
    // token exchange is not registered but allowed by its target resource.
    const { application } = client;
    if (application.type === 'public' && grant.registered !== false && !(application.grant_types as readonly string[]).includes(grant.grantType)) {
      throw new UnauthorizedClientError(`this client did not register the ${grant.grantType} grant type`);
    }
    if (dpopJkt === null && requiresDpop(application)) {
      throw new AppError(400, 'invalid_dpop_proof', "this application's access tokens are DPoP-bound: send a DPoP proof", {
        headers: options.dpop.requireNonce ? { 'dpop-nonce': options.dpop.nonce() } : {},
      });
    }
    const issued = await grant.handle({ db, keys, revocations, config, clientGrants, metrics, resources, findApplication: options.applications.find }, client, body, { dpopJkt });
    // A fresh nonce with every answer, so a client's next proof has one (RFC 9449 §8.2).
    if (options.dpop.requireNonce) reply.header('dpop-nonce', options.dpop.nonce());
    metrics.tokensIssued.inc({ grant_type: grant.grantType });
    const counted = tokenMetric(grant.grantType);
    if (counted) app.activity.count(issued.organization_id, counted);
    // A client that registered itself and got a token is in use: the reaper leaves it.
    await markClientUsed(db, application);
    return issued;
  });
}
