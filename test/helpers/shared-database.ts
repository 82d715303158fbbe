/**
 * One database connection a test file's in-process commands and checks share, opened on first
 * use from the same environment the CLI gets (the embedded database on disk takes a second or
 * more to open). `close()` before a command that opens the database itself: an embedded
 * database is held by one process at a time. The next `db()` opens it again.
 */
import { loadConfig } from '../../src/config.js';
import type { DB, DatabaseHandle } from '../../src/db/connect.js';
import { openDatabase } from '../../src/runtime.js';

export function sharedDatabase(env: () => Record<string, string>): { db(): Promise<DB>; close(): Promise<void> } {
  let shared: Promise<DatabaseHandle> | undefined;
  return {
    db: async () => (await (shared ??= openDatabase(loadConfig(env())).then((opened) => opened.handle))).db,
    close: async () => {
      const open = shared;
      shared = undefined;
      await (await open?.catch(() => undefined))?.close();
    },
  };
}
