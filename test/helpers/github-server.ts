/**
 * A GitHub stand-in for the tests: a node:http server on a free port of 127.0.0.1 that answers as
 * a GitHub Enterprise Server at `baseUrl` does, so orgauth is pointed at it with
 * `--base-url http://127.0.0.1:PORT` (the web flow at the root, the REST API under /api/v3).
 *
 * What it serves, in GitHub's documented request and response shapes:
 * - `GET /login/oauth/authorize`: no login page; the user the test signed in (signInAs) accepts
 *   at once, and the browser is sent (302) to `redirect_uri?code=…&state=…`. An unknown client_id
 *   is a 404 page. A `redirect_uri` must have the registered callback's scheme, host (or a
 *   subdomain of it) and port, and a path that is the callback's or below it ("Redirect URLs" of
 *   GitHub's "Authorizing OAuth apps"); otherwise a 400 page and no redirect. GitHub's older
 *   docs describe a redirect to the registered callback with `error=redirect_uri_mismatch`
 *   instead; a page is what github.com shows today and the stricter answer. GitHub's port
 *   exemption for loopback callbacks is left out: every callback here is on loopback, and a test
 *   of the redirect_uri orgauth sends needs the port to count. After denyNext(), the redirect
 *   carries `error=access_denied` (the user pressed Cancel). PKCE as GitHub has it since July
 *   2025: optional, S256 only; a challenge with another method is an `invalid_request` redirect.
 * - `POST /login/oauth/access_token`: the client by form (or JSON) body or HTTP Basic; the answer
 *   is JSON with `Accept: application/json`, form-encoded otherwise. Errors are GitHub's: HTTP
 *   200 with `error`, `error_description`, `error_uri` (incorrect_client_credentials,
 *   bad_verification_code, redirect_uri_mismatch). A code is single-use (spent by the first
 *   exchange its own client attempts, whatever the outcome), lives 10 minutes by Date.now() (so
 *   vi.setSystemTime expires it), and is bound to the redirect_uri it was issued for: one sent at
 *   the exchange must be identical. A wrong or missing code_verifier for a code issued with a
 *   challenge is bad_verification_code (GitHub does not document which error it gives).
 *   Tokens are `gho_` and 36 base62 characters, with the scopes asked for, comma-separated.
 * - `GET /api/v3/user`: the user (a realistic subset of GitHub's fields; `email` is the public
 *   address or null); `GET /api/v3/user/emails`: every address, verified or not, which needs the
 *   `user` or `user:email` scope (404 Not Found otherwise, as GitHub answers). `Authorization:
 *   Bearer <token>` or `token <token>`; 401 "Bad credentials" for any other token, "Requires
 *   authentication" without one. Answers carry `X-OAuth-Scopes` as GitHub's do.
 *
 * Knobs: register (an OAuth app), signInAs (the browser's user; calling it again with the same id
 * updates that user, tokens included), denyNext, slow (the next answer of every endpoint, or of
 * one, is held back), huge (the next /user answer is padded to a size), and the logs requests,
 * authorizeRequests and tokenRequests.
 */
import { createHash, randomBytes, randomInt } from 'node:crypto';
import { once } from 'node:events';
import http from 'node:http';
import { type AddressInfo, isIP } from 'node:net';

/** The timers as they were at load: a test that fakes the clock (vi.useFakeTimers) still gets real delays here. */
const realSetTimeout = globalThis.setTimeout;
const realClearTimeout = globalThis.clearTimeout;

export interface GitHubEmail {
  email: string;
  primary: boolean;
  verified: boolean;
  /** GitHub's value: 'public' or 'private' for the primary address, null for the others. Derived when absent. */
  visibility?: 'public' | 'private' | null;
}

export interface GitHubUser {
  /** The numeric id: the stable subject (a login can be renamed). */
  id: number;
  login: string;
  name?: string | null;
  /** The address shown on the profile, /user's `email`; null or absent when none is public. */
  publicEmail?: string | null;
  emails: GitHubEmail[];
}

export interface GitHubClient {
  clientId: string;
  clientSecret: string;
  /** The OAuth app's "Authorization callback URL". */
  callbackUrl: string;
}

/** The server's endpoints, as slow() names them. */
export type GitHubEndpoint = 'authorize' | 'token' | 'user' | 'emails';

export interface GitHubRequest {
  method: string;
  /** The path without the query. */
  path: string;
  /** The Authorization header as sent, if any. */
  authorization: string | undefined;
}

export interface GitHubServer {
  /** `http://127.0.0.1:PORT`: what orgauth's --base-url takes. */
  readonly baseUrl: string;
  /** `${baseUrl}/api/v3`, the REST API of a GitHub Enterprise Server. */
  readonly apiUrl: string;
  readonly port: number;
  /** Every request, in order. */
  readonly requests: GitHubRequest[];
  /** The query of every authorize request, in order, whatever its outcome. */
  readonly authorizeRequests: Record<string, string>[];
  /** The parameters of every token request (body, with a Basic header's client_id and client_secret), in order. */
  readonly tokenRequests: Record<string, string>[];
  /** Registers (or replaces) an OAuth app. */
  register(client: GitHubClient): void;
  /** The user the next authorize requests are made by; updates the user with that id everywhere. */
  signInAs(user: GitHubUser): void;
  /** The next authorize request that would succeed redirects with error=access_denied instead. */
  denyNext(): void;
  /** Holds the next answer of every endpoint (or only of `endpoint`) back by `ms`. */
  slow(ms: number, endpoint?: GitHubEndpoint): void;
  /** The next /api/v3/user answer is `bytes` bytes of valid JSON (the user, padded). */
  huge(bytes: number): void;
  close(): Promise<void>;
}

const CODE_LIFETIME_MS = 10 * 60 * 1000;
const DOCS = 'https://docs.github.com';
const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
const MAX_BODY = 64 * 1024;
const ROUTES = new Map<string, GitHubEndpoint>([
  ['GET /login/oauth/authorize', 'authorize'],
  ['POST /login/oauth/access_token', 'token'],
  ['GET /api/v3/user', 'user'],
  ['GET /api/v3/user/emails', 'emails'],
]);

/** GitHub's token errors: HTTP 200 with these members ("Troubleshooting OAuth app access token request errors"). */
const TOKEN_ERRORS = {
  incorrect_client_credentials: {
    error_description: 'The client_id and/or client_secret passed are incorrect.',
    error_uri: `${DOCS}/apps/managing-oauth-apps/troubleshooting-oauth-app-access-token-request-errors/#incorrect-client-credentials`,
  },
  redirect_uri_mismatch: {
    error_description: 'The redirect_uri MUST match the registered callback URL for this application.',
    error_uri: `${DOCS}/apps/managing-oauth-apps/troubleshooting-authorization-request-errors/#redirect-uri-mismatch2`,
  },
  bad_verification_code: {
    error_description: 'The code passed is incorrect or expired.',
    error_uri: `${DOCS}/apps/managing-oauth-apps/troubleshooting-oauth-app-access-token-request-errors/#bad-verification-code`,
  },
} as const;
type TokenError = keyof typeof TOKEN_ERRORS;

interface IssuedCode {
  clientId: string;
  userId: number;
  scopes: string[];
  /** The redirect_uri of the authorize request; undefined when it named none (the callback was used). */
  redirectUri: string | undefined;
  codeChallenge: string | undefined;
  expiresAt: number;
}

interface IssuedToken {
  clientId: string;
  userId: number;
  scopes: string[];
}

/** Whether GitHub would send the browser to `given` for an app whose callback is `registered`. */
function redirectAllowed(registered: string, given: string): boolean {
  let r: URL;
  let g: URL;
  try {
    r = new URL(registered);
    g = new URL(given);
  } catch {
    return false;
  }
  if (g.protocol !== r.protocol || g.port !== r.port || g.username !== '' || g.password !== '' || g.hash !== '') return false;
  const subdomain = isIP(r.hostname) === 0 && g.hostname.endsWith(`.${r.hostname}`);
  if (g.hostname !== r.hostname && !subdomain) return false;
  const below = r.pathname.endsWith('/') ? r.pathname : `${r.pathname}/`;
  return g.pathname === r.pathname || g.pathname.startsWith(below);
}

/** `url` with `params` added to its query (a callback may have a query of its own). */
function withParams(url: string, params: Record<string, string>): string {
  const target = new URL(url);
  for (const [name, value] of Object.entries(params)) target.searchParams.append(name, value);
  return target.toString();
}

/** The scopes of a scope parameter: GitHub takes them space- or comma-separated. */
function parseScopes(scope: string | null | undefined): string[] {
  return [...new Set((scope ?? '').split(/[\s,]+/).filter((s) => s !== ''))];
}

function randomBase62(length: number): string {
  let out = '';
  for (let i = 0; i < length; i++) out += BASE62[randomInt(BASE62.length)];
  return out;
}

function page(res: http.ServerResponse, status: number, title: string, text: string): void {
  const escape = (s: string) => s.replace(/[&<>"]/g, (c) => `&#${c.charCodeAt(0)};`);
  res
    .writeHead(status, { 'content-type': 'text/html; charset=utf-8' })
    .end(`<!DOCTYPE html><html lang="en"><head><title>${escape(title)}</title></head><body><h1>${escape(title)}</h1><p>${escape(text)}</p></body></html>`);
}

function json(res: http.ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', ...headers }).end(JSON.stringify(body));
}

/** A REST API error as GitHub answers it. */
function apiError(res: http.ServerResponse, status: number, message: string, documentation: string): void {
  json(res, status, { message, documentation_url: `${DOCS}${documentation}`, status: String(status) });
}

class TestGitHubServer implements GitHubServer {
  readonly requests: GitHubRequest[] = [];
  readonly authorizeRequests: Record<string, string>[] = [];
  readonly tokenRequests: Record<string, string>[] = [];
  private readonly clients = new Map<string, GitHubClient>();
  private readonly users = new Map<number, GitHubUser>();
  private readonly codes = new Map<string, IssuedCode>();
  private readonly tokens = new Map<string, IssuedToken>();
  private readonly delays = new Map<GitHubEndpoint, number>();
  private readonly timers = new Set<NodeJS.Timeout>();
  private currentUser: number | undefined;
  private denying = false;
  private padTo: number | undefined;

  private constructor(
    private readonly server: http.Server,
    readonly port: number,
  ) {}

  static async start(): Promise<TestGitHubServer> {
    let github: TestGitHubServer | undefined;
    const server = http.createServer((req, res) => {
      github!.handle(req, res).catch((err: unknown) => {
        if (!res.headersSent && !res.destroyed) page(res, 500, 'Server error', err instanceof Error ? err.message : String(err));
      });
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    github = new TestGitHubServer(server, (server.address() as AddressInfo).port);
    return github;
  }

  get baseUrl(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  get apiUrl(): string {
    return `${this.baseUrl}/api/v3`;
  }

  register(client: GitHubClient): void {
    this.clients.set(client.clientId, { ...client });
  }

  signInAs(user: GitHubUser): void {
    this.users.set(user.id, structuredClone(user));
    this.currentUser = user.id;
  }

  denyNext(): void {
    this.denying = true;
  }

  slow(ms: number, endpoint?: GitHubEndpoint): void {
    const endpoints: GitHubEndpoint[] = endpoint ? [endpoint] : ['authorize', 'token', 'user', 'emails'];
    for (const e of endpoints) this.delays.set(e, ms);
  }

  huge(bytes: number): void {
    this.padTo = bytes;
  }

  async close(): Promise<void> {
    for (const timer of this.timers) realClearTimeout(timer);
    this.timers.clear();
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', this.baseUrl);
    const method = req.method ?? 'GET';
    this.requests.push({ method, path: url.pathname, authorization: req.headers.authorization });
    const endpoint = ROUTES.get(`${method} ${url.pathname.replace(/\/$/, '')}`);
    const body = method === 'POST' ? await this.readBody(req) : '';
    if (endpoint) await this.delay(endpoint);
    // A client that gave up while the answer was held back (a timeout test) gets nothing.
    if (res.destroyed || req.socket.destroyed) return;
    switch (endpoint) {
      case 'authorize':
        return this.authorize(url, res);
      case 'token':
        return this.token(req, body, res);
      case 'user':
        return this.user(req, res);
      case 'emails':
        return this.emails(req, res);
      default:
        if (url.pathname.startsWith('/api/v3/')) return apiError(res, 404, 'Not Found', '/rest');
        return page(res, 404, 'Page not found', `${method} ${url.pathname} is not served by the test GitHub server.`);
    }
  }

  private async readBody(req: http.IncomingMessage): Promise<string> {
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of req) {
      size += (chunk as Buffer).length;
      if (size > MAX_BODY) throw new Error('request body too large');
      chunks.push(chunk as Buffer);
    }
    return Buffer.concat(chunks).toString('utf8');
  }

  /** Waits out a delay slow() set for `endpoint`, once. */
  private async delay(endpoint: GitHubEndpoint): Promise<void> {
    const ms = this.delays.get(endpoint);
    if (ms === undefined) return;
    this.delays.delete(endpoint);
    await new Promise<void>((resolve) => {
      const timer = realSetTimeout(() => {
        this.timers.delete(timer);
        resolve();
      }, ms);
      this.timers.add(timer);
    });
  }

  private authorize(url: URL, res: http.ServerResponse): void {
    const query = url.searchParams;
    this.authorizeRequests.push(Object.fromEntries(query));
    const client = this.clients.get(query.get('client_id') ?? '');
    if (!client) return page(res, 404, 'Page not found', 'No OAuth app has this client_id.');
    const redirectUri = query.get('redirect_uri') ?? undefined;
    if (redirectUri !== undefined && !redirectAllowed(client.callbackUrl, redirectUri)) {
      return page(res, 400, 'redirect_uri mismatch', 'The redirect_uri is not associated with this application. It must match the registered callback URL.');
    }
    const target = redirectUri ?? client.callbackUrl;
    const state = query.get('state');
    const redirect = (params: Record<string, string>) => {
      res.writeHead(302, { location: withParams(target, state === null ? params : { ...params, state }), 'content-type': 'text/html; charset=utf-8' }).end();
    };
    const user = this.currentUser;
    if (user === undefined) return page(res, 200, 'Sign in to GitHub', 'No user is signed in at the test GitHub server: call signInAs() first.');
    const codeChallenge = query.get('code_challenge') ?? undefined;
    if (codeChallenge !== undefined && query.get('code_challenge_method') !== 'S256') {
      return redirect({ error: 'invalid_request', error_description: 'Only the S256 code_challenge_method is supported.' });
    }
    if (this.denying) {
      this.denying = false;
      return redirect({
        error: 'access_denied',
        error_description: 'The user has denied your application access.',
        error_uri: `${DOCS}/apps/managing-oauth-apps/troubleshooting-authorization-request-errors/#access-denied`,
      });
    }
    const code = randomBytes(10).toString('hex');
    this.codes.set(code, {
      clientId: client.clientId,
      userId: user,
      scopes: parseScopes(query.get('scope')),
      redirectUri,
      codeChallenge,
      expiresAt: Date.now() + CODE_LIFETIME_MS,
    });
    redirect({ code });
  }

  private token(req: http.IncomingMessage, body: string, res: http.ServerResponse): void {
    const params: Record<string, string> = {};
    if (/^application\/json\b/i.test(req.headers['content-type'] ?? '')) {
      try {
        const parsed: unknown = JSON.parse(body);
        if (typeof parsed === 'object' && parsed !== null) {
          for (const [name, value] of Object.entries(parsed)) if (typeof value === 'string') params[name] = value;
        }
      } catch {
        // An unreadable body has no parameters: the client is then unknown.
      }
    } else {
      Object.assign(params, Object.fromEntries(new URLSearchParams(body)));
    }
    const basic = /^basic\s+(\S+)$/i.exec(req.headers.authorization ?? '');
    if (basic) {
      // RFC 6749 §2.3.1: each half is form-encoded before base64.
      const decoded = Buffer.from(basic[1]!, 'base64').toString('utf8');
      const colon = decoded.indexOf(':');
      const part = (s: string) => {
        try {
          return decodeURIComponent(s.replace(/\+/g, ' '));
        } catch {
          return s;
        }
      };
      if (colon >= 0) {
        params.client_id = part(decoded.slice(0, colon));
        params.client_secret = part(decoded.slice(colon + 1));
      }
    }
    this.tokenRequests.push({ ...params });
    const wantsJson = /application\/json/i.test(req.headers.accept ?? '');
    const answer = (fields: Record<string, string>) => {
      if (wantsJson) return json(res, 200, fields);
      res.writeHead(200, { 'content-type': 'application/x-www-form-urlencoded; charset=utf-8' }).end(new URLSearchParams(fields).toString());
    };
    const fail = (error: TokenError) => answer({ error, ...TOKEN_ERRORS[error] });

    const client = this.clients.get(params.client_id ?? '');
    if (!client || params.client_secret !== client.clientSecret) return fail('incorrect_client_credentials');
    const code = this.codes.get(params.code ?? '');
    if (!code || code.clientId !== client.clientId) return fail('bad_verification_code');
    this.codes.delete(params.code!);
    if (Date.now() >= code.expiresAt) return fail('bad_verification_code');
    if (params.redirect_uri !== undefined && params.redirect_uri !== (code.redirectUri ?? client.callbackUrl)) return fail('redirect_uri_mismatch');
    if (code.codeChallenge !== undefined) {
      const verifier = params.code_verifier ?? '';
      if (createHash('sha256').update(verifier).digest('base64url') !== code.codeChallenge) return fail('bad_verification_code');
    }
    const token = `gho_${randomBase62(36)}`;
    this.tokens.set(token, { clientId: client.clientId, userId: code.userId, scopes: code.scopes });
    answer({ access_token: token, token_type: 'bearer', scope: code.scopes.join(',') });
  }

  /** The token of a request and its user, or undefined after answering 401. */
  private authenticate(req: http.IncomingMessage, res: http.ServerResponse, documentation: string): { token: IssuedToken; user: GitHubUser } | undefined {
    const header = req.headers.authorization;
    if (header === undefined || header.trim() === '') {
      apiError(res, 401, 'Requires authentication', documentation);
      return undefined;
    }
    const match = /^(?:bearer|token)\s+(\S+)$/i.exec(header.trim());
    const token = match ? this.tokens.get(match[1]!) : undefined;
    const user = token ? this.users.get(token.userId) : undefined;
    if (!token || !user) {
      apiError(res, 401, 'Bad credentials', '/rest');
      return undefined;
    }
    return { token, user };
  }

  private scopeHeaders(token: IssuedToken, accepted: string): Record<string, string> {
    return { 'x-oauth-scopes': token.scopes.join(', '), 'x-accepted-oauth-scopes': accepted, 'x-github-media-type': 'github.v3; format=json' };
  }

  private user(req: http.IncomingMessage, res: http.ServerResponse): void {
    const found = this.authenticate(req, res, '/rest/users/users#get-the-authenticated-user');
    if (!found) return;
    const { token, user } = found;
    const object: Record<string, unknown> = this.userObject(user);
    const headers = this.scopeHeaders(token, '');
    const padTo = this.padTo;
    this.padTo = undefined;
    if (padTo === undefined) return json(res, 200, object, headers);
    // `"_padding":""` and its comma, then as many characters as make the body `padTo` bytes.
    const base = JSON.stringify({ ...object, _padding: '' });
    const text = JSON.stringify({ ...object, _padding: ' '.repeat(Math.max(0, padTo - Buffer.byteLength(base))) });
    res.writeHead(200, { 'content-type': 'application/json; charset=utf-8', 'content-length': String(Buffer.byteLength(text)), ...headers }).end(text);
  }

  private emails(req: http.IncomingMessage, res: http.ServerResponse): void {
    const documentation = '/rest/users/emails#list-email-addresses-for-the-authenticated-user';
    const found = this.authenticate(req, res, documentation);
    if (!found) return;
    const { token, user } = found;
    if (!token.scopes.includes('user') && !token.scopes.includes('user:email')) return apiError(res, 404, 'Not Found', documentation);
    const emails = user.emails.map((e) => ({
      email: e.email,
      primary: e.primary,
      verified: e.verified,
      visibility: e.visibility !== undefined ? e.visibility : e.primary ? (e.email === user.publicEmail ? 'public' : 'private') : null,
    }));
    json(res, 200, emails, this.scopeHeaders(token, 'user'));
  }

  /** GET /user's object for `user` on this server (GitHub Enterprise Server's URLs). */
  private userObject(user: GitHubUser): Record<string, unknown> {
    const api = `${this.apiUrl}/users/${user.login}`;
    return {
      login: user.login,
      id: user.id,
      node_id: Buffer.from(`04:User${user.id}`).toString('base64'),
      avatar_url: `${this.baseUrl}/avatars/u/${user.id}`,
      gravatar_id: '',
      url: api,
      html_url: `${this.baseUrl}/${user.login}`,
      followers_url: `${api}/followers`,
      following_url: `${api}/following{/other_user}`,
      gists_url: `${api}/gists{/gist_id}`,
      starred_url: `${api}/starred{/owner}{/repo}`,
      subscriptions_url: `${api}/subscriptions`,
      organizations_url: `${api}/orgs`,
      repos_url: `${api}/repos`,
      events_url: `${api}/events{/privacy}`,
      received_events_url: `${api}/received_events`,
      type: 'User',
      user_view_type: 'private',
      site_admin: false,
      name: user.name ?? null,
      company: null,
      blog: '',
      location: null,
      email: user.publicEmail ?? null,
      hireable: null,
      bio: null,
      twitter_username: null,
      notification_email: null,
      public_repos: 0,
      public_gists: 0,
      followers: 0,
      following: 0,
      created_at: '2020-01-01T00:00:00Z',
      updated_at: '2020-01-01T00:00:00Z',
      private_gists: 0,
      total_private_repos: 0,
      owned_private_repos: 0,
      disk_usage: 0,
      collaborators: 0,
      two_factor_authentication: true,
    };
  }
}

/** A GitHub stand-in on a free port of 127.0.0.1, with no app registered and nobody signed in. */
export async function startGitHubServer(): Promise<GitHubServer> {
  return TestGitHubServer.start();
}
