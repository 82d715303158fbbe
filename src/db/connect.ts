/**
 * One Kysely handle over either a PostgreSQL pool (DATABASE_URL) or an embedded PGlite database.
 * Both back-ends read values the same way: bigint as number, date as 'YYYY-MM-DD', timestamptz
 * as Date, text[] as string[], jsonb as parsed JSON.
 */
import { mkdirSync } from 'node:fs';
import { PGlite, types as pgliteTypes } from '@electric-sql/pglite';
import { Kysely, PostgresDialect, Transaction } from 'kysely';
import { PGliteDialect } from 'kysely-pglite-dialect';
import pg from 'pg';
import type { Logger } from 'pino';
import type { DatabaseTarget } from '../config.js';
import { acquireLock } from './lock.js';
import type { Database } from './schema.js';
import type { PoolStats } from '../metrics.js';

export type DB = Kysely<Database>;

/** Subscribes to a NOTIFY channel; resolves to the function that unsubscribes. */
export type Listen = (channel: string, onMessage: (payload: string) => void, onReconnect?: () => void) => Promise<() => Promise<void>>;

export interface DatabaseHandle {
  readonly db: DB;
  readonly kind: DatabaseTarget['kind'];
  /**
   * LISTEN on a channel. On PostgreSQL a dedicated connection that reconnects by itself
   * (calling `onReconnect`, since notifications sent meanwhile are lost); on PGlite in-process.
   */
  readonly listen: Listen;
  /** The pool's connections (PostgreSQL only), for metrics. */
  readonly poolStats?: () => PoolStats;
  /** Closes the pool or the embedded database (and releases its lock). Safe to call twice. */
  close(): Promise<void>;
}

const INT8_OID = 20;
const DATE_OID = 1082;

/** bigint → number, refusing values a JS number cannot hold exactly. */
function parseInt8(value: string): number {
  const n = Number(value);
  if (!Number.isSafeInteger(n)) throw new RangeError(`bigint value ${value} is beyond Number.MAX_SAFE_INTEGER`);
  return n;
}
const keepDate = (value: string): string => value;

export interface ConnectOptions {
  poolMax?: number;
  logger?: Pick<Logger, 'error'>;
}

export async function connectDatabase(target: DatabaseTarget, options: ConnectOptions = {}): Promise<DatabaseHandle> {
  return target.kind === 'postgres' ? connectPostgres(target.url, options) : connectPglite(target.dataDir);
}

function connectPostgres(url: string, { poolMax = 10, logger }: ConnectOptions): DatabaseHandle {
  const typeOverrides = new pg.TypeOverrides();
  typeOverrides.setTypeParser(INT8_OID, parseInt8);
  typeOverrides.setTypeParser(DATE_OID, keepDate);
  const pool = new pg.Pool({
    connectionString: url,
    max: poolMax,
    types: typeOverrides,
    application_name: 'orgauth',
    // A request that needs the database fails fast when it is gone instead of queueing forever.
    connectionTimeoutMillis: 2000,
    idleTimeoutMillis: 30_000,
    // A connection whose server vanished (partition, not a clean shutdown) is noticed by TCP
    // keepalive, and no query holds a pool client forever.
    keepAlive: true,
    query_timeout: 30_000,
  });
  // An idle client losing its connection (database restart) must not crash the process.
  pool.on('error', (err) => logger?.error({ err }, 'idle PostgreSQL connection failed'));
  const db = new Kysely<Database>({ dialect: new PostgresDialect({ pool }) });
  const listeners = new Set<() => Promise<void>>();
  let closed: Promise<void> | undefined;
  const listen: Listen = async (channel, onMessage, onReconnect) => {
    const stop = await listenPostgres(url, channel, onMessage, onReconnect, logger);
    listeners.add(stop);
    return async () => {
      listeners.delete(stop);
      await stop();
    };
  };
  return {
    db,
    kind: 'postgres',
    poolStats: () => ({ total: pool.totalCount, idle: pool.idleCount, waiting: pool.waitingCount }),
    listen,
    close: () => (closed ??= Promise.all([...listeners].map((stop) => stop())).then(() => db.destroy())),
  };
}

/** A dedicated LISTEN connection (a pooled one would be handed to queries) that comes back after failures. */
async function listenPostgres(
  url: string,
  channel: string,
  onMessage: (payload: string) => void,
  onReconnect: (() => void) | undefined,
  logger: Pick<Logger, 'error'> | undefined,
): Promise<() => Promise<void>> {
  let stopped = false;
  let client: pg.Client | undefined;
  let retry: NodeJS.Timeout | undefined;
  const connect = async (): Promise<void> => {
    const next = new pg.Client({ connectionString: url, application_name: 'orgauth-listen', keepAlive: true, connectionTimeoutMillis: 2000 });
    next.on('notification', (msg) => {
      if (msg.channel === channel) onMessage(msg.payload ?? '');
    });
    next.on('error', (err) => {
      logger?.error({ err, channel }, 'LISTEN connection failed; reconnecting');
      void next.end().catch(() => {});
      if (client === next) schedule();
    });
    await next.connect();
    await next.query(`LISTEN ${pg.escapeIdentifier(channel)}`);
    client = next;
  };
  const schedule = (): void => {
    client = undefined;
    if (stopped || retry) return;
    retry = setTimeout(() => {
      retry = undefined;
      connect().then(
        () => onReconnect?.(),
        () => schedule(),
      );
    }, 500);
    retry.unref();
  };
  await connect();
  return async () => {
    stopped = true;
    clearTimeout(retry);
    await client?.end().catch(() => {});
  };
}

async function connectPglite(dataDir: string | null): Promise<DatabaseHandle> {
  let release = (): void => {};
  if (dataDir !== null) {
    mkdirSync(dataDir, { recursive: true, mode: 0o700 });
    release = acquireLock(`${dataDir}.lock`);
  }
  try {
    const client = await PGlite.create(dataDir ?? 'memory://', {
      parsers: { [INT8_OID]: parseInt8, [pgliteTypes.DATE]: keepDate },
    });
    const db = new Kysely<Database>({ dialect: new PGliteDialect(client) });
    let closed: Promise<void> | undefined;
    return {
      db,
      kind: 'pglite',
      listen: async (channel, onMessage) => {
        const unlisten = await client.listen(channel, onMessage);
        return async () => {
          if (!client.closed) await unlisten();
        };
      },
      close: () => (closed ??= db.destroy().finally(release)),
    };
  } catch (err) {
    release();
    throw err;
  }
}

/**
 * Runs `fn` in a transaction: a new one, or the caller's when `db` already is one, so domain
 * functions compose (the demo seed creates a user, an organization and applications atomically).
 */
export function inTransaction<T>(db: DB, fn: (trx: Transaction<Database>) => Promise<T>): Promise<T> {
  return db instanceof Transaction ? fn(db) : db.transaction().execute(fn);
}
