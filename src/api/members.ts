/**
 * The management API's members: list, read, add (an existing user, by email), change a role,
 * remove. An application acts with the scopes its token holds (applicationRole, mayAssign): it
 * gives or takes away only roles whose every permission its token holds (so a private application
 * with members.write cannot promote someone beyond its own scopes), and creating, changing or
 * removing an owner stays a person's decision. The last
 * owner is protected by the domain (RO-3), whoever asks.
 */
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { addMember, changeMemberRole, getMember, listMembers, type Member, type MemberChangeOptions, removeMember } from '../accounts/organizations.js';
import { requireRole } from '../accounts/roles.js';
import { emailSchema, findUserByEmail } from '../accounts/users.js';
import type { DB } from '../db/connect.js';
import { InvalidRequestError } from '../errors.js';
import type { RevocationList } from '../oauth/models/revocation-list.js';
import { actingRoleOf, actorOf, type ApiAuth, authOf, pathId } from './auth.js';
import { decodeCursor, listPage, listQuery } from './pagination.js';
import { conflictResponse, errorResponses, listOf, orgParams } from './schemas.js';

export const memberSchema = z
  .object({
    user_id: z.number().int(),
    email: z.string(),
    name: z.string(),
    role: z.string().describe('the role’s name: owner, admin, member, viewer or one of the organization’s own (GET /roles)'),
    two_step: z.boolean().describe('whether the member has a second factor (an authenticator app or a passkey)'),
    created_at: z.iso.datetime().describe('when the user joined the organization'),
  })
  .meta({ id: 'Member' });

export function memberOut(m: Member): z.infer<typeof memberSchema> {
  return { user_id: m.user_id, email: m.email, name: m.name, role: m.role, two_step: m.two_step, created_at: m.created_at.toISOString() };
}

export const roleField = z
  .string()
  .max(200)
  .describe('a role’s name: owner, admin, member, viewer or one of the organization’s own (GET /roles); owner is for people only: an application cannot make, change or remove an owner');
const userParams = orgParams.extend({ user_id: z.string() });

export const memberRoutes: FastifyPluginAsyncZod<{ db: DB; revocations: RevocationList }> = async (app, { db, revocations }) => {
  /** An application administers its organization with the permissions its token holds. */
  const asApplication = (auth: ApiAuth): MemberChangeOptions => ({ actor: actorOf(auth), actingAs: actingRoleOf(auth), revocations });

  app.get(
    '/members',
    {
      config: { scope: 'members.read' },
      schema: { tags: ['members'], summary: 'List members, in user id order', params: orgParams, querystring: z.object(listQuery), response: { 200: listOf(memberSchema), ...errorResponses } },
    },
    async (req) =>
      listPage(req.query.limit, (limit) => listMembers(db, authOf(req).organizationId, { afterUserId: decodeCursor(req.query.cursor), limit }), (m) => m.user_id, memberOut),
  );

  app.get(
    '/members/:user_id',
    {
      config: { scope: 'members.read' },
      schema: { tags: ['members'], summary: 'Get a member', params: userParams, response: { 200: memberSchema, ...errorResponses } },
    },
    async (req) => memberOut(await getMember(db, authOf(req).organizationId, pathId(req.params.user_id))),
  );

  app.post(
    '/members',
    {
      config: { scope: 'members.write' },
      schema: {
        tags: ['members'],
        summary: 'Add an existing user to the organization',
        params: orgParams,
        body: z.strictObject({ email: z.string(), role: roleField }),
        response: { 201: memberSchema, ...errorResponses, ...conflictResponse },
      },
    },
    async (req, reply) => {
      const auth = authOf(req);
      const email = emailSchema.safeParse(req.body.email);
      const user = email.success ? await findUserByEmail(db, email.data) : undefined;
      if (!user) throw new InvalidRequestError('email: no user has this email address', { details: [{ path: 'email', message: 'no user has this email address' }] });
      const role = await requireRole(db, auth.organizationId, req.body.role);
      await addMember(db, { organizationId: auth.organizationId, userId: user.id, role }, asApplication(auth));
      reply.code(201).header('location', `/api/v1/${auth.organizationId}/members/${user.id}`);
      return memberOut(await getMember(db, auth.organizationId, user.id));
    },
  );

  app.patch(
    '/members/:user_id',
    {
      config: { scope: 'members.write' },
      schema: {
        tags: ['members'],
        summary: "Change a member's role",
        params: userParams,
        body: z.strictObject({ role: roleField }),
        response: { 200: memberSchema, ...errorResponses, ...conflictResponse },
      },
    },
    async (req) => {
      const auth = authOf(req);
      const userId = pathId(req.params.user_id);
      const role = await requireRole(db, auth.organizationId, req.body.role);
      await changeMemberRole(db, { organizationId: auth.organizationId, userId, role }, asApplication(auth));
      return memberOut(await getMember(db, auth.organizationId, userId));
    },
  );

  app.delete(
    '/members/:user_id',
    {
      config: { scope: 'members.write' },
      schema: {
        tags: ['members'],
        summary: 'Remove a member; every grant they gave in this organization is revoked',
        params: userParams,
        response: { 204: z.null().describe('removed'), ...errorResponses, ...conflictResponse },
      },
    },
    async (req, reply) => {
      const auth = authOf(req);
      await removeMember(db, { organizationId: auth.organizationId, userId: pathId(req.params.user_id) }, asApplication(auth));
      return reply.code(204).send(null);
    },
  );
};
