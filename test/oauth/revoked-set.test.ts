/**
 * The compact revoked set (src/oauth/models/revoked-set.ts) and RevocationList's batched load from the
 * database (src/oauth/models/revocation-list.ts): the structure against a plain Map, its memory per entry
 * counted from its own typed arrays, the load in many small batches (ties on revoked_at across a
 * batch boundary, rows within one millisecond), the plans of the batch queries, a load that fails
 * half way, and revocations after start reaching an instance within a second.
 */
import { randomUUID } from 'node:crypto';
import fc from 'fast-check';
import type { FastifyBaseLogger } from 'fastify';
import { type RawBuilder, sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { REMOVAL_MARGIN_S, revokeGrant } from '../../src/oauth/models/grants.js';
import { RevocationList } from '../../src/oauth/models/revocation-list.js';
import { grantIdCodec, RECENT_LIMIT, RevokedSet, sortEntries, uuidCodec } from '../../src/oauth/models/revoked-set.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { createOrgFixture } from '../helpers/oauth.js';
import { explain, recording } from '../helpers/plans.js';

const FAR = 4_000_000_000;

describe('RevokedSet of grant ids', () => {
  it('finds what was added, in any order, beyond 2^32, before and after a merge', () => {
    const set = new RevokedSet(grantIdCodec, 8);
    const ids = [2 ** 32 + 1, 1, 2 ** 53 - 1, 7, 2 ** 32, 4_294_967_295, 3, 2 ** 40 + 7, 9, 2, 12, 2 ** 33];
    for (const id of ids) set.add(id, FAR);
    expect(set.count).toBe(ids.length);
    for (const id of ids) expect(set.has(id), String(id)).toBe(true);
    // Same low word as a member, other high word; neighbours; not integers.
    for (const id of [2 ** 32 + 3, 2 ** 33 + 1, 2 ** 40 + 1, 0, 4, 8, 2 ** 53 - 2, 1.5, -1, Number.NaN]) expect(set.has(id), String(id)).toBe(false);
    set.merge();
    expect(set.count).toBe(ids.length);
    for (const id of ids) expect(set.has(id)).toBe(true);
    expect(set.has(2 ** 32 + 3)).toBe(false);
  });

  it('merges the recent additions once they reach the bound, and holds each key once', () => {
    const set = new RevokedSet(grantIdCodec, 16);
    for (let id = 100; id > 0; id--) set.add(id * 3, FAR);
    // 100 added, merged at 16, 32, ...: what is left recent is under the bound.
    expect(set.count).toBe(100);
    for (let id = 1; id <= 100; id++) set.add(id * 3, FAR);
    expect(set.count).toBe(100);
    set.merge();
    expect(set.count).toBe(100);
    for (let n = 0; n <= 301; n++) expect(set.has(n)).toBe(n > 0 && n % 3 === 0);
  });

  it('keeps the later until of a key added twice, wherever the first one is', () => {
    const set = new RevokedSet(grantIdCodec, 4);
    set.add(5, 100);
    set.add(5, 200); // both recent
    set.add(6, 200);
    set.add(6, 100); // later first
    set.merge();
    set.add(5, 50); // sorted already: stays 200
    set.add(7, 100);
    set.merge();
    set.add(7, 300); // sorted: raised
    set.prune(150);
    expect([5, 6, 7].map((id) => set.has(id))).toEqual([true, true, true]);
    set.prune(250);
    expect([5, 6, 7].map((id) => set.has(id))).toEqual([false, false, true]);
    expect(set.count).toBe(1);
  });

  it('prunes in one pass, keeping order, and gives memory back when mostly empty', () => {
    const set = new RevokedSet(grantIdCodec);
    const load = set.startLoad();
    // Odd ids expire at 1000, even ones at 3000; added in a scrambled order.
    for (let i = 0; i < 50_000; i++) {
      const id = ((i * 7919) % 50_000) + 1;
      load.add(id, id % 2 ? 1000 : 3000);
    }
    load.finish();
    const before = set.byteSize();
    set.add(2 ** 34 + 1, 1000); // recent, expires
    set.add(2 ** 34 + 2, 3000); // recent, stays
    set.prune(2000);
    expect(set.count).toBe(25_001);
    for (let id = 1; id <= 50_000; id++) if (!set.has(id) === (id % 2 === 0)) throw new Error(`id ${id} after the prune`);
    expect(set.has(2 ** 34 + 1)).toBe(false);
    expect(set.has(2 ** 34 + 2)).toBe(true);
    set.prune(4000);
    expect(set.count).toBe(0);
    expect(set.byteSize()).toBeLessThan(before / 4);
    set.add(42, FAR);
    expect(set.has(42)).toBe(true);
  });

  it('a bulk load dedupes what it read twice and what was added while it ran', () => {
    const set = new RevokedSet(grantIdCodec, 1000);
    set.add(10, 500); // already held before the load
    const load = set.startLoad();
    for (const id of [30, 10, 20, 30, 2 ** 35]) load.add(id, 1000);
    set.add(20, 2000); // arrives by NOTIFY during the load
    set.add(40, 2000);
    expect(set.has(30)).toBe(false); // the load is not visible until finished
    load.finish();
    expect(set.count).toBe(5);
    set.merge();
    expect(set.count).toBe(5);
    set.prune(1500);
    expect([10, 20, 30, 40, 2 ** 35].map((id) => set.has(id))).toEqual([false, true, false, true, false]);
  });

  it('behaves like a Map of key → until under any sequence of adds, merges, loads and prunes', () => {
    type Op = { op: 'add'; id: number; until: number } | { op: 'merge' } | { op: 'prune'; now: number } | { op: 'load'; ids: number[]; until: number };
    const id = fc.oneof(fc.integer({ min: 1, max: 60 }), fc.integer({ min: 2 ** 32 - 3, max: 2 ** 32 + 3 }), fc.constant(2 ** 53 - 1));
    const op: fc.Arbitrary<Op> = fc.oneof(
      { weight: 6, arbitrary: fc.record({ op: fc.constant('add' as const), id, until: fc.integer({ min: 0, max: 100 }) }) },
      { weight: 1, arbitrary: fc.record({ op: fc.constant('merge' as const) }) },
      { weight: 1, arbitrary: fc.record({ op: fc.constant('prune' as const), now: fc.integer({ min: 0, max: 100 }) }) },
      { weight: 1, arbitrary: fc.record({ op: fc.constant('load' as const), ids: fc.array(id, { maxLength: 20 }), until: fc.integer({ min: 0, max: 100 }) }) },
    );
    fc.assert(
      fc.property(fc.array(op, { maxLength: 80 }), (ops) => {
        const set = new RevokedSet(grantIdCodec, 5);
        const model = new Map<number, number>();
        const put = (k: number, u: number) => model.set(k, Math.max(u, model.get(k) ?? 0));
        for (const o of ops) {
          if (o.op === 'add') {
            set.add(o.id, o.until);
            put(o.id, o.until);
          } else if (o.op === 'merge') {
            set.merge();
          } else if (o.op === 'prune') {
            set.prune(o.now);
            for (const [k, u] of model) if (u < o.now) model.delete(k);
          } else {
            const load = set.startLoad();
            for (const k of o.ids) {
              load.add(k, o.until);
              put(k, o.until);
            }
            load.finish();
          }
          expect(set.count).toBe(model.size);
        }
        for (const k of [...model.keys(), 0, 61, 2 ** 32 - 4, 2 ** 32 + 4, 2 ** 53 - 2]) expect(set.has(k)).toBe(model.has(k));
        // The untils too: pruning at each one keeps exactly the keys that last that long.
        for (const now of [...new Set(model.values())].sort((a, b) => a - b)) {
          set.prune(now);
          for (const [k, u] of model) expect(set.has(k)).toBe(u >= now);
        }
      }),
      { numRuns: 300, seed: 13 },
    );
  });
});

describe('sortEntries', () => {
  it('sorts keys of several words with their untils, like a comparison sort', () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.array(fc.integer({ min: 0, max: 0xffffffff }), { minLength: 4, maxLength: 4 }), fc.nat()), { maxLength: 300 }), (entries) => {
        const keys = new Uint32Array(entries.flatMap(([k]) => k));
        const until = new Uint32Array(entries.map(([, u]) => u));
        sortEntries(keys, until, entries.length, 4);
        const cmp = (a: number[], b: number[]) => a.findIndex((x, i) => x !== b[i]);
        const expected = [...entries].sort(([a], [b]) => {
          const i = cmp(a, b);
          return i < 0 ? 0 : a[i]! - b[i]!;
        });
        expect([...keys]).toEqual(expected.flatMap(([k]) => k));
        // Stable: equal keys keep their order, so the untils line up too.
        expect([...until]).toEqual(expected.map(([, u]) => u));
      }),
      { numRuns: 200, seed: 13 },
    );
  });
});

describe('RevokedSet of jtis', () => {
  it('holds UUIDs compactly and any other jti exactly', () => {
    const set = new RevokedSet(uuidCodec, 4);
    const jtis = Array.from({ length: 10 }, () => randomUUID());
    for (const jti of jtis) set.add(jti, FAR);
    set.add('not-a-uuid', FAR);
    const upper = randomUUID().toUpperCase();
    set.add(upper, FAR);
    set.merge();
    for (const jti of [...jtis, 'not-a-uuid', upper]) expect(set.has(jti), jti).toBe(true);
    // Case matters: a jti is a string, not a number.
    expect(set.has(upper.toLowerCase())).toBe(false);
    expect(set.has(jtis[0]!.toUpperCase())).toBe(false);
    expect(set.has('not-a-uuid ')).toBe(false);
    expect(set.has(randomUUID())).toBe(false);
    // A UUID one bit away from a member.
    const flipped = jtis[0]!.slice(0, 35) + (jtis[0]!.endsWith('0') ? '1' : '0');
    expect(set.has(flipped)).toBe(false);
    set.prune(FAR + 1);
    expect(set.count).toBe(0);
  });
});

describe('memory', () => {
  it('1,000,000 revoked grant ids take at most 14 bytes each (12, plus an eighth of headroom)', () => {
    const set = new RevokedSet(grantIdCodec);
    // Counted beforehand, as RevocationList does.
    const load = set.startLoad(1_000_000);
    // Spread beyond 2^32 and read in no particular order, as a load in revoked_at order reads ids.
    for (let i = 0; i < 1_000_000; i++) load.add(((i * 104_729) % 1_000_000) * 5003 + 1, FAR);
    load.finish();
    expect(set.count).toBe(1_000_000);
    expect(set.byteSize()).toBeLessThanOrEqual(14_000_000);
    for (const i of [0, 1, 999_999, 123_456]) expect(set.has(i * 5003 + 1)).toBe(true);
    expect(set.has(5003 * 1_000_000 + 1)).toBe(false);
    // Revocations arriving one at a time afterwards: merged every RECENT_LIMIT, in the headroom.
    for (let i = 0; i < 3 * RECENT_LIMIT; i++) set.add(2 ** 50 + i, FAR);
    expect(set.count).toBe(1_000_000 + 3 * RECENT_LIMIT);
    expect(set.byteSize()).toBeLessThanOrEqual(14_000_000);
  });

  it('a load that was not told its size grows as it fills, to at most 17 bytes a grant id', () => {
    const set = new RevokedSet(grantIdCodec);
    for (const n of [1_000, 70_000, 1_000_000]) {
      const load = set.startLoad();
      for (let i = 0; i < n; i++) load.add(n - i, FAR);
      load.finish();
      expect(set.count).toBe(n);
      expect(set.has(1) && set.has(n) && !set.has(n + 1)).toBe(true);
      expect(set.byteSize()).toBeLessThanOrEqual(Math.max(17 * n, 12 * (RECENT_LIMIT + 1024)));
      set.prune(FAR + 1);
    }
  });

  it('100,000 revoked jtis added one at a time take at most 28 bytes each (20 exact)', () => {
    const set = new RevokedSet(uuidCodec);
    for (let i = 0; i < 100_000; i++) set.add(randomUUID(), FAR);
    expect(set.count).toBe(100_000);
    expect(set.byteSize()).toBeLessThanOrEqual(2_800_000);
  });
});

describe(`RevocationList's load from ${BACKEND}`, () => {
  let t: Awaited<ReturnType<typeof createTestDatabase>>;
  let organizationId: number;
  let applicationId: number;
  /** Revoked within the token lifetime (loaded), long ago (not), and live grants (not). */
  const revoked: number[] = [];
  const old: number[] = [];
  const live: number[] = [];
  const jtis: string[] = [];
  /** Users removed from the organization within the token lifetime (loaded), and long ago (not). */
  const removedRecently: { userId: number; removedAtS: number }[] = [];
  const removedLongAgo: number[] = [];
  const BATCH = 64;

  beforeAll(async () => {
    t = await createTestDatabase();
    const org = await createOrgFixture(t.handle.db);
    organizationId = org.organizationId;
    applicationId = (await t.handle.db.selectFrom('applications').select('id').where('client_id', '=', org.privateApp.client_id).executeTakeFirstOrThrow()).id;
    /** n grants, the g-th (1…n) revoked at `revokedAt` (null: live). */
    const insert = async (n: number, revokedAt: RawBuilder<Date> | null) => {
      const { rows } = await sql<{ id: number }>`
        insert into grants (organization_id, application_id, user_id, scopes, revoked_at, revoked_reason)
        select ${organizationId}, ${applicationId}, null, '{contacts.read}', ${revokedAt ?? sql`null`}, ${revokedAt ? 'revoked_by_admin' : null}::text
        from generate_series(1, ${n}::int) g returning id`.execute(t.handle.db);
      return rows.map((r) => r.id);
    };
    // 200 sharing one revoked_at to the microsecond: a tie across three batch boundaries.
    revoked.push(...(await insert(200, sql`now() - interval '80 minutes'`)));
    // 300 a microsecond apart, all within one millisecond (a cursor rounded to ms would loop).
    revoked.push(...(await insert(300, sql`date_trunc('milliseconds', now()) - interval '1 hour' + g * interval '1 microsecond'`)));
    // 200 spread over the last hour.
    revoked.push(...(await insert(200, sql`now() - g * interval '18 seconds'`)));
    old.push(...(await insert(50, sql`now() - interval '2 hours'`)));
    live.push(...(await insert(50, null)));
    // Revoked tokens of one grant: UUIDs, ties on revoked_at, one that is not a UUID, expired ones.
    const grant = live[0]!;
    for (let i = 0; i < 150; i++) jtis.push(randomUUID());
    jtis.push('legacy-token-id');
    await t.handle.db
      .insertInto('revoked_access_tokens')
      .values(jtis.map((jti, i) => ({ jti, organization_id: organizationId, grant_id: grant, expires_at: sql<Date>`now() + interval '1 hour'`, revoked_at: i < 100 ? sql<Date>`now() - interval '5 minutes'` : sql<Date>`now() - make_interval(secs => ${i})` })))
      .execute();
    await t.handle.db
      .insertInto('revoked_access_tokens')
      .values({ jti: 'expired-long-ago', organization_id: organizationId, grant_id: grant, expires_at: sql<Date>`now() - interval '10 minutes'` })
      .execute();
    // Removed members: 40 sharing one removed_at (a tie across a batch boundary), 30 spread
    // over the last hour, and 10 removed long ago.
    const { rows: users } = await sql<{ id: number }>`
      insert into users (email, name) select 'removed-' || g || '@revoked-set.example', 'Removed' from generate_series(1, 80) g returning id`.execute(t.handle.db);
    const { rows: removals } = await sql<{ user_id: number; s: number }>`
      insert into removed_members (organization_id, user_id, removed_at)
      select ${organizationId}, u.id, r.at from unnest(${users.map((u) => u.id)}::bigint[], ${users.map((_, i) => i)}::int[]) as u(id, i)
      cross join lateral (select case when u.i < 40 then now() - interval '20 minutes' when u.i < 70 then now() - make_interval(secs => u.i * 50) else now() - interval '2 hours' end as at) r
      returning user_id, extract(epoch from removed_at)::float8 as s`.execute(t.handle.db);
    for (const [i, r] of removals.entries()) {
      if (i < 70) removedRecently.push({ userId: r.user_id, removedAtS: r.s });
      else removedLongAgo.push(r.user_id);
    }
  });
  afterAll(() => t.close());

  /** A RevocationList with a one-hour token lifetime (so `old` is out), small batches, and its log lines. */
  function instance(options: { db?: typeof t.handle.db; listen?: boolean } = {}) {
    const logs: { msg: string; obj: Record<string, unknown> }[] = [];
    const logger = {
      info: (obj: Record<string, unknown>, msg: string) => logs.push({ msg, obj }),
      warn: (obj: Record<string, unknown>, msg: string) => logs.push({ msg, obj }),
    } as unknown as FastifyBaseLogger;
    const list = new RevocationList(options.db ?? t.handle.db, {
      accessTokenTtl: 3600 + 1800,
      loadBatchSize: BATCH,
      logger,
      ...(options.listen ? { listen: t.handle.listen } : {}),
    });
    return { list, logs };
  }

  it('loads every revocation that can still matter, in batches, and nothing else', async () => {
    const { list, logs } = instance();
    await list.start();
    try {
      expect(revoked).toHaveLength(700);
      for (const id of revoked) if (!list.isRevoked(id)) throw new Error(`revoked grant ${id} not loaded`);
      for (const id of [...old, ...live]) expect(list.isRevoked(id), String(id)).toBe(false);
      const applicationToken = { organization_id: organizationId, sub: 'app', client_id: 'app', iat: 0 };
      for (const jti of jtis) expect(list.isTokenRevoked({ ...applicationToken, jti, grant_id: live[1]! }), jti).toBe(true);
      expect(list.isTokenRevoked({ ...applicationToken, jti: 'expired-long-ago', grant_id: live[1]! })).toBe(false);
      expect(list.isTokenRevoked({ ...applicationToken, jti: randomUUID(), grant_id: revoked[0]! })).toBe(true);
      // A removed member's tokens from up to the removal's second (and REMOVAL_MARGIN_S more) are refused; later ones, an application's own, and those of a removal long ago are not.
      for (const { userId, removedAtS } of removedRecently) {
        const token = { jti: randomUUID(), grant_id: live[1]!, organization_id: organizationId, sub: String(userId), client_id: 'some-client' };
        expect(list.isTokenRevoked({ ...token, iat: Math.floor(removedAtS) - 60 }), `user ${userId}`).toBe(true);
        expect(list.isTokenRevoked({ ...token, iat: Math.floor(removedAtS) + REMOVAL_MARGIN_S }), `user ${userId}`).toBe(true);
        expect(list.isTokenRevoked({ ...token, iat: Math.floor(removedAtS) + REMOVAL_MARGIN_S + 1 }), `user ${userId}`).toBe(false);
        expect(list.isTokenRevoked({ ...token, organization_id: organizationId + 1, iat: Math.floor(removedAtS) - 60 }), `user ${userId}`).toBe(false);
      }
      for (const userId of removedLongAgo) {
        expect(list.isTokenRevoked({ jti: randomUUID(), grant_id: live[1]!, organization_id: organizationId, sub: String(userId), client_id: 'c', iat: Math.floor(Date.now() / 1000) - 3 * 3600 })).toBe(false);
      }
      const loaded = logs.find((l) => l.msg === 'revocations loaded')!.obj;
      // 700 grants in 64s, read in two slices: each slice's full batches and a short one, 11 or
      // 12 in all (10 full and two short, or 9 and two); 151 tokens: 2 full and a short one; 70
      // removed members: a full one and a short one.
      expect(loaded).toMatchObject({ grants: 700, tokens: 151, members: 70 });
      expect(loaded.batches).toBeGreaterThanOrEqual(11 + 3 + 2);
      expect(loaded.batches).toBeLessThanOrEqual(12 + 3 + 2);
      // 12 and 20 bytes an entry, and room for RECENT_LIMIT more in each set.
      expect(list.memory().bytes).toBeLessThan(12 * (700 + 700 / 8 + RECENT_LIMIT) + 20 * (151 + RECENT_LIMIT) + 20 * (70 + RECENT_LIMIT) + 1000);
    } finally {
      await list.stop();
    }
  });

  it('carries revoked_at in the cursor exactly, to the microsecond, as a number', async () => {
    // What readGrants and readTokens read (revocation-list.ts), and how they turn it back into a
    // timestamptz: µs since the Unix epoch, from timestamptz_send's µs since 2000 and from extract.
    const { rows } = await sql<{ wrong: number }>`
      with r as (select timestamptz '1970-01-01 00:00:00+00' + random() * interval '250 years' as t from generate_series(1, 20000)),
      x as (
        select t,
          ('x' || encode(timestamptz_send(t), 'hex'))::bit(64)::int8 + 946684800000000 as sent,
          (extract(epoch from t) * 1000000)::int8 as extracted
        from r
      )
      select count(*)::int as wrong from x
      where sent <> extracted or (timestamptz 'epoch' + sent::float8 * interval '1 microsecond') <> t`.execute(t.handle.db);
    expect(rows[0]!.wrong).toBe(0);
  });

  it('reads each batch off the (revoked_at, key) index, without a sort', async () => {
    const { db: recorded, queries } = recording(t.handle.db);
    const { list } = instance({ db: recorded });
    await list.start();
    await list.stop();
    const reads = (table: string) => queries.filter((q) => q.sql.includes(`from "${table}"`) && q.sql.includes('order by'));
    // The first and last revocation that can matter, which the load's slices divide (two probes of the index).
    const [span] = queries.filter((q) => q.sql.includes('min("revoked_at")'));
    for (const [table, index] of [
      ['grants', 'grants_revoked_at_id_idx'],
      ['revoked_access_tokens', 'revoked_access_tokens_revoked_at_jti_idx'],
    ] as const) {
      // The span (grants), the first batch, and one after a cursor.
      const first = reads(table).find((q) => !q.sql.includes(') > ('));
      const next = reads(table).find((q) => q.sql.includes(') > ('));
      for (const query of [...(table === 'grants' ? [span] : []), first, next]) {
        if (!query) throw new Error(`no such query on ${table}: ${queries.map((q) => q.sql).join('\n')}`);
        const plan = await t.handle.db.transaction().execute(async (trx) => {
          // What a large table gets anyway; here the tables are small enough to scan.
          await sql`set local enable_seqscan = off`.execute(trx);
          await sql`set local enable_bitmapscan = off`.execute(trx);
          return JSON.stringify(await explain(trx, query));
        });
        expect(plan, plan).toContain(`"Index Name":"${index}"`);
        expect(plan, plan).not.toMatch(/"Node Type":"[^"]*Sort"/);
        expect(plan, plan).not.toContain('Seq Scan');
      }
    }
  });

  it('starts over after a load that failed half way, without keeping half of it', async () => {
    let grantQueries = 0;
    const failing = t.handle.db.withPlugin({
      transformQuery: ({ node }) => {
        if (node.kind === 'SelectQueryNode' && JSON.stringify(node.from).includes('"grants"') && ++grantQueries === 4) throw new Error('connection lost');
        return node;
      },
      transformResult: async ({ result }) => result,
    });
    const { list, logs } = instance({ db: failing });
    await list.start();
    try {
      expect(logs.map((l) => l.msg)).toEqual(['could not refresh the revocations']);
      expect(revoked.some((id) => list.isRevoked(id))).toBe(false);
      // The next poll (500 ms) loads it all.
      await vi.waitFor(() => expect(logs.map((l) => l.msg)).toContain('revocations loaded'), { timeout: 2000, interval: 20 });
      for (const id of revoked) if (!list.isRevoked(id)) throw new Error(`revoked grant ${id} not loaded`);
      expect(list.memory().grants).toBe(700);
    } finally {
      await list.stop();
    }
  });

  it('follows revocations made after the start within a second, by NOTIFY and by the poll alone', async () => {
    const notified = instance({ listen: true }).list;
    const polling = instance().list;
    await Promise.all([notified.start(), polling.start()]);
    try {
      const [viaNotify, viaPollOnly] = live.slice(2, 4) as [number, number];
      expect(await revokeGrant(t.handle.db, viaNotify, 'revoked_by_admin')).toBe(true);
      // Revoked behind everyone's back: no NOTIFY, only the poll can see it.
      await sql`update grants set revoked_at = now(), revoked_reason = 'revoked_by_admin' where id = ${viaPollOnly}`.execute(t.handle.db);
      const started = Date.now();
      await vi.waitFor(
        () => {
          for (const list of [notified, polling]) expect([list.isRevoked(viaNotify), list.isRevoked(viaPollOnly)]).toEqual([true, true]);
        },
        { timeout: 1000, interval: 10 },
      );
      expect(Date.now() - started).toBeLessThan(1000);
      expect(notified.memory().grants).toBe(702);
    } finally {
      await Promise.all([notified.stop(), polling.stop()]);
    }
  });
});
