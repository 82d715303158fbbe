/**
 * SCIM's errors (RFC 7644 §3.12) inside the one hierarchy: a ScimError is an AppError whose code
 * is the scimType (or `scim_error` when the RFC names none), and the SCIM routes' error handler
 * writes it as `{"schemas": ["urn:ietf:params:scim:api:messages:2.0:Error"], "status": "400",
 * "scimType": "invalidFilter", "detail": "..."}`.
 */
import { AppError } from '../errors.js';

export const SCIM_ERROR_SCHEMA = 'urn:ietf:params:scim:api:messages:2.0:Error';

/** RFC 7644 §3.12 Table 9, the scimType values. */
export type ScimType = 'invalidFilter' | 'tooMany' | 'uniqueness' | 'mutability' | 'invalidSyntax' | 'invalidPath' | 'noTarget' | 'invalidValue' | 'invalidVers' | 'sensitive';

export class ScimError extends AppError {
  constructor(
    statusCode: number,
    readonly scimType: ScimType | undefined,
    detail: string,
    options?: ErrorOptions & { headers?: Record<string, string> },
  ) {
    super(statusCode, scimType ?? 'scim_error', detail, options);
  }
}

/** 400 with a scimType: the request is wrong in the way the type names. */
export const badScim = (scimType: ScimType, detail: string): ScimError => new ScimError(400, scimType, detail);

/** The body RFC 7644 §3.12 defines for an error. */
export function scimErrorBody(status: number, scimType: string | undefined, detail: string): Record<string, unknown> {
  return { schemas: [SCIM_ERROR_SCHEMA], status: String(status), ...(scimType ? { scimType } : {}), detail };
}
