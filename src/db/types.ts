/**
 * How values arrive from PostgreSQL (text format), the same on both back-ends: bigint as
 * number, date as 'YYYY-MM-DD', timestamptz as Date.
 */
import pg from 'pg';

export const INT8_OID = 20;
export const DATE_OID = 1082;
export const TIMESTAMPTZ_OID = 1184;

/** bigint → number, refusing values a JS number cannot hold exactly. */
export function parseInt8(value: string): number {
  const n = Number(value);
  if (!Number.isSafeInteger(n)) throw new RangeError(`bigint value ${value} is beyond Number.MAX_SAFE_INTEGER`);
  return n;
}

export const keepDate = (value: string): string => value;

const standardTimestamptz = pg.types.getTypeParser(TIMESTAMPTZ_OID, 'text') as (value: string) => Date;

/** The decimal number in value[start, end), or NaN when a character there is not a digit. */
function digits(value: string, start: number, end: number): number {
  let n = 0;
  for (let i = start; i < end; i++) {
    const d = value.charCodeAt(i) - 48;
    if (d < 0 || d > 9) return Number.NaN;
    n = n * 10 + d;
  }
  return n;
}

/**
 * timestamptz as PostgreSQL writes it with DateStyle ISO ('2026-11-22 13:08:09.123456+00',
 * offsets '+05:30' or '-00:09:21' too), read by position. pg's own parser (postgres-date) runs
 * three regular expressions per value; a page of 50 contacts has 100 timestamps, and that parser
 * was the largest single allocator on the API's list path (31% of the bytes allocated per
 * request, sampled). Anything else (BC dates, years before 1000 or after 9999, infinity) goes
 * to that parser, so results are the same for every input.
 */
export function parseTimestamptz(value: string): Date {
  const length = value.length;
  if (
    length < 22 ||
    value.charCodeAt(4) !== 45 /* - */ ||
    value.charCodeAt(7) !== 45 ||
    value.charCodeAt(10) !== 32 /*   */ ||
    value.charCodeAt(13) !== 58 /* : */ ||
    value.charCodeAt(16) !== 58
  ) {
    return standardTimestamptz(value);
  }
  let i = 19;
  let ms = 0;
  if (value.charCodeAt(i) === 46 /* . */) {
    const start = ++i;
    // Milliseconds from the first three digits; finer digits are dropped, as Date does.
    for (let scale = 100, d = value.charCodeAt(i) - 48; d >= 0 && d <= 9; d = value.charCodeAt(++i) - 48) {
      ms += d * scale;
      scale = scale === 1 ? 0 : scale / 10;
    }
    if (i === start) return standardTimestamptz(value);
  }
  const sign = value.charCodeAt(i);
  if (sign !== 43 /* + */ && sign !== 45 /* - */) return standardTimestamptz(value);
  // ±HH, ±HH:MM or ±HH:MM:SS, and nothing after it.
  const zone = length - i - 1;
  if (zone !== 2 && zone !== 5 && zone !== 8) return standardTimestamptz(value);
  let offset = digits(value, i + 1, i + 3) * 3600;
  if (zone >= 5) offset += value.charCodeAt(i + 3) === 58 ? digits(value, i + 4, i + 6) * 60 : Number.NaN;
  if (zone === 8) offset += value.charCodeAt(i + 6) === 58 ? digits(value, i + 7, i + 9) : Number.NaN;
  const year = digits(value, 0, 4);
  const time = Date.UTC(
    year,
    digits(value, 5, 7) - 1,
    digits(value, 8, 10),
    digits(value, 11, 13),
    digits(value, 14, 16),
    digits(value, 17, 19),
    ms,
  );
  // NaN: a character out of place. Years 0–99 would be read as 1900–1999 by Date.UTC.
  if (Number.isNaN(time) || Number.isNaN(offset) || year < 1000) return standardTimestamptz(value);
  return new Date(sign === 43 ? time - offset * 1000 : time + offset * 1000);
}
