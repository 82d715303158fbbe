/**
 * RFC 6749 §5.2 errors, as members of the one error hierarchy (src/errors.ts). The description
 * is generic and safe for the client; the specific reason goes in `cause` for the log.
 */
import { AppError } from '../errors.js';

export { InvalidRequestError } from '../errors.js';

/** 401: the client could not be authenticated (RFC 6749 §5.2). */
export class InvalidClientError extends AppError {
  constructor(options: { cause?: unknown }) {
    super(401, 'invalid_client', 'client authentication failed', {
      cause: options.cause,
      // RFC 6749 §5.2 and RFC 9110 §15.5.2: every 401 carries a challenge; Basic is the scheme.
      headers: { 'www-authenticate': 'Basic realm="orgauth", charset="UTF-8"' },
    });
  }
}

export class InvalidGrantError extends AppError {
  constructor(description = 'the grant is invalid, expired, revoked or was issued to another client', options?: ErrorOptions) {
    super(400, 'invalid_grant', description, options);
  }
}

export class InvalidScopeError extends AppError {
  constructor(description: string) {
    super(400, 'invalid_scope', description);
  }
}

export class UnauthorizedClientError extends AppError {
  constructor(description: string) {
    super(400, 'unauthorized_client', description);
  }
}

export class UnsupportedGrantTypeError extends AppError {
  constructor() {
    super(400, 'unsupported_grant_type', 'grant_type must be authorization_code, refresh_token, client_credentials or urn:ietf:params:oauth:grant-type:device_code');
  }
}

/** 429: too many failed attempts; `retryAfter` in seconds. */
export class TooManyAttemptsError extends AppError {
  constructor(retryAfter: number, description = 'too many failed attempts; retry later') {
    super(429, 'too_many_requests', description, { headers: { 'retry-after': String(retryAfter) } });
  }
}

/** RFC 8707 §2: the resource asked for is unknown, or not the one the grant is for. */
export class InvalidTargetError extends AppError {
  constructor(description = 'the resource is unknown or not allowed for this request') {
    super(400, 'invalid_target', description);
  }
}

/** RFC 7591 §3.2.2: a registration's redirect URIs are invalid. */
export class InvalidRedirectUriError extends AppError {
  constructor(description: string) {
    super(400, 'invalid_redirect_uri', description);
  }
}

/** RFC 7591 §3.2.2: a registration's metadata (other than its redirect URIs) is invalid. */
export class InvalidClientMetadataError extends AppError {
  constructor(description: string) {
    super(400, 'invalid_client_metadata', description);
  }
}

/**
 * RFC 8628 §3.5: why a device's token request gets no token (yet). authorization_pending and
 * slow_down: poll again (slow_down: 5 seconds slower); access_denied and expired_token: stop.
 */
export class DeviceAuthorizationError extends AppError {
  constructor(code: 'authorization_pending' | 'slow_down' | 'access_denied' | 'expired_token', description: string) {
    super(400, code, description);
  }
}
