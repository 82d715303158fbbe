/**
 * buildApp(): the only way to make the orgauth app. Plugins are registered in order, here, where
 * they can be seen; nothing is auto-loaded. server.ts is the only file that listens.
 */
import { randomUUID } from 'node:crypto';
import cookie from '@fastify/cookie';
import formbody from '@fastify/formbody';
import { corsForClients } from './oauth/endpoints/cors.js';
import Fastify, { type FastifyBaseLogger, type FastifyError, type FastifyInstance, type FastifyReply, LogController } from 'fastify';
import { accountPages } from './web/sign-in.js';
import { API_PREFIX, apiRoutes } from './api/index.js';
import { openApiRoutes, registerOpenApi } from './api/openapi.js';
import type { Config } from './config.js';
import { dashboardPages } from './web/dashboard/index.js';
import { setupPages } from './web/setup-pages.js';
import type { DB, Listen } from './db/connect.js';
import { sanitizeDescription } from './errors.js';
import { toAppError } from './error-mapping.js';
import { isScimPath, SCIM_PREFIX, scimService, sendScimPathError } from './directory/scim-service.js';
import { HEALTH_PATHS, healthRoutes } from './health.js';
import { deriveKey } from './lib/crypto.js';
import { authorizeEndpoint } from './oauth/endpoints/authorize.js';
import { clientAuthThrottle } from './oauth/helpers/client-auth.js';
import { KeyStore } from './oauth/models/key-store.js';
import { metadataRoutes } from './oauth/endpoints/metadata.js';
import { introspectionEndpoint } from './oauth/endpoints/introspect.js';
import { userinfoEndpoint } from './oauth/endpoints/userinfo.js';
import { endSessionEndpoint } from './oauth/endpoints/end-session.js';
import { revocationEndpoint } from './oauth/endpoints/revoke.js';
import { RevocationList } from './oauth/models/revocation-list.js';
import { ExpiredRowSweeper } from './retention.js';
import { ApplicationCache } from './oauth/models/application-cache.js';
import { ClientGrants } from './oauth/models/client-grants.js';
import { ResourceRegistry } from './oauth/models/resources.js';
import { ClientMetadataDocuments } from './oauth/models/client-metadata.js';
import { Metrics } from './metrics.js';
import { ActivityCounter } from './activity.js';
import { tokenEndpoint } from './oauth/endpoints/token.js';
import { parEndpoint } from './oauth/endpoints/par.js';
import { ClientAssertionVerifier } from './oauth/helpers/client-assertion.js';
import { DpopProofs } from './oauth/models/dpop-proofs.js';
import { SeenJtis } from './oauth/models/seen-jtis.js';
import { deviceAuthorizationEndpoint } from './oauth/endpoints/device-authorization.js';
import { devicePages } from './web/device-pages.js';
import { registrationEndpoint } from './oauth/endpoints/register.js';
import { pageAssets } from './web/render.js';
import { BackgroundTasks } from './lib/background.js';
import { jobHandlers } from './jobs/handlers.js';
import { RoleScopes } from './accounts/role-scopes.js';
import { JobRunner } from './jobs/queue.js';
import { devOutboxPage } from './web/dev-outbox.js';
import { MailOutbox } from './mail/outbox.js';
import { WebhookDispatcher } from './webhooks/dispatcher.js';
import { logTransport, type MailTransport, smtpTransport } from './mail/transport.js';

declare module 'fastify' {
  interface FastifyInstance {
    /** What happens per organization and day, counted where it happens (src/activity.ts). */
    activity: ActivityCounter;
  }
}

export interface AppDeps {
  db: DB;
  logger: FastifyBaseLogger;
  /** LISTEN/NOTIFY for revocations across instances; without it they are polled (still within a second). */
  listen?: Listen;
  /** Counters and histograms this app updates (server.ts serves them on METRICS_PORT); a fresh set if absent. */
  metrics?: Metrics;
  /** Where queued email goes; by default SMTP_URL's server, or the log without it. */
  mailTransport?: MailTransport;
}

/** Bodies are forms and small JSON documents; anything larger is refused before it is parsed. */
export const BODY_LIMIT = 64 * 1024;

export async function buildApp(config: Config, deps: AppDeps): Promise<FastifyInstance> {
  const app = Fastify({
    loggerInstance: deps.logger,
    trustProxy: config.trustProxy,
    bodyLimit: BODY_LIMIT,
    genReqId: () => randomUUID(),
    logController: new LogController({ requestIdLogLabel: 'request_id', disableRequestLogging: (req) => HEALTH_PATHS.has(req.url) }),
    onProtoPoisoning: 'error',
    onConstructorPoisoning: 'error',
    return503OnClosing: true,
    // A path the router cannot read (bad percent-encoding, an over-long parameter) gets the one
    // error shape too, not Fastify's own body (R-7; found by test/fuzz.test.ts).
    frameworkErrors: (err: FastifyError, req: { url: string }, reply: FastifyReply) => {
      const status = err.statusCode !== undefined && err.statusCode >= 400 && err.statusCode < 500 ? err.statusCode : 400;
      if (isScimPath(req.url)) return void sendScimPathError(reply, status);
      void reply.code(status).send({ error: 'invalid_request', error_description: 'the request path is malformed' });
    },
  });

  // Hooks on every request take the callback form: an async hook costs a promise and a turn of
  // the microtask queue each (issue 46).
  app.addHook('onRequest', (req, reply, done) => {
    reply.header('x-request-id', req.id);
    done();
  });
  const metrics = deps.metrics ?? new Metrics();
  app.addHook('onResponse', (req, reply, done) => {
    // The route pattern, not the path: ids and tokens in paths would make unbounded label sets.
    const route = req.routeOptions.url ?? 'unmatched';
    metrics.observeRequest(req.method, route, reply.statusCode, reply.elapsedTime / 1000);
    done();
  });

  app.setErrorHandler((err: FastifyError | Error, req, reply) => {
    const appError = toAppError(err);
    if (appError === undefined) {
      req.log.error({ err }, 'unhandled error');
      return reply.code(500).send({ error: 'server_error', error_description: 'internal server error' });
    }
    if (appError.statusCode >= 500) req.log.warn({ err }, appError.description);
    else req.log.info({ err: { type: appError.name, message: appError.message } }, 'request refused');
    reply.code(appError.statusCode).headers(appError.headers);
    return reply.send({
      error: appError.code,
      error_description: sanitizeDescription(appError.description),
      ...(appError.details ? { details: appError.details } : {}),
    });
  });

  app.setNotFoundHandler((req, reply) =>
    reply.code(404).send({ error: 'not_found', error_description: sanitizeDescription(`no route for ${req.method} ${req.url.split('?')[0]}`) }),
  );

  // Counted in memory as it happens, written every ACTIVITY_FLUSH_INTERVAL seconds and at close.
  const activity = new ActivityCounter(deps.db, { intervalSeconds: config.activityFlushInterval, logger: deps.logger });
  app.decorate('activity', activity);
  activity.start();
  app.addHook('onClose', () => activity.stop());

  await app.register(formbody);
  await app.register(cookie, { secret: Buffer.from(deriveKey(config.secretKey, 'cookie-signing')).toString('base64url') });
  await app.register(healthRoutes, { db: deps.db });

  const keys = new KeyStore(deps.db, config);
  const revocations = new RevocationList(deps.db, { accessTokenTtl: config.accessTokenTtl, listen: deps.listen, logger: deps.logger, metrics });
  // Loaded while the routes are registered, and awaited before the app is returned (below): at
  // a million revoked grants the load mostly waits on PostgreSQL, which the registration's CPU
  // work now overlaps (spawn to /healthz ≤ 2 s, issue 46). A failed load is retried by its poll,
  // as before.
  const revocationsLoaded = revocations.start();
  revocationsLoaded.catch(() => undefined);
  app.addHook('onClose', () => revocations.stop());
  const applications = new ApplicationCache(deps.db, { listen: deps.listen, logger: deps.logger });
  await applications.start();
  app.addHook('onClose', () => applications.stop());
  /** The queues that claim work as soon as they start (jobs, mail, webhooks): started last (below). */
  const startWhenReady: (() => unknown)[] = [];
  // Long work (a million grants revoked) that requests queue and any instance finishes; none
  // here with JOB_WORKERS=0 (others run them).
  if (config.jobWorkers > 0) {
    const jobs = new JobRunner(deps.db, { handlers: jobHandlers(revocations), logger: deps.logger, metrics, listen: deps.listen, workers: config.jobWorkers });
    startWhenReady.push(() => jobs.start());
    app.addHook('onClose', () => jobs.stop());
  }
  const clientGrants = new ClientGrants(deps.db, revocations);
  const sweeper = new ExpiredRowSweeper(deps.db, { intervalSeconds: config.cleanupInterval, unusedClientTtl: config.clientRegistration.unusedClientTtl, logger: deps.logger });
  sweeper.start();
  app.addHook('onClose', () => sweeper.stop());
  // Email: queued in the database by requests, sent in the background by every instance.
  const mail = new MailOutbox(deps.db, {
    transport: deps.mailTransport ?? (config.mail.smtpUrl ? smtpTransport(config.mail.smtpUrl) : logTransport(deps.logger)),
    from: config.mail.from,
    secretKey: config.secretKey,
    logger: deps.logger,
    metrics,
    keepBodies: config.mail.devOutbox,
  });
  startWhenReady.push(() => mail.start());
  // Signed webhooks: events written by the changes they report, delivered by every instance.
  const webhooks = new WebhookDispatcher(deps.db, { config, logger: deps.logger, metrics, listen: deps.listen, mail });
  startWhenReady.push(() => webhooks.start());
  const background = new BackgroundTasks(deps.logger);
  // Work that requests started finishes first, then the deliveries in flight (whose failures may
  // queue an email to the owners), then the outbox sends what it has claimed.
  app.addHook('onClose', async () => {
    await background.drain();
    await webhooks.stop();
    await mail.stop();
  });
  const resources = new ResourceRegistry(deps.db, config);
  const roles = new RoleScopes(deps.db);
  const assertions = new ClientAssertionVerifier(config);
  const jtis = new SeenJtis(deps.db);
  const dpop = new DpopProofs(jtis, config);
  const oauth = { db: deps.db, keys, revocations, config, clientThrottle: clientAuthThrottle(), applications, clientGrants, metrics, resources, roles, assertions, dpop, jtis };
  await corsForClients(app);
  await app.register(metadataRoutes, oauth);
  await app.register(tokenEndpoint, oauth);
  await app.register(parEndpoint, oauth);
  await app.register(deviceAuthorizationEndpoint, oauth);
  await app.register(registrationEndpoint, oauth);
  await app.register(revocationEndpoint, oauth);
  await app.register(introspectionEndpoint, oauth);
  await app.register(userinfoEndpoint, oauth);
  await registerOpenApi(app, config);
  await app.register(apiRoutes, { ...oauth, mail, prefix: API_PREFIX });
  await app.register(openApiRoutes, { config });
  await app.register(scimService, { db: deps.db, config, revocations, prefix: `${SCIM_PREFIX}/:directory_id` });

  // Browser pages: each plugin sets up its own security headers and HTML error pages (AZ-7).
  await app.register(pageAssets);
  await app.register(accountPages, { db: deps.db, config, mail, background });
  if (config.mail.devOutbox) await app.register(devOutboxPage, { config, mail });
  await app.register(authorizeEndpoint, { db: deps.db, config, keys, resources, clientMetadata: new ClientMetadataDocuments(deps.db, config, deps.logger) });
  await app.register(devicePages, { db: deps.db, config, resources });
  await app.register(endSessionEndpoint, { db: deps.db, config, keys });
  await app.register(dashboardPages, { db: deps.db, config, keys, revocations, applications, clientGrants, metrics, mail });
  // A setup link's pages: a customer's IT admin sets up domains, SSO and directories without being a member.
  await app.register(setupPages, { db: deps.db, config });

  // The queues start claiming once the app is ready, after every other onReady hook (a plugin's
  // run after its parent's and its elder siblings': this plugin is the last one). Building the
  // app, and the API reference's onReady, hold the event loop for seconds on a busy host: a claim
  // sent before would read its answer only afterwards, past its deadline (CONNECT_TIMEOUT_MS,
  // REQUEST_QUERY_TIMEOUT_MS), discarding a healthy connection that PostgreSQL then counts as
  // abandoned (test/faults/sigterm.test.ts).
  await app.register(async (last) => {
    last.addHook('onReady', async () => {
      for (const start of startWhenReady) await start();
    });
  });

  await revocationsLoaded;
  return app;
}
