/**
 * The management API's roles: the organization's built-in roles and its own (GET), and its own
 * created, changed and deleted (members.write). A role is named in the path by its name (built-in
 * ones by their lower-case name; the organization's own ignoring case). An application acts with
 * the scopes its token holds (applicationRole): it creates or edits a role only with permissions
 * its token holds, so a token cannot be used to mint a role wider than itself. Changing or deleting a role
 * narrows the grants of its members that held a permission it lost (see src/accounts/roles.ts).
 */
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { createRole, deleteRole, getRole, listRoles, PERMISSION_DESCRIPTIONS, PERMISSIONS, type RoleChangeOptions, type RoleView, updateRole } from '../accounts/roles.js';
import type { DB } from '../db/connect.js';
import type { RevocationList } from '../oauth/models/revocation-list.js';
import { actingRoleOf, actorOf, type ApiAuth, authOf } from './auth.js';
import { conflictResponse, errorResponses, orgParams } from './schemas.js';

export const roleSchema = z
  .object({
    name: z.string(),
    builtin: z.boolean().describe('built-in roles exist in every organization and cannot be changed or deleted'),
    description: z.string(),
    permissions: z
      .array(z.string())
      .describe(
        'scope names: what the role may do and let applications do — orgauth’s permissions, and scopes registered resources declare (owner, admin and member hold all of those without listing them)',
      ),
    created_at: z.iso.datetime().nullable(),
    updated_at: z.iso.datetime().nullable(),
  })
  .meta({ id: 'Role' });

export function roleOut(r: RoleView): z.infer<typeof roleSchema> {
  return {
    name: r.name,
    builtin: r.builtin,
    description: r.description,
    permissions: [...r.permissions],
    created_at: r.created_at?.toISOString() ?? null,
    updated_at: r.updated_at?.toISOString() ?? null,
  };
}

const roleParams = orgParams.extend({ role: z.string().max(200) });
const permissionsField = z
  .array(z.string())
  .describe(`any of: ${PERMISSIONS.map((p) => `${p} (${PERMISSION_DESCRIPTIONS[p]})`).join('; ')}; and any scope a registered resource declares (orgauth resource list)`);

export const roleRoutes: FastifyPluginAsyncZod<{ db: DB; revocations: RevocationList }> = async (app, { db, revocations }) => {
  const asApplication = (auth: ApiAuth): RoleChangeOptions => ({ actor: actorOf(auth), actingAs: actingRoleOf(auth), revocations });

  app.get(
    '/roles',
    {
      config: { scope: 'members.read' },
      schema: {
        tags: ['roles'],
        summary: 'List every role: the built-in ones, then the organization’s own by name (at most 100, so all in one page)',
        params: orgParams,
        response: { 200: z.object({ data: z.array(roleSchema) }), ...errorResponses },
      },
    },
    async (req) => ({ data: (await listRoles(db, authOf(req).organizationId)).map(roleOut) }),
  );

  app.get(
    '/roles/:role',
    {
      config: { scope: 'members.read' },
      schema: { tags: ['roles'], summary: 'Get a role by name', params: roleParams, response: { 200: roleSchema, ...errorResponses } },
    },
    async (req) => roleOut(await getRole(db, authOf(req).organizationId, req.params.role)),
  );

  app.post(
    '/roles',
    {
      config: { scope: 'members.write' },
      schema: {
        tags: ['roles'],
        summary: 'Create a custom role',
        params: orgParams,
        body: z.strictObject({ name: z.string(), description: z.string().optional(), permissions: permissionsField }),
        response: { 201: roleSchema, ...errorResponses, ...conflictResponse },
      },
    },
    async (req, reply) => {
      const auth = authOf(req);
      const role = await createRole(db, auth.organizationId, req.body, asApplication(auth));
      reply.code(201).header('location', `/api/v1/${auth.organizationId}/roles/${encodeURIComponent(role.name)}`);
      return roleOut(role);
    },
  );

  app.patch(
    '/roles/:role',
    {
      config: { scope: 'members.write' },
      schema: {
        tags: ['roles'],
        summary: "Rename a custom role, or change its description or permissions; its members' grants lose at once what it loses",
        params: roleParams,
        body: z.strictObject({ name: z.string().optional(), description: z.string().optional(), permissions: permissionsField.optional() }),
        response: { 200: roleSchema, ...errorResponses, ...conflictResponse },
      },
    },
    async (req) => {
      const auth = authOf(req);
      return roleOut(await updateRole(db, auth.organizationId, req.params.role, req.body, asApplication(auth)));
    },
  );

  app.delete(
    '/roles/:role',
    {
      config: { scope: 'members.write' },
      schema: {
        tags: ['roles'],
        summary: 'Delete a custom role; a role members hold needs move_to, the role they move to',
        params: roleParams,
        querystring: z.object({ move_to: z.string().max(200).optional() }),
        response: { 204: z.null().describe('deleted'), ...errorResponses, ...conflictResponse },
      },
    },
    async (req, reply) => {
      const auth = authOf(req);
      await deleteRole(db, auth.organizationId, req.params.role, { moveTo: req.query.move_to }, asApplication(auth));
      return reply.code(204).send(null);
    },
  );
};
