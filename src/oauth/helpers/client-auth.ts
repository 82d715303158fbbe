/**
 * Client authentication at the token, PAR, revocation and introspection endpoints (RFC 6749
 * §2.3.1): client_secret_basic or client_secret_post, or private_key_jwt (RFC 7523 §2.2, OpenID
 * Connect Core §9) — one of them, never two, never in the query. Secrets are compared as SHA-256
 * digests in constant time: no slow hash on this path. An assertion is checked against the
 * application's registered keys (helpers/client-assertion.ts) and its jti is used once, on every
 * instance (models/seen-jtis.ts). Repeated failures for one client_id are throttled (TK-6).
 */
import type { Application } from '../../db/schema.js';
import { CLIENT_ASSERTION_TYPE, type ClientAssertionVerifier } from './client-assertion.js';
import type { SeenJtis } from '../models/seen-jtis.js';
import { InvalidRequestError } from '../../errors.js';
import { secretMatches } from '../../lib/crypto.js';
import type { FindApplication } from '../models/application-cache.js';
import { CLIENT_ID_PATTERN, isClientIdShape } from '../models/applications.js';
import { FailureThrottle } from '../../lib/throttle.js';
import { InvalidClientError, TooManyAttemptsError } from '../errors.js';
import type { Params } from './params.js';


/** How the client authenticated; `none`: a public client without a secret (RFC 7591 §2), identified by client_id alone. */
export type ClientAuthMethod = 'client_secret_basic' | 'client_secret_post' | 'none' | 'private_key_jwt';

/** What checking a private_key_jwt assertion needs: the verifier, the replay store for its jti, and the audiences it may name. */
export interface ClientAssertions {
  verifier: ClientAssertionVerifier;
  jtis: SeenJtis;
  /** The issuer identifier and the endpoint's URL (RFC 7523 §3 point 3). */
  audiences: () => readonly string[];
}

export interface AuthenticatedClient {
  application: Application;
  method: ClientAuthMethod;
}

/** 10 failures per client_id per minute, then 429 until the minute ends. */
export const clientAuthThrottle = (): FailureThrottle => new FailureThrottle(10, 60_000);

/** RFC 6749 §2.3.1: Basic user and password are application/x-www-form-urlencoded first. */
function formDecode(value: string): string {
  // Most credentials are URL-safe already (ours are): nothing to decode.
  if (!/[%+]/.test(value)) return value;
  try {
    return decodeURIComponent(value.replace(/\+/g, ' '));
  } catch {
    throw new InvalidRequestError('the Basic credentials are not correctly encoded');
  }
}

function readBasic(header: string): { clientId: string; secret: string } {
  const encoded = /^Basic +([A-Za-z0-9+/=]+) *$/i.exec(header)?.[1];
  const decoded = encoded === undefined ? '' : Buffer.from(encoded, 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  if (colon < 1) throw new InvalidClientError({ cause: new Error('malformed Basic credentials') });
  return { clientId: formDecode(decoded.slice(0, colon)), secret: formDecode(decoded.slice(colon + 1)) };
}

/** The client_id an assertion names (its iss), read before its signature is checked to find the keys; checked against sub by the verifier. */
function assertedClientId(assertion: string): string {
  const payload = assertion.split('.')[1];
  try {
    const claims = JSON.parse(Buffer.from(payload ?? '', 'base64url').toString('utf8')) as { iss?: unknown };
    if (typeof claims.iss === 'string' && claims.iss !== '') return claims.iss;
  } catch {
    // Refused below.
  }
  throw new InvalidClientError({ cause: new Error('the client assertion names no client (iss)') });
}

async function authenticateWithAssertion(
  findApplication: FindApplication,
  throttle: FailureThrottle,
  assertions: ClientAssertions | undefined,
  request: { body: Params; ip: string },
): Promise<AuthenticatedClient> {
  const { body } = request;
  if (body.client_assertion_type !== CLIENT_ASSERTION_TYPE) throw new InvalidRequestError(`client_assertion_type must be ${CLIENT_ASSERTION_TYPE}`);
  if (body.client_assertion === undefined) throw new InvalidRequestError('client_assertion is required with client_assertion_type');
  if (!assertions) throw new InvalidClientError({ cause: new Error('client assertions are not accepted here') });
  const clientId = assertedClientId(body.client_assertion);
  if (body.client_id !== undefined && body.client_id !== clientId) throw new InvalidRequestError('client_id does not match the client assertion');
  if (!CLIENT_ID_PATTERN.test(clientId)) throw new InvalidClientError({ cause: new Error('malformed client_id in the assertion') });
  const throttleKey = `${clientId}:${request.ip}`;
  const retryAfter = throttle.retryAfter(throttleKey);
  if (retryAfter > 0) throw new TooManyAttemptsError(retryAfter);
  const application = await findApplication(clientId);
  const fail = (reason: string, cause?: unknown): never => {
    throttle.recordFailure(throttleKey);
    throw new InvalidClientError({ cause: cause ?? new Error(reason) });
  };
  if (!application || application.disabled) return fail(!application ? 'unknown client_id' : 'application disabled');
  if (application.token_endpoint_auth_method !== 'private_key_jwt') return fail('the application does not authenticate with private_key_jwt');
  let verified;
  try {
    verified = await assertions.verifier.verify(application, body.client_assertion, assertions.audiences(), { issuerOnly: application.fapi2 });
  } catch (err) {
    if (err instanceof InvalidClientError) return fail('invalid client assertion', err);
    throw err;
  }
  // RFC 7523 §3 point 7: a jti is used once until the assertion expires, on every instance.
  if (!(await assertions.jtis.firstUse(`client:${application.id}:${verified.jti}`, verified.exp))) return fail('the client assertion was used before (its jti was seen)');
  return { application, method: 'private_key_jwt' };
}

export async function authenticateClient(
  findApplication: FindApplication,
  throttle: FailureThrottle,
  request: { authorization: string | undefined; query: Params; body: Params; ip: string },
  assertions?: ClientAssertions,
): Promise<AuthenticatedClient> {
  const { authorization, query, body } = request;
  if (query.client_secret !== undefined || query.client_id !== undefined || query.client_assertion !== undefined) {
    throw new InvalidRequestError('client credentials must not be sent in the query string');
  }
  const basic = authorization !== undefined && /^basic /i.test(authorization);
  if (body.client_assertion !== undefined || body.client_assertion_type !== undefined) {
    if (basic || body.client_secret !== undefined) throw new InvalidRequestError('use one client authentication method, not both');
    return authenticateWithAssertion(findApplication, throttle, assertions, request);
  }
  if (basic && body.client_secret !== undefined) {
    throw new InvalidRequestError('use one client authentication method, not both');
  }
  let clientId: string;
  let secret: string;
  let method: ClientAuthMethod;
  if (basic) {
    ({ clientId, secret } = readBasic(authorization));
    if (body.client_id !== undefined && body.client_id !== clientId) throw new InvalidRequestError('client_id does not match the Basic credentials');
    method = 'client_secret_basic';
  } else if (body.client_id !== undefined && body.client_secret !== undefined) {
    clientId = body.client_id;
    secret = body.client_secret;
    method = 'client_secret_post';
  } else if (body.client_id !== undefined) {
    // A public client without a secret: only one registered with token_endpoint_auth_method
    // none, which gets nothing without PKCE (its codes) or its device code.
    clientId = body.client_id;
    secret = '';
    method = 'none';
  } else {
    throw new InvalidClientError({ cause: new Error('no client credentials') });
  }

  // Not one of our client ids: no throttle entry, no query (and no unbounded keys in memory).
  if (!isClientIdShape(clientId)) throw new InvalidClientError({ cause: new Error('malformed client_id') });
  // A metadata document's client has no secret, ever: one sent for it is refused before any
  // lookup, and leaves nothing in the throttle (whose keys would be URLs of 2,000 characters).
  if (method !== 'none' && !CLIENT_ID_PATTERN.test(clientId)) throw new InvalidClientError({ cause: new Error('a secret for a client that has none') });
  if (method === 'none') {
    const application = await findApplication(clientId);
    if (!application || application.disabled || application.token_endpoint_auth_method !== 'none') {
      const reason = !application ? 'unknown client_id' : application.disabled ? 'application disabled' : 'no client secret sent';
      throw new InvalidClientError({ cause: new Error(reason) });
    }
    return { application, method };
  }
  // Keyed by client and address: guessing from one address is slowed, while failures from
  // elsewhere cannot lock the real client out (its client_id is public).
  const throttleKey = `${clientId}:${request.ip}`;
  const retryAfter = throttle.retryAfter(throttleKey);
  if (retryAfter > 0) throw new TooManyAttemptsError(retryAfter);
  const application = await findApplication(clientId);
  if (!application || application.disabled || !secretMatches(secret, application.client_secret_hash)) {
    throttle.recordFailure(throttleKey);
    const reason = !application ? 'unknown client_id' : application.disabled ? 'application disabled' : 'wrong client secret';
    throw new InvalidClientError({ cause: new Error(reason) });
  }
  // FAPI 2.0 §5.3.2.1: a secret is not enough (an application under it has none; this holds whatever its row says).
  if (application.fapi2) throw new InvalidClientError({ cause: new Error('a FAPI 2.0 application authenticates with private_key_jwt') });
  return { application, method };
}
