/**
 * The tokens in links sent to a user by email: verify an address, reset the password.
 *
 * Each is 256 random bits; the table keeps only its SHA-256, found through a unique index and
 * compared again in constant time. A token is used once, expires, and every token of a user
 * ends when their password changes (setPassword in users.ts), so no link sent before works
 * after it. Using or ending a token sets used_at rather than deleting it: the row still counts
 * for the hourly limits on how many links a user is sent, until retention deletes it an hour
 * after it expired. A live token is one with used_at null: never a comparison of times, which
 * two transactions that began at different moments would each read in their own way.
 */
import { sql } from 'kysely';
import type { DB } from '../db/connect.js';
import type { AccountTokenPurpose } from '../db/schema.js';
import { generateSecret, secretMatches, sha256Hex } from '../lib/crypto.js';

export const VERIFY_EMAIL_TTL_S = 24 * 3600;
export const RESET_PASSWORD_TTL_S = 30 * 60;

/** What a link token looks like: 32 bytes in base64url. Anything else is refused unread. */
export const LINK_TOKEN_PATTERN = /^[A-Za-z0-9_-]{43}$/;

export interface AccountToken {
  id: number;
  user_id: number;
  email: string;
  created_at: Date;
  expires_at: Date;
}

export async function issueAccountToken(
  db: DB,
  input: { purpose: AccountTokenPurpose; userId: number; email: string; ttlSeconds: number },
): Promise<string> {
  const token = generateSecret(32);
  await db
    .insertInto('account_tokens')
    .values({
      token_hash: sha256Hex(token),
      purpose: input.purpose,
      user_id: input.userId,
      email: input.email,
      expires_at: sql<Date>`now() + make_interval(secs => ${input.ttlSeconds})`,
    })
    .execute();
  return token;
}

/** The live token of this purpose, without using it (the page that shows the form). */
export async function findAccountToken(db: DB, purpose: AccountTokenPurpose, token: unknown): Promise<AccountToken | undefined> {
  if (typeof token !== 'string' || !LINK_TOKEN_PATTERN.test(token)) return undefined;
  const row = await db
    .selectFrom('account_tokens')
    .select(['id', 'token_hash', 'user_id', 'email', 'created_at', 'expires_at'])
    .where('token_hash', '=', sha256Hex(token))
    .where('purpose', '=', purpose)
    .where('used_at', 'is', null)
    .where('expires_at', '>', sql<Date>`now()`)
    .executeTakeFirst();
  if (!row || !secretMatches(token, row.token_hash)) return undefined;
  const { token_hash: _hash, ...rest } = row;
  return rest;
}

/**
 * Uses the token: deletes it and returns what it was for, or undefined when it is unknown,
 * expired, or used a moment ago by another request (the DELETE decides, so only one wins).
 */
export async function consumeAccountToken(db: DB, purpose: AccountTokenPurpose, token: unknown): Promise<AccountToken | undefined> {
  if (typeof token !== 'string' || !LINK_TOKEN_PATTERN.test(token)) return undefined;
  // Two requests with the same link: the second waits for the first's row lock, then re-reads
  // the row, finds used_at set and updates nothing.
  const row = await db
    .updateTable('account_tokens')
    .set({ used_at: sql<Date>`now()` })
    .where('token_hash', '=', sha256Hex(token))
    .where('purpose', '=', purpose)
    .where('used_at', 'is', null)
    .where('expires_at', '>', sql<Date>`now()`)
    .returning(['id', 'token_hash', 'user_id', 'email', 'created_at', 'expires_at'])
    .executeTakeFirst();
  if (!row || !secretMatches(token, row.token_hash)) return undefined;
  const { token_hash: _hash, ...rest } = row;
  return rest;
}

/** How many tokens of this purpose the user was sent since `seconds` ago (used or not), and when the last one was (throttles). */
export async function recentAccountTokens(db: DB, userId: number, purpose: AccountTokenPurpose, seconds: number): Promise<{ count: number; last: Date | null }> {
  const row = await db
    .selectFrom('account_tokens')
    .select([sql<string>`count(*)`.as('count'), sql<Date | null>`max(created_at)`.as('last')])
    .where('user_id', '=', userId)
    .where('purpose', '=', purpose)
    .where('created_at', '>', sql<Date>`now() - make_interval(secs => ${seconds})`)
    .executeTakeFirstOrThrow();
  return { count: Number(row.count), last: row.last === null ? null : new Date(row.last) };
}

/** Ends every live link token of a user (the password changed), or those of one purpose. */
export async function endAccountTokens(db: DB, userId: number, purpose?: AccountTokenPurpose): Promise<void> {
  let query = db.updateTable('account_tokens').set({ used_at: sql<Date>`now()` }).where('user_id', '=', userId).where('used_at', 'is', null);
  if (purpose) query = query.where('purpose', '=', purpose);
  await query.execute();
}
