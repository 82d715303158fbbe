/**
 * The SCIM 2.0 service (RFC 7644) of each directory, at `<issuer>/scim/v2/<directory id>`:
 * ServiceProviderConfig, ResourceTypes and Schemas, and Users and Groups (list with filter and
 * paging, `.search`, GET, POST, PUT, PATCH, DELETE, ETags).
 *
 * One gate in front of every route: the directory id in the path and its bearer token (a token
 * opens its own directory only, and a disabled directory none), then a rate limit per directory
 * (SCIM_RATE_LIMIT a minute). Bodies are JSON as `application/scim+json` or `application/json`,
 * at most 1 MiB. Every refusal is a SCIM error (RFC 7644 §3.12) and every request is logged for
 * the Directory page: method, path, status and scimType, never the token or a body.
 */
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import SCIMMY from 'scimmy';
import type { Config } from '../config.js';
import type { DB } from '../db/connect.js';
import { toAppError } from '../error-mapping.js';
import { ConflictError } from '../errors.js';
import type { RemovedMembersMemory } from '../accounts/organizations.js';
import type { RevokedGrantsMemory } from '../oauth/models/grants.js';
import { bearerToken, parsePathId } from '../api/auth.js';
import { registerRateLimit } from '../api/rate-limit.js';
import { authenticateDirectory } from './directories.js';
import { scimBaseUrl } from './base-url.js';
import { directoryChanged, forgetCursors, MAX_COUNT, pageOf, readPage, type Page } from './listing.js';
import { parsePatchRequest } from './patch.js';
import {
  createGroup,
  createUser,
  deleteGroup,
  deleteUser,
  type DirectoryScope,
  getGroup,
  getUser,
  groupsOfUsers,
  membersOfGroups,
  updateGroup,
  updateUser,
} from './provisioning.js';
import {
  ENTERPRISE_USER_SCHEMA,
  etagMatches,
  etagOf,
  GROUP_SCHEMA,
  groupRepresentation,
  LIST_RESPONSE_SCHEMA,
  parseAttributeList,
  project,
  projectionDrops,
  USER_SCHEMA,
  userRepresentation,
} from './representation.js';
import { badScim, ScimError, scimErrorBody } from './scim-errors.js';
import { logDirectoryRequest } from './request-log.js';

export const SCIM_PREFIX = '/scim/v2';
/** Okta and Entra ID send a page of group members or a user at a time; 1 MiB is far above either. */
export const SCIM_BODY_LIMIT = 1024 * 1024;
const SCIM_CONTENT_TYPE = 'application/scim+json; charset=utf-8';

declare module 'fastify' {
  interface FastifyRequest {
    scim: DirectoryScope | null;
    /** The scimType of the error answered, for the request log. */
    scimType: string | null;
  }
}

export interface ScimServiceOptions {
  db: DB;
  config: Pick<Config, 'issuer' | 'scimRateLimit' | 'redisUrl'>;
  revocations?: (RevokedGrantsMemory & RemovedMembersMemory) | undefined;
}

function scopeOf(req: FastifyRequest): DirectoryScope {
  if (!req.scim) throw new Error('SCIM route without its directory');
  return req.scim;
}

function send(reply: FastifyReply, status: number, body: unknown, version?: number | string): FastifyReply {
  reply.code(status).type(SCIM_CONTENT_TYPE);
  if (version !== undefined) reply.header('etag', etagOf(version));
  return reply.send(body);
}

/** Whether a request is for the SCIM service (the app's router answers a path it cannot read before any plugin sees it). */
export const isScimPath = (url: string): boolean => url.startsWith(`${SCIM_PREFIX}/`);

/** The router's refusal of a SCIM path (an over-long id, bad percent-encoding) as a SCIM error, not the app's shape. */
export function sendScimPathError(reply: FastifyReply, status: number): FastifyReply {
  return send(reply, status, scimErrorBody(status, undefined, 'the request path is malformed'));
}

const unauthorized = (detail: string) => new ScimError(401, undefined, detail, { headers: { 'www-authenticate': 'Bearer realm="orgauth-scim"' } });

type Projection = { attributes?: string[][] | undefined; excluded?: string[][] | undefined };

function projectionOf(query: Record<string, unknown>, core: string): Projection {
  return { attributes: parseAttributeList(query.attributes, core), excluded: parseAttributeList(query.excludedAttributes, core) };
}

/** A request's query (GET) or `.search` body (POST, RFC 7644 §3.4.3) as one record of strings. */
function searchParameters(body: unknown): Record<string, unknown> {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) throw badScim('invalidSyntax', 'a search is a JSON object');
  const b = body as Record<string, unknown>;
  // A list of names only: anything else is left for parseAttributeList to refuse (joining nested arrays recurses without bound).
  const list = (v: unknown) => (Array.isArray(v) && v.every((name) => typeof name === 'string') ? v.join(',') : v);
  const text = (v: unknown) => (typeof v === 'number' ? String(v) : v);
  return { filter: b.filter, startIndex: text(b.startIndex), count: text(b.count), attributes: list(b.attributes), excludedAttributes: list(b.excludedAttributes) };
}

function listResponse(page: Page, total: number, resources: Record<string, unknown>[]) {
  return { schemas: [LIST_RESPONSE_SCHEMA], totalResults: total, startIndex: page.startIndex, itemsPerPage: resources.length, Resources: resources };
}

async function listUsers(scope: DirectoryScope, query: Record<string, unknown>) {
  const page = readPage(query);
  const projection = projectionOf(query, USER_SCHEMA);
  const { ids, total } = await pageOf(scope.db, 'directory_users', scope.directory.id, page);
  const rows = ids.length === 0 ? [] : await scope.db.selectFrom('directory_users').selectAll().where('id', 'in', ids).orderBy('seq').execute();
  const groups = projectionDrops(projection, 'groups') ? undefined : await groupsOfUsers(scope.db, ids);
  return listResponse(page, total, rows.map((row) => project(userRepresentation(scope.baseUrl, row, groups?.get(row.id)), projection)));
}

async function listGroups(scope: DirectoryScope, query: Record<string, unknown>) {
  const page = readPage(query);
  const projection = projectionOf(query, GROUP_SCHEMA);
  const { ids, total } = await pageOf(scope.db, 'directory_groups', scope.directory.id, page);
  const rows = ids.length === 0 ? [] : await scope.db.selectFrom('directory_groups').selectAll().where('id', 'in', ids).orderBy('seq').execute();
  const members = projectionDrops(projection, 'members') ? undefined : await membersOfGroups(scope.db, ids);
  return listResponse(page, total, rows.map((row) => project(groupRepresentation(scope.baseUrl, row, members?.get(row.id)), projection)));
}

/** RFC 7643 §5: what this service supports. */
function serviceProviderConfig(baseUrl: string) {
  return {
    schemas: ['urn:ietf:params:scim:schemas:core:2.0:ServiceProviderConfig'],
    documentationUri: 'https://github.com/orgauth/orgauth/blob/main/docs/directory.md',
    patch: { supported: true },
    bulk: { supported: false, maxOperations: 0, maxPayloadSize: 0 },
    filter: { supported: true, maxResults: MAX_COUNT },
    changePassword: { supported: false },
    sort: { supported: false },
    etag: { supported: true },
    authenticationSchemes: [
      { type: 'oauthbearertoken', name: 'Bearer token', description: "The directory's token, sent as Authorization: Bearer (RFC 6750)", primary: true },
    ],
    meta: { resourceType: 'ServiceProviderConfig', location: `${baseUrl}/ServiceProviderConfig` },
  };
}

function resourceTypes(baseUrl: string) {
  return [
    {
      schemas: ['urn:ietf:params:scim:schemas:core:2.0:ResourceType'],
      id: 'User',
      name: 'User',
      endpoint: '/Users',
      description: 'A person of the organization',
      schema: USER_SCHEMA,
      schemaExtensions: [{ schema: ENTERPRISE_USER_SCHEMA, required: false }],
      meta: { resourceType: 'ResourceType', location: `${baseUrl}/ResourceTypes/User` },
    },
    {
      schemas: ['urn:ietf:params:scim:schemas:core:2.0:ResourceType'],
      id: 'Group',
      name: 'Group',
      endpoint: '/Groups',
      description: 'A group of people; a mapped group gives its members a role',
      schema: GROUP_SCHEMA,
      meta: { resourceType: 'ResourceType', location: `${baseUrl}/ResourceTypes/Group` },
    },
  ];
}

/** RFC 7643 §7, the schemas the Users and Groups follow, as scimmy (a SCIM library that implements RFC 7643's definitions) describes them. */
function schemas(baseUrl: string): Record<string, unknown>[] {
  return [SCIMMY.Schemas.User, SCIMMY.Schemas.EnterpriseUser, SCIMMY.Schemas.Group].map((s) => s.definition.describe(`${baseUrl}/Schemas`) as Record<string, unknown>);
}

function single<T extends { id: string }>(list: readonly T[], id: string, kind: string): T {
  const found = list.find((item) => item.id === id);
  if (!found) throw new ScimError(404, undefined, `no ${kind} ${id.slice(0, 100)}`);
  return found;
}

function listOf(resources: Record<string, unknown>[]) {
  return { schemas: [LIST_RESPONSE_SCHEMA], totalResults: resources.length, startIndex: 1, itemsPerPage: resources.length, Resources: resources };
}

export async function scimService(app: FastifyInstance, options: ScimServiceOptions): Promise<void> {
  const { db, config } = options;
  app.decorateRequest('scim', null);
  app.decorateRequest('scimType', null);

  // JSON only: the app's other parsers (forms, text) are not the SCIM service's, so a form's
  // fields never reach a resource and any other type is 415.
  const jsonParser = app.getDefaultJsonParser('error', 'error');
  app.removeAllContentTypeParsers();
  app.addContentTypeParser(['application/scim+json', 'application/json'], { parseAs: 'string', bodyLimit: SCIM_BODY_LIMIT }, jsonParser);

  app.setErrorHandler((err: FastifyError | Error, req, reply) => {
    let error = toAppError(err);
    if (error instanceof ConflictError) error = new ScimError(409, 'uniqueness', error.description);
    if (error === undefined) {
      req.log.error({ err }, 'unhandled error');
      return send(reply, 500, scimErrorBody(500, undefined, 'internal server error'));
    }
    if (error.statusCode >= 500) req.log.warn({ err }, error.description);
    else req.log.info({ err: { type: error.name, message: error.message } }, 'SCIM request refused');
    const scimType = error instanceof ScimError ? error.scimType : error.statusCode === 400 && (err as FastifyError).code === 'FST_ERR_CTP_INVALID_JSON_BODY' ? 'invalidSyntax' : undefined;
    req.scimType = scimType ?? null;
    reply.headers(error.headers);
    return send(reply, error.statusCode, scimErrorBody(error.statusCode, scimType, error.description.slice(0, 500)));
  });

  // The gate: the directory in the path, opened by its own token only.
  app.addHook('onRequest', async (req) => {
    const params = req.params as { directory_id?: string };
    const directoryId = parsePathId(params.directory_id);
    const token = bearerToken(req.headers.authorization);
    if (token === undefined) throw unauthorized("send the directory's token as Authorization: Bearer");
    const directory = directoryId === undefined ? undefined : await authenticateDirectory(db, directoryId, token);
    if (!directory) throw unauthorized("the token is not this directory's, or the directory is disabled");
    req.scim = { db, directory, baseUrl: scimBaseUrl(config.issuer, directory.id), revocations: options.revocations };
  });

  await registerRateLimit(app, config, {
    max: config.scimRateLimit,
    nameSpace: 'orgauth-scim-rl:',
    key: (req) => String(scopeOf(req).directory.id),
    refuse: (retryAfterS, message) => new ScimError(429, undefined, message, { headers: { 'retry-after': String(retryAfterS) } }),
  });

  app.addHook('onResponse', async (req, reply) => {
    if (!req.scim) return;
    await logDirectoryRequest(db, req.scim.directory.id, { method: req.method, url: req.url, prefix: req.scim.baseUrl.slice(config.issuer.length), status: reply.statusCode, scimType: req.scimType }).catch((err: unknown) =>
      req.log.warn({ err }, 'could not log the SCIM request'),
    );
  });

  // A write (whatever its outcome) ends the totals carried along list walks (listing.ts), once it
  // is committed and before the client hears of it.
  app.addHook('onSend', async (req) => {
    if (req.scim && req.method !== 'GET' && req.method !== 'HEAD' && !req.url.split('?')[0]!.endsWith('/.search')) directoryChanged(req.scim.directory.id);
  });

  const ifMatch = (req: FastifyRequest) => (typeof req.headers['if-match'] === 'string' ? req.headers['if-match'] : undefined);
  const notModified = (req: FastifyRequest, version: number | string) => typeof req.headers['if-none-match'] === 'string' && etagMatches(req.headers['if-none-match'], version);
  type WithId = { Params: { directory_id: string; id: string } };
  const query = (req: FastifyRequest) => req.query as Record<string, unknown>;

  // Discovery (RFC 7644 §4).
  app.get('/ServiceProviderConfig', async (req, reply) => send(reply, 200, serviceProviderConfig(scopeOf(req).baseUrl)));
  app.get('/ResourceTypes', async (req, reply) => send(reply, 200, listOf(resourceTypes(scopeOf(req).baseUrl))));
  app.get<WithId>('/ResourceTypes/:id', async (req, reply) => send(reply, 200, single(resourceTypes(scopeOf(req).baseUrl), req.params.id, 'ResourceType')));
  app.get('/Schemas', async (req, reply) => send(reply, 200, listOf(schemas(scopeOf(req).baseUrl))));
  app.get<WithId>('/Schemas/:id', async (req, reply) => send(reply, 200, single(schemas(scopeOf(req).baseUrl) as { id: string }[], req.params.id, 'Schema')));

  // Users.
  app.get('/Users', async (req, reply) => send(reply, 200, await listUsers(scopeOf(req), query(req))));
  app.post('/Users/.search', async (req, reply) => send(reply, 200, await listUsers(scopeOf(req), searchParameters(req.body))));
  app.post('/Users', async (req, reply) => {
    const { resource, version } = await createUser(scopeOf(req), req.body);
    reply.header('location', (resource.meta as { location: string }).location);
    return send(reply, 201, resource, version);
  });
  app.get<WithId>('/Users/:id', async (req, reply) => {
    const { resource, version } = await getUser(scopeOf(req), req.params.id);
    if (notModified(req, version)) return reply.code(304).header('etag', etagOf(version)).send();
    return send(reply, 200, project(resource, projectionOf(query(req), USER_SCHEMA)), version);
  });
  app.put<WithId>('/Users/:id', async (req, reply) => {
    const { resource, version } = await updateUser(scopeOf(req), req.params.id, { body: req.body }, ifMatch(req));
    return send(reply, 200, project(resource, projectionOf(query(req), USER_SCHEMA)), version);
  });
  app.patch<WithId>('/Users/:id', async (req, reply) => {
    const { resource, version } = await updateUser(scopeOf(req), req.params.id, { ops: parsePatchRequest(req.body) }, ifMatch(req));
    return send(reply, 200, project(resource, projectionOf(query(req), USER_SCHEMA)), version);
  });
  app.delete<WithId>('/Users/:id', async (req, reply) => {
    await deleteUser(scopeOf(req), req.params.id, ifMatch(req));
    forgetCursors(scopeOf(req).directory.id);
    return reply.code(204).send();
  });

  // Groups.
  app.get('/Groups', async (req, reply) => send(reply, 200, await listGroups(scopeOf(req), query(req))));
  app.post('/Groups/.search', async (req, reply) => send(reply, 200, await listGroups(scopeOf(req), searchParameters(req.body))));
  app.post('/Groups', async (req, reply) => {
    const { resource, version } = await createGroup(scopeOf(req), req.body);
    reply.header('location', (resource.meta as { location: string }).location);
    return send(reply, 201, resource, version);
  });
  app.get<WithId>('/Groups/:id', async (req, reply) => {
    const projection = projectionOf(query(req), GROUP_SCHEMA);
    const { resource, version } = await getGroup(scopeOf(req), req.params.id, !projectionDrops(projection, 'members'));
    if (notModified(req, version)) return reply.code(304).header('etag', etagOf(version)).send();
    return send(reply, 200, project(resource, projection), version);
  });
  app.put<WithId>('/Groups/:id', async (req, reply) => {
    const projection = projectionOf(query(req), GROUP_SCHEMA);
    const updated = await updateGroup(scopeOf(req), req.params.id, { body: req.body }, ifMatch(req), { withMembers: !projectionDrops(projection, 'members') });
    return send(reply, 200, project(updated!.resource, projection), updated!.version);
  });
  app.patch<WithId>('/Groups/:id', async (req, reply) => {
    const projection = projectionOf(query(req), GROUP_SCHEMA);
    // RFC 7644 §3.5.2: 204 when the client did not ask for attributes back (a group of 100,000
    // members is not sent back for each page of members added); 200 with the resource when it did.
    const wantsResource = projection.attributes !== undefined || projection.excluded !== undefined;
    const updated = await updateGroup(scopeOf(req), req.params.id, { ops: parsePatchRequest(req.body) }, ifMatch(req), { withMembers: wantsResource && !projectionDrops(projection, 'members') });
    if (!wantsResource) return reply.code(204).header('etag', etagOf(updated!.version)).send();
    return send(reply, 200, project(updated!.resource, projection), updated!.version);
  });
  app.delete<WithId>('/Groups/:id', async (req, reply) => {
    await deleteGroup(scopeOf(req), req.params.id, ifMatch(req));
    forgetCursors(scopeOf(req).directory.id);
    return reply.code(204).send();
  });

  // Anything else under a directory: a SCIM 404 (or 405 for a known path), not the app's error shape.
  app.setNotFoundHandler((req, reply) => send(reply, 404, scimErrorBody(404, undefined, `no SCIM endpoint ${req.method} ${req.url.split('?')[0]!.slice(0, 200)}`)));
}
