/**
 * Runs `fn` with this process's Date (jose's clock, the server's and, on the embedded database,
 * the database's) at `ms` since the epoch, still; Date goes back to the real one afterwards.
 * For a token's expiry, where waiting for it would be a timed test.
 */
import { vi } from 'vitest';

export async function atTime<T>(ms: number, fn: () => Promise<T>): Promise<T> {
  const RealDate = Date;
  vi.stubGlobal(
    'Date',
    class extends RealDate {
      constructor(...args: unknown[]) {
        super(...((args.length === 0 ? [ms] : args) as [string]));
      }
      static override now(): number {
        return ms;
      }
    },
  );
  try {
    return await fn();
  } finally {
    vi.unstubAllGlobals();
  }
}
