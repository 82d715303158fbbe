import { InvalidRequestError } from '../errors.js';
import { InvalidScopeError } from './errors.js';

/** Every scope orgauth knows, with the description the consent page shows. */
export const SCOPE_DESCRIPTIONS = {
  'contacts.read': 'Read contacts',
  'contacts.write': 'Create, change and delete contacts',
  'tasks.read': 'Read tasks',
  'tasks.write': 'Create, change and delete tasks',
} as const;

export type Scope = keyof typeof SCOPE_DESCRIPTIONS;
export const KNOWN_SCOPES: readonly Scope[] = ['contacts.read', 'contacts.write', 'tasks.read', 'tasks.write'] satisfies (keyof typeof SCOPE_DESCRIPTIONS)[];

export function isKnownScope(value: string): value is Scope {
  return Object.hasOwn(SCOPE_DESCRIPTIONS, value);
}

/**
 * Parses a space-separated scope string (RFC 6749 §3.3) or a list of them into a de-duplicated
 * list in canonical order. Unknown scopes are an InvalidRequestError naming them.
 */
export function parseScopes(input: string | readonly string[]): Scope[] {
  const words = (typeof input === 'string' ? [input] : input).flatMap((s) => s.split(/[ \t\n\r]+/)).filter((s) => s !== '');
  const unknown = words.filter((w) => !isKnownScope(w));
  if (unknown.length > 0) {
    throw new InvalidRequestError(`unknown scope ${unknown.map((s) => JSON.stringify(s)).join(', ')}; known scopes: ${KNOWN_SCOPES.join(' ')}`);
  }
  return KNOWN_SCOPES.filter((s) => words.includes(s));
}

/**
 * The scopes a token request gets (RFC 6749 §3.3): all of `allowed` when none are asked for;
 * otherwise exactly those asked for, each of which must be known and allowed.
 */
export function grantableScopes(requested: string | undefined, allowed: readonly string[]): Scope[] {
  if (requested === undefined) return KNOWN_SCOPES.filter((s) => allowed.includes(s));
  const words = requested.split(' ').filter((w) => w !== '');
  const refused = words.filter((w) => !isKnownScope(w) || !allowed.includes(w));
  if (words.length === 0 || refused.length > 0) {
    throw new InvalidScopeError(
      words.length === 0 ? 'scope is empty' : `scope ${refused.map((s) => s.slice(0, 40)).join(' ')} is unknown or not allowed for this application`,
    );
  }
  return KNOWN_SCOPES.filter((s) => words.includes(s));
}
