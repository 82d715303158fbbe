/**
 * SCIM filters (RFC 7644 §3.4.2.2) read into a small tree and compiled to SQL over
 * directory_users and directory_groups.
 *
 * Why a parser of our own: the npm package scim2-parse-filter (0.2.10) mangles JSON string escapes
 * (`"a\\b"` becomes two backslashes, `"a\\"` fails, `\u0041` stays literal), turns
 * `emails[type eq "work"].value eq "x"` into `emails[type eq "work"] and emails.value eq "x"`
 * (which two different addresses can satisfy), refuses negative numbers and `True`, and has no
 * nesting limit. The grammar is small enough that a recursive-descent reader is shorter than the
 * work-arounds.
 *
 * Every refusal is a ScimError (`invalidFilter` for filters, `invalidPath` for PATCH paths, which
 * share this reader): never a TypeError, never a 500. Values always reach SQL as bound
 * parameters; only our own attribute names (from the tables below, never the client's spelling)
 * are written into the SQL text, as quoted literals.
 *
 * Logic: SQL's three-valued logic would make `not (title eq "x")` skip users without a title.
 * A comparison with an absent value is false here (RFC 7644 compares assigned values only), so
 * `not` is compiled as `not coalesce(x, false)`; and/or need nothing, because mapping unknown to
 * false commutes with them. Plain comparisons stay bare so `lower(user_name) = lower($1)` can use
 * the (directory_id, lower(user_name)) index.
 */
import { type RawBuilder, sql } from 'kysely';
import { badScim, type ScimType } from './scim-errors.js';

export const MAX_FILTER_LENGTH = 2000;
export const MAX_FILTER_DEPTH = 10;
export const MAX_FILTER_COMPARISONS = 50;

export const CORE_USER_SCHEMA = 'urn:ietf:params:scim:schemas:core:2.0:User';
export const CORE_GROUP_SCHEMA = 'urn:ietf:params:scim:schemas:core:2.0:Group';
export const ENTERPRISE_USER_SCHEMA = 'urn:ietf:params:scim:schemas:extension:enterprise:2.0:User';

export type CompareOp = 'eq' | 'ne' | 'co' | 'sw' | 'ew' | 'gt' | 'ge' | 'lt' | 'le';
export type FilterValue = string | number | boolean | null;

/**
 * `[schema:]attr[.sub]` as the client wrote it. `schema` is the URN prefix (undefined when none
 * was given); names keep the client's case, and resolvers compare them without it.
 */
export interface AttrPath {
  schema?: string;
  attr: string;
  sub?: string;
}

export type Filter =
  | { op: 'and' | 'or'; left: Filter; right: Filter }
  | { op: 'not'; filter: Filter }
  | { op: CompareOp; path: AttrPath; value: FilterValue }
  | { op: 'pr'; path: AttrPath }
  /** `attr[filter]`; `attr[filter].sub op value` is read as `attr[filter and sub op value]`. */
  | { op: '[]'; path: AttrPath; filter: Filter };

/** A PATCH path (RFC 7644 §3.5.2): `attrPath` or `valuePath [ "." subAttr ]`. */
export interface PatchPath {
  path: AttrPath;
  filter?: Filter;
  /** The sub-attribute after a value filter (`emails[type eq "work"].value`). */
  sub?: string;
}

const COMPARE_OPS = new Set<string>(['eq', 'ne', 'co', 'sw', 'ew', 'gt', 'ge', 'lt', 'le']);
const NAME = /^\$?[A-Za-z][\w$-]*$/;
const KNOWN_SCHEMAS = [CORE_USER_SCHEMA, CORE_GROUP_SCHEMA, ENTERPRISE_USER_SCHEMA];

// ---------------------------------------------------------------------------------------------
// Reading

type Token =
  | { t: 'word'; v: string; at: number }
  | { t: 'string'; v: string; at: number }
  | { t: 'number'; v: number; at: number }
  | { t: '(' | ')' | '[' | ']' | '.' | 'end'; at: number };

// A JSON string (RFC 8259 escapes only, no raw control characters), a JSON number, a word
// (attribute paths with URN prefixes and dots, operators, true/false/null).
const STRING = /"(?:[^"\\\u0000-\u001f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"/y;
const NUMBER = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?(?![\w.])/y;
const WORD = /\$?[A-Za-z][\w:.$-]*/y;

function tokenize(text: string, kind: ScimType): Token[] {
  const tokens: Token[] = [];
  let i = 0;
  while (i < text.length) {
    const c = text[i]!;
    if (c === ' ' || c === '\t' || c === '\n' || c === '\r') {
      i++;
      continue;
    }
    if (c === '(' || c === ')' || c === '[' || c === ']' || c === '.') {
      tokens.push({ t: c, at: i });
      i++;
      continue;
    }
    if (c === '"') {
      STRING.lastIndex = i;
      const m = STRING.exec(text);
      if (!m) throw badScim(kind, `unterminated or malformed string at ${i + 1}`);
      const value = JSON.parse(m[0]) as string;
      // No stored text can hold U+0000 (PostgreSQL refuses it): a filter naming it is malformed, not a database error.
      if (value.includes('\u0000')) throw badScim(kind, `a string with U+0000 at ${i + 1}`);
      tokens.push({ t: 'string', v: value, at: i });
      i += m[0].length;
      continue;
    }
    NUMBER.lastIndex = i;
    const n = NUMBER.exec(text);
    if (n) {
      tokens.push({ t: 'number', v: Number(n[0]), at: i });
      i += n[0].length;
      continue;
    }
    WORD.lastIndex = i;
    const w = WORD.exec(text);
    if (w) {
      tokens.push({ t: 'word', v: w[0], at: i });
      i += w[0].length;
      continue;
    }
    throw badScim(kind, `unexpected character ${JSON.stringify(c)} at ${i + 1}`);
  }
  tokens.push({ t: 'end', at: text.length });
  return tokens;
}

/** Splits `urn:...:User:name.givenName` into its URN prefix and `name`, `givenName`. */
function attrPathOf(word: string, kind: ScimType, allowSub = true): AttrPath {
  const lower = word.toLowerCase();
  let schema: string | undefined;
  let rest = word;
  const known = KNOWN_SCHEMAS.find((s) => lower.startsWith(`${s.toLowerCase()}:`));
  if (known) {
    schema = known;
    rest = word.slice(known.length + 1);
  } else if (word.includes(':')) {
    const cut = word.lastIndexOf(':');
    schema = word.slice(0, cut);
    rest = word.slice(cut + 1);
  }
  const parts = rest.split('.');
  if (parts.length > 2 || (!allowSub && parts.length > 1) || !parts.every((p) => NAME.test(p))) {
    throw badScim(kind, `malformed attribute path ${JSON.stringify(word)}`);
  }
  return { ...(schema !== undefined ? { schema } : {}), attr: parts[0]!, ...(parts[1] !== undefined ? { sub: parts[1] } : {}) };
}

class Reader {
  private pos = 0;
  private depth = 0;
  private comparisons = 0;
  private inValuePath = false;

  constructor(
    private readonly tokens: Token[],
    private readonly kind: ScimType,
  ) {}

  private peek(): Token {
    return this.tokens[this.pos]!;
  }

  private take(): Token {
    const t = this.tokens[this.pos]!;
    if (t.t !== 'end') this.pos++;
    return t;
  }

  private fail(message: string): never {
    throw badScim(this.kind, message);
  }

  private describe(t: Token): string {
    if (t.t === 'end') return 'the end';
    if (t.t === 'word' || t.t === 'number') return `${JSON.stringify(String(t.v))} at ${t.at + 1}`;
    if (t.t === 'string') return `a string at ${t.at + 1}`;
    return `"${t.t}" at ${t.at + 1}`;
  }

  private isWord(t: Token, word: string): boolean {
    return t.t === 'word' && t.v.toLowerCase() === word;
  }

  private expect(type: ')' | ']' | 'end'): void {
    const t = this.take();
    if (t.t !== type) this.fail(`expected ${type === 'end' ? 'the end' : `"${type}"`}, found ${this.describe(t)}`);
  }

  private enter(): void {
    if (++this.depth > MAX_FILTER_DEPTH) this.fail(`filter nested deeper than ${MAX_FILTER_DEPTH}`);
  }

  private counted(): void {
    if (++this.comparisons > MAX_FILTER_COMPARISONS) this.fail(`more than ${MAX_FILTER_COMPARISONS} comparisons in a filter`);
  }

  filter(): Filter {
    const f = this.or();
    this.expect('end');
    return f;
  }

  patchPath(): PatchPath {
    const t = this.take();
    if (t.t !== 'word') this.fail(`expected an attribute, found ${this.describe(t)}`);
    const path = attrPathOf(t.v, this.kind);
    if (this.peek().t !== '[') {
      this.expect('end');
      return { path };
    }
    if (path.sub !== undefined) this.fail('a value filter applies to a multi-valued attribute, not a sub-attribute');
    const filter = this.bracket();
    let sub: string | undefined;
    if (this.peek().t === '.') {
      this.take();
      const s = this.take();
      if (s.t !== 'word' || !NAME.test(s.v)) this.fail(`expected a sub-attribute after "].", found ${this.describe(s)}`);
      sub = s.v;
    }
    this.expect('end');
    return { path, filter, ...(sub !== undefined ? { sub } : {}) };
  }

  private or(): Filter {
    let left = this.and();
    while (this.isWord(this.peek(), 'or')) {
      this.take();
      left = { op: 'or', left, right: this.and() };
    }
    return left;
  }

  private and(): Filter {
    let left = this.unary();
    while (this.isWord(this.peek(), 'and')) {
      this.take();
      left = { op: 'and', left, right: this.unary() };
    }
    return left;
  }

  private unary(): Filter {
    if (this.isWord(this.peek(), 'not')) {
      this.take();
      this.enter();
      const filter = this.unary();
      this.depth--;
      return { op: 'not', filter };
    }
    return this.primary();
  }

  private bracket(): Filter {
    this.take(); // '['
    if (this.inValuePath) this.fail('a value filter cannot contain another');
    this.enter();
    this.inValuePath = true;
    const inner = this.or();
    this.inValuePath = false;
    this.depth--;
    this.expect(']');
    return inner;
  }

  private primary(): Filter {
    const t = this.take();
    if (t.t === '(') {
      this.enter();
      const inner = this.or();
      this.depth--;
      this.expect(')');
      return inner;
    }
    if (t.t !== 'word') this.fail(`expected an attribute or "(", found ${this.describe(t)}`);
    const path = attrPathOf(t.v, this.kind);
    if (this.peek().t === '[') {
      if (path.sub !== undefined) this.fail('a value filter applies to a multi-valued attribute, not a sub-attribute');
      const inner = this.bracket();
      if (this.peek().t !== '.') return { op: '[]', path, filter: inner };
      this.take();
      const s = this.take();
      if (s.t !== 'word' || !NAME.test(s.v)) this.fail(`expected a sub-attribute after "].", found ${this.describe(s)}`);
      const comparison = this.comparison({ attr: s.v });
      return { op: '[]', path, filter: { op: 'and', left: inner, right: comparison } };
    }
    return this.comparison(path);
  }

  private comparison(path: AttrPath): Filter {
    const t = this.take();
    const op = t.t === 'word' ? t.v.toLowerCase() : '';
    this.counted();
    if (op === 'pr') return { op: 'pr', path };
    if (!COMPARE_OPS.has(op)) this.fail(`expected an operator (eq, ne, co, sw, ew, gt, ge, lt, le, pr), found ${this.describe(t)}`);
    const v = this.take();
    let value: FilterValue;
    if (v.t === 'string' || v.t === 'number') value = v.v;
    else if (v.t === 'word' && ['true', 'false', 'null'].includes(v.v.toLowerCase())) {
      const w = v.v.toLowerCase();
      value = w === 'null' ? null : w === 'true';
    } else this.fail(`expected a value (a string, number, true, false or null), found ${this.describe(v)}`);
    return { op: op as CompareOp, path, value };
  }
}

function read<T>(text: unknown, kind: ScimType, what: string, run: (r: Reader) => T): T {
  if (typeof text !== 'string') throw badScim(kind, `${what} must be a string`);
  if (text.length > MAX_FILTER_LENGTH) throw badScim(kind, `${what} longer than ${MAX_FILTER_LENGTH} characters`);
  if (text.trim() === '') throw badScim(kind, `${what} is empty`);
  return run(new Reader(tokenize(text, kind), kind));
}

/** Reads a filter; `invalidFilter` for anything RFC 7644 §3.4.2.2 does not allow, or past the limits. */
export function parseFilter(text: string): Filter {
  return read(text, 'invalidFilter', 'filter', (r) => r.filter());
}

/** Reads a PATCH path (the same grammar inside brackets); `invalidPath` when it is not one. */
export function parsePatchPath(text: string): PatchPath {
  return read(text, 'invalidPath', 'path', (r) => r.patchPath());
}

// ---------------------------------------------------------------------------------------------
// Compiling

type ScalarType = 'text' | 'boolean' | 'timestamp' | 'uuid' | 'complex';

/** One value per row (a column, or a JSON member). */
interface Scalar {
  kind: 'scalar';
  type: ScalarType;
  expr: RawBuilder<unknown>;
  /** RFC 7643 caseExact; text only. */
  caseExact?: boolean;
  /** `pr`: assigned and not empty. */
  present: RawBuilder<boolean>;
}

/** A multi-valued attribute: a set of elements, each read by `element`. */
interface Multi {
  kind: 'multi';
  /** The sub-attribute named in the path (`emails.value`), if any. */
  sub?: string;
  present: RawBuilder<boolean>;
  exists(condition: RawBuilder<boolean>): RawBuilder<boolean>;
  element: Resolver;
  /**
   * An indexed test true of every row where some element's `value` holds `text` (without case):
   * said beside a comparison of the values, so the index finds the rows to compare (emails).
   */
  holds?: (text: string) => RawBuilder<boolean>;
}

type Resolver = (path: AttrPath) => Scalar | Multi;

const TRUE = sql<boolean>`true`;
const FALSE = sql<boolean>`false`;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

function unknownAttribute(path: AttrPath): never {
  const name = `${path.schema !== undefined ? `${path.schema}:` : ''}${path.attr}${path.sub !== undefined ? `.${path.sub}` : ''}`;
  throw badScim('invalidFilter', `unknown attribute ${JSON.stringify(name)}`);
}

/** A JSON value counts as present unless it is absent, null, "", {} or []. */
function jsonPresent(json: RawBuilder<unknown>): RawBuilder<boolean> {
  return sql<boolean>`coalesce(case jsonb_typeof(${json}) when 'string' then (${json} #>> '{}') <> '' when 'array' then jsonb_array_length(${json}) > 0 when 'object' then ${json} <> '{}'::jsonb when 'number' then true when 'boolean' then true else false end, false)`;
}

/** `base->'a'->'b'`; keys are our constants, written as SQL literals. */
function jsonGet(base: RawBuilder<unknown>, keys: readonly string[]): RawBuilder<unknown> {
  return keys.reduce<RawBuilder<unknown>>((e, k) => sql`${e}->${sql.lit(k)}`, base);
}

function jsonText(base: RawBuilder<unknown>, keys: readonly string[], caseExact = false): Scalar {
  const parent = jsonGet(base, keys.slice(0, -1));
  return { kind: 'scalar', type: 'text', expr: sql`(${parent}->>${sql.lit(keys[keys.length - 1]!)})`, caseExact, present: jsonPresent(jsonGet(base, keys)) };
}

/** A JSON boolean, also read from Entra's "True"/"False" strings. */
function jsonBoolean(base: RawBuilder<unknown>, keys: readonly string[]): Scalar {
  const parent = jsonGet(base, keys.slice(0, -1));
  const text = sql`lower(${parent}->>${sql.lit(keys[keys.length - 1]!)})`;
  return { kind: 'scalar', type: 'boolean', expr: sql`(case ${text} when 'true' then true when 'false' then false end)`, present: sql<boolean>`(${text} in ('true', 'false'))` };
}

function jsonComplex(base: RawBuilder<unknown>, keys: readonly string[]): Scalar {
  return { kind: 'scalar', type: 'complex', expr: jsonGet(base, keys), present: jsonPresent(jsonGet(base, keys)) };
}

function textColumn(column: string, caseExact: boolean): Scalar {
  const expr = sql.ref(column);
  return { kind: 'scalar', type: 'text', expr, caseExact, present: sql<boolean>`coalesce(${expr} <> '', false)` };
}

function typedColumn(column: string, type: 'boolean' | 'timestamp' | 'uuid'): Scalar {
  const expr = sql.ref(column);
  return { kind: 'scalar', type, expr, present: sql<boolean>`(${expr} is not null)` };
}

/** Escapes LIKE's wildcards and its escape character (backslash, the default, named explicitly). */
function likeEscape(value: string): string {
  return value.replace(/[\\%_]/g, (c) => `\\${c}`);
}

function asText(path: AttrPath, value: FilterValue): string {
  if (value === null) throw badScim('invalidFilter', `null is compared only with eq or ne (${path.attr})`);
  return String(value);
}

function compareText(s: Scalar, op: CompareOp, value: string): RawBuilder<boolean> {
  const ci = !s.caseExact;
  const left = ci ? sql`lower(${s.expr})` : s.expr;
  const right = (v: string) => (ci ? sql`lower(${v})` : sql`${v}`);
  switch (op) {
    case 'eq':
      return sql<boolean>`${left} = ${right(value)}`;
    case 'ne':
      return sql<boolean>`(not coalesce(${left} = ${right(value)}, false))`;
    case 'co':
      return sql<boolean>`${left} like ${right(`%${likeEscape(value)}%`)} escape '\\'`;
    case 'sw':
      return sql<boolean>`${left} like ${right(`${likeEscape(value)}%`)} escape '\\'`;
    case 'ew':
      return sql<boolean>`${left} like ${right(`%${likeEscape(value)}`)} escape '\\'`;
    default:
      // Byte order, so both back-ends (whatever their default collation) agree.
      return sql<boolean>`${left} collate "C" ${sql.raw(ORDER[op])} ${right(value)}`;
  }
}

const ORDER = { gt: '>', ge: '>=', lt: '<', le: '<=' } as const;

function compareScalar(s: Scalar, path: AttrPath, op: CompareOp, value: FilterValue): RawBuilder<boolean> {
  if (value === null) {
    if (op === 'eq') return sql<boolean>`(not ${s.present})`;
    if (op === 'ne') return s.present;
    asText(path, value);
  }
  switch (s.type) {
    case 'complex':
      throw badScim('invalidFilter', `${path.attr} is complex: compare one of its sub-attributes`);
    case 'boolean': {
      let b: boolean | undefined;
      if (typeof value === 'boolean') b = value;
      else if (typeof value === 'string' && /^(true|false)$/i.test(value)) b = value.toLowerCase() === 'true';
      if (b === undefined) throw badScim('invalidFilter', `${path.attr} is a boolean: compare it with true or false`);
      if (op === 'eq') return sql<boolean>`${s.expr} = ${b}`;
      if (op === 'ne') return sql<boolean>`(not coalesce(${s.expr} = ${b}, false))`;
      throw badScim('invalidFilter', `${path.attr} is a boolean: only eq, ne and pr apply`);
    }
    case 'timestamp': {
      if (typeof value !== 'string' || !/^\d{4}-\d{2}-\d{2}([Tt ][\d:.]+([Zz]|[+-]\d{2}:?\d{2})?)?$/.test(value) || Number.isNaN(Date.parse(value))) {
        throw badScim('invalidFilter', `${path.attr}${path.sub ? `.${path.sub}` : ''} is a dateTime: compare it with a string like "2024-05-13T04:42:34Z"`);
      }
      const at = new Date(value).toISOString();
      if (op === 'co' || op === 'sw' || op === 'ew') throw badScim('invalidFilter', `${op} does not apply to a dateTime`);
      if (op === 'eq') return sql<boolean>`${s.expr} = ${at}::timestamptz`;
      if (op === 'ne') return sql<boolean>`(not coalesce(${s.expr} = ${at}::timestamptz, false))`;
      return sql<boolean>`${s.expr} ${sql.raw(ORDER[op])} ${at}::timestamptz`;
    }
    case 'uuid': {
      const text = asText(path, value);
      // A uuid column compared with a non-UUID text is an error in PostgreSQL: such a value
      // simply matches nothing. A UUID is compared as a uuid, so the primary key serves.
      if (op === 'eq') return UUID.test(text) ? sql<boolean>`${s.expr} = ${text.toLowerCase()}::uuid` : FALSE;
      if (op === 'ne') return UUID.test(text) ? sql<boolean>`${s.expr} <> ${text.toLowerCase()}::uuid` : TRUE;
      return compareText({ ...s, type: 'text', expr: sql`${s.expr}::text`, caseExact: false }, op, text);
    }
    case 'text':
      return compareText(s, op, asText(path, value));
  }
}

function compile(f: Filter, resolve: Resolver): RawBuilder<boolean> {
  switch (f.op) {
    case 'and':
    case 'or':
      return sql<boolean>`(${compile(f.left, resolve)} ${sql.raw(f.op)} ${compile(f.right, resolve)})`;
    case 'not':
      return sql<boolean>`(not coalesce(${compile(f.filter, resolve)}, false))`;
    case 'pr': {
      const a = resolve(f.path);
      if (a.kind === 'scalar') return a.present;
      if (a.sub === undefined) return a.present;
      const e = a.element({ attr: a.sub });
      return a.exists(e.kind === 'scalar' ? e.present : unknownAttribute(f.path));
    }
    case '[]': {
      const a = resolve(f.path);
      if (a.kind !== 'multi') throw badScim('invalidFilter', `${f.path.attr} is not multi-valued: a value filter does not apply`);
      return withHolds(a, valueTexts(f.filter), a.exists(compile(f.filter, a.element)));
    }
    default: {
      const a = resolve(f.path);
      if (a.kind === 'scalar') return compareScalar(a, f.path, f.op, f.value);
      // RFC 7644 §3.4.2.2: a multi-valued attribute without a sub-attribute compares its values.
      const subPath = { attr: a.sub ?? 'value' };
      if (f.value === null && (f.op === 'eq' || f.op === 'ne')) {
        const e = a.element(subPath);
        if (e.kind !== 'scalar') return unknownAttribute(f.path);
        const some = a.exists(e.present);
        return f.op === 'eq' ? sql<boolean>`(not ${some})` : some;
      }
      const e = a.element(subPath);
      if (e.kind !== 'scalar') return unknownAttribute(f.path);
      const compared = a.exists(compareScalar(e, f.path, f.op, f.value));
      return subPath.attr.toLowerCase() === 'value' ? withHolds(a, valueTexts({ ...f, path: subPath }), compared) : compared;
    }
  }
}

/** Texts of 3 characters or more (a trigram) that a row's values must hold for `f` to be true of one element: its eq/co/sw/ew comparisons of `value` joined by `and`. */
function valueTexts(f: Filter): string[] {
  if (f.op === 'and') return [...valueTexts(f.left), ...valueTexts(f.right)];
  if ((f.op === 'eq' || f.op === 'co' || f.op === 'sw' || f.op === 'ew') && f.path.schema === undefined && f.path.sub === undefined && typeof f.value === 'string' && [...f.value].length >= 3) {
    return f.path.attr.toLowerCase() === 'value' ? [f.value] : [];
  }
  return [];
}

/** `condition`, with the index's test for one of `texts` beside it when the attribute has an index. */
function withHolds(a: Multi, texts: string[], condition: RawBuilder<boolean>): RawBuilder<boolean> {
  const text = texts.sort((x, y) => y.length - x.length)[0];
  if (a.holds === undefined || text === undefined) return condition;
  return sql<boolean>`(${a.holds(text)} and ${condition})`;
}

/**
 * The elements of a JSON array member of `resource` (anything else: none). `indexed`: the
 * member's values are indexed by migration 0028's directory_user_emails (emails only): every
 * value lowercased, one a line, so a value holding a text means the function's result holds it.
 */
function jsonMulti(subs: Record<string, 'text' | 'boolean'>, key: string, sub: string | undefined, stringElements = false, indexed = false): Multi {
  const array = jsonGet(sql.ref('directory_users.resource'), [key]);
  const elements = sql`jsonb_array_elements(case when jsonb_typeof(${array}) = 'array' then ${array} else '[]'::jsonb end) as scim_e(v)`;
  const element: Resolver = (p) => {
    if (p.schema !== undefined || p.sub !== undefined) return unknownAttribute(p);
    const name = Object.keys(subs).find((s) => s.toLowerCase() === p.attr.toLowerCase());
    if (name === undefined) return unknownAttribute({ attr: `${key}.${p.attr}` });
    if (stringElements) return { kind: 'scalar', type: 'text', expr: sql`(scim_e.v #>> '{}')`, present: jsonPresent(sql`scim_e.v`) };
    return subs[name] === 'boolean' ? jsonBoolean(sql`scim_e.v`, [name]) : jsonText(sql`scim_e.v`, [name]);
  };
  if (sub !== undefined) element({ attr: sub }); // refuses an unknown sub-attribute now
  return {
    kind: 'multi',
    ...(sub !== undefined ? { sub } : {}),
    // CASE, not AND: SQL may evaluate jsonb_array_length first, which fails on a non-array.
    present: sql<boolean>`coalesce(case when jsonb_typeof(${array}) = 'array' then jsonb_array_length(${array}) > 0 end, false)`,
    exists: (condition) => sql<boolean>`exists (select 1 from ${elements} where ${condition})`,
    element,
    ...(indexed && { holds: (text: string) => sql<boolean>`directory_user_emails(directory_users.resource) like lower(${`%${likeEscape(text)}%`}) escape '\\'` }),
  };
}

const PLURAL = { value: 'text', display: 'text', type: 'text', primary: 'boolean' } as const;
const ADDRESS = { formatted: 'text', streetAddress: 'text', locality: 'text', region: 'text', postalCode: 'text', country: 'text', type: 'text', primary: 'boolean' } as const;

/** RFC 7643 §4.1's multi-valued attributes, kept in `resource`. */
const USER_MULTI: Record<string, { key: string; subs: Record<string, 'text' | 'boolean'>; strings?: boolean; indexed?: boolean }> = {
  emails: { key: 'emails', subs: PLURAL, indexed: true },
  phonenumbers: { key: 'phoneNumbers', subs: PLURAL },
  ims: { key: 'ims', subs: PLURAL },
  photos: { key: 'photos', subs: PLURAL },
  addresses: { key: 'addresses', subs: ADDRESS },
  entitlements: { key: 'entitlements', subs: PLURAL },
  roles: { key: 'roles', subs: PLURAL },
  x509certificates: { key: 'x509Certificates', subs: PLURAL },
  schemas: { key: 'schemas', subs: { value: 'text' }, strings: true },
};

/** Single-valued string attributes in `resource` (RFC 7643 §4.1.1), none case-exact. */
const USER_STRINGS = ['nickName', 'profileUrl', 'title', 'userType', 'preferredLanguage', 'locale', 'timezone'];
const NAME_SUBS = ['formatted', 'familyName', 'givenName', 'middleName', 'honorificPrefix', 'honorificSuffix'];
/** RFC 7643 §4.3, the enterprise extension, under its URN in `resource`. */
const ENTERPRISE_STRINGS = ['employeeNumber', 'costCenter', 'organization', 'division', 'department'];
const MANAGER_SUBS = ['value', '$ref', 'displayName'];

function canonical(names: readonly string[], name: string | undefined): string | undefined {
  if (name === undefined) return undefined;
  return names.find((n) => n.toLowerCase() === name.toLowerCase());
}

function metaOf(path: AttrPath, table: string): Scalar | undefined {
  if (path.attr.toLowerCase() !== 'meta' || path.sub === undefined) return undefined;
  const sub = path.sub.toLowerCase();
  if (sub === 'created') return typedColumn(`${table}.created_at`, 'timestamp');
  if (sub === 'lastmodified') return typedColumn(`${table}.updated_at`, 'timestamp');
  return undefined;
}

function enterpriseAttribute(path: AttrPath): Scalar | undefined {
  const resource = sql.ref('directory_users.resource');
  const attr = path.attr.toLowerCase();
  if (attr === 'manager') {
    if (path.sub === undefined) return jsonComplex(resource, [ENTERPRISE_USER_SCHEMA, 'manager']);
    const sub = canonical(MANAGER_SUBS, path.sub);
    return sub === undefined ? undefined : jsonText(resource, [ENTERPRISE_USER_SCHEMA, 'manager', sub]);
  }
  const name = canonical(ENTERPRISE_STRINGS, path.attr);
  if (name === undefined || path.sub !== undefined) return undefined;
  return jsonText(resource, [ENTERPRISE_USER_SCHEMA, name]);
}

function coreUserAttribute(path: AttrPath): Scalar | Multi | undefined {
  const resource = sql.ref('directory_users.resource');
  const attr = path.attr.toLowerCase();
  const meta = metaOf(path, 'directory_users');
  if (meta) return meta;
  const multi = USER_MULTI[attr];
  if (multi) return jsonMulti(multi.subs, multi.key, path.sub, multi.strings, multi.indexed);
  if (attr === 'name') {
    if (path.sub === undefined) return jsonComplex(resource, ['name']);
    const sub = canonical(NAME_SUBS, path.sub);
    return sub === undefined ? undefined : jsonText(resource, ['name', sub]);
  }
  if (path.sub !== undefined) return undefined;
  switch (attr) {
    case 'id':
      return typedColumn('directory_users.id', 'uuid');
    case 'username':
      return textColumn('directory_users.user_name', false);
    case 'externalid':
      return textColumn('directory_users.external_id', true);
    case 'displayname':
      return textColumn('directory_users.display_name', false);
    case 'active':
      return typedColumn('directory_users.active', 'boolean');
  }
  const name = canonical(USER_STRINGS, path.attr);
  return name === undefined ? undefined : jsonText(resource, [name]);
}

const resolveUser: Resolver = (path) => {
  const schema = path.schema?.toLowerCase();
  let found: Scalar | Multi | undefined;
  if (schema === undefined) found = coreUserAttribute(path) ?? enterpriseAttribute(path);
  else if (schema === CORE_USER_SCHEMA.toLowerCase()) found = coreUserAttribute(path);
  else if (schema === ENTERPRISE_USER_SCHEMA.toLowerCase()) found = enterpriseAttribute(path);
  return found ?? unknownAttribute(path);
};

const resolveGroup: Resolver = (path) => {
  const schema = path.schema?.toLowerCase();
  if (schema !== undefined && schema !== CORE_GROUP_SCHEMA.toLowerCase()) return unknownAttribute(path);
  const meta = metaOf(path, 'directory_groups');
  if (meta) return meta;
  const attr = path.attr.toLowerCase();
  if (attr === 'members') {
    const member: Resolver = (p) => (p.schema === undefined && p.sub === undefined && p.attr.toLowerCase() === 'value' ? typedColumn('scim_m.user_id', 'uuid') : unknownAttribute({ attr: `members.${p.attr}` }));
    if (path.sub !== undefined) member({ attr: path.sub });
    const members = sql`directory_group_members as scim_m where scim_m.group_id = directory_groups.id`;
    return {
      kind: 'multi',
      ...(path.sub !== undefined ? { sub: path.sub } : {}),
      present: sql<boolean>`exists (select 1 from ${members})`,
      exists: (condition) => sql<boolean>`exists (select 1 from ${members} and ${condition})`,
      element: member,
    };
  }
  if (path.sub !== undefined) return unknownAttribute(path);
  switch (attr) {
    case 'id':
      return typedColumn('directory_groups.id', 'uuid');
    case 'displayname':
      return textColumn('directory_groups.display_name', false);
    case 'externalid':
      return textColumn('directory_groups.external_id', true);
  }
  return unknownAttribute(path);
};

/**
 * A filter over directory_users, for `.where(userFilterSql(f))` (the directory's own condition
 * is the caller's). userName, displayName, emails, name.* and the enterprise attributes compare
 * without case (RFC 7643 caseExact=false); externalId and id exactly. Enterprise attributes may
 * be named with or without their URN.
 */
export function userFilterSql(filter: string): RawBuilder<boolean> {
  return compile(parseFilter(filter), resolveUser);
}

/** A filter over directory_groups: id, displayName, externalId, members(.value), meta.created/lastModified. */
export function groupFilterSql(filter: string): RawBuilder<boolean> {
  return compile(parseFilter(filter), resolveGroup);
}
