/**
 * Issue 27: long work survives the instance that runs it. Two instances of the server run as
 * real processes; a change queues a job (an application disabled: its grants revoked; a role
 * losing a permission: its members' grants narrowed; a member removed: their grants revoked),
 * the instance running it is SIGKILLed midway, and the other finishes it, nobody asking again.
 * Then, in the database: every grant revoked (or narrowed) exactly once, none left out.
 *
 * Midway is made, not waited for: before the change, the test locks a grant that the job reaches
 * after some of its steps (each a transaction of its own) have committed, and the kill lands
 * while the job's step waits for that lock. The killed instance's lease would run out after
 * LEASE_S; the test ends it at once (the lease is the job's due_at, set back to now, and a NOTIFY
 * wakes the other instance) instead of waiting out the clock: running out by itself is shown in
 * process (test/jobs/queue.test.ts, "resumes a job whose instance died from its cursor once the
 * lease runs out").
 *
 * The finished job is looked at through the CLI (`orgauth job show --json`). PostgreSQL only: the
 * test holds a lock from a connection of its own beside two server processes, and the embedded
 * database is opened by one process at a time.
 */
import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRole } from '../../src/accounts/roles.js';
import { connectDatabase, type DB } from '../../src/db/connect.js';
import { JOB_CHANNEL } from '../../src/jobs/queue.js';
import { createApplication } from '../../src/oauth/models/applications.js';
import { BACKEND } from '../helpers/db.js';
import { CLI, freePort, run, type Running, SERVER, start } from '../helpers/process.js';
import { killIfRunning, type Outcome, request, useServerDatabase, waitFor, waitUntilServing } from './harness.js';

const REDIRECT = 'https://client.example.com/cb';
/** Ten steps of each job (300 grants a step; 100 members a step): the lock stops it in the sixth. */
const GRANTS = 3000;
const MEMBERS = 1000;
const MEMBER_GRANTS = 3000;

interface Instance {
  server: Running;
  baseUrl: string;
}

describe.skipIf(BACKEND !== 'postgres')(`SIGKILL while a job runs, then another instance finishes it, on ${BACKEND}`, () => {
  let manager: { client_id: string; client_secret: string };
  let publicAppId: number;
  let crowdAppId: number;
  let hoarderId: number;
  const setup = useServerDatabase(1, REDIRECT, async (db, fixture) => {
    manager = await createApplication(db, {
      organizationId: fixture.organizationId,
      type: 'private',
      name: 'Administrator',
      // A role is edited only by whom holds what it grants (roles.ts refuseBeyond).
      scopes: 'applications.read applications.write members.read members.write contacts.read contacts.write tasks.read tasks.write',
    });
    publicAppId = await appId(db, fixture.publicApp.client_id);
    await sql`insert into grants (organization_id, application_id, user_id, scopes)
      select ${fixture.organizationId}, ${publicAppId}, ${fixture.ownerId}, '{contacts.read}' from generate_series(1, ${GRANTS})`.execute(db);
    // A role held by MEMBERS members, each with a grant of another application holding all its permissions.
    const crowd = await createApplication(db, { organizationId: fixture.organizationId, type: 'public', name: 'Crowd', redirectUris: [REDIRECT] });
    crowdAppId = await appId(db, crowd.client_id);
    const role = await createRole(db, fixture.organizationId, { name: 'Crowd', permissions: ['contacts.read', 'contacts.write', 'tasks.read'] });
    await sql`insert into users (email, password_hash, email_verified_at) select 'crowd-' || g || '@example.com', '$argon2id$crowd', now() from generate_series(1, ${MEMBERS}) g`.execute(db);
    await sql`insert into memberships (organization_id, user_id, role, role_id) select ${fixture.organizationId}, id, 'custom', ${role.id} from users where email like 'crowd-%'`.execute(db);
    await sql`insert into grants (organization_id, application_id, user_id, scopes)
      select ${fixture.organizationId}, ${crowdAppId}, id, '{contacts.read,contacts.write,tasks.read}' from users where email like 'crowd-%'`.execute(db);
    // A viewer who gave another application MEMBER_GRANTS grants (an automation account).
    const automation = await createApplication(db, { organizationId: fixture.organizationId, type: 'public', name: 'Automation', redirectUris: [REDIRECT] });
    const automationAppId = await appId(db, automation.client_id);
    hoarderId = (await db.insertInto('users').values({ email: 'hoarder@example.com', password_hash: '$argon2id$hoarder', email_verified_at: new Date() }).returning('id').executeTakeFirstOrThrow()).id;
    await db.insertInto('memberships').values({ organization_id: fixture.organizationId, user_id: hoarderId, role: 'viewer' }).execute();
    await sql`insert into grants (organization_id, application_id, user_id, scopes)
      select ${fixture.organizationId}, ${automationAppId}, ${hoarderId}, '{contacts.read}' from generate_series(1, ${MEMBER_GRANTS})`.execute(db);
  });

  /** The instances running now; one starting (for the next test) while a job finishes. */
  const instances: Instance[] = [];
  let starting: Promise<Instance> | undefined;
  /** The test's own connection: reads the jobs and the locks beside the servers. */
  let watcher: pg.Client;

  function startInstance(): Promise<Instance> {
    return (async () => {
      const port = await freePort();
      const baseUrl = `http://127.0.0.1:${port}`;
      // LOG_LEVEL=info: the instance that finishes a job says so ("job finished").
      const server = start(SERVER, [], { ...setup.database.env, PORT: String(port), LOG_LEVEL: 'info', API_RATE_LIMIT: '0' });
      const instance = { server, baseUrl };
      instances.push(instance);
      // Two start at once, on a busy machine: a bound for a hung start only.
      await waitUntilServing(server, baseUrl, 120_000);
      return instance;
    })();
  }

  const alive = () => instances.filter((i) => i.server.child.exitCode === null && i.server.child.signalCode === null);

  /** Two instances serving: the one that starts a job and the one that finishes it. */
  async function twoInstances(): Promise<Instance[]> {
    const pending = starting;
    starting = undefined;
    await pending;
    await Promise.all(Array.from({ length: 2 - alive().length }, () => startInstance()));
    return alive();
  }

  const databaseUrl = () => (setup.database.target.kind === 'postgres' ? setup.database.target.url : '');

  beforeAll(async () => {
    watcher = new pg.Client({ connectionString: databaseUrl() });
    watcher.on('error', () => {});
    await watcher.connect();
    await twoInstances();
  }, 180_000);

  afterAll(async () => {
    await starting?.catch(() => {});
    await Promise.all(instances.map((i) => killIfRunning(i.server)));
    await watcher?.end();
  });

  async function managementToken(baseUrl: string): Promise<string> {
    const auth = `Basic ${Buffer.from(`${manager.client_id}:${manager.client_secret}`).toString('base64')}`;
    const res = await request(baseUrl, { method: 'POST', path: '/oauth/token',
      headers: { authorization: auth, 'content-type': 'application/x-www-form-urlencoded' },
      body: `grant_type=client_credentials&organization_id=${setup.fixture.organizationId}&scope=${encodeURIComponent('applications.write members.write contacts.read contacts.write tasks.read tasks.write')}`,
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    return (res.body as { access_token: string }).access_token;
  }

  interface JobRow {
    id: number;
    state: string;
    instance: string | null;
    attempts: number;
    progress_done: number;
  }

  /** The `kind` job, as the database has it now. */
  async function jobRow(kind: string): Promise<JobRow | undefined> {
    const { rows } = await watcher.query<JobRow>('select id::int, state, instance, attempts, progress_done::int from jobs where kind = $1 order by id desc limit 1', [kind]);
    return rows[0];
  }

  interface JobOut {
    id: number;
    kind: string;
    state: string;
    progress: { done: number; total: number | null };
    attempts: number;
  }

  /**
   * With grant `lockedGrant` locked by the test, makes the change (`change`, with a management
   * token; answered at once, the lock notwithstanding), waits for the job it queued to wait for
   * that lock (its earlier steps committed), and SIGKILLs the instance running it. Then releases
   * the lock, ends the dead instance's lease and waits for the other instance to finish the job,
   * nobody asking again. Returns the finished job as the CLI shows it.
   */
  async function killMidwayThenFinish(kind: string, size: number, lockedGrant: number, change: (baseUrl: string, token: string) => Promise<Outcome>): Promise<JobOut> {
    const [first] = await twoInstances();
    const locker = new pg.Client({ connectionString: databaseUrl() });
    locker.on('error', () => {});
    await locker.connect();
    let killed: JobRow;
    try {
      const lockerPid = (await locker.query<{ pid: number }>('select pg_backend_pid() as pid')).rows[0]!.pid;
      await locker.query('begin');
      await locker.query('select id from grants where id = $1 for update', [lockedGrant]);

      const res = await change(first!.baseUrl, await managementToken(first!.baseUrl));
      expect(res.status, JSON.stringify(res.body)).toBeOneOf([200, 204]);

      killed = await waitFor(
        `the ${kind} job to wait for the locked grant`,
        async () => {
          const job = await jobRow(kind);
          if (job?.state === 'succeeded') throw new Error(`the ${kind} job finished past the locked grant`);
          const { rows } = await watcher.query('select 1 from pg_stat_activity where $1 = any(pg_blocking_pids(pid))', [lockerPid]);
          return job && rows.length > 0 ? job : undefined;
        },
        60_000,
        10,
      );
      // Midway: some steps committed, the rest waiting.
      expect(killed.state).toBe('running');
      expect(killed.progress_done).toBeGreaterThan(0);
      expect(killed.progress_done).toBeLessThan(size);
      // An instance is named host:pid:random (JobRunner.instance).
      const victim = alive().find((i) => killed.instance?.endsWith(`:${i.server.child.pid}:${killed.instance.split(':').at(-1)}`));
      expect(victim, `the instance running the job (${killed.instance})`).toBeDefined();
      victim!.server.child.kill('SIGKILL');
      await victim!.server.exited;
    } finally {
      // The dead instance's step, let through, finds its client gone and rolls back.
      await locker.query('rollback').catch(() => {});
      await locker.end();
    }

    // Its lease ends now instead of in LEASE_S (waiting, if need be, for its step to roll back),
    // and the other instance hears of it.
    await watcher.query("update jobs set due_at = now() where id = $1 and attempts = $2 and state = 'running'", [killed.id, killed.attempts]);
    await watcher.query('select pg_notify($1, $2)', [JOB_CHANNEL, String(killed.id)]);
    const others = alive();
    // The next test's second instance starts meanwhile.
    starting = startInstance();
    const finished = new RegExp(`"job_id":${killed.id},"kind":"${kind.replace(/\./g, '\\.')}","msg":"job finished"`);
    await Promise.any(others.map((i) => i.server.waitForOutput(finished, 240_000)));

    const out = await run(CLI, ['job', 'show', '--id', String(killed.id), '--json'], setup.database.env);
    expect(out.code, out.stderr).toBe(0);
    const done = JSON.parse(out.stdout) as JobOut;
    expect({ kind: done.kind, state: done.state, done: done.progress.done }).toEqual({ kind, state: 'succeeded', done: size });
    // Claimed again after the kill: by the other instance, not by anyone asking.
    expect(done.attempts).toBeGreaterThanOrEqual(killed.attempts + 1);
    return done;
  }

  /** Grant ids of `where`, in id order: the `n`th (from 0). */
  async function nthGrant(where: { applicationId?: number; userId?: number }, n: number): Promise<number> {
    const { rows } = await watcher.query<{ id: number }>(
      'select id::int from grants where ($1::bigint is null or application_id = $1) and ($2::bigint is null or user_id = $2) order by id offset $3 limit 1',
      [where.applicationId ?? null, where.userId ?? null, n],
    );
    return rows[0]!.id;
  }

  /** Opens the database beside the servers. */
  async function inDatabase<T>(fn: (db: DB) => Promise<T>): Promise<T> {
    const handle = await connectDatabase(setup.database.target);
    try {
      return await fn(handle.db);
    } finally {
      await handle.close();
    }
  }

  it(`an application holding ${GRANTS.toLocaleString('en')} grants disabled: answered at once, and every grant revoked once although the server died midway`, async () => {
    const { fixture } = setup;
    // In the sixth step of 300 (grants in id order).
    const locked = await nthGrant({ applicationId: publicAppId }, GRANTS / 2 + 150);
    const done = await killMidwayThenFinish('application.revoke_grants', GRANTS, locked, (baseUrl, token) =>
      request(baseUrl, { method: 'PATCH', path: `/api/v1/${fixture.organizationId}/applications/${fixture.publicApp.client_id}`,
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body: JSON.stringify({ disabled: true }),
      }));
    expect(done.progress.total).toBe(GRANTS);

    await inDatabase(async (db) => {
      const live = await db.selectFrom('grants').select((eb) => eb.fn.countAll<number>().as('n')).where('application_id', '=', publicAppId).where('revoked_at', 'is', null).executeTakeFirstOrThrow();
      expect(Number(live.n)).toBe(0);
      const { rows } = await sql<{ n: number; grants: number }>`
        select count(*) as n, count(distinct details->>'grant_id') as grants from audit_events
        where action = 'grant.revoked' and (details->>'application_id')::bigint = ${publicAppId}`.execute(db);
      // Each grant revoked exactly once: one audit event each, none twice.
      expect(rows.map((r) => [Number(r.n), Number(r.grants)])).toEqual([[GRANTS, GRANTS]]);
    });
  }, 300_000);

  it(`a role held by ${MEMBERS.toLocaleString('en')} members losing a permission: after the server died midway, a new one narrows every grant, nobody PATCHing again`, async () => {
    const { fixture } = setup;
    // The grant of a member in the sixth step of 100 (members in user id order).
    const { rows } = await watcher.query<{ id: number }>('select id::int from grants where application_id = $1 order by user_id offset $2 limit 1', [crowdAppId, MEMBERS / 2 + 50]);
    await killMidwayThenFinish('role.narrow_grants', MEMBERS, rows[0]!.id, (baseUrl, token) =>
      request(baseUrl, { method: 'PATCH', path: `/api/v1/${fixture.organizationId}/roles/Crowd`,
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body: JSON.stringify({ permissions: ['contacts.read', 'tasks.read'] }),
      }));

    await inDatabase(async (db) => {
      const live = await db
        .selectFrom('grants')
        .select(['scopes', (eb) => eb.fn.countAll<number>().as('n')])
        .where('application_id', '=', crowdAppId)
        .where('revoked_at', 'is', null)
        .groupBy('scopes')
        .execute();
      expect(live.map((g) => [g.scopes, Number(g.n)])).toEqual([[['contacts.read', 'tasks.read'], MEMBERS]]);
      const { rows } = await sql<{ n: number; grants: number }>`
        select count(*) as n, count(distinct details->>'replaced_grant_id') as grants from audit_events
        where action = 'grant.narrowed' and (details->>'application_id')::bigint = ${crowdAppId}`.execute(db);
      expect(rows.map((r) => [Number(r.n), Number(r.grants)])).toEqual([[MEMBERS, MEMBERS]]);
    });
  }, 300_000);

  it(`a member holding ${MEMBER_GRANTS.toLocaleString('en')} grants removed: answered at once, and every grant revoked once although the server died midway`, async () => {
    const { fixture } = setup;
    const locked = await nthGrant({ userId: hoarderId }, MEMBER_GRANTS / 2 + 150);
    const done = await killMidwayThenFinish('member.revoke_grants', MEMBER_GRANTS, locked, (baseUrl, token) =>
      request(baseUrl, { method: 'DELETE', path: `/api/v1/${fixture.organizationId}/members/${hoarderId}`, headers: { authorization: `Bearer ${token}` } }));
    expect(done.progress.total).toBe(MEMBER_GRANTS);

    await inDatabase(async (db) => {
      const live = await db.selectFrom('grants').select((eb) => eb.fn.countAll<number>().as('n')).where('user_id', '=', hoarderId).where('revoked_at', 'is', null).executeTakeFirstOrThrow();
      expect(Number(live.n)).toBe(0);
      const { rows } = await sql<{ n: number; grants: number }>`
        select count(*) as n, count(distinct details->>'grant_id') as grants from audit_events
        where action = 'grant.revoked' and details->>'reason' = 'member_removed' and (details->>'user_id')::bigint = ${hoarderId}`.execute(db);
      expect(rows.map((r) => [Number(r.n), Number(r.grants)])).toEqual([[MEMBER_GRANTS, MEMBER_GRANTS]]);
    });
  }, 300_000);
});

async function appId(db: DB, clientId: string): Promise<number> {
  return (await db.selectFrom('applications').select('id').where('client_id', '=', clientId).executeTakeFirstOrThrow()).id;
}
