/**
 * A service of your own behind orgauth: a resource server (RFC 6750) whose API is partitioned by
 * organization, as orgauth's own is. `GET /orgs/:organization_id/orders` answers with that
 * organization's orders to a token that is
 *
 * - orgauth's (issuer), for this service (`aud` is its resource URI: RFC 8707, RFC 9068 §4),
 * - for the organization in the path (`organization_id`: the one the user chose at consent),
 * - with the scope `orders.read`,
 *
 * checked one of two ways:
 *
 * - `jwt`: offline, with orgauth's published keys (jose, through ../mcp-server/orgauth-tokens.ts).
 *   No call per request; a revoked token is accepted until it expires (its lifetime is the
 *   resource's `--access-token-ttl`: keep it short).
 * - `introspection`: each token asked of orgauth's `/oauth/introspect` with this service's own
 *   credentials (RFC 7662; `orgauth resource create` prints them). A revoked token, a revoked
 *   grant, a removed member's token are refused at once; one call per request.
 *
 * Refusals: 401 with `WWW-Authenticate: Bearer` (error="invalid_token" when a token was sent,
 * RFC 6750 §3.1), 403 error="insufficient_scope" without the scope, 403 for another organization.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { canonicalResourceUri, discoverOrgauth, InvalidTokenError, OrgauthTokenVerifier } from '../mcp-server/orgauth-tokens.js';

export const ORDERS_SCOPE = 'orders.read';
const INTROSPECTION_TIMEOUT_MS = 5000;

export interface ResourceServerOptions {
  /** orgauth's issuer, exactly as its metadata names it. */
  issuer: string;
  /** This service's resource URI, as registered with `orgauth resource create --uri`. */
  resourceUri: string;
  port: number;
  host?: string;
  /** `introspection` needs this service's client id and secret. */
  mode: { kind: 'jwt' } | { kind: 'introspection'; clientId: string; clientSecret: string };
  /** The orders of each organization, by organization id. */
  orders: Record<number, { id: string; total: number }[]>;
}

/** What the service knows of a caller once its token is accepted. */
interface Caller {
  organizationId: number;
  subject: string;
  scopes: string[];
}

/** Checks a token and says who it is for; InvalidTokenError otherwise. */
type TokenCheck = (token: string) => Promise<Caller>;

function jwtCheck(verifier: OrgauthTokenVerifier): TokenCheck {
  return async (token) => {
    const t = await verifier.verify(token);
    return { organizationId: t.organizationId, subject: t.subject, scopes: t.scopes };
  };
}

/**
 * RFC 7662 with client_secret_basic: `active` decides, and the answer must still be for this
 * resource (orgauth answers a resource only about its own tokens; checking costs nothing).
 */
function introspectionCheck(introspectionEndpoint: string, resource: string, clientId: string, clientSecret: string): TokenCheck {
  const encode = (s: string) => encodeURIComponent(s).replace(/%20/g, '+');
  const authorization = `Basic ${Buffer.from(`${encode(clientId)}:${encode(clientSecret)}`).toString('base64')}`;
  return async (token) => {
    const res = await fetch(introspectionEndpoint, {
      method: 'POST',
      headers: { authorization, 'content-type': 'application/x-www-form-urlencoded', accept: 'application/json' },
      body: new URLSearchParams({ token }),
      redirect: 'error',
      signal: AbortSignal.timeout(INTROSPECTION_TIMEOUT_MS),
    });
    if (!res.ok) throw new Error(`introspection: HTTP ${res.status}`);
    const answer = (await res.json()) as Record<string, unknown>;
    if (answer.active !== true) throw new InvalidTokenError('inactive');
    const aud = answer.aud;
    if (aud !== resource && !(Array.isArray(aud) && aud.includes(resource))) throw new InvalidTokenError('for another resource');
    if (typeof answer.organization_id !== 'number' || typeof answer.sub !== 'string' || typeof answer.scope !== 'string') throw new InvalidTokenError('claims of the wrong type');
    return { organizationId: answer.organization_id, subject: answer.sub, scopes: answer.scope.split(' ').filter((s) => s !== '') };
  };
}

/** RFC 6750 §2.1: `Bearer <token>`; anything else counts as no token. */
function bearerToken(authorization: string | undefined): string | undefined {
  return (authorization === undefined ? null : /^Bearer +([A-Za-z0-9\-._~+/]+=*) *$/i.exec(authorization))?.[1];
}

function send(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store', ...headers }).end(JSON.stringify(body));
}

export interface RunningResourceServer {
  url: string;
  close(): Promise<void>;
}

export async function startResourceServer(options: ResourceServerOptions): Promise<RunningResourceServer> {
  const resource = canonicalResourceUri(options.resourceUri);
  let check: TokenCheck;
  if (options.mode.kind === 'jwt') {
    check = jwtCheck(await OrgauthTokenVerifier.create(options.issuer, resource));
  } else {
    const metadata = (await discoverOrgauth(options.issuer)) as { introspection_endpoint?: unknown };
    const endpoint = typeof metadata.introspection_endpoint === 'string' ? metadata.introspection_endpoint : `${options.issuer}/oauth/introspect`;
    check = introspectionCheck(endpoint, resource, options.mode.clientId, options.mode.clientSecret);
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const match = /^\/orgs\/([1-9][0-9]{0,9})\/orders$/.exec(new URL(req.url ?? '/', 'http://service').pathname);
    if (!match || req.method !== 'GET') return send(res, 404, { error: 'not_found' });
    const token = bearerToken(req.headers.authorization);
    if (token === undefined) return send(res, 401, { error: 'unauthorized' }, { 'www-authenticate': 'Bearer' });
    let caller: Caller;
    try {
      caller = await check(token);
    } catch (err) {
      if (err instanceof InvalidTokenError) return send(res, 401, { error: 'invalid_token' }, { 'www-authenticate': 'Bearer error="invalid_token"' });
      throw err;
    }
    if (!caller.scopes.includes(ORDERS_SCOPE)) {
      return send(res, 403, { error: 'insufficient_scope' }, { 'www-authenticate': `Bearer error="insufficient_scope", scope="${ORDERS_SCOPE}"` });
    }
    // The organization in the path must be the token's: one organization's token never reads another's.
    const organizationId = Number(match[1]);
    if (caller.organizationId !== organizationId) return send(res, 403, { error: 'forbidden', error_description: 'the token is for another organization' });
    return send(res, 200, { organization_id: organizationId, subject: caller.subject, orders: options.orders[organizationId] ?? [] });
  }

  const server: Server = createServer((req, res) => {
    handle(req, res).catch(() => {
      if (!res.headersSent) send(res, 503, { error: 'temporarily_unavailable' });
      else res.destroy();
    });
  });
  const host = options.host ?? '127.0.0.1';
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(options.port, host, resolve));
  return {
    url: `http://${host}:${options.port}`,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
