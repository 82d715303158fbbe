/**
 * The mail outbox: messages are queued durably and sent in the background, by any instance.
 *
 * `queue(trx, message)` inserts the message in the caller's transaction, so it exists exactly
 * when the change that caused it does (an invitation and its email, say), and no request ever
 * waits for a mail server. After the commit the caller calls `wake()`; every instance also
 * looks for due messages every POLL_MS, which is how other instances' messages, and retries,
 * are picked up.
 *
 * Sending: a short statement claims up to BATCH due messages (`FOR UPDATE SKIP LOCKED`, so two
 * instances never claim the same one) and moves their next_attempt_at forward by LEASE_MS: the
 * claim is a lease, held without an open transaction (on the embedded database a transaction
 * would hold its only connection for as long as the mail server takes). Each message is then
 * sent and marked sent, or its failure recorded with the next attempt after a backoff
 * (1 s, 2 s, 4 s … up to 10 min). An instance that dies mid-send leaves the lease to run out
 * and the message is sent again then: delivery is at least once, and exactly once whenever
 * instances do not die between handing a message to the server and recording it. After
 * GIVE_UP_AFTER_MS a message is marked failed and logged at error.
 *
 * Bodies carry links, so they are stored encrypted (SECRET_KEY) and cleared once sent, except
 * for the developer outbox (no SMTP_URL, embedded database, not production), which shows them.
 */
import { sql } from 'kysely';
import type { Logger } from 'pino';
import type { DB } from '../db/connect.js';
import { openText, sealText } from '../lib/crypto.js';
import type { Metrics } from '../metrics.js';
import type { MailMessage } from './messages.js';
import type { MailTransport } from './transport.js';

const SEAL_PURPOSE = 'mail-outbox';
const BATCH = 10;
const LEASE_MS = 5 * 60_000;
const POLL_MS = 2000;
const MAX_BACKOFF_S = 600;
const GIVE_UP_AFTER_MS = 48 * 3600_000;
/** Sent and failed messages stay this long (what was sent to whom), then retention deletes them. */
const KEEP_DONE_S = 7 * 24 * 3600;

/** Seconds before attempt `attempts + 1`, after `attempts` failed ones. */
export function retryDelaySeconds(attempts: number): number {
  return Math.min(MAX_BACKOFF_S, 2 ** Math.max(0, Math.min(attempts - 1, 20)));
}

interface Claimed {
  id: number;
  recipient: string;
  subject: string;
  body_encrypted: string | null;
  attempts: number;
  created_at: Date;
}

export interface DevOutboxMessage {
  id: number;
  created_at: Date;
  sent_at: Date | null;
  recipient: string;
  subject: string;
  text: string;
  html: string;
}

export class MailOutbox {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private again = false;
  private stopped = false;

  constructor(
    private readonly db: DB,
    private readonly options: {
      transport: MailTransport;
      from: string;
      secretKey: string;
      logger: Pick<Logger, 'info' | 'warn' | 'error'>;
      metrics?: Metrics | undefined;
      /** Keep bodies after sending (the developer outbox shows them). */
      keepBodies?: boolean;
    },
  ) {}

  get transportKind(): MailTransport['kind'] {
    return this.options.transport.kind;
  }

  /** Queues a message in `db`'s transaction (or on its own); call wake() once that has committed. */
  async queue(db: DB, message: MailMessage): Promise<void> {
    const { text, html } = message;
    await db
      .insertInto('mail_outbox')
      .values({
        recipient: message.to,
        subject: message.subject,
        body_encrypted: sealText(this.options.secretKey, SEAL_PURPOSE, JSON.stringify({ text, html })),
      })
      .execute();
  }

  start(): void {
    if (this.timer || this.stopped) return;
    this.timer = setInterval(() => this.wake(), POLL_MS);
    this.timer.unref();
    this.wake();
  }

  /** Sends what is due now; a run already going runs once more afterwards. */
  wake(): void {
    if (this.stopped) return;
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = this.drain().finally(() => {
      this.running = undefined;
    });
  }

  /** Resolves when nothing is being sent (tests). */
  async idle(): Promise<void> {
    while (this.running) await this.running;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    this.timer = undefined;
    await this.idle();
    this.options.transport.close();
  }

  private async drain(): Promise<void> {
    do {
      this.again = false;
      let claimed: Claimed[];
      try {
        claimed = await this.claim();
      } catch (err) {
        this.options.logger.warn({ err }, 'could not read the mail outbox');
        return;
      }
      for (const message of claimed) {
        if (this.stopped) break;
        await this.deliver(message);
      }
      if (claimed.length === BATCH) this.again = true;
    } while (this.again && !this.stopped);
  }

  private async claim(): Promise<Claimed[]> {
    const { rows } = await sql<Claimed>`
      update mail_outbox m
      set attempts = m.attempts + 1, next_attempt_at = now() + make_interval(secs => ${LEASE_MS / 1000})
      from (
        select id from mail_outbox
        where sent_at is null and failed_at is null and next_attempt_at <= now()
        order by next_attempt_at
        limit ${BATCH}
        for update skip locked
      ) due
      where m.id = due.id
      returning m.id, m.recipient, m.subject, m.body_encrypted, m.attempts, m.created_at`.execute(this.db);
    return rows.map((r) => ({ ...r, id: Number(r.id) }));
  }

  private async deliver(message: Claimed): Promise<void> {
    const { logger, metrics, transport } = this.options;
    let error: unknown;
    try {
      await transport.send(this.options.from, { to: message.recipient, subject: message.subject, ...this.openBody(message.body_encrypted) });
    } catch (err) {
      error = err;
    }
    try {
      if (error === undefined) {
        await this.db
          .updateTable('mail_outbox')
          .set({
            sent_at: sql`now()`,
            last_error: null,
            expires_at: sql`now() + make_interval(secs => ${KEEP_DONE_S})`,
            ...(this.options.keepBodies ? {} : { body_encrypted: null }),
          })
          .where('id', '=', message.id)
          .execute();
        metrics?.mailDeliveries.inc({ outcome: 'sent' });
        if (transport.kind === 'smtp') logger.info({ mail_id: message.id, attempt: message.attempts }, 'email sent');
        return;
      }
      const reason = describe(error);
      if (Date.now() - message.created_at.getTime() >= GIVE_UP_AFTER_MS) {
        await this.db
          .updateTable('mail_outbox')
          .set({ failed_at: sql`now()`, last_error: reason, body_encrypted: null, expires_at: sql`now() + make_interval(secs => ${KEEP_DONE_S})` })
          .where('id', '=', message.id)
          .execute();
        metrics?.mailDeliveries.inc({ outcome: 'failed' });
        logger.error({ mail_id: message.id, attempts: message.attempts, reason }, 'email given up: it could not be sent for 48 hours');
        return;
      }
      const delay = retryDelaySeconds(message.attempts);
      await this.db
        .updateTable('mail_outbox')
        .set({ next_attempt_at: sql`now() + make_interval(secs => ${delay})`, last_error: reason })
        .where('id', '=', message.id)
        .execute();
      metrics?.mailDeliveries.inc({ outcome: 'retry' });
      logger.warn({ mail_id: message.id, attempt: message.attempts, retry_in_s: delay, reason }, 'email not sent; will retry');
    } catch (err) {
      // The database is away: the lease runs out and the message is tried again then.
      logger.warn({ err, mail_id: message.id }, 'could not record the outcome of sending an email');
    }
  }

  private openBody(sealed: string | null): { text: string; html: string } {
    if (sealed === null) throw new Error('the message has no body');
    const body = JSON.parse(openText(this.options.secretKey, SEAL_PURPOSE, sealed)) as { text: string; html: string };
    return { text: body.text, html: body.html };
  }

  /** The newest messages with their bodies, for the developer outbox page. */
  async recent(limit: number): Promise<DevOutboxMessage[]> {
    const rows = await this.db
      .selectFrom('mail_outbox')
      .select(['id', 'created_at', 'sent_at', 'recipient', 'subject', 'body_encrypted'])
      .orderBy('id', 'desc')
      .limit(limit)
      .execute();
    return rows.map(({ body_encrypted: sealed, ...row }) => {
      let body = { text: '(the body was cleared once the message was sent)', html: '' };
      try {
        if (sealed !== null) body = this.openBody(sealed);
      } catch {
        body = { text: '(the body cannot be read with this SECRET_KEY)', html: '' };
      }
      return { ...row, ...body };
    });
  }
}

function describe(err: unknown): string {
  if (!(err instanceof Error)) return String(err).slice(0, 500);
  const code = 'code' in err && typeof err.code === 'string' ? `${err.code}: ` : '';
  return `${code}${err.message}`.replace(/\s+/g, ' ').slice(0, 500);
}
