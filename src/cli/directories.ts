/**
 * `orgauth directory ...`: an organization's SCIM directories (src/directory/directories.ts).
 * The token is printed only by `create` and `rotate-token`. Group mappings are given as
 * `--map-group "GROUP=ROLE"`, repeated; on `update` they replace the mappings whole
 * (`--no-group-roles` removes them all). The operator acts (no actor in the audit log), as with
 * every command. With --json each prints what the API answers for the same operation.
 */
import { getOrganization } from '../accounts/organizations.js';
import { directoryOut } from '../api/directories.js';
import type { DB } from '../db/connect.js';
import {
  createDirectory,
  deleteDirectory,
  type DirectoryView,
  getDirectory,
  listDirectories,
  rotateDirectoryToken,
  updateDirectory,
} from '../directory/directories.js';
import { scimBaseUrl } from '../directory/base-url.js';
import { parseCanonicalId } from '../oauth/helpers/params.js';
import { optionalString, orgId, repeated, required, table, type Command, UsageError, type Values } from './shared.js';

async function organizationOf(db: DB, values: Values): Promise<number> {
  return (await getOrganization(db, orgId(values))).id;
}

function idOf(values: Values): number {
  const id = parseCanonicalId(required(values, 'id'));
  if (id === undefined) throw new UsageError('--id must be a positive integer');
  return id;
}

/** --map-group "GROUP=ROLE", repeated: the last `=` separates them (a group's name may hold one). */
function groupRolesOf(values: Values): { group: string; role: string }[] {
  return repeated(values, 'map-group').map((text) => {
    const at = text.lastIndexOf('=');
    if (at <= 0 || at === text.length - 1) throw new UsageError(`--map-group takes "GROUP=ROLE" (got ${JSON.stringify(text)})`);
    return { group: text.slice(0, at), role: text.slice(at + 1) };
  });
}

function describe(issuer: string, d: DirectoryView): string {
  return [
    `id:           ${d.id}`,
    `name:         ${d.name}`,
    `base_url:     ${scimBaseUrl(issuer, d.id)}`,
    `state:        ${d.state}`,
    `default_role: ${d.default_role}`,
    `group_roles:  ${d.group_roles.length === 0 ? '(none)' : d.group_roles.map((g) => `${g.group}=${g.role}`).join(', ')}`,
    `token made:   ${d.token_created_at.toISOString()}`,
  ].join('\n');
}

function withToken(issuer: string, d: DirectoryView, token: string, what: string): { json: object; text: string } {
  return {
    json: { ...directoryOut(issuer, d), token },
    text: [what, describe(issuer, d), `token:        ${token}`, '(the token is shown only now: give it to the SCIM client, which sends it as a bearer token)'].join('\n'),
  };
}

const ORG_ID = { org: { type: 'string' }, id: { type: 'string' } } as const;

export const directoryCommands: Record<string, Command> = {
  'directory create': {
    usage: 'orgauth directory create --org ID --name N [--default-role admin|member|viewer] [--map-group "GROUP=ROLE"]...',
    summary: 'make a SCIM directory for an organization; prints its token, once',
    options: { org: { type: 'string' }, name: { type: 'string' }, 'default-role': { type: 'string' }, 'map-group': { type: 'string', multiple: true } },
    run: async ({ db, config }, v) => {
      const organizationId = await organizationOf(db, v);
      const defaultRole = optionalString(v, 'default-role');
      const { directory, token } = await createDirectory(db, organizationId, {
        name: required(v, 'name'),
        ...(defaultRole !== undefined ? { default_role: defaultRole } : {}),
        group_roles: groupRolesOf(v),
      });
      return withToken(config.issuer, directory, token, `created directory ${directory.id} for organization ${organizationId}`);
    },
  },

  'directory list': {
    usage: 'orgauth directory list --org ID',
    summary: "list an organization's SCIM directories",
    options: { org: { type: 'string' } },
    run: async ({ db, config }, v) => {
      const directories = await listDirectories(db, await organizationOf(db, v));
      return {
        json: { data: directories.map((d) => directoryOut(config.issuer, d)) },
        text:
          directories.length === 0
            ? '(none)'
            : table(['ID', 'NAME', 'STATE', 'DEFAULT_ROLE', 'GROUP_ROLES'], directories.map((d) => [String(d.id), d.name, d.state, d.default_role, String(d.group_roles.length)])),
      };
    },
  },

  'directory show': {
    usage: 'orgauth directory show --org ID --id D',
    summary: 'show a SCIM directory and its group mappings (never its token)',
    options: { ...ORG_ID },
    run: async ({ db, config }, v) => {
      const d = await getDirectory(db, await organizationOf(db, v), idOf(v));
      return { json: directoryOut(config.issuer, d), text: describe(config.issuer, d) };
    },
  },

  'directory update': {
    usage: 'orgauth directory update --org ID --id D [--name N] [--state active|disabled] [--default-role ROLE] [--map-group "GROUP=ROLE"]... [--no-group-roles]',
    summary: 'change a SCIM directory; --map-group replaces the group mappings whole, --no-group-roles removes them',
    options: { ...ORG_ID, name: { type: 'string' }, state: { type: 'string' }, 'default-role': { type: 'string' }, 'map-group': { type: 'string', multiple: true }, 'no-group-roles': { type: 'boolean' } },
    run: async ({ db, config }, v) => {
      const organizationId = await organizationOf(db, v);
      const groupRoles = groupRolesOf(v);
      const clear = v['no-group-roles'] === true;
      if (clear && groupRoles.length > 0) throw new UsageError('--no-group-roles and --map-group exclude each other');
      const name = optionalString(v, 'name');
      const state = optionalString(v, 'state');
      const defaultRole = optionalString(v, 'default-role');
      const d = await updateDirectory(db, organizationId, idOf(v), {
        ...(name !== undefined ? { name } : {}),
        ...(state !== undefined ? { state } : {}),
        ...(defaultRole !== undefined ? { default_role: defaultRole } : {}),
        ...(groupRoles.length > 0 || clear ? { group_roles: groupRoles } : {}),
      });
      return { json: directoryOut(config.issuer, d), text: `updated directory ${d.id}\n${describe(config.issuer, d)}` };
    },
  },

  'directory rotate-token': {
    usage: 'orgauth directory rotate-token --org ID --id D',
    summary: "replace a SCIM directory's token: the old one is refused at once; prints the new one, once",
    options: { ...ORG_ID },
    run: async ({ db, config }, v) => {
      const { directory, token } = await rotateDirectoryToken(db, await organizationOf(db, v), idOf(v));
      return withToken(config.issuer, directory, token, `rotated the token of directory ${directory.id}; the old one no longer works`);
    },
  },

  'directory delete': {
    usage: 'orgauth directory delete --org ID --id D',
    summary: 'delete a SCIM directory; its token stops with it',
    options: { ...ORG_ID },
    run: async ({ db }, v) => {
      const organizationId = await organizationOf(db, v);
      const id = idOf(v);
      await deleteDirectory(db, organizationId, id);
      return { json: { organization_id: organizationId, id, deleted: true }, text: `deleted directory ${id}` };
    },
  },
};
