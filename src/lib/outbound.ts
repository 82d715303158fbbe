/**
 * The one HTTP client for requests whose URL someone outside orgauth chose: client metadata
 * documents, `jwks_uri`, webhooks, an organization's upstream OpenID provider (AG-1).
 *
 * Why it exists: such a URL is a server-side request forgery vector. Without a guard, a client
 * or an organization admin could make orgauth fetch http://169.254.169.254/ (cloud credentials),
 * http://127.0.0.1:5432/, or anything on the private network, and read the answer back through
 * an error message or a timing (draft-ietf-oauth-client-id-metadata-document §6, "Server-Side
 * Request Forgery"; OWASP SSRF Prevention Cheat Sheet). So:
 *
 * - The host is resolved once here and every address it resolves to is checked against the
 *   IANA special-purpose registries (RFC 6890 and successors); one bad address refuses the whole
 *   request, since an attacker who controls DNS chooses which address a client would try.
 * - The connection is pinned to the addresses that were checked: node's `lookup` hook hands the
 *   socket those addresses, so there is no second DNS query for a rebinding attacker to answer
 *   differently (time-of-check/time-of-use). TLS still verifies the certificate against the
 *   hostname, and SNI and Host carry the hostname, so pinning changes nothing a server can see.
 * - Redirects are never followed: each hop would need the same check, and a 3xx to an internal
 *   address is the classic way around a check done only on the first URL. The 3xx goes back to
 *   the caller, which for metadata documents and JWKS treats it as a failure anyway.
 * - The whole exchange is bounded in time and the body in size, so a slow or huge answer cannot
 *   hold a worker or memory (the metadata draft suggests a small limit, around 5 KB).
 *
 * Built on node:http/https rather than undici or the global fetch: their dispatchers take a
 * `lookup` per Agent, so pinning a per-request answer would need an Agent per request (and
 * closing it) or a lookup that re-resolves, while node:http takes `lookup` per request. With
 * `agent: false` each request has its own connection, closed after it: no pool can hand a
 * socket checked under one policy to a request under another. The body is read in full to
 * enforce the size limit, so a WHATWG `Response` is built from bytes either way.
 */
import { promisify } from 'node:util';
import { X509Certificate } from 'node:crypto';
import { lookup as dnsLookup } from 'node:dns/promises';
import type { LookupAddress, LookupOptions } from 'node:dns';
import http from 'node:http';
import https from 'node:https';
import { readFileSync } from 'node:fs';
import { BlockList, isIP } from 'node:net';
import type { LookupFunction } from 'node:net';
import tls from 'node:tls';
import zlib from 'node:zlib';

export interface OutboundPolicy {
  /** Plain http is for development and tests only: outside them a network attacker could rewrite the answer. */
  allowHttp: boolean;
  /** CIDRs (or single addresses) exempted from the special-use refusal, e.g. a trusted internal IdP's network. */
  allowedNetworks: readonly string[];
  /** Connect, request, headers and body together. */
  timeoutMs: number;
  /** The response body, both as received and after content decoding. */
  maxBytes: number;
  /**
   * A PEM file of certificate authorities trusted for https besides node's bundled roots (a
   * company CA; the tests' CA). Null or absent: the bundled roots alone.
   */
  caFile?: string | null | undefined;
}

/** Resolves a hostname to every address it has, the way `dns.promises.lookup(host, { all: true })` does. */
export type ResolveHostname = (hostname: string) => Promise<readonly LookupAddress[]>;

export interface OutboundOptions {
  /**
   * Replaces the system resolver: for tests (to play a rebinding DNS server) and for a
   * deployment that must resolve through a resolver of its own. Called once per request.
   */
  lookup?: ResolveHostname;
}

type HeadersInput = ConstructorParameters<typeof Headers>[0];
/**
 * openid-client's FetchBody plus Blob. Not Response's BodyInit: with TypeScript 5.9 that wants
 * Uint8Array<ArrayBuffer>, which openid-client's plain Uint8Array is not.
 */
type BodyInput = string | URLSearchParams | Uint8Array | ArrayBuffer | ReadableStream | Blob | null | undefined;

/**
 * The subset of fetch's RequestInit that outbound callers use, wide enough that openid-client's
 * `CustomFetchOptions` is accepted as is (the test assigns this function to its `CustomFetch`).
 */
export interface OutboundInit {
  method?: string;
  headers?: HeadersInput;
  body?: BodyInput;
  signal?: AbortSignal | null;
  /**
   * 'manual' and 'follow' both return a 3xx as is: following is never done (see the top of the
   * file). 'error' rejects on a 3xx, as fetch does.
   */
  redirect?: 'manual' | 'error' | 'follow';
  /** Accepted for fetch compatibility (openid-client sets it with a stream body); bodies are buffered anyway. */
  duplex?: 'half';
}

export type OutboundFetch = (url: string | URL, init?: OutboundInit) => Promise<Response>;

/** A request refused by the policy: before any connection for the URL checks, after it for the limits. */
export class OutboundRefusedError extends Error {
  override readonly name = 'OutboundRefusedError';
  constructor(readonly reason: string) {
    super(`outbound request refused: ${reason}`);
  }
}

/**
 * Ranges that are not a public internet host: this network, private, shared (CGNAT), loopback,
 * link-local (cloud metadata), protocol assignments, documentation, benchmarking, 6to4 relay,
 * multicast, reserved, broadcast.
 */
const SPECIAL_USE_V4: readonly (readonly [string, number])[] = [
  ['0.0.0.0', 8],
  ['10.0.0.0', 8],
  ['100.64.0.0', 10],
  ['127.0.0.0', 8],
  ['169.254.0.0', 16],
  ['172.16.0.0', 12],
  ['192.0.0.0', 24],
  ['192.0.2.0', 24],
  ['192.88.99.0', 24],
  ['192.168.0.0', 16],
  ['198.18.0.0', 15],
  ['198.51.100.0', 24],
  ['203.0.113.0', 24],
  ['224.0.0.0', 4],
  ['240.0.0.0', 4],
  // 255.255.255.255/32 lies inside 240.0.0.0/4; listed so the table matches the requirement.
  ['255.255.255.255', 32],
];

/**
 * Beyond the requirement's list: ::/96 (IPv4-compatible, deprecated, and a spelling of
 * loopback as ::127.0.0.1), 2002::/16 (6to4 embeds an IPv4 address the packet is tunnelled to),
 * 3fff::/20 (documentation, RFC 9637) and 5f00::/16 (SRv6 SIDs, RFC 9602). ::ffff:0:0/96 is not
 * here: a mapped address is judged by the IPv4 address it carries, so that an allowed IPv4
 * network also allows its mapped form.
 */
const SPECIAL_USE_V6: readonly (readonly [string, number])[] = [
  ['::', 128],
  ['::1', 128],
  ['::', 96],
  ['64:ff9b::', 96],
  // IPv4-translated (RFC 2765 SIIT), a spelling of an IPv4 address the mapped check does not read.
  ['::ffff:0:0:0', 96],
  // Local-use NAT64 (RFC 8215): translated to IPv4 inside the operator's network.
  ['64:ff9b:1::', 48],
  ['100::', 64],
  ['2001::', 23],
  ['2001:db8::', 32],
  ['2002::', 16],
  ['3fff::', 20],
  ['5f00::', 16],
  ['fc00::', 7],
  ['fe80::', 10],
  // Deprecated site-local (RFC 3879), still routed inside some networks.
  ['fec0::', 10],
  ['ff00::', 8],
];

const specialUse = new BlockList();
for (const [network, prefix] of SPECIAL_USE_V4) specialUse.addSubnet(network, prefix, 'ipv4');
for (const [network, prefix] of SPECIAL_USE_V6) specialUse.addSubnet(network, prefix, 'ipv6');

/**
 * The IPv4 address inside an IPv4-mapped IPv6 address, whatever its spelling (`::ffff:7f00:1`,
 * `::ffff:127.0.0.1`, `0:0:0:0:0:ffff:…`): the WHATWG URL serializer gives every IPv6 address
 * one canonical text, so one pattern suffices. Undefined for any other address.
 */
function unmapIpv4(address: string): string | undefined {
  if (isIP(address) !== 6) return undefined;
  let canonical: string;
  try {
    canonical = new URL(`http://[${address}]/`).hostname;
  } catch {
    return undefined;
  }
  const groups = /^\[::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})\]$/.exec(canonical);
  if (!groups?.[1] || !groups[2]) return undefined;
  const high = parseInt(groups[1], 16);
  const low = parseInt(groups[2], 16);
  return `${high >> 8}.${high & 0xff}.${low >> 8}.${low & 0xff}`;
}

/** Parses "10.1.0.0/16", "fd00::/8" or a bare address; a typo in configuration must fail loudly, not allow nothing or everything. */
function parseNetworks(networks: readonly string[]): BlockList {
  const list = new BlockList();
  for (const entry of networks) {
    const [address = '', prefixText, extra] = entry.trim().split('/');
    const family = isIP(address);
    const maxPrefix = family === 4 ? 32 : 128;
    const prefix = prefixText === undefined ? maxPrefix : Number(prefixText);
    if (family === 0 || extra !== undefined || !Number.isInteger(prefix) || prefix < 0 || prefix > maxPrefix || prefixText === '') {
      throw new Error(`not a network in CIDR notation: ${JSON.stringify(entry)}`);
    }
    list.addSubnet(address, prefix, family === 4 ? 'ipv4' : 'ipv6');
  }
  return list;
}

/**
 * True when `address` (an IP literal, without brackets) is in a special-use range and not inside
 * one of `allowed`. Anything that is not an IP address counts as special-use: refusing is the
 * safe answer to input this function does not understand.
 */
export function isSpecialUseAddress(address: string, allowed: BlockList | readonly string[]): boolean {
  const allowList = allowed instanceof BlockList ? allowed : parseNetworks(allowed);
  const mapped = unmapIpv4(address);
  if (mapped !== undefined) return isSpecialUseAddress(mapped, allowList);
  const family = isIP(address);
  if (family === 0) return true;
  const type = family === 4 ? 'ipv4' : 'ipv6';
  return specialUse.check(address, type) && !allowList.check(address, type);
}

const REDIRECT_STATUSES = new Set([301, 302, 303, 307, 308]);
const NULL_BODY_STATUSES = new Set([204, 205, 304]);
/** Framing and hop-by-hop headers are node's to write from the body it sends; a caller's value could desynchronize the message. */
const CALLER_FORBIDDEN_HEADERS = ['host', 'content-length', 'transfer-encoding', 'connection', 'keep-alive', 'upgrade', 'te', 'trailer', 'expect'];
/** The methods fetch upper-cases; any other is sent as written (fetch leaves `patch` alone too). */
const NORMALIZED_METHODS = new Set(['DELETE', 'GET', 'HEAD', 'OPTIONS', 'POST', 'PUT']);

interface Target {
  url: URL;
  /** Without the brackets URL keeps around an IPv6 literal. */
  host: string;
}

function checkUrl(input: string | URL, policy: OutboundPolicy): Target {
  let url: URL;
  try {
    url = new URL(input);
  } catch {
    throw new OutboundRefusedError('not a valid URL');
  }
  if (url.protocol !== 'https:' && url.protocol !== 'http:') throw new OutboundRefusedError(`scheme ${url.protocol} is not http(s)`);
  if (url.protocol === 'http:' && !policy.allowHttp) throw new OutboundRefusedError('plain http is not allowed');
  // Credentials in a URL someone else supplied would be sent on their behalf, and they blur
  // which host a reader thinks the URL names (https://trusted.example@evil.example/).
  if (url.username !== '' || url.password !== '') throw new OutboundRefusedError('URL carries credentials');
  const host = url.hostname.startsWith('[') ? url.hostname.slice(1, -1) : url.hostname;
  if (host === '') throw new OutboundRefusedError('URL has no host');
  return { url, host };
}

/** Races a promise that cannot itself be cancelled (a DNS lookup) against the deadline. */
function raceAbort<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => reject(signal.reason);
    if (signal.aborted) return onAbort();
    signal.addEventListener('abort', onAbort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}

const defaultResolve: ResolveHostname = (hostname) => dnsLookup(hostname, { all: true });

function checkAddresses(target: Target, addresses: readonly LookupAddress[], allowed: BlockList): LookupAddress[] {
  if (addresses.length === 0) throw new OutboundRefusedError(`${target.host} has no address`);
  for (const { address } of addresses) {
    if (isSpecialUseAddress(address, allowed)) {
      throw new OutboundRefusedError(address === target.host ? `${address} is a special-use address` : `${target.host} resolves to special-use address ${address}`);
    }
  }
  // The family is recomputed from the text: the socket must not be told a different one.
  return addresses.map(({ address }) => ({ address, family: isIP(address) }));
}

/** An IP-literal host, checked; undefined for a name, which needs resolving. */
function checkLiteral(target: Target, allowed: BlockList): LookupAddress[] | undefined {
  const family = isIP(target.host);
  return family === 0 ? undefined : checkAddresses(target, [{ address: target.host, family }], allowed);
}

/**
 * Answers the socket's lookup with the addresses already checked, whatever it asks. With
 * `all` (node 20's happy-eyeballs connect asks for it) it gets all of them, each checked.
 */
function pinTo(addresses: readonly LookupAddress[]): LookupFunction {
  return (_hostname: string, options: LookupOptions, callback) => {
    const wanted = options.family === 4 || options.family === 6 ? addresses.filter((a) => a.family === options.family) : addresses;
    const first = wanted[0];
    if (!first) {
      const error: NodeJS.ErrnoException = new Error(`no checked address of family ${String(options.family)}`);
      error.code = 'ENOTFOUND';
      callback(error, '');
    } else if (options.all) callback(null, [...wanted]);
    else callback(null, first.address, first.family);
  };
}

async function encodeBody(body: BodyInput): Promise<{ bytes: Uint8Array | undefined; contentType: string | null }> {
  if (body === null || body === undefined) return { bytes: undefined, contentType: null };
  if (typeof body === 'string') return { bytes: new TextEncoder().encode(body), contentType: 'text/plain;charset=UTF-8' };
  if (body instanceof URLSearchParams) return { bytes: new TextEncoder().encode(body.toString()), contentType: 'application/x-www-form-urlencoded;charset=UTF-8' };
  if (body instanceof Uint8Array) return { bytes: body, contentType: null };
  if (body instanceof ArrayBuffer) return { bytes: new Uint8Array(body), contentType: null };
  // A stream or a Blob: Response knows how fetch reads each, and a Blob's type.
  const wrapped = new Response(body);
  return { bytes: new Uint8Array(await wrapped.arrayBuffer()), contentType: wrapped.headers.get('content-type') };
}

function buildRequestHeaders(init: OutboundInit, contentType: string | null): Record<string, string> {
  const headers = new Headers(init.headers);
  for (const name of CALLER_FORBIDDEN_HEADERS) headers.delete(name);
  if (contentType !== null && !headers.has('content-type')) headers.set('content-type', contentType);
  // Without Accept-Encoding any coding is acceptable (RFC 9110 §12.5.3); name the ones decoded below.
  if (!headers.has('accept-encoding')) headers.set('accept-encoding', 'gzip, deflate, br');
  if (!headers.has('user-agent')) headers.set('user-agent', 'orgauth');
  const out: Record<string, string> = {};
  headers.forEach((value, name) => (out[name] = value));
  return out;
}

const PEM_CERTIFICATE = /-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+?-----END CERTIFICATE-----/g;

/**
 * The certificates of a PEM file, each parsed (so a damaged one fails here, at start-up, not at
 * the first handshake). Throws when the file cannot be read or holds no certificate.
 */
export function readCaBundle(file: string): string[] {
  const pem = readFileSync(file, 'utf8');
  const certificates = pem.match(PEM_CERTIFICATE) ?? [];
  if (certificates.length === 0) throw new Error(`${file} holds no PEM certificate`);
  for (const certificate of certificates) new X509Certificate(certificate);
  return certificates;
}

const gunzip = promisify(zlib.gunzip);
const inflate = promisify(zlib.inflate);
const inflateRaw = promisify(zlib.inflateRaw);
const brotliDecompress = promisify(zlib.brotliDecompress);

/**
 * Undoes the content codings fetch undoes, with the output bounded: a few kilobytes of gzip can
 * expand to gigabytes. Returns undefined for a coding it does not know, leaving the body raw.
 */
async function decodeContent(body: Buffer, encoding: string, maxBytes: number): Promise<Buffer | undefined> {
  const codings = encoding.split(',').map((c) => c.trim().toLowerCase()).filter((c) => c !== '' && c !== 'identity');
  let decoded = body;
  try {
    for (const coding of codings.reverse()) {
      const options = { maxOutputLength: Math.max(maxBytes, 1) };
      if (coding === 'gzip' || coding === 'x-gzip') decoded = await gunzip(decoded, options);
      // "deflate" should be zlib-wrapped, but servers send raw deflate too; fetch tells them apart the same way.
      else if (coding === 'deflate') decoded = await (((decoded[0] ?? 0) & 0x0f) === 0x08 ? inflate : inflateRaw)(decoded, options);
      else if (coding === 'br') decoded = await brotliDecompress(decoded, options);
      else return undefined;
    }
  } catch (error) {
    if (error instanceof RangeError) throw new OutboundRefusedError('response too large');
    throw error;
  }
  if (decoded.length > maxBytes) throw new OutboundRefusedError('response too large');
  return decoded;
}

function send(
  target: Target,
  addresses: readonly LookupAddress[],
  method: string,
  headers: Record<string, string>,
  bytes: Uint8Array | undefined,
  signal: AbortSignal,
  secureContext: tls.SecureContext | undefined,
): Promise<http.IncomingMessage> {
  return new Promise((resolve, reject) => {
    const client = target.url.protocol === 'https:' ? https : http;
    const request = client.request({
      protocol: target.url.protocol,
      hostname: target.host,
      port: target.url.port || undefined,
      path: `${target.url.pathname}${target.url.search}`,
      method,
      headers,
      lookup: pinTo(addresses),
      agent: false,
      signal,
      ...(secureContext !== undefined && target.url.protocol === 'https:' ? { secureContext } : {}),
    });
    request.once('response', resolve);
    // `on`, not `once`: a socket error after the response must not become an uncaught 'error'.
    request.on('error', (error) => reject(signal.aborted ? signal.reason : error));
    if (bytes !== undefined) request.setHeader('content-length', bytes.length);
    request.end(bytes);
  });
}

async function readBody(response: http.IncomingMessage, maxBytes: number, signal: AbortSignal): Promise<Buffer> {
  const declared = Number(response.headers['content-length']);
  if (Number.isFinite(declared) && declared > maxBytes) {
    response.destroy();
    throw new OutboundRefusedError('response too large');
  }
  const onAbort = (): void => {
    response.destroy(signal.reason instanceof Error ? signal.reason : new Error('aborted'));
  };
  signal.addEventListener('abort', onAbort, { once: true });
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of response) {
      if (!Buffer.isBuffer(chunk)) continue;
      size += chunk.length;
      if (size > maxBytes) {
        response.destroy();
        throw new OutboundRefusedError('response too large');
      }
      chunks.push(chunk);
    }
  } catch (error) {
    if (signal.aborted && !(error instanceof OutboundRefusedError)) throw signal.reason;
    throw error;
  } finally {
    signal.removeEventListener('abort', onAbort);
  }
  return Buffer.concat(chunks);
}

async function buildResponse(message: http.IncomingMessage, method: string, maxBytes: number, signal: AbortSignal): Promise<Response> {
  const status = message.statusCode ?? 0;
  if (status < 200 || status > 599) {
    message.destroy();
    throw new OutboundRefusedError(`unusable status ${status}`);
  }
  const headers = new Headers();
  const raw = message.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) headers.append(raw[i] ?? '', raw[i + 1] ?? '');

  let body: Buffer | null = null;
  if (method === 'HEAD' || NULL_BODY_STATUSES.has(status)) message.destroy();
  else {
    body = await readBody(message, maxBytes, signal);
    const encoding = headers.get('content-encoding');
    if (encoding !== null && body.length > 0) {
      const decoded = await decodeContent(body, encoding, maxBytes);
      if (decoded !== undefined) {
        body = decoded;
        // The Response holds the decoded bytes; these two described the coded ones.
        headers.delete('content-encoding');
        headers.delete('content-length');
      }
    }
  }
  const init = { status, headers };
  // A copy typed Uint8Array<ArrayBuffer>, as BodyInit wants; at most maxBytes.
  const bytes = body === null ? null : new Uint8Array(body);
  try {
    return new Response(bytes, { ...init, statusText: message.statusMessage ?? '' });
  } catch {
    // A reason phrase fetch would not accept; the status is what callers read.
    return new Response(bytes, init);
  }
}

/**
 * Creates the guarded fetch for one policy. Same shape as fetch, so it plugs into openid-client
 * as `config[client.customFetch]`. Policy refusals reject with OutboundRefusedError; the deadline
 * rejects with a DOMException named "TimeoutError" (as fetch with AbortSignal.timeout does); the
 * caller's own signal rejects with its reason.
 */
export function createOutboundFetch(policy: OutboundPolicy, options: OutboundOptions = {}): OutboundFetch {
  const allowed = parseNetworks(policy.allowedNetworks);
  const resolve = options.lookup ?? defaultResolve;
  // Built once, not at each connection: a context parses every root certificate (some 30 ms of
  // CPU a request when `ca` was passed to each one). `ca` replaces node's trust store, so the
  // bundled roots come along.
  const secureContext = policy.caFile ? tls.createSecureContext({ ca: [...tls.rootCertificates, ...readCaBundle(policy.caFile)] }) : undefined;

  return async (input, init = {}) => {
    const target = checkUrl(input, policy);
    // Before anything asynchronous, even before an already-aborted signal is honoured: the tests
    // prove the refusal of private literals (169.254.169.254, 10.0.0.1) with an aborted signal,
    // so that a regression in the check fails them without sending a packet to such an address.
    const literal = checkLiteral(target, allowed);
    const deadline = new AbortController();
    const timer = setTimeout(
      () => deadline.abort(new DOMException(`outbound request to ${target.url.origin} timed out after ${policy.timeoutMs} ms`, 'TimeoutError')),
      policy.timeoutMs,
    );
    const signal = init.signal ? AbortSignal.any([init.signal, deadline.signal]) : deadline.signal;
    try {
      signal.throwIfAborted();
      const addresses = literal ?? checkAddresses(target, await raceAbort(resolve(target.host), signal), allowed);
      const upper = (init.method ?? 'GET').toUpperCase();
      const method = NORMALIZED_METHODS.has(upper) ? upper : (init.method ?? 'GET');
      const { bytes, contentType } = await encodeBody(init.body);
      const headers = buildRequestHeaders(init, contentType);
      const message = await send(target, addresses, method, headers, bytes, signal, secureContext);
      if (init.redirect === 'error' && REDIRECT_STATUSES.has(message.statusCode ?? 0)) {
        message.destroy();
        throw new OutboundRefusedError(`redirect to ${message.headers.location ?? '(no location)'} refused`);
      }
      return await buildResponse(message, method, policy.maxBytes, signal);
    } finally {
      clearTimeout(timer);
    }
  };
}
