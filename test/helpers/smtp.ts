/**
 * A real SMTP server for the tests (the smtp-server package, the server half of nodemailer's
 * project), on a free port of 127.0.0.1, that keeps what it receives, parsed (mailparser), so a
 * test reads links out of the messages orgauth sent. It requires the credentials in `url`, as a
 * real relay would, and can be stopped and started again on the same port (the mail server down).
 */
import { once } from 'node:events';
import { simpleParser } from 'mailparser';
import { SMTPServer } from 'smtp-server';
import { freePort } from './process.js';

export interface ReceivedMail {
  from: string;
  to: string[];
  subject: string;
  text: string;
  html: string;
  /** The links to `issuer` in the text body. */
  links: string[];
}

export const SMTP_USER = 'orgauth';
export const SMTP_PASSWORD = 'smtp-test-password';

export class TestSmtpServer {
  readonly received: ReceivedMail[] = [];
  /** Recipients refused with 550, as a server refuses a mailbox that does not exist. */
  readonly refused = new Set<string>();
  private server: SMTPServer | undefined;
  private waiters: (() => void)[] = [];

  private constructor(readonly port: number) {}

  static async start(): Promise<TestSmtpServer> {
    const smtp = new TestSmtpServer(await freePort());
    await smtp.listen();
    return smtp;
  }

  /** SMTP_URL for orgauth. */
  get url(): string {
    return `smtp://${SMTP_USER}:${SMTP_PASSWORD}@127.0.0.1:${this.port}`;
  }

  async listen(): Promise<void> {
    const server = new SMTPServer({
      // Plain SMTP on loopback: without a certificate STARTTLS would be offered and fail.
      disabledCommands: ['STARTTLS'],
      allowInsecureAuth: true,
      authMethods: ['PLAIN', 'LOGIN'],
      logger: false,
      onAuth: (auth, _session, callback) => {
        if (auth.username === SMTP_USER && auth.password === SMTP_PASSWORD) callback(null, { user: auth.username });
        else callback(new Error('invalid credentials'));
      },
      onRcptTo: (address, _session, callback) => {
        if (this.refused.has(address.address.toLowerCase())) callback(Object.assign(new Error('mailbox unavailable'), { responseCode: 550 }));
        else callback();
      },
      onData: (stream, session, callback) => {
        simpleParser(stream).then(
          (parsed) => {
            const text = parsed.text ?? '';
            this.received.push({
              from: session.envelope.mailFrom ? session.envelope.mailFrom.address : '',
              to: session.envelope.rcptTo.map((r) => r.address),
              subject: parsed.subject ?? '',
              text,
              html: typeof parsed.html === 'string' ? parsed.html : '',
              links: [...text.matchAll(/https?:\/\/[^\s<>"]+/g)].map((m) => m[0]),
            });
            for (const wake of this.waiters.splice(0)) wake();
            callback();
          },
          (err: Error) => callback(err),
        );
      },
    });
    server.listen(this.port, '127.0.0.1');
    await once(server.server, 'listening');
    this.server = server;
  }

  /** Stops listening and drops open connections: the mail server is down until listen() again. */
  async stop(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  /** The first message to `to` whose subject matches, waiting for it up to `timeoutMs`. */
  async waitFor(to: string, subject: RegExp = /./, timeoutMs = 15_000): Promise<ReceivedMail> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const found = this.received.find((m) => m.to.some((t) => t.toLowerCase() === to.toLowerCase()) && subject.test(m.subject));
      if (found) return found;
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no message to ${to} matching ${subject} within ${timeoutMs} ms (received: ${this.received.map((m) => `${m.to.join(',')}: ${m.subject}`).join('; ') || 'nothing'})`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, Math.min(left, 1000));
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  /** Messages to `to` (all so far). */
  to(to: string): ReceivedMail[] {
    return this.received.filter((m) => m.to.some((t) => t.toLowerCase() === to.toLowerCase()));
  }
}

/** The link in a message that starts with `prefix` (e.g. `${issuer}/reset-password`). */
export function linkIn(mail: ReceivedMail, prefix: string): string {
  const link = mail.links.find((l) => l.startsWith(prefix));
  if (!link) throw new Error(`no link starting with ${prefix} in "${mail.subject}": ${mail.text}`);
  return link;
}
