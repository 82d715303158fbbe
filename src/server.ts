/** The only file that listens: loadConfig() → open the database → buildApp() → listen; graceful close. */
import { buildApp } from './app.js';
import { loadConfig } from './config.js';
import { formatDemoBanner, isDatabaseEmpty, seedDemo } from './demo.js';
import { createLogger } from './logger.js';
import { ensureSigningKey } from './oauth/keys.js';
import { describeStartupError, openDatabase } from './runtime.js';

/** SIGTERM must end the process within this even if a request hangs. */
const SHUTDOWN_TIMEOUT_MS = 9000;

async function main(): Promise<void> {
  const config = loadConfig();
  const logger = createLogger(config);
  const { handle, applied } = await openDatabase(config, logger);
  const { db } = handle;
  if (applied.length > 0) logger.info({ applied }, 'database migrated');
  const kid = await ensureSigningKey(db, { alg: config.signingAlg, secretKey: config.secretKey });
  logger.info({ kid, alg: config.signingAlg }, 'signing key ready');

  // Zero set-up: a fresh embedded database gets demo data. A PostgreSQL database never does.
  let banner: string | undefined;
  if (handle.kind === 'pglite' && (await isDatabaseEmpty(db))) {
    banner = formatDemoBanner(await seedDemo(db), config.issuer);
  }

  const app = await buildApp(config, { db, logger });
  let closing = false;
  const shutdown = (signal: NodeJS.Signals) => {
    if (closing) return;
    closing = true;
    logger.info({ signal }, 'shutting down');
    setTimeout(() => {
      logger.error('shutdown timed out; exiting');
      process.exit(1);
    }, SHUTDOWN_TIMEOUT_MS).unref();
    app
      .close()
      .then(() => handle.close())
      .then(
        () => process.exit(0),
        (err: unknown) => {
          logger.error({ err }, 'error during shutdown');
          process.exit(1);
        },
      );
  };
  process.on('SIGTERM', shutdown);
  process.on('SIGINT', shutdown);

  await app.listen({ host: config.host, port: config.port });
  logger.info({ issuer: config.issuer, database: handle.kind }, 'orgauth is ready');
  if (banner) process.stdout.write(`${banner}\n`);
}

main().catch((err: unknown) => {
  for (const line of describeStartupError(err)) process.stderr.write(`orgauth: ${line}\n`);
  process.exit(1);
});
