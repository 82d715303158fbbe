/**
 * API rate limits per (application, organization): API_RATE_LIMIT requests a minute, 429 with
 * Retry-After and the IETF RateLimit-* headers. In memory per instance by default; through Redis
 * (REDIS_URL) every instance counts against one limit. If Redis is away, requests are let
 * through rather than refused: the limit protects the service, it must not take it down.
 */
import rateLimit from '@fastify/rate-limit';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { Config } from '../config.js';
import { TooManyAttemptsError } from '../oauth/errors.js';
import { authOf } from './auth.js';

export async function registerApiRateLimit(app: FastifyInstance, config: Pick<Config, 'apiRateLimit' | 'redisUrl'>): Promise<void> {
  await registerRateLimit(app, config, {
    max: config.apiRateLimit,
    nameSpace: 'orgauth-api-rl:',
    key: (req) => {
      const auth = authOf(req);
      return `${auth.claims.client_id}:${auth.organizationId}`;
    },
    refuse: (retryAfterS, message) => new TooManyAttemptsError(retryAfterS, message),
  });
}

/** A limit of `max` requests a minute per `key` on the plugin's routes, counted after authentication (preHandler); 0 turns it off. */
export interface RateLimit {
  max: number;
  /** Keeps one limit's Redis keys apart from another's. */
  nameSpace: string;
  key: (req: FastifyRequest) => string;
  /** The 429 to throw: its Retry-After, in seconds, and a message. */
  refuse: (retryAfterS: number, message: string) => Error;
}

export async function registerRateLimit(app: FastifyInstance, config: Pick<Config, 'redisUrl'>, limit: RateLimit): Promise<void> {
  if (limit.max === 0) return;
  // Connected once the app is ready, before it listens: connecting while the app is still being
  // built (which holds the event loop for seconds on a busy host) let the 500 ms connect timeout
  // fire before the connection's answer was read, and the instance then served its first requests
  // unlimited while it reconnected.
  // ioredis is loaded only when REDIS_URL is set (a tenth of a second of every start otherwise).
  const redis = config.redisUrl
    ? new (await import('ioredis')).Redis(config.redisUrl, { connectTimeout: 500, maxRetriesPerRequest: 1, enableOfflineQueue: false, lazyConnect: true })
    : undefined;
  redis?.on('error', (err) => app.log.warn({ err }, 'Redis for rate limits is unavailable; requests are not limited meanwhile'));
  if (redis) {
    // A Redis that does not answer does not stop the start: ioredis keeps reconnecting (the 'error' above).
    app.addHook('onReady', async () => void (await redis.connect().catch(() => {})));
    app.addHook('onClose', async () => void (await redis.quit().catch(() => redis.disconnect())));
  }

  await app.register(rateLimit, {
    global: true,
    // After authentication (onRequest), so the key is the token's application and organization.
    hook: 'preHandler',
    max: limit.max,
    timeWindow: 60_000,
    keyGenerator: limit.key,
    enableDraftSpec: true,
    skipOnError: true,
    nameSpace: limit.nameSpace,
    ...(redis ? { redis } : {}),
    errorResponseBuilder: (_req, ctx) => limit.refuse(Math.max(1, Math.ceil(ctx.ttl / 1000)), `rate limit of ${ctx.max} requests per minute exceeded; retry in ${ctx.after}`),
  });
}
