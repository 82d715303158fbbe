/** The account page: change the password; the browser sessions, each with its own sign-out, and sign-out everywhere (else). */
import type { FastifyInstance, FastifyReply } from 'fastify';
import { hashPassword, PASSWORD_MAX_LENGTH, PASSWORD_MIN_LENGTH } from '../../accounts/passwords.js';
import { emailSchema, passwordMatches, setPassword } from '../../accounts/users.js';
import { sendVerification } from '../../accounts/verification.js';
import { clearSessionCookie, csrfTokenMatches, endOtherSessions, endSession, listSessions, SESSIONS_LISTED } from '../../accounts/sessions.js';
import { recordAuditEvent } from '../../audit/events.js';
import { inTransaction } from '../../db/connect.js';
import { ConflictError, ForbiddenError, NotFoundError } from '../../errors.js';
import { TooManyAttemptsError } from '../../oauth/errors.js';
import { sha256Hex } from '../../lib/crypto.js';
import { renderPage } from '../render.js';
import type { DashboardDeps } from './applications.js';
import { CSRF_FAILED, type DashboardContext, dashboardContext, readForm } from './context.js';
import { twoStepSection, type TwoStepView } from './two-step-section.js';
import { listSocialIdentities, unlinkSocialIdentity } from '../../social/identities.js';
import { stepUpPath } from '../second-step.js';
import { type FactorChangeGuard, WRONG_PASSWORD } from './factor-guard.js';
import { ACCOUNT_PATH } from './two-step.js';

/** What one rendering of the Account page adds to what it always shows. */
export interface AccountView extends TwoStepView {
  errors?: string[];
  message?: string;
  newEmail?: string;
}

export type AccountPageRenderer = (reply: FastifyReply, status: number, ctx: DashboardContext, view?: AccountView) => Promise<FastifyReply>;

/** Renders the Account page: what it always shows, and what this request adds (a message, errors, a started enrolment, new recovery codes). */
export function accountPageRenderer(deps: DashboardDeps): AccountPageRenderer {
  const { db } = deps;
  const page = async (ctx: DashboardContext, view: AccountView = {}) => {
    const current = sha256Hex(ctx.session.sessionId);
    const pending = await db
      .selectFrom('account_tokens')
      .select('email')
      .where('user_id', '=', ctx.session.userId)
      .where('purpose', '=', 'verify_email')
      .where('email', '!=', ctx.session.email)
      .where('used_at', 'is', null)
      .where('expires_at', '>', new Date())
      .orderBy('id', 'desc')
      .executeTakeFirst();
    const sessions = (await listSessions(db, ctx.session.userId)).map(({ id_hash: idHash, ...session }) => ({ ...session, current: idHash === current }));
    return {
      title: 'Account',
      ctx,
      active: 'account',
      errors: view.errors ?? [],
      message: view.message ?? '',
      passwordMinLength: PASSWORD_MIN_LENGTH,
      sessions,
      sessionsCapped: sessions.length === SESSIONS_LISTED,
      pendingEmail: pending?.email ?? '',
      newEmail: view.newEmail ?? '',
      twoStep: await twoStepSection(db, deps, ctx, view),
      socialIdentities: await listSocialIdentities(db, ctx.session.userId),
    };
  };
  return async (reply, status, ctx, view = {}) => renderPage(reply, status, 'dashboard/account', await page(ctx, view));
}

export async function accountRoutes(app: FastifyInstance, deps: DashboardDeps & { factorGuard: FactorChangeGuard }): Promise<void> {
  const { db, config, factorGuard } = deps;
  const mailDeps = { mail: deps.mail, issuer: config.issuer };
  const renderAccount = accountPageRenderer(deps);

  /** A refusal the user can act on is shown on the page; anything else goes to the error page. */
  const refusal = (err: unknown): string | undefined => (err instanceof ConflictError || err instanceof TooManyAttemptsError ? err.description : undefined);

  app.post('/dashboard/account/email/verify', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = dashboardContext(req);
    if (!csrfTokenMatches(config, { session: ctx.session.sessionId }, params.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
    try {
      await sendVerification(db, mailDeps, ctx.session.userId);
    } catch (err) {
      const message = refusal(err);
      if (message === undefined) throw err;
      return renderAccount(reply, err instanceof TooManyAttemptsError ? 429 : 409, ctx, { errors: [message] });
    }
    return renderAccount(reply, 200, ctx, { message: `We sent a new link to ${ctx.session.email}.` });
  });

  // A new address takes effect when its link is followed; the password guards against a borrowed session.
  app.post('/dashboard/account/email', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = dashboardContext(req);
    if (!csrfTokenMatches(config, { session: ctx.session.sessionId }, params.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
    const newEmail = (params.email ?? '').trim();
    const again = async (status: number, error: string) => renderAccount(reply, status, ctx, { errors: [error], newEmail });
    const parsed = emailSchema.safeParse(newEmail);
    if (!parsed.success) return again(400, 'Enter a valid email address.');
    if (parsed.data === ctx.session.email) return again(400, 'That is already your email address.');
    const current = params.current_password ?? '';
    if (!(await passwordMatches(db, ctx.session.userId, current))) return again(400, 'The current password is not correct.');
    try {
      await sendVerification(db, mailDeps, ctx.session.userId, parsed.data);
    } catch (err) {
      const message = refusal(err);
      if (message === undefined) throw err;
      return again(err instanceof TooManyAttemptsError ? 429 : 409, message);
    }
    return renderAccount(reply, 200, ctx, { message: `We sent a link to ${parsed.data}. Your address changes when you follow it.` });
  });

  app.get<{ Querystring: { return_to?: unknown } }>('/dashboard/account', async (req, reply) => renderAccount(reply, 200, dashboardContext(req), { returnTo: req.query?.return_to }));

  // The account is the user's own: no organization or role is needed, only the session's CSRF token.
  app.post('/dashboard/account/password', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = dashboardContext(req);
    if (!csrfTokenMatches(config, { session: ctx.session.sessionId }, params.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
    const current = params.current_password ?? '';
    const next = params.new_password ?? '';
    const user = { id: ctx.session.userId };
    if (!(await passwordMatches(db, user.id, current))) {
      return renderAccount(reply, 400, ctx, { errors: ['The current password is not correct.'] });
    }
    if (next.length < PASSWORD_MIN_LENGTH || next.length > PASSWORD_MAX_LENGTH) {
      return renderAccount(reply, 400, ctx, { errors: [`The new password must be ${PASSWORD_MIN_LENGTH} to ${PASSWORD_MAX_LENGTH} characters long.`] });
    }
    const hash = await hashPassword(next);
    await inTransaction(db, async (trx) => {
      await setPassword(trx, user.id, hash);
      // Whoever else held a session (the reason to change a password, often) is signed out.
      await trx.deleteFrom('sessions').where('user_id', '=', user.id).where('id_hash', '!=', sha256Hex(ctx.session.sessionId)).execute();
      // Account events have no organization of their own: each organization the user is in sees it.
      for (const org of ctx.organizations) {
        await recordAuditEvent(trx, { organizationId: org.id, action: 'user.password_changed', actor: { actorUserId: user.id }, details: { user_id: user.id } });
      }
    });
    return renderAccount(reply, 200, ctx, { message: 'Password changed. Your other sessions were signed out.' });
  });

  // One session of the user's own, by its number; another user's number is "no such session".
  app.post<{ Params: { id: string } }>('/dashboard/account/sessions/:id/sign-out', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = dashboardContext(req);
    if (!csrfTokenMatches(config, { session: ctx.session.sessionId }, params.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
    const id = /^[1-9][0-9]{0,15}$/.test(req.params.id) ? Number(req.params.id) : undefined;
    const ended = id === undefined ? undefined : await endSession(db, ctx.session.userId, id);
    if (ended === undefined) throw new NotFoundError('no such session');
    // Ending the session this browser holds is signing out.
    if (ended === sha256Hex(ctx.session.sessionId)) {
      clearSessionCookie(reply, config);
      return reply.redirect('/login', 303);
    }
    return renderAccount(reply, 200, ctx, { message: 'That session was signed out.' });
  });

  // A connected account at a provider (social sign-in), removed while another way to sign in remains.
  app.post<{ Params: { id: string } }>('/dashboard/account/social/:id/remove', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = dashboardContext(req);
    if (!csrfTokenMatches(config, { session: ctx.session.sessionId }, params.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
    // A way to sign in is changed as a factor is (factor-guard.ts): not from a stale or one-step session.
    const check = await factorGuard.check(ctx.session, params.current_password);
    if (check === 'second_step') return reply.redirect(stepUpPath(ACCOUNT_PATH), 303);
    if (check === 'wrong_password') return renderAccount(reply, 400, ctx, { errors: [WRONG_PASSWORD] });
    const id = /^[1-9][0-9]{0,9}$/.test(req.params.id) && Number(req.params.id) <= 2 ** 31 - 1 ? Number(req.params.id) : undefined;
    if (id === undefined) throw new NotFoundError('no such connected account');
    try {
      await unlinkSocialIdentity(db, mailDeps, { id: ctx.session.userId, email: ctx.session.email, name: ctx.session.name }, id, ctx.session.sessionId);
    } catch (err) {
      const message = refusal(err);
      if (message === undefined) throw err;
      return renderAccount(reply, 409, ctx, { errors: [message] });
    }
    return renderAccount(reply, 200, ctx, { message: 'That account can no longer sign you in.' });
  });

  app.post('/dashboard/account/sessions/others', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = dashboardContext(req);
    if (!csrfTokenMatches(config, { session: ctx.session.sessionId }, params.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
    const ended = await endOtherSessions(db, ctx.session.userId, ctx.session.sessionId);
    return renderAccount(reply, 200, ctx, { message: ended === 1 ? 'One other session was signed out.' : `${ended} other sessions were signed out.` });
  });

  app.post('/dashboard/account/sessions', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = dashboardContext(req);
    if (!csrfTokenMatches(config, { session: ctx.session.sessionId }, params.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
    await db.deleteFrom('sessions').where('user_id', '=', ctx.session.userId).execute();
    clearSessionCookie(reply, config);
    return reply.redirect('/login', 303);
  });
}
