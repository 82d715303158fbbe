/**
 * The set of revoked grants, in memory, so checking an access token costs no query (BR-5).
 * Kept current three ways: revocations made here are added at once; other instances' arrive by
 * LISTEN/NOTIFY within milliseconds; and a poll every POLL_MS catches anything a dropped LISTEN
 * connection missed, so a revocation is honoured everywhere within one second regardless.
 */
import { sql } from 'kysely';
import type { FastifyBaseLogger } from 'fastify';
import type { DB, Listen } from '../db/connect.js';
import { REVOCATION_CHANNEL, revokeGrant, type RevocationReason } from './grant-store.js';

const POLL_MS = 500;
/** Commits land after their now(): the poll looks back this far past the newest revocation it saw. */
const POLL_OVERLAP_S = 10;

export class RevocationList {
  private revoked = new Set<number>();
  private newestSeen: Date | undefined;
  private timer: NodeJS.Timeout | undefined;
  private unlisten: (() => Promise<void>) | undefined;
  private polling: Promise<void> | undefined;

  constructor(
    private readonly db: DB,
    private readonly options: { accessTokenTtl: number; listen?: Listen | undefined; logger?: FastifyBaseLogger | undefined },
  ) {}

  /** Loads every revocation that can still matter and starts following new ones. */
  async start(): Promise<void> {
    await this.poll();
    if (this.options.listen) {
      this.unlisten = await this.options.listen(
        REVOCATION_CHANNEL,
        (payload) => {
          const id = Number(payload);
          if (Number.isSafeInteger(id)) this.revoked.add(id);
        },
        () => void this.poll(),
      );
    }
    this.timer = setInterval(() => void this.poll(), POLL_MS);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.unlisten?.();
    await this.polling;
  }

  isRevoked(grantId: number): boolean {
    return this.revoked.has(grantId);
  }

  /** Revokes a grant (see revokeGrant) and refuses its tokens here at once, before the NOTIFY arrives. */
  async revoke(grantId: number, reason: RevocationReason, actor?: Parameters<typeof revokeGrant>[3]): Promise<boolean> {
    const revoked = await revokeGrant(this.db, grantId, reason, actor);
    this.revoked.add(grantId);
    return revoked;
  }

  /**
   * Grants revoked since the newest one seen (with overlap). The first load takes every grant
   * revoked within one access-token lifetime: older ones have no live tokens left.
   */
  private poll(): Promise<void> {
    this.polling ??= (async () => {
      try {
        const since = this.newestSeen
          ? sql<Date>`${this.newestSeen}::timestamptz - make_interval(secs => ${POLL_OVERLAP_S})`
          : sql<Date>`now() - make_interval(secs => ${this.options.accessTokenTtl})`;
        const rows = await this.db
          .selectFrom('grants')
          .select(['id', 'revoked_at'])
          .where('revoked_at', 'is not', null)
          .where('revoked_at', '>', since)
          .execute();
        for (const row of rows) {
          this.revoked.add(row.id);
          if (row.revoked_at && (!this.newestSeen || row.revoked_at > this.newestSeen)) this.newestSeen = row.revoked_at;
        }
        this.newestSeen ??= new Date(Date.now() - POLL_OVERLAP_S * 1000);
      } catch (err) {
        // The database is away: keep the set we have; the next poll catches up.
        this.options.logger?.warn({ err }, 'could not refresh the revoked grants');
      } finally {
        this.polling = undefined;
      }
    })();
    return this.polling;
  }
}
