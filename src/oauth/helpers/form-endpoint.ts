/**
 * What the endpoints that take client-authenticated form posts share (token, revocation,
 * introspection): form bodies only, read as text, duplicate parameters refused, methods other
 * than POST 405, no-store, and client authentication.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Config } from '../../config.js';
import type { DB } from '../../db/connect.js';
import { InvalidRequestError } from '../../errors.js';
import { type FailureThrottle } from '../../lib/throttle.js';
import type { Metrics } from '../../metrics.js';
import type { ApplicationCache } from '../models/application-cache.js';
import type { ClientGrants } from '../models/client-grants.js';
import type { KeyStore } from '../models/key-store.js';
import type { ResourceRegistry } from '../models/resources.js';
import type { RevocationList } from '../models/revocation-list.js';
import { type AuthenticatedClient, authenticateClient } from './client-auth.js';
import type { ClientAssertionVerifier } from './client-assertion.js';
import type { DpopProofs } from '../models/dpop-proofs.js';
import type { SeenJtis } from '../models/seen-jtis.js';
import { type Params, readParamPairs, readParams } from './params.js';

export const FORM = 'application/x-www-form-urlencoded';

export interface OAuthEndpointOptions {
  db: DB;
  keys: KeyStore;
  revocations: RevocationList;
  config: Config;
  clientThrottle: FailureThrottle;
  applications: ApplicationCache;
  clientGrants: ClientGrants;
  metrics: Metrics;
  resources: ResourceRegistry;
  /** private_key_jwt (helpers/client-assertion.ts). */
  assertions: ClientAssertionVerifier;
  /** DPoP proofs (models/dpop-proofs.ts). */
  dpop: DpopProofs;
  /** The replay store of proofs and assertions (models/seen-jtis.ts). */
  jtis: SeenJtis;
}

/** RFC 6749 §5.1: token responses (and errors) are never cached. */
export function noStore(_req: FastifyRequest, reply: FastifyReply, payload: unknown, done: (err: null, payload: unknown) => void): void {
  reply.header('cache-control', 'no-store').header('pragma', 'no-cache');
  done(null, payload);
}

/** The media type of the request body without parameters, lower-cased. */
export function mediaType(req: FastifyRequest): string | undefined {
  const value = req.headers['content-type'];
  if (value === undefined) return undefined;
  const semicolon = value.indexOf(';');
  return (semicolon === -1 ? value : value.slice(0, semicolon)).trim().toLowerCase();
}

/**
 * The endpoints that take client-authenticated form posts share this: any body is read as text
 * (so a wrong media type is the OAuth `invalid_request`, not a 415), methods other than POST
 * answer 405, and nothing is cached.
 */
export async function registerFormEndpoint(
  app: FastifyInstance,
  url: string,
  handler: (req: FastifyRequest, reply: FastifyReply) => Promise<unknown>,
  options: { bodyLimit?: number } = {},
): Promise<void> {
  app.addHook('onSend', noStore);
  app.removeAllContentTypeParsers();
  app.addContentTypeParser(FORM, { parseAs: 'string' }, (_req, body, done) => done(null, new URLSearchParams(String(body))));
  app.addContentTypeParser('*', { parseAs: 'string' }, (_req, _body, done) => done(null, undefined));
  // Decided before the body is parsed too: an empty or malformed Content-Type never reaches the
  // '*' parser and would be Fastify's 415 (found by test/fuzz.test.ts).
  // The POST route's requests all pass here: its handler needs no second look.
  app.addHook('onRequest', (req, reply, done) => {
    if (req.method !== 'POST') return void reply.code(405).header('allow', 'POST').send({ error: 'invalid_request', error_description: `${url} accepts POST only` });
    done(mediaType(req) === FORM ? undefined : new InvalidRequestError(`the body must be ${FORM}`));
  });
  app.post(url, options.bodyLimit === undefined ? {} : { bodyLimit: options.bodyLimit }, handler);
  app.route({
    method: ['GET', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'],
    url,
    handler: async (_req, reply) =>
      reply.code(405).header('allow', 'POST').send({ error: 'invalid_request', error_description: `${url} accepts POST only` }),
  });
}

/** URLSearchParams (from the form parser) → one value per name, or invalid_request for repeats. */
export function formParams(body: unknown): Params {
  return body instanceof URLSearchParams ? readParamPairs(body) : readParams(undefined);
}

/** The form parameters of a client-authenticated endpoint, and the client that sent them. */
export async function authenticatedForm(
  req: FastifyRequest,
  { applications, clientThrottle, assertions, jtis, config }: Pick<OAuthEndpointOptions, 'applications' | 'clientThrottle' | 'assertions' | 'jtis' | 'config'>,
): Promise<{ body: Params; client: AuthenticatedClient }> {
  const body = formParams(req.body);
  // An assertion's audience: the issuer (FAPI 2.0), or this endpoint's URL (OpenID Connect Core §9);
  // built only when an assertion is checked.
  const audiences = () => [config.issuer, `${config.issuer}${req.routeOptions.url ?? ''}`, `${config.issuer}/oauth/token`];
  const client = await authenticateClient(
    applications.find,
    clientThrottle,
    { authorization: req.headers.authorization, query: readParams(req.query), body, ip: req.ip },
    { verifier: assertions, jtis, audiences },
  );
  return { body, client };
}
