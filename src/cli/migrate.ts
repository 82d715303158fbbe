import type { Command } from './shared.js';

export const migrateCommands: Record<string, Command> = {
  migrate: {
    usage: 'orgauth migrate',
    summary: 'apply pending database migrations',
    options: {},
    // Opening the database migrates it; a running server migrated it when it started.
    run: async ({ applied }) => ({
      json: { applied },
      text: applied.length > 0 ? `applied ${applied.join(', ')}` : 'the database is up to date',
    }),
  },
};
