/**
 * Keyset pagination: pages follow the (organization_id, id) index, so page 40,000 costs what
 * page 1 does, and rows inserted meanwhile never duplicate or hide rows that existed.
 */
import { z } from 'zod';
import { InvalidRequestError } from '../errors.js';

export const listQuery = {
  limit: z.coerce.number().int().min(1).max(100).default(25).describe('page size, 1 to 100'),
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

/** Fetches limit + 1 rows to know whether another page exists; returns the page and its cursor. */
export function page<T extends { id: number }>(rows: T[], limit: number): { rows: T[]; next_cursor: string | null } {
  const more = rows.length > limit;
  const pageRows = more ? rows.slice(0, limit) : rows;
  const last = pageRows.at(-1);
  return { rows: pageRows, next_cursor: more && last ? encodeCursor(last.id) : null };
}
