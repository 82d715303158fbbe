/**
 * Authorization codes (RFC 6749 §4.1.2): 256-bit random values stored as SHA-256, bound to the
 * client, redirect_uri, PKCE challenge, user and organization (CD-3), single use (CD-1) and
 * short-lived (CD-2, AUTH_CODE_TTL).
 */
import type { DB } from '../../db/connect.js';
import { generateSecret, sha256Hex } from '../../lib/crypto.js';

export interface NewAuthorizationCode {
  organizationId: number;
  applicationId: number;
  userId: number;
  redirectUri: string;
  scopes: readonly string[];
  /** RFC 7636: only S256 is accepted (PK-1); both null when the client sent no challenge. */
  codeChallenge: string | null;
  ttlSeconds: number;
  /** OpenID Connect: the scopes naming what the ID token tells, the request's nonce, and the sign-in (auth_time, sid) it came from. */
  identityScopes?: readonly string[];
  nonce?: string | null;
  authTime?: Date | null;
  /** How the user signed in for this authorization (RFC 8176). */
  amr?: readonly string[];
  /** The SSO connection the session was signed in through (SS-4); null or absent: not through SSO. */
  ssoConnectionId?: number | null;
  sid?: string | null;
  /** The resource the token will be for (RFC 8707); null or absent: orgauth's API. */
  resourceId?: number | null;
  /** RFC 9449 §10: the DPoP key the code must be redeemed with. */
  dpopJkt?: string | null;
}

/** Stores a new code and returns it; the plaintext exists only in the redirect to the client. */
export async function createAuthorizationCode(db: DB, input: NewAuthorizationCode): Promise<string> {
  const code = generateSecret(32);
  await db
    .insertInto('authorization_codes')
    .values({
      code_hash: sha256Hex(code),
      organization_id: input.organizationId,
      application_id: input.applicationId,
      user_id: input.userId,
      redirect_uri: input.redirectUri,
      scopes: [...input.scopes],
      code_challenge: input.codeChallenge,
      code_challenge_method: input.codeChallenge === null ? null : 'S256',
      identity_scopes: [...(input.identityScopes ?? [])],
      nonce: input.nonce ?? null,
      auth_time: input.authTime ?? null,
      amr: [...(input.amr ?? [])],
      sso_connection_id: input.ssoConnectionId ?? null,
      sid: input.sid ?? null,
      resource_id: input.resourceId ?? null,
      dpop_jkt: input.dpopJkt ?? null,
      expires_at: new Date(Date.now() + input.ttlSeconds * 1000),
    })
    .execute();
  return code;
}
