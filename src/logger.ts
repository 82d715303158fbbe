import { pino, type DestinationStream, type Logger } from 'pino';
import type { Config } from './config.js';

/** Fields that hold secrets wherever they appear in a logged object. */
export const SECRET_FIELDS = ['password', 'client_secret', 'code_verifier', 'refresh_token', 'access_token', 'token', 'secret_key', 'secretKey'];

/**
 * `code` is an authorization code in a form or query, but an error code (ECONNREFUSED, 23505)
 * on an error object, which the logs must keep: redact it only where requests carry it.
 */
const CODE_PATHS = ['code', 'body.code', 'query.code', 'form.code', 'req.body.code', 'req.query.code', 'params.code'];

export const REDACT_PATHS = [
  'req.headers.authorization',
  'req.headers["proxy-authorization"]',
  'req.headers.cookie',
  'res.headers["set-cookie"]',
  'headers.authorization',
  'headers.cookie',
  ...SECRET_FIELDS.flatMap((f) => [f, `*.${f}`, `*.*.${f}`]),
  ...CODE_PATHS,
];

/** Query parameters whose values never reach a log line (a token sent in a URL, a code in a redirect). */
const SECRET_QUERY_PARAMS = new Set([...SECRET_FIELDS, 'code', 'id_token', 'client_assertion']);

/** The URL as logged: path and query, with the values of secret query parameters masked. */
export function maskUrl(url: string): string {
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
      return eq !== -1 && SECRET_QUERY_PARAMS.has(name) ? `${rawName}=[redacted]` : pair;
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

/** pino JSON logs with secrets redacted; `destination` lets tests capture the lines. */
export function createLogger(config: Pick<Config, 'logLevel'>, destination?: DestinationStream): Logger {
  return pino(
    {
      level: config.logLevel,
      base: { service: 'orgauth' },
      redact: { paths: REDACT_PATHS, censor: '[redacted]' },
      serializers: {
        // Fastify's request fields, with the URL's secret query values masked.
        req: (req: LoggedRequest) => ({
          method: req.method,
          url: req.url === undefined ? undefined : maskUrl(req.url),
          host: req.host,
          remoteAddress: req.ip,
          remotePort: req.socket?.remotePort,
        }),
        err: pino.stdSerializers.err,
      },
      timestamp: pino.stdTimeFunctions.isoTime,
    },
    destination,
  );
}
