/**
 * POST /oauth/par (RFC 9126): a client posts its authorization request's parameters here, with
 * its client authentication (any method: a public client's client_id alone too), and gets a
 * request_uri to send the browser to /oauth/authorize with instead of them. The parameters never
 * pass through the browser, so they cannot be read or changed there, and the request is checked
 * (and the client authenticated) before the user sees anything.
 *
 * With a DPoP proof (RFC 9449 §10.1), or a dpop_jkt parameter, the code is bound to that key.
 */
import type { FastifyInstance } from 'fastify';
import { AppError, InvalidRequestError } from '../../errors.js';
import { authenticatedForm, type OAuthEndpointOptions, registerFormEndpoint } from '../helpers/form-endpoint.js';
import { endpointDpopJkt } from '../models/dpop-proofs.js';
import { pushAuthorizationRequest } from '../models/pushed-requests.js';
import { checkPushedRequest } from './authorize.js';
import { UnauthorizedClientError } from '../errors.js';

/**
 * Not kept with the request: client authentication, and what only the consent form or the
 * sign-in adds (the authorization endpoint takes those from the browser, never from a push).
 */
const NOT_KEPT = new Set(['client_secret', 'client_assertion', 'client_assertion_type', 'csrf_token', 'decision', 'organization_id', 'signed_in_after']);

export async function parEndpoint(app: FastifyInstance, options: OAuthEndpointOptions): Promise<void> {
  const { config, resources, db } = options;
  await registerFormEndpoint(app, '/oauth/par', async (req, reply) => {
    const proofJkt = await endpointDpopJkt(options.dpop, config, req, '/oauth/par');
    const { body, client } = await authenticatedForm(req, options);
    const { application } = client;
    // §2.1: request_uri is not allowed here; request objects are not supported at all.
    if (body.request_uri !== undefined) throw new InvalidRequestError('request_uri must not be sent to the pushed authorization request endpoint');
    if (body.request !== undefined) throw new AppError(400, 'request_not_supported', 'request objects are not supported');
    if (application.type !== 'public' || !application.grant_types.includes('authorization_code')) {
      throw new UnauthorizedClientError('this application may not use the authorization code grant');
    }
    // RFC 9449 §10.1: both sent, they must name the same key.
    if (body.dpop_jkt !== undefined && proofJkt !== null && body.dpop_jkt !== proofJkt) {
      throw new AppError(400, 'invalid_dpop_proof', 'dpop_jkt is not the thumbprint of the DPoP proof’s key');
    }
    const params = Object.fromEntries(Object.entries(body).filter(([name, value]) => !NOT_KEPT.has(name) && typeof value === 'string')) as Record<string, string>;
    params.client_id = application.client_id;
    const dpopJkt = proofJkt ?? body.dpop_jkt ?? null;
    const problem = await checkPushedRequest(config, resources, application, params, dpopJkt);
    if (problem) throw new AppError(400, problem.error, problem.description);
    const pushed = await pushAuthorizationRequest(db, { applicationId: application.id, params, dpopJkt });
    reply.code(201);
    return { request_uri: pushed.requestUri, expires_in: pushed.expiresIn };
  });
}
