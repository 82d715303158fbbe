/**
 * The developer dashboard (/dashboard/*): server-rendered pages behind sign-in, acting on the
 * session's current organization. One encapsulated plugin: its hook loads the signed-in user and
 * current organization for every route in it (a signed-out GET goes to the login page, a
 * signed-out POST is a 403), and setUpPages gives every route the page security headers.
 */
import type { FastifyInstance } from 'fastify';
import { loginPath } from '../sign-in.js';
import { ForbiddenError } from '../../errors.js';
import { setUpPages } from '../render.js';
import { accountRoutes } from './account.js';
import { applicationRoutes, type DashboardDeps } from './applications.js';
import { CSRF_FAILED, loadContext, setDashboardContext } from './context.js';
import { organizationRoutes } from './organization.js';
import { roleRoutes } from './roles.js';

export type { DashboardDeps } from './applications.js';

export async function dashboardPages(app: FastifyInstance, deps: DashboardDeps): Promise<void> {
  await setUpPages(app, deps.config);
  app.addHook('preHandler', async (req, reply) => {
    const ctx = await loadContext(deps.db, deps.config, req);
    if (ctx) {
      setDashboardContext(req, ctx);
      return;
    }
    if (req.method === 'GET' || req.method === 'HEAD') return reply.redirect(loginPath(req.url), 303);
    throw new ForbiddenError(CSRF_FAILED);
  });
  await applicationRoutes(app, deps);
  await organizationRoutes(app, deps);
  await roleRoutes(app, deps);
  await accountRoutes(app, deps);
}
