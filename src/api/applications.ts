/**
 * The management API's applications: list, read, create, change, rotate the secret, delete.
 * The rules are the domain's (src/oauth/models/applications.ts), shared with the dashboard and the CLI;
 * this file adds only what is particular to an application administering its own organization:
 * it may not lock itself out (refuseSelfLockout), nor act beyond its token's scopes
 * (refuseBeyondToken).
 */
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { type DB, inTransaction } from '../db/connect.js';
import { type Application, ID_TOKEN_ALGS } from '../db/schema.js';
import type { Config } from '../config.js';
import { ConflictError, ForbiddenError } from '../errors.js';
import type { ApplicationCache } from '../oauth/models/application-cache.js';
import {
  type ApplicationChanges,
  type ChangeOptions,
  createApplication,
  deleteApplication,
  getApplication,
  listApplications,
  rotateClientSecret,
  updateApplication,
} from '../oauth/models/applications.js';
import type { RevocationList } from '../oauth/models/revocation-list.js';
import { applicationScopes } from '../oauth/helpers/scopes.js';
import { actorOf, type ApiAuth, authOf } from './auth.js';
import { decodeCursor, listPage, listQuery } from './pagination.js';
import { conflictResponse, errorResponses, listOf, orgParams } from './schemas.js';

export const applicationSchema = z
  .object({
    client_id: z.string(),
    type: z.enum(['public', 'private']),
    name: z.string(),
    redirect_uris: z.array(z.string()),
    post_logout_redirect_uris: z.array(z.string()).describe('where RP-initiated logout (GET /oauth/logout) may send the browser afterwards'),
    scopes: z.array(z.string()),
    require_pkce: z.boolean(),
    disabled: z.boolean(),
    token_endpoint_auth_method: z.enum(['client_secret_basic', 'client_secret_post', 'private_key_jwt', 'none']).describe('RFC 7591: how the application authenticates at the token endpoint'),
    jwks: z.object({ keys: z.array(z.record(z.string(), z.unknown())) }).nullable().describe('private_key_jwt: the public keys, inline (RFC 7591)'),
    jwks_uri: z.string().nullable().describe('private_key_jwt: where the public keys are published'),
    dpop_bound_access_tokens: z.boolean().describe('RFC 9449: every access token is DPoP-bound; a token request without a DPoP proof is refused'),
    require_pushed_authorization_requests: z.boolean().describe('RFC 9126: authorization requests only through /oauth/par'),
    id_token_signed_response_alg: z.enum(ID_TOKEN_ALGS).describe('the algorithm of its ID tokens'),
    fapi2: z
      .boolean()
      .describe(
        'the FAPI 2.0 Security Profile: PAR, PKCE S256, DPoP-bound tokens, private_key_jwt only, iss in the response, codes valid 60 s, refresh tokens not rotated; mutual TLS (RFC 8705) is out of scope',
      ),
    created_at: z.iso.datetime(),
    updated_at: z.iso.datetime(),
    secret_rotated_at: z.iso.datetime().nullable(),
  })
  .meta({ id: 'Application' });

/** The fields of an application that leave the server (API and CLI): never its secret or the secret's hash. */
export function applicationOut(a: Application & { type: 'public' | 'private' }): z.infer<typeof applicationSchema> {
  return {
    client_id: a.client_id,
    type: a.type,
    name: a.name,
    redirect_uris: a.redirect_uris,
    post_logout_redirect_uris: a.post_logout_redirect_uris,
    scopes: a.scopes,
    require_pkce: a.require_pkce,
    disabled: a.disabled,
    token_endpoint_auth_method: a.token_endpoint_auth_method,
    jwks: a.jwks as { keys: Record<string, unknown>[] } | null,
    jwks_uri: a.jwks_uri,
    dpop_bound_access_tokens: a.dpop_bound_access_tokens,
    require_pushed_authorization_requests: a.require_pushed_authorization_requests,
    id_token_signed_response_alg: a.id_token_signed_response_alg,
    fapi2: a.fapi2,
    created_at: a.created_at.toISOString(),
    updated_at: a.updated_at.toISOString(),
    secret_rotated_at: a.secret_rotated_at?.toISOString() ?? null,
  };
}

const withSecretSchema = applicationSchema
  .extend({ client_secret: z.string().optional().describe('shown in this response only: orgauth keeps only its hash; none for an application on private_key_jwt') })
  .meta({ id: 'ApplicationWithSecret' });
const secretSchema = z
  .object({ client_id: z.string(), client_secret: z.string().describe('shown in this response only; the previous secret no longer works') })
  .meta({ id: 'ClientSecret' });

// Types only: the domain checks the values and names the field in `details` (one set of rules
// for the API, the dashboard and the CLI).
const scopesField = z.array(z.string()).max(50).describe('the scopes the application may be granted; management scopes for private applications only');
const urisField = z.array(z.string()).max(50);
const postLogoutUrisField = urisField.describe(
  'public applications only: where RP-initiated logout may send the browser afterwards (post_logout_redirect_uri, compared byte for byte); at most 20, with the rules of redirect_uris',
);
/** The high-assurance fields (RFC 7591, RFC 9449, RFC 9126 names), for create and change alike. */
const assuranceFields = {
  token_endpoint_auth_method: z.enum(['client_secret_basic', 'client_secret_post', 'private_key_jwt']).optional().describe('private_key_jwt needs jwks or jwks_uri, and ends the client secret; back to a secret: rotate it'),
  jwks: z.unknown().optional().describe('private_key_jwt: a JWK Set of public keys (1 to 20; EC P-256/384/521, RSA ≥ 2048 bits, Ed25519); null removes it'),
  jwks_uri: z.string().nullable().optional().describe('private_key_jwt: an https URL of the JWK Set, fetched with the outbound rules; null removes it'),
  dpop_bound_access_tokens: z.boolean().optional(),
  require_pushed_authorization_requests: z.boolean().optional(),
  id_token_signed_response_alg: z.enum(ID_TOKEN_ALGS).optional(),
  fapi2: z.boolean().optional(),
};
type AssuranceBody = { [K in keyof typeof assuranceFields]?: z.infer<(typeof assuranceFields)[K]> };

/** The high-assurance fields of a body as the domain's changes. */
function assuranceChanges(b: AssuranceBody): ApplicationChanges {
  return {
    tokenEndpointAuthMethod: b.token_endpoint_auth_method,
    ...(b.jwks !== undefined ? { jwks: b.jwks } : {}),
    jwksUri: b.jwks_uri,
    dpopBoundAccessTokens: b.dpop_bound_access_tokens,
    requirePushedAuthorizationRequests: b.require_pushed_authorization_requests,
    idTokenSignedResponseAlg: b.id_token_signed_response_alg,
    fapi2: b.fapi2,
  };
}

const newApplicationBody = z.strictObject({
  type: z.enum(['public', 'private']),
  name: z.string(),
  redirect_uris: urisField.optional().describe('public applications: at least one; private applications: none'),
  post_logout_redirect_uris: postLogoutUrisField.optional(),
  scopes: scopesField.optional().describe('the data scopes when omitted'),
  require_pkce: z.boolean().optional(),
  ...assuranceFields,
});
const applicationPatchBody = z
  .strictObject({
    name: z.string().optional(),
    redirect_uris: urisField.optional(),
    post_logout_redirect_uris: postLogoutUrisField.optional(),
    scopes: scopesField.optional().describe('removing a scope revokes the grants that hold it'),
    require_pkce: z.boolean().optional(),
    disabled: z.boolean().optional().describe('disabling revokes every grant of the application'),
    ...assuranceFields,
  })
  .refine((v) => Object.keys(v).length > 0, 'send at least one field');
const clientIdParams = orgParams.extend({ client_id: z.string() });

/**
 * An integration cannot lock its own organization out by accident: it may not delete or
 * disable itself, nor give up applications.write, in one request. (It may rotate its own secret:
 * the new one is in the response.) A person in the dashboard, or another application, can.
 */
function refuseSelfLockout(auth: ApiAuth, application: Application, change: 'delete' | { disabled?: boolean | undefined; scopes?: readonly string[] | undefined }): void {
  if (application.client_id !== auth.claims.client_id) return;
  const what =
    change === 'delete'
      ? 'delete itself'
      : change.disabled === true
        ? 'disable itself'
        : change.scopes !== undefined && !change.scopes.includes('applications.write')
          ? 'remove applications.write from itself'
          : undefined;
  if (what) throw new ConflictError(`an application cannot ${what}; use another application with applications.write, or the dashboard`);
}

/**
 * applications.write is no master key: an application never hands out more than its token
 * holds. It may give an application only scopes its token has, and it may change, rotate the
 * secret of, disable or delete only applications whose scopes its token has, so it can neither
 * widen itself, nor create a wider sibling, nor take over a wider one through its secret.
 */
function refuseBeyondToken(auth: ApiAuth, scopes: readonly string[], whose: 'given' | 'held'): void {
  const missing = scopes.filter((s) => !auth.scopes.has(s));
  if (missing.length === 0) return;
  throw new ForbiddenError(
    whose === 'given'
      ? `an application can give only scopes its token holds; the token lacks ${missing.join(' ')}`
      : `this application holds scopes the token lacks (${missing.join(' ')}), so the token cannot change it`,
  );
}

export const applicationRoutes: FastifyPluginAsyncZod<{ db: DB; revocations: RevocationList; applications: ApplicationCache; config: Config }> = async (app, deps) => {
  const { db, config } = deps;
  const changeOptions = (auth: ApiAuth): ChangeOptions => ({ actor: actorOf(auth), revocations: deps.revocations, applications: deps.applications });

  app.get(
    '/applications',
    {
      config: { scope: 'applications.read' },
      schema: { tags: ['applications'], summary: 'List applications', params: orgParams, querystring: z.object(listQuery), response: { 200: listOf(applicationSchema), ...errorResponses } },
    },
    async (req) =>
      listPage(req.query.limit, (limit) => listApplications(db, authOf(req).organizationId, { afterId: decodeCursor(req.query.cursor), limit }), (a) => a.id, applicationOut),
  );

  app.get(
    '/applications/:client_id',
    {
      config: { scope: 'applications.read' },
      schema: { tags: ['applications'], summary: 'Get an application', params: clientIdParams, response: { 200: applicationSchema, ...errorResponses } },
    },
    async (req) => applicationOut(await getApplication(db, authOf(req).organizationId, req.params.client_id)),
  );

  app.post(
    '/applications',
    {
      config: { scope: 'applications.write' },
      schema: {
        tags: ['applications'],
        summary: 'Create an application; the response holds its client secret, shown this once',
        description: 'Its scopes must be scopes the calling token holds (403 otherwise); management scopes only for private applications (400).',
        params: orgParams,
        body: newApplicationBody,
        response: { 201: withSecretSchema, ...errorResponses },
      },
    },
    async (req, reply) => {
      const auth = authOf(req);
      const b = req.body;
      refuseBeyondToken(auth, applicationScopes(b.type, b.scopes), 'given');
      // Created with its high-assurance settings in one transaction: refused, nothing is left behind.
      const { created, application } = await inTransaction(db, async (trx) => {
      const created = await createApplication(trx, {
        organizationId: auth.organizationId,
        type: b.type,
        name: b.name,
        ...(b.redirect_uris ? { redirectUris: b.redirect_uris } : {}),
        ...(b.post_logout_redirect_uris ? { postLogoutRedirectUris: b.post_logout_redirect_uris } : {}),
        ...(b.scopes ? { scopes: b.scopes } : {}),
        ...(b.require_pkce !== undefined ? { requirePkce: b.require_pkce } : {}),
        actor: actorOf(auth),
      });
      const made = await getApplication(trx, auth.organizationId, created.client_id);
      const changes = assuranceChanges(b);
      const application = Object.values(changes).some((v) => v !== undefined)
        ? await updateApplication(trx, made, changes, { actor: actorOf(auth), allowHttp: config.outbound.allowHttp })
        : made;
      return { created, application };
      });
      deps.applications.forget(created.client_id);
      reply.code(201).header('location', `/api/v1/${auth.organizationId}/applications/${created.client_id}`);
      // An application on keys has no secret to show.
      return { ...applicationOut(application), ...(application.token_endpoint_auth_method !== 'private_key_jwt' ? { client_secret: created.client_secret } : {}) };
    },
  );

  app.patch(
    '/applications/:client_id',
    {
      config: { scope: 'applications.write' },
      schema: {
        tags: ['applications'],
        summary: 'Change an application: name, redirect URIs, post-logout redirect URIs, scopes, PKCE, disabled',
        description:
          'Narrowing the scopes revokes the grants holding a removed scope; disabling revokes every grant. An application cannot disable itself or remove applications.write from itself (409), and changes only applications whose scopes, old and new, its token holds (403).',
        params: clientIdParams,
        body: applicationPatchBody,
        response: { 200: applicationSchema, ...errorResponses, ...conflictResponse },
      },
    },
    async (req) => {
      const auth = authOf(req);
      const application = await getApplication(db, auth.organizationId, req.params.client_id);
      const b = req.body;
      refuseSelfLockout(auth, application, b);
      refuseBeyondToken(auth, application.scopes, 'held');
      if (b.scopes) refuseBeyondToken(auth, applicationScopes(application.type, b.scopes), 'given');
      const updated = await updateApplication(
        db,
        application,
        {
          name: b.name,
          redirectUris: b.redirect_uris,
          postLogoutRedirectUris: b.post_logout_redirect_uris,
          scopes: b.scopes,
          requirePkce: b.require_pkce,
          disabled: b.disabled,
          ...assuranceChanges(b),
        },
        { ...changeOptions(auth), allowHttp: config.outbound.allowHttp },
      );
      return applicationOut(updated);
    },
  );

  app.delete(
    '/applications/:client_id',
    {
      config: { scope: 'applications.write' },
      schema: {
        tags: ['applications'],
        summary: 'Delete an application, revoking every grant of it',
        description: 'An application cannot delete itself (409), nor an application holding scopes its token lacks (403).',
        params: clientIdParams,
        response: { 204: z.null().describe('deleted'), ...errorResponses, ...conflictResponse },
      },
    },
    async (req, reply) => {
      const auth = authOf(req);
      const application = await getApplication(db, auth.organizationId, req.params.client_id);
      refuseSelfLockout(auth, application, 'delete');
      refuseBeyondToken(auth, application.scopes, 'held');
      await deleteApplication(db, application, changeOptions(auth));
      return reply.code(204).send(null);
    },
  );

  app.post(
    '/applications/:client_id/secret',
    {
      config: { scope: 'applications.write' },
      schema: {
        tags: ['applications'],
        summary: "Rotate an application's client secret: the new one is in the response, the old one stops working at once",
        description: 'Only of an application whose scopes the calling token holds (403 otherwise).',
        params: clientIdParams,
        response: { 200: secretSchema, ...errorResponses },
      },
    },
    async (req) => {
      const auth = authOf(req);
      const application = await getApplication(db, auth.organizationId, req.params.client_id);
      refuseBeyondToken(auth, application.scopes, 'held');
      return rotateClientSecret(db, application, changeOptions(auth));
    },
  );
};
