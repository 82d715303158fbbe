/**
 * Counts failures per key in a fixed window and refuses a key that failed too often, until the
 * window ends. In memory, per instance: enough to make guessing a secret or a password slow.
 */
export class FailureThrottle {
  private readonly failures = new Map<string, { count: number; resetAt: number }>();

  constructor(
    private readonly maxFailures: number,
    private readonly windowMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  /** Seconds until `key` may try again, or 0 when it may try now. */
  retryAfter(key: string): number {
    const entry = this.failures.get(key);
    if (!entry) return 0;
    const now = this.now();
    if (now >= entry.resetAt) {
      this.failures.delete(key);
      return 0;
    }
    return entry.count >= this.maxFailures ? Math.ceil((entry.resetAt - now) / 1000) : 0;
  }

  recordFailure(key: string): void {
    const now = this.now();
    const entry = this.failures.get(key);
    if (!entry || now >= entry.resetAt) {
      // Bound memory under a flood of distinct keys: drop expired entries first.
      if (this.failures.size >= 100_000) this.sweep(now);
      this.failures.set(key, { count: 1, resetAt: now + this.windowMs });
    } else {
      entry.count++;
    }
  }

  reset(key: string): void {
    this.failures.delete(key);
  }

  private sweep(now: number): void {
    for (const [key, entry] of this.failures) if (now >= entry.resetAt) this.failures.delete(key);
    if (this.failures.size >= 100_000) this.failures.clear();
  }
}
