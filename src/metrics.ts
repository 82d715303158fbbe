/**
 * Prometheus metrics (prom-client), served by server.ts on METRICS_PORT only — a port of its own,
 * off by default, so they are never public by accident. One registry per app: tests build
 * several apps in one process.
 */
import { createServer, type Server } from 'node:http';
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client';
import type { RevocationReason } from './db/schema.js';

/** What the pool can say about itself (pg.Pool's counters); absent on the embedded database. */
export interface PoolStats {
  total: number;
  idle: number;
  waiting: number;
}

export class Metrics {
  readonly registry = new Registry();

  readonly requests = new Histogram({
    name: 'orgauth_http_request_duration_seconds',
    help: 'HTTP requests by method, route (the pattern, not the path) and status, with their latency',
    labelNames: ['method', 'route', 'status'] as const,
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    registers: [this.registry],
  });

  readonly tokensIssued = new Counter({
    name: 'orgauth_tokens_issued_total',
    help: 'Access tokens issued, by grant type (authorization_code, refresh_token, client_credentials, dashboard, cli)',
    labelNames: ['grant_type'] as const,
    registers: [this.registry],
  });

  readonly revocations = new Counter({
    name: 'orgauth_revocations_total',
    help: 'Grants (kind="grant") and single access tokens (kind="access_token") revoked by this instance, by reason',
    labelNames: ['kind', 'reason'] as const,
    registers: [this.registry],
  });

  readonly refreshReuse = new Counter({
    name: 'orgauth_refresh_token_reuse_total',
    help: 'Retired refresh tokens presented again: refused within REFRESH_REUSE_GRACE (outcome="refused"), or after it, revoking the grant (outcome="grant_revoked")',
    labelNames: ['outcome'] as const,
    registers: [this.registry],
  });

  readonly mailDeliveries = new Counter({
    name: 'orgauth_mail_deliveries_total',
    help: 'Attempts to send a queued email, by outcome: sent, retry (failed, tried again after a backoff) or failed (given up after 48 hours)',
    labelNames: ['outcome'] as const,
    registers: [this.registry],
  });

  readonly webhookDeliveries = new Counter({
    name: 'orgauth_webhook_deliveries_total',
    help: 'Webhook delivery attempts, by outcome: succeeded (a 2xx answer), retry (failed, tried again later) or failed (retries exhausted, or the endpoint disabled)',
    labelNames: ['outcome'] as const,
    registers: [this.registry],
  });

  readonly jobs = new Counter({
    name: 'orgauth_jobs_total',
    help: 'Background jobs that ended a run on this instance, by kind and outcome: succeeded, retry (failed, tried again after a backoff) or failed (given up)',
    labelNames: ['kind', 'outcome'] as const,
    registers: [this.registry],
  });

  readonly jobItems = new Counter({
    name: 'orgauth_jobs_items_total',
    help: 'Items (grants revoked or narrowed, members moved) that background jobs processed on this instance, by kind',
    labelNames: ['kind'] as const,
    registers: [this.registry],
  });

  readonly jobsRunning = new Gauge({
    name: 'orgauth_jobs_running',
    help: 'Background jobs this instance is running now',
    registers: [this.registry],
  });

  readonly jobsWaiting = new Gauge({
    name: 'orgauth_jobs_waiting',
    help: 'Background jobs of every instance not yet finished, by state (queued, running), as this instance last counted them',
    labelNames: ['state'] as const,
    registers: [this.registry],
  });

  /**
   * `processMetrics`: also the process's own (CPU, memory, event-loop lag, GC), as a served
   * registry wants; they keep observers running, so apps that are never scraped (tests) skip them.
   */
  constructor(options: { poolStats?: (() => PoolStats | undefined) | undefined; processMetrics?: boolean } = {}) {
    const { poolStats } = options;
    if (options.processMetrics) collectDefaultMetrics({ register: this.registry, prefix: 'orgauth_' });
    if (poolStats) {
      const gauge = (name: string, help: string, read: (s: PoolStats) => number) =>
        new Gauge({
          name,
          help,
          registers: [this.registry],
          collect() {
            const stats = poolStats();
            if (stats) this.set(read(stats));
          },
        });
      gauge('orgauth_db_pool_connections_in_use', 'PostgreSQL pool connections running a query or transaction', (s) => s.total - s.idle);
      gauge('orgauth_db_pool_connections_idle', 'PostgreSQL pool connections open and idle', (s) => s.idle);
      gauge('orgauth_db_pool_requests_waiting', 'Queries waiting for a pool connection', (s) => s.waiting);
    }
  }

  /** Per (method, route, status): prom-client's labelled child, found without hashing labels each request. */
  private readonly requestSeries = new Map<string, { observe(seconds: number): void }>();

  observeRequest(method: string, route: string, status: number, seconds: number): void {
    const key = `${method} ${status} ${route}`;
    let series = this.requestSeries.get(key);
    if (!series) {
      series = this.requests.labels(method, route, String(status));
      this.requestSeries.set(key, series);
    }
    series.observe(seconds);
  }

  revoked(kind: 'grant' | 'access_token', reason: RevocationReason, count = 1): void {
    if (count > 0) this.revocations.inc({ kind, reason }, count);
  }
}

/** GET /metrics on its own port (any other path: 404). Resolves once listening. */
export async function serveMetrics(metrics: Metrics, host: string, port: number): Promise<Server> {
  const server = createServer((req, res) => {
    if (req.method !== 'GET' || req.url?.split('?')[0] !== '/metrics') {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found\n');
      return;
    }
    metrics.registry.metrics().then(
      (body) => res.writeHead(200, { 'content-type': metrics.registry.contentType }).end(body),
      (err: unknown) => res.writeHead(500, { 'content-type': 'text/plain' }).end(`${String(err)}\n`),
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  return server;
}
