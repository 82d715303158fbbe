import type { Config } from '../../config.js';
import type { DB } from '../../db/connect.js';
import { type Application, type IdTokenAlg, isDeveloperApplication } from '../../db/schema.js';
import { UnauthorizedClientError } from '../errors.js';
import { signAccessToken } from '../models/access-tokens.js';
import { signIdToken } from '../models/id-tokens.js';
import { apiResource, type ResourceRegistry, type TokenResource } from '../models/resources.js';
import { IDENTITY_SCOPES } from '../helpers/scopes.js';
import { requiresDpop } from '../helpers/fapi.js';
import type { ClientGrants } from '../models/client-grants.js';
import type { KeyStore, SigningKeyMaterial } from '../models/key-store.js';
import type { RevocationList } from '../models/revocation-list.js';
import type { Metrics } from '../../metrics.js';
import type { FindApplication } from '../models/application-cache.js';

/** The token endpoint's success body (RFC 6749 §5.1 plus the organization, as the contract shows). */
export interface TokenResponse {
  /** RFC 9449 §5: DPoP when the access token is bound to the proof's key. */
  token_type: 'Bearer' | 'DPoP';
  expires_in: number;
  access_token: string;
  refresh_token?: string;
  scope: string;
  organization_id: number;
  organization_name: string;
  /** OpenID Connect Core §3.1.3.3: with `openid` granted, on the authorization_code and refresh_token grants only. */
  id_token?: string;
  /** RFC 8693 §2.2.1: token exchange says what it issued. */
  issued_token_type?: string;
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
  /** The application cache's lookup (token exchange checks the tokens it is given). */
  findApplication: FindApplication;
  revocations: RevocationList;
  metrics: Metrics;
  resources: ResourceRegistry;
  config: Pick<Config, 'issuer' | 'accessTokenTtl' | 'refreshTokenTtl' | 'refreshReuseGrace'>;
}

/**
 * The response for a user's grant (authorization_code and refresh_token): a new access token
 * with `accessScopes`, and `refreshToken`, which the grant handler has stored in the same
 * statement that consumed the code or retired the previous refresh token.
 */
export async function userTokenResponse(
  ctx: Pick<TokenContext, 'config' | 'keys'>,
  signingKey: SigningKeyMaterial,
  input: {
    grantId: number;
    organizationId: number;
    organizationName: string;
    clientId: string;
    userId: number;
    /** The member's custom role (null: a built-in one), named in the access token so the API can hold it to the role as it is now. */
    roleId: number | null;
    accessScopes: readonly string[];
    /** What the access token is for (RFC 8707); the refresh token stays with the grant, and so with it. */
    resource: TokenResource;
    refreshToken: string;
    /** The grant's OpenID side; `nonce` only on the code's redemption. */
    identity: GrantIdentity & { nonce: string | null };
    /** The application's id_token_signed_response_alg: the ID token is signed with that algorithm's active key. */
    idTokenAlg: IdTokenAlg;
    /** The DPoP key the access token is bound to (RFC 9449), if a proof came with the request. */
    dpopJkt: string | null;
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
    resource: input.resource,
    roleId: input.roleId,
    dpopJkt: input.dpopJkt,
  });
  const organization = { id: input.organizationId, name: input.organizationName };
  const idToken = identityScopes.includes('openid')
    ? await signIdToken(input.idTokenAlg === signingKey.alg ? signingKey : await ctx.keys.signingKey(input.idTokenAlg), ctx.config, {
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
    token_type: input.dpopJkt ? 'DPoP' : 'Bearer',
    expires_in: input.resource.accessTokenTtl,
    access_token: token,
    refresh_token: input.refreshToken,
    scope: scopes.join(' '),
    organization_id: input.organizationId,
    organization_name: input.organizationName,
    ...(idToken !== undefined ? { id_token: idToken } : {}),
  };
}

/** A grant just made by redeeming a code (an authorization code, an approved device code), as the redeeming statement returns it. */
export interface RedeemedGrant extends GrantIdentity {
  grant_id: number;
  role_id: number | null;
  organization_id: number;
  organization_name: string;
  user_id: number;
  scopes: string[];
  nonce: string | null;
}

/** The first tokens of a redeemed grant: for its resource, with the scopes the resource lists now (one it dropped since the consent is not issued). */
export function redeemedTokenResponse(
  ctx: Pick<TokenContext, 'config' | 'keys'>,
  signingKey: SigningKeyMaterial,
  input: { application: Pick<Application, 'client_id' | 'id_token_signed_response_alg'>; redeemed: RedeemedGrant; resource: TokenResource; refreshToken: string; dpopJkt: string | null },
): Promise<TokenResponse> {
  const { redeemed, resource } = input;
  return userTokenResponse(ctx, signingKey, {
    grantId: redeemed.grant_id,
    organizationId: redeemed.organization_id,
    organizationName: redeemed.organization_name,
    clientId: input.application.client_id,
    userId: redeemed.user_id,
    roleId: redeemed.role_id,
    accessScopes: redeemed.scopes.filter((s) => resource.id === null || resource.scopes.includes(s)),
    resource,
    refreshToken: input.refreshToken,
    identity: redeemed,
    idTokenAlg: input.application.id_token_signed_response_alg,
    dpopJkt: input.dpopJkt,
  });
}

/**
 * A private application's token for its own organization: what the client_credentials grant,
 * `orgauth token create` and the dashboard's "Generate Token" all return. No refresh token; the
 * grant is the application's own, shared by all its tokens (see client-grants.ts).
 */
export async function issueClientToken(
  ctx: SigningContext,
  application: Application,
  scopes: readonly string[],
  resource: TokenResource = apiResource(ctx.config),
  dpopJkt: string | null = null,
): Promise<TokenResponse> {
  // Only an organization's own applications act for it; a self-registered client has none.
  if (!isDeveloperApplication(application)) throw new UnauthorizedClientError('this client belongs to no organization');
  // Every path to a client token (the grant, the CLI, the dashboard) holds to the application's DPoP rule.
  if (dpopJkt === null && requiresDpop(application)) throw new UnauthorizedClientError("this application's access tokens are DPoP-bound: request them with a DPoP proof");
  const grant = await ctx.clientGrants.forApplication(application, scopes);
  const signingKey = await ctx.keys.signingKey();
  const { token } = await signAccessToken(signingKey, ctx.config, {
    subject: application.client_id,
    clientId: application.client_id,
    scopes,
    organizationId: application.organization_id,
    grantId: grant.id,
    resource,
    dpopJkt,
  });
  return {
    token_type: dpopJkt ? 'DPoP' : 'Bearer',
    expires_in: resource.accessTokenTtl,
    access_token: token,
    scope: scopes.join(' '),
    organization_id: application.organization_id,
    organization_name: grant.organizationName,
  };
}
