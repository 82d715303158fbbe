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

/** Discovery results are kept this long per connection: a provider's keys rotate, its endpoints rarely. */
const DISCOVERY_TTL_MS = 10 * 60 * 1000;
const DISCOVERY_CACHE_MAX = 1000;
/** openid-client's code for a JSON member that is not the value expected (here: UserInfo's sub). */
const JSON_ATTRIBUTE_COMPARISON = 'OAUTH_JSON_ATTRIBUTE_COMPARISON_FAILED';

export interface UpstreamOidcSettings {
  issuer: string;
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
  private readonly cache = new Map<number, { key: string; at: number; configuration: Promise<client.Configuration> }>();

  constructor(private readonly settings: UpstreamOidcSettings) {}

  /** The provider's configuration (discovery), cached per connection and dropped when the connection changes. */
  private configuration(row: ConnectionRow): Promise<client.Configuration> {
    const key = `${row.oidc_issuer}|${row.oidc_client_id}|${row.updated_at.getTime()}`;
    const cached = this.cache.get(row.id);
    if (cached && cached.key === key && Date.now() - cached.at < DISCOVERY_TTL_MS) return cached.configuration;
    const secret = openText(this.settings.secretKey, CLIENT_SECRET_PURPOSE, row.oidc_client_secret_sealed ?? '');
    const issuer = new URL(row.oidc_issuer ?? '');
    const insecure = this.settings.allowHttp && issuer.protocol === 'http:';
    const configuration = client.discovery(issuer, row.oidc_client_id ?? '', secret, undefined, {
      [client.customFetch]: this.settings.fetch,
      ...(insecure ? { execute: [client.allowInsecureRequests] } : {}),
      timeout: 5,
    });
    // A failed discovery is not kept: the next sign-in tries again.
    configuration.catch(() => {
      if (this.cache.get(row.id)?.configuration === configuration) this.cache.delete(row.id);
    });
    if (this.cache.size >= DISCOVERY_CACHE_MAX) this.cache.delete(this.cache.keys().next().value!);
    this.cache.set(row.id, { key, at: Date.now(), configuration });
    return configuration;
  }

  /** New checks for one sign-in (PKCE verifier, state, nonce). */
  static newChecks(): OidcChecks {
    return { state: client.randomState(), nonce: client.randomNonce(), codeVerifier: client.randomPKCECodeVerifier() };
  }

  /** Where to send the browser: the provider's authorization endpoint with this sign-in's checks. */
  async authorizationUrl(row: ConnectionRow, checks: OidcChecks, options: { loginHint?: string | undefined; again?: boolean } = {}): Promise<URL> {
    const configuration = await this.wrap('discovery', () => this.configuration(row));
    const parameters: Record<string, string> = {
      redirect_uri: connectionUrls(this.settings.issuer, row.id).redirect_uri,
      scope: row.oidc_scopes ?? DEFAULT_OIDC_SCOPES,
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
  async finish(row: ConnectionRow, callbackUrl: URL, checks: OidcChecks): Promise<UpstreamIdentity> {
    const configuration = await this.wrap('discovery', () => this.configuration(row));
    const tokens = await this.wrap('token exchange', () =>
      client.authorizationCodeGrant(configuration, callbackUrl, { pkceCodeVerifier: checks.codeVerifier, expectedState: checks.state, expectedNonce: checks.nonce, idTokenExpected: true }),
    );
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
    return {
      connectionId: row.id,
      issuer: claims.iss,
      subjectFormat: '',
      subject: claims.sub,
      email: text(emailSource.email),
      emailVerified: emailSource.email_verified === true,
      name: text(claims.name) ?? text(userinfo?.name),
      amr: Array.isArray(claims.amr) ? claims.amr.filter((v): v is string => typeof v === 'string') : [],
    };
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
