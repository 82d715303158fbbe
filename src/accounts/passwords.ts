import argon2 from 'argon2';

export const PASSWORD_MIN_LENGTH = 10;
/** Bounds the work an attacker can make argon2 do with one request. */
export const PASSWORD_MAX_LENGTH = 1024;

/**
 * argon2id with the library's defaults (m=64 MiB, t=3, p=4): about 100 ms here, which is right
 * for a human logging in and the reason nothing but passwords uses it.
 */
export function hashPassword(password: string): Promise<string> {
  return argon2.hash(password, { type: argon2.argon2id });
}

export async function verifyPassword(hash: string, password: string): Promise<boolean> {
  try {
    return await argon2.verify(hash, password);
  } catch {
    return false;
  }
}
