import { formatDemoBanner, seedDemo } from '../demo.js';
import type { Command } from './shared.js';

export const seedDemoCommands: Record<string, Command> = {
  'seed-demo': {
    usage: 'orgauth seed-demo',
    summary: 'create the demo user, organization and applications; prints their secrets once',
    options: {},
    run: async ({ db, config, progress }) => {
      const shown = progress('seeding the demo');
      const seed = await seedDemo(db, { onProgress: (step, of, what) => shown.update(`step ${step} of ${of}, ${what}`) });
      shown.done();
      return { json: seed, text: formatDemoBanner(seed, config.issuer) };
    },
  },
};
