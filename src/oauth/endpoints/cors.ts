/**
 * CORS for the endpoints a browser-based client (a single-page application, an MCP client in a
 * browser) calls itself: discovery, the JWK Set, the token, revocation and userinfo endpoints.
 * Any origin, never credentials: these endpoints authenticate by what the request carries (a
 * client secret, a PKCE verifier, a bearer token), never by a cookie, so letting any page read
 * their answers gives it nothing it did not send. Every other route (the pages, which use the
 * session cookie; the API) gets no CORS headers, and a preflight there is a 404.
 */
import cors from '@fastify/cors';
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

const OPEN = {
  origin: '*',
  credentials: false,
  methods: ['GET', 'POST'],
  // MCP clients send MCP-Protocol-Version with their discovery requests too.
  allowedHeaders: ['Authorization', 'Content-Type', 'DPoP', 'MCP-Protocol-Version'],
  // A browser client must read why a token was refused (RFC 6750 §3) and, later, DPoP nonces.
  exposedHeaders: ['WWW-Authenticate', 'DPoP-Nonce'],
  maxAge: 600,
};

function pathOf(req: FastifyRequest): string {
  const q = req.url.indexOf('?');
  return q === -1 ? req.url : req.url.slice(0, q);
}

/** An OPTIONS request that is not a CORS preflight (no Origin, no method asked for) is the endpoint's own (405 there). */
function isOpenRequest(req: FastifyRequest): boolean {
  if (!CORS_PATHS.has(pathOf(req))) return false;
  return req.method !== 'OPTIONS' || (req.headers.origin !== undefined && req.headers['access-control-request-method'] !== undefined);
}

export async function corsForClients(app: FastifyInstance): Promise<void> {
  await app.register(cors, {
    hideOptionsRoute: true,
    delegator: (req, callback) => callback(null, isOpenRequest(req) ? OPEN : { origin: false }),
  });
}
