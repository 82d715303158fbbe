/**
 * Which requests a development-only page (GET /dev/outbox, and any later one) answers: those that
 * are plainly this machine's own. Two checks, both on what the connection says, never on a
 * header a proxy adds (X-Forwarded-*):
 *
 * - the peer is a loopback address (the socket's, whatever HOST the server listens on);
 * - the Host header names this server: the ISSUER's host and port, or `localhost`, `127.0.0.1`
 *   or `[::1]` with the port the connection came in on. A loopback peer is not enough because of
 *   DNS rebinding: a page the developer visits re-points its own name to 127.0.0.1, and the
 *   browser then sends the developer's requests to this server as same-origin requests of the
 *   attacker's page, which can read the answers. The browser still sends the attacker's name as
 *   Host, so naming this server is what the attacker cannot fake (issue 30; the rule Vite,
 *   webpack-dev-server and Jupyter apply for the same reason).
 *
 * Anything else is answered as an unknown path (the page does not exist for it), and logged at
 * warn once per host name (a bounded set: a flood of names cannot grow it).
 */
import type { FastifyBaseLogger, FastifyRequest } from 'fastify';

/** The names that are this machine whatever ISSUER says (with the connection's own port). */
const LOOPBACK_NAMES = new Set(['localhost', '127.0.0.1', '[::1]']);
/** RFC 9110 §7.2 Host: a reg-name, an IPv4 address or a bracketed IPv6 literal, then an optional port. Nothing else is parsed. */
const HOST_HEADER = /^(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(?::([0-9]{1,5}))?$/;
const MAX_WARNED_HOSTS = 1000;

export function isLoopbackAddress(address: string | undefined): boolean {
  return address !== undefined && (address === '::1' || address.startsWith('127.') || address.startsWith('::ffff:127.'));
}

/** A Host header's name (lower-cased) and port (the scheme's default when absent), or undefined when it is not one. */
function parseHost(header: string, defaultPort: number): { name: string; port: number } | undefined {
  const match = HOST_HEADER.exec(header.toLowerCase());
  if (match === null) return undefined;
  const port = match[2] === undefined ? defaultPort : Number(match[2]);
  return port <= 65535 ? { name: match[1]!, port } : undefined;
}

export interface DevRequestGuard {
  /** Whether `req` may see a development-only page; logs the first refusal of each host name. */
  allows(req: FastifyRequest): boolean;
}

export function devRequestGuard(issuer: string, log: FastifyBaseLogger): DevRequestGuard {
  const url = new URL(issuer);
  const defaultPort = url.protocol === 'https:' ? 443 : 80;
  const own = parseHost(url.host, defaultPort);
  const warned = new Set<string>();

  const namesThisServer = (req: FastifyRequest): boolean => {
    const header = req.headers.host;
    if (typeof header !== 'string') return false;
    // The server speaks plain http here (a development page exists only with an http ISSUER).
    const host = parseHost(header, 80);
    if (host === undefined) return false;
    if (own !== undefined && host.name === own.name && host.port === own.port) return true;
    return LOOPBACK_NAMES.has(host.name) && host.port === req.socket.localPort;
  };

  return {
    allows(req) {
      if (!isLoopbackAddress(req.socket.remoteAddress)) return false;
      // An absolute-form target (`GET http://other.test/dev/outbox`) names its own host, which
      // then wins over Host (RFC 9112 §3.2.2): browsers never send one to a server, so refuse it.
      if (req.raw.url?.startsWith('/') && namesThisServer(req)) return true;
      const name = String(req.headers.host ?? '(none)').slice(0, 200);
      if (!warned.has(name)) {
        if (warned.size >= MAX_WARNED_HOSTS) warned.clear();
        warned.add(name);
        log.warn({ host: name, path: req.url.split('?')[0] }, 'a development page was asked for under a host name that is not this server’s (DNS rebinding?): answered 404');
      }
      return false;
    },
  };
}
