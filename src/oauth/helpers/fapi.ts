/**
 * What an application's settings require of its requests, in one place: its own flags, and the
 * FAPI 2.0 Security Profile (https://openid.net/specs/fapi-security-profile-2_0.html) when its
 * `fapi2` flag is on. Under FAPI 2.0 an application gets, together:
 *
 * - pushed authorization requests only (§5.3.2.2 point 2; RFC 9126 §6);
 * - PKCE with S256 (§5.3.2.2 point 3);
 * - sender-constrained access tokens: DPoP (§5.3.2.1 point 5; RFC 9449 — mTLS, the other
 *   option, is out of scope);
 * - client authentication with private_key_jwt, never a secret (§5.3.2.1 point 4; the
 *   management API refuses the flag for an application without keys);
 * - `iss` in the authorization response (§5.3.2.2 point 7; orgauth sends it to everyone);
 * - authorization codes valid 60 s at most (§5.3.2.2 point 10).
 */
import type { Application } from '../../db/schema.js';

/** §5.3.2.2 point 10: "shall only issue authorization codes with a maximum lifetime of 60 seconds". */
export const FAPI2_MAX_CODE_TTL_S = 60;

type Flags = Pick<Application, 'fapi2' | 'dpop_bound_access_tokens' | 'require_pushed_authorization_requests' | 'require_pkce' | 'token_endpoint_auth_method'>;

/** Every access token DPoP-bound: a token request without a proof is refused (RFC 9449 §5.2 dpop_bound_access_tokens). */
export const requiresDpop = (app: Pick<Flags, 'fapi2' | 'dpop_bound_access_tokens'>): boolean => app.fapi2 || app.dpop_bound_access_tokens;

/** Authorization requests only by request_uri from /oauth/par (RFC 9126 §6). */
export const requiresPar = (app: Pick<Flags, 'fapi2' | 'require_pushed_authorization_requests'>): boolean => app.fapi2 || app.require_pushed_authorization_requests;

/** PKCE on every authorization request: asked for, FAPI 2.0, or a client without credentials (whose PKCE is its only proof). */
export const requiresPkce = (app: Pick<Flags, 'fapi2' | 'require_pkce' | 'token_endpoint_auth_method'>): boolean =>
  app.fapi2 || app.require_pkce || app.token_endpoint_auth_method === 'none';

/** How long the application's authorization codes live. */
export const codeTtlFor = (app: Pick<Flags, 'fapi2'>, configured: number): number => (app.fapi2 ? Math.min(configured, FAPI2_MAX_CODE_TTL_S) : configured);
