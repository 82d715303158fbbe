import { defineConfig } from 'vitest/config';
import FileDurations from './test/durations-reporter.js';
import LongestFirst from './test/sequencer.js';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // Migrates one template database per run; each file's database is a copy (test/helpers/db.ts).
    globalSetup: ['test/global-setup.ts'],
    setupFiles: ['test/setup.ts'],
    // Each file opens its own database; PGlite and argon2 are CPU-heavy on 2 cores.
    pool: 'forks',
    maxWorkers: 2,
    // Files share their worker's module graph instead of importing it again each (fastify, jose,
    // PGlite, … took over a fifth of the run): every file makes its own database, app and
    // servers, and test/setup.ts puts back timers, mocks and stubbed env after each file.
    isolate: false,
    sequence: { sequencer: LongestFirst },
    // TEST_REPORT=<file>.json: also a JSON report, and each file's whole time (hooks included) in
    // <file>.files.json, for scripts/test-durations.mjs.
    ...(process.env.TEST_REPORT
      ? { reporters: ['default', 'json', new FileDurations(process.env.TEST_REPORT.replace(/\.json$/, '') + '.files.json')], outputFile: { json: process.env.TEST_REPORT } }
      : {}),
    testTimeout: 30_000,
    hookTimeout: 60_000,
  },
});
