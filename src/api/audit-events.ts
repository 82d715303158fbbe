/** The management API's audit log: the organization's events, newest first. */
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { type AuditEventRow, listAuditEvents } from '../audit/events.js';
import type { DB } from '../db/connect.js';
import { authOf } from './auth.js';
import { decodeDescendingCursor, listPage, listQuery } from './pagination.js';
import { errorResponses, listOf, orgParams } from './schemas.js';

export const auditEventSchema = z
  .object({
    id: z.number().int(),
    action: z.string().describe('e.g. application.created, application.secret_rotated, member.role_changed, grant.revoked'),
    actor: z
      .object({
        user_id: z.number().int().nullable(),
        email: z.string().nullable(),
        client_id: z.string().nullable().describe('the application that acted (the management API, /oauth/revoke), or that the user authorized'),
      })
      .describe('all null: the system or the operator’s CLI'),
    details: z.record(z.string(), z.unknown()),
    created_at: z.iso.datetime(),
  })
  .meta({ id: 'AuditEvent' });

export function auditEventOut(e: AuditEventRow): z.infer<typeof auditEventSchema> {
  return {
    id: e.id,
    action: e.action,
    actor: { user_id: e.actor_user_id, email: e.actor_email, client_id: e.actor_client_id },
    details: e.details,
    created_at: e.created_at.toISOString(),
  };
}

export const auditEventRoutes: FastifyPluginAsyncZod<{ db: DB }> = async (app, { db }) => {
  app.get(
    '/audit-events',
    {
      config: { scope: 'audit.read' },
      schema: { tags: ['audit'], summary: 'List audit events, newest first', params: orgParams, querystring: z.object(listQuery), response: { 200: listOf(auditEventSchema), ...errorResponses } },
    },
    async (req) =>
      listPage(req.query.limit, (limit) => listAuditEvents(db, authOf(req).organizationId, { beforeId: decodeDescendingCursor(req.query.cursor), limit }), (e) => e.id, auditEventOut),
  );
};
