/**
 * Durable jobs: long work a request starts and answers before it is done (revoking a million
 * grants of a disabled application, narrowing the grants of every member of a role), finished
 * in the background by any instance, and resumed by another instance (or the next start) when the
 * one running it dies.
 *
 * Why not pg-boss or graphile-worker: both open their own `pg` connections from a connection
 * string (and graphile-worker LISTENs on one of them), so neither runs on the embedded PGlite
 * database, which has a single in-process connection that Kysely already holds. The mechanism is
 * the mail outbox's (src/mail/outbox.ts), generalised, on one table:
 *
 * - `enqueueJob(trx, ...)` inserts the job in the caller's transaction, so the job exists
 *   exactly when the change that needs it does (an application disabled and the revocation of
 *   its grants commit together or not at all), and NOTIFYs `orgauth_jobs` on commit.
 * - An instance claims a due job with `FOR UPDATE SKIP LOCKED` (two never claim the same one),
 *   moving it to running with a lease (due_at = now + LEASE_S) and `attempts + 1`: the attempt
 *   number names the lease's owner.
 * - The work is done in steps, each a bounded batch (300 grants) in a transaction of its own
 *   that first locks the job row *as claimed* (same attempts, still running): a step of an
 *   instance whose lease was taken over finds nothing and stops, so two instances never run the
 *   same job at once. The step's work, the job's cursor and progress, and the renewed lease
 *   commit together, so a crash between steps neither repeats nor skips one (no grant revoked
 *   twice, none left out), and a crash inside a step rolls the step back whole.
 * - An instance that dies leaves its lease to run out (LEASE_S); then any instance claims the
 *   job again and resumes from the cursor. One that stops gracefully hands the job back at once.
 * - A step that throws puts the job back in the queue after a backoff (5 s, 10 s, 20 s … up to
 *   10 min), with the error kept in last_error; after MAX_FAILURES runs that failed it is marked
 *   failed and logged at error (hand-backs and takeovers are not failures). An instance claims
 *   only the kinds it has handlers for: one of an older version, mid-deploy, leaves newer kinds
 *   to the others. Operators see all of it: `orgauth job list|show`, and the metrics
 *   orgauth_jobs_total, orgauth_jobs_items_total, orgauth_jobs_running, orgauth_jobs_waiting.
 */
import { hostname } from 'node:os';
import { randomBytes } from 'node:crypto';
import { sql, type Transaction } from 'kysely';
import type { Logger } from 'pino';
import type { DB, Listen } from '../db/connect.js';
import type { Database, JobState } from '../db/schema.js';
import type { Metrics } from '../metrics.js';
import { describeError } from '../lib/errno.js';

export const JOB_CHANNEL = 'orgauth_jobs';
/** A running job's lease: renewed by every step (a step takes well under a second). */
export const LEASE_S = 15;
const POLL_MS = 1000;
const MAX_FAILURES = 10;
const MAX_BACKOFF_S = 600;
/** How long stop() waits for the step in progress; the lease is handed back after it. */
const STOP_WAIT_MS = 3000;

/** A job as a step sees it. */
export interface JobView<P> {
  id: number;
  kind: string;
  organizationId: number | null;
  payload: P;
}

/** What a step did: the cursor to resume from, how many items it processed, and whether the job is done. */
export interface StepResult<C> {
  cursor: C | null;
  processed: number;
  finished: boolean;
  /** How many items the whole job has, when the step learnt it (shown as progress). */
  total?: number | undefined;
  /** Runs once the step has committed: telling this instance's caches (the revoked set). */
  afterCommit?: (() => void) | undefined;
}

/**
 * One kind of job: `step` does one bounded batch of the work in `trx` (and must use nothing
 * but `trx`: on the embedded database another query would wait for the transaction forever).
 */
export interface JobHandler<P = never, C = never> {
  kind: string;
  step(trx: Transaction<Database>, job: JobView<P>, cursor: C | null): Promise<StepResult<C>>;
}

/** Queues a job in the caller's transaction (or on its own); returns its id. Instances hear of it on commit. */
export async function enqueueJob(db: DB, job: { kind: string; organizationId: number | null; payload: Record<string, unknown> }): Promise<number> {
  const row = await db
    .insertInto('jobs')
    .values({ kind: job.kind, organization_id: job.organizationId, payload: JSON.stringify(job.payload), cursor: null })
    .returning('id')
    .executeTakeFirstOrThrow();
  await sql`select pg_notify(${JOB_CHANNEL}, ${String(row.id)})`.execute(db);
  return row.id;
}

/** Where a job is, as `orgauth job show` prints it: its state and items done (of total, once a step learnt it). */
export interface JobProgress {
  state: JobState;
  done: number;
  total: number | null;
}

export interface JobRow {
  id: number;
  kind: string;
  organization_id: number | null;
  state: JobState;
  progress_done: number;
  progress_total: number | null;
  attempts: number;
  failures: number;
  due_at: Date;
  instance: string | null;
  last_error: string | null;
  created_at: Date;
  started_at: Date | null;
  updated_at: Date;
  finished_at: Date | null;
  payload: Record<string, unknown>;
}

const JOB_COLUMNS = [
  'id',
  'kind',
  'organization_id',
  'state',
  'progress_done',
  'progress_total',
  'attempts',
  'failures',
  'due_at',
  'instance',
  'last_error',
  'created_at',
  'started_at',
  'updated_at',
  'finished_at',
  'payload',
] as const;

/** Jobs newest first, a page at a time (keyset on the primary key), optionally of one state. */
export async function listJobs(db: DB, page: { beforeId?: number | undefined; limit: number; state?: JobState | undefined; organizationId?: number | undefined }): Promise<JobRow[]> {
  return (await db
    .selectFrom('jobs')
    .select(JOB_COLUMNS)
    .$if(page.state !== undefined, (qb) => qb.where('state', '=', page.state!))
    .$if(page.organizationId !== undefined, (qb) => qb.where('organization_id', '=', page.organizationId!))
    .$if(page.beforeId !== undefined, (qb) => qb.where('id', '<', page.beforeId!))
    .orderBy('id', 'desc')
    .limit(page.limit)
    .execute()) as JobRow[];
}

export async function findJob(db: DB, id: number): Promise<JobRow | undefined> {
  return (await db.selectFrom('jobs').select(JOB_COLUMNS).where('id', '=', id).executeTakeFirst()) as JobRow | undefined;
}

/** Seconds before the next run of a job whose runs failed `failures` times. */
export function jobRetryDelaySeconds(failures: number): number {
  return Math.min(MAX_BACKOFF_S, 5 * 2 ** Math.max(0, Math.min(failures - 1, 20)));
}

interface Claimed {
  id: number;
  kind: string;
  organization_id: number | null;
  payload: unknown;
  cursor: unknown;
  attempts: number;
  failures: number;
}

/** How one run of a job ended. */
type RunOutcome = 'succeeded' | 'lost' | 'stopped' | 'retry' | 'failed';

/**
 * Runs the jobs of every instance's queue: `workers` at a time on this instance. Wakes on
 * NOTIFY (a job queued anywhere), on `wake()` (one queued here) and every POLL_MS (a lease run
 * out, a retry come due, a NOTIFY missed).
 */
export class JobRunner {
  private readonly handlers = new Map<string, JobHandler<unknown, unknown>>();
  readonly instance = `${hostname()}:${process.pid}:${randomBytes(3).toString('hex')}`;
  private timer: NodeJS.Timeout | undefined;
  private unlisten: (() => Promise<void>) | undefined;
  private readonly running = new Set<Promise<void>>();
  private stopped = false;
  private again = false;

  constructor(
    private readonly db: DB,
    private readonly options: {
      handlers: readonly JobHandler<any, any>[];
      logger: Pick<Logger, 'info' | 'warn' | 'error'>;
      metrics?: Metrics | undefined;
      listen?: Listen | undefined;
      /** Jobs run at once on this instance (1 on the embedded database: its one connection serializes them anyway). */
      workers?: number;
    },
  ) {
    for (const handler of options.handlers) this.handlers.set(handler.kind, handler as JobHandler<unknown, unknown>);
  }

  async start(): Promise<void> {
    if (this.timer || this.stopped) return;
    if (this.options.listen) {
      try {
        this.unlisten = await this.options.listen(JOB_CHANNEL, () => this.wake(), () => this.wake());
      } catch (err) {
        // Polling alone still runs every job within POLL_MS.
        this.options.logger.warn({ err }, 'could not listen for queued jobs; polling only');
      }
    }
    this.timer = setInterval(() => this.wake(), POLL_MS);
    this.timer.unref();
    this.wake();
  }

  /** Claims and runs due jobs, up to `workers` at once; a call while all are busy is remembered. */
  wake(): void {
    if (this.stopped) return;
    const workers = this.options.workers ?? 2;
    if (this.running.size >= workers) {
      this.again = true;
      return;
    }
    const worker: Promise<void> = this.work().finally(() => {
      this.running.delete(worker);
      this.options.metrics?.jobsRunning.set(this.running.size);
      if (this.again && !this.stopped) {
        this.again = false;
        this.wake();
      }
    });
    this.running.add(worker);
    this.options.metrics?.jobsRunning.set(this.running.size);
  }

  /** Stops claiming; the step in progress gets STOP_WAIT_MS, then its job is handed back to the queue. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    this.timer = undefined;
    await this.unlisten?.().catch(() => {});
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([Promise.all(this.running), new Promise<void>((resolve) => (timer = setTimeout(resolve, STOP_WAIT_MS)))]);
    clearTimeout(timer);
  }

  /** Runs due jobs until none is due (or this instance stops). */
  private async work(): Promise<void> {
    for (;;) {
      if (this.stopped) return;
      let job: Claimed | undefined;
      try {
        job = await this.claim();
      } catch (err) {
        this.options.logger.warn({ err }, 'could not read the job queue');
        return;
      }
      // A gauge only: its failure must not strand the job just claimed.
      if (this.running.size === 1) await this.countWaiting().catch(() => {});
      if (!job) return;
      // Another worker may take the next one meanwhile.
      if (this.running.size < (this.options.workers ?? 2)) this.wake();
      await this.run(job);
    }
  }

  /** Claims the due job that has waited longest, or job `id` when it is due. */
  private async claim(id?: number): Promise<Claimed | undefined> {
    const { rows } = await sql<Claimed>`
      update jobs j
      set state = 'running', attempts = j.attempts + 1, due_at = now() + make_interval(secs => ${LEASE_S}),
        instance = ${this.instance}, started_at = coalesce(j.started_at, now()), updated_at = now()
      from (
        select id from jobs
        where state in ('queued', 'running') and due_at <= now() and kind = any(${[...this.handlers.keys()]}::text[])
          ${id === undefined ? sql`` : sql`and id = ${id}`}
        order by due_at
        limit 1
        for update skip locked
      ) due
      where j.id = due.id
      returning j.id, j.kind, j.organization_id, j.payload, j.cursor, j.attempts, j.failures`.execute(this.db);
    return rows[0];
  }

  private async countWaiting(): Promise<void> {
    const gauge = this.options.metrics?.jobsWaiting;
    if (!gauge) return;
    const rows = await this.db
      .selectFrom('jobs')
      .select(['state', (eb) => eb.fn.countAll<number>().as('n')])
      .where('state', 'in', ['queued', 'running'])
      .groupBy('state')
      .execute();
    gauge.set({ state: 'queued' }, 0);
    gauge.set({ state: 'running' }, 0);
    for (const row of rows) gauge.set({ state: row.state }, Number(row.n));
  }

  private async run(job: Claimed, onStep?: (progress: JobProgress) => void): Promise<void> {
    const { logger, metrics } = this.options;
    // Claimed only when this instance has its handler (claim's `kind = any(...)`).
    const handler = this.handlers.get(job.kind)!;
    const view: JobView<unknown> = { id: job.id, kind: job.kind, organizationId: job.organization_id, payload: job.payload };
    let outcome: RunOutcome;
    let error: unknown;
    try {
      outcome = await this.steps(job, handler, view, onStep);
    } catch (err) {
      error = err;
      outcome = job.failures + 1 >= MAX_FAILURES ? 'failed' : 'retry';
    }
    try {
      if (outcome === 'succeeded') {
        metrics?.jobs.inc({ kind: job.kind, outcome });
        logger.info({ job_id: job.id, kind: job.kind }, 'job finished');
      } else if (outcome === 'stopped') {
        // Handed back: another instance (or this one's next start) resumes it at once.
        await this.ours(job).set({ state: 'queued', due_at: sql`now()`, instance: null, updated_at: sql`now()` }).execute();
      } else if (outcome === 'retry' || outcome === 'failed') {
        const reason = describeError(error);
        const delay = jobRetryDelaySeconds(job.failures + 1);
        await this.ours(job)
          .set({
            state: outcome === 'failed' ? 'failed' : 'queued',
            failures: job.failures + 1,
            due_at: sql`now() + make_interval(secs => ${delay})`,
            last_error: reason,
            updated_at: sql`now()`,
            ...(outcome === 'failed' ? { finished_at: sql`now()` } : {}),
          })
          .execute();
        metrics?.jobs.inc({ kind: job.kind, outcome });
        if (outcome === 'failed') logger.error({ job_id: job.id, kind: job.kind, failures: job.failures + 1, reason }, 'job failed too many times; given up');
        else logger.warn({ job_id: job.id, kind: job.kind, failures: job.failures + 1, retry_in_s: delay, reason }, 'job step failed; will retry');
      }
    } catch (err) {
      // The database is away: the lease runs out and the job is claimed again then.
      logger.warn({ err, job_id: job.id }, 'could not record the outcome of a job run');
    }
  }

  /** The job row while this run's lease is still its own. */
  private ours(job: Claimed) {
    return this.db.updateTable('jobs').where('id', '=', job.id).where('attempts', '=', job.attempts).where('state', '=', 'running');
  }

  private async steps(job: Claimed, handler: JobHandler<unknown, unknown>, view: JobView<unknown>, onStep?: (progress: JobProgress) => void): Promise<RunOutcome> {
    for (;;) {
      if (this.stopped) return 'stopped';
      const result = await this.db.transaction().execute(async (trx) => {
        // Locks the job as this run claimed it: a run whose lease another instance took over finds nothing.
        const row = await trx
          .selectFrom('jobs')
          .select(['cursor'])
          .where('id', '=', job.id)
          .where('attempts', '=', job.attempts)
          .where('state', '=', 'running')
          .forUpdate()
          .executeTakeFirst();
        if (!row) return undefined;
        const step = await handler.step(trx, view, row.cursor ?? null);
        const after = await trx
          .updateTable('jobs')
          .set({
            cursor: step.cursor === null ? null : JSON.stringify(step.cursor),
            progress_done: sql`progress_done + ${step.processed}`,
            ...(step.total !== undefined ? { progress_total: step.total } : {}),
            due_at: sql`now() + make_interval(secs => ${LEASE_S})`,
            updated_at: sql`now()`,
            ...(step.finished ? { state: 'succeeded' as const, finished_at: sql`now()`, last_error: null } : {}),
          })
          .where('id', '=', job.id)
          .returning(['state', 'progress_done', 'progress_total'])
          .executeTakeFirstOrThrow();
        return { ...step, progress: { state: after.state, done: after.progress_done, total: after.progress_total } };
      });
      if (!result) {
        this.options.logger.warn({ job_id: job.id, kind: job.kind }, 'job taken over by another instance (this one held it past its lease)');
        return 'lost';
      }
      result.afterCommit?.();
      onStep?.(result.progress);
      if (result.processed > 0) this.options.metrics?.jobItems.inc({ kind: job.kind }, result.processed);
      if (result.finished) return 'succeeded';
    }
  }

  /**
   * Runs job `id` here until it ends, for a process that has no runner of its own started (the
   * CLI): claims it whenever it is due, and waits while another instance holds it. Returns the
   * job as it ended. `onProgress` is told the job's state and progress after each step run here
   * and each time the job is looked at.
   */
  async runToEnd(id: number, options: { timeoutMs?: number; onProgress?: (progress: JobProgress) => void } = {}): Promise<JobRow> {
    const deadline = Date.now() + (options.timeoutMs ?? 10 * 60_000);
    for (;;) {
      const claimed = await this.claim(id);
      if (claimed) await this.run(claimed, options.onProgress);
      const job = await findJob(this.db, id);
      if (!job) throw new Error(`job ${id} does not exist`);
      options.onProgress?.({ state: job.state, done: job.progress_done, total: job.progress_total });
      if (job.state === 'succeeded' || job.state === 'failed') return job;
      if (Date.now() > deadline) return job;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }
}
