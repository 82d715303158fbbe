import { promises as fs } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { FileMigrationProvider, type MigrationResultSet, Migrator, NO_MIGRATIONS } from 'kysely/migration';
import type { DB } from './connect.js';

/** migrations/ beside src/, both in the checkout (TypeScript) and in dist/ (compiled). */
export const MIGRATIONS_DIR = fileURLToPath(new URL('../../migrations', import.meta.url));

export function createMigrator(db: DB): Migrator {
  return new Migrator({
    db,
    provider: new FileMigrationProvider({ fs, path, migrationFolder: MIGRATIONS_DIR }),
  });
}

export class MigrationError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = 'MigrationError';
  }
}

function check(result: MigrationResultSet): string[] {
  if (result.error !== undefined) {
    const failed = result.results?.find((r) => r.status === 'Error')?.migrationName;
    const cause = result.error instanceof Error ? result.error.message : String(result.error);
    throw new MigrationError(`migration ${failed ?? '(unknown)'} failed: ${cause}`, { cause: result.error });
  }
  return (result.results ?? []).filter((r) => r.status === 'Success').map((r) => r.migrationName);
}

/** Applies every pending migration; returns the names applied. Safe to run from several processes at once. */
export async function migrateToLatest(db: DB): Promise<string[]> {
  return check(await createMigrator(db).migrateToLatest());
}

/** Reverts every migration (tests and `orgauth migrate --down-all` only). Returns the names reverted. */
export async function migrateDownAll(db: DB): Promise<string[]> {
  return check(await createMigrator(db).migrateTo(NO_MIGRATIONS));
}
