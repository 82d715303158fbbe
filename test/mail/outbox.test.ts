/**
 * The mail outbox against a real SMTP server: a server that is down delays a message but never
 * loses it or fails the request; two instances sharing the queue send each message once; without
 * SMTP_URL messages go to the log and the developer outbox; bodies are encrypted at rest.
 */
import type { FastifyInstance } from 'fastify';
import { request } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { KyselyPlugin } from 'kysely';
import { afterAll, beforeAll, describe, expect, it, onTestFinished, vi } from 'vitest';
import { createUser } from '../../src/accounts/users.js';
import { connectDatabase, type DatabaseHandle } from '../../src/db/connect.js';
import { createLogger } from '../../src/logger.js';
import { MailOutbox, retryDelaySeconds } from '../../src/mail/outbox.js';
import { smtpTransport } from '../../src/mail/transport.js';
import { Metrics } from '../../src/metrics.js';
import { Browser, csrfTokenIn } from '../accounts/browser.js';
import { buildTestApp, logCapture, TEST_SECRET_KEY, testConfig } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { TestSmtpServer } from '../helpers/smtp.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let smtp: TestSmtpServer;
const db = () => t.handle.db;
let n = 0;
const address = (label: string) => `${label}-${++n}@example.com`;

beforeAll(async () => {
  t = await createTestDatabase();
  smtp = await TestSmtpServer.start();
});
afterAll(async () => {
  await smtp?.stop();
  await t?.close();
});

async function requestReset(app: FastifyInstance, email: string, ip: string) {
  const browser = new Browser(app, ip);
  const csrf_token = await browser.csrf('/forgot-password');
  return browser.post('/forgot-password', { csrf_token, email });
}

/** The outbox's claims (`update mail_outbox m ...`, MailOutbox.claim) on a database given `plugin`, counted as they come back. */
function claimCounter(): { plugin: KyselyPlugin; count: () => number } {
  const claiming = new Set<unknown>();
  let claimed = 0;
  return {
    plugin: {
      transformQuery: (args) => {
        if (JSON.stringify(args.node).includes('update mail_outbox m')) claiming.add(args.queryId);
        return args.node;
      },
      transformResult: async (args) => {
        if (claiming.delete(args.queryId)) claimed++;
        return args.result;
      },
    },
    count: () => claimed,
  };
}

/** Waits until `check` holds (within 30 s), looking every `intervalMs` and doing `each` before every look. */
async function until(check: () => boolean | Promise<boolean>, each: () => void = () => {}, intervalMs = 20): Promise<void> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    each();
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${String(check)}`);
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

/** GET `path` from the listening `app` over a real connection, with the Host header `host` (what curl -H 'Host: …' sends; undefined: none). */
function getWithHost(app: FastifyInstance, path: string, host: string | undefined): Promise<{ status: number; body: string }> {
  const { port } = app.server.address() as AddressInfo;
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, setHost: false, headers: host === undefined ? {} : { host } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (body += chunk));
      res.on('end', () => resolve({ status: res.statusCode!, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

describe(`the mail outbox on ${BACKEND}`, () => {
  it('answers a reset request normally while the mail server is down, and delivers the email exactly once when it is back', async () => {
    // The server's intervals are fake: the outbox's poll (every 2 s) comes round when the test
    // says, and its claims are counted as they come back.
    const claims = claimCounter();
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'], shouldClearNativeTimers: true });
    onTestFinished(() => void vi.useRealTimers());
    const pollComesRound = () => vi.advanceTimersByTime(2000);
    const app = await buildTestApp(db().withPlugin(claims.plugin), { env: { SMTP_URL: smtp.url } });
    try {
      const email = address('patient');
      await createUser(db(), { email, password: 'patient-password-1' });
      await smtp.stop();
      const res = await requestReset(app, email, '10.9.0.1');
      expect(res.statusCode).toBe(200);
      expect(res.body).toContain('If an account uses that address');
      // The attempt failed and is recorded, with a retry scheduled: nothing is lost.
      await expect
        .poll(async () => (await db().selectFrom('mail_outbox').select(['attempts', 'last_error', 'sent_at']).where('recipient', '=', email).executeTakeFirst()) ?? null, { timeout: 15_000 })
        .toMatchObject({ attempts: expect.any(Number), last_error: expect.stringMatching(/ECONNREFUSED/), sent_at: null });
      await smtp.listen();
      // Sent again by a poll once the outbox's pause (its backoff, a second) is over. (Every
      // interval of the server fires with it: not too often, or the embedded database is kept busy.)
      await until(() => smtp.to(email).length > 0, pollComesRound, 100);
      const mail = await smtp.waitFor(email, /Reset your password/, 30_000);
      expect(mail.links.some((l) => l.includes('/reset-password?token='))).toBe(true);
      const sentRow = () => db().selectFrom('mail_outbox').select(['attempts', 'sent_at', 'body_encrypted', 'last_error']).where('recipient', '=', email).executeTakeFirstOrThrow();
      await until(async () => (await sentRow()).sent_at !== null);
      // Another poll or two, their claims come back: still once.
      for (let i = 0; i < 2; i++) {
        const before = claims.count();
        pollComesRound();
        await until(() => claims.count() > before);
      }
      expect(smtp.to(email)).toHaveLength(1);
      const row = await sentRow();
      expect(row.attempts).toBeGreaterThanOrEqual(2);
      expect(row.sent_at).not.toBeNull();
      expect(row.last_error).toBeNull();
      // Sent: the body (with its link) is not kept.
      expect(row.body_encrypted).toBeNull();
    } finally {
      await app.close();
    }
  });

  it('sends each message once when two instances share the queue', async () => {
    // On PostgreSQL each instance has its own pool, as another process would.
    const handles: DatabaseHandle[] = t.target.kind === 'postgres' ? [await connectDatabase(t.target), await connectDatabase(t.target)] : [];
    const [dbA, dbB] = handles.length > 0 ? handles.map((h) => h.db) : [db(), db()];
    const metrics = [new Metrics(), new Metrics()];
    const logger = createLogger({ logLevel: 'silent' });
    const outboxes = [dbA!, dbB!].map(
      (d, i) => new MailOutbox(d, { transport: smtpTransport(smtp.url), from: 'auth@example.com', secretKey: TEST_SECRET_KEY, logger, metrics: metrics[i] }),
    );
    try {
      const recipients = Array.from({ length: 40 }, () => address('bulk'));
      for (const to of recipients) await outboxes[0]!.queue(db(), { to, subject: 'Bulk', text: `hello ${to}`, html: `<p>hello ${to}</p>` });
      for (const o of outboxes) o.start();
      await expect.poll(() => recipients.filter((r) => smtp.to(r).length > 0).length, { timeout: 30_000 }).toBe(40);
      // Each recorded as sent; then each outbox looks once more (wake), and stops once that pass is done: still once.
      await until(async () => (await db().selectFrom('mail_outbox').select('id').where('recipient', 'in', recipients).where('sent_at', 'is', null).execute()).length === 0);
      for (const o of outboxes) o.wake();
      await Promise.all(outboxes.map((o) => o.stop()));
      for (const r of recipients) expect(smtp.to(r), r).toHaveLength(1);
      const rows = await db().selectFrom('mail_outbox').select(['attempts', 'sent_at']).where('recipient', 'in', recipients).execute();
      expect(rows.every((r) => r.attempts === 1 && r.sent_at !== null)).toBe(true);
      const sent = await Promise.all(metrics.map(async (m) => (await m.mailDeliveries.get()).values.find((v) => v.labels.outcome === 'sent')?.value ?? 0));
      expect(sent[0]! + sent[1]!).toBe(40);
    } finally {
      await Promise.all(outboxes.map((o) => o.stop()));
      await Promise.all(handles.map((h) => h.close()));
    }
  });

  it('fails a message the server refuses for good (5xx) at once, and logs and counts it', async () => {
    const metrics = new Metrics();
    const capture = logCapture();
    const logger = createLogger({ logLevel: 'info' }, capture.stream);
    const outbox = new MailOutbox(db(), { transport: smtpTransport(smtp.url), from: 'auth@example.com', secretKey: TEST_SECRET_KEY, logger, metrics });
    const to = address('no-such-mailbox');
    smtp.refused.add(to);
    try {
      await outbox.queue(db(), { to, subject: 'Refused', text: 'x', html: '<p>x</p>' });
      outbox.start();
      await expect.poll(async () => (await db().selectFrom('mail_outbox').select(['failed_at', 'attempts', 'last_error']).where('recipient', '=', to).executeTakeFirstOrThrow()), { timeout: 15_000 })
        .toMatchObject({ failed_at: expect.any(Date), attempts: 1, last_error: expect.stringMatching(/550|mailbox unavailable/) });
      expect((await metrics.mailDeliveries.get()).values.find((v) => v.labels.outcome === 'failed')?.value).toBe(1);
      expect(capture.lines().some((l) => l.includes('email refused by the mail server') && JSON.parse(l).level === 50)).toBe(true);
    } finally {
      await outbox.stop();
    }
  });

  it('backs off 1 s, 2 s, 4 s … up to 10 minutes between attempts', () => {
    expect([1, 2, 3, 4, 10, 11, 50].map(retryDelaySeconds)).toEqual([1, 2, 4, 8, 512, 600, 600]);
  });

  it('keeps bodies encrypted at rest: the link is not readable in the table', async () => {
    const logger = createLogger({ logLevel: 'silent' });
    const outbox = new MailOutbox(db(), { transport: smtpTransport(smtp.url), from: 'auth@example.com', secretKey: TEST_SECRET_KEY, logger });
    const to = address('sealed');
    await outbox.queue(db(), { to, subject: 'Sealed', text: 'https://example.com/secret-link-token', html: '<p>x</p>' });
    const row = await db().selectFrom('mail_outbox').select('body_encrypted').where('recipient', '=', to).executeTakeFirstOrThrow();
    expect(row.body_encrypted).toMatch(/^v1\./);
    expect(row.body_encrypted).not.toContain('secret-link-token');
    await outbox.stop();
    await db().deleteFrom('mail_outbox').where('recipient', '=', to).execute();
  });
});

describe(`without SMTP_URL on ${BACKEND}`, () => {
  it('writes each message to the log at info, link included, and shows it on /dev/outbox', async () => {
    const capture = logCapture();
    const app = await buildTestApp(db(), { logStream: capture.stream });
    try {
      expect(testConfig().mail.devOutbox).toBe(true);
      const email = address('dev');
      await createUser(db(), { email, password: 'developer-password-1' });
      expect((await requestReset(app, email, '10.9.1.1')).statusCode).toBe(200);
      await expect.poll(() => capture.lines().some((l) => l.includes('email not sent (no SMTP_URL)') && l.includes(email)), { timeout: 15_000 }).toBe(true);
      const line = JSON.parse(capture.lines().find((l) => l.includes('email not sent (no SMTP_URL)') && l.includes(email))!);
      expect(line.level).toBe(30);
      expect(line.mail.text).toMatch(/http:\/\/localhost:3000\/reset-password\?token=[A-Za-z0-9_-]{43}/);
      // The ISSUER's own host and port (localhost:3000) names this server.
      const page = await app.inject({ method: 'GET', url: '/dev/outbox', headers: { host: 'localhost:3000' } });
      expect(page.statusCode).toBe(200);
      // Only from this machine, whatever address the server listens on.
      expect((await app.inject({ method: 'GET', url: '/dev/outbox', headers: { host: 'localhost:3000' }, remoteAddress: '192.0.2.7' })).statusCode).toBe(404);
      expect(page.body).toContain(email);
      const link = /href="http:\/\/localhost:3000(\/reset-password\?token=[A-Za-z0-9_-]{43})"/.exec(page.body)![1]!;
      const browser = new Browser(app, '10.9.1.2');
      const form = await browser.get(link);
      expect(form.statusCode).toBe(200);
      expect(csrfTokenIn(form.body)).toBeTruthy();
    } finally {
      await app.close();
    }
  });

  it('answers only a Host that names this server: a DNS-rebound name gets 404 and no message, localhost, 127.0.0.1 and [::1] with its port do', async () => {
    const capture = logCapture();
    const app = await buildTestApp(db(), { logStream: capture.stream });
    try {
      await app.listen({ host: '127.0.0.1', port: 0 });
      const { port } = app.server.address() as AddressInfo;
      const email = address('rebind');
      await createUser(db(), { email, password: 'developer-password-1' });
      expect((await requestReset(app, email, '10.9.1.3')).statusCode).toBe(200);
      await expect.poll(async () => (await getWithHost(app, '/dev/outbox', `localhost:${port}`)).body.includes(email), { timeout: 15_000 }).toBe(true);

      // The reproduction of issue 30: loopback connection, the attacker's name as Host.
      for (const host of [`rebind.attacker.test:${port}`, 'rebind.attacker.test', `127.0.0.1.rebind.attacker.test:${port}`]) {
        const rebound = await getWithHost(app, '/dev/outbox', host);
        expect(rebound.status, host).toBe(404);
        expect(rebound.body, host).not.toContain('reset-password');
        expect(rebound.body, host).not.toContain(email);
        // As an unknown path is answered.
        const unknown = await getWithHost(app, '/dev/no-such-page', host);
        expect(rebound.body.replace('/dev/outbox', '/dev/no-such-page')).toBe(unknown.body);
      }
      // An absolute-form request target naming another host, even with a good Host header.
      expect((await getWithHost(app, `http://rebind.attacker.test:${port}/dev/outbox`, `localhost:${port}`)).status).toBe(404);
      // This machine's names need the server's own port; nothing else parses as a host.
      for (const host of ['localhost', `localhost:${port + 1}`, `localhost.:${port}`, `evil@localhost:${port}`, `localhost:${port}/x`, `localhost:${port}, evil.test`, `[::1]:${port + 1}`, undefined]) {
        // Without a Host header at all, Node's HTTP server answers 400 before any route.
        expect((await getWithHost(app, '/dev/outbox', host)).status, host ?? '(no Host)').toBe(host === undefined ? 400 : 404);
      }
      for (const host of [`localhost:${port}`, `127.0.0.1:${port}`, `[::1]:${port}`, `LocalHost:${port}`, 'localhost:3000']) {
        const page = await getWithHost(app, '/dev/outbox', host);
        expect(page.status, host).toBe(200);
        expect(page.body, host).toMatch(/reset-password\?token=[A-Za-z0-9_-]{43}/);
      }
      // Logged at warn once per host name.
      const warnings = capture.lines().filter((l) => l.includes('DNS rebinding')).map((l) => JSON.parse(l) as { level: number; host: string });
      expect(warnings.filter((w) => w.host === `rebind.attacker.test:${port}`)).toHaveLength(1);
      expect(warnings.every((w) => w.level === 40)).toBe(true);
    } finally {
      await app.close();
    }
  });

  it('has no /dev/outbox in production, with an https ISSUER, or with SMTP_URL', async () => {
    const envs: Record<string, string>[] = [{ NODE_ENV: 'production' }, { ISSUER: 'https://auth.example.com' }, { SMTP_URL: smtp.url }];
    for (const env of envs) {
      const app = await buildTestApp(db(), { env });
      try {
        expect((await app.inject({ method: 'GET', url: '/dev/outbox' })).statusCode, JSON.stringify(env)).toBe(404);
      } finally {
        await app.close();
      }
    }
  });
});
