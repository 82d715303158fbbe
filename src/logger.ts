import { createRequire } from 'node:module';
import { pino, type DestinationStream, type Logger } from 'pino';
import type { Config } from './config.js';

/** pino-pretty, loaded only for pretty logs (a server writing JSON to a pipe never needs it). */
const prettyStream = (options: import('pino-pretty').PrettyOptions) => (createRequire(import.meta.url)('pino-pretty') as typeof import('pino-pretty')).build(options);

/** Fields that hold secrets wherever they appear in a logged object. */
export const SECRET_FIELDS = [
  'password', 'current_password', 'new_password', 'client_secret', 'code_verifier', 'refresh_token', 'access_token', 'token', 'csrf_token',
  'secret_key', 'secretKey',
  // RFC 8628: the device's polling secret, and the code a person types on /device (in its URL too).
  'device_code', 'user_code',
];

/** Request headers that carry credentials. */
const SECRET_HEADERS = ['authorization', 'proxy-authorization', 'cookie', 'set-cookie'];

/**
 * `code` is an authorization code in a form, a query or a logged object's top level, but an
 * error code (ECONNREFUSED, 23505) on an error object, which the logs must keep: it is masked
 * only where requests carry it.
 */
const REQUEST_PARTS = ['body', 'query', 'form', 'params'];
const SECRET_KEYS = new Set([...SECRET_FIELDS, ...SECRET_HEADERS, 'id_token', 'client_assertion']);
const CODE_PARENTS = new Set([...REQUEST_PARTS, 'payload', '']);
/** Top-level keys with a serializer of their own below: they are not walked here. */
const SERIALIZED_KEYS = new Set(['req', 'res', 'err']);
/** A request body as text (a form, say) is masked whole: its fields cannot be told apart. */
const RAW_BODY_KEYS = new Set(['body', 'payload', 'rawBody']);

/**
 * A copy of what an error carries with every secret field masked, at any depth: redact paths
 * have fixed depths, and an error may carry a request's body, query or headers anywhere (as
 * properties, or in a `cause` that is not an Error). `code` is masked only inside a request part,
 * so error codes (ECONNREFUSED, 23505) stay; a body carried as text is masked whole.
 */
function scrub(value: unknown, parentKey: string, depth: number, seen: WeakSet<object>): unknown {
  if (typeof value !== 'object' || value === null) return value;
  if (ArrayBuffer.isView(value)) return `[${value.byteLength} bytes]`;
  if (depth > 10 || seen.has(value)) return '[...]';
  seen.add(value);
  if (Array.isArray(value)) return value.map((item) => scrub(item, parentKey, depth + 1, seen));
  const copy: Record<string, unknown> = {};
  for (const [key, item] of Object.entries(value)) copy[key] = scrubField(key, item, parentKey, depth, seen);
  return copy;
}

/** One field of an object whose key is `parentKey`: masked if its name says secret, else scrubbed. */
function scrubField(key: string, item: unknown, parentKey: string, depth = 0, seen = new WeakSet<object>()): unknown {
  const secret =
    SECRET_KEYS.has(key.toLowerCase()) || (key === 'code' && CODE_PARENTS.has(parentKey)) || (RAW_BODY_KEYS.has(key) && typeof item === 'string');
  return secret ? '[redacted]' : scrub(item, key, depth + 1, seen);
}

/** Query parameters whose values never reach a log line (a token sent in a URL, a code in a redirect). */
const SECRET_QUERY_PARAMS = new Set([...SECRET_FIELDS, 'code', 'id_token', 'client_assertion']);

/** Paths that carry a secret in a segment: a setup link's token (`/setup/<token>/...`, accounts/setup-links.ts). */
const SECRET_PATH = /^\/setup\/[^/?#]+/;

/** The URL as logged: path and query, with a secret path segment and the values of secret query parameters masked. */
export function maskUrl(logged: string): string {
  const url = logged.replace(SECRET_PATH, '/setup/[redacted]');
  const q = url.indexOf('?');
  if (q === -1) return url;
  const query = url
    .slice(q + 1)
    .split('&')
    .map((pair) => {
      const eq = pair.indexOf('=');
      const rawName = eq === -1 ? pair : pair.slice(0, eq);
      let name = rawName;
      try {
        name = decodeURIComponent(rawName.replace(/\+/g, ' '));
      } catch {
        // A malformed name is logged as sent.
      }
      if (eq === -1) return pair;
      if (SECRET_QUERY_PARAMS.has(name)) return `${rawName}=[redacted]`;
      // A page to come back to after sign-in may itself carry a token (an invitation link).
      if (name === 'return_to') {
        try {
          return `${rawName}=${encodeURIComponent(maskUrl(decodeURIComponent(pair.slice(eq + 1).replace(/\+/g, ' '))))}`;
        } catch {
          return `${rawName}=[redacted]`;
        }
      }
      return pair;
    });
  return `${url.slice(0, q)}?${query.join('&')}`;
}

interface LoggedRequest {
  method?: string;
  url?: string;
  host?: string;
  ip?: string;
  socket?: { remotePort?: number };
}

/**
 * Whether the logs are pretty: LOG_FORMAT pretty or json, or (auto) whether standard output is a
 * terminal — a person reading `npm start`, not a log collector reading a pipe.
 */
export function prettyLogs(format: Config['logFormat'], terminal = process.stdout.isTTY === true): boolean {
  return format === 'pretty' || (format === 'auto' && terminal);
}

/**
 * pino-pretty in this process (not a transport's worker thread: a line is written when it is
 * logged, as with JSON, and nothing is lost at exit). It formats what pino wrote, after the
 * formatters and serializers below masked the secrets, so both formats hold the same masked
 * values. Colours only on a terminal.
 */
function prettyDestination(destination: DestinationStream | undefined, terminal: boolean): DestinationStream {
  return prettyStream({
    destination: destination ?? 1,
    colorize: terminal,
    translateTime: 'SYS:HH:MM:ss.l',
    // Every line says orgauth, the process is the one in the terminal, and a request's fields
    // are on the message's line: `GET /path from 127.0.0.1 incoming request`, `200 in 3.1 ms
    // request completed` (the request id beside them pairs the two).
    ignore: 'pid,hostname,service,req,res,responseTime',
    messageFormat: (log, messageKey) => {
      const req = log.req as { method?: string; url?: string; remoteAddress?: string } | undefined;
      const res = log.res as { statusCode?: number } | undefined;
      const parts: string[] = [];
      if (req?.method !== undefined) parts.push(`${req.method} ${req.url ?? ''}`);
      if (req?.remoteAddress !== undefined) parts.push(`from ${req.remoteAddress}`);
      if (res?.statusCode !== undefined) parts.push(String(res.statusCode));
      if (typeof log.responseTime === 'number') parts.push(`in ${log.responseTime.toFixed(1)} ms`);
      parts.push(String(log[messageKey] ?? ''));
      return parts.join(' ');
    },
    hideObject: false,
    singleLine: true,
    sync: true,
  });
}

/**
 * pino logs with secrets redacted, as JSON or pretty (`config.logFormat`, prettyLogs);
 * `destination` lets tests capture the lines (not a terminal), `terminal`: whether the lines go to one.
 */
export function createLogger(
  config: Pick<Config, 'logLevel'> & Partial<Pick<Config, 'logFormat'>>,
  destination?: DestinationStream,
  terminal = destination === undefined && process.stdout.isTTY === true,
): Logger {
  const pretty = prettyLogs(config.logFormat ?? 'auto', terminal);
  return pino(
    {
      level: config.logLevel,
      base: { service: 'orgauth' },
      formatters: {
        // Every logged object, at any depth, with secret fields masked. Done here, when a line is
        // written, rather than with pino's redact paths: those have fixed depths, and their
        // wildcards cost every request's child logger about 7 µs even when nothing is logged.
        log: (object) => {
          const copy: Record<string, unknown> = {};
          for (const [key, value] of Object.entries(object)) {
            copy[key] = SERIALIZED_KEYS.has(key) ? value : scrubField(key, value, '');
          }
          return copy;
        },
      },
      serializers: {
        // Fastify's request fields, with the URL's secret query values masked.
        req: (req: LoggedRequest) => ({
          method: req.method,
          url: req.url === undefined ? undefined : maskUrl(req.url),
          host: req.host,
          remoteAddress: req.ip,
          remotePort: req.socket?.remotePort,
        }),
        // Fastify's reply: its status only (as Fastify's own serializer), never its headers.
        res: (res: { statusCode?: number }) => ({ statusCode: res.statusCode }),
        err: (err: Error) => scrub(pino.stdSerializers.err(err), 'err', 0, new WeakSet()),
      },
      timestamp: pino.stdTimeFunctions.isoTime,
    },
    pretty ? prettyDestination(destination, terminal) : destination,
  );
}
