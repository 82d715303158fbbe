/**
 * POST /oauth/par (RFC 9126): a client posts its authorization request's parameters here, with
 * its client authentication (any method: a public client's client_id alone too), and gets a
 * request_uri to send the browser to /oauth/authorize with instead of them. The parameters never
 * pass through the browser, so they cannot be read or changed there, and the request is checked
 * (and the client authenticated) before the user sees anything.
 *
 * With a DPoP proof (RFC 9449 §10.1), or a dpop_jkt parameter, the code is bound to that key.
 *
 * Anyone who knows a public client_id (with open registration, anyone) can make rows here, so
 * what a push keeps is bounded (DO-1): a body of at most PAR_BODY_LIMIT bytes; of it, only the
 * parameters the authorization endpoint reads, each at most MAX_VALUE_LENGTH characters; at
 * most PUSHES_PER_MINUTE pushes a minute per client and per address on each instance (429); and
 * at most MAX_PENDING_PER_CLIENT usable ones per client across instances (models/pushed-requests.ts).
 */
import type { FastifyInstance } from 'fastify';
import { AppError, InvalidRequestError } from '../../errors.js';
import { addressGroup, clientAddress } from '../../lib/client-address.js';
import { FailureThrottle } from '../../lib/throttle.js';
import { authenticatedForm, type OAuthEndpointOptions, registerFormEndpoint } from '../helpers/form-endpoint.js';
import { endpointDpopJkt } from '../models/dpop-proofs.js';
import { pushAuthorizationRequest } from '../models/pushed-requests.js';
import { AUTHORIZATION_PARAMS, checkPushedRequest } from './authorize.js';
import { TooManyAttemptsError, UnauthorizedClientError } from '../errors.js';

export const PAR_PATH = '/oauth/par';
/**
 * A push's whole body: its parameters, with a client assertion or secret. A browser brings the
 * same parameters to /oauth/authorize in a URL, which Node reads up to 16 KiB of headers.
 */
export const PAR_BODY_LIMIT = 16 * 1024;
/** One kept parameter's value: room for an ID token as id_token_hint, a long state or redirect_uri. */
export const MAX_VALUE_LENGTH = 4096;
/**
 * Pushes a minute from one client, and from one address (its /64 for IPv6), on each instance:
 * ten a second, a busy application's backend pushing for its users included.
 */
export const PUSHES_PER_MINUTE = 600;

/** What the authorization endpoint reads of a request, but client_id: a push keeps the authenticated client's. */
const KEPT = new Set(AUTHORIZATION_PARAMS.filter((name) => name !== 'client_id'));

export async function parEndpoint(app: FastifyInstance, options: OAuthEndpointOptions): Promise<void> {
  const { config, resources, db } = options;
  const perAddress = new FailureThrottle(PUSHES_PER_MINUTE, 60_000);
  const perClient = new FailureThrottle(PUSHES_PER_MINUTE, 60_000);
  /** Counts one push under `key`, or refuses it (429) when the minute's allowance is spent. */
  const countPush = (throttle: FailureThrottle, key: string, whose: string): void => {
    const wait = throttle.retryAfter(key);
    if (wait > 0) throw new TooManyAttemptsError(wait, `at most ${PUSHES_PER_MINUTE} pushed authorization requests a minute from one ${whose}; retry later`);
    throttle.recordFailure(key);
  };
  await registerFormEndpoint(
    app,
    PAR_PATH,
    async (req, reply) => {
      // Before the proof and the client are checked: those cost CPU too.
      countPush(perAddress, addressGroup(clientAddress(req)), 'address');
      const proofJkt = await endpointDpopJkt(options.dpop, config, req, PAR_PATH);
      const { body, client } = await authenticatedForm(req, options);
      const { application } = client;
      countPush(perClient, application.client_id, 'client');
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
      // Only what the authorization endpoint reads is kept (RFC 6749 §3.1, RFC 9126 §2.1: it
      // ignores the rest): no client authentication, nothing a form or the sign-in adds, nothing unknown.
      const params: Record<string, string> = {};
      for (const name of KEPT) {
        const value = body[name];
        if (value === undefined) continue;
        if (value.length > MAX_VALUE_LENGTH) throw new InvalidRequestError(`${name} must be at most ${MAX_VALUE_LENGTH} characters`);
        params[name] = value;
      }
      params.client_id = application.client_id;
      const dpopJkt = proofJkt ?? body.dpop_jkt ?? null;
      const problem = await checkPushedRequest(config, resources, application, params, dpopJkt);
      if (problem) throw new AppError(400, problem.error, problem.description);
      const pushed = await pushAuthorizationRequest(db, { applicationId: application.id, params, dpopJkt });
      reply.code(201);
      return { request_uri: pushed.requestUri, expires_in: pushed.expiresIn };
    },
    { bodyLimit: PAR_BODY_LIMIT },
  );
}
