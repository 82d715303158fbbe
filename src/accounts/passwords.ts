import argon2 from 'argon2';
import type { Config } from '../config.js';

export const PASSWORD_MIN_LENGTH = 10;
/** Bounds the work an attacker can make argon2 do with one request. */
export const PASSWORD_MAX_LENGTH = 1024;

type Hashing = Config['passwordHashing'];

/**
 * argon2id with the library's defaults (m=64 MiB, t=3, p=4): about 100 ms here, which is right
 * for a human logging in and the reason nothing but passwords uses it. `weak-for-tests` (1 MiB,
 * one pass, one lane) only where config.ts allows it: a test suite.
 */
const HASHING_OPTIONS: Record<Hashing, argon2.Options> = {
  standard: { type: argon2.argon2id },
  'weak-for-tests': { type: argon2.argon2id, memoryCost: 1024, timeCost: 1, parallelism: 1 },
};

let hashing: Hashing = 'standard';

/**
 * Sets the cost of the hashes made from now on (PASSWORD_HASHING, applied by the server and the
 * CLI at start). A hash keeps its own parameters, so either kind verifies under the other.
 */
export function usePasswordHashing(kind: Hashing): void {
  if (kind !== hashing) dummyHash = undefined;
  hashing = kind;
}

export const passwordHashing = (): Hashing => hashing;

export function hashPassword(password: string): Promise<string> {
  return argon2.hash(password, HASHING_OPTIONS[hashing]);
}

/**
 * A hash to verify against when there is no password to check (an unknown email, an account
 * made through single sign-on), so that answer takes as long as a wrong password. Made once per
 * process, on first use.
 */
let dummyHash: Promise<string> | undefined;

/** Whether `password` is the one `hash` was made of; no hash (no password set) is never a match, found as slowly. */
export async function verifyPassword(hash: string | null, password: string): Promise<boolean> {
  if (hash === null) {
    dummyHash ??= hashPassword('orgauth-dummy-password-for-timing');
    await verifyPassword(await dummyHash, password);
    return false;
  }
  try {
    return await argon2.verify(hash, password);
  } catch {
    return false;
  }
}
