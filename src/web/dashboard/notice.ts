/**
 * What an action did, said on the page it redirects to: the dashboard's one mechanism for it.
 *
 * The route that made the change writes one sentence, built from what it just changed, into a
 * short-lived cookie sealed with SECRET_KEY (AES-256-GCM: it can be neither forged nor read) and
 * bound to the session; the next dashboard page the browser loads shows it once, at the top
 * (layout.eta, through `ctx.notice`), and clears the cookie. Nothing a URL says ever becomes a
 * notice, so a link cannot make a page claim something happened.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import { cookieSecurity } from '../../accounts/sessions.js';
import type { Config } from '../../config.js';
import { openText, sealText, sha256Hex } from '../../lib/crypto.js';

const PURPOSE = 'dashboard-notice';
/** Long enough for the redirect that follows the action, short enough not to surprise anyone later. */
const TTL_SECONDS = 60;
const MAX_LENGTH = 500;

function cookie(config: Config): { name: string; options: { httpOnly: true; sameSite: 'lax'; path: '/'; secure: boolean } } {
  const { secure } = cookieSecurity(config);
  // `__Host-` over https, as the session cookie: pinned to this host and path /.
  return { name: `${secure ? '__Host-' : ''}orgauth_notice`, options: { httpOnly: true, sameSite: 'lax', path: '/', secure } };
}

/** Has the next dashboard page of this session say `text`. */
export function setNotice(reply: FastifyReply, config: Config, sessionId: string, text: string): void {
  const { name, options } = cookie(config);
  const sealed = sealText(config.secretKey, PURPOSE, JSON.stringify({ s: sha256Hex(sessionId), e: Date.now() + TTL_SECONDS * 1000, t: text.slice(0, MAX_LENGTH) }));
  reply.setCookie(name, sealed, { ...options, maxAge: TTL_SECONDS });
}

/** A 303 to `location`, which then says `text`. */
export function redirectWithNotice(reply: FastifyReply, config: Config, sessionId: string, location: string, text: string): FastifyReply {
  setNotice(reply, config, sessionId, text);
  return reply.redirect(location, 303);
}

/** The notice waiting for this session, or ''; a notice cookie is cleared once read, whatever it held. */
export function takeNotice(req: FastifyRequest, reply: FastifyReply, config: Config, sessionId: string): string {
  const { name, options } = cookie(config);
  const value = req.cookies[name];
  if (value === undefined || value === '') return '';
  reply.clearCookie(name, options);
  try {
    const notice = JSON.parse(openText(config.secretKey, PURPOSE, value)) as { s?: unknown; e?: unknown; t?: unknown };
    if (notice.s !== sha256Hex(sessionId) || typeof notice.e !== 'number' || notice.e < Date.now() || typeof notice.t !== 'string') return '';
    return notice.t;
  } catch {
    return '';
  }
}

/** "1 connected app", "3 connected apps" (above `cap`: "more than 1,000 connected apps"): for notices and confirmation pages. */
export function count(n: number, one: string, many = `${one}s`, cap?: number): string {
  if (cap !== undefined && n > cap) return `more than ${cap.toLocaleString('en-US')} ${many}`;
  return `${n} ${n === 1 ? one : many}`;
}
