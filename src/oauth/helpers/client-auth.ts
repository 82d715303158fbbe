/**
 * Client authentication at the token, revocation and introspection endpoints (RFC 6749 §2.3.1):
 * client_secret_basic or client_secret_post, never both, never in the query. Secrets are
 * compared as SHA-256 digests in constant time: no slow hash on this path. Repeated failures for
 * one client_id are throttled (TK-6).
 */
import type { Application } from '../../db/schema.js';
import { InvalidRequestError } from '../../errors.js';
import { secretMatches } from '../../lib/crypto.js';
import type { FindApplication } from '../models/application-cache.js';
import { CLIENT_ID_PATTERN, isClientIdShape } from '../models/applications.js';
import { FailureThrottle } from '../../lib/throttle.js';
import { InvalidClientError, TooManyAttemptsError } from '../errors.js';
import type { Params } from './params.js';


/** How the client authenticated; `none`: a public client without a secret (RFC 7591 §2), identified by client_id alone. */
export type ClientAuthMethod = 'client_secret_basic' | 'client_secret_post' | 'none';

export interface AuthenticatedClient {
  application: Application;
  method: ClientAuthMethod;
}

/** 10 failures per client_id per minute, then 429 until the minute ends. */
export const clientAuthThrottle = (): FailureThrottle => new FailureThrottle(10, 60_000);

/** RFC 6749 §2.3.1: Basic user and password are application/x-www-form-urlencoded first. */
function formDecode(value: string): string {
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

export async function authenticateClient(
  findApplication: FindApplication,
  throttle: FailureThrottle,
  request: { authorization: string | undefined; query: Params; body: Params; ip: string },
): Promise<AuthenticatedClient> {
  const { authorization, query, body } = request;
  if (query.client_secret !== undefined || query.client_id !== undefined) {
    throw new InvalidRequestError('client credentials must not be sent in the query string');
  }
  const basic = authorization !== undefined && /^basic /i.test(authorization);
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
  return { application, method };
}
