/**
 * An instance's LISTEN connection (src/db/connect.ts ListenConnection): one PostgreSQL session
 * for every channel (revocations, applications, jobs, webhooks), which comes back by itself
 * after it is cut, LISTENing to every channel again and telling every subscriber. PostgreSQL
 * only: the embedded database listens in process.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BACKEND, createTestDatabase } from '../helpers/db.js';

describe.skipIf(BACKEND !== 'postgres')(`the LISTEN connection on ${BACKEND}`, () => {
  let t: Awaited<ReturnType<typeof createTestDatabase>>;
  beforeAll(async () => {
    t = await createTestDatabase();
  });
  afterAll(() => t.close());

  const listenSessions = async () =>
    (
      await sql<{ pid: number }>`select pid from pg_stat_activity where application_name = 'orgauth-listen' and datname = current_database()`.execute(t.handle.db)
    ).rows.map((r) => r.pid);
  const notify = (channel: string, payload: string) => sql`select pg_notify(${channel}, ${payload})`.execute(t.handle.db);
  const until = async (what: string, check: () => boolean | Promise<boolean>) => {
    const deadline = Date.now() + 5000;
    while (!(await check())) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 20));
    }
  };

  it('is one session for every channel, comes back after it is cut for all of them, and closes with the last subscriber', async () => {
    const heard: Record<string, string[]> = { a1: [], a2: [], b: [] };
    const reconnects: Record<string, number> = { a1: 0, a2: 0, b: 0 };
    const subscribe = (channel: string, name: string) =>
      t.handle.listen(channel, (payload) => heard[name]!.push(payload), () => reconnects[name]!++);
    const stopA1 = await subscribe('test_listen_a', 'a1');
    const stopA2 = await subscribe('test_listen_a', 'a2');
    const stopB = await subscribe('test_listen_b', 'b');
    const [pid] = await listenSessions();
    expect(await listenSessions()).toEqual([pid]);

    await notify('test_listen_a', 'one');
    await notify('test_listen_b', 'two');
    await until('both channels heard', () => heard.a1!.length === 1 && heard.a2!.length === 1 && heard.b!.length === 1);
    expect(heard).toEqual({ a1: ['one'], a2: ['one'], b: ['two'] });

    // Cut: it comes back, LISTENs to both channels again, and tells each subscriber (what was sent meanwhile is lost).
    await sql`select pg_terminate_backend(${pid}::int)`.execute(t.handle.db);
    await until('every subscriber told of the reconnection', () => reconnects.a1 === 1 && reconnects.a2 === 1 && reconnects.b === 1);
    const after = await listenSessions();
    expect(after).toHaveLength(1);
    expect(after[0]).not.toBe(pid);
    await notify('test_listen_a', 'three');
    await notify('test_listen_b', 'four');
    await until('both channels heard again', () => heard.a1!.length === 2 && heard.b!.length === 2);

    // One channel's last subscriber gone: that channel is no longer heard, the other still is, on the same session.
    await stopB();
    await stopA1();
    await notify('test_listen_b', 'unheard');
    await notify('test_listen_a', 'five');
    await until('the remaining channel heard', () => heard.a2!.length === 3);
    expect(heard).toEqual({ a1: ['one', 'three'], a2: ['one', 'three', 'five'], b: ['two', 'four'] });
    expect(await listenSessions()).toEqual(after);

    await stopA2();
    await until('the session closed with the last subscriber', async () => (await listenSessions()).length === 0);
  });
});
