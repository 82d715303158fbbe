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
 * - Invitations go 30 days after they expire (the Members page lists expired ones, to re-send).
 * - Sent and failed emails go a week after they were done with (mail_outbox.expires_at, set
 *   then; a message still waiting to be sent has none).
 * - Sign-ins waiting for their second step go once expired; wrong second-step codes once they
 *   are out of the window that counts them (15 minutes).
 */
import { sql } from 'kysely';
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
  { table: 'mail_outbox', key: 'id', at: 'expires_at', graceSeconds: 0 },
  { table: 'pending_sign_ins', key: 'id_hash', at: 'expires_at', graceSeconds: 0 },
  { table: 'sso_sign_ins', key: 'id', at: 'expires_at', graceSeconds: 0 },
  // Kept until the assertion could no longer be accepted anyway (its NotOnOrAfter, capped, plus the skew).
  { table: 'saml_assertion_ids', key: 'id', at: 'expires_at', graceSeconds: 0 },
  { table: 'second_step_failures', key: 'id', at: 'failed_at', graceSeconds: SECOND_STEP_WINDOW_MS / 1000 },
] as const;

export type Expired = Record<(typeof RULES)[number]['table'], number>;

/** Rows per statement: short statements and short locks beside the requests. */
const BATCH = 1000;

/**
 * Deletes every expired row, a batch at a time, until none is left or `stopping()` says so
 * (checked between batches). Rows another instance is deleting at the same moment are skipped
 * (it deletes them), not waited for. A table that fails (the database away, a statement timed
 * out) does not keep the others from being cleaned: its error is passed to `onError`, and the
 * next run starts over. Returns how many rows each table lost.
 */
export async function deleteExpired(
  db: DB,
  options: { stopping?: () => boolean; onError?: (table: string, err: unknown) => void } = {},
): Promise<Expired> {
  const deleted = {} as Expired;
  for (const { table, key, at, graceSeconds } of RULES) {
    deleted[table] = 0;
    try {
      while (!options.stopping?.()) {
        // = any(array(...)), not in (...): the batch's keys are looked up by the primary key
        // however the planner sizes the table (with in (...) it hashes the subquery and reads
        // the whole table, found on saml_assertion_ids at 200,000 rows).
        const result = await sql`
          delete from ${sql.table(table)} where ${sql.ref(key)} = any(array(
            select ${sql.ref(key)} from ${sql.table(table)}
            where ${sql.ref(at)} < now() - make_interval(secs => ${graceSeconds})
            limit ${BATCH}
            for update skip locked
          ))`.execute(db);
        const n = Number(result.numAffectedRows ?? 0n);
        deleted[table] += n;
        if (n < BATCH) break;
      }
    } catch (err) {
      if (!options.onError) throw err;
      options.onError(table, err);
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
    private readonly options: { intervalSeconds: number; logger?: Pick<Logger, 'info' | 'warn'> | undefined },
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
