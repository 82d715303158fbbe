/**
 * One Kysely handle over either a PostgreSQL pool (DATABASE_URL) or an embedded PGlite database.
 * Both back-ends read values the same way: bigint as number, date as 'YYYY-MM-DD', timestamptz
 * as Date, text[] as string[], jsonb as parsed JSON.
 */
import { existsSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { PGlite } from '@electric-sql/pglite';
import { btree_gin } from '@electric-sql/pglite/contrib/btree_gin';
import { pg_trgm } from '@electric-sql/pglite/contrib/pg_trgm';
import { CompiledQuery, Kysely, PostgresDialect, type PostgresPool, type PostgresPoolClient, type RawBuilder, sql, Transaction } from 'kysely';
import { PGliteDialect } from 'kysely-pglite-dialect';
import pg from 'pg';
import type { Logger } from 'pino';
import type { DatabaseTarget } from '../config.js';
import { acquireLock } from './lock.js';
import { MigrationDialect } from './migration-lock.js';
import type { Database } from './schema.js';
import type { PoolStats } from '../metrics.js';
import { DATE_OID, INT8_OID, keepDate, parseInt8, parseTimestamptz, TIMESTAMPTZ_OID } from './types.js';

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
  /**
   * The embedded database's files as one uncompressed tar (PGlite only): the tests migrate one
   * database per run and open a copy of it per file (`ConnectOptions.pgliteArchive`).
   */
  readonly dumpDataDir?: () => Promise<Blob>;
  /** Closes the pool or the embedded database (and releases its lock). Safe to call twice. */
  close(): Promise<void>;
}

export interface ConnectOptions {
  poolMax?: number;
  logger?: Pick<Logger, 'error'>;
  /**
   * PostgreSQL: a query without an answer after this long fails as "database unavailable" and its
   * connection is discarded; the server itself cancels the statement a little earlier
   * (statement_timeout), so a statement the client gave up on does not commit behind its back.
   * Unset: 30 s on the client side only (migrations may build an index for long); the server's
   * request pool uses REQUEST_QUERY_TIMEOUT_MS. Behind a transaction pooler the server-side
   * timeout comes from the role's settings instead (src/db/pooler.ts).
   */
  queryTimeoutMs?: number;
  /**
   * PostgreSQL: this connection only runs migrations (runtime.ts); each of its transactions holds
   * the migration lock and runs without statement_timeout (src/db/migration-lock.ts).
   */
  forMigrations?: boolean;
  /**
   * PGlite: start from this archive of a data directory (made by `dumpDataDir`) instead of an
   * empty database; for a data directory on disk, only when it holds no database yet.
   */
  pgliteArchive?: Blob;
}

/**
 * a request that needs an unreachable database fails within 2 s. Both waits a request can
 * meet stay under that: a connection (new, or a free one of a busy pool) within
 * CONNECT_TIMEOUT_MS, and an answer to each query within REQUEST_QUERY_TIMEOUT_MS. A stopped
 * server refuses at once; these bound a hung one (a network partition, a frozen host), whose
 * connections stay open and silent.
 */
export const CONNECT_TIMEOUT_MS = 1500;
export const REQUEST_QUERY_TIMEOUT_MS = 1500;
/** How much earlier than the client's deadline the server cancels a statement (a live but slow or blocked database). */
export const STATEMENT_TIMEOUT_MARGIN_MS = 250;

export async function connectDatabase(target: DatabaseTarget, options: ConnectOptions = {}): Promise<DatabaseHandle> {
  return target.kind === 'postgres' ? connectPostgres(target, options) : connectPglite(target.dataDir, options.pgliteArchive);
}

function connectPostgres(
  target: Extract<DatabaseTarget, { kind: 'postgres' }>,
  { poolMax = 10, logger, queryTimeoutMs, forMigrations = false }: ConnectOptions,
): DatabaseHandle {
  // Behind a transaction pooler no session state may outlive a transaction (src/db/pooler.ts).
  const sessions = target.pooler !== 'transaction';
  const typeOverrides = new pg.TypeOverrides();
  typeOverrides.setTypeParser(INT8_OID, parseInt8);
  typeOverrides.setTypeParser(DATE_OID, keepDate);
  typeOverrides.setTypeParser(TIMESTAMPTZ_OID, parseTimestamptz);
  const pool = new pg.Pool({
    connectionString: target.url,
    max: poolMax,
    types: typeOverrides,
    application_name: 'orgauth',
    // A request that needs the database fails fast when it is gone instead of queueing forever.
    connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
    idleTimeoutMillis: 30_000,
    // A connection whose server vanished (partition, not a clean shutdown) is noticed by TCP
    // keepalive, and no query holds a pool client for longer than query_timeout.
    keepAlive: true,
    query_timeout: queryTimeoutMs ?? 30_000,
    // A startup parameter, which PgBouncer refuses: there the role's own setting applies.
    ...(queryTimeoutMs !== undefined && sessions ? { statement_timeout: Math.max(1, queryTimeoutMs - STATEMENT_TIMEOUT_MARGIN_MS) } : {}),
  });
  // An idle client losing its connection (database restart) must not crash the process.
  pool.on('error', (err) => logger?.error({ err }, 'idle PostgreSQL connection failed'));
  // Nor a checked-out one: pg emits 'error' on the client itself, and pg-pool listens only while
  // the client is idle, so a connection dropped during a request (or between the statements of
  // a transaction) would be an unhandled 'error' event. The failure also reaches the request's
  // query (or its next one), which answers 503; pg-pool discards the broken client on release.
  pool.on('connect', (client) => {
    client.on('error', () => {});
  });
  const dialectConfig = { pool: discardingTimedOutClients(pool, { namedStatements: sessions }) };
  const db = new Kysely<Database>({ dialect: forMigrations ? new MigrationDialect(dialectConfig) : new PostgresDialect(dialectConfig) });
  // LISTEN needs a session that stays this client's: DATABASE_LISTEN_URL, which config.ts
  // requires behind a transaction pooler.
  const listener = new ListenConnection(target.listenUrl ?? target.url, logger);
  let closed: Promise<void> | undefined;
  const listen: Listen = (channel, onMessage, onReconnect) =>
    listener.subscribe(channel, onMessage, onReconnect).catch((err: unknown) => {
      throw target.listenUrl !== undefined ? new ListenUnavailableError(err) : err;
    });
  return {
    db,
    kind: 'postgres',
    poolStats: () => ({ total: pool.totalCount, idle: pool.idleCount, waiting: pool.waitingCount }),
    listen,
    close: () => (closed ??= listener.close().then(() => db.destroy())),
  };
}

/** The first LISTEN connection to DATABASE_LISTEN_URL failed (at start: runtime.ts names the variable). */
export class ListenUnavailableError extends Error {
  constructor(cause: unknown) {
    super(`cannot open the LISTEN connection (${cause instanceof Error ? cause.message || ('code' in cause ? String(cause.code) : 'unknown error') : String(cause)})`, { cause });
    this.name = 'ListenUnavailableError';
  }
}

const isQueryTimeout = (err: unknown): err is Error => err instanceof Error && err.message === 'Query read timeout';

/**
 * The pool as Kysely uses it, but a client whose query timed out is not reused: pg fails the
 * query yet keeps waiting for its answer on that connection, so anything sent after it (the
 * transaction's ROLLBACK, the next request's query) would wait behind it. Such a client fails
 * further queries at once and is discarded when released.
 */
/**
 * Marks a hot statement to be prepared once per connection and run by name afterwards: pg then
 * sends Bind/Execute only, and PostgreSQL reuses the plan instead of planning a statement of
 * several CTEs on every call (measured: planning took longer than executing the refresh
 * statement; 1.35x the throughput of the statement alone). Put it first in the SQL text; only
 * fixed texts may carry it (a name must always mean the same text). A comment elsewhere (PGlite,
 * and behind a transaction pooler, where the statement is sent unnamed: src/db/pooler.ts).
 */
export const prepared = (name: string) => sql.raw(`/* prepared: ${name} */ `);
const PREPARED = /^\/\* prepared: ([a-z_]+) \*\/ /;

/** A value's place in a statement compiled by preparedStatement(): filled in from the call's values. */
class Slot {
  constructor(readonly key: string) {}
}

/**
 * A hot statement of fixed text, marked as prepared() marks it, built and compiled once and run
 * with each call's values afterwards. Kysely otherwise builds and compiles a template again on
 * every call (13 µs for the refresh statement, and its garbage). `build` receives a
 * placeholder for each value by name; the text must not depend on a value (pass a boolean as a
 * value, never choose a fragment by it). Both back-ends speak PostgreSQL's SQL, so the text compiled
 * on the first call's handle serves every handle. A handle with plugins (the tests' capturing and
 * recording handles) gets the same template built with the values, so its plugins see it.
 */
export function preparedStatement<V extends Record<string, unknown>, R>(
  name: string,
  build: (values: { readonly [K in keyof V]: RawBuilder<V[K]> }) => RawBuilder<R>,
): (db: DB, values: V) => Promise<R[]> {
  type Placeholders = { readonly [K in keyof V]: RawBuilder<V[K]> };
  const template = (values: Placeholders) => sql<R>`${prepared(name)}${build(values)}`;
  const withValues = (values: V) => new Proxy({} as Placeholders, { get: (_, key) => sql.val(values[key as keyof V]) });
  let compiled: { text: string; parameters: readonly unknown[] } | undefined;
  return async (db, values) => {
    if (db.getExecutor().plugins.length > 0) return (await template(withValues(values)).execute(db)).rows;
    if (compiled === undefined) {
      const { sql: text, parameters } = template(new Proxy({} as Placeholders, { get: (_, key) => sql.val(new Slot(String(key))) })).compile(db);
      compiled = { text, parameters };
    }
    const parameters = compiled.parameters.map((p) => (p instanceof Slot ? values[p.key as keyof V] : p));
    return (await db.executeQuery<R>(CompiledQuery.raw(compiled.text, parameters))).rows;
  };
}

function discardingTimedOutClients(pool: pg.Pool, { namedStatements }: { namedStatements: boolean }): PostgresPool {
  return {
    async connect() {
      const client = await pool.connect();
      let broken: Error | undefined;
      const query = async (text: string, parameters: ReadonlyArray<unknown>) => {
        if (broken) throw broken;
        try {
          const name = namedStatements ? PREPARED.exec(text)?.[1] : undefined;
          return await (name === undefined ? client.query(text, [...parameters]) : client.query({ name, text, values: [...parameters] }));
        } catch (err) {
          if (isQueryTimeout(err)) broken = err;
          throw err;
        }
      };
      // Kysely passes a cursor only to stream(), which this code base does not use (no cursor is configured).
      return { query: query as unknown as PostgresPoolClient['query'], release: () => client.release(broken) };
    },
    end: () => pool.end(),
  };
}

interface Subscriber {
  onMessage: (payload: string) => void;
  onReconnect: (() => void) | undefined;
}

/**
 * The one LISTEN connection of a handle (a pooled one would be handed to queries), shared by
 * every channel: the revocations, the application cache, the jobs and the webhooks each
 * subscribe, and an instance holds one session for all of them instead of one each. It opens
 * with the first subscription (tried LISTEN_CONNECT_ATTEMPTS times; a failure is the
 * subscriber's), and comes back by itself after a failure, LISTENing to every channel again and
 * calling every subscriber's `onReconnect` (notifications sent meanwhile are lost).
 */
class ListenConnection {
  private readonly channels = new Map<string, Set<Subscriber>>();
  private client: pg.Client | undefined;
  /** The channels `client` LISTENs to, each with its LISTEN (a second subscriber waits for it too). */
  private listened = new Map<string, Promise<unknown>>();
  /** The first connection, while it is being made. */
  private opening: Promise<void> | undefined;
  private retry: NodeJS.Timeout | undefined;
  /** A reconnection after a failure, while it is being made. */
  private reconnecting: Promise<void> | undefined;
  private closed = false;

  constructor(
    private readonly url: string,
    private readonly logger: Pick<Logger, 'error'> | undefined,
  ) {}

  async subscribe(channel: string, onMessage: (payload: string) => void, onReconnect?: () => void): Promise<() => Promise<void>> {
    if (this.closed) throw new Error('the database handle is closed');
    const subscriber: Subscriber = { onMessage, onReconnect };
    let subscribers = this.channels.get(channel);
    if (!subscribers) this.channels.set(channel, (subscribers = new Set()));
    subscribers.add(subscriber);
    try {
      // While a reconnection is pending, it LISTENs to this channel with the others.
      if (this.reconnecting) await this.reconnecting.catch(() => {});
      else if (this.client === undefined && this.retry === undefined) await (this.opening ??= this.open().finally(() => (this.opening = undefined)));
      const client = this.client;
      let listening = this.listened.get(channel);
      if (client && !listening) {
        const started = client.query(`LISTEN ${pg.escapeIdentifier(channel)}`);
        listening = started;
        this.listened.set(channel, started);
        started.catch(() => {
          if (this.listened.get(channel) === started) this.listened.delete(channel);
        });
      }
      await listening;
    } catch (err) {
      this.remove(channel, subscriber);
      throw err;
    }
    return async () => {
      if (!this.remove(channel, subscriber)) return;
      if (this.channels.size === 0) await this.disconnect();
      else if (!this.channels.has(channel) && this.listened.delete(channel)) await this.client?.query(`UNLISTEN ${pg.escapeIdentifier(channel)}`).catch(() => {});
    };
  }

  /** For good (the handle closes): no subscription is taken afterwards. */
  async close(): Promise<void> {
    this.closed = true;
    await this.disconnect();
  }

  /** Ends the session (nobody listens any more); the next subscription opens another. */
  private async disconnect(): Promise<void> {
    clearTimeout(this.retry);
    this.retry = undefined;
    const client = this.client;
    this.client = undefined;
    this.listened = new Map();
    await client?.end().catch(() => {});
  }

  /** Removes a subscriber; false when it was not there (unsubscribed twice). */
  private remove(channel: string, subscriber: Subscriber): boolean {
    const subscribers = this.channels.get(channel);
    if (!subscribers?.delete(subscriber)) return false;
    if (subscribers.size === 0) this.channels.delete(channel);
    return true;
  }

  /** The first connection: a few tries, since on a busy server a connect may miss its 2 s once (seen in CI). */
  private async open(): Promise<void> {
    for (let attempt = 1; ; attempt++) {
      try {
        await this.connect();
        return;
      } catch (err) {
        if (attempt >= LISTEN_CONNECT_ATTEMPTS || this.closed) throw err;
        await new Promise((resolve) => setTimeout(resolve, 250));
      }
    }
  }

  /** Connects and LISTENs to every channel subscribed to, in one statement. */
  private async connect(): Promise<void> {
    const next = new pg.Client({ connectionString: this.url, application_name: 'orgauth-listen', keepAlive: true, connectionTimeoutMillis: 2000 });
    next.on('notification', (msg) => {
      for (const subscriber of this.channels.get(msg.channel) ?? []) {
        // One subscriber's failure is not the others'.
        try {
          subscriber.onMessage(msg.payload ?? '');
        } catch (err) {
          this.logger?.error({ err, channel: msg.channel }, 'a NOTIFY subscriber failed');
        }
      }
    });
    next.on('error', (err) => {
      this.logger?.error({ err, channels: [...this.channels.keys()] }, 'LISTEN connection failed; reconnecting');
      void next.end().catch(() => {});
      if (this.client === next) this.schedule();
    });
    const channels = new Set<string>();
    try {
      await next.connect();
      for (const c of this.channels.keys()) channels.add(c);
      if (channels.size > 0) await next.query([...channels].map((c) => `LISTEN ${pg.escapeIdentifier(c)}`).join('; '));
    } catch (err) {
      await next.end().catch(() => {});
      throw err;
    }
    // Closed, or everyone unsubscribed, while it connected.
    if (this.closed || this.channels.size === 0) {
      await next.end().catch(() => {});
      return;
    }
    // Channels subscribed to while the LISTEN was on its way are LISTENed by their subscribe().
    this.client = next;
    this.listened = new Map([...channels].map((c) => [c, Promise.resolve()]));
  }

  private schedule(): void {
    this.client = undefined;
    if (this.closed || this.retry) return;
    this.retry = setTimeout(() => {
      this.retry = undefined;
      const reconnecting = this.connect().then(
        () => {
          for (const subscribers of this.channels.values()) for (const s of subscribers) s.onReconnect?.();
        },
        (err: unknown) => {
          this.schedule();
          throw err;
        },
      );
      this.reconnecting = reconnecting;
      void reconnecting.catch(() => {}).finally(() => {
        if (this.reconnecting === reconnecting) this.reconnecting = undefined;
      });
    }, 500);
    this.retry.unref();
  }
}

/** Tries at a LISTEN connection before a start gives up (each within 2 s). */
const LISTEN_CONNECT_ATTEMPTS = 3;

async function connectPglite(dataDir: string | null, archive: Blob | undefined): Promise<DatabaseHandle> {
  let release = (): void => {};
  if (dataDir !== null) {
    mkdirSync(dataDir, { recursive: true, mode: 0o700 });
    release = acquireLock(`${dataDir}.lock`);
  }
  try {
    return pgliteHandle(await openPglite(dataDir, archive), release);
  } catch (err) {
    release();
    throw err;
  }
}

/**
 * An embedded database: in memory (`dataDir` null) or in a folder, started from `archive` (made
 * by `dumpDataDir`) when it holds no database yet. No lock: connectDatabase takes the folder's.
 */
export function openPglite(dataDir: string | null, archive?: Blob): Promise<PGlite> {
  return PGlite.create(dataDir ?? 'memory://', {
    parsers: { [INT8_OID]: parseInt8, [DATE_OID]: keepDate, [TIMESTAMPTZ_OID]: parseTimestamptz },
    // Contact search's trigram index (migration 0007); PostgreSQL ships them as contrib.
    extensions: { pg_trgm, btree_gin },
    ...(archive !== undefined && (dataDir === null || !existsSync(path.join(dataDir, 'PG_VERSION'))) ? { loadDataDir: archive } : {}),
  });
}

/** What a handle uses of an embedded database: queries (the Kysely dialect), LISTEN, the dump and closing. */
export type PgliteClient = Pick<PGlite, 'query' | 'listen' | 'dumpDataDir' | 'close' | 'closed'>;

/**
 * The handle over an open embedded database; closing it closes the database (the dialect does),
 * then calls `release` (the folder's lock), which may finish asynchronously.
 */
export function pgliteHandle(client: PgliteClient, release: () => void | Promise<void> = () => {}): DatabaseHandle {
  // The dialect only queries and closes (kysely-pglite-dialect's driver).
  const db = new Kysely<Database>({ dialect: new PGliteDialect(client as PGlite) });
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
    dumpDataDir: () => client.dumpDataDir('none'),
    close: () => (closed ??= db.destroy().finally(release)),
  };
}

/**
 * Runs `fn` in a transaction: a new one, or the caller's when `db` already is one, so domain
 * functions compose (the demo seed creates a user, an organization and applications atomically).
 */
export function inTransaction<T>(db: DB, fn: (trx: Transaction<Database>) => Promise<T>): Promise<T> {
  return db instanceof Transaction ? fn(db) : db.transaction().execute(fn);
}
