/**
 * SCIM PATCH (RFC 7644 §3.5.2) as Okta and Microsoft Entra ID really send it.
 *
 * Besides the RFC, this accepts what their documentation shows: "Add"/"Replace"/"Remove" in any
 * case; `active` as the strings "True"/"False"; path-less add/replace whose value keys are paths
 * themselves ("name.givenName", "emails[type eq \"work\"].value", URN-qualified enterprise
 * attributes); a replace or add through a value filter that matches nothing appends an element
 * built from the filter (`emails[type eq "work"].value` adds `{type: "work", value}`), which is
 * what Entra expects; Entra's `remove members` with a value list (only those members) beside the
 * RFC's `members[value eq "id"]`; Okta's path-less replace carrying the resource's own `id`.
 *
 * Attribute names compare without case (RFC 7643 §2.1) and are written back in the schema's
 * camelCase; attributes the schemas do not name are kept as sent. A patch is applied to a copy:
 * it takes effect whole or not at all.
 *
 * Groups: the result is the new displayName/externalId and the membership changes in order, never
 * the member list itself (a group may have 100,000 members; the service applies the changes).
 */
import {
  CORE_GROUP_SCHEMA,
  CORE_USER_SCHEMA,
  ENTERPRISE_USER_SCHEMA,
  type Filter,
  type FilterValue,
  type PatchPath,
  parsePatchPath,
} from './filter.js';
import { refuseDeepNesting } from './representation.js';
import { badScim } from './scim-errors.js';

export const PATCH_OP_SCHEMA = 'urn:ietf:params:scim:api:messages:2.0:PatchOp';
export const MAX_PATCH_OPERATIONS = 1000;
/** Member ids across one PATCH's operations. */
export const MAX_MEMBER_IDS = 10_000;

export type PatchOp = 'add' | 'replace' | 'remove';

export interface PatchOperation {
  op: PatchOp;
  /** Absent: the operation's value is a set of attributes (add/replace only). */
  path?: string;
  value?: unknown;
}

export type MemberChange = { op: 'add'; ids: string[] } | { op: 'remove'; ids: string[] } | { op: 'remove_all' } | { op: 'replace'; ids: string[] };

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);

/** A member of `obj` whose name equals `name` without case. */
function fieldOf(obj: Json, name: string): unknown {
  const key = Object.keys(obj).find((k) => k.toLowerCase() === name.toLowerCase());
  return key === undefined ? undefined : obj[key];
}

// ---------------------------------------------------------------------------------------------
// The request

/**
 * Validates a PATCH body: the PatchOp schema (invalidSyntax without it; Okta and Entra both send
 * it), 1 to 1,000 operations under `Operations` (any case), each op add/replace/remove in any
 * case, each path readable (invalidPath), a remove with no path refused (noTarget, RFC 7644
 * §3.5.2.2), an add/replace with a value (a set of attributes when path-less).
 */
export function parsePatchRequest(body: unknown): PatchOperation[] {
  if (!isObject(body)) throw badScim('invalidSyntax', 'a PATCH body is a JSON object');
  const schemas = body.schemas;
  if (!Array.isArray(schemas) || !schemas.some((s) => typeof s === 'string' && s.toLowerCase() === PATCH_OP_SCHEMA.toLowerCase())) {
    throw badScim('invalidSyntax', `schemas must contain ${PATCH_OP_SCHEMA}`);
  }
  const list = fieldOf(body, 'Operations');
  if (!Array.isArray(list) || list.length === 0) throw badScim('invalidSyntax', 'Operations must be a non-empty array');
  if (list.length > MAX_PATCH_OPERATIONS) throw badScim('invalidValue', `at most ${MAX_PATCH_OPERATIONS} operations in one PATCH`);
  return list.map((raw, i) => {
    if (!isObject(raw)) throw badScim('invalidSyntax', `operation ${i + 1} is not an object`);
    const opName = fieldOf(raw, 'op');
    const op = typeof opName === 'string' ? opName.toLowerCase() : '';
    if (op !== 'add' && op !== 'replace' && op !== 'remove') throw badScim('invalidSyntax', `operation ${i + 1}: op must be add, replace or remove`);
    const rawPath = fieldOf(raw, 'path');
    let path: string | undefined;
    if (typeof rawPath === 'string' && rawPath.trim() !== '') {
      path = rawPath.trim();
      if (!isWholeExtension(path)) parsePatchPath(path);
    } else if (rawPath !== undefined && rawPath !== null && rawPath !== '') {
      throw badScim('invalidPath', `operation ${i + 1}: path must be a string`);
    }
    const hasValue = Object.keys(raw).some((k) => k.toLowerCase() === 'value');
    const value = fieldOf(raw, 'value');
    refuseDeepNesting(value, `operation ${i + 1}: the value`);
    if (op === 'remove') {
      if (path === undefined) throw badScim('noTarget', `operation ${i + 1}: remove needs a path`);
      return { op, path, ...(value !== undefined ? { value } : {}) };
    }
    if (!hasValue) throw badScim('invalidSyntax', `operation ${i + 1}: ${op} needs a value`);
    if (path === undefined && !isObject(value)) throw badScim('invalidValue', `operation ${i + 1}: without a path, the value is an object of attributes`);
    return { op, ...(path !== undefined ? { path } : {}), value };
  });
}

// ---------------------------------------------------------------------------------------------
// The User schema (RFC 7643 §4.1, §4.3), for names and shapes

const CORE_USER_ATTRIBUTES = [
  'id', 'externalId', 'meta', 'schemas', 'userName', 'name', 'displayName', 'nickName', 'profileUrl', 'title', 'userType', 'preferredLanguage', 'locale',
  'timezone', 'active', 'password', 'emails', 'phoneNumbers', 'ims', 'photos', 'addresses', 'groups', 'entitlements', 'roles', 'x509Certificates',
];
const ENTERPRISE_ATTRIBUTES = ['employeeNumber', 'costCenter', 'organization', 'division', 'department', 'manager'];
const MULTI_VALUED = new Set(['emails', 'phonenumbers', 'ims', 'photos', 'addresses', 'groups', 'entitlements', 'roles', 'x509certificates', 'schemas']);
const PLURAL_SUBS = ['value', 'display', 'type', 'primary', '$ref'];
const SUB_ATTRIBUTES: Record<string, readonly string[]> = {
  name: ['formatted', 'familyName', 'givenName', 'middleName', 'honorificPrefix', 'honorificSuffix'],
  addresses: ['formatted', 'streetAddress', 'locality', 'region', 'postalCode', 'country', 'type', 'primary'],
  manager: ['value', '$ref', 'displayName'],
};
/** Complex single-valued: a replace or add merges sub-attributes (RFC 7644 §3.5.2.1, §3.5.2.3). */
const COMPLEX = new Set(['name', 'manager']);

const canonical = (names: readonly string[], name: string): string => names.find((n) => n.toLowerCase() === name.toLowerCase()) ?? name;
const subsOf = (attr: string): readonly string[] => SUB_ATTRIBUTES[attr.toLowerCase()] ?? PLURAL_SUBS;

function isWholeExtension(path: string): boolean {
  return path.toLowerCase() === ENTERPRISE_USER_SCHEMA.toLowerCase();
}

/** Sets `obj[key]`, dropping members spelled the same without case (`username` → `userName`). */
function put(obj: Json, key: string, value: unknown): void {
  for (const k of Object.keys(obj)) if (k !== key && k.toLowerCase() === key.toLowerCase()) delete obj[k];
  obj[key] = value;
}

function drop(obj: Json, key: string): void {
  for (const k of Object.keys(obj)) if (k.toLowerCase() === key.toLowerCase()) delete obj[k];
}

/** "True"/"False" (Entra) and booleans; anything else refused. */
function toBoolean(value: unknown, what: string): boolean {
  if (typeof value === 'boolean') return value;
  if (typeof value === 'string' && /^(true|false)$/i.test(value.trim())) return value.trim().toLowerCase() === 'true';
  throw badScim('invalidValue', `${what} must be true or false`);
}

/** An element of a multi-valued attribute, its `primary` made a boolean. */
function normalizeElement(element: unknown, attr: string): unknown {
  if (!isObject(element)) return structuredClone(element);
  const out: Json = {};
  for (const [k, v] of Object.entries(element)) {
    const name = canonical(subsOf(attr), k);
    if (v === null) continue;
    out[name] = name === 'primary' ? toBoolean(v, `${attr}.primary`) : structuredClone(v);
  }
  return out;
}

function sameElement(a: unknown, b: unknown): boolean {
  if (isObject(a) && isObject(b) && a.value !== undefined && b.value !== undefined) {
    return typeof a.value === 'string' && typeof b.value === 'string' ? a.value.toLowerCase() === b.value.toLowerCase() : a.value === b.value;
  }
  return JSON.stringify(a) === JSON.stringify(b);
}

/** RFC 7643 §2.4: `primary: true` at most once; the element set last keeps it. */
function onePrimary(elements: unknown[], keep: unknown): void {
  if (!isObject(keep) || keep.primary !== true) return;
  for (const e of elements) if (e !== keep && isObject(e) && e.primary === true) e.primary = false;
}

// ---------------------------------------------------------------------------------------------
// Value filters on elements, in memory (`emails[type eq "work" and primary eq true]`)

function present(v: unknown): boolean {
  if (v === undefined || v === null || v === '') return false;
  if (Array.isArray(v)) return v.length > 0;
  if (isObject(v)) return Object.keys(v).length > 0;
  return true;
}

function compareValues(actual: unknown, op: string, expected: FilterValue): boolean {
  if (expected === null) return op === 'eq' ? !present(actual) : op === 'ne' ? present(actual) : false;
  if (typeof expected === 'boolean') {
    const b = typeof actual === 'boolean' ? actual : typeof actual === 'string' && /^(true|false)$/i.test(actual) ? actual.toLowerCase() === 'true' : undefined;
    if (op === 'eq') return b === expected;
    if (op === 'ne') return b !== expected;
    throw badScim('invalidPath', `${op} does not apply to a boolean`);
  }
  if (actual === undefined || actual === null || typeof actual === 'object') return op === 'ne';
  if (typeof expected === 'number' && typeof actual === 'number') {
    return { eq: actual === expected, ne: actual !== expected, gt: actual > expected, ge: actual >= expected, lt: actual < expected, le: actual <= expected, co: false, sw: false, ew: false }[op] ?? false;
  }
  // Sub-attributes of multi-valued attributes (type, value, display) are caseExact=false.
  const a = String(actual).toLowerCase();
  const e = String(expected).toLowerCase();
  switch (op) {
    case 'eq':
      return a === e;
    case 'ne':
      return a !== e;
    case 'co':
      return a.includes(e);
    case 'sw':
      return a.startsWith(e);
    case 'ew':
      return a.endsWith(e);
    case 'gt':
      return a > e;
    case 'ge':
      return a >= e;
    case 'lt':
      return a < e;
    default:
      return a <= e;
  }
}

function matches(filter: Filter, element: unknown): boolean {
  switch (filter.op) {
    case 'and':
      return matches(filter.left, element) && matches(filter.right, element);
    case 'or':
      return matches(filter.left, element) || matches(filter.right, element);
    case 'not':
      return !matches(filter.filter, element);
    case '[]':
      throw badScim('invalidPath', 'a value filter cannot contain another');
    default: {
      if (filter.path.schema !== undefined || filter.path.sub !== undefined) throw badScim('invalidPath', 'a value filter names sub-attributes of the element');
      // Elements that are plain values (schemas) answer to `value`.
      const actual = isObject(element) ? fieldOf(element, filter.path.attr) : filter.path.attr.toLowerCase() === 'value' ? element : undefined;
      return filter.op === 'pr' ? present(actual) : compareValues(actual, filter.op, filter.value);
    }
  }
}

/** `type eq "work" and primary eq true` → `{type: "work", primary: true}`; undefined for anything else. */
function seedOf(filter: Filter, attr: string): Json | undefined {
  if (filter.op === 'eq' && filter.value !== null && filter.path.schema === undefined && filter.path.sub === undefined) {
    const name = canonical(subsOf(attr), filter.path.attr);
    return { [name]: name === 'primary' ? toBoolean(filter.value, `${attr}.primary`) : filter.value };
  }
  if (filter.op === 'and') {
    const left = seedOf(filter.left, attr);
    const right = seedOf(filter.right, attr);
    return left && right ? { ...left, ...right } : undefined;
  }
  return undefined;
}

// ---------------------------------------------------------------------------------------------
// Users

/** Where an operation lands: `container` is the resource or the extension object under its URN. */
interface Target {
  extension?: string;
  attr: string;
  /** Known to be multi-valued (true), single-valued (false), or neither known (undefined). */
  multi: boolean | undefined;
  complex: boolean;
  sub?: string;
  filter?: Filter;
}

function userTarget(text: string): Target {
  if (isWholeExtension(text)) return { attr: ENTERPRISE_USER_SCHEMA, multi: false, complex: true };
  const parsed: PatchPath = parsePatchPath(text);
  const { path } = parsed;
  const schema = path.schema?.toLowerCase();
  let extension: string | undefined;
  let attr: string;
  let multi: boolean | undefined;
  let complex = false;
  if (schema === undefined || schema === CORE_USER_SCHEMA.toLowerCase()) {
    attr = canonical(CORE_USER_ATTRIBUTES, path.attr);
    const lower = attr.toLowerCase();
    multi = MULTI_VALUED.has(lower) ? true : CORE_USER_ATTRIBUTES.includes(attr) ? false : undefined;
    complex = COMPLEX.has(lower);
  } else if (schema === ENTERPRISE_USER_SCHEMA.toLowerCase()) {
    extension = ENTERPRISE_USER_SCHEMA;
    attr = canonical(ENTERPRISE_ATTRIBUTES, path.attr);
    multi = ENTERPRISE_ATTRIBUTES.includes(attr) ? false : undefined;
    complex = COMPLEX.has(attr.toLowerCase());
  } else if (schema === CORE_GROUP_SCHEMA.toLowerCase()) {
    throw badScim('invalidPath', `${text} names a Group attribute`);
  } else {
    // Another extension: kept under its URN as sent.
    extension = path.schema;
    attr = path.attr;
  }
  const sub = parsed.sub ?? path.sub;
  // id and meta are the server's, whatever the rest of the path: applyUserOperation answers them.
  if (extension === undefined && (attr === 'id' || attr === 'meta')) return { attr, multi: false, complex: false, ...(sub !== undefined ? { sub } : {}), ...(parsed.filter !== undefined ? { filter: parsed.filter } : {}) };
  if (parsed.filter !== undefined && multi === false) throw badScim('invalidPath', `${attr} is not multi-valued: a value filter does not apply`);
  if (path.sub !== undefined && multi === false && !complex) throw badScim('invalidPath', `${attr} has no sub-attributes`);
  return {
    ...(extension !== undefined ? { extension } : {}),
    attr,
    multi,
    complex,
    ...(sub !== undefined ? { sub: canonical(subsOf(attr), sub) } : {}),
    ...(parsed.filter !== undefined ? { filter: parsed.filter } : {}),
  };
}

function coerce(target: Target, value: unknown): unknown {
  if (target.extension === undefined && target.attr === 'active' && target.sub === undefined) return toBoolean(value, 'active');
  if (target.sub === 'primary') return toBoolean(value, `${target.attr}.primary`);
  return structuredClone(value);
}

/** The object an operation changes: the resource, or its extension object (made for add/replace). */
function containerOf(resource: Json, target: Target, create: boolean): Json | undefined {
  if (target.extension === undefined) return resource;
  const existing = fieldOf(resource, target.extension);
  if (isObject(existing)) {
    put(resource, target.extension, existing);
    return existing;
  }
  if (existing !== undefined && existing !== null) throw badScim('invalidPath', `${target.extension} is not an object`);
  if (!create) return undefined;
  const made: Json = {};
  put(resource, target.extension, made);
  return made;
}

function applyUserOperation(resource: Json, op: PatchOp, target: Target, value: unknown, id: string | undefined): void {
  if (target.extension === undefined) {
    const lower = target.attr.toLowerCase();
    if (lower === 'meta') return; // server-owned; Okta and Entra may echo it
    if (lower === 'id') {
      if (op !== 'remove' && target.sub === undefined && target.filter === undefined && (id === undefined || value === id)) return;
      throw badScim('mutability', 'id is assigned by the server and cannot be changed');
    }
    if (lower === 'groups') throw badScim('mutability', "groups is read-only: change a Group's members instead");
  }
  const container = containerOf(resource, target, op !== 'remove');
  if (!container) return;
  const { attr } = target;
  const current = fieldOf(container, attr);
  const multi = target.multi ?? (Array.isArray(current) || (current === undefined && (Array.isArray(value) || target.filter !== undefined)));
  if (target.filter !== undefined) {
    if (!multi) throw badScim('invalidPath', `${attr} is not multi-valued: a value filter does not apply`);
    applyFiltered(container, op, target, target.filter, Array.isArray(current) ? current : [], value);
    return;
  }
  if (target.sub !== undefined) {
    applySub(container, op, target, current, multi, value);
    return;
  }
  if (op === 'remove') {
    if (value !== undefined && value !== null && Array.isArray(current)) {
      // A value on remove names the elements to take out (Entra does this for members).
      const gone = Array.isArray(value) ? value : [value];
      const left = current.filter((e) => !gone.some((g) => sameElement(e, g)));
      if (left.length === 0) drop(container, attr);
      else put(container, attr, left);
    } else drop(container, attr);
    return;
  }
  // RFC 7643 §2.5: null is the same as unassigned.
  if (value === null) {
    drop(container, attr);
    return;
  }
  if (multi) {
    const items = (Array.isArray(value) ? value : [value]).map((e) => normalizeElement(e, attr));
    let next: unknown[];
    if (op === 'replace') next = items;
    else {
      next = Array.isArray(current) ? current.slice() : current === undefined ? [] : [current];
      for (const item of items) {
        const at = next.findIndex((e) => sameElement(e, item));
        if (at >= 0 && JSON.stringify(next[at]) !== JSON.stringify(item) && isObject(next[at]) && isObject(item)) next[at] = { ...next[at], ...item };
        else if (at < 0) next.push(item);
      }
    }
    for (const item of items) onePrimary(next, next.find((e) => sameElement(e, item)));
    if (next.length === 0) drop(container, attr);
    else put(container, attr, next);
    return;
  }
  if (target.complex || (isObject(current) && isObject(value))) {
    if (!isObject(value)) throw badScim('invalidValue', `${attr} is complex: its value is an object of sub-attributes`);
    // RFC 7644 §3.5.2.1/§3.5.2.3: sub-attributes not given are left as they are.
    const merged: Json = isObject(current) ? current : {};
    for (const [k, v] of Object.entries(value)) {
      const name = attr === ENTERPRISE_USER_SCHEMA ? canonical(ENTERPRISE_ATTRIBUTES, k) : canonical(subsOf(attr), k);
      if (v === null) drop(merged, name);
      else put(merged, name, structuredClone(v));
    }
    put(container, attr, merged);
    return;
  }
  put(container, attr, coerce(target, value));
}

/** `name.givenName`, `manager.value`, or `emails.value` (every element) without a filter. */
function applySub(container: Json, op: PatchOp, target: Target, current: unknown, multi: boolean, value: unknown): void {
  const { attr } = target;
  const sub = target.sub!;
  if (multi) {
    const elements = Array.isArray(current) ? current.map((e) => (isObject(e) ? { ...e } : e)) : [];
    if (op === 'remove') {
      for (const e of elements) if (isObject(e)) drop(e, sub);
    } else if (elements.length === 0) {
      if (value !== null) elements.push({ [sub]: coerce(target, value) });
    } else {
      for (const e of elements) if (isObject(e)) value === null ? drop(e, sub) : put(e, sub, coerce(target, value));
    }
    if (elements.length > 0) put(container, attr, elements);
    return;
  }
  if (current !== undefined && current !== null && !isObject(current)) throw badScim('invalidPath', `${attr} is not complex`);
  if (op === 'remove' || value === null) {
    if (isObject(current)) drop(current, sub);
    return;
  }
  const object: Json = isObject(current) ? current : {};
  put(object, sub, coerce(target, value));
  put(container, attr, object);
}

/** `emails[type eq "work"]` and `emails[type eq "work"].value`. */
function applyFiltered(container: Json, op: PatchOp, target: Target, filter: Filter, current: unknown[], value: unknown): void {
  const { attr, sub } = target;
  const elements = current.map((e) => (isObject(e) ? { ...e } : e));
  const hit = elements.map((e) => matches(filter, e));
  if (op === 'remove') {
    if (sub === undefined) {
      const left = elements.filter((_, i) => !hit[i]);
      if (left.length === 0) drop(container, attr);
      else put(container, attr, left);
    } else {
      elements.forEach((e, i) => hit[i] && isObject(e) && drop(e, sub));
      put(container, attr, elements);
    }
    return;
  }
  if (sub === undefined && !isObject(value)) throw badScim('invalidValue', `${attr}[...] takes an object of sub-attributes`);
  const changes: Json = sub === undefined ? (normalizeElement(value, attr) as Json) : { [sub]: coerce(target, value) };
  let changed: Json | undefined;
  if (hit.some(Boolean)) {
    elements.forEach((e, i) => {
      if (!hit[i] || !isObject(e)) return;
      for (const [k, v] of Object.entries(changes)) v === null ? drop(e, k) : put(e, k, v);
      changed = e;
    });
  } else {
    // Nothing matched: Entra expects `emails[type eq "work"].value` to create the work address.
    const seed = seedOf(filter, attr);
    if (!seed) throw badScim('noTarget', `no ${attr} value matches the filter, and it does not say which to create`);
    changed = { ...seed };
    for (const [k, v] of Object.entries(changes)) if (v !== null) changed[k] = v;
    elements.push(changed);
  }
  onePrimary(elements, changed);
  put(container, attr, elements);
}

/**
 * Applies PATCH operations to a User representation (userName, name, emails, the enterprise
 * extension under its URN, ...), returning a new object; the input is left as it was. `id` is
 * the resource's SCIM id (or `resource.id`): an operation setting it to anything else is refused
 * (mutability), the same id (Okta sends it) is ignored, as is `meta`. Without a known id, an
 * `id` in a patch is ignored: the service never takes the id from a body.
 */
export function applyUserPatch(resource: Record<string, unknown>, ops: PatchOperation[], options: { id?: string } = {}): Record<string, unknown> {
  const out = structuredClone(resource);
  const id = options.id ?? (typeof resource.id === 'string' ? resource.id : undefined);
  for (const operation of ops) {
    if (operation.path !== undefined) {
      applyUserOperation(out, operation.op, userTarget(operation.path), operation.value, id);
      continue;
    }
    if (!isObject(operation.value)) throw badScim('invalidValue', 'without a path, the value is an object of attributes');
    for (const [key, value] of Object.entries(operation.value)) {
      if (key.toLowerCase() === 'schemas') continue; // the resource's schemas follow from its attributes
      applyUserOperation(out, operation.op, userTarget(key), value, id);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Groups

function memberIds(value: unknown): string[] {
  const list = Array.isArray(value) ? value : [value];
  return list.map((m) => {
    const id = isObject(m) ? fieldOf(m, 'value') : undefined;
    if (typeof id !== 'string' || id === '') throw badScim('invalidValue', 'each member is an object with a string "value" (the User id)');
    return id;
  });
}

/** `members[value eq "a"]`, or several joined by `or`: the ids; anything else cannot be applied without loading members. */
function filteredIds(filter: Filter): string[] {
  if (filter.op === 'eq' && filter.path.schema === undefined && filter.path.sub === undefined && filter.path.attr.toLowerCase() === 'value' && typeof filter.value === 'string') return [filter.value];
  if (filter.op === 'or') return [...filteredIds(filter.left), ...filteredIds(filter.right)];
  throw badScim('invalidPath', 'a members filter names members by value: members[value eq "id"]');
}

/**
 * Applies PATCH operations to a Group: the new displayName and externalId, and the membership
 * changes in order (add, remove, remove_all, replace) for the service to apply. Member ids are
 * strings as sent; the service checks they are its own users. At most 10,000 ids in all.
 * `group.id`, when given, lets Okta's echo of the id through and refuses any other.
 */
export function applyGroupPatch(
  group: { id?: string; displayName: string; externalId: string | null },
  ops: PatchOperation[],
): { displayName: string; externalId: string | null; members: MemberChange[] } {
  let { displayName, externalId } = group;
  const members: MemberChange[] = [];
  let count = 0;
  const change = (c: MemberChange) => {
    if (c.op !== 'remove_all') count += c.ids.length;
    if (count > MAX_MEMBER_IDS) throw badScim('invalidValue', `at most ${MAX_MEMBER_IDS} member ids in one PATCH; send the rest in another`);
    members.push(c);
  };

  const apply = (op: PatchOp, text: string, value: unknown) => {
    const parsed = parsePatchPath(text);
    const { path } = parsed;
    if (path.schema !== undefined && path.schema.toLowerCase() !== CORE_GROUP_SCHEMA.toLowerCase()) throw badScim('invalidPath', `a Group has no attribute ${text}`);
    const attr = path.attr.toLowerCase();
    const plain = parsed.filter === undefined && path.sub === undefined && parsed.sub === undefined;
    if (attr === 'members') {
      if (parsed.filter !== undefined) {
        if (op !== 'remove' || parsed.sub !== undefined) throw badScim('invalidPath', 'a members filter is used only to remove members');
        change({ op: 'remove', ids: filteredIds(parsed.filter) });
      } else if (!plain) {
        throw badScim('invalidPath', `${text}: change members as a whole or by members[value eq "id"]`);
      } else if (op === 'remove') {
        change(value === undefined || value === null ? { op: 'remove_all' } : { op: 'remove', ids: memberIds(value) });
      } else {
        const ids = value === null ? [] : memberIds(value);
        if (op === 'replace') change({ op: 'replace', ids });
        else if (ids.length > 0) change({ op: 'add', ids });
      }
      return;
    }
    if (!plain) throw badScim('invalidPath', `${text}: ${path.attr} has no sub-attributes`);
    switch (attr) {
      case 'displayname':
        if (op === 'remove') throw badScim('invalidValue', 'displayName is required');
        if (typeof value !== 'string') throw badScim('invalidValue', 'displayName is a string');
        displayName = value;
        return;
      case 'externalid':
        if (op === 'remove' || value === null) externalId = null;
        else if (typeof value === 'string') externalId = value;
        else throw badScim('invalidValue', 'externalId is a string');
        return;
      case 'id':
        if (op !== 'remove' && (group.id === undefined || value === group.id)) return;
        throw badScim('mutability', 'id is assigned by the server and cannot be changed');
      case 'meta':
      case 'schemas':
        return;
      default:
        throw badScim('invalidPath', `a Group has no attribute ${path.attr}`);
    }
  };

  for (const operation of ops) {
    if (operation.path !== undefined) {
      apply(operation.op, operation.path, operation.value);
      continue;
    }
    if (!isObject(operation.value)) throw badScim('invalidValue', 'without a path, the value is an object of attributes');
    for (const [key, value] of Object.entries(operation.value)) apply(operation.op, key, value);
  }
  return { displayName, externalId, members };
}
