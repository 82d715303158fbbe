/**
 * GET /dev/outbox: the messages a development server would have sent, readable in the browser
 * (their links work from here). Registered only when config.mail.devOutbox: no SMTP_URL, the
 * embedded database, and not production; anywhere else the path does not exist. It answers
 * only requests from this machine (loopback).
 */
import type { FastifyInstance } from 'fastify';
import type { Config } from '../config.js';
import { renderPage, setUpPages } from './render.js';
import type { MailOutbox } from '../mail/outbox.js';

export const DEV_OUTBOX_PATH = '/dev/outbox';

function isLoopback(address: string | undefined): boolean {
  return address !== undefined && (address === '::1' || address.startsWith('127.') || address.startsWith('::ffff:127.'));
}
const SHOWN = 50;

export async function devOutboxPage(app: FastifyInstance, { config, mail }: { config: Config; mail: MailOutbox }): Promise<void> {
  await setUpPages(app, config);
  app.get(DEV_OUTBOX_PATH, async (req, reply) => {
    // The links here sign in as anyone: only to this machine, whatever HOST the server listens on
    // (the socket's address, not one a proxy's header could claim).
    if (!isLoopback(req.socket.remoteAddress)) return reply.callNotFound();
    const messages = (await mail.recent(SHOWN)).map((m) => ({
      ...m,
      // Only links to this server become clickable.
      links: [...m.text.matchAll(/https?:\/\/[^\s<>"]+/g)].map((x) => x[0]).filter((l) => l.startsWith(`${config.issuer}/`)),
    }));
    return renderPage(reply, 200, 'dev-outbox', { title: 'Developer outbox', messages, limit: SHOWN });
  });
}
