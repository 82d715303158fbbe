/**
 * `orgauth resource`: the resources (RFC 8707) tokens may be for besides orgauth's API. They
 * belong to the instance's operator, as signing keys do, so only the CLI manages them.
 */
import { readJwksFile } from './apps.js';
import { registerResource, rotateResourceSecret, setResourceKeys } from '../oauth/models/resource-clients.js';
import { deleteResource, getResource, listResources, type ResourceRow, updateResource } from '../oauth/models/resources.js';
import { optionalString, repeated, required, table, type Command, UsageError, type Values } from './shared.js';

function view(r: ResourceRow) {
  return {
    id: r.id,
    uri: r.uri,
    name: r.name,
    scopes: r.scopes,
    access_token_ttl: r.access_token_ttl,
    exchange_from: r.exchange_from,
    client_id: r.client_id,
    token_endpoint_auth_method: r.token_endpoint_auth_method,
    created_at: r.created_at.toISOString(),
    updated_at: r.updated_at.toISOString(),
  };
}

function describe(r: ResourceRow): string {
  return [
    r.uri,
    `  name: ${r.name}`,
    `  scopes: ${r.scopes.join(' ') || '(none)'}`,
    `  access-token lifetime: ${r.access_token_ttl} s`,
    `  client id: ${r.client_id ?? '(no credentials: orgauth resource rotate-secret makes them)'}${r.token_endpoint_auth_method ? ` (${r.token_endpoint_auth_method})` : ''}`,
    `  token exchange allowed from: ${r.exchange_from.join(' ') || '(nobody)'}`,
  ].join('\n');
}

const secretNote = 'client_secret is shown once: keep it now (orgauth resource rotate-secret makes a new one)';

function ttl(values: Values): number | undefined {
  const value = optionalString(values, 'access-token-ttl');
  if (value === undefined) return undefined;
  if (!/^[0-9]{1,6}$/.test(value)) throw new UsageError('--access-token-ttl must be a number of seconds');
  return Number(value);
}

export const resourceCommands: Record<string, Command> = {
  'resource create': {
    usage: 'orgauth resource create --uri URI --name NAME --scopes "S ..." [--access-token-ttl SECONDS]',
    summary: 'register a resource (an MCP server, an API): tokens asked for it with resource=URI carry aud=URI; prints its client id and secret (introspection, token exchange)',
    options: { uri: { type: 'string' }, name: { type: 'string' }, scopes: { type: 'string' }, 'access-token-ttl': { type: 'string' } },
    run: async ({ db, config }, v) => {
      const { resource: r, credentials } = await registerResource(db, config, { uri: required(v, 'uri'), name: required(v, 'name'), scopes: required(v, 'scopes'), accessTokenTtl: ttl(v) });
      return { json: { ...view(r), client_secret: credentials.client_secret }, text: `resource ${r.id} registered: ${describe(r)}\n  client secret: ${credentials.client_secret}\n${secretNote}` };
    },
  },

  'resource rotate-secret': {
    usage: 'orgauth resource rotate-secret --uri URI|ID',
    summary: 'give a resource a new client secret (or its first); the old secret, or its keys, stop working at once',
    options: { uri: { type: 'string' } },
    run: async ({ db }, v) => {
      const credentials = await rotateResourceSecret(db, required(v, 'uri'));
      const r = await getResource(db, required(v, 'uri'));
      return { json: { ...view(r), client_secret: credentials.client_secret }, text: `resource ${r.uri}: new credentials\n  client id: ${credentials.client_id}\n  client secret: ${credentials.client_secret}\n${secretNote}` };
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
    usage:
      'orgauth resource update --uri URI|ID [--name NAME] [--scopes "S ..."] [--access-token-ttl SECONDS]' +
      ' [--allow-exchange-from URI|CLIENT_ID]... [--deny-exchange-from URI|CLIENT_ID]... [--jwks-file FILE | --jwks-uri URL]',
    summary: 'change a resource: its name, scopes, token lifetime, who may exchange tokens for it, or its keys for private_key_jwt',
    options: {
      uri: { type: 'string' },
      name: { type: 'string' },
      scopes: { type: 'string' },
      'access-token-ttl': { type: 'string' },
      'allow-exchange-from': { type: 'string', multiple: true },
      'deny-exchange-from': { type: 'string', multiple: true },
      'jwks-file': { type: 'string' },
      'jwks-uri': { type: 'string' },
    },
    run: async ({ db, config }, v) => {
      const changes = {
        name: optionalString(v, 'name'),
        scopes: optionalString(v, 'scopes'),
        accessTokenTtl: ttl(v),
        allowExchangeFrom: v['allow-exchange-from'] === undefined ? undefined : repeated(v, 'allow-exchange-from'),
        denyExchangeFrom: v['deny-exchange-from'] === undefined ? undefined : repeated(v, 'deny-exchange-from'),
      };
      const jwksFile = optionalString(v, 'jwks-file');
      const jwksUri = optionalString(v, 'jwks-uri');
      if (jwksFile !== undefined && jwksUri !== undefined) throw new UsageError('--jwks-file and --jwks-uri contradict each other: register one');
      const keys = jwksFile !== undefined ? { jwks: readJwksFile(jwksFile) } : jwksUri !== undefined ? { jwksUri } : undefined;
      if (Object.values(changes).every((c) => c === undefined) && keys === undefined) {
        throw new UsageError('nothing to change: give --name, --scopes, --access-token-ttl, --allow-exchange-from, --deny-exchange-from, --jwks-file or --jwks-uri');
      }
      const uri = required(v, 'uri');
      let r = await updateResource(db, uri, changes);
      if (keys !== undefined) r = await setResourceKeys(db, uri, keys, { allowHttp: config.outbound.allowHttp });
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
