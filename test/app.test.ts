import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { FastifyInstance } from 'fastify';
import { connectDatabase } from '../src/db/connect.js';
import { AppError, InvalidRequestError } from '../src/errors.js';
import { createLogger, maskUrl } from '../src/logger.js';
import { BACKEND, createTestDatabase } from './helpers/db.js';
import { buildTestApp, logCapture } from './helpers/app.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
const logs = logCapture();

beforeAll(async () => {
  t = await createTestDatabase();
  app = await buildTestApp(t.handle.db, { logStream: logs.stream });
  // Routes that exercise the error handler the way real routes will.
  app.get('/test/refused', async () => {
    throw new InvalidRequestError('bad "thing"\r\nInjected: header\\', { details: [{ path: 'name', message: 'required' }] });
  });
  app.get('/test/teapot', async () => {
    throw new AppError(418, 'teapot', 'short and stout', { headers: { 'x-extra': 'yes' } });
  });
  app.get('/test/bug', async () => {
    throw new Error('secret internals at /srv/app.ts:12');
  });
  app.post('/test/echo', async (req) => ({ body: req.body }));
  await app.ready();
});
afterAll(async () => {
  await app.close();
  await t.close();
});

describe(`health endpoints on ${BACKEND}`, () => {
  it('/healthz answers 200 while the process runs', async () => {
    const res = await app.inject('/healthz');
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ status: 'ok' });
    expect(res.headers['cache-control']).toBe('no-store');
  });

  it('/readyz answers 200 when the database answers', async () => {
    const res = await app.inject('/readyz');
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ status: 'ready' });
  });
});

describe('/readyz when the database is unreachable', () => {
  it('answers 503 temporarily_unavailable for a PostgreSQL server that is not there', async () => {
    const handle = await connectDatabase({ kind: 'postgres', url: 'postgres://postgres@127.0.0.1:1/nowhere' });
    const down = await buildTestApp(handle.db);
    try {
      const res = await down.inject('/readyz');
      expect(res.statusCode).toBe(503);
      expect(res.json()).toEqual({ error: 'temporarily_unavailable', error_description: 'the database is not answering' });
      expect(res.headers['retry-after']).toBe('1');
      // Liveness does not depend on the database.
      expect((await down.inject('/healthz')).statusCode).toBe(200);
    } finally {
      await down.close();
      await handle.close();
    }
  });

  it('answers 503 once the embedded database is closed', async () => {
    // On an embedded run, a copy of the run's migrated template (no initdb); a PostgreSQL run has
    // no PGlite template, so a new embedded database.
    const handle = BACKEND === 'pglite' ? (await createTestDatabase()).handle : await connectDatabase({ kind: 'pglite', dataDir: null });
    const down = await buildTestApp(handle.db);
    try {
      expect((await down.inject('/readyz')).statusCode).toBe(200);
      await handle.close();
      const res = await down.inject('/readyz');
      expect(res.statusCode).toBe(503);
      expect(res.json()).toMatchObject({ error: 'temporarily_unavailable' });
    } finally {
      await down.close();
    }
  });
});

describe('errors', () => {
  it('are written as {error, error_description} with details, free of quotes, CR/LF and backslashes', async () => {
    const res = await app.inject('/test/refused');
    expect(res.statusCode).toBe(400);
    expect(res.json()).toEqual({
      error: 'invalid_request',
      error_description: 'bad  thing   Injected: header ',
      details: [{ path: 'name', message: 'required' }],
    });
  });

  it('carry their status and headers', async () => {
    const res = await app.inject('/test/teapot');
    expect(res.statusCode).toBe(418);
    expect(res.headers['x-extra']).toBe('yes');
    expect(res.json()).toEqual({ error: 'teapot', error_description: 'short and stout' });
  });

  it('hide the details of unexpected failures behind a generic 500', async () => {
    const res = await app.inject('/test/bug');
    expect(res.statusCode).toBe(500);
    expect(res.json()).toEqual({ error: 'server_error', error_description: 'internal server error' });
    expect(res.body).not.toContain('internals');
  });

  it('answer unknown routes with 404 not_found', async () => {
    const res = await app.inject('/no/such/route?x=1');
    expect(res.statusCode).toBe(404);
    expect(res.json()).toEqual({ error: 'not_found', error_description: 'no route for GET /no/such/route' });
  });

  it('refuse bodies over 64 KiB with 413, unknown content types with 415 and prototype poisoning with 400', async () => {
    const big = await app.inject({ method: 'POST', url: '/test/echo', headers: { 'content-type': 'application/x-www-form-urlencoded' }, payload: `a=${'x'.repeat(70 * 1024)}` });
    expect(big.statusCode).toBe(413);
    expect(big.json()).toMatchObject({ error: 'request_too_large' });
    const xml = await app.inject({ method: 'POST', url: '/test/echo', headers: { 'content-type': 'application/xml' }, payload: '<a/>' });
    expect(xml.statusCode).toBe(415);
    expect(xml.json()).toMatchObject({ error: 'unsupported_media_type' });
    const proto = await app.inject({ method: 'POST', url: '/test/echo', headers: { 'content-type': 'application/json' }, payload: '{"__proto__": {"admin": true}}' });
    expect(proto.statusCode).toBe(400);
    const ctor = await app.inject({ method: 'POST', url: '/test/echo', headers: { 'content-type': 'application/json' }, payload: '{"constructor": {"prototype": {"admin": true}}}' });
    expect(ctor.statusCode).toBe(400);
    const form = await app.inject({ method: 'POST', url: '/test/echo', headers: { 'content-type': 'application/x-www-form-urlencoded' }, payload: 'a=1&b=2' });
    expect(form.json()).toEqual({ body: { a: '1', b: '2' } });
  });
});

describe('logs (R-8)', () => {
  it('tie every line of a request to the request id it returns', async () => {
    const res = await app.inject('/no/such/route');
    const id = res.headers['x-request-id'];
    expect(id).toMatch(/^[0-9a-f-]{36}$/);
    const lines = logs.lines().map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.request_id === id);
    expect(lines.map((l) => l.msg)).toEqual(['incoming request', 'request completed']);
  });

  it('never contain passwords, secrets, codes or tokens', async () => {
    await app.inject({
      method: 'POST',
      url: '/test/echo',
      headers: { authorization: 'Bearer header-token-value', cookie: 'session=cookie-value', 'content-type': 'application/x-www-form-urlencoded' },
      payload: 'password=form-password-value&client_secret=form-secret-value',
    });
    const capture = logCapture();
    const logger = createLogger({ logLevel: 'info' }, capture.stream);
    logger.info(
      {
        password: 'top-password-value',
        client_secret: 'top-secret-value',
        code: 'top-code-value',
        body: { code: 'nested-code-value', code_verifier: 'nested-verifier-value', refresh_token: 'nested-refresh-value' },
        req: { headers: { authorization: 'Basic basic-value', cookie: 'sid=cookie-value-2' } },
        res: { headers: { 'set-cookie': 'sid=set-cookie-value' } },
        deep: { inner: { access_token: 'deep-access-value', token: 'deep-token-value' } },
      },
      'something happened',
    );
    const all = [...logs.lines(), ...capture.lines()].join('\n');
    expect(capture.lines()).toHaveLength(1);
    for (const secret of [
      'header-token-value', 'cookie-value', 'form-password-value', 'form-secret-value', 'top-password-value', 'top-secret-value',
      'top-code-value', 'nested-code-value', 'nested-verifier-value', 'nested-refresh-value', 'basic-value', 'cookie-value-2', 'set-cookie-value',
      'deep-access-value', 'deep-token-value',
    ]) {
      expect(all).not.toContain(secret);
    }
    expect(all).toContain('[redacted]');
  });
});

describe('logged URLs', () => {
  it('mask the values of secret query parameters and keep the rest', () => {
    expect(maskUrl('/cb?code=abc&state=xyz&access_token=t1&x=1&client%5Fsecret=s&token')).toBe(
      '/cb?code=[redacted]&state=xyz&access_token=[redacted]&x=1&client%5Fsecret=[redacted]&token',
    );
    expect(maskUrl('/plain/path')).toBe('/plain/path');
    expect(maskUrl('/bad?%E0%A4%A=1&refresh_token=r')).toBe('/bad?%E0%A4%A=1&refresh_token=[redacted]');
  });

  it('never carry a token sent in the query string (R-8)', async () => {
    await app.inject('/no/such/route?access_token=query-token-value&code=query-code-value&client_secret=query-secret-value&page=2');
    const all = logs.lines().join('\n');
    expect(all).toContain('page=2');
    for (const secret of ['query-token-value', 'query-code-value', 'query-secret-value']) expect(all).not.toContain(secret);
  });
});

describe('TRUST_PROXY', () => {
  async function clientIp(env: Record<string, string>): Promise<string> {
    const proxied = await buildTestApp(t.handle.db, { env });
    proxied.get('/test/ip', async (req) => ({ ip: req.ip, protocol: req.protocol }));
    try {
      return (await proxied.inject({ url: '/test/ip', headers: { 'x-forwarded-for': '203.0.113.9' } })).json().ip;
    } finally {
      await proxied.close();
    }
  }

  it('ignores X-Forwarded-For by default and honours it when enabled', async () => {
    expect(await clientIp({})).toBe('127.0.0.1');
    expect(await clientIp({ TRUST_PROXY: 'true' })).toBe('203.0.113.9');
    expect(await clientIp({ TRUST_PROXY: '127.0.0.1' })).toBe('203.0.113.9');
    expect(await clientIp({ TRUST_PROXY: '10.0.0.0/8' })).toBe('127.0.0.1');
  });
});

describe('logs of failures', () => {
  it('keep error codes such as ECONNREFUSED', () => {
    const capture = logCapture();
    const logger = createLogger({ logLevel: 'info' }, capture.stream);
    logger.warn({ err: Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }) }, 'database down');
    expect(JSON.parse(capture.lines()[0]!)).toMatchObject({ err: { code: 'ECONNREFUSED' } });
  });
});
