import { resetSecondFactors } from '../accounts/second-factors.js';
import { createUser, getUserByEmail, listUsers } from '../accounts/users.js';
import { queueMail } from '../mail/outbox.js';
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

  'user reset-mfa': {
    usage: 'orgauth user reset-mfa --email E',
    summary: "account recovery: remove a user's second factors (authenticator app, recovery codes, passkeys); recorded on the account and mailed to the user",
    options: { email: { type: 'string' } },
    run: async ({ db, config }, v) => {
      const user = await getUserByEmail(db, required(v, 'email'));
      // The notice is queued; the server's outbox sends it (this process sends nothing).
      const mail = { queue: (trx: typeof db, message: Parameters<typeof queueMail>[2]) => queueMail(trx, config.secretKey, message), wake: () => {} };
      const removed = await resetSecondFactors(db, { issuer: config.issuer, mail }, user);
      return {
        json: { user_id: user.id, email: user.email, totp: removed.totp, recovery_codes: removed.recoveryCodes, passkeys: removed.passkeys },
        text: `removed the second factors of ${user.email}: ${removed.totp ? 'authenticator app, ' : ''}${removed.recoveryCodes} recovery codes, ${removed.passkeys} passkeys`,
      };
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
