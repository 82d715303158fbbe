/** RFC 7636 PKCE, S256 only (PK-1). */
import { createHash, timingSafeEqual } from 'node:crypto';

/** code_verifier and code_challenge: 43 to 128 unreserved characters (RFC 7636 §4.1, §4.2). */
export const PKCE_VALUE = /^[A-Za-z0-9\-._~]{43,128}$/;

export function s256(verifier: string): string {
  return createHash('sha256').update(verifier, 'ascii').digest('base64url');
}

/** Whether `verifier` is well-formed and hashes to `challenge` (PK-4). */
export function verifyPkce(verifier: string | undefined, challenge: string): boolean {
  if (verifier === undefined || !PKCE_VALUE.test(verifier)) return false;
  const actual = Buffer.from(s256(verifier));
  const expected = Buffer.from(challenge);
  return actual.length === expected.length && timingSafeEqual(actual, expected);
}
