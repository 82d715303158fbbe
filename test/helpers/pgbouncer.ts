/**
 * A disposable PgBouncer (Debian's `pgbouncer` package, `apt-get install -y pgbouncer`) in front
 * of TEST_DATABASE_URL's server, for the tests of orgauth behind a transaction pooler. It runs in
 * the foreground as a child of the test, on a free port of 127.0.0.1 (no unix socket), with a
 * generated pgbouncer.ini in a temporary folder, and is stopped (by its pid) afterwards; the
 * machine's PostgreSQL is only connected to. PgBouncer refuses to run as root, so as root it
 * switches to the `postgres` OS user (its `user` setting), which owns the folder.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { osUser } from './pg-cluster.js';
import { freePort } from './process.js';

export interface PgBouncerBinary {
  bin: string;
  version: string;
  /** Switch to this OS user (we are root); undefined: run as ourselves. */
  user: string | undefined;
}

/** The pgbouncer binary and the user to run it as, or why it cannot run here. */
export function findPgBouncer(): PgBouncerBinary | string {
  const candidates = ['/usr/sbin/pgbouncer', ...(process.env.PATH ?? '').split(path.delimiter).filter(Boolean).map((dir) => path.join(dir, 'pgbouncer'))];
  const bin = candidates.find((file) => existsSync(file));
  if (!bin) return 'pgbouncer was not found (/usr/sbin/pgbouncer, PATH): `apt-get install -y pgbouncer`';
  let version: string;
  try {
    version = /PgBouncer (\S+)/.exec(execFileSync(bin, ['--version'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }))?.[1] ?? 'unknown';
  } catch (err) {
    return `${bin} --version failed: ${err instanceof Error ? err.message : String(err)}`;
  }
  if (process.getuid?.() !== 0) return { bin, version, user: undefined };
  if (!osUser('postgres')) return 'running as root, and there is no `postgres` OS user for pgbouncer to switch to';
  return { bin, version, user: 'postgres' };
}

export interface PgBouncer {
  readonly port: number;
  /** A connection string for `database` through PgBouncer, as the upstream URL's user. */
  url(database: string): string;
  /** What PgBouncer logged so far. */
  log(): string;
  /** Stops it (SIGTERM, then SIGKILL after 5 s) and removes its folder. Safe to call twice. */
  stop(): Promise<void>;
}

export interface PgBouncerOptions {
  /** The PostgreSQL server every database name is forwarded to (its host, port, user and password). */
  upstream: string;
  /** Server connections per database and user: small, so that clients really share them. */
  poolSize?: number;
  /** Extra [databases] entries, name → libpq-style settings (e.g. a session-mode alias). */
  databases?: Record<string, string>;
}

/** Children of this process still running: killed at exit even if a test forgot (or crashed before) stop(). */
const live = new Set<ChildProcess>();
let exitHookInstalled = false;

export async function startPgBouncer(binary: PgBouncerBinary, options: PgBouncerOptions): Promise<PgBouncer> {
  const upstream = new URL(options.upstream);
  const user = decodeURIComponent(upstream.username) || 'postgres';
  const password = decodeURIComponent(upstream.password);
  const dir = mkdtempSync(path.join(tmpdir(), 'orgauth-pgbouncer-'));
  const port = await freePort();
  const server = `host=${upstream.hostname} port=${upstream.port || '5432'}`;
  const quote = (s: string) => `"${s.replace(/"/g, '""')}"`;
  writeFileSync(path.join(dir, 'userlist.txt'), `${quote(user)} ${quote(password)}\n`);
  writeFileSync(
    path.join(dir, 'pgbouncer.ini'),
    [
      '[databases]',
      ...Object.entries(options.databases ?? {}).map(([name, settings]) => `${name} = ${server} ${settings}`),
      // Any other database name: the same name on the upstream server.
      `* = ${server}`,
      '',
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      'unix_socket_dir =',
      'auth_type = trust',
      `auth_file = ${path.join(dir, 'userlist.txt')}`,
      'pool_mode = transaction',
      `default_pool_size = ${options.poolSize ?? 3}`,
      'min_pool_size = 0',
      'reserve_pool_size = 0',
      'max_client_conn = 500',
      // Server connections in turn rather than the most recently used first: a client's next
      // transaction lands on another session even without competing clients, so anything
      // session-bound (a named statement, LISTEN, a session lock) breaks every time, not by luck.
      'server_round_robin = 1',
      // Deliberately empty: orgauth must not need any startup parameter to be ignored.
      'ignore_startup_parameters =',
      'log_connections = 0',
      'log_disconnections = 0',
      ...(binary.user ? [`user = ${binary.user}`] : []),
      '',
    ].join('\n'),
  );
  if (binary.user) {
    const owner = osUser(binary.user);
    if (owner) chownSync(dir, owner.uid, owner.gid);
  }

  const child = spawn(binary.bin, [path.join(dir, 'pgbouncer.ini')], { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
  live.add(child);
  if (!exitHookInstalled) {
    exitHookInstalled = true;
    process.on('exit', () => {
      for (const running of live) running.kill('SIGKILL');
    });
  }
  let output = '';
  child.stdout?.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr?.on('data', (d: Buffer) => (output += d.toString()));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  void exited.then(() => live.delete(child));

  let stopped: Promise<void> | undefined;
  const bouncer: PgBouncer = {
    port,
    url: (database) => {
      const url = new URL(options.upstream);
      url.hostname = '127.0.0.1';
      url.port = String(port);
      url.pathname = `/${encodeURIComponent(database)}`;
      return url.toString();
    },
    log: () => output,
    stop: () =>
      (stopped ??= (async () => {
        if (child.exitCode === null && child.signalCode === null) {
          child.kill('SIGTERM');
          const killer = setTimeout(() => child.kill('SIGKILL'), 5000);
          await exited;
          clearTimeout(killer);
        }
        rmSync(dir, { recursive: true, force: true });
      })()),
  };

  const deadline = Date.now() + 10_000;
  while (!/listening on 127\.0\.0\.1:\d+/.test(output)) {
    if (child.exitCode !== null || child.signalCode !== null || Date.now() > deadline) {
      await bouncer.stop();
      throw new Error(`pgbouncer did not start:\n${output}`);
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  return bouncer;
}
