/**
 * src/oauth/models/seen-jtis.ts: the replay store of DPoP proofs and client assertions. Each key is
 * fresh once, whichever instance sees it, and within one batch; a key already there refuses only
 * itself, not the fresh keys sent in the same statement; a row whose window closed long ago is
 * taken over.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CLOCK_MARGIN_S, SeenJtis, seenJtiDigest } from '../../src/oauth/models/seen-jtis.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';

let database: Awaited<ReturnType<typeof createTestDatabase>>;
const inAMinute = () => Math.floor(Date.now() / 1000) + 60;
let n = 0;
const fresh = (kind = 'dpop') => `${kind}:key-${process.pid}:${++n}-${Math.random()}`;

beforeAll(async () => {
  database = await createTestDatabase();
});
afterAll(async () => {
  await database?.close();
});

describe(`the replay store on ${BACKEND}`, () => {
  it('takes a key once, on this instance or another sharing the database', async () => {
    const one = new SeenJtis(database.handle.db);
    const other = new SeenJtis(database.handle.db);
    const key = fresh();
    expect(await one.firstUse(key, inAMinute())).toBe(true);
    expect(await one.firstUse(key, inAMinute())).toBe(false);
    expect(await other.firstUse(key, inAMinute())).toBe(false);
    // The kind is part of the key: the same jti of an assertion is another key.
    expect(await other.firstUse(key.replace(/^dpop:/, 'assertion:'), inAMinute())).toBe(true);
  });

  it('refuses the second of a key sent twice at once, and only it', async () => {
    const store = new SeenJtis(database.handle.db);
    const key = fresh();
    // One statement runs at a time: these wait for the next together, in one batch.
    const results = await Promise.all([store.firstUse(fresh(), inAMinute()), store.firstUse(key, inAMinute()), store.firstUse(key, inAMinute()), store.firstUse(fresh(), inAMinute())]);
    expect(results).toEqual([true, true, false, true]);
  });

  it('refuses a key seen before without refusing the fresh ones of its batch', async () => {
    const store = new SeenJtis(database.handle.db);
    const seen = fresh();
    expect(await store.firstUse(seen, inAMinute())).toBe(true);
    const keys = [fresh(), fresh(), seen, fresh(), fresh()];
    const results = await Promise.all([store.firstUse(fresh(), inAMinute()), ...keys.map((k) => store.firstUse(k, inAMinute()))]);
    expect(results).toEqual([true, true, true, false, true, true]);
    // All the fresh ones are remembered now.
    for (const k of keys) expect(await store.firstUse(k, inAMinute())).toBe(false);
  });

  it('takes over a row whose window closed long ago, and not one that closed just now', async () => {
    const store = new SeenJtis(database.handle.db);
    const [old, recent] = [fresh(), fresh()];
    await sql`insert into seen_jtis (key, expires_at) values
      (${seenJtiDigest(old)}::uuid, now() - make_interval(secs => ${CLOCK_MARGIN_S + 10})),
      (${seenJtiDigest(recent)}::uuid, now() - make_interval(secs => 10))`.execute(database.handle.db);
    expect(await Promise.all([store.firstUse(old, inAMinute()), store.firstUse(recent, inAMinute())])).toEqual([true, false]);
    expect(await store.firstUse(old, inAMinute())).toBe(false);
  });

  it('keeps a key as the first 128 bits of its SHA-256, as a uuid', async () => {
    const key = fresh();
    expect(seenJtiDigest(key)).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
    const { rows } = await sql<{ digest: string }>`select encode(substring(sha256(convert_to(${key}, 'UTF8')) from 1 for 16), 'hex')::uuid::text as digest`.execute(database.handle.db);
    expect(rows[0]!.digest).toBe(seenJtiDigest(key));
    await new SeenJtis(database.handle.db).firstUse(key, inAMinute());
    const stored = await database.handle.db.selectFrom('seen_jtis').select('key').where('key', '=', seenJtiDigest(key)).execute();
    expect(stored).toHaveLength(1);
  });
});
