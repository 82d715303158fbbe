import { formatDemoBanner, seedDemo } from '../demo.js';
import type { Command } from './shared.js';

export const seedDemoCommands: Record<string, Command> = {
  'seed-demo': {
    usage: 'orgauth seed-demo',
    summary: 'create the demo user, organization and applications; prints their secrets once',
    options: {},
    run: async ({ db, config }) => {
      const seed = await seedDemo(db);
      return { json: seed, text: formatDemoBanner(seed, config.issuer) };
    },
  },
};
