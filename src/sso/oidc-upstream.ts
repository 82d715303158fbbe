/**
 * orgauth as the relying party of an organization's OpenID provider, through openid-client (a
 * certified relying party): authorization code flow with PKCE (S256), state and nonce, the ID
 * token's iss, aud, exp, nonce and alg checked, RFC 9207's iss checked when the provider sends
 * it. openid-client does not verify the signature of an ID token it took from the token endpoint
 * itself: that response came straight from the provider over TLS (OIDC Core §3.1.3.7 step 6).
 * The person's claims the ID token leaves out are read from the UserInfo endpoint (OIDC Core
 * §5.4 allows a provider to release them there only). Every request to the provider goes
 * through the guarded outbound client (AG-1): the issuer is a URL an organization's admin typed,
 * and the endpoints are whatever its discovery document says.
 */
import * as client from 'openid-client';
import { type OutboundFetch, OutboundRefusedError } from '../lib/outbound.js';
import { openText } from '../lib/crypto.js';
import { CLIENT_SECRET_PURPOSE, type ConnectionRow, connectionUrls, DEFAULT_OIDC_SCOPES } from './connections.js';
import type { UpstreamIdentity } from './identities.js';

/**
 * orgauth as one relying party at one provider: an organization's SSO connection (ssoRelyingParty)
 * or a social connection (src/social/providers.ts).
 */
export interface OidcRelyingParty {
  /** The connection's id, in the identity it yields; with `kind`, the discovery cache's key. */
  connectionId: number;
  kind: 'sso' | 'social';
  /** Where the provider is discovered. */
  discoveryUrl: string;
  clientId: string;
  /** The client secret, sealed (lib/crypto.ts) under `secretPurpose`. */
  clientSecretSealed: string;
  secretPurpose: string;
  scopes: string;
  redirectUri: string;
  /** When the connection last changed: a change drops what discovery found. */
  updatedAt: Date;
  /**
   * A multi-tenant Microsoft endpoint (common, organizations): its discovery document's issuer is
   * the template `https://login.microsoftonline.com/{tenantid}/v2.0`, and each ID token's iss is
   * that template with the token's own `tid`. Checked here as openid-client does for
   * login.microsoftonline.com itself (which it recognises by origin only).
   */
  tenantTemplate?: boolean;
}

/** An SSO connection's relying party. */
export function ssoRelyingParty(issuer: string, row: ConnectionRow): OidcRelyingParty {
  return {
    connectionId: row.id,
    kind: 'sso',
    discoveryUrl: row.oidc_issuer ?? '',
    clientId: row.oidc_client_id ?? '',
    clientSecretSealed: row.oidc_client_secret_sealed ?? '',
    secretPurpose: CLIENT_SECRET_PURPOSE,
    scopes: row.oidc_scopes ?? DEFAULT_OIDC_SCOPES,
    redirectUri: connectionUrls(issuer, row.id).redirect_uri,
    updatedAt: row.updated_at,
  };
}

/** What the provider said besides the identity: the ID token's claims (Microsoft's tid and xms_edov are read from them). */
export interface UpstreamResult {
  identity: UpstreamIdentity;
  claims: client.IDToken;
}

/** The tenant placeholder of Microsoft's multi-tenant discovery documents. */
const TENANT_PLACEHOLDER = '{tenantid}';
/** What a tid may be before it goes into an issuer: a GUID. */
const TENANT_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** Discovery results are kept this long per connection: a provider's keys rotate, its endpoints rarely. */
const DISCOVERY_TTL_MS = 10 * 60 * 1000;
const DISCOVERY_CACHE_MAX = 1000;
/** openid-client's code for a JSON member that is not the value expected (here: UserInfo's sub). */
const JSON_ATTRIBUTE_COMPARISON = 'OAUTH_JSON_ATTRIBUTE_COMPARISON_FAILED';

export interface UpstreamOidcSettings {
  secretKey: string;
  allowHttp: boolean;
  fetch: OutboundFetch;
}

/** The PKCE verifier, state and nonce of one sign-in, kept server-side until the callback. */
export interface OidcChecks {
  state: string;
  nonce: string;
  codeVerifier: string;
}

/** The upstream could not be used (discovery, token exchange, a check failed): the reason is for the log. */
export class UpstreamOidcError extends Error {
  override readonly name = 'UpstreamOidcError';
  constructor(
    message: string,
    /** The reason as the organization's audit log shows it: without what the outbound policy saw. */
    readonly auditReason: string = message,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

export class UpstreamOidc {
  private readonly cache = new Map<string, { key: string; at: number; configuration: Promise<client.Configuration> }>();

  constructor(private readonly settings: UpstreamOidcSettings) {}

  /** The provider's configuration (discovery), cached per connection and dropped when the connection changes. */
  private configuration(rp: OidcRelyingParty): Promise<client.Configuration> {
    const key = `${rp.discoveryUrl}|${rp.clientId}|${rp.updatedAt.getTime()}`;
    const id = `${rp.kind}:${rp.connectionId}`;
    const cached = this.cache.get(id);
    if (cached && cached.key === key && Date.now() - cached.at < DISCOVERY_TTL_MS) return cached.configuration;
    const configuration = rp.tenantTemplate ? this.tenantDiscovery(rp) : client.discovery(new URL(rp.discoveryUrl), rp.clientId, this.secret(rp), undefined, this.options(rp));
    // A failed discovery is not kept: the next sign-in tries again.
    configuration.catch(() => {
      if (this.cache.get(id)?.configuration === configuration) this.cache.delete(id);
    });
    if (this.cache.size >= DISCOVERY_CACHE_MAX) this.cache.delete(this.cache.keys().next().value!);
    this.cache.set(id, { key, at: Date.now(), configuration });
    return configuration;
  }

  private secret(rp: OidcRelyingParty): string {
    return openText(this.settings.secretKey, rp.secretPurpose, rp.clientSecretSealed);
  }

  /** Plain http to this provider: only where the configuration allows it (development, tests). */
  private insecure(rp: OidcRelyingParty): boolean {
    return this.settings.allowHttp && new URL(rp.discoveryUrl).protocol === 'http:';
  }

  /** Discovery's options: the guarded outbound client, a 5 s deadline, plain http where allowed. */
  private options(rp: OidcRelyingParty) {
    return { [client.customFetch]: this.settings.fetch, ...(this.insecure(rp) ? { execute: [client.allowInsecureRequests] } : {}), timeout: 5 };
  }

  /** A configuration made here (not by discovery), set up as options() sets up discovery's, with `fetch`. */
  private configured(metadata: client.ServerMetadata, rp: OidcRelyingParty, fetch: OutboundFetch): client.Configuration {
    const configuration = new client.Configuration(metadata, rp.clientId, this.secret(rp));
    configuration[client.customFetch] = fetch;
    configuration.timeout = 5;
    if (this.insecure(rp)) client.allowInsecureRequests(configuration);
    return configuration;
  }

  /**
   * A multi-tenant Microsoft endpoint's configuration: its discovery document (fetched through the
   * outbound client), whose issuer must be the tenant template at the same origin.
   */
  private async tenantDiscovery(rp: OidcRelyingParty): Promise<client.Configuration> {
    const url = `${rp.discoveryUrl}/.well-known/openid-configuration`;
    const response = await this.settings.fetch(url, { headers: { accept: 'application/json' }, signal: AbortSignal.timeout(5000) });
    if (response.status !== 200) throw new UpstreamOidcError(`discovery failed: ${url} answered ${response.status}`);
    const metadata = (await response.json()) as client.ServerMetadata;
    const expected = new URL(rp.discoveryUrl);
    if (typeof metadata.issuer !== 'string' || !metadata.issuer.includes(TENANT_PLACEHOLDER) || !URL.canParse(metadata.issuer) || new URL(metadata.issuer).origin !== expected.origin) {
      throw new UpstreamOidcError('discovery failed: a multi-tenant endpoint\'s issuer must be the {tenantid} template at its own origin');
    }
    return this.configured(metadata, rp, this.settings.fetch);
  }

  /** The S256 challenge of a PKCE verifier (RFC 7636). */
  static codeChallenge(verifier: string): Promise<string> {
    return client.calculatePKCECodeChallenge(verifier);
  }

  /** New checks for one sign-in (PKCE verifier, state, nonce). */
  static newChecks(): OidcChecks {
    return { state: client.randomState(), nonce: client.randomNonce(), codeVerifier: client.randomPKCECodeVerifier() };
  }

  /** Where to send the browser: the provider's authorization endpoint with this sign-in's checks. */
  async authorizationUrl(rp: OidcRelyingParty, checks: OidcChecks, options: { loginHint?: string | undefined; again?: boolean } = {}): Promise<URL> {
    const configuration = await this.wrap('discovery', () => this.configuration(rp));
    const parameters: Record<string, string> = {
      redirect_uri: rp.redirectUri,
      scope: rp.scopes,
      response_type: 'code',
      code_challenge: await client.calculatePKCECodeChallenge(checks.codeVerifier),
      code_challenge_method: 'S256',
      state: checks.state,
      nonce: checks.nonce,
    };
    if (options.loginHint !== undefined) parameters.login_hint = options.loginHint;
    // OIDC Core §3.1.2.1: a fresh authentication, not the provider's existing session.
    if (options.again) Object.assign(parameters, { prompt: 'login', max_age: '0' });
    return client.buildAuthorizationUrl(configuration, parameters);
  }

  /**
   * The callback: exchanges the code (PKCE) and checks the ID token (signature, iss, aud, exp,
   * nonce) and the response (state, RFC 9207 iss). Any failure is an UpstreamOidcError.
   */
  async finish(rp: OidcRelyingParty, callbackUrl: URL, checks: OidcChecks): Promise<UpstreamIdentity> {
    return (await this.finishWithClaims(rp, callbackUrl, checks)).identity;
  }

  /** finish, with the ID token's claims. */
  async finishWithClaims(rp: OidcRelyingParty, callbackUrl: URL, checks: OidcChecks): Promise<UpstreamResult> {
    const configuration = await this.wrap('discovery', () => this.configuration(rp));
    const grant = (c: client.Configuration) =>
      client.authorizationCodeGrant(c, callbackUrl, { pkceCodeVerifier: checks.codeVerifier, expectedState: checks.state, expectedNonce: checks.nonce, idTokenExpected: true });
    const tokens = await this.wrap('token exchange', () => (rp.tenantTemplate ? this.tenantGrant(rp, callbackUrl, configuration, grant) : grant(configuration)));
    const claims = tokens.claims();
    if (!claims) throw new UpstreamOidcError('the provider returned no ID token');
    // What the identity link stores (src/sso/identities.ts): bounded, as the columns are.
    if (claims.sub.length > 1024 || claims.iss.length > 2048) throw new UpstreamOidcError('the ID token\'s sub or iss is too long');
    const userinfo = await this.userinfo(configuration, tokens.access_token, claims);
    // email and email_verified are read together from one place, so that one source's
    // email_verified never vouches for the other's address: the ID token when it says both,
    // else UserInfo when it has an address. The subject and amr are the ID token's alone:
    // who signed in and how is what the ID token is for (OIDC Core §2).
    const complete = (c: client.IDToken | client.UserInfoResponse) => text(c.email) !== undefined && typeof c.email_verified === 'boolean';
    const emailSource = complete(claims) || userinfo === undefined || text(userinfo.email) === undefined ? claims : userinfo;
    const identity: UpstreamIdentity = {
      connectionId: rp.connectionId,
      issuer: claims.iss,
      subjectFormat: '',
      subject: claims.sub,
      email: text(emailSource.email),
      emailVerified: emailSource.email_verified === true,
      name: text(claims.name) ?? text(userinfo?.name),
      amr: Array.isArray(claims.amr) ? claims.amr.filter((v): v is string => typeof v === 'string') : [],
    };
    return { identity, claims };
  }

  /**
   * The code grant at a multi-tenant endpoint, whose ID tokens' iss is the template with their own
   * tid. When the authorization response names its issuer (RFC 9207; Microsoft's does not), that
   * names the tenant, and the ID token's iss and tid must agree with it. Otherwise the token
   * response is read once from the provider, its ID token's tid (a GUID) picked out, and the
   * response is then checked in full by openid-client (iss, aud, exp, nonce, state, PKCE) against
   * a configuration whose issuer is the template with that tid, replayed, without asking the
   * provider again. The provider's word on iss and tid is checked the same way as the rest of the
   * ID token taken straight from it (OIDC Core §3.1.3.7 step 6).
   */
  private async tenantGrant(
    rp: OidcRelyingParty,
    callbackUrl: URL,
    template: client.Configuration,
    grant: (c: client.Configuration) => Promise<client.TokenEndpointResponse & client.TokenEndpointResponseHelpers>,
  ) {
    const metadata = template.serverMetadata() as client.ServerMetadata;
    const forTenant = (tid: string) => ({ ...metadata, issuer: metadata.issuer.replace(TENANT_PLACEHOLDER, tid) }) as client.ServerMetadata;
    // A provider that names itself in the response (RFC 9207) names the tenant: one pass, its
    // issuer checked there and in the ID token, and the ID token's tid must be that tenant.
    const named = callbackUrl.searchParams.get('iss');
    if (named !== null) {
      const tid = tenantIn(metadata.issuer, named);
      if (tid === undefined) throw new UpstreamOidcError('the response\'s iss is not the issuer template with a tenant id');
      const tokens = await grant(this.configured(forTenant(tid), rp, this.settings.fetch));
      if (tokens.claims()?.tid !== tid) throw new UpstreamOidcError('the ID token\'s tid is not the tenant its issuer names');
      return tokens;
    }
    if (metadata.token_endpoint === undefined || !URL.canParse(metadata.token_endpoint)) throw new UpstreamOidcError('discovery failed: no token endpoint');
    const tokenEndpoint = new URL(metadata.token_endpoint).href;
    const isTokenEndpoint = (url: string | URL) => URL.canParse(String(url)) && new URL(String(url)).href === tokenEndpoint;
    let captured: { status: number; headers: Headers; body: string } | undefined;
    // The code grant makes one request, to the token endpoint: it is made once, here.
    const capture: OutboundFetch = async (url, init) => {
      if (!isTokenEndpoint(url) || captured !== undefined) throw new UpstreamOidcError('the code grant asked for something other than the token endpoint, once');
      const response = await this.settings.fetch(url, init);
      captured = { status: response.status, headers: response.headers, body: await response.text() };
      // Stop here: the configuration's issuer is the template, which no ID token matches.
      return new Response(JSON.stringify({ error: 'orgauth_tenant_pending' }), { status: 400, headers: { 'content-type': 'application/json' } });
    };
    try {
      await grant(this.configured(metadata, rp, capture));
    } catch (err) {
      if (captured === undefined) throw err;
    }
    if (captured === undefined) throw new UpstreamOidcError('the provider\'s token endpoint was not reached');
    const tid = tenantOf(captured.body);
    if (tid === undefined) throw new UpstreamOidcError('the ID token has no tid that is a tenant id');
    let answer: typeof captured | undefined = captured;
    // The answer, given back once; the code is never sent to the provider a second time.
    const replay: OutboundFetch = async (url) => {
      if (!isTokenEndpoint(url) || answer === undefined) throw new UpstreamOidcError('the code grant asked for something other than the token endpoint, once');
      const { status, headers, body } = answer;
      answer = undefined;
      return new Response(body, { status, headers });
    };
    return grant(this.configured(forTenant(tid), rp, replay));
  }

  /**
   * The UserInfo claims (OIDC Core §5.3) when the ID token lacks one orgauth reads: with the code
   * flow a provider may release the `email` and `profile` scopes' claims at UserInfo only (§5.4;
   * node-oidc-provider does by default). Undefined when the ID token has them all, or the
   * provider advertises no UserInfo endpoint (a missing email is then refused as before).
   *
   * openid-client requests it through this configuration's customFetch, the guarded outbound
   * client, and checks that its `sub` is the ID token's (§5.3.4: otherwise the claims may be
   * another person's, e.g. a substituted access token); a mismatch refuses the sign-in. A signed
   * answer (application/jwt, §5.3.2) is accepted when its alg is one the discovery document
   * lists in userinfo_signing_alg_values_supported, with its iss and aud checked when present;
   * like the ID token's, its signature is not what vouches for it: both come straight from the
   * provider over the connection the outbound client checked (OIDC Core §3.1.3.7 step 6).
   * Any failure (HTTP error, refused address, bad answer) refuses the sign-in.
   */
  private async userinfo(configuration: client.Configuration, accessToken: string, idToken: client.IDToken): Promise<client.UserInfoResponse | undefined> {
    if (text(idToken.email) !== undefined && typeof idToken.email_verified === 'boolean' && text(idToken.name) !== undefined) return undefined;
    if (configuration.serverMetadata().userinfo_endpoint === undefined) return undefined;
    try {
      return await client.fetchUserInfo(configuration, accessToken, idToken.sub);
    } catch (err) {
      const { code, cause } = err as { code?: unknown; cause?: { cause?: { attribute?: unknown } } };
      if (err instanceof client.ClientError && code === JSON_ATTRIBUTE_COMPARISON && cause?.cause?.attribute === 'sub') {
        throw new UpstreamOidcError('userinfo refused: its sub is not the ID token\'s (OIDC Core §5.3.4), so its claims may be another person\'s', undefined, { cause: err });
      }
      throw stepFailed('userinfo', err);
    }
  }

  private async wrap<T>(step: string, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      throw stepFailed(step, err);
    }
  }
}

/** The UpstreamOidcError of a step that failed with `err`: the log's reason and the audit's. */
function stepFailed(step: string, err: unknown): UpstreamOidcError {
  return new UpstreamOidcError(`${step} failed: ${describeError(err, false)}`, `${step} failed: ${describeError(err, true)}`, { cause: err });
}

/** A claim's value when it is a non-empty string. */
function text(value: unknown): string | undefined {
  return typeof value === 'string' && value !== '' ? value : undefined;
}

/**
 * An error and the errors that caused it, on one line (the log, the audit event's reason):
 * openid-client's own messages are generic ("invalid response encountered", "something went
 * wrong"); what failed is in the cause (the iss or nonce check, the outbound client's refusal)
 * or in the OAuth error code. A cause that is not an Error (the callback's parameters, the
 * token response) is left out: it may hold the state or a code.
 */
function describeError(err: unknown, forAudit: boolean): string {
  if (!(err instanceof Error)) return String(err);
  const parts: string[] = [];
  for (let current: unknown = err; current instanceof Error && parts.length < 4; current = current.cause) {
    // The organization's admins read the audit log: which internal address a name resolves to
    // is not theirs to learn (a DNS oracle into orgauth's network). The log keeps it.
    if (forAudit && current instanceof OutboundRefusedError) {
      parts.push('OutboundRefusedError: the provider’s address is not one orgauth may reach (private or special-use, plain http, or too slow or large)');
      break;
    }
    const { error, error_description: description } = current as Error & { error?: unknown; error_description?: unknown };
    const code = typeof error === 'string' ? ` (${error}${typeof description === 'string' ? `: ${description}` : ''})` : '';
    parts.push(`${current.name}: ${current.message}${code}`);
  }
  return parts.join(' <- ');
}

/** The tid of the ID token in a token response's body, when it is a GUID (the signature is openid-client's to check after). */
function tenantOf(body: string): string | undefined {
  try {
    const { id_token: idToken } = JSON.parse(body) as { id_token?: unknown };
    if (typeof idToken !== 'string') return undefined;
    const payload = JSON.parse(Buffer.from(idToken.split('.')[1] ?? '', 'base64url').toString('utf8')) as { tid?: unknown };
    return typeof payload.tid === 'string' && TENANT_ID.test(payload.tid) ? payload.tid : undefined;
  } catch {
    return undefined;
  }
}

/** The tenant id an issuer names, when it is `template` with a GUID in place of {tenantid}. */
function tenantIn(template: string, issuer: string): string | undefined {
  const at = template.indexOf(TENANT_PLACEHOLDER);
  const before = template.slice(0, at);
  const after = template.slice(at + TENANT_PLACEHOLDER.length);
  if (!issuer.startsWith(before) || !issuer.endsWith(after) || issuer.length <= before.length + after.length) return undefined;
  const tid = issuer.slice(before.length, issuer.length - after.length);
  return TENANT_ID.test(tid) ? tid : undefined;
}
