/**
 * The replay store: the DPoP proofs (RFC 9449 §11.1) and the private_key_jwt client assertions
 * (RFC 7523 §3 point 7) seen, each kept until it could no longer be accepted anyway, so that each
 * is used once — on every instance, since they all write here.
 *
 * In the database, not Redis: every instance already shares it, Redis is optional for orgauth
 * (rate limits fall back to memory per instance without it; a replay store cannot), and the
 * embedded database needs no other server. The table is UNLOGGED: its writes skip the WAL and
 * its commits wait for no flush, which is what makes a write per proof affordable; a crash
 * empties it, as a cache in memory would be emptied, and what it protects is minutes long.
 *
 * Group commit: at most MAX_IN_FLIGHT statements at once per instance, and what arrives while
 * one runs waits for the next, which carries all of it (up to MAX_BATCH). A lone request goes at
 * once (nothing added to its latency when idle); under load each statement carries every key
 * that came meanwhile, so a request pays a fraction of a round trip. Nothing is held in memory
 * but the requests waiting for their statement.
 *
 * What a key costs the database (measured on PostgreSQL 15, batches of 14, the backend's CPU):
 * - A key is stored as the first 128 bits of its SHA-256, a uuid: 16 bytes compared as such,
 *   where the text key (kind, a 43-character thumbprint or a client id, and the jti: about 85
 *   characters) made the index five times wider (10.6 → 7.9 µs a key).
 * - A batch is a plain insert: the unique index refuses a key seen before, and refuses the whole
 *   statement with it. Only then (a replay, or a row whose window closed long ago and that the
 *   cleanup has not reached) is the batch sent again as `on conflict ... returning`, which tells
 *   key by key. Sent first, that statement cost every batch a speculative insertion per key and
 *   a row back per fresh key (7.9 → 6.1 µs a key, and no rows to parse).
 *   A 128-bit digest: two different keys share one with probability 2^-128 per pair; a client
 *   that found two jtis with one digest could only refuse its own second proof.
 */
import { createHash } from 'node:crypto';
import { sql } from 'kysely';
import { type DB, prepared } from '../../db/connect.js';
import { isUniqueViolation } from '../../db/errors.js';

/** The statement's batch: at most this many keys in one insert. */
const MAX_BATCH = 500;
/** Statements at once, per instance (the pool's other connections serve everything else). */
const MAX_IN_FLIGHT = 1;
/**
 * Expiry times come from an instance's clock and are compared with the database's: a row is
 * taken over (and deleted by the cleanup, src/retention.ts) only this long after its expiry.
 */
export const CLOCK_MARGIN_S = 300;

interface Pending {
  /** The key's digest, as a uuid. */
  key: string;
  expiresAt: number;
  resolve(fresh: boolean): void;
  reject(err: unknown): void;
}

/** The stored form of a key: the first 128 bits of its SHA-256, as a uuid. */
export function seenJtiDigest(key: string): string {
  const hex = createHash('sha256').update(key, 'utf8').digest('hex');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20, 32)}`;
}

export class SeenJtis {
  private pending: Pending[] = [];
  private inFlight = 0;

  constructor(private readonly db: DB) {}

  /**
   * Records `key` (kind, key or client, and jti) until `expiresAt` (seconds since the epoch);
   * true when it was not seen before (within its window), false for a replay.
   */
  firstUse(key: string, expiresAt: number): Promise<boolean> {
    return new Promise((resolve, reject) => {
      this.pending.push({ key: seenJtiDigest(key), expiresAt, resolve, reject });
      if (this.inFlight < MAX_IN_FLIGHT) this.flush();
    });
  }

  private flush(): void {
    const batch = this.pending.splice(0, MAX_BATCH);
    if (batch.length === 0) return;
    this.inFlight++;
    void this.insert(batch).finally(() => {
      this.inFlight--;
      if (this.pending.length > 0 && this.inFlight < MAX_IN_FLIGHT) this.flush();
    });
  }

  private async insert(batch: Pending[]): Promise<void> {
    // Twice in one batch: the second is a replay of the first.
    const first = new Map<string, Pending>();
    for (const p of batch) if (!first.has(p.key)) first.set(p.key, p);
    try {
      const keys = [...first.keys()];
      const expiries = [...first.values()].map((p) => new Date(p.expiresAt * 1000).toISOString());
      let fresh: ReadonlySet<string> | undefined;
      try {
        await sql`${prepared('record_jtis')}
          insert into seen_jtis (key, expires_at) select * from unnest(${keys}::uuid[], ${expiries}::timestamptz[])`.execute(this.db);
      } catch (err) {
        if (!isUniqueViolation(err)) throw err;
        // Some key is there already: key by key. A row whose window closed long ago is taken over
        // (keys hold random jtis: this only keeps such a row from refusing a fresh key before the cleanup).
        const { rows } = await sql<{ key: string }>`${prepared('first_use_of_jtis')}
          insert into seen_jtis (key, expires_at)
          select * from unnest(${keys}::uuid[], ${expiries}::timestamptz[])
          on conflict (key) do update set expires_at = excluded.expires_at where seen_jtis.expires_at < now() - make_interval(secs => ${CLOCK_MARGIN_S})
          returning key`.execute(this.db);
        fresh = new Set(rows.map((r) => r.key));
      }
      for (const p of batch) p.resolve(first.get(p.key) === p && (fresh?.has(p.key) ?? true));
    } catch (err) {
      for (const p of batch) p.reject(err);
    }
  }
}
