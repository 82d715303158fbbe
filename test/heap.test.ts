/**
 * limitHeapGrowth() (src/runtime.ts): the server's heap stays near twice its live size under a
 * load that keeps promoting short-lived objects, where V8's default lets it reach about four times.
 */
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT } from './helpers/process.js';

/**
 * A child that holds about 25 MB live and churns objects that live long enough to be promoted
 * (a ring of 100,000), then prints whether limitHeapGrowth applied and its peak heap size in MB
 * ('decide': whether it applies, without the load).
 */
const CHURN = `
const { limitHeapGrowth } = await import('./dist/src/runtime.js');
const applied = process.argv[1] === 'default' ? false : limitHeapGrowth();
if (process.argv[1] === 'decide') {
  process.stdout.write(JSON.stringify({ applied, peakMb: 0 }));
  process.exit(0);
}
const live = Array.from({ length: 200_000 }, (_, i) => ({ i, s: 'x'.repeat(50) + i }));
const ring = new Array(100_000);
let peak = 0;
for (let n = 0; n < 3_000_000; n++) {
  ring[n % ring.length] = { n, a: [n, n + 1, n + 2], s: 'y' + n };
  if (n % 10_000 === 0) peak = Math.max(peak, process.memoryUsage().heapTotal);
}
if (live.length !== 200_000) throw new Error('the live set must stay live');
process.stdout.write(JSON.stringify({ applied, peakMb: Math.round(peak / 1e6) }));
`;

function run(mode: 'limited' | 'default' | 'decide', execArgv: string[]): { applied: boolean; peakMb: number } {
  const result = spawnSync(process.execPath, [...execArgv, '--input-type=module', '-e', CHURN, mode], { cwd: ROOT, encoding: 'utf8' });
  if (result.status !== 0) throw new Error(result.stderr);
  return JSON.parse(result.stdout);
}

/** The heap limit of a host with 4 GB or more, where V8 lets old space grow up to 4x live. */
const LARGE = '--max-old-space-size=4096';

describe('the server’s heap growth', () => {
  it('keeps the peak heap well under what V8’s default allows', () => {
    const limited = run('limited', [LARGE]);
    const unlimited = run('default', [LARGE]);
    expect(limited.applied).toBe(true);
    expect(limited.peakMb).toBeLessThan(unlimited.peakMb * 0.75);
  });

  it('leaves an operator’s own --heap-growing-percent alone', () => {
    expect(run('decide', [LARGE, '--heap-growing-percent=300']).applied).toBe(false);
  });

  it('leaves V8 alone with a heap limit under 2 GB, where its own factor is already 2 or less', () => {
    expect(run('decide', ['--max-old-space-size=1024']).applied).toBe(false);
  });
});

describe('the bundle’s sources in the heap', () => {
  // V8 keeps a module's source for lazy compilation, one byte a character only when every
  // character fits in one: a single '—' left in a bundled package's comment doubled the 2.5 MB
  // that file holds (scripts/build.mjs, asciiComments).
  it('writes every file a process starts from in ASCII', () => {
    const folder = path.join(ROOT, 'dist/bundle');
    const files = readdirSync(folder).filter((f) => f.endsWith('.js'));
    expect(files).toContain('server.js');
    for (const file of files) {
      const text = readFileSync(path.join(folder, file), 'utf8');
      expect({ file, outside: text.match(/[^\x00-\x7f]/)?.[0] }).toEqual({ file, outside: undefined });
    }
  });
});
