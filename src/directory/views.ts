/**
 * What the dashboard's Directory page reads of what a directory pushed (issue 43): its users and
 * groups a page at a time, and counts that stop at a cap. Read-only; every read is bounded by
 * an index whatever the directory holds (100,000 users cost what 100 do):
 *
 * - the users in SCIM order, keyset-paged on (directory_id, seq), never OFFSET;
 * - a userName prefix search on the (directory_id, lower(user_name) text_pattern_ops) index: a
 *   range from the prefix to the prefix followed by U+10FFFF (the highest code point: no userName
 *   holds it), compared and ordered by code point (the opclass's ~>=~ and ~<~, so the range is
 *   exact under any collation), and the exact prefix test on what the range yields. The cursor is still the
 *   last row's seq, whose userName the next page starts after (userNames are unique without case);
 * - counts as "at most cap + 1" (a LIMIT under the count), shown as "1,000+" past the cap.
 */
import { sql } from 'kysely';
import type { DB } from '../db/connect.js';
import type { DirectoryRole } from '../db/schema.js';
import { DIRECTORY_ROLES, type GroupRole } from './directories.js';

/** Where the page's counts stop: past it, "1,000+". */
export const COUNT_CAP = 1000;
/** The longest userName prefix searched for (a userName is at most 254 characters). */
export const MAX_PREFIX = 254;
const AFTER_EVERY_NAME = '\u{10FFFF}';

export interface DirectoryUserRow {
  seq: number;
  /** The SCIM id. */
  id: string;
  user_name: string;
  display_name: string | null;
  active: boolean;
  /** The member's role in the organization now (a custom role by its name); null: not a member (deactivated, or removed). */
  member_role: string | null;
  created_at: Date;
  updated_at: Date;
}

export interface DirectoryGroupRow {
  seq: number;
  id: string;
  display_name: string;
  external_id: string | null;
  /** At most COUNT_CAP + 1: more than COUNT_CAP is shown as such. */
  members: number;
  created_at: Date;
  updated_at: Date;
}

/** A count that stopped at `cap` + 1, as a page shows it: "1,000+" past the cap. */
export function boundedCount(n: number, cap = COUNT_CAP): string {
  return n > cap ? `${cap.toLocaleString('en-US')}+` : n.toLocaleString('en-US');
}

/** How many users each directory holds, counting to COUNT_CAP + 1 at most (one index range each). */
export async function directoryUserCounts(db: DB, directoryIds: readonly number[]): Promise<Map<number, number>> {
  const counts = new Map<number, number>(directoryIds.map((id) => [id, 0]));
  if (directoryIds.length === 0) return counts;
  const rows = await db
    .selectFrom('directories as d')
    .select((eb) => [
      'd.id',
      eb
        .selectFrom((inner) => inner.selectFrom('directory_users as u').select('u.seq').whereRef('u.directory_id', '=', 'd.id').limit(COUNT_CAP + 1).as('capped'))
        .select((c) => c.fn.countAll<string | number>().as('n'))
        .as('users'),
    ])
    .where('d.id', 'in', directoryIds)
    .execute();
  for (const row of rows) counts.set(Number(row.id), Number(row.users ?? 0));
  return counts;
}

/**
 * A page of the directory's users: `limit` rows after the row whose seq is `after` (0: from the
 * start), in SCIM order, or, with `prefix`, those whose userName starts with it (without case), in
 * userName order. Each with the member's current role in `organizationId`.
 */
export async function listDirectoryUsers(db: DB, organizationId: number, directoryId: number, options: { after: number; limit: number; prefix?: string | undefined }): Promise<DirectoryUserRow[]> {
  let query = db
    .selectFrom('directory_users as u')
    .leftJoin('memberships as m', (join) => join.onRef('m.user_id', '=', 'u.user_id').on('m.organization_id', '=', organizationId))
    .leftJoin('roles as r', 'r.id', 'm.role_id')
    .select(['u.seq', 'u.id', 'u.user_name', 'u.display_name', 'u.active', 'u.created_at', 'u.updated_at', 'm.role', 'r.name as role_name'])
    .where('u.directory_id', '=', directoryId)
    .limit(options.limit);
  const prefix = options.prefix;
  if (prefix === undefined || prefix === '') {
    query = query.where('u.seq', '>', options.after).orderBy('u.seq');
  } else {
    // The index is text_pattern_ops (migration 0028, for SCIM's LIKE prefixes): its comparisons
    // are ~>=~, ~<~ and ~>~ (code-point order, whatever the collation), and so is the page's order.
    const key = sql<string>`lower(u.user_name)`;
    query = query
      .where(sql<boolean>`${key} ~>=~ lower(${prefix})`)
      .where(sql<boolean>`${key} ~<~ (lower(${prefix}) || ${AFTER_EVERY_NAME})`)
      .where(sql<boolean>`starts_with(${key}, lower(${prefix}))`)
      .orderBy(sql`${key} using ~<~`);
    if (options.after > 0) {
      query = query.where(sql<boolean>`${key} ~>~ (select lower(p.user_name) from directory_users p where p.directory_id = ${directoryId} and p.seq = ${options.after})`);
    }
  }
  const rows = await query.execute();
  return rows.map((r) => ({
    seq: Number(r.seq),
    id: r.id,
    user_name: r.user_name,
    display_name: r.display_name,
    active: r.active,
    member_role: r.role === null ? null : r.role === 'custom' ? (r.role_name ?? 'custom') : r.role,
    created_at: r.created_at,
    updated_at: r.updated_at,
  }));
}

/** A page of the directory's groups in SCIM order after seq `after`, each with its members counted to COUNT_CAP + 1. */
export async function listDirectoryGroups(db: DB, directoryId: number, options: { after: number; limit: number }): Promise<DirectoryGroupRow[]> {
  const rows = await db
    .selectFrom('directory_groups as g')
    .select((eb) => [
      'g.seq',
      'g.id',
      'g.display_name',
      'g.external_id',
      'g.created_at',
      'g.updated_at',
      eb
        .selectFrom((inner) => inner.selectFrom('directory_group_members as gm').select('gm.user_id').whereRef('gm.group_id', '=', 'g.id').limit(COUNT_CAP + 1).as('capped'))
        .select((c) => c.fn.countAll<string | number>().as('n'))
        .as('members'),
    ])
    .where('g.directory_id', '=', directoryId)
    .where('g.seq', '>', options.after)
    .orderBy('g.seq')
    .limit(options.limit)
    .execute();
  return rows.map((r) => ({ ...r, seq: Number(r.seq), members: Number(r.members ?? 0) }));
}

/** The role a group's members get from the directory's mappings (by displayName or id, without case; the highest), or undefined. */
export function mappedRole(group: { id: string; display_name: string }, mappings: readonly GroupRole[]): DirectoryRole | undefined {
  let best: DirectoryRole | undefined;
  for (const m of mappings) {
    const ref = m.group.toLowerCase();
    if (ref !== group.display_name.toLowerCase() && ref !== group.id.toLowerCase()) continue;
    if (best === undefined || DIRECTORY_ROLES.indexOf(m.role) > DIRECTORY_ROLES.indexOf(best)) best = m.role;
  }
  return best;
}
