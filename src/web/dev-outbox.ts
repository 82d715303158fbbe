/**
 * GET /dev/outbox: the messages a development server would have sent, readable in the browser
 * (their links work from here). Registered only when config.mail.devOutbox: no SMTP_URL, the
 * embedded database, and not production; anywhere else the path does not exist. It answers
 * only requests from this machine that name this server (web/dev-only.ts): its links sign in as
 * anyone, so a page that reached it through DNS rebinding could take over any local account.
 */
import type { FastifyInstance } from 'fastify';
import type { Config } from '../config.js';
import type { MailOutbox } from '../mail/outbox.js';
import { devRequestGuard } from './dev-only.js';
import { renderPage, setUpPages } from './render.js';

export const DEV_OUTBOX_PATH = '/dev/outbox';

const SHOWN = 50;

export async function devOutboxPage(app: FastifyInstance, { config, mail }: { config: Config; mail: MailOutbox }): Promise<void> {
  await setUpPages(app, config);
  const guard = devRequestGuard(config.issuer, app.log);
  app.get(DEV_OUTBOX_PATH, async (req, reply) => {
    if (!guard.allows(req)) return reply.callNotFound();
    const messages = (await mail.recent(SHOWN)).map((m) => ({
      ...m,
      // Only links to this server become clickable.
      links: [...m.text.matchAll(/https?:\/\/[^\s<>"]+/g)].map((x) => x[0]).filter((l) => l.startsWith(`${config.issuer}/`)),
    }));
    return renderPage(reply, 200, 'dev-outbox', { title: 'Developer outbox', messages, limit: SHOWN });
  });
}
