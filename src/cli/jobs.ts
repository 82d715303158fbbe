/**
 * `orgauth job`: the durable background jobs (src/jobs/queue.ts) of every instance: what is
 * queued, running, finished or failed, with its progress, attempts and last error.
 */
import { decodeCursor } from '../api/pagination.js';
import type { JobState } from '../db/schema.js';
import { NotFoundError } from '../errors.js';
import { findJob, type JobRow, listJobs } from '../jobs/queue.js';
import { listed, optionalString, PAGE_OPTIONS, PAGE_USAGE, required, UsageError, type Command } from './shared.js';

const STATES: readonly JobState[] = ['queued', 'running', 'succeeded', 'failed'];

/** A job as the CLI prints it with --json. */
export function jobOut(job: JobRow) {
  return {
    id: job.id,
    kind: job.kind,
    organization_id: job.organization_id,
    state: job.state,
    progress: { done: job.progress_done, total: job.progress_total },
    attempts: job.attempts,
    failures: job.failures,
    last_error: job.last_error,
    instance: job.instance,
    created_at: job.created_at.toISOString(),
    started_at: job.started_at?.toISOString() ?? null,
    updated_at: job.updated_at.toISOString(),
    finished_at: job.finished_at?.toISOString() ?? null,
    // When a queued job may run (after a failure: its backoff), or when a running job's lease runs out.
    due_at: job.state === 'queued' || job.state === 'running' ? job.due_at.toISOString() : null,
  };
}

type JobOut = ReturnType<typeof jobOut>;

const progressText = (j: JobOut) => (j.progress.total === null ? String(j.progress.done) : `${j.progress.done}/${j.progress.total}`);

function stateOption(raw: string | undefined): JobState | undefined {
  if (raw === undefined) return undefined;
  if (!STATES.includes(raw as JobState)) throw new UsageError(`--state must be one of ${STATES.join(', ')}`);
  return raw as JobState;
}

export const jobCommands: Record<string, Command> = {
  'job list': {
    usage: `orgauth job list [--state queued|running|succeeded|failed] [--org ID] ${PAGE_USAGE}`,
    summary: 'list background jobs, newest first: state, progress, attempts and last error',
    options: { ...PAGE_OPTIONS, state: { type: 'string' }, org: { type: 'string' } },
    run: async ({ db }, v) => {
      const state = stateOption(optionalString(v, 'state'));
      const org = optionalString(v, 'org');
      const organizationId = org === undefined ? undefined : /^[1-9][0-9]{0,15}$/.test(org) ? Number(org) : NaN;
      if (Number.isNaN(organizationId)) throw new UsageError('--org must be an organization id');
      const cursor = optionalString(v, 'cursor');
      return listed(
        v,
        (limit) => listJobs(db, { state, organizationId, limit, beforeId: cursor === undefined ? undefined : decodeCursor(cursor) }),
        (j) => j.id,
        jobOut,
        [
          ['ID', (j) => String(j.id)],
          ['KIND', (j) => j.kind],
          ['ORG', (j) => (j.organization_id === null ? '-' : String(j.organization_id))],
          ['STATE', (j) => j.state],
          ['PROGRESS', progressText],
          ['ATTEMPTS', (j) => String(j.attempts)],
          ['CREATED', (j) => j.created_at],
          ['LAST_ERROR', (j) => j.last_error ?? ''],
        ],
      );
    },
  },

  'job show': {
    usage: 'orgauth job show --id ID',
    summary: 'show one background job',
    options: { id: { type: 'string' } },
    run: async ({ db }, v) => {
      const raw = required(v, 'id');
      const job = /^[1-9][0-9]{0,15}$/.test(raw) ? await findJob(db, Number(raw)) : undefined;
      if (!job) throw new NotFoundError(`no job with id ${raw}`);
      const out = jobOut(job);
      const text = [
        `job ${out.id}: ${out.kind}${out.organization_id === null ? '' : ` (organization ${out.organization_id})`}`,
        `state: ${out.state}`,
        `progress: ${progressText(out)}`,
        `attempts: ${out.attempts} (${out.failures} failed)`,
        `created: ${out.created_at}`,
        ...(out.started_at ? [`started: ${out.started_at}`] : []),
        ...(out.finished_at ? [`finished: ${out.finished_at}`] : []),
        ...(out.due_at ? [`due: ${out.due_at}`] : []),
        ...(out.instance ? [`instance: ${out.instance}`] : []),
        ...(out.last_error ? [`last error: ${out.last_error}`] : []),
      ];
      return { json: out, text: text.join('\n') };
    },
  },
};
