import type { AuthenticatedClient } from '../helpers/client-auth.js';
import type { Params } from '../helpers/params.js';
import type { TokenContext, TokenResponse } from './token-response.js';

/** What the token endpoint learnt of the request besides its parameters. */
export interface TokenRequest {
  /** The thumbprint of the key of the request's DPoP proof, checked (RFC 9449 §5); null without one. */
  dpopJkt: string | null;
}

/** One grant type of the token endpoint: endpoints/token.ts does what they share, then calls `handle`. */
export interface GrantHandler {
  grantType: string;
  /** false: a client need not have registered the grant type (RFC 7591 grant_types); the grant decides who may use it. */
  registered?: boolean;
  handle(ctx: TokenContext, client: AuthenticatedClient, params: Params, request: TokenRequest): Promise<TokenResponse>;
}
