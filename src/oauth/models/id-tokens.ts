/**
 * ID tokens (OpenID Connect Core §2): who signed in, for the application that asked, signed with
 * the same keys as access tokens but with `typ: JWT` and the application as audience, so neither
 * is ever accepted for the other (access tokens are `at+jwt` for the API's audience).
 */
import { createHash } from 'node:crypto';
import { acrOf } from '../helpers/acr.js';
import { compactVerify, errors as joseErrors } from 'jose';
import { z } from 'zod';
import { type Config, SIGNING_ALGS } from '../../config.js';
import { InvalidRequestError } from '../../errors.js';
import { type KeyStore, type SigningKeyMaterial, signJws } from './key-store.js';
import type { IdentityScope } from '../helpers/scopes.js';

/** The user's claims as the database has them now. */
export interface UserClaimsSource {
  userId: number;
  email: string;
  emailVerified: boolean;
  name: string;
}

/**
 * The claims about the user for the granted OpenID scopes (OIDC Core §5.4): `sub` always, and the
 * organization the user chose; `email` and `email_verified` with `email`; `name` with `profile`
 * when the user gave one (a claim without a value is left out, §5.3.2). The same for the ID token
 * and userinfo.
 */
export function userClaims(user: UserClaimsSource, organization: { id: number; name: string }, scopes: readonly string[]) {
  return {
    sub: String(user.userId),
    organization_id: organization.id,
    organization_name: organization.name,
    ...(scopes.includes('email') ? { email: user.email, email_verified: user.emailVerified } : {}),
    ...(scopes.includes('profile') && user.name.trim() !== '' ? { name: user.name } : {}),
  };
}

/** The claims an ID token or userinfo may carry (the discovery documents list them). */
export const CLAIMS_SUPPORTED = ['iss', 'sub', 'aud', 'exp', 'iat', 'auth_time', 'nonce', 'at_hash', 'sid', 'azp', 'amr', 'acr', 'organization_id', 'organization_name', 'email', 'email_verified', 'name'] as const;

/**
 * at_hash (OIDC Core §3.1.3.6): the left half of the hash of the access token's ASCII, with the
 * hash of the ID token's alg: SHA-256 for ES256 and RS256, SHA-512 for EdDSA over Ed25519 (the
 * only curve our keys use), as OpenID Foundation's errata and the certified libraries do.
 */
export function accessTokenHash(alg: SigningKeyMaterial['alg'], accessToken: string): string {
  const digest = createHash(alg === 'EdDSA' ? 'sha512' : 'sha256')
    .update(accessToken, 'ascii')
    .digest();
  return digest.subarray(0, digest.length / 2).toString('base64url');
}

export interface IdTokenInput {
  clientId: string;
  user: UserClaimsSource;
  organization: { id: number; name: string };
  identityScopes: readonly IdentityScope[];
  /** When the user signed in (OIDC Core auth_time); null for a grant from before OpenID Connect, whose ID token then has none. */
  authTime: Date | null;
  /** The authorization request's nonce, on the code's ID token only. */
  nonce?: string | null | undefined;
  sid?: string | null | undefined;
  /** How the user signed in (RFC 8176 amr); empty for a grant from before it was kept (no amr, no acr then). */
  amr?: readonly string[] | undefined;
  accessToken: string;
}

/**
 * How long an ID token is valid: an hour, or less when access tokens live less (the keys stay
 * published for an access token's lifetime after rotation, so never longer than that). An ID
 * token is read once, when the application signs the user in; it is not a credential to keep.
 */
export const idTokenTtl = (config: Pick<Config, 'accessTokenTtl'>): number => Math.min(3600, config.accessTokenTtl);

/** An ID token for `input`. */
export async function signIdToken(signingKey: SigningKeyMaterial, config: Pick<Config, 'issuer' | 'accessTokenTtl'>, input: IdTokenInput): Promise<string> {
  const iat = Math.floor(Date.now() / 1000);
  const claims = {
    iss: config.issuer,
    ...userClaims(input.user, input.organization, input.identityScopes),
    aud: input.clientId,
    azp: input.clientId,
    iat,
    exp: iat + idTokenTtl(config),
    ...(input.authTime ? { auth_time: Math.floor(input.authTime.getTime() / 1000) } : {}),
    ...(input.nonce ? { nonce: input.nonce } : {}),
    ...(input.sid ? { sid: input.sid } : {}),
    ...(input.amr && input.amr.length > 0 ? { amr: [...input.amr], acr: acrOf(input.amr) } : {}),
    at_hash: accessTokenHash(signingKey.alg, input.accessToken),
  };
  return signJws(signingKey, signingKey.idTokenHeader, claims);
}

const hintSchema = z.object({
  iss: z.string(),
  sub: z.string().min(1),
  aud: z.union([z.string(), z.array(z.string()).min(1)]),
  azp: z.string().optional(),
  sid: z.string().optional(),
});

export interface IdTokenHint {
  sub: string;
  /** The application it was issued to (azp, or the single audience). */
  clientId: string;
  sid: string | undefined;
}

/**
 * An `id_token_hint` (OIDC Core §3.1.2.1, RP-Initiated Logout §2): an ID token this provider
 * issued, checked for signature (our keys only, the key's own alg), `typ: JWT` and issuer. Its
 * expiry is not checked: a hint names a user and an application, and an expired ID token still
 * does (the specifications ask providers to accept them). Keys are published for an access
 * token's lifetime after rotation, so a hint older than that is refused.
 */
export async function verifyIdTokenHint(keys: KeyStore, config: Pick<Config, 'issuer'>, token: string): Promise<IdTokenHint> {
  const refused = (why: string) => new InvalidRequestError(`id_token_hint ${why}`);
  if (token.length > 8192) throw refused('is too long');
  let payload: Uint8Array;
  try {
    ({ payload } = await compactVerify(
      token,
      async (header) => {
        if (typeof header.kid !== 'string') throw refused('has no kid');
        if (header.typ !== 'JWT') throw refused('is not an ID token');
        const found = await keys.verificationKey(header.kid);
        if (!found) throw refused('was not signed by a key of this provider (or one retired too long ago)');
        if (header.alg !== found.alg) throw refused('is signed with another algorithm than its key’s');
        return found.key;
      },
      { algorithms: [...SIGNING_ALGS] },
    ));
  } catch (err) {
    if (err instanceof InvalidRequestError) throw err;
    if (err instanceof joseErrors.JOSEError || err instanceof TypeError) throw refused('is not a valid ID token');
    throw err;
  }
  let claims;
  try {
    claims = hintSchema.safeParse(JSON.parse(new TextDecoder().decode(payload)));
  } catch {
    throw refused('is not a valid ID token');
  }
  if (!claims.success || claims.data.iss !== config.issuer) throw refused('was not issued by this provider');
  const { sub, aud, azp, sid } = claims.data;
  const audiences = typeof aud === 'string' ? [aud] : aud;
  const clientId = azp ?? (audiences.length === 1 ? audiences[0] : undefined);
  if (clientId === undefined || !audiences.includes(clientId)) throw refused('names no single application');
  return { sub, clientId, sid };
}
