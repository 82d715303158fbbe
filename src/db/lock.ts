/**
 * A pid lock file beside the embedded database. PGlite is single-process: the server and a CLI
 * command opening the same DATA_DIR at once would corrupt it, so the second one is refused.
 */
import { readFileSync, unlinkSync, writeFileSync } from 'node:fs';
import { AppError } from '../errors.js';

export class DatabaseInUseError extends AppError {
  constructor(lockFile: string, pid: number) {
    super(
      409,
      'database_in_use',
      `the embedded database is in use by process ${pid} (lock ${lockFile}); stop it first, or set DATABASE_URL to use PostgreSQL, which any number of processes can share`,
    );
  }
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Takes the lock or throws DatabaseInUseError; returns the function that releases it. */
export function acquireLock(lockFile: string): () => void {
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      writeFileSync(lockFile, String(process.pid), { flag: 'wx', mode: 0o600 });
      return () => {
        try {
          if (readFileSync(lockFile, 'utf8') === String(process.pid)) unlinkSync(lockFile);
        } catch {
          // Already gone: nothing to release.
        }
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    const holder = Number.parseInt(readFileSync(lockFile, 'utf8'), 10);
    if (Number.isSafeInteger(holder) && holder !== process.pid && isAlive(holder)) {
      throw new DatabaseInUseError(lockFile, holder);
    }
    // A stale lock from a process that died (or our own from an unclean close): take it over.
    unlinkSync(lockFile);
  }
  throw new Error(`could not take the lock ${lockFile}`);
}
