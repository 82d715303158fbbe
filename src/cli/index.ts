/**
 * The `orgauth` command: administration from a shell, with the server's configuration.
 * With --json every command prints exactly one JSON object on stdout; errors go to stderr and
 * the exit code is 1. Lists print `{"data": [...], "next_cursor"}`, a page at a time.
 *
 * On PostgreSQL the command connects to the database itself. On the embedded database, which
 * one process opens at a time, it does so when no server runs; while one does, it sends the
 * command line to that server's admin socket (src/admin-socket.ts), which runs it here, in
 * runCommandLine, with the same output and exit code.
 */
import path from 'node:path';
import { parseArgs } from 'node:util';
import { sendToAdminSocket, type CommandOutcome } from '../admin-socket.js';
import { usePasswordHashing } from '../accounts/passwords.js';
import { ConfigError, loadConfig, type Config } from '../config.js';
import { DatabaseInUseError } from '../db/lock.js';
import { AppError } from '../errors.js';
import type { DB } from '../db/connect.js';
import type { MigrationProgress } from '../db/migrate.js';
import { jobHandlers } from '../jobs/handlers.js';
import { JobRunner } from '../jobs/queue.js';
import { describeStartupError, openDatabase } from '../runtime.js';
import { appCommands } from './apps.js';
import { cleanupCommands } from './cleanup.js';
import { clientCommands } from './clients.js';
import { directoryCommands } from './directories.js';
import { domainCommands } from './domains.js';
import { grantCommands } from './grants.js';
import { jobCommands } from './jobs.js';
import { keyCommands } from './keys.js';
import { memberCommands } from './members.js';
import { migrateCommands } from './migrate.js';
import { orgCommands } from './orgs.js';
import { resourceCommands } from './resources.js';
import { roleCommands } from './roles.js';
import { seedDemoCommands } from './seed-demo.js';
import { setupLinkCommands } from './setup-links.js';
import { ssoCommands } from './sso.js';
import { socialCommands } from './social.js';
import { count, NO_PROGRESS, type Progress, progressLine, type ProgressLine, UsageError, type Command, type CommandContext, type Options, type Values } from './shared.js';
import { tokenCommands } from './tokens.js';
import { userCommands } from './users.js';
import { webhookCommands } from './webhooks.js';

export type { CommandContext } from './shared.js';

/** Every command, in the order the help lists them. */
const COMMANDS: Record<string, Command> = {
  ...migrateCommands,
  ...userCommands,
  ...orgCommands,
  ...setupLinkCommands,
  ...memberCommands,
  ...roleCommands,
  ...appCommands,
  ...clientCommands,
  ...tokenCommands,
  ...grantCommands,
  ...ssoCommands,
  ...socialCommands,
  ...domainCommands,
  ...webhookCommands,
  ...directoryCommands,
  ...keyCommands,
  ...resourceCommands,
  ...jobCommands,
  ...cleanupCommands,
  ...seedDemoCommands,
};

/**
 * How long a command waits for an embedded database in use by a server that is starting, or by
 * other commands: each opens the database, runs and closes it in a second or two, more on a busy
 * machine (three at once, on two loaded cores in CI, took more than 5 s).
 */
const IN_USE_WAIT_MS = 15_000;

const GLOBAL_OPTIONS: Options = { json: { type: 'boolean' }, help: { type: 'boolean', short: 'h' } };

function helpText(): string {
  const width = Math.max(...Object.keys(COMMANDS).map((k) => k.length));
  return [
    'usage: orgauth <command> [options] [--json]',
    '',
    'commands:',
    ...Object.entries(COMMANDS).map(([name, c]) => `  ${name.padEnd(width)}  ${c.summary}`),
    '',
    'Every command uses the server\'s configuration (DATABASE_URL, DATA_DIR, SECRET_KEY, ...).',
    'On the embedded database, while the server runs, commands are run by that server.',
    'With --json a command prints exactly one JSON object on stdout.',
    'On a terminal, long work (migrations, cleanup, jobs) shows its progress on stderr; never with --json.',
    'Run `orgauth <command> --help` for its options.',
  ].join('\n');
}

export interface CliIo {
  stdout: (text: string) => void;
  stderr: (text: string) => void;
  env: NodeJS.ProcessEnv;
  /**
   * Given when stderr is a terminal (`columns`: its width): long commands then show their
   * progress there, on one line redrawn in place and cleared before the output, unless --json
   * (or TERM=dumb). stdout is the same either way.
   */
  terminal?: { columns?: (() => number | undefined) | undefined } | undefined;
}

/** Finds the command named by the leading words of argv ("app create", "org setup-link revoke"), longest name first. */
function findCommand(argv: string[]): { name: string; command: Command; rest: string[] } | undefined {
  for (const words of [3, 2, 1]) {
    const name = argv.slice(0, words).join(' ');
    const command = Object.hasOwn(COMMANDS, name) ? COMMANDS[name] : undefined;
    if (command && argv.slice(0, words).every((w) => !w.startsWith('-'))) return { name, command, rest: argv.slice(words) };
  }
  return undefined;
}

const failure = (json: boolean, code: string, description: string): CommandOutcome => ({
  code: 1,
  stdout: '',
  stderr: json ? `${JSON.stringify({ error: code, error_description: description })}\n` : `orgauth: ${description}\n`,
});

type Parsed = { outcome: CommandOutcome } | { command: Command; values: Values; json: boolean };

/** Reads the command line: help and usage errors are answered here, before any database is opened. */
function parseCommandLine(argv: string[]): Parsed {
  const json = argv.includes('--json');
  const found = findCommand(argv);
  if (!found) {
    if (argv.length === 0 || argv[0] === '--help' || argv[0] === '-h' || argv[0] === 'help') return { outcome: { code: 0, stdout: `${helpText()}\n`, stderr: '' } };
    return { outcome: failure(json, 'usage', `unknown command "${argv.filter((a) => !a.startsWith('-')).slice(0, 2).join(' ')}"; run \`orgauth --help\``) };
  }
  let values: Values;
  try {
    values = parseArgs({ args: found.rest, options: { ...GLOBAL_OPTIONS, ...found.command.options }, strict: true, allowPositionals: false }).values;
  } catch (err) {
    return { outcome: failure(json, 'usage', `${err instanceof Error ? err.message.split('\n')[0] : String(err)}\nusage: ${found.command.usage}`) };
  }
  if (values.help === true) return { outcome: { code: 0, stdout: `usage: ${found.command.usage}\n  ${found.command.summary}\n`, stderr: '' } };
  return { command: found.command, values, json };
}

/** A command's context as its caller gives it: without `progress`, it shows none. */
type ContextGiven = Omit<CommandContext, 'progress'> & { progress?: CommandContext['progress'] | undefined };

async function execute(parsed: Exclude<Parsed, { outcome: CommandOutcome }>, given: ContextGiven): Promise<CommandOutcome> {
  const ctx: CommandContext = { ...given, progress: given.progress ?? (() => NO_PROGRESS) };
  const { command, values, json } = parsed;
  try {
    const result = await command.run(ctx, values);
    return { code: 0, stdout: json ? `${JSON.stringify(result.json)}\n` : `${result.text}\n`, stderr: '' };
  } catch (err) {
    if (err instanceof UsageError) return failure(json, 'usage', `${err.description}\nusage: ${command.usage}`);
    if (err instanceof AppError) return failure(json, err.code, err.description);
    return failure(json, 'server_error', describeStartupError(err).join('; '));
  }
}

/**
 * Runs a command line on an open database: what the server does for a command sent to its admin
 * socket (with no progress shown: its stderr is not the user's terminal). Never throws.
 */
export async function runCommandLine(argv: string[], ctx: ContextGiven): Promise<CommandOutcome> {
  const parsed = parseCommandLine(argv);
  return 'outcome' in parsed ? parsed.outcome : execute(parsed, ctx);
}

/**
 * The command line as the server's admin socket gets it: the values of file options
 * (--idp-cert-file, --idp-metadata-file) made absolute, since the server reads them from its
 * own working directory.
 */
export function withAbsoluteFiles(argv: string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const inline = /^(--[a-z-]+-file)=(.+)$/s.exec(arg);
    const next = argv[i + 1];
    if (inline) out.push(`${inline[1]}=${path.resolve(inline[2]!)}`);
    else if (/^--[a-z-]+-file$/.test(arg) && next !== undefined && next !== '' && !next.startsWith('-')) {
      out.push(arg, path.resolve(next));
      i++;
    } else out.push(arg);
  }
  return out;
}

/** The newest job's id; undefined where there is no jobs table (a database migrated down). */
async function lastJobId(db: DB): Promise<number | undefined> {
  try {
    const row = await db.selectFrom('jobs').select((eb) => eb.fn.max('id').as('id')).executeTakeFirst();
    return Number(row?.id ?? 0);
  } catch {
    return undefined;
  }
}

async function finishJobsAfter(db: DB, afterId: number | undefined, line: ProgressLine): Promise<void> {
  if (afterId === undefined) return;
  const queued = await db.selectFrom('jobs').select(['id', 'kind']).where('id', '>', afterId).where('state', 'in', ['queued', 'running']).orderBy('id').execute();
  if (queued.length === 0) return;
  const runner = new JobRunner(db, { handlers: jobHandlers(), logger: { info: () => {}, warn: (o: object, m?: string) => console.error(m, o), error: (o: object, m?: string) => console.error(m, o) } as never });
  // Each is run here if it is due and nobody holds it; one a server beside us took, or one
  // waiting out a retry's backoff, is left to the servers (`orgauth job show` follows it).
  for (const [i, { id, kind }] of queued.entries()) {
    const shown = line.start(`job ${id} (${kind}${queued.length > 1 ? `, ${i + 1} of ${queued.length}` : ''})`);
    await runner.runToEnd(id, {
      timeoutMs: 0,
      onProgress: ({ state, done, total }) => shown.update(`${state}, ${count(done)}${total === null ? '' : ` of ${count(total)}`} done`),
    });
    shown.done();
  }
}

/** Runs one command; returns the exit code. Never throws. */
export async function runCli(argv: string[], io: CliIo): Promise<number> {
  const emit = (outcome: CommandOutcome): number => {
    if (outcome.stdout) io.stdout(outcome.stdout);
    if (outcome.stderr) io.stderr(outcome.stderr);
    return outcome.code;
  };
  const parsed = parseCommandLine(argv);
  if ('outcome' in parsed) return emit(parsed.outcome);

  const startupFailure = (err: unknown) =>
    failure(parsed.json, err instanceof ConfigError ? 'invalid_configuration' : err instanceof AppError ? err.code : 'startup_failed', describeStartupError(err).join('; '));
  let config: Config;
  try {
    config = loadConfig(io.env);
  } catch (err) {
    return emit(startupFailure(err));
  }
  usePasswordHashing(config.passwordHashing);
  // Progress of long work (migrations, waiting for the database, the command, its jobs) on the
  // terminal only; every progress is cleared before anything else is written.
  const terminal = io.terminal && !parsed.json && io.env.TERM !== 'dumb' ? { write: io.stderr, columns: io.terminal.columns } : undefined;
  const line = progressLine(terminal);
  const emitted = (outcome: CommandOutcome): number => {
    line.end();
    return emit(outcome);
  };
  // (Told only to a terminal: it costs a look at the pending migrations first.)
  let migrating: Progress | undefined;
  const migration: { onProgress?: MigrationProgress } = terminal
    ? { onProgress: ({ name, step, of }) => (migrating ??= line.start('migrating the database')).update(`${step} of ${of}, ${name}`) }
    : {};
  // The embedded database may belong to a running server, which then runs the command; to a
  // server still starting (no socket yet); or to another command, finishing soon. Both are
  // waited for, a little.
  const since = Date.now();
  const deadline = since + IN_USE_WAIT_MS;
  let waiting: Progress | undefined;
  let opened: Awaited<ReturnType<typeof openDatabase>>;
  for (;;) {
    try {
      opened = await openDatabase(config, undefined, migration);
      break;
    } catch (err) {
      if (!(err instanceof DatabaseInUseError)) return emitted(startupFailure(err));
      const forwarded = await sendToAdminSocket(config.dataDir, withAbsoluteFiles(argv));
      if ('outcome' in forwarded) return emitted(forwarded.outcome);
      if ('error' in forwarded) return emitted(failure(parsed.json, err.code, `${err.description}; its admin socket cannot be used: ${forwarded.error}`));
      if (Date.now() > deadline) return emitted(startupFailure(err));
      waiting ??= line.start('waiting for the database');
      waiting.update(`in use elsewhere, ${Math.floor((Date.now() - since) / 1000)} s of at most ${IN_USE_WAIT_MS / 1000} s`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
  line.end();
  try {
    const db = opened.handle.db;
    const before = await lastJobId(db);
    const outcome = await execute(parsed, { db, config, applied: opened.applied, progress: line.start });
    // A change that queued a job (an application disabled, a role narrowed) is finished here,
    // unless a server beside us takes it first (then this waits for it).
    await finishJobsAfter(db, before, line);
    return emitted(outcome);
  } finally {
    line.end();
    await opened.handle.close();
  }
}
