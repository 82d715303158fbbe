/**
 * Says which back-end this run uses, migrates one template database for the whole run (each
 * test file gets a copy: test/helpers/db.ts), and after the run drops every database it created
 * on TEST_DATABASE_URL's server (each test file creates and drops its own; this is the safety net).
 */
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pg from 'pg';
import type { TestProject } from 'vitest/node';
import { connectDatabase } from '../src/db/connect.js';
import { migrateToLatest } from '../src/db/migrate.js';

declare module 'vitest' {
  export interface ProvidedContext {
    runId: string;
    /** PostgreSQL: the migrated database each test file's database is created from. */
    templateDatabase: string;
    /** PGlite: a tar of a migrated data directory, loaded by each test file's database. */
    templateArchive: string;
    /** PGlite: a tar of a new data directory (initdb, no migration), for the empty databases on disk. */
    emptyArchive: string;
  }
}

export default async function setup(project: TestProject) {
  const runId = `orgauth_test_${Date.now().toString(36)}_${randomBytes(3).toString('hex')}`;
  project.provide('runId', runId);
  const url = process.env.TEST_DATABASE_URL;
  if (!url) {
    console.log('orgauth tests: embedded PGlite databases (set TEST_DATABASE_URL to use PostgreSQL)');
    const folder = mkdtempSync(path.join(tmpdir(), 'orgauth-template-'));
    const handle = await connectDatabase({ kind: 'pglite', dataDir: null });
    try {
      const dump = async (name: string) => {
        const archive = path.join(folder, name);
        writeFileSync(archive, Buffer.from(await (await handle.dumpDataDir!()).arrayBuffer()));
        return archive;
      };
      // initdb takes several seconds on the embedded database: done once here for both.
      project.provide('emptyArchive', await dump('empty.tar'));
      await migrateToLatest(handle.db);
      project.provide('templateArchive', await dump('migrated.tar'));
    } finally {
      await handle.close();
    }
    return () => rmSync(folder, { recursive: true, force: true });
  }
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  const { rows } = await client.query<{ server_version: string }>('show server_version');
  const template = `${runId}_template`;
  await client.query(`create database ${pg.escapeIdentifier(template)}`);
  await client.end();
  const templateUrl = new URL(url);
  templateUrl.pathname = `/${template}`;
  const handle = await connectDatabase({ kind: 'postgres', url: templateUrl.toString() });
  try {
    await migrateToLatest(handle.db);
  } finally {
    // A template must have no session open while databases are created from it.
    await handle.close();
  }
  project.provide('templateDatabase', template);
  console.log(`orgauth tests: PostgreSQL ${rows[0]?.server_version} at ${new URL(url).host}, databases ${runId}_*`);

  return async () => {
    const admin = new pg.Client({ connectionString: url });
    await admin.connect();
    // A worker's spare copy (test/helpers/db.ts) may still be being created by a server process
    // whose client has gone: it is dropped once it exists.
    const creating = () =>
      admin.query('select 1 from pg_stat_activity where pid <> pg_backend_pid() and datname is not null and query ilike $1 and state = $2', [`create database "${runId}_%`, 'active']);
    for (let waited = 0; (await creating()).rowCount! > 0 && waited < 300; waited++) await new Promise((resolve) => setTimeout(resolve, 100));
    const left = await admin.query<{ datname: string }>('select datname from pg_database where datname like $1', [`${runId}_%`]);
    for (const { datname } of left.rows) {
      await admin.query(`drop database if exists ${pg.escapeIdentifier(datname)} with (force)`);
    }
    await admin.end();
  };
}
