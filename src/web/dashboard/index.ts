/**
 * The developer dashboard (/dashboard/*): server-rendered pages behind sign-in, acting on the
 * session's current organization. One encapsulated plugin: its hook loads the signed-in user and
 * current organization for every route in it (a signed-out GET goes to the login page, a
 * signed-out POST is a 403), and setUpPages gives every route the page security headers. A
 * current organization that requires its single sign-on of the user sends a session made another
 * way to sign in through it (SS-4); one that requires two-step sign-in sends a one-step session
 * to its second step (or to set one up) first. A GET page shows what the change that redirected to it did (notice.ts).
 */
import type { FastifyInstance } from 'fastify';
import { sessionShortfall } from '../../accounts/organization-access.js';
import { answerShortfall } from '../shortfall.js';
import { loginPath } from '../sign-in.js';
import { ForbiddenError } from '../../errors.js';
import { setUpPages } from '../render.js';
import { accountRoutes } from './account.js';
import { twoStepRoutes } from './two-step.js';
import { FactorChangeGuard } from './factor-guard.js';
import { passkeyRoutes } from './passkeys.js';
import { applicationRoutes, type DashboardDeps } from './applications.js';
import { CSRF_FAILED, loadContext, setDashboardContext } from './context.js';
import { directoryRoutes } from './directories.js';
import { takeNotice } from './notice.js';
import { organizationRoutes } from './organization.js';
import { overviewRoutes } from './overview.js';
import { roleRoutes } from './roles.js';
import { setupLinkRoutes } from './setup-links.js';
import { ssoRoutes } from './sso.js';
import { webhookRoutes } from './webhooks.js';

export type { DashboardDeps } from './applications.js';

export async function dashboardPages(app: FastifyInstance, deps: DashboardDeps): Promise<void> {
  await setUpPages(app, deps.config);
  app.addHook('preHandler', async (req, reply) => {
    const ctx = await loadContext(deps.db, deps.config, req);
    if (ctx) {
      setDashboardContext(req, ctx);
      // An organization that requires SSO of the user (SS-4) or two-step sign-in is reached only by a
      // session that has it; the Account page (to set a factor up) and switching organization stay open.
      const route = req.routeOptions.url ?? '';
      const shortfall = ctx.organization ? sessionShortfall(ctx.organization, ctx.session) : undefined;
      if (ctx.organization && shortfall && !route.startsWith('/dashboard/account') && route !== '/dashboard/organization') {
        return answerShortfall(deps.db, req, reply, shortfall, ctx.organization.name, ctx.session);
      }
      // The page a change redirected to says what it did, once (notice.ts).
      if (req.method === 'GET') ctx.notice = takeNotice(req, reply, deps.config, ctx.session.sessionId);
      return;
    }
    if (req.method === 'GET' || req.method === 'HEAD') return reply.redirect(loginPath(req.url), 303);
    throw new ForbiddenError(CSRF_FAILED);
  });
  await applicationRoutes(app, deps);
  await overviewRoutes(app, deps);
  await organizationRoutes(app, deps);
  await roleRoutes(app, deps);
  await ssoRoutes(app, deps);
  await setupLinkRoutes(app, deps);
  await directoryRoutes(app, deps);
  await webhookRoutes(app, deps);
  const factorGuard = new FactorChangeGuard(deps.db);
  await accountRoutes(app, { ...deps, factorGuard });
  await twoStepRoutes(app, { ...deps, factorGuard });
  await passkeyRoutes(app, { ...deps, factorGuard });
}
