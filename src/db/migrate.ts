import { readdir } from 'node:fs/promises';
import { type Migration, type MigrationProvider, type MigrationResultSet, Migrator, NO_MIGRATIONS } from 'kysely';
import type { DB } from './connect.js';

/** migrations/ beside src/, both in the checkout (TypeScript) and in dist/ (compiled). */
export const MIGRATIONS_URL = new URL('../../migrations/', import.meta.url);

/**
 * Kysely's FileMigrationProvider, except that the import() is ours: under the test runner it
 * then loads the TypeScript sources, in production the compiled files. `onUp` is told the name
 * of each migration as it starts to apply.
 */
const migrationFiles = (onUp?: (name: string) => void): MigrationProvider => ({
  async getMigrations() {
    const migrations: Record<string, Migration> = {};
    const files = (await readdir(MIGRATIONS_URL)).filter((f) => /\.(js|ts)$/.test(f) && !f.endsWith('.d.ts')).sort();
    for (const file of files) {
      const { up, down }: Partial<Migration> = await import(new URL(file, MIGRATIONS_URL).href);
      if (typeof up !== 'function') throw new MigrationError(`migration ${file} exports no up()`);
      const name = file.replace(/\.(js|ts)$/, '');
      const told: Migration['up'] = onUp ? (db) => (onUp(name), up(db)) : up;
      migrations[name] = typeof down === 'function' ? { up: told, down } : { up: told };
    }
    return migrations;
  },
});

export function createMigrator(db: DB, onUp?: (name: string) => void): Migrator {
  return new Migrator({ db, provider: migrationFiles(onUp) });
}

/** Which migration is being applied: `step` of the `of` that were pending. */
export type MigrationProgress = (progress: { name: string; step: number; of: number }) => void;

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

/**
 * Applies every pending migration; returns the names applied. Safe to run from several
 * processes at once. `onProgress` (which costs a look at what is pending first) is told as each
 * one starts.
 */
export async function migrateToLatest(db: DB, options: { onProgress?: MigrationProgress | undefined } = {}): Promise<string[]> {
  const { onProgress } = options;
  if (!onProgress) return check(await createMigrator(db).migrateToLatest());
  const pending = (await createMigrator(db).getMigrations()).filter((m) => m.executedAt === undefined).length;
  let step = 0;
  return check(await createMigrator(db, (name) => onProgress({ name, step: ++step, of: Math.max(pending, step) })).migrateToLatest());
}

/** Reverts every migration (tests and `orgauth migrate --down-all` only). Returns the names reverted. */
export async function migrateDownAll(db: DB): Promise<string[]> {
  return check(await createMigrator(db).migrateTo(NO_MIGRATIONS));
}
