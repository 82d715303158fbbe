/**
 * Retention: what has expired is deleted, so the token tables hold what can still matter and
 * their indexes stay the size of the live data (the token endpoint inserts into them at every
 * authorization and every refresh, and rotation adds a row per refresh).
 *
 * - Authorization codes go a week after they expire. Until then a code presented again still
 *   revokes the grant its first redemption created (RFC 6749 §4.1.2); afterwards it is refused
 *   as unknown, with the same invalid_grant.
 * - Refresh tokens go once expired: an expired one is refused whatever else is true of it, and
 *   reuse detection checks expiry first.
 * - Revocations of single access tokens go an hour after the token's exp: verification accepts
 *   a token up to CLOCK_TOLERANCE_S (60 s) past exp, and each instance's RevocationList loads
 *   revocations that recent.
 * - Browser sessions go once expired; the tokens of links sent by email an hour after they
 *   expired or were used (they count toward the hourly limits on links sent until then).
 * - Sign-ups waiting for their address to be confirmed go once their link expired; the record of
 *   each admitted sign-up (sign_up_attempts) an hour after it was made, once out of the window the
 *   per-address and per-client sign-up limits count (src/accounts/sign-ups.ts).
 * - Invitations go 30 days after they expire (the Members page lists expired ones, to re-send).
 * - Sent and failed emails go a week after they were done with (mail_outbox.expires_at, set
 *   then; a message still waiting to be sent has none).
 * - Sign-ins waiting for their second step go once expired; wrong second-step codes once they
 *   are out of the window that counts them (15 minutes).
 * - Device authorizations (RFC 8628) go an hour after their device code expired, whatever was
 *   decided: the grant a redeemed one created lives on by itself.
 * - Pushed authorization requests (RFC 9126) go as soon as they can no longer be used: unused
 *   60 s after the push, used up at once, otherwise at the end of the sign-in they started.
 * - The record of each dynamic registration (client_registrations) goes an hour after it was
 *   made, once out of the window the per-address registration limit counts.
 * - Clients that registered themselves (RFC 7591 dynamic registration, client ID metadata
 *   documents) and never obtained a token go UNUSED_CLIENT_TTL (a day) after they registered
 *   (AG-3): what a flood of registrations leaves behind. One that holds a grant stays, whatever
 *   first_used_at says: deleting it would drop its grants without publishing their revocation.
 * - The Overview's activity counters go ACTIVITY_RETENTION_DAYS (400) days after their day.
 * - Setup links go 30 days after they expired, revoked or not.
 * - A directory's logged SCIM requests go a week after they were made.
 * - Jobs go 30 days after they finished (succeeded or failed); webhook events 30 days after they
 *   happened, with their deliveries and the log of attempts.
 */
import { type RawBuilder, sql } from 'kysely';
import type { Logger } from 'pino';
import { SECOND_STEP_WINDOW_MS } from './accounts/second-factors.js';
import type { DB } from './db/connect.js';

const DAY_S = 24 * 3600;

/** Each table, its key, the time after which (plus the grace) a row has expired. */
const RULES = [
  { table: 'authorization_codes', key: 'id', at: 'expires_at', graceSeconds: 7 * DAY_S },
  { table: 'refresh_tokens', key: 'id', at: 'expires_at', graceSeconds: 0 },
  { table: 'revoked_access_tokens', key: 'jti', at: 'expires_at', graceSeconds: 3600 },
  { table: 'sessions', key: 'id_hash', at: 'expires_at', graceSeconds: 0 },
  { table: 'account_tokens', key: 'id', at: 'expires_at', graceSeconds: 3600 },
  { table: 'invitations', key: 'id', at: 'expires_at', graceSeconds: 30 * DAY_S },
  { table: 'pending_sign_ups', key: 'id', at: 'expires_at', graceSeconds: 0 },
  // An admitted sign-up counts toward its address's and its client's limits for an hour.
  { table: 'sign_up_attempts', key: 'id', at: 'created_at', graceSeconds: 3600 },
  { table: 'mail_outbox', key: 'id', at: 'expires_at', graceSeconds: 0 },
  { table: 'pending_sign_ins', key: 'id_hash', at: 'expires_at', graceSeconds: 0 },
  { table: 'sso_sign_ins', key: 'id', at: 'expires_at', graceSeconds: 0 },
  // Kept until the assertion could no longer be accepted anyway (its NotOnOrAfter, capped, plus the skew).
  { table: 'saml_assertion_ids', key: 'id', at: 'expires_at', graceSeconds: 0 },
  { table: 'second_step_failures', key: 'id', at: 'failed_at', graceSeconds: SECOND_STEP_WINDOW_MS / 1000 },
  // An hour past expiry: a device still polling meanwhile is told expired_token, not invalid_grant.
  { table: 'device_authorizations', key: 'id', at: 'expires_at', graceSeconds: 3600 },
  // A registration counts toward its address's limit for an hour (src/oauth/models/registrations.ts).
  { table: 'client_registrations', key: 'id', at: 'created_at', graceSeconds: 3600 },
  // Finished jobs are kept a month for operators (orgauth job list); unfinished ones never go.
  { table: 'jobs', key: 'id', at: 'finished_at', graceSeconds: 30 * DAY_S },
  // Replay stores: a DPoP proof's jti and a private_key_jwt assertion's, until they could no longer be accepted anyway.
  // Five minutes on: their expiry times come from an instance's clock, compared here with the database's.
  { table: 'seen_jtis', key: 'key', at: 'expires_at', graceSeconds: 300 },
  // A pushed request once no longer usable: its expires_at says when (60 s to first use, the end of the
  // sign-in it started, or the moment it was used up), set by the database's clock it is compared with.
  { table: 'pushed_authorization_requests', key: 'id', at: 'expires_at', graceSeconds: 0 },
  // The webhook delivery log: events go 30 days on, their deliveries and attempts with them.
  { table: 'webhook_events', key: 'id', at: 'created_at', graceSeconds: 30 * DAY_S },
  // Setup links a month after they expired (the owners' record of who was let in, with the audit log's).
  { table: 'setup_links', key: 'id', at: 'expires_at', graceSeconds: 30 * DAY_S },
  // A directory's request log (also trimmed to its newest 1,000 as it grows: src/directory/request-log.ts).
  { table: 'directory_requests', key: 'id', at: 'created_at', graceSeconds: 7 * DAY_S },
] as const;

export type Expired = Record<(typeof RULES)[number]['table'] | 'unused_clients' | 'activity_daily', number>;

/** The Overview's per-day counters are kept this many days (GET .../activity answers at most 366 at once). */
export const ACTIVITY_RETENTION_DAYS = 400;

/** How long a self-registered client that never obtained a token is kept, unless the caller says (config.clientRegistration.unusedClientTtl). */
export const DEFAULT_UNUSED_CLIENT_TTL = DAY_S;

/** Rows per statement: short statements and short locks beside the requests. */
const BATCH = 1000;

/**
 * Deletes every expired row, a batch at a time, until none is left or `stopping()` says so
 * (checked between batches). Rows another instance is deleting at the same moment are skipped
 * (it deletes them), not waited for. A table that fails (the database away, a statement timed
 * out) does not keep the others from being cleaned: its error is passed to `onError`, and the
 * next run starts over. Returns how many rows each table lost (`unused_clients`: self-registered
 * clients older than `unusedClientTtl` seconds, default a day, that never obtained a token).
 */
export async function deleteExpired(
  db: DB,
  options: {
    stopping?: () => boolean;
    onError?: (table: string, err: unknown) => void;
    unusedClientTtl?: number;
    /** Told as each table starts and after each of its batches: the table, its place (1-based) among `of`, and what every table lost so far. */
    onProgress?: (progress: { table: keyof Expired; step: number; of: number; deleted: Readonly<Partial<Expired>> }) => void;
  } = {},
): Promise<Expired> {
  // = any(array(...)), not in (...): the batch's keys are looked up by the primary key however
  // the planner sizes the table (with in (...) it hashes the subquery and reads the whole table,
  // found on saml_assertion_ids at 200,000 rows).
  const steps: { name: keyof Expired; statement: RawBuilder<unknown> }[] = RULES.map(({ table, key, at, graceSeconds }) => ({
    name: table,
    statement: sql`
      delete from ${sql.table(table)} where ${sql.ref(key)} = any(array(
        select ${sql.ref(key)} from ${sql.table(table)}
        where ${sql.ref(at)} < now() - make_interval(secs => ${graceSeconds})
        limit ${BATCH}
        for update skip locked
      ))`,
  }));
  // By the partial index of unused registrations. Their codes and device authorizations go with them.
  steps.push({
    name: 'unused_clients',
    statement: sql`
      delete from applications where id = any(array(
        select id from applications
        where registration <> 'developer' and registration <> 'resource' and first_used_at is null
          and created_at < now() - make_interval(secs => ${options.unusedClientTtl ?? DEFAULT_UNUSED_CLIENT_TTL})
          and not exists (select 1 from grants where grants.application_id = applications.id)
        limit ${BATCH}
        for update skip locked
      ))`,
  });
  // The activity counters (src/activity.ts), by their day.
  steps.push({
    name: 'activity_daily',
    statement: sql`
      delete from activity_daily where ctid = any(array(
        select ctid from activity_daily
        where day < current_date - ${ACTIVITY_RETENTION_DAYS}::int
        limit ${BATCH}
        for update skip locked
      ))`,
  });
  const deleted = {} as Expired;
  for (const [i, { name, statement }] of steps.entries()) {
    deleted[name] = 0;
    const progress = () => options.onProgress?.({ table: name, step: i + 1, of: steps.length, deleted });
    progress();
    try {
      while (!options.stopping?.()) {
        const result = await statement.execute(db);
        const n = Number(result.numAffectedRows ?? 0n);
        deleted[name] += n;
        progress();
        if (n < BATCH) break;
      }
    } catch (err) {
      if (!options.onError) throw err;
      options.onError(name, err);
    }
  }
  return deleted;
}

/** Runs deleteExpired every `intervalSeconds` (0: never) in the server; several instances may each run it. */
export class ExpiredRowSweeper {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private stopping = false;

  constructor(
    private readonly db: DB,
    private readonly options: {
      intervalSeconds: number;
      /** UNUSED_CLIENT_TTL (deleteExpired's unusedClientTtl). */
      unusedClientTtl?: number | undefined;
      logger?: Pick<Logger, 'info' | 'warn'> | undefined;
    },
  ) {}

  start(): void {
    if (this.options.intervalSeconds === 0 || this.timer) return;
    this.timer = setInterval(() => void this.sweep(), this.options.intervalSeconds * 1000);
    this.timer.unref();
  }

  /** One sweep; a sweep still running is joined, not doubled. */
  private sweep(): Promise<void> {
    const { logger } = this.options;
    this.running ??= deleteExpired(this.db, {
      // A backlog (the first sweep of a large database) must not hold up a shutdown.
      stopping: () => this.stopping,
      unusedClientTtl: this.options.unusedClientTtl,
      // The database is away or slow: the next sweep catches up.
      onError: (table, err) => logger?.warn({ err, table }, 'could not delete expired rows'),
    })
      .then((deleted) => {
        if (Object.values(deleted).some((n) => n > 0)) logger?.info({ deleted }, 'expired rows deleted');
      })
      .finally(() => {
        this.running = undefined;
      });
    return this.running;
  }

  async stop(): Promise<void> {
    this.stopping = true;
    clearInterval(this.timer);
    this.timer = undefined;
    await this.running;
  }
}
