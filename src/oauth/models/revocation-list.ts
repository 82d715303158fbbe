/**
 * Revoked grants, revoked access tokens and removed members, in memory, so checking an access token costs no
 * query (BR-5). Kept current three ways: revocations made here are added at once; other
 * instances' arrive by LISTEN/NOTIFY within milliseconds; and a poll every POLL_MS catches
 * anything a dropped LISTEN connection missed, so a revocation is honoured everywhere within one
 * second regardless. Entries are dropped once no token they could refuse is still unexpired.
 *
 * A removed member is held as their organization and user with the time of the removal: their
 * access tokens issued up to then are refused at once, while a job revokes their grants (which
 * may be a million: organizations.ts memberGrantsJob). Tokens issued after, once someone added
 * them back, are not.
 *
 * Held compactly (revoked-set.ts: sorted typed arrays, 12 bytes a grant, 20 a jti, plus a
 * small map of the latest additions) and read in batches of LOAD_BATCH rows in (revoked_at, id)
 * order, keyset-paginated on an index in that order (migration 0008). Measured with a million
 * revoked grants (bench/revocations-volume.ts, medians of five starts): the set holds 13.6 MB,
 * the instance 23 MB more resident memory than without them (peak 50 MB more) and healthy 0.8 s
 * later, where a Map filled by one query of a million row objects held 166 MB more (peak 287 MB
 * more) and was healthy 1.3 s later.
 */
import { type RawBuilder, sql } from 'kysely';
import type { FastifyBaseLogger } from 'fastify';
import type { DB, Listen } from '../../db/connect.js';
import type { RevocationReason } from '../../db/schema.js';
import type { Metrics } from '../../metrics.js';
import { CLOCK_TOLERANCE_S } from './access-tokens.js';
import type { Actor } from '../../audit/events.js';
import { REMOVAL_MARGIN_S, REVOCATION_CHANNEL, revokeAccessToken, revokeGrant, type RevokedGrantsMemory } from './grants.js';
import { grantIdCodec, memberCodec, memberKey, RevokedSet, uuidCodec } from './revoked-set.js';

const POLL_MS = 500;
/** Commits land after their now(): the poll looks back this far past the newest revocation it saw. */
const POLL_OVERLAP_S = 10;
/** Expired entries are dropped this often, and kept this long past the end of their tokens. */
const PRUNE_EVERY_MS = 60_000;
const PRUNE_MARGIN_S = 60;
/**
 * Rows per query when reading revocations: a batch of grants is one 800 kB value (readGrants),
 * and takes tens of milliseconds, well inside the pool's statement timeout.
 */
export const LOAD_BATCH = 50_000;
/**
 * Readers of the first load's revoked grants, each on a connection of its own: PostgreSQL reads
 * their slices on both cores while this process unpacks what arrived.
 */
const LOAD_READERS = 2;

/** What an access token says about itself that revocation looks at. */
export interface RevocableToken {
  jti: string;
  grant_id: number;
  organization_id: number;
  exp: number;
}

/** What isTokenRevoked looks at: the token, and its user (sub, unless it is its application's own) and when it was issued. */
export type CheckedRevocation = Pick<RevocableToken, 'jti' | 'grant_id' | 'organization_id'> & { sub: string; client_id: string; iat: number };

const MEMBER_PAYLOAD = /^member (\d+) (\d+) (\d+(?:\.\d+)?)$/;

/**
 * Timestamps are read as whole microseconds since the Unix epoch, not as Date: the keyset
 * cursor needs revoked_at exactly (a Date keeps milliseconds; a cursor rounded down would read
 * rows again, forever if a batch's worth of them shared one millisecond), and parsing a million
 * timestamps was the largest cost of a load. A safe integer until the year 2255.
 *
 * This one is exact because extract returns a numeric (PostgreSQL 14 and later; PGlite is 17).
 */
const REVOKED_AT_US = sql<number>`(extract(epoch from revoked_at) * 1000000)::int8`;
const REMOVED_AT_US = sql<number>`(extract(epoch from removed_at) * 1000000)::int8`;
/** timestamptz_send() writes microseconds since 2000-01-01 UTC (PostgreSQL's epoch). */
const POSTGRES_EPOCH_US = 946_684_800_000_000;
/** The inverse, exactly: an interval of one microsecond times a whole number is that many microseconds. */
const fromMicroseconds = (us: number) => sql<Date>`(timestamptz 'epoch' + ${us}::float8 * interval '1 microsecond')`;

/** Where a keyset read of revocations stopped: the last row's revoked_at (µs) and key. */
interface Cursor<K> {
  revokedAtUs: number;
  key: K;
}

/** What one read of revocations saw. */
interface Read {
  batches: number;
  newest: Date | undefined;
}

const later = (a: Date | undefined, b: Date | undefined) => (a === undefined || (b !== undefined && b > a) ? b : a);

export class RevocationList implements RevokedGrantsMemory {
  /** Revoked grant ids, each until no token of it can be unexpired (revoked_at + accessTokenTtl + margin). */
  private readonly grants = new RevokedSet(grantIdCodec);
  /** Revoked jtis, each until its token's exp (+ margin). */
  private readonly tokens = new RevokedSet(uuidCodec);
  /**
   * Removed members (memberKey), each until no token from before the removal can be unexpired:
   * memberUntil(removedAtS), whence the removal's second comes back.
   */
  private readonly members = new RevokedSet(memberCodec);
  private newestSeen: Date | undefined;
  private lastPruned = Date.now();
  private timer: NodeJS.Timeout | undefined;
  private unlisten: (() => Promise<void>) | undefined;
  private polling: Promise<void> | undefined;

  constructor(
    private readonly db: DB,
    private readonly options: {
      accessTokenTtl: number;
      listen?: Listen | undefined;
      logger?: FastifyBaseLogger | undefined;
      metrics?: Metrics | undefined;
      /** Rows per query (LOAD_BATCH); tests make it small to cross batch boundaries. */
      loadBatchSize?: number | undefined;
    },
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

  /**
   * Whether the token was revoked, by itself or with its grant, or ended by its user's removal
   * from the organization: issued up to the removal's second (iat is whole seconds) and
   * REMOVAL_MARGIN_S more.
   */
  isTokenRevoked(token: CheckedRevocation): boolean {
    if (this.grants.has(token.grant_id) || this.tokens.has(token.jti)) return true;
    if (this.members.count === 0 || token.sub === token.client_id) return false;
    const until = this.members.untilOf(memberKey(token.organization_id, Number(token.sub)));
    return until !== undefined && token.iat <= until - this.options.accessTokenTtl - PRUNE_MARGIN_S + REMOVAL_MARGIN_S;
  }

  /** Entries held and the bytes they take (RevokedSet.byteSize). */
  memory(): { grants: number; tokens: number; members: number; bytes: number } {
    return {
      grants: this.grants.count,
      tokens: this.tokens.count,
      members: this.members.count,
      bytes: this.grants.byteSize() + this.tokens.byteSize() + this.members.byteSize(),
    };
  }

  /** A member removed here (removeMember, committed): their tokens are refused here at once, before the NOTIFY arrives. */
  noteMemberRemoved(organizationId: number, userId: number, removedAtS: number): void {
    this.members.add(memberKey(organizationId, userId), this.memberUntil(removedAtS));
  }

  /** Until when a member removed at removedAtS can have an unexpired token from before (the removal's whole second, plus a token's life). */
  private memberUntil(removedAtS: number): number {
    return Math.floor(removedAtS) + this.options.accessTokenTtl + PRUNE_MARGIN_S;
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

  /** Grants revoked just now, as far as this instance knows (the database's revoked_at is a little earlier; either is fine for pruning). */
  private markRevoked(grantIds: readonly number[]): void {
    const until = this.grantUntil(Date.now() / 1000);
    for (const id of grantIds) this.grants.add(id, until);
  }

  /** Until when a grant revoked at revokedAtS can have an unexpired token. */
  private grantUntil(revokedAtS: number): number {
    return revokedAtS + this.options.accessTokenTtl + PRUNE_MARGIN_S;
  }

  /** Revokes one access token (see revokeAccessToken), refused here at once. */
  async revokeToken(token: RevocableToken, reason: RevocationReason, actor?: Actor): Promise<boolean> {
    const revoked = await revokeAccessToken(this.db, { jti: token.jti, organizationId: token.organization_id, grantId: token.grant_id, exp: token.exp }, reason, actor);
    this.tokens.add(token.jti, token.exp + PRUNE_MARGIN_S);
    if (revoked) this.options.metrics?.revoked('access_token', reason);
    return revoked;
  }

  private received(payload: string): void {
    const token = /^jti (\S+) (\d+)$/.exec(payload);
    if (token) {
      this.tokens.add(token[1]!, Number(token[2]) + PRUNE_MARGIN_S);
      return;
    }
    const member = MEMBER_PAYLOAD.exec(payload);
    if (member) {
      this.noteMemberRemoved(Number(member[1]), Number(member[2]), Number(member[3]));
      return;
    }
    // Grant ids, comma separated (revokeGrants).
    const ids = payload.split(',').map(Number).filter((id) => Number.isSafeInteger(id) && id > 0);
    this.markRevoked(ids);
  }

  /**
   * Drops what can no longer matter: tokens past exp, grants revoked longer ago than a token
   * lives. Also when the recent additions are merged into the sorted arrays (besides whenever
   * they reach RECENT_LIMIT): not at every poll, which with a million entries would move them
   * all twice a second while revocations trickle in.
   */
  private prune(): void {
    const now = Date.now();
    if (now - this.lastPruned < PRUNE_EVERY_MS) return;
    this.lastPruned = now;
    this.grants.prune(now / 1000);
    this.tokens.prune(now / 1000);
    this.members.prune(now / 1000);
  }

  /**
   * Revocations since the newest one seen (with overlap). The first load takes every grant
   * revoked within one access-token lifetime (older ones have no live tokens left) and every
   * revoked token not yet expired.
   */
  private poll(): Promise<void> {
    this.polling ??= (async () => {
      try {
        if (this.newestSeen === undefined) await this.load();
        else await this.refresh(this.newestSeen);
        this.prune();
      } catch (err) {
        // The database is away: keep what we have; the next poll catches up (a first load starts over).
        this.options.logger?.warn({ err }, 'could not refresh the revocations');
      } finally {
        this.polling = undefined;
      }
    })();
    return this.polling;
  }

  /** The first load, into bulk loads of the two sets: appended as read, sorted once at the end. */
  private async load(): Promise<void> {
    const started = performance.now();
    // The database's clock (revoked_at is set by it), and about how many grants are revoked, to
    // size the set's arrays (more or fewer only cost a copy): the planner's count of the partial
    // index on revoked grants (migration 0008), kept by (auto)vacuum and analyze, -1 before
    // either ran. Counting them exactly read a million index entries before the load began
    // (0.2–0.5 s of a start-up).
    const { now, tuples } = (
      await sql<{ now: Date; tuples: number }>`select now() as now,
        coalesce((select reltuples::float8 from pg_class where relname = 'grants_revoked_at_id_idx' and relkind = 'i'), 0) as tuples`.execute(this.db)
    ).rows[0]!;
    const oldest = now.getTime() - this.options.accessTokenTtl * 1000;
    const since = sql<Date>`${new Date(oldest)}::timestamptz`;
    const grants = this.grants.startLoad(Math.max(0, Math.round(Number(tuples))));
    const tokens = this.tokens.startLoad();
    const members = this.members.startLoad();
    // The grants in LOAD_READERS slices of the time between the first and the last revocation
    // that can matter (two probes of the index), read at once on as many connections: each
    // bound is the same value on both of its sides, so no grant falls between two slices, and
    // the first and last are open.
    const span = await this.db
      .selectFrom('grants')
      .select((eb) => [eb.fn.min('revoked_at').as('first'), eb.fn.max('revoked_at').as('last')])
      .where('revoked_at', '>', since)
      .executeTakeFirst();
    const first = span?.first?.getTime();
    const last = span?.last?.getTime();
    const bounds = first === undefined || last === undefined ? [] : Array.from({ length: LOAD_READERS - 1 }, (_, i) => new Date(first + ((i + 1) * (last - first)) / LOAD_READERS));
    const reads = await Promise.all([
      this.readTokens(since, (jti, exp) => tokens.add(jti, exp + PRUNE_MARGIN_S)),
      this.readMembers(since, (key, removedAtS) => members.add(key, this.memberUntil(removedAtS))),
      ...[since, ...bounds.map((b) => sql<Date>`${b}::timestamptz`)].map((after, i) =>
        this.readGrants(after, (id, revokedAtS) => grants.add(id, this.grantUntil(revokedAtS)), bounds[i]),
      ),
    ]);
    grants.finish();
    tokens.finish();
    members.finish();
    // Nothing revoked yet: start from the database's clock when the load began.
    this.newestSeen = reads.reduce<Date | undefined>((newest, r) => later(newest, r.newest), undefined) ?? now;
    this.options.logger?.info(
      { ...this.memory(), batches: reads.reduce((sum, r) => sum + r.batches, 0), ms: Math.round(performance.now() - started) },
      'revocations loaded',
    );
  }

  /** Revocations since the newest seen, less the overlap: usually none or a few, in one batch each. */
  private async refresh(newestSeen: Date): Promise<void> {
    const since = sql<Date>`${newestSeen}::timestamptz - make_interval(secs => ${POLL_OVERLAP_S})`;
    const [g, t, m] = await Promise.all([
      this.readGrants(since, (id, revokedAtS) => this.grants.add(id, this.grantUntil(revokedAtS))),
      this.readTokens(since, (jti, exp) => this.tokens.add(jti, exp + PRUNE_MARGIN_S)),
      this.readMembers(since, (key, removedAtS) => this.members.add(key, this.memberUntil(removedAtS))),
    ]);
    this.newestSeen = later(newestSeen, later(later(g.newest, t.newest), m.newest));
  }

  /**
   * Grants revoked after `since`, a batch at a time in (revoked_at, id) order: keyset pagination
   * on grants_revoked_at_id_idx, each batch a range of the index read without a sort or a visit
   * to the table. A batch comes back as one value, its (id, revoked_at) pairs packed in binary
   * (int8send, timestamptz_send: big-endian int8s, the second in µs since 2000): a row object
   * per revoked grant cost about a microsecond of parsing and garbage each (most of a
   * million-row load, measured), reading two numbers off the bytes costs a few nanoseconds. The
   * value is sent as base64, not bytea's hex text: a third fewer bytes, decoded faster (3.8
   * against 6.1 ms a batch; the decoder skips its line breaks). The
   * pairs come in no promised order (the set sorts them anyway); the cursor is the greatest pair.
   */
  private async readGrants(since: RawBuilder<Date>, each: (id: number, revokedAtS: number) => void, upTo?: Date): Promise<Read> {
    const batchSize = this.options.loadBatchSize ?? LOAD_BATCH;
    const read: Read = { batches: 0, newest: undefined };
    let cursor: Cursor<number> | undefined;
    for (;;) {
      const batch = this.db
        .selectFrom('grants')
        .select(['id', 'revoked_at'])
        .where('revoked_at', 'is not', null)
        .where(cursor ? sql<boolean>`(revoked_at, id) > (${fromMicroseconds(cursor.revokedAtUs)}, ${cursor.key}::bigint)` : sql<boolean>`revoked_at > ${since}`)
        .$if(upTo !== undefined, (qb) => qb.where('revoked_at', '<=', upTo!))
        .orderBy('revoked_at')
        .orderBy('id')
        .limit(batchSize)
        .as('batch');
      const { encoded } = await this.db
        .selectFrom(batch)
        .select(sql<string | null>`encode(string_agg(int8send(batch.id) || timestamptz_send(batch.revoked_at), ''::bytea), 'base64')`.as('encoded'))
        .executeTakeFirstOrThrow();
      const packed = encoded === null ? null : Buffer.from(encoded, 'base64');
      read.batches++;
      const rows = packed ? packed.byteLength / 16 : 0;
      if (packed) {
        const view = new DataView(packed.buffer, packed.byteOffset, packed.byteLength);
        // The greatest pair, in two locals: an object per row would be a million allocations.
        let lastUs = -Infinity;
        let lastId = 0;
        for (let offset = 0; offset < packed.byteLength; offset += 16) {
          const id = view.getUint32(offset) * 2 ** 32 + view.getUint32(offset + 4);
          const us = view.getInt32(offset + 8) * 2 ** 32 + view.getUint32(offset + 12) + POSTGRES_EPOCH_US;
          each(id, us / 1e6);
          if (us > lastUs || (us === lastUs && id > lastId)) {
            lastUs = us;
            lastId = id;
          }
        }
        cursor = { revokedAtUs: lastUs, key: lastId };
        read.newest = later(read.newest, new Date(Math.floor(lastUs / 1000)));
      }
      if (rows < batchSize) return read;
    }
  }

  /**
   * Access tokens revoked after `since` and not yet expired (verification accepts a token up to
   * CLOCK_TOLERANCE_S past its exp), the same way in (revoked_at, jti) order, a row each: they
   * are revoked one at a time by hand (a private application's own tokens), and retention
   * deletes them an hour after they expire, so there are few.
   */
  private async readTokens(since: RawBuilder<Date>, each: (jti: string, exp: number) => void): Promise<Read> {
    const batchSize = this.options.loadBatchSize ?? LOAD_BATCH;
    const read: Read = { batches: 0, newest: undefined };
    let cursor: Cursor<string> | undefined;
    for (;;) {
      const rows = await this.db
        .selectFrom('revoked_access_tokens')
        .select(['jti', REVOKED_AT_US.as('us'), sql<number>`floor(extract(epoch from expires_at))::int8`.as('exp')])
        .where(cursor ? sql<boolean>`(revoked_at, jti) > (${fromMicroseconds(cursor.revokedAtUs)}, ${cursor.key})` : sql<boolean>`revoked_at > ${since}`)
        .where('expires_at', '>', sql<Date>`now() - make_interval(secs => ${CLOCK_TOLERANCE_S})`)
        .orderBy('revoked_at')
        .orderBy('jti')
        .limit(batchSize)
        .execute();
      read.batches++;
      for (const row of rows) each(row.jti, row.exp);
      const last = rows.at(-1);
      if (last) {
        read.newest = later(read.newest, new Date(Math.floor(last.us / 1000)));
        cursor = { revokedAtUs: last.us, key: last.jti };
      }
      if (rows.length < batchSize) return read;
    }
  }

  /**
   * Members removed after `since`, the same way in (removed_at, organization_id, user_id) order
   * (removed_members_removed_at_idx), a row each: a removal is one person at a time, so they
   * are few beside revoked grants. A removal that someone has since undone (restored_at) still
   * counts: their tokens from before it stay refused.
   */
  private async readMembers(since: RawBuilder<Date>, each: (key: string, removedAtS: number) => void): Promise<Read> {
    const batchSize = this.options.loadBatchSize ?? LOAD_BATCH;
    const read: Read = { batches: 0, newest: undefined };
    let cursor: Cursor<[number, number]> | undefined;
    for (;;) {
      const rows = await this.db
        .selectFrom('removed_members')
        .select(['organization_id', 'user_id', REMOVED_AT_US.as('us')])
        .where(
          cursor
            ? sql<boolean>`(removed_at, organization_id, user_id) > (${fromMicroseconds(cursor.revokedAtUs)}, ${cursor.key[0]}::bigint, ${cursor.key[1]}::bigint)`
            : sql<boolean>`removed_at > ${since}`,
        )
        .orderBy('removed_at')
        .orderBy('organization_id')
        .orderBy('user_id')
        .limit(batchSize)
        .execute();
      read.batches++;
      for (const row of rows) each(memberKey(row.organization_id, row.user_id), row.us / 1e6);
      const last = rows.at(-1);
      if (last) {
        read.newest = later(read.newest, new Date(Math.floor(last.us / 1000)));
        cursor = { revokedAtUs: last.us, key: [last.organization_id, last.user_id] };
      }
      if (rows.length < batchSize) return read;
    }
  }
}
