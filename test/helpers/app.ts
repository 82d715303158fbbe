import { Writable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import { buildApp } from '../../src/app.js';
import { type Config, parseConfig } from '../../src/config.js';
import type { DB, Listen } from '../../src/db/connect.js';
import { createLogger } from '../../src/logger.js';

export const TEST_SECRET_KEY = 'test-secret-key-0123456789abcdefghijklmnop';

/** A configuration as the server would parse it, with test defaults and `env` on top. */
export function testConfig(env: Record<string, string> = {}): Config {
  return parseConfig({ SECRET_KEY: TEST_SECRET_KEY, LOG_LEVEL: 'silent', DATA_DIR: '/nonexistent-orgauth-test', ...env });
}

/** Captures log lines so tests can read what the server wrote. */
export function logCapture(): { stream: Writable; lines: () => string[] } {
  const chunks: string[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, done) {
      chunks.push(chunk.toString('utf8'));
      done();
    },
  });
  return { stream, lines: () => chunks.join('').split('\n').filter((l) => l !== '') };
}

/** Builds the app over `db` exactly as server.ts does, without listening. */
export async function buildTestApp(
  db: DB,
  options: { env?: Record<string, string>; logStream?: Writable; listen?: Listen } = {},
): Promise<FastifyInstance> {
  const config = testConfig({ LOG_LEVEL: options.logStream ? 'info' : 'silent', ...options.env });
  const logger = createLogger(config, options.logStream);
  return buildApp(config, { db, logger, ...(options.listen ? { listen: options.listen } : {}) });
}

/** The API's RFC 9728 pointer in its challenges, for the default test issuer. */
export const RESOURCE_METADATA = `resource_metadata="${testConfig().issuer}/.well-known/oauth-protected-resource/api/v1"`;
