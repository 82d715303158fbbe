/**
 * Which URLs a webhook endpoint may have. An endpoint's URL is chosen by an organization's admin
 * (or an application with webhooks.write) and orgauth POSTs to it from inside its own network,
 * so it is a server-side request forgery vector like every URL in src/lib/outbound.ts (AG-1):
 * https only, no credentials, and no special-use address (loopback, private, link-local, cloud
 * metadata, ...) whatever its spelling — a literal in any IPv4 form the URL parser accepts
 * (decimal 2130706433, octal 0177.0.0.1, hex 0x7f000001, short 127.1), any IPv6 form
 * (::1, ::ffff:127.0.0.1, ::ffff:7f00:1), `localhost` and its subdomains (RFC 6761), or a name
 * that resolves to one. WEBHOOK_ALLOW_PRIVATE=1 (development and tests) lifts the scheme and
 * address rules, never the credentials one.
 *
 * Checked when an endpoint is created or its URL changed (src/webhooks/endpoints.ts), so an admin
 * learns at once; the dispatcher checks again at every delivery (through the outbound client,
 * which also pins the connection to the checked addresses), since DNS may change in between.
 * Shared by both: this is the one place the rule is written.
 */
import { lookup as dnsLookup, Resolver } from 'node:dns/promises';
import type { LookupAddress } from 'node:dns';
import { isIP } from 'node:net';
import type { Config } from '../config.js';
import { InvalidRequestError } from '../errors.js';
import { isSpecialUseAddress, type ResolveHostname } from '../lib/outbound.js';
import { isWellFormed } from '../lib/validate.js';

/** As the webhook_endpoints.url column allows. */
export const MAX_WEBHOOK_URL_LENGTH = 2000;

function refuse(message: string): never {
  throw new InvalidRequestError(`url: ${message}`, { details: [{ path: 'url', message }] });
}

/** A name that is loopback by definition (RFC 6761 §6.3), whatever DNS says; compared without case or the root's dot. */
function isLocalhostName(hostname: string): boolean {
  const name = hostname.toLowerCase().replace(/\.$/, '');
  return name === 'localhost' || name.endsWith('.localhost');
}

/**
 * The resolver the check asks: DNS_SERVERS when set (the same servers domain verification asks),
 * otherwise the system's, as a delivery would resolve. Both address families, since a connection
 * may take either.
 */
export function webhookResolver(servers: readonly string[]): ResolveHostname {
  if (servers.length === 0) return (hostname) => dnsLookup(hostname, { all: true });
  return async (hostname) => {
    const resolver = new Resolver({ timeout: 2000, tries: 2 });
    resolver.setServers([...servers]);
    const family = async (query: Promise<string[]>, version: 4 | 6): Promise<LookupAddress[]> => {
      try {
        return (await query).map((address) => ({ address, family: version }));
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code === 'ENOTFOUND' || code === 'ENODATA') return [];
        throw err;
      }
    };
    const [v4, v6] = await Promise.all([family(resolver.resolve4(hostname), 4), family(resolver.resolve6(hostname), 6)]);
    return [...v4, ...v6];
  };
}

/**
 * Parses and checks a webhook endpoint URL; returns it parsed, or throws InvalidRequestError with
 * details [{ path: 'url', message }]. `options.lookup` replaces the resolver (tests).
 */
export async function checkWebhookUrl(url: string, config: Pick<Config, 'webhooks' | 'dnsServers'>, options: { lookup?: ResolveHostname } = {}): Promise<URL> {
  if (url.length === 0) refuse('must not be empty');
  if (url.length > MAX_WEBHOOK_URL_LENGTH) refuse(`must be at most ${MAX_WEBHOOK_URL_LENGTH} characters`);
  if (!isWellFormed(url) || !URL.canParse(url)) refuse('must be an absolute URL');
  const parsed = new URL(url);
  const allowPrivate = config.webhooks.allowPrivate;
  if (parsed.protocol !== 'https:' && !(allowPrivate && parsed.protocol === 'http:')) {
    refuse(allowPrivate ? 'must be an http(s) URL' : 'must be an https URL');
  }
  // Credentials would be sent on the admin's behalf, and they blur which host the URL names.
  if (parsed.username !== '' || parsed.password !== '') refuse('must not carry credentials');
  if (parsed.hash !== '') refuse('must not have a fragment');
  if (allowPrivate) return parsed;
  // WHATWG URL parsing has already turned every IPv4 spelling into dotted decimal and every IPv6
  // one into its canonical text, so the literal check below sees what a socket would connect to.
  const host = parsed.hostname.startsWith('[') ? parsed.hostname.slice(1, -1) : parsed.hostname;
  if (host === '') refuse('must name a host');
  if (isLocalhostName(host)) refuse('must not point at localhost');
  if (isIP(host) !== 0) {
    if (isSpecialUseAddress(host, [])) refuse(`must not point at a private or special-use address (${host})`);
    return parsed;
  }
  let addresses: readonly LookupAddress[];
  try {
    addresses = await (options.lookup ?? webhookResolver(config.dnsServers))(host);
  } catch {
    refuse(`the host ${host} could not be resolved`);
  }
  if (addresses.length === 0) refuse(`the host ${host} could not be resolved`);
  // One bad address refuses the name: whoever controls its DNS chooses which one a sender tries.
  const bad = addresses.find((a) => isSpecialUseAddress(a.address, []));
  if (bad) refuse(`the host ${host} resolves to a private or special-use address (${bad.address})`);
  return parsed;
}

/**
 * A URL without its query string (and fragment), for the audit log, logs and email: receivers
 * often put a token there. What cannot be parsed is given back as it is.
 */
export function urlWithoutQuery(url: string): string {
  try {
    const parsed = new URL(url);
    return `${parsed.origin}${parsed.pathname}`;
  } catch {
    return url;
  }
}
