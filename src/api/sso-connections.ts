/**
 * The management API's SSO connections: the organization's own identity providers, OpenID
 * Connect (orgauth is their relying party) and SAML 2.0 (orgauth is their service provider).
 * sso.read lists and reads them, sso.write creates, changes and deletes them. The rules are the
 * domain's (src/sso/connections.ts), shared with the dashboard and the CLI: the client secret is
 * sealed at rest and never leaves the server, a connection never makes owners, and an
 * application gives through a connection only a role whose every permission its token holds
 * (actingRoleOf), as it would give it to a member.
 */
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import type { Config } from '../config.js';
import type { DB } from '../db/connect.js';
import {
  type ConnectionActor,
  connectionSettings,
  type ConnectionView,
  createConnection,
  DEFAULT_OIDC_SCOPES,
  deleteConnection,
  getConnection,
  listConnections,
  MAX_CONNECTIONS,
  MAX_SAML_CERTIFICATES,
  updateConnection,
} from '../sso/connections.js';
import { actingRoleOf, actorOf, type ApiAuth, authOf, pathId } from './auth.js';
import { errorResponses, orgParams } from './schemas.js';

/** A pasted IdP metadata document may be up to 512 KiB (readIdpMetadata); JSON-escaped, a little more. */
const METADATA_BODY_LIMIT = 3 * 512 * 1024;


const certificateSchema = z
  .object({
    subject: z.string(),
    fingerprint_sha256: z.string().describe('colon-separated hex, as the IdP’s admin console shows it'),
    not_after: z.iso.datetime().describe('when the certificate expires: add the next one before then (rotation)'),
  })
  .meta({ id: 'SsoCertificate' });

export const connectionSchema = z
  .object({
    id: z.number().int(),
    organization_id: z.number().int(),
    protocol: z.enum(['oidc', 'saml']),
    name: z.string(),
    state: z.enum(['draft', 'active', 'disabled']).describe('only an active connection signs anyone in'),
    jit: z.boolean().describe('just-in-time provisioning: someone the IdP vouches for who is not yet a member becomes one, with default_role'),
    default_role: z.string().describe('the role members provisioned through the connection get; never owner'),
    links_existing_accounts: z
      .boolean()
      .describe('whether an existing account is linked by its email (in a verified domain, verified by the provider) without the account’s own proof; true only when an owner or the operator set what the connection trusts'),
    created_at: z.iso.datetime(),
    updated_at: z.iso.datetime(),
    issuer: z.string().optional().describe('OIDC: the provider’s issuer URL'),
    client_id: z.string().optional().describe('OIDC: orgauth’s client at the provider (the client secret is never returned)'),
    scopes: z.string().optional().describe('OIDC: the scopes asked for, space-separated'),
    redirect_uri: z.string().optional().describe('OIDC: the callback to register at the provider'),
    idp_entity_id: z.string().optional().describe('SAML: the IdP’s entity ID (the Issuer of its responses)'),
    idp_sso_url: z.string().optional().describe('SAML: where AuthnRequests go (HTTP-Redirect binding)'),
    idp_certificates: z.array(certificateSchema).optional().describe('SAML: the certificates whose keys may sign the IdP’s responses'),
    idp_initiated: z.boolean().optional().describe('SAML: whether a response the IdP sends unasked (from its app tile) is accepted'),
    entity_id: z.string().optional().describe('SAML: orgauth’s SP entity ID, to register at the IdP'),
    acs_url: z.string().optional().describe('SAML: orgauth’s assertion consumer service URL, to register at the IdP'),
    metadata_url: z.string().optional().describe('SAML: orgauth’s SP metadata, which most IdPs can import'),
  })
  .meta({ id: 'SsoConnection' });

/** A connection as it leaves the server: what ConnectionView holds (never the secret), dates as ISO strings. */
export function connectionOut(c: ConnectionView): z.infer<typeof connectionSchema> {
  return { ...c, created_at: c.created_at.toISOString(), updated_at: c.updated_at.toISOString() };
}

const stateField = z.enum(['draft', 'active', 'disabled']);
/** The fields both protocols have; the domain checks their content (lengths, URLs, the role). */
const commonFields = {
  state: stateField.optional().describe('default active; draft while it is being set up, disabled to stop it (its sessions end)'),
  jit: z.boolean().optional().describe('default true'),
  default_role: z.string().max(200).optional().describe('a role’s name, default member; never owner, and only a role whose every permission the token holds'),
  links_existing_accounts: z.boolean().optional().describe('only false from an application: only an owner or the operator may let a connection link existing accounts without their proof; a change of what the connection trusts by an application sets it to false'),
};
const oidcFields = {
  issuer: z.string().optional().describe('OIDC: the provider’s issuer URL (https); its discovery document is read at sign-in'),
  client_id: z.string().optional().describe('OIDC'),
  client_secret: z.string().optional().describe('OIDC: sealed at rest, never returned'),
  scopes: z.string().optional().describe(`OIDC: space-separated, must include openid; default "${DEFAULT_OIDC_SCOPES}"`),
};
const samlFields = {
  idp_entity_id: z.string().optional().describe('SAML'),
  idp_sso_url: z.string().optional().describe('SAML: the IdP’s HTTP-Redirect SSO URL (https)'),
  idp_certificates: z.array(z.string()).optional().describe(`SAML: 1 to ${MAX_SAML_CERTIFICATES} X.509 certificates, PEM or base64 DER; several while the IdP rotates its key`),
  idp_metadata_xml: z.string().optional().describe('SAML: the IdP’s metadata XML; fills idp_entity_id, idp_sso_url and idp_certificates where they are not given'),
  idp_initiated: z.boolean().optional().describe('SAML: default false'),
};

const connectionParams = orgParams.extend({ id: z.string() });

export const ssoConnectionRoutes: FastifyPluginAsyncZod<{ db: DB; config: Config }> = async (app, { db, config }) => {
  const settings = connectionSettings(config);
  const asApplication = (auth: ApiAuth): ConnectionActor => ({ actor: actorOf(auth), actingAs: actingRoleOf(auth) });

  app.get(
    '/sso-connections',
    {
      config: { scope: 'sso.read' },
      schema: {
        tags: ['sso'],
        summary: `List the SSO connections, in id order (at most ${MAX_CONNECTIONS}, so all in one page)`,
        params: orgParams,
        response: { 200: z.object({ data: z.array(connectionSchema) }), ...errorResponses },
      },
    },
    async (req) => ({ data: (await listConnections(db, settings, authOf(req).organizationId)).map(connectionOut) }),
  );

  app.get(
    '/sso-connections/:id',
    {
      config: { scope: 'sso.read' },
      schema: { tags: ['sso'], summary: 'Get an SSO connection', params: connectionParams, response: { 200: connectionSchema, ...errorResponses } },
    },
    async (req) => connectionOut(await getConnection(db, settings, authOf(req).organizationId, pathId(req.params.id))),
  );

  app.post(
    '/sso-connections',
    {
      config: { scope: 'sso.write' },
      bodyLimit: METADATA_BODY_LIMIT,
      schema: {
        tags: ['sso'],
        summary:
          'Connect an identity provider: OIDC needs name, issuer, client_id and client_secret; SAML needs name and idp_entity_id, idp_sso_url and idp_certificates, or idp_metadata_xml',
        params: orgParams,
        body: z.strictObject({ protocol: z.enum(['oidc', 'saml']), name: z.string(), ...commonFields, ...oidcFields, ...samlFields }),
        response: { 201: connectionSchema, ...errorResponses },
      },
    },
    async (req, reply) => {
      const auth = authOf(req);
      const connection = await createConnection(db, settings, auth.organizationId, req.body, asApplication(auth));
      reply.code(201).header('location', `/api/v1/${auth.organizationId}/sso-connections/${connection.id}`);
      return connectionOut(connection);
    },
  );

  app.patch(
    '/sso-connections/:id',
    {
      config: { scope: 'sso.write' },
      bodyLimit: METADATA_BODY_LIMIT,
      schema: {
        tags: ['sso'],
        summary:
          'Change an SSO connection (not its protocol); what is not given stays. idp_certificates replaces the whole list; leaving the active state ends every session signed in through it',
        params: connectionParams,
        body: z.strictObject({ name: z.string().optional(), ...commonFields, ...oidcFields, ...samlFields }),
        response: { 200: connectionSchema, ...errorResponses },
      },
    },
    async (req) => {
      const auth = authOf(req);
      return connectionOut(await updateConnection(db, settings, auth.organizationId, pathId(req.params.id), req.body, asApplication(auth)));
    },
  );

  app.delete(
    '/sso-connections/:id',
    {
      config: { scope: 'sso.write' },
      schema: {
        tags: ['sso'],
        summary: 'Delete an SSO connection: its identity links go, and the sessions signed in through it end',
        params: connectionParams,
        response: { 204: z.null().describe('deleted'), ...errorResponses },
      },
    },
    async (req, reply) => {
      const auth = authOf(req);
      await deleteConnection(db, auth.organizationId, pathId(req.params.id), asApplication(auth));
      return reply.code(204).send(null);
    },
  );
};
