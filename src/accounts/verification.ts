/**
 * Email verification: sign-up sends a link to the address; an email change sends one to the
 * new address and takes effect only when it is followed (the old address is told).
 * `users.email_verified_at` records it. Resending is throttled per user, in the database, so the
 * limit holds across instances.
 */
import { sql } from 'kysely';
import { recordAuditEvent } from '../audit/events.js';
import { type DB, inTransaction } from '../db/connect.js';
import { isUniqueViolation } from '../db/errors.js';
import { ConflictError } from '../errors.js';
import { TooManyAttemptsError } from '../oauth/errors.js';
import { emailChangedMessage, verifyEmailMessage } from '../mail/messages.js';
import { consumeAccountToken, endAccountTokens, findAccountToken, issueAccountToken, recentAccountTokens, VERIFY_EMAIL_TTL_S } from './account-tokens.js';
import type { MailDeps } from './invitations.js';
import { checkEmailMayLeaveDomain } from '../sso/required.js';

/** A verification link at most this often per user … */
export const VERIFY_RESEND_INTERVAL_S = 60;
/** … and at most this many an hour. */
export const VERIFY_SENDS_PER_HOUR = 5;

export function verificationLink(issuer: string, token: string): string {
  return `${issuer}/verify-email?token=${token}`;
}

/**
 * Queues a verification link for `email` (the user's address, or the new one they asked for)
 * in `trx`. Only the newest link works: one sent before, for another address, must not set
 * the account's address back. Call deps.mail.wake() after the commit.
 */
export async function queueVerification(trx: DB, deps: MailDeps, user: { id: number; name: string; email: string }, change: boolean): Promise<void> {
  await endAccountTokens(trx, user.id, 'verify_email');
  const token = await issueAccountToken(trx, { purpose: 'verify_email', userId: user.id, email: user.email, ttlSeconds: VERIFY_EMAIL_TTL_S });
  await deps.mail.queue(
    trx,
    verifyEmailMessage({ issuer: deps.issuer, to: user.email, name: user.name, link: verificationLink(deps.issuer, token), hours: VERIFY_EMAIL_TTL_S / 3600, change }),
  );
}

/** Seconds to wait before another link may be sent to this user, or 0. */
export async function verificationWait(db: DB, userId: number): Promise<number> {
  const { count, last } = await recentAccountTokens(db, userId, 'verify_email', 3600);
  if (last !== null) {
    const wait = Math.ceil(VERIFY_RESEND_INTERVAL_S - (Date.now() - last.getTime()) / 1000);
    if (wait > 0) return wait;
  }
  return count >= VERIFY_SENDS_PER_HOUR ? VERIFY_RESEND_INTERVAL_S * 5 : 0;
}

/**
 * Sends a new link (the Account page's "resend", or an email change to `newEmail`), unless
 * sent too recently (TooManyRequestsError). An address another account uses is a ConflictError.
 */
export async function sendVerification(db: DB, deps: MailDeps, userId: number, newEmail?: string): Promise<void> {
  const wait = await verificationWait(db, userId);
  if (wait > 0) throw new TooManyAttemptsError(wait, `A link was sent a moment ago. Wait ${wait} seconds before asking for another.`);
  await inTransaction(db, async (trx) => {
    const user = await trx.selectFrom('users').select(['id', 'name', 'email', 'email_verified_at']).where('id', '=', userId).executeTakeFirstOrThrow();
    const change = newEmail !== undefined && newEmail.toLowerCase() !== user.email.toLowerCase();
    if (change) {
      await checkEmailMayLeaveDomain(trx, user, newEmail);
      const taken = await trx.selectFrom('users').select('id').where(sql<string>`lower(email)`, '=', sql<string>`lower(${newEmail})`).executeTakeFirst();
      if (taken) throw new ConflictError('Another account uses this email address.');
    } else if (user.email_verified_at !== null) {
      throw new ConflictError('Your email address is already confirmed.');
    }
    await queueVerification(trx, deps, { id: user.id, name: user.name, email: change ? newEmail! : user.email }, change);
  });
  deps.mail.wake();
}

export interface ConfirmedEmail {
  userId: number;
  email: string;
  /** The address before, when the link changed it. */
  previousEmail?: string;
}

/**
 * Follows a verification link, signed in as `userId`: the address becomes the account's,
 * verified. Undefined when the link is unknown, expired, used or another account's; a
 * ConflictError when another account took the address since.
 */
export async function confirmEmail(db: DB, deps: MailDeps, token: unknown, userId: number): Promise<ConfirmedEmail | undefined> {
  const confirmed = await inTransaction(db, async (trx) => {
    // Another account's link is unknown here, and stays unused.
    const pending = await findAccountToken(trx, 'verify_email', token);
    if (!pending || pending.user_id !== userId) return undefined;
    const used = await consumeAccountToken(trx, 'verify_email', token);
    if (!used) return undefined;
    const user = await trx.selectFrom('users').select(['id', 'name', 'email']).where('id', '=', used.user_id).forUpdate().executeTakeFirstOrThrow();
    const change = user.email !== used.email;
    // Asked for before the organization required SSO, or before the user joined it: checked again.
    if (change) await checkEmailMayLeaveDomain(trx, user, used.email);
    try {
      await trx
        .updateTable('users')
        .set({ email: used.email, email_verified_at: sql`now()`, ...(change ? { updated_at: new Date() } : {}) })
        .where('id', '=', user.id)
        .execute();
    } catch (err) {
      if (isUniqueViolation(err)) throw new ConflictError('Another account has started using this email address since the link was sent.');
      throw err;
    }
    if (!change) return { userId: user.id, email: used.email };
    // A reset link sent to the old address must not outlive the change.
    await endAccountTokens(trx, user.id, 'reset_password');
    const orgs = await trx.selectFrom('memberships').select('organization_id').where('user_id', '=', user.id).execute();
    for (const { organization_id: organizationId } of orgs) {
      await recordAuditEvent(trx, { organizationId, action: 'user.email_changed', actor: { actorUserId: user.id }, details: { user_id: user.id, from: user.email, to: used.email } });
    }
    // The old address hears of it: if someone else made the change, its owner can act.
    await deps.mail.queue(trx, emailChangedMessage({ issuer: deps.issuer, to: user.email, name: user.name, newEmail: used.email }));
    return { userId: user.id, email: used.email, previousEmail: user.email };
  });
  if (confirmed?.previousEmail !== undefined) deps.mail.wake();
  return confirmed;
}
