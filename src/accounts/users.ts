import { sql } from 'kysely';
import { z } from 'zod';
import type { DB } from '../db/connect.js';
import { isUniqueViolation } from '../db/errors.js';
import type { User } from '../db/schema.js';
import { ConflictError, NotFoundError } from '../errors.js';
import { parseInput } from '../lib/validate.js';
import { endAccountTokens } from './account-tokens.js';
import { hashPassword, PASSWORD_MAX_LENGTH, PASSWORD_MIN_LENGTH, verifyPassword } from './passwords.js';

export const emailSchema = z
  .string()
  .trim()
  .max(254, 'must be at most 254 characters')
  // One mailbox, nothing a mailer would read as a display name, a list or a group
  // ("Bob <me@evil.example>", "a@x,b@y", "g:a@x;"), so an account's address is where its mail goes.
  .regex(/^[^\s@<>()[\]\\,;:"]+@[^\s@<>()[\]\\,;:"]+$/, 'must be an email address');

const newUserSchema = z.object({
  email: emailSchema,
  password: z
    .string()
    .min(PASSWORD_MIN_LENGTH, `must be at least ${PASSWORD_MIN_LENGTH} characters`)
    .max(PASSWORD_MAX_LENGTH, `must be at most ${PASSWORD_MAX_LENGTH} characters`),
  name: z.string().trim().max(200, 'must be at most 200 characters').default(''),
});

export type PublicUser = Pick<User, 'id' | 'email' | 'name'>;

export interface PreparedUser {
  email: string;
  name: string;
  /** Null: no password (someone who signs in through their organization's identity provider). */
  passwordHash: string | null;
  /** Whether the address is known to be the user's (an invitation link, the operator's word). */
  emailVerified?: boolean;
}

/**
 * Validates a new user and hashes the password (about 100 ms of argon2id). Separate from the
 * insert so callers hash before opening a transaction: on the embedded database an open
 * transaction holds the only connection, and every other request would wait for the hash.
 */
export async function prepareUser(input: { email: string; password: string; name?: string | undefined }): Promise<PreparedUser> {
  const { email, password, name } = parseInput(newUserSchema, input);
  return { email, name, passwordHash: await hashPassword(password) };
}

/**
 * Creates a user with an argon2id password hash: the operator's path (CLI, seed), where the
 * address counts as verified unless `emailVerified: false`; sign-up verifies by link instead.
 * A taken email (in any letter case) is a ConflictError.
 */
export async function createUser(
  db: DB,
  input: { email: string; password: string; name?: string | undefined; emailVerified?: boolean },
): Promise<PublicUser> {
  return insertUser(db, { ...(await prepareUser(input)), emailVerified: input.emailVerified ?? true });
}

export async function insertUser(db: DB, { email, name, passwordHash, emailVerified }: PreparedUser): Promise<PublicUser> {
  try {
    return await db
      .insertInto('users')
      .values({ email, password_hash: passwordHash, name, email_verified_at: emailVerified ? sql<Date>`now()` : null })
      .returning(['id', 'email', 'name'])
      .executeTakeFirstOrThrow();
  } catch (err) {
    if (isUniqueViolation(err, 'users_email_lower_key')) throw new ConflictError(`a user with email ${email} already exists`);
    throw err;
  }
}

/** Case-insensitive lookup through the lower(email) index: lower() on both sides, so the database's rules apply to both. */
export async function findUserByEmail(db: DB, email: string): Promise<User | undefined> {
  return db
    .selectFrom('users')
    .selectAll()
    .where(sql<string>`lower(email)`, '=', sql<string>`lower(${email.trim()})`)
    .executeTakeFirst();
}

export async function getUserByEmail(db: DB, email: string): Promise<User> {
  const user = await findUserByEmail(db, email);
  if (!user) throw new NotFoundError(`no user with email ${email.trim()}`);
  return user;
}

/** Every user in id order, a page at a time (the operator's `orgauth user list`). */
export async function listUsers(db: DB, page: { afterId: number; limit: number }): Promise<Pick<User, 'id' | 'email' | 'name' | 'created_at'>[]> {
  return db.selectFrom('users').select(['id', 'email', 'name', 'created_at']).where('id', '>', page.afterId).orderBy('id').limit(page.limit).execute();
}

/** Whether `password` is the user's current one (asked again before changes to the account); over-long is never. */
export async function passwordMatches(db: DB, userId: number, password: string | undefined): Promise<boolean> {
  if (password === undefined || password.length > PASSWORD_MAX_LENGTH) return false;
  const row = await db.selectFrom('users').select('password_hash').where('id', '=', userId).executeTakeFirstOrThrow();
  return verifyPassword(row.password_hash, password);
}

/**
 * Sets a user's password hash. Every link sent to them before (reset, verification) stops
 * working: whoever could read their mail then may not be them now. Callers also end sessions.
 */
export async function setPassword(db: DB, userId: number, passwordHash: string): Promise<void> {
  await db.updateTable('users').set({ password_hash: passwordHash, updated_at: new Date() }).where('id', '=', userId).execute();
  await endAccountTokens(db, userId);
  // Whoever gave the old password and waits at the second step starts again.
  await db.deleteFrom('pending_sign_ins').where('user_id', '=', userId).execute();
}
