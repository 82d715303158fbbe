/**
 * The management API's directories: the organization's SCIM clients (issue 43). directory.read
 * lists and reads them, directory.write creates, changes, deletes them and rotates their tokens.
 * A token appears only in the answers of create and rotate-token. The rules are the domain
 * layer's (src/directory/directories.ts), shared with the dashboard and the CLI.
 */
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import type { DB } from '../db/connect.js';
import {
  createDirectory,
  createDirectorySchema,
  deleteDirectory,
  DIRECTORY_ROLES,
  type DirectoryView,
  getDirectory,
  listDirectories,
  MAX_DIRECTORIES,
  rotateDirectoryToken,
  updateDirectory,
  updateDirectorySchema,
} from '../directory/directories.js';
import { scimBaseUrl } from '../directory/base-url.js';
import { actingRoleOf, actorOf, authOf, pathId } from './auth.js';
import { errorResponses, errorSchema, idParams, orgParams } from './schemas.js';

const roleSchema = z.enum(DIRECTORY_ROLES as [string, ...string[]]);

export const directorySchema = z
  .object({
    id: z.number().int(),
    name: z.string(),
    base_url: z.string().describe('the SCIM base URL to give the identity provider: <issuer>/scim/v2/<id>'),
    state: z.enum(['active', 'disabled']).describe('a disabled directory’s requests are refused'),
    default_role: roleSchema.describe('the role of a provisioned member no mapped group gives a higher one'),
    group_roles: z
      .array(z.object({ group: z.string().describe('a SCIM group’s displayName or id, compared without case'), role: roleSchema }))
      .describe('a member of a mapped group gets its role; of several, the highest'),
    token_created_at: z.iso.datetime().describe('when the current token was made'),
    created_at: z.iso.datetime(),
    updated_at: z.iso.datetime(),
  })
  .meta({ id: 'Directory' });

const withToken = directorySchema.extend({ token: z.string().describe('the bearer token the SCIM client sends: shown in this answer only') }).meta({ id: 'DirectoryWithToken' });

export function directoryOut(issuer: string, d: DirectoryView): z.infer<typeof directorySchema> {
  return {
    id: d.id,
    name: d.name,
    base_url: scimBaseUrl(issuer, d.id),
    state: d.state,
    default_role: d.default_role,
    group_roles: d.group_roles.map((g) => ({ group: g.group, role: g.role })),
    token_created_at: d.token_created_at.toISOString(),
    created_at: d.created_at.toISOString(),
    updated_at: d.updated_at.toISOString(),
  };
}

export const directoryRoutes: FastifyPluginAsyncZod<{ db: DB; issuer: string }> = async (app, { db, issuer }) => {
  const out = (d: DirectoryView) => directoryOut(issuer, d);
  app.get(
    '/directories',
    {
      config: { scope: 'directory.read' },
      schema: {
        tags: ['directory'],
        summary: `List the organization’s SCIM directories, oldest first (at most ${MAX_DIRECTORIES}, so all in one page)`,
        params: orgParams,
        response: { 200: z.object({ data: z.array(directorySchema) }), ...errorResponses },
      },
    },
    async (req) => ({ data: (await listDirectories(db, authOf(req).organizationId)).map(out) }),
  );

  app.get(
    '/directories/:id',
    { config: { scope: 'directory.read' }, schema: { tags: ['directory'], summary: 'Get a directory', params: idParams, response: { 200: directorySchema, ...errorResponses } } },
    async (req) => out(await getDirectory(db, authOf(req).organizationId, pathId(req.params.id))),
  );

  app.post(
    '/directories',
    {
      config: { scope: 'directory.write' },
      schema: {
        tags: ['directory'],
        summary: 'Create a directory; its token is in this answer only',
        params: orgParams,
        body: createDirectorySchema,
        response: { 201: withToken, ...errorResponses, 409: errorSchema.describe(`refused: the organization has ${MAX_DIRECTORIES} directories`) },
      },
    },
    async (req, reply) => {
      const auth = authOf(req);
      const { directory, token } = await createDirectory(db, auth.organizationId, req.body, actorOf(auth), actingRoleOf(auth));
      reply.code(201).header('location', `/api/v1/${auth.organizationId}/directories/${directory.id}`);
      return { ...out(directory), token };
    },
  );

  app.patch(
    '/directories/:id',
    {
      config: { scope: 'directory.write' },
      schema: {
        tags: ['directory'],
        summary: 'Rename, disable or enable a directory, or change its default role; group_roles, when given, replaces the mappings whole',
        params: idParams,
        body: updateDirectorySchema,
        response: { 200: directorySchema, ...errorResponses },
      },
    },
    async (req) => {
      const auth = authOf(req);
      return out(await updateDirectory(db, auth.organizationId, pathId(req.params.id), req.body, actorOf(auth), actingRoleOf(auth)));
    },
  );

  app.post(
    '/directories/:id/rotate-token',
    {
      config: { scope: 'directory.write' },
      schema: {
        tags: ['directory'],
        summary: 'Replace the directory’s token: the old one is refused at once; the new one is in this answer only',
        params: idParams,
        response: { 200: withToken, ...errorResponses },
      },
    },
    async (req) => {
      const auth = authOf(req);
      const { directory, token } = await rotateDirectoryToken(db, auth.organizationId, pathId(req.params.id), actorOf(auth));
      return { ...out(directory), token };
    },
  );

  app.delete(
    '/directories/:id',
    {
      config: { scope: 'directory.write' },
      schema: { tags: ['directory'], summary: 'Delete a directory; its token stops with it', params: idParams, response: { 204: z.null().describe('deleted'), ...errorResponses } },
    },
    async (req, reply) => {
      const auth = authOf(req);
      await deleteDirectory(db, auth.organizationId, pathId(req.params.id), actorOf(auth));
      return reply.code(204).send(null);
    },
  );
};
