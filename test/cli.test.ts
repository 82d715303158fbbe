import { mkdtempSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { exportJWK, generateKeyPair } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, runCommandLine } from '../src/cli/index.js';
import { loadConfig } from '../src/config.js';
import type { DB } from '../src/db/connect.js';
import { secretMatches } from '../src/lib/crypto.js';
import { BACKEND, createEmptyDatabase, type TestDatabase } from './helpers/db.js';
import { finishJobs } from './helpers/jobs.js';
import { sharedDatabase } from './helpers/shared-database.js';

let database: TestDatabase;

beforeAll(async () => {
  database = await createEmptyDatabase({ onDisk: true });
});
afterAll(async () => {
  await closeShared();
  await database.drop();
});

const cliEnv = () => ({ ...database.env, LOG_LEVEL: 'silent' });

/**
 * The database the commands after the first of their family run on, opened once (the embedded
 * database on disk takes a second or more to open, and one command opens it only while no other
 * process holds it): closed before a command runs through runCli there.
 */
const { db: sharedDb, close: closeShared } = sharedDatabase(() => cliEnv());
/** The families (`user`, `app`, ...) a command has run through runCli. */
const ranThroughRunCli = new Set<string>();

/**
 * Runs a command as `orgauth` does. The first of each family (and every `migrate`) goes through
 * runCli, which loads the configuration and opens and migrates the database itself, as the
 * binary does; the others run on the shared database with runCommandLine (the parsing and
 * command runCli runs, and the server runs for its admin socket), and the jobs they queue are
 * finished after each, as runCli does.
 */
async function cli(...argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const family = argv.find((a) => !a.startsWith('-')) ?? argv[0] ?? '';
  if (family !== 'migrate' && ranThroughRunCli.has(family)) {
    const db = await sharedDb();
    const outcome = await runCommandLine(argv, { db, config: loadConfig(cliEnv()), applied: [] });
    await finishJobs(db);
    return outcome;
  }
  ranThroughRunCli.add(family);
  // The embedded database is held by one process at a time: the shared one is closed first,
  // unless for help, answered before any database is opened.
  if (BACKEND === 'pglite' && !argv.includes('--help')) await closeShared();
  let stdout = '';
  let stderr = '';
  const code = await runCli(argv, { stdout: (s) => (stdout += s), stderr: (s) => (stderr += s), env: cliEnv() });
  return { code, stdout, stderr };
}

/** Runs a --json command and returns its one object, failing on anything else. */
async function json(...argv: string[]): Promise<Record<string, unknown>> {
  const result = await cli(...argv, '--json');
  expect(result, result.stderr).toMatchObject({ code: 0, stderr: '' });
  expect(result.stdout.trim().split('\n')).toHaveLength(1);
  return JSON.parse(result.stdout) as Record<string, unknown>;
}

/** Runs a --json command that must fail; returns its error object from stderr. */
async function jsonError(...argv: string[]): Promise<{ error: string; error_description: string }> {
  const result = await cli(...argv, '--json');
  expect(result).toMatchObject({ code: 1, stdout: '' });
  return JSON.parse(result.stderr) as { error: string; error_description: string };
}

const withDb = async <T>(fn: (db: DB) => Promise<T>): Promise<T> => fn(await sharedDb());

// A command through runCli opens the embedded database on disk (a second or two each on a busy
// machine, and as long again to open the shared one after it): more time than the default 30 s.
describe(`orgauth CLI on ${BACKEND}`, { timeout: 120_000 }, () => {
  let orgId: number;

  it('migrate applies the migrations once', async () => {
    const every = readdirSync(new URL('../migrations/', import.meta.url)).filter((f) => f.endsWith('.ts')).map((f) => f.slice(0, -3)).sort();
    expect(every.length).toBeGreaterThan(5);
    expect(await json('migrate')).toEqual({ applied: every });
    expect(await json('migrate')).toEqual({ applied: [] });
    expect((await cli('migrate')).stdout).toBe('the database is up to date\n');
  });

  it('user create prints the user, never the password', async () => {
    const result = await cli('user', 'create', '--email', 'Owner@Example.com', '--password', 'a-long-password', '--name', 'Olive Owner', '--json');
    expect(result.code).toBe(0);
    expect(JSON.parse(result.stdout)).toEqual({ id: expect.any(Number), email: 'Owner@Example.com', name: 'Olive Owner' });
    expect(result.stdout).not.toContain('a-long-password');
    expect(await json('user', 'create', '--email', 'member@example.com', '--password', 'another-password')).toEqual({
      id: expect.any(Number),
      email: 'member@example.com',
      name: '',
    });
  });

  it('user create refuses a taken email (any case), a short password and a missing flag', async () => {
    expect(await jsonError('user', 'create', '--email', 'owner@EXAMPLE.com', '--password', 'a-long-password')).toEqual({
      error: 'conflict',
      error_description: 'a user with email owner@EXAMPLE.com already exists',
    });
    expect(await jsonError('user', 'create', '--email', 'x@example.com', '--password', 'short')).toEqual({
      error: 'invalid_request',
      error_description: 'password: must be at least 10 characters',
    });
    expect(await jsonError('user', 'create', '--email', 'not-an-email', '--password', 'long-enough-password')).toEqual({
      error: 'invalid_request',
      error_description: 'email: must be an email address',
    });
    expect((await jsonError('user', 'create', '--password', 'long-enough-password')).error_description).toMatch(/^--email is required\nusage: orgauth user create/);
  });

  it('org create makes the owner an owner', async () => {
    const org = await json('org', 'create', '--name', 'Acme Corp', '--owner', 'owner@example.com');
    expect(org).toEqual({ id: expect.any(Number), name: 'Acme Corp' });
    orgId = org.id as number;
    const membership = await withDb((db) =>
      db.selectFrom('memberships').innerJoin('users', 'users.id', 'memberships.user_id').select(['email', 'role']).where('organization_id', '=', orgId).execute(),
    );
    expect(membership).toEqual([{ email: 'Owner@Example.com', role: 'owner' }]);
  });

  it('org create refuses an unknown owner and an empty name', async () => {
    expect(await jsonError('org', 'create', '--name', 'X', '--owner', 'nobody@example.com')).toEqual({
      error: 'not_found',
      error_description: 'no user with email nobody@example.com',
    });
    expect(await jsonError('org', 'create', '--name', '   ', '--owner', 'owner@example.com')).toEqual({
      error: 'invalid_request',
      error_description: 'must not be empty',
    });
  });

  it('member add adds with a role (member by default) and refuses duplicates', async () => {
    expect(await json('member', 'add', '--org', String(orgId), '--email', 'member@example.com')).toEqual({
      organization_id: orgId,
      user_id: expect.any(Number),
      role: 'member',
    });
    expect(await jsonError('member', 'add', '--org', String(orgId), '--email', 'member@example.com', '--role', 'admin')).toEqual({
      error: 'conflict',
      error_description: expect.stringMatching(/is already a member of organization/),
    });
  });

  it('member add refuses a bad role, an unknown organization and non-canonical ids', async () => {
    expect(await jsonError('member', 'add', '--org', String(orgId), '--email', 'member@example.com', '--role', 'god')).toEqual({
      error: 'invalid_request',
      error_description: '--role: no role named "god" in this organization',
    });
    expect(await jsonError('member', 'add', '--org', '999999', '--email', 'member@example.com')).toEqual({
      error: 'not_found',
      error_description: 'organization 999999 not found',
    });
    for (const bad of ['01', '-1', '1.0', '1e3', 'abc', '0']) {
      expect(await jsonError('member', 'add', `--org=${bad}`, '--email', 'member@example.com')).toEqual({
        error: 'invalid_request',
        error_description: 'must be a positive integer',
      });
    }
  });

  it('app create (private) prints client_id and client_secret; the database holds only the hash', async () => {
    const app = await json('app', 'create', '--org', String(orgId), '--type', 'private', '--name', 'X');
    expect(app).toEqual({
      client_id: expect.stringMatching(/^[0-9a-f]{32}$/),
      client_secret: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/),
      type: 'private',
      organization_id: orgId,
      name: 'X',
      redirect_uris: [],
      post_logout_redirect_uris: [],
      scopes: ['contacts.read', 'contacts.write', 'tasks.read', 'tasks.write'],
    });
    const row = await withDb((db) => db.selectFrom('applications').selectAll().where('client_id', '=', app.client_id as string).executeTakeFirstOrThrow());
    expect(secretMatches(app.client_secret as string, row.client_secret_hash)).toBe(true);
    expect(JSON.stringify(row)).not.toContain(app.client_secret as string);
  });

  it('app create (public) takes repeated redirect URIs, scopes and --require-pkce', async () => {
    const app = await json(
      'app', 'create', '--org', String(orgId), '--type', 'public', '--name', 'Web',
      '--redirect-uri', 'https://web.example.com/cb', '--redirect-uri', 'http://localhost:8080/callback',
      '--scopes', 'contacts.read tasks.read', '--require-pkce',
    );
    expect(app).toMatchObject({
      type: 'public',
      redirect_uris: ['https://web.example.com/cb', 'http://localhost:8080/callback'],
      scopes: ['contacts.read', 'tasks.read'],
    });
    const row = await withDb((db) => db.selectFrom('applications').select('require_pkce').where('client_id', '=', app.client_id as string).executeTakeFirstOrThrow());
    expect(row.require_pkce).toBe(true);
  });

  it('app create refuses bad redirect URIs, unknown scopes, a bad type and an unknown organization', async () => {
    const base = ['app', 'create', '--org', String(orgId), '--name', 'Bad'];
    expect((await jsonError(...base, '--type', 'public')).error_description).toBe('redirect_uris: a public application needs at least one redirect URI');
    expect((await jsonError(...base, '--type', 'public', '--redirect-uri', 'http://evil.example.com/cb')).error_description).toMatch(
      /http is allowed only for loopback hosts/,
    );
    expect((await jsonError(...base, '--type', 'public', '--redirect-uri', 'https://a.example.com/cb#x')).error_description).toMatch(/must not contain a fragment/);
    expect((await jsonError(...base, '--type', 'private', '--redirect-uri', 'https://a.example.com/cb')).error_description).toMatch(/has no redirect URIs/);
    expect((await jsonError(...base, '--type', 'private', '--scopes', 'contacts.read admin')).error_description).toMatch(/^unknown scope "admin"/);
    expect((await jsonError(...base, '--type', 'secret')).error_description).toMatch(/^--type must be public or private/);
    expect(await jsonError('app', 'create', '--org', '424242', '--type', 'private', '--name', 'X')).toEqual({
      error: 'not_found',
      error_description: 'organization 424242 not found',
    });
  });

  it('app create takes repeated post-logout redirect URIs, and show and list print them', async () => {
    const uris = ['https://web.example.com/signed-out', 'http://[::1]:9000/bye'];
    const base = ['app', 'create', '--org', String(orgId), '--type', 'public', '--name', 'Signs out', '--redirect-uri', 'https://web.example.com/cb'];
    const app = await json(...base, '--post-logout-redirect-uri', uris[0]!, '--post-logout-redirect-uri', uris[1]!);
    expect(app).toMatchObject({ redirect_uris: ['https://web.example.com/cb'], post_logout_redirect_uris: uris });
    const row = await withDb((db) => db.selectFrom('applications').select('post_logout_redirect_uris').where('client_id', '=', app.client_id as string).executeTakeFirstOrThrow());
    expect(row.post_logout_redirect_uris).toEqual(uris);
    expect((await json('app', 'show', '--client-id', app.client_id as string)).post_logout_redirect_uris).toEqual(uris);
    const listed = (await json('app', 'list', '--org', String(orgId))).data as { client_id: string; post_logout_redirect_uris: string[] }[];
    expect(listed.find((a) => a.client_id === app.client_id)?.post_logout_redirect_uris).toEqual(uris);

    // As text: a line each in create's output and in show's, aligned with the others.
    const text = await cli(...base, '--post-logout-redirect-uri', uris[0]!);
    expect(text.stdout).toContain(`\npost_logout_redirect_uris: ${uris[0]}\n`);
    const shownLines = (await cli('app', 'show', '--client-id', app.client_id as string)).stdout.split('\n');
    const shown = shownLines.map((l) => l.replace(/: +/, ': '));
    expect(shown).toContain(`post_logout_redirect_uris: ${uris.join(' ')}`);
    expect(shown).toContain(`redirect_uris: https://web.example.com/cb`);
    // None: no line in create's output.
    const none = await cli(...base);
    expect(none.stdout).not.toContain('post_logout_redirect_uris');
  });

  it('app create refuses bad post-logout redirect URIs as it refuses bad redirect URIs', async () => {
    const base = ['app', 'create', '--org', String(orgId), '--name', 'Bad'];
    for (const bad of ['https://a.example.com/bye#x', 'http://evil.example.com/bye', '/bye', 'https://a.example.com/b\u0001ye']) {
      const asRedirect = await jsonError(...base, '--type', 'public', '--redirect-uri', bad);
      expect(asRedirect.error_description).toMatch(/^redirect_uris\.0: /);
      expect(await jsonError(...base, '--type', 'public', '--redirect-uri', 'https://a.example.com/cb', '--post-logout-redirect-uri', bad)).toEqual({
        error: 'invalid_request',
        error_description: asRedirect.error_description.replace(/^redirect_uris/, 'post_logout_redirect_uris'),
      });
    }
    const many = Array.from({ length: 21 }, (_, i) => ['--post-logout-redirect-uri', `https://a.example.com/bye/${i}`]).flat();
    expect(await jsonError(...base, '--type', 'public', '--redirect-uri', 'https://a.example.com/cb', ...many)).toEqual({
      error: 'invalid_request',
      error_description: 'post_logout_redirect_uris: at most 20 post-logout redirect URIs',
    });
    expect(await jsonError(...base, '--type', 'private', '--post-logout-redirect-uri', 'https://a.example.com/bye')).toEqual({
      error: 'invalid_request',
      error_description: 'post_logout_redirect_uris: a private application has no post-logout redirect URIs (it uses client_credentials)',
    });
    expect((await jsonError(...base, '--type', 'public', '--redirect-uri', 'https://a.example.com/cb', '--post-logout-redirect-uri')).error).toBe('usage');
    const help = (await cli('app', 'create', '--help')).stdout;
    expect(help).toContain('[--post-logout-redirect-uri URI]...');
    expect(help).toContain('RP-initiated logout');
  });

  it('app update changes what it is given and keeps the rest; the URI lists are replaced whole, or cleared', async () => {
    const created = await json('app', 'create', '--org', String(orgId), '--type', 'public', '--name', 'Updated', '--redirect-uri', 'https://u.example.com/cb', '--scopes', 'contacts.read tasks.read');
    const id = created.client_id as string;
    const byes = ['https://u.example.com/bye', 'https://u.example.com/bye2'];
    const updated = await json('app', 'update', '--client-id', id, '--post-logout-redirect-uri', byes[0]!, '--post-logout-redirect-uri', byes[1]!, '--require-pkce', 'yes');
    expect(updated).toMatchObject({ client_id: id, name: 'Updated', redirect_uris: ['https://u.example.com/cb'], post_logout_redirect_uris: byes, scopes: ['contacts.read', 'tasks.read'], require_pkce: true });
    const renamed = await json('app', 'update', '--client-id', id, '--name', 'Renamed', '--redirect-uri', 'https://u.example.com/cb2', '--scopes', 'contacts.read');
    expect(renamed).toMatchObject({ name: 'Renamed', redirect_uris: ['https://u.example.com/cb2'], post_logout_redirect_uris: byes, scopes: ['contacts.read'], require_pkce: true });
    expect(await json('app', 'update', '--client-id', id, '--no-post-logout-redirect-uris')).toMatchObject({ post_logout_redirect_uris: [], name: 'Renamed' });
    const row = await withDb((db) => db.selectFrom('applications').select(['name', 'post_logout_redirect_uris', 'require_pkce']).where('client_id', '=', id).executeTakeFirstOrThrow());
    expect(row).toEqual({ name: 'Renamed', post_logout_redirect_uris: [], require_pkce: true });
    // Refused as create refuses, nothing changed.
    expect((await jsonError('app', 'update', '--client-id', id, '--post-logout-redirect-uri', 'http://evil.example.com/bye')).error_description).toMatch(/^post_logout_redirect_uris\.0: /);
    expect((await jsonError('app', 'update', '--client-id', id, '--post-logout-redirect-uri', byes[0]!, '--no-post-logout-redirect-uris')).error).toBe('usage');
    expect((await jsonError('app', 'update', '--client-id', id, '--require-pkce', 'maybe')).error).toBe('usage');
    expect((await jsonError('app', 'update', '--client-id', 'no-such-client')).error).toBe('not_found');
    expect((await json('app', 'show', '--client-id', id)).post_logout_redirect_uris).toEqual([]);
    expect((await cli('app', 'update', '--client-id', id, '--name', 'Text')).stdout).toBe(`updated application ${id} "Text"\n`);
  });

  it('app rotate-secret replaces the secret and refuses unknown clients', async () => {
    const app = await json('app', 'create', '--org', String(orgId), '--type', 'private', '--name', 'Rotate me');
    const rotated = await json('app', 'rotate-secret', '--client-id', app.client_id as string);
    expect(rotated).toEqual({ client_id: app.client_id, client_secret: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/) });
    expect(rotated.client_secret).not.toBe(app.client_secret);
    const row = await withDb((db) => db.selectFrom('applications').select('client_secret_hash').where('client_id', '=', app.client_id as string).executeTakeFirstOrThrow());
    expect(secretMatches(rotated.client_secret as string, row.client_secret_hash)).toBe(true);
    expect(secretMatches(app.client_secret as string, row.client_secret_hash)).toBe(false);
    expect(await jsonError('app', 'rotate-secret', '--client-id', 'nope')).toEqual({ error: 'not_found', error_description: 'no application with client_id nope' });
  });

  it('token create prints a client_credentials token response for a private application', async () => {
    const app = await json('app', 'create', '--org', String(orgId), '--type', 'private', '--name', 'Tokens', '--scopes', 'contacts.read tasks.read');
    const token = await json('token', 'create', '--client-id', app.client_id as string, '--scopes', 'tasks.read');
    expect(token).toEqual({
      token_type: 'Bearer', expires_in: 31_536_000, access_token: expect.stringMatching(/^eyJ/), scope: 'tasks.read',
      organization_id: orgId, organization_name: 'Acme Corp',
    });
    expect((await json('token', 'create', '--client-id', app.client_id as string)).scope).toBe('contacts.read tasks.read');
    expect(await jsonError('token', 'create', '--client-id', app.client_id as string, '--scopes', 'contacts.write')).toEqual({
      error: 'invalid_scope', error_description: expect.stringMatching(/not allowed/),
    });
    const pub = await json('app', 'create', '--org', String(orgId), '--type', 'public', '--name', 'Pub', '--redirect-uri', 'https://p.example.com/cb');
    expect((await jsonError('token', 'create', '--client-id', pub.client_id as string)).error).toBe('unauthorized_client');
    expect((await jsonError('token', 'create', '--client-id', 'nope')).error).toBe('not_found');
  });

  it('user list and org list page through everything with --limit and --cursor', async () => {
    const all = await withDb((db) => db.selectFrom('users').select(['id', 'email']).orderBy('id').execute());
    const seen: unknown[] = [];
    let cursor: string | null = null;
    do {
      const listed: { data: { id: number; email: string }[]; next_cursor: string | null } = (await json('user', 'list', '--limit', '1', ...(cursor ? ['--cursor', cursor] : []))) as never;
      expect(listed.data.length).toBeLessThanOrEqual(1);
      seen.push(...listed.data.map((u) => ({ id: u.id, email: u.email })));
      cursor = listed.next_cursor;
    } while (cursor);
    expect(seen).toEqual(all);
    expect((await json('org', 'list')).data).toContainEqual({ id: orgId, name: 'Acme Corp', require_mfa: false, created_at: expect.any(String) });
    for (const bad of ['0', '1001', 'x', '-1']) expect((await jsonError('user', 'list', `--limit=${bad}`)).error).toBe('usage');
    expect(await jsonError('user', 'list', '--cursor', 'nonsense')).toEqual({ error: 'invalid_request', error_description: 'cursor is invalid' });
  });

  it('member list, set-role and remove; the last owner stays (RO-3)', async () => {
    const members = (await json('member', 'list', '--org', String(orgId))).data as { email: string; role: string }[];
    expect(members.map((m) => [m.email, m.role])).toEqual([['Owner@Example.com', 'owner'], ['member@example.com', 'member']]);
    expect(await json('member', 'set-role', '--org', String(orgId), '--email', 'member@example.com', '--role', 'owner')).toEqual({
      organization_id: orgId, user_id: expect.any(Number), role: 'owner',
    });
    expect((await json('member', 'set-role', '--org', String(orgId), '--email', 'owner@example.com', '--role', 'admin')).role).toBe('admin');
    expect(await jsonError('member', 'set-role', '--org', String(orgId), '--email', 'member@example.com', '--role', 'member')).toEqual({
      error: 'conflict', error_description: 'the last owner of an organization cannot be demoted; make someone else an owner first',
    });
    expect(await jsonError('member', 'remove', '--org', String(orgId), '--email', 'member@example.com')).toEqual({
      error: 'conflict', error_description: 'the last owner of an organization cannot be removed',
    });
    expect((await jsonError('member', 'set-role', '--org', String(orgId), '--email', 'member@example.com', '--role', 'god')).error_description).toBe('--role: no role named "god" in this organization');
    expect((await json('member', 'set-role', '--org', String(orgId), '--email', 'owner@example.com', '--role', 'owner')).role).toBe('owner');
    expect(await json('member', 'remove', '--org', String(orgId), '--email', 'member@example.com')).toEqual({ organization_id: orgId, user_id: expect.any(Number), removed: true });
    expect(await jsonError('member', 'remove', '--org', String(orgId), '--email', 'member@example.com')).toEqual({ error: 'not_found', error_description: 'no such member in this organization' });
  });

  it('role create, list, update and delete; members take custom roles by name', async () => {
    expect(await json('role', 'create', '--org', String(orgId), '--name', 'Support', '--permissions', 'contacts.read tasks.read', '--description', 'Reads')).toMatchObject({
      name: 'Support', builtin: false, permissions: ['contacts.read', 'tasks.read'], description: 'Reads',
    });
    const roles = (await json('role', 'list', '--org', String(orgId))) as unknown as { name: string; builtin: boolean }[];
    expect(roles.map((r) => [r.name, r.builtin])).toEqual([['owner', true], ['admin', true], ['member', true], ['viewer', true], ['Support', false]]);
    expect((await jsonError('role', 'create', '--org', String(orgId), '--name', 'support', '--permissions', 'contacts.read')).error).toBe('conflict');
    expect((await jsonError('role', 'create', '--org', String(orgId), '--name', 'Bad', '--permissions', 'contacts.read everything')).error_description).toMatch(/unknown permission "everything"/);
    expect((await jsonError('role', 'update', '--org', String(orgId), '--role', 'admin', '--permissions', 'contacts.read')).error).toBe('forbidden');
    expect((await json('member', 'add', '--org', String(orgId), '--email', 'member@example.com', '--role', 'support')).role).toBe('Support');
    expect((await json('role', 'update', '--org', String(orgId), '--role', 'Support', '--name', 'Helpdesk', '--permissions', 'contacts.read')).permissions).toEqual(['contacts.read']);
    expect(((await json('member', 'list', '--org', String(orgId))).data as { role: string }[]).map((m) => m.role)).toContain('Helpdesk');
    expect((await jsonError('role', 'delete', '--org', String(orgId), '--role', 'Helpdesk')).error).toBe('conflict');
    expect(await json('role', 'delete', '--org', String(orgId), '--role', 'Helpdesk', '--move-to', 'member')).toEqual({ name: 'Helpdesk', deleted: true, members_moved: 1 });
    expect(((await json('member', 'list', '--org', String(orgId))).data as { email: string; role: string }[]).find((m) => m.email === 'member@example.com')!.role).toBe('member');
  });

  it('app update sets private_key_jwt keys (file or URL), DPoP, PAR, the ID token algorithm and FAPI 2.0, with the API\'s rules', async () => {
    const app = await json('app', 'create', '--org', String(orgId), '--type', 'public', '--name', 'Bank', '--redirect-uri', 'https://bank.example.com/cb');
    const id = app.client_id as string;
    // FAPI 2.0 needs keys: refused while the application has a secret.
    const refused = await cli('app', 'update', '--client-id', id, '--fapi2', 'yes', '--json');
    expect(refused.code).toBe(1);
    expect(JSON.parse(refused.stderr)).toMatchObject({ error: 'invalid_request', error_description: expect.stringContaining('private_key_jwt') });
    const { publicKey } = await generateKeyPair('ES256', { extractable: true });
    const jwksFile = path.join(mkdtempSync(path.join(tmpdir(), 'orgauth-jwks-')), 'jwks.json');
    writeFileSync(jwksFile, JSON.stringify({ keys: [{ ...(await exportJWK(publicKey)), kid: 'k1' }] }));
    const keyed = await json('app', 'update', '--client-id', id, '--token-endpoint-auth-method', 'private_key_jwt', '--jwks-file', jwksFile, '--require-dpop', 'yes', '--require-par', 'yes', '--id-token-signed-response-alg', 'ES256', '--fapi2', 'yes');
    expect(keyed).toMatchObject({
      token_endpoint_auth_method: 'private_key_jwt', jwks: { keys: [expect.objectContaining({ kid: 'k1', kty: 'EC' })] }, jwks_uri: null,
      dpop_bound_access_tokens: true, require_pushed_authorization_requests: true, id_token_signed_response_alg: 'ES256', fapi2: true,
    });
    // The secret is gone with the switch to keys.
    expect(await withDb((db) => db.selectFrom('applications').select('client_secret_hash').where('client_id', '=', id).executeTakeFirstOrThrow())).toEqual({ client_secret_hash: null });
    // A jwks_uri replaces the inline keys; a private key in a file is refused.
    expect(await json('app', 'update', '--client-id', id, '--jwks-uri', 'https://bank.example.com/jwks.json')).toMatchObject({ jwks: null, jwks_uri: 'https://bank.example.com/jwks.json' });
    const { privateKey } = await generateKeyPair('ES256', { extractable: true });
    writeFileSync(jwksFile, JSON.stringify({ keys: [await exportJWK(privateKey)] }));
    const privateRefused = await cli('app', 'update', '--client-id', id, '--jwks-file', jwksFile, '--json');
    expect(privateRefused.code).toBe(1);
    expect(JSON.parse(privateRefused.stderr).error_description).toMatch(/private/);
    expect((await cli('app', 'update', '--client-id', id, '--id-token-signed-response-alg', 'HS256', '--json')).code).toBe(1);
  });

  it('app list, show, disable and delete; grant list and revoke', async () => {
    const app = await json('app', 'create', '--org', String(orgId), '--type', 'private', '--name', 'Lifecycle', '--scopes', 'contacts.read');
    const token = await json('token', 'create', '--client-id', app.client_id as string);
    const listed = (await json('app', 'list', '--org', String(orgId))).data as { client_id: string }[];
    expect(listed.map((a) => a.client_id)).toContain(app.client_id);
    expect(JSON.stringify(listed)).not.toMatch(/"client_secret"/);
    expect(await json('app', 'show', '--client-id', app.client_id as string)).toEqual({
      organization_id: orgId, client_id: app.client_id, type: 'private', name: 'Lifecycle', redirect_uris: [], post_logout_redirect_uris: [], scopes: ['contacts.read'], require_pkce: false, disabled: false,
      created_at: expect.any(String), updated_at: expect.any(String), secret_rotated_at: null,
      token_endpoint_auth_method: 'client_secret_basic', jwks: null, jwks_uri: null, dpop_bound_access_tokens: false,
      require_pushed_authorization_requests: false, id_token_signed_response_alg: 'RS256', fapi2: false,
    });
    const grants = (await json('grant', 'list', '--org', String(orgId))).data as { id: number; application: { client_id: string }; user: unknown }[];
    const own = grants.find((g) => g.application.client_id === app.client_id)!;
    expect(own).toMatchObject({ user: null, scopes: ['contacts.read'] });
    expect(await json('grant', 'revoke', '--id', String(own.id))).toEqual({ id: own.id, revoked: true });
    expect(await jsonError('grant', 'revoke', '--id', String(own.id))).toEqual({ error: 'not_found', error_description: `no live grant with id ${own.id}` });
    expect((await jsonError('grant', 'revoke', '--id', '01')).error).toBe('usage');
    const revoked = await withDb((db) => db.selectFrom('grants').select(['revoked_reason']).where('id', '=', own.id).executeTakeFirstOrThrow());
    expect(revoked.revoked_reason).toBe('revoked_by_admin');
    expect(token.organization_id).toBe(orgId);

    await json('token', 'create', '--client-id', app.client_id as string);
    expect(await json('app', 'disable', '--client-id', app.client_id as string)).toMatchObject({ client_id: app.client_id, disabled: true });
    const live = await withDb((db) => db.selectFrom('grants').innerJoin('applications', 'applications.id', 'grants.application_id').select('grants.revoked_reason').where('client_id', '=', app.client_id as string).orderBy('grants.id').execute());
    expect(live.map((g) => g.revoked_reason)).toEqual(['revoked_by_admin', 'application_disabled']);
    expect((await jsonError('token', 'create', '--client-id', app.client_id as string)).error).toBe('unauthorized_client');
    expect(await json('app', 'delete', '--client-id', app.client_id as string)).toEqual({ client_id: app.client_id, organization_id: orgId, deleted: true });
    expect(await jsonError('app', 'show', '--client-id', app.client_id as string)).toEqual({ error: 'not_found', error_description: `no application with client_id ${app.client_id}` });
    const events = await withDb((db) => db.selectFrom('audit_events').select('action').where('organization_id', '=', orgId).orderBy('id').execute());
    expect(events.map((e) => e.action)).toEqual(expect.arrayContaining(['application.disabled', 'application.deleted', 'grant.revoked']));
  });

  it('app create gives management scopes to private applications only (AD-1)', async () => {
    const admin = await json('app', 'create', '--org', String(orgId), '--type', 'private', '--name', 'Admin', '--scopes', 'applications.read applications.write audit.read');
    expect(admin.scopes).toEqual(['applications.read', 'applications.write', 'audit.read']);
    expect(await jsonError('app', 'create', '--org', String(orgId), '--type', 'public', '--name', 'P', '--redirect-uri', 'https://p.example.com/cb', '--scopes', 'contacts.read members.write')).toEqual({
      error: 'invalid_request', error_description: 'scopes: members.write may be held only by private applications',
    });
  });

  it('keys rotate makes a new active key of SIGNING_ALG; keys list shows each key and what it is still good for', async () => {
    const first = await json('keys', 'rotate');
    expect(first).toEqual({ kid: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/), alg: 'ES256' });
    const second = await json('keys', 'rotate');
    expect(second.kid).not.toBe(first.kid);
    // One active key per algorithm: the ES256 one is the new one.
    const active = await withDb((db) => db.selectFrom('signing_keys').select('kid').where('retired_at', 'is', null).where('alg', '=', 'ES256').execute());
    expect(active).toEqual([{ kid: second.kid }]);
    const listed = (await json('keys', 'list')).data as { kid: string; alg: string; status: string }[];
    expect(listed.filter((k) => k.alg === 'ES256').slice(0, 2)).toEqual([
      { kid: second.kid, alg: 'ES256', status: 'active', created_at: expect.any(String), retired_at: null },
      { kid: first.kid, alg: 'ES256', status: 'retired', created_at: expect.any(String), retired_at: expect.any(String) },
    ]);
    // A key retired longer ago than a token lives verifies nothing any more.
    await withDb((db) => db.updateTable('signing_keys').set({ retired_at: new Date(Date.now() - 366 * 24 * 3600 * 1000) }).where('kid', '=', first.kid as string).execute());
    expect(((await json('keys', 'list')).data as { kid: string; status: string }[]).find((k) => k.kid === first.kid)?.status).toBe('expired');
    expect(JSON.stringify(await json('keys', 'list'))).not.toMatch(/private|"d":/);
  });

  it('resource create, list, show, update and delete manage the resources tokens may be for (RFC 8707)', async () => {
    const created = await json('resource', 'create', '--uri', 'https://MCP.example.com:443/mcp/', '--name', 'Contacts MCP', '--scopes', 'contacts.read tools.call');
    // Stored, and printed, in canonical form: what the tokens' aud will be.
    // With its own credentials (issue 44): the secret shown here only.
    expect(created).toEqual({
      id: expect.any(Number), uri: 'https://mcp.example.com/mcp', name: 'Contacts MCP', scopes: ['contacts.read', 'tools.call'], access_token_ttl: 3600,
      exchange_from: [], client_id: expect.stringMatching(/^[0-9a-f]{32}$/), client_secret: expect.any(String), token_endpoint_auth_method: 'client_secret_basic',
      created_at: expect.any(String), updated_at: expect.any(String),
    });
    expect(JSON.stringify(await json('resource', 'list'))).not.toContain(created.client_secret);
    expect(((await json('resource', 'list')).data as { uri: string }[]).map((r) => r.uri)).toEqual(['https://mcp.example.com/mcp']);
    expect(await json('resource', 'show', '--uri', 'https://mcp.example.com/mcp/')).toMatchObject({ id: created.id, name: 'Contacts MCP' });
    expect(await json('resource', 'update', '--uri', String(created.id), '--scopes', 'tools.call', '--access-token-ttl', '600')).toMatchObject({ scopes: ['tools.call'], access_token_ttl: 600 });
    // A new secret: the same client id, another secret.
    const rotated = await json('resource', 'rotate-secret', '--uri', 'https://mcp.example.com/mcp');
    expect(rotated).toMatchObject({ client_id: created.client_id, client_secret: expect.any(String) });
    expect(rotated.client_secret).not.toBe(created.client_secret);
    // Who may exchange tokens for it (RFC 8693): registered resources (any spelling) and client ids, repeatable; deny removes.
    const files = await json('resource', 'create', '--uri', 'https://files.example.com', '--name', 'Files', '--scopes', 'files.read');
    const allowed = await json('resource', 'update', '--uri', 'https://mcp.example.com/mcp', '--allow-exchange-from', 'HTTPS://files.example.com/', '--allow-exchange-from', String(files.client_id));
    expect(allowed.exchange_from).toEqual(['https://files.example.com', files.client_id]);
    expect((await json('resource', 'update', '--uri', 'https://mcp.example.com/mcp', '--deny-exchange-from', 'https://files.example.com')).exchange_from).toEqual([files.client_id]);
    expect((await jsonError('resource', 'update', '--uri', 'https://mcp.example.com/mcp', '--allow-exchange-from', 'https://unknown.example.com')).error_description).toMatch(/neither a registered resource nor a client id/);
    expect((await jsonError('resource', 'update', '--uri', 'https://mcp.example.com/mcp', '--allow-exchange-from', String(created.client_id))).error_description).toMatch(/for itself/);
    // Deleted, it is no longer allowed anywhere: a resource registered again at its URI starts with nothing.
    await json('resource', 'update', '--uri', 'https://mcp.example.com/mcp', '--allow-exchange-from', 'https://files.example.com');
    expect(await json('resource', 'delete', '--uri', 'https://files.example.com')).toMatchObject({ uri: 'https://files.example.com' });
    expect((await json('resource', 'show', '--uri', 'https://mcp.example.com/mcp')).exchange_from).toEqual([]);
    expect((await jsonError('resource', 'create', '--uri', 'https://mcp.example.com/mcp', '--name', 'Again', '--scopes', 'x')).error).toBe('conflict');
    expect((await jsonError('resource', 'create', '--uri', 'https://mcp.example.com/other', '--name', 'Admin', '--scopes', 'members.write')).error_description).toMatch(/administers orgauth/);
    expect((await jsonError('resource', 'create', '--uri', 'http://mcp.example.com/x', '--name', 'Plain', '--scopes', 'x')).error_description).toMatch(/https/);
    expect(await json('resource', 'delete', '--uri', 'https://mcp.example.com/mcp')).toMatchObject({ uri: 'https://mcp.example.com/mcp' });
    expect((await jsonError('resource', 'show', '--uri', 'https://mcp.example.com/mcp')).error).toBe('not_found');
  });

  it('social create, list, show, update and delete manage sign-in through providers (issue 45); the secret is never shown', async () => {
    const google = await json('social', 'create', '--provider', 'google', '--client-id', 'g-client', '--client-secret', 'g-secret-0123456789');
    expect(google).toEqual({
      id: expect.any(Number), provider: 'google', name: 'Google', state: 'enabled', client_id: 'g-client', issuer: 'https://accounts.google.com', allowed_domains: [],
      redirect_uri: expect.stringMatching(new RegExp(`/social/${google.id}/callback$`)), created_at: expect.any(String), updated_at: expect.any(String),
    });
    const ms = await json('social', 'create', '--provider', 'microsoft', '--client-id', 'm', '--client-secret', 's', '--tenant', 'Organizations', '--allowed-domains', 'Contoso.com fabrikam.com');
    expect(ms).toMatchObject({ issuer: 'https://login.microsoftonline.com', tenant: 'organizations', allowed_domains: ['contoso.com', 'fabrikam.com'] });
    const gh = await json('social', 'create', '--provider', 'github', '--client-id', 'Iv1.abc', '--client-secret', 's', '--base-url', 'https://github.example.com/');
    expect(gh).toMatchObject({ provider: 'github', name: 'GitHub', base_url: 'https://github.example.com' });
    expect(gh.issuer).toBeUndefined();
    const oidc = await json('social', 'create', '--provider', 'oidc', '--client-id', 'c', '--client-secret', 's', '--issuer', 'https://id.example.org', '--name', 'Example ID');
    expect(oidc).toMatchObject({ provider: 'oidc', name: 'Example ID', issuer: 'https://id.example.org' });
    const listed = JSON.stringify(await json('social', 'list'));
    expect(listed).not.toContain('g-secret');
    expect(((await json('social', 'list')).data as { id: number }[]).map((c) => c.id)).toEqual([google.id, ms.id, gh.id, oidc.id]);
    expect(await json('social', 'update', '--id', String(google.id), '--state', 'disabled')).toMatchObject({ state: 'disabled' });
    expect(await json('social', 'show', '--id', String(google.id))).toMatchObject({ state: 'disabled' });
    expect((await json('social', 'update', '--id', String(ms.id), '--allowed-domains', '')).allowed_domains).toEqual([]);
    // What a provider does not have, an unknown provider, a missing issuer, a URL with credentials: refused.
    expect((await jsonError('social', 'create', '--provider', 'github', '--client-id', 'c', '--client-secret', 's', '--issuer', 'https://x.example')).error_description).toMatch(/GitHub has no issuer/);
    expect((await jsonError('social', 'create', '--provider', 'google', '--client-id', 'c', '--client-secret', 's', '--tenant', 'common')).error_description).toMatch(/only Microsoft has a tenant/);
    expect((await jsonError('social', 'create', '--provider', 'facebook', '--client-id', 'c', '--client-secret', 's')).error).toBe('invalid_request');
    expect((await jsonError('social', 'create', '--provider', 'oidc', '--client-id', 'c', '--client-secret', 's')).error_description).toMatch(/needs its issuer/);
    expect((await jsonError('social', 'create', '--provider', 'oidc', '--client-id', 'c', '--client-secret', 's', '--issuer', 'https://user:pw@id.example.org')).error_description).toMatch(/without credentials/);
    expect((await jsonError('social', 'create', '--provider', 'microsoft', '--client-id', 'c', '--client-secret', 's', '--tenant', 'contoso')).error_description).toMatch(/tenant id/);
    expect((await jsonError('social', 'create', '--provider', 'google', '--client-id', 'c')).error).toBe('usage');
    for (const c of [google, ms, gh, oidc]) expect(await json('social', 'delete', '--id', String(c.id))).toEqual({ id: c.id, deleted: true });
    expect((await jsonError('social', 'show', '--id', String(google.id))).error).toBe('not_found');
    expect((await jsonError('social', 'show', '--id', 'x')).error).toBe('usage');
  });

  it('client list shows the clients that registered themselves, and client delete removes one (never a developer’s application)', async () => {
    await withDb((db) =>
      db
        .insertInto('applications')
        .values({ client_id: 'c'.repeat(32), client_secret_hash: null, token_endpoint_auth_method: 'none', registration: 'dynamic', type: 'public', name: 'Agent', redirect_uris: ['http://127.0.0.1/cb'], scopes: ['contacts.read'], require_pkce: true })
        .execute(),
    );
    const listed = (await json('client', 'list')).data as { client_id: string; registration: string; first_used_at: string | null }[];
    expect(listed).toEqual([expect.objectContaining({ client_id: 'c'.repeat(32), registration: 'dynamic', first_used_at: null, name: 'Agent' })]);
    const developers = await json('app', 'create', '--org', String(orgId), '--type', 'private', '--name', 'Not a self-registered one');
    expect((await jsonError('client', 'delete', '--client-id', developers.client_id as string)).error).toBe('not_found');
    expect(await json('client', 'delete', '--client-id', 'c'.repeat(32))).toEqual({ client_id: 'c'.repeat(32), deleted: true });
    expect((await json('client', 'list')).data).toEqual([]);
    expect((await jsonError('client', 'delete', '--client-id', 'c'.repeat(32))).error).toBe('not_found');
  });

  it('cleanup deletes expired rows and says how many', async () => {
    const user = await json('user', 'create', '--email', 'cleanup@example.com', '--password', 'a-long-password');
    await withDb((db) => db.insertInto('sessions').values({ id_hash: 'a'.repeat(64), user_id: user.id as number, expires_at: new Date(Date.now() - 1000) }).execute());
    const none = { authorization_codes: 0, refresh_tokens: 0, revoked_access_tokens: 0, sessions: 0, account_tokens: 0, invitations: 0, pending_sign_ups: 0, sign_up_attempts: 0, mail_outbox: 0, pending_sign_ins: 0, sso_sign_ins: 0, saml_assertion_ids: 0, second_step_failures: 0, unused_clients: 0, device_authorizations: 0, client_registrations: 0, jobs: 0, webhook_events: 0, seen_jtis: 0, pushed_authorization_requests: 0, activity_daily: 0, setup_links: 0, directory_requests: 0 };
    expect(await json('cleanup')).toEqual({ deleted: { ...none, sessions: 1 } });
    expect(await json('cleanup')).toEqual({ deleted: none });
  });

  it('seed-demo prints the demo user, organization and both applications, once', async () => {
    const seed = await json('seed-demo');
    expect(seed).toEqual({
      user: { id: expect.any(Number), email: 'demo@orgauth.local', name: 'Demo User', password: expect.any(String) },
      organization: { id: expect.any(Number), name: 'Demo Organization' },
      public_application: expect.objectContaining({ type: 'public', redirect_uris: ['http://localhost:8080/callback'], client_secret: expect.any(String) }),
      private_application: expect.objectContaining({ type: 'private', client_secret: expect.any(String) }),
    });
    expect(await jsonError('seed-demo')).toEqual({ error: 'conflict', error_description: 'a user with email demo@orgauth.local already exists' });
  });

  it('prints help, and refuses unknown commands and options', async () => {
    const help = await cli('--help');
    expect(help.code).toBe(0);
    for (const command of [
      'migrate', 'user create', 'user list', 'org create', 'org list', 'member add', 'member list', 'member set-role', 'member remove',
      'app create', 'app list', 'app show', 'app rotate-secret', 'app disable', 'app delete', 'token create', 'grant list', 'grant revoke',
      'keys rotate', 'keys list', 'resource create', 'resource list', 'resource show', 'resource update', 'resource delete', 'social create', 'social list', 'social update', 'social delete', 'client list', 'client delete', 'cleanup', 'seed-demo',
    ]) {
      expect(help.stdout).toContain(command);
    }
    expect((await cli('app', 'create', '--help')).stdout).toMatch(/^usage: orgauth app create --org ID/);
    expect(await jsonError('frobnicate')).toEqual({ error: 'usage', error_description: 'unknown command "frobnicate"; run `orgauth --help`' });
    expect((await jsonError('user', 'create', '--emial', 'x')).error_description).toMatch(/Unknown option '--emial'/);
    const plain = await cli('org', 'create', '--name', 'X', '--owner', 'nobody@example.com');
    expect(plain).toEqual({ code: 1, stdout: '', stderr: 'orgauth: no user with email nobody@example.com\n' });
  });

  it('reports a bad configuration as one line per variable', async () => {
    let stderr = '';
    const code = await runCli(['migrate', '--json'], { stdout: () => {}, stderr: (s) => (stderr += s), env: { DATABASE_URL: 'postgres://localhost/x', SECRET_KEY: 'short' } });
    expect(code).toBe(1);
    expect(JSON.parse(stderr)).toEqual({ error: 'invalid_configuration', error_description: 'SECRET_KEY: must be at least 32 characters' });
  });
});
