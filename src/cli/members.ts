import { addMember, changeMemberRole, listMembers, removeMember } from '../accounts/organizations.js';
import { requireRole } from '../accounts/roles.js';
import { getUserByEmail } from '../accounts/users.js';
import { memberOut } from '../api/members.js';
import { decodeCursor } from '../api/pagination.js';
import type { DB } from '../db/connect.js';
import { listed, optionalString, orgId, PAGE_OPTIONS, PAGE_USAGE, required, type Command, type Values } from './shared.js';

/** --role: a built-in role or one of the organization's own, by name. */
const cliRole = (db: DB, organizationId: number, name: string) => requireRole(db, organizationId, name, '--role');

async function memberByEmail(db: DB, values: Values) {
  const organizationId = orgId(values);
  const user = await getUserByEmail(db, required(values, 'email'));
  return { organizationId, user };
}

export const memberCommands: Record<string, Command> = {
  'member add': {
    usage: 'orgauth member add --org ID --email E [--role owner|admin|member|viewer|<custom role>]',
    summary: 'add an existing user to an organization (role member by default)',
    options: { org: { type: 'string' }, email: { type: 'string' }, role: { type: 'string' } },
    run: async ({ db }, v) => {
      const { organizationId, user } = await memberByEmail(db, v);
      const role = await cliRole(db, organizationId, optionalString(v, 'role') ?? 'member');
      const m = await addMember(db, { organizationId, userId: user.id, role });
      return { json: m, text: `added ${user.email} to organization ${m.organization_id} as ${m.role}` };
    },
  },

  'member list': {
    usage: `orgauth member list --org ID ${PAGE_USAGE}`,
    summary: "list an organization's members, in user id order",
    options: { org: { type: 'string' }, ...PAGE_OPTIONS },
    run: async ({ db }, v) => {
      const organizationId = orgId(v);
      return listed(
        v,
        (limit) => listMembers(db, organizationId, { afterUserId: decodeCursor(optionalString(v, 'cursor')), limit }),
        (m) => m.user_id,
        memberOut,
        [['USER', (m) => String(m.user_id)], ['EMAIL', (m) => m.email], ['NAME', (m) => m.name], ['ROLE', (m) => m.role], ['JOINED', (m) => m.created_at]],
      );
    },
  },

  'member set-role': {
    usage: 'orgauth member set-role --org ID --email E --role owner|admin|member|viewer|<custom role>',
    summary: "change a member's role (the last owner cannot be demoted)",
    options: { org: { type: 'string' }, email: { type: 'string' }, role: { type: 'string' } },
    run: async ({ db }, v) => {
      const { organizationId, user } = await memberByEmail(db, v);
      const role = await cliRole(db, organizationId, required(v, 'role'));
      const m = await changeMemberRole(db, { organizationId, userId: user.id, role });
      return { json: m, text: `${user.email} is now ${m.role} of organization ${organizationId}` };
    },
  },

  'member remove': {
    usage: 'orgauth member remove --org ID --email E',
    summary: 'remove a member and revoke the grants they gave there (the last owner cannot be removed)',
    options: { org: { type: 'string' }, email: { type: 'string' } },
    run: async ({ db }, v) => {
      const { organizationId, user } = await memberByEmail(db, v);
      await removeMember(db, { organizationId, userId: user.id });
      return { json: { organization_id: organizationId, user_id: user.id, removed: true }, text: `removed ${user.email} from organization ${organizationId}` };
    },
  },
};
