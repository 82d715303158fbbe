/**
 * Issue 12, part 1: with the server running on the embedded database (`npm start`'s default),
 * the `orgauth` command works from another shell — the real binary, as a separate process —
 * through the server's admin socket, with the output and exit codes it has on its own; and
 * that channel is reachable only by the owner of DATA_DIR, never over the network (AD-2).
 */
import { spawn } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import net from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { adminSocketPath } from '../src/admin-socket.js';
import { BACKEND, createTestDatabase, type TestDatabase } from './helpers/db.js';
import { CLI, freePort, ROOT, run, type Running, SERVER, start } from './helpers/process.js';

let dataDir: string;
let database: TestDatabase;
let port: number;
let server: Running;
/** The server's and the commands' environment: the same DATA_DIR, SECRET_KEY and PASSWORD_HASHING. */
let databaseEnv: Record<string, string>;
const env = () => ({ ...databaseEnv, LOG_LEVEL: 'silent' });

/**
 * The embedded database, whatever this run's back-end. An embedded run has a migrated template:
 * its copy in a DATA_DIR, closed here for the server to open. A PostgreSQL run has none: an empty
 * DATA_DIR, which the server creates and migrates.
 */
async function embeddedDatabase(): Promise<TestDatabase> {
  if (BACKEND === 'pglite') {
    const copy = await createTestDatabase({ onDisk: true });
    await copy.handle.close();
    return copy;
  }
  const folder = mkdtempSync(path.join(tmpdir(), 'orgauth-beside-'));
  return {
    target: { kind: 'pglite', dataDir: path.join(folder, 'pgdata') },
    env: { DATA_DIR: folder, SECRET_KEY: 'beside-secret-key-0123456789abcdefghijklmnop', PASSWORD_HASHING: 'weak-for-tests' },
    drop: async () => rmSync(folder, { recursive: true, force: true }),
  };
}

beforeAll(async () => {
  if (!existsSync(path.join(ROOT, SERVER))) throw new Error(`${SERVER} is missing: run the tests with \`npm test\`, which builds first`);
  database = await embeddedDatabase();
  databaseEnv = database.env;
  dataDir = databaseEnv.DATA_DIR!;
  port = await freePort();
  server = start(SERVER, [], { ...databaseEnv, PORT: String(port) });
  await server.waitForOutput(/orgauth is ready/);
});
afterAll(async () => {
  if (server && server.child.exitCode === null) {
    server.child.kill('SIGTERM');
    await server.exited;
  }
  await database?.drop();
});

/** The real `orgauth` binary in its own process, as from a second terminal. */
const orgauth = (...args: string[]) => run(CLI, args, env());

async function json(...args: string[]): Promise<any> {
  const result = await orgauth(...args, '--json');
  expect(result, result.stderr).toMatchObject({ code: 0, stderr: '' });
  expect(result.stdout.trim().split('\n')).toHaveLength(1);
  return JSON.parse(result.stdout);
}

const api = (orgId: number, token: string, path = '/contacts') =>
  fetch(`http://127.0.0.1:${port}/api/v1/${orgId}${path}`, { headers: { authorization: `Bearer ${token}` } }).then((r) => r.status);

/** Polls until the running server answers `expected`; fails after a second (the issue's bound). */
async function withinOneSecond(probe: () => Promise<number>, expected: number): Promise<void> {
  const since = Date.now();
  for (;;) {
    const status = await probe();
    if (status === expected) return;
    if (Date.now() - since > 1000) throw new Error(`still ${status} a second later, expected ${expected}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

describe('the orgauth command beside a running server on the embedded database', () => {
  let orgId: number;
  let app: { client_id: string; client_secret: string };
  let token: string;

  it('creates a user, an organization and a private application, and issues a token the server accepts', async () => {
    const user = await json('user', 'create', '--email', 'shell@example.com', '--password', 'shell-password-1', '--name', 'Shell User');
    expect(user).toEqual({ id: expect.any(Number), email: 'shell@example.com', name: 'Shell User' });
    const org = await json('org', 'create', '--name', 'Shell Org', '--owner', 'shell@example.com');
    expect(org).toEqual({ id: expect.any(Number), name: 'Shell Org' });
    orgId = org.id;
    app = await json('app', 'create', '--org', String(orgId), '--type', 'private', '--name', 'Shell Integration', '--scopes', 'contacts.read applications.read');
    expect(app).toMatchObject({ client_id: expect.stringMatching(/^[0-9a-f]{32}$/), client_secret: expect.any(String), organization_id: orgId, scopes: ['contacts.read', 'applications.read'] });
    const issued = await json('token', 'create', '--client-id', app.client_id);
    expect(issued).toMatchObject({ token_type: 'Bearer', organization_id: orgId, organization_name: 'Shell Org', scope: 'contacts.read applications.read' });
    token = issued.access_token;
    expect(await api(orgId, token)).toBe(200);
    expect(await api(orgId, token, '/applications')).toBe(200);
    // The application's secret works on the server's token endpoint, too.
    const res = await fetch(`http://127.0.0.1:${port}/oauth/token`, {
      method: 'POST',
      headers: { authorization: `Basic ${Buffer.from(`${app.client_id}:${app.client_secret}`).toString('base64')}`, 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ grant_type: 'client_credentials', organization_id: String(orgId), scope: 'contacts.read' }),
    });
    expect(res.status).toBe(200);
  });

  it('lists users, organizations, members, applications, grants and keys as {"data": [...]}', async () => {
    // Only reads: the commands run side by side, from as many shells, and the server answers each.
    const [users, orgs, members, apps, grants, keys, text] = await Promise.all([
      json('user', 'list'),
      json('org', 'list'),
      json('member', 'list', '--org', String(orgId)),
      json('app', 'list', '--org', String(orgId)),
      json('grant', 'list', '--org', String(orgId)),
      json('keys', 'list'),
      orgauth('member', 'list', '--org', String(orgId)),
    ]);
    expect(users.data).toContainEqual({ id: expect.any(Number), email: 'shell@example.com', name: 'Shell User', created_at: expect.any(String) });
    expect(users).toHaveProperty('next_cursor', null);
    expect(orgs.data).toContainEqual({ id: orgId, name: 'Shell Org', require_mfa: false, created_at: expect.any(String) });
    expect(members.data).toEqual([
      { user_id: expect.any(Number), email: 'shell@example.com', name: 'Shell User', role: 'owner', two_step: false, created_at: expect.any(String) },
    ]);
    expect(apps.data).toEqual([expect.objectContaining({ client_id: app.client_id, organization_id: orgId, type: 'private', disabled: false })]);
    expect(JSON.stringify(apps)).not.toContain(app.client_secret);
    expect(grants.data).toEqual([expect.objectContaining({ user: null, application: expect.objectContaining({ client_id: app.client_id }) })]);
    // The access tokens' key (SIGNING_ALG) and the ID tokens' RS256 key.
    expect(keys.data).toEqual(
      expect.arrayContaining([
        { kid: expect.any(String), alg: 'ES256', status: 'active', created_at: expect.any(String), retired_at: null },
        { kid: expect.any(String), alg: 'RS256', status: 'active', created_at: expect.any(String), retired_at: null },
      ]),
    );
    expect(keys.data).toHaveLength(2);
    // Plain text for people.
    expect(text.code).toBe(0);
    expect(text.stdout).toMatch(/^USER +EMAIL +NAME +ROLE +JOINED\n\d+ +shell@example.com +Shell User +owner /);
  });

  it('changes roles and membership, refusing to demote or remove the last owner (RO-3)', async () => {
    await json('user', 'create', '--email', 'second@example.com', '--password', 'second-password-1');
    expect(await json('member', 'add', '--org', String(orgId), '--email', 'second@example.com')).toMatchObject({ role: 'member' });
    expect(await json('member', 'set-role', '--org', String(orgId), '--email', 'second@example.com', '--role', 'admin')).toMatchObject({ role: 'admin' });
    // Both refused, so neither changes what the other finds: tried at once.
    const [demote, remove] = await Promise.all([
      orgauth('member', 'set-role', '--org', String(orgId), '--email', 'shell@example.com', '--role', 'member', '--json'),
      orgauth('member', 'remove', '--org', String(orgId), '--email', 'shell@example.com'),
    ]);
    expect(demote.code).toBe(1);
    expect(demote.stdout).toBe('');
    expect(JSON.parse(demote.stderr)).toEqual({ error: 'conflict', error_description: expect.stringMatching(/last owner/) });
    expect(remove).toEqual({ code: 1, stdout: '', stderr: 'orgauth: the last owner of an organization cannot be removed\n' });
    expect(await json('member', 'remove', '--org', String(orgId), '--email', 'second@example.com')).toEqual({ organization_id: orgId, user_id: expect.any(Number), removed: true });
  });

  it('revokes a grant and disables an application: the running server refuses their tokens within a second', async () => {
    const [grant] = (await json('grant', 'list', '--org', String(orgId))).data;
    expect(await json('grant', 'revoke', '--id', String(grant.id))).toEqual({ id: grant.id, revoked: true });
    await withinOneSecond(() => api(orgId, token), 401);
    // The same grant revoked again, and a new token (a new grant) for the application: at once.
    const [again, created] = await Promise.all([orgauth('grant', 'revoke', '--id', String(grant.id), '--json'), json('token', 'create', '--client-id', app.client_id)]);
    expect({ code: again.code, error: JSON.parse(again.stderr).error }).toEqual({ code: 1, error: 'not_found' });

    const fresh = created.access_token;
    expect(await api(orgId, fresh)).toBe(200);
    expect(await json('app', 'disable', '--client-id', app.client_id)).toMatchObject({ client_id: app.client_id, disabled: true });
    await withinOneSecond(() => api(orgId, fresh), 401);
    expect((await json('app', 'show', '--client-id', app.client_id)).disabled).toBe(true);

    expect(await json('app', 'delete', '--client-id', app.client_id)).toEqual({ client_id: app.client_id, organization_id: orgId, deleted: true });
    const shown = await orgauth('app', 'show', '--client-id', app.client_id, '--json');
    expect({ code: shown.code, stderr: JSON.parse(shown.stderr) }).toEqual({ code: 1, stderr: { error: 'not_found', error_description: `no application with client_id ${app.client_id}` } });
  });

  it('rotates the signing key in the running server', async () => {
    const rotated = await json('keys', 'rotate');
    const keys = (await json('keys', 'list')).data;
    // The access tokens' algorithm's key rotated; the ID tokens' RS256 key stays active beside it.
    expect(keys.filter((k: { alg: string }) => k.alg === 'ES256').map((k: { kid: string; status: string }) => [k.kid, k.status])).toEqual([[rotated.kid, 'active'], [expect.any(String), 'retired']]);
    expect(keys.filter((k: { alg: string }) => k.alg === 'RS256').map((k: { status: string }) => k.status)).toEqual(['active']);
  });

  it('answers usage errors and help itself, exactly as without a server', async () => {
    const [usage, limit, help] = await Promise.all([orgauth('app', 'show', '--json'), orgauth('user', 'list', '--limit', '0'), orgauth('--help')]);
    expect(usage).toEqual({
      code: 1, stdout: '', stderr: `${JSON.stringify({ error: 'usage', error_description: '--client-id is required\nusage: orgauth app show --client-id ID' })}\n`,
    });
    expect(limit.stderr).toMatch(/--limit must be a whole number from 1 to 1000/);
    expect(help.code).toBe(0);
    for (const command of ['user list', 'org list', 'member list', 'member set-role', 'member remove', 'app list', 'app show', 'app disable', 'app delete', 'grant list', 'grant revoke', 'keys list']) {
      expect(help.stdout).toContain(command);
    }
  });

  it('serves the channel on a Unix socket only the owner of DATA_DIR can use, and on no network port (AD-2)', async () => {
    const socket = adminSocketPath(dataDir);
    const stat = statSync(socket);
    expect(stat.isSocket()).toBe(true);
    expect(stat.mode & 0o777).toBe(0o600);
    expect(statSync(path.dirname(socket)).mode & 0o777).toBe(0o700);
    expect(stat.uid).toBe(process.getuid!());

    // The server listens on its port and nothing else (no TCP socket for administration).
    expect(listeningTcpPorts(server.child.pid!)).toEqual([port]);

    // Another user cannot connect, even with every directory on the way opened up: the socket's
    // own mode refuses them. (Needs root to run a process as another user.)
    if (process.getuid!() !== 0) {
      console.log('cli-beside-server: not root, so the connection as another user is not tried');
      return;
    }
    chmodSync(dataDir, 0o755);
    chmodSync(path.dirname(socket), 0o755);
    try {
      expect(await connectAs(65534, socket)).toBe('EACCES');
      expect(await connectAs(0, socket)).toBe('connected');
    } finally {
      chmodSync(path.dirname(socket), 0o700);
      chmodSync(dataDir, 0o700);
    }
  });

  it('gives the same output and exit codes once the server has stopped and the command opens the database itself', async () => {
    const commands = [['org', 'list', '--json'], ['app', 'show', '--client-id', 'f'.repeat(32), '--json'], ['keys', 'list']];
    // Through the server, several at once.
    const through = await Promise.all(commands.map((c) => orgauth(...c)));
    // A client that connects and says nothing does not hold up the shutdown (R-4).
    const idle = net.connect(adminSocketPath(dataDir));
    idle.on('error', () => {});
    await new Promise((resolve) => idle.on('connect', resolve));
    server.child.kill('SIGTERM');
    expect(await server.exited).toEqual({ code: 0, signal: null });
    idle.destroy();
    expect(existsSync(adminSocketPath(dataDir))).toBe(false);
    // On their own, at once: the embedded database opens in one process at a time, so each
    // command waits for the one before it rather than failing.
    const direct = await Promise.all(commands.map((c) => orgauth(...c)));
    expect(direct).toEqual(through);
    expect(through[1]).toMatchObject({ code: 1, stdout: '' });
  });
});

/** The TCP ports the process listens on: its socket inodes matched against /proc/net/tcp{,6} (Linux). */
function listeningTcpPorts(pid: number): number[] {
  const inodes = new Set(
    readdirSync(`/proc/${pid}/fd`).flatMap((fd) => {
      try {
        return [/^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`))?.[1]].filter((x): x is string => x !== undefined);
      } catch {
        return [];
      }
    }),
  );
  const ports = new Set<number>();
  for (const file of ['/proc/net/tcp', '/proc/net/tcp6']) {
    if (!existsSync(file)) continue;
    for (const line of readFileSync(file, 'utf8').split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/);
      // local_address is "HEX_IP:HEX_PORT"; st 0A is LISTEN; column 9 is the inode.
      if (cols[3] === '0A' && inodes.has(cols[9] ?? '')) ports.add(parseInt(cols[1]!.split(':')[1]!, 16));
    }
  }
  return [...ports].sort((x, y) => x - y);
}

/** Tries to connect to the Unix socket as `uid`; resolves to 'connected' or the error code. */
function connectAs(uid: number, socket: string): Promise<string> {
  const script = `const c=require('node:net').connect(${JSON.stringify(socket)});c.on('connect',()=>{process.stdout.write('connected');c.destroy()});c.on('error',(e)=>process.stdout.write(e.code))`;
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['-e', script], { uid, gid: uid, stdio: ['ignore', 'pipe', 'inherit'], cwd: '/' });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.on('error', reject);
    child.on('exit', () => resolve(out));
  });
}
