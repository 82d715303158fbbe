/**
 * A disposable PostgreSQL cluster for tests that must stop the database (SECURITY.md, R-3):
 * `initdb` into a temporary folder, `pg_ctl` on a free port, trust authentication, listening on
 * 127.0.0.1 only, its unix socket inside the folder, fsync off. The machine's shared server is
 * never touched. initdb and postgres refuse to run as root, so as root they run as the
 * `postgres` OS user (through runuser), which owns the folder.
 */
import { execFile, execFileSync } from 'node:child_process';
import { appendFileSync, chownSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { freePort } from './process.js';

const execFileAsync = promisify(execFile);

export type StopMode = 'fast' | 'immediate';

export interface PgCluster {
  readonly port: number;
  /** The temporary folder: data/, the socket and server.log. */
  readonly dir: string;
  /** A connection string for `database` (default `postgres`) as the `postgres` superuser. */
  url(database?: string): string;
  /** Starts the server on the same port and data (after stop()); resolves once it accepts connections. */
  start(): Promise<void>;
  /** Stops the server: `fast` disconnects clients and checkpoints, `immediate` is a crash (recovery on the next start). */
  stop(options?: { mode?: StopMode }): Promise<void>;
  /** stop() then start(). */
  restart(options?: { mode?: StopMode }): Promise<void>;
  /** Stops the server (immediate) if it runs and removes the folder. Safe to call twice. */
  destroy(): Promise<void>;
  /** What the server wrote to its log file so far. */
  log(): string;
  /**
   * SIGSTOP to the postmaster and all its processes: the server hangs without closing anything,
   * as behind a network partition (connections open, nothing answers). thaw() resumes it.
   */
  freeze(): void;
  thaw(): void;
}

/** How to run the PostgreSQL server binaries here, or why they cannot run. */
export interface PgBinaries {
  bindir: string;
  /** Run as this OS user (through runuser) because we are root; undefined: as ourselves. */
  user: { name: string; uid: number; gid: number } | undefined;
}

function versionOf(dir: string): number {
  return Number(/postgresql\/(\d+)/.exec(dir)?.[1] ?? 0);
}

function findBindir(): string | undefined {
  const candidates: string[] = [];
  try {
    candidates.push(execFileSync('pg_config', ['--bindir'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim());
  } catch {
    // No pg_config on PATH: look where Debian and Ubuntu install the server.
  }
  const debian = '/usr/lib/postgresql';
  if (existsSync(debian)) {
    const dirs = readdirSync(debian).map((v) => path.join(debian, v, 'bin'));
    candidates.push(...dirs.sort((a, b) => versionOf(b) - versionOf(a)));
  }
  for (const dir of (process.env.PATH ?? '').split(path.delimiter)) if (dir) candidates.push(dir);
  return candidates.find((dir) => ['initdb', 'pg_ctl', 'postgres'].every((bin) => existsSync(path.join(dir, bin))));
}

export function osUser(name: string): { name: string; uid: number; gid: number } | undefined {
  try {
    const uid = Number(execFileSync('id', ['-u', name], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim());
    const gid = Number(execFileSync('id', ['-g', name], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim());
    return Number.isInteger(uid) && Number.isInteger(gid) ? { name, uid, gid } : undefined;
  } catch {
    return undefined;
  }
}

/** The binaries and the user to run them as; a string says why a disposable cluster is impossible here. */
export function findPgBinaries(): PgBinaries | string {
  const bindir = findBindir();
  if (!bindir) return 'the PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found (pg_config --bindir, /usr/lib/postgresql/*/bin, PATH)';
  if (process.getuid?.() !== 0) return { bindir, user: undefined };
  const user = osUser('postgres');
  if (!user) return 'running as root, and there is no `postgres` OS user to run initdb and postgres as';
  return { bindir, user };
}

/** Clusters of this process still running: removed at exit even if a test forgot (or crashed before) its afterAll. */
const live = new Set<{ destroySync(): void }>();
let exitHookInstalled = false;
function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.on('exit', () => {
    for (const cluster of live) cluster.destroySync();
  });
}

/**
 * initdb + start. `settings` go into postgresql.conf (e.g. `{ log_min_messages: 'debug1' }`).
 * Call destroy() in afterAll.
 */
export async function startPgCluster(options: { settings?: Record<string, string> } = {}): Promise<PgCluster> {
  const binaries = findPgBinaries();
  if (typeof binaries === 'string') throw new Error(`cannot start a disposable PostgreSQL: ${binaries}`);
  const { bindir, user } = binaries;
  const dir = mkdtempSync(path.join(tmpdir(), 'orgauth-pg-'));
  if (user) chownSync(dir, user.uid, user.gid);
  const data = path.join(dir, 'data');
  const logFile = path.join(dir, 'server.log');

  const command = (bin: string, args: string[]): [string, string[]] =>
    user ? ['runuser', ['-u', user.name, '--', path.join(bindir, bin), ...args]] : [path.join(bindir, bin), args];
  const exec = async (bin: string, args: string[]): Promise<void> => {
    const [file, argv] = command(bin, args);
    try {
      // postgres is started detached by pg_ctl with its output in the log file, so nothing holds these pipes open.
      await execFileAsync(file, argv, { cwd: dir, timeout: 60_000 });
    } catch (err) {
      const e = err as { stderr?: string; stdout?: string; message: string };
      let tail = '';
      try {
        tail = readFileSync(logFile, 'utf8').split('\n').slice(-20).join('\n');
      } catch {
        // No log yet.
      }
      throw new Error(`${bin} ${args.join(' ')} failed: ${e.message}\n${e.stdout ?? ''}${e.stderr ?? ''}\n${tail}`);
    }
  };

  let running = false;
  let destroyed = false;
  let frozen = false;
  /** The postmaster (from postmaster.pid) and its children (from /proc). */
  const pids = (): number[] => {
    let postmaster: number;
    try {
      postmaster = Number(readFileSync(path.join(data, 'postmaster.pid'), 'utf8').split('\n')[0]);
    } catch {
      return [];
    }
    if (!Number.isInteger(postmaster) || postmaster <= 0) return [];
    const children = readdirSync('/proc')
      .filter((name) => /^\d+$/.test(name))
      .filter((name) => {
        try {
          // "pid (comm) state ppid ...": comm may hold spaces, so read after the last ')'.
          const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
          return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]) === postmaster;
        } catch {
          return false;
        }
      })
      .map(Number);
    return [postmaster, ...children];
  };
  const thaw = (): void => {
    if (!frozen) return;
    signalAll('SIGCONT');
    frozen = false;
  };
  const signalAll = (signal: NodeJS.Signals): void => {
    for (const pid of pids()) {
      try {
        process.kill(pid, signal);
      } catch {
        // Gone meanwhile.
      }
    }
  };
  const entry = {
    stopSync() {
      if (!running) return;
      thaw();
      running = false;
      const [file, argv] = command('pg_ctl', ['-D', data, '-m', 'immediate', '-w', 'stop']);
      try {
        execFileSync(file, argv, { stdio: 'ignore', timeout: 30_000 });
      } catch {
        // Already gone.
      }
    },
    destroySync() {
      entry.stopSync();
      rmSync(dir, { recursive: true, force: true });
    },
  };

  try {
    await exec('initdb', ['-D', data, '-U', 'postgres', '-A', 'trust', '-E', 'UTF8', '--locale=C', '--no-sync']);
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
  const port = await freePort();
  const conf: Record<string, string> = {
    port: String(port),
    listen_addresses: "'127.0.0.1'",
    unix_socket_directories: `'${dir}'`,
    fsync: 'off',
    synchronous_commit: 'off',
    full_page_writes: 'off',
    max_connections: '50',
    shared_buffers: "'32MB'",
    ...options.settings,
  };
  // Appending keeps the file's owner (postgres); the last value of a setting wins.
  appendFileSync(path.join(data, 'postgresql.conf'), `\n# orgauth test cluster\n${Object.entries(conf).map(([k, v]) => `${k} = ${v}`).join('\n')}\n`);

  const cluster: PgCluster = {
    port,
    dir,
    url: (database = 'postgres') => `postgres://postgres@127.0.0.1:${port}/${database}`,
    async start() {
      if (destroyed) throw new Error('the cluster was destroyed');
      if (running) return;
      await exec('pg_ctl', ['-D', data, '-l', logFile, '-w', '-t', '60', 'start']);
      running = true;
      live.add(entry);
      installExitHook();
    },
    async stop({ mode = 'fast' } = {}) {
      if (!running) return;
      thaw();
      await exec('pg_ctl', ['-D', data, '-m', mode, '-w', '-t', '60', 'stop']);
      running = false;
      live.delete(entry);
    },
    async restart(stopOptions) {
      await cluster.stop(stopOptions);
      await cluster.start();
    },
    async destroy() {
      if (destroyed) return;
      destroyed = true;
      live.delete(entry);
      // Also after a start() that failed half-way: whatever postmaster.pid names is stopped.
      if (running || existsSync(path.join(data, 'postmaster.pid'))) {
        running = true;
        entry.stopSync();
      }
      rmSync(dir, { recursive: true, force: true });
    },
    freeze() {
      frozen = true;
      signalAll('SIGSTOP');
    },
    thaw,
    log() {
      try {
        return readFileSync(logFile, 'utf8');
      } catch {
        return '';
      }
    },
  };
  try {
    await cluster.start();
  } catch (err) {
    await cluster.destroy();
    throw err;
  }
  return cluster;
}
