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

/**
 * Whether a string is well-formed UTF-16: no lone surrogate (a `\ud800` escape in JSON), which
 * PostgreSQL would store as U+FFFD or refuse. With the u flag, paired surrogates read as one
 * code point, so only a lone one matches \p{Cs}.
 */
export function isWellFormed(value: string): boolean {
  return !/\p{Cs}/u.test(value);
}
