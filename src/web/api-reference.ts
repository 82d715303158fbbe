/**
 * GET /docs: the API reference, a server-rendered page built from the OpenAPI document that
 * GET /openapi.json serves (app.swagger()). Like every other page: same layout and stylesheet,
 * same security headers (setUpPages), no script and nothing from another origin, so it passes
 * the same accessibility audit (issue 29). The view model is built once, when the app is ready:
 * the document does not change afterwards.
 *
 * buildApiReference() only reads the document (it is the cached object /openapi.json sends).
 */
import type { FastifyInstance } from 'fastify';
import type { Config } from '../config.js';
import { renderPage, setUpPages } from './render.js';

export const API_REFERENCE_PATH = '/docs';

/** Text with `backtick` spans: the template writes code segments in <code>, each escaped. */
export type Segment = { code: boolean; text: string };

export interface ParameterRow { name: string; in: string; required: boolean; type: string; description: Segment[] }
export interface FieldRow { name: string; type: string; required: boolean; description: Segment[] }
export interface ResponseRow { status: string; description: Segment[]; body: string }
export interface OperationView {
  id: string;
  method: string;
  path: string;
  /** The path after the base URL (`/contacts/{id}`), for the table of contents. */
  shortPath: string;
  summary: string;
  description: Segment[];
  /** security[0].oauth2: empty when any token of the organization will do. */
  scopes: string[];
  parameters: ParameterRow[];
  body: { required: boolean; contentType: string; type: string; fields: FieldRow[] } | null;
  responses: ResponseRow[];
  curl: string;
}
export interface TagView { id: string; title: string; operations: OperationView[] }
export interface ApiReference {
  title: string;
  version: string;
  description: Segment[];
  origin: string;
  apiBase: string;
  tokenUrl: string;
  tokenCurl: string;
  scopes: { name: string; description: string; publicApplications: boolean }[];
  tags: TagView[];
}

/** The parts of an OpenAPI 3.1 document read here (JSON Schema objects stay loose). */
type Schema = Record<string, unknown>;
interface Parameter { name: string; in: string; required?: boolean; description?: string; schema?: Schema }
interface Operation {
  summary?: string;
  description?: string;
  tags?: string[];
  parameters?: Parameter[];
  security?: Record<string, string[]>[];
  requestBody?: { required?: boolean; content?: Record<string, { schema?: Schema }> };
  responses?: Record<string, { description?: string; content?: Record<string, { schema?: Schema }> }>;
}
export interface OpenApiDocument {
  info?: { title?: string; version?: string; description?: string };
  servers?: { url: string }[];
  paths?: Record<string, Record<string, Operation>>;
  components?: {
    schemas?: Record<string, Schema>;
    securitySchemes?: Record<string, { flows?: Record<string, { tokenUrl?: string; scopes?: Record<string, string> }> }>;
  };
}

const METHODS = ['get', 'put', 'post', 'patch', 'delete', 'head', 'options', 'trace'];
const API_PREFIX = '/api/v1/{organization_id}';
const TAG_TITLES: Record<string, string> = { sso: 'Single sign-on', audit: 'Audit log' };
const STATUS_TEXT: Record<string, string> = { 200: 'OK', 201: 'Created', 202: 'Accepted', 204: 'No content' };
/** zod's integer bounds: true of every integer, so not worth saying. */
const SAFE = Number.MAX_SAFE_INTEGER;
const MAX_DEPTH = 6;

/** `code` spans become code segments; an unmatched backtick stays text. */
export function segments(text: string | undefined): Segment[] {
  if (!text) return [];
  const parts = text.split('`');
  const out: Segment[] = [];
  parts.forEach((part, i) => {
    const code = i % 2 === 1 && i < parts.length - 1;
    const piece = i % 2 === 1 && !code ? `\`${part}` : part;
    if (piece !== '') out.push({ code, text: piece });
  });
  return out;
}

const isObject = (v: unknown): v is Schema => typeof v === 'object' && v !== null && !Array.isArray(v);

class SchemaReader {
  constructor(private readonly doc: OpenApiDocument) {}

  /** The component a `#/components/schemas/X` reference names, or undefined. */
  refName(s: Schema): string | undefined {
    const ref = s.$ref;
    return typeof ref === 'string' && ref.startsWith('#/components/schemas/') ? decodeURIComponent(ref.slice('#/components/schemas/'.length)) : undefined;
  }

  /** The schema with its `$ref` (and a lone allOf) followed. */
  resolve(s: unknown, depth = 0): Schema {
    if (!isObject(s) || depth > MAX_DEPTH) return {};
    const name = this.refName(s);
    if (name !== undefined) return this.resolve(this.doc.components?.schemas?.[name], depth + 1);
    if (Array.isArray(s.allOf) && s.allOf.length === 1) return this.resolve(s.allOf[0], depth + 1);
    return s;
  }

  /** A short, readable type: `string (email) or null`, `array of string, at most 50 items`, `"open" or "done"`. */
  type(s: unknown, depth = 0): string {
    if (!isObject(s)) return 'any';
    if (depth > MAX_DEPTH) return 'object';
    const name = this.refName(s);
    if (name !== undefined) return name;
    if ('const' in s) return JSON.stringify(s.const);
    if (Array.isArray(s.enum)) return s.enum.length > 4 ? `one of ${s.enum.map((v) => JSON.stringify(v)).join(', ')}` : s.enum.map((v) => JSON.stringify(v)).join(' or ');
    const alternatives = s.anyOf ?? s.oneOf;
    if (Array.isArray(alternatives)) return [...new Set(alternatives.map((a) => this.type(a, depth + 1)))].join(' or ');
    if (Array.isArray(s.allOf)) return s.allOf.length === 1 ? this.type(s.allOf[0], depth + 1) : 'object';
    const types = (Array.isArray(s.type) ? s.type : typeof s.type === 'string' ? [s.type] : []) as string[];
    if (types.length === 0) return isObject(s.properties) ? 'object' : 'any JSON value';
    const text = types
      .map((t) => {
        if (t === 'array') return `array of ${this.type(s.items, depth + 1)}`;
        if (t === 'string' && typeof s.format === 'string') return `string (${s.format})`;
        return t;
      })
      .join(' or ');
    const limits = this.limits(s);
    return limits ? `${text}, ${limits}` : text;
  }

  private limits(s: Schema): string {
    const out: string[] = [];
    const num = (k: string) => (typeof s[k] === 'number' ? (s[k] as number) : undefined);
    const range = (min: number | undefined, max: number | undefined, unit: string) => {
      if (min !== undefined && max !== undefined) out.push(min === max ? `exactly ${min}${unit}` : `${min} to ${max}${unit}`);
      else if (max !== undefined) out.push(`at most ${max}${unit}`);
      else if (min !== undefined && min > 0) out.push(`at least ${min}${unit}`);
    };
    range(num('minLength'), num('maxLength'), ' characters');
    range(num('minItems'), num('maxItems'), ' items');
    const min = num('minimum') ?? (num('exclusiveMinimum') !== undefined ? num('exclusiveMinimum')! + 1 : undefined);
    const max = num('maximum');
    range(min !== undefined && Math.abs(min) < SAFE ? min : undefined, max !== undefined && Math.abs(max) < SAFE ? max : undefined, '');
    return out.join(', ');
  }

  /** The object a property holds, when it holds one with properties (itself, an item, or one of its alternatives). */
  private nestedObject(s: unknown): { schema: Schema; prefix: string } | undefined {
    let r = this.resolve(s);
    let prefix = '.';
    const types = Array.isArray(r.type) ? r.type : [r.type];
    if (types.includes('array')) {
      r = this.resolve(r.items);
      prefix = '[].';
    }
    const alternatives = (r.anyOf ?? r.oneOf) as unknown[] | undefined;
    if (Array.isArray(alternatives)) {
      const objects = alternatives.map((a) => this.resolve(a)).filter((a) => isObject(a.properties));
      if (objects.length !== 1) return undefined;
      r = objects[0]!;
    }
    return isObject(r.properties) && Object.keys(r.properties).length > 0 ? { schema: r, prefix } : undefined;
  }

  /** The fields of an object schema, nested objects one level down (`parent.child`, `list[].child`). */
  fields(s: unknown): FieldRow[] {
    const rows: FieldRow[] = [];
    const add = (schema: Schema, prefix: string, nestMore: boolean) => {
      const required = new Set(Array.isArray(schema.required) ? (schema.required as string[]) : []);
      for (const [name, prop] of Object.entries(isObject(schema.properties) ? schema.properties : {})) {
        const description = isObject(prop) ? (prop.description ?? this.resolve(prop).description) : undefined;
        rows.push({ name: `${prefix}${name}`, type: this.type(prop), required: required.has(name), description: segments(typeof description === 'string' ? description : undefined) });
        const nested = nestMore ? this.nestedObject(prop) : undefined;
        if (nested) add(nested.schema, `${prefix}${name}${nested.prefix}`, false);
      }
    };
    add(this.resolve(s), '', true);
    return rows;
  }

  /** What a response body is, in one line: a component's name or `{ data: array of Contact, next_cursor: string or null }`. */
  summary(s: unknown): string {
    if (!isObject(s)) return '';
    if (this.refName(s) !== undefined) return this.type(s);
    if (isObject(s.properties)) return `{ ${Object.entries(s.properties).map(([k, v]) => `${k}: ${this.type(v)}`).join(', ')} }`;
    return this.type(s);
  }

  /** A value the schema accepts, for the curl examples: the required fields (or the first one). */
  example(s: unknown, depth = 0): unknown {
    const r = this.resolve(s);
    if (depth > MAX_DEPTH) return null;
    if (r.examples && Array.isArray(r.examples) && r.examples.length > 0) return r.examples[0];
    if ('example' in r) return r.example;
    if ('default' in r) return r.default;
    if ('const' in r) return r.const;
    if (Array.isArray(r.enum)) return r.enum.find((v) => v !== '' && v !== null) ?? r.enum[0];
    const alternatives = (r.anyOf ?? r.oneOf) as unknown[] | undefined;
    if (Array.isArray(alternatives)) {
      const first = alternatives.map((a) => this.resolve(a)).find((a) => a.type !== 'null' && !(Array.isArray(a.enum) && a.enum.every((v) => v === '' || v === null)));
      return this.example(first ?? alternatives[0], depth + 1);
    }
    const types = (Array.isArray(r.type) ? r.type : [r.type]).filter((t) => t !== 'null');
    switch (types[0]) {
      case 'object': {
        const props = isObject(r.properties) ? r.properties : {};
        const required = Array.isArray(r.required) ? (r.required as string[]).filter((k) => k in props) : [];
        const keys = required.length > 0 ? required : Object.keys(props).slice(0, 1);
        return Object.fromEntries(keys.map((k) => [k, this.example(props[k], depth + 1)]));
      }
      case 'array':
        return [this.example(r.items, depth + 1)];
      case 'integer':
      case 'number':
        return typeof r.minimum === 'number' && Math.abs(r.minimum) < SAFE ? r.minimum : 1;
      case 'boolean':
        return true;
      case 'string':
        return stringExample(r.format);
      default:
        return isObject(r.properties) ? {} : null;
    }
  }
}

function stringExample(format: unknown): string {
  switch (format) {
    case 'email': return 'user@example.com';
    case 'uri': case 'url': return 'https://app.example.com/callback';
    case 'date': return '2025-01-31';
    case 'date-time': return '2025-01-31T12:00:00Z';
    case 'uuid': return '00000000-0000-4000-8000-000000000000';
    default: return 'string';
  }
}

/** A shell variable for a path or query parameter: client_id becomes $CLIENT_ID. */
const shellVar = (name: string) => `$${name.toUpperCase().replace(/[^A-Z0-9_]/g, '_')}`;
/** Single-quoted for the shell. */
const quote = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;

function slug(method: string, path: string): string {
  const rest = path.startsWith(API_PREFIX) ? path.slice(API_PREFIX.length) : path;
  const words = rest.replace(/[{}]/g, '').split(/[^A-Za-z0-9]+/).filter(Boolean).join('-').toLowerCase();
  return `${method}-${words || 'organization'}`;
}

function tagTitle(tag: string): string {
  return TAG_TITLES[tag] ?? tag.charAt(0).toUpperCase() + tag.slice(1).replace(/[-_]/g, ' ');
}

/** The page's view model, from the document as /openapi.json serves it (read, never changed). */
export function buildApiReference(doc: OpenApiDocument): ApiReference {
  const reader = new SchemaReader(doc);
  const origin = (doc.servers?.[0]?.url ?? '').replace(/\/+$/, '');
  const flows = doc.components?.securitySchemes?.oauth2?.flows ?? {};
  const tokenUrl = flows.clientCredentials?.tokenUrl ?? `${origin}/oauth/token`;
  const allScopes = flows.clientCredentials?.scopes ?? {};
  const publicScopes = new Set(Object.keys(flows.authorizationCode?.scopes ?? {}));

  const tags = new Map<string, TagView>();
  const ids = new Set<string>();
  for (const [path, item] of Object.entries(doc.paths ?? {})) {
    for (const method of METHODS) {
      const op = item[method];
      if (!op) continue;
      const tag = op.tags?.[0] ?? 'other';
      if (!tags.has(tag)) tags.set(tag, { id: `tag-${tag.toLowerCase().replace(/[^a-z0-9]+/g, '-')}`, title: tagTitle(tag), operations: [] });

      let id = slug(method, path);
      for (let n = 2; ids.has(id); n++) id = `${slug(method, path)}-${n}`;
      ids.add(id);

      const parameters = (op.parameters ?? [])
        .filter((p) => p.in === 'path' || p.in === 'query')
        .map((p) => ({ name: p.name, in: p.in, required: p.in === 'path' || p.required === true, type: reader.type(p.schema), description: segments(p.description) }));

      const [contentType, media] = Object.entries(op.requestBody?.content ?? {})[0] ?? [];
      const body = op.requestBody && contentType
        ? { required: op.requestBody.required === true, contentType, type: reader.type(media?.schema), fields: reader.fields(media?.schema) }
        : null;

      const responses = Object.entries(op.responses ?? {}).map(([status, r]) => {
        const described = r.description && r.description !== 'Default Response' ? r.description : (STATUS_TEXT[status] ?? '');
        const schema = Object.values(r.content ?? {})[0]?.schema;
        return { status, description: segments(described), body: schema ? reader.summary(schema) : '' };
      });

      // The curl example: path parameters as shell variables, the required query parameters too.
      let url = origin + path.replace(/\{([^}]+)\}/g, (_m, name: string) => shellVar(name));
      const query = parameters.filter((p) => p.in === 'query' && p.required).map((p) => `${encodeURIComponent(p.name)}=${shellVar(p.name)}`);
      if (query.length > 0) url += `?${query.join('&')}`;
      const lines = [`curl -s${method === 'get' || (method === 'post' && body) ? '' : ` -X ${method.toUpperCase()}`} "${url}"`, `  -H "Authorization: Bearer $TOKEN" -H 'Accept: application/json'`];
      if (body) lines.push(`  -H 'Content-Type: ${contentType}' -d ${quote(JSON.stringify(reader.example(media?.schema)))}`);

      tags.get(tag)!.operations.push({
        id,
        method: method.toUpperCase(),
        path,
        shortPath: (path.startsWith(API_PREFIX) ? path.slice(API_PREFIX.length) : path) || '/',
        summary: op.summary ?? `${method.toUpperCase()} ${path}`,
        description: segments(op.description),
        scopes: op.security?.[0]?.oauth2 ?? [],
        parameters,
        body,
        responses,
        curl: lines.join(' \\\n'),
      });
    }
  }

  return {
    title: doc.info?.title ?? 'API reference',
    version: doc.info?.version ?? '',
    description: segments(doc.info?.description),
    origin,
    apiBase: `${origin}${API_PREFIX}`,
    tokenUrl,
    tokenCurl: [
      `curl -s -u "$CLIENT_ID:$CLIENT_SECRET" -d grant_type=client_credentials`,
      `  -d organization_id="$ORGANIZATION_ID" --data-urlencode 'scope=contacts.read contacts.write'`,
      `  ${tokenUrl}`,
    ].join(' \\\n'),
    scopes: Object.entries(allScopes).map(([name, description]) => ({ name, description, publicApplications: publicScopes.has(name) })),
    tags: [...tags.values()],
  };
}

/**
 * Registered after the API routes (the document needs them): GET /docs, and /docs/ sent there.
 * An encapsulated plugin, so the page headers and HTML errors stay on these two routes.
 */
export async function apiReferencePage(app: FastifyInstance, { config }: { config: Config }): Promise<void> {
  await setUpPages(app, config);
  // Built on the first request, not at start: it turns every route's schema into OpenAPI (a
  // third of a second), which a server that is never asked for /docs should not spend starting.
  let reference: ApiReference | undefined;
  app.get(API_REFERENCE_PATH, { schema: { hide: true } }, async (_req, reply) => {
    reference ??= buildApiReference(app.swagger() as OpenApiDocument);
    return renderPage(reply, 200, 'api-reference', { title: 'API reference', wide: true, ref: reference });
  });
  app.get(`${API_REFERENCE_PATH}/`, { schema: { hide: true } }, async (_req, reply) => reply.redirect(API_REFERENCE_PATH, 301));
}
