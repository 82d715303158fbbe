import { type RawBuilder, sql } from 'kysely';
import type { ApplicationType } from '../../db/schema.js';
import { InvalidRequestError } from '../../errors.js';
import { InvalidScopeError } from '../errors.js';

/** Every scope orgauth knows, with the description the consent page and the dashboard show. */
export const SCOPE_DESCRIPTIONS = {
  'contacts.read': 'Read contacts',
  'contacts.write': 'Create, change and delete contacts',
  'tasks.read': 'Read tasks',
  'tasks.write': 'Create, change and delete tasks',
  'applications.read': 'Read the organization’s applications',
  'applications.write': 'Create, change, disable and delete applications and rotate their secrets',
  'members.read': 'Read the organization’s members and their roles',
  'members.write': 'Add and remove members and change their roles',
  'grants.read': 'Read the connected apps (live grants)',
  'grants.write': 'Revoke connected apps',
  'audit.read': 'Read the audit log',
  'sso.read': 'Read the organization’s SSO connections and domains',
  'sso.write': 'Manage the organization’s SSO connections and domains',
  'webhooks.read': 'Read the organization’s webhook endpoints and their deliveries',
  'webhooks.write': 'Manage the organization’s webhook endpoints: create, change, delete, rotate secrets, ping, retry deliveries',
  'directory.read': 'Read the organization’s SCIM directories',
  'directory.write': 'Manage the organization’s SCIM directories: create, change, delete, rotate their tokens',
} as const;

export type Scope = keyof typeof SCOPE_DESCRIPTIONS;

/** The organization's data: what a user can delegate to a public application. */
export const DATA_SCOPES = ['contacts.read', 'contacts.write', 'tasks.read', 'tasks.write'] as const satisfies readonly Scope[];
/**
 * Administration of the organization (the management API). Held only by the organization's own
 * private applications (AD-1): a user never delegates them to a third party.
 */
export const MANAGEMENT_SCOPES = [
  'applications.read',
  'applications.write',
  'members.read',
  'members.write',
  'grants.read',
  'grants.write',
  'audit.read',
  'sso.read',
  'sso.write',
  'webhooks.read',
  'webhooks.write',
  'directory.read',
  'directory.write',
] as const satisfies readonly Scope[];

/** Canonical order: scope lists are always written in this order. */
export const KNOWN_SCOPES: readonly Scope[] = [...DATA_SCOPES, ...MANAGEMENT_SCOPES];

/**
 * The OpenID Connect scopes (OIDC Core §5.4): what an application learns about the user who signs
 * in, not what it may do with the organization's data. Any public application may ask for them
 * and any member may grant them, so neither an application's registered scopes nor a role bound
 * them: they are stored apart from `scopes` (identity_scopes), and every comparison of `scopes`
 * with a role or an application leaves them out.
 */
export const IDENTITY_SCOPE_DESCRIPTIONS = {
  openid: 'Know who you are (your user id) and which organization you chose',
  profile: 'See your name',
  email: 'See your email address and whether it is confirmed',
} as const;
export type IdentityScope = keyof typeof IDENTITY_SCOPE_DESCRIPTIONS;
export const IDENTITY_SCOPES: readonly IdentityScope[] = ['openid', 'profile', 'email'];

export function isIdentityScope(value: string): value is IdentityScope {
  return Object.hasOwn(IDENTITY_SCOPE_DESCRIPTIONS, value);
}

/** What the discovery documents list: the OpenID scopes, then every scope orgauth knows. */
export const SCOPES_SUPPORTED: readonly string[] = [...IDENTITY_SCOPES, ...KNOWN_SCOPES];

export function isKnownScope(value: string): value is Scope {
  return Object.hasOwn(SCOPE_DESCRIPTIONS, value);
}

const MANAGEMENT = new Set<string>(MANAGEMENT_SCOPES);
/** A resource's credentials (type 'resource') hold no scope: they introspect and exchange tokens. */
const HOLDABLE: Record<ApplicationType, ReadonlySet<string>> = { public: new Set<string>(DATA_SCOPES), private: new Set<string>(KNOWN_SCOPES), resource: new Set<string>() };

export function isManagementScope(value: string): boolean {
  return MANAGEMENT.has(value);
}

/** What an application of this type may hold: public ones the data scopes only (AD-1). */
export function scopesForType(type: ApplicationType): readonly Scope[] {
  return type === 'private' ? KNOWN_SCOPES : type === 'public' ? DATA_SCOPES : [];
}

/** Whether an application of this type may hold `scope`. */
export function mayHold(type: ApplicationType, scope: string): boolean {
  // A declared scope (not orgauth's) reaches here only for a private application (applicationScopes).
  return HOLDABLE[type].has(scope) || (type === 'private' && !isKnownScope(scope));
}

/**
 * Parses a space-separated scope string (RFC 6749 §3.3) or a list of them into a de-duplicated
 * list in canonical order. Unknown scopes are an InvalidRequestError naming them.
 */
export function parseScopes(input: string | readonly string[], declared: ReadonlySet<string> = NONE_DECLARED): string[] {
  const words = (typeof input === 'string' ? [input] : input).flatMap((s) => s.split(/[ \t\n\r]+/)).filter((s) => s !== '');
  const unknown = words.filter((w) => !isKnownScope(w) && !declared.has(w));
  if (unknown.length > 0) {
    throw new InvalidRequestError(`unknown scope ${unknown.map((s) => JSON.stringify(s.slice(0, 40))).join(', ')}; known scopes: ${KNOWN_SCOPES.join(' ')}`, {
      details: [{ path: 'scopes', message: `unknown scope ${unknown.map((s) => JSON.stringify(s.slice(0, 40))).join(', ')}` }],
    });
  }
  // orgauth's own in canonical order, then the declared ones in the order given.
  return [...KNOWN_SCOPES.filter((s) => words.includes(s)), ...[...new Set(words)].filter((w) => declared.has(w) && !isKnownScope(w))];
}

const NONE_DECLARED: ReadonlySet<string> = new Set();

/**
 * The scopes an application of `type` is registered with: `input` parsed (data scopes when
 * omitted), at least one, and for a public application no management scope (AD-1). A private
 * application may also list scopes the registered resources declare (`declared`): those bound
 * what it gets for itself (client_credentials) at a resource. A public application's users
 * decide that at consent, so it lists none.
 */
export function applicationScopes(type: ApplicationType, input: string | readonly string[] | undefined, declared: ReadonlySet<string> = NONE_DECLARED): string[] {
  const scopes = input === undefined ? [...DATA_SCOPES] : parseScopes(input, type === 'private' ? declared : NONE_DECLARED);
  if (scopes.length === 0) throw new InvalidRequestError('scopes: at least one scope is required', { details: [{ path: 'scopes', message: 'at least one scope is required' }] });
  const refused = scopes.filter((s) => !mayHold(type, s));
  if (refused.length > 0) {
    const message = `${refused.join(' ')} may be held only by private applications`;
    throw new InvalidRequestError(`scopes: ${message}`, { details: [{ path: 'scopes', message }] });
  }
  return scopes;
}

/**
 * An authorization request's scope split in two: the OpenID scopes, in canonical order, and the
 * rest (space-separated, '' when none), which the caller checks against the application's with
 * grantableScopes. `profile` and `email` mean something only beside `openid` (OIDC Core §5.4):
 * without it they are invalid_scope rather than silently dropped.
 */
export function splitIdentityScopes(requested: string): { identity: IdentityScope[]; rest: string } {
  // offline_access (OIDC Core §11) asks for a refresh token, which every authorization gets: understood, nothing to grant.
  const words = requested.split(' ').filter((w) => w !== '' && w !== 'offline_access');
  const identity = IDENTITY_SCOPES.filter((s) => words.includes(s));
  if (identity.length > 0 && !identity.includes('openid')) throw new InvalidScopeError(`scope ${identity.join(' ')} needs openid`);
  return { identity, rest: words.filter((w) => !isIdentityScope(w)).join(' ') };
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
  // In KNOWN_SCOPES' order, each once: one word (most requests) already is.
  if (words.length === 1) return words as Scope[];
  return KNOWN_SCOPES.filter((s) => words.includes(s));
}

/** orgauth's own scope names as a SQL array literal. */
export const KNOWN_SCOPES_SQL = sql.raw(`array[${KNOWN_SCOPES.map((s) => `'${s}'`).join(',')}]::text[]`);

/**
 * The names of orgauth's own vocabulary among `scopes` (SQL): what an application's registered
 * scopes bound. A resource's declared names are bounded by the resource, consent and role instead.
 */
export function knownScopesOf(scopes: RawBuilder<string[]>): RawBuilder<string[]> {
  return sql<string[]>`array(select s from unnest(${scopes}) s where s = any(${KNOWN_SCOPES_SQL}))`;
}
