/**
 * Says which back-end this run uses, and after the run drops every database it created on
 * TEST_DATABASE_URL's server (each test file creates and drops its own; this is the safety net).
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import type { TestProject } from 'vitest/node';

declare module 'vitest' {
  export interface ProvidedContext {
    runId: string;
  }
}

export default async function setup(project: TestProject) {
  const runId = `orgauth_test_${Date.now().toString(36)}_${randomBytes(3).toString('hex')}`;
  project.provide('runId', runId);
  const url = process.env.TEST_DATABASE_URL;
  if (!url) {
    console.log('orgauth tests: embedded PGlite databases (set TEST_DATABASE_URL to use PostgreSQL)');
    return;
  }
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  const { rows } = await client.query<{ server_version: string }>('show server_version');
  await client.end();
  console.log(`orgauth tests: PostgreSQL ${rows[0]?.server_version} at ${new URL(url).host}, databases ${runId}_*`);

  return async () => {
    const admin = new pg.Client({ connectionString: url });
    await admin.connect();
    const left = await admin.query<{ datname: string }>('select datname from pg_database where datname like $1', [`${runId}_%`]);
    for (const { datname } of left.rows) {
      await admin.query(`drop database if exists ${pg.escapeIdentifier(datname)} with (force)`);
    }
    await admin.end();
  };
}
