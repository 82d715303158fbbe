/**
 * `orgauth sso ...`: an organization's single sign-on connections (src/sso/connections.ts),
 * OpenID Connect providers and SAML identity providers. Certificates and IdP metadata are read
 * from files (--idp-cert-file, repeatable: several while the IdP rotates its key;
 * --idp-metadata-file). The operator acts (no actor in the audit log), as with every command;
 * the client secret is sealed with SECRET_KEY and never printed.
 */
import { readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { getOrganization } from '../accounts/organizations.js';
import { connectionOut } from '../api/sso-connections.js';
import type { DB } from '../db/connect.js';
import { InvalidRequestError } from '../errors.js';
import { parseCanonicalId } from '../oauth/helpers/params.js';
import { connectionSettings, type ConnectionView, createConnection, deleteConnection, getConnection, listConnections, updateConnection } from '../sso/connections.js';
import { optionalString, orgId, repeated, required, table, type Command, type Options, UsageError, type Values, yesNo } from './shared.js';

/** An IdP metadata document is at most 512 KiB (readIdpMetadata); a file much larger is not one. */
const MAX_FILE_BYTES = 1024 * 1024;
const STATES = ['draft', 'active', 'disabled'] as const;

async function organizationOf(db: DB, values: Values): Promise<number> {
  return (await getOrganization(db, orgId(values))).id;
}

function connectionId(values: Values): number {
  const id = parseCanonicalId(required(values, 'id'));
  if (id === undefined) throw new UsageError('--id must be a positive integer');
  return id;
}

function readText(option: string, file: string): Buffer {
  const resolved = path.resolve(file);
  try {
    if (statSync(resolved).size > MAX_FILE_BYTES) throw new InvalidRequestError(`--${option} ${file}: larger than ${MAX_FILE_BYTES / 1024} KiB`);
    return readFileSync(resolved);
  } catch (err) {
    if (err instanceof InvalidRequestError) throw err;
    throw new InvalidRequestError(`--${option} ${file}: cannot be read (${(err as NodeJS.ErrnoException).code ?? String(err)})`);
  }
}

/**
 * The certificates in each --idp-cert-file: every PEM block of a file (a bundle is several), a
 * binary DER file as base64, or the file's text (base64 DER as admin consoles show it). The
 * domain checks each one.
 */
function certificatesFrom(values: Values): string[] | undefined {
  const files = repeated(values, 'idp-cert-file');
  if (files.length === 0) return undefined;
  return files.flatMap((file) => {
    const bytes = readText('idp-cert-file', file);
    const text = bytes.toString('utf8');
    const blocks = text.match(/-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g);
    if (blocks) return blocks;
    if (bytes[0] === 0x30) return [bytes.toString('base64')];
    return [text.trim()];
  });
}

function metadataFrom(values: Values): string | undefined {
  const file = optionalString(values, 'idp-metadata-file');
  return file === undefined ? undefined : readText('idp-metadata-file', file).toString('utf8');
}

function stateOf(values: Values): (typeof STATES)[number] | undefined {
  const state = optionalString(values, 'state');
  if (state === undefined) return undefined;
  if (!(STATES as readonly string[]).includes(state)) throw new UsageError('--state must be draft, active or disabled');
  return state as (typeof STATES)[number];
}

const OIDC_OPTIONS = ['issuer', 'client-id', 'client-secret', 'scopes'] as const;
const SAML_OPTIONS = ['idp-entity-id', 'idp-sso-url', 'idp-cert-file', 'idp-metadata-file', 'idp-initiated'] as const;

/** Options of the other protocol are a usage error, named as the user typed them. */
function refuseOptionsOf(values: Values, protocol: 'oidc' | 'saml'): void {
  const foreign = (protocol === 'oidc' ? SAML_OPTIONS : OIDC_OPTIONS).filter((o) => values[o] !== undefined);
  if (foreign.length > 0) throw new UsageError(`${foreign.map((o) => `--${o}`).join(', ')}: not for ${protocol === 'oidc' ? 'an OIDC' : 'a SAML'} connection`);
}

/** The fields both protocols have, from the options given (what is not given is left out). */
function commonInput(values: Values) {
  const jit = yesNo(values, 'jit');
  const linksExisting = yesNo(values, 'link-existing');
  const state = stateOf(values);
  const name = optionalString(values, 'name');
  const defaultRole = optionalString(values, 'default-role');
  return {
    ...(name !== undefined ? { name } : {}),
    ...(state !== undefined ? { state } : {}),
    ...(jit !== undefined ? { jit } : {}),
    ...(linksExisting !== undefined ? { links_existing_accounts: linksExisting } : {}),
    ...(defaultRole !== undefined ? { default_role: defaultRole } : {}),
  };
}

function oidcInput(values: Values) {
  const issuer = optionalString(values, 'issuer');
  const clientId = optionalString(values, 'client-id');
  const clientSecret = optionalString(values, 'client-secret');
  const scopes = optionalString(values, 'scopes');
  return {
    ...(issuer !== undefined ? { issuer } : {}),
    ...(clientId !== undefined ? { client_id: clientId } : {}),
    ...(clientSecret !== undefined ? { client_secret: clientSecret } : {}),
    ...(scopes !== undefined ? { scopes } : {}),
  };
}

function samlInput(values: Values) {
  const entityId = optionalString(values, 'idp-entity-id');
  const ssoUrl = optionalString(values, 'idp-sso-url');
  const certificates = certificatesFrom(values);
  const metadata = metadataFrom(values);
  const initiated = yesNo(values, 'idp-initiated');
  return {
    ...(entityId !== undefined ? { idp_entity_id: entityId } : {}),
    ...(ssoUrl !== undefined ? { idp_sso_url: ssoUrl } : {}),
    ...(certificates !== undefined ? { idp_certificates: certificates } : {}),
    ...(metadata !== undefined ? { idp_metadata_xml: metadata } : {}),
    ...(initiated !== undefined ? { idp_initiated: initiated } : {}),
  };
}

/** What to register at the provider: the URLs orgauth has for the connection. */
function urlLines(c: ConnectionView): string[] {
  return c.protocol === 'oidc'
    ? [`redirect_uri: ${c.redirect_uri ?? ''}   (register it at the provider)`]
    : [`entity_id:    ${c.entity_id ?? ''}`, `acs_url:      ${c.acs_url ?? ''}`, `metadata_url: ${c.metadata_url ?? ''}   (most IdPs import it)`];
}

function describe(c: ConnectionView): string {
  const lines = [
    `id:           ${c.id}`,
    `protocol:     ${c.protocol}`,
    `name:         ${c.name}`,
    `state:        ${c.state}`,
    `jit:          ${c.jit ? 'yes' : 'no'}`,
    `default_role: ${c.default_role}`,
    `link_existing: ${c.links_existing_accounts ? 'yes' : 'no'}   (link an existing account by its verified email, without its proof)`,
  ];
  if (c.protocol === 'oidc') lines.push(`issuer:       ${c.issuer ?? ''}`, `client_id:    ${c.client_id ?? ''}`, `scopes:       ${c.scopes ?? ''}`);
  else {
    lines.push(`idp_entity_id: ${c.idp_entity_id ?? ''}`, `idp_sso_url:  ${c.idp_sso_url ?? ''}`, `idp_initiated: ${c.idp_initiated ? 'yes' : 'no'}`);
    for (const cert of c.idp_certificates ?? []) lines.push(`certificate:  ${cert.subject}, SHA-256 ${cert.fingerprint_sha256}, expires ${cert.not_after}`);
  }
  return [...lines, ...urlLines(c)].join('\n');
}

const COMMON_OPTIONS: Options = {
  org: { type: 'string' },
  name: { type: 'string' },
  state: { type: 'string' },
  jit: { type: 'string' },
  'link-existing': { type: 'string' },
  'default-role': { type: 'string' },
  issuer: { type: 'string' },
  'client-id': { type: 'string' },
  'client-secret': { type: 'string' },
  scopes: { type: 'string' },
  'idp-entity-id': { type: 'string' },
  'idp-sso-url': { type: 'string' },
  'idp-cert-file': { type: 'string', multiple: true },
  'idp-metadata-file': { type: 'string' },
  'idp-initiated': { type: 'string' },
};

export const ssoCommands: Record<string, Command> = {
  'sso create': {
    usage: [
      'orgauth sso create --org ID --protocol oidc --name N --issuer URL --client-id X --client-secret S [--scopes "openid email profile"] [--jit yes|no] [--link-existing yes|no] [--default-role R] [--state draft|active|disabled]',
      '       orgauth sso create --org ID --protocol saml --name N (--idp-entity-id E --idp-sso-url URL --idp-cert-file FILE [--idp-cert-file FILE2]... | --idp-metadata-file FILE) [--idp-initiated yes|no] [--jit yes|no] [--link-existing yes|no] [--default-role R] [--state draft|active|disabled]',
    ].join('\n'),
    summary:
      'connect an identity provider (OpenID Connect or SAML) to an organization; active unless --state draft. Prints the URLs to register at the provider. --idp-cert-file is repeatable (the IdP rotating its key); the client secret is never printed',
    options: { ...COMMON_OPTIONS, protocol: { type: 'string' } },
    run: async ({ db, config }, v) => {
      const protocol = required(v, 'protocol');
      if (protocol !== 'oidc' && protocol !== 'saml') throw new UsageError('--protocol must be oidc or saml');
      refuseOptionsOf(v, protocol);
      required(v, 'name');
      let input;
      if (protocol === 'oidc') {
        for (const option of ['issuer', 'client-id', 'client-secret']) if (optionalString(v, option) === undefined) throw new UsageError(`--${option} is required for an OIDC connection`);
        input = { protocol, ...commonInput(v), ...oidcInput(v) };
      } else {
        if (optionalString(v, 'idp-metadata-file') === undefined) {
          for (const option of ['idp-entity-id', 'idp-sso-url']) if (optionalString(v, option) === undefined) throw new UsageError(`--${option} is required for a SAML connection (or --idp-metadata-file)`);
          if (repeated(v, 'idp-cert-file').length === 0) throw new UsageError('--idp-cert-file is required for a SAML connection (or --idp-metadata-file)');
        }
        input = { protocol, ...commonInput(v), ...samlInput(v) };
      }
      const organizationId = await organizationOf(db, v);
      const c = await createConnection(db, connectionSettings(config), organizationId, input);
      return {
        json: connectionOut(c),
        text: [`created ${c.protocol === 'oidc' ? 'OIDC' : 'SAML'} connection "${c.name}" in organization ${organizationId} (${c.state})`, `id:           ${c.id}`, ...urlLines(c)].join('\n'),
      };
    },
  },

  'sso list': {
    usage: 'orgauth sso list --org ID',
    summary: "list an organization's SSO connections (never their secrets)",
    options: { org: { type: 'string' } },
    run: async ({ db, config }, v) => {
      const connections = await listConnections(db, connectionSettings(config), await organizationOf(db, v));
      return {
        json: { data: connections.map(connectionOut) },
        text:
          connections.length === 0
            ? '(none)'
            : table(
                ['ID', 'PROTOCOL', 'NAME', 'STATE', 'JIT', 'DEFAULT_ROLE', 'IDP'],
                connections.map((c) => [String(c.id), c.protocol, c.name, c.state, c.jit ? 'yes' : 'no', c.default_role, (c.protocol === 'oidc' ? c.issuer : c.idp_entity_id) ?? '']),
              ),
      };
    },
  },

  'sso show': {
    usage: 'orgauth sso show --org ID --id C',
    summary: 'show an SSO connection, its certificates and the URLs to register at the provider (never its secret)',
    options: { org: { type: 'string' }, id: { type: 'string' } },
    run: async ({ db, config }, v) => {
      const c = await getConnection(db, connectionSettings(config), await organizationOf(db, v), connectionId(v));
      return { json: connectionOut(c), text: describe(c) };
    },
  },

  'sso update': {
    usage:
      'orgauth sso update --org ID --id C [--state draft|active|disabled] [--name N] [--jit yes|no] [--link-existing yes|no] [--default-role R] [--issuer URL] [--client-id X] [--client-secret S] [--scopes "…"] [--idp-entity-id E] [--idp-sso-url URL] [--idp-cert-file FILE]... [--idp-metadata-file FILE] [--idp-initiated yes|no]',
    summary:
      'change an SSO connection; what is not given stays. --idp-cert-file replaces the whole list (repeat it to keep the old certificate beside the new one); leaving the active state ends the sessions signed in through it',
    options: { ...COMMON_OPTIONS, id: { type: 'string' } },
    run: async ({ db, config }, v) => {
      const settings = connectionSettings(config);
      const organizationId = await organizationOf(db, v);
      const id = connectionId(v);
      const current = await getConnection(db, settings, organizationId, id);
      refuseOptionsOf(v, current.protocol);
      const input = { ...commonInput(v), ...(current.protocol === 'oidc' ? oidcInput(v) : samlInput(v)) };
      const c = await updateConnection(db, settings, organizationId, id, input);
      return { json: connectionOut(c), text: `updated ${c.protocol === 'oidc' ? 'OIDC' : 'SAML'} connection ${c.id} "${c.name}" (${c.state})` };
    },
  },

  'sso delete': {
    usage: 'orgauth sso delete --org ID --id C',
    summary: 'delete an SSO connection: its identity links go, and the sessions signed in through it end',
    options: { org: { type: 'string' }, id: { type: 'string' } },
    run: async ({ db, config }, v) => {
      const organizationId = await organizationOf(db, v);
      const c = await getConnection(db, connectionSettings(config), organizationId, connectionId(v));
      await deleteConnection(db, organizationId, c.id);
      return { json: { id: c.id, organization_id: organizationId, deleted: true }, text: `deleted SSO connection ${c.id} "${c.name}"` };
    },
  },
};
