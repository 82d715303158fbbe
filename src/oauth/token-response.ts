import type { Config } from '../config.js';
import type { DB } from '../db/connect.js';
import type { Application } from '../db/schema.js';
import { signAccessToken } from './access-tokens.js';
import { createGrant } from './grant-store.js';
import type { KeyStore, SigningKeyMaterial } from './key-store.js';
import { insertRefreshToken } from './refresh-tokens.js';
import type { RevocationList } from './revocations.js';

/** The token endpoint's success body (RFC 6749 §5.1 plus the organization, as the contract shows). */
export interface TokenResponse {
  token_type: 'Bearer';
  expires_in: number;
  access_token: string;
  refresh_token?: string;
  scope: string;
  organization_id: number;
  organization_name: string;
}

/** What issuing a client token needs (the CLI has no revocation list). */
export interface SigningContext {
  db: DB;
  keys: KeyStore;
  config: Pick<Config, 'issuer' | 'accessTokenTtl'>;
}

export interface TokenContext extends SigningContext {
  revocations: RevocationList;
  config: Pick<Config, 'issuer' | 'accessTokenTtl' | 'refreshTokenTtl' | 'refreshReuseGrace'>;
}

/**
 * Tokens for a user's grant (authorization_code and refresh_token): an access token with
 * `accessScopes` and a new refresh token carrying `refreshScopes` (RFC 6749 §6: a rotated
 * refresh token keeps the scope of the one it replaces). Pass the transaction that consumed the
 * code or retired the old refresh token, so both happen or neither.
 */
export async function issueUserTokens(
  trx: DB,
  ctx: TokenContext,
  signingKey: SigningKeyMaterial,
  input: {
    grantId: number;
    organizationId: number;
    organizationName: string;
    clientId: string;
    userId: number;
    accessScopes: readonly string[];
    refreshScopes: readonly string[];
    parentRefreshTokenId: number | null;
  },
): Promise<TokenResponse> {
  const refreshToken = await insertRefreshToken(trx, {
    organizationId: input.organizationId,
    grantId: input.grantId,
    parentId: input.parentRefreshTokenId,
    scopes: input.refreshScopes,
    ttlSeconds: ctx.config.refreshTokenTtl,
  });
  const { token } = await signAccessToken(signingKey, ctx.config, {
    subject: String(input.userId),
    clientId: input.clientId,
    scopes: input.accessScopes,
    organizationId: input.organizationId,
    grantId: input.grantId,
  });
  return {
    token_type: 'Bearer',
    expires_in: ctx.config.accessTokenTtl,
    access_token: token,
    refresh_token: refreshToken,
    scope: input.accessScopes.join(' '),
    organization_id: input.organizationId,
    organization_name: input.organizationName,
  };
}

/**
 * A private application's token for its own organization: what the client_credentials grant,
 * `orgauth token create` and the dashboard's "Generate Token" all return. No refresh token.
 */
export async function issueClientToken(ctx: SigningContext, application: Application, scopes: readonly string[]): Promise<TokenResponse> {
  const grant = await createGrant(ctx.db, {
    organizationId: application.organization_id,
    applicationId: application.id,
    userId: null,
    scopes,
  });
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
