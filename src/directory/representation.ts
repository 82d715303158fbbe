/**
 * How SCIM resources look on the wire (RFC 7643): a directory user or group row to its JSON
 * representation, with `meta` (location, version as a weak ETag) and the `attributes` /
 * `excludedAttributes` projection of RFC 7644 §3.4.2.5.
 */
import { badScim } from './scim-errors.js';

export const USER_SCHEMA = 'urn:ietf:params:scim:schemas:core:2.0:User';
export const ENTERPRISE_USER_SCHEMA = 'urn:ietf:params:scim:schemas:extension:enterprise:2.0:User';
export const GROUP_SCHEMA = 'urn:ietf:params:scim:schemas:core:2.0:Group';
export const LIST_RESPONSE_SCHEMA = 'urn:ietf:params:scim:api:messages:2.0:ListResponse';
export const PATCH_OP_SCHEMA = 'urn:ietf:params:scim:api:messages:2.0:PatchOp';

/** The ETag of a resource at `version` (RFC 7644 §3.14): weak, as the representation may be re-serialized. */
export const etagOf = (version: number | string): string => `W/"${version}"`;

/**
 * Whether an If-Match (or If-None-Match) header names `version`: `*`, or a list of entity tags,
 * weak or strong (a client may echo the tag without the W/ prefix).
 */
export function etagMatches(header: string, version: number | string): boolean {
  if (header.trim() === '*') return true;
  return header.split(',').some((tag) => tag.trim().replace(/^W\//, '') === `"${version}"`);
}

export interface UserRow {
  id: string;
  user_name: string;
  external_id: string | null;
  display_name: string | null;
  active: boolean;
  resource: Record<string, unknown>;
  version: number | string;
  created_at: Date;
  updated_at: Date;
}

export interface GroupRow {
  id: string;
  display_name: string;
  external_id: string | null;
  version: number | string;
  created_at: Date;
  updated_at: Date;
}

export interface Reference {
  value: string;
  display: string | null;
}

/** How deep a representation (or a PATCH operation's value) may nest: a User nests three levels, the enterprise manager four. */
export const MAX_DEPTH = 8;

function depthOf(value: unknown, depth = 0): number {
  if (depth > MAX_DEPTH || value === null || typeof value !== 'object') return depth;
  let deepest = depth;
  for (const child of Object.values(value)) deepest = Math.max(deepest, depthOf(child, depth + 1));
  return deepest;
}

/** 400 invalidValue when `value` nests deeper than MAX_DEPTH, found without walking further down (a body nested 100,000 deep would overflow the stack of whatever copies it). */
export function refuseDeepNesting(value: unknown, what: string): void {
  if (depthOf(value) > MAX_DEPTH) throw badScim('invalidValue', `${what} nests deeper than ${MAX_DEPTH} levels`);
}

/** Attributes the server owns: never taken from a request body. */
const SERVER_OWNED = new Set(['id', 'meta', 'schemas', 'groups']);

/** A request body's attributes without those the server owns (id, meta, schemas, groups). */
export function clientAttributes(body: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(body).filter(([key]) => !SERVER_OWNED.has(key.toLowerCase())));
}

function meta(resourceType: 'User' | 'Group', location: string, row: { version: number | string; created_at: Date; updated_at: Date }) {
  return { resourceType, created: row.created_at.toISOString(), lastModified: row.updated_at.toISOString(), location, version: etagOf(row.version) };
}

export function userRepresentation(baseUrl: string, row: UserRow, groups: readonly Reference[] | undefined): Record<string, unknown> {
  const { userName: _u, externalId: _e, displayName: _d, active: _a, ...rest } = row.resource;
  const schemas = ENTERPRISE_USER_SCHEMA in rest ? [USER_SCHEMA, ENTERPRISE_USER_SCHEMA] : [USER_SCHEMA];
  return {
    schemas,
    id: row.id,
    ...(row.external_id !== null ? { externalId: row.external_id } : {}),
    userName: row.user_name,
    ...(row.display_name !== null ? { displayName: row.display_name } : {}),
    ...rest,
    active: row.active,
    ...(groups !== undefined ? { groups: groups.map((g) => ({ value: g.value, ...(g.display !== null ? { display: g.display } : {}), $ref: `${baseUrl}/Groups/${g.value}`, type: 'direct' })) } : {}),
    meta: meta('User', `${baseUrl}/Users/${row.id}`, row),
  };
}

export function groupRepresentation(baseUrl: string, row: GroupRow, members: readonly Reference[] | undefined): Record<string, unknown> {
  return {
    schemas: [GROUP_SCHEMA],
    id: row.id,
    ...(row.external_id !== null ? { externalId: row.external_id } : {}),
    displayName: row.display_name,
    ...(members !== undefined ? { members: members.map((m) => ({ value: m.value, ...(m.display !== null ? { display: m.display } : {}), $ref: `${baseUrl}/Users/${m.value}`, type: 'User' })) } : {}),
    meta: meta('Group', `${baseUrl}/Groups/${row.id}`, row),
  };
}

/** An attribute path of `attributes`/`excludedAttributes`: lower-cased, the core schema's URN dropped, an extension's kept as the first part. */
function attributePath(text: string, core: string): string[] {
  let path = text.trim();
  if (path.toLowerCase().startsWith(`${core.toLowerCase()}:`)) path = path.slice(core.length + 1);
  if (path.toLowerCase().startsWith(`${ENTERPRISE_USER_SCHEMA.toLowerCase()}:`)) return [ENTERPRISE_USER_SCHEMA.toLowerCase(), ...path.slice(ENTERPRISE_USER_SCHEMA.length + 1).toLowerCase().split('.')];
  if (!/^[A-Za-z$][\w$-]*(\.[A-Za-z$][\w$-]*)?$/.test(path)) throw badScim('invalidValue', `"${text.slice(0, 100)}" is not an attribute name`);
  return path.toLowerCase().split('.');
}

/** The attribute paths of an `attributes`/`excludedAttributes` parameter (comma separated), or undefined when absent. */
export function parseAttributeList(value: unknown, core: string): string[][] | undefined {
  if (value === undefined || value === '') return undefined;
  if (typeof value !== 'string' || value.length > 2000) throw badScim('invalidValue', 'attributes and excludedAttributes are a comma-separated list of attribute names');
  return value.split(',').filter((part) => part.trim() !== '').map((part) => attributePath(part, core));
}

/** Attributes always returned whatever was asked (RFC 7643 §2.4 `returned: always`). */
const ALWAYS = new Set(['id', 'schemas', 'meta']);

function pick(resource: Record<string, unknown>, paths: readonly string[][]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(resource)) {
    const lower = key.toLowerCase();
    if (ALWAYS.has(lower)) {
      out[key] = value;
      continue;
    }
    const wanted = paths.filter((p) => p[0] === lower);
    if (wanted.length === 0) continue;
    if (wanted.some((p) => p.length === 1) || value === null || typeof value !== 'object') out[key] = value;
    else if (Array.isArray(value)) out[key] = value.map((item) => (item !== null && typeof item === 'object' ? pick(item as Record<string, unknown>, wanted.map((p) => p.slice(1))) : item));
    else out[key] = pick(value as Record<string, unknown>, wanted.map((p) => p.slice(1)));
  }
  return out;
}

function omit(resource: Record<string, unknown>, paths: readonly string[][]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(resource)) {
    const lower = key.toLowerCase();
    const excluded = ALWAYS.has(lower) ? [] : paths.filter((p) => p[0] === lower);
    if (excluded.some((p) => p.length === 1)) continue;
    if (excluded.length === 0 || value === null || typeof value !== 'object') out[key] = value;
    else if (Array.isArray(value)) out[key] = value.map((item) => (item !== null && typeof item === 'object' ? omit(item as Record<string, unknown>, excluded.map((p) => p.slice(1))) : item));
    else out[key] = omit(value as Record<string, unknown>, excluded.map((p) => p.slice(1)));
  }
  return out;
}

/** RFC 7644 §3.4.2.5: `attributes` keeps those named (and id, schemas, meta), else `excludedAttributes` drops those named. */
export function project(resource: Record<string, unknown>, projection: { attributes?: string[][] | undefined; excluded?: string[][] | undefined }): Record<string, unknown> {
  if (projection.attributes) return pick(resource, projection.attributes);
  if (projection.excluded) return omit(resource, projection.excluded);
  return resource;
}

/** Whether a projection leaves out a (top-level) attribute, so the query for it can be skipped. */
export function projectionDrops(projection: { attributes?: string[][] | undefined; excluded?: string[][] | undefined }, attribute: string): boolean {
  if (projection.attributes) return !projection.attributes.some((p) => p[0] === attribute);
  return projection.excluded?.some((p) => p.length === 1 && p[0] === attribute) ?? false;
}
