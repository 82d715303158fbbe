/**
 * `orgauth webhook ...` (issue 27): an operator adds an organization's webhook endpoints (the
 * secret printed once, --json as the API's 201), lists, shows, changes, rotates, pings and
 * deletes them, and reads and retries deliveries. Run in-process like test/cli.test.ts, on the
 * backend TEST_DATABASE_URL selects, with WEBHOOK_ALLOW_PRIVATE=1 for loopback receivers except
 * where the production rules are the point.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, runCommandLine } from '../src/cli/index.js';
import { loadConfig } from '../src/config.js';
import type { DB } from '../src/db/connect.js';
import { openWebhookSecret } from '../src/webhooks/secrets.js';
import { TEST_SECRET_KEY } from './helpers/app.js';
import { BACKEND, createEmptyDatabase, type TestDatabase } from './helpers/db.js';
import { finishJobs } from './helpers/jobs.js';
import { sharedDatabase } from './helpers/shared-database.js';

let database: TestDatabase;
let orgId: string;
const RECEIVER = 'http://127.0.0.1:9/hooks/cli';

beforeAll(async () => {
  database = await createEmptyDatabase({ onDisk: true });
  expect((await cli('migrate')).code).toBe(0);
  // Set up in process: the user and org commands are test/cli.test.ts's.
  expect((await inProcess({}, 'user', 'create', '--email', 'owner@webhooks-cli.example', '--password', 'a-long-password')).code).toBe(0);
  orgId = String(JSON.parse((await inProcess({}, 'org', 'create', '--name', 'Hooks Corp', '--owner', 'owner@webhooks-cli.example', '--json')).stdout).id);

  // The first command migrates an embedded database on disk: slow on a busy machine.
}, 180_000);
afterAll(async () => {
  await closeShared();
  await database?.drop();
});

/** The test database, WEBHOOK_ALLOW_PRIVATE=1 and `env` on top. */
const cliEnv = (env: Record<string, string> = {}) => ({ ...database.env, LOG_LEVEL: 'silent', WEBHOOK_ALLOW_PRIVATE: '1', ...env });

/**
 * The database the commands after the first of their family run on, opened once (the embedded
 * database on disk takes a second or more to open, and one command opens it only while no other
 * process holds it): closed before a command runs through runCli there.
 */
const { db: sharedDb, close: closeShared } = sharedDatabase(() => cliEnv());
/** The families (`webhook`, ...) a command has run through runCli. */
const ranThroughRunCli = new Set<string>();

/**
 * Runs a command with cliEnv(env) as `orgauth` does. The first of each family (and every
 * `migrate`) goes through runCli, which loads the configuration and opens and migrates the
 * database itself, as the binary does; the others run in process.
 */
async function cliWith(env: Record<string, string>, ...argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const family = argv.find((a) => !a.startsWith('-')) ?? argv[0] ?? '';
  if (family !== 'migrate' && ranThroughRunCli.has(family)) return inProcess(env, ...argv);
  ranThroughRunCli.add(family);
  // The embedded database is held by one process at a time: the shared one is closed first,
  // unless for help, answered before any database is opened.
  if (BACKEND === 'pglite' && !argv.includes('--help')) await closeShared();
  let stdout = '';
  let stderr = '';
  const code = await runCli(argv, { stdout: (s) => (stdout += s), stderr: (s) => (stderr += s), env: cliEnv(env) });
  return { code, stdout, stderr };
}

/**
 * Runs a command on the shared database with runCommandLine (the parsing and command runCli
 * runs, and the server runs for its admin socket), then finishes the jobs it queued, as runCli does.
 */
async function inProcess(env: Record<string, string>, ...argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const db = await sharedDb();
  const outcome = await runCommandLine(argv, { db, config: loadConfig(cliEnv(env)), applied: [] });
  await finishJobs(db);
  return outcome;
}

const cli = (...argv: string[]) => cliWith({}, ...argv);

/** Runs a --json command and returns its one object, failing on anything else. */
async function json(...argv: string[]): Promise<Record<string, any>> {
  const result = await cli(...argv, '--json');
  expect(result, result.stderr).toMatchObject({ code: 0, stderr: '' });
  expect(result.stdout.trim().split('\n')).toHaveLength(1);
  return JSON.parse(result.stdout) as Record<string, any>;
}

/** Runs a --json command that must fail; returns its error object from stderr. */
async function jsonError(...argv: string[]): Promise<{ error: string; error_description: string }> {
  const result = await cli(...argv, '--json');
  expect(result, result.stdout).toMatchObject({ code: 1, stdout: '' });
  return JSON.parse(result.stderr) as { error: string; error_description: string };
}

const withDb = async <T>(fn: (db: DB) => Promise<T>): Promise<T> => fn(await sharedDb());

// A command through runCli opens the embedded database on disk (a second or two each on a busy
// machine, and as long again to open the shared one after it).
describe(`orgauth webhook on ${BACKEND}`, { timeout: 180_000 }, () => {
  let id: number;
  let secret: string;

  it('webhook create --json prints what the API answers: the id and the secret (whsec_), shown this once', async () => {
    const made = await json('webhook', 'create', '--org', orgId, '--url', RECEIVER, '--events', 'member.removed member.added', '--description', 'CRM');
    expect(made).toEqual({
      id: expect.any(Number), organization_id: Number(orgId), url: RECEIVER, description: 'CRM', events: ['member.added', 'member.removed'],
      enabled: true, disabled_reason: null, failing_since: null, previous_secret_expires_at: null,
      created_at: expect.any(String), updated_at: expect.any(String),
      secret: expect.stringMatching(/^whsec_[A-Za-z0-9+/]{43}=$/),
    });
    id = made.id;
    secret = made.secret;
    const sealed = await withDb((db) => db.selectFrom('webhook_endpoints').select('secret_sealed').where('id', '=', id).executeTakeFirstOrThrow());
    expect(openWebhookSecret(TEST_SECRET_KEY, sealed.secret_sealed)).toBe(secret);
    // Without --json: the id and the secret for people, and the warning.
    const plain = await cli('webhook', 'create', '--org', orgId, '--url', `${RECEIVER}/2`, '--events', 'role.created,role.deleted', '--enabled', 'no');
    expect(plain.code, plain.stderr).toBe(0);
    expect(plain.stdout).toMatch(/^created webhook endpoint \d+ in organization \d+ \(disabled\)\nid: +\d+\nsecret: +whsec_\S+\n\(the secret is shown only now/);
  });

  it('refuses what the rules refuse, and checks usage before opening anything', async () => {
    expect((await jsonError('webhook', 'create', '--org', orgId, '--url', RECEIVER, '--events', 'member.added user.deleted')).error_description).toMatch(/^events\.1: is not an event type/);
    expect((await jsonError('webhook', 'create', '--org', orgId, '--url', RECEIVER)).error_description).toMatch(/^--events is required\nusage: orgauth webhook create/);
    expect((await jsonError('webhook', 'create', '--org', orgId, '--events', 'member.added')).error_description).toMatch(/^--url is required/);
    expect(await jsonError('webhook', 'create', '--org', '999999', '--url', RECEIVER, '--events', 'member.added')).toEqual({ error: 'not_found', error_description: 'organization 999999 not found' });
    expect((await jsonError('webhook', 'show', '--org', orgId, '--id', 'x')).error_description).toMatch(/^--id must be a positive integer/);
    expect((await jsonError('webhook', 'update', '--org', orgId, '--id', String(id))).error_description).toMatch(/^give at least one of/);
    // The production rules: https to a public address.
    const strict = await cliWith({ WEBHOOK_ALLOW_PRIVATE: '0' }, 'webhook', 'create', '--org', orgId, '--url', RECEIVER, '--events', 'member.added', '--json');
    expect(strict.code).toBe(1);
    expect(JSON.parse(strict.stderr)).toEqual({ error: 'invalid_request', error_description: 'url: must be an https URL' });
    const loopback = await cliWith({ WEBHOOK_ALLOW_PRIVATE: '0' }, 'webhook', 'create', '--org', orgId, '--url', 'https://127.0.0.1/x', '--events', 'member.added', '--json');
    expect(JSON.parse(loopback.stderr).error_description).toMatch(/^url: must not point at a private or special-use address/);
  });

  it('webhook list and show never print a secret', async () => {
    const list = await json('webhook', 'list', '--org', orgId);
    expect(list.data.map((e: { id: number }) => e.id)).toContain(id);
    expect(list.next_cursor).toBeNull();
    const firstPage = await json('webhook', 'list', '--org', orgId, '--limit', '1');
    expect(firstPage.data).toHaveLength(1);
    expect((await json('webhook', 'list', '--org', orgId, '--limit', '1', '--cursor', firstPage.next_cursor)).data).toHaveLength(1);
    const shown = await json('webhook', 'show', '--org', orgId, '--id', String(id));
    expect(shown).toMatchObject({ id, url: RECEIVER, events: ['member.added', 'member.removed'] });
    for (const out of [(await cli('webhook', 'list', '--org', orgId)).stdout, (await cli('webhook', 'show', '--org', orgId, '--id', String(id))).stdout, JSON.stringify(list), JSON.stringify(shown)]) {
      expect(out).not.toContain('whsec_');
    }
    expect((await cli('webhook', 'list', '--org', orgId)).stdout).toMatch(/^ID +STATE +URL +EVENTS\n/);
  });

  it('webhook update changes only what is given; --enabled yes clears a disable for failing', async () => {
    const updated = await json('webhook', 'update', '--org', orgId, '--id', String(id), '--events', 'grant.revoked', '--description', 'Grants');
    expect(updated).toMatchObject({ id, url: RECEIVER, events: ['grant.revoked'], description: 'Grants', enabled: true });
    await withDb((db) => db.updateTable('webhook_endpoints').set({ enabled: false, disabled_reason: 'failing', failing_since: new Date(Date.now() - 6 * 86400_000) }).where('id', '=', id).execute());
    expect((await cli('webhook', 'show', '--org', orgId, '--id', String(id))).stdout).toContain('state:       disabled (failing)');
    expect(await json('webhook', 'update', '--org', orgId, '--id', String(id), '--enabled', 'yes')).toMatchObject({ enabled: true, disabled_reason: null, failing_since: null });
    expect((await jsonError('webhook', 'update', '--org', orgId, '--id', String(id), '--enabled', 'maybe')).error_description).toMatch(/^--enabled must be yes or no/);
  });

  it('webhook rotate-secret prints the new secret; the previous one signs for 24 hours', async () => {
    const rotated = await json('webhook', 'rotate-secret', '--org', orgId, '--id', String(id));
    expect(rotated).toMatchObject({ id, secret: expect.stringMatching(/^whsec_/), previous_secret_expires_at: expect.any(String) });
    expect(rotated.secret).not.toBe(secret);
    const row = await withDb((db) => db.selectFrom('webhook_endpoints').select(['secret_sealed', 'previous_secret_sealed']).where('id', '=', id).executeTakeFirstOrThrow());
    expect(openWebhookSecret(TEST_SECRET_KEY, row.previous_secret_sealed!)).toBe(secret);
    expect(openWebhookSecret(TEST_SECRET_KEY, row.secret_sealed)).toBe(rotated.secret);
  });

  it('webhook ping queues a delivery; deliveries, delivery and retry read and resend it', async () => {
    const ping = await json('webhook', 'ping', '--org', orgId, '--id', String(id));
    expect(ping).toMatchObject({ endpoint_id: id, event_type: 'webhook.ping', message_id: expect.stringMatching(/^msg_[0-9a-f]{32}$/), state: 'pending' });
    const deliveries = await json('webhook', 'deliveries', '--org', orgId, '--id', String(id));
    expect(deliveries.data.map((d: { id: number }) => d.id)).toContain(ping.id);
    await withDb(async (db) => {
      await db.updateTable('webhook_deliveries').set({ state: 'failed', attempts: 1, last_status: 502, finished_at: new Date() }).where('id', '=', ping.id).execute();
      await db.insertInto('webhook_attempts').values({ delivery_id: ping.id, attempt: 1, duration_ms: 7, status: 502, response_body: 'bad gateway', error: null }).execute();
    });
    const detail = await json('webhook', 'delivery', '--org', orgId, '--id', String(id), '--delivery', String(ping.id));
    expect(detail).toMatchObject({ id: ping.id, state: 'failed', payload: { type: 'webhook.ping', data: { endpoint_id: id } }, attempts_log: [{ attempt: 1, status: 502, response_body: 'bad gateway' }] });
    const text = await cli('webhook', 'delivery', '--org', orgId, '--id', String(id), '--delivery', String(ping.id));
    expect(text.stdout).toMatch(/attempt 1: \S+ HTTP 502 in 7 ms\n {2}answer: bad gateway/);
    const retried = await json('webhook', 'retry', '--org', orgId, '--id', String(id), '--delivery', String(ping.id));
    expect(retried).toMatchObject({ id: ping.id, message_id: ping.message_id, state: 'pending', attempts: 1 });
    expect((await jsonError('webhook', 'delivery', '--org', orgId, '--id', String(id), '--delivery', '99999999')).error).toBe('not_found');
  });

  it('webhook delete removes it; the operator acted, in the audit log', async () => {
    expect(await json('webhook', 'delete', '--org', orgId, '--id', String(id))).toEqual({ id, organization_id: Number(orgId), deleted: true });
    expect((await jsonError('webhook', 'show', '--org', orgId, '--id', String(id))).error).toBe('not_found');
    const audit = await withDb((db) => db.selectFrom('audit_events').select(['action', 'actor_user_id', 'actor_client_id']).where('organization_id', '=', Number(orgId)).where('action', 'like', 'webhook.%').orderBy('id').execute());
    expect(audit.map((e) => e.action)).toEqual([
      'webhook.created', 'webhook.created', 'webhook.updated', 'webhook.updated', 'webhook.secret_rotated', 'webhook.pinged', 'webhook.delivery_retried', 'webhook.deleted',
    ]);
    expect(audit.every((e) => e.actor_user_id === null && e.actor_client_id === null)).toBe(true);
  });

  it('lists the commands in the help', async () => {
    const help = await cli('--help');
    for (const command of ['create', 'list', 'show', 'update', 'delete', 'rotate-secret', 'ping', 'deliveries', 'delivery', 'retry']) expect(help.stdout).toContain(`webhook ${command}`);
  });
});
