/**
 * The mail outbox: messages are queued durably and sent in the background, by any instance.
 *
 * `queue(trx, message)` inserts the message in the caller's transaction, so it exists exactly
 * when the change that caused it does (an invitation and its email, say), and no request ever
 * waits for a mail server. After the commit the caller calls `wake()`; every instance also
 * looks for due messages every POLL_MS, which is how other instances' messages, and retries,
 * are picked up.
 *
 * Sending: a short statement claims the next due message (`FOR UPDATE SKIP LOCKED`, so two
 * instances never claim the same one) and moves its next_attempt_at forward by LEASE_MS: the
 * claim is a lease, held without an open transaction (on the embedded database a transaction
 * would hold its only connection for as long as the mail server takes). One message is claimed
 * at a time and a send is given up after SEND_TIMEOUT_MS, well inside the lease, so a slow
 * server cannot let a lease run out while the message waits its turn. The message is then
 * marked sent, or its failure recorded with the next attempt after a backoff (1 s, 2 s, 4 s …
 * up to 10 min); either only while the lease is still this instance's (`attempts` unchanged).
 * A server that cannot be reached pauses this instance's sending for the same backoff, instead
 * of failing every queued message in turn; a permanent refusal (5xx) fails the message at once.
 * An instance that dies mid-send leaves the lease to run out and the message is sent again then:
 * delivery is at least once, and exactly once whenever instances do not die between handing a
 * message to the server and recording it. After GIVE_UP_AFTER_MS a message is marked failed.
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
const LEASE_MS = 5 * 60_000;
const SEND_TIMEOUT_MS = 2 * 60_000;
/** How long stop() waits for a send in progress (a shutdown has 9 s in all; src/server.ts). */
const STOP_WAIT_MS = 2000;
/** Errors that say the server could not be reached or talked to at all, not that it refused this message. */
const CONNECTION_ERRORS = new Set(['ECONNECTION', 'ETIMEDOUT', 'ESOCKET', 'EDNS', 'ECONNREFUSED', 'ECONNRESET', 'EHOSTUNREACH', 'ENOTFOUND', 'EAI_AGAIN', 'ETLS', 'EAUTH', 'EGREETING']);
const POLL_MS = 2000;
const MAX_BACKOFF_S = 600;
const GIVE_UP_AFTER_MS = 48 * 3600_000;
/** Sent and failed messages stay this long (what was sent to whom), then retention deletes them. */
const KEEP_DONE_S = 7 * 24 * 3600;

/**
 * Queues a message in `db`'s transaction (or on its own), its bodies sealed: what MailOutbox.queue
 * does, for a process that does not send (the CLI beside a server, whose outbox sends it).
 */
export async function queueMail(db: DB, secretKey: string, message: MailMessage): Promise<void> {
  const { text, html } = message;
  await db
    .insertInto('mail_outbox')
    .values({ recipient: message.to, subject: message.subject, body_encrypted: sealText(secretKey, SEAL_PURPOSE, JSON.stringify({ text, html })) })
    .execute();
}

/** What queues mail: the outbox, or a process that only writes to it. */
export type MailQueue = Pick<MailOutbox, 'queue' | 'wake'>;

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
  /** While the server cannot be reached: no sending before this (ms since the epoch), and how many times in a row. */
  private pausedUntil = 0;
  private unreachable = 0;

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

  /** Queues a message in `db`'s transaction (or on its own); call wake() once that has committed. */
  async queue(db: DB, message: MailMessage): Promise<void> {
    await queueMail(db, this.options.secretKey, message);
  }

  start(): void {
    if (this.timer || this.stopped) return;
    this.timer = setInterval(() => this.wake(), POLL_MS);
    this.timer.unref();
    this.wake();
  }

  /** Sends what is due now; a run already going runs once more afterwards. */
  wake(): void {
    if (this.stopped || Date.now() < this.pausedUntil) return;
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = this.drain().finally(() => {
      this.running = undefined;
    });
  }

  /** Resolves when nothing is being sent. */
  private async idle(): Promise<void> {
    while (this.running) await this.running;
  }

  /**
   * Stops sending. A send in progress gets STOP_WAIT_MS to finish; after that it is abandoned
   * and its message goes again when the lease runs out.
   */
  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    this.timer = undefined;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.idle(), new Promise<void>((resolve) => (timer = setTimeout(resolve, STOP_WAIT_MS)))]);
    clearTimeout(timer);
    this.options.transport.close();
  }

  private async drain(): Promise<void> {
    do {
      this.again = false;
      let claimed: Claimed | undefined;
      try {
        claimed = await this.claim();
      } catch (err) {
        this.options.logger.warn({ err }, 'could not read the mail outbox');
        return;
      }
      if (!claimed) continue;
      await this.deliver(claimed);
      this.again = true;
    } while (this.again && !this.stopped && Date.now() >= this.pausedUntil);
  }

  private async claim(): Promise<Claimed | undefined> {
    const { rows } = await sql<Claimed>`
      update mail_outbox m
      set attempts = m.attempts + 1, next_attempt_at = now() + make_interval(secs => ${LEASE_MS / 1000})
      from (
        select id from mail_outbox
        where sent_at is null and failed_at is null and next_attempt_at <= now()
        order by next_attempt_at
        limit 1
        for update skip locked
      ) due
      where m.id = due.id
      returning m.id, m.recipient, m.subject, m.body_encrypted, m.attempts, m.created_at`.execute(this.db);
    const row = rows[0];
    return row && { ...row, id: Number(row.id) };
  }

  private async deliver(message: Claimed): Promise<void> {
    const { logger, metrics, transport } = this.options;
    let error: unknown;
    let timer: NodeJS.Timeout | undefined;
    try {
      const body = this.openBody(message.body_encrypted);
      await Promise.race([
        transport.send(this.options.from, { to: message.recipient, subject: message.subject, ...body }),
        new Promise<never>((_resolve, reject) => {
          timer = setTimeout(() => reject(Object.assign(new Error('the mail server did not finish in time'), { code: 'ETIMEDOUT' })), SEND_TIMEOUT_MS);
        }),
      ]);
    } catch (err) {
      error = err;
    } finally {
      clearTimeout(timer);
    }
    // Every outcome is written only while the lease is still ours: `attempts` is what we claimed.
    const ours = this.db.updateTable('mail_outbox').where('id', '=', message.id).where('attempts', '=', message.attempts);
    const done = { expires_at: sql<Date>`now() + make_interval(secs => ${KEEP_DONE_S})` };
    try {
      if (error === undefined) {
        this.unreachable = 0;
        await ours.set({ sent_at: sql`now()`, last_error: null, ...done, ...(this.options.keepBodies ? {} : { body_encrypted: null }) }).execute();
        metrics?.mailDeliveries.inc({ outcome: 'sent' });
        if (transport.kind === 'smtp') logger.info({ mail_id: message.id, attempt: message.attempts }, 'email sent');
        return;
      }
      const reason = describe(error);
      // Not there, or our credentials refused: the server's problem or the operator's, not the message's.
      const unreachable = CONNECTION_ERRORS.has(errorCode(error));
      const refused = !unreachable && smtpStatus(error) >= 500;
      if (refused || Date.now() - message.created_at.getTime() >= GIVE_UP_AFTER_MS) {
        await ours.set({ failed_at: sql`now()`, last_error: reason, body_encrypted: null, ...done }).execute();
        metrics?.mailDeliveries.inc({ outcome: 'failed' });
        logger.error(
          { mail_id: message.id, attempts: message.attempts, reason },
          refused ? 'email refused by the mail server; not retried' : 'email given up: it could not be sent for 48 hours',
        );
        return;
      }
      const delay = retryDelaySeconds(unreachable ? Math.max(++this.unreachable, message.attempts) : message.attempts);
      await ours.set({ next_attempt_at: sql`now() + make_interval(secs => ${delay})`, last_error: reason }).execute();
      metrics?.mailDeliveries.inc({ outcome: 'retry' });
      logger.warn({ mail_id: message.id, attempt: message.attempts, retry_in_s: delay, reason }, 'email not sent; will retry');
      if (unreachable) this.pausedUntil = Date.now() + delay * 1000;
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

function errorCode(err: unknown): string {
  return err instanceof Error && 'code' in err && typeof err.code === 'string' ? err.code : '';
}

/** The SMTP reply code of a refusal (nodemailer's responseCode), or 0. */
function smtpStatus(err: unknown): number {
  return err instanceof Error && 'responseCode' in err && typeof err.responseCode === 'number' ? err.responseCode : 0;
}

function describe(err: unknown): string {
  if (!(err instanceof Error)) return String(err).slice(0, 500);
  const code = errorCode(err);
  return `${code ? `${code}: ` : ''}${err.message}`.replace(/\s+/g, ' ').slice(0, 500);
}
