/**
 * The OpenAPI 3.1 document, generated from the API routes' zod schemas (one definition for
 * validation, serialization and documentation), with the OAuth 2.0 security scheme and each
 * operation's scope; GET /openapi.json, and GET /docs, our own server-rendered API reference built
 * from the same document (src/web/api-reference.ts).
 */
import swagger from '@fastify/swagger';
import type { FastifyInstance } from 'fastify';
import { jsonSchemaTransform, jsonSchemaTransformObject } from 'fastify-type-provider-zod';
import type { Config } from '../config.js';
import { DATA_SCOPES, SCOPE_DESCRIPTIONS } from '../oauth/helpers/scopes.js';
import { apiReferencePage } from '../web/api-reference.js';

const API_PATH = /^\/api\/v1\//;

export async function registerOpenApi(app: FastifyInstance, config: Config): Promise<void> {
  await app.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'orgauth API',
        version: '1.0.0',
        description:
          'Organization-scoped API. Every path starts with the organization_id of the token response; a token for another organization is refused with 403 organization_mismatch. The management operations (applications, members, grants, audit-events, sso-connections, domains, webhooks, directories) need management scopes, which only the organization\'s own private applications can hold (client_credentials, the dashboard\'s Generate Token, `orgauth token create`).',
      },
      servers: [{ url: config.issuer }],
      components: {
        securitySchemes: {
          oauth2: {
            type: 'oauth2',
            description: 'Access tokens from the authorization code grant (public applications) or client_credentials (private ones).',
            flows: {
              authorizationCode: {
                authorizationUrl: `${config.issuer}/oauth/authorize`,
                tokenUrl: `${config.issuer}/oauth/token`,
                refreshUrl: `${config.issuer}/oauth/token`,
                // What a user can delegate to a public application: the data scopes (AD-1).
                scopes: Object.fromEntries(DATA_SCOPES.map((s) => [s, SCOPE_DESCRIPTIONS[s]])),
              },
              clientCredentials: { tokenUrl: `${config.issuer}/oauth/token`, scopes: SCOPE_DESCRIPTIONS },
            },
          },
        },
      },
    },
    transform: (input) => {
      // Only the API is documented here; the OAuth endpoints are described by RFC 8414 metadata.
      if (!API_PATH.test(input.url)) return { schema: { ...input.schema, hide: true }, url: input.url };
      const out = jsonSchemaTransform(input);
      const scope = input.route.config?.scope;
      return { ...out, schema: { ...out.schema, security: [{ oauth2: scope ? [scope] : [] }] } };
    },
    transformObject: jsonSchemaTransformObject,
  });
}

/** Registered after the routes: the document can only be built once they exist. */
export async function openApiRoutes(app: FastifyInstance, { config }: { config: Config }): Promise<void> {
  app.get('/openapi.json', { schema: { hide: true } }, async () => app.swagger());
  // The page in a plugin of its own: its headers (setUpPages) stay off /openapi.json.
  await app.register(apiReferencePage, { config });
}
