/**
 * A fresh, migrated database per test file: a new database on TEST_DATABASE_URL's server, or an
 * embedded PGlite database (in memory, or in a temporary DATA_DIR when a process must open it).
 * Migrations run once per run (test/global-setup.ts); each file's database is a copy of that
 * template (PostgreSQL: CREATE DATABASE … TEMPLATE; PGlite: the dumped data directory loaded).
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pg from 'pg';
import { inject } from 'vitest';
import type { DatabaseTarget } from '../../src/config.js';
import { connectDatabase, type DatabaseHandle } from '../../src/db/connect.js';
import { leaseMemoryDatabase } from './memory-databases.js';

export const TEST_DATABASE_URL = process.env.TEST_DATABASE_URL;
export const BACKEND: DatabaseTarget['kind'] = TEST_DATABASE_URL ? 'postgres' : 'pglite';

let counter = 0;

export interface TestDatabase {
  target: DatabaseTarget;
  /** Environment variables that point the server or the CLI at this database. */
  env: Record<string, string>;
  /** Removes the database (PostgreSQL) or its folder (PGlite). */
  drop(): Promise<void>;
}

async function adminQuery(sql: string): Promise<void> {
  const client = new pg.Client({ connectionString: TEST_DATABASE_URL });
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

/**
 * Creates an empty database (not migrated). `onDisk` gives PGlite a DATA_DIR so a child process
 * can open it; PostgreSQL databases are always reachable by URL.
 */
export async function createEmptyDatabase(options: { onDisk?: boolean } = {}): Promise<TestDatabase> {
  return createDatabase({ ...options, migrated: false });
}

/** Creates a PostgreSQL database for this run, a copy of the migrated template or empty; its name. */
async function createPostgresDatabase(migrated: boolean): Promise<string> {
  const name = `${inject('runId')}_${process.pid}_${++counter}`;
  const template = migrated ? ` template ${pg.escapeIdentifier(inject('templateDatabase'))}` : '';
  await adminQuery(`create database ${pg.escapeIdentifier(name)}${template}`);
  return name;
}

/**
 * The next file's copy of the template, made while this file runs: CREATE DATABASE … TEMPLATE
 * takes about half a second (it writes the copy to the WAL and syncs it), which every file would
 * otherwise wait for before its first test. A worker's last spare is dropped by the run's
 * teardown (test/global-setup.ts).
 */
let spare: Promise<string> | undefined;

function takeMigratedPostgresDatabase(): Promise<string> {
  const next = spare ?? createPostgresDatabase(true);
  spare = createPostgresDatabase(true);
  // Awaited by whoever takes it; a failure here would otherwise be an unhandled rejection.
  spare.catch(() => {});
  return next;
}

async function createDatabase(options: { onDisk?: boolean; migrated: boolean }): Promise<TestDatabase> {
  const secret = 'test-secret-key-0123456789abcdefghijklmnop';
  // Child processes (server, CLI) hash passwords cheaply too (test/setup.ts does it in-process).
  const hashing = { PASSWORD_HASHING: 'weak-for-tests' };
  if (TEST_DATABASE_URL) {
    const name = options.migrated ? await takeMigratedPostgresDatabase() : await createPostgresDatabase(false);
    const url = new URL(TEST_DATABASE_URL);
    url.pathname = `/${name}`;
    return {
      target: { kind: 'postgres', url: url.toString() },
      env: { DATABASE_URL: url.toString(), SECRET_KEY: secret, ...hashing },
      drop: () => adminQuery(`drop database if exists ${pg.escapeIdentifier(name)} with (force)`),
    };
  }
  if (!options.onDisk) {
    return { target: { kind: 'pglite', dataDir: null }, env: { ...hashing }, drop: async () => {} };
  }
  const dataDir = mkdtempSync(path.join(tmpdir(), 'orgauth-test-'));
  const target: DatabaseTarget = { kind: 'pglite', dataDir: path.join(dataDir, 'pgdata') };
  if (!options.migrated) {
    // The run's new data directory written here (initdb, no migration), as the server or the CLI
    // would find a DATA_DIR it had just made: opening an empty folder would run initdb again (5 s).
    await (await connectDatabase(target, { pgliteArchive: (emptyArchive ??= archiveOf('emptyArchive')) })).close();
  }
  return {
    target,
    env: { DATA_DIR: dataDir, SECRET_KEY: secret, ...hashing },
    drop: async () => rmSync(dataDir, { recursive: true, force: true }),
  };
}

/** The PGlite archives (test/global-setup.ts), each read once per worker. */
let templateArchive: Blob | undefined;
let emptyArchive: Blob | undefined;
const archiveOf = (name: 'templateArchive' | 'emptyArchive') => new Blob([readFileSync(inject(name))]);

/** A migrated database with an open handle; `close()` closes the handle and drops the database. */
export async function createTestDatabase(options: { onDisk?: boolean } = {}): Promise<
  TestDatabase & { handle: DatabaseHandle; close(): Promise<void> }
> {
  const database = await createDatabase({ ...options, migrated: true });
  const template = () => (templateArchive ??= archiveOf('templateArchive'));
  // In memory: a database the worker kept from an earlier file, emptied (test/helpers/memory-databases.ts).
  const handle =
    database.target.kind === 'pglite' && database.target.dataDir === null
      ? await leaseMemoryDatabase(template)
      : await connectDatabase(database.target, { pgliteArchive: database.target.kind === 'pglite' ? template() : undefined });
  return {
    ...database,
    handle,
    close: async () => {
      await handle.close();
      await database.drop();
    },
  };
}

/** Runs `fn` on a connection of its own to `target` (beside a CLI or a server using the database), closed after. */
export async function withDatabase<T>(target: DatabaseTarget, fn: (db: DatabaseHandle['db']) => Promise<T>): Promise<T> {
  const handle = await connectDatabase(target);
  try {
    return await fn(handle.db);
  } finally {
    await handle.close();
  }
}
