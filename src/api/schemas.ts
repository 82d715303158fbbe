/** Schemas shared by the API routes: path parameters, list envelopes and the error shape. */
import type { FastifySerializerCompiler } from 'fastify';
import fastJson from 'fast-json-stringify';
import { z } from 'zod';

/**
 * Responses are written by fast-json-stringify from the route's zod schema turned into JSON
 * Schema (as Fastify does for JSON Schema routes): a page of 50 contacts costs about 22 µs
 * instead of the 87 µs of checking it with zod and JSON.stringify. Only the schema's properties
 * are written, so a column added to a row never leaks into a response.
 */
export const serializerCompiler: FastifySerializerCompiler<z.ZodType> = ({ schema }) => {
  let serialize = serializers.get(schema);
  if (serialize === undefined) {
    // Compiled when the route first answers, not when it is registered: compiling every route's
    // writer took a fifth of start-up (about 250 ms of 1.3 s), most of them for routes a given
    // instance may not serve for a while.
    let compiled: ((data: unknown) => string) | undefined;
    serialize = (data) => (compiled ??= fastJson(z.toJSONSchema(schema, { target: 'draft-7', io: 'output', unrepresentable: 'any' }) as Parameters<typeof fastJson>[0]))(data);
    serializers.set(schema, serialize);
  }
  return serialize;
};

/**
 * Each schema's writer, compiled once per process: the routes' schemas are module constants, and
 * compiling them again for every app the process builds (a test file builds several) cost about
 * a third of buildApp(). A writer is a pure function of its schema.
 */
const serializers = new WeakMap<z.ZodType, (data: unknown) => string>();

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

/** For the operations a rule can refuse whatever the request's shape (the last owner, an application locking itself out). */
export const conflictResponse = { 409: errorSchema.describe('refused: it would leave the organization without an owner or lock the calling application out, or the user is already a member or has not verified their email address') };

export const listOf = <T extends z.ZodType>(item: T) =>
  z.object({ data: z.array(item), next_cursor: z.string().nullable().describe('pass as ?cursor= for the next page; null on the last page') });
