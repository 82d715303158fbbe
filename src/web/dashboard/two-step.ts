/**
 * The Account page's two-step sign-in: set up and remove an authenticator app, make new
 * recovery codes. Who may change them is factor-guard.ts (a user with a factor only from a
 * two-factor session; the password again unless the session signed in a moment ago). Each
 * change is recorded on the account and mailed to the user (accounts/second-factors.ts).
 * Passkeys are passkeys.ts.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { confirmTotp, pendingTotpEnrolment, regenerateRecoveryCodes, removeTotp, startTotpEnrolment } from '../../accounts/second-factors.js';
import { csrfToken, csrfTokenMatches, raisedSession, safeReturnTo } from '../../accounts/sessions.js';
import { ConflictError, ForbiddenError, NotFoundError } from '../../errors.js';
import type { Params } from '../../oauth/helpers/params.js';
import { replaceSession } from '../begin-session.js';
import { stepUpPath } from '../second-step.js';
import { accountPageRenderer, type AccountView } from './account.js';
import type { DashboardDeps } from './applications.js';
import { CSRF_FAILED, type DashboardContext, dashboardContext, readForm } from './context.js';
import { type FactorChangeGuard, WRONG_PASSWORD } from './factor-guard.js';

export const ACCOUNT_PATH = '/dashboard/account';

export async function twoStepRoutes(app: FastifyInstance, deps: DashboardDeps & { factorGuard: FactorChangeGuard }): Promise<void> {
  const { db, config, factorGuard } = deps;
  const renderAccount = accountPageRenderer(deps);
  const factorDeps = { secretKey: config.secretKey, issuer: config.issuer, mail: deps.mail };

  /** The form's CSRF token, and the user it is for. */
  function formOf(req: FastifyRequest): { ctx: DashboardContext; params: Params; user: { id: number; email: string; name: string } } {
    const { params } = readForm(req.body);
    const ctx = dashboardContext(req);
    if (!csrfTokenMatches(config, { session: ctx.session.sessionId }, params.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
    return { ctx, params, user: { id: ctx.session.userId, email: ctx.session.email, name: ctx.session.name } };
  }

  /**
   * A change to the account's factors, once factor-guard.ts allows it: to the second step first
   * (back to the Account page), or the page again asking for the password.
   */
  async function guarded(reply: FastifyReply, ctx: DashboardContext, params: Params, change: () => Promise<FastifyReply>, view: AccountView = {}) {
    const check = await factorGuard.check(ctx.session, params.current_password);
    if (check === 'second_step') return reply.redirect(stepUpPath(ACCOUNT_PATH), 303);
    if (check === 'wrong_password') return renderAccount(reply, 400, ctx, { ...view, twoStepError: WRONG_PASSWORD });
    try {
      return await change();
    } catch (err) {
      // A refusal the user can act on (already set up, nothing to remove) is shown on the page.
      if (!(err instanceof ConflictError || err instanceof NotFoundError)) throw err;
      return renderAccount(reply, err instanceof NotFoundError ? 404 : 409, ctx, { ...view, twoStepError: err.description });
    }
  }

  app.post(`${ACCOUNT_PATH}/totp`, async (req, reply) => {
    const { ctx, params, user } = formOf(req);
    const returnTo = params.return_to;
    return guarded(reply, ctx, params, async () => renderAccount(reply, 200, ctx, { enrolment: await startTotpEnrolment(db, factorDeps, user, ctx.session.sessionId), returnTo }), { returnTo });
  });

  // Confirming needs no password again: only the session that started the enrolment (with it) gets here.
  app.post(`${ACCOUNT_PATH}/totp/confirm`, async (req, reply) => {
    const { ctx, params, user } = formOf(req);
    const returnTo = params.return_to;
    let codes: string[] | undefined;
    try {
      codes = await confirmTotp(db, factorDeps, user, ctx.session.sessionId, params.code ?? '');
    } catch (err) {
      if (!(err instanceof ConflictError)) throw err;
      return renderAccount(reply, 409, ctx, { twoStepError: err.description, returnTo });
    }
    if (codes === undefined) {
      return renderAccount(reply, 400, ctx, {
        twoStepError: 'That code is not right. Type the 6-digit code your app shows now.',
        enrolment: await pendingTotpEnrolment(db, factorDeps, user, ctx.session.sessionId),
        returnTo,
      });
    }
    // A correct code from the new app is a second step: a new session (new id) with two factors.
    const next = raisedSession(ctx.session, ['otp']);
    const sessionId = await replaceSession(db, config, req, reply, next);
    req.log.info({ user_id: user.id }, 'authenticator app added');
    const raised = { ...ctx, session: { ...ctx.session, sessionId, amr: next.amr, authTime: new Date() }, csrfToken: csrfToken(config, { session: sessionId }) };
    return renderAccount(reply, 200, raised, {
      message: 'Two-step sign-in is on: from now on you sign in with your password and a code from your app.',
      recoveryCodes: codes,
      returnTo: safeReturnTo(returnTo, ''),
    });
  });

  app.post(`${ACCOUNT_PATH}/totp/remove`, async (req, reply) => {
    const { ctx, params, user } = formOf(req);
    return guarded(reply, ctx, params, async () => {
      await removeTotp(db, factorDeps, user);
      req.log.info({ user_id: user.id }, 'authenticator app removed');
      return renderAccount(reply, 200, ctx, { message: 'The authenticator app was removed.' });
    });
  });

  app.post(`${ACCOUNT_PATH}/recovery-codes`, async (req, reply) => {
    const { ctx, params, user } = formOf(req);
    return guarded(reply, ctx, params, async () =>
      renderAccount(reply, 200, ctx, { message: 'New recovery codes were made; the old ones no longer work.', recoveryCodes: await regenerateRecoveryCodes(db, factorDeps, user) }),
    );
  });
}
