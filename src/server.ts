/** The only file that listens: loadConfig() → open the database → buildApp() → listen; graceful close. */
import type { FastifyInstance } from 'fastify';
import type { Server } from 'node:http';
import { type AdminSocket, serveAdminSocket } from './admin-socket.js';
import { buildApp } from './app.js';
import { runCommandLine } from './cli/index.js';
import { Metrics, serveMetrics } from './metrics.js';
import { usePasswordHashing } from './accounts/passwords.js';
import { loadConfig } from './config.js';
import type { DatabaseHandle } from './db/connect.js';
import { formatDemoBanner, isDatabaseEmpty, seedDemo } from './demo.js';
import { createLogger } from './logger.js';
import { DEV_OUTBOX_PATH } from './web/dev-outbox.js';
import { ensureSigningKey } from './oauth/models/signing-keys.js';
import { describeStartupError, limitHeapGrowth, openDatabase } from './runtime.js';

/** SIGTERM must end the process within this even if a request hangs. */
const SHUTDOWN_TIMEOUT_MS = 9000;

let handle: DatabaseHandle | undefined;
let app: FastifyInstance | undefined;
let metricsServer: Server | undefined;
let adminSocket: AdminSocket | undefined;
let closing = false;

/**
 * Registered before anything else: as PID 1 in a container, node ignores SIGTERM until a
 * handler exists, and a stop during migrations must still close the database cleanly.
 */
function shutdown(signal: NodeJS.Signals): void {
  if (closing) return;
  closing = true;
  process.stderr.write(`orgauth: ${signal} received, shutting down\n`);
  setTimeout(() => {
    process.stderr.write('orgauth: shutdown timed out; exiting\n');
    process.exit(1);
  }, SHUTDOWN_TIMEOUT_MS).unref();
  metricsServer?.close();
  metricsServer?.closeAllConnections();
  // The admin socket closes beside the HTTP server, not before it: neither waits for the other.
  Promise.all([adminSocket?.close(), app?.close()])
    .then(() => handle?.close())
    .then(
      () => process.exit(0),
      (err: unknown) => {
        process.stderr.write(`orgauth: error during shutdown: ${describeStartupError(err).join('; ')}\n`);
        process.exit(1);
      },
    );
}
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);

async function main(): Promise<void> {
  const config = loadConfig();
  usePasswordHashing(config.passwordHashing);
  const logger = createLogger(config);
  if (config.passwordHashing !== 'standard') logger.warn({ passwordHashing: config.passwordHashing }, 'PASSWORD_HASHING is not standard: password hashes are cheap to crack; for test suites only');
  const opened = await openDatabase(config, logger);
  handle = opened.handle;
  const { db } = handle;
  if (opened.applied.length > 0) logger.info({ applied: opened.applied }, 'database migrated');
  const kid = await ensureSigningKey(db, { alg: config.signingAlg, secretKey: config.secretKey, retireUnused: true });
  logger.info({ kid, alg: config.signingAlg }, 'signing key ready');

  // Zero set-up: a fresh embedded database gets demo data, printed at once (its secrets exist
  // nowhere else). A PostgreSQL database never does: `orgauth seed-demo` on request.
  if (handle.kind === 'pglite' && (await isDatabaseEmpty(db))) {
    process.stdout.write(`${formatDemoBanner(await seedDemo(db), config.issuer)}\n`);
  }

  if (config.mail.devOutbox) {
    process.stdout.write(`Email: SMTP_URL is not set, so messages are logged and shown at ${config.issuer}${DEV_OUTBOX_PATH} instead of sent.\n`);
  } else if (config.mail.smtpUrl === null) {
    logger.warn('SMTP_URL is not set: emails (verification, password reset, invitations) are written to the log at info, not sent');
  }
  const metrics = new Metrics({ poolStats: handle.poolStats, processMetrics: true });
  app = await buildApp(config, { db, logger, listen: handle.listen, metrics });
  if (closing) return;
  await app.listen({ host: config.host, port: config.port });
  if (config.metricsPort !== null) {
    metricsServer = await serveMetrics(metrics, config.host, config.metricsPort);
    logger.info({ port: config.metricsPort }, 'metrics served on GET /metrics');
  }
  // The embedded database opens in this process only: `orgauth` commands from other terminals
  // reach it through this server (src/admin-socket.ts). PostgreSQL needs no such channel.
  if (handle.kind === 'pglite') {
    adminSocket = await serveAdminSocket(config.dataDir, (argv) => runCommandLine(argv, { db, config, applied: [] }), logger);
    if (adminSocket) logger.info({ socket: adminSocket.path }, 'orgauth commands from this machine run here (admin socket)');
  }
  limitHeapGrowth();
  logger.info({ issuer: config.issuer, database: handle.kind }, 'orgauth is ready');
}

main().catch(async (err: unknown) => {
  for (const line of describeStartupError(err)) process.stderr.write(`orgauth: ${line}\n`);
  await app?.close().catch(() => {});
  await handle?.close().catch(() => {});
  process.exit(1);
});
