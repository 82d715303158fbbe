#!/usr/bin/env node
// Writes test/durations.json (read by test/sequencer.ts) from the per-file times of two runs:
//   TEST_REPORT=/tmp/pg.json TEST_DATABASE_URL=... npm test     (also writes /tmp/pg.files.json)
//   TEST_REPORT=/tmp/lite.json npm test
//   node scripts/test-durations.mjs postgres=/tmp/pg.files.json pglite=/tmp/lite.files.json
// Each file's whole time in its worker, hooks included (test/durations-reporter.ts); a vitest JSON
// report (`testResults`) is read too, but times only the tests. A back-end not given keeps its
// current numbers. Seconds per file, rounded to 0.1.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), '..');
const out = path.join(root, 'test/durations.json');
const durations = existsSync(out) ? JSON.parse(readFileSync(out, 'utf8')) : { postgres: {}, pglite: {} };
for (const arg of process.argv.slice(2)) {
  const [backend, file] = arg.split('=');
  if (!['postgres', 'pglite'].includes(backend) || !file) throw new Error(`usage: postgres=<report.json> pglite=<report.json> (got ${arg})`);
  const report = JSON.parse(readFileSync(file, 'utf8'));
  const files = report.files ?? {};
  for (const result of report.testResults ?? []) {
    files[path.relative(root, result.name)] = Math.round((result.endTime - result.startTime) / 100) / 10;
  }
  durations[backend] = Object.fromEntries(Object.entries(files).sort(([, a], [, b]) => b - a));
}
writeFileSync(out, `${JSON.stringify(durations, null, 2)}\n`);
console.log(`wrote ${path.relative(process.cwd(), out)}`);
