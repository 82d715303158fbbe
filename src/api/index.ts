/**
 * Everything under /api/v1/:organization_id, in one encapsulated plugin: the authentication and
 * organization hook, the scope check, JSON-only bodies, and zod schemas that validate, serialize
 * and document each route from one definition.
 */
import type { FastifyInstance } from 'fastify';
import { validatorCompiler, type ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import type { DpopProofs } from '../oauth/models/dpop-proofs.js';
import type { Config } from '../config.js';
import type { DB } from '../db/connect.js';
import type { MailOutbox } from '../mail/outbox.js';
import { getOrganization, updateOrganization } from '../accounts/organizations.js';
import type { Organization } from '../db/schema.js';
import type { KeyStore } from '../oauth/models/key-store.js';
import type { RevocationList } from '../oauth/models/revocation-list.js';
import type { ApplicationCache } from '../oauth/models/application-cache.js';
import { applicationRoutes } from './applications.js';
import { auditEventRoutes } from './audit-events.js';
import { actorOf, authenticateApiRequest, authOf } from './auth.js';
import { contactRoutes } from './contacts.js';
import { directoryRoutes } from './directories.js';
import { domainRoutes } from './domains.js';
import { registerApiRateLimit } from './rate-limit.js';
import { grantRoutes } from './grants.js';
import { invitationRoutes } from './invitations.js';
import { memberRoutes } from './members.js';
import { roleRoutes } from './roles.js';
import { errorResponses, orgParams, serializerCompiler } from './schemas.js';
import { ssoConnectionRoutes } from './sso-connections.js';
import { taskRoutes } from './tasks.js';
import { activityRoutes } from './activity.js';
import { webhookRoutes } from './webhooks.js';
import type { RoleScopes } from '../accounts/role-scopes.js';

export const API_PREFIX = '/api/v1/:organization_id';

const organizationSchema = z
  .object({
    id: z.number().int(),
    name: z.string(),
    require_mfa: z.boolean().describe('Members reach the organization only after signing in with two factors'),
    created_at: z.iso.datetime(),
  })
  .meta({ id: 'Organization' });

const organizationOut = (org: Organization) => ({ id: org.id, name: org.name, require_mfa: org.require_mfa, created_at: org.created_at.toISOString() });

export async function apiRoutes(
  app: FastifyInstance,
  options: { db: DB; keys: KeyStore; revocations: RevocationList; applications: ApplicationCache; config: Config; mail: MailOutbox; roles: RoleScopes; dpop: DpopProofs },
): Promise<void> {
  app.setValidatorCompiler(validatorCompiler);
  app.setSerializerCompiler(serializerCompiler);
  // JSON bodies only: a form is 415 here, not a parsed object.
  app.removeContentTypeParser('application/x-www-form-urlencoded');
  app.decorateRequest('auth', null);
  app.decorateRequest('refusedFor', null);
  app.addHook('onRequest', authenticateApiRequest(options));
  // The Overview's API counts: answers by class for the token's organization, and the tokens
  // this server signed that the gate refused (expired, revoked, another organization's path,
  // short of scope, a bad proof), counted for the token's organization. A request without a
  // token this server signed counts for nobody: nobody can inflate another's counts.
  app.addHook('onResponse', async (req, reply) => {
    const organizationId = req.auth?.organizationId ?? req.refusedFor;
    if (organizationId === null) return;
    const status = reply.statusCode;
    req.server.activity.count(organizationId, status >= 500 ? 'api_5xx' : status >= 400 ? 'api_4xx' : 'api_2xx');
    if (req.auth === null && (status === 401 || status === 403)) req.server.activity.count(organizationId, 'api_refused');
  });
  await registerApiRateLimit(app, options.config);
  app.addHook('onSend', async (_req, reply, payload) => {
    reply.header('cache-control', 'no-store');
    return payload;
  });

  const api = app.withTypeProvider<ZodTypeProvider>();
  api.get(
    '/',
    {
      config: { scope: null },
      schema: {
        tags: ['organization'],
        summary: 'The organization the token is for',
        params: orgParams,
        response: { 200: organizationSchema, ...errorResponses },
      },
    },
    async (req) => organizationOut(await getOrganization(options.db, authOf(req).organizationId)),
  );
  api.patch(
    '/',
    {
      // The requirement guards the members' sign-in: the scope that manages members changes it.
      config: { scope: 'members.write' },
      schema: {
        tags: ['organization'],
        summary: "Rename the organization, or turn its two-step sign-in requirement on or off",
        params: orgParams,
        body: z.strictObject({ name: z.string().optional(), require_mfa: z.boolean().optional() }),
        response: { 200: organizationSchema, ...errorResponses },
      },
    },
    async (req) => {
      const auth = authOf(req);
      return organizationOut(await updateOrganization(options.db, auth.organizationId, { name: req.body.name, requireMfa: req.body.require_mfa }, actorOf(auth)));
    },
  );
  await api.register(contactRoutes, { db: options.db });
  await api.register(taskRoutes, { db: options.db });
  // The management API: the organization's own private applications administering it.
  await api.register(applicationRoutes, { db: options.db, revocations: options.revocations, applications: options.applications, config: options.config });
  await api.register(memberRoutes, { db: options.db, revocations: options.revocations });
  await api.register(roleRoutes, { db: options.db, revocations: options.revocations });
  await api.register(invitationRoutes, { db: options.db, mail: options.mail, issuer: options.config.issuer });
  await api.register(grantRoutes, { db: options.db, revocations: options.revocations });
  await api.register(auditEventRoutes, { db: options.db });
  await api.register(activityRoutes, { db: options.db });
  // Single sign-on: the organization's identity providers and the email domains routed to them.
  await api.register(ssoConnectionRoutes, { db: options.db, config: options.config });
  await api.register(domainRoutes, { db: options.db, config: options.config });
  // Signed webhooks: the organization's endpoints and the log of what was sent to them.
  await api.register(webhookRoutes, { db: options.db, config: options.config });
  // Directory sync (SCIM): the organization's SCIM clients.
  await api.register(directoryRoutes, { db: options.db, issuer: options.config.issuer });
}
