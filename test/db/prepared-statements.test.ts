/**
 * preparedStatement(): a hot statement compiled once and run with each call's values. Every
 * call answers with its own values (none is kept from the call that compiled it), a value used
 * twice fills both places, a value written into the template stays, and a handle with plugins
 * (the tests' recording handle) sees the same text and values the compiled path sends.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { preparedStatement } from '../../src/db/connect.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { recording } from '../helpers/plans.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
beforeAll(async () => {
  t = await createTestDatabase();
});
afterAll(() => t.close());

const constant = (n: number) => sql<number>`${n}::integer`;
const ECHO = preparedStatement<{ word: string; n: number; words: string[] | null; flag: boolean }, { word: string; twice: number; fixed: number; size: number | null; flag: boolean }>(
  'test_echo',
  (v) => sql`select ${v.word}::text as word, ${v.n}::integer + ${v.n}::integer as twice, ${constant(41)} + 1 as fixed,
    cardinality(${v.words}::text[]) as size, ${v.flag}::boolean as flag`,
);

describe(`preparedStatement on ${BACKEND}`, () => {
  it('runs every call with its own values, on the compiled text', async () => {
    const db = t.handle.db;
    const answers = await Promise.all(
      Array.from({ length: 20 }, (_, i) => ECHO(db, { word: `word ${i} '; --`, n: i, words: i % 2 === 0 ? null : Array.from({ length: i }, () => 'x'), flag: i % 3 === 0 })),
    );
    answers.forEach((rows, i) => {
      expect(rows).toEqual([{ word: `word ${i} '; --`, twice: 2 * i, fixed: 42, size: i % 2 === 0 ? null : i, flag: i % 3 === 0 }]);
    });
  });

  it('sends a handle with plugins the same text and values, so its plugins see the statement', async () => {
    const values = { word: 'seen', n: 7, words: ['a', 'b'], flag: true };
    const recorded = recording(t.handle.db);
    expect(await ECHO(recorded.db, values)).toEqual([{ word: 'seen', twice: 14, fixed: 42, size: 2, flag: true }]);
    expect(recorded.queries).toHaveLength(1);
    const [query] = recorded.queries;
    expect(query!.sql.startsWith('/* prepared: test_echo */ select $1::text as word')).toBe(true);
    expect(query!.parameters).toEqual(['seen', 7, 7, 41, ['a', 'b'], true]);
    // The compiled path: the same answer on the plain handle, compiled by now.
    expect(await ECHO(t.handle.db, values)).toEqual(await ECHO(recorded.db, values));
  });
});
