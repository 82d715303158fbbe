/**
 * The durable job queue (src/jobs/queue.ts) with a job kind of the test's own, whose every step
 * writes a row in the step's transaction: a step done twice, or skipped, shows in that table.
 * The SIGKILL of a real server process midway: test/faults/jobs.test.ts.
 */
import { type KyselyPlugin, sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it, onTestFinished, vi } from 'vitest';
import { inTransaction } from '../../src/db/connect.js';
import { enqueueJob, findJob, type JobHandler, JobRunner, LEASE_S } from '../../src/jobs/queue.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
const db = () => t.handle.db;

beforeAll(async () => {
  t = await createTestDatabase();
  await sql`create table job_effects (job_id bigint not null, step integer not null)`.execute(db());
});
afterAll(() => t.close());

interface Payload {
  steps: number;
  /** Throw at this step, on the job's first run only. */
  throwAt?: number;
  /** Each step waits this long (ms) before committing (until the job is in `quickened`). */
  slowMs?: number;
}

const thrown = new Set<number>();
/** Jobs whose steps no longer wait: the test is past what needed them slow. */
const quickened = new Set<number>();
const steps: JobHandler<Payload, { done: number }> = {
  kind: 'test.steps',
  async step(trx, job, cursor) {
    const n = (cursor?.done ?? 0) + 1;
    if (job.payload.throwAt === n && !thrown.has(job.id)) {
      thrown.add(job.id);
      throw new Error(`step ${n} failed on purpose`);
    }
    if (job.payload.slowMs && !quickened.has(job.id)) await new Promise((r) => setTimeout(r, job.payload.slowMs));
    await sql`insert into job_effects (job_id, step) values (${job.id}, ${n})`.execute(trx);
    return { cursor: { done: n }, processed: 1, finished: n >= job.payload.steps, total: job.payload.steps };
  },
};

function logger() {
  const lines: { level: string; msg: string; obj: object }[] = [];
  const at = (level: string) => (obj: object, msg?: string) => void lines.push({ level, msg: msg ?? '', obj });
  return { lines, info: at('info'), warn: at('warn'), error: at('error') };
}

const runner = (log = logger(), workers = 2, database = db()) => new JobRunner(database, { handlers: [steps], logger: log as never, workers });
const effectsOf = async (jobId: number) => (await sql<{ step: number }>`select step from job_effects where job_id = ${jobId} order by step`.execute(db())).rows.map((r) => r.step);
const queue = (payload: Payload) => enqueueJob(db(), { kind: 'test.steps', organizationId: null, payload: { ...payload } });

async function until<T>(probe: () => Promise<T | undefined>, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 25));
  }
}

describe(`durable jobs on ${BACKEND}`, () => {
  it('exists exactly when the transaction that queued it commits', async () => {
    await expect(
      inTransaction(db(), async (trx) => {
        await enqueueJob(trx, { kind: 'test.steps', organizationId: null, payload: { steps: 1, marker: 'rolled back' } });
        throw new Error('the change failed');
      }),
    ).rejects.toThrow('the change failed');
    const found = await db().selectFrom('jobs').select('id').where(sql<boolean>`payload->>'marker' = 'rolled back'`).execute();
    expect(found).toEqual([]);
  });

  it('runs every step once, in order, recording progress, and ends succeeded', async () => {
    const id = await queue({ steps: 5 });
    const job = await runner().runToEnd(id);
    expect(job).toMatchObject({ state: 'succeeded', progress_done: 5, progress_total: 5, attempts: 1, last_error: null });
    expect(job.finished_at).toBeInstanceOf(Date);
    expect(await effectsOf(id)).toEqual([1, 2, 3, 4, 5]);
  });

  it('two runners sharing the queue never run one job twice: each step of each job exactly once', async () => {
    const ids = await Promise.all(Array.from({ length: 8 }, () => queue({ steps: 4 })));
    const a = runner(logger(), 2);
    const b = runner(logger(), 2);
    await Promise.all([a.start(), b.start()]);
    try {
      await until(async () => {
        const open = await db().selectFrom('jobs').select('id').where('id', 'in', ids).where('state', '<>', 'succeeded').execute();
        return open.length === 0 ? true : undefined;
      });
    } finally {
      await Promise.all([a.stop(), b.stop()]);
    }
    for (const id of ids) expect(await effectsOf(id)).toEqual([1, 2, 3, 4]);
  });

  it('resumes a job whose instance died from its cursor once the lease runs out: no step repeated, none skipped', async () => {
    const id = await queue({ steps: 5 });
    // What a SIGKILLed instance leaves: running, two steps committed (with their cursor), the lease still on.
    await sql`insert into job_effects (job_id, step) values (${id}, 1), (${id}, 2)`.execute(db());
    await db()
      .updateTable('jobs')
      .set({ state: 'running', attempts: 1, cursor: JSON.stringify({ done: 2 }), progress_done: 2, instance: 'dead', due_at: sql`now() + make_interval(secs => ${LEASE_S})` })
      .where('id', '=', id)
      .execute();
    // The runner's poll (setInterval) is fake: its second passes at once, and the claims it makes
    // (`update jobs j ...`, JobRunner.claim) are counted as they come back.
    const claiming = new Set<unknown>();
    let claimed = 0;
    const counting: KyselyPlugin = {
      transformQuery: (args) => {
        if (JSON.stringify(args.node).includes('update jobs j')) claiming.add(args.queryId);
        return args.node;
      },
      transformResult: async (args) => {
        if (claiming.delete(args.queryId)) claimed++;
        return args.result;
      },
    };
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'], shouldClearNativeTimers: true });
    onTestFinished(() => void vi.useRealTimers());
    const other = runner(logger(), 2, db().withPlugin(counting));
    await other.start();
    try {
      // Not while the lease holds: neither the claim at the start nor the poll's a second later takes it.
      vi.advanceTimersByTime(1000);
      await until(async () => claimed >= 2 || undefined);
      expect(await findJob(db(), id)).toMatchObject({ state: 'running', instance: 'dead' });
      // The lease runs out (moved back here rather than waited for), found by the next poll.
      await db().updateTable('jobs').set({ due_at: sql`now() - interval '1 second'` }).where('id', '=', id).execute();
      vi.advanceTimersByTime(1000);
      const done = await until(async () => {
        const job = await findJob(db(), id);
        return job?.state === 'succeeded' ? job : undefined;
      });
      expect(done).toMatchObject({ progress_done: 5, attempts: 2 });
      expect(done.instance).toBe(other.instance);
    } finally {
      await other.stop();
    }
    expect(await effectsOf(id)).toEqual([1, 2, 3, 4, 5]);
  });

  it('a step that fails rolls back whole; the job is queued again after a backoff with its error, and resumes where it was', async () => {
    const log = logger();
    const id = await queue({ steps: 4, throwAt: 3 });
    const first = await runner(log).runToEnd(id, { timeoutMs: 0 });
    expect(first).toMatchObject({ state: 'queued', attempts: 1, failures: 1, progress_done: 2, last_error: 'step 3 failed on purpose' });
    expect(first.due_at.getTime()).toBeGreaterThan(Date.now() + 3000);
    expect(log.lines.filter((l) => l.level === 'warn').map((l) => l.msg)).toEqual(['job step failed; will retry']);
    await db().updateTable('jobs').set({ due_at: sql`now()` }).where('id', '=', id).execute();
    expect(await runner(log).runToEnd(id)).toMatchObject({ state: 'succeeded', attempts: 2, progress_done: 4, last_error: null });
    expect(await effectsOf(id)).toEqual([1, 2, 3, 4]);
  });

  it('gives up after ten failed runs (hand-backs and takeovers are not failures): failed, finished, logged at error', async () => {
    const log = logger();
    const id = await queue({ steps: 2, throwAt: 1 });
    await db().updateTable('jobs').set({ attempts: 30, failures: 9 }).where('id', '=', id).execute();
    const job = await runner(log).runToEnd(id);
    expect(job).toMatchObject({ state: 'failed', attempts: 31, failures: 10, last_error: 'step 1 failed on purpose' });
    expect(job.finished_at).toBeInstanceOf(Date);
    expect(log.lines.filter((l) => l.level === 'error')).toEqual([expect.objectContaining({ msg: 'job failed too many times; given up', obj: expect.objectContaining({ job_id: id, kind: 'test.steps' }) })]);
    expect(await effectsOf(id)).toEqual([]);
  });

  it('leaves a job of a kind it does not know to an instance that knows it (a newer version, mid-deploy): never claimed', async () => {
    const id = await enqueueJob(db(), { kind: 'test.unknown', organizationId: null, payload: {} });
    // One pass (timeoutMs 0): claimed and run here if this runner could.
    const job = await runner().runToEnd(id, { timeoutMs: 0 });
    expect(job).toMatchObject({ state: 'queued', attempts: 0, failures: 0, last_error: null });
    await db().deleteFrom('jobs').where('id', '=', id).execute();
  });

  it('stopping hands the job back at once: queued, due now, held by nobody, its committed steps kept', async () => {
    const id = await queue({ steps: 50, slowMs: 100 });
    const r = runner();
    await r.start();
    await until(async () => ((await findJob(db(), id))?.progress_done ?? 0) >= 2 || undefined);
    await r.stop();
    const job = await findJob(db(), id);
    expect(job).toMatchObject({ state: 'queued', instance: null });
    expect(job!.due_at.getTime()).toBeLessThanOrEqual(Date.now());
    const done = job!.progress_done;
    expect(await effectsOf(id)).toEqual(Array.from({ length: done }, (_, i) => i + 1));
    // Another instance finishes it from there (each step at once: slow steps were for the stop).
    quickened.add(id);
    expect(await runner().runToEnd(id)).toMatchObject({ state: 'succeeded', progress_done: 50 });
    expect(await effectsOf(id)).toEqual(Array.from({ length: 50 }, (_, i) => i + 1));
  });
});
