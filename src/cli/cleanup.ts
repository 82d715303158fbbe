import { deleteExpired } from '../retention.js';
import { count, type Command } from './shared.js';

const words = (table: string) => table.replaceAll('_', ' ');

export const cleanupCommands: Record<string, Command> = {
  cleanup: {
    usage: 'orgauth cleanup',
    summary: 'delete expired codes, refresh tokens, access-token revocations, sessions, email links, old invitations, sent emails and self-registered clients that never obtained a token now (the server does it every CLEANUP_INTERVAL seconds)',
    options: {},
    run: async ({ db, config, progress }) => {
      // An error on the way clears the line too (runCli ends every progress before output).
      const shown = progress('cleanup');
      const deleted = await deleteExpired(db, {
        unusedClientTtl: config.clientRegistration.unusedClientTtl,
        onProgress: ({ table, step, of, deleted: sofar }) => {
          const all = Object.values(sofar).reduce((sum, n) => sum + n, 0);
          shown.update(`${words(table)} (${step}/${of}): ${count(sofar[table] ?? 0)} deleted, ${count(all)} in all`);
        },
      });
      shown.done();
      return { json: { deleted }, text: `deleted ${Object.entries(deleted).map(([table, n]) => `${n} ${words(table)}`).join(', ')}` };
    },
  },
};
