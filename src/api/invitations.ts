/**
 * The management API's invitations: invite an address with a role (members.write), list the
 * pending ones (members.read), send one again with a new link, revoke one. An application
 * invites to roles whose permissions its token holds (never an owner); the email names the application as the inviter.
 */
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import {
  createInvitation,
  getPendingInvitation,
  type InvitationActor,
  listPendingInvitations,
  type PendingInvitation,
  resendInvitation,
  revokeInvitation,
} from '../accounts/invitations.js';
import { requireRole } from '../accounts/roles.js';
import { roleField } from './members.js';
import type { DB } from '../db/connect.js';
import type { MailOutbox } from '../mail/outbox.js';
import { actingRoleOf, actorOf, type ApiAuth, authOf, pathId } from './auth.js';
import { decodeCursor, listPage, listQuery } from './pagination.js';
import { errorResponses, errorSchema, listOf, orgParams } from './schemas.js';

export const invitationSchema = z
  .object({
    id: z.number().int(),
    email: z.string(),
    role: z.string().describe('the role’s name'),
    status: z.enum(['pending', 'expired']).describe('expired invitations stay listed until revoked or re-sent'),
    invited_by_user_id: z.number().int().nullable(),
    invited_by_client_id: z.string().nullable(),
    created_at: z.iso.datetime(),
    sent_at: z.iso.datetime().describe('when the current link was sent'),
    expires_at: z.iso.datetime(),
  })
  .meta({ id: 'Invitation' });

function invitationOut(i: PendingInvitation): z.infer<typeof invitationSchema> {
  return {
    id: i.id,
    email: i.email,
    role: i.role,
    status: i.status,
    invited_by_user_id: i.invited_by_user_id,
    invited_by_client_id: i.invited_by_client_id,
    created_at: i.created_at.toISOString(),
    sent_at: i.sent_at.toISOString(),
    expires_at: i.expires_at.toISOString(),
  };
}

const invitationParams = orgParams.extend({ id: z.string() });
const invitationConflict = { 409: errorSchema.describe('refused: the address already belongs to a member, or too many invitations were sent in the last hour') };

export const invitationRoutes: FastifyPluginAsyncZod<{ db: DB; mail: MailOutbox; issuer: string }> = async (app, { db, mail, issuer }) => {
  const mailDeps = { mail, issuer };

  async function asApplication(auth: ApiAuth): Promise<InvitationActor> {
    const application = await db.selectFrom('applications').select('name').where('client_id', '=', auth.claims.client_id).executeTakeFirst();
    return { actor: actorOf(auth), actingAs: actingRoleOf(auth), inviterLabel: application ? `The application “${application.name}”` : 'An application' };
  }

  app.get(
    '/invitations',
    {
      config: { scope: 'members.read' },
      schema: {
        tags: ['members'],
        summary: 'List pending invitations (not accepted or revoked; expired ones included), in id order',
        params: orgParams,
        querystring: z.object(listQuery),
        response: { 200: listOf(invitationSchema), ...errorResponses },
      },
    },
    async (req) =>
      listPage(req.query.limit, (limit) => listPendingInvitations(db, authOf(req).organizationId, { afterId: decodeCursor(req.query.cursor), limit }), (i) => i.id, invitationOut),
  );

  app.get(
    '/invitations/:id',
    {
      config: { scope: 'members.read' },
      schema: { tags: ['members'], summary: 'Get a pending invitation', params: invitationParams, response: { 200: invitationSchema, ...errorResponses } },
    },
    async (req) => invitationOut(await getPendingInvitation(db, authOf(req).organizationId, pathId(req.params.id))),
  );

  app.post(
    '/invitations',
    {
      config: { scope: 'members.write' },
      schema: {
        tags: ['members'],
        summary: 'Invite an email address with a role; a pending invitation to the same address is replaced',
        params: orgParams,
        body: z.strictObject({
          email: z.string().max(254),
          role: roleField,
        }),
        response: { 201: invitationSchema, ...errorResponses, ...invitationConflict },
      },
    },
    async (req, reply) => {
      const auth = authOf(req);
      const role = await requireRole(db, auth.organizationId, req.body.role);
      const invitation = await createInvitation(db, { organizationId: auth.organizationId, email: req.body.email, role }, await asApplication(auth), mailDeps);
      reply.code(201).header('location', `/api/v1/${auth.organizationId}/invitations/${invitation.id}`);
      return invitationOut(invitation);
    },
  );

  app.post(
    '/invitations/:id/resend',
    {
      config: { scope: 'members.write' },
      schema: {
        tags: ['members'],
        summary: 'Send an invitation again with a new link and a new expiry; the old link stops working',
        params: invitationParams,
        response: { 200: invitationSchema, ...errorResponses, ...invitationConflict },
      },
    },
    async (req) => {
      const auth = authOf(req);
      return invitationOut(await resendInvitation(db, auth.organizationId, pathId(req.params.id), await asApplication(auth), mailDeps));
    },
  );

  app.delete(
    '/invitations/:id',
    {
      config: { scope: 'members.write' },
      schema: { tags: ['members'], summary: 'Revoke a pending invitation: its link stops working', params: invitationParams, response: { 204: z.null().describe('revoked'), ...errorResponses } },
    },
    async (req, reply) => {
      const auth = authOf(req);
      await revokeInvitation(db, auth.organizationId, pathId(req.params.id), { actor: actorOf(auth), actingAs: actingRoleOf(auth) });
      return reply.code(204).send(null);
    },
  );
};
