/**
 * Configuration: the only module that reads `process.env`.
 *
 * `parseConfig(env)` is pure: it validates the variables with zod and returns a frozen Config
 * or throws ConfigError listing one line per bad variable. `loadConfig(env)` adds the I/O
 * configuration needs: the embedded database's generated SECRET_KEY in DATA_DIR, and a check
 * that OUTBOUND_CA_FILE holds certificates (the outbound client reads them when it is created).
 */
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { isIP } from 'node:net';
import path from 'node:path';
import { z } from 'zod';
import { errnoCode } from './lib/errno.js';
import { readCaBundle } from './lib/outbound.js';

export const SIGNING_ALGS = ['ES256', 'RS256', 'EdDSA'] as const;
export type SigningAlg = (typeof SIGNING_ALGS)[number];

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export const LOG_FORMATS = ['auto', 'pretty', 'json'] as const;
/**
 * PASSWORD_HASHING: argon2id's cost. `standard` (the default) is what production runs;
 * `weak-for-tests` (1 MiB, one pass) keeps a test suite that hashes thousands of passwords fast,
 * and is refused in production (NODE_ENV=production or an https ISSUER).
 */
export const PASSWORD_HASHINGS = ['standard', 'weak-for-tests'] as const;

export const DATABASE_POOLERS = ['none', 'transaction'] as const;

export type DatabaseTarget =
  | {
      kind: 'postgres';
      url: string;
      /**
       * DATABASE_LISTEN_URL: where the LISTEN connections go, each a session of its own (not
       * through a transaction pooler). Absent: `url`; always present with `pooler`.
       */
      listenUrl?: string;
      /**
       * DATABASE_POOLER 'transaction': `url` is a transaction-pooling PgBouncer, which shares each
       * PostgreSQL session between clients transaction by transaction (src/db/pooler.ts).
       */
      pooler?: 'transaction';
    }
  /** dataDir null: an in-memory database (tests only). */
  | { kind: 'pglite'; dataDir: string | null };

export interface Config {
  readonly database: DatabaseTarget;
  readonly databasePoolMax: number;
  /**
   * JOB_WORKERS: background jobs (src/jobs/) this instance runs at once; 0: none (an instance
   * that only answers requests, beside others that run the jobs). Default: 2 on PostgreSQL, 1 on
   * the embedded database (its one connection runs them one at a time anyway).
   */
  readonly jobWorkers: number;
  readonly dataDir: string;
  readonly host: string;
  readonly port: number;
  /** Prometheus metrics on this port (GET /metrics), on HOST; null: not served (the default). */
  readonly metricsPort: number | null;
  /** Public base URL without a trailing slash. */
  readonly issuer: string;
  /** Set by parseConfig only when SECRET_KEY is in the environment; loadConfig fills it otherwise. */
  readonly secretKey: string;
  readonly accessTokenTtl: number;
  readonly refreshTokenTtl: number;
  readonly authCodeTtl: number;
  /** RFC 8628: how long a device code (and its user code) waits for the user, in seconds. */
  readonly deviceCodeTtl: number;
  /** RFC 8628 §3.2 `interval`: the seconds a device waits between polls (slow_down adds 5). */
  readonly devicePollInterval: number;
  readonly refreshReuseGrace: number;
  readonly signingAlg: SigningAlg;
  readonly logLevel: (typeof LOG_LEVELS)[number];
  /** PASSWORD_HASHING (src/accounts/passwords.ts); never `weak-for-tests` in production. */
  readonly passwordHashing: (typeof PASSWORD_HASHINGS)[number];
  /** LOG_FORMAT: `pretty` (human-readable lines), `json` (one JSON object a line), or `auto`: pretty when standard output is a terminal. */
  readonly logFormat: (typeof LOG_FORMATS)[number];
  /** API requests per minute per (application, organization); 0 disables the limit. */
  readonly apiRateLimit: number;
  /** SCIM_RATE_LIMIT: SCIM requests per minute per directory (Okta and Entra ID push in bursts); 0 disables the limit. */
  readonly scimRateLimit: number;
  /** Redis for rate limits shared by every instance; null keeps them in memory, per instance. */
  readonly redisUrl: string | null;
  /** Passed to Fastify's trustProxy: false, true, or the proxies' addresses/CIDR ranges. */
  readonly trustProxy: boolean | string[];
  /** Seconds between deletions of expired codes, refresh tokens, revocations and sessions (src/retention.ts); 0: never. */
  readonly cleanupInterval: number;
  /** ACTIVITY_FLUSH_INTERVAL: seconds between writes of the activity counted in memory (src/activity.ts). */
  readonly activityFlushInterval: number;
  /** SIGNING_KEY_ROTATION_DAYS: the Overview asks owners to have a signing key older than this rotated; 0: never. */
  readonly signingKeyRotationDays: number;
  readonly mail: MailConfig;
  /** DNS_SERVERS: the resolvers domain verification asks (`host:port`); empty: the system's. */
  readonly dnsServers: readonly string[];
  readonly outbound: OutboundConfig;
  readonly clientRegistration: ClientRegistrationConfig;
  readonly clientMetadata: ClientMetadataConfig;
  readonly webhooks: WebhooksConfig;
  readonly dpop: DpopConfig;
}

/** DPoP (RFC 9449) proofs at the token endpoint, PAR and the API (src/oauth/models/dpop-proofs.ts). */
export interface DpopConfig {
  /** DPOP_REQUIRE_NONCE=1: every proof must carry a server nonce (RFC 9449 §8, §9); the first request of a client then costs a round trip more. */
  readonly requireNonce: boolean;
  /** DPOP_PROOF_MAX_AGE: seconds a proof is accepted after its iat (and its jti remembered); 5 s of clock skew is allowed ahead. */
  readonly proofMaxAge: number;
}

/** Signed webhooks (src/webhooks/). */
export interface WebhooksConfig {
  /**
   * WEBHOOK_ALLOW_PRIVATE=1: endpoints may be plain http and on loopback or private addresses
   * (development and tests only); otherwise https to public addresses only.
   */
  readonly allowPrivate: boolean;
  /**
   * WEBHOOK_RETRY_DELAYS: seconds before each retry after a failed attempt, comma separated; the
   * default spreads eleven retries over about three days. Tests shorten it.
   */
  readonly retryDelaysSeconds: readonly number[];
}

/** The default retry schedule: 5 s, 1 min, 5 min, 30 min, 1 h, 2 h, 5 h, 10 h, 14 h, 20 h, 24 h (≈ 3.2 days in all). */
export const DEFAULT_WEBHOOK_RETRY_DELAYS = [5, 60, 300, 1800, 3600, 7200, 18000, 36000, 50400, 72000, 86400] as const;

/** Client ID metadata documents, fetched for anonymous requests to /oauth/authorize (src/oauth/models/client-metadata.ts). */
export interface ClientMetadataConfig {
  /**
   * CLIENT_METADATA_ALLOW_NETWORKS: CIDR ranges a metadata document may be fetched from although
   * special-use (tests on loopback). Not OUTBOUND_ALLOW_NETWORKS: that one opens the company
   * network to upstreams an administrator configured, this one to URLs anyone may send.
   */
  readonly allowedNetworks: readonly string[];
  /** CLIENT_METADATA_MAX_CLIENTS: metadata-document clients that have not obtained a token yet, at once. */
  readonly maxClients: number;
}

export const CLIENT_REGISTRATION_MODES = ['open', 'token', 'off'] as const;

/** RFC 7591 dynamic client registration at POST /oauth/register (src/oauth/endpoints/register.ts). */
export interface ClientRegistrationConfig {
  /** CLIENT_REGISTRATION: open to anyone (the default), only with the initial access token, or off (404). */
  readonly mode: (typeof CLIENT_REGISTRATION_MODES)[number];
  /** CLIENT_REGISTRATION_TOKEN: the initial access token (RFC 7591 §3) a registration must carry as a Bearer token; mode token only. */
  readonly initialAccessToken: string | null;
  /** CLIENT_REGISTRATION_RATE_LIMIT: registrations per client address per hour; 0: no limit. */
  readonly perAddressPerHour: number;
  /** CLIENT_REGISTRATION_MAX_CLIENTS: dynamically registered clients that may exist at once. */
  readonly maxClients: number;
  /** UNUSED_CLIENT_TTL: seconds after which a self-registered client that never obtained a token is deleted (src/retention.ts). */
  readonly unusedClientTtl: number;
}

/** The one guarded client for URLs someone else chose (src/lib/outbound.ts, AG-1). */
export interface OutboundConfig {
  /** Plain http only in development (an http ISSUER, NODE_ENV not production). */
  readonly allowHttp: boolean;
  /** OUTBOUND_ALLOW_NETWORKS: CIDR ranges reachable although special-use (an IdP on the company network; tests on loopback). */
  readonly allowedNetworks: readonly string[];
  readonly timeoutMs: number;
  readonly maxBytes: number;
  /**
   * OUTBOUND_CA_FILE: a PEM file of certificate authorities trusted for outbound https besides
   * node's bundled roots (a company CA; the tests' CA). Null: the bundled roots alone.
   */
  readonly caFile: string | null;
}

export interface MailConfig {
  /** SMTP_URL (smtp://user:pass@host:port, smtps://…); null: messages go to the log (and /dev/outbox). */
  readonly smtpUrl: string | null;
  /** MAIL_FROM: the From header, an address or `Name <address>`. */
  readonly from: string;
  /**
   * Whether GET /dev/outbox shows the messages that were logged instead of sent: only without
   * SMTP_URL, on the embedded database, and not in production (NODE_ENV=production or an https ISSUER).
   */
  readonly devOutbox: boolean;
}

/** Thrown when the environment is invalid; `problems` holds one line per bad variable. */
export class ConfigError extends Error {
  constructor(
    readonly problems: string[],
    options?: ErrorOptions,
  ) {
    super(problems.join('\n'), options);
    this.name = 'ConfigError';
  }
}

export const SECRET_KEY_MIN_LENGTH = 32;
const SECRET_KEY_FILE = 'secret_key';

/** Empty strings count as unset, as in most .env tooling. */
const optional = <T extends z.ZodType>(schema: T) =>
  z.preprocess((v) => (v === '' ? undefined : v), schema.optional());

/** A whole number in [min, max], written in decimal digits only. */
const wholeNumber = (min: number, max: number, message: string) =>
  z
    .string()
    .regex(/^[0-9]{1,15}$/, message)
    .transform(Number)
    .pipe(z.number().min(min, message).max(max, message));

const MAX_TTL = 10 * 365 * 24 * 3600;
const seconds = (max = MAX_TTL) => wholeNumber(1, max, `must be a whole number of seconds between 1 and ${max}`);

const envSchema = z
  .object({
  DATABASE_URL: optional(
    z.string().refine((v) => /^postgres(ql)?:\/\//.test(v) && URL.canParse(v), {
      message: 'must be a postgres:// or postgresql:// connection URL',
    }),
  ),
  DATABASE_POOL_MAX: optional(wholeNumber(1, 1000, 'must be a whole number between 1 and 1000')),
  JOB_WORKERS: optional(wholeNumber(0, 32, 'must be a whole number between 0 and 32')),
  DATABASE_LISTEN_URL: optional(
    z.string().refine((v) => /^postgres(ql)?:\/\//.test(v) && URL.canParse(v), {
      message: 'must be a postgres:// or postgresql:// connection URL',
    }),
  ),
  DATABASE_POOLER: optional(z.enum(DATABASE_POOLERS, { error: `must be one of ${DATABASE_POOLERS.join(', ')}` })),
  DATA_DIR: optional(z.string()),
  HOST: optional(z.string().refine((v) => isIP(v) !== 0 || /^[a-zA-Z0-9.-]+$/.test(v), 'must be an IP address or host name')),
  PORT: optional(wholeNumber(0, 65535, 'must be a port number between 0 and 65535')),
  METRICS_PORT: optional(wholeNumber(1, 65535, 'must be a port number between 1 and 65535')),
  ISSUER: optional(
    z.string().refine(isValidIssuer, {
      message: 'must be an absolute http(s) URL without path, query, fragment or user info',
    }),
  ),
  SECRET_KEY: optional(z.string().min(SECRET_KEY_MIN_LENGTH, `must be at least ${SECRET_KEY_MIN_LENGTH} characters`)),
  ACCESS_TOKEN_TTL: optional(seconds()),
  REFRESH_TOKEN_TTL: optional(seconds()),
  AUTH_CODE_TTL: optional(seconds(600)),
  DEVICE_CODE_TTL: optional(wholeNumber(60, 3600, 'must be a whole number of seconds between 60 and 3600')),
  DEVICE_POLL_INTERVAL: optional(wholeNumber(1, 60, 'must be a whole number of seconds between 1 and 60')),
  REFRESH_REUSE_GRACE: optional(wholeNumber(0, 3600, 'must be a whole number of seconds between 0 and 3600')),
  CLEANUP_INTERVAL: optional(wholeNumber(0, 7 * 24 * 3600, 'must be a whole number of seconds between 0 and 604800 (0 disables the cleanup)')),
  ACTIVITY_FLUSH_INTERVAL: optional(wholeNumber(1, 300, 'must be a whole number of seconds between 1 and 300')),
  SIGNING_KEY_ROTATION_DAYS: optional(wholeNumber(0, 3650, 'must be a whole number of days between 0 and 3650 (0: no reminder)')),
  DPOP_REQUIRE_NONCE: optional(z.enum(['0', '1', 'true', 'false'], { error: 'must be 1 or 0 (true or false)' })),
  DPOP_PROOF_MAX_AGE: optional(wholeNumber(10, 600, 'must be a whole number of seconds between 10 and 600')),
  SIGNING_ALG: optional(z.enum(SIGNING_ALGS, { error: `must be one of ${SIGNING_ALGS.join(', ')}` })),
  LOG_LEVEL: optional(z.enum(LOG_LEVELS, { error: `must be one of ${LOG_LEVELS.join(', ')}` })),
  PASSWORD_HASHING: optional(z.enum(PASSWORD_HASHINGS, { error: `must be one of ${PASSWORD_HASHINGS.join(', ')}` })),
  LOG_FORMAT: optional(z.enum(LOG_FORMATS, { error: `must be one of ${LOG_FORMATS.join(', ')}` })),
  API_RATE_LIMIT: optional(wholeNumber(0, 1_000_000, 'must be a whole number of requests per minute (0 disables the limit)')),
  SCIM_RATE_LIMIT: optional(wholeNumber(0, 1_000_000, 'must be a whole number of requests per minute (0 disables the limit)')),
  REDIS_URL: optional(
    z.string().refine((v) => /^rediss?:\/\//.test(v) && URL.canParse(v), { message: 'must be a redis:// or rediss:// URL' }),
  ),
  SMTP_URL: optional(
    z.string().refine((v) => /^smtps?:\/\/[^/?#]+(\/?|\/?\?[^#]*)$/.test(v) && URL.canParse(v), {
      message: 'must be an smtp:// or smtps:// URL (smtp://user:password@host:port)',
    }),
  ),
  MAIL_FROM: optional(
    z.string().max(320).refine((v) => MAIL_FROM_PATTERN.test(v), { message: 'must be an email address or "Name <address>"' }),
  ),
  NODE_ENV: optional(z.string()),
  DNS_SERVERS: optional(
    z.string().refine((v) => parseDnsServers(v) !== undefined, { message: 'must be a comma-separated list of resolvers, each an IP address with an optional port (1.1.1.1, 127.0.0.1:5353, [::1]:53)' }),
  ),
  OUTBOUND_ALLOW_NETWORKS: optional(
    z.string().refine((v) => parseAddressList(v) !== undefined, { message: 'must be a comma-separated list of IP addresses/CIDR ranges' }),
  ),
  CLIENT_REGISTRATION: optional(z.enum(CLIENT_REGISTRATION_MODES, { error: `must be one of ${CLIENT_REGISTRATION_MODES.join(', ')}` })),
  CLIENT_REGISTRATION_TOKEN: optional(
    z
      .string()
      .min(SECRET_KEY_MIN_LENGTH, `must be at least ${SECRET_KEY_MIN_LENGTH} characters (e.g. from \`openssl rand -base64 32\`)`)
      .max(1000, 'must be at most 1000 characters')
      .regex(/^[\x21-\x7e]+$/, 'must be printable ASCII without spaces (it travels in an Authorization header)'),
  ),
  CLIENT_REGISTRATION_RATE_LIMIT: optional(wholeNumber(0, 1_000_000, 'must be a whole number of registrations per address per hour (0 disables the limit)')),
  CLIENT_REGISTRATION_MAX_CLIENTS: optional(wholeNumber(1, 10_000_000, 'must be a whole number between 1 and 10000000')),
  UNUSED_CLIENT_TTL: optional(wholeNumber(60, 365 * 24 * 3600, 'must be a whole number of seconds between 60 and 31536000')),
  OUTBOUND_CA_FILE: optional(z.string().refine((v) => !v.includes('\u0000'), { message: 'must be a file path' })),
  CLIENT_METADATA_ALLOW_NETWORKS: optional(
    z.string().refine((v) => parseAddressList(v) !== undefined, { message: 'must be a comma-separated list of IP addresses/CIDR ranges' }),
  ),
  WEBHOOK_ALLOW_PRIVATE: optional(z.enum(['0', '1', 'true', 'false'], { error: 'must be 1 or 0' })),
  WEBHOOK_RETRY_DELAYS: optional(
    z.string().refine((v) => parseDelays(v) !== undefined, { message: 'must be a comma-separated list of 1 to 20 whole numbers of seconds, each between 1 and 604800' }),
  ),
  CLIENT_METADATA_MAX_CLIENTS: optional(wholeNumber(1, 10_000_000, 'must be a whole number between 1 and 10000000')),
  TRUST_PROXY: optional(
    z.string().refine((v) => parseTrustProxy(v) !== undefined, {
      message: 'must be true, false or a comma-separated list of IP addresses/CIDR ranges of the proxies',
    }),
  ),
  })
  .superRefine((env, ctx) => {
    if (env.CLIENT_REGISTRATION === 'token' && env.CLIENT_REGISTRATION_TOKEN === undefined) {
      ctx.addIssue({ code: 'custom', path: ['CLIENT_REGISTRATION_TOKEN'], message: 'required with CLIENT_REGISTRATION=token (at least 32 characters)' });
    }
    if (env.CLIENT_REGISTRATION !== 'token' && env.CLIENT_REGISTRATION_TOKEN !== undefined) {
      ctx.addIssue({ code: 'custom', path: ['CLIENT_REGISTRATION_TOKEN'], message: 'only with CLIENT_REGISTRATION=token' });
    }
    if (env.DATABASE_URL !== undefined && env.SECRET_KEY === undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['SECRET_KEY'],
        message: `required when DATABASE_URL is set (at least ${SECRET_KEY_MIN_LENGTH} characters, e.g. from \`openssl rand -base64 48\`)`,
      });
    }
    // Both say how DATABASE_URL reaches PostgreSQL: without it they would be silently ignored.
    if (env.DATABASE_URL === undefined) {
      if (env.DATABASE_LISTEN_URL !== undefined) ctx.addIssue({ code: 'custom', path: ['DATABASE_LISTEN_URL'], message: 'only with DATABASE_URL' });
      if (env.DATABASE_POOLER === 'transaction') ctx.addIssue({ code: 'custom', path: ['DATABASE_POOLER'], message: 'transaction only with DATABASE_URL' });
    } else if (env.DATABASE_POOLER === 'transaction' && env.DATABASE_LISTEN_URL === undefined) {
      // LISTEN through a transaction pooler succeeds and then hears nothing (src/db/pooler.ts).
      ctx.addIssue({
        code: 'custom',
        path: ['DATABASE_LISTEN_URL'],
        message: 'required with DATABASE_POOLER=transaction: LISTEN needs a session of its own (PostgreSQL directly, or a PgBouncer database in session mode)',
      });
    }
  });

const MAIL_FROM_PATTERN = /^(?:[^\r\n<>"]*<[^\s@<>]+@[^\s@<>]+>|"[^\r\n"]*" ?<[^\s@<>]+@[^\s@<>]+>|[^\s@<>]+@[^\s@<>]+)$/;

function isValidIssuer(value: string): boolean {
  if (!URL.canParse(value)) return false;
  const url = new URL(value);
  return (
    (url.protocol === 'https:' || url.protocol === 'http:') &&
    // RFC 8414 §3: metadata lives at /.well-known/... of the issuer; we serve it at the root only.
    url.pathname === '/' &&
    url.search === '' &&
    url.hash === '' &&
    url.username === '' &&
    url.password === '' &&
    !value.includes('#') &&
    !value.includes('?')
  );
}

function parseTrustProxy(value: string): Config['trustProxy'] | undefined {
  const v = value.trim().toLowerCase();
  if (v === 'true') return true;
  if (v === 'false') return false;
  return parseAddressList(value);
}

/** Resolvers as node:dns setServers takes them: `1.1.1.1`, `1.1.1.1:53`, `[::1]:53`. */
function parseDnsServers(value: string): string[] | undefined {
  const parts = value.split(',').map((p) => p.trim());
  const valid = parts.every((p) => {
    const match = /^(?:\[([0-9a-fA-F:.]+)\]|([0-9.]+))(?::([0-9]{1,5}))?$/.exec(p) ?? /^([0-9a-fA-F:]+)()()$/.exec(p);
    if (!match) return false;
    const address = match[1] || match[2] || '';
    const port = match[3];
    return isIP(address) !== 0 && (port === undefined || port === '' || (Number(port) >= 1 && Number(port) <= 65535));
  });
  return valid ? parts : undefined;
}

/** A comma-separated list of IP addresses and CIDR ranges. */
function parseDelays(value: string): number[] | undefined {
  const parts = value.split(',').map((p) => p.trim());
  if (parts.length < 1 || parts.length > 20 || parts.some((p) => !/^[0-9]{1,6}$/.test(p))) return undefined;
  const delays = parts.map(Number);
  return delays.every((d) => d >= 1 && d <= 604_800) ? delays : undefined;
}

function parseAddressList(value: string): string[] | undefined {
  const parts = value.split(',').map((p) => p.trim());
  const valid = parts.every((p) => {
    const [addr, bits, ...rest] = p.split('/');
    if (rest.length > 0 || addr === undefined || isIP(addr) === 0) return false;
    if (bits === undefined) return true;
    return /^[0-9]{1,3}$/.test(bits) && Number(bits) <= (isIP(addr) === 4 ? 32 : 128);
  });
  return valid ? parts : undefined;
}

/**
 * Validates the environment. Pure apart from reading `env`: it never touches the file system.
 * When SECRET_KEY is unset on the embedded database, `secretKey` is '' and loadConfig fills it.
 */
export function parseConfig(env: NodeJS.ProcessEnv): Config {
  const parsed = envSchema.safeParse(env);
  if (!parsed.success) {
    const problems = new Map<string, string>();
    for (const issue of parsed.error.issues) {
      const name = String(issue.path[0] ?? 'environment');
      if (!problems.has(name)) problems.set(name, `${name}: ${issue.message}`);
    }
    throw new ConfigError([...problems.values()]);
  }
  const e = parsed.data;
  const port = e.PORT ?? 3000;
  const dataDir = path.resolve(e.DATA_DIR ?? './data');
  const issuer = (e.ISSUER ?? `http://localhost:${port}`).replace(/\/+$/, '');
  const production = e.NODE_ENV === 'production' || issuer.startsWith('https:');
  if (production && e.PASSWORD_HASHING === 'weak-for-tests') {
    throw new ConfigError(['PASSWORD_HASHING: weak-for-tests is for test suites only and is refused in production (NODE_ENV=production or an https ISSUER)']);
  }
  return Object.freeze({
    database: e.DATABASE_URL
      ? {
          kind: 'postgres',
          url: e.DATABASE_URL,
          ...(e.DATABASE_LISTEN_URL !== undefined ? { listenUrl: e.DATABASE_LISTEN_URL } : {}),
          ...(e.DATABASE_POOLER === 'transaction' ? { pooler: 'transaction' as const } : {}),
        }
      : { kind: 'pglite', dataDir: path.join(dataDir, 'pgdata') },
    databasePoolMax: e.DATABASE_POOL_MAX ?? 10,
    jobWorkers: e.JOB_WORKERS ?? (e.DATABASE_URL ? 2 : 1),
    dataDir,
    host: e.HOST ?? '127.0.0.1',
    port,
    metricsPort: e.METRICS_PORT ?? null,
    issuer,
    secretKey: e.SECRET_KEY ?? '',
    accessTokenTtl: e.ACCESS_TOKEN_TTL ?? 31_536_000,
    refreshTokenTtl: e.REFRESH_TOKEN_TTL ?? 31_536_000,
    authCodeTtl: e.AUTH_CODE_TTL ?? 60,
    deviceCodeTtl: e.DEVICE_CODE_TTL ?? 600,
    devicePollInterval: e.DEVICE_POLL_INTERVAL ?? 5,
    refreshReuseGrace: e.REFRESH_REUSE_GRACE ?? 10,
    signingAlg: e.SIGNING_ALG ?? 'ES256',
    logLevel: e.LOG_LEVEL ?? 'info',
    passwordHashing: e.PASSWORD_HASHING ?? 'standard',
    logFormat: e.LOG_FORMAT ?? 'auto',
    apiRateLimit: e.API_RATE_LIMIT ?? 600,
    scimRateLimit: e.SCIM_RATE_LIMIT ?? 2000,
    redisUrl: e.REDIS_URL ?? null,
    trustProxy: e.TRUST_PROXY === undefined ? false : (parseTrustProxy(e.TRUST_PROXY) ?? false),
    cleanupInterval: e.CLEANUP_INTERVAL ?? 600,
    activityFlushInterval: e.ACTIVITY_FLUSH_INTERVAL ?? 5,
    signingKeyRotationDays: e.SIGNING_KEY_ROTATION_DAYS ?? 90,
    mail: {
      smtpUrl: e.SMTP_URL ?? null,
      from: e.MAIL_FROM ?? `orgauth <no-reply@${new URL(issuer).hostname}>`,
      devOutbox: e.SMTP_URL === undefined && e.DATABASE_URL === undefined && !production,
    },
    dnsServers: e.DNS_SERVERS === undefined ? [] : (parseDnsServers(e.DNS_SERVERS) ?? []),
    outbound: {
      allowHttp: !production,
      allowedNetworks: e.OUTBOUND_ALLOW_NETWORKS === undefined ? [] : (parseAddressList(e.OUTBOUND_ALLOW_NETWORKS) ?? []),
      timeoutMs: 5000,
      maxBytes: 1024 * 1024,
      caFile: e.OUTBOUND_CA_FILE === undefined ? null : path.resolve(e.OUTBOUND_CA_FILE),
    },
    clientRegistration: {
      mode: e.CLIENT_REGISTRATION ?? 'open',
      initialAccessToken: e.CLIENT_REGISTRATION_TOKEN ?? null,
      perAddressPerHour: e.CLIENT_REGISTRATION_RATE_LIMIT ?? 20,
      maxClients: e.CLIENT_REGISTRATION_MAX_CLIENTS ?? 10_000,
      unusedClientTtl: e.UNUSED_CLIENT_TTL ?? 24 * 3600,
    },
    clientMetadata: {
      allowedNetworks: e.CLIENT_METADATA_ALLOW_NETWORKS === undefined ? [] : (parseAddressList(e.CLIENT_METADATA_ALLOW_NETWORKS) ?? []),
      maxClients: e.CLIENT_METADATA_MAX_CLIENTS ?? 10_000,
    },
    dpop: {
      requireNonce: e.DPOP_REQUIRE_NONCE === '1' || e.DPOP_REQUIRE_NONCE === 'true',
      proofMaxAge: e.DPOP_PROOF_MAX_AGE ?? 60,
    },
    webhooks: {
      allowPrivate: e.WEBHOOK_ALLOW_PRIVATE === '1' || e.WEBHOOK_ALLOW_PRIVATE === 'true',
      retryDelaysSeconds: e.WEBHOOK_RETRY_DELAYS === undefined ? DEFAULT_WEBHOOK_RETRY_DELAYS : (parseDelays(e.WEBHOOK_RETRY_DELAYS) ?? DEFAULT_WEBHOOK_RETRY_DELAYS),
    },
  } satisfies Config);
}

/**
 * parseConfig plus the embedded database's SECRET_KEY: generated once (384 random bits) and kept
 * in DATA_DIR with mode 0600, so cookies and encrypted signing keys survive restarts.
 */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  const config = parseConfig(env);
  if (config.outbound.caFile !== null) checkCaFile(config.outbound.caFile);
  if (config.secretKey !== '') return config;
  return Object.freeze({ ...config, secretKey: readOrCreateSecretKey(config.dataDir) });
}

/** OUTBOUND_CA_FILE must be readable and hold certificates: found out at start, not at the first outbound request. */
function checkCaFile(file: string): void {
  try {
    readCaBundle(file);
  } catch (err) {
    throw new ConfigError([`OUTBOUND_CA_FILE: ${err instanceof Error ? err.message : String(err)}`]);
  }
}

function readOrCreateSecretKey(dataDir: string): string {
  const file = path.join(dataDir, SECRET_KEY_FILE);
  try {
    const existing = readFileSync(file, 'utf8').trim();
    if (existing.length < SECRET_KEY_MIN_LENGTH) {
      throw new ConfigError([`SECRET_KEY: the generated key in ${file} is shorter than ${SECRET_KEY_MIN_LENGTH} characters; delete it or set SECRET_KEY`]);
    }
    return existing;
  } catch (err) {
    if (err instanceof ConfigError) throw err;
    if (errnoCode(err) !== 'ENOENT') throw new ConfigError([`DATA_DIR: cannot read ${file} (${err instanceof Error ? err.message : String(err)})`]);
  }
  // A database whose key is gone cannot decrypt its signing keys: never paper over that with a new key.
  if (existsSync(path.join(dataDir, 'pgdata', 'PG_VERSION'))) {
    throw new ConfigError([`SECRET_KEY: ${file} is missing but the embedded database in ${dataDir} exists; restore the file or set SECRET_KEY to the key it was created with`]);
  }
  const secret = randomBytes(48).toString('base64url');
  try {
    mkdirSync(dataDir, { recursive: true, mode: 0o700 });
    // 'wx': never overwrite a key another process wrote a moment ago.
    writeFileSync(file, `${secret}\n`, { mode: 0o600, flag: 'wx' });
    return secret;
  } catch (err) {
    if (errnoCode(err) === 'EEXIST') return readOrCreateSecretKey(dataDir);
    throw new ConfigError([`DATA_DIR: cannot write ${file} (${err instanceof Error ? err.message : String(err)})`]);
  }
}
