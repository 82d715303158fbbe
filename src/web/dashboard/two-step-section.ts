/** The Account page's "Two-step sign-in" section: what the user has, and what this request started or made. */
import { factorSummary, hasSecondFactor, pendingTotpEnrolment, type TotpEnrolment } from '../../accounts/second-factors.js';
import { safeReturnTo, signedInRecently, signedInWithTwoFactors } from '../../accounts/sessions.js';
import { listAccountEvents } from '../../audit/events.js';
import type { DB } from '../../db/connect.js';
import type { DashboardDeps } from './applications.js';
import type { DashboardContext } from './context.js';
import { stepUpPath } from '../second-step.js';

/** What the Account page's security activity says for each account event. */
const EVENT_LABELS: Record<string, string> = {
  'second_factor.totp_added': 'Authenticator app added',
  'second_factor.totp_removed': 'Authenticator app removed',
  'second_factor.recovery_codes_regenerated': 'New recovery codes made',
  'second_factor.recovery_code_used': 'Signed in with a recovery code',
  'second_factor.locked': 'Second step locked after too many wrong codes',
  'second_factor.reset_by_administrator': 'Second factors removed by an administrator',
  'passkey.added': 'Passkey added',
  'passkey.removed': 'Passkey removed',
  'passkey.counter_regression': 'A passkey sign-in was refused: its counter went backwards (a copied passkey?)',
};

export interface TwoStepView {
  /** An authenticator-app enrolment to show: its secret, otpauth:// URI and QR code. */
  enrolment?: TotpEnrolment | undefined;
  /** New recovery codes, shown this once. */
  recoveryCodes?: string[] | undefined;
  /** Where to go on once two-step sign-in is set up (an application or an organization asked for it). */
  returnTo?: unknown;
  twoStepError?: string | undefined;
}

export async function twoStepSection(db: DB, deps: Pick<DashboardDeps, 'config' | 'mail'>, ctx: DashboardContext, view: TwoStepView) {
  const userId = ctx.session.userId;
  const user = { id: userId, email: ctx.session.email, name: ctx.session.name };
  const summary = await factorSummary(db, userId);
  const factorDeps = { secretKey: deps.config.secretKey, issuer: deps.config.issuer, mail: deps.mail };
  const passkeys = await db
    .selectFrom('passkeys')
    .select(['id', 'name', 'created_at', 'last_used_at', 'backed_up'])
    .where('user_id', '=', userId)
    .orderBy('id')
    .execute();
  const returnTo = safeReturnTo(view.returnTo, '');
  return {
    summary,
    enabled: hasSecondFactor(summary),
    passkeys,
    enrolment: view.enrolment ?? (summary.totp ? undefined : await pendingTotpEnrolment(db, factorDeps, user, ctx.session.sessionId)),
    recoveryCodes: view.recoveryCodes ?? [],
    error: view.twoStepError ?? '',
    // The password is asked again for changes, unless the session signed in a moment ago.
    needsPassword: !signedInRecently(ctx.session),
    sessionHasTwoFactors: signedInWithTwoFactors(ctx.session),
    // Changes to the factors of an account that has one take a two-factor session (factor-guard.ts).
    secondStepFirst: hasSecondFactor(summary) && !signedInWithTwoFactors(ctx.session) ? stepUpPath('/dashboard/account') : '',
    requiredBy: ctx.organizations.filter((o) => o.requireMfa).map((o) => o.name),
    returnTo,
    events: (await listAccountEvents(db, userId, 20)).map((e) => ({ ...e, label: EVENT_LABELS[e.action] ?? e.action })),
  };
}
