/** Starting the built server and CLI as real processes, the way a user does. */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => (typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port'))));
    });
  });
}

export interface Running {
  child: ChildProcess;
  /** Everything written so far. */
  output: { stdout: string; stderr: string };
  /** Settles once the process has exited and its output is all read. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /**
   * Resolves as soon as stdout + stderr (as written so far, stdout first) match `pattern`: tested
   * again on every chunk the process writes, not on a clock. Rejects if the process ends without
   * printing it; `timeoutMs` only bounds a hung process, so the error says what it printed.
   */
  waitForOutput(pattern: RegExp, timeoutMs?: number): Promise<void>;
}

/** Environment for a child: PATH and HOME only, plus `env`, so the developer's variables cannot leak in. */
function childEnv(env: Record<string, string>): NodeJS.ProcessEnv {
  return { PATH: process.env.PATH, HOME: process.env.HOME, ...env };
}

/** Whether util-linux `script` is here to give a child a pseudo-terminal (`start` with `terminal`); macOS and BusyBox have other ones. */
export const HAS_SCRIPT = /util-linux/.test(spawnSync('script', ['--version'], { encoding: 'utf8' }).stdout ?? '');

/** A word for `sh -c`, quoted. */
const shellWord = (word: string) => `'${word.replace(/'/g, `'\\''`)}'`;

/**
 * Starts `node script args` with `env`. `terminal`: inside a pseudo-terminal (util-linux
 * `script`), as a person running it in a shell would: its standard output is a TTY, and what it
 * wrote arrives on stdout with CRLF line ends.
 */
export function start(script: string, args: string[], env: Record<string, string>, options: { terminal?: boolean } = {}): Running {
  const [command, argv] = options.terminal
    ? ['script', ['--quiet', '--flush', '--return', '--command', [process.execPath, script, ...args].map(shellWord).join(' '), '/dev/null']]
    : [process.execPath, [script, ...args]];
  const child = spawn(command, argv, { cwd: ROOT, env: childEnv(env), stdio: ['ignore', 'pipe', 'pipe'] });
  const output = { stdout: '', stderr: '' };
  /** The waitForOutput calls not answered yet: tested on each chunk that arrives. */
  const waiters = new Set<{ pattern: RegExp; resolve: () => void }>();
  const seen = () => output.stdout + output.stderr;
  const onChunk = (stream: 'stdout' | 'stderr') => (chunk: string) => {
    output[stream] += chunk;
    if (waiters.size === 0) return;
    const text = seen();
    for (const waiter of waiters) if (waiter.pattern.test(text)) waiter.resolve();
  };
  // Decoded as UTF-8 across chunks, so a character split between two is not mangled.
  child.stdout?.setEncoding('utf8').on('data', onChunk('stdout'));
  child.stderr?.setEncoding('utf8').on('data', onChunk('stderr'));
  let ended = false;
  // 'close', not 'exit': the streams are read to their end, so `output` is complete.
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on('close', (code, signal) => {
      ended = true;
      resolve({ code, signal });
    }),
  );
  return {
    child,
    output,
    exited,
    waitForOutput(pattern, timeoutMs = 30_000) {
      const describe = () => `${output.stdout}\n${output.stderr}`;
      if (pattern.test(seen())) return Promise.resolve();
      if (ended) return Promise.reject(new Error(`process exited (${child.exitCode ?? child.signalCode}) before printing ${pattern}:\n${describe()}`));
      return new Promise<void>((resolve, reject) => {
        const waiter = { pattern, resolve: () => settle() };
        const timer = setTimeout(() => settle(new Error(`no ${pattern} after ${timeoutMs} ms:\n${describe()}`)), timeoutMs);
        // After the close, no more output can come.
        void exited.then(() => settle(new Error(`process exited (${child.exitCode ?? child.signalCode}) before printing ${pattern}:\n${describe()}`)));
        function settle(err?: Error): void {
          if (!waiters.delete(waiter)) return;
          clearTimeout(timer);
          if (err) reject(err);
          else resolve();
        }
        waiters.add(waiter);
      });
    },
  };
}

/** Runs a process to completion. */
export async function run(script: string, args: string[], env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const p = start(script, args, env);
  const { code } = await p.exited;
  return { code, ...p.output };
}

export const SERVER = 'dist/bundle/server.js';
export const CLI = 'bin/orgauth.js';
