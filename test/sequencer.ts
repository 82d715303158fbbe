/**
 * Runs the slowest files first, so the two workers finish together instead of one waiting on a
 * long file picked last. Durations come from test/durations.json (seconds per file and back-end,
 * written by scripts/test-durations.mjs from a run's JSON report); a file not listed there (a new
 * one) counts as the median of the listed ones.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { BaseSequencer, type TestSpecification } from 'vitest/node';

type Durations = Record<'postgres' | 'pglite', Record<string, number>>;

function load(root: string): Durations {
  try {
    return JSON.parse(readFileSync(path.join(root, 'test/durations.json'), 'utf8')) as Durations;
  } catch {
    return { postgres: {}, pglite: {} };
  }
}

export default class LongestFirst extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const root = this.ctx.config.root;
    const durations = load(root)[process.env.TEST_DATABASE_URL ? 'postgres' : 'pglite'] ?? {};
    const listed = Object.values(durations).sort((a, b) => a - b);
    const median = listed[Math.floor(listed.length / 2)] ?? 0;
    const seconds = (file: TestSpecification) => durations[path.relative(root, file.moduleId)] ?? median;
    return [...files].sort((a, b) => seconds(b) - seconds(a) || a.moduleId.localeCompare(b.moduleId));
  }
}
