/**
 * Issue 29, the terminal: long commands (migrations, cleanup, seed-demo, the jobs a command
 * queued, waiting for the embedded database) show their progress on stderr when it is a
 * terminal — one line redrawn in place, cleared before the output — and nothing with --json or
 * when stderr is not a terminal; stdout is the same either way.
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { sql } from 'kysely';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { runCli, runCommandLine } from '../src/cli/index.js';
import { applicationByClientId, PROGRESS_INTERVAL_MS, progressLine } from '../src/cli/shared.js';
import { loadConfig } from '../src/config.js';
import type { DB } from '../src/db/connect.js';
import { jobHandlers } from '../src/jobs/handlers.js';
import { type JobProgress, JobRunner } from '../src/jobs/queue.js';
import { updateApplication } from '../src/oauth/models/applications.js';
import { deleteExpired } from '../src/retention.js';
import { BACKEND, createEmptyDatabase, type TestDatabase } from './helpers/db.js';
import { finishJobs } from './helpers/jobs.js';
import { CLI, HAS_SCRIPT, ROOT, run } from './helpers/process.js';
import { sharedDatabase } from './helpers/shared-database.js';

const CLEAR = '\r\x1b[K';

/** What was drawn on the progress line, frame by frame (each drawing starts with CLEAR). */
const frames = (terminal: string) => terminal.split(CLEAR).filter((f) => f !== '');

describe('the progress line', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it('draws "label: text" in place at once, then at most every 100 ms (the latest update when its turn comes), and done() clears it', () => {
    vi.useFakeTimers();
    let out = '';
    const line = progressLine({ write: (t) => (out += t), columns: () => 80 });
    const p = line.start('work');
    p.update('1 of 4');
    expect(out).toBe(`${CLEAR}work: 1 of 4`);
    p.update('2 of 4');
    p.update('3 of 4');
    expect(out).toBe(`${CLEAR}work: 1 of 4`);
    vi.advanceTimersByTime(PROGRESS_INTERVAL_MS);
    expect(out).toBe(`${CLEAR}work: 1 of 4${CLEAR}work: 3 of 4`);
    p.update('4 of 4');
    p.done();
    vi.advanceTimersByTime(PROGRESS_INTERVAL_MS);
    // The pending update is dropped; the line is left empty, the cursor at its start.
    expect(out).toBe(`${CLEAR}work: 1 of 4${CLEAR}work: 3 of 4${CLEAR}`);
    p.update('late');
    line.end();
    expect(out).toBe(`${CLEAR}work: 1 of 4${CLEAR}work: 3 of 4${CLEAR}`);
  });

  it('cuts a line wider than the terminal (80 when it does not say), a new progress replaces the last, and without a terminal nothing is written', () => {
    vi.useFakeTimers();
    let out = '';
    const narrow = progressLine({ write: (t) => (out += t), columns: () => 30 });
    narrow.start('label').update('x'.repeat(100));
    expect(out).toBe(`${CLEAR}label: ${'x'.repeat(21)}…`);
    out = '';
    const unsized = progressLine({ write: (t) => (out += t), columns: () => 0 });
    const first = unsized.start('first');
    first.update('y'.repeat(200));
    expect(out).toHaveLength(CLEAR.length + 79);
    vi.advanceTimersByTime(PROGRESS_INTERVAL_MS);
    out = '';
    unsized.start('second').update('z');
    first.update('stale');
    vi.advanceTimersByTime(PROGRESS_INTERVAL_MS);
    expect(out).toBe(`${CLEAR}${CLEAR}second: z`);
    unsized.end();
    unsized.end();
    expect(out).toBe(`${CLEAR}${CLEAR}second: z${CLEAR}`);

    const none = progressLine(undefined);
    none.start('anything').update('at all');
    none.end();
  });
});

let database: TestDatabase;

beforeAll(async () => {
  database = await createEmptyDatabase({ onDisk: true });
});
afterAll(async () => {
  await closeShared();
  await database.drop();
});

const env = () => ({ ...database.env, LOG_LEVEL: 'silent' });

/**
 * The database the test's own setup and checks use, opened once (the embedded database on disk
 * takes a second or more to open); closed there before a command that opens it runs (one
 * process at a time holds it).
 */
const { db: sharedDb, close: closeShared } = sharedDatabase(() => env());
/** Before a command that opens the database itself (runCli, the real binary). */
const letGo = async () => void (BACKEND === 'pglite' && (await closeShared()));

/** Runs the command in this process, through runCli (what the binary runs); `terminal`: stderr is a 200-column terminal. */
async function cli(argv: string[], options: { terminal?: boolean; env?: Record<string, string> } = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  await letGo();
  let stdout = '';
  let stderr = '';
  const code = await runCli(argv, {
    stdout: (s) => (stdout += s),
    stderr: (s) => (stderr += s),
    env: { ...env(), ...options.env },
    terminal: options.terminal ? { columns: () => 200 } : undefined,
  });
  return { code, stdout, stderr };
}

/** Setup with a --json command, run in process on the shared database (runCommandLine, then its jobs finished): its progress is not what is looked at. */
async function json(...argv: string[]): Promise<Record<string, unknown>> {
  const db = await sharedDb();
  const result = await runCommandLine([...argv, '--json'], { db, config: loadConfig(env()), applied: [] });
  await finishJobs(db);
  expect(result, result.stderr).toMatchObject({ code: 0, stderr: '' });
  return JSON.parse(result.stdout) as Record<string, unknown>;
}

const withDb = async <T>(fn: (db: DB) => Promise<T>): Promise<T> => fn(await sharedDb());

const SESSIONS = 2500;
const GRANTS = 700;

/** SESSIONS expired sessions of `userId`: three of cleanup's batches. */
const expiredSessions = (userId: number) =>
  withDb((db) =>
    sql`insert into sessions (id_hash, user_id, expires_at)
      select md5(g::text) || md5((-g)::text), ${userId}, now() - interval '1 hour' from generate_series(1, ${SESSIONS}) g`.execute(db),
  );

/** A private application of `orgId` holding GRANTS live grants: three steps of the job that revokes them. */
async function appWithGrants(orgId: number, name: string): Promise<string> {
  const app = await json('app', 'create', '--org', String(orgId), '--type', 'private', '--name', name, '--scopes', 'contacts.read');
  await withDb(async (db) => {
    const { id } = await db.selectFrom('applications').select('id').where('client_id', '=', app.client_id as string).executeTakeFirstOrThrow();
    await sql`insert into grants (organization_id, application_id, user_id, scopes)
      select ${orgId}, ${id}, null, '{contacts.read}' from generate_series(1, ${GRANTS})`.execute(db);
  });
  return app.client_id as string;
}

const liveGrants = (clientId: string) =>
  withDb(async (db) =>
    Number(
      (
        await db
          .selectFrom('grants')
          .innerJoin('applications', 'applications.id', 'grants.application_id')
          .select((eb) => eb.fn.countAll<number>().as('n'))
          .where('client_id', '=', clientId)
          .where('revoked_at', 'is', null)
          .executeTakeFirstOrThrow()
      ).n,
    ),
  );

// Each command opens the embedded database on disk, the first applying every migration (a minute
// or more on a busy machine): more time than the default 30 s.
describe(`long commands on ${BACKEND}: progress on a terminal only`, { timeout: 180_000 }, () => {
  let userId: number;
  let orgId: number;

  it('migrate shows each migration as it is applied, and clears the line before its output', async () => {
    const result = await cli(['migrate'], { terminal: true });
    expect(result.code).toBe(0);
    const applied = result.stdout.replace(/^applied /, '').trim().split(', ');
    expect(applied.length).toBeGreaterThan(5);
    expect(result.stderr.startsWith(`${CLEAR}migrating the database: 1 of ${applied.length}, ${applied[0]}`), result.stderr).toBe(true);
    expect(result.stderr.endsWith(CLEAR)).toBe(true);
    for (const frame of frames(result.stderr)) expect(frame).toMatch(new RegExp(`^migrating the database: \\d+ of ${applied.length}, \\S+$`));
    // Nothing pending: nothing to show.
    expect(await cli(['migrate'], { terminal: true })).toEqual({ code: 0, stdout: 'the database is up to date\n', stderr: '' });
  });

  it('cleanup shows the table it is on and the rows deleted so far; stdout is the same piped, and --json, TERM=dumb or no terminal show nothing', async () => {
    userId = (await json('user', 'create', '--email', 'progress@example.com', '--password', 'a-long-password')).id as number;
    await expiredSessions(userId);
    const shown = await cli(['cleanup'], { terminal: true });
    expect(shown.code, JSON.stringify(shown)).toBe(0);
    expect(shown.stdout).toMatch(new RegExp(`^deleted 0 authorization codes, 0 refresh tokens, 0 revoked access tokens, ${SESSIONS} sessions, .*\\n$`));
    expect(shown.stderr, shown.stderr).toMatch(/^\r\x1b\[Kcleanup: authorization codes \(1\/\d+\): 0 deleted, 0 in all/);
    expect(shown.stderr.endsWith(CLEAR)).toBe(true);
    for (const frame of frames(shown.stderr)) expect(frame).toMatch(/^cleanup: [a-z ]+ \(\d+\/\d+\): [\d,]+ deleted, [\d,]+ in all$/);

    await expiredSessions(userId);
    expect(await cli(['cleanup'])).toEqual({ code: 0, stdout: shown.stdout, stderr: '' });
    await expiredSessions(userId);
    expect(await cli(['cleanup'], { terminal: true, env: { TERM: 'dumb' } })).toEqual({ code: 0, stdout: shown.stdout, stderr: '' });
    await expiredSessions(userId);
    const quiet = await cli(['cleanup', '--json'], { terminal: true });
    expect(quiet).toMatchObject({ code: 0, stderr: '' });
    expect(JSON.parse(quiet.stdout)).toMatchObject({ deleted: { sessions: SESSIONS, refresh_tokens: 0 } });
    expect(quiet.stdout.split('\n')).toEqual([expect.any(String), '']);
  });

  it('the domain functions tell their progress without knowing of terminals: deleteExpired after each batch, a job after each step', async () => {
    await expiredSessions(userId);
    const sessions: [number, number, number][] = [];
    const deleted = await withDb((db) =>
      deleteExpired(db, { onProgress: ({ table, step, of, deleted: sofar }) => table === 'sessions' && sessions.push([step, of, sofar.sessions ?? -1]) }),
    );
    expect(deleted.sessions).toBe(SESSIONS);
    const [step, of] = sessions[0]!;
    expect(sessions).toEqual([[step, of, 0], [step, of, 1000], [step, of, 2000], [step, of, 2500]]);
    expect(of).toBe(Object.keys(deleted).length);

    orgId = (await json('org', 'create', '--name', 'Progress Org', '--owner', 'progress@example.com')).id as number;
    const clientId = await appWithGrants(orgId, 'Bulk Steps');
    const told = await withDb(async (db) => {
      await updateApplication(db, await applicationByClientId(db, clientId), { disabled: true });
      const job = await db.selectFrom('jobs').select('id').where('state', '=', 'queued').orderBy('id', 'desc').executeTakeFirstOrThrow();
      const progress: JobProgress[] = [];
      const quiet = { info: () => {}, warn: () => {}, error: () => {} };
      await new JobRunner(db, { handlers: jobHandlers(), logger: quiet }).runToEnd(job.id, { onProgress: (p) => progress.push(p) });
      return progress;
    });
    expect(told).toEqual([
      { state: 'running', done: 300, total: GRANTS },
      { state: 'running', done: 600, total: GRANTS },
      { state: 'running', done: GRANTS, total: GRANTS },
      // The step that finds nothing left, then the look at the job as it ended.
      { state: 'succeeded', done: GRANTS, total: GRANTS },
      { state: 'succeeded', done: GRANTS, total: GRANTS },
    ]);
  });

  it('a command that queued a job shows the job\'s state and progress while it finishes it, then prints what it always prints', async () => {
    const shownApp = await appWithGrants(orgId, 'Bulk One');
    const shown = await cli(['app', 'disable', '--client-id', shownApp], { terminal: true });
    expect(shown).toMatchObject({ code: 0, stdout: `disabled application ${shownApp} "Bulk One"\n` });
    expect(shown.stderr, shown.stderr).toMatch(new RegExp(`^${CLEAR.replace('[', '\\[')}job \\d+ \\(application\\.revoke_grants\\): running, 300 of ${GRANTS} done`));
    expect(shown.stderr.endsWith(CLEAR)).toBe(true);
    for (const frame of frames(shown.stderr)) expect(frame).toMatch(new RegExp(`^job \\d+ \\(application\\.revoke_grants\\): (running|succeeded), [\\d,]+ of ${GRANTS} done$`));
    expect(await liveGrants(shownApp)).toBe(0);

    const pipedApp = await appWithGrants(orgId, 'Bulk Two');
    expect(await cli(['app', 'disable', '--client-id', pipedApp])).toEqual({ code: 0, stdout: `disabled application ${pipedApp} "Bulk Two"\n`, stderr: '' });
    expect(await liveGrants(pipedApp)).toBe(0);
    const jsonApp = await appWithGrants(orgId, 'Bulk Three');
    const quiet = await cli(['app', 'disable', '--client-id', jsonApp, '--json'], { terminal: true });
    expect(quiet).toMatchObject({ code: 0, stderr: '' });
    expect(JSON.parse(quiet.stdout)).toMatchObject({ client_id: jsonApp, disabled: true });
    expect(await liveGrants(jsonApp)).toBe(0);
  });

  it('seed-demo shows its steps, then prints the banner', async () => {
    const shown = await cli(['seed-demo'], { terminal: true });
    expect(shown.code, JSON.stringify(shown)).toBe(0);
    expect(shown.stdout).toMatch(/^─+\n orgauth demo data/);
    expect(shown.stderr.startsWith(`${CLEAR}seeding the demo: step 1 of 5, hashing the password`), shown.stderr).toBe(true);
    expect(shown.stderr.endsWith(CLEAR)).toBe(true);
    for (const frame of frames(shown.stderr)) expect(frame).toMatch(/^seeding the demo: step [1-5] of 5, (hashing the password|creating the (user|organization|public application|private application))$/);
    // A failure clears the line before its message.
    const again = await cli(['seed-demo'], { terminal: true });
    expect(again.code).toBe(1);
    expect(again.stdout).toBe('');
    expect(again.stderr).toMatch(new RegExp(`^${CLEAR.replace('[', '\\[')}seeding the demo: step 1 of 5, hashing the password.*${CLEAR.replace('[', '\\[')}orgauth: a user with email demo@orgauth.local already exists\\n$`, 's'));
  });

  it.skipIf(BACKEND !== 'pglite')('waiting for the embedded database in use by another process shows how long it has waited', async () => {
    await letGo();
    const lockFile = `${(database.target as { dataDir: string }).dataDir}.lock`;
    const holder = spawn('sleep', ['60'], { stdio: 'ignore' });
    try {
      writeFileSync(lockFile, String(holder.pid));
      let stderr = '';
      let stdout = '';
      const done = runCli(['org', 'list'], { stdout: (s) => (stdout += s), stderr: (s) => (stderr += s), env: env(), terminal: { columns: () => 200 } });
      while (!stderr.includes('waiting for the database')) await new Promise((r) => setTimeout(r, 20));
      unlinkSync(lockFile);
      expect(await done).toBe(0);
      expect(stderr.startsWith(`${CLEAR}waiting for the database: in use elsewhere, `), stderr).toBe(true);
      expect(stderr.endsWith(CLEAR)).toBe(true);
      for (const frame of frames(stderr)) expect(frame).toMatch(/^waiting for the database: in use elsewhere, \d+ s of at most 15 s$/);
      expect(stdout).toMatch(/^ID\s+NAME/);
    } finally {
      holder.kill();
      rmSync(lockFile, { force: true });
    }
  });

  describe.skipIf(!HAS_SCRIPT)('the real command in a terminal (util-linux script)', () => {
    const out = mkdtempSync(path.join(tmpdir(), 'orgauth-progress-'));
    afterAll(() => rmSync(out, { recursive: true, force: true }));

    beforeAll(() => {
      if (!existsSync(path.join(ROOT, 'dist/bundle/cli.js'))) throw new Error('dist/ is missing: run the tests with `npm test`, which builds first');
    });

    const shellWord = (word: string) => `'${word.replace(/'/g, `'\\''`)}'`;

    /**
     * Runs `orgauth args` inside a pseudo-terminal: `terminal` is what it showed there (stderr,
     * and stdout unless `stdoutFile` takes it; CRLF line ends).
     */
    async function inTerminal(args: string[], stdoutFile?: string): Promise<{ code: number | null; terminal: string; stdout: string }> {
      await letGo();
      const command = [process.execPath, CLI, ...args].map(shellWord).join(' ') + (stdoutFile ? ` > ${shellWord(stdoutFile)}` : '');
      const child = spawn('script', ['--quiet', '--flush', '--return', '--command', command, '/dev/null'], {
        cwd: ROOT,
        env: { PATH: process.env.PATH, HOME: process.env.HOME, ...env() },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let terminal = '';
      child.stdout.on('data', (d: Buffer) => (terminal += d.toString()));
      return new Promise((resolve) =>
        child.on('exit', (code) => resolve({ code, terminal, stdout: stdoutFile ? readFileSync(stdoutFile, 'utf8') : '' })),
      );
    }

    it('cleanup draws its progress on the terminal while stdout (redirected) is what a pipe gets; piped, and with --json, no progress', async () => {
      await expiredSessions(userId);
      const file = path.join(out, 'cleanup.out');
      const shown = await inTerminal(['cleanup'], file);
      expect(shown.code, JSON.stringify(shown)).toBe(0);
      expect(shown.terminal, JSON.stringify(shown.terminal)).toMatch(/^\r\x1b\[Kcleanup: authorization codes \(1\/\d+\): 0 deleted, 0 in all/);
      expect(shown.terminal.endsWith(CLEAR)).toBe(true);
      for (const frame of frames(shown.terminal)) expect(frame).toMatch(/^cleanup: [a-z ]+ \(\d+\/\d+\): [\d,]+ deleted, [\d,]+ in all$/);
      expect(shown.stdout).toMatch(new RegExp(`^deleted 0 authorization codes, 0 refresh tokens, 0 revoked access tokens, ${SESSIONS} sessions, .*\\n$`));

      await expiredSessions(userId);
      await letGo();
      expect(await run(CLI, ['cleanup'], env())).toEqual({ code: 0, stdout: shown.stdout, stderr: '' });

      await expiredSessions(userId);
      const quiet = await inTerminal(['cleanup', '--json']);
      expect(quiet.code).toBe(0);
      expect(quiet.terminal).not.toContain('\x1b');
      expect(quiet.terminal).not.toContain('\r\x1b');
      expect(quiet.terminal.split('\r\n')).toEqual([expect.any(String), '']);
      expect(JSON.parse(quiet.terminal)).toMatchObject({ deleted: { sessions: SESSIONS } });
    });

    it('app disable shows the job revoking the grants, and clears the line before its output', async () => {
      const clientId = await appWithGrants(orgId, 'Bulk Terminal');
      const shown = await inTerminal(['app', 'disable', '--client-id', clientId]);
      expect(shown.code, JSON.stringify(shown)).toBe(0);
      const output = `disabled application ${clientId} "Bulk Terminal"\r\n`;
      expect(shown.terminal.endsWith(`${CLEAR}${output}`), JSON.stringify(shown.terminal)).toBe(true);
      const progress = shown.terminal.slice(0, -output.length);
      expect(progress).toMatch(new RegExp(`^${CLEAR.replace('[', '\\[')}job \\d+ \\(application\\.revoke_grants\\): running, 300 of ${GRANTS} done`));
      for (const frame of frames(progress)) expect(frame).toMatch(new RegExp(`^job \\d+ \\(application\\.revoke_grants\\): (running|succeeded), [\\d,]+ of ${GRANTS} done$`));
      expect(await liveGrants(clientId)).toBe(0);

      const piped = await appWithGrants(orgId, 'Bulk Piped');
      await letGo();
      expect(await run(CLI, ['app', 'disable', '--client-id', piped], env())).toEqual({ code: 0, stdout: `disabled application ${piped} "Bulk Piped"\n`, stderr: '' });
      expect(await liveGrants(piped)).toBe(0);
    });
  });
});
