/** What the fault tests share: HTTP calls that record how they ended and how long they took, and polling. */
import http from 'node:http';
import net from 'node:net';
import pg from 'pg';
import { TEST_DATABASE_URL } from '../helpers/db.js';
import { basic, form, type OrgFixture } from '../helpers/oauth.js';
import type { Running } from '../helpers/process.js';

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
      (res) => {
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
      },
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
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('error', (err: NodeJS.ErrnoException) => finish({ status: res.statusCode, error: err.code ?? err.message }));
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
      },
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
