/**
 * An organization's upstream OpenID provider for the tests: node-oidc-provider (the certified
 * OpenID provider library) on http://127.0.0.1:PORT, with clients and accounts the test adds at
 * any time, and a sign-in the test drives either programmatically (signIn, a fetch-based browser
 * with its own cookie jar) or from a real Chromium (a one-field form at /interaction/:uid).
 *
 * Choices, each so that what orgauth's relying party sees is what a strict real provider sends:
 * - the issuer is exactly `http://127.0.0.1:PORT` (no trailing slash; discovery says the same);
 * - PKCE is required for every client (oidc-provider only offers S256), not only public ones;
 * - oidc-provider's default `conformIdTokenClaims: true`: with the code flow, the claims of the
 *   `email` and `profile` scopes (email, email_verified, name) are released at the UserInfo
 *   endpoint only, not in the ID token (OIDC Core §5.4); the ID token has sub and `amr`, which
 *   comes from the sign-in and is made part of `openid`;
 * - signing a user in also grants every scope and claim the client asked for (no consent page),
 *   as an organization's provider does for its own SSO application;
 * - storage is an in-memory adapter of this instance only: oidc-provider's own memory adapter is
 *   one module-wide store, so two upstream providers in one test file would share sessions.
 */
import { generateKeyPairSync, randomBytes, randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import type {
  Adapter,
  AdapterPayload,
  ClientMetadata,
  Configuration,
  InteractionResults,
  default as OidcProvider,
} from 'oidc-provider';

export interface UpstreamAccount {
  sub: string;
  email?: string;
  email_verified?: boolean;
  name?: string;
  /**
   * The `sub` the UserInfo endpoint answers with, when it is not `sub`: a provider that mixes
   * up its accounts (or an access token another subject's), which a relying party must refuse
   * (OIDC Core §5.3.4). Never released as a claim of its own.
   */
  userinfo_sub?: string;
  /** A Microsoft-like provider's (options.tenant): the tenant the account is of, in its ID token. */
  tid?: string;
  /** A Microsoft-like provider's: the email domain's owner verified the address (ID token). */
  xms_edov?: boolean;
}

/** Client metadata as oidc-provider takes it; the three named members are the ones every test sets. */
export interface UpstreamClient extends Omit<ClientMetadata, 'client_id' | 'client_secret' | 'redirect_uris'> {
  client_id: string;
  client_secret: string;
  redirect_uris: string[];
}

export interface UpstreamOidcOptions {
  clients?: UpstreamClient[];
  /** Accounts by the login typed into the form (or given to signIn). */
  accounts?: Record<string, UpstreamAccount>;
  /** The `amr` of every sign-in unless signIn says otherwise. Default ['pwd', 'mfa']. */
  amr?: string[];
  /**
   * What discovery advertises as `userinfo_endpoint` instead of the provider's own: another URL
   * (a provider whose UserInfo lives elsewhere), or none at all when null. The provider's own
   * endpoint stays on, unadvertised: oidc-provider releases the claims in the ID token when its
   * UserInfo is turned off, and these variations are of a provider that does not.
   */
  userinfoEndpoint?: string | null;
  /**
   * Microsoft's multi-tenant endpoints (login.microsoftonline.com): the provider is the tenant
   * `tenant` (a GUID), at issuer `http://127.0.0.1:PORT/<tenant>/v2.0`, with `tid` and `xms_edov`
   * in the ID token; `/common/v2.0` and `/organizations/v2.0` serve its discovery document with
   * the issuer `http://127.0.0.1:PORT/{tenantid}/v2.0`, as Microsoft's do. `multiTenantOrigin`
   * (the result's) is then what a connection's issuer is set to.
   */
  tenant?: string;
  /**
   * With `tenant`: whether the authorization response names the issuer (RFC 9207). Microsoft's
   * does not (and its discovery does not say it would); default false, as Microsoft.
   */
  issInResponse?: boolean;
}

export interface SignInOptions {
  /** This sign-in's `amr` (e.g. ['pwd'] for a user without a second factor). */
  amr?: string[];
  /**
   * The browser's cookies. Default: a fresh jar, a browser that never signed in upstream. Pass
   * the same jar twice to have the second authorization request find the upstream session.
   */
  jar?: CookieJar;
}

export interface UpstreamOidc {
  /** `http://127.0.0.1:PORT` (with options.tenant: `…/<tenant>/v2.0`), as discovery and the ID tokens' `iss` say it. */
  issuer: string;
  /** `http://127.0.0.1:PORT`: where the multi-tenant paths are (options.tenant). */
  origin: string;
  /** The node-oidc-provider instance, for tweaks a test needs (its events, its models). */
  provider: OidcProvider;
  /** Adds (or replaces) a client. token_endpoint_auth_method defaults to client_secret_post, what openid-client's discovery(…, clientSecret) uses. */
  registerClient(client: UpstreamClient): void;
  /** Adds (or replaces) the account signed in with `login`. */
  setAccount(login: string, claims: UpstreamAccount): void;
  /**
   * The user signs in upstream: follows `authorizeUrl` through the provider (sign-in form, login
   * `login`) and returns the URL the provider finally redirects to, normally the client's
   * redirect_uri with code, state and iss (or error). That last redirect is not followed.
   * Rejects when the login is unknown or the provider shows an error page instead of redirecting.
   */
  signIn(authorizeUrl: string | URL, login: string, options?: SignInOptions): Promise<string>;
  /** The user cancels the upstream sign-in: returns the redirect to the client with error=access_denied. */
  denySignIn(authorizeUrl: string | URL): Promise<string>;
  close(): Promise<void>;
}

/**
 * oidc-provider warns on import that it wants Node 22 (it runs on 20, which this project
 * supports), and through console.info / console.warn when a default it wants replaced is used.
 * The import happens once, with those two messages kept out of the test output.
 */
let providerModule: Promise<typeof import('oidc-provider')> | undefined;
function importProvider(): Promise<typeof import('oidc-provider')> {
  providerModule ??= (async () => {
    const { warn } = console;
    console.warn = (...args: unknown[]) => {
      if (typeof args[0] === 'string' && args[0].startsWith('oidc-provider WARNING: Unsupported runtime')) return;
      warn(...args);
    };
    try {
      return await import('oidc-provider');
    } finally {
      console.warn = warn;
    }
  })();
  return providerModule;
}

/**
 * A minimal cookie jar for the fetch-driven browser: oidc-provider's cookies are path-scoped
 * (/interaction/:uid, /auth/:uid) and cleared by an expired Set-Cookie, and that is all it needs.
 * Cookies are not scoped by host: one jar talks to one provider.
 */
export class CookieJar {
  private readonly cookies = new Map<string, { name: string; value: string; path: string; expires: number }>();

  store(response: Response): void {
    for (const line of response.headers.getSetCookie()) {
      const [pair = '', ...attributes] = line.split(';');
      const eq = pair.indexOf('=');
      if (eq <= 0) continue;
      const name = pair.slice(0, eq).trim();
      const value = pair.slice(eq + 1).trim();
      let path = '/';
      let expires = Number.POSITIVE_INFINITY;
      for (const attribute of attributes) {
        const [key = '', ...rest] = attribute.split('=');
        const v = rest.join('=').trim();
        switch (key.trim().toLowerCase()) {
          case 'path':
            path = v || '/';
            break;
          case 'expires':
            expires = Math.min(expires, Date.parse(v));
            break;
          case 'max-age':
            expires = Date.now() + Number(v) * 1000;
            break;
        }
      }
      const key = `${name}\0${path}`;
      if (expires <= Date.now()) this.cookies.delete(key);
      else this.cookies.set(key, { name, value, path, expires });
    }
  }

  /** The Cookie header for a request to `url`, or undefined without a matching cookie. */
  header(url: URL): string | undefined {
    const now = Date.now();
    const matching = [...this.cookies.values()].filter(
      (c) => c.expires > now && (url.pathname === c.path || url.pathname.startsWith(c.path.endsWith('/') ? c.path : `${c.path}/`)),
    );
    // RFC 6265 §5.4: longer paths first.
    matching.sort((a, b) => b.path.length - a.path.length);
    return matching.length ? matching.map((c) => `${c.name}=${c.value}`).join('; ') : undefined;
  }
}

const escapeHtml = (s: string): string =>
  s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c] ?? c);

function signInPage(uid: string, message?: string): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Upstream sign-in</title></head>
<body>
<h1>Upstream identity provider</h1>
${message ? `<p role="alert">${escapeHtml(message)}</p>` : ''}
<form method="post" action="/interaction/${encodeURIComponent(uid)}">
<label>Login <input name="login" autocomplete="username" autofocus required></label>
<button type="submit">Sign in</button>
</form>
</body></html>`;
}

async function readForm(req: IncomingMessage): Promise<URLSearchParams> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
}

/** One store per provider instance; see the module comment for why not oidc-provider's own. */
function memoryAdapterFactory(): { factory: (model: string) => Adapter; clients: Map<string, AdapterPayload> } {
  interface Entry {
    payload: AdapterPayload;
    expiresAt: number;
  }
  const models = new Map<string, Map<string, Entry>>();
  const byGrant = new Map<string, Set<{ model: string; id: string }>>();
  const byUid = new Map<string, string>();
  const byUserCode = new Map<string, string>();
  const clients = new Map<string, AdapterPayload>();
  const table = (model: string) => {
    let t = models.get(model);
    if (!t) models.set(model, (t = new Map()));
    return t;
  };

  const factory = (model: string): Adapter => {
    const entries = table(model);
    const find = async (id: string): Promise<AdapterPayload | undefined> => {
      if (model === 'Client') return clients.get(id);
      const entry = entries.get(id);
      if (!entry) return undefined;
      if (entry.expiresAt <= Date.now()) {
        entries.delete(id);
        return undefined;
      }
      return entry.payload;
    };
    return {
      async upsert(id, payload, expiresIn) {
        if (model === 'Client') {
          clients.set(id, payload);
          return;
        }
        entries.set(id, { payload, expiresAt: expiresIn ? Date.now() + expiresIn * 1000 : Number.POSITIVE_INFINITY });
        if (payload.grantId) {
          let members = byGrant.get(payload.grantId);
          if (!members) byGrant.set(payload.grantId, (members = new Set()));
          members.add({ model, id });
        }
        if (payload.uid && model === 'Session') byUid.set(payload.uid, id);
        if (payload.userCode) byUserCode.set(payload.userCode, id);
      },
      find,
      async findByUid(uid) {
        const id = byUid.get(uid);
        return id === undefined ? undefined : find(id);
      },
      async findByUserCode(userCode) {
        const id = byUserCode.get(userCode);
        return id === undefined ? undefined : find(id);
      },
      async consume(id) {
        const entry = entries.get(id);
        if (entry) entry.payload.consumed = Math.floor(Date.now() / 1000);
      },
      async destroy(id) {
        if (model === 'Client') clients.delete(id);
        else entries.delete(id);
      },
      async revokeByGrantId(grantId) {
        for (const { model: m, id } of byGrant.get(grantId) ?? []) table(m).delete(id);
        byGrant.delete(grantId);
      },
    };
  };
  return { factory, clients };
}

/** A 2048-bit RSA signing key per provider, so an ID token of one upstream never verifies against another's keys. */
function signingJwk() {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  return { ...privateKey.export({ format: 'jwk' }), kid: randomUUID(), use: 'sig', alg: 'RS256' };
}

export async function startUpstreamOidc(options: UpstreamOidcOptions = {}): Promise<UpstreamOidc> {
  const { default: Provider } = await importProvider();
  const accounts = new Map<string, UpstreamAccount>(Object.entries(options.accounts ?? {}));
  const defaultAmr = options.amr ?? ['pwd', 'mfa'];
  const { factory, clients } = memoryAdapterFactory();

  // The issuer names the port, so the server listens first and gets its handler afterwards.
  let handler: (req: IncomingMessage, res: ServerResponse) => void = (_req, res) => res.writeHead(503).end();
  const server = createServer((req, res) => handler(req, res));
  const sockets = new Set<Socket>();
  server.on('connection', (socket) => {
    sockets.add(socket);
    socket.once('close', () => sockets.delete(socket));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const prefix = options.tenant === undefined ? '' : `/${options.tenant}/v2.0`;
  const issuer = `${origin}${prefix}`;

  const configuration: Configuration = {
    adapter: factory,
    jwks: { keys: [signingJwk()] },
    cookies: { keys: [randomBytes(32).toString('base64url')] },
    // The ID token carries only claims of a requested scope (or of the `claims` parameter):
    // amr, set by the sign-in, is made part of `openid` so that it is always there. The null
    // entries are oidc-provider's defaults, which a `claims` setting replaces.
    claims: {
      acr: null,
      auth_time: null,
      iss: null,
      sid: null,
      // As Microsoft's v2.0 ID tokens: the tenant, and the address (with the email scope) in the ID token itself.
      openid: ['sub', 'amr', ...(options.tenant === undefined ? [] : ['tid', 'xms_edov', 'email'])],
      email: ['email', 'email_verified'],
      profile: ['name'],
    },
    pkce: { required: () => true },
    features: {
      devInteractions: { enabled: false },
      // A client registered with userinfo_signed_response_alg gets UserInfo as a signed JWT (OIDC Core §5.3.2).
      jwtUserinfo: { enabled: true },
    },
    // Explicit lifetimes and hooks: the defaults print a notice asking for them.
    ttl: { AccessToken: 3600, AuthorizationCode: 60, IdToken: 3600, Interaction: 3600, Session: 3600, Grant: 3600, RefreshToken: 86400 },
    clientBasedCORS: () => false,
    findAccount: (ctx, sub) => {
      const account = [...accounts.values()].find((a) => a.sub === sub);
      if (!account) return undefined;
      const { userinfo_sub: userinfoSub, ...claims } = account;
      // oidc-provider answers UserInfo with the found account's accountId as `sub`.
      const accountId = ctx.oidc.route === 'userinfo' && userinfoSub !== undefined ? userinfoSub : sub;
      return { accountId, claims: () => ({ ...claims }) };
    },
    renderError: (ctx, out) => {
      ctx.type = 'html';
      ctx.body = `<!doctype html><title>Upstream error</title><h1>${escapeHtml(String(out.error))}</h1><p>${escapeHtml(String(out.error_description ?? ''))}</p>`;
    },
  };
  const provider = new Provider(issuer, configuration);
  const { userinfoEndpoint } = options;
  if (userinfoEndpoint !== undefined) {
    // oidc-provider's `discovery` setting only adds members it does not write itself; this
    // middleware, which runs around its routes, rewrites the document instead.
    provider.use(async (ctx, next) => {
      await next();
      if (ctx.path !== '/.well-known/openid-configuration' || ctx.status !== 200) return;
      const { userinfo_endpoint: _own, userinfo_signing_alg_values_supported: _algs, ...metadata } = ctx.body as Record<string, unknown>;
      ctx.body = userinfoEndpoint === null ? metadata : { ...metadata, userinfo_endpoint: userinfoEndpoint };
    });
  }

  if (options.tenant !== undefined && options.issInResponse !== true) {
    // As Microsoft: no iss in the authorization response, and discovery does not promise one.
    provider.use(async (ctx, next) => {
      await next();
      const location = ctx.response.get('location');
      if (location !== '' && ctx.status >= 300 && ctx.status < 400 && URL.canParse(location)) {
        const url = new URL(location);
        if (url.searchParams.has('iss')) {
          url.searchParams.delete('iss');
          ctx.set('location', url.href);
        }
      }
      if (ctx.path === '/.well-known/openid-configuration' && ctx.status === 200) {
        const { authorization_response_iss_parameter_supported: _iss, ...metadata } = ctx.body as Record<string, unknown>;
        ctx.body = metadata;
      }
    });
  }

  const registerClient = (client: UpstreamClient): void => {
    clients.set(client.client_id, { token_endpoint_auth_method: 'client_secret_post', ...client });
  };
  for (const client of options.clients ?? []) registerClient(client);

  /**
   * What the provider learns when the user signs in as `account`: who (login) and, in the same
   * result, the grant of everything the client asked for (consent), so no second prompt follows.
   */
  async function grantAll(req: IncomingMessage, res: ServerResponse, accountId: string, amr: string[] | undefined): Promise<InteractionResults> {
    const details = await provider.interactionDetails(req, res);
    const existing = details.prompt.name !== 'login' && details.grantId ? await provider.Grant.find(details.grantId) : undefined;
    const grant = existing ?? new provider.Grant({ accountId, clientId: String(details.params.client_id) });
    if (typeof details.params.scope === 'string') grant.addOIDCScope(details.params.scope);
    const promptDetails = details.prompt.details as { missingOIDCClaims?: string[]; missingResourceScopes?: Record<string, string[]> };
    if (promptDetails.missingOIDCClaims) grant.addOIDCClaims(promptDetails.missingOIDCClaims);
    for (const [resource, scopes] of Object.entries(promptDetails.missingResourceScopes ?? {})) grant.addResourceScope(resource, scopes);
    const grantId = await grant.save();
    return {
      ...(details.prompt.name === 'login' ? { login: { accountId, amr: amr ?? defaultAmr } } : {}),
      consent: { grantId },
    };
  }

  /** GET shows the sign-in form (or finishes a consent-only prompt); POST signs in. */
  async function interaction(req: IncomingMessage, res: ServerResponse, uid: string): Promise<void> {
    const details = await provider.interactionDetails(req, res);
    if (req.method === 'GET') {
      if (details.prompt.name === 'login') {
        res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' }).end(signInPage(uid));
        return;
      }
      // Consent for an already signed-in user: granted without a page (see the module comment).
      const accountId = details.session?.accountId;
      if (!accountId) throw new Error(`interaction prompt ${details.prompt.name} without a session`);
      await provider.interactionFinished(req, res, await grantAll(req, res, accountId, undefined), { mergeWithLastSubmission: true });
      return;
    }
    if (req.method !== 'POST') {
      res.writeHead(405).end();
      return;
    }
    const form = await readForm(req);
    if (form.has('deny')) {
      await provider.interactionFinished(req, res, { error: 'access_denied', error_description: 'End-User aborted interaction' }, { mergeWithLastSubmission: false });
      return;
    }
    const login = form.get('login') ?? '';
    const account = accounts.get(login);
    const accountId = details.prompt.name === 'login' ? account?.sub : details.session?.accountId;
    if (!accountId) {
      res.writeHead(401, { 'content-type': 'text/html; charset=utf-8' }).end(signInPage(uid, `Unknown login ${login}`));
      return;
    }
    const amr = form.getAll('amr');
    await provider.interactionFinished(req, res, await grantAll(req, res, accountId, amr.length ? amr : undefined), { mergeWithLastSubmission: false });
  }

  const callback = provider.callback();
  /** Microsoft's multi-tenant discovery: the tenant's document with the {tenantid} issuer template. */
  async function multiTenantDiscovery(res: ServerResponse): Promise<void> {
    const own = (await (await fetch(`${issuer}/.well-known/openid-configuration`)).json()) as Record<string, unknown>;
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ ...own, issuer: `${origin}/{tenantid}/v2.0` }));
  }
  handler = (req, res) => {
    if (prefix !== '') {
      if (/^\/(common|organizations)\/v2\.0\/\.well-known\/openid-configuration$/.test(req.url ?? '')) {
        multiTenantDiscovery(res).catch(() => res.writeHead(500).end());
        return;
      }
      // oidc-provider mounted at the issuer's path: it routes what follows it.
      if (req.url?.startsWith(`${prefix}/`)) req.url = req.url.slice(prefix.length);
    }
    const match = /^\/interaction\/([^/?]+)(?:\?.*)?$/.exec(req.url ?? '');
    if (!match?.[1]) {
      void callback(req, res);
      return;
    }
    interaction(req, res, decodeURIComponent(match[1])).catch((err: Error) => {
      if (!res.headersSent) res.writeHead(400, { 'content-type': 'text/plain; charset=utf-8' });
      res.end(`interaction failed: ${err.message}`);
    });
  };

  /**
   * The fetch-driven browser: follows redirects within the provider, posting `form` to the
   * sign-in page when it shows up, and stops at the first redirect that leaves the provider.
   */
  async function drive(authorizeUrl: string | URL, form: URLSearchParams, jar: CookieJar): Promise<string> {
    let url = new URL(authorizeUrl);
    let method: 'GET' | 'POST' = 'GET';
    let body: URLSearchParams | undefined;
    for (let hop = 0; hop < 20; hop++) {
      const cookie = jar.header(url);
      const response = await fetch(url, {
        method,
        redirect: 'manual',
        headers: { ...(cookie ? { cookie } : {}), ...(body ? { 'content-type': 'application/x-www-form-urlencoded' } : {}) },
        ...(body ? { body } : {}),
      });
      jar.store(response);
      const location = response.headers.get('location');
      if (response.status >= 300 && response.status < 400 && location) {
        await response.body?.cancel();
        const next = new URL(location, url);
        if (next.origin !== origin) return next.href;
        url = next;
        method = 'GET';
        body = undefined;
        continue;
      }
      const text = await response.text();
      if (response.status === 200 && method === 'GET' && url.pathname.startsWith('/interaction/')) {
        method = 'POST';
        body = form;
        continue;
      }
      throw new Error(`upstream sign-in stopped at ${method} ${url.pathname}: ${response.status} ${text.replace(/<[^>]*>/g, ' ').replace(/\s+/g, ' ').trim()}`);
    }
    throw new Error('upstream sign-in: too many redirects');
  }

  return {
    issuer,
    origin,
    provider,
    registerClient,
    setAccount: (login, claims) => void accounts.set(login, { ...claims }),
    signIn: (authorizeUrl, login, signInOptions = {}) => {
      const form = new URLSearchParams({ login });
      for (const method of signInOptions.amr ?? []) form.append('amr', method);
      return drive(authorizeUrl, form, signInOptions.jar ?? new CookieJar());
    },
    denySignIn: (authorizeUrl) => drive(authorizeUrl, new URLSearchParams({ deny: '1' }), new CookieJar()),
    close: async () => {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const socket of sockets) socket.destroy();
      await closed;
    },
  };
}
