/**
 * A pid lock file beside the embedded database. PGlite is single-process: the server and a CLI
 * command opening the same DATA_DIR at once would corrupt it, so the second one is refused.
 */
import { linkSync, readFileSync, unlinkSync, writeFileSync } from 'node:fs';
import { AppError } from '../errors.js';
import { errnoCode } from '../lib/errno.js';

export class DatabaseInUseError extends AppError {
  constructor(lockFile: string, holder: string) {
    super(
      409,
      'database_in_use',
      `the embedded database is in use by process ${holder} (lock ${lockFile}); stop it first, or set DATABASE_URL to use PostgreSQL, which any number of processes can share`,
    );
  }
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return errnoCode(err) === 'EPERM';
  }
}

function readHolder(lockFile: string): string | undefined {
  try {
    return readFileSync(lockFile, 'utf8');
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return undefined;
    throw err;
  }
}

/** Takes the lock or throws DatabaseInUseError; returns the function that releases it. */
export function acquireLock(lockFile: string): () => void {
  const mine = String(process.pid);
  // The pid is written to a private file first and linked into place, so the lock file never
  // exists without its pid (link fails with EEXIST when the lock is taken: atomic).
  const temp = `${lockFile}.${mine}`;
  writeFileSync(temp, mine, { mode: 0o600 });
  try {
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        linkSync(temp, lockFile);
        return () => {
          if (readHolder(lockFile) === mine) unlinkSync(lockFile);
        };
      } catch (err) {
        if (errnoCode(err) !== 'EEXIST') throw err;
      }
      const holder = readHolder(lockFile);
      if (holder === undefined) continue;
      const pid = Number(holder);
      if (!/^[0-9]+$/.test(holder) || (holder !== mine && isAlive(pid))) throw new DatabaseInUseError(lockFile, holder.slice(0, 20) || '?');
      // Stale: its process is gone (or it is ours from an unclean close). Remove it only if it
      // still names that process, then race for it again through link().
      if (readHolder(lockFile) === holder) unlinkSync(lockFile);
    }
    throw new DatabaseInUseError(lockFile, readHolder(lockFile) ?? '?');
  } finally {
    unlinkSync(temp);
  }
}
