/**
 * The app as in production (same buildApp, configuration from the environment), plus — in
 * this bench-only entry point and nowhere else — two baseline routes to compare against:
 * GET /bench/hello (a constant) and GET /bench/contacts (the API's 50-row query, no auth).
 */
import { z } from 'zod';
import { contactOut, listContacts } from '../src/api/contacts.js';
import { buildApp } from '../src/app.js';
import { loadConfig } from '../src/config.js';
import { createLogger } from '../src/logger.js';
import { ensureSigningKey } from '../src/oauth/models/signing-keys.js';
import { limitHeapGrowth, openDatabase } from '../src/runtime.js';

limitHeapGrowth();
const config = loadConfig();
const logger = createLogger(config);
const { handle } = await openDatabase(config, logger);
await ensureSigningKey(handle.db, { alg: config.signingAlg, secretKey: config.secretKey });
const app = await buildApp(config, { db: handle.db, logger, listen: handle.listen });

const query = z.object({ org: z.coerce.number().int().positive(), limit: z.coerce.number().int().min(1).max(100).default(50) });
app.get('/bench/hello', async () => ({ hello: 'world' }));
app.get('/bench/contacts', async (req) => {
  const { org, limit } = query.parse(req.query);
  const rows = await listContacts(handle.db, org, { afterId: 0, limit: limit + 1 });
  return { data: rows.slice(0, limit).map(contactOut), next_cursor: null };
});

const shutdown = () => void app.close().then(() => handle.close()).then(() => process.exit(0));
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);
await app.listen({ host: '127.0.0.1', port: config.port });
process.stdout.write('bench server ready\n');
