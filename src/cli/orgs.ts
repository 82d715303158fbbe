import { createOrganization, listOrganizations } from '../accounts/organizations.js';
import { getUserByEmail } from '../accounts/users.js';
import { decodeCursor } from '../api/pagination.js';
import { listed, optionalString, PAGE_OPTIONS, PAGE_USAGE, required, type Command } from './shared.js';

export const orgCommands: Record<string, Command> = {
  'org create': {
    usage: 'orgauth org create --name N --owner EMAIL',
    summary: 'create an organization owned by an existing user',
    options: { name: { type: 'string' }, owner: { type: 'string' } },
    run: async ({ db }, v) => {
      const owner = await getUserByEmail(db, required(v, 'owner'));
      const org = await createOrganization(db, { name: required(v, 'name'), ownerUserId: owner.id });
      return { json: org, text: `created organization ${org.id} "${org.name}" owned by ${owner.email}` };
    },
  },

  'org list': {
    usage: `orgauth org list ${PAGE_USAGE}`,
    summary: 'list organizations, in id order',
    options: PAGE_OPTIONS,
    run: async ({ db }, v) =>
      listed(
        v,
        (limit) => listOrganizations(db, { afterId: decodeCursor(optionalString(v, 'cursor')), limit }),
        (o) => o.id,
        (o) => ({ id: o.id, name: o.name, created_at: o.created_at.toISOString() }),
        [['ID', (o) => String(o.id)], ['NAME', (o) => o.name], ['CREATED', (o) => o.created_at]],
      ),
  },
};
