/**
 * One error hierarchy. Everything the service refuses on purpose is an AppError with an HTTP
 * status and a registered error code; the error handler (app.ts) writes each one as
 * `{"error", "error_description"}`. Anything else is a bug and becomes a generic 500.
 */

export interface ErrorDetail {
  path: string;
  message: string;
}

export class AppError extends Error {
  constructor(
    readonly statusCode: number,
    readonly code: string,
    /** Safe to show the client. The specific reason for the log goes in `cause`. */
    readonly description: string,
    options?: ErrorOptions & { headers?: Record<string, string>; details?: ErrorDetail[] },
  ) {
    super(description, options);
    this.name = new.target.name;
    this.headers = options?.headers ?? {};
    this.details = options?.details;
  }
  readonly headers: Record<string, string>;
  readonly details: ErrorDetail[] | undefined;
}

/** 400: the request is malformed or names something invalid. */
export class InvalidRequestError extends AppError {
  constructor(description: string, options?: ErrorOptions & { details?: ErrorDetail[] }) {
    super(400, 'invalid_request', description, options);
  }
}

/** 403: a form without a valid CSRF token, or a choice the user may not make. */
export class ForbiddenError extends AppError {
  constructor(description: string) {
    super(403, 'forbidden', description);
  }
}

/** 404: missing, or belonging to another organization (indistinguishable on purpose). */
export class NotFoundError extends AppError {
  constructor(description = 'not found') {
    super(404, 'not_found', description);
  }
}

/** 409: the request collides with existing state (a duplicate email, say). */
export class ConflictError extends AppError {
  constructor(description: string) {
    super(409, 'conflict', description);
  }
}

/** 503: a dependency (the database) is unavailable; the client may retry. */
export class ServiceUnavailableError extends AppError {
  constructor(description = 'the service is temporarily unavailable, retry shortly', options?: ErrorOptions) {
    super(503, 'temporarily_unavailable', description, { ...options, headers: { 'retry-after': '1' } });
  }
}

/**
 * RFC 6749 §5.2: error_description is limited to %x20-21 / %x23-5B / %x5D-7E, so no CR/LF,
 * quotes or backslashes reach a client (or a header built from it).
 */
export function sanitizeDescription(text: string): string {
  return text.replace(/[^\x20\x21\x23-\x5b\x5d-\x7e]/g, ' ').slice(0, 500);
}
