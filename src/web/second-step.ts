/**
 * The second step of signing in: after the password, a user with a second factor types a code
 * from their authenticator app or a recovery code (or uses a passkey: passkey-pages.ts). Until
 * then the browser holds only a pending sign-in (accounts/pending-sign-ins.ts), which no page
 * that needs a session accepts (MF-2).
 *
 * The same page raises a signed-in session that has only a password (an application asked for
 * two factors with acr_values, or an organization requires them): a session made before the
 * user set up a factor, or after an administrator reset them. Success then starts a new session
 * (a new id for a higher assurance) with both factors in its amr.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { findPendingSignIn, endPendingSignIn, type PendingSignIn } from '../accounts/pending-sign-ins.js';
import { factorSummary, type FactorUser, hasSecondFactor, verifySecondStepCode } from '../accounts/second-factors.js';
import { CSRF_FAILED, type CsrfBinding, csrfToken, csrfTokenMatches, currentUser, ensurePreSession, preSessionBinding, raisedSession, safeReturnTo, type SessionUser, withSecondFactor } from '../accounts/sessions.js';
import type { Config } from '../config.js';
import type { DB } from '../db/connect.js';
import { ConflictError, ForbiddenError } from '../errors.js';
import type { MailOutbox } from '../mail/outbox.js';
import { readParams } from '../oauth/helpers/params.js';
import { beginSession } from './begin-session.js';
import { renderPage } from './render.js';

export const SECOND_STEP_PATH = '/login/second-step';

/** Where a signed-in user with only a password goes to add the second step, coming back to `returnTo`. */
export function stepUpPath(returnTo: string): string {
  return `${SECOND_STEP_PATH}?${new URLSearchParams({ return_to: returnTo }).toString()}`;
}

/**
 * Where a signed-in user goes when something needs two factors and their session has a
 * password alone: the second step, or (no factor yet) the Account page to set one up; either
 * comes back to `returnTo`.
 */
export function twoFactorsPath(hasFactor: boolean, returnTo: string): string {
  return hasFactor ? stepUpPath(returnTo) : `/dashboard/account?${new URLSearchParams({ return_to: returnTo }).toString()}`;
}

/** Who is taking the second step: a pending sign-in (after the password), or a signed-in session raising itself. */
export type SecondStepSubject =
  | { kind: 'pending'; pending: PendingSignIn & { userId: number }; user: FactorUser; amr: string[]; returnTo: string }
  | { kind: 'session'; session: SessionUser; user: FactorUser; amr: string[]; returnTo: string };

export async function findSecondStepSubject(db: DB, config: Config, req: FastifyRequest, returnTo: unknown): Promise<SecondStepSubject | undefined> {
  const pending = await findPendingSignIn(db, config, req);
  if (pending && pending.userId !== null) {
    const user = await db.selectFrom('users').select(['id', 'email', 'name']).where('id', '=', pending.userId).executeTakeFirst();
    if (user) return { kind: 'pending', pending: { ...pending, userId: pending.userId }, user, amr: pending.amr, returnTo: pending.returnTo };
  }
  const session = await currentUser(db, config, req);
  if (!session) return undefined;
  return { kind: 'session', session, user: { id: session.userId, email: session.email, name: session.name }, amr: session.amr, returnTo: safeReturnTo(returnTo) };
}

/** The CSRF binding of the second-step forms: the pre-session cookie before sign-in, the session for a step-up. */
function binding(req: FastifyRequest, reply: FastifyReply, config: Config, subject: SecondStepSubject) {
  return subject.kind === 'session' ? { session: subject.session.sessionId } : { preSession: ensurePreSession(req, reply, config) };
}

/** The CSRF binding a second-step request must match: the session for a step-up, the pre-session cookie otherwise. */
export function secondStepCsrfBinding(req: FastifyRequest, config: Config, subject: SecondStepSubject): CsrfBinding | undefined {
  return subject.kind === 'session' ? { session: subject.session.sessionId } : preSessionBinding(req, config);
}

/**
 * Finishes the sign-in with the second factor given: a new session, the pending one (if any)
 * ended first so it is used once. `json`: answered to a page script (passkey-pages.ts).
 */
export async function finishSecondStep(db: DB, config: Config, req: FastifyRequest, reply: FastifyReply, subject: SecondStepSubject, method: readonly string[], json = false) {
  if (subject.kind === 'pending' && !(await endPendingSignIn(db, config, reply, subject.pending.idHash))) {
    // Another request finished (or cancelled) this sign-in first.
    if (json) throw new ConflictError(SIGN_IN_FINISHED);
    return reply.redirect('/login', 303);
  }
  // A pending sign-in is a password's or a social connection's (no SSO: an organization's identity
  // provider's sign-in never waits here), and the session keeps that connection; a session raising
  // itself stays the sign-in it was, its connections included (SS-4).
  const raised =
    subject.kind === 'session'
      ? raisedSession(subject.session, method)
      : { userId: subject.user.id, amr: withSecondFactor(subject.amr, method), ...(subject.pending.socialConnectionId !== null ? { socialConnectionId: subject.pending.socialConnectionId } : {}) };
  return beginSession(db, config, req, reply, { ...raised, returnTo: subject.returnTo, json });
}

/** What the loser of two racing finishes of one sign-in is told. */
export const SIGN_IN_FINISHED = 'This sign-in was finished or cancelled already. Sign in again.';

export async function secondStepPages(app: FastifyInstance, deps: { db: DB; config: Config; mail: MailOutbox }): Promise<void> {
  const { db, config } = deps;
  const factorDeps = { secretKey: config.secretKey, issuer: config.issuer, mail: deps.mail };

  async function render(req: FastifyRequest, reply: FastifyReply, status: number, subject: SecondStepSubject, view: { error?: string } = {}) {
    const summary = await factorSummary(db, subject.user.id);
    if (!hasSecondFactor(summary)) {
      // A step-up asked of someone with nothing to step up with: set one up first.
      return renderPage(reply, 403, 'message', {
        title: 'Two-step sign-in needed',
        message: 'This needs two-step sign-in, and your account has no second factor yet. Set up an authenticator app or a passkey on your account page, then try again.',
        link: { href: `/dashboard/account?${new URLSearchParams({ return_to: subject.returnTo }).toString()}`, label: 'Set up two-step sign-in' },
      });
    }
    return renderPage(reply, status, 'second-step', {
      title: 'Two-step sign-in',
      csrfToken: csrfToken(config, binding(req, reply, config, subject)),
      returnTo: subject.returnTo,
      totp: summary.totp,
      recoveryCodes: summary.recoveryCodesLeft > 0,
      passkeys: summary.passkeys > 0,
      notice: subject.kind === 'session' ? 'This asks you to confirm it is you with your second factor.' : '',
      error: view.error ?? '',
    });
  }

  app.get(SECOND_STEP_PATH, async (req, reply) => {
    const query = req.query as Record<string, unknown> | undefined;
    const subject = await findSecondStepSubject(db, config, req, query?.return_to);
    if (!subject) return reply.redirect('/login', 303);
    // A session that already has two factors has nothing to add.
    if (subject.kind === 'session' && subject.amr.includes('mfa')) return reply.redirect(subject.returnTo, 303);
    return render(req, reply, 200, subject);
  });

  app.post(SECOND_STEP_PATH, async (req, reply) => {
    const form = readParams(req.body);
    const subject = await findSecondStepSubject(db, config, req, form.return_to);
    if (!subject) return reply.redirect('/login', 303);
    if (!csrfTokenMatches(config, secondStepCsrfBinding(req, config, subject), form.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
    const method = await verifySecondStepCode(db, factorDeps, subject.user, form.code ?? '');
    if (method === undefined) {
      req.log.info({ user_id: subject.user.id }, 'second step refused');
      return render(req, reply, 400, subject, { error: 'That code is not right, or it was used already. Try the current code from your app, or a recovery code.' });
    }
    req.log.info({ user_id: subject.user.id, method }, 'second step taken');
    // RFC 8176: a recovery code is a one-time password too.
    return finishSecondStep(db, config, req, reply, subject, ['otp']);
  });

  app.post(`${SECOND_STEP_PATH}/cancel`, async (req, reply) => {
    const form = readParams(req.body);
    const pending = await findPendingSignIn(db, config, req);
    if (pending) {
      if (!csrfTokenMatches(config, preSessionBinding(req, config), form.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
      await endPendingSignIn(db, config, reply, pending.idHash);
    }
    return reply.redirect('/login', 303);
  });
}
