import { deleteExpired } from '../retention.js';
import type { Command } from './shared.js';

export const cleanupCommands: Record<string, Command> = {
  cleanup: {
    usage: 'orgauth cleanup',
    summary: 'delete expired codes, refresh tokens, access-token revocations, sessions, email links, old invitations and sent emails now (the server does it every CLEANUP_INTERVAL seconds)',
    options: {},
    run: async ({ db }) => {
      const deleted = await deleteExpired(db);
      return { json: { deleted }, text: `deleted ${Object.entries(deleted).map(([table, n]) => `${n} ${table.replaceAll('_', ' ')}`).join(', ')}` };
    },
  },
};
