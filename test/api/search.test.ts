/**
 * Contact search (`?q=`) on both databases: every page is what a filter of the whole
 * organization would give, in each of the three ways listContacts finds it (a walk of the next
 * rows for a common term; the trigram index's matches when few remain; an id range bounded by
 * them when many do), and a term the first rows do not hold is looked up in the trigram index
 * with the organization in the index condition, never by reading the organization's rows.
 * Measured at volume (1,000,000 contacts in one organization, PostgreSQL 15): an absent term
 * 3 ms, one person's email 30 ms, a common term 1–35 ms; before the index an absent term hit
 * the 1.25 s statement timeout.
 */
import { type CompiledQuery, sql } from 'kysely';
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { listContacts, searchable } from '../../src/api/contacts.js';
import type { DB } from '../../src/db/connect.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { buildTestApp, TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { explain, type ExplainRows, nodesOf, planIn, type PlanNode, recording } from '../helpers/plans.js';
import { clientCredentialsToken, createOrgFixture, type OrgFixture } from '../helpers/oauth.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
let a: OrgFixture;
let b: OrgFixture;
let token: string;
/** Organization A's contacts, in id order, as a filter would see them. */
let everyone: { id: number; name: string; email: string | null; company: string | null }[];

beforeAll(async () => {
  t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  app = await buildTestApp(t.handle.db, { listen: t.handle.listen });
  a = await createOrgFixture(t.handle.db);
  b = await createOrgFixture(t.handle.db);
  token = await clientCredentialsToken(app, a, 'contacts.read');
  const insert = (org: number, rows: string) => sql.raw(`insert into contacts (organization_id, name, email, company) ${rows.replaceAll('$org', String(org))}`).execute(t.handle.db);
  // A: 600 rows, every other one an "Alpha" (a term the walk fills a page with); then 2,400 rows
  // of which every other one is a "Quokka" (1,200 matches, more than one probe reads); then one
  // "Wombat" (a single match far from the start). B: 2,000 "Wombat"s at "Zebulon", which A has none of.
  await insert(a.organizationId, `select $org, case when g % 2 = 0 then 'Alpha ' || g else 'Contact ' || g end, 'c' || g || '@a.example', 'Company ' || (g % 10) from generate_series(1, 600) g`);
  await insert(a.organizationId, `select $org, case when g % 2 = 0 then 'Quokka ' || g else 'Contact ' || g end, null, null from generate_series(601, 3000) g`);
  await insert(a.organizationId, `select $org, 'Last One', 'wombat@a.example', 'Burrow_Co' from generate_series(1, 1)`);
  await insert(b.organizationId, `select $org, 'Wombat ' || g, 'wombat' || g || '@b.example', 'Zebulon' from generate_series(1, 2000) g`);
  await sql`analyze contacts`.execute(t.handle.db);
  everyone = await t.handle.db.selectFrom('contacts').select(['id', 'name', 'email', 'company']).where('organization_id', '=', a.organizationId).orderBy('id').execute();
});
afterAll(async () => {
  await app.close();
  await t.close();
});

/** The statements a call sends, recorded as they run. */
async function recordingOf<T>(fn: (db: DB) => Promise<T>): Promise<{ result: T; queries: CompiledQuery[] }> {
  const { db, queries } = recording(t.handle.db);
  return { result: await fn(db), queries };
}

const matching = (term: string) => {
  const needle = term.toLowerCase();
  return everyone.filter((c) => [c.name, c.email, c.company].some((v) => v?.toLowerCase().includes(needle))).map((c) => c.id);
};

async function searchAll(term: string, limit: number): Promise<number[]> {
  const ids: number[] = [];
  let cursor: string | null = null;
  do {
    const res: LightMyRequestResponse = await app.inject({
      url: `/api/v1/${a.organizationId}/contacts?q=${encodeURIComponent(term)}&limit=${limit}${cursor ? `&cursor=${cursor}` : ''}`,
      headers: { authorization: `Bearer ${token}` },
    });
    expect(res.statusCode, res.body).toBe(200);
    const body = res.json() as { data: { id: number }[]; next_cursor: string | null };
    ids.push(...body.data.map((c) => c.id));
    cursor = body.next_cursor;
  } while (cursor);
  return ids;
}

describe(`contact search on ${BACKEND}`, () => {
  it.each([
    ['alpha', 'a common term: the walk of the next rows fills the page', 1],
    ['wombat', 'one match beyond the walk: the trigram index finds it, then its row is read', 3],
    ['quokka', 'more matches beyond the walk than one probe reads: an id range bounded by them', 4],
    ['zebulon', "a term only another organization holds: nothing, and none of B's rows", 2],
    ['burrow_co', 'a literal underscore', 3],
  ])('"%s" (%s): every page as a filter of the organization gives it, no repeats, no gaps', async (term, _why, statements) => {
    for (const limit of [100, 7]) expect(await searchAll(term, limit)).toEqual(matching(term));
    // The way it was found: the walk; the probe; the matches' rows, or the settings and the range.
    const { queries } = await recordingOf((db) => listContacts(db, a.organizationId, { afterId: 0, limit: 26, q: term }));
    expect(queries).toHaveLength(statements);
  });

  it('matches case-insensitively in name, email and company, and % and _ literally', async () => {
    expect(await searchAll('WOMBAT@A.', 100)).toEqual(matching('wombat@a.'));
    expect(await searchAll('company 3', 100)).toEqual(matching('company 3'));
    expect(await searchAll('burrow%co', 100)).toEqual([]);
    expect(await searchAll('burrowXco', 100)).toEqual([]);
  });

  it('refuses a term the trigram index cannot serve with 400 invalid_request naming q', async () => {
    for (const term of ['ab', '--', 'x', '%_%', 'é.']) {
      expect(searchable(term), term).toBe(false);
      const res: LightMyRequestResponse = await app.inject({ url: `/api/v1/${a.organizationId}/contacts?q=${encodeURIComponent(term)}`, headers: { authorization: `Bearer ${token}` } });
      expect(res.statusCode, term).toBe(400);
      expect(res.json()).toMatchObject({ error: 'invalid_request', details: [{ path: 'q' }] });
    }
    for (const term of ['abc', 'Li Na', 'a.b', '東京都', '@a.', '  okay  ']) expect(searchable(term.trim()), term).toBe(true);
  });
});

/** A plan read as the database would run it: each recorded setting applied first, in a transaction. */
async function planUnder(settings: string[], statement: (trx: DB) => Promise<PlanNode>): Promise<PlanNode> {
  return t.handle.db.transaction().execute(async (trx) => {
    for (const setting of settings) {
      const [name, value] = setting.split('=');
      await sql`select set_config(${name}, ${value}, true)`.execute(trx);
    }
    return statement(trx);
  });
}

/** Bitmap scans only: the trigram index within the organization, any other index only by id, never the organization's whole range. */
function expectIndexLookups(plan: PlanNode): void {
  const nodes = nodesOf(plan);
  const show = JSON.stringify(plan);
  expect(nodes.some((n) => ['Seq Scan', 'Index Scan', 'Index Only Scan'].includes(n['Node Type'])), show).toBe(false);
  for (const scan of nodes.filter((n) => n['Node Type'] === 'Bitmap Index Scan')) {
    if (scan['Index Name'] === 'contacts_search_idx') expect(scan['Index Cond'], show).toMatch(/organization_id = /);
    else expect(scan['Index Cond'], show).toMatch(/\bid (=|<=|<|>)/);
  }
}

describe(`contact search's plan on ${BACKEND}`, () => {
  it("probes the trigram index with the organization in the index condition, never by reading the organization's rows", async () => {
    // The probe as the database runs it: contacts_search_probe's body, under its SET clauses.
    const fn = await sql<{ prosrc: string; proconfig: string[] }>`select prosrc, proconfig from pg_proc where proname = 'contacts_search_probe'`.execute(t.handle.db);
    const { prosrc, proconfig } = fn.rows[0]!;
    expect([...proconfig].sort()).toEqual(['enable_indexscan=off', 'enable_seqscan=off']);
    for (const term of ['zebulon', 'wombat', 'quokka']) {
      const plan = await planUnder(proconfig, async (trx) => {
        await sql.raw(`prepare search_probe(bigint, bigint, text) as ${prosrc}`).execute(trx);
        const explained = await sql<ExplainRows['rows'][number]>`explain (format json) execute search_probe(${sql.lit(a.organizationId)}, 300, ${sql.lit(`%${term}%`)})`.execute(trx);
        await sql`deallocate search_probe`.execute(trx);
        return planIn(explained);
      });
      expectIndexLookups(plan);
      expect(nodesOf(plan).some((n) => n['Index Name'] === 'contacts_search_idx'), JSON.stringify(plan)).toBe(true);
    }
  });

  it('reads the id range the probe bounds through an index, never the organization from its start', async () => {
    const { queries } = await recordingOf((db) => listContacts(db, a.organizationId, { afterId: 0, limit: 26, q: 'quokka' }));
    const settings = queries.filter((q) => q.sql.includes('set_config'));
    expect(settings).toHaveLength(1);
    const range = queries.find((q) => /\bilike\b/.test(q.sql) && !q.sql.includes('walk') && !q.sql.includes('contacts_search_probe'));
    expect(range).toBeDefined();
    const plan = await planUnder(['enable_seqscan=off', 'enable_indexscan=off'], (trx) => explain(trx, range!));
    expectIndexLookups(plan);
  });
});
