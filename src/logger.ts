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

/** pino JSON logs with secrets redacted; `destination` lets tests capture the lines. */
export function createLogger(config: Pick<Config, 'logLevel'>, destination?: DestinationStream): Logger {
  return pino(
    {
      level: config.logLevel,
      base: { service: 'orgauth' },
      redact: { paths: REDACT_PATHS, censor: '[redacted]' },
      timestamp: pino.stdTimeFunctions.isoTime,
    },
    destination,
  );
}
