/**
 * The management API's connected apps: the organization's live grants (an application
 * authorized by a user, or a private application's own), newest first, and their revocation.
 */
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import type { DB } from '../db/connect.js';
import { NotFoundError } from '../errors.js';
import { findLiveGrant, type LiveGrant, listLiveGrants } from '../oauth/models/grants.js';
import type { RevocationList } from '../oauth/models/revocation-list.js';
import { actorOf, authOf, pathId } from './auth.js';
import { decodeDescendingCursor, listPage, listQuery } from './pagination.js';
import { errorResponses, listOf, orgParams } from './schemas.js';

export const grantSchema = z
  .object({
    id: z.number().int(),
    application: z.object({ client_id: z.string(), name: z.string(), type: z.enum(['public', 'private']) }),
    user: z.object({ id: z.number().int(), email: z.string() }).nullable().describe('who authorized it; null: a private application acting for itself'),
    scopes: z.array(z.string()),
    created_at: z.iso.datetime(),
    last_used_at: z.iso.datetime().nullable().describe('last token issued under it (a refresh, or a client_credentials token)'),
  })
  .meta({ id: 'Grant' });

export function grantOut(g: LiveGrant): z.infer<typeof grantSchema> {
  return {
    id: g.id,
    application: { client_id: g.application_client_id, name: g.application_name, type: g.application_type },
    user: g.user_id === null ? null : { id: g.user_id, email: g.user_email ?? '' },
    scopes: g.scopes,
    created_at: g.created_at.toISOString(),
    last_used_at: g.last_used_at?.toISOString() ?? null,
  };
}

const grantParams = orgParams.extend({ id: z.string() });

export const grantRoutes: FastifyPluginAsyncZod<{ db: DB; revocations: RevocationList }> = async (app, { db, revocations }) => {
  async function liveGrant(organizationId: number, id: string): Promise<LiveGrant> {
    const grant = await findLiveGrant(db, organizationId, pathId(id));
    if (!grant) throw new NotFoundError('no such connected app in this organization');
    return grant;
  }

  app.get(
    '/grants',
    {
      config: { scope: 'grants.read' },
      schema: { tags: ['grants'], summary: 'List the connected apps (live grants), newest first', params: orgParams, querystring: z.object(listQuery), response: { 200: listOf(grantSchema), ...errorResponses } },
    },
    async (req) =>
      listPage(req.query.limit, (limit) => listLiveGrants(db, authOf(req).organizationId, { beforeId: decodeDescendingCursor(req.query.cursor), limit }), (g) => g.id, grantOut),
  );

  app.get(
    '/grants/:id',
    {
      config: { scope: 'grants.read' },
      schema: { tags: ['grants'], summary: 'Get a connected app', params: grantParams, response: { 200: grantSchema, ...errorResponses } },
    },
    async (req) => grantOut(await liveGrant(authOf(req).organizationId, req.params.id)),
  );

  app.delete(
    '/grants/:id',
    {
      config: { scope: 'grants.write' },
      schema: {
        tags: ['grants'],
        summary: 'Revoke a connected app: its access and refresh tokens stop working on every instance within a second',
        params: grantParams,
        response: { 204: z.null().describe('revoked'), ...errorResponses },
      },
    },
    async (req, reply) => {
      const auth = authOf(req);
      const grant = await liveGrant(auth.organizationId, req.params.id);
      await revocations.revoke(grant.id, 'revoked_by_admin', actorOf(auth));
      return reply.code(204).send(null);
    },
  );
};
