import { deleteExpired } from '../retention.js';
import type { Command } from './shared.js';

export const cleanupCommands: Record<string, Command> = {
  cleanup: {
    usage: 'orgauth cleanup',
    summary: 'delete expired codes, refresh tokens, access-token revocations, sessions, email links, old invitations, sent emails and self-registered clients that never obtained a token now (the server does it every CLEANUP_INTERVAL seconds)',
    options: {},
    run: async ({ db, config }) => {
      const deleted = await deleteExpired(db, { unusedClientTtl: config.clientRegistration.unusedClientTtl });
      return { json: { deleted }, text: `deleted ${Object.entries(deleted).map(([table, n]) => `${n} ${table.replaceAll('_', ' ')}`).join(', ')}` };
    },
  },
};
