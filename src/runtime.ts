/** What the server and the CLI share when they start: opening the database and reporting failures. */
import v8 from 'node:v8';
import type { Logger } from 'pino';
import { ConfigError, type Config } from './config.js';
import { connectDatabase, type DatabaseHandle, ListenUnavailableError, REQUEST_QUERY_TIMEOUT_MS } from './db/connect.js';
import { isDatabaseUnavailable } from './db/errors.js';
import { migrateToLatest, type MigrationProgress } from './db/migrate.js';
import { statementTimeoutProblem } from './db/pooler.js';
import { AppError } from './errors.js';

/** V8 lets old space grow up to four times the live heap only with a heap limit this large. */
const LARGE_HEAP_LIMIT = 2 * 1024 ** 3;

/**
 * Lets V8's old space grow to twice the live heap before a full collection, instead of up to
 * four times: V8's factor when collections are fast and the heap limit is 2 GB or more (on
 * Node 20, hosts or containers with 4 GB of memory or more). The server's live heap is about
 * 30 MB, and under load (50 connections listing contacts) the default let the heap reach
 * 165 MB between collections. Measured with the bench: peak RSS of a 20 s contacts load
 * 235 → 167 MB, of a whole run 239 → 163 MB, req/s the same within the machine's noise. Below
 * that limit V8 already keeps the factor at 2 or less (and lowers it near the limit), so the
 * setting is left alone there, as it is when the operator gives node --heap-growing-percent.
 * V8 reads it at each collection, so the server sets it once it is ready: set first thing, it
 * made start-up collect more often while loading a million revoked grants (spawn to /healthz
 * 1.63 → 1.55 s, medians of six alternating spawns; the same peak RSS). Returns whether it set it.
 */
export function limitHeapGrowth(): boolean {
  if (process.execArgv.some((arg) => arg.startsWith('--heap-growing-percent') || arg.startsWith('--heap_growing_percent'))) return false;
  if (v8.getHeapStatistics().heap_size_limit < LARGE_HEAP_LIMIT) return false;
  v8.setFlagsFromString('--heap-growing-percent=100');
  return true;
}

/**
 * Connects and applies pending migrations (`migration.onProgress` is told as each starts);
 * returns the handle and the migrations applied. On
 * PostgreSQL the handle answers requests, so each query gets REQUEST_QUERY_TIMEOUT_MS;
 * migrations, which may take longer, run before it on a connection of their own. Behind a
 * transaction pooler that timeout is the role's setting, which is checked (src/db/pooler.ts).
 */
export async function openDatabase(
  config: Config,
  logger?: Logger,
  migration: { onProgress?: MigrationProgress | undefined } = {},
): Promise<{ handle: DatabaseHandle; applied: string[] }> {
  const options = { poolMax: config.databasePoolMax, ...(logger ? { logger } : {}) };
  if (config.database.kind === 'postgres') {
    const migrator = await connectDatabase(config.database, { ...options, poolMax: 1, forMigrations: true });
    let applied: string[];
    try {
      applied = await migrateToLatest(migrator.db, migration);
    } finally {
      await migrator.close();
    }
    const handle = await connectDatabase(config.database, { ...options, queryTimeoutMs: REQUEST_QUERY_TIMEOUT_MS });
    if (config.database.pooler === 'transaction') {
      try {
        const problem = await statementTimeoutProblem(handle.db);
        if (problem !== undefined) logger?.warn(problem);
      } catch (err) {
        await handle.close().catch(() => {});
        throw err;
      }
    }
    return { handle, applied };
  }
  const handle = await connectDatabase(config.database, options);
  try {
    return { handle, applied: await migrateToLatest(handle.db, migration) };
  } catch (err) {
    await handle.close().catch(() => {});
    throw err;
  }
}

/**
 * One line per problem, never a stack trace: configuration errors name each bad variable, an
 * unreachable database says so without echoing the URL (it may hold a password).
 */
export function describeStartupError(err: unknown): string[] {
  if (err instanceof ConfigError) return err.problems;
  if (err instanceof AppError) return [err.description];
  if (err instanceof ListenUnavailableError) return [`DATABASE_LISTEN_URL: ${err.message.split('\n')[0]}`];
  if (isDatabaseUnavailable(err)) {
    const reason = err instanceof Error ? (err.message || ('code' in err ? String(err.code) : 'unknown error')) : String(err);
    return [`DATABASE_URL: cannot reach the database (${reason.split('\n')[0]})`];
  }
  return [err instanceof Error ? err.message.split('\n')[0] ?? err.name : String(err)];
}
