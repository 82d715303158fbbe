/**
 * `orgauth resource`: the resources (RFC 8707) tokens may be for besides orgauth's API. They
 * belong to the instance's operator, as signing keys do, so only the CLI manages them.
 */
import { createResource, deleteResource, getResource, listResources, type ResourceRow, updateResource } from '../oauth/models/resources.js';
import { optionalString, required, table, type Command, UsageError, type Values } from './shared.js';

function view(r: ResourceRow) {
  return { id: r.id, uri: r.uri, name: r.name, scopes: r.scopes, access_token_ttl: r.access_token_ttl, created_at: r.created_at.toISOString(), updated_at: r.updated_at.toISOString() };
}

function describe(r: ResourceRow): string {
  return `${r.uri}\n  name: ${r.name}\n  scopes: ${r.scopes.join(' ') || '(none)'}\n  access-token lifetime: ${r.access_token_ttl} s`;
}

function ttl(values: Values): number | undefined {
  const value = optionalString(values, 'access-token-ttl');
  if (value === undefined) return undefined;
  if (!/^[0-9]{1,6}$/.test(value)) throw new UsageError('--access-token-ttl must be a number of seconds');
  return Number(value);
}

export const resourceCommands: Record<string, Command> = {
  'resource create': {
    usage: 'orgauth resource create --uri URI --name NAME --scopes "S ..." [--access-token-ttl SECONDS]',
    summary: 'register a resource (an MCP server, an API): tokens asked for it with resource=URI carry aud=URI',
    options: { uri: { type: 'string' }, name: { type: 'string' }, scopes: { type: 'string' }, 'access-token-ttl': { type: 'string' } },
    run: async ({ db, config }, v) => {
      const r = await createResource(db, config, { uri: required(v, 'uri'), name: required(v, 'name'), scopes: required(v, 'scopes'), accessTokenTtl: ttl(v) });
      return { json: view(r), text: `resource ${r.id} registered: ${describe(r)}` };
    },
  },

  'resource list': {
    usage: 'orgauth resource list',
    summary: 'list the registered resources (orgauth\u2019s own API is built in and not listed)',
    options: {},
    run: async ({ db }) => {
      const rows = (await listResources(db)).map(view);
      return {
        json: { data: rows },
        text: table(['ID', 'URI', 'NAME', 'SCOPES', 'TTL'], rows.map((r) => [String(r.id), r.uri, r.name, r.scopes.join(' '), String(r.access_token_ttl)])),
      };
    },
  },

  'resource show': {
    usage: 'orgauth resource show --uri URI|ID',
    summary: 'show one resource',
    options: { uri: { type: 'string' } },
    run: async ({ db }, v) => {
      const r = await getResource(db, required(v, 'uri'));
      return { json: view(r), text: describe(r) };
    },
  },

  'resource update': {
    usage: 'orgauth resource update --uri URI|ID [--name NAME] [--scopes "S ..."] [--access-token-ttl SECONDS]',
    summary: 'rename a resource or change its scopes or token lifetime (its URI is its identity)',
    options: { uri: { type: 'string' }, name: { type: 'string' }, scopes: { type: 'string' }, 'access-token-ttl': { type: 'string' } },
    run: async ({ db }, v) => {
      const changes = { name: optionalString(v, 'name'), scopes: optionalString(v, 'scopes'), accessTokenTtl: ttl(v) };
      if (Object.values(changes).every((c) => c === undefined)) throw new UsageError('nothing to change: give --name, --scopes or --access-token-ttl');
      const r = await updateResource(db, required(v, 'uri'), changes);
      return { json: view(r), text: `resource updated: ${describe(r)}` };
    },
  },

  'resource delete': {
    usage: 'orgauth resource delete --uri URI|ID',
    summary: 'delete a resource; its grants end with it (nothing is refreshed for it again)',
    options: { uri: { type: 'string' } },
    run: async ({ db }, v) => {
      const r = await deleteResource(db, required(v, 'uri'));
      return { json: view(r), text: `resource ${r.uri} deleted` };
    },
  },
};
