import type { z } from 'zod';
import { InvalidRequestError } from '../errors.js';

/** Parses input with a zod schema; failures become one InvalidRequestError listing every problem. */
export function parseInput<T extends z.ZodType>(schema: T, input: unknown): z.output<T> {
  const result = schema.safeParse(input);
  if (result.success) return result.data;
  const details = result.error.issues.map((issue) => ({ path: issue.path.join('.'), message: issue.message }));
  const summary = details.map((d) => (d.path ? `${d.path}: ${d.message}` : d.message)).join('; ');
  throw new InvalidRequestError(summary, { details });
}
