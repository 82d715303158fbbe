/**
 * The benchmark's peer: node-oidc-provider (panva/node-oidc-provider, the OpenID Certified
 * Node.js provider) configured to do what orgauth's client_credentials scenario does, in a
 * process of its own so neither server shares a CPU budget with the load generator:
 *
 * - one confidential client authenticating with client_secret_basic, and one with private_key_jwt
 *   (its public keys in PEER_KEYS_JWKS) for the DPoP scenario;
 * - the client_credentials grant, scope contacts.read;
 * - ES256-signed JWT access tokens (RFC 9068 profile) for one resource server, one hour;
 * - its in-memory adapter (the default), production mode otherwise (no dev interactions).
 *
 * Run by bench/run.ts with PEER_PORT, PEER_CLIENT_ID and PEER_CLIENT_SECRET; prints
 * "peer ready" when it listens.
 */
import { exportJWK, generateKeyPair } from 'jose';
import Provider from 'oidc-provider';

const port = Number(process.env.PEER_PORT);
const clientId = process.env.PEER_CLIENT_ID ?? 'bench-peer';
const clientSecret = process.env.PEER_CLIENT_SECRET ?? 'bench-peer-secret-0123456789abcdefghijklmnop';
const RESOURCE = 'https://api.bench.example';

const { privateKey } = await generateKeyPair('ES256', { extractable: true });
const jwk = { ...(await exportJWK(privateKey)), alg: 'ES256', use: 'sig', kid: 'bench' };

const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: [
    {
      client_id: clientId,
      client_secret: clientSecret,
      grant_types: ['client_credentials'],
      response_types: [],
      redirect_uris: [],
      token_endpoint_auth_method: 'client_secret_basic',
      // Its only key is ES256 (the default RS256 would need an RSA key it never uses here).
      id_token_signed_response_alg: 'ES256',
      scope: 'contacts.read',
    },
    ...(process.env.PEER_KEYS_JWKS
      ? [
          {
            client_id: `${clientId}-keys`,
            grant_types: ['client_credentials'],
            response_types: [],
            redirect_uris: [],
            token_endpoint_auth_method: 'private_key_jwt' as const,
            token_endpoint_auth_signing_alg: 'ES256' as const,
            jwks: JSON.parse(process.env.PEER_KEYS_JWKS) as { keys: object[] },
            id_token_signed_response_alg: 'ES256' as const,
            scope: 'contacts.read',
          },
        ]
      : []),
  ],
  jwks: { keys: [jwk] },
  // The same path as orgauth's, so both scenarios send the very same request.
  routes: { token: '/oauth/token' },
  scopes: ['contacts.read'],
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    // RFC 9449, as orgauth: proofs accepted, no nonce required.
    dPoP: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => RESOURCE,
      useGrantedResource: () => true,
      getResourceServerInfo: () => ({
        scope: 'contacts.read',
        audience: RESOURCE,
        accessTokenTTL: 3600,
        accessTokenFormat: 'jwt',
        jwt: { sign: { alg: 'ES256' } },
      }),
    },
  },
});
provider.proxy = false;

const server = provider.listen(port, '127.0.0.1', () => process.stdout.write('peer ready\n'));
const stop = () => server.close(() => process.exit(0));
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
