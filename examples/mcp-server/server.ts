/**
 * An MCP server (Streamable HTTP, stateless) behind orgauth: a protected resource in the sense of
 * the MCP authorization specification.
 *
 * - GET /.well-known/oauth-protected-resource/<path> (RFC 9728): this resource, its scopes, and
 *   orgauth as the authorization server. MCP clients find orgauth from here.
 * - POST <path>: JSON-RPC, with an orgauth access token for this resource. Without one, 401 with
 *   `WWW-Authenticate: Bearer resource_metadata="..."` (RFC 9728 §5.1), which starts the client's
 *   authorization; with a bad one, the same with error="invalid_token" (RFC 6750 §3.1); a tool
 *   call the token has not the scope for, 403 error="insufficient_scope" with the scope to ask
 *   for (MCP's step-up).
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { type ContactInput, ContactStore, createContactsServer, SCOPES_SUPPORTED, TOOL_SCOPES } from './contacts.js';
import { canonicalResourceUri, InvalidTokenError, type OrgauthToken, OrgauthTokenVerifier } from './orgauth-tokens.js';

const PRM_PATH = '/.well-known/oauth-protected-resource';
const MAX_BODY_BYTES = 1024 * 1024;

export interface McpServerOptions {
  /** orgauth's issuer, exactly as its metadata names it, e.g. https://auth.example.com. */
  issuer: string;
  /** This server's resource URI, as registered with `orgauth resource create --uri`: where clients reach it, e.g. https://mcp.example.com/mcp. */
  resourceUri: string;
  port: number;
  /** Default 127.0.0.1. */
  host?: string;
  /** The example's data to start with, per orgauth organization id. */
  contacts?: ReadonlyArray<ContactInput & { organizationId: number }>;
  /** A name shown by clients that display RFC 9728's resource_name. */
  resourceName?: string;
}

export interface RunningMcpServer {
  /** The canonical resource URI: the `aud` of the tokens this server accepts, and the MCP endpoint. */
  resource: string;
  /** Where this server's RFC 9728 document is (the URL its 401s point to). */
  resourceMetadataUrl: string;
  store: ContactStore;
  close(): Promise<void>;
}

/** The RFC 9728 §3.1 location of a resource's metadata: the well-known prefix before the resource's path. */
export function resourceMetadataUrl(resource: string): string {
  const url = new URL(resource);
  return `${url.origin}${PRM_PATH}${url.pathname === '/' ? '' : url.pathname}`;
}

/** RFC 6750 §2.1: `Bearer <token>`; anything else counts as no token. */
function bearerToken(authorization: string | undefined): string | undefined {
  return (authorization === undefined ? null : /^Bearer +([A-Za-z0-9\-._~+/]+=*) *$/i.exec(authorization))?.[1];
}

function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store', ...headers }).end(JSON.stringify(body));
}

class BodyError extends Error {
  constructor(
    readonly status: number,
    readonly rpcCode: number,
    message: string,
  ) {
    super(message);
  }
}

async function readJsonBody(req: IncomingMessage): Promise<unknown> {
  const type = (req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase();
  if (type !== 'application/json') throw new BodyError(415, -32000, 'Content-Type must be application/json');
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_BODY_BYTES) throw new BodyError(413, -32000, `the body exceeds ${MAX_BODY_BYTES} bytes`);
    chunks.push(chunk);
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString('utf8'));
  } catch {
    throw new BodyError(400, -32700, 'Parse error');
  }
}

/** The scopes the tool calls in a JSON-RPC message (or batch) need. */
function scopesNeeded(body: unknown): string[] {
  const messages = Array.isArray(body) ? body : [body];
  const needed = new Set<string>();
  for (const message of messages) {
    if (typeof message !== 'object' || message === null) continue;
    const { method, params } = message as { method?: unknown; params?: { name?: unknown } };
    if (method !== 'tools/call' || typeof params?.name !== 'string') continue;
    const scope = Object.hasOwn(TOOL_SCOPES, params.name) ? TOOL_SCOPES[params.name] : undefined;
    if (scope !== undefined) needed.add(scope);
  }
  return [...needed];
}

/** Starts the example MCP server: discovers orgauth, then listens. */
export async function startMcpServer(options: McpServerOptions): Promise<RunningMcpServer> {
  const resource = canonicalResourceUri(options.resourceUri);
  const resourceOrigin = new URL(resource).origin;
  const mcpPath = new URL(resource).pathname || '/';
  const metadataUrl = resourceMetadataUrl(resource);
  const verifier = await OrgauthTokenVerifier.create(options.issuer, resource);
  const store = new ContactStore();
  for (const { organizationId, ...contact } of options.contacts ?? []) store.add(organizationId, contact);

  const protectedResourceMetadata = {
    resource,
    authorization_servers: [options.issuer],
    scopes_supported: SCOPES_SUPPORTED,
    bearer_methods_supported: ['header'],
    resource_name: options.resourceName ?? 'Contacts (orgauth MCP example)',
  };

  /** RFC 6750 §3 with RFC 9728 §5.1's resource_metadata; no error code when no token was sent (RFC 6750 §3.1). */
  function challenge(res: ServerResponse, status: 401 | 403, error?: { code: 'invalid_token' | 'insufficient_scope'; description: string; scope?: string }): void {
    const params = error === undefined ? [] : [`error="${error.code}"`, `error_description="${error.description}"`, ...(error.scope === undefined ? [] : [`scope="${error.scope}"`])];
    params.push(`resource_metadata="${metadataUrl}"`);
    sendJson(res, status, error === undefined ? { error: 'invalid_request', error_description: 'an access token is required' } : { error: error.code, error_description: error.description }, {
      'www-authenticate': `Bearer ${params.join(', ')}`,
    });
  }

  async function authenticate(req: IncomingMessage, res: ServerResponse): Promise<OrgauthToken | undefined> {
    const token = bearerToken(req.headers.authorization);
    if (token === undefined) {
      challenge(res, 401);
      return undefined;
    }
    try {
      return await verifier.verify(token);
    } catch (err) {
      if (!(err instanceof InvalidTokenError)) throw err;
      challenge(res, 401, { code: 'invalid_token', description: 'the access token is invalid, expired, or not for this server' });
      return undefined;
    }
  }

  async function serveMcp(req: IncomingMessage, res: ServerResponse): Promise<void> {
    // MCP transports §Security: check Origin, so a web page cannot reach a local server through DNS rebinding.
    if (req.headers.origin !== undefined && req.headers.origin !== resourceOrigin) {
      return sendJson(res, 403, { error: 'forbidden', error_description: 'requests from this origin are not accepted' });
    }
    const auth = await authenticate(req, res);
    if (!auth) return;
    // Stateless: no server-initiated stream (GET) and no session to end (DELETE).
    if (req.method !== 'POST') return sendJson(res, 405, { jsonrpc: '2.0', error: { code: -32000, message: 'Method not allowed' }, id: null }, { allow: 'POST' });
    let body: unknown;
    try {
      body = await readJsonBody(req);
    } catch (err) {
      if (!(err instanceof BodyError)) throw err;
      return sendJson(res, err.status, { jsonrpc: '2.0', error: { code: err.rpcCode, message: err.message }, id: null });
    }
    const missing = scopesNeeded(body).filter((s) => !auth.scopes.includes(s));
    if (missing.length > 0) {
      // The scopes to ask for: those held and those missing, as a new authorization replaces the old one's.
      return challenge(res, 403, { code: 'insufficient_scope', description: `this call needs ${missing.join(' ')}`, scope: [...new Set([...auth.scopes, ...missing])].join(' ') });
    }
    const server = createContactsServer(store, auth.organizationId);
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
    res.on('close', () => {
      void transport.close();
      void server.close();
    });
    await server.connect(transport);
    await transport.handleRequest(req, res, body);
  }

  function serveMetadata(req: IncomingMessage, res: ServerResponse): void {
    // Public metadata, readable by browser-based clients of any origin.
    const cors = { 'access-control-allow-origin': '*' };
    if (req.method === 'OPTIONS') {
      res.writeHead(204, { ...cors, 'access-control-allow-methods': 'GET', 'access-control-allow-headers': 'mcp-protocol-version' }).end();
    } else if (req.method !== 'GET') {
      sendJson(res, 405, { error: 'method_not_allowed' }, { allow: 'GET' });
    } else {
      sendJson(res, 200, protectedResourceMetadata, { ...cors, 'cache-control': 'public, max-age=3600' });
    }
  }

  // The path-suffixed metadata location is RFC 9728's; the bare one is for clients that only look there.
  const metadataPaths = [new URL(metadataUrl).pathname, PRM_PATH];
  const http: Server = createServer((req, res) => {
    const pathname = (req.url ?? '/').split('?')[0];
    const handling = pathname === mcpPath ? serveMcp(req, res) : Promise.resolve(metadataPaths.includes(pathname ?? '') ? serveMetadata(req, res) : sendJson(res, 404, { error: 'not_found' }));
    handling.catch((err: unknown) => {
      console.error('mcp-server: request failed', err);
      if (!res.headersSent) sendJson(res, 500, { jsonrpc: '2.0', error: { code: -32603, message: 'Internal error' }, id: null });
      else res.destroy();
    });
  });

  await new Promise<void>((resolve, reject) => {
    http.once('error', reject);
    http.listen(options.port, options.host ?? '127.0.0.1', () => resolve());
  });

  return {
    resource,
    resourceMetadataUrl: metadataUrl,
    store,
    close: () =>
      new Promise<void>((resolve, reject) => {
        http.close((err) => (err ? reject(err) : resolve()));
        http.closeAllConnections();
      }),
  };
}
