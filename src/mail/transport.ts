/**
 * Where messages go: an SMTP server through nodemailer (SMTP_URL), or, without one, the log.
 *
 * nodemailer speaks SMTP for us: smtps:// is TLS from the first byte; on smtp:// it upgrades
 * with STARTTLS whenever the server offers it (and never sends credentials in the clear to a
 * server that does not, unless the URL says so). Timeouts are short: a message that cannot go
 * now is retried by the outbox, so a hung server must not hold a sending slot for minutes.
 */
import type { Logger } from 'pino';
import { lazyImport } from '../lib/lazy.js';
import type { MailMessage } from './messages.js';

export interface MailTransport {
  /** 'smtp' delivers; 'log' writes the message to the log (no SMTP_URL). */
  readonly kind: 'smtp' | 'log';
  send(from: string, message: MailMessage): Promise<void>;
  close(): void;
}

export function smtpTransport(url: string): MailTransport {
  // nodemailer is loaded with the first message (a tenth of a second of every start otherwise).
  let created: ReturnType<typeof import('nodemailer').createTransport> | undefined;
  const transporter = lazyImport(async () => {
    const { default: nodemailer } = await import('nodemailer');
    created = nodemailer.createTransport(url, {
      connectionTimeout: 10_000,
      greetingTimeout: 10_000,
      socketTimeout: 30_000,
      // The messages carry sign-in links: never leave them in nodemailer's own logs.
      logger: false,
      debug: false,
    } as never);
    return created;
  });
  return {
    kind: 'smtp',
    async send(from, message) {
      // An address object, never a string nodemailer would parse as a list of recipients.
      await (await transporter()).sendMail({ from, to: { name: '', address: message.to }, subject: message.subject, text: message.text, html: message.html });
    },
    close: () => created?.close(),
  };
}

/**
 * No SMTP_URL: each message is written to the log at info, its text (with its link) included,
 * since the log is the only place anyone can read it. For development and tests only; the
 * server says so when it starts.
 */
export function logTransport(logger: Pick<Logger, 'info'>): MailTransport {
  return {
    kind: 'log',
    async send(from, message) {
      logger.info({ mail: { from, to: message.to, subject: message.subject, text: message.text } }, 'email not sent (no SMTP_URL): logged instead');
    },
    close: () => {},
  };
}
