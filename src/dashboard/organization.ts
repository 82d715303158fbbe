/**
 * The organization pages: overview and switcher, connected apps (live grants), members and the
 * audit log. Grant ids and user ids from URLs are always looked up within the current
 * organization.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { addMember, removeMember, ROLES } from '../accounts/organizations.js';
import { findUserByEmail } from '../accounts/users.js';
import { recordAuditEvent } from '../audit/events.js';
import { type DB, inTransaction } from '../db/connect.js';
import type { Role } from '../db/schema.js';
import { ConflictError, ForbiddenError, NotFoundError } from '../errors.js';
import { renderPage } from '../pages/render.js';
import type { DashboardDeps } from './applications.js';
import { type ActionContext, dashboardContext, type DashboardContext, parseId, readForm, requireAction } from './context.js';
import { selectOrganization } from './current-organization.js';

export const AUDIT_PAGE_SIZE = 50;

function parseRole(value: string | undefined): Role | undefined {
  return ROLES.find((r) => r === value);
}

/** Only an owner may make an owner, or change or remove one. */
function mayAssign(actor: Role, role: Role): boolean {
  return role !== 'owner' || actor === 'owner';
}

/**
 * Changes a member's role. The last owner cannot be demoted; the membership rows are locked so
 * two concurrent demotions cannot both pass that check.
 */
export async function changeMemberRole(db: DB, input: { organizationId: number; userId: number; role: Role; actorUserId: number }): Promise<void> {
  await inTransaction(db, async (trx) => {
    const members = await trx.selectFrom('memberships').select(['user_id', 'role']).where('organization_id', '=', input.organizationId).forUpdate().execute();
    const member = members.find((m) => m.user_id === input.userId);
    if (!member) throw new NotFoundError('There is no such member in this organization.');
    if (member.role === input.role) return;
    if (member.role === 'owner' && members.filter((m) => m.role === 'owner').length === 1) {
      throw new ConflictError('The last owner of an organization cannot be demoted. Make someone else an owner first.');
    }
    await trx.updateTable('memberships').set({ role: input.role }).where('organization_id', '=', input.organizationId).where('user_id', '=', input.userId).execute();
    await recordAuditEvent(trx, {
      organizationId: input.organizationId,
      action: 'member.role_changed',
      actorUserId: input.actorUserId,
      details: { user_id: input.userId, from: member.role, to: input.role },
    });
  });
}

export async function organizationRoutes(app: FastifyInstance, deps: DashboardDeps): Promise<void> {
  const { db, config, revocations } = deps;

  app.get('/dashboard', async (req, reply) =>
    renderPage(reply, 200, 'dashboard/overview', { title: 'Dashboard', ctx: dashboardContext(req), active: 'overview' }),
  );

  app.post('/dashboard/organization', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = dashboardContext(req);
    // Switching needs only the CSRF token and membership of the target (checked in the UPDATE).
    requireAction(config, req, params, { manage: false });
    const organizationId = parseId(params.organization_id);
    const selected =
      organizationId !== undefined && (await selectOrganization(db, { sessionId: ctx.session.sessionId, userId: ctx.session.userId, organizationId }));
    if (!selected) throw new ForbiddenError('You are not a member of that organization.');
    return reply.redirect('/dashboard', 303);
  });

  // Connected apps: every live grant of the current organization.
  async function liveGrants(organizationId: number) {
    return db
      .selectFrom('grants')
      .innerJoin('applications', (j) => j.onRef('applications.id', '=', 'grants.application_id').onRef('applications.organization_id', '=', 'grants.organization_id'))
      .leftJoin('users', 'users.id', 'grants.user_id')
      .select([
        'grants.id',
        'grants.user_id',
        'grants.scopes',
        'grants.created_at',
        'grants.last_used_at',
        'applications.name as application_name',
        'applications.type as application_type',
        'users.email as user_email',
      ])
      .where('grants.organization_id', '=', organizationId)
      .where('grants.revoked_at', 'is', null)
      .orderBy('grants.id', 'desc')
      .execute();
  }

  app.get('/dashboard/connected-apps', async (req, reply) => {
    const ctx = dashboardContext(req);
    return renderPage(reply, 200, 'dashboard/connected-apps', {
      title: 'Connected apps',
      ctx,
      active: 'connected-apps',
      grants: ctx.organization ? await liveGrants(ctx.organization.id) : [],
    });
  });

  app.post<{ Params: { grantId: string } }>('/dashboard/connected-apps/:grantId/revoke', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { manage: false });
    const grantId = parseId(req.params.grantId);
    const grant =
      grantId === undefined
        ? undefined
        : await db
            .selectFrom('grants')
            .select(['id', 'user_id'])
            .where('organization_id', '=', ctx.organization.id)
            .where('id', '=', grantId)
            .where('revoked_at', 'is', null)
            .executeTakeFirst();
    if (!grant) throw new NotFoundError('There is no such connected app in this organization.');
    // Owners and admins revoke any grant; a member only one they authorized themselves.
    if (!ctx.canManage && grant.user_id !== ctx.session.userId) throw new ForbiddenError('You may revoke only the apps you authorized yourself.');
    await revocations.revoke(grant.id, 'revoked_by_user', { actorUserId: ctx.session.userId });
    return reply.redirect('/dashboard/connected-apps', 303);
  });

  // Members.
  async function listMembers(organizationId: number) {
    return db
      .selectFrom('memberships')
      .innerJoin('users', 'users.id', 'memberships.user_id')
      .select(['users.id', 'users.email', 'users.name', 'memberships.role', 'memberships.created_at'])
      .where('memberships.organization_id', '=', organizationId)
      .orderBy('users.email')
      .execute();
  }

  async function renderMembers(reply: FastifyReply, ctx: DashboardContext, status = 200, view: { errors?: string[]; email?: string } = {}) {
    return renderPage(reply, status, 'dashboard/members', {
      title: 'Members',
      ctx,
      active: 'members',
      members: ctx.organization ? await listMembers(ctx.organization.id) : [],
      roles: ROLES,
      errors: view.errors ?? [],
      email: view.email ?? '',
    });
  }

  app.get('/dashboard/members', async (req, reply) => renderMembers(reply, dashboardContext(req)));

  app.post('/dashboard/members', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { manage: true });
    const email = (params.email ?? '').trim();
    const role = parseRole(params.role);
    const refuse = (message: string) => renderMembers(reply, ctx, 400, { errors: [message], email });
    if (!role) return refuse('Choose a role.');
    if (!mayAssign(ctx.organization.role, role)) throw new ForbiddenError('Only an owner may add an owner.');
    const user = email === '' || email.length > 254 ? undefined : await findUserByEmail(db, email);
    if (!user) return refuse('There is no account with this email address. Ask them to sign up first.');
    try {
      await addMember(db, { organizationId: ctx.organization.id, userId: user.id, role, actorUserId: ctx.session.userId });
    } catch (err) {
      if (err instanceof ConflictError) return refuse('This user is already a member.');
      throw err;
    }
    return reply.redirect('/dashboard/members', 303);
  });

  /** The member named in the URL, for an owner or admin allowed to change them. */
  async function managedMember(req: FastifyRequest<{ Params: { userId: string } }>): Promise<{ ctx: ActionContext; userId: number; role: Role; params: Record<string, string | undefined> }> {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { manage: true });
    const userId = parseId(req.params.userId);
    const member =
      userId === undefined
        ? undefined
        : await db.selectFrom('memberships').select(['user_id', 'role']).where('organization_id', '=', ctx.organization.id).where('user_id', '=', userId).executeTakeFirst();
    if (!member) throw new NotFoundError('There is no such member in this organization.');
    if (!mayAssign(ctx.organization.role, member.role)) throw new ForbiddenError('Only an owner may change or remove an owner.');
    return { ctx, userId: member.user_id, role: member.role, params };
  }

  app.post<{ Params: { userId: string } }>('/dashboard/members/:userId/role', async (req, reply) => {
    const { ctx, userId, params } = await managedMember(req);
    const role = parseRole(params.role);
    if (!role) throw new ForbiddenError('Choose a role.');
    if (!mayAssign(ctx.organization.role, role)) throw new ForbiddenError('Only an owner may make an owner.');
    await changeMemberRole(db, { organizationId: ctx.organization.id, userId, role, actorUserId: ctx.session.userId });
    return reply.redirect('/dashboard/members', 303);
  });

  app.post<{ Params: { userId: string } }>('/dashboard/members/:userId/remove', async (req, reply) => {
    const { ctx, userId } = await managedMember(req);
    const live = await db
      .selectFrom('grants')
      .select('id')
      .where('organization_id', '=', ctx.organization.id)
      .where('user_id', '=', userId)
      .where('revoked_at', 'is', null)
      .execute();
    // removeMember revokes the grants this user gave here (and refuses to remove the last owner).
    await removeMember(db, { organizationId: ctx.organization.id, userId, actorUserId: ctx.session.userId });
    // Already revoked and published; this only makes this instance refuse their tokens at once.
    for (const g of live) await revocations.revoke(g.id, 'member_removed', { actorUserId: ctx.session.userId });
    return reply.redirect(userId === ctx.session.userId ? '/dashboard' : '/dashboard/members', 303);
  });

  // Audit log: newest first, keyset pagination on id (`?before=<id>`).
  app.get<{ Querystring: { before?: unknown } }>('/dashboard/audit', async (req, reply) => {
    const ctx = dashboardContext(req);
    const before = parseId(req.query.before);
    const rows = ctx.organization
      ? await db
          .selectFrom('audit_events')
          .leftJoin('users', 'users.id', 'audit_events.actor_user_id')
          .select(['audit_events.id', 'audit_events.action', 'audit_events.details', 'audit_events.created_at', 'audit_events.actor_client_id', 'users.email as actor_email'])
          .where('audit_events.organization_id', '=', ctx.organization.id)
          .$if(before !== undefined, (qb) => qb.where('audit_events.id', '<', before ?? 0))
          .orderBy('audit_events.id', 'desc')
          .limit(AUDIT_PAGE_SIZE + 1)
          .execute()
      : [];
    const events = rows.slice(0, AUDIT_PAGE_SIZE).map((e) => ({ ...e, detailsText: JSON.stringify(e.details) }));
    const last = events.at(-1);
    return renderPage(reply, 200, 'dashboard/audit', {
      title: 'Audit log',
      ctx,
      active: 'audit',
      events,
      nextBefore: rows.length > AUDIT_PAGE_SIZE && last ? last.id : undefined,
      isFirstPage: before === undefined,
    });
  });
}
