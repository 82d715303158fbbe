import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { ConfigError, loadConfig, parseConfig } from '../src/config.js';

const SECRET = 'x'.repeat(32);

function problems(env: Record<string, string>): string[] {
  try {
    parseConfig(env);
  } catch (err) {
    if (err instanceof ConfigError) return err.problems;
    throw err;
  }
  throw new Error('expected a ConfigError');
}

describe('parseConfig', () => {
  it('applies the documented defaults', () => {
    const config = parseConfig({});
    expect(config).toEqual({
      database: { kind: 'pglite', dataDir: path.resolve('data/pgdata') },
      databasePoolMax: 10,
      jobWorkers: 1,
      dataDir: path.resolve('data'),
      host: '127.0.0.1',
      port: 3000,
      metricsPort: null,
      issuer: 'http://localhost:3000',
      secretKey: '',
      accessTokenTtl: 31_536_000,
      refreshTokenTtl: 31_536_000,
      authCodeTtl: 60,
      deviceCodeTtl: 600,
      devicePollInterval: 5,
      refreshReuseGrace: 10,
      signingAlg: 'ES256',
      logLevel: 'info',
      passwordHashing: 'standard',
      logFormat: 'auto',
      apiRateLimit: 600,
      scimRateLimit: 2000,
      redisUrl: null,
      trustProxy: false,
      cleanupInterval: 600,
      activityFlushInterval: 5,
      signingKeyRotationDays: 90,
      mail: { smtpUrl: null, from: 'orgauth <no-reply@localhost>', devOutbox: true },
      dnsServers: [],
      outbound: { allowHttp: true, allowedNetworks: [], timeoutMs: 5000, maxBytes: 1024 * 1024, caFile: null },
      clientRegistration: { mode: 'open', initialAccessToken: null, perAddressPerHour: 20, maxClients: 10_000, unusedClientTtl: 86_400 },
      clientMetadata: { allowedNetworks: [], maxClients: 10_000 },
      webhooks: { allowPrivate: false, retryDelaysSeconds: [5, 60, 300, 1800, 3600, 7200, 18000, 36000, 50400, 72000, 86400] },
      dpop: { requireNonce: false, proofMaxAge: 60 },
    });
    expect(Object.isFrozen(config)).toBe(true);
  });

  it('reads every variable', () => {
    const config = parseConfig({
      DATABASE_URL: 'postgres://u:p@db:5432/orgauth',
      DATABASE_POOL_MAX: '25',
      JOB_WORKERS: '0',
      DATABASE_LISTEN_URL: 'postgres://u:p@db-primary:5432/orgauth',
      DATABASE_POOLER: 'transaction',
      DATA_DIR: '/var/lib/orgauth',
      HOST: '0.0.0.0',
      PORT: '8080',
      ISSUER: 'https://auth.example.com/',
      SECRET_KEY: SECRET,
      ACCESS_TOKEN_TTL: '3600',
      REFRESH_TOKEN_TTL: '86400',
      AUTH_CODE_TTL: '600',
      DEVICE_CODE_TTL: '900',
      DEVICE_POLL_INTERVAL: '10',
      REFRESH_REUSE_GRACE: '0',
      SIGNING_ALG: 'EdDSA',
      LOG_LEVEL: 'warn',
      TRUST_PROXY: '10.0.0.0/8, 127.0.0.1',
      API_RATE_LIMIT: '0',
      REDIS_URL: 'redis://cache:6379/2',
      CLEANUP_INTERVAL: '0',
      SMTP_URL: 'smtp://mailer:secret@smtp.example.com:587',
      MAIL_FROM: 'Example Auth <auth@example.com>',
      DNS_SERVERS: '10.0.0.53, 127.0.0.1:5353,[::1]:53, 2001:db8::1',
      OUTBOUND_ALLOW_NETWORKS: '10.20.0.0/16, 192.168.1.5',
      OUTBOUND_CA_FILE: '/etc/orgauth/ca.pem',
      CLIENT_METADATA_ALLOW_NETWORKS: '192.168.7.0/24',
      CLIENT_METADATA_MAX_CLIENTS: '500',
      DPOP_REQUIRE_NONCE: '1',
      DPOP_PROOF_MAX_AGE: '120',
    });
    expect(config).toMatchObject({
      dpop: { requireNonce: true, proofMaxAge: 120 },
      dnsServers: ['10.0.0.53', '127.0.0.1:5353', '[::1]:53', '2001:db8::1'],
      outbound: { allowHttp: false, allowedNetworks: ['10.20.0.0/16', '192.168.1.5'], caFile: '/etc/orgauth/ca.pem' },
      clientMetadata: { allowedNetworks: ['192.168.7.0/24'], maxClients: 500 },
      mail: { smtpUrl: 'smtp://mailer:secret@smtp.example.com:587', from: 'Example Auth <auth@example.com>', devOutbox: false },
      database: { kind: 'postgres', url: 'postgres://u:p@db:5432/orgauth', listenUrl: 'postgres://u:p@db-primary:5432/orgauth', pooler: 'transaction' },
      databasePoolMax: 25,
      jobWorkers: 0,
      dataDir: '/var/lib/orgauth',
      host: '0.0.0.0',
      port: 8080,
      issuer: 'https://auth.example.com',
      secretKey: SECRET,
      accessTokenTtl: 3600,
      refreshTokenTtl: 86400,
      authCodeTtl: 600,
      deviceCodeTtl: 900,
      devicePollInterval: 10,
      refreshReuseGrace: 0,
      signingAlg: 'EdDSA',
      logLevel: 'warn',
      trustProxy: ['10.0.0.0/8', '127.0.0.1'],
      apiRateLimit: 0,
      redisUrl: 'redis://cache:6379/2',
      cleanupInterval: 0,
    });
  });

  it('shows the developer outbox only without SMTP_URL, on the embedded database, outside production', () => {
    expect(parseConfig({}).mail.devOutbox).toBe(true);
    expect(parseConfig({ SMTP_URL: 'smtps://u:p@mail.example.com' }).mail.devOutbox).toBe(false);
    expect(parseConfig({ NODE_ENV: 'production' }).mail.devOutbox).toBe(false);
    expect(parseConfig({ ISSUER: 'https://auth.example.com' }).mail.devOutbox).toBe(false);
    expect(parseConfig({ DATABASE_URL: 'postgres://localhost/x', SECRET_KEY: SECRET }).mail.devOutbox).toBe(false);
    expect(parseConfig({ ISSUER: 'https://auth.example.com' }).mail.from).toBe('orgauth <no-reply@auth.example.com>');
  });

  it('refuses an SMTP_URL that is not smtp(s):// and a MAIL_FROM that is not an address', () => {
    expect(problems({ SMTP_URL: 'http://mail.example.com' })).toEqual([expect.stringMatching(/^SMTP_URL: must be an smtp:\/\/ or smtps:\/\/ URL/)]);
    expect(problems({ SMTP_URL: 'smtp://' })).toHaveLength(1);
    expect(problems({ MAIL_FROM: 'not an address' })).toEqual(['MAIL_FROM: must be an email address or "Name <address>"']);
    expect(problems({ MAIL_FROM: 'x@example.com\r\nBcc: victim@example.com' })).toHaveLength(1);
    expect(parseConfig({ MAIL_FROM: 'auth@example.com' }).mail.from).toBe('auth@example.com');
    expect(parseConfig({ MAIL_FROM: '"Example, Inc." <auth@example.com>' }).mail.from).toBe('"Example, Inc." <auth@example.com>');
  });

  it('derives the default ISSUER from PORT', () => {
    expect(parseConfig({ PORT: '4100' }).issuer).toBe('http://localhost:4100');
  });

  it('treats empty values as unset', () => {
    expect(parseConfig({ DATABASE_URL: '', PORT: '', SIGNING_ALG: '' })).toMatchObject({ database: { kind: 'pglite' }, port: 3000, signingAlg: 'ES256' });
  });

  it('requires SECRET_KEY with DATABASE_URL, reported with the other problems', () => {
    expect(problems({ DATABASE_URL: 'postgres://localhost/x' })).toEqual([expect.stringMatching(/^SECRET_KEY: required when DATABASE_URL is set/)]);
    expect(problems({ DATABASE_URL: 'postgres://localhost/x', PORT: 'x' })).toEqual([
      'PORT: must be a port number between 0 and 65535',
      expect.stringMatching(/^SECRET_KEY: required when DATABASE_URL is set/),
    ]);
  });

  it('reaches PostgreSQL directly by default: no pooler, LISTEN on DATABASE_URL', () => {
    expect(parseConfig({ DATABASE_URL: 'postgres://localhost/x', SECRET_KEY: SECRET }).database).toEqual({ kind: 'postgres', url: 'postgres://localhost/x' });
    expect(parseConfig({ DATABASE_URL: 'postgres://localhost/x', DATABASE_POOLER: 'none', SECRET_KEY: SECRET }).database).toEqual({ kind: 'postgres', url: 'postgres://localhost/x' });
  });

  it('DATABASE_POOLER=transaction requires DATABASE_URL and DATABASE_LISTEN_URL', () => {
    expect(problems({ DATABASE_URL: 'postgres://pgbouncer/x', DATABASE_POOLER: 'transaction', SECRET_KEY: SECRET })).toEqual([
      expect.stringMatching(/^DATABASE_LISTEN_URL: required with DATABASE_POOLER=transaction: LISTEN needs a session of its own/),
    ]);
    expect(problems({ DATABASE_POOLER: 'transaction', DATABASE_LISTEN_URL: 'postgres://db/x' })).toEqual([
      'DATABASE_LISTEN_URL: only with DATABASE_URL',
      'DATABASE_POOLER: transaction only with DATABASE_URL',
    ]);
  });

  it('takes PASSWORD_HASHING=weak-for-tests in development and refuses it in production', () => {
    expect(parseConfig({ PASSWORD_HASHING: 'weak-for-tests' }).passwordHashing).toBe('weak-for-tests');
    const refusal = ['PASSWORD_HASHING: weak-for-tests is for test suites only and is refused in production (NODE_ENV=production or an https ISSUER)'];
    expect(problems({ PASSWORD_HASHING: 'weak-for-tests', NODE_ENV: 'production', SECRET_KEY: SECRET })).toEqual(refusal);
    expect(problems({ PASSWORD_HASHING: 'weak-for-tests', ISSUER: 'https://auth.example.com', SECRET_KEY: SECRET })).toEqual(refusal);
    expect(parseConfig({ PASSWORD_HASHING: 'standard', NODE_ENV: 'production', SECRET_KEY: SECRET }).passwordHashing).toBe('standard');
  });

  it('refuses a SECRET_KEY shorter than 32 characters without echoing it', () => {
    const lines = problems({ DATABASE_URL: 'postgres://localhost/x', SECRET_KEY: 'short-secret' });
    expect(lines).toEqual(['SECRET_KEY: must be at least 32 characters']);
    expect(lines.join()).not.toContain('short-secret');
  });

  it.each([
    ['DATABASE_URL', 'mysql://localhost/x', 'DATABASE_URL: must be a postgres:// or postgresql:// connection URL'],
    ['DATABASE_POOL_MAX', '0', 'DATABASE_POOL_MAX: must be a whole number between 1 and 1000'],
    ['DATABASE_LISTEN_URL', 'mysql://localhost/x', 'DATABASE_LISTEN_URL: must be a postgres:// or postgresql:// connection URL'],
    ['DATABASE_POOLER', 'session', 'DATABASE_POOLER: must be one of none, transaction'],
    ['PORT', '70000', 'PORT: must be a port number between 0 and 65535'],
    ['PORT', 'http', 'PORT: must be a port number between 0 and 65535'],
    ['HOST', 'not a host', 'HOST: must be an IP address or host name'],
    ['ISSUER', 'ftp://example.com', 'ISSUER: must be an absolute http(s) URL without path, query, fragment or user info'],
    ['ISSUER', 'https://example.com/?x=1', 'ISSUER: must be an absolute http(s) URL without path, query, fragment or user info'],
    ['ISSUER', 'https://example.com/auth', 'ISSUER: must be an absolute http(s) URL without path, query, fragment or user info'],
    ['ISSUER', 'https://user@example.com', 'ISSUER: must be an absolute http(s) URL without path, query, fragment or user info'],
    ['ACCESS_TOKEN_TTL', '-1', 'ACCESS_TOKEN_TTL: must be a whole number of seconds between 1 and 315360000'],
    ['REFRESH_TOKEN_TTL', '1.5', 'REFRESH_TOKEN_TTL: must be a whole number of seconds between 1 and 315360000'],
    ['AUTH_CODE_TTL', '601', 'AUTH_CODE_TTL: must be a whole number of seconds between 1 and 600'],
    ['AUTH_CODE_TTL', '0', 'AUTH_CODE_TTL: must be a whole number of seconds between 1 and 600'],
    ['DEVICE_CODE_TTL', '59', 'DEVICE_CODE_TTL: must be a whole number of seconds between 60 and 3600'],
    ['DEVICE_POLL_INTERVAL', '61', 'DEVICE_POLL_INTERVAL: must be a whole number of seconds between 1 and 60'],
    ['REFRESH_REUSE_GRACE', 'ten', 'REFRESH_REUSE_GRACE: must be a whole number of seconds between 0 and 3600'],
    ['CLEANUP_INTERVAL', '604801', 'CLEANUP_INTERVAL: must be a whole number of seconds between 0 and 604800 (0 disables the cleanup)'],
    ['SIGNING_ALG', 'HS256', 'SIGNING_ALG: must be one of ES256, RS256, EdDSA'],
    ['LOG_LEVEL', 'loud', 'LOG_LEVEL: must be one of fatal, error, warn, info, debug, trace, silent'],
    ['PASSWORD_HASHING', 'none', 'PASSWORD_HASHING: must be one of standard, weak-for-tests'],
    ['API_RATE_LIMIT', '-5', 'API_RATE_LIMIT: must be a whole number of requests per minute (0 disables the limit)'],
    ['REDIS_URL', 'http://cache:6379', 'REDIS_URL: must be a redis:// or rediss:// URL'],
    ['TRUST_PROXY', 'yes', 'TRUST_PROXY: must be true, false or a comma-separated list of IP addresses/CIDR ranges of the proxies'],
    ['TRUST_PROXY', '10.0.0.0/33', 'TRUST_PROXY: must be true, false or a comma-separated list of IP addresses/CIDR ranges of the proxies'],
    ['DNS_SERVERS', 'dns.example.com', 'DNS_SERVERS: must be a comma-separated list of resolvers, each an IP address with an optional port (1.1.1.1, 127.0.0.1:5353, [::1]:53)'],
    ['DNS_SERVERS', '127.0.0.1:99999', 'DNS_SERVERS: must be a comma-separated list of resolvers, each an IP address with an optional port (1.1.1.1, 127.0.0.1:5353, [::1]:53)'],
    ['OUTBOUND_ALLOW_NETWORKS', 'intranet', 'OUTBOUND_ALLOW_NETWORKS: must be a comma-separated list of IP addresses/CIDR ranges'],
    ['CLIENT_METADATA_ALLOW_NETWORKS', '10.0.0.0/33', 'CLIENT_METADATA_ALLOW_NETWORKS: must be a comma-separated list of IP addresses/CIDR ranges'],
    ['CLIENT_METADATA_MAX_CLIENTS', '0', 'CLIENT_METADATA_MAX_CLIENTS: must be a whole number between 1 and 10000000'],
  ])('names %s when it is %j', (name, value, line) => {
    expect(problems({ SECRET_KEY: SECRET, [name]: value })).toEqual([line]);
  });

  it('reports one line per bad variable', () => {
    expect(problems({ PORT: 'x', SIGNING_ALG: 'none', AUTH_CODE_TTL: '9999' })).toEqual([
      'PORT: must be a port number between 0 and 65535',
      'AUTH_CODE_TTL: must be a whole number of seconds between 1 and 600',
      'SIGNING_ALG: must be one of ES256, RS256, EdDSA',
    ]);
  });
});

describe('loadConfig', () => {
  const dirs: string[] = [];
  afterEach(() => {
    for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
  });

  it('generates the embedded SECRET_KEY once, private to the owner, and reuses it', () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'orgauth-config-'));
    dirs.push(dir);
    const dataDir = path.join(dir, 'data');
    const first = loadConfig({ DATA_DIR: dataDir });
    expect(first.secretKey.length).toBeGreaterThanOrEqual(64);
    const file = path.join(dataDir, 'secret_key');
    expect(readFileSync(file, 'utf8').trim()).toBe(first.secretKey);
    expect(statSync(file).mode & 0o777).toBe(0o600);
    expect(loadConfig({ DATA_DIR: dataDir }).secretKey).toBe(first.secretKey);
  });

  it('refuses to generate a new key for an existing embedded database', () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'orgauth-config-'));
    dirs.push(dir);
    mkdirSync(path.join(dir, 'pgdata'));
    writeFileSync(path.join(dir, 'pgdata', 'PG_VERSION'), '17');
    expect(() => loadConfig({ DATA_DIR: dir })).toThrow(/secret_key is missing but the embedded database/);
    expect(existsSync(path.join(dir, 'secret_key'))).toBe(false);
  });

  it('prefers SECRET_KEY from the environment and writes nothing', () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'orgauth-config-'));
    dirs.push(dir);
    expect(loadConfig({ DATA_DIR: dir, SECRET_KEY: SECRET }).secretKey).toBe(SECRET);
    expect(() => statSync(path.join(dir, 'secret_key'))).toThrow();
  });
});
