/**
 * The local administration channel of a server on the embedded database (SECURITY.md AD-2).
 *
 * PGlite opens in one process only, so while the server runs, the `orgauth` command cannot open
 * DATA_DIR itself. Instead the server listens on a Unix socket, DATA_DIR/admin/orgauth.sock, in
 * a directory of mode 0700 owned by the server's user, the socket itself 0600: no network port,
 * and only that user (and root) can connect, the same people who could read the database files
 * and the generated SECRET_KEY beside them anyway. The CLI sends its command line there when
 * the database is locked, and the server runs it exactly as the CLI would (src/cli/index.ts), in its
 * own process, on its own database handle, and answers with the exit code and output.
 *
 * Why not @electric-sql/pglite-socket (PGlite's wire protocol on a socket, the CLI connecting
 * with pg): PGlite is a single session, so a socket client holds an exclusive lock on it while
 * connected, or is multiplexed onto that one session, where its transaction would interleave
 * with the server's requests; and it speaks TCP by default. Running the command in the server
 * keeps one connection, one set of caches (a change is seen at once by the server that made
 * it) and no new dependency.
 *
 * Protocol: one request per connection, a JSON line `{"argv": [...]}`; one JSON line back,
 * `{"code", "stdout", "stderr"}`.
 */
import { chmodSync, lstatSync, mkdirSync, rmSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import type { Logger } from 'pino';
import { z } from 'zod';
import { errnoCode } from './lib/errno.js';

/** What a command line produced: the CLI prints it and exits with `code`. */
export interface CommandOutcome {
  code: number;
  stdout: string;
  stderr: string;
}

const MAX_REQUEST_BYTES = 64 * 1024;
/** Lists are paged (at most 1,000 rows), so an answer stays far below this. */
const MAX_RESPONSE_BYTES = 32 * 1024 * 1024;
/** A client that connects and sends nothing is dropped after this. */
const REQUEST_TIMEOUT_MS = 10_000;
/** Commands at once; more connections wait in the kernel's backlog. */
const MAX_CONNECTIONS = 16;
/** On close, commands still running after this are abandoned (their connection is cut). */
const CLOSE_GRACE_MS = 3000;
/** How long the CLI waits for the answer to a command (revoking a million grants takes about 90 s). */
const ANSWER_TIMEOUT_MS = 10 * 60_000;
/** sun_path holds 108 bytes on Linux and 104 on macOS, the terminating NUL included. */
const MAX_SOCKET_PATH_BYTES = 103;

const requestSchema = z.object({ argv: z.array(z.string().max(10_000)).max(200) });
const outcomeSchema = z.object({ code: z.number().int(), stdout: z.string(), stderr: z.string() });

export function adminSocketPath(dataDir: string): string {
  return path.join(dataDir, 'admin', 'orgauth.sock');
}

/** Why a socket cannot live at `socketPath`, or undefined when it can. */
function pathProblem(socketPath: string): string | undefined {
  return Buffer.byteLength(socketPath) > MAX_SOCKET_PATH_BYTES
    ? `${socketPath} is longer than the ${MAX_SOCKET_PATH_BYTES} bytes a Unix socket path may have; use a shorter DATA_DIR`
    : undefined;
}

/** The socket's directory: ours, a real directory (not a link), closed to everyone else. */
function preparePrivateDirectory(dir: string): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const stat = lstatSync(dir);
  if (!stat.isDirectory() || stat.isSymbolicLink()) throw new Error(`${dir} is not a directory`);
  if (typeof process.getuid === 'function' && stat.uid !== process.getuid()) throw new Error(`${dir} belongs to another user (uid ${stat.uid})`);
  chmodSync(dir, 0o700);
}

export interface AdminSocket {
  readonly path: string;
  /** Stops accepting, cuts connections that sent nothing yet, gives running commands CLOSE_GRACE_MS, removes the socket. */
  close(): Promise<void>;
}

/**
 * Serves `run` on DATA_DIR's admin socket. Call only while holding the embedded database's lock:
 * a socket file found there is then a stale one (a server that crashed) and is replaced.
 * Returns undefined, with a warning, when the socket cannot be made (a DATA_DIR path too long
 * for a socket): the server runs, and the CLI says the database is in use as before.
 */
export async function serveAdminSocket(
  dataDir: string,
  run: (argv: string[]) => Promise<CommandOutcome>,
  logger: Pick<Logger, 'warn' | 'error'>,
): Promise<AdminSocket | undefined> {
  const socketPath = adminSocketPath(dataDir);
  const problem = pathProblem(socketPath);
  if (problem) {
    logger.warn(`no admin socket, so \`orgauth\` commands cannot reach this server: ${problem}`);
    return undefined;
  }
  preparePrivateDirectory(path.dirname(socketPath));
  rmSync(socketPath, { force: true });

  // Connections still waiting for their request line are cut at close; running commands get
  // CLOSE_GRACE_MS to finish, so that a shutdown (R-4: within 10 s) is never held up by a client.
  const waiting = new Set<net.Socket>();
  const running = new Map<net.Socket, Promise<void>>();
  const server = net.createServer((conn) => {
    waiting.add(conn);
    const done = serveConnection(conn, run, logger, () => waiting.delete(conn)).finally(() => {
      waiting.delete(conn);
      running.delete(conn);
    });
    running.set(conn, done);
  });
  server.maxConnections = MAX_CONNECTIONS;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(socketPath, () => {
      server.off('error', reject);
      resolve();
    });
  });
  // The directory is already 0700; the socket gets 0600 as well, in case the directory is opened up.
  chmodSync(socketPath, 0o600);
  server.on('error', (err) => logger.error({ err }, 'admin socket failed'));

  let closing: Promise<void> | undefined;
  return {
    path: socketPath,
    close: () =>
      (closing ??= (async () => {
        const closed = new Promise<void>((resolve) => server.close(() => resolve()));
        for (const conn of waiting) conn.destroy();
        const grace = new Promise<void>((resolve) => setTimeout(resolve, CLOSE_GRACE_MS).unref());
        await Promise.race([Promise.allSettled([...running.values()]), grace]);
        for (const conn of running.keys()) conn.destroy();
        await closed;
        rmSync(socketPath, { force: true });
      })()),
  };
}

async function serveConnection(
  conn: net.Socket,
  run: (argv: string[]) => Promise<CommandOutcome>,
  logger: Pick<Logger, 'error'>,
  started: () => void,
): Promise<void> {
  conn.on('error', () => {});
  const reply = (outcome: CommandOutcome) => conn.end(`${JSON.stringify(outcome)}\n`);
  const refuse = (description: string) => reply({ code: 1, stdout: '', stderr: `orgauth: ${description}\n` });
  const line = await readLine(conn, MAX_REQUEST_BYTES, REQUEST_TIMEOUT_MS).catch(() => undefined);
  started();
  if (line === undefined) {
    refuse('the admin request was not a line of at most 64 KiB sent within 10 s');
    return;
  }
  let request: z.infer<typeof requestSchema>;
  try {
    request = requestSchema.parse(JSON.parse(line));
  } catch {
    refuse('the admin request is not {"argv": [...]}');
    return;
  }
  try {
    reply(await run(request.argv));
  } catch (err) {
    logger.error({ err }, 'admin command failed');
    refuse('the command failed in the server; see its log');
  }
}

/** The first line sent on `conn` (without its newline), or a rejection when it is too long, too slow or cut off. */
function readLine(conn: net.Socket, maxBytes: number, timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer) => {
      const newline = chunk.indexOf(0x0a);
      const part = newline === -1 ? chunk : chunk.subarray(0, newline);
      size += part.length;
      if (size > maxBytes) finish(new Error('too long'));
      else {
        chunks.push(part);
        if (newline !== -1) finish(undefined, Buffer.concat(chunks).toString('utf8'));
      }
    };
    const onEnd = () => finish(new Error('closed before a full line'));
    const onClose = () => finish(new Error('closed before a full line'));
    const onTimeout = () => finish(new Error('timed out'));
    const onError = (err: Error) => finish(err);
    function finish(err?: Error, value?: string): void {
      conn.setTimeout(0);
      conn.off('data', onData).off('end', onEnd).off('close', onClose).off('timeout', onTimeout).off('error', onError);
      if (err) reject(err);
      else resolve(value ?? '');
    }
    conn.setTimeout(timeoutMs);
    conn.on('data', onData).on('end', onEnd).on('close', onClose).on('timeout', onTimeout).on('error', onError);
  });
}

/** What became of a command line sent to the admin socket. */
export type Forwarded =
  | { outcome: CommandOutcome }
  /** No server listens there (no socket, or a stale one): it may be starting, or gone. */
  | { absent: true }
  /** A server may be there, but this process cannot use it; `error` says why. */
  | { error: string };

/** Sends a command line to the server of `dataDir` and waits for its answer. */
export async function sendToAdminSocket(dataDir: string, argv: string[]): Promise<Forwarded> {
  const socketPath = adminSocketPath(dataDir);
  const problem = pathProblem(socketPath);
  if (problem) return { error: problem };
  let conn: net.Socket;
  try {
    conn = await connect(socketPath);
  } catch (err) {
    const code = errnoCode(err);
    if (code === 'ENOENT' || code === 'ECONNREFUSED') return { absent: true };
    return {
      error: code === 'EACCES' ? `permission denied on ${socketPath}: it serves the user who runs the server` : `cannot connect to ${socketPath} (${code ?? String(err)})`,
    };
  }
  conn.on('error', () => {});
  conn.write(`${JSON.stringify({ argv })}\n`);
  const line = await readLine(conn, MAX_RESPONSE_BYTES, ANSWER_TIMEOUT_MS).catch((err: unknown) => (err instanceof Error && err.message === 'timed out' ? 'timed out' : undefined));
  conn.destroy();
  if (line === 'timed out') return { error: `the server did not answer within ${ANSWER_TIMEOUT_MS / 1000} s` };
  const outcome = line === undefined ? undefined : outcomeSchema.safeParse(safeJson(line));
  return outcome?.success ? { outcome: outcome.data } : { error: 'the server closed the admin connection without an answer; see its log' };
}

function connect(socketPath: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const conn = net.connect(socketPath);
    conn.once('connect', () => {
      conn.off('error', reject);
      resolve(conn);
    });
    conn.once('error', reject);
  });
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}
