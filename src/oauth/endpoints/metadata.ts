/**
 * Discovery: RFC 8414 authorization server metadata at /.well-known/oauth-authorization-server
 * and OpenID Connect Discovery 1.0 at /.well-known/openid-configuration, one document at both
 * (RFC 8414 §2 takes the OpenID fields), so the two can never disagree; and the RFC 7517 JWK Set.
 */
import type { FastifyInstance } from 'fastify';
import { ACR_VALUES_SUPPORTED } from '../helpers/acr.js';
import type { Config } from '../../config.js';
import type { KeyStore } from '../models/key-store.js';
import { DATA_SCOPES, SCOPES_SUPPORTED } from '../helpers/scopes.js';
import { API_RESOURCE_PATH, apiResource, apiResourceUri } from '../models/resources.js';
import { DEVICE_CODE_GRANT, TOKEN_EXCHANGE_GRANT } from '../../db/schema.js';
import { CLAIMS_SUPPORTED } from '../models/id-tokens.js';
import { ID_TOKEN_ALGS } from '../../db/schema.js';
import { CLIENT_ASSERTION_ALGS } from '../helpers/client-assertion.js';
import { DPOP_SIGNING_ALGS } from '../models/dpop-proofs.js';

export function authorizationServerMetadata(config: Pick<Config, 'issuer' | 'signingAlg' | 'clientRegistration'>) {
  const url = (path: string) => `${config.issuer}${path}`;
  return {
    issuer: config.issuer,
    authorization_endpoint: url('/oauth/authorize'),
    token_endpoint: url('/oauth/token'),
    // RFC 7591: absent (never null) when registration is off.
    ...(config.clientRegistration.mode !== 'off' ? { registration_endpoint: url('/oauth/register') } : {}),
    device_authorization_endpoint: url('/oauth/device_authorization'),
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
    // OpenID Connect Discovery §3: RS256 must be among them; each application picks one (id_token_signed_response_alg).
    id_token_signing_alg_values_supported: [...ID_TOKEN_ALGS],
    // Only what is implemented: no request objects, no claims parameter, no userinfo signing.
    request_parameter_supported: false,
    request_uri_parameter_supported: false,
    claims_parameter_supported: false,
    prompt_values_supported: ['none', 'login', 'consent', 'select_account'],
    grant_types_supported: ['authorization_code', 'refresh_token', 'client_credentials', DEVICE_CODE_GRANT, TOKEN_EXCHANGE_GRANT],
    // none: public clients that registered themselves (PKCE required of them). private_key_jwt:
    // RFC 7523 assertions signed with a key the application registered (jwks or jwks_uri).
    token_endpoint_auth_methods_supported: ['client_secret_basic', 'client_secret_post', 'private_key_jwt', 'none'],
    token_endpoint_auth_signing_alg_values_supported: [...CLIENT_ASSERTION_ALGS],
    revocation_endpoint_auth_methods_supported: ['client_secret_basic', 'client_secret_post', 'private_key_jwt', 'none'],
    revocation_endpoint_auth_signing_alg_values_supported: [...CLIENT_ASSERTION_ALGS],
    introspection_endpoint_auth_methods_supported: ['client_secret_basic', 'client_secret_post', 'private_key_jwt'],
    introspection_endpoint_auth_signing_alg_values_supported: [...CLIENT_ASSERTION_ALGS],
    // RFC 9701 §7: answers as JWTs (Accept: application/token-introspection+jwt), signed with the server's key, never encrypted.
    introspection_signing_alg_values_supported: [config.signingAlg],
    // RFC 9126: pushed authorization requests, required per application (and by FAPI 2.0), not of everyone.
    pushed_authorization_request_endpoint: url('/oauth/par'),
    require_pushed_authorization_requests: false,
    // RFC 9449: DPoP proofs at the token endpoint, PAR, userinfo and the API.
    dpop_signing_alg_values_supported: [...DPOP_SIGNING_ALGS],
    // RFC 8705 §3.3: no certificate-bound tokens (mutual TLS is out of scope; DPoP constrains senders).
    tls_client_certificate_bound_access_tokens: false,
    // draft-ietf-oauth-client-id-metadata-document: an https client_id is the URL of its metadata.
    client_id_metadata_document_supported: true,
    code_challenge_methods_supported: ['S256'],
    authorization_response_iss_parameter_supported: true,
  };
}

/**
 * RFC 9728: orgauth's API as a protected resource — its identifier (the audience of its tokens),
 * who issues them and how they are sent.
 */
export function apiResourceMetadata(config: Pick<Config, 'issuer' | 'accessTokenTtl'>) {
  return {
    resource: apiResourceUri(config),
    authorization_servers: [config.issuer],
    // What a client may ask a user for: the data scopes. The management scopes are the
    // organization's own private applications' (client_credentials), never delegated (AD-1).
    scopes_supported: DATA_SCOPES,
    bearer_methods_supported: ['header'],
    // RFC 9728 §2: DPoP-bound tokens are accepted (Authorization: DPoP), and required of applications that say so.
    dpop_signing_alg_values_supported: [...DPOP_SIGNING_ALGS],
    dpop_bound_access_tokens_required: false,
    resource_name: apiResource(config).name,
    resource_documentation: `${config.issuer}/docs`,
  };
}

export async function metadataRoutes(app: FastifyInstance, { config, keys }: { config: Config; keys: KeyStore }): Promise<void> {
  const metadata = authorizationServerMetadata(config);
  const resourceMetadata = apiResourceMetadata(config);
  app.get(`/.well-known/oauth-protected-resource${API_RESOURCE_PATH}`, async (_req, reply) => {
    reply.header('cache-control', 'public, max-age=3600');
    return resourceMetadata;
  });
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
