/**
 * What each social provider says about the person who signed in there, after every protocol
 * check passed. Every request goes through the guarded outbound client (AG-1).
 *
 * - Google and any OpenID provider: openid-client (sso/oidc-upstream.ts), authorization code with
 *   PKCE, state and nonce; claims from the ID token or UserInfo.
 * - Microsoft: the same at `issuer`/`tenant`/v2.0, the address from the ID token only. For a multi-tenant endpoint (common,
 *   organizations) each ID token's iss is checked against the discovery document's {tenantid}
 *   template filled with the token's own tid; `organizations` refuses personal accounts,
 *   `consumers` and a tenant id accept only theirs. Microsoft sends no email_verified: an address
 *   counts as verified when the token says xms_edov (the domain's owner verified it) or the
 *   account is a personal one (Microsoft verified it); otherwise it is never used to match or to
 *   make an account (the nOAuth class of takeovers).
 * - GitHub: its OAuth web flow (state, PKCE) and REST API: `/user` for the numeric id (the
 *   subject: logins can be renamed) and `/user/emails` for the primary verified address.
 */
import type { OutboundFetch } from '../lib/outbound.js';
import { openText } from '../lib/crypto.js';
import { type OidcChecks, type OidcRelyingParty, UpstreamOidc, UpstreamOidcError } from '../sso/oidc-upstream.js';
import { MICROSOFT_CONSUMERS_TENANT, MICROSOFT_MULTI_TENANTS, SOCIAL_SECRET_PURPOSE, type SocialConnectionRow, socialRedirectUri } from './connections.js';

/** What a social provider said about the person. */
export interface SocialIdentity {
  connectionId: number;
  /** The provider's stable id of the person: OIDC sub, GitHub's numeric user id. */
  subject: string;
  email: string | undefined;
  /** Whether the provider vouches that the address is the person's. */
  emailVerified: boolean;
  name: string | undefined;
}

/** The largest body read from GitHub's API (a user and their addresses are a few kilobytes). */
const GITHUB_MAX_BODY = 256 * 1024;
const OIDC_SCOPES = 'openid email profile';
const GITHUB_SCOPES = 'read:user user:email';

export interface SocialProviderSettings {
  issuer: string;
  secretKey: string;
  allowHttp: boolean;
  fetch: OutboundFetch;
}

export class SocialProviders {
  private readonly oidc: UpstreamOidc;

  constructor(private readonly settings: SocialProviderSettings) {
    this.oidc = new UpstreamOidc({ secretKey: settings.secretKey, allowHttp: settings.allowHttp, fetch: settings.fetch });
  }

  private relyingParty(row: SocialConnectionRow): OidcRelyingParty {
    const tenant = row.tenant ?? 'common';
    return {
      connectionId: row.id,
      kind: 'social',
      discoveryUrl: row.provider === 'microsoft' ? `${row.issuer}/${tenant}/v2.0` : (row.issuer ?? ''),
      clientId: row.client_id,
      clientSecretSealed: row.client_secret_sealed,
      secretPurpose: SOCIAL_SECRET_PURPOSE,
      scopes: OIDC_SCOPES,
      redirectUri: socialRedirectUri(this.settings.issuer, row.id),
      updatedAt: row.updated_at,
      // consumers has one tenant: its discovery document names it.
      tenantTemplate: row.provider === 'microsoft' && MICROSOFT_MULTI_TENANTS.has(tenant) && tenant !== 'consumers',
    };
  }

  /** Where to send the browser. */
  async authorizationUrl(row: SocialConnectionRow, checks: OidcChecks): Promise<URL> {
    if (row.provider !== 'github') return this.oidc.authorizationUrl(this.relyingParty(row), checks);
    const url = new URL(`${row.base_url}/login/oauth/authorize`);
    url.search = new URLSearchParams({
      client_id: row.client_id,
      redirect_uri: socialRedirectUri(this.settings.issuer, row.id),
      scope: GITHUB_SCOPES,
      state: checks.state,
      code_challenge: await UpstreamOidc.codeChallenge(checks.codeVerifier),
      code_challenge_method: 'S256',
    }).toString();
    return url;
  }

  /** The callback: the person as the provider vouches for them; an UpstreamOidcError when any check fails. */
  async finish(row: SocialConnectionRow, callbackUrl: URL, checks: OidcChecks): Promise<SocialIdentity> {
    if (row.provider === 'github') return this.github(row, callbackUrl, checks);
    const { identity, claims } = await this.oidc.finishWithClaims(this.relyingParty(row), callbackUrl, checks);
    let { email, emailVerified } = identity;
    if (row.provider === 'microsoft') {
      const tid = typeof claims.tid === 'string' ? claims.tid : undefined;
      const tenant = row.tenant ?? 'common';
      if (tid === undefined) throw new UpstreamOidcError('the Microsoft ID token has no tid');
      if (tenant === 'organizations' && tid === MICROSOFT_CONSUMERS_TENANT) throw new UpstreamOidcError('a personal Microsoft account at a connection for work and school accounts');
      if (!MICROSOFT_MULTI_TENANTS.has(tenant) && tid !== tenant) throw new UpstreamOidcError('the ID token is of another tenant than the connection\'s');
      if (tenant === 'consumers' && tid !== MICROSOFT_CONSUMERS_TENANT) throw new UpstreamOidcError('a work or school account at a connection for personal accounts');
      // The address and what vouches for it from one place, the ID token (Microsoft sends no
      // email_verified, so UserInfo's address would otherwise be vouched for by the ID token's claims).
      email = typeof claims.email === 'string' && claims.email !== '' ? claims.email : undefined;
      emailVerified = email !== undefined && (claims.email_verified === true || claims.xms_edov === true || claims.xms_edov === 1 || tid === MICROSOFT_CONSUMERS_TENANT);
    }
    return { connectionId: row.id, subject: identity.subject, email, emailVerified, name: identity.name };
  }

  private async github(row: SocialConnectionRow, callbackUrl: URL, checks: OidcChecks): Promise<SocialIdentity> {
    const query = callbackUrl.searchParams;
    // The state was matched when the sign-in was taken (takeOidcSignIn); an error is the provider's refusal.
    if (query.get('state') !== checks.state) throw new UpstreamOidcError('the state is not this sign-in\'s');
    const error = query.get('error');
    if (error !== null) throw new UpstreamOidcError(`the provider refused: ${error.slice(0, 100)}`);
    const code = query.get('code');
    if (code === null || code === '' || code.length > 512) throw new UpstreamOidcError('the callback has no code');
    const token = await this.githubJson<{ access_token?: unknown; error?: unknown; error_description?: unknown }>(`${row.base_url}/login/oauth/access_token`, {
      method: 'POST',
      headers: { accept: 'application/json', 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({
        client_id: row.client_id,
        client_secret: openText(this.settings.secretKey, SOCIAL_SECRET_PURPOSE, row.client_secret_sealed),
        code,
        redirect_uri: socialRedirectUri(this.settings.issuer, row.id),
        code_verifier: checks.codeVerifier,
      }).toString(),
    });
    // GitHub answers its token errors with a 200 and an error member.
    if (typeof token.error === 'string') throw new UpstreamOidcError(`token exchange failed: ${token.error.slice(0, 100)}`);
    if (typeof token.access_token !== 'string' || token.access_token === '' || token.access_token.length > 1024) throw new UpstreamOidcError('token exchange failed: no access token');
    const api = githubApi(row.base_url ?? '');
    const headers = { accept: 'application/vnd.github+json', authorization: `Bearer ${token.access_token}`, 'x-github-api-version': '2022-11-28' };
    const user = await this.githubJson<{ id?: unknown; name?: unknown; login?: unknown }>(`${api}/user`, { headers });
    if (typeof user.id !== 'number' || !Number.isSafeInteger(user.id) || user.id <= 0) throw new UpstreamOidcError('GitHub\'s user has no id');
    const emails = await this.githubJson<unknown>(`${api}/user/emails`, { headers });
    if (!Array.isArray(emails)) throw new UpstreamOidcError('GitHub\'s addresses are not a list');
    // Only the primary address, and only when GitHub verified it: a secondary one may be anyone's
    // GitHub let someone add, and an unverified one nobody proved.
    const primary = emails.find((e): e is { email: string; verified: boolean } => typeof e === 'object' && e !== null && (e as { primary?: unknown }).primary === true && typeof (e as { email?: unknown }).email === 'string');
    const name = typeof user.name === 'string' && user.name !== '' ? user.name : typeof user.login === 'string' ? user.login : undefined;
    return { connectionId: row.id, subject: String(user.id), email: primary?.email, emailVerified: primary?.verified === true, name: name?.slice(0, 200) };
  }

  /** A JSON answer from GitHub, bounded; any failure is an UpstreamOidcError. */
  private async githubJson<T>(url: string, init: { method?: string; headers: Record<string, string>; body?: string }): Promise<T> {
    let response: Response;
    try {
      response = await this.settings.fetch(url, { ...init, signal: AbortSignal.timeout(5000) });
    } catch (err) {
      throw new UpstreamOidcError(`request to ${new URL(url).pathname} failed: ${err instanceof Error ? err.message : String(err)}`, `request to ${new URL(url).pathname} failed`, { cause: err });
    }
    if (response.status !== 200) throw new UpstreamOidcError(`${new URL(url).pathname} answered ${response.status}`);
    const text = await response.text();
    if (text.length > GITHUB_MAX_BODY) throw new UpstreamOidcError(`${new URL(url).pathname} answered too much`);
    try {
      return JSON.parse(text) as T;
    } catch {
      throw new UpstreamOidcError(`${new URL(url).pathname} answered something that is not JSON`);
    }
  }
}

/** GitHub's REST API beside its web flow: api.github.com for github.com, /api/v3 on a GitHub Enterprise Server. */
export function githubApi(baseUrl: string): string {
  const base = new URL(baseUrl);
  return base.host === 'github.com' && base.pathname === '/' ? 'https://api.github.com' : `${baseUrl}/api/v3`;
}
