/**
 * POST /oauth/register: RFC 7591 dynamic client registration, for clients no developer
 * registered (MCP clients, agents). CLIENT_REGISTRATION says who may register: anyone (open, the
 * default), only a request carrying the initial access token CLIENT_REGISTRATION_TOKEN as a
 * Bearer token (token), or nobody (off: 404). The body is JSON, at most REGISTRATION_BODY_LIMIT
 * bytes (413 past it); what it says is checked in models/registrations.ts, and every refusal is
 * a 4xx with an RFC 7591 §3.2.2 error (invalid_redirect_uri, invalid_client_metadata) or
 * invalid_request for a body that is not JSON.
 *
 * GET and DELETE /oauth/register/:client_id: RFC 7592's client configuration endpoint, with the
 * registration access token the registration returned as a Bearer token (401 invalid_token
 * otherwise, the same for an unknown client). GET reads the registration back (without the
 * secret, which is never kept); DELETE removes the client and revokes its grants. Updating a
 * registration (PUT) is not offered: 405; a client registers anew instead. These work whatever
 * CLIENT_REGISTRATION says, so clients registered before it was turned off can still be removed.
 *
 * Every answer is no-store (RFC 7591 §3.2.1). Self-registered clients belong to no organization,
 * and the audit log is kept per organization: registrations and deletions go to the log instead
 * (their grants' revocations are audited in the organizations that gave them).
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Application } from '../../db/schema.js';
import { AppError, InvalidRequestError, NotFoundError } from '../../errors.js';
import { clientAddress } from '../../lib/client-address.js';
import { secretMatches, sha256Hex } from '../../lib/crypto.js';
import { mediaType, noStore, type OAuthEndpointOptions } from '../helpers/form-endpoint.js';
import { clientInformation, deleteRegisteredClient, findRegisteredClient, parseRegistration, REGISTRATION_BODY_LIMIT, registerClient } from '../models/registrations.js';

export const REGISTRATION_PATH = '/oauth/register';
const JSON_TYPE = 'application/json';
const REALM = 'Bearer realm="orgauth"';

/**
 * The Bearer token of the Authorization header: undefined without one, '' for a header that is
 * not a well-formed Bearer token (treated as a wrong token).
 */
function bearerToken(req: FastifyRequest): string | undefined {
  const header = req.headers.authorization;
  if (header === undefined) return undefined;
  return /^Bearer +([A-Za-z0-9\-._~+/]+=*) *$/i.exec(header)?.[1] ?? '';
}

/** RFC 6750 §3: a request without a token gets the bare challenge; one with a bad token, error="invalid_token". */
function invalidToken(sent: boolean, description: string): AppError {
  return new AppError(401, 'invalid_token', description, { headers: { 'www-authenticate': sent ? `${REALM}, error="invalid_token"` : REALM } });
}

function methodNotAllowed(reply: FastifyReply, allow: string, url: string) {
  return reply.code(405).header('allow', allow).send({ error: 'invalid_request', error_description: `${url} accepts ${allow} only` });
}

/** The request body as JSON (read as text by the parser below, so that nothing is parsed before the checks). */
function jsonBody(body: unknown): unknown {
  if (typeof body !== 'string') throw new InvalidRequestError(`the body must be ${JSON_TYPE}`);
  try {
    return JSON.parse(body) as unknown;
  } catch {
    throw new InvalidRequestError('the body is not valid JSON');
  }
}

export async function registrationEndpoint(app: FastifyInstance, options: OAuthEndpointOptions): Promise<void> {
  const { db, config, applications, revocations } = options;
  const settings = config.clientRegistration;
  const initialTokenHash = settings.initialAccessToken === null ? null : sha256Hex(settings.initialAccessToken);

  app.addHook('onSend', noStore);
  // Every body is read as text, whatever its media type: the handlers decide (invalid_request, not 415).
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'string' }, (_req, body, done) => done(null, body));
  // Who may register, and the media type, are decided before the body is read. A malformed
  // Content-Type never reaches the parser above (it would be Fastify's 415).
  app.addHook('onRequest', async (req) => {
    if (req.method !== 'POST' || req.routeOptions.url !== REGISTRATION_PATH) return;
    if (settings.mode === 'off') throw new NotFoundError('dynamic client registration is turned off on this server');
    if (settings.mode === 'token') {
      const token = bearerToken(req);
      if (token === undefined) throw invalidToken(false, 'registration requires an initial access token (Authorization: Bearer)');
      if (!secretMatches(token, initialTokenHash)) throw invalidToken(true, 'the initial access token is not valid');
    }
    if (mediaType(req) !== JSON_TYPE) throw new InvalidRequestError(`the body must be ${JSON_TYPE}`);
  });

  app.post(REGISTRATION_PATH, { bodyLimit: REGISTRATION_BODY_LIMIT }, async (req, reply) => {
    const metadata = parseRegistration(jsonBody(req.body));
    // Never what a forged X-Forwarded-For says when it is not an address (TRUST_PROXY).
    const registered = await registerClient(db, metadata, { ip: clientAddress(req), limits: settings });
    const { application } = registered;
    req.log.info(
      { client_id: application.client_id, grant_types: application.grant_types, token_endpoint_auth_method: application.token_endpoint_auth_method, redirect_uris: application.redirect_uris },
      'client registered (RFC 7591)',
    );
    return reply.code(201).send(clientInformation(application, config.issuer, { registrationAccessToken: registered.registrationAccessToken, clientSecret: registered.clientSecret }));
  });
  app.route({ method: ['GET', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'], url: REGISTRATION_PATH, handler: async (_req, reply) => methodNotAllowed(reply, 'POST', REGISTRATION_PATH) });

  /** The client the path names, when the request carries its registration access token. */
  async function configuredClient(req: FastifyRequest): Promise<{ application: Application; token: string }> {
    const token = bearerToken(req);
    if (token === undefined) throw invalidToken(false, 'a registration access token is required (Authorization: Bearer)');
    const { client_id: clientId } = req.params as { client_id: string };
    const application = token === '' ? undefined : await findRegisteredClient(db, clientId, token);
    // RFC 7592 §2: an unknown client is answered as a wrong token.
    if (!application) throw invalidToken(true, 'the registration access token is not valid for this client');
    return { application, token };
  }

  const clientPath = `${REGISTRATION_PATH}/:client_id`;
  app.get(clientPath, async (req) => {
    const { application, token } = await configuredClient(req);
    // The token just presented stays valid: RFC 7592 §3 has it in every answer.
    return clientInformation(application, config.issuer, { registrationAccessToken: token });
  });
  app.delete(clientPath, async (req, reply) => {
    const { application } = await configuredClient(req);
    const deleted = await deleteRegisteredClient(db, application, { actor: { actorClientId: application.client_id }, revocations, applications });
    // Deleted meanwhile by a request with the same token (or the retention sweep): gone, as if unknown.
    if (!deleted) throw invalidToken(true, 'the registration access token is not valid for this client');
    req.log.info({ client_id: application.client_id }, 'registered client deleted (RFC 7592)');
    return reply.code(204).send();
  });
  app.route({ method: ['POST', 'PUT', 'PATCH', 'OPTIONS'], url: clientPath, handler: async (_req, reply) => methodNotAllowed(reply, 'GET, DELETE', `${REGISTRATION_PATH}/{client_id}`) });
}
