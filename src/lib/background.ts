/**
 * Work a request starts but does not wait for (it answers first, so its timing tells nothing
 * about what the work found). Failures are logged; `drain()` waits for what is still running,
 * so a closing app finishes it.
 */
import type { FastifyBaseLogger } from 'fastify';

export class BackgroundTasks {
  private readonly running = new Set<Promise<void>>();

  constructor(private readonly logger: Pick<FastifyBaseLogger, 'error'>) {}

  run(name: string, task: () => Promise<unknown>): void {
    const promise: Promise<void> = Promise.resolve()
      .then(task)
      .then(
        () => {},
        (err: unknown) => this.logger.error({ err, task: name }, 'background task failed'),
      )
      .finally(() => this.running.delete(promise));
    this.running.add(promise);
  }

  async drain(): Promise<void> {
    while (this.running.size > 0) await Promise.all(this.running);
  }
}
