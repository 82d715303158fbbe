import type { Config } from '../config.js';
import type { DB } from '../db/connect.js';
import type { Application } from '../db/schema.js';
import { signAccessToken } from './access-tokens.js';
import { createGrant } from './grant-store.js';
import type { KeyStore } from './key-store.js';

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

export interface TokenContext {
  db: DB;
  keys: KeyStore;
  config: Pick<Config, 'issuer' | 'accessTokenTtl'>;
}

/**
 * A private application's token for its own organization: what the client_credentials grant,
 * `orgauth token create` and the dashboard's "Generate Token" all return. No refresh token.
 */
export async function issueClientToken(ctx: TokenContext, application: Application, scopes: readonly string[]): Promise<TokenResponse> {
  const grant = await createGrant(ctx.db, {
    organizationId: application.organization_id,
    applicationId: application.id,
    userId: null,
    scopes,
  });
  const { token } = await signAccessToken(ctx.keys, ctx.config, {
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
