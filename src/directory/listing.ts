/**
 * SCIM lists (RFC 7644 §3.4.2): a filter, `startIndex` (1-based) and `count`, in the order the
 * directory's resources were created.
 *
 * Clients page with startIndex (Okta: 1, 101, 201, ...; Entra ID the same), which read as an
 * OFFSET costs a scan of every row before the page: the 1,000th page of 100,000 users read
 * 100,000 index entries. So each page served remembers where it ended, keyed by directory,
 * resource type, filter and the next startIndex; the next page then starts there by keyset on
 * (directory_id, seq), and costs what the first one did. The memory is bounded (CURSORS entries,
 * oldest dropped first) and only a shortcut: a startIndex it does not know is served by OFFSET.
 * A row created or deleted between pages moves what an OFFSET page holds anyway (RFC 7644
 * §3.4.2.4 does not promise consistency across pages); a cursor page is, if anything, steadier.
 *
 * totalResults is a count of every resource the filter matches, which costs as much as the
 * matches (100,000 index entries or rows for a filter that matches a 100,000-user directory):
 * counted on each page, a walk through N resources cost N²/count. So the first page of a walk
 * counts, and its cursor carries that total to the pages after it, each handing it on: a walk
 * counts once. A carried total is dropped when any resource of the directory may have changed
 * since it was counted (a SCIM write through this process: `directoryChanged`, called before
 * the write's answer is sent), and after TOTAL_TTL_MS whatever happened (a write through
 * another instance); the page then counts again.
 */
import type { RawBuilder } from 'kysely';
import type { DB } from '../db/connect.js';
import { groupFilterSql, userFilterSql } from './filter.js';
import { badScim } from './scim-errors.js';

/** The most resources one page holds (ServiceProviderConfig's filter.maxResults). */
export const MAX_COUNT = 1000;
export const DEFAULT_COUNT = 100;
const CURSORS = 10_000;
/** The longest a carried total is trusted (a write through another instance is not seen here). */
export const TOTAL_TTL_MS = 30_000;

export interface Page {
  startIndex: number;
  count: number;
  filter: string | undefined;
}

/** startIndex below 1 is 1 and count below 0 is 0 (RFC 7644 §3.4.2.4); count above MAX_COUNT is MAX_COUNT. */
export function readPage(query: Record<string, unknown>): Page {
  const number = (name: string, fallback: number): number => {
    const value = query[name];
    if (value === undefined || value === '') return fallback;
    if (typeof value !== 'string' || !/^-?\d{1,15}$/.test(value.trim())) throw badScim('invalidValue', `${name} must be an integer`);
    return Number(value);
  };
  const filter = query.filter;
  if (filter !== undefined && typeof filter !== 'string') throw badScim('invalidFilter', 'give filter once');
  return {
    startIndex: Math.max(1, number('startIndex', 1)),
    count: Math.min(MAX_COUNT, Math.max(0, number('count', DEFAULT_COUNT))),
    filter: filter === undefined || filter.trim() === '' ? undefined : filter,
  };
}

/** Where the page at a startIndex starts (after `seq`), and the total of the walk that got there. */
interface Cursor {
  seq: number;
  total: number;
  /** When the total was counted (performance.now()). */
  countedAt: number;
  /** The directory's `changes` then. */
  changes: number;
}

const cursors = new Map<string, Cursor>();
/**
 * Per directory, a number that grows with each SCIM write this process sees (never the same
 * twice, even after the entry is dropped: a dropped one reads 0): a carried total counted under
 * another number is not used.
 */
const changes = new Map<number, number>();
let lastChange = 0;

function remember(key: string, cursor: Cursor): void {
  cursors.delete(key);
  cursors.set(key, cursor);
  if (cursors.size > CURSORS) cursors.delete(cursors.keys().next().value!);
}

/** Forgets a directory's cursors (its resources changed in a way that moves pages: a delete). */
export function forgetCursors(directoryId: number): void {
  directoryChanged(directoryId);
  const prefix = `${directoryId}\u0000`;
  for (const key of cursors.keys()) if (key.startsWith(prefix)) cursors.delete(key);
}

/** A resource of the directory may have changed (a SCIM write, committed or not): totals counted before are not carried on. */
export function directoryChanged(directoryId: number): void {
  changes.delete(directoryId);
  changes.set(directoryId, ++lastChange);
  if (changes.size > CURSORS) changes.delete(changes.keys().next().value!);
}

type Table = 'directory_users' | 'directory_groups';

/** One page of a directory's users or groups: their ids in order, and how many match in all. */
export async function pageOf(db: DB, table: Table, directoryId: number, page: Page): Promise<{ ids: string[]; total: number }> {
  const where: RawBuilder<boolean> | undefined = page.filter === undefined ? undefined : table === 'directory_users' ? userFilterSql(page.filter) : groupFilterSql(page.filter);
  const base = () => {
    const q = db.selectFrom(table).where(`${table}.directory_id`, '=', directoryId);
    return where ? q.where(where) : q;
  };
  const keyOf = (startIndex: number) => `${directoryId}\u0000${table}\u0000${page.filter ?? ''}\u0000${startIndex}`;
  const cursor = page.startIndex === 1 ? undefined : cursors.get(keyOf(page.startIndex));
  const generation = changes.get(directoryId) ?? 0;
  // Read before counting: a write that lands while the count runs makes the count's generation old.
  let counted: Pick<Cursor, 'total' | 'countedAt' | 'changes'>;
  if (cursor !== undefined && cursor.changes === generation && performance.now() - cursor.countedAt < TOTAL_TTL_MS) {
    counted = cursor;
  } else {
    const countedAt = performance.now();
    const { total } = await base().select((eb) => eb.fn.countAll<number | string>().as('total')).executeTakeFirstOrThrow();
    counted = { total: Number(total), countedAt, changes: generation };
    // The page asked again (a retry, another client) carries the new total from here.
    if (cursor !== undefined) remember(keyOf(page.startIndex), { seq: cursor.seq, ...counted });
  }
  if (page.count === 0) return { ids: [], total: counted.total };
  const after = page.startIndex === 1 ? 0 : cursor?.seq;
  let query = base().select([`${table}.id`, `${table}.seq`]).orderBy(`${table}.seq`).limit(page.count);
  query = after !== undefined ? query.where(`${table}.seq`, '>', after) : query.offset(page.startIndex - 1);
  const rows = await query.execute();
  if (rows.length === page.count) remember(keyOf(page.startIndex + rows.length), { seq: Number(rows.at(-1)!.seq), total: counted.total, countedAt: counted.countedAt, changes: counted.changes });
  return { ids: rows.map((r) => r.id), total: counted.total };
}
