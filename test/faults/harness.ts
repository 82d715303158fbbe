/**
 * What the fault tests share: HTTP calls that record how they ended and how long they took,
 * polling, pre-issued authorization codes, and the built server's process.
 */
import { existsSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll } from 'vitest';
import type { DB } from '../../src/db/connect.js';
import { generateSecret, sha256Hex } from '../../src/lib/crypto.js';
import { createTestDatabase, TEST_DATABASE_URL, type TestDatabase } from '../helpers/db.js';
import { basic, createOrgFixture, form, type OrgFixture } from '../helpers/oauth.js';
import { ROOT, type Running, SERVER } from '../helpers/process.js';

export interface Outcome {
  label: string;
  startedAt: number;
  endedAt: number;
  ms: number;
  status?: number;
  headers?: http.IncomingHttpHeaders;
  /** Parsed JSON, or the raw text when it is not JSON. */
  body?: unknown;
  /** A socket-level failure (ECONNRESET, ECONNREFUSED, socket hang up...) or our own deadline. */
  error?: string;
}

/**
 * Reads a response to its end and hands `finish` its status, headers and body (parsed JSON, or the
 * text), or the status and the error when the connection fails or is cut before the end.
 */
function readResponse(res: http.IncomingMessage, finish: (rest: Partial<Outcome>) => void): void {
  const chunks: Buffer[] = [];
  res.on('data', (c: Buffer) => chunks.push(c));
  res.on('error', (err: NodeJS.ErrnoException) => finish({ status: res.statusCode, error: err.code ?? err.message }));
  res.on('aborted', () => finish({ status: res.statusCode, error: 'ECONNRESET' }));
  res.on('end', () => {
    const text = Buffer.concat(chunks).toString('utf8');
    let body: unknown = text;
    try {
      body = JSON.parse(text);
    } catch {
      // Not JSON: keep the text.
    }
    finish({ status: res.statusCode, headers: res.headers, body });
  });
}

/**
 * One request on its own connection (no keep-alive: a killed or closing server must not leave a
 * pooled socket to the next request). Never throws: failures are in `error`. A response that has
 * not ended after `timeoutMs` is a hang, reported as error 'TIMEOUT'.
 */
export function request(
  baseUrl: string,
  options: { method?: string; path: string; headers?: Record<string, string>; body?: string; label?: string; timeoutMs?: number },
): Promise<Outcome> {
  const startedAt = Date.now();
  const label = options.label ?? `${options.method ?? 'GET'} ${options.path}`;
  return new Promise((resolve) => {
    let settled = false;
    const finish = (rest: Partial<Outcome>) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      const endedAt = Date.now();
      resolve({ label, startedAt, endedAt, ms: endedAt - startedAt, ...rest });
    };
    const req = http.request(
      `${baseUrl}${options.path}`,
      {
        method: options.method ?? 'GET',
        agent: false,
        headers: { connection: 'close', ...options.headers, ...(options.body !== undefined ? { 'content-length': String(Buffer.byteLength(options.body)) } : {}) },
      },
      (res) => readResponse(res, finish),
    );
    const timer = setTimeout(() => {
      finish({ error: 'TIMEOUT' });
      req.destroy();
    }, options.timeoutMs ?? 10_000);
    req.on('error', (err: NodeJS.ErrnoException) => finish({ error: err.code ?? err.message }));
    req.end(options.body);
  });
}

const FORM = { 'content-type': 'application/x-www-form-urlencoded' };

export function clientCredentials(baseUrl: string, fixture: OrgFixture, label = 'token'): Promise<Outcome> {
  return request(baseUrl, {
    method: 'POST',
    path: '/oauth/token',
    label,
    headers: { ...FORM, authorization: basic(fixture.privateApp.client_id, fixture.privateApp.client_secret) },
    body: form({ grant_type: 'client_credentials', organization_id: String(fixture.organizationId) }),
  });
}

/** /oauth/revoke or /oauth/introspect as the fixture's private application. */
export function tokenEndpoint(baseUrl: string, fixture: OrgFixture, path: '/oauth/revoke' | '/oauth/introspect', token: string): Promise<Outcome> {
  return request(baseUrl, {
    method: 'POST',
    path,
    headers: { ...FORM, authorization: basic(fixture.privateApp.client_id, fixture.privateApp.client_secret) },
    body: form({ token }),
  });
}

/** An authorization_code redemption by the fixture's public application: one transaction (consume the code, create the grant and the refresh token). */
export function redeemCode(
  baseUrl: string,
  fixture: OrgFixture,
  code: string,
  redirectUri: string,
  options: { label: string; timeoutMs?: number },
): Promise<Outcome> {
  return request(baseUrl, {
    method: 'POST',
    path: '/oauth/token',
    label: options.label,
    headers: { ...FORM, authorization: basic(fixture.publicApp.client_id, fixture.publicApp.client_secret) },
    body: form({ grant_type: 'authorization_code', code, redirect_uri: redirectUri }),
    ...(options.timeoutMs !== undefined ? { timeoutMs: options.timeoutMs } : {}),
  });
}

export function listContacts(baseUrl: string, fixture: OrgFixture, accessToken: string, label = 'api'): Promise<Outcome> {
  return request(baseUrl, { path: `/api/v1/${fixture.organizationId}/contacts`, label, headers: { authorization: `Bearer ${accessToken}` } });
}

/** The claims of a JWT, unverified (the test's own tokens). */
export function jwtClaims(token: string): Record<string, unknown> {
  return JSON.parse(Buffer.from(token.split('.')[1] ?? '', 'base64url').toString('utf8')) as Record<string, unknown>;
}

/** Calls `probe` until it returns a value (not undefined) or `timeoutMs` passes; throws with `what` then. */
export async function waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs: number, intervalMs = 100): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const value = await probe();
      if (value !== undefined) return value;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? ` (last error: ${String(last)})` : ''}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Waits until a started server answers /healthz (it listens only once it is ready); fails at once if it exits. */
export async function waitUntilServing(server: Running, baseUrl: string, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (server.child.exitCode !== null || server.child.signalCode !== null) {
      throw new Error(`the server exited (${server.child.exitCode ?? server.child.signalCode}) before serving:\n${server.output.stdout}\n${server.output.stderr}`);
    }
    if ((await request(baseUrl, { path: '/healthz', timeoutMs: 2000 })).status === 200) return;
    if (Date.now() > deadline) throw new Error(`the server did not serve /healthz within ${timeoutMs} ms:\n${server.output.stdout}\n${server.output.stderr}`);
    await sleep(50);
  }
}

/**
 * A request whose body arrives slowly: the head and the first half of the body are sent now, the
 * rest when `sendRest()` is called. Meanwhile the server holds it in flight, reading the body.
 */
export function slowUpload(
  baseUrl: string,
  options: { path: string; headers: Record<string, string>; body: string; label?: string },
): { sendRest(): void; outcome: Promise<Outcome> } {
  const startedAt = Date.now();
  const label = options.label ?? `slow POST ${options.path}`;
  const half = Math.floor(options.body.length / 2);
  let req!: http.ClientRequest;
  const outcome = new Promise<Outcome>((resolve) => {
    const finish = (rest: Partial<Outcome>) => {
      const endedAt = Date.now();
      resolve({ label, startedAt, endedAt, ms: endedAt - startedAt, ...rest });
    };
    req = http.request(
      `${baseUrl}${options.path}`,
      { method: 'POST', agent: false, headers: { connection: 'close', ...options.headers, 'content-length': String(Buffer.byteLength(options.body)) } },
      (res) => readResponse(res, finish),
    );
    req.on('error', (err: NodeJS.ErrnoException) => finish({ error: err.code ?? err.message }));
    req.flushHeaders();
    req.write(options.body.slice(0, half));
  });
  return { sendRest: () => req.end(options.body.slice(half)), outcome };
}

/** Whether a new TCP connection to the server is refused (nothing listens any more). */
export function connectionRefused(baseUrl: string): Promise<boolean> {
  const url = new URL(baseUrl);
  return new Promise((resolve) => {
    const socket = net.connect({ host: url.hostname, port: Number(url.port) });
    socket.once('connect', () => {
      socket.destroy();
      resolve(false);
    });
    socket.once('error', (err: NodeJS.ErrnoException) => resolve(err.code === 'ECONNREFUSED'));
  });
}

/** The abandoned-session count of a database (PostgreSQL 14+), and how many orgauth sessions it has. */
export async function sessionStats(database: string): Promise<{ abandoned: number; orgauthSessions: number }> {
  const admin = new pg.Client({ connectionString: TEST_DATABASE_URL });
  await admin.connect();
  try {
    const { rows } = await admin.query<{ abandoned: number; sessions: number }>(
      `select (select sessions_abandoned from pg_stat_database where datname = $1)::int as abandoned,
              (select count(*) from pg_stat_activity where datname = $1 and application_name like 'orgauth%')::int as sessions`,
      [database],
    );
    return { abandoned: rows[0]!.abandoned, orgauthSessions: rows[0]!.sessions };
  } finally {
    await admin.end();
  }
}

/**
 * Issues `count` authorization codes to the fixture's owner for its public application (scope
 * contacts.read, no PKCE, valid for 10 minutes), inserted at once; returns the codes.
 */
export async function insertCodes(db: DB, fixture: OrgFixture, count: number, redirectUri: string): Promise<string[]> {
  const app = await db.selectFrom('applications').select('id').where('client_id', '=', fixture.publicApp.client_id).executeTakeFirstOrThrow();
  const expires = new Date(Date.now() + 10 * 60_000);
  const codes = Array.from({ length: count }, () => generateSecret(32));
  await db
    .insertInto('authorization_codes')
    .values(
      codes.map((code) => ({
        code_hash: sha256Hex(code), organization_id: fixture.organizationId, application_id: app.id, user_id: fixture.ownerId,
        redirect_uri: redirectUri, scopes: ['contacts.read'], code_challenge: null, code_challenge_method: null, expires_at: expires,
      })),
    )
    .execute();
  return codes;
}

/** Fails at once when the server has not been built (the fault tests run dist/, as in production). */
export function requireBuiltServer(): void {
  if (!existsSync(path.join(ROOT, SERVER))) throw new Error(`${SERVER} is missing: run the tests with \`npm test\`, which builds first`);
}

/** For an afterAll: SIGKILLs the server if it is still running (a graceful stop is not what is left to do), and waits for it to exit. */
export async function killIfRunning(server: Running | undefined): Promise<void> {
  if (server && server.child.exitCode === null && server.child.signalCode === null) {
    server.child.kill('SIGKILL');
    await server.exited;
  }
}

/**
 * A fresh database on the run's back-end (PGlite on disk, or a new database on TEST_DATABASE_URL's
 * server) for a server process to open: migrated (a copy of the run's template: createTestDatabase),
 * with an organization fixture, `codeCount` pre-issued codes (see insertCodes) and whatever `seed`
 * adds. Its handle is closed before this returns: the embedded database is opened by one process
 * at a time. Dropped again if setting it up fails.
 */
async function prepareDatabase(
  codeCount: number,
  redirectUri: string,
  seed?: (db: DB, fixture: OrgFixture) => Promise<void>,
): Promise<{ database: TestDatabase; fixture: OrgFixture; codes: string[] }> {
  const { handle, close, ...database } = await createTestDatabase({ onDisk: true });
  try {
    const fixture = await createOrgFixture(handle.db);
    await seed?.(handle.db, fixture);
    const codes = await insertCodes(handle.db, fixture, codeCount, redirectUri);
    await handle.close();
    return { database, fixture, codes };
  } catch (err) {
    // The caller never gets it to drop: close it and drop it here.
    await close();
    throw err;
  }
}

/** The name of a PostgreSQL test database ('' on the embedded one). */
export function databaseName(database: TestDatabase): string {
  return database.target.kind === 'postgres' ? decodeURIComponent(new URL(database.target.url).pathname.slice(1)) : '';
}

/** What useServerDatabase's beforeAll sets up; set `server` to the server process a test starts. */
export interface ServerDatabase {
  database: TestDatabase;
  fixture: OrgFixture;
  /** The pre-issued authorization codes, for redirectUri. */
  codes: string[];
  server?: Running;
}

/**
 * Registers, in a describe block that runs the built server on a database of its own: a beforeAll
 * that checks the build and prepares the database (see prepareDatabase), and an afterAll that
 * SIGKILLs `server` if it is still running and drops the database. The returned object's fields
 * are filled in by the beforeAll.
 */
export function useServerDatabase(codeCount: number, redirectUri: string, seed?: (db: DB, fixture: OrgFixture) => Promise<void>): ServerDatabase {
  const state = {} as ServerDatabase;
  beforeAll(async () => {
    requireBuiltServer();
    Object.assign(state, await prepareDatabase(codeCount, redirectUri, seed));
  }, 60_000);
  afterAll(async () => {
    await killIfRunning(state.server);
    await state.database?.drop();
  });
  return state;
}
