import fc from 'fast-check';
import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseTimestamptz, TIMESTAMPTZ_OID } from '../../src/db/types.js';
import { createTestDatabase } from '../helpers/db.js';

const standard = pg.types.getTypeParser(TIMESTAMPTZ_OID, 'text') as (value: string) => Date | number;
const pad = (n: number, width: number) => String(n).padStart(width, '0');

/** A timestamptz as PostgreSQL's ISO output writes it. */
const isoOutput = fc
  .record({
    year: fc.integer({ min: 1, max: 9999 }),
    month: fc.integer({ min: 1, max: 12 }),
    day: fc.integer({ min: 1, max: 28 }),
    hour: fc.integer({ min: 0, max: 23 }),
    minute: fc.integer({ min: 0, max: 59 }),
    second: fc.integer({ min: 0, max: 59 }),
    fraction: fc.option(fc.stringMatching(/^[0-9]{1,6}$/), { nil: undefined }),
    sign: fc.constantFrom('+', '-'),
    offset: fc.tuple(fc.integer({ min: 0, max: 15 }), fc.option(fc.integer({ min: 0, max: 59 }), { nil: undefined }), fc.option(fc.integer({ min: 0, max: 59 }), { nil: undefined })),
    bc: fc.boolean(),
  })
  .map((t) => {
    const [h, m, s] = t.offset;
    const zone = `${t.sign}${pad(h, 2)}${m === undefined ? '' : `:${pad(m, 2)}${s === undefined ? '' : `:${pad(s, 2)}`}`}`;
    const fraction = t.fraction === undefined ? '' : `.${t.fraction}`;
    return `${pad(t.year, 4)}-${pad(t.month, 2)}-${pad(t.day, 2)} ${pad(t.hour, 2)}:${pad(t.minute, 2)}:${pad(t.second, 2)}${fraction}${zone}${t.bc ? ' BC' : ''}`;
  });

describe('reading timestamptz', () => {
  it('gives the same instant as pg’s own parser for every ISO output', () => {
    fc.assert(
      fc.property(isoOutput, (value) => {
        expect(parseTimestamptz(value).getTime()).toBe((standard(value) as Date).getTime());
      }),
      { numRuns: 5000 },
    );
  });

  it.each([
    '2026-11-22 13:08:09.123456+00',
    '2026-11-22 13:08:09+05:30',
    '1900-01-01 00:00:00+00:19:32',
    '2026-03-01 01:02:03.9-03:30',
    '0050-06-01 12:00:00+00',
    '2000-01-01 00:00:00+00 BC',
    '12345-01-01 00:00:00+00',
    'infinity',
    '-infinity',
  ])('reads %s as pg does', (value) => {
    expect(parseTimestamptz(value)).toEqual(standard(value));
  });
});

describe('timestamptz from the database', () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  beforeAll(async () => {
    database = await createTestDatabase();
  });
  afterAll(() => database.close());

  it.each(['UTC', 'Asia/Kolkata', 'America/St_Johns', 'Europe/Amsterdam'])('is the same instant whatever the session time zone (%s)', async (zone) => {
    const rows = await database.handle.db.transaction().execute(async (trx) => {
      await sql`select set_config('TimeZone', ${zone}, true)`.execute(trx);
      const { rows } = await sql<{ at: Date; epoch_ms: string }>`
        select at, floor(extract(epoch from at) * 1000)::bigint::text as epoch_ms
        from (values (timestamptz '2026-11-22 13:08:09.123456Z'), (timestamptz '1900-01-01 00:00:00Z'), (now())) v(at)`.execute(trx);
      return rows;
    });
    expect(rows).toHaveLength(3);
    for (const row of rows) {
      expect(row.at).toBeInstanceOf(Date);
      expect(row.at.getTime()).toBe(Number(row.epoch_ms));
    }
  });
});
