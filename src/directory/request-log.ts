/**
 * The last requests of each directory, for the Directory page (what Okta or Entra ID sent and
 * what it was answered): method, the path below the directory's base URL with its query (a
 * filter names a userName, never a secret), status and scimType. Never the token or a body.
 *
 * Bounded per directory whatever the volume (Okta and Entra push in bursts of thousands): every
 * TRIM_EVERY requests of a directory, rows past its newest KEEP are deleted, off the
 * (directory_id, id) index. Retention (src/retention.ts) drops what is older than a week.
 */
import { sql } from 'kysely';
import type { DB } from '../db/connect.js';

/** Requests kept per directory (the page shows the newest 100). */
export const KEEP = 1000;
const TRIM_EVERY = 100;
const MAX_PATH = 500;

const sinceTrim = new Map<number, number>();

export interface LoggedRequest {
  method: string;
  /** The request's URL as received. */
  url: string;
  /** The directory's base path (`/scim/v2/<id>`), cut from the front of the URL. */
  prefix: string;
  status: number;
  scimType: string | null;
}

export async function logDirectoryRequest(db: DB, directoryId: number, request: LoggedRequest): Promise<void> {
  const path = request.url.startsWith(request.prefix) ? request.url.slice(request.prefix.length) || '/' : request.url;
  await db
    .insertInto('directory_requests')
    .values({ directory_id: directoryId, method: request.method.slice(0, 10), path: path.slice(0, MAX_PATH), status: request.status, scim_type: request.scimType })
    .execute();
  const count = (sinceTrim.get(directoryId) ?? 0) + 1;
  sinceTrim.set(directoryId, count % TRIM_EVERY);
  if (count >= TRIM_EVERY) {
    await sql`delete from directory_requests where directory_id = ${directoryId} and id < (select id from directory_requests where directory_id = ${directoryId} order by id desc offset ${KEEP - 1} limit 1)`.execute(db);
  }
}

export interface DirectoryRequest {
  id: number;
  method: string;
  path: string;
  status: number;
  scim_type: string | null;
  created_at: Date;
}

/** A directory's newest requests, newest first. */
export async function recentDirectoryRequests(db: DB, directoryId: number, limit = 100): Promise<DirectoryRequest[]> {
  return db.selectFrom('directory_requests').select(['id', 'method', 'path', 'status', 'scim_type', 'created_at']).where('directory_id', '=', directoryId).orderBy('id', 'desc').limit(limit).execute();
}
