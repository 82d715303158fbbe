/**
 * Discovery: RFC 8414 authorization server metadata at /.well-known/oauth-authorization-server
 * and OpenID Connect Discovery 1.0 at /.well-known/openid-configuration, one document at both
 * (RFC 8414 §2 takes the OpenID fields), so the two can never disagree; and the RFC 7517 JWK Set.
 */
import type { FastifyInstance } from 'fastify';
import { ACR_VALUES_SUPPORTED } from '../helpers/acr.js';
import type { Config } from '../../config.js';
import type { KeyStore } from '../models/key-store.js';
import { SCOPES_SUPPORTED } from '../helpers/scopes.js';
import { CLAIMS_SUPPORTED } from '../models/id-tokens.js';

export function authorizationServerMetadata(config: Pick<Config, 'issuer' | 'signingAlg'>) {
  const url = (path: string) => `${config.issuer}${path}`;
  return {
    issuer: config.issuer,
    authorization_endpoint: url('/oauth/authorize'),
    token_endpoint: url('/oauth/token'),
    revocation_endpoint: url('/oauth/revoke'),
    introspection_endpoint: url('/oauth/introspect'),
    userinfo_endpoint: url('/oauth/userinfo'),
    end_session_endpoint: url('/oauth/logout'),
    jwks_uri: url('/.well-known/jwks.json'),
    scopes_supported: SCOPES_SUPPORTED,
    claims_supported: CLAIMS_SUPPORTED,
    acr_values_supported: ACR_VALUES_SUPPORTED,
    response_types_supported: ['code'],
    response_modes_supported: ['query'],
    subject_types_supported: ['public'],
    id_token_signing_alg_values_supported: [config.signingAlg],
    // Only what is implemented: no request objects, no claims parameter, no userinfo signing.
    request_parameter_supported: false,
    request_uri_parameter_supported: false,
    claims_parameter_supported: false,
    prompt_values_supported: ['none', 'login', 'consent', 'select_account'],
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
  for (const path of ['/.well-known/oauth-authorization-server', '/.well-known/openid-configuration']) {
    app.get(path, async (_req, reply) => {
      reply.header('cache-control', 'public, max-age=3600');
      return metadata;
    });
  }
  app.get('/.well-known/jwks.json', async (_req, reply) => {
    // Short, so clients see a rotated key soon; they refetch on an unknown kid anyway.
    reply.header('cache-control', 'public, max-age=300');
    return keys.jwks();
  });
}
