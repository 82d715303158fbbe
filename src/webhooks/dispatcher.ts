/**
 * The webhook dispatcher: delivers the events that the audit trigger queued (migration 0017) to
 * the organizations' endpoints, signed per Standard Webhooks, by any instance, at least once.
 *
 * Queue: webhook_deliveries, one row per event and endpoint, claimed as the mail outbox claims
 * its messages (src/mail/outbox.ts): a short statement takes due pending rows `FOR UPDATE SKIP
 * LOCKED` (two instances never take the same one) and moves their next_attempt_at forward by
 * LEASE_S. The lease is held without an open transaction, so a slow receiver holds no
 * connection; `attempts` names the lease's owner, and an outcome is written only while it is
 * unchanged. An instance that dies mid-request leaves its lease to run out and the delivery is
 * tried again then: receivers dedupe on `webhook-id`, the event's message_id, the same on every
 * attempt. Up to CONCURRENCY deliveries run at once per instance, so one slow receiver does not
 * hold up every other organization's events. New events arrive by NOTIFY on WEBHOOK_CHANNEL
 * (the trigger sends it at commit); every POLL_MS the queue is read anyway, which is how retries
 * fall due and how an instance without LISTEN takes part.
 *
 * Each attempt is one POST through the guarded outbound client (AG-1): the URL is checked again
 * first with the rules that admitted it (src/webhooks/url.ts), since DNS may have changed since,
 * and the client resolves once, refuses special-use addresses, pins the connection to what it
 * checked, never follows a redirect (a 3xx is a failure like any other non-2xx) and gives up
 * after WEBHOOK_TIMEOUT_MS. WEBHOOK_ALLOW_PRIVATE lifts the scheme and address rules, for
 * development and tests. Every attempt is logged in webhook_attempts with its status, the first
 * KEPT_BODY_BYTES of the answer or the error, and its duration.
 *
 * After a failure the next attempt waits WEBHOOK_RETRY_DELAYS[attempt - 1] seconds; after the
 * last delay the delivery is failed. An endpoint's failing_since marks the first failure of its
 * current run of failures and a success clears it; a failure when the run is DISABLE_AFTER_S old
 * disables the endpoint (disabled_reason 'failing'), fails its pending deliveries and emails the
 * organization's owners, in one transaction. Deliveries claimed for a disabled endpoint are
 * failed without a request; a deleted endpoint's go with it (the foreign key cascades), and an
 * attempt in flight meanwhile ends unrecorded (see record()).
 */
import { sql } from 'kysely';
import type { Logger } from 'pino';
import type { Config } from '../config.js';
import { type DB, inTransaction, type Listen } from '../db/connect.js';
import { AppError } from '../errors.js';
import { describeError } from '../lib/errno.js';
import { createOutboundFetch, type OutboundFetch, type OutboundOptions, type ResolveHostname } from '../lib/outbound.js';
import { webhookDisabledMessage } from '../mail/messages.js';
import { type MailQueue, queueMail } from '../mail/outbox.js';
import type { Metrics } from '../metrics.js';
import { WEBHOOK_CHANNEL } from './catalogue.js';
import { openWebhookSecret } from './secrets.js';
import { webhookHeaders } from './signing.js';
import { checkWebhookUrl, urlWithoutQuery, webhookResolver } from './url.js';

/** Connect, request and answer together, per attempt. */
export const WEBHOOK_TIMEOUT_MS = 10_000;
/** What the delivery log keeps of an answer's body. */
export const KEPT_BODY_BYTES = 1024;
/** A run of failures this long (five days) disables the endpoint at its next failure. */
export const DISABLE_AFTER_S = 5 * 24 * 3600;
/** Deliveries in flight at once, per instance. */
const CONCURRENCY = 8;
/** Due deliveries a claim looks at to find up to CONCURRENCY of distinct endpoints. */
const CANDIDATES = 500;
/** Far beyond an attempt's WEBHOOK_TIMEOUT_MS, so a lease never runs out under a live request. */
const LEASE_S = 60;
/**
 * The answer read at most (the log keeps its first KEPT_BODY_BYTES): receivers are asked for a
 * 2xx, not a body, but some echo a whole page. A larger one fails the attempt (the outbound
 * client refuses it rather than hold it in memory); docs/webhooks.md says so.
 */
const MAX_RESPONSE_BYTES = 1024 * 1024;
const POLL_MS = 1000;
/** How long stop() waits for requests in flight (a shutdown has 9 s in all; src/server.ts). */
const STOP_WAIT_MS = 2000;
const ABORT_WAIT_MS = 500;
const ENDPOINT_DISABLED = 'endpoint disabled';

export interface WebhookDispatcherOptions {
  config: Config;
  logger: Pick<Logger, 'info' | 'warn' | 'error'>;
  metrics?: Metrics | undefined;
  /** LISTEN for new events; without it they wait for the next poll (at most POLL_MS). */
  listen?: Listen | undefined;
  /** Queues the owners' email when an endpoint is disabled; without it the mail is written to the outbox table for whichever instance sends. */
  mail?: MailQueue | undefined;
  /** The outbound client's resolver (tests play DNS with it); by default DNS_SERVERS or the system's. */
  outbound?: OutboundOptions | undefined;
}

/** A claimed delivery with what its attempt needs. */
interface Claimed {
  id: number;
  attempts: number;
  message_id: string;
  payload: unknown;
  endpoint_id: number;
  organization_id: number;
  url: string;
  enabled: boolean;
  secret_sealed: string;
  /** Null unless a rotated-out secret still signs. */
  previous_secret_sealed: string | null;
}

interface AttemptResult {
  startedAt: Date;
  status: number | null;
  body: string | null;
  error: string | null;
  durationMs: number;
}

export class WebhookDispatcher {
  private readonly fetch: OutboundFetch;
  private readonly lookup: ResolveHostname;
  private readonly inFlight = new Set<Promise<void>>();
  /** Endpoints with a request in flight here: one at a time each, so a slow receiver holds one slot, not all. */
  private readonly busyEndpoints = new Set<number>();
  /** Aborts the requests still in flight when stop() has waited long enough. */
  private readonly aborter = new AbortController();
  private claiming: Promise<void> | undefined;
  private again = false;
  private stopped = false;
  private timer: NodeJS.Timeout | undefined;
  private unlisten: (() => Promise<void>) | undefined;

  constructor(
    private readonly db: DB,
    private readonly options: WebhookDispatcherOptions,
  ) {
    const { config } = options;
    const allowPrivate = config.webhooks.allowPrivate;
    this.lookup = options.outbound?.lookup ?? webhookResolver(config.dnsServers);
    // Webhook URLs are chosen by organization admins, not the operator: OUTBOUND_ALLOW_NETWORKS
    // (an operator's trusted IdP network) does not extend to them.
    this.fetch = createOutboundFetch(
      {
        allowHttp: allowPrivate,
        allowedNetworks: allowPrivate ? ['0.0.0.0/0', '::/0'] : [],
        timeoutMs: WEBHOOK_TIMEOUT_MS,
        maxBytes: MAX_RESPONSE_BYTES,
        caFile: config.outbound.caFile,
      },
      { lookup: this.lookup },
    );
  }

  /** Follows new events (LISTEN) and starts polling; delivers what is already due. */
  async start(): Promise<void> {
    if (this.timer || this.stopped) return;
    if (this.options.listen) {
      try {
        this.unlisten = await this.options.listen(WEBHOOK_CHANNEL, () => this.wake(), () => this.wake());
      } catch (err) {
        // Polling alone still delivers every event within POLL_MS.
        this.options.logger.warn({ err }, 'could not listen for webhook events; polling only');
      }
    }
    this.timer = setInterval(() => this.wake(), POLL_MS);
    this.timer.unref();
    this.wake();
  }

  /** Claims what is due now, up to the free slots; a claim already going runs once more afterwards. */
  wake(): void {
    if (this.stopped) return;
    if (this.claiming) {
      this.again = true;
      return;
    }
    this.claiming = this.fill().finally(() => {
      this.claiming = undefined;
    });
  }

  /**
   * Stops claiming. Requests in flight get STOP_WAIT_MS to finish and be recorded; after that
   * they are aborted unrecorded and their deliveries handed back, due at once, for another
   * instance (or the next start) to send.
   */
  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    this.timer = undefined;
    await this.unlisten?.().catch(() => {});
    this.unlisten = undefined;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.idle(), new Promise<void>((resolve) => (timer = setTimeout(resolve, STOP_WAIT_MS)))]);
    clearTimeout(timer);
    this.aborter.abort(new Error('the webhook dispatcher stopped'));
    // Aborted requests end at once; a URL check still waiting on DNS is not waited for.
    await Promise.race([Promise.allSettled([...this.inFlight]), new Promise<void>((resolve) => (timer = setTimeout(resolve, ABORT_WAIT_MS)))]);
    clearTimeout(timer);
  }

  private async idle(): Promise<void> {
    while (this.claiming || this.inFlight.size > 0) await Promise.allSettled([this.claiming, ...this.inFlight]);
  }

  private async fill(): Promise<void> {
    do {
      this.again = false;
      const slots = CONCURRENCY - this.inFlight.size;
      // Full: each delivery that finishes wakes the dispatcher again.
      if (slots <= 0) return;
      let claimed: Claimed[];
      try {
        claimed = await this.claim(slots);
      } catch (err) {
        this.options.logger.warn({ err }, 'could not read the webhook queue');
        return;
      }
      for (const delivery of claimed) this.track(delivery);
      if (claimed.length === slots) this.again = true;
    } while (this.again && !this.stopped);
  }

  private track(delivery: Claimed): void {
    this.busyEndpoints.add(delivery.endpoint_id);
    const running = this.deliver(delivery).catch((err: unknown) => {
      // The database is away: the lease runs out and the delivery is tried again then.
      this.options.logger.warn({ err, delivery_id: delivery.id }, 'could not record a webhook delivery attempt');
    });
    this.inFlight.add(running);
    void running.finally(() => {
      this.inFlight.delete(running);
      this.busyEndpoints.delete(delivery.endpoint_id);
      this.wake();
    });
  }

  /**
   * Takes up to `limit` due deliveries (a lease each) with their events and endpoints, in one
   * statement: at most one per endpoint, and none of an endpoint this instance is sending to
   * already, so a receiver that hangs for its 10 s holds one slot however many of its events are
   * due, and every other organization's events go on. The candidates are the oldest due ones
   * (bounded, by the index of due deliveries).
   */
  private async claim(limit: number): Promise<Claimed[]> {
    const { rows } = await sql<Claimed>`
      with candidates as (
        select id, row_number() over (partition by endpoint_id order by next_attempt_at, id) as nth
        from (
          select id, endpoint_id, next_attempt_at from webhook_deliveries
          where state = 'pending' and next_attempt_at <= now() and endpoint_id <> all(${[...this.busyEndpoints]}::bigint[])
          order by next_attempt_at
          limit ${CANDIDATES}
        ) oldest
      ), due as (
        select id from webhook_deliveries
        where id in (select id from candidates where nth = 1) and state = 'pending' and next_attempt_at <= now()
        order by next_attempt_at
        limit ${limit}
        for update skip locked
      ), claimed as (
        update webhook_deliveries d
        set attempts = d.attempts + 1, next_attempt_at = now() + make_interval(secs => ${LEASE_S})
        from due
        where d.id = due.id
        returning d.id, d.attempts, d.event_id, d.endpoint_id
      )
      select c.id, c.attempts, ev.message_id, ev.payload, e.id as endpoint_id, e.organization_id, e.url, e.enabled, e.secret_sealed,
        case when e.previous_secret_expires_at > now() then e.previous_secret_sealed end as previous_secret_sealed
      from claimed c
      join webhook_events ev on ev.id = c.event_id
      join webhook_endpoints e on e.id = c.endpoint_id`.execute(this.db);
    return rows.map((row) => ({ ...row, id: Number(row.id), endpoint_id: Number(row.endpoint_id), organization_id: Number(row.organization_id) }));
  }

  private async deliver(delivery: Claimed): Promise<void> {
    if (!delivery.enabled) return this.stopDisabled(delivery);
    const result = await this.attempt(delivery);
    // Shutting down: the request was cut short by us, not by the receiver.
    if (result === undefined) return this.handBack(delivery);
    await this.record(delivery, result);
  }

  /**
   * A delivery whose request stop() cut short: due again at once, its claim not counted as an
   * attempt (the receiver may have had it: delivery is at least once, and the webhook-id is the
   * same). Only while the lease is still ours; best effort (the database may be closing too: the
   * lease then runs out as after a crash).
   */
  private async handBack(delivery: Claimed): Promise<void> {
    await this.db
      .updateTable('webhook_deliveries')
      .set({ attempts: delivery.attempts - 1, next_attempt_at: sql`now()` })
      .where('id', '=', delivery.id)
      .where('attempts', '=', delivery.attempts)
      .where('state', '=', 'pending')
      .execute()
      .catch(() => {});
  }

  /** One POST; undefined when stop() aborted it. */
  private async attempt(delivery: Claimed): Promise<AttemptResult | undefined> {
    const started = Date.now();
    const done = (status: number | null, body: string | null, error: string | null): AttemptResult => ({
      startedAt: new Date(started),
      status,
      body,
      error,
      durationMs: Date.now() - started,
    });
    try {
      const { config } = this.options;
      const url = await checkWebhookUrl(delivery.url, config, { lookup: this.lookup });
      const body = JSON.stringify(delivery.payload);
      const secrets = [delivery.secret_sealed, ...(delivery.previous_secret_sealed === null ? [] : [delivery.previous_secret_sealed])].map((sealed) =>
        openWebhookSecret(config.secretKey, sealed),
      );
      const response = await this.fetch(url, {
        method: 'POST',
        headers: webhookHeaders({ messageId: delivery.message_id, body, secrets, at: new Date() }),
        body,
        redirect: 'manual',
        signal: this.aborter.signal,
      });
      const kept = keptText(new Uint8Array(await response.arrayBuffer()));
      if (response.ok) return done(response.status, kept, null);
      const location = response.headers.get('location');
      const error =
        response.status >= 300 && response.status < 400
          ? `redirect (${response.status}${location ? ` to ${clip(location, 200)}` : ''}) not followed`
          : `answered ${response.status}`;
      return done(response.status, kept, error);
    } catch (err) {
      if (this.aborter.signal.aborted) return undefined;
      return done(null, null, describe(err));
    }
  }

  /** A delivery claimed for a disabled endpoint: failed without a request, its claim not counted as an attempt. */
  private async stopDisabled(delivery: Claimed): Promise<void> {
    const stopped = await this.db
      .updateTable('webhook_deliveries')
      .set({ state: 'failed', last_error: ENDPOINT_DISABLED, finished_at: sql`now()`, attempts: delivery.attempts - 1 })
      .where('id', '=', delivery.id)
      .where('attempts', '=', delivery.attempts)
      .executeTakeFirst();
    if (stopped.numUpdatedRows > 0n) this.options.metrics?.webhookDeliveries.inc({ outcome: 'failed' });
  }

  /**
   * Writes the attempt and its consequences in one transaction, only while the lease is still
   * ours (`attempts` unchanged, still pending): otherwise another instance has taken the
   * delivery over, or an admin has retried it, and their outcome stands.
   *
   * The endpoint's row is key-shared first, before the delivery is touched: the order a delete
   * takes them in (the endpoint, then its deliveries by the cascade; see EndpointLock in
   * endpoints.ts). Taken the other way round, a delete arriving between the delivery's update and
   * the endpoint's (failing_since) would deadlock with it. Now a delete in progress is waited for
   * and the endpoint is then gone: the delivery went with it and nothing is written, as when a
   * delete comes after. A delete that comes during this transaction waits for it instead.
   */
  private async record(delivery: Claimed, result: AttemptResult): Promise<void> {
    const { config, logger, metrics } = this.options;
    const delays = config.webhooks.retryDelaysSeconds;
    const succeeded = result.error === null;
    const retryIn = succeeded ? undefined : delays[delivery.attempts - 1];
    const outcome = await inTransaction(this.db, async (trx) => {
      const endpoint = await trx.selectFrom('webhook_endpoints').select('id').where('id', '=', delivery.endpoint_id).forKeyShare().executeTakeFirst();
      if (!endpoint) return undefined;
      const ours = trx
        .updateTable('webhook_deliveries')
        .where('id', '=', delivery.id)
        .where('attempts', '=', delivery.attempts)
        .where('state', '=', 'pending');
      const last = { last_status: result.status, last_error: result.error };
      const written = await (succeeded
        ? ours.set({ ...last, state: 'succeeded', finished_at: sql`now()` })
        : retryIn === undefined
          ? ours.set({ ...last, state: 'failed', finished_at: sql`now()` })
          : ours.set({ ...last, next_attempt_at: sql`now() + make_interval(secs => ${retryIn})` })
      ).executeTakeFirst();
      if (written.numUpdatedRows === 0n) return undefined;
      await trx
        .insertInto('webhook_attempts')
        .values({
          delivery_id: delivery.id,
          attempt: delivery.attempts,
          started_at: result.startedAt,
          duration_ms: result.durationMs,
          status: result.status,
          response_body: result.body,
          error: result.error,
        })
        .execute();
      if (succeeded) {
        await trx.updateTable('webhook_endpoints').set({ failing_since: null }).where('id', '=', delivery.endpoint_id).where('failing_since', 'is not', null).execute();
        return { disabled: undefined };
      }
      return { disabled: await this.noteFailure(trx, delivery) };
    });
    if (outcome === undefined) return;
    const log = { delivery_id: delivery.id, endpoint_id: delivery.endpoint_id, organization_id: delivery.organization_id, attempt: delivery.attempts };
    if (succeeded) metrics?.webhookDeliveries.inc({ outcome: 'succeeded' });
    else if (retryIn !== undefined && outcome.disabled === undefined) {
      metrics?.webhookDeliveries.inc({ outcome: 'retry' });
      logger.info({ ...log, retry_in_s: retryIn, status: result.status, reason: result.error }, 'webhook delivery failed; will retry');
    } else {
      metrics?.webhookDeliveries.inc({ outcome: 'failed' });
      logger.info({ ...log, status: result.status, reason: result.error }, 'webhook delivery failed; not retried');
    }
    if (outcome.disabled !== undefined) {
      // The others of the endpoint's pending deliveries, failed with it.
      if (outcome.disabled.stopped > 0) metrics?.webhookDeliveries.inc({ outcome: 'failed' }, outcome.disabled.stopped);
      if (outcome.disabled.emailed > 0) this.options.mail?.wake();
      logger.warn(
        { endpoint_id: delivery.endpoint_id, organization_id: delivery.organization_id, owners_emailed: outcome.disabled.emailed },
        'webhook endpoint disabled: it has failed for five days',
      );
    }
  }

  /**
   * Marks the endpoint failing (from now, unless it already was); when the run has lasted
   * DISABLE_AFTER_S, disables it, fails its pending deliveries and emails its organization's
   * owners. Returns what disabling did, or undefined when the endpoint stays enabled. Only the
   * transaction that flips `enabled` does the rest, so two instances failing at once email once.
   */
  private async noteFailure(trx: DB, delivery: Claimed): Promise<{ stopped: number; emailed: number } | undefined> {
    // Written only when the run of failures starts; afterwards read (no row write per failure).
    await trx.updateTable('webhook_endpoints').set({ failing_since: sql`now()` }).where('id', '=', delivery.endpoint_id).where('failing_since', 'is', null).execute();
    const marked = await trx
      .selectFrom('webhook_endpoints')
      .select(['failing_since', sql<boolean>`failing_since <= now() - make_interval(secs => ${DISABLE_AFTER_S})`.as('expired')])
      .where('id', '=', delivery.endpoint_id)
      .executeTakeFirst();
    if (!marked?.expired) return undefined;
    const disabled = await trx
      .updateTable('webhook_endpoints')
      .set({ enabled: false, disabled_reason: 'failing', updated_at: sql`now()` })
      .where('id', '=', delivery.endpoint_id)
      .where('enabled', '=', true)
      .returning(['url', 'organization_id'])
      .executeTakeFirst();
    if (!disabled) return undefined;
    // Only those nobody holds (SKIP LOCKED): one another attempt is recording now waits for
    // nothing here (no deadlock), and fails by itself when next claimed (stopDisabled).
    const stopped = await sql`
      update webhook_deliveries set state = 'failed', last_error = ${ENDPOINT_DISABLED}, finished_at = now()
      where id in (
        select id from webhook_deliveries
        where endpoint_id = ${delivery.endpoint_id} and state = 'pending' and id <> ${delivery.id}
        for update skip locked
      )`.execute(trx);
    // This one keeps its own error: it is why the endpoint was disabled.
    await trx.updateTable('webhook_deliveries').set({ state: 'failed', finished_at: sql`now()` }).where('id', '=', delivery.id).where('state', '=', 'pending').execute();
    const emailed = await this.emailOwners(trx, disabled.organization_id, disabled.url, marked.failing_since ?? new Date());
    return { stopped: Number(stopped.numAffectedRows ?? 0n), emailed };
  }

  private async emailOwners(trx: DB, organizationId: number, url: string, failingSince: Date): Promise<number> {
    const { config, mail } = this.options;
    const organization = await trx.selectFrom('organizations').select('name').where('id', '=', organizationId).executeTakeFirst();
    if (!organization) return 0;
    const owners = await trx
      .selectFrom('memberships')
      .innerJoin('users', 'users.id', 'memberships.user_id')
      .select(['users.email', 'users.name'])
      .where('memberships.organization_id', '=', organizationId)
      .where('memberships.role', '=', 'owner')
      .execute();
    for (const owner of owners) {
      const message = webhookDisabledMessage({
        issuer: config.issuer,
        to: owner.email,
        name: owner.name,
        organizationName: organization.name,
        url: urlWithoutQuery(url),
        failingSince,
      });
      if (mail) await mail.queue(trx, message);
      else await queueMail(trx, config.secretKey, message);
    }
    return owners.length;
  }
}

/**
 * The first KEPT_BODY_BYTES of an answer as text. A multi-byte character cut at the end, or
 * bytes that are not UTF-8, become U+FFFD; NUL too, which a text column cannot hold.
 */
function keptText(bytes: Uint8Array): string {
  return new TextDecoder('utf-8', { fatal: false }).decode(bytes.subarray(0, KEPT_BODY_BYTES)).replace(/\u0000/g, '\uFFFD');
}

function clip(text: string, max: number): string {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/**
 * The error as the delivery log shows it: a refused URL as the API words it; otherwise its code
 * (ECONNREFUSED …) and message; on one line.
 */
function describe(err: unknown): string {
  return err instanceof AppError ? clip(err.description, 500) : describeError(err);
}
