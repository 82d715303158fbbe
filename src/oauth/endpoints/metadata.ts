/** RFC 8414 authorization server metadata and the RFC 7517 JWK Set. */
import type { FastifyInstance } from 'fastify';
import type { Config } from '../../config.js';
import type { KeyStore } from '../models/key-store.js';
import { KNOWN_SCOPES } from '../helpers/scopes.js';

export function authorizationServerMetadata(config: Pick<Config, 'issuer' | 'signingAlg'>) {
  const url = (path: string) => `${config.issuer}${path}`;
  return {
    issuer: config.issuer,
    authorization_endpoint: url('/oauth/authorize'),
    token_endpoint: url('/oauth/token'),
    revocation_endpoint: url('/oauth/revoke'),
    introspection_endpoint: url('/oauth/introspect'),
    jwks_uri: url('/.well-known/jwks.json'),
    scopes_supported: KNOWN_SCOPES,
    response_types_supported: ['code'],
    grant_types_supported: ['authorization_code', 'refresh_token', 'client_credentials'],
    token_endpoint_auth_methods_supported: ['client_secret_basic', 'client_secret_post'],
    revocation_endpoint_auth_methods_supported: ['client_secret_basic', 'client_secret_post'],
    introspection_endpoint_auth_methods_supported: ['client_secret_basic', 'client_secret_post'],
    code_challenge_methods_supported: ['S256'],
    authorization_response_iss_parameter_supported: true,
  };
}

export async function metadataRoutes(app: FastifyInstance, { config, keys }: { config: Config; keys: KeyStore }): Promise<void> {
  const metadata = authorizationServerMetadata(config);
  app.get('/.well-known/oauth-authorization-server', async (_req, reply) => {
    reply.header('cache-control', 'public, max-age=3600');
    return metadata;
  });
  app.get('/.well-known/jwks.json', async (_req, reply) => {
    // Short, so clients see a rotated key soon; they refetch on an unknown kid anyway.
    reply.header('cache-control', 'public, max-age=300');
    return keys.jwks();
  });
}
