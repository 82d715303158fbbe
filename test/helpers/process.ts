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
  output: { stdout: string; stderr: string };
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
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
  child.stdout?.on('data', (d: Buffer) => (output.stdout += d.toString()));
  child.stderr?.on('data', (d: Buffer) => (output.stderr += d.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal })),
  );
  return {
    child,
    output,
    exited,
    async waitForOutput(pattern, timeoutMs = 30_000) {
      const deadline = Date.now() + timeoutMs;
      while (!pattern.test(output.stdout + output.stderr)) {
        if (child.exitCode !== null) throw new Error(`process exited (${child.exitCode}) before printing ${pattern}:\n${output.stdout}\n${output.stderr}`);
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${pattern}:\n${output.stdout}\n${output.stderr}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    },
  };
}

/** Runs a process to completion. */
export async function run(script: string, args: string[], env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const p = start(script, args, env);
  const { code } = await p.exited;
  return { code, ...p.output };
}

export const SERVER = 'dist/src/server.js';
export const CLI = 'bin/orgauth.js';
