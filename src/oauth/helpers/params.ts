/**
 * OAuth request parameters (RFC 6749 §3.1, §3.2): each at most once, empty values count as
 * absent, unknown ones are ignored. Values land in a null-prototype object, so `__proto__` or
 * `constructor` are just unknown parameter names.
 */
import { InvalidRequestError } from '../../errors.js';

export type Params = Readonly<Record<string, string | undefined>>;

const repeated = (name: string) => new InvalidRequestError(`parameter ${name.slice(0, 40)} was sent more than once`);

/** A parameter's value, if it may be one: text without NUL. */
function checked(name: string, value: string): string {
  if (value.includes('\u0000')) throw new InvalidRequestError(`parameter ${name.slice(0, 40)} contains a NUL character`);
  return value;
}

/** Parameters as an object (a parsed query string): a name once, text without NUL; an empty value is absent. */
export function readParams(source: unknown): Params {
  const params: Record<string, string | undefined> = Object.create(null);
  if (source === undefined || source === null) return params;
  if (typeof source !== 'object') throw new InvalidRequestError('the request parameters could not be read');
  for (const [name, value] of Object.entries(source)) {
    if (Array.isArray(value)) throw repeated(name);
    if (typeof value !== 'string') throw new InvalidRequestError(`parameter ${name.slice(0, 40)} is malformed`);
    if (checked(name, value) !== '') params[name] = value;
  }
  return params;
}

/**
 * The same rules over name-value pairs as they came (a parsed form), in one pass with no
 * intermediate object: a repeat is seen at its second occurrence.
 */
export function readParamPairs(pairs: Iterable<[string, string]>): Params {
  const params: Record<string, string | undefined> = Object.create(null);
  let empty = false;
  for (const [name, value] of pairs) {
    if (params[name] !== undefined) throw repeated(name);
    params[name] = checked(name, value);
    if (value === '') empty = true;
  }
  // Empty values were held to see their repeats; a name sent empty is absent.
  if (empty) for (const name in params) if (params[name] === '') delete params[name];
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
