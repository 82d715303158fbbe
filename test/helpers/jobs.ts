/**
 * Finishes every queued or running job: runs each here (claiming it when due) or waits while an
 * app's own runner holds it. What a test does after a change that queues one (an application
 * disabled, a role narrowed) before it looks at the grants.
 */
import type { DB } from '../../src/db/connect.js';
import { jobHandlers } from '../../src/jobs/handlers.js';
import { JobRunner } from '../../src/jobs/queue.js';

const quiet = { info: () => {}, warn: () => {}, error: () => {} };

export async function finishJobs(db: DB): Promise<void> {
  const runner = new JobRunner(db, { handlers: jobHandlers(), logger: quiet });
  for (;;) {
    const open = await db.selectFrom('jobs').select('id').where('state', 'in', ['queued', 'running']).orderBy('id').execute();
    if (open.length === 0) return;
    for (const { id } of open) {
      const job = await runner.runToEnd(id, { timeoutMs: 60_000 });
      if (job.state !== 'succeeded') throw new Error(`job ${id} (${job.kind}) ended ${job.state}: ${job.last_error ?? ''}`);
    }
  }
}
