/**
 * Revoked grants and revoked access tokens, in memory, so checking an access token costs no
 * query (BR-5). Kept current three ways: revocations made here are added at once; other
 * instances' arrive by LISTEN/NOTIFY within milliseconds; and a poll every POLL_MS catches
 * anything a dropped LISTEN connection missed, so a revocation is honoured everywhere within one
 * second regardless. Entries are dropped once no token they could refuse is still unexpired.
 */
import { sql } from 'kysely';
import type { FastifyBaseLogger } from 'fastify';
import type { DB, Listen } from '../db/connect.js';
import type { Metrics } from '../metrics.js';
import { CLOCK_TOLERANCE_S } from './access-tokens.js';
import type { Actor } from '../audit/events.js';
import { REVOCATION_CHANNEL, revokeAccessToken, revokeGrant, type RevocationReason, type RevokedGrantsMemory } from './grant-store.js';

const POLL_MS = 500;
/** Commits land after their now(): the poll looks back this far past the newest revocation it saw. */
const POLL_OVERLAP_S = 10;
/** Expired entries are dropped this often, and kept this long past the end of their tokens. */
const PRUNE_EVERY_MS = 60_000;
const PRUNE_MARGIN_S = 60;


/** What an access token says about itself that revocation looks at. */
export interface RevocableToken {
  jti: string;
  grant_id: number;
  organization_id: number;
  exp: number;
}

export class RevocationList implements RevokedGrantsMemory {
  /** Grant id → when it was revoked (ms), as far as this instance knows. */
  private readonly grants = new Map<number, number>();
  /** jti → the token's exp (s). */
  private readonly tokens = new Map<string, number>();
  private newestSeen: Date | undefined;
  private lastPruned = Date.now();
  private timer: NodeJS.Timeout | undefined;
  private unlisten: (() => Promise<void>) | undefined;
  private polling: Promise<void> | undefined;

  constructor(
    private readonly db: DB,
    private readonly options: { accessTokenTtl: number; listen?: Listen | undefined; logger?: FastifyBaseLogger | undefined; metrics?: Metrics | undefined },
  ) {}

  /** Loads every revocation that can still matter and starts following new ones. */
  async start(): Promise<void> {
    await this.poll();
    if (this.options.listen) {
      this.unlisten = await this.options.listen(REVOCATION_CHANNEL, (payload) => this.received(payload), () => void this.poll());
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
    return this.grants.has(grantId);
  }

  /** Whether the token was revoked, by itself or with its grant. */
  isTokenRevoked(token: Pick<RevocableToken, 'jti' | 'grant_id'>): boolean {
    return this.grants.has(token.grant_id) || this.tokens.has(token.jti);
  }

  /** Revokes a grant (see revokeGrant) and refuses its tokens here at once, before the NOTIFY arrives. */
  async revoke(grantId: number, reason: RevocationReason, actor?: Actor): Promise<boolean> {
    const revoked = await revokeGrant(this.db, grantId, reason, actor);
    this.markRevoked([grantId]);
    if (revoked) this.options.metrics?.revoked('grant', reason);
    return revoked;
  }

  /**
   * Grants revoked by this instance (revokeGrants, committed): refused here at once, before the
   * NOTIFY arrives, and counted in the metrics.
   */
  noteRevoked(grantIds: readonly number[], reason: RevocationReason): void {
    this.markRevoked(grantIds);
    this.options.metrics?.revoked('grant', reason, grantIds.length);
  }

  private markRevoked(grantIds: readonly number[]): void {
    const now = Date.now();
    for (const id of grantIds) if (!this.grants.has(id)) this.grants.set(id, now);
  }

  /** Revokes one access token (see revokeAccessToken), refused here at once. */
  async revokeToken(token: RevocableToken, reason: RevocationReason, actor?: Actor): Promise<boolean> {
    const revoked = await revokeAccessToken(this.db, { jti: token.jti, organizationId: token.organization_id, grantId: token.grant_id, exp: token.exp }, reason, actor);
    this.tokens.set(token.jti, token.exp);
    if (revoked) this.options.metrics?.revoked('access_token', reason);
    return revoked;
  }

  private received(payload: string): void {
    const token = /^jti (\S+) (\d+)$/.exec(payload);
    if (token) {
      this.tokens.set(token[1]!, Number(token[2]));
      return;
    }
    // Grant ids, comma separated (revokeGrants).
    const ids = payload.split(',').map(Number).filter((id) => Number.isSafeInteger(id) && id > 0);
    this.markRevoked(ids);
  }

  /** Drops what can no longer matter: tokens past exp, grants revoked longer ago than a token lives. */
  private prune(): void {
    const now = Date.now();
    if (now - this.lastPruned < PRUNE_EVERY_MS) return;
    this.lastPruned = now;
    const nowS = now / 1000;
    for (const [jti, exp] of this.tokens) if (exp + PRUNE_MARGIN_S < nowS) this.tokens.delete(jti);
    const grantCutoff = now - (this.options.accessTokenTtl + PRUNE_MARGIN_S) * 1000;
    for (const [id, revokedAt] of this.grants) if (revokedAt < grantCutoff) this.grants.delete(id);
  }

  /**
   * Revocations since the newest one seen (with overlap). The first load takes every grant
   * revoked within one access-token lifetime (older ones have no live tokens left) and every
   * revoked token not yet expired.
   */
  private poll(): Promise<void> {
    this.polling ??= (async () => {
      try {
        const since = this.newestSeen
          ? sql<Date>`${this.newestSeen}::timestamptz - make_interval(secs => ${POLL_OVERLAP_S})`
          : sql<Date>`now() - make_interval(secs => ${this.options.accessTokenTtl})`;
        const [grants, tokens] = await Promise.all([
          this.db.selectFrom('grants').select(['id', 'revoked_at']).where('revoked_at', 'is not', null).where('revoked_at', '>', since).execute(),
          this.db
            .selectFrom('revoked_access_tokens')
            .select(['jti', 'expires_at', 'revoked_at'])
            .where('revoked_at', '>', since)
            // Verification accepts a token up to CLOCK_TOLERANCE_S past its exp.
            .where('expires_at', '>', sql<Date>`now() - make_interval(secs => ${CLOCK_TOLERANCE_S})`)
            .execute(),
        ]);
        let newest = this.newestSeen;
        for (const row of grants) {
          const revokedAt = row.revoked_at!;
          if (!this.grants.has(row.id)) this.grants.set(row.id, revokedAt.getTime());
          if (!newest || revokedAt > newest) newest = revokedAt;
        }
        for (const row of tokens) {
          this.tokens.set(row.jti, Math.floor(row.expires_at.getTime() / 1000));
          if (!newest || row.revoked_at > newest) newest = row.revoked_at;
        }
        // Nothing revoked yet: start from the database's clock, which revoked_at is set by.
        this.newestSeen = newest ?? (await sql<{ now: Date }>`select now() as now`.execute(this.db)).rows[0]!.now;
        this.prune();
      } catch (err) {
        // The database is away: keep what we have; the next poll catches up.
        this.options.logger?.warn({ err }, 'could not refresh the revocations');
      } finally {
        this.polling = undefined;
      }
    })();
    return this.polling;
  }
}
