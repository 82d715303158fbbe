/**
 * The admin socket itself (src/admin-socket.ts), with a stand-in for the command runner: what it
 * answers to hostile or broken clients, that a client can never hold up a shutdown, and where it
 * refuses to make its socket. test/cli-beside-server.test.ts drives it with the real server and CLI.
 */
import { existsSync, mkdirSync, mkdtempSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { adminSocketPath, type AdminSocket, type CommandOutcome, sendToAdminSocket, serveAdminSocket } from '../src/admin-socket.js';

let dataDir: string;
let socket: AdminSocket | undefined;
const warnings: string[] = [];
const logger = { warn: (msg: string) => void warnings.push(msg), error: () => {} };

beforeEach(() => {
  dataDir = mkdtempSync(path.join(tmpdir(), 'oa-sock-'));
  warnings.length = 0;
});
afterEach(async () => {
  await socket?.close();
  socket = undefined;
  rmSync(dataDir, { recursive: true, force: true });
});

/** A promise and the function that resolves it: an event to wait for. */
function signal(): [Promise<void>, () => void] {
  let resolve: () => void = () => {};
  const promise = new Promise<void>((r) => (resolve = r));
  return [promise, resolve];
}

const echo = async (argv: string[]): Promise<CommandOutcome> => ({ code: argv.length === 0 ? 2 : 0, stdout: `${argv.join(' ')}\n`, stderr: '' });

/** Sends raw bytes and reads everything the server answers until it closes. */
function raw(bytes: string | Buffer, options: { end?: boolean } = {}): Promise<string> {
  return new Promise((resolve, reject) => {
    const conn = net.connect(adminSocketPath(dataDir));
    let out = '';
    conn.on('data', (d: Buffer) => (out += d.toString()));
    conn.on('close', () => resolve(out));
    conn.on('error', (err: NodeJS.ErrnoException) => (err.code === 'ECONNRESET' || err.code === 'EPIPE' ? resolve(out) : reject(err)));
    conn.on('connect', () => {
      conn.write(bytes);
      if (options.end) conn.end();
    });
  });
}

describe('the admin socket', () => {
  it('runs a command line and answers with its exit code and output', async () => {
    socket = await serveAdminSocket(dataDir, echo, logger);
    expect(await sendToAdminSocket(dataDir, ['org', 'list', '--json'])).toEqual({ outcome: { code: 0, stdout: 'org list --json\n', stderr: '' } });
    expect(await sendToAdminSocket(dataDir, [])).toEqual({ outcome: { code: 2, stdout: '\n', stderr: '' } });
    const stat = statSync(adminSocketPath(dataDir));
    expect({ socket: stat.isSocket(), mode: stat.mode & 0o777, dir: statSync(path.dirname(adminSocketPath(dataDir))).mode & 0o777 }).toEqual({ socket: true, mode: 0o600, dir: 0o700 });
  });

  it('refuses what is not one {"argv": [strings]} line of at most 64 KiB, without running anything', async () => {
    let ran = 0;
    socket = await serveAdminSocket(dataDir, async (argv) => (ran++, echo(argv)), logger);
    const refused = (text: string) => ({ code: 1, stdout: '', stderr: `orgauth: ${text}\n` });
    for (const bad of ['not json\n', '{"argv": "x"}\n', '{"argv": [1]}\n', '{"argv": ["__proto__"], "__proto__": {"x": 1}}\n'.replace('["__proto__"]', '[{}]'), 'null\n', '\n']) {
      expect(JSON.parse(await raw(bad))).toEqual(refused('the admin request is not {"argv": [...]}'));
    }
    expect(JSON.parse(await raw(`{"argv": ["${'x'.repeat(70_000)}"]}\n`))).toEqual(refused('the admin request was not a line of at most 64 KiB sent within 10 s'));
    // Hung up before a whole line: nothing to run, nobody to answer.
    expect(await raw('{"argv": ["half', { end: true })).toBe('');
    expect(ran).toBe(0);
    // Still serving.
    expect(await sendToAdminSocket(dataDir, ['after'])).toEqual({ outcome: { code: 0, stdout: 'after\n', stderr: '' } });
  });

  it('closes at once with an idle client connected, lets a short command finish, and removes the socket (R-4)', async () => {
    let release: () => void = () => {};
    const [runStarted, started] = signal();
    const slow = (argv: string[]) =>
      new Promise<CommandOutcome>((resolve) => {
        release = () => resolve({ code: 0, stdout: `${argv[0]}\n`, stderr: '' });
        started();
      });
    socket = await serveAdminSocket(dataDir, slow, logger);
    const idle = net.connect(adminSocketPath(dataDir));
    const idleClosed = new Promise<void>((resolve) => idle.on('close', () => resolve()));
    idle.on('error', () => {});
    await new Promise((resolve) => idle.on('connect', resolve));
    const answer = sendToAdminSocket(dataDir, ['finishing']);
    // The command is running when the close begins.
    await runStarted;
    const closed = socket!.close();
    // The server cuts the idle client while the command still runs (it is released only then),
    // rather than waiting out the client's 10 s request timeout.
    await idleClosed;
    release();
    const first = await Promise.race([closed.then(() => 'closed'), new Promise((resolve) => setTimeout(() => resolve('still open after 5 s'), 5000))]);
    expect(first).toBe('closed');
    expect(await answer).toEqual({ outcome: { code: 0, stdout: 'finishing\n', stderr: '' } });
    expect(existsSync(adminSocketPath(dataDir))).toBe(false);
    expect(await sendToAdminSocket(dataDir, ['x'])).toEqual({ absent: true });
    socket = undefined;
  });

  it('cuts a command still running after the grace period, so the server can exit', async () => {
    const [runStarted, started] = signal();
    socket = await serveAdminSocket(dataDir, () => (started(), new Promise<CommandOutcome>(() => {})), logger);
    const answer = sendToAdminSocket(dataDir, ['forever']);
    await runStarted;
    // The grace period passes on a fake clock (the sockets' I/O stays real): close() has armed its
    // timer when it returns, and a shutdown must be over within R-4's 10 s.
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    try {
      const closed = socket!.close();
      await vi.advanceTimersByTimeAsync(9_999);
      vi.useRealTimers();
      await closed;
    } finally {
      vi.useRealTimers();
    }
    expect(await answer).toEqual({ error: 'the server closed the admin connection without an answer; see its log' });
    socket = undefined;
  });

  it('replaces a stale socket file left by a crash', async () => {
    mkdirSync(path.dirname(adminSocketPath(dataDir)), { recursive: true, mode: 0o700 });
    writeFileSync(adminSocketPath(dataDir), 'stale');
    expect(await sendToAdminSocket(dataDir, ['x'])).toEqual({ absent: true });
    socket = await serveAdminSocket(dataDir, echo, logger);
    expect(await sendToAdminSocket(dataDir, ['fresh'])).toEqual({ outcome: { code: 0, stdout: 'fresh\n', stderr: '' } });
  });

  it('answers absent where no server listens, so the CLI can wait for one that is starting', async () => {
    expect(await sendToAdminSocket(dataDir, ['x'])).toEqual({ absent: true });
  });

  it('makes no socket in a directory it does not control, nor at a path too long for one', async () => {
    const elsewhere = mkdtempSync(path.join(tmpdir(), 'oa-elsewhere-'));
    try {
      symlinkSync(elsewhere, path.join(dataDir, 'admin'));
      await expect(serveAdminSocket(dataDir, echo, logger)).rejects.toThrow(/is not a directory/);
      expect(existsSync(path.join(elsewhere, 'orgauth.sock'))).toBe(false);
    } finally {
      rmSync(elsewhere, { recursive: true, force: true });
    }
    const deep = path.join(dataDir, 'd'.repeat(100));
    expect(await serveAdminSocket(deep, echo, logger)).toBeUndefined();
    expect(warnings).toEqual([expect.stringMatching(/no admin socket, so `orgauth` commands cannot reach this server: .* use a shorter DATA_DIR/)]);
    expect(await sendToAdminSocket(deep, ['x'])).toEqual({ error: expect.stringMatching(/longer than the 103 bytes/) });
  });
});
