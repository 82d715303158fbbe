/** Random secrets, their digests and constant-time comparison. */
import { createHash, hkdfSync, randomBytes, timingSafeEqual } from 'node:crypto';

/**
 * A random value from the CSPRNG, base64url without padding. 32 bytes (256 bits) by default:
 * client secrets, authorization codes, refresh tokens and session ids all use this.
 */
export function generateSecret(bytes = 32): string {
  return randomBytes(bytes).toString('base64url');
}

/** Hex SHA-256: how secrets are stored. A high-entropy secret needs no slow hash. */
export function sha256Hex(value: string): string {
  return createHash('sha256').update(value, 'utf8').digest('hex');
}

/** Whether `secret` hashes to `expectedHex`, compared in constant time. */
export function secretMatches(secret: string, expectedHex: string): boolean {
  const actual = createHash('sha256').update(secret, 'utf8').digest();
  const expected = Buffer.from(expectedHex, 'hex');
  return expected.length === actual.length && timingSafeEqual(actual, expected);
}

/**
 * A 256-bit key for one purpose, derived from SECRET_KEY with HKDF-SHA256 (RFC 5869), so the
 * cookie-signing key and the key-encryption key are independent of each other.
 */
export function deriveKey(secretKey: string, purpose: string): Uint8Array {
  return new Uint8Array(hkdfSync('sha256', secretKey, 'orgauth', purpose, 32));
}
