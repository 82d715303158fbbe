/**
 * npx tsx bench/roles-volume.ts [--members N] [--grants N]: what organization roles cost at
 * volume (issue 15). On the PostgreSQL of BENCH_DATABASE_URL (default
 * postgres://postgres@127.0.0.1:5432/postgres) it builds one organization with N members (a
 * million by default), all holding one custom role, GRANTS of them (100,000) with a live grant
 * and its refresh token, and times, through the domain functions the dashboard and the API call:
 * one member's role change (narrowing their grant), the members list (first page and deep), a
 * user's organizations with their roles (the consent page), a custom role losing a permission
 * (narrowing every member's grant), and deleting the role with its members moved, each with the
 * longest wait meanwhile for the lock a code redemption takes. The database
 * is dropped at the end (unless --keep; --explain prints the deep members page's plan).
 */
import { sql, type Transaction } from 'kysely';
import { changeMemberRole, listMembers } from '../src/accounts/organizations.js';
import { listUserOrganizations } from '../src/accounts/organizations.js';
import { deleteRole, updateRole } from '../src/accounts/roles.js';
import { jobHandlers } from '../src/jobs/handlers.js';
import { JobRunner } from '../src/jobs/queue.js';
import { connectDatabase } from '../src/db/connect.js';
import { migrateToLatest } from '../src/db/migrate.js';
import type { Database } from '../src/db/schema.js';
import pg from 'pg';

const ADMIN_URL = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const DB_NAME = 'orgauth_roles_volume';
const option = (name: string) => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : undefined;
};
const MEMBERS = Number(option('--members') ?? 1_000_000);
const GRANTS = Number(option('--grants') ?? 100_000);

async function admin(query: string): Promise<void> {
  const client = new pg.Client({ connectionString: ADMIN_URL });
  await client.connect();
  try {
    await client.query(query);
  } finally {
    await client.end();
  }
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
async function timed<T>(fn: () => Promise<T>): Promise<{ ms: number; value: T }> {
  const started = performance.now();
  const value = await fn();
  return { ms: performance.now() - started, value };
}
async function medianOf(rounds: number, fn: () => Promise<unknown>): Promise<number> {
  const times: number[] = [];
  for (let i = 0; i < rounds; i++) times.push((await timed(fn)).ms);
  return median(times);
}

async function main(): Promise<void> {
  await admin(`drop database if exists ${DB_NAME} with (force)`);
  await admin(`create database ${DB_NAME}`);
  const url = new URL(ADMIN_URL);
  url.pathname = `/${DB_NAME}`;
  const handle = await connectDatabase({ kind: 'postgres', url: url.toString() });
  const db = handle.db;
  try {
    await migrateToLatest(db);
    console.log(`seeding ${MEMBERS.toLocaleString('en')} members in one custom role, ${GRANTS.toLocaleString('en')} live grants...`);
    const seeded = await timed(async () => {
      await sql`insert into users (email, password_hash, email_verified_at) select 'u' || g || '@volume.example', '$argon2id$volume', now() from generate_series(1, ${MEMBERS}::int) g`.execute(db);
      const org = (await sql<{ id: number }>`insert into organizations (name) values ('Volume') returning id`.execute(db)).rows[0]!.id;
      const role = (await sql<{ id: number }>`insert into roles (organization_id, name, permissions) values (${org}, 'Field', '{contacts.read,contacts.write,tasks.read}') returning id`.execute(db)).rows[0]!.id;
      await sql`insert into memberships (organization_id, user_id, role, role_id) select ${org}, id, 'custom', ${role} from users`.execute(db);
      await sql`update memberships set role = 'owner', role_id = null where user_id = (select min(id) from users)`.execute(db);
      const app = (await sql<{ id: number }>`insert into applications (organization_id, client_id, client_secret_hash, type, name, redirect_uris, scopes)
        values (${org}, 'c0000000000000000000000000000001', repeat('a', 64), 'public', 'Volume app', '{https://volume.example/cb}', '{contacts.read,contacts.write,tasks.read,tasks.write}') returning id`.execute(db)).rows[0]!.id;
      await sql`insert into grants (organization_id, application_id, user_id, scopes, last_used_at)
        select ${org}, ${app}, id, '{contacts.read,contacts.write,tasks.read}', now() from users where id > (select min(id) from users) order by id limit ${GRANTS}`.execute(db);
      await sql`insert into refresh_tokens (token_hash, organization_id, grant_id, scopes, expires_at)
        select md5(id::text) || md5(id::text || 'r'), organization_id, id, scopes, now() + interval '30 days' from grants`.execute(db);
      await sql`vacuum analyze`.execute(db);
      return { org, role };
    });
    const { org } = seeded.value;
    console.log(`seeded in ${(seeded.ms / 1000).toFixed(1)} s`);
    const someone = (await sql<{ id: number }>`select user_id as id from grants where revoked_at is null order by id desc limit 1`.execute(db)).rows[0]!.id;
    const field = { kind: 'custom' as const, id: seeded.value.role, name: 'Field', permissions: ['contacts.read', 'contacts.write', 'tasks.read'] as const };

    const rows: [string, string][] = [];
    // One member's role change: to viewer narrows their grant; back to Field narrows nothing.
    const change = await medianOf(7, async () => {
      await changeMemberRole(db, { organizationId: org, userId: someone, role: 'viewer' });
      await changeMemberRole(db, { organizationId: org, userId: someone, role: { ...field, permissions: [...field.permissions] } });
    });
    rows.push(['a member demoted (their grant narrowed) and given the role back', `${change.toFixed(1)} ms`]);
    rows.push(['members, first page of 100', `${(await medianOf(7, () => listMembers(db, org, { afterUserId: 0, limit: 101 }))).toFixed(1)} ms`]);
    rows.push(['members, a page 900,000 deep', `${(await medianOf(7, () => listMembers(db, org, { afterUserId: Math.floor(MEMBERS * 0.9), limit: 101 }))).toFixed(1)} ms`]);
    if (process.argv.includes('--explain')) {
      const plan = await sql<{ 'QUERY PLAN': string }>`explain analyze select m.user_id, u.email, u.name, m.role, m.role_id, r.name as role_name, m.created_at
        from memberships m inner join users u on u.id = m.user_id left join roles r on r.id = m.role_id
        where m.organization_id = ${org} and m.user_id > ${Math.floor(MEMBERS * 0.9)} order by m.user_id limit 101`.execute(db);
      console.log(plan.rows.map((r) => r['QUERY PLAN']).join('\n'));
    }
    rows.push(["a user's organizations with their roles (consent page)", `${(await medianOf(7, () => listUserOrganizations(db, someone))).toFixed(2)} ms`]);
    // What a code redemption or refresh of the role's members waits for meanwhile: the longest
    // share lock on the role (narrowing) or on a member's row (moving), taken every 20 ms.
    const longestWait = async <T>(lock: (trx: Transaction<Database>) => Promise<unknown>, work: () => Promise<T>) => {
      let done = false;
      let longest = 0;
      const probe = (async () => {
        while (!done) {
          longest = Math.max(longest, (await timed(() => db.transaction().execute(lock))).ms);
          await new Promise((r) => setTimeout(r, 20));
        }
      })();
      const result = await timed(work);
      done = true;
      await probe;
      return { ...result, longest };
    };
    const lockRole = (trx: Transaction<Database>) => sql`select permissions from roles where id = ${seeded.value.role} for share`.execute(trx);
    // The request answers once the change and its job are committed; the job does the narrowing.
    const runner = new JobRunner(db, { handlers: jobHandlers(), logger: { info: () => {}, warn: console.warn, error: console.error } as never });
    const andJob = async <T>(work: () => Promise<T>) => {
      const answered = await timed(work);
      const job = (await sql<{ id: number }>`select max(id) as id from jobs`.execute(db)).rows[0]!.id;
      await runner.runToEnd(job, { timeoutMs: 3_600_000 });
      return { ...answered, value: answered.value, requestMs: answered.ms };
    };
    const narrowed = await longestWait(lockRole, () => andJob(() => updateRole(db, org, 'Field', { permissions: ['contacts.read', 'tasks.read'] })));
    const live = (await sql<{ n: number }>`select count(*)::int as n from grants where revoked_at is null and 'contacts.write' = any(scopes)`.execute(db)).rows[0]!.n;
    rows.push([`the role loses contacts.write: the request answered`, `${narrowed.value.requestMs.toFixed(0)} ms`]);
    rows.push([`... and its job narrowed ${GRANTS.toLocaleString('en')} grants (left holding it: ${live})`, `${(narrowed.ms / 1000).toFixed(1)} s (${Math.round(GRANTS / (narrowed.ms / 1000)).toLocaleString('en')} grants/s)`]);
    rows.push(['meanwhile, a share lock on the role (what a code redemption takes; the batches only share it): longest', `${narrowed.longest.toFixed(1)} ms`]);
    const last = (await sql<{ id: number }>`select max(user_id) as id from memberships where organization_id = ${org}`.execute(db)).rows[0]!.id;
    const lockMember = (trx: Transaction<Database>) => sql`select role from memberships where organization_id = ${org} and user_id = ${last} for share`.execute(trx);
    const deleted = await longestWait(lockMember, () => andJob(() => deleteRole(db, org, 'Field', { moveTo: 'viewer' })));
    rows.push([`the role deleted: the request answered`, `${deleted.value.requestMs.toFixed(0)} ms`]);
    rows.push([`... and its job moved ${deleted.value.value.moved.toLocaleString('en')} members to viewer`, `${(deleted.ms / 1000).toFixed(1)} s`]);
    rows.push(['meanwhile, a share lock on the member moved last (what a code redemption takes): longest', `${deleted.longest.toFixed(1)} ms`]);
    console.log('\n| measure (PostgreSQL, median of 7 where repeated) | time |\n|---|---|');
    for (const [k, v] of rows) console.log(`| ${k} | ${v} |`);
  } finally {
    await handle.close();
    if (!process.argv.includes('--keep')) await admin(`drop database if exists ${DB_NAME} with (force)`);
  }
}

await main();
