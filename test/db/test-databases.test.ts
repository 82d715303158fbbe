/**
 * The test suite's own databases (test/helpers/db.ts): each file's database starts as the
 * migrated template holds it, whatever the file before it did. On PGlite the worker keeps an
 * in-memory database from one file to the next and empties it (test/helpers/memory-databases.ts):
 * these tests prove that what a file wrote, set or listened to does not reach the next, that a
 * closed handle answers nothing, and that a database whose schema a file changed is not kept.
 */
import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { memoryDatabasesOpened } from '../helpers/memory-databases.js';

const organizations = async (t: Awaited<ReturnType<typeof createTestDatabase>>) =>
  (await sql<{ id: number; name: string }>`select id, name from organizations order by id`.execute(t.handle.db)).rows;

describe(`each file's database on ${BACKEND}`, () => {
  it('starts as the template: rows, identity sequences, session settings and LISTEN from the one before are gone', async () => {
    const first = await createTestDatabase();
    await first.handle.db.insertInto('organizations').values([{ name: 'Left behind' }, { name: 'Also left' }]).execute();
    await sql`set application_name = 'left-behind'`.execute(first.handle.db);
    const heard: string[] = [];
    await first.handle.listen('test_databases', (payload) => heard.push(payload));
    await first.close();

    const opened = memoryDatabasesOpened();
    const second = await createTestDatabase();
    try {
      // On PGlite the same database, kept and emptied; on PostgreSQL a new copy of the template.
      if (BACKEND === 'pglite') expect(memoryDatabasesOpened()).toBe(opened);
      expect(await organizations(second)).toEqual([]);
      await second.handle.db.insertInto('organizations').values({ name: 'New' }).execute();
      expect(await organizations(second)).toEqual([{ id: 1, name: 'New' }]);
      expect((await sql<{ name: string }>`select current_setting('application_name') as name`.execute(second.handle.db)).rows[0]!.name).not.toBe('left-behind');
      await sql`select pg_notify('test_databases', 'for the second file')`.execute(second.handle.db);
      await sql`select 1`.execute(second.handle.db);
      expect(heard).toEqual([]);
      // The first file's handle answers nothing any more.
      await expect(sql`select 1`.execute(first.handle.db)).rejects.toThrow();
    } finally {
      await second.close();
    }
  });

  it('a database whose schema a file changed is not handed to the next one', async () => {
    const first = await createTestDatabase();
    await sql`alter table organizations add column left_behind text`.execute(first.handle.db);
    await sql`create table left_behind (id int)`.execute(first.handle.db);
    await first.close();

    // On PGlite the worker hands out the database kept last first: were the changed one kept,
    // this would be it.
    const second = await createTestDatabase();
    try {
      const columns = await sql<{ n: number }>`select count(*)::int as n from information_schema.columns where table_name = 'organizations' and column_name = 'left_behind'`.execute(second.handle.db);
      expect(columns.rows[0]!.n).toBe(0);
      await expect(sql`select * from left_behind`.execute(second.handle.db)).rejects.toThrow(/left_behind/);
    } finally {
      await second.close();
    }
  });
});
