/** The account page: change the password; the browser sessions, each with its own sign-out, and sign-out everywhere (else). */
import type { FastifyInstance } from 'fastify';
import { hashPassword, PASSWORD_MAX_LENGTH, PASSWORD_MIN_LENGTH, verifyPassword } from '../accounts/passwords.js';
import { clearSessionCookie, csrfTokenMatches, endOtherSessions, endSession, listSessions, SESSIONS_LISTED } from '../accounts/sessions.js';
import { recordAuditEvent } from '../audit/events.js';
import { inTransaction } from '../db/connect.js';
import { ForbiddenError, NotFoundError } from '../errors.js';
import { sha256Hex } from '../lib/crypto.js';
import { renderPage } from '../pages/render.js';
import type { DashboardDeps } from './applications.js';
import { CSRF_FAILED, dashboardContext, readForm } from './context.js';

export async function accountRoutes(app: FastifyInstance, deps: DashboardDeps): Promise<void> {
  const { db, config } = deps;

  const page = async (ctx: ReturnType<typeof dashboardContext>, view: { errors?: string[]; message?: string } = {}) => {
    const current = sha256Hex(ctx.session.sessionId);
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
    };
  };

  app.get('/dashboard/account', async (req, reply) => renderPage(reply, 200, 'dashboard/account', await page(dashboardContext(req))));

  // The account is the user's own: no organization or role is needed, only the session's CSRF token.
  app.post('/dashboard/account/password', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = dashboardContext(req);
    if (!csrfTokenMatches(config, { session: ctx.session.sessionId }, params.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
    const current = params.current_password ?? '';
    const next = params.new_password ?? '';
    const user = await db.selectFrom('users').select(['id', 'password_hash']).where('id', '=', ctx.session.userId).executeTakeFirstOrThrow();
    if (current.length > PASSWORD_MAX_LENGTH || !(await verifyPassword(user.password_hash, current))) {
      return renderPage(reply, 400, 'dashboard/account', await page(ctx, { errors: ['The current password is not correct.'] }));
    }
    if (next.length < PASSWORD_MIN_LENGTH || next.length > PASSWORD_MAX_LENGTH) {
      return renderPage(reply, 400, 'dashboard/account', await page(ctx, { errors: [`The new password must be ${PASSWORD_MIN_LENGTH} to ${PASSWORD_MAX_LENGTH} characters long.`] }));
    }
    const hash = await hashPassword(next);
    await inTransaction(db, async (trx) => {
      await trx.updateTable('users').set({ password_hash: hash, updated_at: new Date() }).where('id', '=', user.id).execute();
      // Whoever else held a session (the reason to change a password, often) is signed out.
      await trx.deleteFrom('sessions').where('user_id', '=', user.id).where('id_hash', '!=', sha256Hex(ctx.session.sessionId)).execute();
      // Account events have no organization of their own: each organization the user is in sees it.
      for (const org of ctx.organizations) {
        await recordAuditEvent(trx, { organizationId: org.id, action: 'user.password_changed', actor: { actorUserId: user.id }, details: { user_id: user.id } });
      }
    });
    return renderPage(reply, 200, 'dashboard/account', await page(ctx, { message: 'Password changed. Your other sessions were signed out.' }));
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
    return renderPage(reply, 200, 'dashboard/account', await page(ctx, { message: 'That session was signed out.' }));
  });

  app.post('/dashboard/account/sessions/others', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = dashboardContext(req);
    if (!csrfTokenMatches(config, { session: ctx.session.sessionId }, params.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
    const ended = await endOtherSessions(db, ctx.session.userId, ctx.session.sessionId);
    return renderPage(reply, 200, 'dashboard/account', await page(ctx, { message: ended === 1 ? 'One other session was signed out.' : `${ended} other sessions were signed out.` }));
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
