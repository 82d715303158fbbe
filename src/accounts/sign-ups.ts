/**
 * Sign-up by confirmed address (SECURITY.md AC-2, DO-1).
 *
 * A sign-up makes no user. It is kept pending (pending_sign_ups: the address, the password's
 * argon2id hash, the name, the organization's name, where to go afterwards) and a link is mailed
 * to the address; following the link and giving the same password creates the user, with the
 * address confirmed, and their organization, in one transaction. So nobody holds an account on
 * an address they do not read (pre-account takeover, Sudhodanan & Paverd 2022), and the answer
 * to a sign-up is the same whether or not the address has an account: a taken address's owner
 * is mailed instead ("someone tried to sign up"), with where to sign in and reset the password.
 *
 * - The link's token is 256 random bits, kept as its SHA-256 (AC-1), found through a unique index
 *   and compared again in constant time; it works once (the DELETE that uses it decides) and for
 *   SIGN_UP_TTL_S. A new sign-up for a pending address replaces the row, and kills its link.
 * - Limits (DO-1), counted in the database so every instance shares them: SIGN_UPS_PER_ADDRESS
 *   sign-ups an hour per address and SIGN_UPS_PER_IP per client address group (an IPv6 /64:
 *   lib/client-address.ts). admitSignUp checks both, and records the sign-up, under one
 *   transaction-scoped advisory lock, before the password is hashed: a refused sign-up costs no
 *   argon2. Every admitted sign-up sends exactly one mail, to its address, so the per-address
 *   limit is also the bound on sign-up mails a recipient gets, whoever asks.
 * - Retention (src/retention.ts) deletes pending sign-ups once expired and the counted sign-ups
 *   an hour after they were made; the limits bound how many rows there are meanwhile.
 */
import { sql } from 'kysely';
import { type DB, inTransaction } from '../db/connect.js';
import { addressGroup } from '../lib/client-address.js';
import { generateSecret, secretMatches, sha256Hex } from '../lib/crypto.js';
import { signUpConfirmMessage, signUpTakenMessage } from '../mail/messages.js';
import { LINK_TOKEN_PATTERN } from './account-tokens.js';
import type { MailDeps } from './invitations.js';
import { createOrganization } from './organizations.js';
import { hashPassword, verifyPassword } from './passwords.js';
import { findUserByEmail, insertUser } from './users.js';

/** How long a sign-up's link works: short, the person is at their screen waiting for it. */
export const SIGN_UP_TTL_S = 3600;
/** Sign-ups (and so sign-up mails) per address an hour, whoever asks. */
export const SIGN_UPS_PER_ADDRESS = 3;
/** Sign-ups per client address group an hour. */
export const SIGN_UPS_PER_IP = 10;
const WINDOW_S = 3600;

/** Serializes admissions (counted, then recorded): one lock for the instance's database. */
const SIGN_UP_LOCK = sql`hashtext('orgauth.sign_up')`;

export function signUpLink(issuer: string, token: string): string {
  return `${issuer}/signup/confirm?token=${token}`;
}

/** The counted sign-ups of one address or client in the window, and seconds until the oldest leaves it. */
async function recentSignUps(trx: DB, column: 'email' | 'ip', value: string): Promise<{ count: number; wait: number }> {
  const row = await trx
    .selectFrom('sign_up_attempts')
    .select([
      sql<string>`count(*)`.as('count'),
      sql<string | null>`ceil(extract(epoch from min(created_at) + make_interval(secs => ${WINDOW_S}) - now()))`.as('wait'),
    ])
    .where(column, '=', value)
    .where('created_at', '>', sql<Date>`now() - make_interval(secs => ${WINDOW_S})`)
    .executeTakeFirstOrThrow();
  return { count: Number(row.count), wait: Math.max(1, Number(row.wait ?? 1)) };
}

/**
 * Admits a sign-up for `email` from `ip` and records it, or returns how many seconds to wait
 * (the address or the client used up its hour). 0: admitted.
 */
export async function admitSignUp(db: DB, input: { email: string; ip: string }): Promise<number> {
  const email = input.email.trim().toLowerCase();
  const ip = addressGroup(input.ip);
  return inTransaction(db, async (trx) => {
    await sql`select pg_advisory_xact_lock(${SIGN_UP_LOCK})`.execute(trx);
    const byAddress = await recentSignUps(trx, 'email', email);
    const byClient = await recentSignUps(trx, 'ip', ip);
    const wait = Math.max(byAddress.count >= SIGN_UPS_PER_ADDRESS ? byAddress.wait : 0, byClient.count >= SIGN_UPS_PER_IP ? byClient.wait : 0);
    if (wait > 0) return wait;
    await trx.insertInto('sign_up_attempts').values({ email, ip }).execute();
    return 0;
  });
}

export interface SignUpRequest {
  email: string;
  password: string;
  name: string;
  organizationName: string;
  returnTo: string;
}

/**
 * An admitted sign-up: hashes the password (the same argon2 work whatever the address), then
 * keeps the sign-up pending and mails its link, or, when an account has the address, mails its
 * owner instead. Says which for the log only: the caller answers the same either way.
 */
export async function requestSignUp(db: DB, deps: MailDeps, input: SignUpRequest): Promise<'pending' | 'taken'> {
  const passwordHash = await hashPassword(input.password);
  const outcome = await inTransaction(db, async (trx) => {
    const user = await findUserByEmail(trx, input.email);
    if (user) {
      await deps.mail.queue(trx, signUpTakenMessage({ issuer: deps.issuer, to: user.email, name: user.name }));
      return 'taken' as const;
    }
    const token = generateSecret(32);
    const row = {
      email: input.email,
      token_hash: sha256Hex(token),
      password_hash: passwordHash,
      name: input.name,
      organization_name: input.organizationName,
      return_to: input.returnTo,
      expires_at: sql<Date>`now() + make_interval(secs => ${SIGN_UP_TTL_S})`,
    };
    // One pending sign-up per address: a new one replaces it, and the old link stops working.
    await trx
      .insertInto('pending_sign_ups')
      .values(row)
      .onConflict((oc) => oc.expression(sql`lower(email)`).doUpdateSet({ ...row, created_at: sql<Date>`now()` }))
      .execute();
    await deps.mail.queue(
      trx,
      signUpConfirmMessage({ issuer: deps.issuer, to: input.email, name: input.name, organizationName: input.organizationName, link: signUpLink(deps.issuer, token), minutes: SIGN_UP_TTL_S / 60 }),
    );
    return 'pending' as const;
  });
  deps.mail.wake();
  return outcome;
}

export interface PendingSignUp {
  email: string;
  name: string;
  organization_name: string;
  return_to: string;
  password_hash: string;
}

/** The pending sign-up a link is for, while it may still be used (the page with the form). */
export async function findPendingSignUp(db: DB, token: unknown): Promise<PendingSignUp | undefined> {
  if (typeof token !== 'string' || !LINK_TOKEN_PATTERN.test(token)) return undefined;
  const row = await db
    .selectFrom('pending_sign_ups')
    .select(['token_hash', 'email', 'name', 'organization_name', 'return_to', 'password_hash'])
    .where('token_hash', '=', sha256Hex(token))
    .where('expires_at', '>', sql<Date>`now()`)
    .executeTakeFirst();
  if (!row || !secretMatches(token, row.token_hash)) return undefined;
  const { token_hash: _hash, ...rest } = row;
  return rest;
}

export type CompletedSignUp =
  | { outcome: 'created'; userId: number; organizationId: number; returnTo: string }
  | { outcome: 'wrong_password' }
  | { outcome: 'unknown' };

/**
 * Follows a sign-up's link: with the password chosen at sign-up (so whoever only reads the
 * mailbox cannot create, by one click, an account whose password someone else chose), uses the
 * link and creates the user, address confirmed, and the organization they own. 'unknown': the
 * link is unknown, expired, replaced or used a moment ago by another request (the DELETE decides).
 * A ConflictError when an account took the address since (an invitation, the operator).
 */
export async function completeSignUp(db: DB, token: unknown, password: string): Promise<CompletedSignUp> {
  const pending = await findPendingSignUp(db, token);
  if (!pending || typeof token !== 'string') return { outcome: 'unknown' };
  // argon2 before the transaction: on the embedded database it would hold the only connection.
  if (!(await verifyPassword(pending.password_hash, password))) return { outcome: 'wrong_password' };
  return inTransaction(db, async (trx) => {
    const used = await trx
      .deleteFrom('pending_sign_ups')
      .where('token_hash', '=', sha256Hex(token))
      .where('expires_at', '>', sql<Date>`now()`)
      .returning(['token_hash', 'email', 'name', 'organization_name', 'return_to', 'password_hash'])
      .executeTakeFirst();
    if (!used || !secretMatches(token, used.token_hash)) return { outcome: 'unknown' } as const;
    // The link came to the address: it is confirmed.
    const user = await insertUser(trx, { email: used.email, name: used.name, passwordHash: used.password_hash, emailVerified: true });
    const org = await createOrganization(trx, { name: used.organization_name, ownerUserId: user.id });
    return { outcome: 'created', userId: user.id, organizationId: org.id, returnTo: used.return_to } as const;
  });
}
