/** Schemas shared by the API routes: path parameters, list envelopes and the error shape. */
import { z } from 'zod';

export const orgParams = z.object({ organization_id: z.string().describe('the organization id from the token response') });
export const idParams = orgParams.extend({ id: z.string() });

export const errorSchema = z
  .object({
    error: z.string(),
    error_description: z.string(),
    details: z.array(z.object({ path: z.string(), message: z.string() })).optional(),
  })
  .meta({ id: 'Error' });

export const errorResponses = {
  400: errorSchema.describe('invalid request'),
  401: errorSchema.describe('missing, invalid, expired or revoked token'),
  403: errorSchema.describe('insufficient scope, or a token for another organization'),
  404: errorSchema.describe('not found (also for another organization\'s ids)'),
};

export const listOf = <T extends z.ZodType>(item: T) =>
  z.object({ data: z.array(item), next_cursor: z.string().nullable().describe('pass as ?cursor= for the next page; null on the last page') });
