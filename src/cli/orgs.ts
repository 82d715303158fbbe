import { createOrganization, listOrganizations, updateOrganization } from '../accounts/organizations.js';
import { getUserByEmail } from '../accounts/users.js';
import { decodeCursor } from '../api/pagination.js';
import { listed, optionalString, orgId, PAGE_OPTIONS, PAGE_USAGE, required, type Command, yesNo } from './shared.js';

const orgOut = (o: { id: number; name: string; require_mfa: boolean; created_at: Date }) => ({ id: o.id, name: o.name, require_mfa: o.require_mfa, created_at: o.created_at.toISOString() });

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

  'org update': {
    usage: 'orgauth org update --org ID [--name N] [--require-mfa yes|no]',
    summary: "rename an organization, or turn on or off its two-step sign-in requirement (members then reach it only after two factors)",
    options: { org: { type: 'string' }, name: { type: 'string' }, 'require-mfa': { type: 'string' } },
    run: async ({ db }, v) => {
      const org = await updateOrganization(db, orgId(v), { name: optionalString(v, 'name'), requireMfa: yesNo(v, 'require-mfa') });
      return { json: orgOut(org), text: `organization ${org.id} "${org.name}": two-step sign-in ${org.require_mfa ? 'required' : 'not required'}` };
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
        orgOut,
        [['ID', (o) => String(o.id)], ['NAME', (o) => o.name], ['REQUIRE MFA', (o) => (o.require_mfa ? 'yes' : 'no')], ['CREATED', (o) => o.created_at]],
      ),
  },
};
