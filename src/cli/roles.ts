import { createRole, deleteRole, listRoles, updateRole } from '../accounts/roles.js';
import { roleOut } from '../api/roles.js';
import { optionalString, orgId, required, table, type Command } from './shared.js';

const splitList = (value: string) => value.split(/[\s,]+/).filter((p) => p !== '');

export const roleCommands: Record<string, Command> = {
  'role list': {
    usage: 'orgauth role list --org ID',
    summary: "list an organization's roles: the built-in ones, then its own",
    options: { org: { type: 'string' } },
    run: async ({ db }, v) => {
      const roles = (await listRoles(db, orgId(v))).map(roleOut);
      return { json: roles, text: table(['NAME', 'BUILTIN', 'PERMISSIONS'], roles.map((r) => [r.name, r.builtin ? 'yes' : 'no', r.permissions.join(' ')])) };
    },
  },

  'role create': {
    usage: 'orgauth role create --org ID --name N --permissions "contacts.read contacts.write" [--description D]',
    summary: 'create a custom role',
    options: { org: { type: 'string' }, name: { type: 'string' }, permissions: { type: 'string' }, description: { type: 'string' } },
    run: async ({ db }, v) => {
      const role = await createRole(db, orgId(v), { name: required(v, 'name'), permissions: splitList(optionalString(v, 'permissions') ?? ''), description: optionalString(v, 'description') });
      return { json: roleOut(role), text: `created role ${role.name}: ${role.permissions.join(' ') || '(no permissions)'}` };
    },
  },

  'role update': {
    usage: 'orgauth role update --org ID --role NAME [--name NEW] [--permissions "…"] [--description D]',
    summary: "rename a custom role or change its permissions; members' grants lose what it loses",
    options: { org: { type: 'string' }, role: { type: 'string' }, name: { type: 'string' }, permissions: { type: 'string' }, description: { type: 'string' } },
    run: async ({ db }, v) => {
      const permissions = optionalString(v, 'permissions');
      const role = await updateRole(db, orgId(v), required(v, 'role'), {
        name: optionalString(v, 'name'),
        description: optionalString(v, 'description'),
        permissions: permissions === undefined ? undefined : splitList(permissions),
      });
      return { json: roleOut(role), text: `role ${role.name}: ${role.permissions.join(' ') || '(no permissions)'}` };
    },
  },

  'role delete': {
    usage: 'orgauth role delete --org ID --role NAME [--move-to ROLE]',
    summary: 'delete a custom role; its members move to --move-to (a job, which the command runs unless a server takes it)',
    options: { org: { type: 'string' }, role: { type: 'string' }, 'move-to': { type: 'string' } },
    run: async ({ db }, v) => {
      const name = required(v, 'role');
      const { moved } = await deleteRole(db, orgId(v), name, { moveTo: optionalString(v, 'move-to') });
      return { json: { name, deleted: true, members_moved: moved }, text: `deleted role ${name}${moved > 0 ? `; ${moved} member(s) moved to ${optionalString(v, 'move-to')}` : ''}` };
    },
  },
};
