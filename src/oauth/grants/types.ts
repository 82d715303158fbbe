import type { AuthenticatedClient } from '../helpers/client-auth.js';
import type { Params } from '../helpers/params.js';
import type { TokenContext, TokenResponse } from './token-response.js';

/** One grant type of the token endpoint: endpoints/token.ts does what they share, then calls `handle`. */
export interface GrantHandler {
  grantType: string;
  handle(ctx: TokenContext, client: AuthenticatedClient, params: Params): Promise<TokenResponse>;
}
