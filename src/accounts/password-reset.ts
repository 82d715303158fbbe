/**
 * Password reset by email.
 *
 * requestPasswordReset runs after the page has answered (BackgroundTasks), so the answer is the
 * same, and takes the same time, whether or not the address has an account. A link works once
 * and for RESET_PASSWORD_TTL_S; at most RESETS_PER_HOUR links go to one account an hour,
 * whichever instance is asked (counted in the database), on top of the page's own throttles.
 * Resetting ends every session of the user and every other link sent to them, verifies the
 * address (the link came to it), and is audited in each of their organizations.
 */
import { sql } from 'kysely';
import { recordAuditEvent } from '../audit/events.js';
import { type DB, inTransaction } from '../db/connect.js';
import { resetPasswordMessage, ssoRequiredMessage } from '../mail/messages.js';
import { findSsoRoute } from '../sso/domains.js';
import { consumeAccountToken, issueAccountToken, recentAccountTokens, RESET_PASSWORD_TTL_S } from './account-tokens.js';
import type { MailDeps } from './invitations.js';
import { findUserByEmail, setPassword } from './users.js';

export const RESETS_PER_HOUR = 3;

export function resetLink(issuer: string, token: string): string {
  return `${issuer}/reset-password?token=${token}`;
}

/** Queues a reset link for the account with this address, if there is one. Returns whether a link was queued (for the log only). */
export async function requestPasswordReset(db: DB, deps: MailDeps, email: string): Promise<'queued' | 'no_account' | 'throttled' | 'sso_required'> {
  const user = await findUserByEmail(db, email);
  if (!user) return 'no_account';
  // An organization that requires its SSO for this address: no link that could set a password,
  // a pointer to the company sign-in instead (as often as a link would go).
  const route = await findSsoRoute(db, user.email);
  const ssoRequired = route?.ssoRequired === true ? await db.selectFrom('organizations').select('name').where('id', '=', route.organizationId).executeTakeFirst() : undefined;
  const queued = await inTransaction(db, async (trx) => {
    // Locked, so two requests for the same account cannot both pass the hourly count, and read
    // again under the lock: an email change that committed meanwhile decides the address.
    const locked = await trx
      .selectFrom('users')
      .select(['id', 'email', 'name'])
      .where('id', '=', user.id)
      .where(sql<string>`lower(email)`, '=', sql<string>`lower(${email.trim()})`)
      .forUpdate()
      .executeTakeFirst();
    if (!locked) return false;
    const { count } = await recentAccountTokens(trx, locked.id, 'reset_password', 3600);
    if (count >= RESETS_PER_HOUR) return false;
    if (ssoRequired) {
      // Counted as a link would be (the hourly cap), but the token is never sent: it resets nothing.
      await issueAccountToken(trx, { purpose: 'reset_password', userId: locked.id, email: locked.email, ttlSeconds: 1 });
      await deps.mail.queue(trx, ssoRequiredMessage({ issuer: deps.issuer, to: locked.email, name: locked.name, organizationName: ssoRequired.name, link: `${deps.issuer}/login?login_hint=${encodeURIComponent(locked.email)}` }));
      return 'sso_required';
    }
    const token = await issueAccountToken(trx, { purpose: 'reset_password', userId: locked.id, email: locked.email, ttlSeconds: RESET_PASSWORD_TTL_S });
    await deps.mail.queue(
      trx,
      resetPasswordMessage({ issuer: deps.issuer, to: locked.email, name: locked.name, link: resetLink(deps.issuer, token), minutes: RESET_PASSWORD_TTL_S / 60 }),
    );
    return true;
  });
  if (queued === false) return 'throttled';
  deps.mail.wake();
  return queued === 'sso_required' ? 'sso_required' : 'queued';
}

/**
 * Sets the new password (already hashed: argon2 runs before the transaction) if the link is
 * still good; returns the user's id, or undefined for a link that is unknown, expired or used.
 */
export async function resetPassword(db: DB, token: unknown, passwordHash: string): Promise<number | undefined> {
  return inTransaction(db, async (trx) => {
    const used = await consumeAccountToken(trx, 'reset_password', token);
    if (!used) return undefined;
    // A link sent to an address the account no longer has resets nothing.
    const current = await trx.selectFrom('users').select(sql<boolean>`lower(email) = lower(${used.email})`.as('same')).where('id', '=', used.user_id).forUpdate().executeTakeFirst();
    if (!current?.same) return undefined;
    await setPassword(trx, used.user_id, passwordHash);
    // The link came to the account's address: it is theirs.
    await trx.updateTable('users').set({ email_verified_at: sql`coalesce(email_verified_at, now())` }).where('id', '=', used.user_id).execute();
    await trx.deleteFrom('sessions').where('user_id', '=', used.user_id).execute();
    const orgs = await trx.selectFrom('memberships').select('organization_id').where('user_id', '=', used.user_id).execute();
    for (const { organization_id: organizationId } of orgs) {
      await recordAuditEvent(trx, { organizationId, action: 'user.password_reset', actor: { actorUserId: used.user_id }, details: { user_id: used.user_id } });
    }
    return used.user_id;
  });
}
