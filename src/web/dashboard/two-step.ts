/**
 * The Account page's two-step sign-in: set up and remove an authenticator app, make new
 * recovery codes. Each change needs the password again unless the session signed in a moment
 * ago (sessions.ts signedInRecently), is recorded on the account and mailed to the user
 * (accounts/second-factors.ts). Passkeys are passkeys.ts.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { confirmTotp, pendingTotpEnrolment, regenerateRecoveryCodes, removeTotp, startTotpEnrolment } from '../../accounts/second-factors.js';
import { csrfTokenMatches, identityConfirmed, raiseSessionAmr } from '../../accounts/sessions.js';
import { ConflictError, ForbiddenError, NotFoundError } from '../../errors.js';
import type { Params } from '../../oauth/helpers/params.js';
import { withSecondFactor } from '../second-step.js';
import { accountPageRenderer } from './account.js';
import type { DashboardDeps } from './applications.js';
import { CSRF_FAILED, type DashboardContext, dashboardContext, readForm } from './context.js';

/** What a change to how the account signs in says when the password was needed and not right. */
export const WRONG_PASSWORD = 'Enter your current password to change how you sign in.';

export async function twoStepRoutes(app: FastifyInstance, deps: DashboardDeps): Promise<void> {
  const { db, config } = deps;
  const renderAccount = accountPageRenderer(deps);
  const factorDeps = { secretKey: config.secretKey, issuer: config.issuer, mail: deps.mail };

  /** The form's CSRF token, and the user it is for. */
  function guard(req: FastifyRequest): { ctx: DashboardContext; params: Params; user: { id: number; email: string; name: string } } {
    const { params } = readForm(req.body);
    const ctx = dashboardContext(req);
    if (!csrfTokenMatches(config, { session: ctx.session.sessionId }, params.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
    return { ctx, params, user: { id: ctx.session.userId, email: ctx.session.email, name: ctx.session.name } };
  }


  /** A refusal the user can act on (already set up, nothing to remove) is shown on the page. */
  const refusal = (err: unknown) => (err instanceof ConflictError || err instanceof NotFoundError ? err.description : undefined);

  app.post('/dashboard/account/totp', async (req, reply) => {
    const { ctx, params, user } = guard(req);
    const returnTo = params.return_to;
    if (!(await identityConfirmed(db, ctx.session, params.current_password))) return renderAccount(reply, 400, ctx, { twoStepError: WRONG_PASSWORD, returnTo });
    try {
      const enrolment = await startTotpEnrolment(db, factorDeps, user);
      return renderAccount(reply, 200, ctx, { enrolment, returnTo });
    } catch (err) {
      const message = refusal(err);
      if (message === undefined) throw err;
      return renderAccount(reply, 409, ctx, { twoStepError: message, returnTo });
    }
  });

  app.post('/dashboard/account/totp/confirm', async (req, reply) => {
    const { ctx, params, user } = guard(req);
    const returnTo = params.return_to;
    const code = params.code ?? '';
    let codes: string[] | undefined;
    try {
      codes = code.length <= 64 ? await confirmTotp(db, factorDeps, user, code) : undefined;
    } catch (err) {
      const message = refusal(err);
      if (message === undefined) throw err;
      return renderAccount(reply, 409, ctx, { twoStepError: message, returnTo });
    }
    if (codes === undefined) {
      return renderAccount(reply, 400, ctx, {
        twoStepError: 'That code is not right. Type the 6-digit code your app shows now.',
        enrolment: await pendingTotpEnrolment(db, factorDeps, user),
        returnTo,
      });
    }
    // A correct code from the new app is a second step: this session now has two factors.
    const amr = withSecondFactor(ctx.session.amr, ['otp']);
    await raiseSessionAmr(db, ctx.session.sessionId, amr);
    req.log.info({ user_id: user.id }, 'authenticator app added');
    return renderAccount(reply, 200, { ...ctx, session: { ...ctx.session, amr } }, {
      message: 'Two-step sign-in is on: from now on you sign in with your password and a code from your app.',
      recoveryCodes: codes,
      returnTo,
    });
  });

  app.post('/dashboard/account/totp/remove', async (req, reply) => {
    const { ctx, params, user } = guard(req);
    if (!(await identityConfirmed(db, ctx.session, params.current_password))) return renderAccount(reply, 400, ctx, { twoStepError: WRONG_PASSWORD });
    try {
      await removeTotp(db, factorDeps, user);
    } catch (err) {
      const message = refusal(err);
      if (message === undefined) throw err;
      return renderAccount(reply, 409, ctx, { twoStepError: message });
    }
    req.log.info({ user_id: user.id }, 'authenticator app removed');
    return renderAccount(reply, 200, ctx, { message: 'The authenticator app was removed.' });
  });

  app.post('/dashboard/account/recovery-codes', async (req, reply) => {
    const { ctx, params, user } = guard(req);
    if (!(await identityConfirmed(db, ctx.session, params.current_password))) return renderAccount(reply, 400, ctx, { twoStepError: WRONG_PASSWORD });
    try {
      const codes = await regenerateRecoveryCodes(db, factorDeps, user);
      return renderAccount(reply, 200, ctx, { message: 'New recovery codes were made; the old ones no longer work.', recoveryCodes: codes });
    } catch (err) {
      const message = refusal(err);
      if (message === undefined) throw err;
      return renderAccount(reply, 409, ctx, { twoStepError: message });
    }
  });
}
