/**
 * OAuth request parameters (RFC 6749 §3.1, §3.2): each at most once, empty values count as
 * absent, unknown ones are ignored. Values land in a null-prototype object, so `__proto__` or
 * `constructor` are just unknown parameter names.
 */
import { InvalidRequestError } from '../../errors.js';

export type Params = Readonly<Record<string, string | undefined>>;

export function readParams(source: unknown): Params {
  const params: Record<string, string | undefined> = Object.create(null);
  if (source === undefined || source === null) return params;
  if (typeof source !== 'object') throw new InvalidRequestError('the request parameters could not be read');
  for (const [name, value] of Object.entries(source)) {
    if (Array.isArray(value)) throw new InvalidRequestError(`parameter ${name.slice(0, 40)} was sent more than once`);
    if (typeof value !== 'string') throw new InvalidRequestError(`parameter ${name.slice(0, 40)} is malformed`);
    if (value.includes('\u0000')) throw new InvalidRequestError(`parameter ${name.slice(0, 40)} contains a NUL character`);
    if (value !== '') params[name] = value;
  }
  return params;
}

export function requireParam(params: Params, name: string): string {
  const value = params[name];
  if (value === undefined) throw new InvalidRequestError(`${name} is required`);
  return value;
}

/** A canonical positive integer ("1", never "01", "1.0", "+1" or "1e3"), within JS's exact range. */
export function parseCanonicalId(value: string): number | undefined {
  if (!/^[1-9][0-9]{0,15}$/.test(value)) return undefined;
  const n = Number(value);
  return Number.isSafeInteger(n) ? n : undefined;
}
