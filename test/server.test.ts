/**
 * The server and the CLI as processes, built by `npm test`'s pretest step: zero-setup start on
 * the embedded database, start-up errors, graceful shutdown, the real `orgauth` binary.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { verifyPassword } from '../src/accounts/passwords.js';
import { runCli } from '../src/cli/index.js';
import { connectDatabase } from '../src/db/connect.js';
import { secretMatches } from '../src/lib/crypto.js';
import { createEmptyDatabase, TEST_DATABASE_URL, type TestDatabase } from './helpers/db.js';
import { CLI, freePort, HAS_SCRIPT, ROOT, run, type Running, SERVER, start } from './helpers/process.js';

beforeAll(() => {
  if (!existsSync(path.join(ROOT, SERVER))) throw new Error(`${SERVER} is missing: run the tests with \`npm test\`, which builds first`);
});

describe('zero set-up on the embedded database', () => {
  const dataDir = mkdtempSync(path.join(tmpdir(), 'orgauth-start-'));
  let port: number;
  let banner: string;
  /**
   * The server started again on the same DATA_DIR, its output piped (as under a supervisor): one
   * process for the tests of a later start (how it logs when piped; that it does not seed again),
   * started by the first of them to run.
   */
  let again: Running | undefined;
  const startAgain = () => (again ??= start(SERVER, [], { DATA_DIR: dataDir, PORT: String(port), LOG_LEVEL: 'info' }));
  afterAll(async () => {
    if (again && again.child.exitCode === null && again.child.signalCode === null) {
      again.child.kill('SIGTERM');
      await again.exited;
    }
    rmSync(dataDir, { recursive: true, force: true });
  });

  it('starts, serves /healthz, generates SECRET_KEY and prints the demo credentials once', async () => {
    port = await freePort();
    const server = start(SERVER, [], { DATA_DIR: dataDir, PORT: String(port) });
    try {
      await server.waitForOutput(/curl -s -u[\s\S]*orgauth is ready/);
      const res = await fetch(`http://127.0.0.1:${port}/healthz`);
      expect(res.status).toBe(200);
      expect(await res.json()).toEqual({ status: 'ok' });
      expect((await fetch(`http://127.0.0.1:${port}/readyz`)).status).toBe(200);
      banner = server.output.stdout;
      // The printed curl works: the same request, made with fetch.
      const curl = /curl -s -u '([^:]+):([^']+)' \\\n\s+-d grant_type=client_credentials -d organization_id=(\d+) \\\n\s+--data-urlencode 'scope=([^']+)' \\\n\s+(\S+)/.exec(banner);
      expect(curl).not.toBeNull();
      const [, id, secret, orgId, scope, url] = curl!;
      const tokenRes = await fetch(url!.replace('localhost', '127.0.0.1'), {
        method: 'POST',
        headers: { authorization: `Basic ${Buffer.from(`${id}:${secret}`).toString('base64')}`, 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ grant_type: 'client_credentials', organization_id: orgId!, scope: scope! }),
      });
      expect(tokenRes.status).toBe(200);
      expect(await tokenRes.json()).toMatchObject({ token_type: 'Bearer', organization_id: 1, organization_name: 'Demo Organization' });
      // The second one, pasted into a shell as printed, lists the applications with a management token.
      const management = /List the organization's applications with a management token:\n((?:   .*\n)+)/.exec(banner)?.[1];
      expect(management).toBeDefined();
      const listed = await promisify(execFile)('/bin/bash', ['-c', management!], { env: { PATH: process.env.PATH } });
      expect(JSON.parse(listed.stdout)).toMatchObject({
        data: [expect.objectContaining({ name: 'Demo Public App', type: 'public' }), expect.objectContaining({ name: 'Demo Integration', type: 'private' })],
        next_cursor: null,
      });
      expect(banner).toContain('email:    demo@orgauth.local');
      expect(banner).toContain(`http://localhost:${port}/oauth/token`);
      // No SMTP_URL: the banner says where the emails go instead, and that page answers.
      expect(banner).toContain(`messages are logged and shown at http://localhost:${port}/dev/outbox`);
      expect((await fetch(`http://127.0.0.1:${port}/dev/outbox`)).status).toBe(200);
      expect(readFileSync(path.join(dataDir, 'secret_key'), 'utf8').trim().length).toBeGreaterThanOrEqual(32);

      // While the server holds the embedded database, the CLI does not open it (that would corrupt
      // it): the server runs the command (test/cli-beside-server.test.ts has the rest).
      let stdout = '';
      const code = await runCli(['migrate', '--json'], { stdout: (s) => (stdout += s), stderr: () => {}, env: { DATA_DIR: dataDir } });
      expect({ code, stdout }).toEqual({ code: 0, stdout: '{"applied":[]}\n' });
    } finally {
      server.child.kill('SIGTERM');
    }
    const exit = await server.exited;
    expect(exit).toEqual({ code: 0, signal: null });
    expect(existsSync(path.join(dataDir, 'pgdata.lock'))).toBe(false);
  });

  it('stores only hashes of the printed secrets and password', async () => {
    const secret = /Private application[\s\S]*?client_secret: (\S+)/.exec(banner)?.[1];
    const clientId = /Private application[\s\S]*?client_id: +(\S+)/.exec(banner)?.[1];
    const password = /password: (\S+)/.exec(banner)?.[1];
    expect(secret).toBeDefined();
    const handle = await connectDatabase({ kind: 'pglite', dataDir: path.join(dataDir, 'pgdata') });
    try {
      const user = await handle.db.selectFrom('users').selectAll().where('email', '=', 'demo@orgauth.local').executeTakeFirstOrThrow();
      expect(await verifyPassword(user.password_hash, password!)).toBe(true);
      expect(user.password_hash).not.toContain(password!);
      const app = await handle.db.selectFrom('applications').selectAll().where('client_id', '=', clientId!).executeTakeFirstOrThrow();
      expect(secretMatches(secret!, app.client_secret_hash)).toBe(true);
      expect(JSON.stringify(await handle.db.selectFrom('applications').selectAll().execute())).not.toContain(secret!);
    } finally {
      await handle.close();
    }
  });

  it('`orgauth app create --json` prints client_id and client_secret and stores only the hash', async () => {
    const result = await run(CLI, ['app', 'create', '--org', '1', '--type', 'private', '--name', 'X', '--json'], { DATA_DIR: dataDir });
    expect(result.stderr).toBe('');
    expect(result.code).toBe(0);
    const app = JSON.parse(result.stdout) as { client_id: string; client_secret: string };
    expect(app).toMatchObject({ client_id: expect.any(String), client_secret: expect.any(String), organization_id: 1, type: 'private' });
    const handle = await connectDatabase({ kind: 'pglite', dataDir: path.join(dataDir, 'pgdata') });
    try {
      const row = await handle.db.selectFrom('applications').selectAll().where('client_id', '=', app.client_id).executeTakeFirstOrThrow();
      expect(row.client_secret_hash).toMatch(/^[0-9a-f]{64}$/);
      expect(secretMatches(app.client_secret, row.client_secret_hash)).toBe(true);
      expect(JSON.stringify(row)).not.toContain(app.client_secret);
    } finally {
      await handle.close();
    }
  });

  it.skipIf(!HAS_SCRIPT)('logs lines a person reads in a terminal, and JSON when piped (LOG_FORMAT unset: auto)', async () => {
    // Up to the end of the line that says the request completed: the request's lines are all in.
    const visit = async (server: Running, at: number) => {
      await server.waitForOutput(/orgauth is ready/);
      expect((await fetch(`http://127.0.0.1:${at}/.well-known/openid-configuration`)).status).toBe(200);
      await server.waitForOutput(/request completed[^\n]*\n/);
    };
    const terminalPort = await freePort();
    const inTerminal = start(SERVER, [], { DATA_DIR: dataDir, PORT: String(terminalPort) }, { terminal: true });
    try {
      await visit(inTerminal, terminalPort);
    } finally {
      inTerminal.child.kill('SIGTERM');
      await inTerminal.exited;
    }
    const shown = inTerminal.output.stdout;
    // Coloured, and once the colours are gone: time, level, the request on the message's line; no JSON.
    expect(shown).toMatch(/\x1b\[3\dm/);
    const lines = shown.replace(/\x1b\[[0-9;]*m/g, '').split(/\r?\n/);
    expect(lines.filter((l) => l.startsWith('{'))).toEqual([]);
    expect(lines.some((l) => /^\[\d\d:\d\d:\d\d\.\d{3}\] INFO: GET \/\.well-known\/openid-configuration from 127\.0\.0\.1 incoming request/.test(l)), shown).toBe(true);
    expect(lines.some((l) => /^\[\d\d:\d\d:\d\d\.\d{3}\] INFO: 200 in [\d.]+ ms request completed/.test(l)), shown).toBe(true);

    // Piped: the next test stops this one.
    const piped = startAgain();
    await visit(piped, port);
    const objects = piped.output.stdout
      .split('\n')
      .slice(0, -1) // whole lines only: the server is still running
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as { level: number; msg: string; req?: { url: string } });
    expect(objects.some((o) => o.level === 30 && o.msg === 'incoming request' && o.req?.url === '/.well-known/openid-configuration')).toBe(true);
    expect(piped.output.stdout).not.toMatch(/\x1b\[/);
  });

  it('does not seed again on the next start', async () => {
    const server = startAgain();
    try {
      await server.waitForOutput(/orgauth is ready/);
      expect(server.output.stdout).not.toContain('demo@orgauth.local');
    } finally {
      server.child.kill('SIGINT');
    }
    expect((await server.exited).code).toBe(0);
  });
});

// Three processes of their own, independent of each other: run side by side.
describe.concurrent('start-up errors: one line per problem, exit code 1, no stack trace', () => {
  it('names SECRET_KEY when it is too short', async () => {
    const result = await run(SERVER, [], { DATABASE_URL: 'postgres://postgres@127.0.0.1:5432/postgres', SECRET_KEY: 'short' });
    expect(result).toEqual({ code: 1, stdout: '', stderr: 'orgauth: SECRET_KEY: must be at least 32 characters\n' });
  });

  it('names every bad variable on its own line', async () => {
    const result = await run(SERVER, [], { PORT: 'eighty', SIGNING_ALG: 'HS256', AUTH_CODE_TTL: '3600' });
    expect(result.code).toBe(1);
    expect(result.stderr.split('\n').filter(Boolean)).toEqual([
      'orgauth: PORT: must be a port number between 0 and 65535',
      'orgauth: AUTH_CODE_TTL: must be a whole number of seconds between 1 and 600',
      'orgauth: SIGNING_ALG: must be one of ES256, RS256, EdDSA',
    ]);
  });

  it('says the database is unreachable without echoing its URL', async () => {
    const result = await run(SERVER, [], { DATABASE_URL: 'postgres://admin:hunter2hunter2@127.0.0.1:1/orgauth', SECRET_KEY: 'k'.repeat(40) });
    expect(result.code).toBe(1);
    expect(result.stderr).toMatch(/^orgauth: DATABASE_URL: cannot reach the database \(.*ECONNREFUSED.*\)\n$/);
    expect(result.stderr).not.toContain('hunter2');
  });
});

describe.skipIf(!TEST_DATABASE_URL)('on PostgreSQL', () => {
  let database: TestDatabase;
  beforeAll(async () => {
    database = await createEmptyDatabase();
  });
  afterAll(() => database.drop());

  it('migrates on start, seeds nothing, and exits 0 on SIGTERM', async () => {
    const port = await freePort();
    const server = start(SERVER, [], { ...database.env, PORT: String(port) });
    try {
      await server.waitForOutput(/orgauth is ready/);
      expect((await fetch(`http://127.0.0.1:${port}/readyz`)).status).toBe(200);
      expect(server.output.stdout).not.toContain('demo@orgauth.local');
      const seeded = await run(CLI, ['seed-demo', '--json'], database.env);
      expect(seeded.code).toBe(0);
      expect(JSON.parse(seeded.stdout)).toMatchObject({ user: { email: 'demo@orgauth.local' } });
    } finally {
      server.child.kill('SIGTERM');
    }
    expect(await server.exited).toEqual({ code: 0, signal: null });
  });
});
