/**
 * `orgauth social`: sign-in through Google, Microsoft, GitHub or any OpenID provider, for the
 * whole instance (src/social/). The operator's, like signing keys and resources: only the CLI
 * manages them. `create` prints the redirect URI to register at the provider.
 */
import {
  createSocialConnection,
  deleteSocialConnection,
  getSocialConnection,
  listSocialConnections,
  type SocialConnectionInput,
  type SocialConnectionView,
  socialSettings,
  updateSocialConnection,
} from '../social/connections.js';
import { optionalString, required, table, type Command, UsageError, type Values } from './shared.js';

function json(c: SocialConnectionView) {
  return { ...c, created_at: c.created_at.toISOString(), updated_at: c.updated_at.toISOString() };
}

function describe(c: SocialConnectionView): string {
  return [
    `social connection ${c.id}: ${c.name} (${c.provider}), ${c.state}`,
    `  client id: ${c.client_id}`,
    ...(c.issuer !== undefined ? [`  issuer: ${c.issuer}`] : []),
    ...(c.tenant !== undefined ? [`  tenant: ${c.tenant}`] : []),
    ...(c.base_url !== undefined ? [`  base URL: ${c.base_url}`] : []),
    `  allowed domains: ${c.allowed_domains.join(' ') || '(any)'}`,
    `  redirect URI (register it at the provider): ${c.redirect_uri}`,
  ].join('\n');
}

function connectionId(values: Values): number {
  const raw = required(values, 'id');
  if (!/^[1-9][0-9]{0,9}$/.test(raw) || Number(raw) > 2 ** 31 - 1) throw new UsageError('--id must be a connection id');
  return Number(raw);
}

/** The options both create and update take, as the model's input. */
function fields(values: Values): SocialConnectionInput {
  const domains = optionalString(values, 'allowed-domains');
  const input: SocialConnectionInput = {
    name: optionalString(values, 'name'),
    client_id: optionalString(values, 'client-id'),
    client_secret: optionalString(values, 'client-secret'),
    issuer: optionalString(values, 'issuer'),
    tenant: optionalString(values, 'tenant'),
    base_url: optionalString(values, 'base-url'),
    allowed_domains: domains === undefined ? undefined : domains.split(/[\s,]+/).filter((d) => d !== ''),
    state: optionalString(values, 'state'),
  };
  return Object.fromEntries(Object.entries(input).filter(([, v]) => v !== undefined));
}

const FIELD_OPTIONS = {
  name: { type: 'string' },
  'client-id': { type: 'string' },
  'client-secret': { type: 'string' },
  issuer: { type: 'string' },
  tenant: { type: 'string' },
  'base-url': { type: 'string' },
  'allowed-domains': { type: 'string' },
  state: { type: 'string' },
} as const;

export const socialCommands: Record<string, Command> = {
  'social create': {
    usage:
      'orgauth social create --provider google|microsoft|github|oidc --client-id X --client-secret S [--name N] [--issuer URL] [--tenant T] [--base-url URL]' +
      ' [--allowed-domains "a.com b.com"] [--state enabled|disabled]',
    summary: 'add sign-in through a provider for everyone (a button on the sign-in page); prints the redirect URI to register there',
    options: { provider: { type: 'string' }, ...FIELD_OPTIONS },
    run: async ({ db, config }, v) => {
      required(v, 'client-id');
      required(v, 'client-secret');
      const c = await createSocialConnection(db, socialSettings(config), { provider: required(v, 'provider'), ...fields(v) });
      return { json: json(c), text: describe(c) };
    },
  },

  'social list': {
    usage: 'orgauth social list',
    summary: 'list the social connections',
    options: {},
    run: async ({ db, config }) => {
      const rows = await listSocialConnections(db, config);
      return {
        json: { data: rows.map(json) },
        text: rows.length === 0 ? '(none)' : table(['ID', 'PROVIDER', 'NAME', 'STATE', 'CLIENT ID', 'REDIRECT URI'], rows.map((c) => [String(c.id), c.provider, c.name, c.state, c.client_id, c.redirect_uri])),
      };
    },
  },

  'social show': {
    usage: 'orgauth social show --id ID',
    summary: 'show one social connection',
    options: { id: { type: 'string' } },
    run: async ({ db, config }, v) => {
      const c = await getSocialConnection(db, config, connectionId(v));
      return { json: json(c), text: describe(c) };
    },
  },

  'social update': {
    usage:
      'orgauth social update --id ID [--state enabled|disabled] [--name N] [--client-id X] [--client-secret S] [--issuer URL] [--tenant T] [--base-url URL] [--allowed-domains "a.com b.com"]',
    summary: 'change a social connection: enable or disable it, rotate its client secret, limit it to domains ("" allows any)',
    options: { id: { type: 'string' }, ...FIELD_OPTIONS },
    run: async ({ db, config }, v) => {
      const changes = fields(v);
      if (Object.keys(changes).length === 0) throw new UsageError('nothing to change: give --state, --name, --client-id, --client-secret, --issuer, --tenant, --base-url or --allowed-domains');
      const c = await updateSocialConnection(db, socialSettings(config), connectionId(v), changes);
      return { json: json(c), text: describe(c) };
    },
  },

  'social delete': {
    usage: 'orgauth social delete --id ID',
    summary: 'delete a social connection: the identities linked through it and the sessions signed in through it end',
    options: { id: { type: 'string' } },
    run: async ({ db }, v) => {
      const id = connectionId(v);
      await deleteSocialConnection(db, id);
      return { json: { id, deleted: true }, text: `social connection ${id} deleted` };
    },
  },
};
