/**
 * The Account page's passkeys: add one (a WebAuthn registration ceremony, two JSON requests from
 * the page script: options, then the browser's response) and remove one (a form). Both need the
 * password again unless the session signed in a moment ago, and are recorded on the account and
 * mailed (accounts/passkeys.ts). The registration challenge lives in the session (single use).
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { addPasskey, passkeyNameSchema, registrationOptions, registrationResponseSchema, removePasskey } from '../../accounts/passkeys.js';
import { PASSWORD_MAX_LENGTH } from '../../accounts/passwords.js';
import { csrfTokenMatches, raisedSession, safeReturnTo } from '../../accounts/sessions.js';
import { ForbiddenError, InvalidRequestError, NotFoundError } from '../../errors.js';
import { answerErrorsAsJson, csrfHeader, parseBody } from '../passkey-pages.js';
import { replaceSession } from '../begin-session.js';
import { stepUpPath } from '../second-step.js';
import { accountPageRenderer } from './account.js';
import type { DashboardDeps } from './applications.js';
import { CSRF_FAILED, type DashboardContext, dashboardContext, parseId, readForm } from './context.js';
import { type FactorChangeGuard, SECOND_STEP_FIRST, WRONG_PASSWORD } from './factor-guard.js';
import { ACCOUNT_PATH } from './two-step.js';
import { setNotice } from './notice.js';

const password = z.string().max(PASSWORD_MAX_LENGTH).optional();
const optionsBody = z.object({ current_password: password });
const addBody = z.object({ response: registrationResponseSchema, name: passkeyNameSchema.default('Passkey'), current_password: password, return_to: z.string().max(8192).optional() });

export async function passkeyRoutes(app: FastifyInstance, deps: DashboardDeps & { factorGuard: FactorChangeGuard }): Promise<void> {
  const { db, config, factorGuard } = deps;
  const renderAccount = accountPageRenderer(deps);
  const passkeyDeps = { issuer: config.issuer, secretKey: config.secretKey, mail: deps.mail };
  const userOf = (ctx: DashboardContext) => ({ id: ctx.session.userId, email: ctx.session.email, name: ctx.session.name });

  app.post<{ Params: { id: string } }>('/dashboard/account/passkeys/:id/remove', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = dashboardContext(req);
    if (!csrfTokenMatches(config, { session: ctx.session.sessionId }, params.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
    const check = await factorGuard.check(ctx.session, params.current_password);
    if (check === 'second_step') return reply.redirect(stepUpPath(ACCOUNT_PATH), 303);
    if (check === 'wrong_password') return renderAccount(reply, 400, ctx, { twoStepError: WRONG_PASSWORD });
    const id = parseId(req.params.id);
    try {
      if (id === undefined) throw new NotFoundError('There is no such passkey on your account.');
      const name = await removePasskey(db, passkeyDeps, userOf(ctx), id);
      req.log.info({ user_id: ctx.session.userId, passkey_id: id }, 'passkey removed');
      return await renderAccount(reply, 200, ctx, { message: `The passkey "${name}" was removed.` });
    } catch (err) {
      if (!(err instanceof NotFoundError)) throw err;
      return renderAccount(reply, 404, ctx, { twoStepError: err.description });
    }
  });

  await app.register(async (json) => {
    answerErrorsAsJson(json);

    /** The session's CSRF token (header), and factor-guard.ts's rule: a two-factor session for an account that has a factor, the password unless the session is fresh. */
    async function guard(req: FastifyRequest, currentPassword: string | undefined): Promise<DashboardContext> {
      const ctx = dashboardContext(req);
      if (!csrfTokenMatches(config, { session: ctx.session.sessionId }, csrfHeader(req))) throw new ForbiddenError(CSRF_FAILED);
      const check = await factorGuard.check(ctx.session, currentPassword);
      if (check === 'second_step') throw new ForbiddenError(SECOND_STEP_FIRST);
      if (check === 'wrong_password') throw new InvalidRequestError(WRONG_PASSWORD);
      return ctx;
    }

    json.post('/dashboard/account/passkeys/options', async (req) => {
      const body = parseBody(optionsBody, req.body);
      const ctx = await guard(req, body.current_password);
      return registrationOptions(db, passkeyDeps, userOf(ctx), ctx.session.sessionId);
    });

    json.post('/dashboard/account/passkeys', async (req, reply) => {
      const body = parseBody(addBody, req.body);
      // Checked again here (not only for the options): this is the request that changes the account.
      const ctx = await guard(req, body.current_password);
      const added = await addPasskey(db, passkeyDeps, userOf(ctx), ctx.session.sessionId, body.response, body.name);
      // The new passkey verified the user: as with a new authenticator app's first code, the
      // browser now has two factors, in a new session (new id).
      const sessionId = await replaceSession(db, config, req, reply, raisedSession(ctx.session, [added.backedUp ? 'swk' : 'hwk']));
      req.log.info({ user_id: ctx.session.userId, passkey_id: added.id }, 'passkey added');
      // The page the script goes to says so (notice.ts).
      setNotice(reply, config, sessionId, `The passkey "${body.name}" was added.`);
      const returnTo = safeReturnTo(body.return_to, '');
      const redirect = returnTo ? `/dashboard/account?${new URLSearchParams({ return_to: returnTo }).toString()}` : '/dashboard/account';
      // A first factor's recovery codes, shown once by the page script before it goes on.
      return added.recoveryCodes.length > 0 ? { redirect, recovery_codes: added.recoveryCodes } : { redirect };
    });
  });
}
