/**
 * With TEST_REPORT=<file>.json, also writes <file>.files.json: each test file's time in its worker,
 * in seconds — its tests and its hooks (vitest's report times the tests only, so a file that builds a large database in beforeAll looked like a short one and was put
 * last, leaving the other worker idle meanwhile). Importing is left out: the first file of a
 * worker imports the modules every later one shares (isolate: false). scripts/test-durations.mjs turns it into
 * test/durations.json for test/sequencer.ts.
 */
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import type { Reporter, TestModule } from 'vitest/node';

export default class FileDurations implements Reporter {
  constructor(private readonly out: string) {}

  onTestRunEnd(modules: ReadonlyArray<TestModule>): void {
    const files: Record<string, number> = {};
    for (const module of modules) {
      const d = module.diagnostic();
      files[path.relative(module.project.config.root, module.moduleId)] = Math.round((d.setupDuration + d.duration) / 100) / 10;
    }
    writeFileSync(this.out, `${JSON.stringify({ files }, null, 2)}\n`);
  }
}
