/**
 * CORS for the endpoints a browser-based client (a single-page application, an MCP client in a
 * browser) calls itself: discovery, the JWK Set, the token, revocation and userinfo endpoints.
 * Any origin, never credentials: these endpoints authenticate by what the request carries (a
 * client secret, a PKCE verifier, a bearer token), never by a cookie, so letting any page read
 * their answers gives it nothing it did not send. Every other route (the pages, which use the
 * session cookie; the API) gets no CORS headers, and a preflight there is a 404.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';

export const CORS_PATHS: ReadonlySet<string> = new Set([
  '/.well-known/oauth-authorization-server',
  '/.well-known/openid-configuration',
  '/.well-known/jwks.json',
  '/.well-known/oauth-protected-resource/api/v1',
  '/oauth/token',
  '/oauth/device_authorization',
  '/oauth/register',
  '/oauth/revoke',
  '/oauth/userinfo',
]);

/**
 * The one answer (Fetch §3.2): any origin, so no Vary: Origin (the answer does not depend on
 * it); no credentials; POST with these headers (MCP clients send MCP-Protocol-Version with their
 * discovery requests too); a browser client may read why a token was refused (RFC 6750 §3) and
 * DPoP nonces (RFC 9449 §8).
 */
const ANSWER = { 'access-control-allow-origin': '*', 'access-control-expose-headers': 'WWW-Authenticate, DPoP-Nonce' };
const PREFLIGHT = {
  'access-control-allow-methods': 'GET, POST',
  'access-control-allow-headers': 'Authorization, Content-Type, DPoP, MCP-Protocol-Version',
  'access-control-max-age': '600',
  'content-length': '0',
};

function pathOf(req: FastifyRequest): string {
  const q = req.url.indexOf('?');
  return q === -1 ? req.url : req.url.slice(0, q);
}

/**
 * One hook, not @fastify/cors: its delegator form (which a per-path policy needs) normalises the
 * options it is given with two object spreads on every request, 5 µs of a token request's 140
 * (docs/performance.md), for an answer that never changes.
 */
export async function corsForClients(app: FastifyInstance): Promise<void> {
  app.addHook('onRequest', (req, reply, done) => {
    if (!CORS_PATHS.has(pathOf(req))) return done();
    if (req.method !== 'OPTIONS') {
      reply.headers(ANSWER);
      return done();
    }
    // An OPTIONS request that is not a preflight (no Origin, no method asked for) is the endpoint's own (405 there).
    if (req.headers.origin === undefined || req.headers['access-control-request-method'] === undefined) return done();
    // Answered here, before any route's hooks: a preflight carries no credentials to check.
    void reply.code(204).headers(ANSWER).headers(PREFLIGHT).send();
  });
  // A preflight to a path without an OPTIONS route of its own reaches the hook through this one;
  // anything else that reaches it has no such route: the 404 every unknown route gets.
  app.options('*', { schema: { hide: true } }, (_req, reply) => reply.callNotFound());
}
