/**
 * limitHeapGrowth() (src/runtime.ts): the server's heap stays near twice its live size under a
 * load that keeps promoting short-lived objects, where V8's default lets it reach about four times.
 */
import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { ROOT } from './helpers/process.js';

/**
 * A child that holds about 25 MB live and churns objects that live long enough to be promoted
 * (a ring of 100,000), then prints its peak heap size in MB.
 */
const CHURN = `
const { limitHeapGrowth } = await import('./dist/src/runtime.js');
if (process.argv[1] === 'limited') limitHeapGrowth();
const live = Array.from({ length: 200_000 }, (_, i) => ({ i, s: 'x'.repeat(50) + i }));
const ring = new Array(100_000);
let peak = 0;
for (let n = 0; n < 3_000_000; n++) {
  ring[n % ring.length] = { n, a: [n, n + 1, n + 2], s: 'y' + n };
  if (n % 10_000 === 0) peak = Math.max(peak, process.memoryUsage().heapTotal);
}
if (live.length !== 200_000) throw new Error('the live set must stay live');
process.stdout.write(String(Math.round(peak / 1e6)));
`;

function peakHeapMb(mode: 'limited' | 'default', execArgv: string[] = []): number {
  const result = spawnSync(process.execPath, [...execArgv, '--input-type=module', '-e', CHURN, mode], { cwd: ROOT, encoding: 'utf8' });
  if (result.status !== 0) throw new Error(result.stderr);
  return Number(result.stdout);
}

describe('the server’s heap growth', () => {
  it('keeps the peak heap well under what V8’s default allows', () => {
    const limited = peakHeapMb('limited');
    const unlimited = peakHeapMb('default');
    expect(limited).toBeLessThan(unlimited * 0.75);
  });

  it('leaves an operator’s own --heap-growing-percent alone', () => {
    const operator = peakHeapMb('limited', ['--heap-growing-percent=300']);
    expect(operator).toBeGreaterThan(peakHeapMb('limited') / 0.75);
  });
});
