import type { Config } from '../../config.js';
import type { DB } from '../../db/connect.js';
import type { Application } from '../../db/schema.js';
import { signAccessToken } from '../models/access-tokens.js';
import { signIdToken } from '../models/id-tokens.js';
import { IDENTITY_SCOPES } from '../helpers/scopes.js';
import type { ClientGrants } from '../models/client-grants.js';
import type { KeyStore, SigningKeyMaterial } from '../models/key-store.js';
import type { RevocationList } from '../models/revocation-list.js';
import type { Metrics } from '../../metrics.js';

/** The token endpoint's success body (RFC 6749 §5.1 plus the organization, as the contract shows). */
export interface TokenResponse {
  token_type: 'Bearer';
  expires_in: number;
  access_token: string;
  refresh_token?: string;
  scope: string;
  organization_id: number;
  organization_name: string;
  /** OpenID Connect Core §3.1.3.3: with `openid` granted, on the authorization_code and refresh_token grants only. */
  id_token?: string;
}

/**
 * What a user's grant says about the user, as the token statements return it: the OpenID scopes
 * granted, the sign-in they came from, and the user's claims as they are now.
 */
export interface GrantIdentity {
  identity_scopes: string[];
  auth_time: Date | null;
  sid: string | null;
  /** How the user signed in (RFC 8176), for the ID token's amr and acr. */
  amr: string[];
  email: string;
  name: string;
  email_verified: boolean;
}

/** What issuing a client token needs (the CLI has no revocation list). */
export interface SigningContext {
  db: DB;
  keys: KeyStore;
  config: Pick<Config, 'issuer' | 'accessTokenTtl'>;
  clientGrants: ClientGrants;
}

export interface TokenContext extends SigningContext {
  revocations: RevocationList;
  metrics: Metrics;
  config: Pick<Config, 'issuer' | 'accessTokenTtl' | 'refreshTokenTtl' | 'refreshReuseGrace'>;
}

/**
 * The response for a user's grant (authorization_code and refresh_token): a new access token
 * with `accessScopes`, and `refreshToken`, which the grant handler has stored in the same
 * statement that consumed the code or retired the previous refresh token.
 */
export async function userTokenResponse(
  ctx: Pick<TokenContext, 'config'>,
  signingKey: SigningKeyMaterial,
  input: {
    grantId: number;
    organizationId: number;
    organizationName: string;
    clientId: string;
    userId: number;
    accessScopes: readonly string[];
    refreshToken: string;
    /** The grant's OpenID side; `nonce` only on the code's redemption. */
    identity: GrantIdentity & { nonce: string | null };
  },
): Promise<TokenResponse> {
  const identityScopes = IDENTITY_SCOPES.filter((s) => input.identity.identity_scopes.includes(s));
  // The OpenID scopes first, in canonical order: the access token lets userinfo be read with them.
  const scopes = [...identityScopes, ...input.accessScopes];
  const { token } = await signAccessToken(signingKey, ctx.config, {
    subject: String(input.userId),
    clientId: input.clientId,
    scopes,
    organizationId: input.organizationId,
    grantId: input.grantId,
  });
  const organization = { id: input.organizationId, name: input.organizationName };
  const idToken = identityScopes.includes('openid')
    ? await signIdToken(signingKey, ctx.config, {
        clientId: input.clientId,
        user: { userId: input.userId, email: input.identity.email, emailVerified: input.identity.email_verified, name: input.identity.name },
        organization,
        identityScopes,
        authTime: input.identity.auth_time,
        nonce: input.identity.nonce,
        sid: input.identity.sid,
        amr: input.identity.amr,
        accessToken: token,
      })
    : undefined;
  return {
    token_type: 'Bearer',
    expires_in: ctx.config.accessTokenTtl,
    access_token: token,
    refresh_token: input.refreshToken,
    scope: scopes.join(' '),
    organization_id: input.organizationId,
    organization_name: input.organizationName,
    ...(idToken !== undefined ? { id_token: idToken } : {}),
  };
}

/**
 * A private application's token for its own organization: what the client_credentials grant,
 * `orgauth token create` and the dashboard's "Generate Token" all return. No refresh token; the
 * grant is the application's own, shared by all its tokens (see client-grants.ts).
 */
export async function issueClientToken(ctx: SigningContext, application: Application, scopes: readonly string[]): Promise<TokenResponse> {
  const grant = await ctx.clientGrants.forApplication(application, scopes);
  const signingKey = await ctx.keys.signingKey();
  const { token } = await signAccessToken(signingKey, ctx.config, {
    subject: application.client_id,
    clientId: application.client_id,
    scopes,
    organizationId: application.organization_id,
    grantId: grant.id,
  });
  return {
    token_type: 'Bearer',
    expires_in: ctx.config.accessTokenTtl,
    access_token: token,
    scope: scopes.join(' '),
    organization_id: application.organization_id,
    organization_name: grant.organizationName,
  };
}
