/**
 * npx tsx bench/revocations-volume.ts [--dist DIR] [--count N] [--rounds N]: what a million
 * revoked grants cost an instance (issue 13, item 2). On the PostgreSQL of BENCH_DATABASE_URL
 * (default postgres://postgres@127.0.0.1:5432/postgres) it builds a database with COUNT grants
 * revoked within the access-token lifetime and a copy of it where they were revoked two years
 * ago (nothing to load; same rows otherwise), starts the real server on each in turn, and
 * prints the time from spawn to GET /healthz answering 200, the resident memory once started
 * (and its peak), and the server's own "revocations loaded" time where it logs one. Then two
 * instances on the million: a grant revoked through one is refused by the other (measured).
 *
 * The server runs compiled, as in production: the working tree is built into a directory of
 * its own (never ./dist, which the tests use), or `--dist DIR` names a build to measure (for
 * example one of an older commit, for a before/after). Both databases are dropped at the end.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, symlinkSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { freePort } from '../test/helpers/process.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const ADMIN_URL = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const DB_WITH = 'orgauth_revocations_volume';
/** The same rows, revoked too long ago to matter: what an instance costs without the revocations. */
const DB_WITHOUT = 'orgauth_revocations_volume_old';
const SECRET_KEY = 'bench-secret-key-0123456789-abcdefghijklmnop';
/** After /healthz answers, the process settles this long before its memory is read. */
const SETTLE_MS = 3000;
/** The bench's private applications: client ids of the server's shape (32 hex digits), fixed secrets. */
const CLIENTS = { bulk: 'b0000000000000000000000000000001', reader: 'b0000000000000000000000000000002', admin: 'b0000000000000000000000000000003' };
const secretOf = (name: keyof typeof CLIENTS) => `bench-${name}-secret-0123456789`;
const basicOf = (name: keyof typeof CLIENTS) => `Basic ${Buffer.from(`${CLIENTS[name]}:${secretOf(name)}`).toString('base64')}`;

function option(name: string): string | undefined {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : undefined;
}
const COUNT = Number(option('--count') ?? 1_000_000);
const ROUNDS = Number(option('--rounds') ?? 3);

const dbUrl = (name: string) => {
  const url = new URL(ADMIN_URL);
  url.pathname = `/${name}`;
  return url.toString();
};

async function withClient<T>(url: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

/** The working tree compiled into a directory of its own, as package.json's build does. */
function build(): string {
  const out = '/tmp/orgauth-revocations-volume';
  mkdirSync(out, { recursive: true });
  // The compiled files import their dependencies from the nearest node_modules up the tree.
  if (!existsSync(path.join(out, 'node_modules'))) symlinkSync(path.join(ROOT, 'node_modules'), path.join(out, 'node_modules'));
  const dist = path.join(out, 'dist');
  console.log(`building the working tree into ${dist}...`);
  const result = spawnSync('npx', ['tsc', '-p', 'tsconfig.build.json', '--outDir', dist], { cwd: ROOT, stdio: ['ignore', 'inherit', 'inherit'] });
  if (result.status !== 0) throw new Error('tsc failed');
  const copied = spawnSync('node', ['scripts/copy-templates.mjs', dist], { cwd: ROOT, stdio: ['ignore', 'inherit', 'inherit'] });
  if (copied.status !== 0) throw new Error('copying the templates failed');
  return dist;
}

interface Instance {
  child: ChildProcess;
  base: string;
  /** Milliseconds from spawn to the first 200 of GET /healthz. */
  healthyMs: number;
  /** The server's own log lines (JSON). */
  logs: string[];
}

async function startInstance(dist: string, database: string): Promise<Instance> {
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const started = performance.now();
  const child = spawn(process.execPath, [path.join(dist, 'src/server.js')], {
    cwd: ROOT,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, DATABASE_URL: dbUrl(database), SECRET_KEY, PORT: String(port), ISSUER: base, LOG_LEVEL: 'info' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const logs: string[] = [];
  let pending = '';
  child.stdout!.on('data', (d: Buffer) => {
    const lines = (pending + d.toString()).split('\n');
    pending = lines.pop()!;
    logs.push(...lines);
  });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  for (;;) {
    if (child.exitCode !== null) throw new Error(`server exited with ${child.exitCode}: ${stderr}`);
    const ok = await fetch(`${base}/healthz`).then((r) => r.status === 200, () => false);
    if (ok) return { child, base, healthyMs: performance.now() - started, logs };
    if (performance.now() - started > 60_000) throw new Error(`server not healthy within 60 s: ${stderr}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

async function stopInstance(instance: Instance): Promise<void> {
  if (instance.child.exitCode !== null) return;
  const exited = new Promise((resolve) => instance.child.once('exit', resolve));
  instance.child.kill('SIGTERM');
  await exited;
}

/** VmRSS and VmHWM (peak) of a process, in MB. */
function memoryMb(pid: number): { rss: number; peak: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)![1]);
  return { rss: kb('VmRSS') / 1024, peak: kb('VmHWM') / 1024 };
}

/** The server's "revocations loaded" log line, when the build has one (the compact set's). */
function loadLog(instance: Instance): { grants: number; ms: number } | undefined {
  for (const line of instance.logs) {
    if (!line.includes('revocations loaded')) continue;
    const entry = JSON.parse(line) as { grants: number; ms: number };
    return { grants: entry.grants, ms: entry.ms };
  }
  return undefined;
}

async function seed(dist: string): Promise<{ organizationId: number; reader: string; admin: string }> {
  await withClient(ADMIN_URL, async (c) => {
    for (const name of [DB_WITH, DB_WITHOUT]) await c.query(`drop database if exists ${name} with (force)`);
    await c.query(`create database ${DB_WITH}`);
  });
  // The build's own migrations, as at any start.
  await stopInstance(await startInstance(dist, DB_WITH));
  const ids = await withClient(dbUrl(DB_WITH), async (c) => {
    const org = await c.query<{ id: string }>(`insert into organizations (name) values ('Volume Org') returning id`);
    const organizationId = Number(org.rows[0]!.id);
    // Private applications: one holds the million revoked grants, one reads the API, one
    // revokes the reader's grant through the management API (the cross-instance check).
    const hash = async (name: keyof typeof CLIENTS) => (await c.query<{ h: string }>(`select encode(sha256(convert_to($1, 'utf8')), 'hex') as h`, [secretOf(name)])).rows[0]!.h;
    const apps: Record<string, number> = {};
    for (const [name, scopes] of [['bulk', ['contacts.read']], ['reader', ['contacts.read']], ['admin', ['grants.read', 'grants.write']]] as const) {
      const row = await c.query<{ id: string }>(
        `insert into applications (organization_id, client_id, client_secret_hash, type, name, scopes) values ($1, $2, $3, 'private', $4, $5) returning id`,
        [organizationId, CLIENTS[name], await hash(name), `Bench ${name}`, scopes],
      );
      apps[name] = Number(row.rows[0]!.id);
    }
    console.log(`inserting ${COUNT.toLocaleString('en')} revoked grants...`);
    // Revoked over the last ~290 days, newest first: all within the one-year token lifetime.
    await c.query(
      `insert into grants (organization_id, application_id, user_id, scopes, created_at, revoked_at, revoked_reason)
       select $1, $2, null, '{contacts.read}', now() - interval '300 days', now() - g * interval '25 seconds', 'revoked_by_admin'
       from generate_series(1, $3::int) g`,
      [organizationId, apps.bulk, COUNT],
    );
    await c.query('vacuum analyze grants');
    return { organizationId };
  });
  await withClient(ADMIN_URL, (c) => c.query(`create database ${DB_WITHOUT} template ${DB_WITH}`));
  await withClient(dbUrl(DB_WITHOUT), async (c) => {
    await c.query(`update grants set revoked_at = revoked_at - interval '2 years' where revoked_at is not null`);
    await c.query('vacuum analyze grants');
  });
  return { organizationId: ids.organizationId, reader: basicOf('reader'), admin: basicOf('admin') };
}

async function clientToken(base: string, basic: string, organizationId: number, scope: string): Promise<string> {
  const res = await fetch(`${base}/oauth/token`, {
    method: 'POST',
    headers: { authorization: basic, 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ grant_type: 'client_credentials', organization_id: String(organizationId), scope }),
  });
  if (res.status !== 200) throw new Error(`token: ${res.status} ${await res.text()}`);
  return ((await res.json()) as { access_token: string }).access_token;
}

/**
 * Two instances on the million: the reader's token works on A; its grant is revoked through B's
 * management API; how long until A refuses it.
 */
async function crossInstance(dist: string, ids: { organizationId: number; reader: string; admin: string }): Promise<number> {
  const [a, b] = await Promise.all([startInstance(dist, DB_WITH), startInstance(dist, DB_WITH)]);
  try {
    const api = (base: string, token: string, p = '', method = 'GET') =>
      fetch(`${base}/api/v1/${ids.organizationId}${p}`, { method, headers: { authorization: `Bearer ${token}` } });
    const reader = await clientToken(a.base, ids.reader, ids.organizationId, 'contacts.read');
    if ((await api(a.base, reader)).status !== 200) throw new Error('the reader token does not work on A');
    const admin = await clientToken(b.base, ids.admin, ids.organizationId, 'grants.read grants.write');
    const list = (await (await api(b.base, admin, '/grants?limit=100')).json()) as { data: { id: number; application: { client_id: string } }[] };
    const grant = list.data.find((g) => g.application.client_id === CLIENTS.reader);
    if (!grant) throw new Error(`the reader's grant is not listed: ${JSON.stringify(list)}`);
    const revoked = await api(b.base, admin, `/grants/${grant.id}`, 'DELETE');
    if (revoked.status !== 204) throw new Error(`revoke: ${revoked.status} ${await revoked.text()}`);
    const at = performance.now();
    while ((await api(a.base, reader)).status === 200) {
      if (performance.now() - at > 5000) throw new Error('still accepted by A 5 s after the revocation');
      await new Promise((r) => setTimeout(r, 5));
    }
    return performance.now() - at;
  } finally {
    await Promise.all([stopInstance(a), stopInstance(b)]);
  }
}

const median = (xs: number[]) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)]!;

async function main(): Promise<void> {
  const dist = option('--dist') ? path.resolve(option('--dist')!) : build();
  const ids = await seed(dist);
  try {
    const runs: Record<'with' | 'without', { healthyMs: number; rss: number; peak: number; loadMs: number | undefined }[]> = { with: [], without: [] };
    for (let round = 0; round < ROUNDS; round++) {
      for (const kind of ['without', 'with'] as const) {
        const instance = await startInstance(dist, kind === 'with' ? DB_WITH : DB_WITHOUT);
        try {
          await new Promise((r) => setTimeout(r, SETTLE_MS));
          const memory = memoryMb(instance.child.pid!);
          const load = loadLog(instance);
          if (kind === 'with' && load && load.grants < COUNT) throw new Error(`loaded ${load.grants} revoked grants, expected ${COUNT}`);
          runs[kind].push({ healthyMs: instance.healthyMs, ...memory, loadMs: load?.ms });
          console.log(`round ${round + 1} ${kind.padEnd(7)}: healthy after ${instance.healthyMs.toFixed(0)} ms, RSS ${memory.rss.toFixed(1)} MB (peak ${memory.peak.toFixed(1)} MB)${load ? `, loaded in ${load.ms} ms` : ''}`);
        } finally {
          await stopInstance(instance);
        }
      }
    }
    const refusedMs = await crossInstance(dist, ids);

    const row = (label: string, f: (r: (typeof runs)['with'][number]) => number | undefined, unit: string) => {
      const values = (['without', 'with'] as const).map((k) => {
        const xs = runs[k].map(f).filter((x): x is number => x !== undefined);
        return xs.length ? median(xs) : undefined;
      });
      const cell = (x: number | undefined) => (x === undefined ? '—' : `${x.toFixed(unit === 'MB' ? 1 : 0)} ${unit}`).padStart(12);
      const delta = values[0] !== undefined && values[1] !== undefined ? values[1] - values[0] : undefined;
      console.log(`| ${label.padEnd(26)} | ${cell(values[0])} | ${cell(values[1])} | ${cell(delta)} |`);
    };
    console.log(`\n${COUNT.toLocaleString('en')} revoked grants, median of ${ROUNDS} starts each (${dist})\n`);
    console.log(`| ${''.padEnd(26)} | ${'without'.padStart(12)} | ${'with'.padStart(12)} | ${'difference'.padStart(12)} |`);
    console.log(`|${'-'.repeat(28)}|${'-'.repeat(14)}|${'-'.repeat(14)}|${'-'.repeat(14)}|`);
    row('spawn to /healthz 200', (r) => r.healthyMs, 'ms');
    row(`RSS ${SETTLE_MS / 1000} s after healthy`, (r) => r.rss, 'MB');
    row('peak RSS (VmHWM)', (r) => r.peak, 'MB');
    row('revocations loaded (log)', (r) => r.loadMs, 'ms');
    console.log(`\nrevoked through instance B, refused by instance A after ${refusedMs.toFixed(0)} ms (both with the ${COUNT.toLocaleString('en')} loaded)`);
  } finally {
    await withClient(ADMIN_URL, async (c) => {
      for (const name of [DB_WITH, DB_WITHOUT]) await c.query(`drop database if exists ${name} with (force)`);
    });
  }
}

await main();
