import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { acquireLock, DatabaseInUseError } from '../../src/db/lock.js';

const dir = mkdtempSync(path.join(tmpdir(), 'orgauth-lock-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let n = 0;
const lockFile = () => path.join(dir, `db${++n}.lock`);

/** The pid of a process that has exited. */
function deadPid(): number {
  return Number(spawnSync(process.execPath, ['-e', 'process.stdout.write(String(process.pid))']).stdout.toString());
}

describe('the embedded database lock', () => {
  it('writes our pid, and removes the file on release', () => {
    const file = lockFile();
    const release = acquireLock(file);
    expect(readFileSync(file, 'utf8')).toBe(String(process.pid));
    release();
    expect(existsSync(file)).toBe(false);
  });

  it('refuses while a live process holds it', () => {
    const file = lockFile();
    writeFileSync(file, String(process.ppid));
    expect(() => acquireLock(file)).toThrow(DatabaseInUseError);
    expect(readFileSync(file, 'utf8')).toBe(String(process.ppid));
  });

  it('treats an unreadable holder as held, never as free', () => {
    const file = lockFile();
    writeFileSync(file, 'garbage');
    expect(() => acquireLock(file)).toThrow(DatabaseInUseError);
  });

  it('takes over the lock of a process that died', () => {
    const file = lockFile();
    writeFileSync(file, String(deadPid()));
    const release = acquireLock(file);
    expect(readFileSync(file, 'utf8')).toBe(String(process.pid));
    release();
  });
});
