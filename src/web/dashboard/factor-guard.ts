/**
 * Who may change how an account signs in (add or remove a factor, make new recovery codes):
 *
 * - a user who has a second factor, only from a session that used it (two factors): a session
 *   with a password alone (from before the factor, or a stolen one) takes the second step first,
 *   so a password never removes or replaces the factor that protects the account;
 * - and the password again (form field current_password), unless the session signed in within
 *   RECENT_SIGN_IN_MS. Wrong passwords here are throttled per user, as at sign-in.
 *
 * The first factor of an account has nothing to step up with: the password (or a fresh sign-in)
 * is all there is.
 */
import { factorSummary, hasSecondFactor } from '../../accounts/second-factors.js';
import { signedInRecently, signedInWithTwoFactors, type SessionUser } from '../../accounts/sessions.js';
import { passwordMatches } from '../../accounts/users.js';
import type { DB } from '../../db/connect.js';
import { FailureThrottle } from '../../lib/throttle.js';
import { TooManyAttemptsError } from '../../oauth/errors.js';
import { LOGIN_MAX_FAILURES_PER_EMAIL, LOGIN_WINDOW_MS } from '../sign-in.js';

export type FactorChangeCheck = 'ok' | 'second_step' | 'wrong_password';

export const WRONG_PASSWORD = 'Enter your current password to change how you sign in.';
export const SECOND_STEP_FIRST = 'Confirm it is you with your second factor first.';

export class FactorChangeGuard {
  private readonly wrongPasswords = new FailureThrottle(LOGIN_MAX_FAILURES_PER_EMAIL, LOGIN_WINDOW_MS);

  constructor(private readonly db: DB) {}

  async check(session: SessionUser, password: string | undefined): Promise<FactorChangeCheck> {
    if (!signedInWithTwoFactors(session) && hasSecondFactor(await factorSummary(this.db, session.userId))) return 'second_step';
    if (signedInRecently(session)) return 'ok';
    // No password given is no guess: the page asks for it.
    if (password === undefined || password === '') return 'wrong_password';
    const key = String(session.userId);
    const wait = this.wrongPasswords.retryAfter(key);
    if (wait > 0) throw new TooManyAttemptsError(wait, 'Too many wrong passwords. Please wait and try again later.');
    if (await passwordMatches(this.db, session.userId, password)) {
      this.wrongPasswords.reset(key);
      return 'ok';
    }
    this.wrongPasswords.recordFailure(key);
    return 'wrong_password';
  }
}
