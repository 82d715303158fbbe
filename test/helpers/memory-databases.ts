/**
 * The embedded test databases in memory, kept by their worker from one file to the next.
 *
 * Opening one from the migrated template (`openPglite` with the run's archive) costs about 0.9 s
 * of CPU (1.3–2.3 s in a busy run): PGlite starts a PostgreSQL backend in WebAssembly. Emptying
 * one again costs about 0.2 s. So when a file closes its database, the handle it had is closed for good (its
 * queries fail as on a closed PGlite, its LISTENs are gone) and the database goes back to what
 * the template holds before the worker's next file gets it:
 *
 * - any transaction left open is rolled back and the session's state discarded (DISCARD ALL:
 *   settings, prepared statements, temporary tables, advisory locks, LISTEN);
 * - every table the template leaves empty and the file wrote to is truncated, and every sequence
 *   is put back where the template had it (its identity columns start again at 1);
 * - it is kept only if nothing else differs from the template: the schema (tables, columns,
 *   constraints, indexes, triggers, functions, views, extensions, schemas), roles and their
 *   settings, the planner's statistics, and the rows of the tables the template fills (the
 *   migrations' own). A file that changed any of these leaves its database to be closed; the
 *   next file gets another kept one or a new one.
 *
 * Databases on disk (for a server or CLI process) and empty ones are not kept: test/helpers/db.ts
 * makes those as before.
 */
import type { PGlite } from '@electric-sql/pglite';
import { type DatabaseHandle, openPglite, type PgliteClient, pgliteHandle } from '../../src/db/connect.js';

/** At most this many idle databases per worker (a file may hold two at once). */
const KEEP = 2;

/** What is compared with the template before a database is kept (one row, one text). */
const STATE_SQL = `
select concat_ws(E'\\n',
  (select string_agg(format('%s.%s %s %s', n.nspname, c.relname, c.relkind, c.relnatts), ',' order by n.nspname, c.relname)
     from pg_class c join pg_namespace n on n.oid = c.relnamespace
    where n.nspname not in ('pg_catalog', 'information_schema') and n.nspname not like 'pg_toast%' and n.nspname not like 'pg_temp%'),
  (select string_agg(format('%s.%s %s %s %s', a.attrelid::regclass, a.attname, a.atttypid::regtype, a.attnotnull, pg_get_expr(d.adbin, d.adrelid)), ',' order by a.attrelid::regclass::text, a.attnum)
     from pg_attribute a join pg_class c on c.oid = a.attrelid join pg_namespace n on n.oid = c.relnamespace
     left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
    where n.nspname not in ('pg_catalog', 'information_schema') and n.nspname not like 'pg_toast%' and a.attnum > 0 and not a.attisdropped),
  (select string_agg(format('%s %s %s', conrelid::regclass, conname, pg_get_constraintdef(oid)), ',' order by conrelid::regclass::text, conname)
     from pg_constraint where connamespace not in ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)),
  (select string_agg(pg_get_indexdef(indexrelid), ',' order by indexrelid::regclass::text)
     from pg_index i join pg_class c on c.oid = i.indrelid join pg_namespace n on n.oid = c.relnamespace
    where n.nspname not in ('pg_catalog', 'information_schema') and n.nspname not like 'pg_toast%'),
  (select string_agg(format('%s %s %s', tgrelid::regclass, tgname, tgenabled), ',' order by tgrelid::regclass::text, tgname) from pg_trigger),
  (select string_agg(format('%s %s', p.oid::regprocedure, md5(p.prosrc)), ',' order by p.oid::regprocedure::text)
     from pg_proc p join pg_namespace n on n.oid = p.pronamespace where n.nspname not in ('pg_catalog', 'information_schema')),
  (select string_agg(format('%s %s', ev_class::regclass, md5(ev_action::text)), ',' order by ev_class::regclass::text, rulename) from pg_rewrite where ev_class >= 16384),
  (select string_agg(format('%s %s', extname, extversion), ',' order by extname) from pg_extension),
  (select string_agg(nspname, ',' order by nspname) from pg_namespace),
  (select string_agg(format('%s %s %s %s', rolname, rolsuper, rolcanlogin, rolconfig), ',' order by rolname) from pg_roles),
  (select string_agg(format('%s %s %s', setdatabase, setrole, setconfig), ',' order by setdatabase, setrole) from pg_db_role_setting),
  (select count(*)::text from pg_statistic s join pg_class c on c.oid = s.starelid where c.oid >= 16384),
  (select count(*)::text from pg_largeobject_metadata),
  (select string_agg(format('%s.%s %s %s', schemaname, sequencename, last_value, increment_by), ',' order by schemaname, sequencename) from pg_sequences)
) as v`;

/** The template as a fresh database shows it: read from the first one a worker opens. */
interface Template {
  state: string;
  /** The tables the template leaves empty, quoted: those a file wrote to are truncated. */
  emptied: string[];
  /** The tables it fills (the migrations' own): their rows must be unchanged. */
  filled: string[];
  filledRows: string;
  /** Each sequence's last value ('' before its first use). */
  sequences: Map<string, string>;
}

let template: Template | undefined;
const idle: PGlite[] = [];
let opened = 0;

/** How many in-memory databases this worker has opened from the archive (for the helper's own test). */
export const memoryDatabasesOpened = () => opened;

const one = async <T>(client: PGlite, sql: string): Promise<T> => ((await client.query<{ v: T }>(sql)).rows[0] as { v: T }).v;

async function rowsOf(client: PGlite, tables: string[]): Promise<string> {
  if (tables.length === 0) return '';
  return one(client, `select concat_ws(E'\\n', ${tables.map((t) => `(select md5(coalesce(string_agg(r::text, ',' order by r::text), '')) from ${t} r)`).join(', ')}) as v`);
}

/** Which of `tables` (quoted names) hold a row, in one query. */
async function holdingRows(client: PGlite, tables: string[]): Promise<boolean[]> {
  if (tables.length === 0) return [];
  const row = (await client.query<Record<string, boolean>>(`select ${tables.map((name, i) => `exists (select from ${name}) as t${i}`).join(', ')}`)).rows[0]!;
  return tables.map((_, i) => row[`t${i}`]!);
}

async function readTemplate(client: PGlite): Promise<Template> {
  const { rows } = await client.query<{ name: string }>(`
    select format('%I.%I', n.nspname, c.relname) as name
      from pg_class c join pg_namespace n on n.oid = c.relnamespace
     where c.relkind in ('r', 'p') and n.nspname not in ('pg_catalog', 'information_schema') and n.nspname not like 'pg_toast%'
     order by 1`);
  const tables = rows.map((r) => r.name);
  const holding = await holdingRows(client, tables);
  const filled = tables.filter((_, i) => holding[i]);
  return {
    emptied: tables.filter((_, i) => !holding[i]),
    filled,
    filledRows: await rowsOf(client, filled),
    state: await one(client, STATE_SQL),
    sequences: await sequencesOf(client),
  };
}

async function sequencesOf(client: PGlite): Promise<Map<string, string>> {
  const { rows } = await client.query<{ name: string; value: string }>(
    `select format('%I.%I', schemaname, sequencename) as name, coalesce(last_value::text, '') as value from pg_sequences`,
  );
  return new Map(rows.map((r) => [r.name, r.value]));
}

/** Puts `client` back to the template's state; false when it cannot be (see above). */
async function reset(client: PGlite, t: Template): Promise<boolean> {
  if (client.isInTransaction()) await client.exec('rollback');
  await client.exec('discard all');
  const written = await holdingRows(client, t.emptied);
  const toEmpty = t.emptied.filter((_, i) => written[i]);
  if (toEmpty.length > 0) await client.exec(`truncate ${toEmpty.join(', ')} restart identity cascade`);
  // Sequences no truncated table owns: where the template left them.
  for (const [name, value] of await sequencesOf(client)) {
    const wanted = t.sequences.get(name);
    if (wanted === undefined || wanted === value) continue;
    await client.exec(wanted === '' ? `alter sequence ${name} restart` : `select setval('${name.replace(/'/g, "''")}', ${Number(wanted)}, true)`);
  }
  return (await one(client, STATE_SQL)) === t.state && (await rowsOf(client, t.filled)) === t.filledRows;
}

/**
 * What a file gets to use: the database's queries and LISTEN until it closes it, then nothing
 * (as a closed PGlite answers). Closing waits for the file's queries still running.
 */
class Lease implements PgliteClient {
  closed = false;
  private readonly running = new Set<Promise<unknown>>();
  private readonly unlistens = new Set<() => Promise<void>>();
  constructor(private readonly client: PGlite) {}

  private check(): void {
    if (this.closed) throw new Error('PGlite is closed');
  }

  query: PGlite['query'] = <T>(...args: Parameters<PGlite['query']>) => {
    this.check();
    const answer = this.client.query<T>(...args);
    this.running.add(answer);
    void answer.catch(() => {}).finally(() => this.running.delete(answer));
    return answer;
  };

  listen: PGlite['listen'] = async (channel, callback, tx) => {
    this.check();
    const unlisten = await this.client.listen(channel, callback, tx);
    const once = async () => {
      if (this.unlistens.delete(once)) await unlisten();
    };
    this.unlistens.add(once);
    return once;
  };

  dumpDataDir: PGlite['dumpDataDir'] = (...args) => {
    this.check();
    return this.client.dumpDataDir(...args);
  };

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await Promise.allSettled([...this.running]);
    for (const unlisten of [...this.unlistens]) await unlisten();
  }
}

/** A migrated in-memory database: a kept one, emptied, or a new one from `archive`. */
export async function leaseMemoryDatabase(archive: () => Blob): Promise<DatabaseHandle> {
  // The one kept last (test/db/test-databases.test.ts relies on it).
  let client = idle.pop();
  if (client === undefined) {
    client = await openPglite(null, archive());
    opened++;
    template ??= await readTemplate(client);
  }
  const kept = client;
  const lease = new Lease(kept);
  return pgliteHandle(lease, async () => {
    // The handle's close closed the lease (the dialect did): the file's queries have finished.
    await lease.close();
    const clean = await reset(kept, template!).catch(() => false);
    if (clean && idle.length < KEEP) idle.push(kept);
    else await kept.close();
  });
}
