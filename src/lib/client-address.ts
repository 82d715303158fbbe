/**
 * The address a request came from, as the limits and throttles of anonymous requests count it
 * (client registrations per address, client metadata document fetches, wrong device codes).
 *
 * - clientAddress: `req.ip`, when it is an IP address. With TRUST_PROXY, `req.ip` is read from
 *   X-Forwarded-For, which is only as good as the proxy that sets it: a header the client wrote
 *   itself can say anything. Whatever is not an address (net.isIP) is not used; the connection's
 *   own address is, the proxy's when there is one.
 * - addressGroup: the key an address is counted under. An IPv4 address is its own key, also when
 *   written IPv4-mapped (::ffff:203.0.113.9, as a dual-stack listener reports it); an IPv6
 *   address counts with its /64 (`2001:db8:1:2::/64`), which one host usually holds whole, so
 *   that it cannot take a fresh allowance with each of its addresses.
 */
import { isIP } from 'node:net';
import type { FastifyRequest } from 'fastify';

/** The request's address: `req.ip` when it is an IP address, otherwise the connection's. */
export function clientAddress(req: Pick<FastifyRequest, 'ip' | 'socket'>): string {
  if (isIP(req.ip) !== 0) return req.ip;
  const connection = req.socket.remoteAddress;
  // Undefined only once the connection has closed: such requests share one key.
  return connection !== undefined && isIP(connection) !== 0 ? connection : '0.0.0.0';
}

/** The eight 16-bit groups of an IPv6 address (one net.isIP accepts), a trailing dotted quad and a zone included. */
function ipv6Groups(address: string): number[] {
  let text = address.replace(/%.*$/, '').toLowerCase();
  const dotted = /^(.*:)([0-9]+)\.([0-9]+)\.([0-9]+)\.([0-9]+)$/.exec(text);
  if (dotted) {
    const [a, b, c, d] = dotted.slice(2).map(Number) as [number, number, number, number];
    text = `${dotted[1]}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const parse = (part: string) => (part === '' ? [] : part.split(':').map((group) => parseInt(group, 16)));
  const [head = '', tail] = text.split('::');
  if (tail === undefined) return parse(head);
  const before = parse(head);
  const after = parse(tail);
  return [...before, ...Array<number>(8 - before.length - after.length).fill(0), ...after];
}

/**
 * The key `ip` (an IP address, as clientAddress returns) is counted under: an IPv4 address
 * itself, IPv4-mapped ones included; an IPv6 address's /64, as `2001:db8:1:2::/64`.
 */
export function addressGroup(ip: string): string {
  if (isIP(ip) !== 6) return ip;
  const groups = ipv6Groups(ip);
  if (groups.slice(0, 5).every((g) => g === 0) && groups[5] === 0xffff) {
    const [high = 0, low = 0] = groups.slice(6);
    return `${high >> 8}.${high & 0xff}.${low >> 8}.${low & 0xff}`;
  }
  return `${groups
    .slice(0, 4)
    .map((g) => g.toString(16))
    .join(':')}::/64`;
}
