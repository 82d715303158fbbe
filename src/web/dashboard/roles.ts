/**
 * The Roles page: every role of the current organization with its permissions (members.read),
 * and its own roles created, changed and deleted (members.write, within what the user's own role
 * holds: see src/accounts/roles.ts). Roles are named in URLs by name. A change redirects back to
 * the page, which says what it did (notice.ts); deleting a role first answers a page saying who
 * holds it and what happens to them, whose form sends the same POST again with `confirm`.
 */
import type { FastifyInstance, FastifyReply } from 'fastify';
import {
  checkRoleDeletion,
  createRole,
  deleteRole,
  listRoles,
  mayAssign,
  PERMISSION_DESCRIPTIONS,
  PERMISSIONS,
  roleHoldsScope,
  type RoleChangeOptions,
  updateRole,
} from '../../accounts/roles.js';
import { isDeclaredScope, listResources } from '../../oauth/models/resources.js';
import { AppError, ConflictError, ForbiddenError, InvalidRequestError, NotFoundError } from '../../errors.js';
import { DATA_SCOPES } from '../../oauth/helpers/scopes.js';
import { renderPage } from '../render.js';
import type { DashboardDeps } from './applications.js';
import { type ActionContext, dashboardContext, type DashboardContext, readForm, requireAction, requireView } from './context.js';
import { count, redirectWithNotice } from './notice.js';

interface RoleForm {
  name: string;
  description: string;
  permissions: string[];
}

const DATA = new Set<string>(DATA_SCOPES);
const permissionChoices = PERMISSIONS.map((name) => ({ name, description: PERMISSION_DESCRIPTIONS[name], data: DATA.has(name) }));

export async function roleRoutes(app: FastifyInstance, deps: DashboardDeps): Promise<void> {
  const { db, config, revocations } = deps;

  /** The scopes the registered resources declare: permissions a role may hold too (owner, admin and member hold them all). */
  async function declaredChoices() {
    const seen = new Set<string>();
    return (await listResources(db)).flatMap((r) =>
      r.scopes.filter((name) => isDeclaredScope(name) && !seen.has(name) && seen.add(name)).map((name) => ({ name, description: `${name} at ${r.name} (${r.uri})`, data: true })),
    );
  }

  async function render(reply: FastifyReply, ctx: DashboardContext, status = 200, view: { errors?: string[]; form?: RoleForm; editing?: string; message?: string } = {}) {
    requireView(ctx, 'members.read');
    const roles = ctx.organization ? await listRoles(db, ctx.organization.id) : [];
    const access = ctx.organization?.access;
    const manage = ctx.can['members.write'];
    return renderPage(reply, status, 'dashboard/roles', {
      title: 'Roles',
      ctx,
      active: 'roles',
      roles: roles.map((r) => ({
        ...r,
        // Someone may edit or delete a role only if they could give it (they hold all it holds).
        editable: manage && !r.builtin && access !== undefined && mayAssign(access, r),
        path: `/dashboard/roles/${encodeURIComponent(r.name)}`,
      })),
      choices: [...permissionChoices, ...(await declaredChoices())].map((c) => ({ ...c, allowed: access !== undefined && roleHoldsScope(access, c.name) })),
      errors: view.errors ?? [],
      form: view.form ?? { name: '', description: '', permissions: [] },
      editing: view.editing,
      message: view.message ?? '',
    });
  }

  const options = (ctx: ActionContext): RoleChangeOptions => ({ actor: { actorUserId: ctx.session.userId }, actingAs: ctx.organization.access, revocations });

  /**
   * Runs a change, then back to the page, which says what it did (`change` returns it, or a page
   * of its own); a refusal the user can fix is shown on the page with what they typed.
   */
  async function attempt(reply: FastifyReply, ctx: ActionContext, form: RoleForm | undefined, editing: string | undefined, change: () => Promise<string | FastifyReply>) {
    try {
      const done = await change();
      return typeof done === 'string' ? redirectWithNotice(reply, config, ctx.session.sessionId, '/dashboard/roles', done) : done;
    } catch (err) {
      if (err instanceof InvalidRequestError || err instanceof ConflictError || err instanceof ForbiddenError || err instanceof NotFoundError) {
        return render(reply, ctx, (err as AppError).statusCode, { errors: [err.description], ...(form ? { form } : {}), editing });
      }
      throw err;
    }
  }

  app.get('/dashboard/roles', async (req, reply) => render(reply, dashboardContext(req)));

  app.post('/dashboard/roles', async (req, reply) => {
    const { params, scopes } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'members.write' });
    const form = { name: params.name ?? '', description: params.description ?? '', permissions: scopes };
    return attempt(reply, ctx, form, undefined, async () => {
      const role = await createRole(db, ctx.organization.id, form, options(ctx));
      return `Role ${role.name} created.`;
    });
  });

  app.post<{ Params: { name: string } }>('/dashboard/roles/:name', async (req, reply) => {
    const { params, scopes } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'members.write' });
    const form = { name: params.name ?? '', description: params.description ?? '', permissions: scopes };
    return attempt(reply, ctx, form, req.params.name, async () => {
      const role = await updateRole(db, ctx.organization.id, req.params.name, form, options(ctx));
      return `Role ${role.name} saved.`;
    });
  });

  app.post<{ Params: { name: string } }>('/dashboard/roles/:name/delete', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'members.write' });
    // The page says who holds the role: for those who may see the Roles page.
    if (params.confirm !== 'delete') requireView(ctx, 'members.read');
    return attempt(reply, ctx, undefined, undefined, async () => {
      // Asked first (role-delete.eta): who holds it, and where they go. What deleting would refuse
      // about the role itself (built-in, beyond the user's role, none such) is refused before asking.
      const deletion = await checkRoleDeletion(db, ctx.organization.id, req.params.name, options(ctx));
      const { role } = deletion;
      if (params.confirm !== 'delete') {
        const access = ctx.organization.access;
        const moveTargets = (await listRoles(db, ctx.organization.id)).filter((r) => !(r.kind === 'custom' && r.id === role.id) && mayAssign(access, r)).map((r) => r.name);
        return renderPage(reply, 200, 'dashboard/role-delete', {
          title: `Delete the role ${role.name}`,
          ctx,
          active: 'roles',
          ...deletion,
          membersText: count(deletion.members, 'member'),
          invitationsText: count(deletion.pendingInvitations, 'pending invitation'),
          moveTargets,
          moveTo: params.move_to ?? '',
          path: `/dashboard/roles/${encodeURIComponent(role.name)}`,
        });
      }
      const moveTo = params.move_to || undefined;
      const { moved } = await deleteRole(db, ctx.organization.id, req.params.name, { moveTo }, options(ctx));
      if (moved > 0) return `Deleted the role ${role.name}. Its ${count(moved, 'member')} ${moved === 1 ? 'moves' : 'move'} to ${moveTo}; their connected apps keep only what ${moveTo} allows.`;
      return `Deleted the role ${role.name}${moveTo ? `; invitations that named it name ${moveTo} now` : ''}.`;
    });
  });
}
