/**
 * Keyset pagination: pages follow an index led by organization_id (and the row's id, or for
 * members the user id), so page 40,000 costs what page 1 does, and rows inserted meanwhile never
 * duplicate or hide rows that existed. Lists are in ascending key order, except the newest-first
 * ones (connected apps, audit events), whose cursor holds the key the next page goes below.
 */
import { z } from 'zod';
import { InvalidRequestError } from '../errors.js';

export const listQuery = {
  // Canonical digits only: " 5", "1e1" or "0x10" are not a page size, whatever Number() makes of them.
  limit: z
    .preprocess((v) => (typeof v === 'string' && /^[1-9][0-9]{0,2}$/.test(v) ? Number(v) : v), z.number().int().min(1).max(100))
    .default(25)
    .describe('page size, 1 to 100'),
  cursor: z.string().max(200).optional().describe('opaque: the next_cursor of the previous page'),
};

export function encodeCursor(lastId: number): string {
  return Buffer.from(JSON.stringify({ after: lastId })).toString('base64url');
}

/** The id after which the page starts, or 0 for the first page. */
export function decodeCursor(cursor: string | undefined): number {
  if (cursor === undefined || cursor === '') return 0;
  try {
    const parsed: unknown = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'));
    if (typeof parsed === 'object' && parsed !== null && 'after' in parsed && Number.isSafeInteger(parsed.after) && Number(parsed.after) > 0) {
      return Number(parsed.after);
    }
  } catch {
    // falls through
  }
  throw new InvalidRequestError('cursor is invalid', { details: [{ path: 'cursor', message: 'not a cursor this API issued' }] });
}

/**
 * Callers fetch limit + 1 rows, in the list's order, to know whether another page exists; this
 * returns the page and the cursor of its last row's key (the position after which the next page
 * starts, whichever the list's direction).
 */
export function page<T>(rows: T[], limit: number, keyOf: (row: T) => number): { rows: T[]; next_cursor: string | null } {
  const more = rows.length > limit;
  const pageRows = more ? rows.slice(0, limit) : rows;
  const last = pageRows.at(-1);
  return { rows: pageRows, next_cursor: more && last ? encodeCursor(keyOf(last)) : null };
}

/**
 * One page of a list as the API and the CLI answer it: `fetch` gets limit + 1 rows from the
 * cursor on, `keyOf` is the row's keyset key and `out` the mapper of the fields that leave.
 */
export async function listPage<R, T>(
  limit: number,
  fetch: (limitPlusOne: number) => Promise<R[]>,
  keyOf: (row: R) => number,
  out: (row: R) => T,
): Promise<{ data: T[]; next_cursor: string | null }> {
  const result = page(await fetch(limit + 1), limit, keyOf);
  return { data: result.rows.map(out), next_cursor: result.next_cursor };
}

/** The key of the row before which a newest-first page starts, or undefined for the first page. */
export function decodeDescendingCursor(cursor: string | undefined): number | undefined {
  const after = decodeCursor(cursor);
  return after === 0 ? undefined : after;
}
