/**
 * The organization pages: the organization switcher, connected apps (live grants), members and the
 * audit log. Grant ids and user ids from URLs are always looked up within the current
 * organization. A change redirects to its page, which says what it did (notice.ts); removing a
 * member, revoking a connected app or an invitation first answers a page that says what will stop
 * working, whose form sends the same POST again with `confirm`.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { addMember, changeMemberRole, checkMemberRemoval, getMember, listMembers, removeMember, UnverifiedEmailError, updateOrganization } from '../../accounts/organizations.js';
import { signedInWithTwoFactors } from '../../accounts/sessions.js';
import { findRole, listRoles, mayAssign, type RoleRef } from '../../accounts/roles.js';
import {
  checkInvitationChange,
  createInvitation,
  getPendingInvitation,
  type InvitationActor,
  listPendingInvitations,
  resendInvitation,
  revokeInvitation,
} from '../../accounts/invitations.js';
import { emailSchema, findUserByEmail } from '../../accounts/users.js';
import { listAuditEvents } from '../../audit/events.js';
import type { DB } from '../../db/connect.js';
import { ConflictError, ForbiddenError, InvalidRequestError, NotFoundError } from '../../errors.js';
import { countLiveGrants, findLiveGrant, GRANT_COUNT_CAP, listLiveGrants } from '../../oauth/models/grants.js';
import type { Params } from '../../oauth/helpers/params.js';
import { renderPage } from '../render.js';
import type { DashboardDeps } from './applications.js';
import { type ActionContext, DASHBOARD_PAGE_SIZE, dashboardContext, type DashboardContext, parseId, readForm, requireAction, requireView } from './context.js';
import { selectOrganization } from '../../accounts/current-organization.js';
import { count, redirectWithNotice } from './notice.js';

export const AUDIT_PAGE_SIZE = 50;

/** The organization's role named in a form, or undefined. */
async function roleFromForm(db: DB, organizationId: number, value: string | undefined): Promise<RoleRef | undefined> {
  return value === undefined ? undefined : findRole(db, organizationId, value, { forShare: false });
}

/** The roles `ctx`'s user may give (mayAssign), for the Members page's selects. */
export async function assignableRoles(db: DB, ctx: DashboardContext): Promise<RoleRef[]> {
  if (!ctx.organization || !ctx.can['members.write']) return [];
  const access = ctx.organization.access;
  return (await listRoles(db, ctx.organization.id)).filter((r) => mayAssign(access, r));
}

export async function organizationRoutes(app: FastifyInstance, deps: DashboardDeps): Promise<void> {
  const { db, config, revocations } = deps;

  app.post('/dashboard/organization', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = dashboardContext(req);
    // Switching needs only the CSRF token and membership of the target (checked in the UPDATE).
    requireAction(config, req, params, { permission: null });
    const organizationId = parseId(params.organization_id);
    const selected =
      organizationId !== undefined && (await selectOrganization(db, { sessionId: ctx.session.sessionId, userId: ctx.session.userId, organizationId }));
    if (!selected) throw new ForbiddenError('You are not a member of that organization.');
    const name = ctx.organizations.find((o) => o.id === organizationId)?.name;
    return redirectWithNotice(reply, config, ctx.session.sessionId, '/dashboard', name === undefined ? 'Organization switched.' : `You are now working in ${name}.`);
  });

  // Connected apps: the live grants of the current organization, newest first; without
  // grants.read, only the ones the user gave.
  app.get<{ Querystring: { before?: unknown } }>('/dashboard/connected-apps', async (req, reply) => {
    const ctx = dashboardContext(req);
    const before = parseId(req.query.before);
    const userId = ctx.can['grants.read'] ? undefined : ctx.session.userId;
    const rows = ctx.organization ? await listLiveGrants(db, ctx.organization.id, { beforeId: before, limit: DASHBOARD_PAGE_SIZE + 1, userId }) : [];
    return renderPage(reply, 200, 'dashboard/connected-apps', {
      title: 'Connected apps',
      ctx,
      active: 'connected-apps',
      grants: rows.slice(0, DASHBOARD_PAGE_SIZE),
      first: before === undefined ? '' : '/dashboard/connected-apps',
      next: rows.length > DASHBOARD_PAGE_SIZE ? `/dashboard/connected-apps?before=${rows[DASHBOARD_PAGE_SIZE - 1]!.id}` : '',
    });
  });

  app.post<{ Params: { grantId: string } }>('/dashboard/connected-apps/:grantId/revoke', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: null });
    const grantId = parseId(req.params.grantId);
    const grant = grantId === undefined ? undefined : await findLiveGrant(db, ctx.organization.id, grantId);
    if (!grant) throw new NotFoundError('There is no such connected app in this organization.');
    // grants.write (owners, admins) revokes any grant; anyone else only one they authorized themselves.
    if (!ctx.can['grants.write'] && grant.user_id !== ctx.session.userId) throw new ForbiddenError('You may revoke only the apps you authorized yourself.');
    const mine = grant.user_id === ctx.session.userId;
    if (params.confirm !== 'revoke') {
      // The page names who gave the grant: someone else's only to those who may see every grant.
      if (!mine) requireView(ctx, 'grants.read');
      return renderPage(reply, 200, 'dashboard/grant-revoke', {
        title: `Revoke ${grant.application_name}`,
        ctx,
        active: 'connected-apps',
        grant,
        mine,
        path: `/dashboard/connected-apps/${grant.id}/revoke`,
      });
    }
    await revocations.revoke(grant.id, 'revoked_by_user', { actorUserId: ctx.session.userId });
    const what =
      grant.user_id === null ? `the grant ${grant.application_name} had for itself` : `${grant.application_name}’s access, given by ${mine ? 'you' : (grant.user_email ?? 'someone')}`;
    return redirectWithNotice(reply, config, ctx.session.sessionId, '/dashboard/connected-apps', `Revoked ${what}: its tokens stopped working.`);
  });

  // Members, in user id order.
  async function renderMembers(
    reply: FastifyReply,
    ctx: DashboardContext,
    status = 200,
    view: { errors?: string[]; email?: string; inviteEmail?: string; message?: string; after?: number | undefined } = {},
  ) {
    requireView(ctx, 'members.read');
    const roles = (await assignableRoles(db, ctx)).map((r) => r.name);
    const rows = ctx.organization ? await listMembers(db, ctx.organization.id, { afterUserId: view.after ?? 0, limit: DASHBOARD_PAGE_SIZE + 1 }) : [];
    // Pending invitations: the first page, to those who manage members (a longer list is the API's).
    const invitations = ctx.organization && ctx.can['members.write'] ? await listPendingInvitations(db, ctx.organization.id, { afterId: 0, limit: DASHBOARD_PAGE_SIZE + 1 }) : [];
    return renderPage(reply, status, 'dashboard/members', {
      title: 'Members',
      ctx,
      active: 'members',
      members: rows.slice(0, DASHBOARD_PAGE_SIZE),
      first: view.after === undefined ? '' : '/dashboard/members',
      next: rows.length > DASHBOARD_PAGE_SIZE ? `/dashboard/members?after=${rows[DASHBOARD_PAGE_SIZE - 1]!.user_id}` : '',
      roles,
      defaultRole: roles.includes('member') ? 'member' : roles.at(-1),
      errors: view.errors ?? [],
      email: view.email ?? '',
      inviteEmail: view.inviteEmail ?? '',
      message: view.message ?? '',
      invitations: invitations.slice(0, DASHBOARD_PAGE_SIZE),
      invitationsCapped: invitations.length > DASHBOARD_PAGE_SIZE,
    });
  }

  /** The acting user, with their role, for the domain's permission and audit. */
  const memberChange = (ctx: ActionContext) => ({ actor: { actorUserId: ctx.session.userId }, actingAs: ctx.organization.access, revocations });

  app.get<{ Querystring: { after?: unknown } }>('/dashboard/members', async (req, reply) =>
    renderMembers(reply, dashboardContext(req), 200, { after: parseId(req.query.after) }),
  );

  // The organization's two-step sign-in requirement: whoever manages members sets it.
  app.post('/dashboard/members/require-mfa', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'members.write' });
    if (params.require_mfa !== 'yes' && params.require_mfa !== 'no') throw new InvalidRequestError('Choose on or off.');
    const requireMfa = params.require_mfa === 'yes';
    // Turning it on from a one-step session would shut the person doing it out at their next click.
    if (requireMfa && !signedInWithTwoFactors(ctx.session)) {
      return renderMembers(reply, ctx, 409, { errors: ['Set up two-step sign-in for yourself first (Account page), and sign in with it, before requiring it of everyone.'] });
    }
    await updateOrganization(db, ctx.organization.id, { requireMfa }, { actorUserId: ctx.session.userId });
    return redirectWithNotice(
      reply,
      config,
      ctx.session.sessionId,
      '/dashboard/members',
      requireMfa ? 'Two-step sign-in is now required: members without it are asked to set it up before they reach this organization.' : 'Two-step sign-in is no longer required.',
    );
  });

  app.post('/dashboard/members', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'members.write' });
    const email = (params.email ?? '').trim();
    const role = await roleFromForm(db, ctx.organization.id, params.role);
    const refuse = (message: string) => renderMembers(reply, ctx, 400, { errors: [message], email });
    if (!role) return refuse('Choose a role.');
    const user = email === '' || email.length > 254 ? undefined : await findUserByEmail(db, email);
    if (!user) return refuse('There is no account with this email address. Invite them instead: they can sign up from the link.');
    try {
      await addMember(db, { organizationId: ctx.organization.id, userId: user.id, role }, memberChange(ctx));
    } catch (err) {
      if (err instanceof UnverifiedEmailError) return refuse('This user has not confirmed their email address yet. Invite them instead.');
      if (err instanceof ConflictError) return refuse('This user is already a member.');
      if (err instanceof ForbiddenError) return renderMembers(reply, ctx, 403, { errors: [err.description], email });
      throw err;
    }
    return redirectWithNotice(reply, config, ctx.session.sessionId, '/dashboard/members', `Added ${user.email} to ${ctx.organization.name} as ${role.name}.`);
  });

  // Invitations: by email, with a role; the invitee joins from the emailed link.
  const inviter = (ctx: ActionContext): InvitationActor => ({
    actor: { actorUserId: ctx.session.userId },
    actingAs: ctx.organization.access,
    inviterLabel: ctx.session.name ? `${ctx.session.name} (${ctx.session.email})` : ctx.session.email,
  });
  const mailDeps = { mail: deps.mail, issuer: config.issuer };

  app.post('/dashboard/invitations', async (req, reply) => {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'members.write' });
    const email = (params.email ?? '').trim();
    const role = await roleFromForm(db, ctx.organization.id, params.role);
    const refuse = (status: number, message: string) => renderMembers(reply, ctx, status, { errors: [message], inviteEmail: email });
    if (!role) return refuse(400, 'Choose a role.');
    if (!emailSchema.safeParse(email).success) return refuse(400, 'Enter a valid email address.');
    try {
      await createInvitation(db, { organizationId: ctx.organization.id, email, role }, inviter(ctx), mailDeps);
    } catch (err) {
      if (err instanceof ConflictError || err instanceof ForbiddenError) return refuse(err.statusCode, err.description);
      throw err;
    }
    return redirectWithNotice(reply, config, ctx.session.sessionId, '/dashboard/members', `Invitation sent to ${email}.`);
  });

  /** The pending invitation named in the URL, for someone who manages members. */
  function managedInvitation(req: FastifyRequest<{ Params: { id: string } }>): { ctx: ActionContext; id: number; params: Params } {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'members.write' });
    const id = parseId(req.params.id);
    if (id === undefined) throw new NotFoundError('There is no such pending invitation in this organization.');
    return { ctx, id, params };
  }

  app.post<{ Params: { id: string } }>('/dashboard/invitations/:id/resend', async (req, reply) => {
    const { ctx, id } = managedInvitation(req);
    const invitation = await resendInvitation(db, ctx.organization.id, id, inviter(ctx), mailDeps);
    return redirectWithNotice(reply, config, ctx.session.sessionId, '/dashboard/members', `Invitation sent again to ${invitation.email}; the earlier link no longer works.`);
  });

  app.post<{ Params: { id: string } }>('/dashboard/invitations/:id/revoke', async (req, reply) => {
    const { ctx, id, params } = managedInvitation(req);
    // The page names the invitation: for those who may see the Members page.
    if (params.confirm !== 'revoke') requireView(ctx, 'members.read');
    // What revoking would refuse is refused before asking: another organization's, or a role the user may not give.
    await checkInvitationChange(db, ctx.organization.id, id, ctx.organization.access);
    const invitation = await getPendingInvitation(db, ctx.organization.id, id);
    if (params.confirm !== 'revoke') {
      return renderPage(reply, 200, 'dashboard/invitation-revoke', {
        title: `Revoke the invitation to ${invitation.email}`,
        ctx,
        active: 'members',
        invitation,
        path: `/dashboard/invitations/${invitation.id}/revoke`,
      });
    }
    await revokeInvitation(db, ctx.organization.id, id, inviter(ctx));
    return redirectWithNotice(reply, config, ctx.session.sessionId, '/dashboard/members', `Revoked the invitation to ${invitation.email}: its link no longer works.`);
  });

  /** The member named in the URL, for someone who manages members (the domain checks which roles theirs may give). */
  function managedMember(req: FastifyRequest<{ Params: { userId: string } }>): { ctx: ActionContext; userId: number; params: Params } {
    const { params } = readForm(req.body);
    const ctx = requireAction(config, req, params, { permission: 'members.write' });
    const userId = parseId(req.params.userId);
    if (userId === undefined) throw new NotFoundError('There is no such member in this organization.');
    return { ctx, userId, params };
  }

  app.post<{ Params: { userId: string } }>('/dashboard/members/:userId/role', async (req, reply) => {
    const { ctx, userId, params } = managedMember(req);
    const role = await roleFromForm(db, ctx.organization.id, params.role);
    if (!role) throw new InvalidRequestError('Choose a role.');
    await changeMemberRole(db, { organizationId: ctx.organization.id, userId, role }, memberChange(ctx));
    const member = await getMember(db, ctx.organization.id, userId);
    return redirectWithNotice(reply, config, ctx.session.sessionId, '/dashboard/members', `${member.email} now has the role ${member.role} in ${ctx.organization.name}.`);
  });

  app.post<{ Params: { userId: string } }>('/dashboard/members/:userId/remove', async (req, reply) => {
    const { ctx, userId, params } = managedMember(req);
    const organization = ctx.organization;
    // The page names the member: for those who may see the Members page.
    if (params.confirm !== 'remove') requireView(ctx, 'members.read');
    // What removing would refuse is refused before asking: no such member, a role the user's may not take away, the last owner.
    await checkMemberRemoval(db, { organizationId: organization.id, userId }, memberChange(ctx));
    const member = await getMember(db, organization.id, userId);
    const self = userId === ctx.session.userId;
    // The apps they connected here: revoked after the removal (a job); their tokens stop at once.
    const grants = await countLiveGrants(db, { organizationId: organization.id, userId }, { cap: GRANT_COUNT_CAP });
    if (params.confirm !== 'remove') {
      return renderPage(reply, 200, 'dashboard/member-remove', {
        title: self ? `Leave ${organization.name}` : `Remove ${member.email}`,
        ctx,
        active: 'members',
        member,
        self,
        grants,
        grantsText: count(grants, 'connected app', 'connected apps', GRANT_COUNT_CAP),
        path: `/dashboard/members/${member.user_id}/remove`,
      });
    }
    // Ends their tokens at once and queues the revocation of the grants they gave here (and refuses to remove the last owner).
    await removeMember(db, { organizationId: organization.id, userId }, memberChange(ctx));
    const apps = count(grants, 'connected app', 'connected apps', GRANT_COUNT_CAP);
    if (self) {
      const notice = `You left ${organization.name}.${grants > 0 ? ` Your ${apps} there lost access: every token you had there stopped working.` : ''}`;
      return redirectWithNotice(reply, config, ctx.session.sessionId, '/dashboard', notice);
    }
    const notice = `Removed ${member.email} from ${organization.name}.${grants > 0 ? ` Their ${apps} lost access: every token they had there stopped working.` : ' They had no connected apps there.'}`;
    return redirectWithNotice(reply, config, ctx.session.sessionId, '/dashboard/members', notice);
  });

  // Audit log: newest first, keyset pagination on id (`?before=<id>`).
  app.get<{ Querystring: { before?: unknown } }>('/dashboard/audit', async (req, reply) => {
    const ctx = dashboardContext(req);
    requireView(ctx, 'audit.read');
    const before = parseId(req.query.before);
    const rows = ctx.organization ? await listAuditEvents(db, ctx.organization.id, { beforeId: before, limit: AUDIT_PAGE_SIZE + 1 }) : [];
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
