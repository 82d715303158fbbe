/**
 * Resource indicators (RFC 8707): the URI a client names in `resource`, compared in one canonical
 * form, so `https://MCP.example.com:443/mcp/` and `https://mcp.example.com/mcp` are one resource
 * (the trailing-slash mismatch MCP clients keep running into) while the path stays
 * case-sensitive, as URLs are.
 */
import { isWellFormed } from '../../lib/validate.js';

const LOOPBACK_HOSTS = new Set(['localhost', '127.0.0.1', '[::1]']);
export const MAX_RESOURCE_URI_LENGTH = 2000;

/**
 * The canonical form of a resource URI, or a reason it cannot be one: absolute https (or http for
 * a loopback host), no fragment (RFC 8707 §2), no query, no user info; scheme and host
 * lower-cased and the default port dropped (WHATWG URL does both), and a lone trailing `/` of the
 * path dropped.
 */
export function parseResourceUri(value: string): { uri: string } | { problem: string } {
  if (value.length > MAX_RESOURCE_URI_LENGTH) return { problem: `must be at most ${MAX_RESOURCE_URI_LENGTH} characters` };
  if (/[\s\x00-\x1f\x7f]/.test(value) || !isWellFormed(value)) return { problem: 'must not contain spaces or control characters' };
  if (!URL.canParse(value)) return { problem: 'must be an absolute URI' };
  const url = new URL(value);
  if (value.includes('#')) return { problem: 'must not contain a fragment (RFC 8707 §2)' };
  if (url.search !== '' || value.includes('?')) return { problem: 'must not contain a query' };
  if (url.username !== '' || url.password !== '') return { problem: 'must not contain user info' };
  if (url.protocol !== 'https:' && !(url.protocol === 'http:' && LOOPBACK_HOSTS.has(url.hostname))) {
    return { problem: 'must use https (or http for a loopback host)' };
  }
  const path = url.pathname.endsWith('/') ? url.pathname.slice(0, -1) : url.pathname;
  return { uri: `${url.protocol}//${url.host}${path}` };
}

/** The canonical form of `value`, or undefined when it cannot name a resource. */
export function canonicalResourceUri(value: string): string | undefined {
  const parsed = parseResourceUri(value);
  return 'uri' in parsed ? parsed.uri : undefined;
}
