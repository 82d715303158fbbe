/**
 * orgauth as the relying party of an organization's OpenID provider, through openid-client (a
 * certified relying party): authorization code flow with PKCE (S256), state and nonce, the ID
 * token's signature, iss, aud, exp and nonce checked, RFC 9207's iss checked when the provider
 * sends it. Every request to the provider goes through the guarded outbound client (AG-1): the
 * issuer is a URL an organization's admin typed.
 */
import * as client from 'openid-client';
import { type OutboundFetch, OutboundRefusedError } from '../lib/outbound.js';
import { openText } from '../lib/crypto.js';
import { CLIENT_SECRET_PURPOSE, type ConnectionRow, connectionUrls, DEFAULT_OIDC_SCOPES } from './connections.js';
import type { UpstreamIdentity } from './identities.js';

/** Discovery results are kept this long per connection: a provider's keys rotate, its endpoints rarely. */
const DISCOVERY_TTL_MS = 10 * 60 * 1000;
const DISCOVERY_CACHE_MAX = 1000;

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
    const text = (v: unknown) => (typeof v === 'string' && v !== '' ? v : undefined);
    return {
      connectionId: row.id,
      issuer: claims.iss,
      subjectFormat: '',
      subject: claims.sub,
      email: text(claims.email),
      emailVerified: claims.email_verified === true,
      name: text(claims.name),
      amr: Array.isArray(claims.amr) ? claims.amr.filter((v): v is string => typeof v === 'string') : [],
    };
  }

  private async wrap<T>(step: string, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      throw new UpstreamOidcError(`${step} failed: ${describeError(err, false)}`, `${step} failed: ${describeError(err, true)}`, { cause: err });
    }
  }
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
