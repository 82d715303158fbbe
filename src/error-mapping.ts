/**
 * What every error handler refuses with: an AppError as it is, and what Fastify or the database
 * threw mapped onto the one hierarchy (src/errors.ts); undefined for a bug (a 500). Shared by the
 * app's handler ({error, error_description}) and the SCIM service's (RFC 7644 §3.12 errors).
 */
import type { FastifyError } from 'fastify';
import { isBadValue, isDatabaseUnavailable, isTransactionConflict } from './db/errors.js';
import { AppError, InvalidRequestError, ServiceUnavailableError } from './errors.js';

const CODE_FOR_STATUS: Record<number, string> = {
  401: 'unauthorized',
  403: 'forbidden',
  404: 'not_found',
  405: 'method_not_allowed',
  406: 'not_acceptable',
  413: 'request_too_large',
  415: 'unsupported_media_type',
  429: 'too_many_requests',
};

/** Maps anything thrown in a request to the one error shape; unknown errors become a bare 500. */
export function toAppError(err: FastifyError | Error): AppError | undefined {
  if (err instanceof AppError) return err;
  if (isDatabaseUnavailable(err)) return new ServiceUnavailableError(undefined, { cause: err });
  if (isTransactionConflict(err)) return new ServiceUnavailableError('a concurrent request got there first; retry', { cause: err });
  if (isBadValue(err)) return new InvalidRequestError('a value in the request is not acceptable', { cause: err });
  if ('validation' in err && Array.isArray(err.validation)) {
    const context = 'validationContext' in err && typeof err.validationContext === 'string' ? err.validationContext : '';
    const details = err.validation.map((v) => ({
      path: String(v.instancePath ?? '').replace(/^\//, '').replace(/\//g, '.') || context,
      message: String(v.message ?? 'invalid'),
    }));
    return new InvalidRequestError(`invalid ${context || 'request'}: ${details.map((d) => `${d.path} ${d.message}`).join('; ')}`, { details, cause: err });
  }
  const status = 'statusCode' in err ? err.statusCode : undefined;
  if (typeof status === 'number' && status >= 400 && status < 500) {
    return new AppError(status, CODE_FOR_STATUS[status] ?? 'invalid_request', err.message, { cause: err });
  }
  return undefined;
}
