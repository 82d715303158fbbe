import { createUser, listUsers } from '../accounts/users.js';
import { decodeCursor } from '../api/pagination.js';
import { listed, optionalString, PAGE_OPTIONS, PAGE_USAGE, required, type Command } from './shared.js';

export const userCommands: Record<string, Command> = {
  'user create': {
    usage: 'orgauth user create --email E --password P [--name N]',
    summary: 'create a user (password: at least 10 characters); the operator vouches for the address, so it counts as verified',
    options: { email: { type: 'string' }, password: { type: 'string' }, name: { type: 'string' } },
    run: async ({ db }, v) => {
      const user = await createUser(db, {
        email: required(v, 'email'),
        password: required(v, 'password'),
        name: optionalString(v, 'name'),
        emailVerified: true,
      });
      return { json: user, text: `created user ${user.id} <${user.email}>` };
    },
  },

  'user list': {
    usage: `orgauth user list ${PAGE_USAGE}`,
    summary: 'list users, in id order',
    options: PAGE_OPTIONS,
    run: async ({ db }, v) =>
      listed(
        v,
        (limit) => listUsers(db, { afterId: decodeCursor(optionalString(v, 'cursor')), limit }),
        (u) => u.id,
        (u) => ({ id: u.id, email: u.email, name: u.name, created_at: u.created_at.toISOString() }),
        [['ID', (u) => String(u.id)], ['EMAIL', (u) => u.email], ['NAME', (u) => u.name], ['CREATED', (u) => u.created_at]],
      ),
  },
};
